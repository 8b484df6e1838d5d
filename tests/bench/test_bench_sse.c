/* test_bench_sse.c - the streaming SSE parser gives the same events however the bytes are split:
 * whole, cut in two at every byte, and one byte at a time; line ends LF, CRLF and CR; comments,
 * other fields, multi-line data, "data:" without a space, a last event without its blank line,
 * and the size bound. Expected events follow the WHATWG EventSource parsing rules. */
#include "bench/sse.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

typedef struct collected {
    char ev[16][128];
    int n;
} collected;

static int collect(void *ud, const char *data, size_t len) {
    collected *c = ud;
    if (c->n < 16) {
        snprintf(c->ev[c->n], sizeof c->ev[0], "%.*s", (int)len, data);
        if (strlen(data) != len) snprintf(c->ev[c->n], sizeof c->ev[0], "(NUL mismatch)");
    }
    c->n++;
    return MS_OK;
}

static const char k_stream[] =
    ": keep-alive comment\n"
    "data: {\"a\":1}\n\n"
    "event: message\r\nid: 7\r\ndata:{\"b\":2}\r\n\r\n"
    "data: line1\rdata: line2\r\r"
    "retry: 10\n\n"                 /* no data: no event */
    "data\n\n"                       /* field with no colon: empty data, still an event */
    "data:  two spaces\n\n"
    "data: [DONE]\n\n"
    "data: tail without blank line";
static const char *k_want[] = {"{\"a\":1}", "{\"b\":2}", "line1\nline2", "", " two spaces", "[DONE]",
                               "tail without blank line"};
#define N_WANT 7

static int run_split(const size_t *cuts, int ncuts, collected *c) {
    ms_bench_sse s;
    ms_bench_sse_init(&s, 1 << 16);
    ms_err err = {0};
    memset(c, 0, sizeof *c);
    size_t len = strlen(k_stream), prev = 0;
    int rc = MS_OK;
    for (int i = 0; i <= ncuts && rc == MS_OK; i++) {
        size_t at = i < ncuts ? cuts[i] : len;
        rc = ms_bench_sse_feed(&s, k_stream + prev, at - prev, collect, c, &err);
        prev = at;
    }
    if (rc == MS_OK) rc = ms_bench_sse_finish(&s, collect, c, &err);
    ms_bench_sse_free(&s);
    return rc;
}

static int same(const collected *c) {
    if (c->n != N_WANT) return 0;
    for (int i = 0; i < N_WANT; i++)
        if (strcmp(c->ev[i], k_want[i])) return 0;
    return 1;
}

static void test_whole(void) {
    collected c;
    CHECK(run_split(NULL, 0, &c) == MS_OK);
    CHECK_EQ_INT(c.n, N_WANT);
    for (int i = 0; i < N_WANT && i < c.n; i++) CHECK_STR(c.ev[i], k_want[i]);
}

static void test_every_two_way_split(void) {
    size_t len = strlen(k_stream);
    int bad = 0;
    for (size_t cut = 0; cut <= len; cut++) {
        collected c;
        if (run_split(&cut, 1, &c) != MS_OK || !same(&c)) {
            if (!bad) fprintf(stderr, "  split at %zu gives %d events\n", cut, c.n);
            bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);
}

static void test_byte_at_a_time(void) {
    size_t len = strlen(k_stream);
    size_t *cuts = malloc(len * sizeof *cuts);
    for (size_t i = 0; i < len; i++) cuts[i] = i + 1;
    collected c;
    CHECK(run_split(cuts, (int)len - 1, &c) == MS_OK);
    CHECK(same(&c));
    free(cuts);
}

static void test_crlf_split_inside(void) {
    /* A CR at the end of one piece and its LF at the start of the next is one line end, not two:
     * two line ends would dispatch an event early. */
    const char *a = "data: x\r", *b = "\ndata: y\r\n\r\n";
    ms_bench_sse s;
    ms_bench_sse_init(&s, 1024);
    collected c = {0};
    ms_err err = {0};
    CHECK(ms_bench_sse_feed(&s, a, strlen(a), collect, &c, &err) == MS_OK);
    CHECK(ms_bench_sse_feed(&s, b, strlen(b), collect, &c, &err) == MS_OK);
    CHECK(ms_bench_sse_finish(&s, collect, &c, &err) == MS_OK);
    CHECK_EQ_INT(c.n, 1);
    CHECK_STR(c.ev[0], "x\ny");
    ms_bench_sse_free(&s);
}

static void test_bound(void) {
    ms_bench_sse s;
    ms_bench_sse_init(&s, 32);
    collected c = {0};
    ms_err err = {0};
    char big[100];
    memset(big, 'x', sizeof big);
    memcpy(big, "data: ", 6);
    CHECK(ms_bench_sse_feed(&s, big, sizeof big, collect, &c, &err) == MS_ERR_FORMAT);
    CHECK(strstr(err.msg, "exceeds") != NULL);
    ms_bench_sse_free(&s);
    /* many short data lines adding up past the bound */
    ms_bench_sse_init(&s, 32);
    const char *line = "data: 0123456789\n";
    int rc = MS_OK;
    for (int i = 0; i < 5 && rc == MS_OK; i++) rc = ms_bench_sse_feed(&s, line, strlen(line), collect, &c, &err);
    CHECK(rc == MS_ERR_FORMAT);
    ms_bench_sse_free(&s);
}

static int stop_cb(void *ud, const char *data, size_t len) { return MS_ERR_ABORTED; }

static void test_callback_stops(void) {
    ms_bench_sse s;
    ms_bench_sse_init(&s, 1024);
    ms_err err = {0};
    const char *t = "data: a\n\ndata: b\n\n";
    CHECK(ms_bench_sse_feed(&s, t, strlen(t), stop_cb, NULL, &err) == MS_ERR_ABORTED);
    CHECK_EQ_INT(s.n_events, 1);
    ms_bench_sse_free(&s);
}

int main(void) {
    RUN(test_whole);
    RUN(test_every_two_way_split);
    RUN(test_byte_at_a_time);
    RUN(test_crlf_split_inside);
    RUN(test_bound);
    RUN(test_callback_stops);
    return TEST_SUMMARY();
}
