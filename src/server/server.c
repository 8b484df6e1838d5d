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
    c->max_connections = 4096;
    c->max_header_bytes = 32u << 10;
    c->idle_timeout_s = 600;
    c->header_timeout_s = 60;
    c->body_timeout_s = 120;
    c->min_upload_bps = 1024;
    c->body_budget_bytes = (size_t)256 << 20;
    c->stream_stall_timeout_s = 60;
    c->shutdown_timeout_s = 30;
    c->max_choices = 64;
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
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        r->fd = ci ? (int)ci->connect_fd : -1;
        ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        r->cr = ci ? ci->socket_context : NULL;
        if (r->cr) r->cr->in_req = 1;
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
        if (cl && (long long)strtoull(cl, NULL, 10) > (long long)s->cfg.body_budget_bytes - s->body_bytes) {
            r->phase = PH_DONE;
            ms_metrics_guard(&s->metrics, MS_GUARD_BODY_BUDGET);
            return ms_srv_fail(s, conn, 503, "server_error", NULL, "server_busy",
                               "The server is buffering too many request bodies; retry later.");
        }
        return MHD_YES;
    }
    if (r->phase == PH_DONE) { *upload_size = 0; return MHD_YES; }
    if (r->phase == PH_WAIT) {
        pthread_mutex_lock(&r->mu);
        int kill = r->kill;
        pthread_mutex_unlock(&r->mu);
        if (kill) { /* the watchdog saw the client go: end the connection; on_completed aborts the work */
            ms_srv_abort_all(r);
            return MHD_NO;
        }
        return ms_srv_continue_wait(r, conn);
    }
    if (*upload_size) {
        r->body_rx += (long long)*upload_size;
        if (r->too_large || r->too_busy) {
        } else if (r->body.len + *upload_size > s->cfg.max_request_bytes) {
            r->too_large = 1;
        } else if (s->body_bytes + (long long)*upload_size > (long long)s->cfg.body_budget_bytes) {
            r->too_busy = 1; /* over the global budget: drop the body, answer 503 at its end */
        } else {
            ms_sbuf_add(&r->body, upload, *upload_size);
            s->body_bytes += (long long)*upload_size;
            r->body_acct += (long long)*upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    r->wd_state = 2; /* body complete */
    if (r->too_busy) {
        r->phase = PH_DONE;
        ms_srv_body_release(r);
        ms_metrics_guard(&s->metrics, MS_GUARD_BODY_BUDGET);
        return ms_srv_fail(s, conn, 503, "server_error", NULL, "server_busy",
                           "The server is buffering too many request bodies; retry later.");
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
        if ((s->cfg.max_queued > 0 || s->cfg.max_queue_wait_s > 0) && s->ops.stats) { /* overload: refuse before the costly parse + tokenize */
            ms_engine_stats st;
            s->ops.stats(s->ops.ctx, &st);
            if ((s->cfg.max_queued > 0 && st.waiting >= s->cfg.max_queued) ||
                (s->cfg.max_queue_wait_s > 0 && ms_engine_queue_wait(st.waiting, st.admit_rate) > s->cfg.max_queue_wait_s)) {
                r->phase = PH_DONE;
                ms_srv_body_release(r);
                return ms_srv_fail(s, conn, 503, "server_error", NULL, "server_busy", "The server is at capacity (queue full); retry later.");
            }
        }
        r->phase = PH_DONE;
        enum MHD_Result rc = ms_srv_start_generation(r, conn);
        ms_srv_body_release(r); /* parsed: the body no longer counts against the budget */
        ms_sbuf_free(&r->body);
        return rc;
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
    ms_srv_body_release(r);
    if (r->cr) { /* the connection waits for the next request's headers from now on */
        r->cr->t_wait_ms = (long long)(ms_now() * 1000.0);
        r->cr->in_req = 0;
    }
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK || !ms_srv_all_done(r)) {
        /* client went away (or the response ended early): free the engine's work; a disconnect the
         * daemon saw itself (the watchdog counts its own) is counted here */
        pthread_mutex_lock(&r->mu);
        int killed = r->kill;
        pthread_mutex_unlock(&r->mu);
        if (!killed && r->wd_state == 1 && !ms_srv_all_done(r) && !s->stopping) ms_metrics_guard(&s->metrics, MS_GUARD_CLIENT_GONE);
        ms_srv_abort_all(r);
        for (int i = 0; i < r->n_ch; i++)
            if (!r->ch[i].done && r->ch[i].submitted) /* a choice refused before submission was never running */
                ms_metrics_finish(&s->metrics, ms_now() - r->t0, MS_FR_ABORT, r->ch[i].n_prompt, r->ch[i].n_gen);
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
    if (s->cfg.max_connections <= 0) s->cfg.max_connections = 4096;
    if (s->cfg.max_header_bytes < 4096) s->cfg.max_header_bytes = s->cfg.max_header_bytes ? 4096 : 32u << 10;
    if (s->cfg.idle_timeout_s <= 0) s->cfg.idle_timeout_s = 600;
    if (s->cfg.header_timeout_s <= 0) s->cfg.header_timeout_s = 60;
    if (s->cfg.body_timeout_s <= 0) s->cfg.body_timeout_s = 120;
    if (s->cfg.min_upload_bps == 0) s->cfg.min_upload_bps = 1024;
    if (!s->cfg.body_budget_bytes) s->cfg.body_budget_bytes = (size_t)256 << 20;
    if (s->cfg.body_budget_bytes < s->cfg.max_request_bytes) s->cfg.body_budget_bytes = s->cfg.max_request_bytes;
    if (s->cfg.stream_stall_timeout_s == 0) s->cfg.stream_stall_timeout_s = 60;
    if (s->cfg.shutdown_timeout_s < 0) s->cfg.shutdown_timeout_s = 0;
    if (s->cfg.max_choices <= 0) s->cfg.max_choices = 64;
    if (!s->cfg.lim.model_names[0]) s->cfg.lim.model_names[0] = "default";
    s->t_start = (double)time(NULL);
    s->t_start_mono = ms_now();
    snprintf(s->fingerprint, sizeof s->fingerprint, "moeserve-%s", s->cfg.version ? s->cfg.version : "0");
    ms_metrics_init(&s->metrics);
    pthread_mutex_init(&s->live_mu, NULL);
    pthread_mutex_init(&s->conns_mu, NULL);

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
                            MHD_OPTION_NOTIFY_CONNECTION, ms_srv_notify_connection, s,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg.max_connections,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, s->cfg.max_header_bytes,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(s->cfg.idle_timeout_s + 0.5),
                            MHD_OPTION_END);
    if (!s->d) {
        ms_metrics_destroy(&s->metrics);
        free(s);
        return ms_errf(err, MS_ERR_IO, "flag --port: cannot listen on %s:%d (in use or not permitted)", cfg->host, cfg->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->cfg.port;
    if (ms_srv_guard_start(s, err) != MS_OK) {
        MHD_stop_daemon(s->d);
        ms_metrics_destroy(&s->metrics);
        free(s);
        return err->code;
    }
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

/* Requests still open (their connection not completed). */
static int n_live(ms_server *s) {
    int n = 0;
    pthread_mutex_lock(&s->live_mu);
    for (req *r = s->live; r; r = r->live_next) n++;
    pthread_mutex_unlock(&s->live_mu);
    return n;
}

void ms_server_stop(ms_server *s) {
    if (!s) return;
    s->stopping = 1; /* new requests on open connections get 503 */
    MHD_socket lsock = MHD_quiesce_daemon(s->d); /* no new connections */
    /* let running requests finish, up to the shutdown timeout */
    double t_end = ms_now() + s->cfg.shutdown_timeout_s;
    int n = n_live(s);
    if (n && s->cfg.shutdown_timeout_s > 0) MS_LOGI("shutdown: waiting up to %.0f s for %d running request(s)", s->cfg.shutdown_timeout_s, n);
    while (n_live(s) > 0 && ms_now() < t_end) usleep(20000);
    if ((n = n_live(s)) > 0) MS_LOGI("shutdown: aborting %d request(s) still running", n);
    /* abort everything in flight; the engine's final events end the responses */
    for (int round = 0; round < 300 && flag_live(s, 0) > 0; round++) usleep(10000);
    /* still there after 3 s: end them without waiting for the engine */
    for (int round = 0; round < 100 && flag_live(s, 1) > 0; round++) usleep(10000);
    /* MHD_stop_daemon must not see suspended connections; none is left suspended above */
    ms_srv_guard_stop(s);
    MHD_stop_daemon(s->d);
    if (lsock != MHD_INVALID_SOCKET) close(lsock);
    pthread_mutex_destroy(&s->live_mu);
    pthread_mutex_destroy(&s->conns_mu);
    ms_metrics_destroy(&s->metrics);
    free(s);
}
