/* route_regs.cuh - the decode router's expert choice in registers (route_token_regs), kept apart from
 * elementwise.cu so that tests/backend/test_route_emu.sh can compile the same source for the host (a
 * warp as 32 threads, redux.sync and shfl.sync rebuilt) and compare it with the CPU's routing rules
 * without a GPU. Device code only; needs uint32_t, INFINITY, fmaxf/fminf and the warp intrinsics. */
#ifndef MS_BACKEND_CUDA_ROUTE_REGS_CUH
#define MS_BACKEND_CUDA_ROUTE_REGS_CUH

/* Order-preserving key of a routing score for the integer warp reductions: larger score, larger key;
 * +0 and -0 alike (the CPU compares with >, so they tie); NaN 1, below every number; 0 is kept for
 * "not a candidate" (taken, or past E). */
static __device__ __forceinline__ uint32_t rs_key(float f) {
    if (f != f) return 1u;
    const uint32_t u = f == 0.f ? 0u : __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* route_token for E <= 32 * RS_EPL experts, n_group <= 32 and topk <= 32, with the scores already in
 * shared memory (s [E] sigmoid scores, c [E] the same plus the correction bias) and the choice made in
 * registers by warp reductions (redux.sync) instead of shuffle trees. Same result as route_token and the
 * CPU reference: group score = sum of the two largest biased scores of the group, topk_group groups by
 * score (ties: lower group), experts of the other groups at 0 (not -inf), top-k experts by biased
 * score (ties: lower expert), weights from the unbiased scores in choice order. */
#define RS_EPL 8
/* Whether route_token_regs takes a routing of E experts in n_group groups, top-k topk: both the split
 * router's last block and the routed MoE kernel's host check ask here. */
static __host__ __device__ inline bool route_regs_fits(int E, int n_group, int topk) {
    return E <= 32 * RS_EPL && n_group <= 32 && topk <= 32;
}
static __device__ void route_token_regs(const float *s, const float *c, int E, int topk, int n_group, int topk_group, int norm,
                                        float scale, int32_t *ids, float *wout) {
    const int lane = threadIdx.x & 31;
    uint32_t key[RS_EPL]; /* expert lane + 32 i */
#pragma unroll
    for (int i = 0; i < RS_EPL; i++) key[i] = lane + 32 * i < E ? rs_key(c[lane + 32 * i]) : 0u;
    if (n_group > 1) {
        /* a team of ts lanes per group (ts = 32 / the power of two >= n_group) finds its two largest
         * biased scores (a multiset: a repeated maximum counts twice, as in the CPU's scan) */
        const int gsz = E / n_group;
        int ts = 32;
        while (ts * n_group > 32) ts >>= 1;
        const int g = lane / ts, r = lane - g * ts;
        float m1 = -INFINITY, m2 = -INFINITY;
        if (g < n_group)
            for (int j = r; j < gsz; j += ts) {
                const float v = c[g * gsz + j];
                if (v > m1) { m2 = m1; m1 = v; } else if (v > m2) m2 = v;
            }
        for (int o = 1; o < ts; o <<= 1) {
            const float b1 = __shfl_xor_sync(0xffffffffu, m1, o), b2 = __shfl_xor_sync(0xffffffffu, m2, o);
            const float hi = fmaxf(m1, b1), lo = fmaxf(fminf(m1, b1), fmaxf(m2, b2));
            m1 = hi;
            m2 = lo;
        }
        uint32_t gk = g < n_group && r == 0 ? rs_key(gsz > 1 ? m1 + m2 : m1) : 0u;
        uint32_t kept = 0u; /* bit g: group g kept */
        for (int k = 0; k < topk_group; k++) {
            const uint32_t m = __reduce_max_sync(0xffffffffu, gk);
            const uint32_t w = __reduce_min_sync(0xffffffffu, gk == m && r == 0 && g < n_group ? (uint32_t)g : 0xffffffffu);
            kept |= 1u << w;
            if (g == (int)w && r == 0) gk = 0u;
        }
#pragma unroll
        for (int i = 0; i < RS_EPL; i++) {
            const int e = lane + 32 * i;
            if (e < E && !((kept >> (e / gsz)) & 1u)) key[i] = rs_key(0.f);
        }
    }
    float sum = 0.f, myw = 0.f;
    int myid = 0;
    for (int k = 0; k < topk; k++) {
        uint32_t bk = 0u, bi = 0xffffffffu; /* the lane's best: first (lowest expert) of its largest key */
#pragma unroll
        for (int i = 0; i < RS_EPL; i++)
            if (key[i] > bk) { bk = key[i]; bi = lane + 32 * i; }
        const uint32_t m = __reduce_max_sync(0xffffffffu, bk);
        const uint32_t win = __reduce_min_sync(0xffffffffu, bk == m ? bi : 0xffffffffu);
#pragma unroll
        for (int i = 0; i < RS_EPL; i++)
            if (lane + 32 * i == (int)win) key[i] = 0u;
        const float wv = s[win];
        sum += wv;
        if (lane == k) { myid = (int)win; myw = wv; }
    }
    if (lane < topk) {
        ids[lane] = myid;
        wout[lane] = norm ? (myw / (sum + 1e-20f)) * scale : myw * scale;
    }
}

#endif
