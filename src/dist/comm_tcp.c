/* comm_tcp.c - the communicator for CPU ranks in different processes (--nnodes on CPU), and the
 * bootstrap that carries the NCCL unique id from node 0 to the other nodes.
 *
 * Correctness over speed: rank 0 is a hub. Each collective, every other rank sends its part to
 * rank 0 in one DATA frame (tagged with the call's op, dtype and root so differing call sequences
 * are caught), rank 0 reads them in rank order, reduces in rank order with the same float32 code
 * as the in-process communicator (bitwise equal results), and sends every rank its result. Every
 * socket wait is a poll() bounded by the collective's deadline (now + timeout_s). A failure breaks
 * the communicator: rank 0 tells the ranks it is not in the middle of a frame with an ERROR frame
 * carrying its sentence, then shuts every socket down, so every rank fails fast and names the
 * rank at fault. */
#include "dist/comm.h"
#include "dist/dist_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

enum { OP_ALL_REDUCE = 1, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_BROADCAST, OP_BARRIER };
static const char *op_name(int op) {
    static const char *n[] = {"?", "all_reduce_sum", "all_gather", "reduce_scatter_sum", "broadcast", "barrier"};
    return op >= 0 && op <= OP_BARRIER ? n[op] : "?";
}

typedef struct tcp_comm {
    ms_comm c;
    int *fds;            /* rank 0: fds[r] for r >= 1; others: fds[0] = the hub */
    char (*addrs)[64];   /* peer addresses, same indexing */
    unsigned char *dirty; /* rank 0: a frame to rank r was left half sent */
    pthread_mutex_t mu;
    int broken;
    char cause[MS_ERR_MSG_MAX];
    float *acc;
    size_t acc_cap;
    unsigned char *tmp;
    size_t tmp_cap;
} tcp_comm;

static tcp_comm *tc(ms_comm *c) { return (tcp_comm *)c; }

static void shutdown_all(tcp_comm *t) {
    for (int r = 0; r < t->c.size; r++)
        if (t->fds[r] >= 0) shutdown(t->fds[r], SHUT_RDWR);
}

/* Breaks the communicator with the first cause (later causes are consequences) and returns it. */
static int fail(tcp_comm *t, ms_err *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(tcp_comm *t, ms_err *err, const char *fmt, ...) {
    char m[MS_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&t->mu);
    int first = !t->broken;
    if (first) {
        t->broken = 1;
        snprintf(t->cause, sizeof t->cause, "tcp comm rank %d: %s", t->c.rank, m);
    }
    pthread_mutex_unlock(&t->mu);
    if (first && t->c.rank == 0) {
        ms_frame f = {MS_DIST_MAGIC, MS_DIST_VERSION, MS_FR_ERROR, 0, 0, strlen(t->cause)};
        for (int r = 1; r < t->c.size; r++) {
            int e = 0;
            if (t->fds[r] >= 0 && !t->dirty[r]) ms_dist_send_frame(t->fds[r], &f, t->cause, ms_dist_now() + 0.2, 0, &e);
        }
    }
    if (first) shutdown_all(t);
    return ms_errf(err, MS_ERR_RUNTIME, "%s", t->cause);
}

static int check_broken(tcp_comm *t, ms_err *err) {
    pthread_mutex_lock(&t->mu);
    int b = t->broken;
    pthread_mutex_unlock(&t->mu);
    return b ? ms_errf(err, MS_ERR_RUNTIME, "%s", t->cause) : MS_OK;
}

static int grow(tcp_comm *t, size_t acc_n, size_t tmp_bytes, ms_err *err) {
    if (acc_n > t->acc_cap) {
        float *q = realloc(t->acc, acc_n * sizeof(float));
        if (!q) return fail(t, err, "out of memory for a %zu-element reduction", acc_n);
        t->acc = q;
        t->acc_cap = acc_n;
    }
    if (tmp_bytes > t->tmp_cap) {
        unsigned char *q = realloc(t->tmp, tmp_bytes);
        if (!q) return fail(t, err, "out of memory for a %zu-byte receive buffer", tmp_bytes);
        t->tmp = q;
        t->tmp_cap = tmp_bytes;
    }
    return MS_OK;
}

/* A peer's view of a failure on the hub socket: an ERROR frame from rank 0 becomes its sentence. */
static int peer_net_fail(tcp_comm *t, int rc, int e, double deadline, int op, ms_err *err) {
    if (rc == NET_PEER_SPOKE) {
        ms_frame f;
        int e2 = 0;
        double dl = ms_dist_now() + 0.5;
        if (ms_dist_recv_frame_hdr(t->fds[0], &f, dl, &e2) == NET_OK && f.magic == MS_DIST_MAGIC &&
            f.type == MS_FR_ERROR && f.len < 4096) {
            char msg[MS_ERR_MSG_MAX];
            size_t n = f.len < sizeof msg - 1 ? (size_t)f.len : sizeof msg - 1;
            if (ms_dist_recv(t->fds[0], msg, n, dl, &e2) != NET_OK) n = 0;
            msg[n] = 0;
            return fail(t, err, "rank 0 failed during %s: %s", op_name(op), msg);
        }
        return fail(t, err, "rank 0 (%s) sent an unexpected frame during %s", t->addrs[0], op_name(op));
    }
    char what[128];
    if (rc == NET_TIMEOUT)
        return fail(t, err, "rank 0 (%s) did not answer within %.1f s during %s", t->addrs[0], t->c.timeout_s,
                    op_name(op));
    return fail(t, err, "rank 0 (%s) %s during %s", t->addrs[0], ms_dist_net_what(rc, e, what, sizeof what), op_name(op));
}

static int hub_net_fail(tcp_comm *t, int r, int rc, int e, int op, ms_err *err) {
    char what[128];
    if (rc == NET_TIMEOUT)
        return fail(t, err, "rank %d (%s) did not answer within %.1f s during %s", r, t->addrs[r], t->c.timeout_s,
                    op_name(op));
    return fail(t, err, "rank %d (%s) %s during %s", r, t->addrs[r], ms_dist_net_what(rc, e, what, sizeof what),
                op_name(op));
}

/* One collective. up/up_n: what this rank contributes (peers send it to rank 0); see each op below
 * for where rank 0 puts what it receives and what each rank gets back in down/down_n. */
static int collective(tcp_comm *t, int op, ms_dtype dt, int root, size_t cpr, const void *up, size_t up_n, void *down,
                      size_t down_n, ms_err *err) {
    MS_TRY(check_broken(t, err));
    int size = t->c.size;
    double deadline = ms_dist_now() + t->c.timeout_s;
    uint32_t sig = ((uint32_t)dt << 16) | (uint32_t)(root & 0xffff);
    int e = 0, rc;
    if (t->c.rank != 0) {
        ms_frame f = {MS_DIST_MAGIC, MS_DIST_VERSION, MS_FR_DATA, (uint32_t)op, sig, up_n};
        rc = ms_dist_send_frame(t->fds[0], &f, up, deadline, 1, &e);
        if (rc != NET_OK) return peer_net_fail(t, rc, e, deadline, op, err);
        rc = ms_dist_recv_frame_hdr(t->fds[0], &f, deadline, &e);
        if (rc != NET_OK) return peer_net_fail(t, rc, e, deadline, op, err);
        if (f.magic != MS_DIST_MAGIC) return fail(t, err, "rank 0 (%s) sent a bad frame (magic 0x%08x)", t->addrs[0], f.magic);
        if (f.type == MS_FR_ERROR) {
            /* reuse the PEER_SPOKE path, which reads the sentence: push the header back is not
             * possible, so read the payload here */
            char msg[MS_ERR_MSG_MAX];
            size_t n = f.len < sizeof msg - 1 ? (size_t)f.len : sizeof msg - 1;
            if (f.len > 4096 || ms_dist_recv(t->fds[0], msg, n, ms_dist_now() + 0.5, &e) != NET_OK) n = 0;
            msg[n] = 0;
            return fail(t, err, "rank 0 failed during %s: %s", op_name(op), msg);
        }
        if (f.type != MS_FR_DATA || f.a != (uint32_t)op || f.len != down_n)
            return fail(t, err, "rank 0 answered %s with frame type %u op %u, %llu bytes (want %zu)", op_name(op),
                        f.type, f.a, (unsigned long long)f.len, down_n);
        rc = down_n ? ms_dist_recv(t->fds[0], down, down_n, deadline, &e) : NET_OK;
        if (rc != NET_OK) return peer_net_fail(t, rc, e, deadline, op, err);
        return MS_OK;
    }
    /* rank 0: gather in rank order */
    size_t es = ms_dist_red_size(dt);
    if (op == OP_ALL_REDUCE || op == OP_REDUCE_SCATTER) {
        size_t n = up_n / es;
        MS_TRY(grow(t, n, up_n, err));
        ms_dist_acc_init(t->acc, up, n, dt);
    }
    for (int r = 1; r < size; r++) {
        ms_frame f;
        rc = ms_dist_recv_frame_hdr(t->fds[r], &f, deadline, &e);
        if (rc != NET_OK) return hub_net_fail(t, r, rc, e, op, err);
        if (f.magic != MS_DIST_MAGIC || f.type != MS_FR_DATA)
            return fail(t, err, "rank %d (%s) sent a bad frame (magic 0x%08x type %u) during %s", r, t->addrs[r],
                        f.magic, f.type, op_name(op));
        size_t want = op == OP_BROADCAST ? (r == root ? up_n : 0) : up_n;
        if (op == OP_BROADCAST && root == 0) want = 0;
        if (f.a != (uint32_t)op || f.b != sig || f.len != want)
            return fail(t, err,
                        "collective calls differ: rank %d called %s (dtype %s, root %u, %llu bytes) while rank 0 called "
                        "%s (dtype %s, root %d, %zu bytes)",
                        r, op_name((int)f.a), ms_dtype_name((ms_dtype)(f.b >> 16)), f.b & 0xffff,
                        (unsigned long long)f.len, op_name(op), ms_dtype_name(dt), root, want);
        void *dst = NULL;
        switch (op) {
        case OP_ALL_REDUCE:
        case OP_REDUCE_SCATTER: dst = t->tmp; break;
        case OP_ALL_GATHER: dst = (char *)down + (size_t)r * up_n; break;
        case OP_BROADCAST: dst = down; break;
        default: break;
        }
        if (want) {
            rc = ms_dist_recv(t->fds[r], dst, want, deadline, &e);
            if (rc != NET_OK) return hub_net_fail(t, r, rc, e, op, err);
        }
        if (op == OP_ALL_REDUCE || op == OP_REDUCE_SCATTER) ms_dist_acc_add(t->acc, t->tmp, up_n / es, dt);
    }
    /* rank 0's own result, then each rank's */
    if (op == OP_ALL_REDUCE) ms_dist_acc_store(down, t->acc, down_n / es, dt);
    if (op == OP_ALL_GATHER && up != down) memmove(down, up, up_n);
    if (op == OP_REDUCE_SCATTER) ms_dist_acc_store(down, t->acc, cpr, dt);
    for (int r = 1; r < size; r++) {
        const void *payload = down;
        size_t n = down_n;
        if (op == OP_REDUCE_SCATTER) {
            ms_dist_acc_store(t->tmp, t->acc + (size_t)r * cpr, cpr, dt);
            payload = t->tmp;
        }
        if (op == OP_BROADCAST && r == root) n = 0;
        if (op == OP_BARRIER) n = 0;
        ms_frame f = {MS_DIST_MAGIC, MS_DIST_VERSION, MS_FR_DATA, (uint32_t)op, sig, n};
        t->dirty[r] = 1;
        rc = ms_dist_send_frame(t->fds[r], &f, payload, deadline, 0, &e);
        if (rc != NET_OK) return hub_net_fail(t, r, rc, e, op, err);
        t->dirty[r] = 0;
    }
    return MS_OK;
}

static int check_red(ms_comm *c, ms_dtype dt, const char *what, ms_err *err) {
    if (!ms_dist_red_size(dt))
        return ms_errf(err, MS_ERR_UNSUPPORTED, "tcp comm rank %d: %s: dtype %s is not supported (F32 or BF16)", c->rank,
                       what, ms_dtype_name(dt));
    return MS_OK;
}

static int tc_all_reduce(ms_comm *c, void *buf, size_t count, ms_dtype dt, ms_err *err) {
    MS_TRY(check_red(c, dt, "all_reduce_sum", err));
    if (c->size == 1) return check_broken(tc(c), err);
    size_t n = count * ms_dist_red_size(dt);
    return collective(tc(c), OP_ALL_REDUCE, dt, 0, count, buf, n, buf, n, err);
}

static int tc_all_gather(ms_comm *c, const void *send, void *recv, size_t cpr, ms_dtype dt, ms_err *err) {
    size_t es = ms_dtype_size(dt);
    if (!es) return ms_errf(err, MS_ERR_INVALID, "tcp comm rank %d: all_gather: invalid dtype", c->rank);
    if (c->size == 1) {
        MS_TRY(check_broken(tc(c), err));
        if (send != recv) memmove(recv, send, cpr * es);
        return MS_OK;
    }
    /* a peer's own slice: place it first (recv may alias it), then receive everything */
    char *mine = (char *)recv + (size_t)c->rank * cpr * es;
    if (c->rank != 0 && send != mine) memmove(mine, send, cpr * es);
    return collective(tc(c), OP_ALL_GATHER, dt, 0, cpr, c->rank ? mine : send, cpr * es, recv,
                      (size_t)c->size * cpr * es, err);
}

static int tc_reduce_scatter(ms_comm *c, const void *send, void *recv, size_t cpr, ms_dtype dt, ms_err *err) {
    MS_TRY(check_red(c, dt, "reduce_scatter_sum", err));
    size_t es = ms_dist_red_size(dt);
    if (c->size == 1) {
        MS_TRY(check_broken(tc(c), err));
        if (send != recv) memmove(recv, send, cpr * es);
        return MS_OK;
    }
    return collective(tc(c), OP_REDUCE_SCATTER, dt, 0, cpr, send, (size_t)c->size * cpr * es, recv, cpr * es, err);
}

static int tc_broadcast(ms_comm *c, void *buf, size_t bytes, int root, ms_err *err) {
    if (root < 0 || root >= c->size)
        return ms_errf(err, MS_ERR_INVALID, "tcp comm rank %d: broadcast root %d out of range (size %d)", c->rank, root,
                       c->size);
    if (c->size == 1) return check_broken(tc(c), err);
    size_t up = (c->rank == root && root != 0) ? bytes : 0;
    size_t down = c->rank == root ? 0 : bytes;
    if (c->rank == 0) up = bytes, down = bytes; /* the hub holds (or receives) the data and sends it on */
    return collective(tc(c), OP_BROADCAST, MS_U8, root, bytes, buf, up, buf, down, err);
}

static int tc_barrier(ms_comm *c, ms_err *err) {
    if (c->size == 1) return check_broken(tc(c), err);
    return collective(tc(c), OP_BARRIER, MS_U8, 0, 0, NULL, 0, NULL, 0, err);
}

static void tc_abort(ms_comm *c, const char *why) {
    tcp_comm *t = tc(c);
    pthread_mutex_lock(&t->mu);
    int first = !t->broken;
    if (first) {
        t->broken = 1;
        snprintf(t->cause, sizeof t->cause, "tcp comm aborted on rank %d: %s", c->rank, why ? why : "(no reason given)");
    }
    pthread_mutex_unlock(&t->mu);
    if (first) shutdown_all(t); /* wakes a thread blocked in poll() on any of them */
}

static void tc_destroy(ms_comm *c) {
    if (!c) return;
    tcp_comm *t = tc(c);
    for (int r = 0; r < c->size; r++) ms_dist_close(&t->fds[r]);
    pthread_mutex_destroy(&t->mu);
    free(t->fds);
    free(t->addrs);
    free(t->dirty);
    free(t->acc);
    free(t->tmp);
    free(t);
}

static const ms_comm_ops tcp_ops = {
    .all_reduce_sum = tc_all_reduce,
    .all_gather = tc_all_gather,
    .reduce_scatter_sum = tc_reduce_scatter,
    .broadcast = tc_broadcast,
    .barrier = tc_barrier,
    .abort = tc_abort,
    .destroy = tc_destroy,
};

int ms_comm_tcp_create(const char *host_port, int rank, int size, double timeout_s, ms_comm **out, ms_err *err) {
    *out = NULL;
    if (size < 1 || size > 4096 || rank < 0 || rank >= size)
        return ms_errf(err, MS_ERR_INVALID, "tcp comm: rank %d of %d is out of range", rank, size);
    if (!(timeout_s > 0)) return ms_errf(err, MS_ERR_INVALID, "tcp comm: timeout %.3f s must be > 0", timeout_s);
    char host[256];
    int port = 0;
    MS_TRY(ms_dist_parse_addr(host_port, host, sizeof host, &port, err));
    tcp_comm *t = calloc(1, sizeof *t);
    if (!t) return ms_errf(err, MS_ERR_NOMEM, "tcp comm: out of memory");
    t->c = (ms_comm){&tcp_ops, "tcp", rank, size, timeout_s, t};
    t->fds = malloc((size_t)size * sizeof *t->fds);
    t->addrs = calloc((size_t)size, sizeof *t->addrs);
    t->dirty = calloc((size_t)size, 1);
    pthread_mutex_init(&t->mu, NULL);
    if (!t->fds || !t->addrs || !t->dirty) {
        free(t->fds);
        t->fds = NULL;
        t->c.size = 0;
        tc_destroy(&t->c);
        return ms_errf(err, MS_ERR_NOMEM, "tcp comm: out of memory");
    }
    for (int r = 0; r < size; r++) t->fds[r] = -1;
    int rc = MS_OK;
    double deadline = ms_dist_now() + timeout_s;
    if (size > 1 && rank == 0) {
        int lfd = -1;
        rc = ms_dist_listen(host, port, &lfd, err);
        if (rc == MS_OK) rc = ms_dist_accept_group(lfd, MS_CH_COMM, size, deadline, "tcp comm", t->fds, t->addrs, err);
        ms_dist_close(&lfd);
    } else if (size > 1) {
        snprintf(t->addrs[0], sizeof t->addrs[0], "%s:%d", host, port);
        rc = ms_dist_connect(host, port, deadline, &t->fds[0], err);
        if (rc != MS_OK) ms_err_prefix(err, "tcp comm rank %d", rank);
        char who[96];
        snprintf(who, sizeof who, "rank 0 at %s", t->addrs[0]);
        if (rc == MS_OK) rc = ms_dist_hello(t->fds[0], MS_CH_COMM, rank, size, deadline, who, err);
    }
    if (rc != MS_OK) {
        tc_destroy(&t->c);
        return rc;
    }
    *out = &t->c;
    return MS_OK;
}

int ms_dist_bootstrap_share(const char *host_port, int node_rank, int nnodes, double timeout_s, void *blob, size_t n,
                            ms_err *err) {
    if (nnodes == 1) return MS_OK;
    ms_comm *c = NULL;
    int rc = ms_comm_tcp_create(host_port, node_rank, nnodes, timeout_s, &c, err);
    if (rc == MS_OK) rc = c->ops->broadcast(c, blob, n, 0, err);
    if (rc == MS_OK) rc = c->ops->barrier(c, err); /* nobody closes before everybody has the blob */
    if (c) ms_comm_destroy(c);
    if (rc != MS_OK) ms_err_prefix(err, "bootstrap at %s (node %d of %d)", host_port, node_rank, nnodes);
    return rc;
}
