/* gemv_mma.cuh - the device pieces of the tensor-core decode product (gemv_mma.cu, whose file comment
 * explains the layout, the exactness argument and the data movement) that other decode kernels reuse:
 * PTX wrappers, the exact NVFP4/FP8 decoders, the super-step loads (registers or the cp.async ring)
 * and the per-super-step multiply-add gm_step. The fused one-token MoE kernel (moe_fused.cu) streams
 * the same weights through the same ring, with the raw e2m1 placement (gm_fp4x8_raw) and a step of its
 * own that scales after the mma. Device code only; included after cuda_internal.cuh. */
#ifndef MS_BACKEND_CUDA_GEMV_MMA_CUH
#define MS_BACKEND_CUDA_GEMV_MMA_CUH

#include "backend/cuda/cuda_internal.cuh"

/* ---- PTX wrappers ---- */

/* d += A·B for one m16n8k16 tile, bf16 inputs, fp32 accumulate (fragment layouts: PTX ISA "Matrix
 * Fragments for mma.m16n8k16 with floating point type"). */
__device__ __forceinline__ void gm_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* Two bf16 products a*b (+ -0.0), rounded to nearest; exact whenever the product fits bf16. */
__device__ __forceinline__ uint32_t gm_bmul2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
}
__device__ __forceinline__ void gm_cp16(void *smem, const void *gmem, int src_bytes) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void gm_cp8(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void gm_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void gm_cp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
/* all but the newest N of the thread's cp.async groups have landed */
template <int N> __device__ __forceinline__ void gm_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/* ---- exact decoders (see the file comment) ---- */

/* 8 nibbles (k = i for nibble i) -> 4 bf16x2: out[i] = (k i, k i+4) as e2m1 * s / 256, where s2 is
 * the bf16x2 pattern of (s * 2^118, s * 2^118). */
__device__ __forceinline__ void gm_fp4x8(uint32_t w, uint32_t s2, uint32_t (&o)[4]) {
    const uint32_t M = 0x01C001C0u, S = 0x80008000u; /* magnitude (e1 e0 m) at bits 8..6, sign at 15 */
    o[0] = gm_bmul2(((w << 6) & M) | ((w << 12) & S), s2);
    o[1] = gm_bmul2(((w << 2) & M) | ((w << 8) & S), s2);
    o[2] = gm_bmul2(((w >> 2) & M) | ((w << 4) & S), s2);
    o[3] = gm_bmul2(((w >> 6) & M) | (w & S), s2);
}
/* gm_fp4x8 with fewer integer-pipe instructions (MS_CU_GEMV_FP4=v2, the default; same outputs): the
 * nibble pair (i, i+4) of a word is isolated by one mask (16 bits apart, as the bf16 halves) and one
 * multiply by 2^a + 2^(a+6) (IMAD, the FMA pipe) puts the magnitude at bits 8..6 and a copy of the
 * sign at bit 15 of each half without carries (the two shifted copies do not overlap); one mask keeps
 * those bits. Nibbles 2, 3, 6, 7 go through the same after one shared right shift by 8. Per word: 8
 * LOP3 + 1 shift on the ALU pipe and 4 IMAD (the old form: 8 LOP3 + 7 shifts, which ptxas splits
 * between SHF and IMAD.SHL). gm_fp4x8_raw is the placement alone: out[i] = (k i, k i+4) as bf16 patterns
 * holding e2m1 * 2^-126 exactly (e2m1's 0.5 becomes a bf16 subnormal), for a consumer that applies the
 * block scale after the product (moe_fused.cu). */
__device__ __forceinline__ void gm_fp4x8_raw(uint32_t w, uint32_t (&o)[4]) {
    const uint32_t MS = 0x81C081C0u; /* magnitude at bits 8..6, sign at 15, in each half */
    const uint32_t w2 = w >> 8;
    o[0] = ((w & 0x000F000Fu) * 0x1040u) & MS;
    o[1] = ((w & 0x00F000F0u) * 0x104u) & MS;
    o[2] = ((w2 & 0x000F000Fu) * 0x1040u) & MS;
    o[3] = ((w2 & 0x00F000F0u) * 0x104u) & MS;
}
__device__ __forceinline__ void gm_fp4x8_v2(uint32_t w, uint32_t s2, uint32_t (&o)[4]) {
    gm_fp4x8_raw(w, o);
#pragma unroll
    for (int i = 0; i < 4; i++) o[i] = gm_bmul2(o[i], s2);
}
/* 4 e4m3 bytes (k = i for byte i) -> 2 bf16x2 holding the exact values: o[0] = (k 0, k 2),
 * o[1] = (k 1, k 3). */
__device__ __forceinline__ void gm_fp8x4(uint32_t w, uint32_t (&o)[2]) {
    const uint32_t M = 0x07F007F0u, S = 0x80008000u, P120 = 0x7B807B80u; /* bf16 2^120 twice */
    o[0] = gm_bmul2(((w << 4) & M) | ((w << 8) & S), P120);
    o[1] = gm_bmul2(((w >> 4) & M) | (w & S), P120);
}
/* e4m3 scale byte -> bf16 bits of s * 2^118 (exact: 4 significant bits, below 2^127). */
__device__ __forceinline__ uint32_t gm_fp4_scale(uint32_t byte) {
    const float s = __uint_as_float(((byte & 0x7fu) << 20) | ((byte & 0x80u) << 24)) * 0x1p120f; /* exact e4m3 */
    const uint32_t h = __float_as_uint(s * 0x1p118f) >> 16;
    return h | (h << 16);
}

/* The two e4m3 scale bytes of a lane's nvfp4 chunk (sc: byte 0 for k 0..15, byte 1 for k 16..31) ->
 * s0, s1: the bf16x2 patterns (s * 2^118, s * 2^118) of each, as gm_fp4_scale, for both at once and
 * without the fp32 path: the bytes spread to the two halves, the e4m3 bits placed in a bf16 pattern
 * give s * 2^-120 exactly (e4m3 subnormals become bf16 subnormals, which fma.bf16x2 takes), two exact
 * bf16x2 products by 2^119 give s * 2^118 (>= 2^109 or 0, < 2^127), then each half is broadcast. */
__device__ __forceinline__ void gm_fp4_scale2(uint32_t sc, uint32_t &s0, uint32_t &s1) {
    const uint32_t P119 = 0x7B007B00u; /* bf16 2^119 twice */
    const uint32_t t = __byte_perm(sc, 0u, 0x4140); /* byte 0 -> bits 0..7, byte 1 -> bits 16..23 */
    const uint32_t p = ((t << 4) & 0x07F007F0u) | ((t << 8) & 0x80008000u);
    const uint32_t v = gm_bmul2(gm_bmul2(p, P119), P119);
    s0 = __byte_perm(v, v, 0x1010);
    s1 = __byte_perm(v, v, 0x3232);
}

/* One super-step's raw loads for rows g and g+8. sc: nvfp4 the two scale bytes of the lane's chunk
 * per row; fp8 the block scale (float bits, same for both rows) in sc[0]. */
struct gm_raw {
    uint4 w[2];
    uint32_t sc[2];
};

/* 16-byte x unit u of a token row -> its place in the staged row: the low two bits flip with bits
 * 3..4, so with gm_fmt::PAD the 8 lanes of a quarter-warp (tokens g, g+1 x lanes t = 0..3) read
 * 8 distinct bank groups. */
__device__ __forceinline__ int gm_swz(int u) { return u ^ ((u >> 3) & 3); }

template <int FMT> struct gm_fmt {
    /* FMT 2..5 are nvfp4: decode v1, v2, v2 with launch bounds for 3 blocks of 256 threads per SM, v2
     * with the weights streamed through shared memory (v3, GM_D super-steps in flight per warp) */
    static constexpr int UPS = FMT == 0 ? 4 : FMT == 1 ? 8 : 16; /* x units (8 k) per super-step */
    static constexpr int SS = UPS * 8;                            /* k per super-step */
    static constexpr int CE = SS / 4;                             /* k per lane chunk */
    /* row padding in units, so token rows g and g+1 use disjoint banks: bf16 lanes t read 4 units of
     * one aligned group of 4 -> shift by 4; fp8 4 units of one parity -> shift by 1; nvfp4 units
     * {a, a^1, a+4, (a^1)+4} -> shift by 2 */
    static constexpr int PAD = FMT == 0 ? 4 : FMT == 1 ? 1 : 2;
    /* staged row stride in units for nsl super-steps: PAD past a multiple of 8 units (128 bytes) */
    static __host__ __device__ __forceinline__ int rstride(int nsl) { return ((nsl * UPS + 7) & ~7) + PAD; }
};

template <int FMT>
__device__ __forceinline__ void gm_load(gm_raw &r, const uint8_t *const (&wrow)[2], const void *const (&srow)[2], int j,
                                        int nss, int K, int ti) {
    typedef gm_fmt<FMT> F;
    const bool ok = j < nss && j * F::SS + ti * F::CE < K; /* chunk inside the row (K % CE == 0) */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        r.w[h] = ok ? __ldg((const uint4 *)(wrow[h] + (size_t)j * 64 + ti * 16)) : make_uint4(0, 0, 0, 0);
        r.sc[h] = 0u;
        if (FMT >= 2 && ok) r.sc[h] = __ldg((const unsigned short *)srow[h] + (size_t)j * 4 + ti);
    }
    if (FMT == 1 && j < nss) r.sc[0] = __float_as_uint(__ldg((const float *)srow[0] + (j >> 1)));
}

/* FMT 5 (MS_CU_GEMV_FP4=v3): each warp streams its super-steps through a ring of GM_D stages in shared
 * memory with cp.async, GM_D - 1 super-steps ahead of its math, where the register double buffer of
 * the other forms holds two: ~2x the bytes in flight per warp for fewer registers. A stage: the 32
 * lanes' 16-byte chunks of row g ([h][lane], 512 bytes per h, read back by the same lane) and the 8
 * scale bytes of each of the 16 rows ([h][g], copied by lane (g, 0), read by the row's 4 lanes after a
 * __syncwarp). The host picks FMT 5 only when K % 128 == 0 (8-byte aligned scale rows) and x fits in
 * one slice. */
#define GM_D 4
#define GM_STG (1024 + 128)
/* The same stage seen through the lane's own pointer lst = stage + 16 lane (moe_fused.cu keeps one a
 * ring stage): its chunk of row g at lst, of row g + 8 at lst + 512, and its row's two scale bytes at
 * lst + gm_ring_soff(gi, ti) (+ 64 for row g + 8). */
__device__ __forceinline__ int gm_ring_soff(int gi, int ti) { return 1024 + 8 * gi + 2 * ti - 16 * (4 * gi + ti); }
/* Queues one super-step's copies: the lane's 16-byte chunks w0 (row g) and w1 (row g + 8); lane t = 0
 * of each row also the 8 scale bytes s0 and s1 of the super-step. */
__device__ __forceinline__ void gm_ring_put_lane(uint8_t *lst, const uint8_t *w0, const uint8_t *w1, const uint8_t *s0,
                                                 const uint8_t *s1, int gi, int ti) {
    gm_cp16(lst, w0, 16);
    gm_cp16(lst + 512, w1, 16);
    if (ti == 0) {
        gm_cp8(lst + gm_ring_soff(gi, 0), s0);
        gm_cp8(lst + gm_ring_soff(gi, 0) + 64, s1);
    }
}
__device__ __forceinline__ void gm_ring_get_lane(gm_raw &r, const uint8_t *lst, int soff) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        r.w[h] = *(const uint4 *)(lst + h * 512);
        r.sc[h] = *(const unsigned short *)(lst + soff + h * 64);
    }
}
__device__ __forceinline__ void gm_ring_put(uint8_t *st, const uint8_t *const (&wrow)[2], const void *const (&srow)[2],
                                            int j, int gi, int ti, int lane) {
    gm_ring_put_lane(st + 16 * lane, wrow[0] + (size_t)j * 64 + ti * 16, wrow[1] + (size_t)j * 64 + ti * 16,
                     (const uint8_t *)srow[0] + (size_t)j * 8, (const uint8_t *)srow[1] + (size_t)j * 8, gi, ti);
}
__device__ __forceinline__ void gm_ring_get(gm_raw &r, const uint8_t *st, int gi, int ti, int lane) {
    gm_ring_get_lane(r, st + 16 * lane, gm_ring_soff(gi, ti));
}

/* The nvfp4 v2 decode's pieces (gm_step's FMT >= 3 path; gm_word also moe_fused.cu's). Word q of row h's
 * (g / g + 8) 16-byte chunk: k 8q..8q+7 of the lane's 32, as pairs (i, i + 4). */
__device__ __forceinline__ uint32_t gm_word(const gm_raw &r, int h, int q) {
    return q == 0 ? r.w[h].x : q == 1 ? r.w[h].y : q == 2 ? r.w[h].z : r.w[h].w;
}
/* Both rows' scale bytes -> s2[row][16-k group], the bf16x2 factors of gm_fp4x8_v2. */
__device__ __forceinline__ void gm_fp4_scales_v2(const gm_raw &r, uint32_t (&s2)[2][2]) {
#pragma unroll
    for (int h = 0; h < 2; h++) gm_fp4_scale2(r.sc[h], s2[h][0], s2[h][1]);
}
/* Word q of both rows -> A[row], the fragment registers of one mma pair. */
__device__ __forceinline__ void gm_fp4_rows_v2(const gm_raw &r, int q, const uint32_t (&s2)[2][2], uint32_t (&A)[2][4]) {
#pragma unroll
    for (int h = 0; h < 2; h++) gm_fp4x8_v2(gm_word(r, h, q), s2[h][q >> 1], A[h]);
}
/* Unit of x (k 8q..8q+7 of lane t's chunk) in super-step jl of a staged row: gm_swz(16 jl + 4 t + q)
 * spelled so that the lane's part is loop invariant (with c = 4 t + q < 16, gm_swz(16 jl + c) =
 * 16 jl + (c ^ (c >> 3) ^ 2 (jl & 1))). */
__device__ __forceinline__ int gm_xunit_v2(int jl, int ti, int q) {
    const int c = 4 * ti + q;
    return jl * 16 + ((c ^ (c >> 3)) ^ ((jl & 1) << 1));
}

/* Accumulates super-step jl of the staged slice (xs, row stride rs units) into acc. */
template <int FMT, int NT>
__device__ __forceinline__ void gm_step(float (&acc)[NT][4], const gm_raw &r, const uint4 *xs, int rs, int jl, int gi,
                                        int ti, int nr, int ntiles) {
    typedef gm_fmt<FMT> F;
    const int ubase = jl * F::UPS + ti * (F::CE / 8); /* the lane's first x unit */
    if (FMT == 0) {
        /* chunk = 4 words of 2 k; step 0 takes words 0 (slots 2t,2t+1) and 1 (2t+8,2t+9), step 1 words 2, 3 */
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            if (nt >= ntiles) break;
            const int row = min(nt * 8 + gi, nr - 1);
            const uint4 X = xs[row * rs + gm_swz(ubase)];
            gm_mma(acc[nt], r.w[0].x, r.w[1].x, r.w[0].y, r.w[1].y, X.x, X.y);
            gm_mma(acc[nt], r.w[0].z, r.w[1].z, r.w[0].w, r.w[1].w, X.z, X.w);
        }
    } else if (FMT == 1) {
        /* chunk = 4 words of 4 k; step w takes word w as pairs (k 4w, 4w+2) and (4w+1, 4w+3) */
        uint32_t A[2][4][2]; /* [row g / g+8][word = mma step][pair] */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            gm_fp8x4(r.w[h].x, A[h][0]);
            gm_fp8x4(r.w[h].y, A[h][1]);
            gm_fp8x4(r.w[h].z, A[h][2]);
            gm_fp8x4(r.w[h].w, A[h][3]);
        }
        const float sc = __uint_as_float(r.sc[0]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            if (nt >= ntiles) break;
            const int row = min(nt * 8 + gi, nr - 1);
            const uint4 X0 = xs[row * rs + gm_swz(ubase)], X1 = xs[row * rs + gm_swz(ubase + 1)];
            const uint32_t xw[8] = {X0.x, X0.y, X0.z, X0.w, X1.x, X1.y, X1.z, X1.w}; /* xw[i] = x k 2i, 2i+1 */
            float p[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int w = 0; w < 4; w++)
                gm_mma(p, A[0][w][0], A[1][w][0], A[0][w][1], A[1][w][1], __byte_perm(xw[2 * w], xw[2 * w + 1], 0x5410),
                       __byte_perm(xw[2 * w], xw[2 * w + 1], 0x7632));
#pragma unroll
            for (int i = 0; i < 4; i++) acc[nt][i] = fmaf(p[i], sc, acc[nt][i]);
        }
    } else {
        /* chunk = 4 words of 8 k; word q gives pairs (k 8q+i, 8q+i+4), i = 0..3; step 2q takes i = 0, 1
         * and step 2q+1 takes i = 2, 3. FMT 3 (MS_CU_GEMV_FP4=v2) decodes the same values with fewer
         * ALU instructions: both scale bytes of a row at once, the nibbles through gm_fp4x8_v2. */
        uint32_t s2[2][2]; /* FMT >= 3: [row g / g+8][16-k group] */
        if (FMT >= 3) gm_fp4_scales_v2(r, s2);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            uint32_t A[2][4];
            if (FMT >= 3) {
                gm_fp4_rows_v2(r, q, s2, A);
            } else {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint32_t sb = q < 2 ? (r.sc[h] & 0xffu) : (r.sc[h] >> 8); /* 16-k group q/2 */
                    gm_fp4x8(gm_word(r, h, q), gm_fp4_scale(sb), A[h]);
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                /* a pass has >= 1 n-tile: FMT 3 tests only the later ones (no branch at NT = 1, so the
                 * next word's decode can be scheduled across the mma) */
                if ((FMT < 3 || nt > 0) && nt >= ntiles) break;
                const int row = min(nt * 8 + gi, nr - 1);
                /* x k 8q..8q+7 (FMT >= 3: the same unit, spelled loop-invariantly) */
                const uint4 X = FMT >= 3 ? xs[row * rs + gm_xunit_v2(jl, ti, q)] : xs[row * rs + gm_swz(ubase + q)];
                if (FMT >= 3) { /* staged as (k 0,4), (1,5), (2,6), (3,7) already (gm_xpair) */
                    gm_mma(acc[nt], A[0][0], A[1][0], A[0][1], A[1][1], X.x, X.y);
                    gm_mma(acc[nt], A[0][2], A[1][2], A[0][3], A[1][3], X.z, X.w);
                } else {
                    gm_mma(acc[nt], A[0][0], A[1][0], A[0][1], A[1][1], __byte_perm(X.x, X.z, 0x5410),
                           __byte_perm(X.x, X.z, 0x7632));
                    gm_mma(acc[nt], A[0][2], A[1][2], A[0][3], A[1][3], __byte_perm(X.y, X.w, 0x5410),
                           __byte_perm(X.y, X.w, 0x7632));
                }
            }
        }
    }
}

/* nvfp4 v2 family (FMT >= 3): re-pairs the x units this thread staged for a slice (gm_stage's loop,
 * after its cp.async landed and before the barrier that publishes the slice) from k (0,1), (2,3),
 * (4,5), (6,7) to (0,4), (1,5), (2,6), (3,7), the pairs of gm_fp4x8's words: four PRMTs per unit
 * once per block instead of four per unit and n-tile in every warp that reads it. */
template <int FMT>
__device__ __forceinline__ void gm_xpair(uint4 *buf, int rs, int nsl, int nr) {
    typedef gm_fmt<FMT> F;
    const int upt = nsl * F::UPS;
    for (int i = threadIdx.x; i < nr * upt; i += blockDim.x) {
        const int j = i / upt, u = i - j * upt;
        uint4 *p = buf + j * rs + gm_swz(u);
        const uint4 v = *p;
        *p = make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632), __byte_perm(v.y, v.w, 0x5410),
                        __byte_perm(v.y, v.w, 0x7632));
    }
}


#endif
