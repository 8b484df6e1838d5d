/* test_bench_stats.c - the bench metric math on synthetic timings: numpy-linear percentiles and
 * population std (values from numpy's documented examples), TPOT per request, ITL pooled, TTFT
 * and E2E across requests, throughputs, concurrency and the per-second peaks. */
#include "bench/report.h"
#include "bench/stats.h"
#include "test.h"

#include <stdlib.h>

static void test_percentile_numpy(void) {
    /* numpy docs: a = [[10, 7, 4], [3, 2, 1]]; np.percentile(a, 50) -> 3.5 */
    double a[] = {1, 2, 3, 4, 7, 10};
    CHECK_CLOSE(ms_bench_percentile(a, 6, 50), 3.5, 1e-12);
    CHECK_CLOSE(ms_bench_percentile(a, 6, 0), 1, 1e-12);
    CHECK_CLOSE(ms_bench_percentile(a, 6, 100), 10, 1e-12);
    /* linear: rank = p/100*(n-1); [1,2,3,4]: p90 rank 2.7 -> 3.7, p99 rank 2.97 -> 3.97, p25 -> 1.75 */
    double b[] = {1, 2, 3, 4};
    CHECK_CLOSE(ms_bench_percentile(b, 4, 90), 3.7, 1e-12);
    CHECK_CLOSE(ms_bench_percentile(b, 4, 99), 3.97, 1e-12);
    CHECK_CLOSE(ms_bench_percentile(b, 4, 25), 1.75, 1e-12);
    double one[] = {42};
    CHECK_CLOSE(ms_bench_percentile(one, 1, 99), 42, 0);
}

static void test_stat_of(void) {
    /* numpy docs: np.std([[1, 2], [3, 4]]) -> 1.1180339887498949 (ddof=0); unsorted input. */
    double v[] = {4, 1, 3, 2};
    ms_bench_stat s;
    CHECK(ms_bench_stat_of(v, 4, &s) == 0);
    CHECK_EQ_INT(s.n, 4);
    CHECK_CLOSE(s.mean, 2.5, 1e-12);
    CHECK_CLOSE(s.std, 1.1180339887498949, 1e-12);
    CHECK_CLOSE(s.median, 2.5, 1e-12);
    CHECK_CLOSE(s.p90, 3.7, 1e-12);
    CHECK_CLOSE(s.p95, 3.85, 1e-12);
    CHECK_CLOSE(s.max, 4, 0);
    CHECK_CLOSE(v[0], 4, 0); /* input untouched */
    CHECK(ms_bench_stat_of(v, 0, &s) == 0);
    CHECK_EQ_INT(s.n, 0);
    CHECK_CLOSE(s.mean, 0, 0);
}

static void test_tpot(void) {
    CHECK_CLOSE(ms_bench_tpot(1.0, 0.2, 5), 0.2, 1e-12);
    CHECK(ms_bench_tpot(1.0, 0.2, 1) < 0);
    CHECK(ms_bench_tpot(1.0, 0.2, 0) < 0);
}

static void set_itl(ms_bench_result *r, int n, double gap) {
    r->itl = malloc((size_t)n * sizeof *r->itl);
    for (int i = 0; i < n; i++) r->itl[i] = gap;
    r->n_itl = r->cap_itl = n;
}

static void test_metrics(void) {
    ms_bench_result r[4] = {{0}};
    double T = 100.0; /* arbitrary clock origin */
    /* r0: TTFT 0.1, 4 ITLs of 0.1, 5 tokens, E2E 0.5 */
    r[0] = (ms_bench_result){.success = 1, .start = T, .ttft = 0.1, .latency = 0.5, .prompt_len = 10, .output_len = 5,
                             .content_len = 3};
    set_itl(&r[0], 4, 0.1);
    /* r1: TTFT 0.25, 8 ITLs of 0.15, 9 tokens, E2E 1.45 */
    r[1] = (ms_bench_result){.success = 1, .start = T + 0.2, .ttft = 0.25, .latency = 1.45, .prompt_len = 20,
                             .output_len = 9, .reasoning_len = 2, .usage_seen = 1};
    set_itl(&r[1], 8, 0.15);
    /* r2: failed: counts nowhere */
    r[2] = (ms_bench_result){.success = 0, .start = T, .ttft = 0.01, .latency = 9, .prompt_len = 1000, .output_len = 1000};
    /* r3: one token: no TPOT, no ITL; empty reply */
    r[3] = (ms_bench_result){.success = 1, .start = T + 1.1, .ttft = 0.3, .latency = 0.3, .prompt_len = 30,
                             .output_len = 1, .usage_seen = 1};
    ms_bench_metrics m;
    ms_err err = {0};
    CHECK(ms_bench_metrics_compute(r, 4, 2.0, &m, &err) == MS_OK);
    CHECK_EQ_INT(m.completed, 3);
    CHECK_EQ_INT(m.failed, 1);
    CHECK_EQ_INT(m.total_input, 60);
    CHECK_EQ_INT(m.total_output, 15);
    CHECK_EQ_INT(m.empty_replies, 1);
    CHECK_EQ_INT(m.usage_missing, 1);
    CHECK_CLOSE(m.request_throughput, 1.5, 1e-12);
    CHECK_CLOSE(m.input_throughput, 30, 1e-12);
    CHECK_CLOSE(m.output_throughput, 7.5, 1e-12);
    CHECK_CLOSE(m.total_throughput, 37.5, 1e-12);
    CHECK_CLOSE(m.concurrency, (0.5 + 1.45 + 0.3) / 2.0, 1e-12);
    /* TTFT across requests (ms) */
    CHECK_EQ_INT(m.ttft_ms.n, 3);
    CHECK_CLOSE(m.ttft_ms.mean, (100 + 250 + 300) / 3.0, 1e-9);
    CHECK_CLOSE(m.ttft_ms.median, 250, 1e-9);
    /* TPOT only for output_len > 1: 100 and 150 ms */
    CHECK_EQ_INT(m.tpot_ms.n, 2);
    CHECK_CLOSE(m.tpot_ms.mean, 125, 1e-9);
    CHECK_CLOSE(m.tpot_ms.std, 25, 1e-9);
    /* ITL pooled: 4 x 100 + 8 x 150 */
    CHECK_EQ_INT(m.itl_ms.n, 12);
    CHECK_CLOSE(m.itl_ms.mean, 1600.0 / 12, 1e-9);
    CHECK_CLOSE(m.itl_ms.median, 150, 1e-9);
    CHECK_CLOSE(m.itl_ms.max, 150, 1e-9);
    /* E2E */
    CHECK_CLOSE(m.e2e_ms.mean, 750, 1e-9);
    CHECK_CLOSE(m.e2e_ms.p99, 500 + (1450 - 500) * 0.98, 1e-9);
    /* Peaks: second 0 holds r0's 5 tokens (0.1..0.5) and r1's at 0.45, 0.6, 0.75, 0.9; second 1
     * holds r1's other 5 and r3's one. Open requests: r0, r1 in second 0; r1, r3 in second 1. */
    CHECK_CLOSE(m.peak_output_throughput, 9, 0);
    CHECK_CLOSE(m.peak_concurrent, 2, 0);
    for (int i = 0; i < 4; i++) ms_bench_result_free(&r[i]);
}

static void test_metrics_empty(void) {
    ms_bench_result r[2] = {{0}};
    r[0].error = NULL;
    ms_bench_metrics m;
    ms_err err = {0};
    CHECK(ms_bench_metrics_compute(r, 2, 1.0, &m, &err) == MS_OK);
    CHECK_EQ_INT(m.completed, 0);
    CHECK_EQ_INT(m.failed, 2);
    CHECK_CLOSE(m.concurrency, 0, 0);
    CHECK_EQ_INT(m.itl_ms.n, 0);
}

int main(void) {
    RUN(test_percentile_numpy);
    RUN(test_stat_of);
    RUN(test_tpot);
    RUN(test_metrics);
    RUN(test_metrics_empty);
    return TEST_SUMMARY();
}
