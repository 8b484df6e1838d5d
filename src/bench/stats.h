/* stats.h - the metric math of `moeserve bench`, kept apart from the network code so it can be
 * checked on synthetic timings. Definitions follow SGLang's bench_serving (reference/perf-anchors.md
 * section 5): numpy-style linear-interpolation percentiles, population std (ddof=0), TPOT per
 * request, ITL pooled over all requests, concurrency = sum(e2e) / duration. */
#ifndef MS_BENCH_STATS_H
#define MS_BENCH_STATS_H

#include <stddef.h>

/* Summary of one sample set; every field is 0 when n == 0. Units are whatever the input used. */
typedef struct ms_bench_stat {
    int n;
    double mean, median, std, p90, p95, p99, max;
} ms_bench_stat;

/* Percentile p in [0,100] of an ascending-sorted array of n >= 1 values, as numpy.percentile with
 * method="linear": rank = p/100*(n-1), interpolated between its floor and ceil neighbours. */
double ms_bench_percentile(const double *sorted, int n, double p);

/* Fills *out from n values (n may be 0). Does not modify v; allocates a sorted copy internally.
 * Returns 0, or -1 when the copy cannot be allocated (out is zeroed then). */
int ms_bench_stat_of(const double *v, int n, ms_bench_stat *out);

/* TPOT of one request in seconds: (latency - ttft) / (output_len - 1); returns -1 when output_len
 * <= 1 (such requests have no TPOT and are left out of the TPOT statistics). */
double ms_bench_tpot(double latency_s, double ttft_s, int output_len);

#endif
