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

/* Earliest of the found positions (-1 = absent); *which gets its index (0..2). */
static long earliest(const long pos[3], int *which) {
    long best = -1;
    for (int i = 0; i < 3; i++)
        if (pos[i] >= 0 && (best < 0 || pos[i] < best)) best = pos[i], *which = i;
    return best;
}

/* Tags are handled one at a time in text order, so a delta holding several tokens (released
 * together by the detokenizer or the stop-string matcher) splits exactly as token by token would. */
void ms_reasoning_push(ms_reasoning *r, const char *text, size_t n, ms_sbuf *reasoning,
                       ms_sbuf *content) {
    ms_sbuf_add(&r->buf, text, n);
    for (;;) {
        const char *b = ms_sbuf_str(&r->buf);
        size_t len = r->buf.len;
        if (len == 0) return;
        if (proper_prefix(b, len, THINK_START) || proper_prefix(b, len, THINK_END) ||
            proper_prefix(b, len, TOOL_START))
            return;
        long pos[3] = {r->stripped_start ? -1 : ms_find(b, len, THINK_START),
                       r->in_reasoning ? ms_find(b, len, THINK_END) : -1,
                       r->in_reasoning ? ms_find(b, len, TOOL_START) : -1};
        int which = -1;
        long p = earliest(pos, &which);
        ms_sbuf *out = r->in_reasoning ? reasoning : content;
        if (p < 0) { /* no tag: emit all but a tail that could start one */
            size_t hold = r->stripped_start ? 0 : ms_partial_tail(b, len, THINK_START);
            if (r->in_reasoning)
                hold = max3(hold, ms_partial_tail(b, len, THINK_END), ms_partial_tail(b, len, TOOL_START));
            ms_sbuf_add(out, b, len - hold);
            ms_sbuf_consume(&r->buf, len - hold);
            return;
        }
        ms_sbuf_add(out, b, (size_t)p);
        if (which == 0) { /* <think>: removed, reasoning (re)starts */
            ms_sbuf_consume(&r->buf, (size_t)p + sizeof THINK_START - 1);
            r->stripped_start = 1;
            r->in_reasoning = 1;
        } else if (which == 1) { /* </think>: removed, content follows */
            ms_sbuf_consume(&r->buf, (size_t)p + sizeof THINK_END - 1);
            r->in_reasoning = 0;
        } else { /* <tool_call>: ends reasoning and stays in the content */
            ms_sbuf_consume(&r->buf, (size_t)p);
            r->in_reasoning = 0;
        }
    }
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
