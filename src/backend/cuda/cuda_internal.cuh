/* cuda_internal.cuh - what the CUDA backend's .cu files (and the CUDA MoE runners) share: the
 * backend's private state, checked-call macros, dtype helpers, the exact dequantization of every
 * weight format and the internal GEMM entry points. Included only from .cu files. */
#ifndef MS_BACKEND_CUDA_INTERNAL_CUH
#define MS_BACKEND_CUDA_INTERNAL_CUH

#define _Noreturn [[noreturn]]
extern "C" {
#include "backend/backend.h"
#include "backend/cuda/backend_cuda.h"
#include "core/dtype.h"
#include "core/status.h"
#include "model/tensor.h"
}
#undef _Noreturn

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

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

#define MS_CU_N_SCRATCH 5
enum { SCR_DEQ = 0, SCR_TMP = 1, SCR_TMP2 = 2, SCR_HOST = 3, SCR_ATTN = 4 /* split-K attention partials */ };

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
    cu_gemm_cache_ent gcache[64];
    int gcache_next;
    cu_rope_ent rope[8];
    int n_rope;
    cu_alloc_node *owned; /* freed at destroy (prepared tables etc.) */
    int max_smem_optin;
    uint64_t epoch; /* bumped when a scratch buffer moves (recorded graphs hold its old address) */
} cu_impl;

static inline cu_impl *cu_of(const ms_backend *b) { return (cu_impl *)b->impl; }

/* Device form of one weight matrix in its checkpoint format (all pointers device memory). */
typedef struct cu_wdesc {
    const void *w;
    const void *scale;
    float scale2;
    int fmt;      /* ms_wfmt */
    int dtype;    /* w dtype when PLAIN (BF16 or F32 after placement) */
    int n, k;     /* rows (out features), cols (in features) */
    int scale_ld; /* FP8: scale row length ceil(K/128); NVFP4: K/16 */
} cu_wdesc;

/* What place_linear stores in W->prepared. */
typedef struct cu_linear_prep {
    cu_wdesc d;
    bf16 *deq;        /* lazily made bf16 copy [N,K] (kv_b for absorbed MLA), NULL until needed */
    float *bias_f32;  /* bias as F32 or NULL */
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

/* ---- quantized kernels (quant.cu) ---- */
/* Dequantizes rows of d into bf16 out [N,K] exactly as ms_linear_dequant_row, then rounds. */
int cu_dequant_bf16(ms_backend *b, const cu_wdesc *d, bf16 *out, ms_err *err);
/* Grouped small-batch product reading each weight once (memory-bound decode path); runs
 * cu_gemv_mma when cu_gemv_mma_usable allows, else the CUDA-core kernels.
 * For group g (0..n_groups-1; groups beyond *n_active_d if non-NULL are skipped) with weight
 * table entry wid = group_w_d ? group_w_d[g] : g, rows r in [row_off_d[wid], row_off_d[wid]+row_cnt_d[wid])
 * of x [*, K] (bf16, x row = row_idx_d ? row_idx_d[r] : r):
 *   mode 0: y[r, n] = x_r · W0[wid]_nᵀ, y F32 or BF16 (y_type) with row stride ldy.
 *   mode 1: y[r, n] = silu(x_r·W0ᵀ) * (x_r·W1ᵀ) as BF16 (gate/up fused).
 * W0/W1 are device arrays of cu_wdesc indexed by wid; when W0_d is NULL there is one group using
 * *w_host itself, rows [0, rows_total) (row_off_d/row_cnt_d NULL). w_host also gives format/N/K. */
int cu_gemv_grouped(ms_backend *b, int mode, const cu_wdesc *W0_d, const cu_wdesc *W1_d, const cu_wdesc *w_host,
                    int n_groups, const int32_t *n_active_d, const int32_t *group_w_d, const int32_t *row_off_d,
                    const int32_t *row_cnt_d, const int32_t *row_idx_d, int rows_total, const bf16 *x, void *y,
                    int y_type, int64_t ldy, ms_err *err);
/* ---- tensor-core grouped GEMV (gemv_mma.cu) ---- */
/* 1 when cu_gemv_mma can run weights shaped like w with activations x: MS_CU_GEMV is not "gv2"
 * (read once), compute capability >= 8.0, BF16 with K % 8 == 0, FP8 with K % 16 == 0 or NVFP4 with
 * K % 32 == 0, x 16-byte aligned, and when single != 0 (one group using w itself) w's data 16-byte
 * aligned. Rows of every weight in a device table are assumed 16-byte aligned, as in the gv2 kernels. */
int cu_gemv_mma_usable(const ms_backend *b, const cu_wdesc *w, const void *x, int single);
/* Same contract as cu_gemv_grouped, computed on tensor cores (mma.sync bf16, fp32 accumulate) with
 * the weights dequantized exactly in registers; requires cu_gemv_mma_usable. */
int cu_gemv_mma(ms_backend *b, int mode, const cu_wdesc *W0_d, const cu_wdesc *W1_d, const cu_wdesc *w_host,
                int n_groups, const int32_t *n_active_d, const int32_t *group_w_d, const int32_t *row_off_d,
                const int32_t *row_cnt_d, const int32_t *row_idx_d, int rows_total, const bf16 *x, void *y,
                int y_type, int64_t ldy, ms_err *err);
/* cu_gemv_mma with two single-group extras (W0_d == NULL): w1_host, the up weight of a fused mode-1
 * gate/up pair (silu(x·gateᵀ) * (x·upᵀ), both shaped like w_host), and bias_d, mode 0 only, an F32
 * [N] bias added in the epilogue. Either may be NULL. */
int cu_gemv_mma_ex(ms_backend *b, int mode, const cu_wdesc *W0_d, const cu_wdesc *W1_d, const cu_wdesc *w_host,
                   const cu_wdesc *w1_host, const float *bias_d, int n_groups, const int32_t *n_active_d,
                   const int32_t *group_w_d, const int32_t *row_off_d, const int32_t *row_cnt_d,
                   const int32_t *row_idx_d, int rows_total, const bf16 *x, void *y, int y_type, int64_t ldy,
                   ms_err *err);
/* Grouped tensor-core GEMM (wmma bf16, fp32 accumulate) dequantizing weight tiles in shared memory.
 * Rows are grouped: tile t of the launch covers rows of group g where tile_off_d[g] <= t < tile_off_d[g+1]
 * (64-row tiles; tile_off_d has n_groups+1 entries; tiles past tile_off_d[n_groups] exit).
 * x rows are contiguous per group starting at row_off_d[g] (row_cnt_d[g] rows). Modes as gemv. */
int cu_gemm_grouped(ms_backend *b, int mode, const cu_wdesc *W0_d, const cu_wdesc *W1_d, const cu_wdesc *w_host,
                    int n_groups, int max_tiles, const int32_t *tile_off_d, const int32_t *row_off_d,
                    const int32_t *row_cnt_d, const bf16 *x, void *y, int y_type, int64_t ldy, ms_err *err);
#define CU_GG_BM 64

/* ---- attention (attention.cu, attn_mma.cu) ---- */
/* Split-K sizing shared by the attention kernels: *n_split key ranges for a launch of `blocks` blocks
 * (before splitting) over at most `tiles` key tiles, aiming at per_sm blocks per SM (at most 64 ranges,
 * at most one per tile; 1 when MS_ATTN_NO_SPLIT is set). When *n_split > 1, *part is the float
 * workspace [T][nh][n_split][Dv + 2] (slot SCR_ATTN) for the partials: unnormalised O, then the
 * range's running max m (natural log domain of the scaled scores; -inf when it saw no key) and sum l. */
int cu_attn_split(ms_backend *b, int64_t blocks, int tiles, int per_sm, int T, int nh, int Dv, int *n_split,
                  float **part, ms_err *err);
/* Merges the n_split partials of every (token, head) into out [T][nh][Dv] (nothing when n_split <= 1). */
int cu_attn_combine(ms_backend *b, const float *part, int n_split, int T, int nh, int Dv, bf16 *out, ms_err *err);
/* Paged causal GQA on tensor cores (attn_mma.cu), the fast path of attn_gqa: q [T][nh][d], caches
 * [S][nkv][d], out [T][nh][d], bf16 device memory, batch layout as ms_attn_meta. Sets *launched = 0
 * and does nothing when the shape is not covered (d other than 64 or 128, a GPU below sm_80, too
 * little shared memory, or MS_ATTN_NO_MMA set in the environment); the caller then runs k_attn. */
int cu_attn_gqa_mma(ms_backend *b, const bf16 *q, const bf16 *kc, const bf16 *vc, int nh, int nkv, int d,
                    const ms_attn_meta *m, float scale, bf16 *out, int *launched, ms_err *err);

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
__device__ __forceinline__ float cu_silu(float g) { return g / (1.f + expf(-g)); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static inline int cu_blocks(int64_t n, int t) { return (int)((n + t - 1) / t); }

#endif
