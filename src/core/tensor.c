/* tensor.c - tensor view helpers, the reference dequantization of one weight row and the greedy choice of a logits row. */
#include "core/tensor.h"

#include "core/status.h"

#include <float.h>
#include <math.h>

int64_t ms_tensor_numel(const ms_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t ms_tensor_nbytes(const ms_tensor *t) {
    return (size_t)ms_tensor_numel(t) * ms_dtype_size(t->dtype);
}

ms_tensor ms_tensor_make(ms_dtype dtype, int ndim, const int64_t *shape) {
    MS_ASSERT(ndim >= 0 && ndim <= 4);
    ms_tensor t = {0};
    t.dtype = dtype;
    t.ndim = ndim;
    for (int i = 0; i < ndim; i++) t.shape[i] = shape[i];
    return t;
}

ms_tensor ms_tensor_2d(ms_dtype dtype, int64_t rows, int64_t cols) {
    int64_t s[2] = {rows, cols};
    return ms_tensor_make(dtype, 2, s);
}

ms_tensor ms_tensor_rows(const ms_tensor *t, int64_t r0, int64_t n) {
    MS_ASSERT(t->ndim >= 1 && r0 >= 0 && r0 + n <= t->shape[0]);
    ms_tensor v = *t;
    int64_t row = 1;
    for (int i = 1; i < t->ndim; i++) row *= t->shape[i];
    v.data = (char *)t->data + (size_t)(r0 * row) * ms_dtype_size(t->dtype);
    v.shape[0] = n;
    return v;
}

ms_tensor ms_tensor_reshape(const ms_tensor *t, int ndim, const int64_t *shape) {
    ms_tensor v = ms_tensor_make(t->dtype, ndim, shape);
    MS_ASSERT(ms_tensor_numel(&v) == ms_tensor_numel(t));
    v.data = t->data;
    return v;
}

const char *ms_wfmt_name(ms_wfmt f, ms_dtype plain_dtype) {
    switch (f) {
    case MS_WFMT_FP8: return "fp8";
    case MS_WFMT_NVFP4: return "nvfp4";
    default: break;
    }
    switch (plain_dtype) {
    case MS_BF16: return "bf16";
    case MS_F16: return "f16";
    case MS_F32: return "f32";
    default: return "?";
    }
}

void ms_linear_dequant_row(const ms_linear *W, int64_t n, float *out) {
    const int64_t K = W->n_in;
    MS_ASSERT(n >= 0 && n < W->n_out);
    switch (W->fmt) {
    case MS_WFMT_PLAIN:
        ms_convert_to_f32(W->w.dtype, (const char *)W->w.data + (size_t)(n * K) * ms_dtype_size(W->w.dtype), out,
                          (size_t)K);
        break;
    case MS_WFMT_FP8: {
        ms_dtype_init();
        const uint8_t *q = (const uint8_t *)W->w.data + (size_t)(n * K);
        const float *s = (const float *)W->scale.data + (size_t)((n / 128) * W->scale.shape[1]);
        for (int64_t k = 0; k < K; k++) out[k] = ms_e4m3_to_f32(q[k]) * s[k / 128];
        break;
    }
    case MS_WFMT_NVFP4: {
        ms_dtype_init();
        const uint8_t *q = (const uint8_t *)W->w.data + (size_t)(n * (K / 2));
        const uint8_t *s = (const uint8_t *)W->scale.data + (size_t)(n * (K / 16));
        for (int64_t k = 0; k < K; k += 2) {
            float bs = ms_e4m3_to_f32(s[k / 16]) * W->scale2;
            uint8_t b = q[k / 2];
            out[k] = ms_e2m1_to_f32(b & 15) * bs;
            out[k + 1] = ms_e2m1_to_f32(b >> 4) * bs;
        }
        break;
    }
    }
}

size_t ms_linear_nbytes(const ms_linear *W) {
    size_t n = ms_tensor_nbytes(&W->w);
    if (W->scale.data) n += ms_tensor_nbytes(&W->scale);
    if (W->bias.data) n += ms_tensor_nbytes(&W->bias);
    return n;
}

int64_t ms_greedy_argmax(const float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m; /* NaN: x[i] > m is false */
    if (m > FLT_MAX) m = FLT_MAX;
    if (m > -INFINITY)
        for (int64_t i = 0; i < n; i++)
            if ((x[i] > FLT_MAX ? FLT_MAX : x[i]) == m) return i;
    return 0;
}
