/* server.c - the HTTP daemon: start/stop, connection callbacks, authentication, dispatch.
 *
 * The rest of the server is split by concern (server_int.h lists the parts); this file keeps what
 * touches libmicrohttpd's connection lifecycle, so the request lifetime rules below live in one place.
 *
 * Lifecycle of a generation request (struct req):
 *   1. libmicrohttpd calls on_request repeatedly while the body arrives (bounded by
 *      max_request_bytes), then once more with no data: the body is parsed, the prompt rendered
 *      and tokenized, and one engine request per choice is submitted.
 *   2. Engine callbacks (engine thread) append events to req->q and resume the connection if it
 *      is suspended. All text work happens on the HTTP thread: streaming responses process events
 *      in the content reader; non-streaming ones in on_request, which libmicrohttpd calls again
 *      after each resume. With nothing to do, the connection is suspended (no busy waiting).
 *   3. A req is freed when both libmicrohttpd (completion callback) and every submitted engine
 *      request (final event) have let go of it (refcount). A client that disconnects gets its
 *      engine requests aborted, which frees their KV pages.
 * Invalid UTF-8 in a request body is rejected with 400 (jansson refuses it). */
#include "server/server_int.h"

#include "core/fileutil.h"
#include "core/log.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

void ms_server_config_default(ms_server_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8000;
    c->max_request_bytes = 10u << 20;
    c->n_threads = 4;
    c->tool_parser = -1;
    c->lim.default_temperature = 1.0f;
    c->lim.default_top_p = 1.0f;
    c->lim.enable_thinking_default = 1;
    c->version = "0";
}

/* ---- responses ------------------------------------------------------------------------------ */

enum MHD_Result ms_srv_send_buf(ms_server *s, struct MHD_Connection *c, int status, const char *ctype,
                                const char *data, size_t len, const char *retry_after) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", ctype);
    if (retry_after) MHD_add_response_header(resp, "Retry-After", retry_after);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    ms_metrics_http(&s->metrics, status);
    return rc;
}

enum MHD_Result ms_srv_send_json(ms_server *s, struct MHD_Connection *c, int status, const ms_sbuf *b) {
    return ms_srv_send_buf(s, c, status, "application/json", ms_sbuf_str(b), b->len, NULL);
}

enum MHD_Result ms_srv_send_error(ms_server *s, struct MHD_Connection *c, const ms_api_error *e) {
    ms_sbuf b = {0};
    ms_api_error_json(e, &b);
    const char *retry = e->status == 503 ? "1" : NULL;
    enum MHD_Result rc = ms_srv_send_buf(s, c, e->status, "application/json", ms_sbuf_str(&b), b.len, retry);
    ms_sbuf_free(&b);
    if (e->status >= 500) MS_LOGW("HTTP %d: %s", e->status, e->message);
    return rc;
}

enum MHD_Result ms_srv_fail(ms_server *s, struct MHD_Connection *c, int status, const char *type,
                            const char *param, const char *code, const char *msg) {
    ms_api_error e;
    ms_api_fail(&e, status, type, param, code, "%s", msg);
    return ms_srv_send_error(s, c, &e);
}

/* Constant-time comparison of the presented bearer token with the key. */
static int auth_ok(const char *key, const char *header) {
    if (!key || !key[0]) return 1;
    if (!header || strncmp(header, "Bearer ", 7) != 0) return 0;
    const char *tok = header + 7;
    size_t kl = strlen(key), tl = strlen(tok);
    unsigned char diff = (unsigned char)(kl != tl);
    for (size_t i = 0; i < kl; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < tl ? tok[i] : 0);
    return diff == 0;
}

/* ---- libmicrohttpd callbacks ------------------------------------------------------------------- */

static int needs_auth(const char *url) { return !strncmp(url, "/v1/", 4) || !strcmp(url, "/get_server_info"); }

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    ms_server *s = cls;
    (void)version;
    req *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->srv = s;
        r->ops = s->ops;
        pthread_mutex_init(&r->mu, NULL);
        r->refs = 1;
        r->conn = conn;
        r->t0 = ms_now();
        r->is_post = !strcmp(method, "POST");
        snprintf(r->method, sizeof r->method, "%s", method);
        snprintf(r->url, sizeof r->url, "%s", url);
        char *q = strchr(r->url, '?');
        if (q) *q = 0;
        pthread_mutex_lock(&s->live_mu);
        r->live_next = s->live;
        if (s->live) s->live->live_prev = r;
        s->live = r;
        pthread_mutex_unlock(&s->live_mu);
        *con_cls = r;
        if (needs_auth(r->url) &&
            !auth_ok(s->cfg.api_key, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization"))) {
            r->phase = PH_DONE;
            return ms_srv_fail(s, conn, 401, "invalid_request_error", NULL, "invalid_api_key",
                        "Incorrect or missing API key: send 'Authorization: Bearer <key>'.");
        }
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_request_bytes) {
            r->phase = PH_DONE;
            char msg[160];
            snprintf(msg, sizeof msg, "The request body is larger than the limit of %zu bytes.", s->cfg.max_request_bytes);
            return ms_srv_fail(s, conn, 413, "invalid_request_error", NULL, "request_too_large", msg);
        }
        return MHD_YES;
    }
    if (r->phase == PH_DONE) { *upload_size = 0; return MHD_YES; }
    if (r->phase == PH_WAIT) return ms_srv_continue_wait(r, conn);
    if (*upload_size) {
        if (!r->too_large && r->body.len + *upload_size <= s->cfg.max_request_bytes) ms_sbuf_add(&r->body, upload, *upload_size);
        else r->too_large = 1;
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->too_large) {
        r->phase = PH_DONE;
        char msg[160];
        snprintf(msg, sizeof msg, "The request body is larger than the limit of %zu bytes.", s->cfg.max_request_bytes);
        return ms_srv_fail(s, conn, 413, "invalid_request_error", NULL, "request_too_large", msg);
    }
    const char *u = r->url;
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (s->stopping) { r->phase = PH_DONE; return ms_srv_fail(s, conn, 503, "server_error", NULL, "shutting_down", "The server is shutting down."); }
    if (!strcmp(u, "/v1/chat/completions") || !strcmp(u, "/v1/completions")) {
        if (!r->is_post) { r->phase = PH_DONE; return ms_srv_fail(s, conn, 405, "invalid_request_error", NULL, "method_not_allowed", "Use POST for this route."); }
        r->phase = PH_DONE;
        return ms_srv_start_generation(r, conn);
    }
    r->phase = PH_DONE;
    return ms_srv_route_other(s, conn, u, get);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    if (ms_log_level() < MS_LOG_DEBUG) return;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && buf[n - 1] == '\n') buf[--n] = 0;
    MS_LOGD("libmicrohttpd: %s", buf);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    ms_server *s = cls;
    req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    if (ms_log_level() >= MS_LOG_INFO) { /* the access log: one line per request */
        const union MHD_ConnectionInfo *st = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_HTTP_STATUS);
        MS_LOGI("%s %s %u %.1f ms%s", r->method, r->url, st ? st->http_status : 0u, (ms_now() - r->t0) * 1e3,
                toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (ended early: client gone or error)");
    }
    pthread_mutex_lock(&s->live_mu);
    if (r->live_prev) r->live_prev->live_next = r->live_next;
    else s->live = r->live_next;
    if (r->live_next) r->live_next->live_prev = r->live_prev;
    pthread_mutex_unlock(&s->live_mu);
    pthread_mutex_lock(&r->mu);
    r->mhd_done = 1;
    pthread_mutex_unlock(&r->mu);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK || !ms_srv_all_done(r)) {
        /* client went away (or the response ended early): free the engine's work */
        ms_srv_abort_all(r);
        for (int i = 0; i < r->n_ch; i++)
            if (!r->ch[i].done) ms_metrics_finish(&s->metrics, ms_now() - r->t0, MS_FR_ABORT, r->ch[i].n_prompt, r->ch[i].n_gen);
    }
    ms_srv_req_unref(r);
}

int ms_server_start(const ms_server_config *cfg, const ms_server_ops *ops, ms_server **out, ms_err *err) {
    ms_server *s = calloc(1, sizeof *s);
    if (!s) return ms_errf(err, MS_ERR_NOMEM, "server: out of memory");
    s->cfg = *cfg;
    s->ops = *ops;
    if (!s->cfg.host || !s->cfg.host[0]) s->cfg.host = "127.0.0.1";
    if (!s->cfg.max_request_bytes) s->cfg.max_request_bytes = 10u << 20;
    if (s->cfg.n_threads <= 0) s->cfg.n_threads = 4;
    if (!s->cfg.lim.model_names[0]) s->cfg.lim.model_names[0] = "default";
    s->t_start = (double)time(NULL);
    snprintf(s->fingerprint, sizeof s->fingerprint, "moeserve-%s", s->cfg.version ? s->cfg.version : "0");
    ms_metrics_init(&s->metrics);
    pthread_mutex_init(&s->live_mu, NULL);

    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    struct sockaddr *sa;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    memset(&a4, 0, sizeof a4);
    memset(&a6, 0, sizeof a6);
    if (inet_pton(AF_INET, s->cfg.host, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)s->cfg.port);
        sa = (struct sockaddr *)&a4;
    } else if (inet_pton(AF_INET6, s->cfg.host, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)s->cfg.port);
        sa = (struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else {
        ms_metrics_destroy(&s->metrics);
        free(s);
        return ms_errf(err, MS_ERR_INVALID, "flag --host: '%s' is not an IPv4 or IPv6 address", cfg->host);
    }
    s->d = MHD_start_daemon(flags, (uint16_t)s->cfg.port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, sa,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->cfg.n_threads,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)4096,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
                            MHD_OPTION_END);
    if (!s->d) {
        ms_metrics_destroy(&s->metrics);
        free(s);
        return ms_errf(err, MS_ERR_IO, "flag --port: cannot listen on %s:%d (in use or not permitted)", cfg->host, cfg->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->cfg.port;
    *out = s;
    return MS_OK;
}

int ms_server_port(const ms_server *s) { return s->port; }

/* Sets a flag on every live request and wakes it (lock order: live_mu, then r->mu). */
static int flag_live(ms_server *s, int force) {
    int n = 0;
    pthread_mutex_lock(&s->live_mu);
    for (req *r = s->live; r; r = r->live_next) {
        n++;
        pthread_mutex_lock(&r->mu);
        r->shutdown = 1;
        if (force) r->force_end = 1;
        if (r->suspended) {
            r->suspended = 0;
            MHD_resume_connection(r->conn);
        }
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&s->live_mu);
    return n;
}

void ms_server_stop(ms_server *s) {
    if (!s) return;
    s->stopping = 1;
    /* abort everything in flight; the engine's final events end the responses */
    for (int round = 0; round < 300 && flag_live(s, 0) > 0; round++) usleep(10000);
    /* still there after 3 s: end them without waiting for the engine */
    for (int round = 0; round < 100 && flag_live(s, 1) > 0; round++) usleep(10000);
    /* MHD_stop_daemon must not see suspended connections; none is left suspended above */
    MHD_stop_daemon(s->d);
    pthread_mutex_destroy(&s->live_mu);
    ms_metrics_destroy(&s->metrics);
    free(s);
}
