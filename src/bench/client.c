/* client.c - see client.h. */
#include "bench/client.h"

#include "bench/sse.h"
#include "core/fileutil.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define MAX_EVENT_BYTES ((size_t)16 << 20) /* one SSE event */
#define MAX_BODY_BYTES ((size_t)64 << 20)  /* one non-streamed reply */
#define ERR_BODY_BYTES 2048                /* kept of an error reply / unexpected body */

void ms_bench_result_free(ms_bench_result *r) {
    free(r->error);
    free(r->itl);
    free(r->content);
    free(r->reasoning);
    r->error = NULL;
    r->itl = NULL;
    r->content = r->reasoning = NULL;
}

void ms_bench_result_reset(ms_bench_result *r, int prompt_len, int requested_output_len) {
    ms_bench_result_free(r);
    memset(r, 0, sizeof *r);
    r->ttft = -1;
    r->prompt_len = prompt_len;
    r->requested_output_len = requested_output_len;
    r->output_len = 0;
}

static void set_error(ms_bench_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(ms_bench_result *r, const char *fmt, ...) {
    if (r->error) return; /* the first cause is the one worth reporting */
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    r->error = strdup(buf);
    r->success = 0;
}

char *ms_bench_request_body(const ms_bench_config *cfg, const ms_bench_prompt *p) {
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "model", json_string(cfg->model ? cfg->model : ""));
    if (cfg->chat) {
        json_t *msgs = json_array(), *m = json_object();
        json_object_set_new(m, "role", json_string("user"));
        json_object_set_new(m, "content", json_string(p->text ? p->text : ""));
        json_array_append_new(msgs, m);
        json_object_set_new(o, "messages", msgs);
    } else if (p->ids) {
        json_t *a = json_array();
        for (int i = 0; i < p->n_ids; i++) json_array_append_new(a, json_integer(p->ids[i]));
        json_object_set_new(o, "prompt", a);
    } else {
        json_object_set_new(o, "prompt", json_string(p->text ? p->text : ""));
    }
    json_object_set_new(o, "temperature", json_real(0.0));
    json_object_set_new(o, "max_tokens", json_integer(p->output_len));
    json_object_set_new(o, "ignore_eos", json_boolean(cfg->ignore_eos));
    json_object_set_new(o, "stream", json_boolean(cfg->stream));
    if (cfg->stream) {
        json_t *so = json_object();
        json_object_set_new(so, "include_usage", json_true());
        json_object_set_new(o, "stream_options", so);
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

static void append_text(ms_bench_result *r, char **buf, size_t *len, const char *s, size_t n, size_t cap) {
    if (*len + n > cap) {
        r->truncated = 1;
        n = *len < cap ? cap - *len : 0;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--; /* cut on a character boundary */
    }
    if (!n) return;
    char *p = realloc(*buf, *len + n + 1);
    if (!p) { r->truncated = 1; return; }
    memcpy(p + *len, s, n);
    *len += n;
    p[*len] = 0;
    *buf = p;
}

/* Reads a string field; sets *seen when present as a string. */
static const char *str_field(json_t *obj, const char *key, size_t *len, int *seen) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_string(v)) { *len = 0; return NULL; }
    if (seen) *seen = 1;
    *len = json_string_length(v);
    return json_string_value(v);
}

static void read_usage(ms_bench_result *r, json_t *root) {
    json_t *u = json_object_get(root, "usage");
    if (!json_is_object(u)) return;
    json_t *ct = json_object_get(u, "completion_tokens"), *pt = json_object_get(u, "prompt_tokens");
    if (json_is_integer(ct) && json_integer_value(ct) >= 0 && json_integer_value(ct) < (1LL << 30)) {
        r->output_len = (int)json_integer_value(ct);
        r->usage_seen = 1;
    }
    if (json_is_integer(pt) && json_integer_value(pt) > 0 && json_integer_value(pt) < (1LL << 30))
        r->prompt_len = (int)json_integer_value(pt);
}

static int check_error_object(json_t *root, ms_err *err) {
    json_t *e = json_object_get(root, "error");
    if (!e || json_is_null(e)) return MS_OK;
    const char *msg = json_is_object(e) ? json_string_value(json_object_get(e, "message"))
                                        : json_string_value(e);
    return ms_errf(err, MS_ERR_RUNTIME, "server sent an error: %s", msg ? msg : "(no message)");
}

/* Text of choices[0] in this chunk/body (content and reasoning channels); returns total length. */
static size_t take_choice(ms_bench_result *r, const ms_bench_config *cfg, json_t *root, const char *obj_key) {
    json_t *choices = json_object_get(root, "choices");
    if (!json_is_array(choices) || json_array_size(choices) == 0) return 0;
    json_t *c0 = json_array_get(choices, 0);
    if (!json_is_object(c0)) return 0;
    json_t *fr = json_object_get(c0, "finish_reason");
    if (json_is_string(fr)) snprintf(r->finish_reason, sizeof r->finish_reason, "%s", json_string_value(fr));
    size_t cl = 0, rl = 0;
    const char *c = NULL, *rs = NULL;
    if (cfg->chat) {
        json_t *d = json_object_get(c0, obj_key);
        if (!json_is_object(d)) return 0;
        c = str_field(d, "content", &cl, &r->content_seen);
        rs = str_field(d, "reasoning_content", &rl, &r->reasoning_seen);
        if (!rs) rs = str_field(d, "reasoning", &rl, &r->reasoning_seen); /* newer vLLM spelling */
    } else {
        c = str_field(c0, "text", &cl, &r->content_seen);
    }
    if (c) append_text(r, &r->content, &r->content_len, c, cl, cfg->max_reply_bytes);
    if (rs) append_text(r, &r->reasoning, &r->reasoning_len, rs, rl, cfg->max_reply_bytes);
    return cl + rl;
}

int ms_bench_apply_event(ms_bench_result *r, const ms_bench_config *cfg, const char *data, size_t len,
                         double now, ms_err *err) {
    r->latency = now - r->start;
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) return MS_OK;
    json_error_t je;
    json_t *root = json_loadb(data, len, 0, &je);
    if (!root) return ms_errf(err, MS_ERR_FORMAT, "stream chunk is not JSON (%s): %.80s", je.text, data);
    int rc = check_error_object(root, err);
    if (rc == MS_OK) {
        size_t got = take_choice(r, cfg, root, "delta");
        if (got > 0) {
            if (r->ttft < 0) {
                r->ttft = now - r->start;
            } else {
                if (r->n_itl == r->cap_itl) {
                    int nc = r->cap_itl ? r->cap_itl * 2 : 64;
                    double *p = realloc(r->itl, (size_t)nc * sizeof *p);
                    if (!p) { json_decref(root); return ms_errf(err, MS_ERR_NOMEM, "bench: cannot grow the ITL list"); }
                    r->itl = p;
                    r->cap_itl = nc;
                }
                r->itl[r->n_itl++] = now - r->last_chunk;
            }
            r->last_chunk = now;
            r->n_chunks++;
        }
        read_usage(r, root);
    }
    json_decref(root);
    return rc;
}

int ms_bench_apply_body(ms_bench_result *r, const ms_bench_config *cfg, const char *body, size_t len,
                        double now, ms_err *err) {
    r->latency = now - r->start;
    json_error_t je;
    json_t *root = json_loadb(body, len, 0, &je);
    if (!root) return ms_errf(err, MS_ERR_FORMAT, "reply is not JSON (%s): %.80s", je.text, body);
    int rc = check_error_object(root, err);
    if (rc == MS_OK) {
        if (take_choice(r, cfg, root, "message") > 0) {
            r->ttft = r->latency;
            r->n_chunks = 1;
        }
        r->output_len = r->requested_output_len;
        read_usage(r, root);
    }
    json_decref(root);
    return rc;
}

/* ---- URL policy ---- */

int ms_bench_check_url(const char *url, int allow_remote, ms_err *err) {
    CURLU *u = curl_url();
    if (!u) return ms_errf(err, MS_ERR_NOMEM, "bench: cannot allocate a URL parser");
    char *scheme = NULL, *host = NULL;
    int rc = MS_OK;
    if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK) {
        rc = ms_errf(err, MS_ERR_INVALID, "flag --base-url: '%s' is not a valid URL", url);
    } else if (strcasecmp(scheme, "http") != 0 && strcasecmp(scheme, "https") != 0) {
        rc = ms_errf(err, MS_ERR_INVALID, "flag --base-url: scheme '%s' is not http or https", scheme);
    } else if (!allow_remote) {
        struct in_addr a4;
        int loop = !strcasecmp(host, "localhost") || !strcmp(host, "[::1]") ||
                   (inet_pton(AF_INET, host, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127);
        if (!loop)
            rc = ms_errf(err, MS_ERR_INVALID,
                         "flag --base-url: host '%s' is not loopback; pass --allow-remote to benchmark "
                         "another machine", host);
    }
    curl_free(scheme);
    curl_free(host);
    curl_url_cleanup(u);
    return rc;
}

/* ---- buffers ---- */

typedef struct buf {
    char *p;
    size_t len, cap, max;
    int overflow;
} buf;

static void buf_add(buf *b, const char *s, size_t n) {
    if (b->len + n > b->max) {
        b->overflow = 1;
        n = b->len < b->max ? b->max - b->len : 0;
    }
    if (!n) return;
    if (b->len + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 1024;
        while (c < b->len + n + 1) c *= 2;
        char *p = realloc(b->p, c);
        if (!p) { b->overflow = 1; return; }
        b->p = p;
        b->cap = c;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static size_t on_buf_write(char *ptr, size_t size, size_t nmemb, void *ud) {
    buf_add(ud, ptr, size * nmemb);
    return size * nmemb;
}

/* GET url (with a bearer key when api_key is set) into b, 10 s at most, http(s) only; *code = the
 * HTTP status. CURLE_FAILED_INIT when curl cannot start. */
static CURLcode get_small(const char *url, const char *api_key, buf *b, long *code) {
    char auth[1024];
    CURL *e = curl_easy_init();
    if (!e) return CURLE_FAILED_INIT;
    struct curl_slist *h = NULL;
    if (api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", api_key);
        h = curl_slist_append(h, auth);
    }
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_buf_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    CURLcode cc = curl_easy_perform(e);
    *code = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, code);
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    return cc;
}

int ms_bench_fetch_model(const char *base_url, const char *api_key, char **model, ms_err *err) {
    *model = NULL;
    char url[2048];
    snprintf(url, sizeof url, "%s/v1/models", base_url);
    buf b = {.max = (size_t)1 << 20};
    long code = 0;
    CURLcode cc = get_small(url, api_key, &b, &code);
    if (cc == CURLE_FAILED_INIT) return ms_errf(err, MS_ERR_RUNTIME, "bench: curl_easy_init failed");
    int rc = MS_OK;
    if (cc != CURLE_OK) {
        rc = ms_errf(err, MS_ERR_IO, "GET %s failed: %s (pass --model to skip this)", url, curl_easy_strerror(cc));
    } else if (code != 200 || b.overflow) {
        rc = ms_errf(err, MS_ERR_IO, "GET %s: HTTP %ld (pass --model to skip this)", url, code);
    } else {
        json_t *root = json_loadb(b.p ? b.p : "", b.len, 0, NULL);
        json_t *d = json_object_get(root, "data");
        const char *id = json_string_value(json_object_get(json_array_get(d, 0), "id"));
        if (id) *model = strdup(id);
        else rc = ms_errf(err, MS_ERR_FORMAT, "GET %s: no data[0].id in the reply (pass --model)", url);
        json_decref(root);
    }
    free(b.p);
    return rc;
}

/* ---- the run loop ---- */

typedef struct req {
    CURL *easy;
    struct curl_slist *headers;
    char *body;
    ms_bench_result *res;
    const ms_bench_config *cfg;
    ms_bench_sse sse;
    buf raw;           /* error body, non-streamed body, or the head of an unexpected body */
    int status_known;
    int aborted;       /* our callback stopped the transfer; res->error says why */
    char curl_err[CURL_ERROR_SIZE];
} req;

static int on_event(void *ud, const char *data, size_t len) {
    req *q = ud;
    ms_err e = {0};
    if (ms_bench_apply_event(q->res, q->cfg, data, len, ms_now(), &e) != MS_OK) {
        set_error(q->res, "%s", e.msg);
        return e.code;
    }
    return MS_OK;
}

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *ud) {
    req *q = ud;
    size_t n = size * nmemb;
    if (!q->status_known) {
        curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &q->res->http_status);
        q->status_known = 1;
        if (q->res->http_status == 200 && !q->cfg->stream) q->raw.max = MAX_BODY_BYTES;
    }
    if (q->res->http_status != 200 || !q->cfg->stream) {
        buf_add(&q->raw, ptr, n);
        if (q->raw.overflow && q->res->http_status == 200) {
            set_error(q->res, "reply body exceeds %zu bytes", q->raw.max);
            q->aborted = 1;
            return 0;
        }
        return n;
    }
    if (q->raw.len < 256) buf_add(&q->raw, ptr, n < 256 ? n : 256);
    ms_err e = {0};
    int rc = ms_bench_sse_feed(&q->sse, ptr, n, on_event, q, &e);
    if (rc != MS_OK) {
        if (e.msg[0]) set_error(q->res, "%s", e.msg);
        q->aborted = 1;
        return 0; /* stops the transfer with CURLE_WRITE_ERROR */
    }
    return n;
}

static void req_free(req *q) {
    if (!q) return;
    curl_easy_cleanup(q->easy);
    curl_slist_free_all(q->headers);
    free(q->body);
    free(q->raw.p);
    ms_bench_sse_free(&q->sse);
    free(q);
}

static req *req_new(const ms_bench_config *cfg, const ms_bench_prompt *p, ms_bench_result *res) {
    req *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    q->cfg = cfg;
    q->res = res;
    q->raw.max = ERR_BODY_BYTES;
    ms_bench_sse_init(&q->sse, MAX_EVENT_BYTES);
    q->easy = curl_easy_init();
    q->body = ms_bench_request_body(cfg, p);
    if (!q->easy || !q->body) { req_free(q); return NULL; }
    char url[2048], auth[1024];
    snprintf(url, sizeof url, "%s%s", cfg->base_url, cfg->endpoint);
    q->headers = curl_slist_append(q->headers, "Content-Type: application/json");
    q->headers = curl_slist_append(q->headers, "Expect:"); /* no 100-continue round trip */
    if (cfg->stream) q->headers = curl_slist_append(q->headers, "Accept: text/event-stream");
    if (cfg->api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", cfg->api_key);
        q->headers = curl_slist_append(q->headers, auth);
    }
    CURL *e = q->easy;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, q->headers);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(q->body));
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(e, CURLOPT_PRIVATE, q);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, q->curl_err);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(cfg->request_timeout_s * 1000.0));
    return q;
}

/* The transfer of q ended with curl status cc at time now: settle q->res. */
static void finish(req *q, CURLcode cc, double now) {
    ms_bench_result *r = q->res;
    if (!q->status_known) curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &r->http_status);
    if (q->aborted || r->error) {
        if (!r->error) set_error(r, "transfer stopped by the client");
        return;
    }
    if (cc != CURLE_OK) {
        set_error(r, "%s%s%s", curl_easy_strerror(cc), q->curl_err[0] ? ": " : "", q->curl_err);
        return;
    }
    if (r->http_status != 200) {
        set_error(r, "HTTP %ld: %.300s", r->http_status, q->raw.p ? q->raw.p : "");
        return;
    }
    ms_err e = {0};
    if (q->cfg->stream) {
        if (ms_bench_sse_finish(&q->sse, on_event, q, &e) != MS_OK) {
            set_error(r, "%s", e.msg[0] ? e.msg : "bad final SSE event");
            return;
        }
        if (q->sse.n_events == 0) {
            set_error(r, "HTTP 200 but no SSE events in the reply; it starts: %.200s", q->raw.p ? q->raw.p : "");
            return;
        }
        if (!r->usage_seen) r->output_len = r->n_chunks;
    } else {
        if (ms_bench_apply_body(r, q->cfg, q->raw.p ? q->raw.p : "", q->raw.len, now, &e) != MS_OK) {
            set_error(r, "%s", e.msg);
            return;
        }
    }
    r->success = 1;
}

static void draw_progress(int done, int n, double elapsed) {
    int width = 40, fill = n ? (int)((long long)done * width / n) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    fprintf(stderr, "\r[%s] %d/%d  %.1fs", bar, done, n, elapsed);
    if (done == n) fputc('\n', stderr);
    fflush(stderr);
}

int ms_bench_run(const ms_bench_config *cfg, const ms_bench_prompt *p, int n, const double *arrivals,
                 ms_bench_result *res, double *t_begin, double *t_end, ms_err *err) {
    CURLM *m = curl_multi_init();
    req **live = calloc(n > 0 ? (size_t)n : 1, sizeof *live); /* open request of prompt i, or NULL */
    if (!m || !live) {
        curl_multi_cleanup(m);
        free(live);
        return ms_errf(err, MS_ERR_RUNTIME, "bench: cannot set up the curl multi handle");
    }
    curl_multi_setopt(m, CURLMOPT_MAX_HOST_CONNECTIONS, 0L);
    curl_multi_setopt(m, CURLMOPT_MAX_TOTAL_CONNECTIONS, 0L);
    int next = 0, open = 0, done = 0, rc = MS_OK;
    const char *why_stop = NULL;
    double t0 = ms_now();
    *t_begin = t0;
    if (cfg->progress) draw_progress(0, n, 0);
    while (done < n) {
        double now = ms_now();
        if (now - t0 > cfg->max_duration_s) { why_stop = "--max-duration reached"; break; }
        while (next < n && arrivals[next] <= now - t0 &&
               (cfg->max_concurrency <= 0 || open < cfg->max_concurrency)) {
            ms_bench_result_reset(&res[next], p[next].prompt_len, p[next].output_len);
            req *q = req_new(cfg, &p[next], &res[next]);
            res[next].start = ms_now();
            if (!q || curl_multi_add_handle(m, q->easy) != CURLM_OK) {
                set_error(&res[next], "could not set up the HTTP request (out of memory?)");
                req_free(q);
                done++;
            } else {
                live[next] = q;
                open++;
            }
            next++;
        }
        int running = 0;
        if (curl_multi_perform(m, &running) != CURLM_OK) {
            rc = ms_errf(err, MS_ERR_RUNTIME, "bench: curl_multi_perform failed");
            why_stop = "the client loop failed";
            break;
        }
        CURLMsg *msg;
        int left, progressed = 0;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            req *q = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&q);
            CURLcode cc = msg->data.result;
            finish(q, cc, ms_now());
            curl_multi_remove_handle(m, q->easy);
            live[q->res - res] = NULL;
            req_free(q);
            open--;
            done++;
            progressed = 1;
        }
        if (progressed && cfg->progress) draw_progress(done, n, ms_now() - t0);
        if (done >= n) break;
        /* Sleep until the next arrival (when one could start) or curl activity, at most 50 ms. */
        double wait = 0.05;
        if (next < n && (cfg->max_concurrency <= 0 || open < cfg->max_concurrency)) {
            double until = arrivals[next] - (ms_now() - t0);
            if (until < wait) wait = until;
        }
        if (wait > 0) curl_multi_poll(m, NULL, 0, (int)ceil(wait * 1000.0), NULL);
    }
    /* Whatever is still open or unsent (time limit, loop failure) fails with the reason. */
    for (int i = 0; i < n; i++) {
        if (live[i]) {
            curl_multi_remove_handle(m, live[i]->easy);
            set_error(&res[i], "stopped: %s", why_stop ? why_stop : "run ended");
            req_free(live[i]);
        } else if (i >= next) {
            ms_bench_result_reset(&res[i], p[i].prompt_len, p[i].output_len);
            set_error(&res[i], "not sent: %s", why_stop ? why_stop : "run ended");
        }
    }
    if (cfg->progress && done < n) fputc('\n', stderr);
    *t_end = ms_now();
    free(live);
    curl_multi_cleanup(m);
    return rc;
}

double ms_bench_fetch_accept_length(const char *base_url, const char *api_key) {
    char url[2048];
    snprintf(url, sizeof url, "%s/get_server_info", base_url);
    buf b = {.max = (size_t)1 << 20};
    long code = 0;
    CURLcode cc = get_small(url, api_key, &b, &code);
    double al = 0;
    if (cc == CURLE_OK && code == 200 && !b.overflow) {
        json_t *root = json_loadb(b.p ? b.p : "", b.len, 0, NULL);
        json_t *v = json_object_get(json_array_get(json_object_get(root, "internal_states"), 0), "avg_spec_accept_length");
        if (json_is_number(v)) al = json_number_value(v);
        json_decref(root);
    }
    free(b.p);
    return al;
}
