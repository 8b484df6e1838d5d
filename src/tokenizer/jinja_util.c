/* jinja_util.c - arena, byte buffer and the text primitives the template engine needs to reproduce
 * JavaScript string behaviour (the oracle is a JavaScript engine): whitespace set, UTF-16 lengths,
 * number formatting and JSON.stringify quoting. */
#include "tokenizer/jinja.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ---------------------------------------------------------------------------------- */

struct jj_chunk {
    jj_chunk *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
};

void *jj_alloc(jj_arena *a, size_t n) {
    if (a->over) return NULL;
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->limit && (a->used_total + n > a->limit || n > a->limit)) {
        a->over = 1;
        return NULL;
    }
    jj_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (c && c->cap * 2 > cap && c->cap < (64u << 20)) cap = c->cap * 2 > n ? c->cap * 2 : n;
        c = malloc(sizeof(jj_chunk) + cap);
        if (!c) {
            a->over = 1;
            return NULL;
        }
        c->cap = cap;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    a->used_total += n;
    memset(p, 0, n);
    return p;
}

char *jj_strdup(jj_arena *a, const char *s, size_t n) {
    char *p = jj_alloc(a, n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void jj_arena_free(jj_arena *a) {
    jj_chunk *c = a->head;
    while (c) {
        jj_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used_total = 0;
}

/* ---- buffer --------------------------------------------------------------------------------- */

int jj_buf_put(jj_buf *b, const char *s, size_t n) {
    if (b->over) return -1;
    if (b->limit && b->n + n > b->limit) {
        b->over = 1;
        return -1;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->over = 1;
            return -1;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int jj_buf_putc(jj_buf *b, char c) { return jj_buf_put(b, &c, 1); }
int jj_buf_puts(jj_buf *b, const char *s) { return jj_buf_put(b, s, strlen(s)); }

void jj_buf_free(jj_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

int jj_utf8_dec(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0) {
        *cp = 0xFFFD;
        return 1;
    }
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
    else {
        *cp = 0xFFFD;
        return 1;
    }
    if ((size_t)len > n) {
        *cp = 0xFFFD;
        return 1;
    }
    for (int i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *cp = 0xFFFD;
            return 1;
        }
        v = (v << 6) | (u[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = 0xFFFD;
        return 1;
    }
    *cp = v;
    return len;
}

int jj_utf8_enc(uint32_t cp, char out[4]) {
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* lone surrogates cannot be UTF-8 */
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp > 0x10FFFF) cp = 0xFFFD;
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int jj_is_js_space(uint32_t c) {
    switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000: case 0xFEFF:
        return 1;
    default:
        return c >= 0x2000 && c <= 0x200A;
    }
}

size_t jj_utf16_len(const char *s, size_t n) {
    size_t units = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += jj_utf8_dec(s + i, n - i, &cp);
        units += cp >= 0x10000 ? 2 : 1;
    }
    return units;
}

/* ---- numbers -------------------------------------------------------------------------------- */

void jj_js_num(double v, char out[40]) {
    if (isnan(v)) {
        strcpy(out, "NaN");
        return;
    }
    if (isinf(v)) {
        strcpy(out, v < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (v == 0) {
        strcpy(out, "0");
        return;
    }
    /* Shortest digit string that reads back as v (ECMAScript Number::toString). */
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, v);
        if (strtod(tmp, NULL) == v) break;
    }
    /* tmp = [-]d[.ddd]e[+-]XX */
    char digits[24];
    int k = 0, neg = 0;
    const char *p = tmp;
    if (*p == '-') neg = 1, p++;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[k++] = *p;
    digits[k] = 0;
    while (k > 1 && digits[k - 1] == '0') digits[--k] = 0;
    int e = atoi(p + 1);
    int n = e + 1; /* decimal point position */
    char *o = out;
    if (neg) *o++ = '-';
    if (k <= n && n <= 21) {
        memcpy(o, digits, (size_t)k);
        o += k;
        for (int i = 0; i < n - k; i++) *o++ = '0';
    } else if (0 < n && n <= 21) {
        memcpy(o, digits, (size_t)n);
        o += n;
        *o++ = '.';
        memcpy(o, digits + n, (size_t)(k - n));
        o += k - n;
    } else if (-6 < n && n <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -n; i++) *o++ = '0';
        memcpy(o, digits, (size_t)k);
        o += k;
    } else {
        *o++ = digits[0];
        if (k > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)(k - 1));
            o += k - 1;
        }
        o += sprintf(o, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
    }
    *o = 0;
}

/* ---- JSON ----------------------------------------------------------------------------------- */

int jj_json_quote(jj_buf *b, const char *s, size_t n, int ascii) {
    if (jj_buf_putc(b, '"')) return -1;
    size_t run = 0; /* start of the pending unescaped run */
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[16];
        size_t step = 1;
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            esc = tmp;
        } else if (ascii && c >= 0x7F) {
            uint32_t cp;
            step = (size_t)jj_utf8_dec(s + i, n - i, &cp);
            if (cp >= 0x10000) {
                uint32_t x = cp - 0x10000;
                snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (x >> 10), 0xDC00 + (x & 0x3FF));
            } else {
                snprintf(tmp, sizeof tmp, "\\u%04x", cp);
            }
            esc = tmp;
        }
        if (esc) {
            if (jj_buf_put(b, s + run, i - run) || jj_buf_puts(b, esc)) return -1;
            i += step;
            run = i;
        } else {
            i++;
        }
    }
    if (jj_buf_put(b, s + run, n - run)) return -1;
    return jj_buf_putc(b, '"');
}
