/* report.c - see report.h. */
#include "bench/report.h"

#include "core/fileutil.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BUCKETS 10000000 /* seconds a peak histogram may span (about 115 days) */

/* Per-second histogram helpers for the peak metrics; bucket = floor(t - t0). */
static int bucket_of(double t, double t0) {
    double b = floor(t - t0);
    if (b < 0) b = 0;
    if (b >= MAX_BUCKETS) b = MAX_BUCKETS - 1;
    return (int)b;
}

int ms_bench_metrics_compute(const ms_bench_result *r, int n, double duration_s, ms_bench_metrics *m,
                             ms_err *err) {
    memset(m, 0, sizeof *m);
    m->duration_s = duration_s;
    size_t n_itl = 0;
    double t0 = INFINITY, tmax = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (!r[i].success) { m->failed++; continue; }
        n_itl += (size_t)r[i].n_itl;
        if (r[i].start < t0) t0 = r[i].start;
        if (r[i].start + r[i].latency > tmax) tmax = r[i].start + r[i].latency;
    }
    double *ttft = malloc(((size_t)n + 1) * sizeof *ttft), *tpot = malloc(((size_t)n + 1) * sizeof *tpot);
    double *e2e = malloc(((size_t)n + 1) * sizeof *e2e), *itl = malloc((n_itl + 1) * sizeof *itl);
    int nb = n - m->failed > 0 ? bucket_of(tmax, t0) + 1 : 1;
    int *tok_b = calloc((size_t)nb, sizeof *tok_b), *conc_b = calloc((size_t)nb, sizeof *conc_b);
    int rc = MS_OK;
    if (!ttft || !tpot || !e2e || !itl || !tok_b || !conc_b) {
        rc = ms_errf(err, MS_ERR_NOMEM, "bench metrics: cannot allocate for %d requests", n);
        goto out;
    }
    int n_ttft = 0, n_tpot = 0, n_e2e = 0;
    size_t k = 0;
    double sum_e2e = 0;
    for (int i = 0; i < n; i++) {
        const ms_bench_result *q = &r[i];
        if (!q->success) continue;
        m->completed++;
        m->total_input += q->prompt_len;
        m->total_output += q->output_len;
        if (!q->usage_seen) m->usage_missing++;
        if (q->content_len == 0 && q->reasoning_len == 0) m->empty_replies++;
        if (q->ttft >= 0) ttft[n_ttft++] = q->ttft * 1000.0;
        else m->no_ttft++;
        double tp = q->ttft >= 0 ? ms_bench_tpot(q->latency, q->ttft, q->output_len) : -1;
        if (tp >= 0) tpot[n_tpot++] = tp * 1000.0;
        e2e[n_e2e++] = q->latency * 1000.0;
        sum_e2e += q->latency;
        for (int j = 0; j < q->n_itl; j++) itl[k++] = q->itl[j] * 1000.0;
        /* Peak metrics (newer bench_serving): token times rebuilt as start + ttft + cumulative ITLs;
         * a request is open in every whole second from its start to its end, inclusive. */
        if (q->ttft >= 0) {
            double t = q->start + q->ttft;
            tok_b[bucket_of(t, t0)]++;
            for (int j = 0; j < q->n_itl; j++) {
                t += q->itl[j];
                tok_b[bucket_of(t, t0)]++;
            }
        }
        int b0 = bucket_of(q->start, t0), b1 = bucket_of(q->start + q->latency, t0);
        for (int b = b0; b <= b1 && b < nb; b++) conc_b[b]++;
    }
    for (int b = 0; b < nb; b++) {
        if (tok_b[b] > m->peak_output_throughput) m->peak_output_throughput = tok_b[b];
        if (conc_b[b] > m->peak_concurrent) m->peak_concurrent = conc_b[b];
    }
    if (duration_s > 0) {
        m->request_throughput = m->completed / duration_s;
        m->input_throughput = (double)m->total_input / duration_s;
        m->output_throughput = (double)m->total_output / duration_s;
        m->total_throughput = (double)(m->total_input + m->total_output) / duration_s;
        m->concurrency = sum_e2e / duration_s;
    }
    if (ms_bench_stat_of(ttft, n_ttft, &m->ttft_ms) || ms_bench_stat_of(tpot, n_tpot, &m->tpot_ms) ||
        ms_bench_stat_of(e2e, n_e2e, &m->e2e_ms) || ms_bench_stat_of(itl, (int)k, &m->itl_ms))
        rc = ms_errf(err, MS_ERR_NOMEM, "bench metrics: cannot allocate the sorted copies");
out:
    free(ttft);
    free(tpot);
    free(e2e);
    free(itl);
    free(tok_b);
    free(conc_b);
    return rc;
}

static void row_s(FILE *f, const char *k, const char *v) { fprintf(f, "%-40s %-10s\n", k, v); }
static void row_i(FILE *f, const char *k, long long v) { fprintf(f, "%-40s %-10lld\n", k, v); }
static void row_f(FILE *f, const char *k, double v) { fprintf(f, "%-40s %-10.2f\n", k, v); }
static void title(FILE *f, const char *t, char fill) {
    int w = 50, l = (int)strlen(t), left = (w - l) / 2, right = w - l - left;
    for (int i = 0; i < left; i++) fputc(fill, f);
    fputs(t, f);
    for (int i = 0; i < right; i++) fputc(fill, f);
    fputc('\n', f);
}

static void stat_rows(FILE *f, const char *name, const ms_bench_stat *s, int p95, int max) {
    char k[64];
    snprintf(k, sizeof k, "Mean %s (ms):", name); row_f(f, k, s->mean);
    snprintf(k, sizeof k, "Median %s (ms):", name); row_f(f, k, s->median);
    snprintf(k, sizeof k, "Std %s (ms):", name); row_f(f, k, s->std);
    snprintf(k, sizeof k, "P90 %s (ms):", name); row_f(f, k, s->p90);
    if (p95) { snprintf(k, sizeof k, "P95 %s (ms):", name); row_f(f, k, s->p95); }
    snprintf(k, sizeof k, "P99 %s (ms):", name); row_f(f, k, s->p99);
    if (max) { snprintf(k, sizeof k, "Max %s (ms):", name); row_f(f, k, s->max); }
}

void ms_bench_print_table(FILE *f, const ms_bench_info *info, const ms_bench_metrics *m) {
    fputc('\n', f);
    title(f, " Serving Benchmark Result ", '=');
    row_s(f, "Backend:", info->backend);
    if (isinf(info->request_rate)) row_s(f, "Traffic request rate:", "inf");
    else row_f(f, "Traffic request rate:", info->request_rate);
    if (info->max_concurrency > 0) row_i(f, "Max request concurrency:", info->max_concurrency);
    else row_s(f, "Max request concurrency:", "not set");
    row_i(f, "Successful requests:", m->completed);
    row_i(f, "Failed requests:", m->failed);
    row_f(f, "Benchmark duration (s):", m->duration_s);
    row_i(f, "Total input tokens:", m->total_input);
    row_i(f, "Total generated tokens:", m->total_output);
    row_f(f, "Request throughput (req/s):", m->request_throughput);
    row_f(f, "Input token throughput (tok/s):", m->input_throughput);
    row_f(f, "Output token throughput (tok/s):", m->output_throughput);
    row_f(f, "Peak output token throughput (tok/s):", m->peak_output_throughput);
    row_f(f, "Peak concurrent requests:", m->peak_concurrent);
    row_f(f, "Total token throughput (tok/s):", m->total_throughput);
    if (m->accept_length > 0) row_f(f, "Accept length:", m->accept_length);
    row_f(f, "Concurrency:", m->concurrency);
    title(f, "End-to-End Latency", '-');
    stat_rows(f, "E2E Latency", &m->e2e_ms, 0, 0);
    title(f, "Time to First Token", '-');
    stat_rows(f, "TTFT", &m->ttft_ms, 0, 0);
    title(f, "Time per Output Token (excl. 1st token)", '-');
    stat_rows(f, "TPOT", &m->tpot_ms, 0, 0);
    title(f, "Inter-Token Latency", '-');
    stat_rows(f, "ITL", &m->itl_ms, 1, 1);
    title(f, "", '=');
}

static void print_json_str(FILE *f, const char *s, size_t len, int seen) {
    if (!seen) { fputs("null", f); return; }
    json_t *j = json_stringn(s ? s : "", s ? len : 0);
    char *d = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    fputs(d ? d : "\"(unprintable)\"", f);
    free(d);
    json_decref(j);
}

void ms_bench_print_checks(FILE *f, const ms_bench_info *info, const ms_bench_metrics *m,
                           const ms_bench_result *r, int n, int chat) {
    title(f, " Reply checks ", '=');
    row_i(f, "Replies with empty content+reasoning:", m->empty_replies);
    row_i(f, "Replies without usage (counted chunks):", m->usage_missing);
    if (m->no_ttft) row_i(f, "Replies with no text chunk (no TTFT):", m->no_ttft);
    for (int i = 0; i < n; i++) {
        if (r[i].success) continue;
        fprintf(f, "First failure (request %d): %s\n", i, r[i].error ? r[i].error : "(no message)");
        break;
    }
    for (int i = 0; i < n; i++) {
        if (!r[i].success) continue;
        fprintf(f, "Sample reply (request %d, finish_reason %s, %d output tokens%s):\n", i,
                r[i].finish_reason[0] ? r[i].finish_reason : "(none)", r[i].output_len,
                r[i].truncated ? ", text truncated" : "");
        fputs(chat ? "  content: " : "  text: ", f);
        print_json_str(f, r[i].content, r[i].content_len, r[i].content_seen);
        fputc('\n', f);
        if (chat) {
            fputs("  reasoning_content: ", f);
            print_json_str(f, r[i].reasoning, r[i].reasoning_len, r[i].reasoning_seen);
            fputc('\n', f);
        }
        break;
    }
    title(f, "", '=');
    (void)info;
}

static void put_stat(json_t *o, const char *name, const ms_bench_stat *s) {
    char k[64];
    struct { const char *p; double v; } f[] = {{"mean", s->mean}, {"median", s->median}, {"std", s->std},
                                               {"p90", s->p90}, {"p95", s->p95}, {"p99", s->p99},
                                               {"max", s->max}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        snprintf(k, sizeof k, "%s_%s_ms", f[i].p, name);
        json_object_set_new(o, k, json_real(f[i].v));
    }
}

static json_t *str_or_null(const char *s, size_t len, int seen) {
    if (!seen) return json_null();
    json_t *j = json_stringn(s ? s : "", s ? len : 0);
    return j ? j : json_string("(not valid UTF-8)");
}

int ms_bench_write_json(const char *path, const ms_bench_info *info, const ms_bench_metrics *m,
                        const ms_bench_result *r, int n, ms_err *err) {
    json_t *o = json_object();
    json_object_set_new(o, "backend", json_string(info->backend));
    json_object_set_new(o, "base_url", json_string(info->base_url));
    json_object_set_new(o, "endpoint", json_string(info->endpoint));
    json_object_set_new(o, "model", json_string(info->model ? info->model : ""));
    json_object_set_new(o, "dataset_name", json_string(info->dataset_name));
    json_object_set_new(o, "request_rate", isinf(info->request_rate) ? json_string("inf") : json_real(info->request_rate));
    json_object_set_new(o, "max_concurrency", info->max_concurrency > 0 ? json_integer(info->max_concurrency) : json_null());
    json_object_set_new(o, "num_prompts", json_integer(info->num_prompts));
    json_object_set_new(o, "random_input_len", json_integer(info->random_input_len));
    json_object_set_new(o, "random_output_len", json_integer(info->random_output_len));
    json_object_set_new(o, "random_range_ratio", json_real(info->random_range_ratio));
    json_object_set_new(o, "seed", json_integer((json_int_t)info->seed));
    json_object_set_new(o, "stream", json_boolean(info->stream));
    json_object_set_new(o, "warmup_requests", json_integer(info->warmup_requests));
    json_object_set_new(o, "duration", json_real(m->duration_s));
    json_object_set_new(o, "completed", json_integer(m->completed));
    json_object_set_new(o, "failed", json_integer(m->failed));
    json_object_set_new(o, "total_input_tokens", json_integer(m->total_input));
    json_object_set_new(o, "total_output_tokens", json_integer(m->total_output));
    json_object_set_new(o, "request_throughput", json_real(m->request_throughput));
    json_object_set_new(o, "input_throughput", json_real(m->input_throughput));
    json_object_set_new(o, "output_throughput", json_real(m->output_throughput));
    json_object_set_new(o, "total_throughput", json_real(m->total_throughput));
    json_object_set_new(o, "max_output_tokens_per_s", json_real(m->peak_output_throughput));
    json_object_set_new(o, "max_concurrent_requests", json_real(m->peak_concurrent));
    json_object_set_new(o, "concurrency", json_real(m->concurrency));
    if (m->accept_length > 0) json_object_set_new(o, "accept_length", json_real(m->accept_length));
    json_object_set_new(o, "empty_replies", json_integer(m->empty_replies));
    json_object_set_new(o, "usage_missing", json_integer(m->usage_missing));
    put_stat(o, "e2e_latency", &m->e2e_ms);
    put_stat(o, "ttft", &m->ttft_ms);
    put_stat(o, "tpot", &m->tpot_ms);
    put_stat(o, "itl", &m->itl_ms);
    json_t *reqs = json_array();
    for (int i = 0; i < n; i++) {
        const ms_bench_result *q = &r[i];
        json_t *e = json_object();
        json_object_set_new(e, "success", json_boolean(q->success));
        json_object_set_new(e, "error", q->error ? json_string(q->error) : json_null());
        json_object_set_new(e, "http_status", json_integer(q->http_status));
        json_object_set_new(e, "start_s", json_real(q->start));
        json_object_set_new(e, "ttft_s", q->ttft >= 0 ? json_real(q->ttft) : json_null());
        json_object_set_new(e, "latency_s", json_real(q->latency));
        json_t *itl = json_array();
        for (int j = 0; j < q->n_itl; j++) json_array_append_new(itl, json_real(q->itl[j]));
        json_object_set_new(e, "itl_s", itl);
        json_object_set_new(e, "prompt_len", json_integer(q->prompt_len));
        json_object_set_new(e, "output_len", json_integer(q->output_len));
        json_object_set_new(e, "requested_output_len", json_integer(q->requested_output_len));
        json_object_set_new(e, "usage_seen", json_boolean(q->usage_seen));
        json_object_set_new(e, "chunks", json_integer(q->n_chunks));
        json_object_set_new(e, "finish_reason", q->finish_reason[0] ? json_string(q->finish_reason) : json_null());
        json_object_set_new(e, "content", str_or_null(q->content, q->content_len, q->content_seen));
        json_object_set_new(e, "reasoning_content", str_or_null(q->reasoning, q->reasoning_len, q->reasoning_seen));
        json_object_set_new(e, "text_truncated", json_boolean(q->truncated));
        json_array_append_new(reqs, e);
    }
    json_object_set_new(o, "requests", reqs);
    char *s = json_dumps(o, JSON_INDENT(1) | JSON_REAL_PRECISION(10));
    json_decref(o);
    if (!s) return ms_errf(err, MS_ERR_NOMEM, "bench: cannot serialise the result for %s", path);
    int rc = ms_write_file(path, s, strlen(s), err);
    free(s);
    return rc;
}
