/* client.h - the request side of `moeserve bench`: builds OpenAI-compatible requests, sends them
 * through libcurl's multi interface (one thread, thousands of connections), parses the streamed
 * replies and records per-request timings exactly as SGLang's bench_serving measures them
 * (reference/perf-anchors.md 5.1/5.3): st just before the POST, once the concurrency limit lets the
 * request go; TTFT at the first chunk carrying text (completions `text`, chat `content` or
 * `reasoning_content`); one ITL per later non-empty chunk; latency at the last received event,
 * `[DONE]` included. */
#ifndef MS_BENCH_CLIENT_H
#define MS_BENCH_CLIENT_H

#include "bench/dataset.h"
#include "core/status.h"

#include <stddef.h>

typedef struct ms_bench_config {
    const char *base_url;   /* scheme://host:port, no trailing path */
    const char *endpoint;   /* "/v1/completions" or "/v1/chat/completions" */
    int chat;               /* 1: messages + delta.content/reasoning_content; 0: prompt + text */
    const char *model;      /* "model" field; required */
    int stream;             /* 1: "stream": true with stream_options.include_usage */
    int ignore_eos;         /* sent as "ignore_eos" */
    int max_concurrency;    /* 0: unlimited */
    double request_timeout_s; /* per request, > 0 */
    double max_duration_s;  /* whole run, > 0: what is still open then fails */
    const char *api_key;    /* "Authorization: Bearer" when non-NULL */
    int progress;           /* draw a progress bar on stderr */
    size_t max_reply_bytes; /* generated text kept per channel per request (counting goes on) */
} ms_bench_config;

/* What one request did. Times are seconds (ms_now() clock for start). */
typedef struct ms_bench_result {
    int success;
    char *error;       /* malloc'd sentence when !success */
    long http_status;
    double start;      /* when the POST was issued */
    double ttft;       /* -1 when no chunk carried text */
    double latency;    /* e2e: last received event (or whole body) minus start */
    double *itl;       /* malloc'd, n_itl entries */
    int n_itl, cap_itl;
    int prompt_len;    /* usage.prompt_tokens when the server sent it, else the dataset target */
    int output_len;    /* usage.completion_tokens when sent, else non-empty chunks (stream) or the
                          requested max tokens (non-stream) */
    int usage_seen;    /* the server sent usage.completion_tokens */
    int n_chunks;      /* chunks that carried text */
    double last_chunk; /* time of the latest chunk that carried text */
    int requested_output_len;
    /* Generated text per channel (completions: `text` goes to content). *_seen: the field came as a
     * string at least once (so a reply whose content was always null shows as null). */
    char *content, *reasoning;
    size_t content_len, reasoning_len;
    int content_seen, reasoning_seen, truncated;
    char finish_reason[32];
} ms_bench_result;

void ms_bench_result_free(ms_bench_result *r);
/* Resets r for a new request of the given targets (frees what it held). */
void ms_bench_result_reset(ms_bench_result *r, int prompt_len, int requested_output_len);

/* The JSON body for one request (malloc'd, caller frees), or NULL on allocation failure. */
char *ms_bench_request_body(const ms_bench_config *cfg, const ms_bench_prompt *p);

/* Applies one SSE event's data received at time `now` to r (timings, text, usage, errors).
 * Returns MS_OK, or an error (malformed JSON, an error object from the server) with err set. */
int ms_bench_apply_event(ms_bench_result *r, const ms_bench_config *cfg, const char *data, size_t len,
                         double now, ms_err *err);

/* Applies a whole non-streamed reply body received at `now` (TTFT = latency). */
int ms_bench_apply_body(ms_bench_result *r, const ms_bench_config *cfg, const char *body, size_t len,
                        double now, ms_err *err);

/* Refuses URLs that are not http(s) or whose host is not loopback (localhost, 127.0.0.0/8, ::1)
 * unless allow_remote. */
int ms_bench_check_url(const char *url, int allow_remote, ms_err *err);

/* GET base_url/v1/models and returns the first model id (malloc'd). Bounded: 10 s, 1 MiB. */
int ms_bench_fetch_model(const char *base_url, const char *api_key, char **model, ms_err *err);
/* The server's mean speculative accept length from GET base_url/get_server_info
 * (internal_states[0].avg_spec_accept_length, as SGLang reports it); 0 when the server reports none
 * or cannot be asked (best effort: never an error). */
double ms_bench_fetch_accept_length(const char *base_url, const char *api_key);

/* Sends n requests: prompt i becomes eligible at arrivals[i] seconds after the start and is sent
 * once fewer than max_concurrency requests are open. Fills res[0..n) (caller zeroes res before the
 * first use; ms_bench_result_free each after). *t_begin and *t_end: ms_now() at start and when the last
 * request finished. Failures of single requests are recorded in res, not returned; the return is
 * an error only when the run itself cannot proceed (curl setup). */
int ms_bench_run(const ms_bench_config *cfg, const ms_bench_prompt *p, int n, const double *arrivals,
                 ms_bench_result *res, double *t_begin, double *t_end, ms_err *err);

#endif
