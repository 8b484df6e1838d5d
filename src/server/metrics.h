/* metrics.h - the server's Prometheus metrics, written in the text exposition format (0.0.4) by
 * hand: a handful of counters, gauges and fixed-bucket histograms need no client library.
 *
 * Latency observations come from the HTTP threads; all updates take one mutex (a few per token,
 * negligible next to a forward step). Engine-side numbers (running/waiting requests, KV pages,
 * prefix-cache hits, preemptions) are read from ms_engine_stats at scrape time. */
#ifndef MS_SERVER_METRICS_H
#define MS_SERVER_METRICS_H

#include "engine/engine.h"
#include "server/sbuf.h"

#include <pthread.h>
#include <stdint.h>

#define MS_HIST_MAX_BUCKETS 32

typedef struct ms_hist {
    int n;                              /* finite upper bounds */
    double le[MS_HIST_MAX_BUCKETS];     /* ascending, seconds */
    uint64_t count[MS_HIST_MAX_BUCKETS + 1]; /* per bucket (not cumulative); last = +Inf */
    double sum;
    uint64_t total;
} ms_hist;

/* Sets the bucket bounds (n <= MS_HIST_MAX_BUCKETS, ascending). */
void ms_hist_init(ms_hist *h, const double *le, int n);
void ms_hist_observe(ms_hist *h, double v);
/* Appends "# HELP", "# TYPE" and the _bucket/_sum/_count lines (cumulative buckets). */
void ms_hist_write(const ms_hist *h, ms_sbuf *out, const char *name, const char *help);

/* MS_FR_GRAMMAR: no token could continue the request's grammar (finish_reason "grammar_unsatisfiable") */
enum { MS_FR_STOP, MS_FR_LENGTH, MS_FR_TOOL, MS_FR_ABORT, MS_FR_ERROR, MS_FR_GRAMMAR, MS_FR_N };

/* What the watchdog (guard.c) and the admission checks ended or refused. */
enum { MS_GUARD_CLIENT_GONE, MS_GUARD_STREAM_STALL, MS_GUARD_SLOW_UPLOAD, MS_GUARD_HEADER_TIMEOUT,
       MS_GUARD_BODY_BUDGET, MS_GUARD_REQUEST_TIMEOUT, MS_GUARD_N };

typedef struct ms_metrics {
    pthread_mutex_t mu;
    ms_hist ttft, itl, e2e, tpot_req;
    /* the parts of a request's time to first token, observed at its first token: arrival of its
     * headers to its submission to the engine (body, parsing, template, tokenizer), engine queue
     * (submitted to first scheduled), prefill (first scheduled to first token), delivery (first
     * token to an HTTP worker taking it for the response) */
    ms_hist ttft_pre, ttft_queue, ttft_prefill, ttft_deliver;
    uint64_t requests_ok[MS_FR_N];  /* finished choices by finish reason */
    uint64_t http_status[6];       /* responses by status class 1xx..5xx (index 1..5) */
    uint64_t prompt_tokens, generated_tokens; /* as seen by the server */
    uint64_t guard[MS_GUARD_N];     /* MS_GUARD_* events */
} ms_metrics;

void ms_metrics_init(ms_metrics *m);
void ms_metrics_destroy(ms_metrics *m);
void ms_metrics_ttft(ms_metrics *m, double s);
void ms_metrics_itl(ms_metrics *m, double s);
/* The four parts of one request's time to first token, in seconds (see ms_metrics). */
void ms_metrics_ttft_parts(ms_metrics *m, double pre, double queue, double prefill, double deliver);
/* A finished choice: e2e latency, finish reason (MS_FR_*), tokens. */
void ms_metrics_finish(ms_metrics *m, double e2e, int reason, int prompt_tokens, int gen_tokens);
void ms_metrics_http(ms_metrics *m, int status);
/* One MS_GUARD_* event (a client that went away, a stalled stream, a connection cut...). */
void ms_metrics_guard(ms_metrics *m, int kind);
/* Writes the whole exposition (server metrics + engine snapshot) into *out. */
void ms_metrics_write(ms_metrics *m, const ms_engine_stats *es, const char *model_name, ms_sbuf *out);

#endif
