/* gemv_mma.cu - the tensor-core form of the grouped small-batch product (decode): for each group (an
 * MoE expert, or one linear) y[r,:] = x_r · Wᵀ over the rows routed to it, gate/up fused in mode 1,
 * with the multiply-adds on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate) while the
 * weights stream from HBM in their checkpoint format (BF16, FP8 block-scaled, NVFP4) with 16-byte
 * loads and are dequantized in registers. Same contract as cu_gemv_grouped, which dispatches here.
 *
 * Layout. Weight rows are the MMA's M (an m-tile is 16 rows), tokens are N (an n-tile is 8 tokens;
 * a pass keeps up to NT n-tiles in registers so each weight byte is read once per pass), K is the
 * reduction. A dot product does not change under a permutation of k applied to both operands, so the
 * weights need no re-layout: for the A fragment a lane (g = lane>>2, t = lane&3) holds rows g and
 * g+8 at fragment columns {2t,2t+1,2t+8,2t+9}, and for the B fragment k {2t,2t+1,2t+8,2t+9} of
 * token g. Lane (g,t) loads one 16-byte chunk of row g and one of row g+8 at k offset
 * base + t*CE (CE = 8 bf16 / 16 fp8 / 32 nvfp4 elements) and the matching k range of its token's x;
 * the chunk's elements fill the lane's fragment slots of CE/4 consecutive mma k-steps. A warp's
 * "super-step" is one such chunk per lane: 4*CE k = 64 bytes of every weight row.
 *
 * Exactness. A holds the weights exactly (bf16 has 8 significant bits, fp32's exponent range):
 *   BF16: the weight bits themselves.
 *   FP8 E4M3: bits placed in a bf16 pattern give e4m3 * 2^-120 exactly (subnormals included); one
 *     fma.rn.bf16x2 by 2^120 (exact, subnormal inputs are supported by fma.bf16x2) gives the value.
 *     The 128x128 block scale is constant over a super-step (64 k inside one 128-k block; an m-tile's
 *     16 rows inside one 128-row block): each super-step's fp32 partial is folded in with one fma.
 *   NVFP4: nibbles placed in bf16 patterns give e2m1 * 2^-126 exactly (the 0.5 code is a bf16
 *     subnormal); one fma.rn.bf16x2 by the block scale s * 2^118 (e4m3 scale, 4 significant bits,
 *     exact in bf16, < 2^127) gives e2m1 * s / 256 exactly (at most 6 significant bits, >= 2^-18).
 *     The 256 and the per-tensor scale2 multiply the fp32 result at the end.
 * x stays bf16 (no range assumption); bf16 x bf16 products are exact in fp32 and the tensor core
 * accumulates them in fp32, like the CPU reference up to summation order and rounding.
 *
 * Data movement. The block stages its pass's token rows of x in shared memory with cp.async (16-byte
 * units, zero-filled past K, swizzled so a quarter-warp's 16-byte reads hit distinct banks); when all
 * of K does not fit, K is cut into slices staged double-buffered (the next slice copies while the
 * current one computes). Each warp owns one m-tile of one weight (gate or up in mode 1) and a share
 * of the super-steps (ksplit warps split K); the S x ksplit fp32 partials of an m-tile are summed in
 * shared memory in a fixed order by one warp, which applies silu(gate) * up in mode 1. A warp's
 * weight loads run two super-steps ahead of its math, in registers. */
#include "backend/cuda/cuda_internal.cuh"

#include <string.h>

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
 * between SHF and IMAD.SHL). */
__device__ __forceinline__ void gm_fp4x8_v2(uint32_t w, uint32_t s2, uint32_t (&o)[4]) {
    const uint32_t MS = 0x81C081C0u; /* magnitude at bits 8..6, sign at 15, in each half */
    const uint32_t w2 = w >> 8;
    o[0] = gm_bmul2(((w & 0x000F000Fu) * 0x1040u) & MS, s2);
    o[1] = gm_bmul2(((w & 0x00F000F0u) * 0x104u) & MS, s2);
    o[2] = gm_bmul2(((w2 & 0x000F000Fu) * 0x1040u) & MS, s2);
    o[3] = gm_bmul2(((w2 & 0x00F000F0u) * 0x104u) & MS, s2);
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

/* ---- kernel ---- */

struct gm_args : cu_gemv_kargs { /* w1: the up weight of the single form (w0 when the call has none) */
    /* warps per block = rw * S * ksplit: rw m-tiles, each computed by S (gate/up) x ksplit (K share)
     * warps whose fp32 partials meet in shared memory */
    int ksplit, rw;
    int ntok;   /* tokens per pass (<= NT * 8) */
    int xbytes; /* shared memory for x staging (the reduction reuses the same memory) */
    int ring;   /* FMT 5: byte offset of the warps' weight rings in shared memory */
};

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
    static __device__ __forceinline__ int rstride(int nsl) { return ((nsl * UPS + 7) & ~7) + PAD; }
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
__device__ __forceinline__ void gm_ring_put(uint8_t *st, const uint8_t *const (&wrow)[2], const void *const (&srow)[2],
                                            int j, int gi, int ti, int lane) {
#pragma unroll
    for (int h = 0; h < 2; h++) gm_cp16(st + h * 512 + lane * 16, wrow[h] + (size_t)j * 64 + ti * 16, 16);
    if (ti == 0) {
#pragma unroll
        for (int h = 0; h < 2; h++) gm_cp8(st + 1024 + h * 64 + gi * 8, (const uint8_t *)srow[h] + (size_t)j * 8);
    }
}
__device__ __forceinline__ void gm_ring_get(gm_raw &r, const uint8_t *st, int gi, int ti, int lane) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        r.w[h] = *(const uint4 *)(st + h * 512 + lane * 16);
        r.sc[h] = *(const unsigned short *)(st + 1024 + h * 64 + gi * 8 + ti * 2);
    }
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
        if (FMT >= 3) {
#pragma unroll
            for (int h = 0; h < 2; h++) gm_fp4_scale2(r.sc[h], s2[h][0], s2[h][1]);
        }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            uint32_t A[2][4];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t wq = q == 0 ? r.w[h].x : q == 1 ? r.w[h].y : q == 2 ? r.w[h].z : r.w[h].w;
                if (FMT >= 3) {
                    gm_fp4x8_v2(wq, s2[h][q >> 1], A[h]);
                } else {
                    const uint32_t sb = q < 2 ? (r.sc[h] & 0xffu) : (r.sc[h] >> 8); /* 16-k group q/2 */
                    gm_fp4x8(wq, gm_fp4_scale(sb), A[h]);
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                /* a pass has >= 1 n-tile: FMT 3 tests only the later ones (no branch at NT = 1, so the
                 * next word's decode can be scheduled across the mma) */
                if ((FMT < 3 || nt > 0) && nt >= ntiles) break;
                const int row = min(nt * 8 + gi, nr - 1);
                /* x k 8q..8q+7. FMT >= 3 spells gm_swz(ubase + q) so that the lane's part is loop
                 * invariant: with c = 4 ti + q < 16, gm_swz(16 jl + c) = 16 jl + (c ^ (c >> 3) ^ 2 (jl & 1)) */
                const int c = 4 * ti + q;
                const uint4 X = FMT >= 3 ? xs[row * rs + jl * 16 + ((c ^ (c >> 3)) ^ ((jl & 1) << 1))]
                                         : xs[row * rs + gm_swz(ubase + q)];
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

/* Copies the pass's x rows, super-steps [s0, s0+nsl), into buf (row stride rs units), 16-byte units
 * at or past K zero-filled. One cp.async group per thread. */
template <int FMT>
__device__ __forceinline__ void gm_stage(const gm_args &a, uint4 *buf, int rs, int s0, int nsl, int rbase, int nr) {
    typedef gm_fmt<FMT> F;
    const int upt = nsl * F::UPS, K = a.K;
    for (int i = threadIdx.x; i < nr * upt; i += blockDim.x) {
        const int j = i / upt, u = i - j * upt;
        const int r = rbase + j;
        const int xrow = a.row_idx ? a.row_idx[r] : r;
        const int k = (s0 * F::UPS + u) * 8;
        const bf16 *src = a.x + (size_t)xrow * K + (k < K ? k : 0);
        gm_cp16(buf + j * rs + gm_swz(u), src, k < K ? 16 : 0);
    }
    gm_cp_commit();
}

/* MS_CU_GEMV_FP4=v2o and v3 (FMT 4, 5) ask ptxas for <= 85 registers (3 blocks of 256 threads, 24 warps
 * per SM, instead of 2 blocks at ~120 registers): more loads in flight per SM for a few spills outside
 * the loop (FMT 5 needs ~106 registers unbounded, 80 bounded, with the same loop). */
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

template <int FMT, int MODE, int NT>
__global__ __launch_bounds__(256, FMT >= 4 ? 3 : 1) void k_gmma(gm_args a) {
    cu_pdl_wait();
    cu_pdl_trigger();
    extern __shared__ uint4 gm_smem[];
    typedef gm_fmt<FMT> F;
    constexpr int S = MODE == 1 ? 2 : 1;
    const int g = blockIdx.x;
    if (a.n_active && g >= *a.n_active) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, ti = lane & 3;
    const int ksplit = a.ksplit, rwi = warp % a.rw, sk = warp / a.rw; /* sk = stream * ksplit + ks */
    const int stream = sk / ksplit, ks = sk - stream * ksplit;
    cu_wdesc W;
    int off = 0, cnt = a.rows_total;
    if (a.W0) {
        const int wid = a.group_w ? a.group_w[g] : g;
        W = MODE == 1 && stream ? a.W1[wid] : a.W0[wid];
        off = a.row_off[wid];
        cnt = a.row_cnt[wid];
    } else {
        W = MODE == 1 && stream ? a.w1 : a.w0;
    }
    if (cnt <= 0) return; /* block-uniform: before any barrier */
    const int K = a.K, N = a.N;
    const int m0 = (blockIdx.y * a.rw + rwi) * 16;
    const bool active = m0 < N; /* warp-uniform; idle warps still stage x and meet the barriers */
    const int nss = (K + F::SS - 1) / F::SS;

    const uint8_t *wrow[2];
    const void *srow[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const size_t n = (size_t)min(m0 + gi + 8 * h, N - 1); /* clamped rows are computed, not stored */
        if (FMT == 0) {
            wrow[h] = (const uint8_t *)W.w + n * (size_t)K * 2;
            srow[h] = NULL;
        } else if (FMT == 1) {
            wrow[h] = (const uint8_t *)W.w + n * (size_t)K;
            srow[h] = (const float *)W.scale + (size_t)(min(m0, N - 1) / 128) * W.scale_ld; /* 16 | 128 */
        } else {
            wrow[h] = (const uint8_t *)W.w + n * (size_t)(K / 2);
            srow[h] = (const uint8_t *)W.scale + n * (size_t)(K / 16);
        }
    }

    for (int r0 = 0; r0 < cnt; r0 += a.ntok) {
        const int nr = min(a.ntok, cnt - r0), ntiles = (nr + 7) >> 3;
        /* K slicing: one slice when all of K fits, else double-buffered slices of sps super-steps (a
         * multiple of 2 * ksplit so every warp's two load buffers stay in step across slices; the host
         * guarantees sps >= 2 * ksplit) */
        int sps = nss, rs = F::rstride(nss), half = 0;
        if (nr * rs * 16 > a.xbytes) {
            const int per = (a.xbytes / 2) / 16 / nr - F::PAD;
            sps = per / F::UPS;
            sps -= sps % (2 * ksplit); /* even, so sps * UPS is a multiple of 8 */
            rs = F::rstride(sps);
            half = (a.xbytes / 2) / 16;
        }
        const int nslices = (nss + sps - 1) / sps;

        float acc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[nt][i] = 0.f;
        gm_raw ra, rb; /* super-steps j and j + ksplit; loads run two super-steps ahead of the math */
        uint8_t *ring = (uint8_t *)gm_smem + a.ring + (size_t)warp * GM_D * GM_STG; /* FMT 5 */
        if (active && FMT != 5) {
            gm_load<FMT>(ra, wrow, srow, ks, nss, K, ti);
            gm_load<FMT>(rb, wrow, srow, ks + ksplit, nss, K, ti);
        }
        if (r0 > 0) __syncthreads(); /* the previous pass is done with shared memory */
        if (FMT == 5 && active) { /* stages 0 .. GM_D - 2; the slice's wait below lands them */
#pragma unroll
            for (int p = 0; p < GM_D - 1; p++) {
                if (ks + p * ksplit < nss) gm_ring_put(ring + p * GM_STG, wrow, srow, ks + p * ksplit, gi, ti, lane);
                gm_cp_commit();
            }
        }
        gm_stage<FMT>(a, gm_smem, rs, 0, min(sps, nss), off + r0, nr);
        for (int sl = 0; sl < nslices; sl++) {
            gm_cp_wait_all();
            if (FMT >= 3) gm_xpair<FMT>(gm_smem + (sl & 1) * half, rs, min(sps, nss - sl * sps), nr);
            __syncthreads(); /* slice sl visible; every warp is past slice sl-1, whose buffer is refilled next */
            if (sl + 1 < nslices) {
                const int t0 = (sl + 1) * sps;
                gm_stage<FMT>(a, gm_smem + ((sl + 1) & 1) * half, rs, t0, min(sps, nss - t0), off + r0, nr);
            }
            const uint4 *xs = gm_smem + (sl & 1) * half;
            const int s0 = sl * sps, s1 = min(s0 + sps, nss);
            if (active && FMT == 5) { /* one slice (host): s0 = 0, s1 = nss */
                int i = 0; /* the warp's super-step count; stage i % GM_D */
                for (int j = ks; j < s1; j += ksplit, i++) {
                    gm_cp_wait<GM_D - 2>(); /* this lane's copies of super-step i landed */
                    __syncwarp();           /* ... and every lane's (scales); all lanes are past i - 1 */
                    gm_raw cur;
                    gm_ring_get(cur, ring + (i % GM_D) * GM_STG, gi, ti, lane);
                    const int jn = j + (GM_D - 1) * ksplit; /* into stage (i - 1) % GM_D, read at i - 1 */
                    if (jn < nss) gm_ring_put(ring + ((i + GM_D - 1) % GM_D) * GM_STG, wrow, srow, jn, gi, ti, lane);
                    gm_cp_commit();
                    gm_step<FMT, NT>(acc, cur, xs, rs, j, gi, ti, nr, ntiles);
                }
            } else if (active) {
                for (int j = s0 + ks; j < s1; j += 2 * ksplit) {
                    {
                        const gm_raw cur = ra;
                        gm_load<FMT>(ra, wrow, srow, j + 2 * ksplit, nss, K, ti);
                        gm_step<FMT, NT>(acc, cur, xs, rs, j - s0, gi, ti, nr, ntiles);
                    }
                    if (j + ksplit < s1) {
                        const gm_raw cur = rb;
                        gm_load<FMT>(rb, wrow, srow, j + 3 * ksplit, nss, K, ti);
                        gm_step<FMT, NT>(acc, cur, xs, rs, j + ksplit - s0, gi, ti, nr, ntiles);
                    }
                }
            }
        }
        if (FMT == 5) gm_cp_wait_all(); /* no ring copy outlives the pass */
        /* the S * ksplit partials of an m-tile meet in warp (stream 0, ks 0), summed in a fixed order */
        float up[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) up[nt][i] = 0.f;
        const int nsk = S * ksplit;
        if (nsk > 1) {
            float *red = (float *)gm_smem;
            __syncthreads(); /* all x reads done */
            if (active && sk > 0) {
                float *dst = red + (size_t)(rwi * (nsk - 1) + sk - 1) * (NT * 4 * 32) + lane;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) dst[(nt * 4 + i) * 32] = acc[nt][i];
            }
            __syncthreads();
            if (active && sk == 0) {
                for (int k2 = 1; k2 < nsk; k2++) {
                    const float *src = red + (size_t)(rwi * (nsk - 1) + k2 - 1) * (NT * 4 * 32) + lane;
                    const bool is_up = k2 >= ksplit; /* stream 1 */
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            const float v = src[(nt * 4 + i) * 32];
                            if (is_up) up[nt][i] += v;
                            else acc[nt][i] += v;
                        }
                }
            }
        }
        if (active && sk == 0) {
            /* post-scale: nvfp4 256 * scale2 of each stream (2^-8 was folded into A) */
            float post0 = 1.f, post1 = 1.f;
            if (FMT >= 2) {
                post0 = 256.f * W.scale2;
                if (MODE == 1) post1 = 256.f * (a.W0 ? a.W1[a.group_w ? a.group_w[g] : g].scale2 : a.w1.scale2);
            }
            /* C fragment: c0 (row g, token 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1) */
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                if (nt >= ntiles) break;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int tok = nt * 8 + 2 * ti + (i & 1), n = m0 + gi + 8 * (i >> 1);
                    if (tok >= nr || n >= N) continue;
                    const size_t yi = (size_t)(off + r0 + tok) * a.ldy + n;
                    const float v0 = acc[nt][i] * post0 + (MODE == 0 && a.bias ? a.bias[n] : 0.f);
                    if (MODE == 1) ((bf16 *)a.y)[yi] = __float2bfloat16_rn(cu_silu(v0) * (up[nt][i] * post1));
                    else cu_st(a.y, a.y_type, yi, v0);
                }
            }
        }
    }
}

/* ---- host side ---- */

/* MS_CU_GEMV (knobs.c, read once): "mma" (default) or "gv2" (the CUDA-core kernels of quant.cu, and
 * cuBLASLt for plain bf16 linears, i.e. the behaviour before this kernel). */
static int gm_enabled(void) { return cu_knob(CU_KNOB_GEMV) == CU_GEMV_MMA; }

/* Warps per SM the launch aims at by splitting K (MS_CU_GEMV_WARPS_PER_SM, knobs.c; default 48). */
static int gm_warps_per_sm(void) { return cu_knob(CU_KNOB_GEMV_WARPS_PER_SM); }

static int gm_fmt_of(const cu_wdesc *w) {
    if (w->fmt == MS_WFMT_PLAIN && w->dtype == MS_BF16 && w->k % 8 == 0) return 0;
    if (w->fmt == MS_WFMT_FP8 && w->k % 16 == 0) return 1;
    if (w->fmt == MS_WFMT_NVFP4 && w->k % 32 == 0) return 2;
    return -1;
}

/* Contract in cuda_internal.cuh. Device-table weights cannot be inspected here; w (expert 0) stands
 * for their format and shape. */
int cu_gemv_mma_usable(const ms_backend *b, const cu_wdesc *w, const void *x, int single) {
    if (!gm_enabled() || b->gpu.cc_major < 8 || w->n <= 0 || w->k <= 0 || (w->n + 15) / 16 > 65535) return 0;
    if (gm_fmt_of(w) < 0 || ((uintptr_t)x & 15)) return 0;
    if (single && (((uintptr_t)w->w & 15) || (w->fmt == MS_WFMT_NVFP4 && ((uintptr_t)w->scale & 1)))) return 0;
    return 1;
}

template <int F, int M, int NT>
static cudaError_t gm_launch(dim3 grid, int threads, size_t smem, cudaStream_t st, const gm_args &a) {
    if (smem > 48 * 1024) {
        cudaError_t ce = cudaFuncSetAttribute(k_gmma<F, M, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (ce != cudaSuccess) return ce;
    }
    return cu_launch(k_gmma<F, M, NT>, grid, threads, smem, st, a);
}

template <int F, int M>
static cudaError_t gm_launch_nt(int nt, dim3 grid, int threads, size_t smem, cudaStream_t st, const gm_args &a) {
    switch (nt) {
    case 1: return gm_launch<F, M, 1>(grid, threads, smem, st, a);
    case 2: return gm_launch<F, M, 2>(grid, threads, smem, st, a);
    default:
        if constexpr (M == 0) return gm_launch<F, M, 4>(grid, threads, smem, st, a);
        else return cudaErrorInvalidValue; /* mode 1 has device tables: at most 2 n-tiles per pass */
    }
}

/* Contract in cuda_internal.cuh. Launch shape. Tokens per pass: a single group gets up to 32 (rows_total is exact); with the
 * device tables rows_total only bounds one group's rows and a decode expert usually has a few, so
 * passes take 8 (hint <= 8) or 16 tokens and busier experts take more passes. Warps: one per
 * (m-tile, stream, K share); ksplit grows while the grid has fewer than 48 warps per SM, every warp
 * keeps >= 4 super-steps and a block stays <= 8 warps. Shared memory: 12 KB per warp at most for x
 * (4 warps -> 48 KB: 4 blocks per SM), sliced along K when the pass's tokens need more. */
int cu_gemv_mma(ms_backend *b, const cu_gemv_call *c, ms_err *err) {
    const int mode = c->mode, n_groups = c->n_groups, rows_total = c->rows_total;
    if (n_groups <= 0) return MS_OK;
    MS_ASSERT(mode == 0 || c->W0 || c->w1.w); /* gate/up fusion: device tables, or the single pair */
    MS_ASSERT(!c->bias || (mode == 0 && !c->W0));
    const int single = c->W0 == NULL;
    if (single && rows_total <= 0) return MS_OK;
    const int f = gm_fmt_of(&c->w0);
    MS_ASSERT(f >= 0);
    int fp4 = cu_knob(CU_KNOB_GEMV_FP4);
    if (fp4 == CU_GEMV_FP4_W8) { /* one token of NVFP4 on sm_90a: FP8 wgmma */
        int launched = 0, rc = cu_gemv_w8(b, c, &launched, err);
        if (rc != MS_OK || launched) return rc;
    }
    gm_args a;
    memset(&a, 0, sizeof a);
    cu_kargs_set(a, *c);
    if (!c->w1.w) a.w1 = c->w0;

    const int hint = rows_total > 0 ? rows_total : 8;
    int nt;
    if (single && mode == 0) nt = hint <= 8 ? 1 : hint <= 16 ? 2 : 4;
    else nt = hint <= 8 ? 1 : 2;
    a.ntok = hint < nt * 8 ? hint : nt * 8;

    static const int UPS[3] = {4, 8, 16}, PAD[3] = {4, 1, 2};
    const int ups = UPS[f], pad = PAD[f], S = mode == 1 ? 2 : 1;
    const int nss = (a.K + ups * 8 - 1) / (ups * 8);
    const int mrows = (a.N + 15) / 16;
    const int64_t mt = (int64_t)n_groups * mrows;
    const int nsm = b->gpu.n_sm > 0 ? b->gpu.n_sm : 132;
    int optin = cu_of(b)->max_smem_optin;
    if (optin <= 0) optin = 48 * 1024;
    const int64_t units = mt * S; /* warps without a K split */
    int ksplit = 1;
    while (S * ksplit * 2 <= 8 && units * ksplit < (int64_t)nsm * gm_warps_per_sm() && nss >= 8 * ksplit) ksplit *= 2;
    const int64_t full = (int64_t)a.ntok * (((nss * ups + 7) & ~7) + pad) * 16; /* gm_fmt::rstride */
    int nw, cap;
    for (;;) { /* sliced staging needs two buffers of >= 2 * ksplit super-steps for every token */
        nw = S * ksplit > 4 ? S * ksplit : 4;
        cap = 12 * 1024 * nw < optin ? 12 * 1024 * nw : optin;
        if (full <= cap || ksplit == 1 || (int64_t)a.ntok * (2 * ksplit * ups + pad) * 16 <= cap / 2) break;
        ksplit /= 2;
    }
    if (full > cap && (int64_t)a.ntok * (2 * ups + pad) * 16 > cap / 2)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "gemv_mma: %d tokens of K=%d do not fit %d bytes of shared memory",
                       a.ntok, a.K, cap);
    const int nsk = S * ksplit;
    a.ksplit = ksplit;
    a.rw = nw / nsk;
    a.xbytes = full <= cap ? (int)full : cap;
    const size_t red = nsk > 1 ? (size_t)(nsk - 1) * a.rw * nt * 4 * 32 * sizeof(float) : 0;
    size_t smem = (size_t)a.xbytes > red ? (size_t)a.xbytes : red;
    /* nvfp4 v3 (FMT 5) when x fits in one slice, scale rows are 8-byte aligned (K % 128 == 0; device
     * tables are taken to follow their expert 0) and the rings fit next to the staging */
    /* auto: few groups leave most SMs waiting on memory latency, where v3's deeper prefetch pays;
     * many groups fill the GPU and v2's lighter loop wins (measured on the H200, knobs.c) */
    if (fp4 == CU_GEMV_FP4_AUTO || fp4 == CU_GEMV_FP4_W8) fp4 = n_groups <= 16 ? CU_GEMV_FP4_V3 : CU_GEMV_FP4_V2;
    if (f == 2 && fp4 == CU_GEMV_FP4_V3) {
        const size_t ring = (smem + 15) & ~(size_t)15, need = ring + (size_t)nw * GM_D * GM_STG;
        if (full <= cap && a.K % 128 == 0 && need <= (size_t)optin &&
            (!single || ((uintptr_t)c->w0.scale & 7) == 0)) {
            a.ring = (int)ring;
            smem = need;
        } else {
            fp4 = CU_GEMV_FP4_V2;
        }
    }
    if (smem > (size_t)optin)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "gemv_mma: %zu bytes of shared memory exceed the device's %d", smem,
                       optin);
    const int gy = (mrows + a.rw - 1) / a.rw;
    if (gy > 65535)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "gemv_mma: N=%d gives %d row blocks (limit 65535)", a.N, gy);
    dim3 grid(n_groups, gy);
    cudaStream_t st = cu_of(b)->stream;
    cudaError_t ce;
#define GM_L(F, M) ce = gm_launch_nt<F, M>(nt, grid, nw * 32, smem, st, a)
    /* nvfp4 (MS_CU_GEMV_FP4, knobs.c): v1 = FMT 2, v2 = FMT 3, v2o = FMT 4, v3 = FMT 5 */
    if (mode == 0) {
        switch (f) {
        case 0: GM_L(0, 0); break;
        case 1: GM_L(1, 0); break;
        default:
            if (fp4 == CU_GEMV_FP4_V1) GM_L(2, 0);
            else if (fp4 == CU_GEMV_FP4_V2O) GM_L(4, 0);
            else if (fp4 == CU_GEMV_FP4_V3) GM_L(5, 0);
            else GM_L(3, 0);
        }
    } else {
        switch (f) {
        case 0: GM_L(0, 1); break;
        case 1: GM_L(1, 1); break;
        default:
            if (fp4 == CU_GEMV_FP4_V1) GM_L(2, 1);
            else if (fp4 == CU_GEMV_FP4_V2O) GM_L(4, 1);
            else if (fp4 == CU_GEMV_FP4_V3) GM_L(5, 1);
            else GM_L(3, 1);
        }
    }
#undef GM_L
    CK(ce);
    return MS_OK;
}
