/* report.h - turns per-request results into bench_serving's aggregate metrics, prints its result
 * table, checks the replies (empty content and reasoning, a sample reply with both channels), and
 * writes the JSON result file. Metric definitions: reference/perf-anchors.md 5.2. */
#ifndef MS_BENCH_REPORT_H
#define MS_BENCH_REPORT_H

#include "bench/client.h"
#include "bench/stats.h"
#include "core/status.h"

#include <stdio.h>

typedef struct ms_bench_metrics {
    int completed, failed;
    int empty_replies;   /* successful requests whose content and reasoning were both empty */
    int usage_missing;   /* successful requests without usage.completion_tokens */
    int no_ttft;         /* successful requests where no chunk carried text (left out of TTFT) */
    double duration_s;
    long long total_input, total_output;
    double request_throughput, input_throughput, output_throughput, total_throughput; /* per s */
    double concurrency;            /* sum(e2e) / duration */
    double peak_output_throughput; /* most output tokens in one whole second */
    double peak_concurrent;        /* most requests open in one whole second */
    ms_bench_stat ttft_ms, tpot_ms, itl_ms, e2e_ms;
    double accept_length;          /* speculative decoding: the server's mean accept length, 0 = none
                                    * reported (filled by the caller, not by ms_bench_metrics_compute) */
} ms_bench_metrics;

/* Aggregates n results over a run of duration_s seconds. Only successful requests count.
 * TPOT only for output_len > 1; ITL pooled over all requests; TTFT over requests with a text chunk.
 * Returns MS_OK or MS_ERR_NOMEM. */
int ms_bench_metrics_compute(const ms_bench_result *r, int n, double duration_s, ms_bench_metrics *m,
                             ms_err *err);

/* Facts about the run that the table and the JSON file echo. */
typedef struct ms_bench_info {
    const char *backend, *base_url, *endpoint, *model, *dataset_name;
    double request_rate; /* inf when unthrottled */
    int max_concurrency; /* 0 = not set */
    int num_prompts, random_input_len, random_output_len;
    double random_range_ratio;
    unsigned long long seed;
    int stream, warmup_requests;
} ms_bench_info;

/* The "Serving Benchmark Result" table, laid out as SGLang's bench_serving prints it. */
void ms_bench_print_table(FILE *f, const ms_bench_info *info, const ms_bench_metrics *m);

/* Reply checks: the empty-reply count, the first failure's message, and the first successful
 * reply in full with both channels as JSON strings (null when the field never came). */
void ms_bench_print_checks(FILE *f, const ms_bench_info *info, const ms_bench_metrics *m,
                           const ms_bench_result *r, int n, int chat);

/* Writes one JSON object: SGLang's result keys (duration, completed, total_input_tokens, ...,
 * mean_ttft_ms, p99_itl_ms, concurrency, ...) plus "requests": per-request details. */
int ms_bench_write_json(const char *path, const ms_bench_info *info, const ms_bench_metrics *m,
                        const ms_bench_result *r, int n, ms_err *err);

#endif
