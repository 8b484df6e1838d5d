/* comm_nccl.c - the communicator for GPU ranks: NCCL, one rank per GPU, collectives enqueued on the
 * CUDA backend's stream so they are ordered with the forward's kernels (and can be captured in a
 * CUDA graph).
 *
 * NCCL can hang forever when a peer dies (its kernels spin waiting for data). So the communicator
 * is non-blocking (ncclConfig_t.blocking = 0: init and enqueue return at once, completion is
 * polled with a bound), and a watchdog thread per rank records when each collective was enqueued
 * (an event after it on the stream) and polls ncclCommGetAsyncError: a collective still running
 * after timeout_s, or an asynchronous NCCL error, aborts the communicator (ncclCommAbort), which
 * releases the stream and anything waiting on it; every later call fails with the cause. Enqueue
 * calls and the abort are serialised by a mutex so the abort never frees the communicator under a
 * running call. */
#include "dist/comm.h"
#include "dist/dist_internal.h"
#include "backend/backend.h"
#include "backend/cuda/backend_cuda.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Static_assert(NCCL_UNIQUE_ID_BYTES == MS_COMM_NCCL_ID_BYTES, "NCCL unique id size changed");

#define NC_RING 64

typedef struct nc_comm {
    ms_comm c;
    int device;
    ncclComm_t comm;
    cudaStream_t stream;
    float *one_d; /* barrier scratch */
    /* call_mu serialises enqueues with the watchdog's abort */
    pthread_mutex_t call_mu;
    /* mu guards the failure state and the watchdog ring */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int broken, nccl_dead; /* nccl_dead: ncclCommAbort was called, comm is gone */
    char cause[MS_ERR_MSG_MAX];
    /* watchdog */
    pthread_t wd;
    int wd_running, wd_stop;
    cudaEvent_t ev[NC_RING];
    double ev_t[NC_RING];
    const char *ev_op[NC_RING];
    unsigned long ev_seq[NC_RING];
    unsigned long seq;
    int head, tail; /* ring: [tail, head) outstanding */
} nc_comm;

static nc_comm *nc(ms_comm *c) { return (nc_comm *)c; }

static void nsleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Under call_mu: aborts the NCCL communicator once. */
static void nccl_abort_locked(nc_comm *n) {
    if (n->nccl_dead || !n->comm) return;
    n->nccl_dead = 1;
    ncclCommAbort(n->comm);
    n->comm = NULL;
}

/* Records the first cause; returns it as an error. Does not abort NCCL (callers decide). */
static int set_broken(nc_comm *n, ms_err *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int set_broken(nc_comm *n, ms_err *err, const char *fmt, ...) {
    char m[MS_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&n->mu);
    if (!n->broken) {
        n->broken = 1;
        snprintf(n->cause, sizeof n->cause, "nccl comm rank %d (GPU %d): %s", n->c.rank, n->device, m);
        pthread_cond_broadcast(&n->cv);
    }
    pthread_mutex_unlock(&n->mu);
    return ms_errf(err, MS_ERR_RUNTIME, "%s", n->cause);
}

static int check_broken(nc_comm *n, ms_err *err) {
    pthread_mutex_lock(&n->mu);
    int b = n->broken;
    pthread_mutex_unlock(&n->mu);
    return b ? ms_errf(err, MS_ERR_RUNTIME, "%s", n->cause) : MS_OK;
}

/* Waits (bounded by timeout_s) until a non-blocking call's state leaves ncclInProgress. */
static ncclResult_t wait_ready(ncclComm_t comm, double timeout_s, int *timed_out) {
    double deadline = ms_dist_now() + timeout_s;
    *timed_out = 0;
    for (;;) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess) return r;
        if (st != ncclInProgress) return st;
        if (ms_dist_now() >= deadline) {
            *timed_out = 1;
            return ncclInProgress;
        }
        nsleep_ms(1);
    }
}

static void *watchdog(void *p) {
    nc_comm *n = p;
    cudaSetDevice(n->device);
    pthread_mutex_lock(&n->mu);
    while (!n->wd_stop) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_nsec += 20 * 1000000L;
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&n->cv, &n->mu, &dl);
        if (n->wd_stop || n->broken) continue;
        /* retire completed collectives, oldest first */
        char why[MS_ERR_MSG_MAX] = "";
        while (n->tail != n->head) {
            int i = n->tail % NC_RING;
            cudaError_t q = cudaEventQuery(n->ev[i]);
            if (q == cudaSuccess) {
                n->tail++;
                continue;
            }
            if (q != cudaErrorNotReady) {
                snprintf(why, sizeof why, "CUDA error while waiting for collective #%lu (%s): %s", n->ev_seq[i],
                         n->ev_op[i], cudaGetErrorString(q));
            } else if (ms_dist_now() - n->ev_t[i] > n->c.timeout_s) {
                snprintf(why, sizeof why,
                         "collective #%lu (%s) did not complete within %.1f s: a peer rank died, hung or never "
                         "called it",
                         n->ev_seq[i], n->ev_op[i], n->c.timeout_s);
            }
            break;
        }
        pthread_mutex_unlock(&n->mu);
        if (!why[0] && pthread_mutex_trylock(&n->call_mu) == 0) {
            /* async errors (a peer's NCCL failed, a network error) */
            if (!n->nccl_dead && n->comm) {
                ncclResult_t st = ncclSuccess;
                if (ncclCommGetAsyncError(n->comm, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress)
                    snprintf(why, sizeof why, "NCCL reported an asynchronous error: %s (%s)", ncclGetErrorString(st),
                             ncclGetLastError(n->comm));
            }
            pthread_mutex_unlock(&n->call_mu);
        }
        if (why[0]) {
            set_broken(n, NULL, "%s", why);
            pthread_mutex_lock(&n->call_mu);
            nccl_abort_locked(n);
            pthread_mutex_unlock(&n->call_mu);
        }
        pthread_mutex_lock(&n->mu);
    }
    pthread_mutex_unlock(&n->mu);
    return NULL;
}

static int dtype_of(ms_dtype dt, ncclDataType_t *out) {
    if (dt == MS_F32) *out = ncclFloat32;
    else if (dt == MS_BF16) *out = ncclBfloat16;
    else return 0;
    return 1;
}

/* Under call_mu: after an NCCL enqueue returned r, waits out ncclInProgress and tracks the
 * collective for the watchdog. */
static int finish_call(nc_comm *n, ncclResult_t r, const char *op, ms_err *err) {
    int to = 0;
    if (r == ncclInProgress) r = wait_ready(n->comm, n->c.timeout_s, &to);
    if (r != ncclSuccess) {
        int rc = to ? set_broken(n, err, "%s: NCCL did not accept the call within %.1f s", op, n->c.timeout_s)
                    : set_broken(n, err, "%s failed: %s (%s)", op, ncclGetErrorString(r), ncclGetLastError(n->comm));
        nccl_abort_locked(n);
        return rc;
    }
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(n->stream, &cs) != cudaSuccess) {
        cudaGetLastError();
        cs = cudaStreamCaptureStatusNone;
    }
    if (cs != cudaStreamCaptureStatusNone) return MS_OK; /* recorded into a graph: nothing ran yet */
    pthread_mutex_lock(&n->mu);
    /* free a slot: drop finished entries; if still full, this collective goes unwatched (a hang in
     * it stalls every later, watched collective on the same stream anyway) */
    while (n->head - n->tail >= NC_RING && cudaEventQuery(n->ev[n->tail % NC_RING]) == cudaSuccess) n->tail++;
    cudaGetLastError();
    if (n->head - n->tail < NC_RING) {
        int i = n->head % NC_RING;
        cudaError_t e = cudaEventRecord(n->ev[i], n->stream);
        if (e == cudaSuccess) {
            n->ev_t[i] = ms_dist_now();
            n->ev_op[i] = op;
            n->ev_seq[i] = ++n->seq;
            n->head++;
        } else {
            pthread_mutex_unlock(&n->mu);
            int rc = set_broken(n, err, "%s: cudaEventRecord failed: %s", op, cudaGetErrorString(e));
            nccl_abort_locked(n);
            return rc;
        }
    }
    pthread_mutex_unlock(&n->mu);
    return MS_OK;
}

/* Enters a call: checks the state and takes call_mu (released by leave()). */
static int enter(nc_comm *n, ms_err *err) {
    MS_TRY(check_broken(n, err));
    pthread_mutex_lock(&n->call_mu);
    if (n->nccl_dead || n->broken) {
        pthread_mutex_unlock(&n->call_mu);
        return ms_errf(err, MS_ERR_RUNTIME, "%s", n->broken ? n->cause : "nccl comm: communicator was aborted");
    }
    cudaError_t e = cudaSetDevice(n->device);
    if (e != cudaSuccess) {
        pthread_mutex_unlock(&n->call_mu);
        return set_broken(n, err, "cudaSetDevice(%d) failed: %s", n->device, cudaGetErrorString(e));
    }
    return MS_OK;
}

static int nc_all_reduce(ms_comm *c, void *buf, size_t count, ms_dtype dt, ms_err *err) {
    nc_comm *n = nc(c);
    ncclDataType_t t;
    if (!dtype_of(dt, &t))
        return ms_errf(err, MS_ERR_UNSUPPORTED, "nccl comm rank %d: all_reduce_sum: dtype %s (F32 or BF16)", c->rank,
                       ms_dtype_name(dt));
    MS_TRY(enter(n, err));
    int rc = finish_call(n, ncclAllReduce(buf, buf, count, t, ncclSum, n->comm, n->stream), "all_reduce_sum", err);
    pthread_mutex_unlock(&n->call_mu);
    return rc;
}

static int nc_all_gather(ms_comm *c, const void *send, void *recv, size_t cpr, ms_dtype dt, ms_err *err) {
    nc_comm *n = nc(c);
    ncclDataType_t t;
    if (!dtype_of(dt, &t))
        return ms_errf(err, MS_ERR_UNSUPPORTED, "nccl comm rank %d: all_gather: dtype %s (F32 or BF16)", c->rank,
                       ms_dtype_name(dt));
    MS_TRY(enter(n, err));
    int rc = finish_call(n, ncclAllGather(send, recv, cpr, t, n->comm, n->stream), "all_gather", err);
    pthread_mutex_unlock(&n->call_mu);
    return rc;
}

static int nc_reduce_scatter(ms_comm *c, const void *send, void *recv, size_t cpr, ms_dtype dt, ms_err *err) {
    nc_comm *n = nc(c);
    ncclDataType_t t;
    if (!dtype_of(dt, &t))
        return ms_errf(err, MS_ERR_UNSUPPORTED, "nccl comm rank %d: reduce_scatter_sum: dtype %s (F32 or BF16)",
                       c->rank, ms_dtype_name(dt));
    MS_TRY(enter(n, err));
    int rc = finish_call(n, ncclReduceScatter(send, recv, cpr, t, ncclSum, n->comm, n->stream), "reduce_scatter_sum",
                         err);
    pthread_mutex_unlock(&n->call_mu);
    return rc;
}

static int nc_broadcast(ms_comm *c, void *buf, size_t bytes, int root, ms_err *err) {
    nc_comm *n = nc(c);
    if (root < 0 || root >= c->size)
        return ms_errf(err, MS_ERR_INVALID, "nccl comm rank %d: broadcast root %d out of range (size %d)", c->rank,
                       root, c->size);
    MS_TRY(enter(n, err));
    int rc = finish_call(n, ncclBroadcast(buf, buf, bytes, ncclUint8, root, n->comm, n->stream), "broadcast", err);
    pthread_mutex_unlock(&n->call_mu);
    return rc;
}

/* An all-reduce of one float, then a bounded wait for the stream to reach it: returns when every
 * rank has got there (or the watchdog has aborted the communicator). */
static int nc_barrier(ms_comm *c, ms_err *err) {
    nc_comm *n = nc(c);
    MS_TRY(enter(n, err));
    int rc = finish_call(n, ncclAllReduce(n->one_d, n->one_d, 1, ncclFloat32, ncclSum, n->comm, n->stream), "barrier",
                         err);
    pthread_mutex_unlock(&n->call_mu);
    if (rc != MS_OK) return rc;
    double deadline = ms_dist_now() + 2 * c->timeout_s + 1; /* the watchdog fires first */
    for (;;) {
        cudaError_t q = cudaStreamQuery(n->stream);
        if (q == cudaSuccess) return check_broken(n, err);
        if (q != cudaErrorNotReady) {
            cudaGetLastError();
            MS_TRY(check_broken(n, err));
            return set_broken(n, err, "barrier: stream failed: %s", cudaGetErrorString(q));
        }
        MS_TRY(check_broken(n, err));
        if (ms_dist_now() > deadline) return set_broken(n, err, "barrier did not complete within %.1f s", c->timeout_s);
        nsleep_ms(1);
    }
}

static void nc_abort(ms_comm *c, const char *why) {
    nc_comm *n = nc(c);
    set_broken(n, NULL, "aborted: %s", why ? why : "(no reason given)");
    pthread_mutex_lock(&n->call_mu);
    nccl_abort_locked(n);
    pthread_mutex_unlock(&n->call_mu);
}

static void nc_destroy(ms_comm *c) {
    if (!c) return;
    nc_comm *n = nc(c);
    if (n->wd_running) {
        pthread_mutex_lock(&n->mu);
        n->wd_stop = 1;
        pthread_cond_broadcast(&n->cv);
        pthread_mutex_unlock(&n->mu);
        pthread_join(n->wd, NULL);
    }
    cudaSetDevice(n->device);
    if (n->comm && !n->nccl_dead) {
        /* finalize flushes outstanding work; bounded, then destroy (or abort when stuck) */
        int to = 0;
        ncclResult_t r = n->broken ? ncclInternalError : ncclCommFinalize(n->comm);
        if (r == ncclInProgress || r == ncclSuccess) r = wait_ready(n->comm, c->timeout_s, &to);
        if (r == ncclSuccess) ncclCommDestroy(n->comm);
        else ncclCommAbort(n->comm);
        n->comm = NULL;
    }
    for (int i = 0; i < NC_RING; i++)
        if (n->ev[i]) cudaEventDestroy(n->ev[i]);
    if (n->one_d) cudaFree(n->one_d);
    cudaGetLastError();
    pthread_mutex_destroy(&n->call_mu);
    pthread_mutex_destroy(&n->mu);
    pthread_cond_destroy(&n->cv);
    free(n);
}

static const ms_comm_ops nccl_ops = {
    .all_reduce_sum = nc_all_reduce,
    .all_gather = nc_all_gather,
    .reduce_scatter_sum = nc_reduce_scatter,
    .broadcast = nc_broadcast,
    .barrier = nc_barrier,
    .abort = nc_abort,
    .destroy = nc_destroy,
};

int ms_comm_nccl_available(char *why, size_t why_size) {
    if (ms_cuda_device_count() > 0) return 1;
    if (why) snprintf(why, why_size, "no usable NVIDIA GPU is visible, so NCCL cannot be used");
    return 0;
}

static void nvls_off(void) { setenv("NCCL_NVLS_ENABLE", "0", 0); }

int ms_comm_nccl_unique_id(unsigned char id[MS_COMM_NCCL_ID_BYTES], ms_err *err) {
    nvls_off();
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return ms_errf(err, MS_ERR_RUNTIME, "ncclGetUniqueId failed: %s", ncclGetErrorString(r));
    memcpy(id, u.internal, MS_COMM_NCCL_ID_BYTES);
    return MS_OK;
}

int ms_comm_nccl_create(ms_backend *b, const unsigned char id[MS_COMM_NCCL_ID_BYTES], int rank, int size,
                        double timeout_s, ms_comm **out, ms_err *err) {
    *out = NULL;
    if (!b || !b->name || strcmp(b->name, "cuda") != 0)
        return ms_errf(err, MS_ERR_INVALID, "nccl comm rank %d: needs a cuda backend (got %s)", rank,
                       b && b->name ? b->name : "none");
    if (size < 1 || rank < 0 || rank >= size)
        return ms_errf(err, MS_ERR_INVALID, "nccl comm: rank %d of %d is out of range", rank, size);
    if (!(timeout_s > 0)) return ms_errf(err, MS_ERR_INVALID, "nccl comm: timeout %.3f s must be > 0", timeout_s);
    nvls_off();
    nc_comm *n = calloc(1, sizeof *n);
    if (!n) return ms_errf(err, MS_ERR_NOMEM, "nccl comm: out of memory");
    n->c = (ms_comm){&nccl_ops, "nccl", rank, size, timeout_s, n};
    n->device = b->device;
    n->stream = (cudaStream_t)ms_cuda_stream(b);
    pthread_mutex_init(&n->call_mu, NULL);
    pthread_mutex_init(&n->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&n->cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = MS_OK;
    cudaError_t e = cudaSetDevice(n->device);
    for (int i = 0; i < NC_RING && e == cudaSuccess; i++) e = cudaEventCreateWithFlags(&n->ev[i], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaMalloc((void **)&n->one_d, sizeof(float));
    if (e == cudaSuccess) e = cudaMemsetAsync(n->one_d, 0, sizeof(float), n->stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        rc = ms_errf(err, MS_ERR_RUNTIME, "nccl comm rank %d: CUDA setup on GPU %d failed: %s", rank, n->device,
                     cudaGetErrorString(e));
        goto fail;
    }
    ncclUniqueId u;
    memcpy(u.internal, id, MS_COMM_NCCL_ID_BYTES);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, size, u, rank, &cfg);
    int to = 0;
    if ((r == ncclSuccess || r == ncclInProgress) && n->comm) r = wait_ready(n->comm, timeout_s, &to);
    if (r != ncclSuccess) {
        if (to)
            rc = ms_errf(err, MS_ERR_RUNTIME,
                         "nccl comm rank %d of %d (GPU %d): initialisation did not complete within %.1f s (another rank "
                         "did not join: not started, wrong unique id or unreachable)",
                         rank, size, n->device, timeout_s);
        else
            rc = ms_errf(err, MS_ERR_RUNTIME, "nccl comm rank %d of %d (GPU %d): ncclCommInitRankConfig failed: %s (%s)",
                         rank, size, n->device, ncclGetErrorString(r), n->comm ? ncclGetLastError(n->comm) : "");
        if (n->comm) ncclCommAbort(n->comm);
        n->comm = NULL;
        goto fail;
    }
    if (pthread_create(&n->wd, NULL, watchdog, n) != 0) {
        rc = ms_errf(err, MS_ERR_RUNTIME, "nccl comm rank %d: cannot start the watchdog thread: %s", rank, strerror(errno));
        goto fail;
    }
    n->wd_running = 1;
    *out = &n->c;
    return MS_OK;
fail:
    nc_destroy(&n->c);
    return rc;
}
