/* dummy.cu - random weights generated directly in GPU memory for `--load-format dummy`, so
 * full-size benchmarks need neither a download nor a host copy of hundreds of gigabytes. */
#include "backend/cuda/cuda_internal.cuh"

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

__global__ void k_fill(void *dst, int dt, size_t n, float amp, uint64_t seed) {
    cu_pdl_wait();
    cu_pdl_trigger();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = mix64(seed ^ mix64(i + 0x9e3779b97f4a7c15ull));
        float u = ((float)(h >> 40) / 16777216.0f) * 2.f - 1.f;
        switch (dt) {
        case MS_F32: ((float *)dst)[i] = u * amp; break;
        case MS_BF16: ((bf16 *)dst)[i] = __float2bfloat16_rn(u * amp); break;
        case MS_F8E4M3: {
            uint8_t b = (uint8_t)h;
            if ((b & 0x78) == 0x78) b &= 0xf7; /* exponent <= 14: finite, never NaN */
            ((uint8_t *)dst)[i] = b;
            break;
        }
        default: ((uint8_t *)dst)[i] = (uint8_t)h; break;
        }
    }
}

extern "C" int ms_cuda_fill_random(ms_backend *b, void *dst_d, ms_dtype dtype, size_t n_elems, float amp,
                                   uint64_t seed, ms_err *err) {
    if (!n_elems) return MS_OK;
    cu_of(b)->weights_quiet = 0; /* its kernel may write weights: see cu_impl */
    if (dtype != MS_F32 && dtype != MS_BF16 && dtype != MS_F8E4M3 && dtype != MS_U8)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "dummy weights: dtype %s not supported on the GPU", ms_dtype_name(dtype));
    size_t g = (n_elems + 255) / 256;
    if (g > 65535 * 4) g = 65535 * 4;
    CK(cu_launch(k_fill, (unsigned)g, 256, 0, cu_of(b)->stream, dst_d, dtype, n_elems, amp, seed));
    return MS_OK;
}

/* ------------------------------------------------------------------ whole weights, in format */

#include <cuda_fp8.h>

__device__ __forceinline__ float u_of(uint64_t seed, size_t i) {
    uint64_t h = mix64(seed ^ mix64(i + 0x9e3779b97f4a7c15ull));
    return ((float)(h >> 40) / 16777216.0f) * 2.f - 1.f;
}

/* dst[i] = offset + amp * u_i, as F32 or BF16. */
__global__ void k_gen_float(void *dst, int dt, size_t n, float offset, float amp, uint64_t seed) {
    cu_pdl_wait();
    cu_pdl_trigger();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = offset + amp * u_of(seed, i);
        if (dt == MS_F32) ((float *)dst)[i] = v;
        else ((bf16 *)dst)[i] = __float2bfloat16_rn(v);
    }
}

/* dst[i] = e4m3((a + b * u_i) * 448) (RNE, saturating: always finite). */
__global__ void k_gen_e4m3(uint8_t *dst, size_t n, float a, float b, uint64_t seed) {
    cu_pdl_wait();
    cu_pdl_trigger();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = (uint8_t)__nv_cvt_float_to_fp8((a + b * u_of(seed, i)) * 448.0f, __NV_SATFINITE, __NV_E4M3);
}

/* n random bytes (each E2M1 nibble pair uniform over all 16 codes, all finite by definition). */
__global__ void k_gen_bytes(uint8_t *dst, size_t n, uint64_t seed) {
    cu_pdl_wait();
    cu_pdl_trigger();
    size_t nw = n / 8;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nw; i += (size_t)gridDim.x * blockDim.x)
        ((uint64_t *)dst)[i] = mix64(seed ^ mix64(i + 0x9e3779b97f4a7c15ull));
    if (blockIdx.x == 0 && threadIdx.x < n - nw * 8) dst[nw * 8 + threadIdx.x] = (uint8_t)mix64(seed + n + threadIdx.x);
}

static unsigned gen_grid(size_t n) {
    size_t g = (n + 255) / 256;
    return (unsigned)(g > 65535 * 8 ? 65535 * 8 : g < 1 ? 1 : g);
}

/* cudaMalloc that reports the tensor it was for. */
static int dev_alloc(ms_backend *b, size_t n, const char *what, void **out, ms_err *err) {
    *out = NULL;
    cudaError_t e = cudaMalloc(out, n ? n : 16);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *out = NULL;
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        return ms_errf(err, MS_ERR_NOMEM, "dummy weights: no GPU memory for '%s' (%zu bytes; %.2f GiB free of %.2f GiB)",
                       what, n, fr / 1073741824.0, tot / 1073741824.0);
    }
    return MS_OK;
}

extern "C" int ms_cuda_dummy_tensor(ms_backend *b, ms_tensor *t, float offset, float amp, uint64_t seed, ms_err *err) {
    CK(cudaSetDevice(b->device));
    cu_of(b)->weights_quiet = 0; /* its kernel may write weights: see cu_impl */
    if (t->dtype != MS_F32 && t->dtype != MS_BF16)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "dummy weights: tensor dtype %s not supported on the GPU",
                       ms_dtype_name(t->dtype));
    size_t n = (size_t)ms_tensor_numel(t);
    void *d = NULL;
    MS_TRY(dev_alloc(b, ms_tensor_nbytes(t), "tensor", &d, err));
    cudaError_t e = n ? cu_launch(k_gen_float, gen_grid(n), 256, 0, cu_of(b)->stream, d, t->dtype, n, offset, amp, seed)
                      : cudaSuccess;
    if (e != cudaSuccess) {
        cudaFree(d);
        return ms_errf(err, MS_ERR_RUNTIME, "dummy weights: fill kernel failed: %s", cudaGetErrorString(e));
    }
    t->data = d;
    return MS_OK;
}

extern "C" int ms_cuda_dummy_linear(ms_backend *b, ms_linear *W, int with_bias, uint64_t seed, ms_err *err) {
    CK(cudaSetDevice(b->device));
    cu_of(b)->weights_quiet = 0; /* its kernels write weights: see cu_impl */
    const int64_t N = W->n_out, K = W->n_in;
    const char *nm = W->name ? W->name : "(linear)";
    if (N <= 0 || K <= 0 || N > INT32_MAX || K > INT32_MAX || (W->fmt == MS_WFMT_NVFP4 && K % 16))
        return ms_errf(err, MS_ERR_INVALID, "dummy weights: %s shape [%lld, %lld] not valid for %s", nm, (long long)N,
                       (long long)K, ms_wfmt_name(W->fmt, MS_BF16));
    cudaStream_t s = cu_of(b)->stream;
    cu_linear_prep *p = (cu_linear_prep *)calloc(1, sizeof *p);
    if (!p) return ms_errf(err, MS_ERR_NOMEM, "%s: out of host memory", nm);
    void *wd = NULL, *sd = NULL, *bd = NULL;
    int rc = MS_OK;
    cudaError_t le = cudaSuccess; /* the first failed fill launch */
    const float kf = (float)K;
    switch (W->fmt) {
    case MS_WFMT_PLAIN:
        W->w = ms_tensor_2d(MS_BF16, N, K);
        rc = dev_alloc(b, ms_tensor_nbytes(&W->w), nm, &wd, err);
        if (!rc)
            le = cu_launch(k_gen_float, gen_grid((size_t)N * K), 256, 0, s, wd, MS_BF16, (size_t)N * K, 0.f,
                           sqrtf(3.f / kf), seed);
        break;
    case MS_WFMT_FP8: {
        /* codes e4m3(u*448) times block scale sqrt(3/K)/448 * (1 + 0.25u'): variance about 1/K (as dummy.c) */
        W->w = ms_tensor_2d(MS_F8E4M3, N, K);
        W->scale = ms_tensor_2d(MS_F32, (N + 127) / 128, (K + 127) / 128);
        rc = dev_alloc(b, ms_tensor_nbytes(&W->w), nm, &wd, err);
        if (!rc) rc = dev_alloc(b, ms_tensor_nbytes(&W->scale), nm, &sd, err);
        if (!rc) {
            float s0 = sqrtf(3.f / kf) / 448.f;
            le = cu_launch(k_gen_e4m3, gen_grid((size_t)N * K), 256, 0, s, (uint8_t *)wd, (size_t)N * K, 0.f, 1.f, seed);
            size_t ns = (size_t)ms_tensor_numel(&W->scale);
            if (le == cudaSuccess)
                le = cu_launch(k_gen_float, gen_grid(ns), 256, 0, s, sd, MS_F32, ns, s0, 0.25f * s0, seed ^ 0x5ca1e);
        }
        break;
    }
    case MS_WFMT_NVFP4: {
        /* uniform nibbles (E[code^2] = 68.5/8), block scales e4m3 of U(0.25,1)*448 (E[(s/448)^2] =
         * 0.4375), global scale so the dequantized variance is 1/K (as dummy.c) */
        W->w = ms_tensor_2d(MS_U8, N, K / 2);
        W->scale = ms_tensor_2d(MS_F8E4M3, N, K / 16);
        rc = dev_alloc(b, ms_tensor_nbytes(&W->w), nm, &wd, err);
        if (!rc) rc = dev_alloc(b, ms_tensor_nbytes(&W->scale), nm, &sd, err);
        if (!rc) {
            le = cu_launch(k_gen_bytes, gen_grid((size_t)N * K / 16), 256, 0, s, (uint8_t *)wd, (size_t)N * K / 2, seed);
            if (le == cudaSuccess)
                le = cu_launch(k_gen_e4m3, gen_grid((size_t)N * K / 16), 256, 0, s, (uint8_t *)sd, (size_t)N * K / 16,
                               0.625f, 0.375f, seed ^ 0x5ca1e);
        }
        W->scale2 = 1.0f / (448.0f * sqrtf(kf * (68.5f / 8.0f) * 0.4375f));
        W->input_scale = 1.0f;
        break;
    }
    default: rc = ms_errf(err, MS_ERR_INVALID, "dummy weights: %s has an unknown format %d", nm, (int)W->fmt);
    }
    if (!rc && with_bias) {
        W->bias = ms_tensor_make(MS_F32, 1, &W->n_out);
        rc = dev_alloc(b, (size_t)N * sizeof(float), nm, &bd, err);
        if (!rc && le == cudaSuccess)
            le = cu_launch(k_gen_float, gen_grid((size_t)N), 256, 0, s, bd, MS_F32, (size_t)N, 0.f, 0.1f, seed ^ 0xb1a5);
    }
    if (!rc) {
        cudaError_t e = le != cudaSuccess ? le : cudaGetLastError();
        if (e != cudaSuccess) rc = ms_errf(err, MS_ERR_RUNTIME, "dummy weights: %s fill kernel failed: %s", nm, cudaGetErrorString(e));
    }
    if (rc) {
        if (wd) cudaFree(wd);
        if (sd) cudaFree(sd);
        if (bd) cudaFree(bd);
        free(p);
        W->w.data = W->scale.data = W->bias.data = NULL;
        return rc;
    }
    W->w.data = wd;
    W->scale.data = sd;
    W->bias.data = bd;
    p->d.w = wd;
    p->d.scale = sd;
    p->d.scale2 = W->scale2;
    p->d.fmt = W->fmt;
    p->d.dtype = W->w.dtype;
    p->d.n = (int)N;
    p->d.k = (int)K;
    p->d.scale_ld = W->fmt == MS_WFMT_FP8 ? (int)((K + 127) / 128) : W->fmt == MS_WFMT_NVFP4 ? (int)(K / 16) : 0;
    p->bias_f32 = (float *)bd;
    W->prepared = p;
    return MS_OK;
}
