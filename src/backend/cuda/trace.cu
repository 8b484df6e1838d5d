/* trace.cu - the host side of the in-graph kernel trace (cuda_internal.cuh, "The in-graph kernel trace"):
 * the registry of each translation unit's setter of its ring pointer, the table of launched kernels by
 * shape, and the ring's allocation and dump. Only a build with CU_TRACE=1 (MS_CU_TRACE) records anything;
 * elsewhere attach and dump do nothing, so the backend calls them unconditionally (and nothing calls
 * register or note). The dump's format, one record a line:
 *   R seq t_start_ns t_wait_ns gx gy gz threads   (a launch's first block: at its wait, wait returned)
 *   K name gx gy gz threads                       (a kernel launched with that shape)
 * scripts/trace_links.py turns it into the chain's links. */
#include "backend/cuda/cuda_internal.cuh"
extern "C" {
#include "core/log.h"
}

#include <mutex>
#include <stdio.h>
#include <stdlib.h>

#if MS_CU_TRACE
#define TR_MAX_SYMS 64
#define TR_MAX_SIGS 1024
#define TR_CAP (1u << 17)

struct tr_sig {
    const void *fn;
    unsigned gx, gy, gz, bx;
};

static std::mutex tr_mu;
static cudaError_t (*tr_syms[TR_MAX_SYMS])(cu_trace_ring *);
static int tr_nsyms;
static tr_sig tr_sigs[TR_MAX_SIGS];
static int tr_nsigs;
static cu_trace_ring *tr_ring; /* device */
static const ms_backend *tr_owner; /* the backend whose creation attached it: its destruction dumps it */

/* Points every translation unit's ring pointer at ring (NULL: none); the first CUDA error, else success. */
static cudaError_t tr_set_all(cu_trace_ring *ring) {
    cudaError_t first = cudaSuccess;
    for (int i = 0; i < tr_nsyms; i++) {
        const cudaError_t e = tr_syms[i](ring);
        if (e != cudaSuccess && first == cudaSuccess) first = e;
    }
    return first;
}

/* Contract in cuda_internal.cuh. Runs during static initialisation: no CUDA call here. */
int cu_trace_register(cudaError_t (*set)(cu_trace_ring *ring)) {
    std::lock_guard<std::mutex> g(tr_mu);
    if (tr_nsyms < TR_MAX_SYMS) tr_syms[tr_nsyms++] = set;
    return 0;
}

/* Contract in cuda_internal.cuh. */
void cu_trace_note(const void *fn, dim3 grid, dim3 block) {
    const unsigned bx = block.x * block.y * block.z;
    std::lock_guard<std::mutex> g(tr_mu);
    for (int i = 0; i < tr_nsigs; i++)
        if (tr_sigs[i].fn == fn && tr_sigs[i].gx == grid.x && tr_sigs[i].gy == grid.y && tr_sigs[i].gz == grid.z &&
            tr_sigs[i].bx == bx)
            return;
    if (tr_nsigs < TR_MAX_SIGS) tr_sigs[tr_nsigs++] = {fn, grid.x, grid.y, grid.z, bx};
}

#endif

/* Contract in cuda_internal.cuh. */
int cu_trace_attach(const ms_backend *b, ms_err *err) {
#if MS_CU_TRACE
    const char *path = getenv("MS_CU_TRACE_OUT");
    std::lock_guard<std::mutex> g(tr_mu);
    if (!path || !*path || tr_ring) return MS_OK;
    const size_t bytes = sizeof(cu_trace_ring) + sizeof(cu_trace_rec) * (TR_CAP - 1);
    cu_trace_ring head = {};
    head.cap = TR_CAP;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaSuccess) e = cudaMemset(p, 0, bytes);
    if (e == cudaSuccess) e = cudaMemcpy(p, &head, sizeof head, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = tr_set_all((cu_trace_ring *)p);
    if (e != cudaSuccess) { /* no half-attached ring: every pointer back to none */
        (void)cudaGetLastError();
        (void)tr_set_all(NULL);
        if (p) cudaFree(p);
        return ms_errf(err, MS_ERR_RUNTIME, "cuda trace (MS_CU_TRACE_OUT=%s): setting up the ring failed: %s", path,
                       cudaGetErrorString(e));
    }
    tr_ring = (cu_trace_ring *)p;
    tr_owner = b;
    MS_LOGI("cuda trace: %d translation units record into a ring of %u launches for %s", tr_nsyms, TR_CAP, path);
#else
    (void)b, (void)err;
#endif
    return MS_OK;
}

/* Contract in cuda_internal.cuh. */
void cu_trace_dump(const ms_backend *b) {
#if MS_CU_TRACE
    std::lock_guard<std::mutex> g(tr_mu);
    if (!tr_ring || b != tr_owner) return;
    const char *path = getenv("MS_CU_TRACE_OUT");
    cu_trace_ring head;
    cu_trace_rec *recs = NULL;
    FILE *f = NULL;
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaMemcpy(&head, tr_ring, sizeof head, cudaMemcpyDeviceToHost);
    const unsigned n = e == cudaSuccess ? (head.n < head.cap ? head.n : head.cap) : 0;
    if (e == cudaSuccess && n) {
        recs = (cu_trace_rec *)malloc(sizeof(cu_trace_rec) * n);
        if (!recs) e = cudaErrorMemoryAllocation;
        else e = cudaMemcpy(recs, tr_ring->r, sizeof(cu_trace_rec) * n, cudaMemcpyDeviceToHost);
    }
    if (e != cudaSuccess) {
        MS_LOGW("cuda trace: reading the ring failed: %s", cudaGetErrorString(e));
    } else if (!path || !(f = fopen(path, "w"))) {
        MS_LOGW("cuda trace: cannot write %s", path ? path : "(MS_CU_TRACE_OUT unset)");
    } else {
        fprintf(f, "# moeserve kernel trace: %u launches recorded, the last %u below\n", head.n, n);
        const unsigned first = head.n - n; /* the ring holds seq first .. head.n - 1 */
        for (unsigned s = first; s < head.n; s++) {
            const cu_trace_rec &r = recs[s % head.cap];
            fprintf(f, "R %u %llu %llu %u %u %u %u\n", r.seq, r.t_start, r.t_wait, r.gx, r.gy, r.gz, r.bx);
        }
        for (int i = 0; i < tr_nsigs; i++) {
            const char *name = NULL;
            if (cudaFuncGetName(&name, tr_sigs[i].fn) != cudaSuccess || !name) (void)cudaGetLastError(), name = "?";
            fprintf(f, "K %s %u %u %u %u\n", name, tr_sigs[i].gx, tr_sigs[i].gy, tr_sigs[i].gz, tr_sigs[i].bx);
        }
        if (fclose(f)) MS_LOGW("cuda trace: writing %s failed", path);
        else MS_LOGI("cuda trace: %u launches written to %s", n, path);
    }
    free(recs);
    if (tr_set_all(NULL) != cudaSuccess) (void)cudaGetLastError(); /* no kernel may write into the freed ring */
    cudaFree(tr_ring);
    tr_ring = NULL;
    tr_owner = NULL;
#else
    (void)b;
#endif
}
