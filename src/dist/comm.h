/* comm.h - collectives for tensor/expert parallelism, behind one ops table.
 *
 * The model forward is written once and calls all-reduce/all-gather/... through ms_comm_ops, without
 * knowing whether its peers are threads of this process sharing host memory ("local", CPU ranks),
 * processes on other machines reached over TCP ("tcp", CPU ranks across nodes) or GPUs reached
 * through NCCL ("nccl"). Every implementation gives results that do not depend on thread or network
 * timing; "local" and "tcp" reduce in rank order (r0 + r1 + r2 + ...) in float32, so the two give
 * bitwise identical sums, equal to a serial loop over the ranks.
 *
 * Failure model: every wait is bounded by timeout_s. A peer that does not arrive, dies or closes its
 * connection makes the collective fail with MS_ERR_RUNTIME and a sentence naming the rank (and for
 * tcp the address) at fault; after any failure the communicator is broken (every later call fails
 * with the first cause) and the caller is expected to shut the process down. abort() from any
 * thread makes every blocked or later call fail with the given cause. No call ever hangs. */
#ifndef MS_DIST_COMM_H
#define MS_DIST_COMM_H

#include "core/dtype.h"
#include "core/status.h"

#include <stddef.h>

typedef struct ms_backend ms_backend;
typedef struct ms_comm ms_comm;

/* All buffers are in the rank's backend memory: host memory for cpu ranks ("local", "tcp"), device
 * memory for cuda ranks ("nccl", ordered on the backend's stream: the call enqueues and returns; the
 * result is there for the next op on that stream). Counts are elements of dt, which must be MS_F32
 * or MS_BF16 for the reductions (broadcast counts bytes). Every rank of the group must make the same
 * sequence of calls with the same counts, dtypes and root; "local" and "tcp" check this and fail
 * with a sentence naming the rank that differs. A rank's calls come from one thread at a time. */
typedef struct ms_comm_ops {
    /* buf[i] = sum over ranks of buf_r[i], on every rank (in place). BF16 sums accumulate in float32
     * (rounded once) where the implementation can (local, tcp; NCCL accumulates as it does). */
    int (*all_reduce_sum)(ms_comm *c, void *buf, size_t count, ms_dtype dt, ms_err *err);
    /* recv [size * count_per_rank] = send_0 ; send_1 ; ... (rank-major concatenation) on every rank.
     * send may alias recv + rank * count_per_rank (in place). */
    int (*all_gather)(ms_comm *c, const void *send, void *recv, size_t count_per_rank, ms_dtype dt, ms_err *err);
    /* send [size * count_per_rank] on every rank; recv [count_per_rank] = slice `rank` of the sum over
     * ranks of send. recv may alias send + rank * count_per_rank. */
    int (*reduce_scatter_sum)(ms_comm *c, const void *send, void *recv, size_t count_per_rank, ms_dtype dt,
                              ms_err *err);
    /* buf [bytes] of rank `root` copied into buf on every other rank. */
    int (*broadcast)(ms_comm *c, void *buf, size_t bytes, int root, ms_err *err);
    /* Returns when every rank has entered the barrier (nccl: when the stream reaches it). */
    int (*barrier)(ms_comm *c, ms_err *err);
    /* Thread-safe, callable from any thread (a watchdog, a signal-handling thread): every rank blocked
     * in a collective, and every later call, fails with an error naming `why`. Idempotent; the first
     * cause wins. Does not free anything. */
    void (*abort)(ms_comm *c, const char *why);
    /* Frees this rank's handle. Not concurrent with a call on the same handle. */
    void (*destroy)(ms_comm *c);
} ms_comm_ops;

struct ms_comm {
    const ms_comm_ops *ops;
    const char *name; /* "local", "tcp" or "nccl" */
    int rank, size;
    double timeout_s; /* bound on every wait, seconds */
    void *impl;
};

/* Frees c (NULL is fine). Same as c->ops->destroy(c). */
void ms_comm_destroy(ms_comm *c);

/* ---- local: n ranks that are threads of this process (CPU backend, host memory) ----
 * Fills out_array[0..n-1] with one handle per rank (rank i = out_array[i]); hand each to its own
 * thread. n >= 1; timeout_s > 0. The handles share state; each is freed with ms_comm_destroy (the
 * shared state goes with the last one). With n == 1 every collective is a no-op or a copy. */
int ms_comm_local_create(int n, double timeout_s, ms_comm **out_array, ms_err *err);

/* ---- tcp: one rank per process, CPU backend, host memory ----
 * host_port "HOST:PORT" (the --dist-init-addr): rank 0 listens there (all interfaces when HOST is
 * 0.0.0.0) and waits for ranks 1..size-1; the others connect, retrying until timeout_s. Blocks until
 * the group is complete or fails (timeout naming the ranks that did not connect; a refused or stray
 * connection is named with its address). Collectives go through rank 0 as a hub. The caller owns
 * *out. Thread-safe only in the sense of ops->abort. */
int ms_comm_tcp_create(const char *host_port, int rank, int size, double timeout_s, ms_comm **out, ms_err *err);

/* ---- nccl: one rank per GPU, device memory on the CUDA backend's stream ----
 * A group is made from one unique id: one process calls ms_comm_nccl_unique_id, the id reaches
 * every process of the group (ms_dist_bootstrap_share across nodes, plain memory for threads), then
 * every rank calls ms_comm_nccl_create with its own CUDA backend `b`, concurrently (each from its own
 * thread: the calls complete together). Initialisation is non-blocking and bounded by timeout_s; a
 * watchdog thread aborts the communicator (ncclCommAbort) when a collective does not complete
 * within timeout_s or NCCL reports an asynchronous error, so the stream and every waiter are
 * released and later calls fail with the cause. Sets NCCL_NVLS_ENABLE=0 unless the environment
 * already sets it. A build without CUDA returns MS_ERR_UNSUPPORTED. */
#define MS_COMM_NCCL_ID_BYTES 128
int ms_comm_nccl_unique_id(unsigned char id[MS_COMM_NCCL_ID_BYTES], ms_err *err);
int ms_comm_nccl_create(ms_backend *b, const unsigned char id[MS_COMM_NCCL_ID_BYTES], int rank, int size,
                        double timeout_s, ms_comm **out, ms_err *err);

/* ---- choosing an implementation ---- */
/* The communicator kind for ranks on backend `backend_name` ("cpu" or "cuda") spread over nnodes
 * processes: "nccl" for cuda, "local" for cpu on one node, "tcp" for cpu on several. Never NULL. */
const char *ms_comm_kind_for_backend(const char *backend_name, int nnodes);
/* 1 when communicator `kind` can be created in this build and process; else 0 and `why` (may be
 * NULL) gets one sentence (e.g. "this build has no CUDA/NCCL"). */
int ms_dist_available(const char *kind, char *why, size_t why_size);

/* ---- bootstrap: one blob from process 0 to the others (the NCCL unique id) ----
 * Process node_rank of nnodes: node 0 serves blob[0..n) at host_port to nnodes-1 connections; the
 * others connect (retrying until timeout_s) and receive it into blob. Returns when every process
 * has the blob, or fails naming the node or address at fault. nnodes == 1 returns at once. */
int ms_dist_bootstrap_share(const char *host_port, int node_rank, int nnodes, double timeout_s, void *blob, size_t n,
                            ms_err *err);

/* Parses "HOST:PORT" (HOST may be a name or an IPv4 address, PORT 1..65535) into host (NUL-ended)
 * and *port; the message names the flag value at fault. */
int ms_dist_parse_addr(const char *host_port, char *host, size_t host_size, int *port, ms_err *err);

#endif
