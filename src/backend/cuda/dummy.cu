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
    if (dtype != MS_F32 && dtype != MS_BF16 && dtype != MS_F8E4M3 && dtype != MS_U8)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "dummy weights: dtype %s not supported on the GPU", ms_dtype_name(dtype));
    size_t g = (n_elems + 255) / 256;
    if (g > 65535 * 4) g = 65535 * 4;
    k_fill<<<(unsigned)g, 256, 0, cu_of(b)->stream>>>(dst_d, dtype, n_elems, amp, seed);
    CK_LAUNCH();
    return MS_OK;
}
