/* sse.h - incremental Server-Sent Events parser for streamed OpenAI replies. Bytes arrive in
 * arbitrary pieces from libcurl; events come out whole, exactly as the WHATWG EventSource rules
 * split them (LF, CRLF or CR line ends; "data:" lines joined by LF; blank line dispatches; ":"
 * comments and other fields ignored). Memory per stream is bounded by max_event. */
#ifndef MS_BENCH_SSE_H
#define MS_BENCH_SSE_H

#include "core/status.h"

#include <stddef.h>

/* Called once per event with its data (NUL-terminated, len excludes the NUL). Return MS_OK to go
 * on; anything else stops parsing and is returned by the feed call. */
typedef int (*ms_bench_sse_cb)(void *ud, const char *data, size_t len);

typedef struct ms_bench_sse {
    char *line;
    size_t line_len, line_cap;
    char *data;
    size_t data_len, data_cap;
    int has_data;   /* a data: field was seen since the last dispatch */
    int after_cr;   /* previous byte was CR: a following LF belongs to the same line end */
    size_t max_event;
    size_t n_events; /* events dispatched so far */
} ms_bench_sse;

/* max_event: the most bytes one line or one event's data may hold (> 0). */
void ms_bench_sse_init(ms_bench_sse *s, size_t max_event);
void ms_bench_sse_free(ms_bench_sse *s);
/* Parses n bytes; calls cb for each completed event. Returns MS_OK, MS_ERR_FORMAT when a line or
 * event exceeds max_event, MS_ERR_NOMEM, or the callback's status. */
int ms_bench_sse_feed(ms_bench_sse *s, const char *buf, size_t n, ms_bench_sse_cb cb, void *ud, ms_err *err);
/* End of stream: a final unterminated line is processed and a pending event dispatched (servers
 * that close without the last blank line still deliver their last event). */
int ms_bench_sse_finish(ms_bench_sse *s, ms_bench_sse_cb cb, void *ud, ms_err *err);

#endif
