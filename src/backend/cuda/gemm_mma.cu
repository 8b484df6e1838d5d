/* gemm_mma.cu - the grouped tensor-core GEMM of MoE prefill: for every expert group, y = x·Wᵀ with the
 * weight in its checkpoint format (bf16; FP8 E4M3 with 128x128 fp32 block scales; NVFP4 E2M1 with E4M3
 * block-16 scales and an fp32 global scale), mode 1 computing gate and up together and writing
 * silu(gate)*up. It is the fast path of cu_gemm_grouped (quant.cu), which keeps k_gg for what this file
 * does not cover (cu_gemm_grouped_mma says what). Two kernels: k_gm (mma.sync, described first, every
 * format on sm_80+) and k_gw (wgmma, FP8 and NVFP4 on sm_90; its own comment further down).
 *
 * Work split. The launch enumerates 64-row tiles (CU_GG_BM, tile_off from permute.cu) in grid y and
 * weight-column blocks in grid x (x fastest, so the blocks that share an activation tile run together
 * and read it from L2). A block takes an even tile of its group together with the odd tile after it:
 * 128 rows (odd-tile blocks exit at once), so each dequantized weight element serves up to 128 rows.
 * Columns per block: mode 0, 256 of W0; mode 1, the same 128 columns of W0 (gate) and W1 (up), so the
 * epilogue has both halves of silu(g)*u in one thread. The weight tile is 256 rows (of W) x 64 k either way.
 * 8 warps: with more than 64 rows a warp computes 64 rows x 64 weight rows (2 x 4 warps; mode 1: 32 gate +
 * the same 32 up columns); with 64 rows or fewer (the group's last pair is a single tile) the block
 * switches, block-uniformly, to 64 rows x 32 weight rows per warp (1 x 8) so no warp idles on empty rows.
 *
 * Pipeline, per 64-wide k-step (one __syncthreads each): the activation tile arrives by 16-byte cp.async,
 * three stages (rows past the group's count and k past K are zero-filled, never read). bf16 weights do
 * the same (three stages). FP8/NVFP4 weights go through registers: each thread owns one weight row of the
 * tile and holds the raw bytes of the step after next; while the warps run the MMAs of step s, every
 * thread decodes its staged bytes of step s+1 into the other of two bf16 shared buffers, a quarter
 * (16 k) after each of the four k16 MMA sub-steps so integer work and tensor work interleave, and
 * re-fills the consumed registers with step s+2's bytes (about one k-step of latency to hide).
 *
 * Math: mma.sync m16n8k16 bf16 -> fp32 (fragment layouts and ldmatrix in cuda_internal.cuh). A fragments
 * by ldmatrix.x4 from the row-major activation tile; B[k][n] = W[n][k] is a weight row in shared memory,
 * so plain ldmatrix.x4 (matrices: n 0-7/k 0-7, n 0-7/k 8-15, n 8-15/k 0-7, n 8-15/k 8-15) yields the B
 * fragments of two 8-column n-tiles. Shared rows are 64 + 8 elements (144 bytes): the 8 row addresses of
 * an ldmatrix, and the 16-byte stores of 8 consecutive threads, fall in 8 distinct bank groups.
 *
 * Exactness: every weight value is __float2bfloat16_rn of what cu_deq computes (k_gg's rounding):
 * FP8 = bf16(e4m3 * s) with one fp32 multiply as k_gg; NVFP4 = bf16(e2m1 * (e4m3(scale) * scale2)), taken
 * from an 8-entry table per 16-element block: the 8 magnitudes times the block scale, each multiplied in
 * fp32 and rounded to bf16 once, looked up by byte permutes (prmt) on the 3-bit magnitude codes; the sign
 * bit of a code flips the sign of the bf16 (exact: round-to-nearest-even is symmetric). */
#include "backend/cuda/cuda_internal.cuh"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GM_BM (2 * CU_GG_BM)      /* rows per block: an even tile of a group and the odd one after it */
#define GM_BK 64                  /* k per pipeline step */
#define GM_ROWB ((GM_BK + 8) * 2) /* shared row stride in bytes */
#define GM_THREADS 256
#define GM_BR 256 /* weight rows per block tile (mode 1: 128 of W0, then the same 128 of W1) */
#define GM_A_STAGE (GM_BM * GM_ROWB)
#define GM_B_STAGE (GM_BR * GM_ROWB)
#define GM_A_STAGES 3

/* Dynamic shared memory of a block: 3 activation stages, 3 (bf16) or 2 (decoded) weight stages. */
static size_t gm_smem_bytes(int fmt) {
    return (size_t)GM_A_STAGES * GM_A_STAGE + (size_t)(fmt == 0 ? 3 : 2) * GM_B_STAGE;
}

struct gm_args : cu_gg_kargs {
    int pair_st; /* y takes 2-element stores (F32/BF16, even ldy, aligned base) */
};

/* ---- exact decoders (bf16 pairs, lower k in the low half) ---- */

/* prmt.b32 (generic mode): byte i of the result is byte (sel nibble i & 7) of {b, a}, or that byte's sign
 * replicated when the nibble's bit 3 is set. */
__device__ __forceinline__ uint32_t gm_prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

/* bf16(e2m1(m) * bs) for the magnitude codes m = 0..7, as byte tables: lo0/lo1 hold the low bytes of
 * m = 0-3 / 4-7, hi0/hi1 the high bytes (so {lo1, lo0} is an 8-byte table indexed by m). */
struct gm_lut {
    uint32_t lo0, lo1, hi0, hi1;
};
__device__ __forceinline__ gm_lut gm_nvfp4_lut(float bs) {
    uint32_t p[4];
#pragma unroll
    for (int q = 0; q < 4; q++)
        p[q] = cu_pack_bf16(__fmul_rn(e2m1_fast(2u * q), bs), __fmul_rn(e2m1_fast(2u * q + 1u), bs));
    gm_lut t;
    t.lo0 = gm_prmt(p[0], p[1], 0x6420u);
    t.hi0 = gm_prmt(p[0], p[1], 0x7531u);
    t.lo1 = gm_prmt(p[2], p[3], 0x6420u);
    t.hi1 = gm_prmt(p[2], p[3], 0x7531u);
    return t;
}
/* Eight E2M1 codes (nibble i of w = element i) -> out[0..3]. Per half-word: the masked codes select low and
 * high bytes from the tables; a sign-replicating prmt turns each code's bit 3 into 0xff/0x00 per byte
 * (element 2i's sign is the msb of byte i of w << 4, element 2i+1's the msb of byte i of w), whose msb
 * flips the sign of the high byte; two more prmts interleave low and high bytes into bf16 pairs. */
__device__ __forceinline__ void gm_nvfp4_dec8(uint32_t w, const gm_lut &t, uint32_t *out) {
    const uint32_t w4 = w << 4;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint32_t sel = (h ? w >> 16 : w) & 0x7777u;
        const uint32_t lo = gm_prmt(t.lo0, t.lo1, sel);
        const uint32_t sg = gm_prmt(w, w4, h ? 0xBFAEu : 0x9D8Cu);
        const uint32_t hi = gm_prmt(t.hi0, t.hi1, sel) ^ (sg & 0x80808080u);
        out[2 * h] = gm_prmt(lo, hi, 0x5140u);
        out[2 * h + 1] = gm_prmt(lo, hi, 0x7362u);
    }
}
/* Four E4M3 bytes (byte i = element i) times the block scale s -> out[0..1]. */
__device__ __forceinline__ void gm_fp8_dec4(uint32_t w, float s, uint32_t *out) {
    out[0] = cu_pack_bf16(__fmul_rn(e4m3_fast(w & 0xffu), s), __fmul_rn(e4m3_fast((w >> 8) & 0xffu), s));
    out[1] = cu_pack_bf16(__fmul_rn(e4m3_fast((w >> 16) & 0xffu), s), __fmul_rn(e4m3_fast(w >> 24), s));
}
/* ---- end of the decoders ---- */

/* Stores y[i], y[i+1] (columns col, col+1; those >= N are skipped). */
__device__ __forceinline__ void gm_store2(const gm_args &a, size_t i, int col, float v0, float v1, int yt) {
    if (a.pair_st && col + 1 < a.N) {
        if (yt == MS_F32) *(float2 *)((float *)a.y + i) = make_float2(v0, v1);
        else *(__nv_bfloat162 *)((bf16 *)a.y + i) = __floats2bfloat162_rn(v0, v1);
    } else {
        if (col < a.N) cu_st(a.y, yt, i, v0);
        if (col + 1 < a.N) cu_st(a.y, yt, i + 1, v1);
    }
}

/* One block: rows [rbase, rbase + rows) of x (rows <= 128; NT = 4 when rows <= 64, see the header) times
 * the block's weight columns; FMT 0 bf16, 1 FP8, 2 NVFP4. sm: the dynamic shared memory. */
template <int FMT, int MODE, int NT>
__device__ __forceinline__ void gm_block(const gm_args &a, const cu_wdesc &W0, const cu_wdesc &W1, int rbase,
                                         int rows, unsigned char *sm) {
    constexpr int MR = NT == 8 ? GM_BM : CU_GG_BM; /* activation rows loaded and computed */
    constexpr int HN = NT / 2;                     /* n8-tile pairs per k16; mode 1: gate tiles per warp */
    constexpr int B_OFF = GM_A_STAGES * GM_A_STAGE; /* first weight stage, bytes from sm */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int K = a.K, N = a.N, nk = (K + GM_BK - 1) / GM_BK;
    const int n0 = blockIdx.x * (MODE == 1 ? GM_BR / 2 : GM_BR);
    const uint32_t s0 = cu_saddr(sm);
    const int wm = NT == 8 ? (warp >> 2) * 64 : 0; /* warp's first row */
    const int wn = NT == 8 ? (warp & 3) : warp;    /* warp's column group */
    /* ldmatrix lane offsets in a stage: A rows wm + lane%16, k + 8*(lane/16); B (weight) rows
     * lane%8 + 8*(lane/16), k + 8*((lane/8)%2) */
    const uint32_t a_off = (uint32_t)((wm + (lane & 15)) * GM_ROWB + (lane >> 4) * 16);
    const uint32_t b_off = (uint32_t)(((lane >> 4) * 8 + (lane & 7)) * GM_ROWB + ((lane >> 3) & 1) * 16);
    const int ld_r = tid >> 3, ld_c = tid & 7; /* cp.async: rows ld_r + 32q, 16-byte column ld_c */

    float acc[4][NT][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;

    auto load_a = [&](int st, int s) {
        const int k = s * GM_BK + ld_c * 8;
#pragma unroll
        for (int q = 0; q < MR / 32; q++) {
            const int r = ld_r + 32 * q;
            const bool ok = r < rows && k < K;
            const bf16 *src = a.x + (size_t)(rbase + (ok ? r : 0)) * K + (ok ? k : 0);
            cu_cp16(s0 + st * GM_A_STAGE + r * GM_ROWB + ld_c * 16, src, ok);
        }
    };
    /* MMAs of k16 sub-step kk on activation stage sa and weight stage sb */
    auto mma_step = [&](int sa, int sb, int kk) {
        const uint32_t ab = s0 + sa * GM_A_STAGE + a_off + kk * 32;
        const uint32_t bb = s0 + B_OFF + sb * GM_B_STAGE + b_off + kk * 32;
        uint32_t af[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++) cu_ldsm4(af[i], ab + i * 16 * GM_ROWB);
#pragma unroll
        for (int p = 0; p < HN; p++) {
            const int j = 2 * p; /* n8 tiles j, j+1: weight rows brow .. brow+15 of the tile */
            const int brow = MODE == 0 ? wn * NT * 8 + 8 * j : (j / HN) * (GM_BR / 2) + wn * HN * 8 + 8 * (j % HN);
            uint32_t bf[4];
            cu_ldsm4(bf, bb + brow * GM_ROWB);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                cu_mma_bf16(acc[i][j], af[i], bf[0], bf[1]);
                cu_mma_bf16(acc[i][j + 1], af[i], bf[2], bf[3]);
            }
        }
    };

    if constexpr (FMT == 0) {
        const bf16 *w0p = (const bf16 *)W0.w, *w1p = (const bf16 *)W1.w;
        auto load_b = [&](int st, int s) {
            const int k = s * GM_BK + ld_c * 8;
#pragma unroll
            for (int q = 0; q < GM_BR / 32; q++) {
                const int r = ld_r + 32 * q;
                const bf16 *wp = (MODE == 1 && r >= GM_BR / 2) ? w1p : w0p;
                const int n = n0 + (MODE == 1 ? (r & (GM_BR / 2 - 1)) : r);
                const bool ok = n < N && k < K;
                cu_cp16(s0 + B_OFF + st * GM_B_STAGE + r * GM_ROWB + ld_c * 16, wp + (ok ? (size_t)n * K + k : 0), ok);
            }
        };
        load_a(0, 0);
        load_b(0, 0);
        cu_cp_commit();
        if (nk > 1) {
            load_a(1, 1);
            load_b(1, 1);
        }
        cu_cp_commit();
        cu_cp_wait<1>();
        __syncthreads();
        int st = 0;
        for (int ks = 0; ks < nk; ks++) {
            const int st2 = st == 0 ? 2 : st - 1; /* (st + 2) % 3: read in step ks-1, free after its barrier */
            if (ks + 2 < nk) {
                load_a(st2, ks + 2);
                load_b(st2, ks + 2);
            }
            cu_cp_commit();
#pragma unroll
            for (int kk = 0; kk < GM_BK / 16; kk++) mma_step(st, st, kk);
            cu_cp_wait<1>(); /* step ks+1 landed (this thread's copies); the barrier publishes everyone's */
            __syncthreads();
            st = st == 2 ? 0 : st + 1;
        }
    } else {
        /* this thread's weight row of the tile: mode 0 row tid of W0; mode 1 gate rows, then up rows */
        const bool up = MODE == 1 && tid >= GM_BR / 2;
        const int bn = n0 + (MODE == 1 ? (tid & (GM_BR / 2 - 1)) : tid);
        const bool bok = bn < N;
        const int bnc = bok ? bn : N - 1; /* an address inside W; rows >= N load nothing */
        const uint8_t *wrow;
        const uint8_t *srow;
        const float s2 = up ? W1.scale2 : W0.scale2;
        {
            const uint8_t *wb = (const uint8_t *)(up ? W1.w : W0.w), *sb = (const uint8_t *)(up ? W1.scale : W0.scale);
            if (FMT == 2) {
                wrow = wb + (size_t)bnc * (K / 2);
                srow = sb + (size_t)bnc * (K / 16);
            } else {
                wrow = wb + (size_t)bnc * K;
                srow = sb + (size_t)(bnc / 128) * (up ? W1.scale_ld : W0.scale_ld) * sizeof(float);
            }
        }
        const uint32_t b_row = B_OFF + tid * GM_ROWB; /* this thread's row in weight stage 0, bytes from sm */
        constexpr int NP = FMT == 2 ? 2 : 4;          /* 16-byte pieces per row and step: 32 / 16 k each */
        uint4 rv[NP];
        uint32_t rs[2] = {0u, 0u}; /* NVFP4: the two scale bytes of each piece */
        float sc_cur = 0.f, sc_nxt = 0.f; /* FP8: block scale of the staged step / of the next one */
        auto load_piece = [&](int s, int p) {
            const int k = s * GM_BK + (FMT == 2 ? 32 : 16) * p;
            const bool ok = bok && k < K;
            rv[p] = make_uint4(0u, 0u, 0u, 0u);
            if (ok) rv[p] = __ldg((const uint4 *)(wrow + (FMT == 2 ? k / 2 : k)));
            if constexpr (FMT == 2) rs[p] = ok ? (uint32_t)__ldg((const uint16_t *)(srow + k / 16)) : 0u;
        };
        auto load_scale = [&](int s) -> float {
            const int k = s * GM_BK;
            return (bok && k < K) ? __ldg((const float *)srow + k / 128) : 0.f;
        };
        /* decodes k [16kk, 16kk+16) of the staged step into weight stage sb */
        auto dequant = [&](int sb, int kk) {
            uint32_t o[8];
            if constexpr (FMT == 2) {
                const int u = kk >> 1, hf = kk & 1;
                const float bs = __fmul_rn(cu_e4m3((rs[u] >> (8 * hf)) & 0xffu), s2);
                const gm_lut t = gm_nvfp4_lut(bs);
                gm_nvfp4_dec8(hf ? rv[u].z : rv[u].x, t, o);
                gm_nvfp4_dec8(hf ? rv[u].w : rv[u].y, t, o + 4);
            } else {
                gm_fp8_dec4(rv[kk].x, sc_cur, o);
                gm_fp8_dec4(rv[kk].y, sc_cur, o + 2);
                gm_fp8_dec4(rv[kk].z, sc_cur, o + 4);
                gm_fp8_dec4(rv[kk].w, sc_cur, o + 6);
            }
            uint4 *dst = (uint4 *)(sm + b_row + sb * GM_B_STAGE + kk * 32);
            dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
            dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
        };
        load_a(0, 0);
        cu_cp_commit();
        if (nk > 1) load_a(1, 1);
        cu_cp_commit();
#pragma unroll
        for (int p = 0; p < NP; p++) load_piece(0, p);
        if (FMT == 1) sc_cur = load_scale(0);
#pragma unroll
        for (int kk = 0; kk < GM_BK / 16; kk++) dequant(0, kk);
        const int s1 = nk > 1 ? 1 : 0;
#pragma unroll
        for (int p = 0; p < NP; p++) load_piece(s1, p);
        if (FMT == 1) sc_cur = load_scale(s1);
        cu_cp_wait<1>();
        __syncthreads();
        int sa = 0;
        for (int ks = 0; ks < nk; ks++) {
            const int sb = ks & 1, sa2 = sa == 0 ? 2 : sa - 1;
            if (ks + 2 < nk) load_a(sa2, ks + 2);
            cu_cp_commit();
            const int sl = min(ks + 2, nk - 1); /* step whose bytes are loaded now (past the end: reloads, unused) */
#pragma unroll
            for (int kk = 0; kk < GM_BK / 16; kk++) {
                mma_step(sa, sb, kk);
                dequant(sb ^ 1, kk); /* step ks+1; that buffer was last read in step ks-1 */
                if constexpr (FMT == 2) {
                    if (kk & 1) load_piece(sl, kk >> 1);
                } else {
                    load_piece(sl, kk);
                    if (kk == 0) sc_nxt = load_scale(sl);
                }
            }
            if (FMT == 1) sc_cur = sc_nxt;
            cu_cp_wait<1>();
            __syncthreads();
            sa = sa == 2 ? 0 : sa + 1;
        }
    }

    /* epilogue straight from the C fragments: rows wm + 16i + g (+8), columns 2t, 2t+1 of each n8 tile */
    const int g8 = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = wm + 16 * i + g8 + 8 * h;
            if (r >= rows) continue;
            const size_t yrow = (size_t)(rbase + r) * a.ldy;
            if (MODE == 1) {
#pragma unroll
                for (int j = 0; j < HN; j++) {
                    const int col = n0 + wn * HN * 8 + 8 * j + 2 * t4;
                    const float v0 = cu_silu(acc[i][j][2 * h]) * acc[i][j + HN][2 * h];
                    const float v1 = cu_silu(acc[i][j][2 * h + 1]) * acc[i][j + HN][2 * h + 1];
                    gm_store2(a, yrow + col, col, v0, v1, MS_BF16);
                }
            } else {
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const int col = n0 + wn * NT * 8 + 8 * j + 2 * t4;
                    gm_store2(a, yrow + col, col, acc[i][j][2 * h], acc[i][j][2 * h + 1], a.y_type);
                }
            }
        }
}

/* Block (x, y): weight-column block x of 64-row tile y (see the header); the block's group is found by all
 * threads at once (one tile_off read each), odd tiles and tiles past the end exit before any work. */
template <int FMT, int MODE>
__global__ __launch_bounds__(GM_THREADS, 1) void k_gm(gm_args a) {
    cu_pdl_wait();
    cu_pdl_trigger();
    extern __shared__ __align__(128) unsigned char gm_sm[];
    __shared__ int sh_g;
    const int tile = blockIdx.y;
    if (threadIdx.x == 0) sh_g = -1;
    __syncthreads();
    for (int g = threadIdx.x; g < a.n_groups; g += GM_THREADS)
        if (a.tile_off[g] <= tile && tile < a.tile_off[g + 1]) sh_g = g;
    __syncthreads();
    const int g = sh_g;
    if (g < 0) return; /* past the last tile */
    const int local = tile - a.tile_off[g];
    if (local & 1) return; /* computed by the block of the even tile before it */
    const int m0 = local * CU_GG_BM, rows = min(GM_BM, a.row_cnt[g] - m0);
    if (rows <= 0) return;
    const int rbase = a.row_off[g] + m0;
    const cu_wdesc W0 = a.W0[g];
    const cu_wdesc W1 = MODE == 1 ? a.W1[g] : W0;
    if (rows > CU_GG_BM) gm_block<FMT, MODE, 8>(a, W0, W1, rbase, rows, gm_sm);
    else gm_block<FMT, MODE, 4>(a, W0, W1, rbase, rows, gm_sm);
}

/* ---- Hopper form (sm_90a): wgmma with the weight tile decoded into shared memory ----
 *
 * Why: the mma.sync kernel above runs at ~19% of the tensor pipe's peak on the H200 (ncu, GLM-5 gate/up
 * k_gm<2,1>: 2 warps per scheduler, shared-memory path 70% busy, 84% of the issued instructions not MMAs):
 * every MMA needs its operands staged through registers by ldmatrix. wgmma reads both operands from
 * shared memory and runs asynchronously, so the same threads decode the next k-step's weights while the
 * tensor cores work on this one.
 *
 * Block: 256 threads = two warpgroups, 128 activation rows (the same group/tile enumeration as k_gm) x BN
 * weight rows (256 as k_gm, or 128: MS_CU_GW_N). Warpgroup w computes rows 64w .. 64w+63 against all BN
 * weight rows with one wgmma.m64n{BN}k16 per 16 k (fp32 accumulators: BN/2 registers a thread). With
 * BN = 128 a block needs about half the registers and 80 KB of shared memory, so two blocks share an SM
 * and one's wgmmas run while the other decodes or waits at its barrier; each weight row is then decoded by
 * two threads (32 k each per step). Shared tiles are
 * K-major with the 128-byte swizzle (16-byte chunk c of row r at r*128 + ((c ^ (r & 7)) * 16), stage
 * bases 1024-byte aligned), so the wgmma descriptors need no transposition: start address, stride 1024
 * bytes between 8-row groups, and +32 bytes per 16-k slice inside the 64-k atom. Activations arrive by
 * cp.async (three stages), weights are decoded by the threads owning the row (k_gm's decoders, so the
 * bf16 weight values are identical; FP8's 128 x 128 block scale is constant over a 64-k step) into two
 * stages. Per k-step: issue the four wgmmas of step s, decode
 * step s+1 into the other weight stage and load step s+2's raw bytes, wait for the wgmmas, then fence
 * (generic-proxy writes -> async-proxy reads) and one barrier. Both warpgroups always issue their wgmmas
 * (a pair with at most 64 rows computes zero-filled rows it does not store): a warpgroup-dependent branch
 * around them makes ptxas serialize every wgmma. NVFP4 and FP8 (their decode is what the wgmmas hide);
 * bf16 weights keep k_gm. */
#define GW_STAGE_A (GM_BM * 128)
/* shared bytes of a block with BN weight rows: 3 activation stages, 2 weight stages, 1024 for alignment */
#define GW_SMEM(BN) (GM_A_STAGES * GW_STAGE_A + 2 * (BN) * 128 + 1024)

__device__ __forceinline__ uint32_t gw_swz(int r, int c) { return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)); }

/* Matrix descriptor of a K-major bf16 tile with the 128-byte swizzle (PTX ISA "Matrix Descriptor Format"):
 * start address >> 4, leading offset unused (1), stride 1024 bytes between 8-row core-matrix groups. */
__device__ __forceinline__ uint64_t gw_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

#if CU_HAVE_WGMMA
#define GW_HAVE 1
/* d (64 x 256 fp32, this thread's 128) += A (64 x 16, desc a) * B (256 x 16, desc b)^T */
__device__ __forceinline__ void gw_mma(float (&d)[128], uint64_t a, uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(a), "l"(b));
}
/* the same with a 128-row B: d is 64 x 128 (64 registers a thread) */
__device__ __forceinline__ void gw_mma(float (&d)[64], uint64_t a, uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(a), "l"(b));
}
#else
#define GW_HAVE 0
#endif

template <int FMT, int MODE, int BN>
__global__ __launch_bounds__(GM_THREADS, BN == 128 ? 2 : 1) void k_gw(gm_args a) {
    cu_pdl_wait();
    cu_pdl_trigger();
#if GW_HAVE
    extern __shared__ __align__(128) unsigned char gw_sm[];
    __shared__ int sh_g;
    const int tile = blockIdx.y, tid = threadIdx.x;
    if (tid == 0) sh_g = -1;
    __syncthreads();
    for (int g = tid; g < a.n_groups; g += GM_THREADS)
        if (a.tile_off[g] <= tile && tile < a.tile_off[g + 1]) sh_g = g;
    __syncthreads();
    const int g = sh_g;
    if (g < 0) return;
    const int local = tile - a.tile_off[g];
    if (local & 1) return;
    const int m0 = local * CU_GG_BM, rows = min(GM_BM, a.row_cnt[g] - m0);
    if (rows <= 0) return;
    const int rbase = a.row_off[g] + m0;
    const cu_wdesc W0 = a.W0[g];
    const cu_wdesc W1 = MODE == 1 ? a.W1[g] : W0;
    const int K = a.K, N = a.N, nk = (K + GM_BK - 1) / GM_BK;
    const int n0 = blockIdx.x * (MODE == 1 ? BN / 2 : BN);
    /* threads per weight row; k per 16-byte piece of raw weight (NVFP4 32, FP8 16); pieces per thread
     * and k-step */
    constexpr int TPR = GM_THREADS / BN, KPP = FMT == 2 ? 32 : 16, NP = GM_BK / KPP / TPR;
    constexpr int GW_STAGE_B = BN * 128;
    const uint32_t base = (cu_saddr(gw_sm) + 1023u) & ~1023u; /* the swizzle repeats every 1024 bytes */
    const uint32_t sA = base, sB = base + GM_A_STAGES * GW_STAGE_A;
    const int wg = tid >> 7;
    const int ld_r = tid >> 3, ld_c = tid & 7;

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[i] = 0.f;

    auto load_a = [&](int st, int s) {
        const int k = s * GM_BK + ld_c * 8;
#pragma unroll
        for (int q = 0; q < GM_BM / 32; q++) {
            const int r = ld_r + 32 * q;
            const bool ok = r < rows && k < K;
            const bf16 *src = a.x + (size_t)(rbase + (ok ? r : 0)) * K + (ok ? k : 0);
            cu_cp16(sA + st * GW_STAGE_A + gw_swz(r, ld_c), src, ok);
        }
    };
    /* this thread's weight row of the tile, brow = tid / TPR (mode 0 W0 row n0 + brow; mode 1 gate rows,
     * then up), and its share of each k-step: pieces p0 .. p0 + NP - 1 of KPP k */
    const int brow = tid / TPR, p0 = (tid % TPR) * NP;
    const bool up = MODE == 1 && brow >= BN / 2;
    const int bn = n0 + (MODE == 1 ? (brow & (BN / 2 - 1)) : brow);
    const bool bok = bn < N;
    const int bnc = bok ? bn : N - 1;
    const float s2 = up ? W1.scale2 : W0.scale2;
    const uint8_t *wb = (const uint8_t *)(up ? W1.w : W0.w), *sbp = (const uint8_t *)(up ? W1.scale : W0.scale);
    /* NVFP4: nibbles [N, K/2], e4m3 scales [N, K/16]; FP8: bytes [N, K], fp32 scales of 128 x 128 blocks */
    const uint8_t *wrow = wb + (size_t)bnc * (FMT == 2 ? K / 2 : K);
    const uint8_t *srow = FMT == 2 ? sbp + (size_t)bnc * (K / 16)
                                   : sbp + (size_t)(bnc / 128) * (up ? W1.scale_ld : W0.scale_ld) * sizeof(float);
    uint4 rv[NP];
    uint32_t rs[NP];
    float sc = 0.f; /* FP8: the step's block scale (a 64-k step lies inside one 128-k block) */
    auto load_step = [&](int s) {
#pragma unroll
        for (int p = 0; p < NP; p++) {
            const int k = s * GM_BK + KPP * (p0 + p);
            const bool ok = bok && k < K;
            rv[p] = ok ? __ldg((const uint4 *)(wrow + (FMT == 2 ? k / 2 : k))) : make_uint4(0u, 0u, 0u, 0u);
            if (FMT == 2) rs[p] = ok ? (uint32_t)__ldg((const uint16_t *)(srow + k / 16)) : 0u;
        }
        if (FMT == 1) sc = (bok && s * GM_BK < K) ? __ldg((const float *)srow + s * GM_BK / 128) : 0.f;
    };
    auto decode_step = [&](int sb) {
#pragma unroll
        for (int kl = 0; kl < (FMT == 2 ? 2 * NP : NP); kl++) {
            uint32_t o[8];
            int kk;
            if constexpr (FMT == 2) {
                const int u = kl >> 1, hf = kl & 1;
                kk = 2 * p0 + kl;
                const float bs = __fmul_rn(cu_e4m3((rs[u] >> (8 * hf)) & 0xffu), s2);
                const gm_lut t = gm_nvfp4_lut(bs);
                gm_nvfp4_dec8(hf ? rv[u].z : rv[u].x, t, o);
                gm_nvfp4_dec8(hf ? rv[u].w : rv[u].y, t, o + 4);
            } else {
                kk = p0 + kl;
                gm_fp8_dec4(rv[kl].x, sc, o);
                gm_fp8_dec4(rv[kl].y, sc, o + 2);
                gm_fp8_dec4(rv[kl].z, sc, o + 4);
                gm_fp8_dec4(rv[kl].w, sc, o + 6);
            }
            const uint32_t row = sB + sb * GW_STAGE_B;
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(row + gw_swz(brow, 2 * kk)), "r"(o[0]), "r"(o[1]),
                         "r"(o[2]), "r"(o[3]) : "memory");
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(row + gw_swz(brow, 2 * kk + 1)), "r"(o[4]),
                         "r"(o[5]), "r"(o[6]), "r"(o[7]) : "memory");
        }
    };

    load_a(0, 0);
    cu_cp_commit();
    if (nk > 1) load_a(1, 1);
    cu_cp_commit();
    load_step(0);
    decode_step(0);
    if (nk > 1) load_step(1);
    cu_cp_wait<1>();
    cu_wg_proxy_fence();
    __syncthreads();
    for (int ks = 0; ks < nk; ks++) {
        const int sa = ks % GM_A_STAGES, sb = ks & 1;
        if (ks + 2 < nk) load_a((ks + 2) % GM_A_STAGES, ks + 2); /* its stage was read in step ks-1 */
        cu_cp_commit();
        cu_wg_acc_fence(acc);
        cu_wg_fence();
#pragma unroll
        for (int kk = 0; kk < GM_BK / 16; kk++)
            gw_mma(acc, gw_desc(sA + sa * GW_STAGE_A + wg * 64 * 128 + kk * 32), gw_desc(sB + sb * GW_STAGE_B + kk * 32));
        cu_wg_commit();
        if (ks + 1 < nk) {
            decode_step(sb ^ 1); /* step ks+1; that stage was read by step ks-1's wgmmas, finished */
            if (ks + 2 < nk) load_step(ks + 2);
        }
        cu_wg_wait<0>();
        cu_wg_acc_fence(acc);
        cu_cp_wait<1>();
        cu_wg_proxy_fence();
        __syncthreads();
    }

    /* accumulator layout (wgmma m64nN, f32): warp w4 = warp % 4 holds rows 16 w4 .. +15 of the warpgroup's
     * 64; register 4j + i is row g + 8 (i >> 1), column 8j + 2t + (i & 1), as an mma.sync C fragment per
     * 8-column tile j */
    const int lane = tid & 31, w4 = (tid >> 5) & 3, g8 = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = wg * 64 + w4 * 16 + g8 + 8 * h;
        if (r >= rows) continue;
        const size_t yrow = (size_t)(rbase + r) * a.ldy;
        if (MODE == 1) {
#pragma unroll
            for (int j = 0; j < BN / 16; j++) {
                const int col = n0 + 8 * j + 2 * t4;
                const float v0 = cu_silu(acc[4 * j + 2 * h]) * acc[4 * (j + BN / 16) + 2 * h];
                const float v1 = cu_silu(acc[4 * j + 2 * h + 1]) * acc[4 * (j + BN / 16) + 2 * h + 1];
                gm_store2(a, yrow + col, col, v0, v1, MS_BF16);
            }
        } else {
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                const int col = n0 + 8 * j + 2 * t4;
                gm_store2(a, yrow + col, col, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], a.y_type);
            }
        }
    }
#else
    (void)a;
    __trap(); /* no sm_90a code in this build: the host never launches it (cu_gw_probe) */
#endif
}

/* Writes whether this build's code for the running GPU holds k_gw's body. */
__global__ void k_gw_probe(int *out) {
    cu_pdl_wait();
    cu_pdl_trigger();
    *out = GW_HAVE;
}

/* Contract in cuda_internal.cuh. */
int cu_gw_probe(ms_backend *b, int *have, ms_err *err) {
    *have = 0;
    if (b->gpu.cc_major != 9) return MS_OK;
    int *d = NULL, h = 0;
    CK(cudaMalloc(&d, sizeof(int)));
    cudaError_t e = cu_launch(k_gw_probe, dim3(1), dim3(1), 0, cu_of(b)->stream, d);
    if (e == cudaSuccess) e = cudaMemcpyAsync(&h, d, sizeof(int), cudaMemcpyDeviceToHost, cu_of(b)->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cu_of(b)->stream);
    cudaFree(d);
    CK(e);
    *have = h;
    return MS_OK;
}

template <int F, int M, int BN>
static cudaError_t gw_launch(dim3 grid, cudaStream_t st, const gm_args &a, int smem_per_sm) {
    cudaError_t e = cudaFuncSetAttribute(k_gw<F, M, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GW_SMEM(BN));
    /* a shared-memory carveout that holds the blocks an SM is meant to run (two of 128 rows, one of 256)
     * and leaves the rest to L1, which the weight and scale loads go through: asking for the largest
     * carveout (28 KB of L1 left) measured 6% slower */
    const int want = (BN == 128 ? 2 : 1) * (GW_SMEM(BN) + 1024);
    if (e == cudaSuccess && smem_per_sm > 0)
        e = cudaFuncSetAttribute(k_gw<F, M, BN>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 want >= smem_per_sm ? 100 : (int)(((long long)want * 100 + smem_per_sm - 1) / smem_per_sm));
    if (e != cudaSuccess) return e;
    return cu_launch(k_gw<F, M, BN>, grid, GM_THREADS, (size_t)GW_SMEM(BN), st, a);
}
static long long gw_launches; /* ms_cuda_gw_launches; updated atomically */

/* Contract in backend_cuda.h. */
extern "C" long long ms_cuda_gw_launches(void) { return __atomic_load_n(&gw_launches, __ATOMIC_RELAXED); }

template <int F>
static cudaError_t gw_launch_f(int mode, int wide, dim3 grid, cudaStream_t st, const gm_args &a, int sm) {
    if (wide) return mode == 1 ? gw_launch<F, 1, 256>(grid, st, a, sm) : gw_launch<F, 0, 256>(grid, st, a, sm);
    return mode == 1 ? gw_launch<F, 1, 128>(grid, st, a, sm) : gw_launch<F, 0, 128>(grid, st, a, sm);
}

template <int F, int M>
static cudaError_t gm_launch(dim3 grid, size_t smem, cudaStream_t st, const gm_args &a) {
    cudaError_t e = cudaFuncSetAttribute(k_gm<F, M>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    return cu_launch(k_gm<F, M>, grid, GM_THREADS, smem, st, a);
}

/* Contract in cuda_internal.cuh. W1 entries (mode 1) must have w0's format, as for cu_gemv_grouped's
 * vector paths; every expert's weight and scale pointers are assumed as aligned as w0's (cudaMalloc'd
 * per tensor). */
int cu_gemm_grouped_mma(ms_backend *b, const cu_gg_call *c, int *launched, ms_err *err) {
    const int mode = c->mode, n_groups = c->n_groups, max_tiles = c->max_tiles;
    const cu_wdesc *w_host = &c->w0;
    const bf16 *x = c->x;
    void *y = c->y;
    const int64_t ldy = c->ldy;
    *launched = 0;
    if (cu_knob(CU_KNOB_GG) == CU_GG_OLD) return MS_OK;
    if (b->gpu.cc_major < 8 || n_groups <= 0 || max_tiles <= 0 || max_tiles > 65535) return MS_OK;
    if (mode == 1 && !c->W1) return MS_OK;
    const int K = w_host->k, N = w_host->n;
    int fmt = -1;
    if (w_host->fmt == MS_WFMT_PLAIN && w_host->dtype == MS_BF16 && K % 8 == 0) fmt = 0;
    else if (w_host->fmt == MS_WFMT_FP8 && K % 16 == 0) fmt = 1;
    else if (w_host->fmt == MS_WFMT_NVFP4 && K % 32 == 0) fmt = 2;
    if (fmt < 0 || K <= 0 || N <= 0) return MS_OK;
    if ((((uintptr_t)x | (uintptr_t)w_host->w) & 15u) != 0) return MS_OK;
    if (fmt != 0 && ((uintptr_t)w_host->scale & (fmt == 1 ? 3u : 1u)) != 0) return MS_OK;
    const size_t smem = gm_smem_bytes(fmt);
    if (cu_of(b)->max_smem_optin <= 0 || (size_t)cu_of(b)->max_smem_optin < smem + 256) return MS_OK;

    gm_args a;
    cu_kargs_set(a, *c);
    a.W1 = c->W1 ? c->W1 : c->W0;
    a.y_type = mode == 1 ? MS_BF16 : c->y_type;
    const size_t ysz = a.y_type == MS_F32 ? 4 : 2;
    a.pair_st = (a.y_type == MS_F32 || a.y_type == MS_BF16) && ldy % 2 == 0 && ((uintptr_t)y % (2 * ysz)) == 0;
    dim3 grid(cu_blocks(N, mode == 1 ? GM_BR / 2 : GM_BR), max_tiles);
    cudaStream_t st = cu_of(b)->stream;
    cudaError_t ce;
    /* NVFP4 and FP8 on Hopper: the wgmma form (MS_CU_GG=sync keeps the mma.sync kernel) */
    if (fmt != 0 && b->gpu.cc_major == 9 && cu_of(b)->have_wgmma && cu_knob(CU_KNOB_GG) != CU_GG_SYNC &&
        (size_t)cu_of(b)->max_smem_optin >= (size_t)GW_SMEM(256)) {
        const int wide = cu_knob(CU_KNOB_GW_N) == CU_GW_N_256;
        const dim3 g2(cu_blocks(N, (mode == 1 ? 64 : 128) * (wide ? 2 : 1)), max_tiles);
        const int sm = cu_of(b)->smem_per_sm;
        ce = fmt == 2 ? gw_launch_f<2>(mode, wide, g2, st, a, sm) : gw_launch_f<1>(mode, wide, g2, st, a, sm);
        CK(ce);
        __atomic_add_fetch(&gw_launches, 1, __ATOMIC_RELAXED);
        *launched = 1;
        return MS_OK;
    }
    if (mode == 1) {
        switch (fmt) {
        case 0: ce = gm_launch<0, 1>(grid, smem, st, a); break;
        case 1: ce = gm_launch<1, 1>(grid, smem, st, a); break;
        default: ce = gm_launch<2, 1>(grid, smem, st, a); break;
        }
    } else {
        switch (fmt) {
        case 0: ce = gm_launch<0, 0>(grid, smem, st, a); break;
        case 1: ce = gm_launch<1, 0>(grid, smem, st, a); break;
        default: ce = gm_launch<2, 0>(grid, smem, st, a); break;
        }
    }
    CK(ce);
    CK_LAUNCH();
    *launched = 1;
    return MS_OK;
}
