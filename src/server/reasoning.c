/* reasoning.c - the glm45 reasoning parser (see reasoning.h for the semantics and the one
 * deliberate refinement, tail hold-back). */
#include "server/reasoning.h"

#include <string.h>

static const char THINK_START[] = "<think>";
static const char THINK_END[] = "</think>";
static const char TOOL_START[] = "<tool_call>";

long ms_find(const char *hay, size_t n, const char *needle) {
    size_t m = strlen(needle);
    if (m == 0) return 0;
    if (m > n) return -1;
    const char *p = memmem(hay, n, needle, m);
    return p ? (long)(p - hay) : -1;
}

size_t ms_partial_tail(const char *s, size_t n, const char *tag) {
    size_t m = strlen(tag);
    size_t k = n < m - 1 ? n : m - 1;
    for (; k > 0; k--)
        if (memcmp(s + n - k, tag, k) == 0) return k;
    return 0;
}

/* 1 when s[0..n) (n > 0) is a proper prefix of tag. */
static int proper_prefix(const char *s, size_t n, const char *tag) {
    size_t m = strlen(tag);
    return n > 0 && n < m && memcmp(s, tag, n) == 0;
}

void ms_reasoning_init(ms_reasoning *r, int force_reasoning) {
    memset(r, 0, sizeof *r);
    r->in_reasoning = force_reasoning ? 1 : 0;
}

void ms_reasoning_free(ms_reasoning *r) { ms_sbuf_free(&r->buf); }

static size_t max3(size_t a, size_t b, size_t c) {
    size_t m = a > b ? a : b;
    return m > c ? m : c;
}

void ms_reasoning_push(ms_reasoning *r, const char *text, size_t n, ms_sbuf *reasoning,
                       ms_sbuf *content) {
    ms_sbuf_add(&r->buf, text, n);
    const char *b = ms_sbuf_str(&r->buf);
    size_t len = r->buf.len;
    if (proper_prefix(b, len, THINK_START) || proper_prefix(b, len, THINK_END) ||
        proper_prefix(b, len, TOOL_START))
        return;
    if (!r->stripped_start) {
        long p = ms_find(b, len, THINK_START);
        if (p >= 0) {
            size_t tl = sizeof THINK_START - 1;
            memmove(r->buf.s + p, r->buf.s + p + tl, len - (size_t)p - tl + 1);
            r->buf.len -= tl;
            len = r->buf.len;
            r->stripped_start = 1;
            r->in_reasoning = 1;
        }
    }
    if (r->in_reasoning) {
        long e = ms_find(b, len, THINK_END);
        if (e >= 0) {
            ms_sbuf_add(reasoning, b, (size_t)e);
            size_t after = (size_t)e + sizeof THINK_END - 1;
            ms_sbuf_add(content, b + after, len - after);
            ms_sbuf_clear(&r->buf);
            r->in_reasoning = 0;
            return;
        }
        long t = ms_find(b, len, TOOL_START);
        if (t >= 0) {
            ms_sbuf_add(reasoning, b, (size_t)t);
            ms_sbuf_add(content, b + t, len - (size_t)t);
            ms_sbuf_clear(&r->buf);
            r->in_reasoning = 0;
            return;
        }
        size_t hold = max3(ms_partial_tail(b, len, THINK_END), ms_partial_tail(b, len, TOOL_START),
                           r->stripped_start ? 0 : ms_partial_tail(b, len, THINK_START));
        ms_sbuf_add(reasoning, b, len - hold);
        ms_sbuf_consume(&r->buf, len - hold);
        return;
    }
    size_t hold = r->stripped_start ? 0 : ms_partial_tail(b, len, THINK_START);
    ms_sbuf_add(content, b, len - hold);
    ms_sbuf_consume(&r->buf, len - hold);
}

void ms_reasoning_finish(ms_reasoning *r, ms_sbuf *reasoning, ms_sbuf *content) {
    if (r->buf.len) ms_sbuf_add(r->in_reasoning ? reasoning : content, r->buf.s, r->buf.len);
    ms_sbuf_clear(&r->buf);
}

void ms_reasoning_parse(const char *text, size_t n, int force_reasoning, ms_sbuf *reasoning,
                        ms_sbuf *content) {
    int in_reasoning = force_reasoning || ms_find(text, n, THINK_START) >= 0;
    if (!in_reasoning) {
        ms_sbuf_add(content, text, n);
        return;
    }
    size_t sl = sizeof THINK_START - 1;
    while (n >= sl && memcmp(text, THINK_START, sl) == 0) {
        text += sl;
        n -= sl;
    }
    long e = ms_find(text, n, THINK_END);
    if (e < 0) {
        long t = ms_find(text, n, TOOL_START);
        if (t >= 0) {
            ms_sbuf_add(reasoning, text, (size_t)t);
            ms_sbuf_add(content, text + t, n - (size_t)t);
        } else {
            ms_sbuf_add(reasoning, text, n);
        }
        return;
    }
    ms_sbuf_add(reasoning, text, (size_t)e);
    size_t after = (size_t)e + sizeof THINK_END - 1;
    ms_sbuf_add(content, text + after, n - after);
}
