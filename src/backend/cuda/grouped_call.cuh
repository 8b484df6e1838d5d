/* grouped_call.cuh - the plain-data descriptions that the CUDA weight products share: a weight matrix
 * in its checkpoint format (cu_wdesc), one call of the grouped small-batch product (cu_gemv_call, for
 * cu_gemv_grouped / cu_gemv_mma) and one call of the grouped GEMM (cu_gg_call, for cu_gemm_grouped /
 * cu_gemm_grouped_mma). Callers fill a call with designated initialisers (fields left out are zero,
 * which means "absent" for every pointer) and pass its address. Each implementation (CUDA-core
 * fallback in quant.cu, tensor-core gemv_mma.cu / gemm_mma.cu) copies the call into its kernel
 * arguments (cu_gemv_kargs / cu_gg_kargs: the call plus w0's shape) and extends those with its own
 * launch fields, so the arguments are read in one place. Free of CUDA headers (the host emulation of
 * gemv_mma.cu includes it too); the includer declares `bf16` first. */
#ifndef MS_BACKEND_CUDA_GROUPED_CALL_CUH
#define MS_BACKEND_CUDA_GROUPED_CALL_CUH

#include <stdint.h>

/* Device form of one weight matrix in its checkpoint format. The struct itself is plain data (host
 * or device copies alike); w and scale point into device memory owned by the placed ms_linear. */
typedef struct cu_wdesc {
    const void *w;     /* weight data: PLAIN dtype [n, k]; FP8 e4m3 bytes [n, k]; NVFP4 E2M1 nibbles [n, k/2] */
    const void *scale; /* FP8: F32 [ceil(n/128), scale_ld] block scales; NVFP4: e4m3 [n, k/16]; PLAIN: NULL */
    float scale2;      /* NVFP4 per-tensor scale (multiplies every element); unused otherwise */
    int fmt;           /* ms_wfmt */
    int dtype;         /* w dtype when PLAIN (BF16 or F32 after placement) */
    int n, k;          /* rows (out features), cols (in features) */
    int scale_ld;      /* FP8: scale row length ceil(K/128); NVFP4: K/16 */
} cu_wdesc;

/* One call of the grouped small-batch product (contract of the results: cu_gemv_grouped in
 * cuda_internal.cuh). Two forms: device tables (W0 != NULL: n_groups groups, each with its own
 * weight and rows) or a single group (W0 == NULL: one weight, w0, over rows [0, rows_total)). The
 * caller owns every buffer; the call only borrows them until the launch is queued on the stream. */
typedef struct cu_gemv_call {
    int mode; /* 0: y = x·W0ᵀ (y_type F32 or BF16); 1: y = silu(x·W0ᵀ) * (x·W1ᵀ) as BF16 (gate/up fused) */
    int n_groups; /* groups launched (tables: slots 0..n_groups-1, those past *n_active skipped); single: 1.
                     <= 0: nothing is done */
    const cu_wdesc *W0, *W1; /* device arrays of descriptors indexed by the group's weight id; W1 (the up
                                weights, mode 1 only) has W0's formats. NULL W0: the single form */
    cu_wdesc w0; /* host copy of the single group's weight, or of table entry 0 with the tables: its
                    format, n (N, output columns) and k (K, reduction) stand for every group's */
    cu_wdesc w1; /* single form, mode 1: the up weight, shaped like w0 (cu_gemv_mma only). w1.w == NULL:
                    absent */
    const float *bias; /* single form, mode 0: F32 [N] device bias added to every row (cu_gemv_mma only), or
                          NULL */
    const int32_t *n_active; /* tables: device [1], groups at or past it are skipped; NULL = all n_groups */
    const int32_t *group_w;  /* tables: device [n_groups], weight id of group g; NULL = g itself */
    const int32_t *row_off, *row_cnt; /* tables: device [weights], group wid's rows are r in
                                         [row_off[wid], row_off[wid] + row_cnt[wid]); single: NULL */
    const int32_t *row_idx; /* device [rows]: x row of output row r; NULL = r itself */
    int rows_total; /* single: exact row count (<= 0: nothing is done); tables: a hint, the usual most rows of
                       one group, which sizes token staging (any count stays correct, in more passes; <= 0:
                       8 is assumed) */
    const bf16 *x;  /* device [*, K] bf16 activations, row stride K elements */
    void *y;        /* device output, row r at y + r * ldy elements */
    int y_type;     /* ms_dtype of y: F32 or BF16 (mode 1: BF16) */
    int64_t ldy;    /* row stride of y in elements (>= N) */
} cu_gemv_call;

/* One call of the grouped GEMM (contract of the results: cu_gemm_grouped in cuda_internal.cuh):
 * CU_GG_BM-row tiles of rows grouped contiguously by weight. The caller owns every buffer. */
typedef struct cu_gg_call {
    int mode;      /* 0: y = x·W0ᵀ (y_type F32 or BF16); 1: y = silu(x·W0ᵀ) * (x·W1ᵀ) as BF16 */
    int n_groups;  /* groups (= weights; <= 0: nothing is done) */
    int max_tiles; /* tiles launched: an upper bound of tile_off[n_groups] (<= 0: nothing is done) */
    const cu_wdesc *W0, *W1; /* device arrays [n_groups] of descriptors; W1 (up, mode 1 only) has w0's format */
    cu_wdesc w0;   /* host copy of W0[0]: format, n (N) and k (K) stand for every group's */
    const int32_t *tile_off; /* device [n_groups + 1]: group g owns tiles [tile_off[g], tile_off[g + 1]) */
    const int32_t *row_off, *row_cnt; /* device [n_groups]: group g's rows of x (and y) are contiguous,
                                         row_cnt[g] of them from row_off[g] */
    const bf16 *x; /* device [rows, K] bf16, row stride K elements */
    void *y;       /* device output, row r at y + r * ldy elements */
    int y_type;    /* ms_dtype of y: F32 or BF16 (mode 1: BF16) */
    int64_t ldy;   /* row stride of y in elements (>= N) */
} cu_gg_call;

/* What the grouped-product kernels receive: the call with w0's shape spelled out (N = w0.n output
 * columns, K = w0.k reduction length). Implementations derive their launch arguments from these. */
struct cu_gemv_kargs : cu_gemv_call {
    int N, K;
};
struct cu_gg_kargs : cu_gg_call {
    int N, K;
};
/* Copies call c into the kernel arguments a (other fields of a's derived type are left as they are). */
static inline void cu_kargs_set(cu_gemv_kargs &a, const cu_gemv_call &c) {
    static_cast<cu_gemv_call &>(a) = c;
    a.N = c.w0.n;
    a.K = c.w0.k;
}
static inline void cu_kargs_set(cu_gg_kargs &a, const cu_gg_call &c) {
    static_cast<cu_gg_call &>(a) = c;
    a.N = c.w0.n;
    a.K = c.w0.k;
}

#endif
