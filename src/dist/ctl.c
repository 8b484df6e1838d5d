/* ctl.c - node 0 -> followers step-plan channel over TCP (see ctl.h for why it exists). Frames are
 * the communicator's (magic, version, type, sequence number, length); every wait is a bounded
 * poll() except a follower's idle wait, which still wakes on a closed connection or an abort. */
#include "dist/ctl.h"
#include "dist/comm.h"
#include "dist/dist_internal.h"

#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define CTL_MAX_MSG ((uint64_t)1 << 32) /* a plan larger than 4 GiB is a protocol error */

struct ms_dist_ctl {
    int node, nnodes;
    double timeout_s;
    int *fds; /* node 0: fds[r] for r >= 1; followers: fds[0] */
    char (*addrs)[64];
    uint32_t seq;
    unsigned char *buf;
    size_t cap;
    pthread_mutex_t mu;
    int broken;
    char cause[MS_ERR_MSG_MAX];
};

static void shut(ms_dist_ctl *c) {
    for (int r = 0; r < c->nnodes; r++)
        if (c->fds[r] >= 0) shutdown(c->fds[r], SHUT_RDWR);
}

static int cfail(ms_dist_ctl *c, ms_err *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int cfail(ms_dist_ctl *c, ms_err *err, const char *fmt, ...) {
    char m[MS_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->mu);
    int first = !c->broken;
    if (first) {
        c->broken = 1;
        snprintf(c->cause, sizeof c->cause, "control channel node %d: %s", c->node, m);
    }
    pthread_mutex_unlock(&c->mu);
    if (first) shut(c);
    return ms_errf(err, MS_ERR_RUNTIME, "%s", c->cause);
}

static int cbroken(ms_dist_ctl *c, ms_err *err) {
    pthread_mutex_lock(&c->mu);
    int b = c->broken;
    pthread_mutex_unlock(&c->mu);
    return b ? ms_errf(err, MS_ERR_RUNTIME, "%s", c->cause) : MS_OK;
}

int ms_dist_ctl_addr(const char *init_addr, char *out, size_t out_size, ms_err *err) {
    char host[256];
    int port = 0;
    MS_TRY(ms_dist_parse_addr(init_addr, host, sizeof host, &port, err));
    if (port >= 65535)
        return ms_errf(err, MS_ERR_INVALID, "flag --dist-init-addr: port %d leaves no room for the control channel (port+1)",
                       port);
    snprintf(out, out_size, "%s:%d", host, port + 1);
    return MS_OK;
}

void ms_dist_ctl_close(ms_dist_ctl *c) {
    if (!c) return;
    for (int r = 0; r < c->nnodes; r++) ms_dist_close(&c->fds[r]);
    pthread_mutex_destroy(&c->mu);
    free(c->fds);
    free(c->addrs);
    free(c->buf);
    free(c);
}

int ms_dist_ctl_open(const char *host_port, int node_rank, int nnodes, double timeout_s, ms_dist_ctl **out,
                     ms_err *err) {
    *out = NULL;
    if (nnodes < 1 || nnodes > 4096 || node_rank < 0 || node_rank >= nnodes)
        return ms_errf(err, MS_ERR_INVALID, "flag --node-rank: %d is out of range for --nnodes %d", node_rank, nnodes);
    if (!(timeout_s > 0)) return ms_errf(err, MS_ERR_INVALID, "control channel: timeout %.3f s must be > 0", timeout_s);
    char host[256];
    int port = 0;
    MS_TRY(ms_dist_parse_addr(host_port, host, sizeof host, &port, err));
    ms_dist_ctl *c = calloc(1, sizeof *c);
    if (!c) return ms_errf(err, MS_ERR_NOMEM, "control channel: out of memory");
    c->node = node_rank;
    c->nnodes = nnodes;
    c->timeout_s = timeout_s;
    c->fds = malloc((size_t)nnodes * sizeof *c->fds);
    c->addrs = calloc((size_t)nnodes, sizeof *c->addrs);
    pthread_mutex_init(&c->mu, NULL);
    if (!c->fds || !c->addrs) {
        c->nnodes = 0;
        ms_dist_ctl_close(c);
        return ms_errf(err, MS_ERR_NOMEM, "control channel: out of memory");
    }
    for (int r = 0; r < nnodes; r++) c->fds[r] = -1;
    double deadline = ms_dist_now() + timeout_s;
    int rc = MS_OK;
    if (nnodes > 1 && node_rank == 0) {
        int lfd = -1;
        rc = ms_dist_listen(host, port, &lfd, err);
        if (rc == MS_OK)
            rc = ms_dist_accept_group(lfd, MS_CH_CTL, nnodes, deadline, "control channel", c->fds, c->addrs, err);
        ms_dist_close(&lfd);
    } else if (nnodes > 1) {
        snprintf(c->addrs[0], sizeof c->addrs[0], "%s:%d", host, port);
        rc = ms_dist_connect(host, port, deadline, &c->fds[0], err);
        if (rc != MS_OK) ms_err_prefix(err, "control channel node %d", node_rank);
        char who[96];
        snprintf(who, sizeof who, "node 0's control channel at %s", c->addrs[0]);
        if (rc == MS_OK) rc = ms_dist_hello(c->fds[0], MS_CH_CTL, node_rank, nnodes, deadline, who, err);
    }
    if (rc != MS_OK) {
        ms_dist_ctl_close(c);
        return rc;
    }
    *out = c;
    return MS_OK;
}

static int send_type(ms_dist_ctl *c, int type, const void *msg, size_t n, int try_all, ms_err *err) {
    if (c->node != 0)
        return ms_errf(err, MS_ERR_INVALID, "control channel node %d: only node 0 sends plans", c->node);
    MS_TRY(cbroken(c, err));
    double deadline = ms_dist_now() + c->timeout_s;
    c->seq++;
    ms_frame f = {MS_DIST_MAGIC, MS_DIST_VERSION, (uint16_t)type, c->seq, 0, n};
    int first = MS_OK;
    for (int r = 1; r < c->nnodes; r++) {
        int e = 0, rc = ms_dist_send_frame(c->fds[r], &f, msg, deadline, 0, &e);
        if (rc == NET_OK) continue;
        char what[128];
        ms_err tmp = {0};
        int code = rc == NET_TIMEOUT ? cfail(c, &tmp, "node %d (%s) did not take the message within %.1f s", r, c->addrs[r],
                                             c->timeout_s)
                                     : cfail(c, &tmp, "node %d (%s) %s", r, c->addrs[r],
                                             ms_dist_net_what(rc, e, what, sizeof what));
        if (first == MS_OK) {
            first = code;
            if (err) *err = tmp;
        }
        if (!try_all) break;
    }
    return first;
}

int ms_dist_ctl_send_all(ms_dist_ctl *c, const void *msg, size_t n, ms_err *err) {
    return send_type(c, MS_FR_CTL, msg, n, 0, err);
}

int ms_dist_ctl_shutdown(ms_dist_ctl *c, ms_err *err) { return send_type(c, MS_FR_SHUTDOWN, NULL, 0, 1, err); }

int ms_dist_ctl_check(ms_dist_ctl *c, ms_err *err) {
    if (c->node != 0) return MS_OK;
    MS_TRY(cbroken(c, err));
    for (int r = 1; r < c->nnodes; r++) {
        struct pollfd p = {.fd = c->fds[r], .events = POLLIN};
        if (poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLHUP | POLLERR)))
            return cfail(c, err, "node %d (%s) closed its connection (process exited or was killed?)", r, c->addrs[r]);
    }
    return MS_OK;
}

int ms_dist_ctl_recv(ms_dist_ctl *c, const void **msg, size_t *n, double wait_s, ms_err *err) {
    *msg = NULL;
    *n = 0;
    if (c->node == 0)
        return ms_errf(err, MS_ERR_INVALID, "control channel node 0: node 0 sends plans, it does not receive them");
    MS_TRY(cbroken(c, err));
    if (c->nnodes == 1) return ms_errf(err, MS_ERR_INVALID, "control channel: no node 0 in a one-node run");
    int fd = c->fds[0], e = 0;
    /* wait for the first byte (forever when asked): poll notices EOF at once */
    double first_dl = wait_s < 0 ? INFINITY : ms_dist_now() + wait_s;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        double left = isinf(first_dl) ? -1 : first_dl - ms_dist_now();
        int k = poll(&p, 1, left < 0 && !isinf(first_dl) ? 0 : isinf(first_dl) ? 1000 : (int)ceil(left * 1000));
        MS_TRY(cbroken(c, err));
        if (k > 0) break;
        if (k == 0 && !isinf(first_dl) && ms_dist_now() >= first_dl)
            return cfail(c, err, "node 0 (%s) sent no message within %.1f s", c->addrs[0], wait_s);
    }
    double deadline = ms_dist_now() + c->timeout_s;
    ms_frame f;
    char what[128];
    int rc = ms_dist_recv_frame_hdr(fd, &f, deadline, &e);
    if (rc != NET_OK) {
        MS_TRY(cbroken(c, err));
        return cfail(c, err, "node 0 (%s) %s", c->addrs[0], ms_dist_net_what(rc, e, what, sizeof what));
    }
    if (f.magic != MS_DIST_MAGIC || f.version != MS_DIST_VERSION)
        return cfail(c, err, "node 0 (%s) sent a bad frame (magic 0x%08x version %u)", c->addrs[0], f.magic, f.version);
    if (f.a != c->seq + 1)
        return cfail(c, err, "node 0 (%s) sent message %u, expected %u", c->addrs[0], f.a, c->seq + 1);
    c->seq = f.a;
    if (f.type == MS_FR_SHUTDOWN) return MS_OK;
    if (f.type != MS_FR_CTL || f.len > CTL_MAX_MSG)
        return cfail(c, err, "node 0 (%s) sent frame type %u of %llu bytes", c->addrs[0], f.type,
                     (unsigned long long)f.len);
    if (f.len + 1 > c->cap) {
        unsigned char *q = realloc(c->buf, (size_t)f.len + 1);
        if (!q) return cfail(c, err, "out of memory for a %llu-byte plan", (unsigned long long)f.len);
        c->buf = q;
        c->cap = (size_t)f.len + 1;
    }
    rc = f.len ? ms_dist_recv(fd, c->buf, (size_t)f.len, deadline, &e) : NET_OK;
    if (rc != NET_OK) {
        MS_TRY(cbroken(c, err));
        return cfail(c, err, "node 0 (%s) %s in the middle of a message", c->addrs[0],
                     ms_dist_net_what(rc, e, what, sizeof what));
    }
    *msg = c->buf;
    *n = (size_t)f.len;
    return MS_OK;
}

void ms_dist_ctl_abort(ms_dist_ctl *c, const char *why) {
    pthread_mutex_lock(&c->mu);
    int first = !c->broken;
    if (first) {
        c->broken = 1;
        snprintf(c->cause, sizeof c->cause, "control channel node %d aborted: %s", c->node, why ? why : "(no reason given)");
    }
    pthread_mutex_unlock(&c->mu);
    if (first) shut(c);
}
