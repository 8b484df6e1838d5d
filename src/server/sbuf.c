/* sbuf.c - see sbuf.h. */
#include "server/sbuf.h"

#include "core/status.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void reserve(ms_sbuf *b, size_t extra) {
    MS_ASSERT(extra < ((size_t)1 << 40));
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->s, cap);
    MS_ASSERT(p != NULL);
    b->s = p;
    b->cap = cap;
}

void ms_sbuf_add(ms_sbuf *b, const char *p, size_t n) {
    reserve(b, n);
    if (n) memcpy(b->s + b->len, p, n);
    b->len += n;
    b->s[b->len] = 0;
}

void ms_sbuf_adds(ms_sbuf *b, const char *s) { ms_sbuf_add(b, s, strlen(s)); }

void ms_sbuf_addc(ms_sbuf *b, char c) { ms_sbuf_add(b, &c, 1); }

void ms_sbuf_printf(ms_sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    MS_ASSERT(n >= 0);
    reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void ms_sbuf_add_json_escaped(ms_sbuf *b, const char *s, size_t n) {
    reserve(b, n + 2);
    size_t run = 0; /* start of the pending run of bytes that need no escaping */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                esc = u;
            }
        }
        if (!esc) continue;
        ms_sbuf_add(b, s + run, i - run);
        ms_sbuf_adds(b, esc);
        run = i + 1;
    }
    ms_sbuf_add(b, s + run, n - run);
}

void ms_sbuf_add_json_str(ms_sbuf *b, const char *s, size_t n) {
    ms_sbuf_addc(b, '"');
    ms_sbuf_add_json_escaped(b, s, n);
    ms_sbuf_addc(b, '"');
}

void ms_sbuf_consume(ms_sbuf *b, size_t n) {
    if (n >= b->len) { ms_sbuf_clear(b); return; }
    memmove(b->s, b->s + n, b->len - n);
    b->len -= n;
    b->s[b->len] = 0;
}

void ms_sbuf_clear(ms_sbuf *b) {
    b->len = 0;
    if (b->s) b->s[0] = 0;
}

void ms_sbuf_free(ms_sbuf *b) {
    free(b->s);
    b->s = NULL;
    b->len = b->cap = 0;
}

char *ms_sbuf_take(ms_sbuf *b) {
    reserve(b, 0);
    char *s = b->s;
    b->s = NULL;
    b->len = b->cap = 0;
    return s;
}

const char *ms_sbuf_str(const ms_sbuf *b) { return b->s ? b->s : ""; }

static void add_shortest(ms_sbuf *b, double v, int is_float) {
    if (isfinite(v) && v == floor(v) && fabs(v) < 1e15) {
        ms_sbuf_printf(b, "%.0f", v);
        return;
    }
    char t[64];
    ms_fmt_roundtrip(t, sizeof t, v, 0, is_float);
    ms_sbuf_adds(b, t);
}

void ms_sbuf_add_double(ms_sbuf *b, double v) { add_shortest(b, v, 0); }

void ms_sbuf_add_float(ms_sbuf *b, float v) { add_shortest(b, (double)v, 1); }
