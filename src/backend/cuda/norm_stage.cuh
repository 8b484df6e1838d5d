/* norm_stage.cuh - cu_norm_stage, the block part of a row's RMSNorm folded into the kernel that reads
 * it (cu_norm_in in cuda_internal.cuh): the streaming bf16 GEMV (gemv_bf16.cu), the decode router
 * (elementwise.cu) and the routed fused MoE kernel (moe_fused.cu) include it, each in a kernel instance
 * of its own (k_gvb<1, 2>, k_router_split<1>, k_moe_fused<NG, D, 1>),
 * so that the forms without it keep their code and registers: a call in k_gvb's other forms cost them
 * ~17% (H200, session 13: lm_head 0.283 -> 0.331 ms), so it is inlined. */
#ifndef MS_BACKEND_CUDA_NORM_STAGE_CUH
#define MS_BACKEND_CUDA_NORM_STAGE_CUH

#include "backend/cuda/cuda_internal.cuh"

/* cu_norm_in's block part (contract there): x units [u0, u1) of the row (8 bf16 each) into xs[0 ..
 * u1 - u0); nblocks: the blocks of the launch that call this (each exactly once), first: this block stores
 * out. All threads of the block (at least CU_NORM_T) call it after griddepcontrol.wait; threads
 * CU_NORM_T and up hold nothing, so the sum's order is the same in every caller. It ends in a barrier,
 * after which xs is complete. Uses 34 floats of static shared memory. */
static __device__ __forceinline__ void cu_norm_stage(const cu_norm_in n, uint4 *xs, int u0, int u1, unsigned nblocks, bool first) {
    __shared__ float red[34];
    /* nt is CU_NORM_T in every caller (blocks of at least CU_NORM_T threads); kept a run-time value,
     * since the constant let the compiler keep more addresses live (ptxas: k_gvb<1, 2> spilled 128 bytes
     * instead of 48, the three-group routed forms 24 instead of 0) */
    const int tid = threadIdx.x, nt = min((int)blockDim.x, CU_NORM_T), U = tid < nt ? n.H >> 3 : 0;
    const int warp = tid >> 5, lane = tid & 31;
    float4 s[CU_NORM_U][2];
    uint4 wv[CU_NORM_U];
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < CU_NORM_U; i++) {
        const int u = tid + i * nt;
        if (u < U) {
            wv[i] = __ldg((const uint4 *)n.w + u); /* in flight with the row's loads */
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float4 a = __ldcg((const float4 *)n.resid + 2 * u + h);
                if (n.delta) {
                    const float4 d = __ldcg((const float4 *)n.delta + 2 * u + h);
                    a.x += d.x, a.y += d.y, a.z += d.z, a.w += d.w;
                }
                s[i][h] = a;
                acc += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
            }
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) red[warp] = acc;
    __syncthreads();
    if (tid == 0) {
        float t = 0.f;
        for (int w = 0; w < nt >> 5; w++) t += red[w];
        red[32] = 1.f / sqrtf(t / (float)n.H + n.eps);
        unsigned last = 0;
        if (n.delta) { /* this block's reads of resid are done (their values are summed above) */
            __threadfence();
            last = atomicAdd(n.done, 1u) == nblocks - 1;
        }
        red[33] = last ? 1.f : 0.f;
    }
    __syncthreads();
    const float inv = red[32];
    const bool last = red[33] != 0.f;
    if (last) __threadfence(); /* every block's count seen before this block's writes of resid */
    if (last && tid == 0) *n.done = 0;
#pragma unroll
    for (int i = 0; i < CU_NORM_U; i++) {
        const int u = tid + i * nt;
        if (u < U) {
            const uint32_t wr[4] = {wv[i].x, wv[i].y, wv[i].z, wv[i].w};
            uint32_t o[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float4 &a = s[i][j >> 1];
                const float v0 = (j & 1) ? a.z : a.x, v1 = (j & 1) ? a.w : a.y;
                const __nv_bfloat162 p = __floats2bfloat162_rn(v0 * inv * __uint_as_float(wr[j] << 16),
                                                               v1 * inv * __uint_as_float(wr[j] & 0xffff0000u));
                o[j] = *(const uint32_t *)&p;
            }
            const uint4 ov = make_uint4(o[0], o[1], o[2], o[3]);
            if (u >= u0 && u < u1) xs[u - u0] = ov;
            if (first) ((uint4 *)n.out)[u] = ov;
            if (last) {
                ((float4 *)n.resid)[2 * u] = s[i][0];
                ((float4 *)n.resid)[2 * u + 1] = s[i][1];
            }
        }
    }
    __syncthreads();
}

#endif
