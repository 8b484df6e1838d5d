/* utf8.c - shared UTF-8 decoding with one replacement policy (U+FFFD, one byte at a time) and
 * encoding through utf8proc, so no layer carries its own copy. */
#include "core/utf8.h"

#include <utf8proc.h>

int ms_utf8_dec(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    *cp = 0xFFFD;
    if (n == 0) return 1;
    unsigned c = u[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) len = 2, v = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, v = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, v = c & 0x07, min = 0x10000;
    else return 1;
    if ((size_t)len > n) return 1;
    for (int i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) return 1;
        v = (v << 6) | (u[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 1;
    *cp = v;
    return len;
}

int ms_utf8_enc(uint32_t cp, char out[4]) {
    if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) cp = 0xFFFD;
    return (int)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)out);
}
