/* elementwise.cu - the CUDA backend's memory-bound ops: embedding, norms, adds, SwiGLU, column and
 * row copies, RoPE, KV stores, NaN/Inf search, argmax and the fused router (sigmoid + bias +
 * group-limited top-k + normalize + scale). Statistics and products run in fp32; each output is
 * rounded once to its dtype. */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/knobs.h"
#include "backend/cuda/norm_stage.cuh"
#include "backend/cuda/route_regs.cuh"
#include "backend/cuda/router_dot.cuh"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static inline cudaStream_t stream_of(ms_backend *b) { return cu_of(b)->stream; }
static int64_t last_dim(const ms_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }

/* ---- conversions and small helpers ---- */

__global__ void k_convert(const void *src, int st, void *dst, int dt, size_t n) {
    cu_pdl_wait();
    cu_pdl_trigger();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        cu_st(dst, dt, i, cu_ld(src, st, i));
}

static int grid_for(size_t n) {
    size_t g = (n + 255) / 256;
    if (g > 65535) g = 65535;
    return g ? (int)g : 1;
}

int cu_convert(ms_backend *b, const void *src, int st, void *dst, int dt, size_t n, ms_err *err) {
    if (!n) return MS_OK;
    CK(cu_launch(k_convert, grid_for(n), 256, 0, stream_of(b), src, st, dst, dt, n));
    return MS_OK;
}

__global__ void k_add_bias(void *y, int yt, const float *bias, int64_t rows, int64_t n) {
    cu_pdl_wait();
    cu_pdl_trigger();
    size_t tot = (size_t)rows * n;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < tot; i += (size_t)gridDim.x * blockDim.x)
        cu_st(y, yt, i, cu_ld(y, yt, i) + bias[i % n]);
}

int cu_add_bias(ms_backend *b, void *y, int yt, const float *bias, int64_t rows, int64_t n, ms_err *err) {
    size_t tot = (size_t)rows * n;
    if (!tot) return MS_OK;
    CK(cu_launch(k_add_bias, grid_for(tot), 256, 0, stream_of(b), y, yt, bias, rows, n));
    return MS_OK;
}

/* ---- embedding ---- */

__global__ void k_embed(const void *table, int tt, int64_t V, int64_t H, const int32_t *ids, int64_t v0, void *out, int ot) {
    cu_pdl_wait();
    cu_pdl_trigger();
    int64_t r = blockIdx.x;
    int64_t id = (int64_t)ids[r] - v0;
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
        float v = (id >= 0 && id < V) ? cu_ld(table, tt, (size_t)id * H + c) : 0.f;
        cu_st(out, ot, (size_t)r * H + c, v);
    }
}

int cu_op_embed(ms_backend *b, const ms_tensor *table, const int32_t *ids_d, int n, ms_tensor *out, ms_err *err) {
    MS_ASSERT(table->ndim == 2);
    int64_t H = table->shape[1];
    MS_ASSERT(ms_tensor_numel(out) >= (int64_t)n * H);
    if (n <= 0) return MS_OK;
    CK(cu_launch(k_embed, n, 256, 0, stream_of(b), table->data, table->dtype, table->shape[0], H, ids_d, 0, out->data, out->dtype));
    return MS_OK;
}

/* Vocabulary-parallel rows: ids outside [v0, v0 + rows) give zero rows (another rank adds them). */
int cu_op_embed_part(ms_backend *b, const ms_tensor *table, const int32_t *ids_d, int n, int64_t v0, ms_tensor *out,
                     ms_err *err) {
    MS_ASSERT(table->ndim == 2);
    int64_t H = table->shape[1];
    MS_ASSERT(ms_tensor_numel(out) >= (int64_t)n * H);
    if (n <= 0) return MS_OK;
    CK(cu_launch(k_embed, n, 256, 0, stream_of(b), table->data, table->dtype, table->shape[0], H, ids_d, v0, out->data, out->dtype));
    return MS_OK;
}

__global__ void k_remap_ids(int32_t *ids, int64_t n, int lo, int count) {
    cu_pdl_wait();
    cu_pdl_trigger();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int32_t e = ids[i];
        ids[i] = e >= lo && e < lo + count ? e - lo : -1;
    }
}

/* Expert parallelism: global expert ids -> this rank's (-1 for experts other ranks hold). */
int cu_op_remap_ids(ms_backend *b, int32_t *ids_d, int64_t n, int lo, int count, ms_err *err) {
    if (n <= 0) return MS_OK;
    CK(cu_launch(k_remap_ids, grid_for((size_t)n), 256, 0, stream_of(b), ids_d, n, lo, count));
    return MS_OK;
}

__global__ void k_moe_append(const int32_t *ids, const float *w, int T, int k, int32_t id, float weight, int32_t *ids_out,
                             float *w_out) {
    cu_pdl_wait();
    cu_pdl_trigger();
    const int64_t n = (int64_t)T * (k + 1);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / (k + 1);
        const int j = (int)(i - t * (k + 1));
        ids_out[i] = j < k ? ids[t * k + j] : id;
        w_out[i] = j < k ? w[t * k + j] : weight;
    }
}

/* A shared expert as column k of every row (backend.h, moe_append). */
int cu_op_moe_append(ms_backend *b, const int32_t *ids_d, const float *w_d, int T, int k, int32_t id, float weight,
                     int32_t *ids_out_d, float *w_out_d, ms_err *err) {
    if (T <= 0) return MS_OK;
    CK(cu_launch(k_moe_append, grid_for((size_t)T * (size_t)(k + 1)), 256, 0, stream_of(b), ids_d, w_d, T, k, id, weight, ids_out_d,
                 w_out_d));
    return MS_OK;
}

/* ---- norms ---- */

__device__ float block_sum(float v, float *sh) {
    v = warp_sum(v);
    int w = threadIdx.x / 32, l = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < nw; i++) s += sh[i];
    return s;
}

/* LayerNorm of row x[base, base + D) over the block: mean and 1 / sqrt(var + eps). The one place the
 * statistics are computed, so that the layernorm op and the fused indexer-key op (same block size)
 * give the same bits. */
__device__ __forceinline__ void ln_stats(const void *x, int xt, size_t base, int64_t D, float eps, float *sh,
                                         float *mean, float *inv) {
    float acc = 0.f;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) acc += cu_ld(x, xt, base + c);
    const float m = block_sum(acc, sh) / (float)D;
    float v2 = 0.f;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
        float d = cu_ld(x, xt, base + c) - m;
        v2 += d * d;
    }
    const float var = block_sum(v2, sh) / (float)D;
    *mean = m;
    *inv = 1.f / sqrtf(var + eps);
}

/* LayerNorm output of column c holding xv (before rounding to the output dtype). */
__device__ __forceinline__ float ln_value(float xv, float mean, float inv, const void *w, int wt, const void *bias,
                                          int bt, int64_t c) {
    float v = (xv - mean) * inv * cu_ld(w, wt, c);
    if (bias) v += cu_ld(bias, bt, c);
    return v;
}

/* Threads per row of a layernorm launch (the sum order of ln_stats depends on it). */
static int ln_threads(int64_t D) { return D >= 1024 ? 512 : D >= 256 ? 256 : 128; }

/* out[base + c] = x[base + c] / sqrt(mean(x²) + eps) * w[c] over the block, c < D (one rounding to ot). */
__device__ __forceinline__ void rms_row(const void *x, int xt, size_t base, int64_t D, const void *w, int wt, float eps,
                                        void *out, int ot, float *sh) {
    float acc = 0.f;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
        float v = cu_ld(x, xt, base + c);
        acc += v * v;
    }
    float ms = block_sum(acc, sh) / (float)D;
    float inv = 1.f / sqrtf(ms + eps);
    __syncthreads();
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x)
        cu_st(out, ot, base + c, cu_ld(x, xt, base + c) * inv * cu_ld(w, wt, c));
}

/* mode 0: rmsnorm; 1: resid += delta then rmsnorm(resid); 2: layernorm (with bias). */
__global__ void k_norm(int mode, void *x, int xt, const void *delta, int dt, const void *w, int wt, const void *bias,
                       int bt, float eps, void *out, int ot, int64_t D) {
    cu_pdl_wait();
    cu_pdl_trigger();
    __shared__ float sh[32];
    size_t base = (size_t)blockIdx.x * D;
    if (mode == 1 && delta) {
        for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
            cu_st(x, xt, base + c, cu_ld(x, xt, base + c) + cu_ld(delta, dt, base + c));
        }
        __syncthreads();
    }
    if (mode == 2) {
        float mean, inv;
        ln_stats(x, xt, base, D, eps, sh, &mean, &inv);
        __syncthreads();
        for (int64_t c = threadIdx.x; c < D; c += blockDim.x)
            cu_st(out, ot, base + c, ln_value(cu_ld(x, xt, base + c), mean, inv, w, wt, bias, bt, c));
        return;
    }
    rms_row(x, xt, base, D, w, wt, eps, out, ot, sh);
}

/* The forward's common case in one pass: a float32 residual row (plus a float32 delta, written
 * back) normalised into bf16 with bf16 weights. Each thread keeps up to RN_V float4 of the row in
 * registers, so the row is read once; the result equals k_norm's up to the order of the fp32 sum. */
#define RN_V 4
/* TRIG (MS_CU_NORM_EARLY): trigger before the wait, so that the projection after the norm launches while the
 * kernel before the norm (the MoE) still drains and starts its early weight copies on the SMs that kernel
 * frees. Safe as k_attn_combine<1>'s: the norm is launched only once every block before it has started. */
template <int ADD, int TRIG>
__global__ __launch_bounds__(1024) void k_rmsnorm_f32(float *x, const float *delta, const bf16 *w, float eps, bf16 *out,
                                                      int D, int early) {
    const int n4 = D / 4;
    /* early: w is not written by device work in flight (cu_impl.weights_quiet): its loads go out before
     * the wait (cuda_internal.cuh's exception), off the kernel's dependent chain */
    uint2 wr[RN_V];
    if (early) {
#pragma unroll
        for (int i = 0; i < RN_V; i++) {
            const int c = threadIdx.x + i * blockDim.x;
            if (c < n4) wr[i] = ((const uint2 *)w)[c];
        }
    }
    if (TRIG) cu_pdl_trigger();
    cu_pdl_wait();
    if (!TRIG) cu_pdl_trigger();
    __shared__ float sh[32];
    const size_t base = (size_t)blockIdx.x * D;
    float4 v[RN_V];
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < RN_V; i++) {
        const int c = threadIdx.x + i * blockDim.x;
        if (c < n4) {
            float4 a = ((const float4 *)(x + base))[c];
            if (ADD) {
                const float4 d = ((const float4 *)(delta + base))[c];
                a.x += d.x, a.y += d.y, a.z += d.z, a.w += d.w;
                ((float4 *)(x + base))[c] = a;
            }
            v[i] = a;
            acc += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
        }
    }
    const float inv = 1.f / sqrtf(block_sum(acc, sh) / (float)D + eps);
#pragma unroll
    for (int i = 0; i < RN_V; i++) {
        const int c = threadIdx.x + i * blockDim.x;
        if (c < n4) {
            const uint2 wv = early ? wr[i] : ((const uint2 *)w)[c];
            const float w0 = __uint_as_float(wv.x << 16), w1 = __uint_as_float(wv.x & 0xffff0000u),
                        w2 = __uint_as_float(wv.y << 16), w3 = __uint_as_float(wv.y & 0xffff0000u);
            __nv_bfloat162 o0 = __floats2bfloat162_rn(v[i].x * inv * w0, v[i].y * inv * w1);
            __nv_bfloat162 o1 = __floats2bfloat162_rn(v[i].z * inv * w2, v[i].w * inv * w3);
            uint2 ov;
            ov.x = *(uint32_t *)&o0;
            ov.y = *(uint32_t *)&o1;
            ((uint2 *)(out + base))[c] = ov;
        }
    }
}

static int launch_norm(ms_backend *b, int mode, ms_tensor *x, const ms_tensor *delta, const ms_tensor *w,
                       const ms_tensor *bias, float eps, ms_tensor *out, ms_err *err) {
    int64_t D = last_dim(x);
    MS_ASSERT(D > 0 && ms_tensor_numel(w) == D);
    int64_t R = ms_tensor_numel(x) / D;
    MS_ASSERT(ms_tensor_numel(out) == R * D);
    if (delta) MS_ASSERT(ms_tensor_numel(delta) == R * D);
    if (R == 0) return MS_OK;
    if (R > 0x7fffffff) return ms_errf(err, MS_ERR_INVALID, "norm: too many rows (%lld)", (long long)R);
    if (mode != 2 && x->dtype == MS_F32 && (!delta || delta->dtype == MS_F32) && w->dtype == MS_BF16 &&
        out->dtype == MS_BF16 && D % 4 == 0 && D <= 1024 * 4 * RN_V && !((uintptr_t)x->data & 15) &&
        !(delta && ((uintptr_t)delta->data & 15)) && !((uintptr_t)w->data & 7) && !((uintptr_t)out->data & 7)) {
        int th = (int)((D / 4 + RN_V - 1) / RN_V);
        th = th < 64 ? 64 : (th + 31) & ~31;
        const int trig = mode == 1 && delta && cu_knob(CU_KNOB_NORM_EARLY);
        if (mode == 1 && delta) {
            CK(cu_launch(trig ? k_rmsnorm_f32<1, 1> : k_rmsnorm_f32<1, 0>, (unsigned)R, th, 0, stream_of(b),
                         (float *)x->data, (const float *)delta->data, (const bf16 *)w->data, eps, (bf16 *)out->data,
                         (int)D, cu_of(b)->weights_quiet));
            cu_prev_early = trig;
        } else
            CK(cu_launch(k_rmsnorm_f32<0, 0>, (unsigned)R, th, 0, stream_of(b), (float *)x->data, (const float *)NULL,
                         (const bf16 *)w->data, eps, (bf16 *)out->data, (int)D, cu_of(b)->weights_quiet));
        return MS_OK;
    }
    int th = ln_threads(D);
    CK(cu_launch(k_norm, (unsigned)R, th, 0, stream_of(b), mode, x->data, x->dtype, delta ? delta->data : NULL,
                 delta ? delta->dtype : 0, w->data, w->dtype,
                 bias && bias->data ? bias->data : NULL, bias ? bias->dtype : 0, eps,
                 out->data, out->dtype, D));
    return MS_OK;
}

int cu_op_rmsnorm(ms_backend *b, const ms_tensor *x, const ms_tensor *w, float eps, ms_tensor *out, ms_err *err) {
    return launch_norm(b, 0, (ms_tensor *)x, NULL, w, NULL, eps, out, err);
}

int cu_op_add_rmsnorm(ms_backend *b, ms_tensor *resid, const ms_tensor *delta, const ms_tensor *w, float eps,
                      ms_tensor *out, ms_err *err) {
    return launch_norm(b, 1, resid, delta, w, NULL, eps, out, err);
}

int cu_op_layernorm(ms_backend *b, const ms_tensor *x, const ms_tensor *w, const ms_tensor *bias, float eps,
                    ms_tensor *out, ms_err *err) {
    return launch_norm(b, 2, (ms_tensor *)x, NULL, w, bias, eps, out, err);
}

/* ---- add, silu_mul, copies ---- */

__global__ void k_add(void *y, int yt, const void *x, int xt, size_t n) {
    cu_pdl_wait();
    cu_pdl_trigger();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        cu_st(y, yt, i, cu_ld(y, yt, i) + cu_ld(x, xt, i));
}

int cu_op_add(ms_backend *b, ms_tensor *y, const ms_tensor *x, ms_err *err) {
    size_t n = (size_t)ms_tensor_numel(y);
    MS_ASSERT((int64_t)n == ms_tensor_numel(x));
    if (!n) return MS_OK;
    CK(cu_launch(k_add, grid_for(n), 256, 0, stream_of(b), y->data, y->dtype, x->data, x->dtype, n));
    return MS_OK;
}

__global__ void k_silu_mul(const void *g, int gt, const void *u, int ut, void *o, int ot, size_t n) {
    cu_pdl_wait();
    cu_pdl_trigger();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        cu_st(o, ot, i, cu_silu(cu_ld(g, gt, i)) * cu_ld(u, ut, i));
}

int cu_op_silu_mul(ms_backend *b, const ms_tensor *g, const ms_tensor *u, ms_tensor *out, ms_err *err) {
    size_t n = (size_t)ms_tensor_numel(g);
    MS_ASSERT((int64_t)n == ms_tensor_numel(u) && (int64_t)n == ms_tensor_numel(out));
    if (!n) return MS_OK;
    CK(cu_launch(k_silu_mul, grid_for(n), 256, 0, stream_of(b), g->data, g->dtype, u->data, u->dtype, out->data, out->dtype, n));
    return MS_OK;
}

/* dst[r, c] = src[map(r), c0 + c] for c < nc; map = idx ? idx[r] : r. */
__global__ void k_copy_rows(const void *src, int st, int64_t sC, int64_t c0, const int32_t *idx, void *dst, int dt,
                            int64_t nc) {
    cu_pdl_wait();
    cu_pdl_trigger();
    int64_t r = blockIdx.x;
    int64_t sr = idx ? idx[r] : r;
    for (int64_t c = threadIdx.x; c < nc; c += blockDim.x)
        cu_st(dst, dt, (size_t)r * nc + c, cu_ld(src, st, (size_t)sr * sC + c0 + c));
}

int cu_op_copy_cols(ms_backend *b, const ms_tensor *src, int c0, int nc, ms_tensor *dst, ms_err *err) {
    int64_t C = last_dim(src);
    int64_t T = C ? ms_tensor_numel(src) / C : 0;
    MS_ASSERT(c0 >= 0 && nc >= 0 && c0 + nc <= C && ms_tensor_numel(dst) == T * nc);
    if (T == 0 || nc == 0) return MS_OK;
    CK(cu_launch(k_copy_rows, (unsigned)T, 256, 0, stream_of(b), src->data, src->dtype, C, c0, (const int32_t *)NULL,
                 dst->data, dst->dtype, nc));
    return MS_OK;
}

int cu_op_gather_rows(ms_backend *b, const ms_tensor *src, const int32_t *idx_d, int n, ms_tensor *dst, ms_err *err) {
    MS_ASSERT(src->ndim >= 1 && src->shape[0] > 0);
    int64_t W = ms_tensor_numel(src) / src->shape[0];
    MS_ASSERT(ms_tensor_numel(dst) >= (int64_t)n * W);
    if (n <= 0 || W == 0) return MS_OK;
    CK(cu_launch(k_copy_rows, n, 256, 0, stream_of(b), src->data, src->dtype, W, 0, idx_d, dst->data, dst->dtype, W));
    return MS_OK;
}

__global__ void k_set_cols(const void *src, int st, int64_t nc, void *dst, int dt, int64_t C, int64_t c0) {
    cu_pdl_wait();
    cu_pdl_trigger();
    int64_t r = blockIdx.x;
    for (int64_t c = threadIdx.x; c < nc; c += blockDim.x)
        cu_st(dst, dt, (size_t)r * C + c0 + c, cu_ld(src, st, (size_t)r * nc + c));
}

int cu_op_set_cols(ms_backend *b, const ms_tensor *src, int c0, ms_tensor *dst, ms_err *err) {
    int64_t nc = last_dim(src), C = last_dim(dst);
    int64_t T = nc ? ms_tensor_numel(src) / nc : 0;
    MS_ASSERT(c0 >= 0 && c0 + nc <= C && ms_tensor_numel(dst) == T * C);
    if (T == 0 || nc == 0) return MS_OK;
    CK(cu_launch(k_set_cols, (unsigned)T, 256, 0, stream_of(b), src->data, src->dtype, nc, dst->data, dst->dtype, C, c0));
    return MS_OK;
}

__global__ void k_scale(void *x, int xt, float alpha, size_t n) {
    cu_pdl_wait();
    cu_pdl_trigger();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        cu_st(x, xt, i, cu_ld(x, xt, i) * alpha);
}

int cu_op_scale(ms_backend *b, ms_tensor *x, float alpha, ms_err *err) {
    size_t n = (size_t)ms_tensor_numel(x);
    if (!n) return MS_OK;
    CK(cu_launch(k_scale, grid_for(n), 256, 0, stream_of(b), x->data, x->dtype, alpha, n));
    return MS_OK;
}

/* ---- RoPE ---- */

__global__ void k_rope(void *x, int xt, int nh, int d, const int32_t *pos, const float *inv_freq, int rot_off,
                       int rot_dim, int interleaved) {
    cu_pdl_wait();
    cu_pdl_trigger();
    int t = blockIdx.x;
    int half = rot_dim / 2;
    float p = (float)pos[t];
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < nh * half; i += gridDim.y * blockDim.x) {
        int h = i / half, j = i % half;
        size_t base = ((size_t)t * nh + h) * d + rot_off;
        size_t i0 = base + (interleaved ? 2 * j : j), i1 = base + (interleaved ? 2 * j + 1 : j + half);
        float o0, o1;
        rope_pair(cu_ld(x, xt, i0), cu_ld(x, xt, i1), p, inv_freq[j], &o0, &o1);
        cu_st(x, xt, i0, o0);
        cu_st(x, xt, i1, o1);
    }
}

/* Contract in cuda_internal.cuh. */
int cu_rope_table(ms_backend *b, const ms_rope_cfg *rc, const float **out, ms_err *err) {
    cu_impl *c = cu_of(b);
    for (int i = 0; i < c->n_rope; i++)
        if (c->rope[i].theta == rc->theta && c->rope[i].rot_dim == rc->rot_dim) {
            *out = c->rope[i].inv_freq_d;
            return MS_OK;
        }
    int half = rc->rot_dim / 2;
    float *h = (float *)malloc(sizeof(float) * (size_t)half);
    if (!h) return ms_errf(err, MS_ERR_NOMEM, "rope: out of host memory");
    /* as transformers: inv_freq = 1 / theta ** (arange(0, dim, 2).float() / dim), all float32 */
    for (int i = 0; i < half; i++) h[i] = 1.0f / powf((float)rc->theta, (float)(2 * i) / (float)rc->rot_dim);
    float *d = NULL;
    cudaStreamCaptureStatus cst = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(c->stream, &cst);
    if (e == cudaSuccess && cst != cudaStreamCaptureStatusNone) {
        free(h);
        return ms_errf(err, MS_ERR_RUNTIME, "rope table (theta %g, %d rotary dims): first needed while the stream is "
                       "captured into a graph (the shape must run eagerly first)", rc->theta, rc->rot_dim);
    }
    if (e == cudaSuccess) e = cudaMalloc(&d, sizeof(float) * (size_t)half);
    /* on the backend's stream and waited for: a blocking cudaMemcpy from pageable memory may return
     * before its DMA lands, and on the legacy stream nothing would order it before the kernels of the
     * (non-blocking) backend stream that read the table */
    if (e == cudaSuccess) e = cudaMemcpyAsync(d, h, sizeof(float) * (size_t)half, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    free(h);
    if (e != cudaSuccess) {
        if (d) cudaFree(d);
        return ms_errf(err, MS_ERR_RUNTIME, "rope table upload failed at %s:%d: %s", __FILE__, __LINE__,
                       cudaGetErrorString(e));
    }
    if (c->n_rope == 8) { /* evict the oldest (recorded graphs may hold its address: new epoch) */
        c->epoch++;
        cudaStreamSynchronize(c->stream);
        cudaFree(c->rope[0].inv_freq_d);
        memmove(&c->rope[0], &c->rope[1], sizeof(c->rope[0]) * 7);
        c->n_rope = 7;
    }
    c->rope[c->n_rope].theta = rc->theta;
    c->rope[c->n_rope].rot_dim = rc->rot_dim;
    c->rope[c->n_rope].inv_freq_d = d;
    c->n_rope++;
    *out = d;
    return MS_OK;
}

int cu_op_rope(ms_backend *b, ms_tensor *x, const int32_t *pos_d, const ms_rope_cfg *rc, ms_err *err) {
    MS_ASSERT(x->ndim == 3);
    int T = (int)x->shape[0], nh = (int)x->shape[1], d = (int)x->shape[2];
    MS_ASSERT(rc->rot_dim % 2 == 0 && rc->rot_off >= 0 && rc->rot_off + rc->rot_dim <= d);
    if (T == 0 || rc->rot_dim == 0) return MS_OK;
    const float *inv = NULL;
    MS_TRY(cu_rope_table(b, rc, &inv, err));
    /* a token's rotations over several blocks: one block per token left a one-token step's 64 MLA
     * heads (2048 rotations, an accurate sincosf each) on one SM for 6.5 us */
    const int per_tok = (int)((nh * (int64_t)(rc->rot_dim / 2) + 255) / 256);
    const dim3 grid((unsigned)T, (unsigned)(per_tok < 16 ? per_tok : 16));
    CK(cu_launch(k_rope, grid, 256, 0, stream_of(b), x->data, x->dtype, nh, d, pos_d, inv, rc->rot_off, rc->rot_dim,
                 rc->interleaved));
    return MS_OK;
}

/* ---- the absorbed MLA query's rope part ---- */

/* Per (token, head) the dr rope columns of q copied into out, the rc pairs among them rotated on the
 * way exactly as k_rope rotates them in q (rope_pair, the same float32 angle): one unit per rotary
 * pair or pass-through column. Why: the rope launch on q before this copy, which moved the same bytes. */
__global__ void k_copy_rope(const bf16 *q, bf16 *out, int T, int nh, int dn, int dr, int kvl, const int32_t *pos,
                            const float *inv, int rot_off, int rot_dim, int interleaved) {
    cu_pdl_wait();
    cu_pdl_trigger();
    const int half = rot_dim / 2, per = dr - half;
    const size_t tot = (size_t)T * nh * per;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < tot; i += (size_t)gridDim.x * blockDim.x) {
        const size_t th = i / per;
        const int j = (int)(i % per);
        const bf16 *src = q + th * (dn + dr) + dn;
        bf16 *dst = out + th * (kvl + dr) + kvl;
        cu_rope_part_unit(src, dst, j, pos, (int)(th / nh), inv, rot_off, rot_dim, interleaved);
    }
}

int cu_copy_rope_part(ms_backend *b, const bf16 *q, bf16 *out, int T, int nh, int dn, int dr, int kvl,
                      const int32_t *pos_d, const ms_rope_cfg *rc, ms_err *err) {
    const int rot_dim = rc ? rc->rot_dim : 0, rot_off = rc ? rc->rot_off - dn : 0;
    if (rot_dim < 0 || rot_dim % 2 || rot_off < 0 || rot_off + rot_dim > dr)
        return ms_errf(err, MS_ERR_INVALID, "mla_absorb_q: rotary columns %d..%d lie outside the rope part %d..%d of q",
                       rot_off + dn, rot_off + dn + rot_dim, dn, dn + dr);
    const size_t tot = (size_t)T * nh * (dr - rot_dim / 2);
    if (!tot) return MS_OK;
    const float *inv = NULL;
    if (rot_dim) MS_TRY(cu_rope_table(b, rc, &inv, err));
    CK(cu_launch(k_copy_rope, grid_for(tot), 256, 0, stream_of(b), q, out, T, nh, dn, dr, kvl, pos_d, inv, rot_off,
                 rot_dim, rc ? rc->interleaved : 0));
    return MS_OK;
}

/* ---- fused GQA preparation ---- */

/* Block (t, c) takes heads GP_HPB*c .. +GP_HPB of token t from the list q heads (nh), k heads (nkv),
 * v heads (nkv): for q and k it adds the bias and rotates the rotary pairs exactly as k_rope (float32
 * angle p * inv_freq[j], cos/sin computed once per block into shared memory) and writes the head back
 * in place (q) or into its cache row (k); a v head plus its bias goes to its cache row. The bias is
 * added in float32 before the rotation, with one rounding to bf16 where the unfused ops round after
 * each step. Several blocks per token: at decode one token's ~100 heads in one block left the GPU
 * idle for longer than the seven kernels it replaces. */
#define GP_HPB 8
/* Row t of q / k / v is read at qi / ki / vi + t * ldq / ldk / ldv (each tensor's own width for
 * separate buffers, the stacked width for one q|k|v projection output); q is written to qo [T][nh][d]. */
struct gp_io {
    bf16 *qo;
    const bf16 *qi, *ki, *vi;
    int64_t ldq, ldk, ldv;
};
__global__ void k_gqa_prep(gp_io io, const float *bq, const float *bk, const float *bv,
                           int nh, int nkv, int d, const int32_t *pos, const float *inv, int rot_off, int rot_dim,
                           int interleaved, bf16 *kc, bf16 *vc, int64_t S, const int32_t *slot) {
    cu_pdl_wait();
    cu_pdl_trigger();
    extern __shared__ float gp_cs[]; /* [half] cos, then [half] sin */
    const int t = blockIdx.x, h0 = blockIdx.y * GP_HPB;
    const int half = rot_dim / 2, per = half + (d - rot_dim);
    const float p = (float)pos[t];
    for (int j = threadIdx.x; j < half; j += blockDim.x) sincosf(p * inv[j], &gp_cs[half + j], &gp_cs[j]);
    __syncthreads();
    const int64_t s = slot[t];
    const bool st = s >= 0 && s < S;
    const int nheads = min(GP_HPB, nh + 2 * nkv - h0);
    /* rotated heads (q, k): one unit per rotary pair or pass-through dim */
    const int nrot = max(0, min(nheads, nh + nkv - h0));
    for (int u = threadIdx.x; u < nrot * per; u += blockDim.x) {
        const int hh = h0 + u / per, j = u % per;
        const bool isk = hh >= nh;
        const int h = isk ? hh - nh : hh;
        const bf16 *row = isk ? io.ki + (size_t)t * io.ldk + (size_t)h * d : io.qi + (size_t)t * io.ldq + (size_t)h * d;
        const float *bias = isk ? (bk ? bk + (size_t)h * d : NULL) : (bq ? bq + (size_t)h * d : NULL);
        bf16 *dst = isk ? (st ? kc + ((size_t)s * nkv + h) * d : NULL) : io.qo + ((size_t)t * nh + h) * d;
        if (dst) cu_gqa_prep_unit(row, bias, gp_cs, j, rot_off, rot_dim, interleaved, dst, NULL);
    }
    /* v heads of this block: plus bias into the cache */
    const int v0 = max(h0, nh + nkv) - (nh + nkv), v1 = h0 + nheads - (nh + nkv);
    if (st && v1 > v0)
        for (int c = v0 * d + threadIdx.x; c < v1 * d; c += blockDim.x)
            vc[(size_t)s * nkv * d + c] = __float2bfloat16_rn(__bfloat162float(io.vi[(size_t)t * io.ldv + c]) + (bv ? bv[c] : 0.f));
}

int cu_op_gqa_prep(ms_backend *b, ms_tensor *q, const ms_tensor *k, const ms_tensor *v, const ms_tensor *bq,
                   const ms_tensor *bk, const ms_tensor *bv, const int32_t *pos_d, const ms_rope_cfg *rc,
                   ms_tensor *kcache, ms_tensor *vcache, const int32_t *slot_d, const ms_tensor *qkv, ms_err *err) {
    MS_ASSERT(q->ndim == 3 && k->ndim == 3 && v->ndim == 3 && kcache->ndim == 3 && vcache->ndim == 3);
    const int T = (int)q->shape[0], nh = (int)q->shape[1], d = (int)q->shape[2], nkv = (int)k->shape[1];
    MS_ASSERT(k->shape[0] == T && v->shape[0] == T && k->shape[2] == d && v->shape[1] == nkv && v->shape[2] == d);
    MS_ASSERT(kcache->shape[1] == nkv && kcache->shape[2] == d && vcache->shape[0] == kcache->shape[0]);
    if (q->dtype != MS_BF16 || k->dtype != MS_BF16 || v->dtype != MS_BF16 || kcache->dtype != MS_BF16 ||
        vcache->dtype != MS_BF16 || (qkv && qkv->dtype != MS_BF16))
        return ms_errf(err, MS_ERR_UNSUPPORTED, "gqa_prep: the CUDA backend needs bf16 q/k/v and caches");
    const int rot_dim = rc ? rc->rot_dim : 0, rot_off = rc ? rc->rot_off : 0;
    MS_ASSERT(rot_dim % 2 == 0 && rot_off >= 0 && rot_off + rot_dim <= d);
    gp_io io;
    io.qo = (bf16 *)q->data;
    if (qkv) {
        io.ldq = io.ldk = io.ldv = (int64_t)(nh + 2 * nkv) * d;
        MS_ASSERT(qkv->ndim == 2 && qkv->shape[0] == T && qkv->shape[1] == io.ldq);
        io.qi = (const bf16 *)qkv->data;
        io.ki = io.qi + (size_t)nh * d;
        io.vi = io.ki + (size_t)nkv * d;
    } else {
        io.ldq = (int64_t)nh * d;
        io.ldk = io.ldv = (int64_t)nkv * d;
        io.qi = (const bf16 *)q->data;
        io.ki = (const bf16 *)k->data;
        io.vi = (const bf16 *)v->data;
    }
    int bias_ok = 1;
    const float *fbq = cu_f32_opt(bq, (int64_t)nh * d, &bias_ok), *fbk = cu_f32_opt(bk, (int64_t)nkv * d, &bias_ok),
                *fbv = cu_f32_opt(bv, (int64_t)nkv * d, &bias_ok);
    if (!bias_ok)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "gqa_prep: the q/k/v biases must be F32 of %d / %d / %d elements", nh * d,
                       nkv * d, nkv * d);
    if (T == 0) return MS_OK;
    const float *inv = NULL;
    if (rot_dim) MS_TRY(cu_rope_table(b, rc, &inv, err));
    dim3 grid((unsigned)T, (unsigned)((nh + 2 * nkv + GP_HPB - 1) / GP_HPB));
    CK(cu_launch(k_gqa_prep, grid, 256, sizeof(float) * (size_t)rot_dim, stream_of(b), io,
                 fbq, fbk, fbv, nh, nkv, d, pos_d, inv, rot_off, rot_dim,
                 rc ? rc->interleaved : 0, (bf16 *)kcache->data, (bf16 *)vcache->data,
                 kcache->shape[0], slot_d));
    return MS_OK;
}

/* ---- fused MLA latent preparation ---- */

/* One block per token: the first kvl columns of the kv_a row RMS-normalised (fp32, one bf16 rounding,
 * as k_norm), the last dr rotated as k_rope (fp32 angle p * inv_freq[j]), both written back into the
 * row and into the token's latent-cache row. Why: five launches (copy out, norm, copy back, RoPE,
 * store) per MLA layer that together move ~1 KB per token. */
__device__ __forceinline__ void mla_kv_row(int t, bf16 *kva, int kvl, int dr, const void *w, int wt, float eps,
                                           const int32_t *pos, const float *inv, int interleaved, bf16 *cache, int64_t S,
                                           const int32_t *slot, float *sh) {
    const int W = kvl + dr;
    bf16 *row = kva + (size_t)t * W;
    float acc = 0.f;
    for (int c = threadIdx.x; c < kvl; c += blockDim.x) {
        const float v = __bfloat162float(row[c]);
        acc += v * v;
    }
    const float inv_rms = 1.f / sqrtf(block_sum(acc, sh) / (float)kvl + eps);
    const int64_t s = slot[t];
    bf16 *dst = s >= 0 && s < S ? cache + (size_t)s * W : NULL;
    const float p = (float)pos[t];
    const int half = dr / 2;
    /* the rope pairs read before anyone writes (a thread writes only the columns it read) */
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        const int i0 = kvl + (interleaved ? 2 * j : j), i1 = kvl + (interleaved ? 2 * j + 1 : j + half);
        const float a = __bfloat162float(row[i0]), c = __bfloat162float(row[i1]);
        float sn, cs;
        sincosf(p * inv[j], &sn, &cs);
        const bf16 o0 = __float2bfloat16_rn(a * cs - c * sn), o1 = __float2bfloat16_rn(c * cs + a * sn);
        row[i0] = o0;
        row[i1] = o1;
        if (dst) dst[i0] = o0, dst[i1] = o1;
    }
    for (int c = threadIdx.x; c < kvl; c += blockDim.x) {
        const bf16 o = __float2bfloat16_rn(__bfloat162float(row[c]) * inv_rms * cu_ld(w, wt, c));
        row[c] = o;
        if (dst) dst[c] = o;
    }
}
__global__ void k_mla_kv_prep(bf16 *kva, int kvl, int dr, const void *w, int wt, float eps, const int32_t *pos,
                              const float *inv, int interleaved, bf16 *cache, int64_t S, const int32_t *slot) {
    cu_pdl_wait();
    cu_pdl_trigger();
    __shared__ float sh[32];
    mla_kv_row(blockIdx.x, kva, kvl, dr, w, wt, eps, pos, inv, interleaved, cache, S, slot, sh);
}

/* mla_kv_prep's shape rules: MS_OK, or MS_ERR_UNSUPPORTED with the reason. */
static int kv_prep_check(const ms_tensor *kva, int kvl, const ms_tensor *w, const ms_rope_cfg *rc, const ms_tensor *cache,
                         ms_err *err) {
    const int64_t W = last_dim(kva), dr = W - kvl;
    if (kva->dtype != MS_BF16 || cache->dtype != MS_BF16 || last_dim(cache) != W || dr < 0 || dr % 2 ||
        ms_tensor_numel(w) != kvl || !rc || rc->rot_off != kvl || rc->rot_dim != dr)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "mla_kv_prep: needs bf16 rows of kv_lora_rank + rope dims with RoPE on the last ones");
    return MS_OK;
}

int cu_op_mla_kv_prep(ms_backend *b, ms_tensor *kva, int kvl, const ms_tensor *w, float eps, const int32_t *pos_d,
                      const ms_rope_cfg *rc, ms_tensor *cache, const int32_t *slot_d, ms_err *err) {
    MS_TRY(kv_prep_check(kva, kvl, w, rc, cache, err));
    const int64_t W = last_dim(kva), T = W ? ms_tensor_numel(kva) / W : 0;
    const int dr = (int)(W - kvl);
    if (T == 0) return MS_OK;
    const float *inv = NULL;
    if (dr) MS_TRY(cu_rope_table(b, rc, &inv, err));
    const int64_t S = ms_tensor_numel(cache) / W;
    CK(cu_launch(k_mla_kv_prep, (unsigned)T, 256, 0, stream_of(b), (bf16 *)kva->data, kvl, dr, w->data, w->dtype, eps, pos_d, inv,
                 rc->interleaved, (bf16 *)cache->data, S, slot_d));
    return MS_OK;
}

/* ---- fused indexer-key preparation ---- */

/* One block per token, of layernorm's block size: the row layer-normalised exactly as k_norm (same
 * ln_stats sum order, rounded once into x), then the rotary pairs rotated from those rounded values
 * exactly as k_rope, each column stored into the token's cache row as k_kv_store would (re-read from x,
 * converted to the cache dtype). Why: three launches per indexer layer that move ~256 bytes a token. */
__device__ __forceinline__ void idx_k_row(int t, void *x, int xt, int64_t D, const void *w, int wt, const void *bias,
                                          int bt, float eps, const int32_t *pos, const float *inv, int rot_off,
                                          int rot_dim, int interleaved, void *cache, int ct, int64_t S,
                                          const int32_t *slot, float *sh) {
    const size_t base = (size_t)t * D;
    float mean, rs;
    ln_stats(x, xt, base, D, eps, sh, &mean, &rs);
    __syncthreads();
    const int64_t s = slot[t];
    const bool st = s >= 0 && s < S;
    const size_t cb = st ? (size_t)s * D : 0;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
        cu_st(x, xt, base + c, ln_value(cu_ld(x, xt, base + c), mean, rs, w, wt, bias, bt, c));
        if (st && (c < rot_off || c >= rot_off + rot_dim)) cu_st(cache, ct, cb + c, cu_ld(x, xt, base + c));
    }
    __syncthreads(); /* the normalised row, written by the whole block, is what the rotation reads */
    const int half = rot_dim / 2;
    const float p = (float)pos[t];
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        const int64_t c0 = rot_off + (interleaved ? 2 * j : j), c1 = rot_off + (interleaved ? 2 * j + 1 : j + half);
        float o0, o1;
        rope_pair(cu_ld(x, xt, base + c0), cu_ld(x, xt, base + c1), p, inv[j], &o0, &o1);
        cu_st(x, xt, base + c0, o0);
        cu_st(x, xt, base + c1, o1);
        if (st) {
            cu_st(cache, ct, cb + c0, cu_ld(x, xt, base + c0));
            cu_st(cache, ct, cb + c1, cu_ld(x, xt, base + c1));
        }
    }
}
__global__ void k_idx_k_prep(void *x, int xt, int64_t D, const void *w, int wt, const void *bias, int bt, float eps,
                             const int32_t *pos, const float *inv, int rot_off, int rot_dim, int interleaved,
                             void *cache, int ct, int64_t S, const int32_t *slot) {
    cu_pdl_wait();
    cu_pdl_trigger();
    __shared__ float sh[32];
    idx_k_row(blockIdx.x, x, xt, D, w, wt, bias, bt, eps, pos, inv, rot_off, rot_dim, interleaved, cache, ct, S, slot, sh);
}

static int float_dtype(const ms_tensor *t) { return t->dtype == MS_F32 || t->dtype == MS_BF16 || t->dtype == MS_F16; }

/* idx_k_prep's shape rules: MS_OK, or MS_ERR_UNSUPPORTED with the reason. */
static int idx_prep_check(const ms_tensor *x, const ms_tensor *w, const ms_tensor *bias, const ms_rope_cfg *rc,
                          const ms_tensor *cache, ms_err *err) {
    const int64_t D = last_dim(x), T = D > 0 ? ms_tensor_numel(x) / D : 0, C = ms_tensor_numel(cache);
    const int with_bias = bias && bias->data;
    if (D < 1 || !rc || rc->rot_dim < 0 || rc->rot_dim % 2 || rc->rot_off < 0 || rc->rot_off + rc->rot_dim > D)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "idx_k_prep: the rotary dims must lie inside the %lld-wide key row",
                       (long long)D);
    if (!float_dtype(x) || !float_dtype(cache) || !float_dtype(w) || (with_bias && !float_dtype(bias)) ||
        ms_tensor_numel(w) != D || (with_bias && ms_tensor_numel(bias) != D) || C % D || T > 0x7fffffff)
        return ms_errf(err, MS_ERR_UNSUPPORTED,
                       "idx_k_prep: needs float keys, norm weight/bias and cache rows of the key width %lld", (long long)D);
    return MS_OK;
}

int cu_op_idx_k_prep(ms_backend *b, ms_tensor *x, const ms_tensor *w, const ms_tensor *bias, float eps,
                     const int32_t *pos_d, const ms_rope_cfg *rc, ms_tensor *cache, const int32_t *slot_d, ms_err *err) {
    MS_TRY(idx_prep_check(x, w, bias, rc, cache, err));
    const int64_t D = last_dim(x), T = ms_tensor_numel(x) / D, C = ms_tensor_numel(cache);
    const int with_bias = bias && bias->data;
    if (T == 0) return MS_OK;
    const float *inv = NULL;
    if (rc->rot_dim) MS_TRY(cu_rope_table(b, rc, &inv, err));
    CK(cu_launch(k_idx_k_prep, (unsigned)T, ln_threads(D), 0, stream_of(b), x->data, x->dtype, D, w->data, w->dtype,
                 with_bias ? bias->data : NULL, with_bias ? bias->dtype : 0, eps, pos_d, inv, rc->rot_off, rc->rot_dim,
                 rc->interleaved, cache->data, cache->dtype, C / D, slot_d));
    return MS_OK;
}

/* ---- the MLA layer's three one-row preparations in one launch ---- */

struct mp_args {
    void *cq;
    int cqt;
    int64_t ql;
    const void *qw;
    int qwt;
    float qeps;
    bf16 *kva;
    int kvl, dr;
    const void *kvw;
    int kvwt;
    float kveps;
    const float *kvinv;
    int kvil;
    bf16 *kvc;
    int64_t kvS;
    void *ki; /* NULL: no indexer key */
    int kit;
    int64_t kiD;
    const void *kiw, *kib;
    int kiwt, kibt;
    float kieps;
    const float *kiinv;
    int kirot_off, kirot_dim, kiil;
    void *kic;
    int kict;
    int64_t kiS;
    const int32_t *pos, *slot;
};

/* Block (t, part): part 0 the q_a norm of token t (rms_row), 1 its latent (mla_kv_row), 2 its indexer
 * key (idx_k_row): the three kernels' bodies, side by side in one grid. */
__global__ void k_mla_prep(mp_args a) {
    cu_pdl_wait();
    cu_pdl_trigger();
    __shared__ float sh[32];
    const int t = blockIdx.x;
    if (blockIdx.y == 0)
        rms_row(a.cq, a.cqt, (size_t)t * (size_t)a.ql, a.ql, a.qw, a.qwt, a.qeps, a.cq, a.cqt, sh);
    else if (blockIdx.y == 1)
        mla_kv_row(t, a.kva, a.kvl, a.dr, a.kvw, a.kvwt, a.kveps, a.pos, a.kvinv, a.kvil, a.kvc, a.kvS, a.slot, sh);
    else
        idx_k_row(t, a.ki, a.kit, a.kiD, a.kiw, a.kiwt, a.kib, a.kibt, a.kieps, a.pos, a.kiinv, a.kirot_off, a.kirot_dim,
                  a.kiil, a.kic, a.kict, a.kiS, a.slot, sh);
}

/* backend.h mla_prep. */
int cu_op_mla_prep(ms_backend *b, const ms_mla_prep *p, ms_err *err) {
    if (!cu_knob(CU_KNOB_MLA_PREP)) return ms_errf(err, MS_ERR_UNSUPPORTED, "mla_prep: off (MS_CU_MLA_PREP=0)");
    const int64_t ql = last_dim(p->cq), T = ql > 0 ? ms_tensor_numel(p->cq) / ql : 0;
    MS_TRY(kv_prep_check(p->kva, p->kvl, p->kv_norm, p->kv_rope, p->kv_cache, err));
    if (p->kI) MS_TRY(idx_prep_check(p->kI, p->kI_w, p->kI_b, p->kI_rope, p->kI_cache, err));
    const int64_t W = last_dim(p->kva), D = p->kI ? last_dim(p->kI) : 0;
    if (ql < 1 || W < 1 || !float_dtype(p->cq) || !float_dtype(p->q_norm) || ms_tensor_numel(p->q_norm) != ql ||
        ms_tensor_numel(p->kva) != T * W || (p->kI && ms_tensor_numel(p->kI) != T * D) || T > 0x7fffffff)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "mla_prep: the parts' rows differ (q_a %lld wide) or a norm does not fit",
                       (long long)ql);
    if (T == 0) return MS_OK;
    mp_args a = {};
    a.cq = p->cq->data, a.cqt = p->cq->dtype, a.ql = ql, a.qw = p->q_norm->data, a.qwt = p->q_norm->dtype, a.qeps = p->q_eps;
    a.kva = (bf16 *)p->kva->data, a.kvl = p->kvl, a.dr = (int)(W - p->kvl), a.kvw = p->kv_norm->data;
    a.kvwt = p->kv_norm->dtype, a.kveps = p->kv_eps, a.kvil = p->kv_rope->interleaved;
    a.kvc = (bf16 *)p->kv_cache->data, a.kvS = ms_tensor_numel(p->kv_cache) / W;
    if (a.dr) MS_TRY(cu_rope_table(b, p->kv_rope, &a.kvinv, err));
    if (p->kI) {
        const int with_bias = p->kI_b && p->kI_b->data;
        a.ki = p->kI->data, a.kit = p->kI->dtype, a.kiD = D, a.kiw = p->kI_w->data, a.kiwt = p->kI_w->dtype;
        a.kib = with_bias ? p->kI_b->data : NULL, a.kibt = with_bias ? p->kI_b->dtype : 0, a.kieps = p->kI_eps;
        a.kirot_off = p->kI_rope->rot_off, a.kirot_dim = p->kI_rope->rot_dim, a.kiil = p->kI_rope->interleaved;
        a.kic = p->kI_cache->data, a.kict = p->kI_cache->dtype, a.kiS = ms_tensor_numel(p->kI_cache) / D;
        if (a.kirot_dim) MS_TRY(cu_rope_table(b, p->kI_rope, &a.kiinv, err));
        /* the second table's lookup may have evicted the first from the backend's cache: look it up
         * again (it is then the newest, so the second stays) */
        if (a.dr) MS_TRY(cu_rope_table(b, p->kv_rope, &a.kvinv, err));
    }
    a.pos = p->pos_d, a.slot = p->slot_d;
    CK(cu_launch(k_mla_prep, dim3((unsigned)T, p->kI ? 3u : 2u), 256, 0, stream_of(b), a));
    return MS_OK;
}

/* ---- KV store ---- */

__global__ void k_kv_store(void *cache, int ct, int64_t S, const void *x, int xt, int64_t W, const int32_t *slot) {
    cu_pdl_wait();
    cu_pdl_trigger();
    int t = blockIdx.x;
    int64_t s = slot[t];
    if (s < 0 || s >= S) return;
    for (int64_t c = threadIdx.x; c < W; c += blockDim.x)
        cu_st(cache, ct, (size_t)s * W + c, cu_ld(x, xt, (size_t)t * W + c));
}

int cu_op_kv_store(ms_backend *b, ms_tensor *cache, const ms_tensor *x, const int32_t *slot_d, ms_err *err) {
    MS_ASSERT(cache->ndim >= 1);
    int64_t S = cache->shape[0];
    int64_t W = S ? ms_tensor_numel(cache) / S : 0;
    int64_t T = W ? ms_tensor_numel(x) / W : 0;
    MS_ASSERT(T * W == ms_tensor_numel(x));
    if (T == 0) return MS_OK;
    CK(cu_launch(k_kv_store, (unsigned)T, 256, 0, stream_of(b), cache->data, cache->dtype, S, x->data, x->dtype, W, slot_d));
    return MS_OK;
}

/* ---- checks ---- */

__global__ void k_nonfinite(const void *x, int xt, int64_t C, size_t n, unsigned long long *bad) {
    cu_pdl_wait();
    cu_pdl_trigger();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = cu_ld(x, xt, i);
        if (!isfinite(v)) atomicMin(bad, (unsigned long long)(i / C));
    }
}

/* Sets *flag = min(*flag, code) when x holds a NaN/Inf (the per-step check: no host wait). */
__global__ void k_nonfinite_flag(const void *x, int xt, size_t n, int32_t code, int32_t *flag) {
    cu_pdl_wait();
    cu_pdl_trigger();
    int bad = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        bad |= !isfinite(cu_ld(x, xt, i));
    if (__syncthreads_or(bad) && threadIdx.x == 0) atomicMin(flag, code);
}

/* Resets the step flag to "nothing seen" (a kernel, so graphs record it). */
__global__ void k_flag_reset(int32_t *flag) {
    cu_pdl_wait();
    cu_pdl_trigger();
    *flag = INT32_MAX;
}

int cu_op_nonfinite_flag(ms_backend *b, const ms_tensor *x, int32_t code, int32_t *flag_d, ms_err *err) {
    if (!x) {
        CK(cu_launch(k_flag_reset, 1, 1, 0, stream_of(b), flag_d));
        return MS_OK;
    }
    size_t n = (size_t)ms_tensor_numel(x);
    if (!n) return MS_OK;
    unsigned g = grid_for(n);
    if (g > 1024) g = 1024; /* a grid-stride pass: a few waves are enough for a memory-bound read */
    CK(cu_launch(k_nonfinite_flag, g, 256, 0, stream_of(b), x->data, x->dtype, n, code, flag_d));
    return MS_OK;
}

int cu_op_find_nonfinite(ms_backend *b, const ms_tensor *x, int64_t *bad_row, ms_err *err) {
    *bad_row = -1;
    int64_t C = last_dim(x);
    size_t n = (size_t)ms_tensor_numel(x);
    if (!n || !C) return MS_OK;
    void *buf;
    MS_TRY(cu_scratch(b, SCR_HOST, sizeof(unsigned long long), &buf, err));
    unsigned long long init = ~0ull, res = 0;
    CK(cudaMemcpyAsync(buf, &init, sizeof init, cudaMemcpyHostToDevice, stream_of(b)));
    CK(cu_launch(k_nonfinite, grid_for(n), 256, 0, stream_of(b), x->data, x->dtype, C, n, (unsigned long long *)buf));
    CK(cudaMemcpyAsync(&res, buf, sizeof res, cudaMemcpyDeviceToHost, stream_of(b)));
    CK(cudaStreamSynchronize(stream_of(b)));
    *bad_row = res == ~0ull ? -1 : (int64_t)res;
    return MS_OK;
}

/* One block a row: backend.h's greedy rule. Each thread keeps the first index of its largest value
 * (strictly greater only, from -inf: NaN and -inf never take an index, +inf counts as FLT_MAX); the
 * block then takes the largest value, the lowest index among equals; no index at all gives 0. */
__global__ void k_argmax(const float *x, int64_t V, int32_t *out) {
    cu_pdl_wait();
    cu_pdl_trigger();
    __shared__ float sv[32];
    __shared__ int32_t si[32];
    const float *row = x + (size_t)blockIdx.x * V;
    float bv = -INFINITY;
    int32_t bi = 0x7fffffff;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
        const float r = row[i], v = r > FLT_MAX ? FLT_MAX : r; /* NaN stays NaN: v > bv is false */
        if (v > bv) { bv = v; bi = (int32_t)i; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    if (l == 0) { sv[w] = bv; si[w] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < (int)blockDim.x / 32; i++)
            if (sv[i] > bv || (sv[i] == bv && si[i] < bi)) { bv = sv[i]; bi = si[i]; }
        out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
    }
}

int cu_op_argmax(ms_backend *b, const ms_tensor *logits, int32_t *out_d, ms_err *err) {
    MS_ASSERT(logits->dtype == MS_F32);
    int64_t V = last_dim(logits);
    int64_t R = V ? ms_tensor_numel(logits) / V : 0;
    if (R == 0) return MS_OK;
    CK(cu_launch(k_argmax, (unsigned)R, 1024, 0, stream_of(b), (const float *)logits->data, V, out_d)); /* a 150k row is ~600 KB: one SM, many loads in flight */
    return MS_OK;
}

/* ---- router (one warp per token) ---- */

/* Warp-wide argmax of v[0..n) (ties: lowest index); every lane of the calling warp takes part. */
__device__ int warp_argmax(const float *v, int n) {
    const int lane = threadIdx.x & 31;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = lane; i < n; i += 32)
        if (v[i] > bv || (bi == 0x7fffffff && !isnan(v[i]))) { bv = v[i]; bi = i; }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    return bi == 0x7fffffff ? 0 : bi;
}

/* noaux_tc routing of one token by one warp (spec 3.9): sigmoid scores of the router logits lg [E],
 * plus the correction bias for the choice, group-limited when n_group > 1, top-k, weights from the
 * unbiased scores (normalised when norm) times scale into ids [topk] / wout [topk]. sm: 2E + 2 n_group
 * floats of this warp's shared memory. lg is read through L2 (another block may have written it). */
__device__ void route_token(const float *lg, const void *bias, int bt, int E, int topk, int n_group, int topk_group,
                            int norm, float scale, int32_t *ids, float *wout, float *sm) {
    float *s = sm, *bsc = sm + E, *gs = sm + 2 * E;
    int *keep = (int *)(gs + n_group);
    const int lane = threadIdx.x & 31;
    for (int e = lane; e < E; e += 32) {
        float sv = 1.f / (1.f + expf(-__ldcg(lg + e)));
        s[e] = sv;
        bsc[e] = sv + (bias ? cu_ld(bias, bt, e) : 0.f);
    }
    __syncwarp();
    if (n_group > 1) {
        int gsz = E / n_group;
        for (int g = lane; g < n_group; g += 32) {
            float m1 = -INFINITY, m2 = -INFINITY;
            for (int i = 0; i < gsz; i++) {
                float v = bsc[g * gsz + i];
                if (v > m1) { m2 = m1; m1 = v; } else if (v > m2) m2 = v;
            }
            gs[g] = gsz > 1 ? m1 + m2 : m1;
            keep[g] = 0;
        }
        __syncwarp();
        for (int r = 0; r < topk_group; r++) {
            int gi = warp_argmax(gs, n_group);
            __syncwarp();
            if (lane == 0) { keep[gi] = 1; gs[gi] = -INFINITY; }
            __syncwarp();
        }
        for (int e = lane; e < E; e += 32)
            if (!keep[e / gsz]) bsc[e] = 0.f;
        __syncwarp();
    }
    float sum = 0.f;
    for (int k = 0; k < topk; k++) {
        int e = warp_argmax(bsc, E);
        __syncwarp();
        float wv = s[e];
        sum += wv;
        if (lane == 0) {
            ids[k] = e;
            wout[k] = wv;
            bsc[e] = -INFINITY;
        }
        __syncwarp();
    }
    __syncwarp();
    for (int k = lane; k < topk; k += 32) {
        float wv = wout[k];
        wout[k] = norm ? (wv / (sum + 1e-20f)) * scale : wv * scale;
    }
}

__global__ void k_route(const float *logits, const void *bias, int bt, int E, int topk, int n_group, int topk_group,
                        int norm, float scale, int32_t *ids, float *wout) {
    cu_pdl_wait();
    cu_pdl_trigger();
    extern __shared__ float rsm[];
    const int t = blockIdx.x;
    route_token(logits + (size_t)t * E, bias, bt, E, topk, n_group, topk_group, norm, scale, ids + (size_t)t * topk,
                wout + (size_t)t * topk, rsm);
}

int cu_route(ms_backend *b, const float *logits, const void *bias, int bias_t, const ms_route_cfg *rc, int T,
             int32_t *ids, float *w, ms_err *err) {
    size_t sm = sizeof(float) * (2 * (size_t)rc->n_experts + 2 * (size_t)rc->n_group);
    if (sm > 48 * 1024) { /* more than ~6000 experts: the opt-in shared memory (~28000 on sm_90) */
        cu_impl *c = cu_of(b);
        if (c->max_smem_optin <= 0 || sm > (size_t)c->max_smem_optin)
            return ms_errf(err, MS_ERR_UNSUPPORTED,
                           "router: n_routed_experts %d needs %zu bytes of shared memory, the GPU allows %d", rc->n_experts,
                           sm, c->max_smem_optin);
        CK(cudaFuncSetAttribute(k_route, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    }
    CK(cu_launch(k_route, T, 32, sm, stream_of(b), logits, bias, bias_t, rc->n_experts, rc->topk, rc->n_group, rc->topk_group,
                 rc->norm_topk_prob, rc->routed_scaling_factor, ids, w));
    return MS_OK;
}

/* ---- router GEMV + routing in one launch (decode) ---- */

#define RF_WARPS 8
#define RF_MAXT 8
#define RF_DEPTH 8

/* Blocks that finished their experts' logits in the current k_router_fused launch; the last block
 * routes and puts it back to 0, so launches (and graph replays) on one device never overlap in it:
 * they are ordered on the backend's stream. */
__device__ unsigned int g_rf_done;

/* Warp w of block b computes the fp32 logits of expert e = 8b + w for every token (a bf16 row of W
 * times each bf16 x row, fp32 accumulation) into lg [T][E]; the last block to finish routes the T
 * tokens, one warp each, as k_route. Why: at decode the router is a 1-6 MB GEMV plus a one-warp
 * kernel, two launches costing ~16 us per layer where the bytes take ~1 us. */
__global__ __launch_bounds__(RF_WARPS * 32) void k_router_fused(const bf16 *x, const bf16 *W, int T, int K, float *lg,
                                                                const void *bias, int bt, int E, int topk, int n_group,
                                                                int topk_group, int norm, float scale, int32_t *ids,
                                                                float *wout) {
    cu_pdl_wait();
    cu_pdl_trigger();
    extern __shared__ float rfsm[];
    __shared__ bool last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int e = blockIdx.x * RF_WARPS + warp;
    if (e < E) {
        float acc[RF_MAXT];
#pragma unroll
        for (int t = 0; t < RF_MAXT; t++) acc[t] = 0.f;
        const uint4 *wr = (const uint4 *)(W + (size_t)e * K);
        const int nc = K / 8;
        /* RF_DEPTH row chunks in flight per lane before any math: one warp per expert leaves few
         * warps per SM, so memory parallelism has to come from each lane */
        for (int c0 = 0; c0 < nc; c0 += 32 * RF_DEPTH) {
            uint4 wv[RF_DEPTH];
#pragma unroll
            for (int u = 0; u < RF_DEPTH; u++) {
                const int c = c0 + u * 32 + lane;
                wv[u] = c < nc ? __ldg(wr + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < RF_DEPTH; u++) {
                const int c = c0 + u * 32 + lane;
                if (c >= nc) break;
                const __nv_bfloat162 *w2 = (const __nv_bfloat162 *)&wv[u];
#pragma unroll
                for (int t = 0; t < RF_MAXT; t++) {
                    if (t >= T) break;
                    /* the previous kernel's x: __ldcg, never __ldg (cuda_internal.cuh, PDL) */
                    const uint4 xv = __ldcg((const uint4 *)(x + (size_t)t * K) + c);
                    const __nv_bfloat162 *x2 = (const __nv_bfloat162 *)&xv;
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float2 a = __bfloat1622float2(w2[i]), bb = __bfloat1622float2(x2[i]);
                        acc[t] = fmaf(a.x, bb.x, fmaf(a.y, bb.y, acc[t]));
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < RF_MAXT; t++) {
            if (t >= T) break;
            const float v = warp_sum(acc[t]);
            if (lane == 0) lg[(size_t)t * E + e] = v;
        }
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&g_rf_done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    float *sm = rfsm + (size_t)warp * (2 * E + 2 * n_group);
    for (int t = warp; t < T; t += RF_WARPS)
        route_token(lg + (size_t)t * E, bias, bt, E, topk, n_group, topk_group, norm, scale, ids + (size_t)t * topk,
                    wout + (size_t)t * topk, sm);
    if (threadIdx.x == 0) g_rf_done = 0;
}

/* ---- router GEMV split over K, then routing (decode; MS_CU_ROUTER=split, the default) ---- */

#define RS_WARPS 8        /* experts per block, one warp each */
#define RS_D 2            /* 16-byte weight chunks per lane: a block's K slice is 32 * RS_D * 8 = 512 k */
#define RS_KS (32 * RS_D * 8)
#define RS_PART_MAX 32768 /* fp32 partial logits (K slices x T x E) the scratch below holds */
static_assert(RS_WARPS * 32 >= CU_NORM_T, "k_router_split<1> folds a norm: cu_norm_stage needs CU_NORM_T threads");
static_assert(RS_WARPS == RF_WARPS, "cu_router_fused sizes the routing scratch for RF_WARPS warps");
static_assert(RF_MAXT * RS_KS / 8 <= 2 * RS_WARPS * 32, "k_router_split stages x with 2 units per thread");

/* Partial logits [slice][T][E] of the current k_router_split launch and the count of its blocks that
 * stored theirs; the last block sums, routes and puts the count back to 0. Launches on one device are
 * ordered on the backend's stream (as for g_rf_done), so they never overlap in these. */
__device__ float g_rs_part[RS_PART_MAX];
__device__ unsigned int g_rs_done;

/* Block (bx, by): experts 8bx..8bx+7 (one warp each) over K slice by (512 k). The block stages the
 * slice of the T x rows in shared memory while every lane has its RS_D weight chunks in flight (one
 * memory round trip for the whole 1-6 MB matrix when the grid covers the GPU), each warp reduces its
 * expert's T dot products and stores them as partials; the last block to finish sums the slices in
 * slice order (so the logits do not depend on which block finishes last) into lg [T][E], puts the
 * token's scores in shared memory and routes the T tokens, one warp each, with route_token_regs (or
 * route_token, as k_route, past its limits). Why: the one-warp-per-expert form (k_router_fused)
 * runs E/8 blocks that each walk all of K with the x loads in the dependent chain: ~17 us for 1 MB.
 * NORM (T = 1): the block computes its x slice from the residual row (cu_norm_stage: the whole row's
 * sum of squares, from L2) instead of reading x, in place of the norm kernel before the router. */
template <int NORM>
__global__ __launch_bounds__(RS_WARPS * 32) void k_router_split(const bf16 *x, const bf16 *W, int T, int K, float *lg,
                                                                const void *bias, int bt, int E, int topk, int n_group,
                                                                int topk_group, int norm, float scale, int32_t *ids,
                                                                float *wout, cu_norm_in nin, int early) {
    /* early: the weights (W, bias) are not written by device work in flight (cu_impl.weights_quiet), so
     * their loads go out before the wait (cuda_internal.cuh's exception): the kernel's first dependent
     * round trip then overlaps the previous kernel's end instead of following it */
    if (!early) {
        cu_pdl_wait();
        cu_pdl_trigger();
    }
    extern __shared__ uint4 rssm[]; /* x slice [T][RS_KS / 8] units; later the routing scratch */
    __shared__ bool last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int e = blockIdx.x * RS_WARPS + warp, k0 = blockIdx.y * RS_KS, nks = gridDim.y;
    const int nc = min(RS_KS, K - k0) / 8; /* 16-byte units of this slice (K % 8 == 0) */
    if (bias && blockIdx.y == 0 && lane == 0 && e < E) /* into L2 for the last block's routing */
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)bias + (size_t)e * (bt == MS_F32 ? 4 : 2)));
    uint4 wv[RS_D];
#pragma unroll
    for (int u = 0; u < RS_D; u++) {
        const int c = u * 32 + lane;
        wv[u] = e < E && c < nc ? __ldg((const uint4 *)(W + (size_t)e * K + k0) + c) : make_uint4(0, 0, 0, 0);
    }
    if (early) {
        cu_pdl_wait();
        cu_pdl_trigger();
    }
    if (NORM) { /* T = 1: the slice computed from the residual row (cu_norm_in) */
        cu_norm_stage(nin, rssm, k0 / 8, k0 / 8 + nc, gridDim.x * gridDim.y, blockIdx.x == 0 && blockIdx.y == 0);
    } else {
        /* the x slice: T * nc <= RF_MAXT * RS_KS / 8 = 2 units per thread, both loads in flight at once.
         * __ldcg, not __ldg: the compiler may move a non-coherent (invariant) load above the PDL wait, and
         * x is the previous kernel's output (with the weight loads before the wait, it did: graph and
         * mixed-step logits went wrong on the H200, session 19) */
        uint4 xv[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = threadIdx.x + h * RS_WARPS * 32, t = i / nc, c = i - t * nc;
            if (i < T * nc) xv[h] = __ldcg((const uint4 *)(x + (size_t)t * K + k0) + c);
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = threadIdx.x + h * RS_WARPS * 32, t = i / nc, c = i - t * nc;
            if (i < T * nc) rssm[t * (RS_KS / 8) + c] = xv[h];
        }
        __syncthreads();
    }
    if (e < E) {
        float acc[RF_MAXT];
#pragma unroll
        for (int t = 0; t < RF_MAXT; t++) acc[t] = 0.f;
#pragma unroll
        for (int u = 0; u < RS_D; u++) {
            const int c = u * 32 + lane;
            if (c >= nc) break;
#pragma unroll
            for (int t = 0; t < RF_MAXT; t++) {
                if (t >= T) break;
                acc[t] = cu_router_fma8(acc[t], wv[u], rssm[t * (RS_KS / 8) + c]);
            }
        }
#pragma unroll
        for (int t = 0; t < RF_MAXT; t++) {
            if (t >= T) break;
            const float v = warp_sum(acc[t]);
            if (lane == 0) g_rs_part[((size_t)blockIdx.y * T + t) * E + e] = v;
        }
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&g_rs_done, 1u) == gridDim.x * gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* the register router when its limits hold (uniform over the block), with the scores of token t in
     * shared memory: s at t * 2E, s + bias at t * 2E + E */
    const bool regs = route_regs_fits(E, n_group, topk);
    float *sc = (float *)rssm;
    for (int i = threadIdx.x; i < T * E; i += blockDim.x) {
        const int t = i / E, ee = i - t * E;
        const float bv = regs && bias ? cu_ld(bias, bt, ee) : 0.f; /* loaded with the partials, before lg's store */
        float v = 0.f;
        for (int ks = 0; ks < nks; ks++) v += __ldcg(g_rs_part + (size_t)ks * T * E + i);
        lg[i] = v;
        if (regs) {
            const float sv = cu_router_score(v);
            sc[(size_t)t * 2 * E + ee] = sv;
            sc[(size_t)t * 2 * E + E + ee] = sv + bv;
        }
    }
    __syncthreads(); /* lg and the scores complete (route_token reads lg through L2, as written by this block) */
    if (regs) {
        if (warp < T)
            route_token_regs(sc + (size_t)warp * 2 * E, sc + (size_t)warp * 2 * E + E, E, topk, n_group, topk_group,
                             norm, scale, ids + (size_t)warp * topk, wout + (size_t)warp * topk);
    } else {
        float *sm = (float *)rssm + (size_t)warp * (2 * E + 2 * n_group);
        for (int t = warp; t < T; t += RS_WARPS)
            route_token(lg + (size_t)t * E, bias, bt, E, topk, n_group, topk_group, norm, scale,
                        ids + (size_t)t * topk, wout + (size_t)t * topk, sm);
    }
    if (threadIdx.x == 0) g_rs_done = 0;
}

/* Contract in cuda_internal.cuh. */
int cu_router_fused(ms_backend *b, const ms_tensor *x, const ms_linear *gate, const void *bias, int bias_t,
                    const ms_route_cfg *rc, int T, float *lg, int32_t *ids, float *w, const cu_norm_in *nrm,
                    int *launched, ms_err *err) {
    *launched = 0;
    const int64_t K = gate->n_in;
    if (T < 1 || T > RF_MAXT || gate->fmt != MS_WFMT_PLAIN || gate->w.dtype != MS_BF16 || gate->bias.data ||
        x->dtype != MS_BF16 || K % 8 || ((uintptr_t)gate->w.data | (uintptr_t)x->data) % 16 || K > (1 << 24))
        return MS_OK;
    if (nrm && (T != 1 || nrm->H != K || K / 8 > CU_NORM_U * CU_NORM_T)) return MS_OK;
    cu_norm_in nin;
    memset(&nin, 0, sizeof nin);
    if (nrm) nin = *nrm;
    const int E = rc->n_experts;
    const size_t sm = sizeof(float) * RF_WARPS * (2 * (size_t)E + 2 * (size_t)rc->n_group);
    if (sm > 48 * 1024) return MS_OK;
    const int64_t nks = (K + RS_KS - 1) / RS_KS;
    if (cu_knob(CU_KNOB_ROUTER) == CU_ROUTER_SPLIT && nks * T * E <= RS_PART_MAX && nks <= 65535) {
        /* shared memory: the x slice, then the routing scratch of 8 warps (sm, <= 48 KB as checked) */
        const size_t xsm = (size_t)T * RS_KS * sizeof(bf16), ssm = xsm > sm ? xsm : sm;
        dim3 grid((E + RS_WARPS - 1) / RS_WARPS, (unsigned)nks);
        /* each block of the folded form reads the whole residual row from L2: with more blocks than SMs
         * that costs more than the norm kernel it replaces (H200: GLM-5's 384 blocks measured +0.02 ms a
         * step, GLM-4.5-Air's 128 -0.05 ms) */
        if (nrm && (b->gpu.n_sm <= 0 || (int64_t)grid.x * grid.y > b->gpu.n_sm)) return MS_OK;
        CK(cu_launch(nrm ? k_router_split<1> : k_router_split<0>, grid, RS_WARPS * 32, ssm, stream_of(b),
                     (const bf16 *)x->data, (const bf16 *)gate->w.data, T, (int)K, lg, bias, bias_t, E, rc->topk, rc->n_group,
                     rc->topk_group, rc->norm_topk_prob, rc->routed_scaling_factor, ids, w, nin,
                     cu_of(b)->weights_quiet));
        *launched = 1;
        return MS_OK;
    }
    if (nrm) return MS_OK; /* the one-warp-per-expert form reads x */
    CK(cu_launch(k_router_fused, (E + RF_WARPS - 1) / RF_WARPS, RF_WARPS * 32, sm, stream_of(b), 
                 (const bf16 *)x->data, (const bf16 *)gate->w.data, T, (int)K, lg, bias, bias_t, E, rc->topk, rc->n_group,
                 rc->topk_group, rc->norm_topk_prob, rc->routed_scaling_factor, ids, w));
    *launched = 1;
    return MS_OK;
}
