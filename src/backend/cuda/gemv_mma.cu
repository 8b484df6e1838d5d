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
#include "backend/cuda/gemv_mma.cuh"

#include <string.h>

/* ---- kernel ---- */

struct gm_args : cu_gemv_kargs { /* w1: the up weight of the single form (w0 when the call has none) */
    /* warps per block = rw * S * ksplit: rw m-tiles, each computed by S (gate/up) x ksplit (K share)
     * warps whose fp32 partials meet in shared memory */
    int ksplit, rw;
    int ntok;   /* tokens per pass (<= NT * 8) */
    int xbytes; /* shared memory for x staging (the reduction reuses the same memory) */
    int ring;   /* FMT 5: byte offset of the warps' weight rings in shared memory */
};

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
