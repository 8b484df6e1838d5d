/* gemv_w8.cu - the one-token NVFP4 product (batch-1 decode: routed experts, the shared expert, NVFP4
 * linears) on Hopper's FP8 tensor cores: same contract as cu_gemv_mma, which hands it the calls it
 * covers.
 *
 * Why. At batch 1 the mma.sync kernel (gemv_mma.cu) is issue-bound on turning e2m1 nibbles into bf16
 * (~4 instructions per weight byte, 221 per KB with the rest: bench/NOTES.md), so it streams 1.8-2.2
 * TB/s of a 4.2 TB/s bus. A nibble becomes an e4m3 byte with 2 masks and a shift per 4 weights, and
 * wgmma takes e4m3 operands from registers (mma.sync's e4m3 form is emulated on sm_90, wgmma's is not):
 * ~100 instructions per KB. Measured (H200, bench/NOTES.md "Session 8"): correct, but slower than
 * gemv_mma's v3 at every shape tried (Air b1 7.0 vs 6.8 ms, GLM-5 x12 4.0 vs 3.4 ms): the one-token
 * product is bound by each warpgroup's load-to-use latency and by the per-block B tiles (8 bytes of
 * shared memory per k), not by the decode's instruction count. Hence opt-in (MS_CU_GEMV_FP4=w8).
 *
 * Layout. A block is NWG warpgroups over 64 weight rows (16 a warp), one token at a time; a warpgroup
 * takes one weight (mode 1: gate or up) and a share of K. A lane (g = lane>>2, t = lane&3) loads, per
 * super-step j (128 k), the 16 bytes at k j*128 + 32t of rows g and g+8 (lane group t's chunk: two
 * 16-k scale blocks), W8_PD super-steps ahead of its math. Word q of the chunk (8 k) is one
 * wgmma.m64n8k32 step: its low nibbles (k +0,2,4,6) fill the A slots 4t..4t+3, its high nibbles
 * (k +1,3,5,7) the slots 16+4t..16+4t+3 (PTX A fragment for 8-bit types: a0 row g / a1 row g+8 at
 * k 4t.., a2 / a3 at 16+4t..). So each k32 step mixes the four lane groups' chunks, i.e. four
 * different scale blocks per row. The activations sort that out: B (32 slots x 8 columns) is zero
 * except column c < 4, which holds x_hi at lane group c's slots, and column 4 + c, which holds x_lo
 * there. Column c of D is then lane group c's own partial, from one scale block: two steps (words
 * 2h, 2h+1: scale block h of every chunk) accumulate in a fresh D, and each lane multiplies its two
 * columns (2t, 2t+1: lane groups 2(t&1), 2(t&1)+1, hi for t < 2, lo for t >= 2) by weight scale x
 * activation scale into fp32 accumulators. The four lanes of a row sum their accumulators at the end.
 * Columns: at one token 8 is wgmma's narrowest N, and it is exactly hi + lo of four lane groups.
 *
 * Exactness. A: e2m1 bits placed in an e4m3 byte (sign to bit 7, e1 e0 m to bits 4..2) give e2m1 * 2^-6
 * exactly (the 0.5 code becomes an e4m3 subnormal). B: each 16-k block of x is scaled by a power of
 * two sx (its largest |x| to (224, 448]) and split into hi = e4m3(x / sx) and lo = e4m3(x / sx - hi):
 * a bf16 has 8 significant bits, e4m3 4, so hi + lo = x / sx exactly wherever |x / sx| >= 2^-2 (lo's
 * last bit is then at least e4m3's subnormal step 2^-9); smaller elements (below ~2^-10.8 of their
 * block's largest) are off by at most 2^-10 sx, i.e. ~2^-18 of the block's largest |x|. Every product is
 * exact (2 x 4 significant bits); the tensor core adds the eight of a column and step, and the next
 * step's eight, with less than fp32's precision (Hopper's FP8 adder keeps ~14 bits relative to the
 * largest term, DeepSeek-V3 report): ~2^-13 of a hi column's block partial, which keeping hi and lo in
 * separate columns stops from swallowing lo. Each block's
 * partial is multiplied by its weight scale (e4m3, exact in fp32) and sx (a power of two) and added
 * in fp32, in a fixed order (deterministic). The 2^6 and the per-tensor scale2 multiply the row's sum.
 * Against the CPU reference (bf16 x, fp32 sums) this differs by summation order and the small-element
 * bound above: test_cuda_ops and test_moe_cuda hold it to their usual tolerance.
 *
 * B tiles. Step s = 4j + q has a 256-byte tile in shared memory in wgmma's unswizzled K-major form: two
 * 8 x 16-byte core matrices (slots 0..15, then 16..31), row n = column n of B. Only word (n & 3) of a
 * row is nonzero, so the thread that quantizes 16-k block b writes whole rows: its two words' hi/lo,
 * low/high-nibble orders. Both descriptor strides are 128 bytes (only one core matrix along N exists,
 * so the stride that wgmma ignores cannot be the wrong one). */
#include "backend/cuda/cuda_internal.cuh"

#include <cuda_fp8.h>
#include <math.h>
#include <string.h>

#define W8_ROWS 64 /* weight rows of a block (one warpgroup, 16 a warp) */
#define W8_THREADS 128

/* e2m1 nibbles -> e4m3 bytes holding e2m1 * 2^-6 exactly (see the file comment). w8_lo: the low nibble of
 * each byte of w (k +0, +2, +4, +6 of its word); w8_hi: the high ones (k +1, +3, +5, +7). */
__device__ __forceinline__ uint32_t w8_lo(uint32_t w) { return ((w & 0x07070707u) << 2) | ((w & 0x08080808u) << 4); }
__device__ __forceinline__ uint32_t w8_hi(uint32_t w) { return ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u); }

/* Descriptor of one B tile (PTX ISA "Matrix Descriptor Format"): start >> 4, both strides 128 bytes,
 * no swizzle. */
__device__ __forceinline__ uint64_t w8_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(128 >> 4) << 32);
}

#if CU_HAVE_WGMMA
/* d (64 x 8 fp32; this thread's rows g, g+8 of its warp's 16, columns 2t, 2t+1) = A (64 x 32 e4m3,
 * registers) * B (32 x 8 e4m3, descriptor b); w8_mma_acc adds to d instead. */
__device__ __forceinline__ void w8_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b));
}
__device__ __forceinline__ void w8_mma_acc(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, 1, 1, 1;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b));
}
#endif

/* One super-step's loads of a lane for one weight: its 16-byte chunks of rows g and g+8, and for each
 * row the four scale bytes its D columns need (blocks j*8 + 4(t&1) + 0..3: see w8_step). */
struct w8_raw {
    uint4 w[2];
    uint32_t sc[2];
};

__device__ __forceinline__ void w8_load(w8_raw &r, const uint8_t *const (&wrow)[2], const uint8_t *const (&srow)[2], int j,
                                        int nss, int ti) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        r.w[h] = j < nss ? __ldg((const uint4 *)(wrow[h] + (size_t)j * 64 + ti * 16)) : make_uint4(0, 0, 0, 0);
        r.sc[h] = j < nss ? __ldg((const uint32_t *)(srow[h] + (size_t)j * 8 + 4 * (ti & 1))) : 0u;
    }
}

/* Quantizes one token row x[0..K) into the B tiles and the block scales sxs[K/16] (see the file
 * comment); every byte of the K/32 * 4 tiles is written. */
template <int NWG> __device__ __forceinline__ void w8_stage(const bf16 *x, int K, uint8_t *tiles, float *sxs) {
    for (int b = threadIdx.x; b < K / 16; b += W8_THREADS * NWG) {
        const uint4 u[2] = {((const uint4 *)x)[2 * b], ((const uint4 *)x)[2 * b + 1]};
        float v[16];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t p[4] = {u[i].x, u[i].y, u[i].z, u[i].w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                v[8 * i + 2 * e] = __uint_as_float(p[e] << 16);
                v[8 * i + 2 * e + 1] = __uint_as_float(p[e] & 0xffff0000u);
            }
        }
        float amax = 0.f;
        bool finite = true;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            amax = fmaxf(amax, fabsf(v[i]));
            finite = finite && fabsf(v[i]) <= 3.402823466e38f;
        }
        int e;
        frexpf(amax * (1.f / 448.f), &e); /* amax / 2^e in (224, 448] up to rounding (satfinite clamps) */
        e = e < -100 ? -100 : e;
        const float inv = __uint_as_float((uint32_t)(127 - e) << 23), sx = __uint_as_float((uint32_t)(127 + e) << 23);
        const int j = b >> 3, c = (b >> 1) & 3;
#pragma unroll
        for (int qq = 0; qq < 2; qq++) {
            /* [0]: k +0, +2, +4, +6 of the word (the A slots of w8_lo, core matrix 0); [1]: k +1, +3, +5, +7 */
            uint32_t hi2[2] = {0u, 0u}, lo2[2] = {0u, 0u};
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float xs = v[8 * qq + i] * inv;
                const __nv_fp8_storage_t hb = __nv_cvt_float_to_fp8(xs, __NV_SATFINITE, __NV_E4M3);
                const float hf = cu_e4m3(hb);
                const __nv_fp8_storage_t lb = __nv_cvt_float_to_fp8(xs - hf, __NV_SATFINITE, __NV_E4M3);
                hi2[i & 1] |= (uint32_t)hb << (8 * (i >> 1));
                lo2[i & 1] |= (uint32_t)lb << (8 * (i >> 1));
            }
            uint8_t *t = tiles + (size_t)(4 * j + 2 * (b & 1) + qq) * 256;
#pragma unroll
            for (int cm = 0; cm < 2; cm++) {
                const uint32_t hi = hi2[cm], lo = lo2[cm];
                *(uint4 *)(t + cm * 128 + c * 16) =
                    make_uint4(c == 0 ? hi : 0u, c == 1 ? hi : 0u, c == 2 ? hi : 0u, c == 3 ? hi : 0u);
                *(uint4 *)(t + cm * 128 + (c + 4) * 16) =
                    make_uint4(c == 0 ? lo : 0u, c == 1 ? lo : 0u, c == 2 ? lo : 0u, c == 3 ? lo : 0u);
            }
        }
        sxs[b] = finite ? sx : __int_as_float(0x7fc00000); /* Inf/NaN in x: the outputs become NaN */
    }
}

#if CU_HAVE_WGMMA
/* Super-step j of one weight (r: the lane's loads) into acc (D fragment order: row g col 2t, g 2t+1,
 * g+8 2t, g+8 2t+1). Scale byte 2*ii + hh of a row's word is block j*8 + 4(t&1) + 2ii + hh: lane group
 * 2(t&1) + ii (this lane's D column parity ii), scale block hh of its chunk; sxs likewise. */
__device__ __forceinline__ void w8_step(float (&acc)[4], const w8_raw &r, uint32_t tbase, const float *sxs, int j,
                                        int ti) {
    uint32_t A[4][4];
    const uint32_t wg[4] = {r.w[0].x, r.w[0].y, r.w[0].z, r.w[0].w};
    const uint32_t wh[4] = {r.w[1].x, r.w[1].y, r.w[1].z, r.w[1].w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        A[q][0] = w8_lo(wg[q]);
        A[q][1] = w8_lo(wh[q]);
        A[q][2] = w8_hi(wg[q]);
        A[q][3] = w8_hi(wh[q]);
        cu_wg_reg_fence(A[q]); /* the fragments are written before the fence */
    }
    float D[2][4];
    cu_wg_fence();
    const uint32_t t0 = tbase + (uint32_t)j * 1024u;
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const uint32_t(&a)[4] = A[2 * hh], (&b)[4] = A[2 * hh + 1];
        w8_mma(D[hh], a[0], a[1], a[2], a[3], w8_desc(t0 + 2 * hh * 256));
        w8_mma_acc(D[hh], b[0], b[1], b[2], b[3], w8_desc(t0 + (2 * hh + 1) * 256));
    }
    cu_wg_commit();
    cu_wg_wait<0>();
    cu_wg_acc_fence(D[0]);
    cu_wg_acc_fence(D[1]);
    const float4 x4 = *(const float4 *)(sxs + j * 8 + 4 * (ti & 1));
    const float sx[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
    for (int rr = 0; rr < 2; rr++) { /* row g, g+8: scale bytes 0..3 = (ii 0, hh 0), (0, 1), (1, 0), (1, 1) */
        const uint32_t sc = r.sc[rr];
        const __half2_raw p01 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(sc & 0xffffu), __NV_E4M3);
        const __half2_raw p23 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(sc >> 16), __NV_E4M3);
        const float f[4] = {__half2float(__half(__half_raw{p01.x})), __half2float(__half(__half_raw{p01.y})),
                            __half2float(__half(__half_raw{p23.x})), __half2float(__half(__half_raw{p23.y}))};
#pragma unroll
        for (int ii = 0; ii < 2; ii++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int byte = 2 * ii + hh, i = 2 * rr + ii;
                acc[i] = fmaf(D[hh][i], f[byte] * sx[byte], acc[i]);
            }
    }
}
#endif

/* Weights are read W8_PD super-steps ahead of the math, in registers. What hides the memory latency is
 * warps: a warpgroup's super-step is a chain of dependent instructions plus a wgmma round trip, so an SM
 * needs 16-32 warps in flight (H200, first form: one warpgroup a block doing gate and up, 163-168
 * registers, 6 warps an SM on Air's gate/up: 36-39 us against the mma.sync kernel's 29.6). Every form
 * is held to 64 registers (32 warps an SM). */
#define W8_PD 2

/* Block: NWG warpgroups over the same 64 rows. Mode 0: warpgroup wg takes super-steps wg, wg + NWG, ...
 * (a K split). Mode 1: warpgroup wg takes weight wg & 1 (gate, up) and super-steps wg >> 1, + NWG / 2,
 * ... Their row sums meet in shared memory and are added in a fixed order. */
template <int MODE, int NWG>
__global__ __launch_bounds__(W8_THREADS *NWG, 8 / NWG) void k_gw8(cu_gemv_kargs a) {
    cu_pdl_wait();
    cu_pdl_trigger();
#if CU_HAVE_WGMMA
    extern __shared__ __align__(128) uint8_t w8_smem[];
    constexpr int S = MODE == 1 ? 2 : 1, KS = NWG / S; /* weights, K shares */
    static_assert(KS >= 1, "mode 1 needs two warpgroups");
    const int g = blockIdx.x;
    if (a.n_active && g >= *a.n_active) return;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, gi = lane >> 2, ti = lane & 3;
    const int stream = wg % S, ks = wg / S;
    int off = 0, cnt = a.rows_total;
    cu_wdesc W;
    if (a.W0) {
        const int wid = a.group_w ? a.group_w[g] : g;
        W = stream ? a.W1[wid] : a.W0[wid];
        off = a.row_off[wid];
        cnt = a.row_cnt[wid];
    } else {
        W = stream ? a.w1 : a.w0;
    }
    if (cnt <= 0) return; /* block-uniform: before any barrier */
    const int K = a.K, N = a.N, nss = K / 128;
    const int m0 = blockIdx.y * W8_ROWS + warp * 16;
    const uint8_t *wrow[2], *srow[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const size_t n = (size_t)min(m0 + gi + 8 * h, N - 1); /* clamped rows are computed, not stored */
        wrow[h] = (const uint8_t *)W.w + n * (size_t)(K / 2);
        srow[h] = (const uint8_t *)W.scale + n * (size_t)(K / 16);
    }
    uint8_t *tiles = w8_smem;
    float *sxs = (float *)(w8_smem + (size_t)K * 8);
    float *red = sxs + K / 16; /* [NWG][64] row sums, warpgroup-major */
    const uint32_t tbase = cu_saddr(tiles);

    for (int r0 = 0; r0 < cnt; r0++) {
        w8_raw ring[W8_PD];
#pragma unroll
        for (int p = 0; p < W8_PD; p++) w8_load(ring[p], wrow, srow, ks + p * KS, nss, ti);
        if (r0 > 0) __syncthreads(); /* the previous token's wgmmas and row sums are done with shared memory */
        const int r = off + r0, xrow = a.row_idx ? a.row_idx[r] : r;
        w8_stage<NWG>(a.x + (size_t)xrow * K, K, tiles, sxs);
        cu_wg_proxy_fence();
        __syncthreads();
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int j = ks; j < nss; j += W8_PD * KS) {
#pragma unroll
            for (int p = 0; p < W8_PD; p++) {
                const int jj = j + p * KS;
                if (jj < nss) { /* warpgroup-uniform */
                    const w8_raw cur = ring[p];
                    w8_load(ring[p], wrow, srow, jj + W8_PD * KS, nss, ti);
                    w8_step(acc, cur, tbase, sxs, jj, ti);
                }
            }
        }
        /* a row's sum: the lane's two columns, then the row's four lanes (times 2^6 and this weight's
         * scale2), then the K shares (fixed order) */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float t = acc[2 * h] + acc[2 * h + 1];
            t += __shfl_xor_sync(0xffffffffu, t, 1);
            t += __shfl_xor_sync(0xffffffffu, t, 2);
            if (ti == 0) red[wg * W8_ROWS + warp * 16 + gi + 8 * h] = t * (64.f * W.scale2);
        }
        __syncthreads();
        if (threadIdx.x < W8_ROWS) {
            const int n = blockIdx.y * W8_ROWS + threadIdx.x;
            float v[S];
#pragma unroll
            for (int s = 0; s < S; s++) {
                v[s] = 0.f;
                for (int k = 0; k < KS; k++) v[s] += red[(k * S + s) * W8_ROWS + threadIdx.x];
            }
            if (n < N) {
                const size_t yi = (size_t)r * a.ldy + n;
                if (MODE == 1) ((bf16 *)a.y)[yi] = __float2bfloat16_rn(cu_silu(v[0]) * v[S - 1]);
                else cu_st(a.y, a.y_type, yi, v[0] + (a.bias ? a.bias[n] : 0.f));
            }
        }
    }
#else
    (void)a;
    __trap(); /* no sm_90a code in this build: the host never launches it (cu_impl.have_wgmma) */
#endif
}

static long long w8_launches; /* ms_cuda_w8_launches; updated atomically */

/* Contract in backend_cuda.h. */
extern "C" long long ms_cuda_w8_launches(void) { return __atomic_load_n(&w8_launches, __ATOMIC_RELAXED); }

/* The instantiated forms, by [mode][log2 warpgroups a block] (mode 1 needs 2 or 4), with their launchers
 * (the shared-memory limit was set by cu_occupancy). */
typedef cudaError_t (*w8_go_fn)(dim3 grid, size_t smem, cudaStream_t st, const cu_gemv_kargs &a);
template <int M, int NWG> static cudaError_t w8_go(dim3 grid, size_t smem, cudaStream_t st, const cu_gemv_kargs &a) {
    return cu_launch(k_gw8<M, NWG>, grid, dim3(W8_THREADS * NWG), smem, st, a);
}
static const struct {
    const void *kern;
    w8_go_fn go;
} w8_forms[2][3] = {{{(const void *)k_gw8<0, 1>, w8_go<0, 1>}, {(const void *)k_gw8<0, 2>, w8_go<0, 2>},
                     {(const void *)k_gw8<0, 4>, w8_go<0, 4>}},
                    {{NULL, NULL}, {(const void *)k_gw8<1, 2>, w8_go<1, 2>}, {(const void *)k_gw8<1, 4>, w8_go<1, 4>}}};

/* Contract in cuda_internal.cuh. Warpgroups per block (mode 1: 2 or 4, mode 0: 1, 2 or 4; each keeping
 * >= 4 super-steps): the fewest waves (resident blocks from the occupancy calculator), then the most
 * resident warps, so a call with few row tiles (Air's gate/up: 198 at batch 1) gets more warps without
 * a second wave. Several tokens on one group (a device table's rows_total is a hint) stay correct but
 * re-read the group's weights once per token. */
int cu_gemv_w8(ms_backend *b, const cu_gemv_call *c, int *launched, ms_err *err) {
    *launched = 0;
    const cu_wdesc *w = &c->w0;
    const int K = w->k, N = w->n, single = c->W0 == NULL;
    if (b->gpu.cc_major != 9 || !cu_of(b)->have_wgmma || w->fmt != MS_WFMT_NVFP4 || c->rows_total != 1 || K <= 0 ||
        N <= 0 || K % 128 != 0 || c->n_groups <= 0)
        return MS_OK;
    if (c->mode == 1 && !(single ? c->w1.w != NULL : c->W1 != NULL)) return MS_OK;
    /* 4-byte scale loads: device tables are taken to follow their expert 0, as cu_gemv_mma's v3 does */
    if (((uintptr_t)w->scale & 3) || (single && c->mode == 1 && ((uintptr_t)c->w1.scale & 3)) || ((uintptr_t)c->x & 15))
        return MS_OK;
    const int gy = (N + W8_ROWS - 1) / W8_ROWS, S = c->mode == 1 ? 2 : 1, nss = K / 128;
    const size_t base = (size_t)K * 8 + (size_t)(K / 16) * sizeof(float);
    if (base + (size_t)4 * W8_ROWS * sizeof(float) > (size_t)cu_of(b)->max_smem_optin || gy > 65535) return MS_OK;
    cu_gemv_kargs a;
    memset(&a, 0, sizeof a);
    cu_kargs_set(a, *c);
    if (!c->w1.w) a.w1 = c->w0;
    const int64_t blocks = (int64_t)c->n_groups * gy;
    const int nsm = b->gpu.n_sm > 0 ? b->gpu.n_sm : 132;
    int pick = -1;
    int64_t best_waves = 0, best_warps = 0;
    for (int i = c->mode == 1 ? 1 : 0; i <= 2; i++) {
        const int nwg = 1 << i;
        if (i > (c->mode == 1 ? 1 : 0) && nss < 4 * (nwg / S)) continue;
        const size_t smem = base + (size_t)nwg * W8_ROWS * sizeof(float);
        int bps = 0;
        MS_TRY(cu_occupancy(b, w8_forms[c->mode][i].kern, W8_THREADS * nwg, smem, &bps, err));
        if (bps <= 0) continue;
        const int64_t slots = (int64_t)bps * nsm, waves = (blocks + slots - 1) / slots;
        const int64_t warps = (blocks < slots ? blocks : slots) * nwg * 4;
        if (pick < 0 || waves < best_waves || (waves == best_waves && warps > best_warps))
            pick = i, best_waves = waves, best_warps = warps;
    }
    if (pick < 0) return MS_OK; /* no form fits an SM */
    const size_t smem = base + (size_t)(1 << pick) * W8_ROWS * sizeof(float);
    const dim3 grid(c->n_groups, gy);
    cudaStream_t st = cu_of(b)->stream;
    const cudaError_t e = w8_forms[c->mode][pick].go(grid, smem, st, a);
    CK(e);
    __atomic_fetch_add(&w8_launches, 1, __ATOMIC_RELAXED);
    *launched = 1;
    return MS_OK;
}
