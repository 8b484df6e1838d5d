/* stats.c - see stats.h. */
#include "bench/stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double ms_bench_percentile(const double *sorted, int n, double p) {
    if (n <= 0) return 0.0;
    if (p <= 0) return sorted[0];
    if (p >= 100) return sorted[n - 1];
    double rank = p / 100.0 * (double)(n - 1);
    int lo = (int)floor(rank);
    int hi = lo + 1 < n ? lo + 1 : n - 1;
    double frac = rank - (double)lo;
    /* numpy's lerp form: a + (b - a) * t, exact at t = 0. */
    return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

int ms_bench_stat_of(const double *v, int n, ms_bench_stat *out) {
    memset(out, 0, sizeof *out);
    if (n <= 0) return 0;
    double *s = malloc((size_t)n * sizeof *s);
    if (!s) return -1;
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += s[i];
    double mean = sum / n, ss = 0;
    for (int i = 0; i < n; i++) ss += (s[i] - mean) * (s[i] - mean);
    out->n = n;
    out->mean = mean;
    out->std = sqrt(ss / n);
    out->median = ms_bench_percentile(s, n, 50);
    out->p90 = ms_bench_percentile(s, n, 90);
    out->p95 = ms_bench_percentile(s, n, 95);
    out->p99 = ms_bench_percentile(s, n, 99);
    out->max = s[n - 1];
    free(s);
    return 0;
}

double ms_bench_tpot(double latency_s, double ttft_s, int output_len) {
    if (output_len <= 1) return -1.0;
    return (latency_s - ttft_s) / (double)(output_len - 1);
}
