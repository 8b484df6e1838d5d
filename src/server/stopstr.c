/* stopstr.c - see stopstr.h. */
#include "server/stopstr.h"

#include "server/reasoning.h"

#include <stdlib.h>
#include <string.h>

void ms_stopstr_init(ms_stopstr *m, const char *const *stops, int n) {
    memset(m, 0, sizeof *m);
    for (int i = 0; i < n && m->n < MS_MAX_STOP_STRINGS; i++)
        if (stops[i] && stops[i][0]) m->s[m->n++] = strdup(stops[i]);
}

void ms_stopstr_free(ms_stopstr *m) {
    for (int i = 0; i < m->n; i++) free(m->s[i]);
    ms_sbuf_free(&m->held);
    m->n = 0;
}

/* Longest suffix of s[0..n) that is a (possibly whole-buffer) prefix of tag, shorter than tag. */
static size_t tail_prefix(const char *s, size_t n, const char *tag) {
    size_t m = strlen(tag);
    size_t k = n < m - 1 ? n : m - 1;
    for (; k > 0; k--)
        if (memcmp(s + n - k, tag, k) == 0) return k;
    return 0;
}

int ms_stopstr_push(ms_stopstr *m, const char *text, size_t n, ms_sbuf *out) {
    if (m->matched) return 1;
    if (m->n == 0) {
        ms_sbuf_add(out, text, n);
        return 0;
    }
    ms_sbuf_add(&m->held, text, n);
    const char *h = ms_sbuf_str(&m->held);
    size_t len = m->held.len;
    long first = -1;
    for (int i = 0; i < m->n; i++) {
        long p = ms_find(h, len, m->s[i]);
        if (p >= 0 && (first < 0 || p < first)) first = p;
    }
    if (first >= 0) {
        ms_sbuf_add(out, h, (size_t)first);
        ms_sbuf_clear(&m->held);
        m->matched = 1;
        return 1;
    }
    size_t hold = 0;
    for (int i = 0; i < m->n; i++) {
        size_t t = tail_prefix(h, len, m->s[i]);
        if (t > hold) hold = t;
    }
    ms_sbuf_add(out, h, len - hold);
    ms_sbuf_consume(&m->held, len - hold);
    return 0;
}

void ms_stopstr_flush(ms_stopstr *m, ms_sbuf *out) {
    if (!m->matched) ms_sbuf_add(out, ms_sbuf_str(&m->held), m->held.len);
    ms_sbuf_clear(&m->held);
}
