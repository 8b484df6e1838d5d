/* tensor.h - views of backend memory and of quantized linear weights.
 *
 * An ms_tensor is a contiguous row-major view; `data` is backend memory (host memory for the CPU
 * backend, device memory for CUDA). It never owns memory by itself: the model (mmap or its arena)
 * or the backend allocator does. An ms_linear is one weight matrix W [n_out, n_in] (y = x·Wᵀ + b)
 * kept in its checkpoint format; what each format means is defined in core/dtype.h and
 * reference/glm5-spec.md section 4. */
#ifndef MS_CORE_TENSOR_H
#define MS_CORE_TENSOR_H

#include "core/dtype.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ms_tensor {
    void *data;
    ms_dtype dtype;
    int ndim;
    int64_t shape[4];
} ms_tensor;

/* Number of elements (product of shape; 1 for ndim 0). */
int64_t ms_tensor_numel(const ms_tensor *t);
/* numel x element size. */
size_t ms_tensor_nbytes(const ms_tensor *t);
/* Makes a tensor header (data NULL) of the given dtype and shape (ndim <= 4). */
ms_tensor ms_tensor_make(ms_dtype dtype, int ndim, const int64_t *shape);
ms_tensor ms_tensor_2d(ms_dtype dtype, int64_t rows, int64_t cols);
/* View of rows [r0, r0+n) of a tensor whose first dim indexes rows (shape[0] becomes n). */
ms_tensor ms_tensor_rows(const ms_tensor *t, int64_t r0, int64_t n);
/* Same data viewed with a new shape of equal numel. */
ms_tensor ms_tensor_reshape(const ms_tensor *t, int ndim, const int64_t *shape);

typedef enum ms_wfmt {
    MS_WFMT_PLAIN = 0, /* w: [N,K] F32, F16 or BF16 */
    MS_WFMT_FP8 = 1,   /* w: [N,K] F8E4M3; scale: [ceil(N/128), ceil(K/128)] F32 multiplier */
    MS_WFMT_NVFP4 = 2, /* w: [N,K/2] U8 (low nibble = even k); scale: [N,K/16] F8E4M3; scale2 global */
} ms_wfmt;

/* Name of a format for messages and `inspect` ("bf16", "fp8", "nvfp4", "f32", "f16"). */
const char *ms_wfmt_name(ms_wfmt f, ms_dtype plain_dtype);

typedef struct ms_linear {
    const char *name;   /* module name, e.g. "model.layers.3.mlp.experts.7.up_proj" (owned by model) */
    ms_wfmt fmt;
    int64_t n_out, n_in;
    ms_tensor w;
    ms_tensor scale;    /* data NULL for PLAIN */
    float scale2;       /* NVFP4 weight_scale_2 */
    float input_scale;  /* NVFP4 input_scale (kept for W4A4 engines; W4A16 ignores it) */
    ms_tensor bias;     /* [N] or data NULL */
    void *prepared;     /* backend-private form made by place_linear (may be NULL) */
} ms_linear;

/* Dequantizes row n of W into out[0..n_in) as float32, exactly per the format definition. W must be
 * in host memory. Used by the CPU backend, quantize round trips and tests. */
void ms_linear_dequant_row(const ms_linear *W, int64_t n, float *out);
/* The greedy choice of a row x [n] of logits (engine/sampler.h step 3, backend.h's argmax op): the
 * first index holding the largest value, where NaN never wins and +inf counts as FLT_MAX; 0 when no
 * value is above -inf. Two passes: a max the compiler vectorises, then the first index holding it. */
int64_t ms_greedy_argmax(const float *x, int64_t n);
/* Bytes of weight data (w + scale + bias). */
size_t ms_linear_nbytes(const ms_linear *W);

#endif
