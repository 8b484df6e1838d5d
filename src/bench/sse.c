/* sse.c - see sse.h. */
#include "bench/sse.h"

#include <stdlib.h>
#include <string.h>

void ms_bench_sse_init(ms_bench_sse *s, size_t max_event) {
    memset(s, 0, sizeof *s);
    s->max_event = max_event;
}

void ms_bench_sse_free(ms_bench_sse *s) {
    free(s->line);
    free(s->data);
    s->line = s->data = NULL;
}

static int grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *p = realloc(*buf, c);
    if (!p) return -1;
    *buf = p;
    *cap = c;
    return 0;
}

static int dispatch(ms_bench_sse *s, ms_bench_sse_cb cb, void *ud) {
    if (!s->has_data) return MS_OK;
    size_t len = s->data_len;
    if (len && s->data[len - 1] == '\n') len--; /* the spec drops the last LF */
    s->data[len] = 0;
    s->has_data = 0;
    s->data_len = 0;
    s->n_events++;
    return cb(ud, s->data, len);
}

/* One complete line (without its line end) in s->line[0..line_len). */
static int process_line(ms_bench_sse *s, ms_bench_sse_cb cb, void *ud, ms_err *err) {
    const char *l = s->line;
    size_t n = s->line_len;
    s->line_len = 0;
    if (n == 0) return dispatch(s, cb, ud);
    if (l[0] == ':') return MS_OK;
    size_t name_len = 0;
    while (name_len < n && l[name_len] != ':') name_len++;
    if (name_len != 4 || memcmp(l, "data", 4) != 0) return MS_OK; /* event:, id:, retry:, unknown */
    const char *v = l + name_len;
    size_t vl = n - name_len;
    if (vl) { v++; vl--; }              /* the ':' */
    if (vl && v[0] == ' ') { v++; vl--; } /* one optional space */
    if (s->data_len + vl + 2 > s->max_event)
        return ms_errf(err, MS_ERR_FORMAT, "SSE stream: one event's data exceeds %zu bytes", s->max_event);
    if (grow(&s->data, &s->data_cap, s->data_len + vl + 2))
        return ms_errf(err, MS_ERR_NOMEM, "SSE stream: cannot grow the event buffer");
    memcpy(s->data + s->data_len, v, vl);
    s->data_len += vl;
    s->data[s->data_len++] = '\n';
    s->has_data = 1;
    return MS_OK;
}

int ms_bench_sse_feed(ms_bench_sse *s, const char *buf, size_t n, ms_bench_sse_cb cb, void *ud, ms_err *err) {
    size_t i = 0;
    while (i < n) {
        if (s->after_cr) {
            s->after_cr = 0;
            if (buf[i] == '\n') { i++; continue; }
        }
        /* Copy up to the next line end in one go. */
        size_t j = i;
        while (j < n && buf[j] != '\n' && buf[j] != '\r') j++;
        size_t chunk = j - i;
        if (chunk) {
            if (s->line_len + chunk + 1 > s->max_event)
                return ms_errf(err, MS_ERR_FORMAT, "SSE stream: a line exceeds %zu bytes", s->max_event);
            if (grow(&s->line, &s->line_cap, s->line_len + chunk + 1))
                return ms_errf(err, MS_ERR_NOMEM, "SSE stream: cannot grow the line buffer");
            memcpy(s->line + s->line_len, buf + i, chunk);
            s->line_len += chunk;
        }
        if (j == n) break;
        s->after_cr = buf[j] == '\r';
        i = j + 1;
        int rc = process_line(s, cb, ud, err);
        if (rc != MS_OK) return rc;
    }
    return MS_OK;
}

int ms_bench_sse_finish(ms_bench_sse *s, ms_bench_sse_cb cb, void *ud, ms_err *err) {
    if (s->line_len) {
        int rc = process_line(s, cb, ud, err);
        if (rc != MS_OK) return rc;
    }
    return dispatch(s, cb, ud);
}
