/* cuda_internal.cuh - what the CUDA backend's .cu files (and the CUDA MoE runners) share: the
 * backend's private state, checked-call macros, dtype helpers, the exact dequantization of every
 * weight format, and the prototypes of every function one .cu file defines for another (ops,
 * launchers, internal GEMM entry points): no .cu file declares another's functions itself.
 * Included only from .cu files. */
#ifndef MS_BACKEND_CUDA_INTERNAL_CUH
#define MS_BACKEND_CUDA_INTERNAL_CUH

#define _Noreturn [[noreturn]]
extern "C" {
#include "backend/backend.h"
#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/knobs.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
}
#undef _Noreturn

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

#include "backend/cuda/grouped_call.cuh"

/* Every CUDA runtime call goes through CK: failure returns an ms_err naming the call and place. */
#define CK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t ck_e_ = (call);                                                               \
        if (ck_e_ != cudaSuccess)                                                                 \
            return ms_errf(err, MS_ERR_RUNTIME, "%s failed at %s:%d: %s", #call, __FILE__, __LINE__, \
                           cudaGetErrorString(ck_e_));                                            \
    } while (0)
/* After a kernel launch: reports launch-configuration errors. */
#define CK_LAUNCH() CK(cudaGetLastError())
#define CKB(call)                                                                                 \
    do {                                                                                          \
        cublasStatus_t ck_s_ = (call);                                                            \
        if (ck_s_ != CUBLAS_STATUS_SUCCESS)                                                       \
            return ms_errf(err, MS_ERR_RUNTIME, "%s failed at %s:%d: cublas status %d", #call, __FILE__, \
                           __LINE__, (int)ck_s_);                                                 \
    } while (0)

/* ---- Programmatic Dependent Launch (PDL) ----
 * Every kernel of ours is launched through cu_launch and opens with cu_pdl_wait(); cu_pdl_trigger();
 * before anything else. With PDL on (knob MS_CU_PDL, default 1, and a GPU of compute capability
 * 9.x, the one this build has sm_90 code for: later GPUs JIT the compute_80 PTX, whose kernels have no
 * wait), cu_launch marks the launch "programmatic stream serialization allowed": the kernel may start
 * while the previous kernel on the stream is still running, as soon as every block of that one has
 * executed griddepcontrol.launch_dependents (or exited). It then does its prologue (block scheduling,
 * parameter loads) and parks in griddepcontrol.wait, which returns once every prerequisite grid has
 * COMPLETED and its memory operations are visible: the same guarantee as ordinary stream order. This
 * hides the launch/drain gap between dependent kernels (~2 us a boundary at batch-1 decode).
 *
 * Why a wait-first kernel is always safe: nothing the kernel does before the wait touches global
 * memory (neither reads of what the previous kernel writes nor writes to what it still reads; shared
 * memory and registers are private to the block), so everything it does is ordered after the previous
 * grid's completion exactly as without PDL. Completion is transitive: kernel N+1 completes only after
 * its wait returned, i.e. after N completed, so N+2 (waiting on N+1) also sees N's writes, and so on.
 * Kernels that are not ours (cuBLAS/cuBLASLt/NCCL) are launched without the attribute, so they start
 * only after our previous kernel has fully completed (plain stream order); one of ours launched after
 * them may start early only if they trigger, and it still waits for their completion.
 *
 * The one exception: the streaming bf16 GEMV (gemv_bf16.cu), the absorbed MLA products (mla_absorb.cu),
 * the split router and the residual RMSNorm (elementwise.cu) load their first weights before their
 * wait, only when cu_impl.weights_quiet says no device work in flight writes weights; what the previous
 * kernel writes (x) they still read after the wait, and they write nothing before it. The GQA attention
 * kernel's decode form with the preparation fused (attn_mma.cu) goes further on the same condition: it
 * also reads the batch meta and the caches' old rows before its wait, which only the kernel just before
 * could still be writing (it is the q|k|v projection there, whose blocks all work). A block of ours
 * triggers only after its wait or leaves without working, so once a kernel starts, every block of the
 * one before has waited or left; if one waited, everything older than that kernel has completed. Such
 * a kernel must not read the previous kernel's output with __ldg (ld.global.nc): the compiler may move a
 * non-coherent load above the wait, next to the weight loads (session 19: the split router's x did, and
 * mixed steps and graphs read stale rows on the H200). Asking the L2 for more weights there (bulk
 * prefetch) measured slower (bench/NOTES.md, session 19).
 *
 * Two kernels may trigger before their wait, each behind a knob that is off by default: the split-K
 * attention merge (MS_CU_ATTN_MERGE_EARLY) and the one-pass residual RMSNorm (MS_CU_NORM_EARLY), so that the
 * projection after them launches while the kernel before them still runs and streams its first weights
 * there. The kernel after such a kernel may start while the one two back still runs; that is safe only
 * because what follows them reads nothing but weights before its wait (the GEMVs, the absorbed MLA
 * products, the split router), and it still triggers after its wait, so the kernel after it again
 * finds everything older completed. A kernel that reads anything else before its wait (the decode
 * attention) must never follow one of the two directly: it checks cu_prev_early and then reads after its
 * wait.
 *
 * Why trigger right after the wait: the next kernel can launch only once all our blocks passed the
 * trigger, i.e. after our own wait returned, i.e. after the previous grid completed. So at most two
 * grids are resident (the running one and the next one parked at its wait), and the parked blocks only
 * take SM resources once every block of the running grid has been scheduled (a block not yet started
 * has not triggered): no starvation, no deadlock even for grids larger than one wave. Triggering early
 * does not publish anything: the dependent's wait still waits for our completion and memory flush.
 *
 * Memcpy/memset nodes, host callbacks, event records/waits: the attribute only relaxes kernel ->
 * kernel order on one stream; any other operation before or after one of our kernels is ordered by
 * full completion as always (a D2H copy after our kernel waits for it to finish). Graph capture
 * (CUDA 12.3+): a captured PDL launch becomes a programmatic edge between the two kernel nodes; a
 * recorded graph keeps the launch attributes it was captured with. On a kernel launched without the
 * attribute (PDL off, sm < 90, the first kernel of a stream) griddepcontrol.wait returns at once, and
 * both instructions compile to nothing below sm_90. */
/* ---- The in-graph kernel trace (builds with CU_TRACE=1 only: MS_CU_TRACE) ----
 * Where a batch-1 step's time goes between kernels that overlap under PDL cannot be read from ncu (one
 * kernel at a time, no graph) or from sections bracketed by syncs. A trace build records, for every launch,
 * the global timer when its first block reaches cu_pdl_wait (after its work before the wait) and when that
 * block's griddepcontrol.wait returns (the kernel before has then completed), and the launch's grid and
 * block shape, into a device ring that trace.cu allocates when MS_CU_TRACE_OUT names a file and writes there
 * when the backend that attached it is destroyed, with the kernels' names by shape. Consecutive wait
 * returns bound each link of the chain (scripts/trace_links.py). Each translation unit has its own copy of
 * the ring's pointer (no relocatable device code) and a setter of it, registered by a static initialiser so
 * that trace.cu can set them all. */
struct cu_trace_rec {
    unsigned long long t_start, t_wait; /* ns, %globaltimer */
    unsigned seq, gx, gy, gz, bx, pad;
};
struct cu_trace_ring {
    unsigned n, cap; /* records written (all time), ring size */
    unsigned pad[2];
    cu_trace_rec r[1];
};
/* trace.cu: notes a translation unit's setter of its ring pointer (called by cu_trace_attach); returns 0 */
int cu_trace_register(cudaError_t (*set)(cu_trace_ring *ring));
/* trace.cu: notes a launch's kernel and shape for the names of the dump (trace builds call it in cu_launch) */
void cu_trace_note(const void *fn, dim3 grid, dim3 block);
/* trace.cu: in a trace build with MS_CU_TRACE_OUT set, the first backend b to call it (on the current device)
 * owns the ring and every registered pointer is set to it; otherwise nothing. MS_OK, or an error naming the
 * variable and the CUDA error, with no ring left attached. */
int cu_trace_attach(const ms_backend *b, ms_err *err);
/* trace.cu: when b owns the ring, writes its records (in order, the last cap of them) and the kernels' names
 * by shape to MS_CU_TRACE_OUT once the device's work is done, points every registered pointer back to none
 * and frees the ring; else nothing. Errors go to the log (it runs when a backend is destroyed). */
void cu_trace_dump(const ms_backend *b);
#if MS_CU_TRACE
static __device__ cu_trace_ring *cu_trace_dev;
static cudaError_t cu_trace_set(cu_trace_ring *ring) { return cudaMemcpyToSymbol(cu_trace_dev, &ring, sizeof ring); }
static const int cu_trace_reg = cu_trace_register(cu_trace_set);
#endif

__device__ __forceinline__ void cu_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#if MS_CU_TRACE
    /* the slot is claimed before the wait (the atomic's round trip overlaps the parked time), so that
     * after it only posted stores stand between the wait and the kernel's trigger */
    cu_trace_ring *tr = cu_trace_dev;
    const bool rec = tr && (threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) == 0;
    unsigned long long t0 = 0, t1;
    cu_trace_rec *r = NULL;
    if (rec) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        const unsigned i = atomicAdd(&tr->n, 1u);
        r = &tr->r[i % tr->cap];
        r->seq = i;
    }
#endif
    asm volatile("griddepcontrol.wait;" ::: "memory");
#if MS_CU_TRACE
    if (rec) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
        r->t_start = t0, r->t_wait = t1;
        r->gx = gridDim.x, r->gy = gridDim.y, r->gz = gridDim.z, r->bx = blockDim.x * blockDim.y * blockDim.z;
    }
#endif
#endif
}
__device__ __forceinline__ void cu_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
/* 1 when the last kernel this host thread launched through cu_launch triggers its dependents before its own
 * wait (k_attn_combine<1>, k_rmsnorm_f32<1, 1>: their launch sites set it after cu_launch cleared it), else 0.
 * A kernel that reads anything but weights before its wait (the decode attention's PREP form) must not do
 * so right after such a kernel (the PDL comment above), so it asks this first. backend.cu. */
extern thread_local int cu_prev_early;
/* 1 when our launches on the current device carry the PDL attribute: MS_CU_PDL (read once) is not 0
 * and the current device has compute capability 9.x (cached per device). backend.cu. */
int cu_pdl_enabled(void);
/* kernel<<<grid, block, smem, stream>>>(args...) through cudaLaunchKernelEx, with programmatic stream
 * serialization allowed when cu_pdl_enabled() (see above; every kernel launched this way must open
 * with cu_pdl_wait). Returns the launch error (cudaSuccess when queued) and leaves none behind for
 * cudaGetLastError, so call sites wrap it in CK() instead of CK_LAUNCH(). */
template <typename... KArgs, typename... Args>
static inline cudaError_t cu_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                    Args &&...args) {
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    if (cu_pdl_enabled()) {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...);
    cu_prev_early = 0; /* the two early-trigger sites set it again after their launch */
    if (e != cudaSuccess) (void)cudaGetLastError();
#if MS_CU_TRACE
    else cu_trace_note((const void *)kernel, grid, block);
#endif
    return e;
}

#define MS_CU_N_SCRATCH 7
enum { SCR_DEQ = 0, SCR_TMP = 1, SCR_TMP2 = 2, SCR_HOST = 3, SCR_ATTN = 4 /* split-K attention partials */,
       SCR_GVD = 5 /* the claiming bf16 GEMV's counters (zeroed when the buffer moves, zero between launches) */,
       SCR_GVP = 6 /* ... and its rows' partials */ };

#define CU_GCACHE 256 /* cuBLASLt algorithms remembered per (shape, types, leading dims) */
typedef struct cu_gemm_cache_ent {
    int used;
    int m, n, k, ta, tb, atype, ctype;
    int64_t lda, ldb, ldc;
    cublasLtMatmulAlgo_t algo;
} cu_gemm_cache_ent;

typedef struct cu_alloc_node {
    void *p;
    struct cu_alloc_node *next;
} cu_alloc_node;

typedef struct cu_rope_ent {
    double theta;
    int rot_dim;
    float *inv_freq_d;
} cu_rope_ent;

/* Backend-private state (b->impl). */
typedef struct cu_impl {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    cublasHandle_t blas;
    void *lt_ws;
    size_t lt_ws_bytes;
    void *scratch[MS_CU_N_SCRATCH];
    size_t scratch_bytes[MS_CU_N_SCRATCH];
    cu_gemm_cache_ent gcache[CU_GCACHE];
    int gcache_next;
    cu_rope_ent rope[8];
    int n_rope;
    cu_alloc_node *owned; /* freed at destroy (prepared tables etc.) */
    int max_smem_optin;
    int have_wgmma; /* cu_gw_probe at creation: the wgmma grouped GEMM is in this build's code */
    int smem_per_sm; /* cudaDevAttrMaxSharedMemoryPerMultiprocessor (bytes) */
    /* cu_occupancy's answers per (kernel, threads, shared bytes): per backend, because the shared-memory
     * limit it sets with them is a per-device attribute. Sized for GLM-5's shapes with room to spare;
     * past it answers are not kept */
    struct { const void *k; int threads; size_t smem; int bps; } occ_memo[96];
    int n_occ_memo;
    uint64_t epoch; /* bumped when a scratch buffer moves (recorded graphs hold its old address) */
    /* 1 while no device work in flight writes placed weights: placement copies synchronously, stacking's
     * device copies (legacy stream) are complete when it returns because it then frees the parts' memory
     * (cudaFree synchronises the device),
     * the dummy-weight generators (dummy.cu) launch kernels and clear it, and the next stream
     * synchronisation (cu_sync, cu_upload, cu_download) sets it again. Lets a decode kernel read its
     * weights before griddepcontrol.wait (gemv_bf16.cu, mla_absorb.cu; the split router and the residual
     * RMSNorm of elementwise.cu, which MS_CU_BF16_STREAM_EARLY does not switch off; the decode attention's
     * biases and RoPE table, attn_mma.cu, switched by MS_CU_ATTN_PREP). */
    int weights_quiet;
    /* [2] device counters of the fused MoE kernel's phase boundary (moe_fused.cu), zero between its
     * launches; allocated at creation */
    unsigned *moe_sync;
    /* device counter of the fused input norms (cu_norm_in.done; in moe_sync's allocation, past the MoE's
     * counters), zero between launches */
    unsigned *norm_sync;
    /* [CU_MOE_PART_MAX] the routed fused MoE kernel's partial logits (in moe_sync's allocation) */
    float *moe_part;
} cu_impl;

static inline cu_impl *cu_of(const ms_backend *b) { return (cu_impl *)b->impl; }


/* What place_linear stores in W->prepared. */
typedef struct cu_linear_prep {
    cu_wdesc d;
    bf16 *deq;        /* lazily made bf16 copy [N,K] (kv_b for absorbed MLA), NULL until needed */
    float *bias_f32;  /* bias as F32 or NULL */
    int view;         /* d.w / d.scale / bias_f32 point into another linear's memory (stack_linears) */
} cu_linear_prep;

/* ---- host helpers (backend.cu) ---- */
/* Returns a device buffer of at least n bytes in slot `slot` (grows; contents not kept). */
int cu_scratch(ms_backend *b, int slot, size_t n, void **out, ms_err *err);
/* Registers device memory to free when the backend is destroyed. */
int cu_own(ms_backend *b, void *p_d, ms_err *err);
/* Descriptor of a placed linear (fails if W was not placed on this backend). */
int cu_wdesc_of(const ms_linear *W, cu_wdesc *d, ms_err *err);
/* The bf16 [N,K] form of a placed linear (plain bf16: the weight itself; otherwise a cached
 * dequantized copy when keep != 0, else a copy in scratch slot SCR_DEQ valid until the next call). */
int cu_weight_bf16(ms_backend *b, const ms_linear *W, int keep, const bf16 **out, ms_err *err);

/* Row-major GEMM on the backend stream: C[M,N] (+)= A[M,K] · op(B) where B is [N,K] (b_trans=1,
 * i.e. y = x·Wᵀ) or [K,N] (b_trans=0). A/B types BF16 (or both F32), C BF16 or F32; fp32 accumulate.
 * Leading dims are in elements. beta 0 or 1. */
int cu_gemm(ms_backend *b, int M, int N, int K, const void *A, int64_t lda, int ab_type, const void *B, int64_t ldb,
            int b_trans, void *C, int64_t ldc, int c_type, float beta, ms_err *err);

/* Resident blocks an SM (*bps) of kernel kern launched with `threads` threads and smem bytes of dynamic
 * shared memory, from the occupancy calculator, remembered per backend (cu_impl.occ_memo: decode calls
 * repeat a few shapes, and eager steps should not pay driver queries per launch). Raises the kernel's
 * dynamic shared-memory limit to the device's per-block maximum less the kernel's static shared memory
 * on first sight of a total > 48 KB. *bps = 0: it does not fit an SM. */
int cu_occupancy(ms_backend *b, const void *kern, int threads, size_t smem, int *bps, ms_err *err);

/* Internal linear used by the router and runners: same as the backend's linear op. */
int cu_linear_op(ms_backend *b, const ms_linear *W, const ms_tensor *x, ms_tensor *y, ms_err *err);

/* ---- quantized kernels (quant.cu) ---- */
/* Dequantizes rows of d into bf16 out [N,K] exactly as ms_linear_dequant_row, then rounds. */
int cu_dequant_bf16(ms_backend *b, const cu_wdesc *d, bf16 *out, ms_err *err);
/* Grouped small-batch product reading each weight once (memory-bound decode path), described by c
 * (fields: grouped_call.cuh); runs cu_gemv_mma when cu_gemv_mma_usable allows, else the CUDA-core
 * kernels (which take neither c->w1 nor c->bias). For group g (0..n_groups-1; groups at or past
 * *n_active if non-NULL are skipped) with weight table entry wid = group_w ? group_w[g] : g, rows r in
 * [row_off[wid], row_off[wid]+row_cnt[wid]) of x [*, K] (bf16, x row = row_idx ? row_idx[r] : r):
 *   mode 0: y[r, n] = x_r · W0[wid]_nᵀ, y F32 or BF16 (y_type) with row stride ldy.
 *   mode 1: y[r, n] = silu(x_r·W0ᵀ) * (x_r·W1ᵀ) as BF16 (gate/up fused; needs the tables).
 * When W0 is NULL there is one group using c->w0 itself, rows [0, rows_total) (row_off/row_cnt
 * NULL). c->w0 also gives format/N/K. Queued on the backend stream; c may be reused on return. */
int cu_gemv_grouped(ms_backend *b, const cu_gemv_call *c, ms_err *err);
/* ---- tensor-core grouped GEMV (gemv_mma.cu) ---- */
/* 1 when cu_gemv_mma can run weights shaped like w with activations x: MS_CU_GEMV is not "gv2"
 * (read once), compute capability >= 8.0, BF16 with K % 8 == 0, FP8 with K % 16 == 0 or NVFP4 with
 * K % 32 == 0, x 16-byte aligned, and when single != 0 (one group using w itself) w's data 16-byte
 * aligned. Rows of every weight in a device table are assumed 16-byte aligned, as in the gv2 kernels. */
int cu_gemv_mma_usable(const ms_backend *b, const cu_wdesc *w, const void *x, int single);
/* Same contract as cu_gemv_grouped, computed on tensor cores (mma.sync bf16, fp32 accumulate) with
 * the weights dequantized exactly in registers; requires cu_gemv_mma_usable. Also takes the two
 * single-group extras (W0 == NULL): c->w1, the up weight of a fused mode-1 gate/up pair
 * (silu(x·gateᵀ) * (x·upᵀ), both shaped like w0), and c->bias, mode 0 only, an F32 [N] bias added in
 * the epilogue. MS_ERR_UNSUPPORTED when the tokens of one pass do not fit shared memory. */
int cu_gemv_mma(ms_backend *b, const cu_gemv_call *c, ms_err *err);
/* The one-token NVFP4 form of cu_gemv_mma on FP8 wgmma (gemv_w8.cu): same call, results within the
 * bound of its file comment (tiny activations, FP8 accumulation). Sets *launched = 0 and does nothing
 * when it does not cover the call: no groups, not sm_90 with this build's sm_90a code (cu_impl.have_wgmma), not NVFP4,
 * rows_total != 1, K not a multiple of 128, scales not 4-byte aligned, x not 16-byte aligned, mode 1
 * without its up weight, or K too large for shared memory (K * 8.25 bytes). */
int cu_gemv_w8(ms_backend *b, const cu_gemv_call *c, int *launched, ms_err *err);

/* ---- the one-token MoE in one kernel (moe_fused.cu) ---- */
typedef struct cu_moe_fused_call {
    const cu_wdesc *G, *U, *D; /* device tables [n experts]: gate, up ([I, H]) and down ([H, I]) */
    cu_wdesc gate_h, up_h, down_h; /* host copies of entry 0: format, shapes and alignment stand for
                                      every expert's */
    int n_experts;             /* entries in the tables; ids outside [0, n_experts) count as -1 */
    const int32_t *ids;        /* device [nslot] expert ids of the token (-1: held by another rank) */
    const float *wts;          /* device [nslot] their weights */
    int nslot;
    int extra_slot;            /* 0: none; e + 1: one more slot, expert e with weight 1 (a folded shared
                                  expert; zero, the designated initialisers' default, means absent) */
    const bf16 *x; /* device [H] the token */
    bf16 *h;       /* device [nslot + (extra_slot > 0), I] workspace */
    void *out;     /* device [H] result, out_type (MS_BF16 or MS_F32) */
    int out_type;
    int form_groups, form_depth; /* the form to take when it fits (a tuned one: ms_moe_fused_form); 0: the
                                    cost model chooses */
    const struct cu_moe_route *route; /* non-NULL: the routed form (ids and wts above unused; nslot = rc->topk) */
} cu_moe_fused_call;
/* out = Σ_s wts[s] · down_{ids[s]}(silu(gate_{ids[s]}·x) * (up_{ids[s]}·x)) over the slots with
 * ids[s] in [0, n_experts), plus expert extra_slot - 1 with weight 1 when extra_slot > 0 (h rounded
 * to bf16 as the two-kernel form rounds it), queued on the backend stream as one kernel. Sets
 * *launched = 0 and queues nothing when it does not cover the call: MS_CU_MOE_FUSED is 0, compute
 * capability < 8.0, the SM count unknown, any of the three formats is not NVFP4, the shapes are not
 * gate/up [I, H] and down [H, I] with H and I multiples of 128, nslot (with the extra slot) outside
 * 1..16, out_type not BF16 or F32, x or h not 16-byte aligned, entry 0's rows (16 bytes) or scales
 * (8 bytes) misaligned (the other entries are taken to match), or the staging does not fit shared
 * memory. MS_CU_MOE_FUSED=1 takes form (form_groups, form_depth) when the kernel has it and it fits, else
 * the form its cost model prefers; 2 + f forces form f (ms_cuda_moe_fused_form) or nothing. With route
 * set, the kernel first computes the norm and the router itself (cu_moe_route; the split router's
 * arithmetic, bit-identical to cu_router_fused's split form with the norm folded, in every form) and
 * routes the token in every block; it declines (nothing queued) also when MS_CU_MOE_ROUTE is 0,
 * MS_CU_ROUTER is not split or MS_CU_ROUTER_UNFUSED is set (the router would not be the split form),
 * the routing is outside route_token_regs' limits (E <= 256, groups <= 32, top-k <= 32 and = nslot),
 * H > 8 * CU_NORM_U * CU_NORM_T, W misaligned, or the partials exceed CU_MOE_PART_MAX. */
int cu_moe_fused(ms_backend *b, const cu_moe_fused_call *c, int *launched, ms_err *err);

/* One call of the streaming bf16 GEMV (gemv_bf16.cu): y[t, n] = x[t, :] · w0[n, :] (+ bias[n]) in mode 0,
 * silu(x[t, :] · w0[n, :]) * (x[t, :] · w1[n, :]) in mode 1, for t < T, n < N. Weights [N, K] row-major
 * bf16, x [T, K] bf16 contiguous, y [T, ldy] of y_type (BF16 or F32; mode 1: BF16); bias F32 or NULL
 * (mode 0 only). Device pointers, all owned by the caller. */
/* A row's RMSNorm folded into the kernel that reads its output (decode at one row: backend.h's
 * norm_linear / norm_router): s = resid + delta (delta NULL: s = resid), x = bf16(s / rms(s) * w), with
 * k_rmsnorm_f32's formula. Every block of the consuming kernel computes x for itself from L2 (the row is
 * 16-24 KB), which costs less than the separate norm kernel it replaces (~4 us a norm in a decode step's
 * chain of kernels, H200). Block `first` stores x to out (later ops read it); when delta is set, the
 * last block to have read resid (counted in *done, which it puts back to 0) stores s back into resid:
 * every block reads resid, so no block may write it earlier. H % 8 == 0, H <= 8 * CU_NORM_U * CU_NORM_T,
 * resid, delta and out 16-byte aligned, w 16-byte aligned. The block's first CU_NORM_T threads do the
 * work (the others only meet the barriers), so the sum of squares, hence x, has the same bits in every
 * kernel that folds the norm, whatever its block size (>= CU_NORM_T): the routed MoE kernel's 512- and
 * 768-thread forms route exactly as the 256-thread split router does. */
#define CU_NORM_U 4   /* 8-element units of the row a thread holds */
#define CU_NORM_T 256 /* threads that hold the row, in every kernel that folds a norm */
typedef struct cu_norm_in {
    float *resid;
    const float *delta;
    const bf16 *w;
    bf16 *out;
    float eps;
    int H;
    unsigned *done;
} cu_norm_in;

/* Fills o with n as cu_norm_in for one row of width K and returns 1 when the folded form applies
 * (MS_CU_NORM_FOLD allows it for the router (router = 1; the routed MoE kernel counts as the router) or
 * a projection, F32 resid and delta, bf16 w and out, 16-byte aligned, K % 8 == 0 and at most CU_NORM_U
 * 8-element units for each of CU_NORM_T threads); 0 otherwise. o points into n's tensors and the
 * backend's norm counter. */
int cu_norm_of(ms_backend *b, const ms_norm_in *n, int64_t K, int router, cu_norm_in *o);

/* The routed form of the fused MoE call (cu_moe_fused_call.route): the token's pending residual add +
 * RMSNorm (nin, cu_norm_of's form; x = nin.out is written too) and its router run inside the MoE kernel:
 * W [E, H] bf16 router rows, bias [E] F32 or BF16 or NULL (score correction), rc the routing settings
 * (noaux_tc: sigmoid scores, group limit, top-k, weights); the choice is stored to ids / wts [rc->topk]
 * (device, the caller's), as the router op would. */
typedef struct cu_moe_route {
    const bf16 *W;
    const void *bias;
    int bias_t;
    const ms_route_cfg *rc;
    cu_norm_in nin;
    int32_t *ids;
    float *wts;
} cu_moe_route;
/* Partial logits the routed form's scratch holds (cu_impl.moe_part: K slices x experts floats). */
#define CU_MOE_PART_MAX 32768

typedef struct cu_gvb_call {
    int mode, T, N, K;
    const cu_norm_in *norm; /* T = 1, K = norm->H: x is computed from it (x below unused), else NULL */
    int weights_quiet; /* 1: no device work in flight writes w0/w1 (cu_impl.weights_quiet when they are
                        * placed weights), so they may be read before the previous kernel completes */
    const bf16 *w0, *w1;
    const float *bias;
    const bf16 *x;
    void *y;
    int y_type, ldy;
} cu_gvb_call;
/* Runs c on the backend stream when the form applies (mode 0 or 1, 1 <= T <= MS_CU_BF16_STREAM_MAX_T <= 4,
 * K % 8 == 0, 16-byte aligned weights and x, x of at most 96 KB, a block that fits an SM, and a K split
 * that keeps every warp at <= 64 rows in one resident wave) and sets *launched = 1; otherwise leaves
 * *launched = 0 and does nothing (the caller takes another form). MS_OK unless a CUDA call failed. */
int cu_gemv_bf16(ms_backend *b, const cu_gvb_call *c, int *launched, ms_err *err);
/* Grouped tensor-core GEMM (bf16 x bf16, fp32 accumulate) dequantizing weight tiles in shared memory,
 * described by c (fields: grouped_call.cuh). Rows are grouped: tile t of the launch covers rows of
 * group g where tile_off[g] <= t < tile_off[g+1] (CU_GG_BM-row tiles; tiles past tile_off[n_groups]
 * exit). x rows are contiguous per group starting at row_off[g] (row_cnt[g] rows); W0/W1 are indexed
 * by g, and W1's entries have w0's format. Modes as gemv. Runs cu_gemm_grouped_mma when it covers
 * the call, else the wmma kernel k_gg (quant.cu). Queued on the backend stream. */
int cu_gemm_grouped(ms_backend *b, const cu_gg_call *c, ms_err *err);
#define CU_GG_BM 64
/* The fast path of cu_gemm_grouped (gemm_mma.cu): same call and results, on tensor cores with 128-row
 * blocks (pairs of CU_GG_BM tiles of one group) and a pipelined dequantization: FP8 and NVFP4 weights on
 * sm_90 with wgmma (when this build carries sm_90a code; MS_CU_GG=sync keeps mma.sync), everything
 * else with mma.sync. Sets *launched = 0 and does nothing when it does not cover the call (a GPU below
 * sm_80, a format other than bf16/FP8/NVFP4, K not a multiple of 8/16/32 for those, unaligned pointers,
 * too little shared memory, more than 65535 tiles, mode 1 without W1, or MS_CU_GG=old in the
 * environment); the caller then runs k_gg. */
int cu_gemm_grouped_mma(ms_backend *b, const cu_gg_call *c, int *launched, ms_err *err);
/* 1 when this build's code for the current GPU holds the wgmma grouped GEMM (sm_90a code; a build for
 * plain sm_90 or PTX only compiles it empty). Launches a one-thread probe kernel and waits for it:
 * called once at backend creation (cu_impl.have_wgmma), never during a graph capture. gemm_mma.cu. */
int cu_gw_probe(ms_backend *b, int *have, ms_err *err);

/* ---- attention (attention.cu, attn_mma.cu, attn_ref.cu; the implementations: attn_impl.cu) ---- */
/* Split-K sizing shared by the attention kernels: *n_split key ranges for a launch of `blocks` blocks
 * (before splitting) over at most `tiles` key tiles, aiming at per_sm blocks per SM (at most 64 ranges,
 * at most one per tile; 1 when allow_split is 0). When *n_split > 1, *part is the float
 * workspace [T][nh][n_split][Dv + 2] (slot SCR_ATTN) for the partials: unnormalised O, then the
 * range's running max m (natural log domain of the scaled scores; -inf when it saw no key) and sum l. */
int cu_attn_split(ms_backend *b, int64_t blocks, int tiles, int per_sm, int T, int nh, int Dv, int allow_split,
                  int *n_split, float **part, ms_err *err);
/* Merges the n_split partials of every (token, head) into out [T][nh][Dv] (nothing when n_split <= 1). */
int cu_attn_combine(ms_backend *b, const float *part, int n_split, int T, int nh, int Dv, bf16 *out, ms_err *err);
/* Paged causal GQA on tensor cores (attn_mma.cu), the fast path of attn_gqa: q [T][nh][d], caches
 * [S][nkv][d], out [T][nh][d], bf16 device memory, batch layout as ms_attn_meta. Sets *launched = 0
 * and does nothing when the shape is not covered (d other than 64 or 128, a GPU below sm_80, too
 * little shared memory); the caller then runs k_attn. allow_split 0: one key range per block. */
int cu_attn_gqa_mma(ms_backend *b, const bf16 *q, const bf16 *kc, const bf16 *vc, int nh, int nkv, int d,
                    const ms_attn_meta *m, float scale, bf16 *out, int allow_split, int *launched, ms_err *err);
/* A GQA call with c->prep (backend/attn.h ms_attn_gqa_prep) as one launch of the tensor-core kernel that
 * does gqa_prep's work in its blocks (plus the merge of split-K partials), when the step is decode-shaped
 * (every sequence one new token), q/k/v come stacked (prep->qkv, not q's buffer), the head group's q rows
 * and fp32 biases fit the kernel's staging (at most 32 query heads a KV head at head dim 128, 34 at 64),
 * head dim 64 or 128, bf16 tensors, F32 biases (16-byte aligned, as the stacked rows), prep->pos_d the
 * meta's positions and
 * MS_CU_ATTN_PREP is on. Otherwise *launched = 0 and nothing is done: the caller runs gqa_prep first. */
int cu_attn_gqa_mma_prep(ms_backend *b, const struct ms_attn_call *c, int *launched, ms_err *err);
/* attn_gqa (contract in backend.h) by the tensor-core kernel: checks dtypes (error), then as
 * cu_attn_gqa_mma (*launched = 0 when the shape is not covered). */
int cu_attn_gqa_try_mma(ms_backend *b, const ms_tensor *q, const ms_tensor *kcache, const ms_tensor *vcache,
                        const ms_attn_meta *m, float scale, ms_tensor *out, int allow_split, int *launched, ms_err *err);
/* attn_gqa by the CUDA-core flash kernel k_attn; allow_split 0: no split-K. */
int cu_attn_gqa_flash(ms_backend *b, const ms_tensor *q, const ms_tensor *kcache, const ms_tensor *vcache,
                      const ms_attn_meta *m, float scale, ms_tensor *out, int allow_split, ms_err *err);
/* 1 if cu_attn_mla_mma covers a latent row of dk with value width dv on b; else 0 and the reason in
 * why (one clause; why may be NULL). */
int cu_attn_mla_mma_covers(const ms_backend *b, int dk, int dv, char *why, size_t cap);
/* mla_attn (contract in backend.h) on tensor cores (attn_mla_mma.cu): one block per token and 64
 * heads, split-KV with cu_attn_combine when the grid is small (allow_split 0: never). Sets *launched
 * = 0 and does nothing when cu_attn_mla_mma_covers refuses the shape or a dtype is not bf16. */
int cu_attn_mla_mma(ms_backend *b, const ms_tensor *q, const ms_tensor *latent, const ms_attn_meta *m,
                    const int32_t *topk_d, int topk, int kvl, float scale, ms_tensor *out, int allow_split,
                    int *launched, ms_err *err);
/* mla_attn (contract in backend.h) by k_attn: dense causal, or gathering the top-k keys of topk_d. */
int cu_attn_mla_flash(ms_backend *b, const ms_tensor *q, const ms_tensor *latent, const ms_attn_meta *m,
                      const int32_t *topk_d, int topk, int kvl, float scale, ms_tensor *out, int allow_split,
                      ms_err *err);
/* Shared memory bytes k_attn needs for R query rows of widths Dk/Dv (gqa: a V tile too), and the
 * largest the GPU allows a block (for supports()). */
size_t cu_attn_flash_min_smem(int Dk, int Dv, int gqa);
int cu_smem_optin(const ms_backend *b);
/* The straightforward reference kernel (attn_ref.cu): one block per (token, head), keys in tiles of
 * 128 with an online softmax in fp32, no split. GQA (v != NULL: k/v [S][nkv][d]) or MLA (v == NULL:
 * values are the first kvl columns of the latent row). With topk_d (DSA) it is dense-equivalent
 * masked: it walks every causal key and admits those in the query's top-k list (a [T][ctx] byte
 * mask in scratch slot SCR_TMP2). Shapes and dtypes as attn_gqa / mla_attn. */
int cu_attn_ref(ms_backend *b, const ms_tensor *q, const ms_tensor *k, const ms_tensor *v, const ms_attn_meta *m,
                const int32_t *topk_d, int topk, int dv, float scale, ms_tensor *out, ms_err *err);
#define CU_ATTN_REF_MAX_DV 1024

/* ---- ops of the backend table implemented outside backend.cu (elementwise.cu, attention.cu) ----
 * Each has the contract of the ms_backend_ops member of the same name (backend/backend.h), on the
 * backend's stream with device tensors. */
int cu_op_embed(ms_backend *b, const ms_tensor *table, const int32_t *ids_d, int n, ms_tensor *out, ms_err *err);
int cu_op_embed_part(ms_backend *b, const ms_tensor *table, const int32_t *ids_d, int n, int64_t v0, ms_tensor *out,
                     ms_err *err);
int cu_op_remap_ids(ms_backend *b, int32_t *ids_d, int64_t n, int lo, int count, ms_err *err);
int cu_op_moe_append(ms_backend *b, const int32_t *ids_d, const float *w_d, int T, int k, int32_t id, float weight,
                     int32_t *ids_out_d, float *w_out_d, ms_err *err);
int cu_op_rmsnorm(ms_backend *b, const ms_tensor *x, const ms_tensor *w, float eps, ms_tensor *out, ms_err *err);
int cu_op_add_rmsnorm(ms_backend *b, ms_tensor *resid, const ms_tensor *delta, const ms_tensor *w, float eps,
                      ms_tensor *out, ms_err *err);
int cu_op_layernorm(ms_backend *b, const ms_tensor *x, const ms_tensor *w, const ms_tensor *bias, float eps,
                    ms_tensor *out, ms_err *err);
int cu_op_add(ms_backend *b, ms_tensor *y, const ms_tensor *x, ms_err *err);
int cu_op_silu_mul(ms_backend *b, const ms_tensor *g, const ms_tensor *u, ms_tensor *out, ms_err *err);
int cu_op_copy_cols(ms_backend *b, const ms_tensor *src, int c0, int nc, ms_tensor *dst, ms_err *err);
int cu_op_gather_rows(ms_backend *b, const ms_tensor *src, const int32_t *idx_d, int n, ms_tensor *dst, ms_err *err);
int cu_op_set_cols(ms_backend *b, const ms_tensor *src, int c0, ms_tensor *dst, ms_err *err);
int cu_op_scale(ms_backend *b, ms_tensor *x, float alpha, ms_err *err);
int cu_op_rope(ms_backend *b, ms_tensor *x, const int32_t *pos_d, const ms_rope_cfg *rc, ms_err *err);
int cu_op_kv_store(ms_backend *b, ms_tensor *cache, const ms_tensor *x, const int32_t *slot_d, ms_err *err);
int cu_op_mla_kv_prep(ms_backend *b, ms_tensor *kva, int kvl, const ms_tensor *w, float eps, const int32_t *pos_d,
                      const ms_rope_cfg *rc, ms_tensor *cache, const int32_t *slot_d, ms_err *err);
int cu_op_idx_k_prep(ms_backend *b, ms_tensor *x, const ms_tensor *w, const ms_tensor *bias, float eps,
                     const int32_t *pos_d, const ms_rope_cfg *rc, ms_tensor *cache, const int32_t *slot_d, ms_err *err);
int cu_op_mla_prep(ms_backend *b, const ms_mla_prep *p, ms_err *err);
int cu_op_gqa_prep(ms_backend *b, ms_tensor *q, const ms_tensor *k, const ms_tensor *v, const ms_tensor *bq,
                   const ms_tensor *bk, const ms_tensor *bv, const int32_t *pos_d, const ms_rope_cfg *rc,
                   ms_tensor *kcache, ms_tensor *vcache, const int32_t *slot_d, const ms_tensor *qkv, ms_err *err);
int cu_op_find_nonfinite(ms_backend *b, const ms_tensor *x, int64_t *bad_row, ms_err *err);
int cu_op_nonfinite_flag(ms_backend *b, const ms_tensor *x, int32_t code, int32_t *flag_d, ms_err *err);
int cu_op_argmax(ms_backend *b, const ms_tensor *logits, int32_t *out_d, ms_err *err);
int cu_op_attn_gqa(ms_backend *b, const ms_tensor *q, const ms_tensor *kcache, const ms_tensor *vcache,
                   const ms_attn_meta *m, float scale, ms_tensor *out, ms_err *err);
int cu_op_mla_attn(ms_backend *b, const ms_tensor *q, const ms_tensor *latent, const ms_attn_meta *m,
                   const int32_t *topk_d, int topk, int kvl, float scale, ms_tensor *out, ms_err *err);
int cu_op_indexer_topk(ms_backend *b, const ms_tensor *qI, const ms_tensor *w, const ms_tensor *idx_cache,
                       const ms_attn_meta *m, int topk, int32_t *out, ms_err *err);

/* ---- elementwise helpers (elementwise.cu) ---- */
/* One rotary pair (a, c) at position p with inverse frequency f: the float32 angle p * f as
 * transformers computes it. Every kernel that rotates goes through here, so the fused forms give the
 * rope op's bits. */
__device__ __forceinline__ void rope_pair(float a, float c, float p, float f, float *o0, float *o1) {
    float sn, cs;
    sincosf(p * f, &sn, &cs);
    *o0 = a * cs - c * sn;
    *o1 = c * cs + a * sn;
}
/* Unit j of the absorbed MLA query's rope part (dr columns of one head, src -> dst): j < rot_dim / 2
 * rotates pair j of the rotary columns rot_off.. (inv NULL or rot_dim 0: none) at position pos[t] (read
 * only then), the rest copy pass-through column j - rot_dim / 2 (skipping the rotary ones). k_copy_rope
 * and k_absorb_q both write the rope part through here, so either gives the rope op's bits. */
__device__ __forceinline__ void cu_rope_part_unit(const bf16 *src, bf16 *dst, int j, const int32_t *pos, int t,
                                                  const float *inv, int rot_off, int rot_dim, int interleaved) {
    const int half = inv ? rot_dim / 2 : 0, rot = inv ? rot_dim : 0;
    if (j < half) {
        const int i0 = rot_off + (interleaved ? 2 * j : j), i1 = rot_off + (interleaved ? 2 * j + 1 : j + half);
        float o0, o1;
        rope_pair(__bfloat162float(src[i0]), __bfloat162float(src[i1]), (float)pos[t], inv[j], &o0, &o1);
        dst[i0] = __float2bfloat16_rn(o0);
        dst[i1] = __float2bfloat16_rn(o1);
    } else {
        const int e = j - half, c = e < rot_off ? e : e + rot;
        dst[c] = src[c];
    }
}
/* Unit j of gqa_prep's work on one head (row -> d0, and d1 when not NULL): j < rot_dim / 2 adds the
 * bias (NULL: none) to rotary pair j of columns rot_off.. in fp32 and rotates it by cs (cos [half], then
 * sin [half], computed by sincosf at the token's position), the rest add the bias to pass-through column
 * j - rot_dim / 2; one rounding to bf16. k_gqa_prep and the attention kernel that does gqa_prep itself
 * (attn_mma.cu) both go through here, so they write the same bits. */
__device__ __forceinline__ void cu_gqa_prep_unit(const bf16 *row, const float *bias, const float *cs, int j, int rot_off,
                                                 int rot_dim, int interleaved, bf16 *d0, bf16 *d1) {
    const int half = rot_dim / 2;
    if (j < half) {
        const int i0 = rot_off + (interleaved ? 2 * j : j), i1 = rot_off + (interleaved ? 2 * j + 1 : j + half);
        const float a = __bfloat162float(row[i0]) + (bias ? bias[i0] : 0.f);
        const float c = __bfloat162float(row[i1]) + (bias ? bias[i1] : 0.f);
        const float co = cs[j], sn = cs[half + j];
        const bf16 r0 = __float2bfloat16_rn(a * co - c * sn), r1 = __float2bfloat16_rn(c * co + a * sn);
        d0[i0] = r0, d0[i1] = r1;
        if (d1) d1[i0] = r0, d1[i1] = r1;
    } else {
        const int e = j - half, i = e < rot_off ? e : e + rot_dim;
        const bf16 r = __float2bfloat16_rn(__bfloat162float(row[i]) + (bias ? bias[i] : 0.f));
        d0[i] = r;
        if (d1) d1[i] = r;
    }
}
/* fp32 value of the low / high bf16 of a packed pair (exact) */
__device__ __forceinline__ float cu_bf_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float cu_bf_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
/* The device table of rc->rot_dim / 2 inverse frequencies theta^(-2j / rot_dim) (float32), made on
 * first use per (theta, rot_dim) and owned by the backend. The backend keeps 8 tables: a call that adds
 * a 9th frees the oldest (after synchronising the stream, with a new graph epoch), so a pointer from an
 * earlier call is valid only until a later call adds a table. A new table is uploaded on the backend
 * stream, which the call then synchronises; so it fails (MS_ERR_RUNTIME) while that stream is being
 * captured into a graph. */
int cu_rope_table(ms_backend *b, const ms_rope_cfg *rc, const float **out, ms_err *err);
/* n elements of src (dtype st) -> dst (dtype dt), F32/BF16/F16, on the stream. */
int cu_convert(ms_backend *b, const void *src, int st, void *dst, int dt, size_t n, ms_err *err);
/* y [rows, n] (dtype yt) += bias [n] (F32) broadcast over rows. */
int cu_add_bias(ms_backend *b, void *y, int yt, const float *bias, int64_t rows, int64_t n, ms_err *err);
/* Absorbed MLA: copies the rope part of q [T, nh, dn+dr] (columns dn..dn+dr) into columns kvl..kvl+dr
 * of out [T, nh, kvl+dr]; the rest of out is untouched. rc != NULL (its columns q's, inside the rope
 * part, else MS_ERR_INVALID): the copy is rotated at positions pos_d[T] as the rope op would rotate q. */
int cu_copy_rope_part(ms_backend *b, const bf16 *q, bf16 *out, int T, int nh, int dn, int dr, int kvl,
                      const int32_t *pos_d, const ms_rope_cfg *rc, ms_err *err);
/* The absorbed MLA products at a few tokens (mla_absorb.cu). W: kv_b's bf16 form [nh (dn + dv)][kvl]
 * (cu_weight_bf16 of kv_b). absorb: out [T][nh][kvl + dr] = per head q_nope · W_UK, then the rope part of
 * q [T][nh][dn + dr] copied, rotated at pos_d when rc has rotary columns (rc's columns are q's; outside
 * the rope part: MS_ERR_INVALID). v_up: out [T][nh dv] = per head ol [T][nh][kvl] · W_UVᵀ. Both set
 * *done = 1 when they launched, and leave *done = 0 without doing anything when the call is not theirs
 * (T outside 1..4, MS_CU_MLA_ABSORB=0, kvl not a multiple of 8, dn > 256 (absorb), kvl > 1024 or dv not a
 * multiple of 4 (v_up), misaligned W or ol), so the caller then runs its general form. */
int cu_mla_absorb_small(ms_backend *b, const ms_linear *kv_b, const bf16 *W, const bf16 *q, int T, int nh, int dn,
                        int dr, int dv, int kvl, const int32_t *pos_d, const ms_rope_cfg *rc, bf16 *out, int *done,
                        ms_err *err);
int cu_mla_v_up_small(ms_backend *b, const ms_linear *kv_b, const bf16 *W, const bf16 *ol, int T, int nh, int dn,
                      int dv, int kvl, bf16 *out, int *done, ms_err *err);
/* Router GEMV and noaux_tc routing in one launch for small decode batches (elementwise.cu): the same
 * result as cu_linear into lg [T][E] fp32 followed by cu_route, up to the GEMV's summation order. Sets
 * *launched = 0 and does nothing unless T <= 8, the gate is plain bf16 without a bias, x is bf16 and
 * K is a multiple of 8 with 16-byte aligned rows. norm != NULL (T = 1, norm->H = K, the K-split form
 * of at most one block an SM only, else nothing is launched): x is not read but computed from norm
 * (cu_norm_in). */
int cu_router_fused(ms_backend *b, const ms_tensor *x, const ms_linear *gate, const void *bias, int bias_t,
                    const ms_route_cfg *rc, int T, float *lg, int32_t *ids, float *w, const cu_norm_in *norm,
                    int *launched, ms_err *err);
/* MoE routing of T tokens from router logits [T, n_experts] (F32) with an optional score-correction
 * bias (dtype bias_t, NULL = none) as rc describes: ids [T, topk] expert ids and w [T, topk] weights
 * (device memory), the contract of the router op after its linear (backend/backend.h). */
int cu_route(ms_backend *b, const float *logits, const void *bias, int bias_t, const ms_route_cfg *rc, int T,
             int32_t *ids, float *w, ms_err *err);

/* ---- device helpers ---- */
__device__ __forceinline__ float cu_ld(const void *p, int dt, size_t i) {
    switch (dt) {
    case MS_F32: return ((const float *)p)[i];
    case MS_BF16: return __bfloat162float(((const bf16 *)p)[i]);
    case MS_F16: return __half2float(((const __half *)p)[i]);
    default: return 0.f;
    }
}
__device__ __forceinline__ void cu_st(void *p, int dt, size_t i, float v) {
    switch (dt) {
    case MS_F32: ((float *)p)[i] = v; break;
    case MS_BF16: ((bf16 *)p)[i] = __float2bfloat16_rn(v); break;
    case MS_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    default: break;
    }
}
/* float8_e4m3fn -> float, exact (NaN codes give NaN). */
__device__ __forceinline__ float cu_e4m3(uint32_t b) {
    uint32_t s = (b & 0x80u) << 24, e = (b >> 3) & 15u, m = b & 7u;
    if (e == 15u && m == 7u) return __int_as_float(0x7fc00000 | s);
    if (e == 0u) { float v = (float)m * 0.001953125f; return s ? -v : v; } /* m/8 * 2^-6 */
    return __uint_as_float(s | ((e + 120u) << 23) | (m << 20));
}
/* E2M1 code (low 4 bits) -> float, exact. */
__device__ __forceinline__ float cu_e2m1(uint32_t c) {
    uint32_t s = (c & 8u) << 28, mag = c & 7u;
    uint32_t bits = mag == 0 ? 0u : mag == 1 ? 0x3f000000u : ((((mag >> 1) + 126u) << 23) | ((mag & 1u) << 22));
    return __uint_as_float(bits | s);
}
/* Element (n,k) of a weight, exactly as ms_linear_dequant_row computes it (float32). */
__device__ __forceinline__ float cu_deq(const cu_wdesc &d, int64_t n, int64_t k) {
    if (d.fmt == MS_WFMT_PLAIN) return cu_ld(d.w, d.dtype, (size_t)(n * d.k + k));
    if (d.fmt == MS_WFMT_FP8) {
        uint8_t q = ((const uint8_t *)d.w)[n * d.k + k];
        float s = ((const float *)d.scale)[(n / 128) * d.scale_ld + k / 128];
        return __fmul_rn(cu_e4m3(q), s);
    }
    uint8_t q = ((const uint8_t *)d.w)[n * (d.k / 2) + k / 2];
    uint8_t sc = ((const uint8_t *)d.scale)[n * (d.k / 16) + k / 16];
    float bs = __fmul_rn(cu_e4m3(sc), d.scale2);
    return __fmul_rn(cu_e2m1((k & 1) ? (q >> 4) : (q & 15)), bs);
}
/* Fast exact decoders for the vector paths (NaN codes of e4m3 are not special-cased here:
 * checkpoints hold finite weights; the scalar path keeps NaN). */
__device__ __forceinline__ float e2m1_fast(uint32_t nib) {
    return __uint_as_float(((nib & 7u) << 22) | ((nib & 8u) << 28)) * 0x1p126f;
}
__device__ __forceinline__ float e4m3_fast(uint32_t byte) {
    return __uint_as_float(((byte & 0x7fu) << 20) | ((byte & 0x80u) << 24)) * 0x1p120f;
}
__device__ __forceinline__ float cu_silu(float g) { return g / (1.f + expf(-g)); }

/* ---- tensor-core building blocks (sm_80+ PTX; attn_mma.cu, gemm_mma.cu) ---- */
/* Fragment layouts of mma.m16n8k16 .bf16 (PTX ISA; g = lane >> 2, t = lane & 3), lower index in the
 * low 16 bits of each register:
 *   A 16x16 (row-major): reg0 = A[g][2t..2t+1], reg1 = A[g+8][2t..], reg2 = A[g][2t+8..], reg3 = A[g+8][2t+8..]
 *   B 16x8  (k x n):     reg0 = B[2t..2t+1][g],  reg1 = B[2t+8..2t+9][g]
 *   C 16x8  (fp32):      c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]
 * ldmatrix .x4: lanes 8i..8i+7 give the row addresses of matrix i (8 rows of 16 bytes); register i of
 * every lane receives row lane/4, elements 2(lane%4), 2(lane%4)+1 of matrix i. */

/* ---- Hopper warpgroup MMA (wgmma) building blocks (gemm_mma.cu, gemv_w8.cu) ----
 * CU_HAVE_WGMMA is 1 only while compiling sm_90a code: wgmma exists on no other target, so kernels
 * built around it compile to an empty body elsewhere and the host launches them only where
 * cu_gw_probe found that code (cu_impl.have_wgmma). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CU_HAVE_WGMMA 1
/* Orders this warpgroup's earlier register writes (accumulators, A fragments) before its next wgmma. */
__device__ __forceinline__ void cu_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
/* Closes this warpgroup's wgmmas issued since the last commit into one group (what cu_wg_wait counts). */
__device__ __forceinline__ void cu_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/* Waits until at most N of this warpgroup's committed wgmma groups are pending. */
template <int N> __device__ __forceinline__ void cu_wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Pins registers in place around the asynchronous wgmmas (CUTLASS's warpgroup_fence_operand): no read
 * or write of acc may be moved across this point by the compiler. */
template <int R> __device__ __forceinline__ void cu_wg_acc_fence(float (&acc)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(acc[i])::"memory");
}
/* The same for register operands (wgmma's A fragments): written before this point, not moved past it. */
template <int R> __device__ __forceinline__ void cu_wg_reg_fence(uint32_t (&r)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+r"(r[i])::"memory");
}
/* Makes this thread's generic-proxy shared-memory writes visible to later wgmma (async-proxy) reads;
 * a barrier must follow before another thread's wgmma reads them. */
__device__ __forceinline__ void cu_wg_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
#else
#define CU_HAVE_WGMMA 0
#endif

/* Shared-memory address of a generic pointer into shared memory. */
__device__ __forceinline__ uint32_t cu_saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
/* 16-byte global -> shared copy; full == false writes 16 zero bytes and reads nothing. */
__device__ __forceinline__ void cu_cp16(uint32_t dst, const void *src, bool full) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(full ? 16 : 0) : "memory");
}
/* Asks the L2 for the bytes [p, p + n): a hint (cp.async.bulk.prefetch, sm_90 on; nothing below), no data
 * returned, nothing to wait for. p and n must be multiples of 16. Only for bytes no device work in flight
 * writes (weights under cu_impl.weights_quiet). */
__device__ __forceinline__ void cu_l2_prefetch(const void *p, unsigned n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
#endif
}
__device__ __forceinline__ void cu_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* Waits until at most N of this thread's committed cp.async groups are pending. */
template <int N> __device__ __forceinline__ void cu_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cu_ldsm4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
/* ldmatrix .x4 .trans: register i of every lane receives rows 2(lane%4), 2(lane%4)+1 of column
 * lane/4 of matrix i (the B fragment of a row-major k x n tile). */
__device__ __forceinline__ void cu_ldsm4t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
/* c += A (16x16, 4 regs) · B (16x8, 2 regs), bf16 inputs, fp32 accumulate. */
__device__ __forceinline__ void cu_mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* Two floats as a bf16x2 register (round to nearest even), lo in the low half. */
__device__ __forceinline__ uint32_t cu_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(const uint32_t *)&v;
}

/* One online-softmax step of a flash-attention warp tile (rows g and g+8 of the lane, NS 8-key
 * n-tiles): sc holds the tile's scores already scaled into the log2 domain, -inf where masked. Folds
 * them into the running max m and this lane's share of the sum l, turns sc into P = exp2(s - m) and
 * rescales the lane's O fragments (NO n-tiles). A row that has seen no key keeps m = -inf and uses 0
 * as its base, so no inf - inf appears. */
template <int NS, int NO>
__device__ __forceinline__ void cu_softmax_tile(float (&sc)[NS][4], float (&m)[2], float (&l)[2], float (&o)[NO][4]) {
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NS; nt++) mx = fmaxf(mx, fmaxf(sc[nt][2 * hf], sc[nt][2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m[hf], mx);
        const float base = mn == -INFINITY ? 0.f : mn;
        const float alpha = exp2f(m[hf] - base); /* 0 while the row had no key */
        m[hf] = mn;
        float rs = 0.f;
#pragma unroll
        for (int nt = 0; nt < NS; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float &v = sc[nt][2 * hf + e];
                v = exp2f(v - base);
                rs += v;
            }
        l[hf] = l[hf] * alpha + rs;
#pragma unroll
        for (int dt = 0; dt < NO; dt++) {
            o[dt][2 * hf] *= alpha;
            o[dt][2 * hf + 1] *= alpha;
        }
    }
}
/* O += P·V for a warp tile: P from sc (S's C fragments of n-tiles 2ks, 2ks+1 are P's A fragment for
 * keys 16ks..16ks+15), V rows in shared memory with row stride lds elements; vrow is this lane's
 * ldmatrix.trans address of key 0, column 0: row (lane & 7) + 8 * ((lane >> 3) & 1), column
 * 8 * (lane >> 4). NO 8-wide output n-tiles. */
template <int NS, int NO>
__device__ __forceinline__ void cu_pv_tile(const float (&sc)[NS][4], const bf16 *vrow, int lds, float (&o)[NO][4]) {
#pragma unroll
    for (int ks = 0; ks < NS / 2; ks++) {
        const uint32_t pa[4] = {cu_pack_bf16(sc[2 * ks][0], sc[2 * ks][1]), cu_pack_bf16(sc[2 * ks][2], sc[2 * ks][3]),
                                cu_pack_bf16(sc[2 * ks + 1][0], sc[2 * ks + 1][1]),
                                cu_pack_bf16(sc[2 * ks + 1][2], sc[2 * ks + 1][3])};
#pragma unroll
        for (int dp = 0; dp < NO / 2; dp++) {
            uint32_t bv[4];
            cu_ldsm4t(bv, cu_saddr(vrow + ks * 16 * lds + dp * 16));
            cu_mma_bf16(o[2 * dp], pa, bv[0], bv[1]);
            cu_mma_bf16(o[2 * dp + 1], pa, bv[2], bv[3]);
        }
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static inline int cu_blocks(int64_t n, int t) { return (int)((n + t - 1) / t); }
/* F32 data of an optional tensor t of n elements (a bias): NULL when t is absent; *ok = 0 when t is there
 * but not F32 [n] (the caller then declines or reports it: biases come from checkpoints, so not an assert). */
static inline const float *cu_f32_opt(const ms_tensor *t, int64_t n, int *ok) {
    if (!t || !t->data) return NULL;
    if (t->dtype != MS_F32 || ms_tensor_numel(t) != n) *ok = 0;
    return (const float *)t->data;
}

#endif
