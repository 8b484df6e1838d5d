/* grouped_call.cuh - the plain-data descriptions that the CUDA weight products share: a weight matrix
 * in its checkpoint format (cu_wdesc) and one call of the grouped small-batch product
 * (cu_gemv_grouped) or of the grouped GEMM (cu_gemm_grouped), as their kernels take them. Each
 * implementation (CUDA-core fallback in quant.cu, tensor-core gemv_mma.cu / gemm_mma.cu) extends
 * the call with its own launch fields, so the arguments are read in one place. Free of CUDA headers
 * (the host emulation of gemv_mma.cu includes it too); the includer declares `bf16` first. */
#ifndef MS_BACKEND_CUDA_GROUPED_CALL_CUH
#define MS_BACKEND_CUDA_GROUPED_CALL_CUH

#include <stdint.h>
#include <stdlib.h>

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

/* cu_gemv_grouped's arguments (contract in cuda_internal.cuh); w0 is the single-group weight, N/K
 * its shape (w_host's for the device tables). */
struct cu_gemv_call {
    const cu_wdesc *W0, *W1;
    cu_wdesc w0;
    const int32_t *n_active, *group_w, *row_off, *row_cnt, *row_idx;
    int rows_total;
    const bf16 *x;
    void *y;
    int y_type;
    int64_t ldy;
    int N, K;
};

static inline cu_gemv_call cu_gemv_call_make(const cu_wdesc *W0_d, const cu_wdesc *W1_d, const cu_wdesc *w_host,
                                             const int32_t *n_active_d, const int32_t *group_w_d,
                                             const int32_t *row_off_d, const int32_t *row_cnt_d,
                                             const int32_t *row_idx_d, int rows_total, const bf16 *x, void *y,
                                             int y_type, int64_t ldy) {
    cu_gemv_call c = {W0_d, W1_d, *w_host, n_active_d, group_w_d, row_off_d, row_cnt_d, row_idx_d,
                      rows_total, x, y, y_type, ldy, w_host->n, w_host->k};
    return c;
}

/* cu_gemm_grouped's arguments (contract in cuda_internal.cuh). */
struct cu_gg_call {
    const cu_wdesc *W0, *W1;
    int n_groups;
    const int32_t *tile_off, *row_off, *row_cnt;
    const bf16 *x;
    void *y;
    int y_type;
    int64_t ldy;
    int N, K;
};

static inline cu_gg_call cu_gg_call_make(const cu_wdesc *W0_d, const cu_wdesc *W1_d, const cu_wdesc *w_host,
                                         int n_groups, const int32_t *tile_off_d, const int32_t *row_off_d,
                                         const int32_t *row_cnt_d, const bf16 *x, void *y, int y_type, int64_t ldy) {
    cu_gg_call c = {W0_d, W1_d, n_groups, tile_off_d, row_off_d, row_cnt_d, x, y, y_type, ldy, w_host->n, w_host->k};
    return c;
}

/* Integer tuning knob from the environment: `name` parsed as a decimal integer in [lo, hi], else
 * def. Callers read it once (a function-local static), so a step never pays for getenv. */
static inline int cu_env_int(const char *name, int def, int lo, int hi) {
    const char *e = getenv(name);
    if (!e || !*e) return def;
    char *end = NULL;
    long v = strtol(e, &end, 10);
    return (*end || v < lo || v > hi) ? def : (int)v;
}

#endif
