/* guard.c - the watchdog: clients that go away, stall or trickle must not hold batch slots, KV
 * pages, memory or connections.
 *
 * libmicrohttpd does not look at a suspended connection, and a non-streaming request (or a stream
 * waiting for its first token) is suspended while the engine works: a client that disconnects
 * there would go unnoticed until its generation ran to max_tokens. A streaming client that stops
 * reading without closing keeps its socket writable-never, so its request runs on too. And the
 * daemon's only own timeout is inactivity, which a client trickling one byte at a time resets.
 * So a thread looks at every live request and connection a few times a second:
 *   - generating requests: the socket is polled for a hang-up (POLLRDHUP); a stream whose content
 *     reader has taken nothing for --stream-stall-timeout while output waits is stalled. Either
 *     way the request is marked (req.kill), resumed and its socket shut down; the HTTP thread then
 *     aborts its engine requests (slots and pages freed, counted as aborted);
 *   - generating requests older than --request-timeout: their engine requests are aborted, so the
 *     response ends normally with finish_reason "abort";
 *   - requests still receiving their body: cut after --body-timeout, or when the average rate
 *     falls below --min-upload-rate after a grace period;
 *   - connections waiting for request headers (new or keep-alive): cut after --header-timeout.
 * Cutting is shutdown(2) on the socket: libmicrohttpd sees the error on its next look and closes
 * the connection through its normal path (on_completed), so no state is freed behind its back.
 * Request bodies also draw from one global budget (--max-body-buffer-bytes); over it, 503. */
#include "server/server_int.h"

#include "core/fileutil.h"
#include "core/log.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define GUARD_TICK_US 200000   /* 5 looks a second: a disconnect is seen within ~0.2 s */
#define UPLOAD_GRACE_S 5.0     /* the minimum upload rate applies after this long */

static long long now_ms(void) { return (long long)(ms_now() * 1000.0); }

void ms_srv_notify_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                              enum MHD_ConnectionNotificationCode toe) {
    ms_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_rec *c = calloc(1, sizeof *c);
        if (!c) return; /* untracked: only the idle timeout applies to it */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        c->fd = ci ? (int)ci->connect_fd : -1;
        c->t_wait_ms = now_ms();
        pthread_mutex_lock(&s->conns_mu);
        c->next = s->conns;
        if (s->conns) s->conns->prev = c;
        s->conns = c;
        pthread_mutex_unlock(&s->conns_mu);
        *socket_context = c;
        return;
    }
    conn_rec *c = *socket_context;
    if (!c) return;
    pthread_mutex_lock(&s->conns_mu);
    if (c->prev) c->prev->next = c->next;
    else s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    pthread_mutex_unlock(&s->conns_mu);
    *socket_context = NULL;
    free(c);
}

void ms_srv_body_release(req *r) {
    if (r->body_acct) {
        r->srv->body_bytes -= r->body_acct;
        r->body_acct = 0;
    }
}

/* 1 when the peer has closed or reset the connection (no data is consumed). */
static int peer_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
    int n = poll(&p, 1, 0);
    if (n <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return 1;
    if (p.revents & POLLRDHUP) {
        /* the peer's write side is closed; data it sent before may still be queued (a pipelined
         * request): gone only when nothing is left to read */
        char b;
        ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return 0;
}

/* Marks r for the HTTP thread, wakes it, and shuts the socket so the connection ends. */
static void kill_req(req *r, int why) {
    pthread_mutex_lock(&r->mu);
    if (!r->kill) r->kill = why;
    if (r->suspended) {
        r->suspended = 0;
        MHD_resume_connection(r->conn);
    }
    pthread_mutex_unlock(&r->mu);
    if (r->fd >= 0) shutdown(r->fd, SHUT_RDWR);
}

static void look_at_requests(ms_server *s, long long t) {
    const ms_server_config *cfg = &s->cfg;
    pthread_mutex_lock(&s->live_mu);
    for (req *r = s->live; r; r = r->live_next) {
        pthread_mutex_lock(&r->mu);
        int killed = r->kill, suspended = r->suspended;
        pthread_mutex_unlock(&r->mu);
        if (killed) continue;
        int st = r->wd_state;
        if (st == 0) {
            double age = (double)(t - (long long)(r->t0 * 1000.0)) / 1000.0;
            double rate = age > 0 ? (double)r->body_rx / age : 0;
            if (age > cfg->body_timeout_s ||
                (cfg->min_upload_bps > 0 && age > UPLOAD_GRACE_S && rate < cfg->min_upload_bps)) {
                MS_LOGD("request body too slow (%.0f bytes in %.1f s): connection closed", (double)r->body_rx, age);
                ms_metrics_guard(&s->metrics, MS_GUARD_SLOW_UPLOAD);
                kill_req(r, KILL_BODY);
            }
        } else if (st == 1) {
            if (cfg->request_timeout_s > 0 && !r->timed_out &&
                (double)(t - (long long)(r->t0 * 1000.0)) / 1000.0 > cfg->request_timeout_s) {
                /* the choices were all allocated before wd_state became 1; ms_engine_abort is safe for
                 * finished ids, so no HTTP-thread state is needed */
                r->timed_out = 1;
                ms_metrics_guard(&s->metrics, MS_GUARD_REQUEST_TIMEOUT);
                for (int i = 0; i < r->n_ch; i++)
                    if (r->ch[i].submitted) r->ops.abort(r->ops.ctx, r->ch[i].eid);
            }
            if (peer_gone(r->fd)) {
                ms_metrics_guard(&s->metrics, MS_GUARD_CLIENT_GONE);
                kill_req(r, KILL_GONE);
            } else if (r->streaming && !suspended && cfg->stream_stall_timeout_s > 0 &&
                       (double)(t - r->t_progress_ms) / 1000.0 > cfg->stream_stall_timeout_s) {
                MS_LOGD("stream reader stalled for %.1f s: request aborted", (double)(t - r->t_progress_ms) / 1000.0);
                ms_metrics_guard(&s->metrics, MS_GUARD_STREAM_STALL);
                kill_req(r, KILL_STALL);
            }
        }
    }
    pthread_mutex_unlock(&s->live_mu);
}

static void look_at_connections(ms_server *s, long long t) {
    long long lim = (long long)(s->cfg.header_timeout_s * 1000.0);
    pthread_mutex_lock(&s->conns_mu);
    for (conn_rec *c = s->conns; c; c = c->next) {
        if (c->in_req || c->fd < 0 || t - c->t_wait_ms <= lim) continue;
        c->t_wait_ms = (long long)1 << 60; /* once */
        ms_metrics_guard(&s->metrics, MS_GUARD_HEADER_TIMEOUT);
        shutdown(c->fd, SHUT_RDWR);
    }
    pthread_mutex_unlock(&s->conns_mu);
}

static void *guard_main(void *p) {
    ms_server *s = p;
    while (!s->guard_stop) {
        usleep(GUARD_TICK_US);
        long long t = now_ms();
        look_at_requests(s, t);
        look_at_connections(s, t);
    }
    return NULL;
}

int ms_srv_guard_start(ms_server *s, ms_err *err) {
    s->guard_stop = 0;
    if (pthread_create(&s->guard_th, NULL, guard_main, s) != 0)
        return ms_errf(err, MS_ERR_IO, "server: cannot start the connection watchdog thread");
    s->guard_started = 1;
    return MS_OK;
}

void ms_srv_guard_stop(ms_server *s) {
    if (!s->guard_started) return;
    s->guard_stop = 1;
    pthread_join(s->guard_th, NULL);
    s->guard_started = 0;
}
