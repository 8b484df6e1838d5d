/* utf8.h - the one UTF-8 encoder/decoder pair every layer uses (tokenizer, chat templates, and
 * the server's JSON/SSE code), so malformed input is replaced the same way everywhere. */
#ifndef MS_CORE_UTF8_H
#define MS_CORE_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Decodes one UTF-8 sequence at s[0..n) into *cp and returns its byte length (>= 1). Malformed
 * input (n == 0, a stray continuation byte, a truncated, overlong or surrogate sequence, or a
 * value above U+10FFFF) decodes as U+FFFD with length 1, so callers always make progress. */
int ms_utf8_dec(const char *s, size_t n, uint32_t *cp);

/* Decodes one code point from s[0..n), n >= 1, that the caller knows is valid UTF-8 (fast path,
 * no validation; a sequence cut short by n yields U+FFFD with length 1). Returns its length. */
static inline int ms_utf8_dec_valid(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    if (c < 0xE0 && n >= 2) { *cp = ((c & 0x1F) << 6) | (s[1] & 0x3F); return 2; }
    if (c < 0xF0 && n >= 3) { *cp = ((c & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F); return 3; }
    if (n >= 4) {
        *cp = ((c & 0x07) << 18) | ((s[1] & 0x3F) << 12) | ((s[2] & 0x3F) << 6) | (s[3] & 0x3F);
        return 4;
    }
    *cp = 0xFFFD;
    return 1;
}

/* Byte length of the sequence that lead byte c starts (1..4), assuming valid UTF-8. */
static inline int ms_utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

/* Encodes cp as 1..4 bytes into out and returns the count. A surrogate or a value above
 * U+10FFFF cannot be UTF-8 and is written as U+FFFD. */
int ms_utf8_enc(uint32_t cp, char out[4]);

#endif
