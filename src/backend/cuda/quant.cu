/* quant.cu - kernels that read weights in their checkpoint format (BF16, FP8 block-scaled, NVFP4):
 * exact dequantization to bf16, the memory-bound grouped GEMV used for decode (each weight row read
 * once for all tokens that need it, 16-byte loads, dequantized in registers; a staged variant keeps x
 * in shared memory and gives each warp four weight-row streams) and the grouped
 * tensor-core GEMM (wmma bf16 m16n16k16, fp32 accumulate) that dequantizes weight tiles into shared
 * memory. The MoE runners and the linear op share them. cu_gemv_grouped hands aligned shapes to the
 * tensor-core GEMV of gemv_mma.cu unless MS_CU_GEMV=gv2; the kernels here are its fallback. */
#include "backend/cuda/cuda_internal.cuh"

#include <cuda_fp16.h>
#include <mma.h>

/* ---- exact dequantization ---- */

__global__ void k_dequant(cu_wdesc d, bf16 *out) {
    cu_pdl_wait();
    cu_pdl_trigger();
    int64_t total = (int64_t)d.n * d.k;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = i / d.k, k = i - n * d.k;
        out[i] = __float2bfloat16_rn(cu_deq(d, n, k));
    }
}

int cu_dequant_bf16(ms_backend *b, const cu_wdesc *d, bf16 *out, ms_err *err) {
    int64_t total = (int64_t)d->n * d->k;
    int blocks = (int)((total + 255) / 256);
    if (blocks > 65536) blocks = 65536;
    CK(cu_launch(k_dequant, blocks, 256, 0, cu_of(b)->stream, *d, out));
    return MS_OK;
}

/* (e2m1_fast / e4m3_fast, the fast exact decoders, live in cuda_internal.cuh.) */
__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

/* ---- grouped GEMV (decode) ---- */

typedef cu_gemv_kargs gv_args;

#define GV_WARPS 8
#define GV_RPW 4 /* rows per warp */
#define GV_TOK 8 /* tokens per pass */

/* Accumulates, for one weight row n of W and up to GV_TOK x rows, the dot products into acc.
 * FMT: 0 bf16 (8 el / 16 B), 1 fp8 (16 el), 2 nvfp4 (32 el), 3 any format, scalar. */
template <int FMT>
__device__ __forceinline__ void gv_row(const cu_wdesc &W, int n, const bf16 *const *xr, int nr, float *acc, int lane) {
    const int K = W.k;
    if (FMT == 0) {
        const uint4 *wp = (const uint4 *)((const bf16 *)W.w + (size_t)n * K);
        const int nc = K / 8;
#pragma unroll 2
        for (int c = lane; c < nc; c += 32) {
            uint4 wv = __ldg(wp + c);
            float wf[8] = {bf_lo(wv.x), bf_hi(wv.x), bf_lo(wv.y), bf_hi(wv.y),
                           bf_lo(wv.z), bf_hi(wv.z), bf_lo(wv.w), bf_hi(wv.w)};
#pragma unroll
            for (int j = 0; j < GV_TOK; j++) {
                if (j < nr) {
                    uint4 xv = __ldg((const uint4 *)xr[j] + c);
                    float s = acc[j];
                    s = fmaf(bf_lo(xv.x), wf[0], s); s = fmaf(bf_hi(xv.x), wf[1], s);
                    s = fmaf(bf_lo(xv.y), wf[2], s); s = fmaf(bf_hi(xv.y), wf[3], s);
                    s = fmaf(bf_lo(xv.z), wf[4], s); s = fmaf(bf_hi(xv.z), wf[5], s);
                    s = fmaf(bf_lo(xv.w), wf[6], s); s = fmaf(bf_hi(xv.w), wf[7], s);
                    acc[j] = s;
                }
            }
        }
    } else if (FMT == 1) {
        const uint4 *wp = (const uint4 *)((const uint8_t *)W.w + (size_t)n * K);
        const float *sp = (const float *)W.scale + (size_t)(n / 128) * W.scale_ld;
        const int nc = K / 16;
#pragma unroll 2
        for (int c = lane; c < nc; c += 32) {
            uint4 wv = __ldg(wp + c);
            float sc = __ldg(sp + (c * 16) / 128);
            uint32_t ws[4] = {wv.x, wv.y, wv.z, wv.w};
            float wf[16];
#pragma unroll
            for (int q = 0; q < 4; q++)
#pragma unroll
                for (int bb = 0; bb < 4; bb++) wf[q * 4 + bb] = e4m3_fast((ws[q] >> (8 * bb)) & 0xffu);
#pragma unroll
            for (int j = 0; j < GV_TOK; j++) {
                if (j < nr) {
                    const uint4 *xp = (const uint4 *)xr[j] + c * 2;
                    uint4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
                    uint32_t xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                    float s = 0.f;
#pragma unroll
                    for (int q = 0; q < 8; q++) {
                        s = fmaf(bf_lo(xs[q]), wf[2 * q], s);
                        s = fmaf(bf_hi(xs[q]), wf[2 * q + 1], s);
                    }
                    acc[j] = fmaf(s, sc, acc[j]);
                }
            }
        }
    } else if (FMT == 2) {
        const uint4 *wp = (const uint4 *)((const uint8_t *)W.w + (size_t)n * (K / 2));
        const uint16_t *sp = (const uint16_t *)((const uint8_t *)W.scale + (size_t)n * (K / 16));
        const int nc = K / 32;
#pragma unroll 2
        for (int c = lane; c < nc; c += 32) {
            uint4 wv = __ldg(wp + c);
            uint32_t s2 = __ldg(sp + c);
            float bs0 = __fmul_rn(cu_e4m3(s2 & 0xffu), W.scale2), bs1 = __fmul_rn(cu_e4m3(s2 >> 8), W.scale2);
            uint32_t ws[4] = {wv.x, wv.y, wv.z, wv.w};
            float wf[32];
#pragma unroll
            for (int q = 0; q < 4; q++)
#pragma unroll
                for (int i = 0; i < 8; i++) wf[q * 8 + i] = e2m1_fast(ws[q] >> (4 * i));
#pragma unroll
            for (int j = 0; j < GV_TOK; j++) {
                if (j < nr) {
                    const uint4 *xp = (const uint4 *)xr[j] + c * 4;
                    float s0 = 0.f, s1 = 0.f;
#pragma unroll
                    for (int h = 0; h < 4; h++) {
                        uint4 xv = __ldg(xp + h);
                        uint32_t xs[4] = {xv.x, xv.y, xv.z, xv.w};
                        float s = 0.f;
#pragma unroll
                        for (int q = 0; q < 4; q++) {
                            s = fmaf(bf_lo(xs[q]), wf[h * 8 + 2 * q], s);
                            s = fmaf(bf_hi(xs[q]), wf[h * 8 + 2 * q + 1], s);
                        }
                        if (h < 2) s0 += s; else s1 += s;
                    }
                    acc[j] = fmaf(s0, bs0, fmaf(s1, bs1, acc[j]));
                }
            }
        }
    } else {
        for (int k = lane; k < K; k += 32) {
            float wv = cu_deq(W, n, k);
#pragma unroll
            for (int j = 0; j < GV_TOK; j++)
                if (j < nr) acc[j] = fmaf(__bfloat162float(xr[j][k]), wv, acc[j]);
        }
    }
}

template <int FMT, int MODE>
__global__ __launch_bounds__(GV_WARPS * 32) void k_gemv(gv_args a) {
    cu_pdl_wait();
    cu_pdl_trigger();
    const int g = blockIdx.x;
    if (a.n_active && g >= *a.n_active) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    cu_wdesc W0, W1;
    int off = 0, cnt = a.rows_total;
    if (a.W0) {
        int wid = a.group_w ? a.group_w[g] : g;
        W0 = a.W0[wid];
        if (MODE == 1) W1 = a.W1[wid];
        off = a.row_off[wid];
        cnt = a.row_cnt[wid];
    } else {
        W0 = a.w0;
        W1 = a.w0;
    }
    if (cnt <= 0) return;
    const int K = a.K;
    for (int r0 = 0; r0 < cnt; r0 += GV_TOK) {
        const int nr = min(GV_TOK, cnt - r0);
        const bf16 *xr[GV_TOK];
#pragma unroll
        for (int j = 0; j < GV_TOK; j++) {
            int r = off + r0 + min(j, nr - 1);
            int xrow = a.row_idx ? a.row_idx[r] : r;
            xr[j] = a.x + (size_t)xrow * K;
        }
#pragma unroll 1
        for (int i = 0; i < GV_RPW; i++) {
            const int n = (blockIdx.y * GV_RPW + i) * GV_WARPS + warp;
            if (n >= a.N) break;
            float acc0[GV_TOK], acc1[GV_TOK];
#pragma unroll
            for (int j = 0; j < GV_TOK; j++) acc0[j] = acc1[j] = 0.f;
            gv_row<FMT>(W0, n, xr, nr, acc0, lane);
            if (MODE == 1) gv_row<FMT>(W1, n, xr, nr, acc1, lane);
#pragma unroll
            for (int j = 0; j < GV_TOK; j++) {
                acc0[j] = warp_sum(acc0[j]);
                if (MODE == 1) acc1[j] = warp_sum(acc1[j]);
            }
            if (lane == 0) {
#pragma unroll
                for (int j = 0; j < GV_TOK; j++) {
                    if (j < nr) {
                        size_t yi = (size_t)(off + r0 + j) * a.ldy + n;
                        if (MODE == 1) ((bf16 *)a.y)[yi] = __float2bfloat16_rn(cu_silu(acc0[j]) * acc1[j]);
                        else cu_st(a.y, a.y_type, yi, acc0[j]);
                    }
                }
            }
        }
    }
}

/* ---- staged grouped GEMV (decode fast path) ----
 * The block stages its tokens' x rows (bf16) in shared memory once; each warp owns GV2_S weight-row
 * streams (mode 0: 4 rows of W0; mode 1: 2 rows of W0 and the same 2 rows of W1) and issues all their
 * 16-byte loads for one chunk before using them, so one x read from shared memory serves 4 weight
 * chunks. Weights are decoded to half bit patterns that equal the exact value times a power of two
 * (nvfp4: e2m1 * 2^-14, fp8: e4m3 * 2^-8, subnormals included); the power of two is folded into the
 * block scale, so every product and partial sum is the old path's scaled exactly by 2^k. x units
 * (16 B) are stored at u ^ ((u >> 3) & 3) so the lanes of a quarter-warp hit distinct banks. */

#define GV2_S 4   /* weight-row streams per warp */
#define GV2_TOK 4 /* tokens per staged pass (register budget) */
#define GV2_SMEM_BUDGET (96 * 1024)

__device__ __forceinline__ int gv2_swz(int u) { return u ^ ((u >> 3) & 3); }
__device__ __forceinline__ float2 gv2_h2f(uint32_t bits) {
    __half2 h = *reinterpret_cast<const __half2 *>(&bits);
    return __half22float2(h);
}

/* Decodes unit h (8 consecutive k) of one 16-byte chunk into wf[0..7] in k order (scaled by 2^-14
 * for nvfp4, 2^-8 for fp8, exact for bf16). */
template <int FMT>
__device__ __forceinline__ void gv2_decode(const uint4 &wv, int h, float *wf) {
    const uint32_t ws[4] = {wv.x, wv.y, wv.z, wv.w};
    if (FMT == 0) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            wf[2 * q] = bf_lo(ws[q]);
            wf[2 * q + 1] = bf_hi(ws[q]);
        }
    } else if (FMT == 1) {
#pragma unroll
        for (int t = 0; t < 2; t++) {
            const uint32_t w = ws[2 * h + t]; /* bytes b0..b3 = k 4t..4t+3 of the unit */
            const uint32_t h02 = ((w << 7) & 0x3F803F80u) | ((w << 8) & 0x80008000u);
            const uint32_t h13 = ((w >> 1) & 0x3F803F80u) | (w & 0x80008000u);
            const float2 f02 = gv2_h2f(h02), f13 = gv2_h2f(h13);
            wf[4 * t + 0] = f02.x;
            wf[4 * t + 1] = f13.x;
            wf[4 * t + 2] = f02.y;
            wf[4 * t + 3] = f13.y;
        }
    } else {
        const uint32_t w = ws[h]; /* nibble i = k i of the unit */
        const uint32_t X[4] = {w << 9, w << 5, w << 1, w >> 3};
        const uint32_t Y[4] = {w << 12, w << 8, w << 4, w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 f = gv2_h2f((X[i] & 0x0E000E00u) | (Y[i] & 0x80008000u));
            wf[i] = f.x;
            wf[i + 4] = f.y;
        }
    }
}

template <int FMT, int MODE>
__global__ __launch_bounds__(256) void k_gv2(gv_args a, int st) {
    cu_pdl_wait();
    cu_pdl_trigger();
    extern __shared__ uint4 gv2_smem[];
    bf16 *xs = (bf16 *)gv2_smem;
    const int g = blockIdx.x;
    if (a.n_active && g >= *a.n_active) return;
    cu_wdesc W0, W1;
    int off = 0, cnt = a.rows_total;
    if (a.W0) {
        const int wid = a.group_w ? a.group_w[g] : g;
        W0 = a.W0[wid];
        W1 = MODE == 1 ? a.W1[wid] : W0;
        off = a.row_off[wid];
        cnt = a.row_cnt[wid];
    } else {
        W0 = a.w0;
        W1 = a.w0;
    }
    if (cnt <= 0) return; /* block-uniform: before any barrier */
    constexpr int RPW = MODE == 1 ? 2 : 4;
    constexpr int UPC = FMT == 0 ? 1 : FMT == 1 ? 2 : 4; /* 16-byte x units per weight chunk */
    const int K = a.K, N = a.N, KP = (K + 31) & ~31, nu = K / 8, nc = K / (8 * UPC);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
    const int nb = (blockIdx.y * nwarps + warp) * RPW;
    const bool active = nb < N; /* warp-uniform; idle warps still help stage x */
    const uint4 *wp[GV2_S];
    const void *sp[GV2_S];
    float s2[GV2_S];
#pragma unroll
    for (int s = 0; s < GV2_S; s++) {
        const cu_wdesc &M = (MODE == 1 && s >= 2) ? W1 : W0;
        const int n = min(nb + (MODE == 1 ? (s & 1) : s), N - 1); /* clamped rows are computed, not stored */
        s2[s] = M.scale2;
        if (FMT == 0) {
            wp[s] = (const uint4 *)((const bf16 *)M.w + (size_t)n * K);
            sp[s] = NULL;
        } else if (FMT == 1) {
            wp[s] = (const uint4 *)((const uint8_t *)M.w + (size_t)n * K);
            sp[s] = (const float *)M.scale + (size_t)(n / 128) * M.scale_ld;
        } else {
            wp[s] = (const uint4 *)((const uint8_t *)M.w + (size_t)n * (K / 2));
            sp[s] = (const uint8_t *)M.scale + (size_t)n * (K / 16);
        }
    }
    for (int r0 = 0; r0 < cnt; r0 += st) {
        const int nr = min(st, cnt - r0);
        if (r0 > 0) __syncthreads(); /* previous pass done reading xs */
        for (int i = threadIdx.x; i < nr * nu; i += blockDim.x) {
            const int j = i / nu, u = i - j * nu;
            const int r = off + r0 + j;
            const int xrow = a.row_idx ? a.row_idx[r] : r;
            const uint4 v = __ldg((const uint4 *)(a.x + (size_t)xrow * K) + u);
            *(uint4 *)(xs + (size_t)j * KP + gv2_swz(u) * 8) = v;
        }
        __syncthreads();
        if (!active) continue;
        float acc[GV2_S][GV2_TOK];
#pragma unroll
        for (int s = 0; s < GV2_S; s++)
#pragma unroll
            for (int j = 0; j < GV2_TOK; j++) acc[s][j] = 0.f;
        for (int c = lane; c < nc; c += 32) {
            uint4 wv[GV2_S];
            float sc[GV2_S][2];
#pragma unroll
            for (int s = 0; s < GV2_S; s++) wv[s] = __ldg(wp[s] + c);
#pragma unroll
            for (int s = 0; s < GV2_S; s++) {
                if (FMT == 1) {
                    sc[s][0] = sc[s][1] = __ldg((const float *)sp[s] + c / 8) * 256.f; /* 128-wide block */
                } else if (FMT == 2) {
                    const uint32_t b2 = __ldg((const uint16_t *)sp[s] + c); /* groups 2c, 2c+1 */
                    sc[s][0] = __fmul_rn(cu_e4m3(b2 & 0xffu), s2[s]) * 16384.f;
                    sc[s][1] = __fmul_rn(cu_e4m3(b2 >> 8), s2[s]) * 16384.f;
                } else {
                    sc[s][0] = sc[s][1] = 1.f;
                }
            }
            float p[GV2_S][GV2_TOK];
#pragma unroll
            for (int s = 0; s < GV2_S; s++)
#pragma unroll
                for (int j = 0; j < GV2_TOK; j++) p[s][j] = 0.f;
#pragma unroll
            for (int h = 0; h < UPC; h++) {
                float wf[GV2_S][8];
#pragma unroll
                for (int s = 0; s < GV2_S; s++) gv2_decode<FMT>(wv[s], h, wf[s]);
                const int u = c * UPC + h;
#pragma unroll
                for (int j = 0; j < GV2_TOK; j++) {
                    if (j < nr) {
                        const uint4 xv = *(const uint4 *)(xs + (size_t)j * KP + gv2_swz(u) * 8);
                        const float xf[8] = {bf_lo(xv.x), bf_hi(xv.x), bf_lo(xv.y), bf_hi(xv.y),
                                             bf_lo(xv.z), bf_hi(xv.z), bf_lo(xv.w), bf_hi(xv.w)};
#pragma unroll
                        for (int s = 0; s < GV2_S; s++) {
                            float t = p[s][j];
#pragma unroll
                            for (int e = 0; e < 8; e++) t = fmaf(xf[e], wf[s][e], t);
                            p[s][j] = t;
                        }
                    }
                }
                /* end of a scale group: nvfp4 after units 1 and 3, fp8/bf16 after the chunk */
                if ((FMT == 2 && (h == 1 || h == 3)) || (FMT != 2 && h == UPC - 1)) {
                    const int gi = (FMT == 2 && h == 3) ? 1 : 0;
#pragma unroll
                    for (int s = 0; s < GV2_S; s++)
#pragma unroll
                        for (int j = 0; j < GV2_TOK; j++) {
                            acc[s][j] = fmaf(p[s][j], sc[s][gi], acc[s][j]);
                            p[s][j] = 0.f;
                        }
                }
            }
        }
#pragma unroll
        for (int s = 0; s < GV2_S; s++)
#pragma unroll
            for (int j = 0; j < GV2_TOK; j++)
                if (j < nr) acc[s][j] = warp_sum(acc[s][j]);
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < GV2_TOK; j++) {
                if (j >= nr) continue;
                const size_t yrow = (size_t)(off + r0 + j) * a.ldy;
                if (MODE == 1) {
#pragma unroll
                    for (int r = 0; r < 2; r++)
                        if (nb + r < N) ((bf16 *)a.y)[yrow + nb + r] = __float2bfloat16_rn(cu_silu(acc[r][j]) * acc[2 + r][j]);
                } else {
#pragma unroll
                    for (int s = 0; s < GV2_S; s++)
                        if (nb + s < N) cu_st(a.y, a.y_type, yrow + nb + s, acc[s][j]);
                }
            }
        }
    }
}

/* Launches k_gv2, raising its dynamic shared memory limit to budget when smem needs more than the
 * default 48 KB (per call: the attribute is per device, and decode shapes never need it). */
template <int F, int M>
static cudaError_t gv2_launch(dim3 grid, int threads, size_t smem, int budget, cudaStream_t st, const gv_args &a,
                              int tok) {
    if (smem > 48 * 1024) {
        cudaError_t ce = cudaFuncSetAttribute(k_gv2<F, M>, cudaFuncAttributeMaxDynamicSharedMemorySize, budget);
        if (ce != cudaSuccess) return ce;
    }
    return cu_launch(k_gv2<F, M>, grid, threads, smem, st, a, tok);
}

static int gv_fmt(const cu_wdesc *w) {
    if (w->fmt == MS_WFMT_PLAIN && w->dtype == MS_BF16 && w->k % 8 == 0) return 0;
    if (w->fmt == MS_WFMT_FP8 && w->k % 16 == 0) return 1;
    if (w->fmt == MS_WFMT_NVFP4 && w->k % 32 == 0) return 2;
    return 3;
}

/* Contract in cuda_internal.cuh. With the device tables (c->W0 != NULL), rows_total > 0 is only a
 * hint: the usual most rows of one group, which sizes the staged path's shared memory (any row count
 * stays correct, in more passes). */
int cu_gemv_grouped(ms_backend *b, const cu_gemv_call *c, ms_err *err) {
    const int mode = c->mode, n_groups = c->n_groups, rows_total = c->rows_total;
    if (n_groups <= 0) return MS_OK;
    if (cu_gemv_mma_usable(b, &c->w0, c->x, c->W0 == NULL)) return cu_gemv_mma(b, c, err);
    gv_args a;
    cu_kargs_set(a, *c);
    MS_ASSERT(mode == 0 || c->W0); /* gate/up fusion needs the device tables */
    MS_ASSERT(!c->bias && !c->w1.w); /* single-group extras are cu_gemv_mma's only */
    cudaStream_t st = cu_of(b)->stream;
    int f = gv_fmt(&c->w0);
    /* staged path: tokens per pass limited by registers, shared memory and the caller's row bound */
    const int KP = (a.K + 31) & ~31;
    int budget = cu_of(b)->max_smem_optin;
    if (budget <= 0 || budget > GV2_SMEM_BUDGET) budget = budget <= 0 ? 48 * 1024 : GV2_SMEM_BUDGET;
    int tok = f <= 2 ? budget / (KP * 2) : 0;
    if (tok > GV2_TOK) tok = GV2_TOK;
    if (rows_total > 0 && tok > rows_total) tok = rows_total;
    if (tok >= 1) {
        const int rpw = mode == 1 ? 2 : 4, nsm = b->gpu.n_sm > 0 ? b->gpu.n_sm : 132;
        int wb = 8; /* warps per block: fewer when the grid would not cover the SMs twice */
        while (wb > 2 && (int64_t)n_groups * cu_blocks(a.N, wb * rpw) < 2 * nsm) wb /= 2;
        dim3 g2(n_groups, cu_blocks(a.N, wb * rpw));
        const size_t smem = (size_t)tok * KP * 2;
        cudaError_t ce = cudaSuccess;
#define GV2_L(F, M) ce = gv2_launch<F, M>(g2, wb * 32, smem, budget, st, a, tok)
        if (mode == 0) {
            switch (f) { case 0: GV2_L(0, 0); break; case 1: GV2_L(1, 0); break; default: GV2_L(2, 0); }
        } else {
            switch (f) { case 0: GV2_L(0, 1); break; case 1: GV2_L(1, 1); break; default: GV2_L(2, 1); }
        }
#undef GV2_L
        CK(ce);
        CK_LAUNCH();
        return MS_OK;
    }
    dim3 grid(n_groups, cu_blocks(a.N, GV_WARPS * GV_RPW));
    cudaError_t le = cudaSuccess;
#define GV_L(F, M) le = cu_launch(k_gemv<F, M>, grid, GV_WARPS * 32, 0, st, a)
    if (mode == 0) {
        switch (f) { case 0: GV_L(0, 0); break; case 1: GV_L(1, 0); break; case 2: GV_L(2, 0); break; default: GV_L(3, 0); }
    } else {
        switch (f) { case 0: GV_L(0, 1); break; case 1: GV_L(1, 1); break; case 2: GV_L(2, 1); break; default: GV_L(3, 1); }
    }
#undef GV_L
    CK(le);
    return MS_OK;
}

/* ---- grouped tensor-core GEMM ---- */

using namespace nvcuda;

#define GG_BM CU_GG_BM
#define GG_BN 64
#define GG_BK 32
#define GG_LDS (GG_BK + 8)
#define GG_LDC (GG_BN + 4)

struct gg_args : cu_gg_kargs {
    int vec; /* K % 32 == 0 and format-aligned: vector tile loads */
};

/* Loads the W tile rows [n0, n0+64) x cols [k0, k0+32) into Bs as bf16 (0 outside). */
__device__ __forceinline__ void gg_load_w(const cu_wdesc &W, int n0, int k0, int vec, bf16 (*Bs)[GG_LDS]) {
    const int tid = threadIdx.x, N = W.n, K = W.k;
    if (vec && W.fmt == MS_WFMT_PLAIN) {
        for (int i = tid; i < GG_BN * 4; i += 128) {
            int r = i / 4, cc = (i % 4) * 8, n = n0 + r;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (n < N) v = __ldg((const uint4 *)((const bf16 *)W.w + (size_t)n * K + k0 + cc));
            *(uint4 *)&Bs[r][cc] = v;
        }
    } else if (vec && W.fmt == MS_WFMT_FP8) {
        int r = tid / 2, cc = (tid % 2) * 16, n = n0 + r;
        uint4 v = make_uint4(0, 0, 0, 0);
        float sc = 0.f;
        if (n < N) {
            v = __ldg((const uint4 *)((const uint8_t *)W.w + (size_t)n * K + k0 + cc));
            sc = __ldg((const float *)W.scale + (size_t)(n / 128) * W.scale_ld + (k0 + cc) / 128);
        }
        uint32_t ws[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int bb = 0; bb < 4; bb += 2) {
                float a0 = __fmul_rn(e4m3_fast((ws[q] >> (8 * bb)) & 0xffu), sc);
                float a1 = __fmul_rn(e4m3_fast((ws[q] >> (8 * bb + 8)) & 0xffu), sc);
                *(__nv_bfloat162 *)&Bs[r][cc + q * 4 + bb] = __floats2bfloat162_rn(a0, a1);
            }
    } else if (vec && W.fmt == MS_WFMT_NVFP4) {
        int r = tid / 2, hh = tid % 2, n = n0 + r;
        uint2 v = make_uint2(0, 0);
        float bs = 0.f;
        if (n < N) {
            v = __ldg((const uint2 *)((const uint8_t *)W.w + (size_t)n * (K / 2) + k0 / 2 + hh * 8));
            uint8_t s = __ldg((const uint8_t *)W.scale + (size_t)n * (K / 16) + k0 / 16 + hh);
            bs = __fmul_rn(cu_e4m3(s), W.scale2);
        }
        uint32_t ws[2] = {v.x, v.y};
#pragma unroll
        for (int q = 0; q < 2; q++)
#pragma unroll
            for (int i = 0; i < 8; i += 2) {
                float a0 = __fmul_rn(e2m1_fast(ws[q] >> (4 * i)), bs);
                float a1 = __fmul_rn(e2m1_fast(ws[q] >> (4 * i + 4)), bs);
                *(__nv_bfloat162 *)&Bs[r][hh * 16 + q * 8 + i] = __floats2bfloat162_rn(a0, a1);
            }
    } else {
        for (int i = tid; i < GG_BN * GG_BK; i += 128) {
            int r = i / GG_BK, cc = i % GG_BK, n = n0 + r, k = k0 + cc;
            float v = (n < N && k < K) ? cu_deq(W, n, k) : 0.f;
            Bs[r][cc] = __float2bfloat16_rn(v);
        }
    }
}

template <int MODE>
__global__ __launch_bounds__(128) void k_gg(gg_args a) {
    cu_pdl_wait();
    cu_pdl_trigger();
    __shared__ __align__(128) bf16 As[GG_BM][GG_LDS];
    __shared__ __align__(128) bf16 Bs0[GG_BN][GG_LDS];
    __shared__ __align__(128) bf16 Bs1[MODE == 1 ? GG_BN : 1][GG_LDS];
    __shared__ __align__(128) float Cs[GG_BM][GG_LDC];
    const int tile = blockIdx.x;
    if (tile >= a.tile_off[a.n_groups]) return;
    int lo = 0, hi = a.n_groups - 1; /* last g with tile_off[g] <= tile */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (a.tile_off[mid] <= tile) lo = mid; else hi = mid - 1;
    }
    const int g = lo;
    const int m0 = (tile - a.tile_off[g]) * GG_BM;
    const int rows = min(GG_BM, a.row_cnt[g] - m0);
    if (rows <= 0) return;
    const int rbase = a.row_off[g] + m0;
    const int n0 = blockIdx.y * GG_BN;
    const cu_wdesc W0 = a.W0[g];
    cu_wdesc W1 = W0;
    if (MODE == 1) W1 = a.W1[g];
    const int K = a.K, tid = threadIdx.x, warp = tid / 32;
    const int wm = (warp / 2) * 32, wn = (warp % 2) * 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc0[2][2], acc1[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            wmma::fill_fragment(acc0[i][j], 0.f);
            if (MODE == 1) wmma::fill_fragment(acc1[i][j], 0.f);
        }
    for (int k0 = 0; k0 < K; k0 += GG_BK) {
        /* A tile */
        if (a.vec) {
            for (int i = tid; i < GG_BM * 4; i += 128) {
                int r = i / 4, cc = (i % 4) * 8;
                uint4 v = make_uint4(0, 0, 0, 0);
                if (r < rows) v = __ldg((const uint4 *)(a.x + (size_t)(rbase + r) * K + k0 + cc));
                *(uint4 *)&As[r][cc] = v;
            }
        } else {
            for (int i = tid; i < GG_BM * GG_BK; i += 128) {
                int r = i / GG_BK, cc = i % GG_BK;
                As[r][cc] = (r < rows && k0 + cc < K) ? a.x[(size_t)(rbase + r) * K + k0 + cc] : __float2bfloat16_rn(0.f);
            }
        }
        gg_load_w(W0, n0, k0, a.vec, Bs0);
        if (MODE == 1) gg_load_w(W1, n0, k0, a.vec, Bs1);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GG_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], &As[wm + i * 16][kk], GG_LDS);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                wmma::load_matrix_sync(fb, &Bs0[wn + j * 16][kk], GG_LDS);
#pragma unroll
                for (int i = 0; i < 2; i++) wmma::mma_sync(acc0[i][j], fa[i], fb, acc0[i][j]);
                if (MODE == 1) {
                    wmma::load_matrix_sync(fb, &Bs1[wn + j * 16][kk], GG_LDS);
#pragma unroll
                    for (int i = 0; i < 2; i++) wmma::mma_sync(acc1[i][j], fa[i], fb, acc1[i][j]);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            if (MODE == 1) {
#pragma unroll
                for (int e = 0; e < acc0[i][j].num_elements; e++)
                    acc0[i][j].x[e] = cu_silu(acc0[i][j].x[e]) * acc1[i][j].x[e];
            }
            wmma::store_matrix_sync(&Cs[wm + i * 16][wn + j * 16], acc0[i][j], GG_LDC, wmma::mem_row_major);
        }
    __syncthreads();
    for (int i = tid; i < GG_BM * GG_BN; i += 128) {
        int r = i / GG_BN, cc = i % GG_BN, n = n0 + cc;
        if (r < rows && n < a.N) {
            size_t yi = (size_t)(rbase + r) * a.ldy + n;
            if (MODE == 1) ((bf16 *)a.y)[yi] = __float2bfloat16_rn(Cs[r][cc]);
            else cu_st(a.y, a.y_type, yi, Cs[r][cc]);
        }
    }
}

/* Contract in cuda_internal.cuh. */
int cu_gemm_grouped(ms_backend *b, const cu_gg_call *c, ms_err *err) {
    if (c->n_groups <= 0 || c->max_tiles <= 0) return MS_OK;
    int launched = 0; /* the mma.sync kernel (gemm_mma.cu) when it covers the call */
    MS_TRY(cu_gemm_grouped_mma(b, c, &launched, err));
    if (launched) return MS_OK;
    const cu_wdesc *w_host = &c->w0;
    gg_args a;
    cu_kargs_set(a, *c);
    a.vec = (a.K % GG_BK == 0) &&
            ((w_host->fmt == MS_WFMT_PLAIN && w_host->dtype == MS_BF16) || w_host->fmt == MS_WFMT_FP8 ||
             w_host->fmt == MS_WFMT_NVFP4);
    dim3 grid(c->max_tiles, cu_blocks(a.N, GG_BN));
    cudaStream_t st = cu_of(b)->stream;
    if (c->mode == 1) CK(cu_launch(k_gg<1>, grid, 128, 0, st, a));
    else CK(cu_launch(k_gg<0>, grid, 128, 0, st, a));
    return MS_OK;
}
