/* jinja_util.c - arena, byte buffer and the text primitives the template engine needs to match
 * Python's string behaviour (printable and whitespace sets) and the JS lexer's (whitespace set),
 * plus JSON string quoting as json.dumps writes it. */
#include "tokenizer/jinja.h"

#include <math.h>
#include <utf8proc.h>
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

int jj_is_js_space(uint32_t c) {
    switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000: case 0xFEFF:
        return 1;
    default:
        return c >= 0x2000 && c <= 0x200A;
    }
}

size_t jj_cp_len(const char *s, size_t n) {
    size_t units = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += ms_utf8_dec(s + i, n - i, &cp);
        units++;
    }
    return units;
}

/* ---- numbers -------------------------------------------------------------------------------- */

int jj_py_printable(uint32_t cp) {
    if (cp == ' ') return 1;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return 0;
    default: return 1;
    }
}

int jj_is_py_space(uint32_t c) {
    switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E: case 0x1F:
    case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
        return 1;
    default: return c >= 0x2000 && c <= 0x200A;
    }
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
            step = (size_t)ms_utf8_dec(s + i, n - i, &cp);
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
