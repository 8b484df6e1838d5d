/* router_dot.cuh - the arithmetic the decode router's logits and scores are made of, shared by the split
 * router (k_router_split, elementwise.cu) and the routed form of the fused MoE kernel (moe_fused.cu).
 * The routed kernel must choose exactly the experts the router kernel would (the tests compare the two
 * bit for bit), so both build a logit from the same 16-byte steps and a score from the same formula
 * instead of two copies that must be kept alike by hand. tests/backend/test_route_emu.sh compiles it for
 * the host too (after its shims for the bf16 types). */
#ifndef MS_BACKEND_CUDA_ROUTER_DOT_CUH
#define MS_BACKEND_CUDA_ROUTER_DOT_CUH

/* acc plus the dot product of one 16-byte chunk of a router row w and of x (8 bf16 each), pair by pair
 * (elements 2i and 2i + 1 for i = 0..3, the odd one first into each fma): the order in which a lane of
 * either kernel accumulates its chunks, one call a chunk, chunks in increasing k. */
static __device__ __forceinline__ float cu_router_fma8(float acc, uint4 w, uint4 x) {
    const __nv_bfloat162 *w2 = (const __nv_bfloat162 *)&w, *x2 = (const __nv_bfloat162 *)&x;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 wf = __bfloat1622float2(w2[i]), xf = __bfloat1622float2(x2[i]);
        acc = fmaf(wf.x, xf.x, fmaf(wf.y, xf.y, acc));
    }
    return acc;
}

/* The routing score of a logit (GLM's sigmoid scoring), in the float formula both kernels use. */
static __device__ __forceinline__ float cu_router_score(float logit) { return 1.f / (1.f + expf(-logit)); }

#endif
