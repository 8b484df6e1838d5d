/* comm_local.c - the in-process communicator: ranks are threads of one process sharing host memory
 * (the CPU backend's tensor parallelism, and every split tested on CI).
 *
 * Each collective is: every rank posts its buffer pointers and call signature, a barrier, each
 * rank computes its share straight from the peers' buffers (a reduction writes its slice of a
 * shared scratch, summing ranks in order 0, 1, 2, ...), a second barrier, then the copy-out. The
 * result is therefore the same bits on every rank and independent of thread timing. The scratch is
 * only resized by the last rank to arrive at the first barrier of the next collective, when every
 * rank has finished reading it. Every wait is a timed condition wait; a rank that does not arrive
 * within timeout_s breaks the group with a message naming it, and abort() wakes everybody. */
#include "dist/comm.h"
#include "dist/dist_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { OP_NONE, OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_BROADCAST, OP_BARRIER };
static const char *op_name(int op) {
    static const char *n[] = {"?", "all_reduce_sum", "all_gather", "reduce_scatter_sum", "broadcast", "barrier"};
    return op >= 0 && op <= OP_BARRIER ? n[op] : "?";
}

typedef struct post {
    int op;
    size_t count;
    ms_dtype dt;
    int root;
    const void *src;
    void *dst;
} post;

typedef struct local_shared {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    double timeout_s;
    int refs;
    /* barrier */
    unsigned long gen;
    int arrived;
    unsigned char *here; /* [n]: arrived in the current generation */
    /* failure */
    int broken;
    char cause[MS_ERR_MSG_MAX];
    /* collective */
    post *posts; /* [n] */
    void *scratch;
    size_t scratch_cap;
    int scratch_fail;
} local_shared;

typedef struct local_rank {
    ms_comm c;
    local_shared *s;
} local_rank;

static local_shared *sh(ms_comm *c) { return ((local_rank *)c)->s; }

static void break_locked(local_shared *s, const char *fmt, const char *arg) {
    if (s->broken) return;
    s->broken = 1;
    snprintf(s->cause, sizeof s->cause, fmt, arg);
    pthread_cond_broadcast(&s->cv);
}

/* Checks that every rank posted the same call and grows the scratch; runs under the lock in the
 * last rank to arrive. */
static void complete_locked(local_shared *s) {
    post *p0 = &s->posts[0];
    for (int r = 1; r < s->n; r++) {
        post *p = &s->posts[r];
        if (p->op != p0->op || p->count != p0->count || p->dt != p0->dt || p->root != p0->root) {
            char m[MS_ERR_MSG_MAX];
            snprintf(m, sizeof m,
                     "local comm: collective calls differ: rank %d called %s(count %zu, %s, root %d) while rank 0 "
                     "called %s(count %zu, %s, root %d)",
                     r, op_name(p->op), p->count, ms_dtype_name(p->dt), p->root, op_name(p0->op), p0->count,
                     ms_dtype_name(p0->dt), p0->root);
            break_locked(s, "%s", m);
            return;
        }
    }
    if (p0->op == OP_ALL_REDUCE) {
        size_t need = p0->count * ms_dist_red_size(p0->dt);
        if (need > s->scratch_cap) {
            void *q = realloc(s->scratch, need);
            if (!q) {
                break_locked(s, "local comm: out of memory for the %s scratch", op_name(p0->op));
                return;
            }
            s->scratch = q;
            s->scratch_cap = need;
        }
    }
}

/* Waits until all n ranks have arrived (the last one runs complete_locked when `complete`). */
static int barrier(ms_comm *c, int complete, const char *what, ms_err *err) {
    local_shared *s = sh(c);
    pthread_mutex_lock(&s->mu);
    if (s->broken) goto broken;
    unsigned long g = s->gen;
    s->here[c->rank] = 1;
    if (++s->arrived == s->n) {
        if (complete) complete_locked(s);
        s->arrived = 0;
        memset(s->here, 0, (size_t)s->n);
        s->gen++;
        pthread_cond_broadcast(&s->cv);
        if (s->broken) goto broken;
        pthread_mutex_unlock(&s->mu);
        return MS_OK;
    }
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    double t = (double)dl.tv_sec + 1e-9 * dl.tv_nsec + s->timeout_s;
    dl.tv_sec = (time_t)t;
    dl.tv_nsec = (long)((t - (double)dl.tv_sec) * 1e9);
    while (s->gen == g && !s->broken) {
        int rc = pthread_cond_timedwait(&s->cv, &s->mu, &dl);
        if (rc == ETIMEDOUT && s->gen == g && !s->broken) {
            char miss[200] = "";
            size_t off = 0;
            for (int r = 0; r < s->n && off < sizeof miss - 8; r++)
                if (!s->here[r]) off += (size_t)snprintf(miss + off, sizeof miss - off, "%s%d", off ? ", " : "", r);
            char m[MS_ERR_MSG_MAX];
            snprintf(m, sizeof m, "local comm: rank(s) %s did not reach %s within %.1f s (rank %d waited)", miss, what,
                     s->timeout_s, c->rank);
            break_locked(s, "%s", m);
        }
    }
    if (s->broken) goto broken;
    pthread_mutex_unlock(&s->mu);
    return MS_OK;
broken:
    pthread_mutex_unlock(&s->mu);
    return ms_errf(err, MS_ERR_RUNTIME, "rank %d: %s", c->rank, s->cause);
}

static int check_red(ms_comm *c, ms_dtype dt, const char *what, ms_err *err) {
    if (!ms_dist_red_size(dt))
        return ms_errf(err, MS_ERR_UNSUPPORTED, "rank %d: %s: dtype %s is not supported (F32 or BF16)", c->rank, what,
                       ms_dtype_name(dt));
    return MS_OK;
}

static int pre(ms_comm *c, int op, size_t count, ms_dtype dt, int root, const void *src, void *dst, ms_err *err) {
    local_shared *s = sh(c);
    pthread_mutex_lock(&s->mu);
    int broken = s->broken;
    if (!broken) s->posts[c->rank] = (post){op, count, dt, root, src, dst};
    pthread_mutex_unlock(&s->mu);
    if (broken) return ms_errf(err, MS_ERR_RUNTIME, "rank %d: %s", c->rank, s->cause);
    return barrier(c, 1, op_name(op), err);
}

/* Rank r's share of [0, n): contiguous, balanced. */
static void share(size_t n, int parts, int r, size_t *lo, size_t *hi) {
    *lo = n * (size_t)r / (size_t)parts;
    *hi = n * (size_t)(r + 1) / (size_t)parts;
}

static int lc_all_reduce(ms_comm *c, void *buf, size_t count, ms_dtype dt, ms_err *err) {
    MS_TRY(check_red(c, dt, "all_reduce_sum", err));
    local_shared *s = sh(c);
    if (s->n == 1) return s->broken ? ms_errf(err, MS_ERR_RUNTIME, "rank 0: %s", s->cause) : MS_OK;
    MS_TRY(pre(c, OP_ALL_REDUCE, count, dt, 0, buf, buf, err));
    size_t es = ms_dist_red_size(dt), lo, hi;
    share(count, s->n, c->rank, &lo, &hi);
    if (hi > lo) {
        const void *srcs[s->n];
        for (int r = 0; r < s->n; r++) srcs[r] = (const char *)s->posts[r].src + lo * es;
        ms_dist_reduce_ranks(srcs, s->n, hi - lo, dt, (char *)s->scratch + lo * es);
    }
    MS_TRY(barrier(c, 0, "all_reduce_sum", err));
    memcpy(buf, s->scratch, count * es);
    return MS_OK;
}

static int lc_all_gather(ms_comm *c, const void *send, void *recv, size_t cpr, ms_dtype dt, ms_err *err) {
    local_shared *s = sh(c);
    size_t es = ms_dtype_size(dt);
    if (!es) return ms_errf(err, MS_ERR_INVALID, "rank %d: all_gather: invalid dtype", c->rank);
    if (s->n == 1) {
        if (s->broken) return ms_errf(err, MS_ERR_RUNTIME, "rank 0: %s", s->cause);
        if (send != recv) memmove(recv, send, cpr * es);
        return MS_OK;
    }
    MS_TRY(pre(c, OP_ALL_GATHER, cpr, dt, 0, send, recv, err));
    for (int r = 0; r < s->n; r++) {
        char *d = (char *)recv + (size_t)r * cpr * es;
        if (s->posts[r].src != d) memcpy(d, s->posts[r].src, cpr * es);
    }
    return barrier(c, 0, "all_gather", err);
}

static int lc_reduce_scatter(ms_comm *c, const void *send, void *recv, size_t cpr, ms_dtype dt, ms_err *err) {
    MS_TRY(check_red(c, dt, "reduce_scatter_sum", err));
    local_shared *s = sh(c);
    size_t es = ms_dist_red_size(dt);
    if (s->n == 1) {
        if (s->broken) return ms_errf(err, MS_ERR_RUNTIME, "rank 0: %s", s->cause);
        if (send != recv) memmove(recv, send, cpr * es);
        return MS_OK;
    }
    MS_TRY(pre(c, OP_REDUCE_SCATTER, cpr, dt, 0, send, recv, err));
    const void *srcs[s->n];
    for (int r = 0; r < s->n; r++) srcs[r] = (const char *)s->posts[r].src + (size_t)c->rank * cpr * es;
    /* element-wise: recv may alias our own slice, which only this rank reads */
    ms_dist_reduce_ranks(srcs, s->n, cpr, dt, recv);
    return barrier(c, 0, "reduce_scatter_sum", err);
}

static int lc_broadcast(ms_comm *c, void *buf, size_t bytes, int root, ms_err *err) {
    local_shared *s = sh(c);
    if (root < 0 || root >= s->n)
        return ms_errf(err, MS_ERR_INVALID, "rank %d: broadcast root %d out of range (size %d)", c->rank, root, s->n);
    if (s->n == 1) return s->broken ? ms_errf(err, MS_ERR_RUNTIME, "rank 0: %s", s->cause) : MS_OK;
    MS_TRY(pre(c, OP_BROADCAST, bytes, MS_U8, root, buf, buf, err));
    if (c->rank != root && bytes) memcpy(buf, s->posts[root].src, bytes);
    return barrier(c, 0, "broadcast", err);
}

static int lc_barrier(ms_comm *c, ms_err *err) {
    local_shared *s = sh(c);
    if (s->n == 1) return s->broken ? ms_errf(err, MS_ERR_RUNTIME, "rank 0: %s", s->cause) : MS_OK;
    return pre(c, OP_BARRIER, 0, MS_U8, 0, NULL, NULL, err);
}

static void lc_abort(ms_comm *c, const char *why) {
    local_shared *s = sh(c);
    pthread_mutex_lock(&s->mu);
    char m[MS_ERR_MSG_MAX];
    snprintf(m, sizeof m, "local comm aborted by rank %d: %s", c->rank, why ? why : "(no reason given)");
    break_locked(s, "%s", m);
    pthread_mutex_unlock(&s->mu);
}

static void free_shared(local_shared *s) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->here);
    free(s->posts);
    free(s->scratch);
    free(s);
}

static void lc_destroy(ms_comm *c) {
    if (!c) return;
    local_shared *s = sh(c);
    pthread_mutex_lock(&s->mu);
    int last = --s->refs == 0;
    pthread_mutex_unlock(&s->mu);
    free(c);
    if (last) free_shared(s);
}

static const ms_comm_ops local_ops = {
    .all_reduce_sum = lc_all_reduce,
    .all_gather = lc_all_gather,
    .reduce_scatter_sum = lc_reduce_scatter,
    .broadcast = lc_broadcast,
    .barrier = lc_barrier,
    .abort = lc_abort,
    .destroy = lc_destroy,
};

int ms_comm_local_create(int n, double timeout_s, ms_comm **out_array, ms_err *err) {
    if (n < 1 || n > 4096) return ms_errf(err, MS_ERR_INVALID, "local comm: %d ranks is out of range (1..4096)", n);
    if (!(timeout_s > 0)) return ms_errf(err, MS_ERR_INVALID, "local comm: timeout %.3f s must be > 0", timeout_s);
    local_shared *s = calloc(1, sizeof *s);
    if (!s) return ms_errf(err, MS_ERR_NOMEM, "local comm: out of memory");
    s->n = n;
    s->timeout_s = timeout_s;
    s->here = calloc((size_t)n, 1);
    s->posts = calloc((size_t)n, sizeof *s->posts);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    int ok = s->here && s->posts;
    for (int r = 0; r < n && ok; r++) {
        local_rank *lr = calloc(1, sizeof *lr);
        if (!lr) {
            ok = 0;
            break;
        }
        lr->s = s;
        lr->c = (ms_comm){&local_ops, "local", r, n, timeout_s, s};
        out_array[r] = &lr->c;
        s->refs++;
    }
    if (!ok) {
        for (int r = 0; r < s->refs; r++) free(out_array[r]);
        free_shared(s);
        return ms_errf(err, MS_ERR_NOMEM, "local comm: out of memory for %d ranks", n);
    }
    return MS_OK;
}
