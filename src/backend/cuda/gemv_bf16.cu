/* gemv_bf16.cu - y = x·Wᵀ for plain bf16 weights at 1..4 rows of x: the batch-1 (and speculative
 * few-token) decode form of the attention projections, dense MLPs and the lm_head, which read 10 of
 * GLM-4.5-Air's 15.5 GB a step. Same results as the other linear forms up to summation order (bf16
 * products are exact in fp32, sums in fp32).
 *
 * Why not cuBLASLt or gemv_mma's bf16 form: at one row cuBLASLt reaches 3.3-3.8 TB/s with a GEMM tile
 * (splitting K for narrow outputs, then a reduction kernel) and starts only after the previous kernel
 * has fully completed (it carries no PDL attribute); gemv_mma's form reads 64 bytes of 16 rows per warp
 * step. Here every warp streams whole 512-byte runs of one row at a time through a shared-memory ring,
 * GB_D - 1 steps (3.5 KB a warp, ~110 KB an SM) ahead of its math, so HBM sees long sequential reads
 * and enough bytes in flight, and the multiply-adds run on CUDA cores (~35 instructions per 16 weight
 * bytes at one row), or on tensor cores with MS_CU_BF16_STREAM_MMA (gemv_tc.cuh: each lane's 16 bytes
 * placed so that no fragment shuffling is needed; ~21 fewer instructions a step, under measurement).
 * Holding the steps in registers instead (version 1 in bench/NOTES.md) capped the depth at 4 steps and
 * the kernel at ~2.9 TB/s. H200, ncu: the lm_head streams at 4.38 TB/s (91% of the DRAM
 * peak), GLM-4.5-Air's 117 MB q|k|v at 3.6 (ramp and tail of a 32 us kernel).
 *
 * Work split. A block is GB_WARPS warps over (GB_WARPS / ks) row groups x ks K shares; warp (rg, kq)
 * streams rows r0 .. r0 + rpw - 1 over 16-byte chunks [kq * kc, (kq + 1) * kc) of K. The host picks
 * ks and rpw so the whole grid is resident in one wave with the least bytes on the busiest warp. A
 * warp's rows end in a shuffle reduction; its partial goes to shared memory, and after one barrier the
 * block sums the ks partials of each row in K order (deterministic) and writes y (+ bias; mode 1:
 * silu(gate) * up of two weights read in the same steps).
 *
 * PDL and the weights before the wait. The weights of a decode step do not depend on the previous
 * kernel, so when the caller knows that no device work in flight writes them (cu_gvb_call.weights_quiet:
 * the backend has synchronised since the last kernel that wrote weights, cu_impl.weights_quiet) each
 * warp copies its first GB_D - 1 steps into its ring before griddepcontrol.wait: a kernel launched early
 * under PDL (cuda_internal.cuh) thus has its first loads in flight while the previous kernel (a norm,
 * attention) still runs. x, which the previous kernel writes, is read only after the wait, and nothing
 * is written to global memory before it, so the wait-first argument of cuda_internal.cuh still holds
 * for everything but those weight reads.
 *
 * Folded input norm (cu_gvb_call.norm, one row): instead of reading x, every block computes it from the
 * residual row with cu_norm_stage after the wait, while its first weight steps are already in flight;
 * this replaces the norm kernel before the q|k|v (or q_a|kv_a) projection and its link in the chain. */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gemv_walk.cuh"
#include "backend/cuda/gemv_tc.cuh"
#include "backend/cuda/norm_stage.cuh"

#include <string.h>

#define GB_WARPS 8
#define GB_THREADS (GB_WARPS * 32)
#define GB_D GD_RING /* ring stages per warp and weight stream: 512-byte steps, GB_D - 1 in flight */
#define GB_MAX_T 4 /* rows of x per launch (template NT = 1..4) */
static_assert(GB_THREADS >= CU_NORM_T, "k_gvb<1, 2> folds a norm: cu_norm_stage needs CU_NORM_T threads");

struct gb_args {
    const bf16 *w0, *w1; /* [N][K] row-major; w1 = up (mode 1) */
    const float *bias;   /* [N] or NULL (mode 0) */
    const bf16 *x;       /* [NT][K], 16-byte aligned */
    void *y;             /* [NT][ldy] of y_type (mode 1: bf16) */
    int y_type, ldy;
    int N, K;
    int ks;  /* warps per row, each over a contiguous share of K */
    int rpw; /* rows per warp */
    int kc;  /* 16-byte chunks in a K share (the last share may be shorter) */
    int early; /* the weights are not written by device work in flight: their first steps are copied before
                * griddepcontrol.wait (bit 0); early >> 1 more steps a warp are asked of the L2 there */
    int red_units; /* 16-byte units of shared memory for the partials (before the rings) */
    cu_norm_in nin; /* MODE 2: x is computed from it (cu_norm_stage), not read */
};

/* acc[0] += products of the even elements, acc[1] of the odd ones, of 8 weights w and 8 x values xv */
__device__ __forceinline__ void gb_dot8(float (&acc)[2], const uint4 &w, const uint4 &xv) {
    acc[0] = fmaf(cu_bf_lo(w.x), cu_bf_lo(xv.x), acc[0]);
    acc[1] = fmaf(cu_bf_hi(w.x), cu_bf_hi(xv.x), acc[1]);
    acc[0] = fmaf(cu_bf_lo(w.y), cu_bf_lo(xv.y), acc[0]);
    acc[1] = fmaf(cu_bf_hi(w.y), cu_bf_hi(xv.y), acc[1]);
    acc[0] = fmaf(cu_bf_lo(w.z), cu_bf_lo(xv.z), acc[0]);
    acc[1] = fmaf(cu_bf_hi(w.z), cu_bf_hi(xv.z), acc[1]);
    acc[0] = fmaf(cu_bf_lo(w.w), cu_bf_lo(xv.w), acc[0]);
    acc[1] = fmaf(cu_bf_hi(w.w), cu_bf_hi(xv.w), acc[1]);
}

/* The L2 prefetch before the wait (MS_CU_BF16_STREAM_L2PF): steps [s0, s0 + pf) of a warp's walk, the rows
 * (K elements apart from w, the warp's first row at its K share) of spr 512-byte runs over kc 16-byte
 * chunks, as contiguous pieces, one bulk prefetch a row. Out of line: the kernel's prologue registers are
 * the step loop's. */
__device__ __noinline__ void gb_l2pf(const bf16 *w, int K, int kc, int spr, int nsteps, int s0, int pf) {
    const int end = min(nsteps, s0 + pf);
    for (int s = s0; s < end;) {
        const int row = s / spr, run = s - row * spr, n = min(end - s, spr - run);
        const unsigned lo = (unsigned)run * 512u, hi = min((unsigned)(run + n) * 512u, (unsigned)kc * 16u);
        cu_l2_prefetch((const char *)(w + (size_t)row * K) + lo, hi - lo);
        s += n;
    }
}

/* MODE 0: y = x·Wᵀ (+ bias); 1: silu(x·w0ᵀ) * (x·w1ᵀ); 2 (NT = 1): as 0 with x computed from a.nin (its own
 * instance, so that the other forms carry none of its code). TC 1: each step's products on tensor cores
 * (gemv_tc.cuh), else on CUDA cores. D: ring stages a warp and stream, D - 1 steps in flight; the GPU runs
 * GB_D, and 12 for one-row launches of a long K under MS_CU_BF16_STREAM_DEEPK (rings of 10 and 12 stages for
 * every launch measured slower, bench/NOTES.md session 26; session 29's use is to copy more before the
 * wait); the host emulation (tests/backend/gemv_tc_emu) checks the walk at other depths too.
 * Shared memory: x as NT rows of K/8 16-byte units (TC: K/8 + 32, the last 32 zero), the partials
 * red[row of block][kq][stream][t] (red_units), then each warp's weight ring [stream][stage][lane] of
 * 16-byte units. */
template <int NT, int MODE, int TC, int D = GB_D>
__global__ __launch_bounds__(GB_THREADS, MODE == 1 ? 3 : 4) void k_gvb(gb_args a) {
    extern __shared__ uint4 gb_smem[];
    constexpr int S = MODE == 1 ? 2 : 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int ks = a.ks, rg = warp / ks, kq = warp - rg * ks;
    const int K = a.K, K8 = K >> 3, rows_pb = (GB_WARPS / ks) * a.rpw;
    const int r0 = blockIdx.x * rows_pb + rg * a.rpw;
    const int nrow = max(0, min(a.rpw, a.N - r0));
    const int c0 = kq * a.kc, kc = max(0, min(a.kc, K8 - c0));
    const int spr = (kc + 31) >> 5; /* 512-byte steps per row */
    const int nsteps = nrow * spr;
    const bf16 *wp[S];
#pragma unroll
    for (int s = 0; s < S; s++) wp[s] = (s ? a.w1 : a.w0) + (size_t)(nrow > 0 ? r0 : 0) * K + (size_t)c0 * 8;

    /* Weights stream through this warp's ring of D stages in shared memory (cp.async, 16 bytes a lane
     * and step: each lane reads back only what it copied, so no warp barrier), D - 1 steps ahead of
     * the math. The load stream is at row li, run lj; lp = this lane's 16-byte chunk there in w0 (w1's is
     * lp + d1). Steps past the warp's work copy zeros (nothing is read). */
    const int K8p = TC ? K8 + 32 : K8; /* x's row stride in shared memory (TC: 32 zero units after each row) */
    float *red = (float *)(gb_smem + NT * K8p);
    uint4 *ring = gb_smem + NT * K8p + a.red_units + (size_t)warp * (S * D * 32) + lane;
    int li = 0, lj = 0;
    const uint4 *lp = (const uint4 *)wp[0] + lane;
    const ptrdiff_t d1 = (const uint4 *)wp[S - 1] - (const uint4 *)wp[0];
    const int skip = K8 - spr * 32; /* from past a row's last run to the next row's first */
    /* The TC form walks by counts down instead (fewer instructions a step, its point): nload steps left to
     * copy, lleft of them in the load stream's row; only a row's last run can have lanes past the share
     * (kc not a multiple of 32), those with last_ok false. */
    int nload = nsteps, lleft = spr;
    const bool last_ok = lane < kc - (spr - 1) * 32;
    auto put = [&](int stage) {
        bool ok;
        if constexpr (TC) ok = nload > 0 && (lleft != 1 || last_ok);
        else ok = li < nrow && lj * 32 + lane < kc;
#pragma unroll
        for (int s = 0; s < S; s++)
            cu_cp16(cu_saddr(ring + (s * D + stage) * 32), ok ? lp + (s ? d1 : 0) : (const uint4 *)a.w0, ok);
        cu_cp_commit();
        lp += 32;
        if constexpr (TC) {
            nload--;
            if (--lleft == 0) lleft = spr, lp += skip;
        } else {
            if (++lj == spr) lj = 0, li++, lp += skip;
        }
    };
    if (a.early) { /* the first D - 1 steps before the previous kernel completes: see the file comment */
#pragma unroll
        for (int u = 0; u < D - 1; u++) put(u);
        if constexpr (MODE != 2) /* (the folded norm's instance has no registers to spare: the host sends none) */
            if (a.early > 1 && lane == 0) /* and the next early >> 1 steps asked of the L2 */
#pragma unroll
                for (int s = 0; s < S; s++) gb_l2pf(wp[s], K, kc, spr, nsteps, D - 1, a.early >> 1);
    }
    cu_pdl_wait();
    cu_pdl_trigger();
    if (!a.early) {
#pragma unroll
        for (int u = 0; u < D - 1; u++) put(u);
    }

    if constexpr (TC) { /* x rows K8p apart, each unit in gt_step's order, zeros after each row */
        if (MODE == 2) {
            cu_norm_stage(a.nin, gb_smem, 0, K8, gridDim.x, blockIdx.x == 0);
            for (int i = threadIdx.x; i < K8; i += GB_THREADS) gb_smem[i] = gt_perm(gb_smem[i]);
        } else {
            for (int i = threadIdx.x; i < NT * K8; i += GB_THREADS) {
                const int t = i / K8;
                gb_smem[i + t * 32] = gt_perm(__ldcg((const uint4 *)a.x + i));
            }
        }
        for (int i = threadIdx.x; i < NT * 32; i += GB_THREADS) gb_smem[(i / 32 + 1) * K8p - 32 + i % 32] = make_uint4(0u, 0u, 0u, 0u);
        __syncthreads();
    } else if (MODE == 2) {
        cu_norm_stage(a.nin, gb_smem, 0, K8, gridDim.x, blockIdx.x == 0);
    } else {
        for (int i = threadIdx.x; i < NT * K8; i += GB_THREADS) gb_smem[i] = __ldcg((const uint4 *)a.x + i);
        __syncthreads();
    }

    if constexpr (TC) {
        /* acc: each (stream, row of x)'s two C fragments, the dot product on their diagonals (gemv_tc.cuh).
         * Step s0 + u is row ci's run spr - cleft; xo = this lane's chunk of x there. A lane past the share
         * (warp-wide mma) hands zero weights, copied so, and meets the zeros after x's row. A loop of its own:
         * one loop with both steps under `if constexpr` (three shapes tried) changed the scheduling of the
         * CUDA-core instances' code, the default path, whose speed this kernel's history shows to move with
         * its layout; merge once the tensor-core step is measured. */
        float acc[S][NT][2][4];
#pragma unroll
        for (int s = 0; s < S; s++)
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int i = 0; i < 8; i++) acc[s][t][i / 4][i % 4] = 0.f;
        int ci = 0, cleft = spr, xo = c0 + lane;
        for (int s0 = 0; s0 < nsteps; s0 += D) {
#pragma unroll
            for (int u = 0; u < D; u++) {
                if (s0 + u >= nsteps) break; /* warp-uniform */
                cu_cp_wait<D - 2>();         /* step s0 + u landed (D - 1 groups were in flight) */
                uint4 v[S];
#pragma unroll
                for (int s = 0; s < S; s++) v[s] = ring[(s * D + u) * 32];
                put((u + D - 1) % D);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const uint4 xv = gb_smem[t * K8p + xo];
#pragma unroll
                    for (int s = 0; s < S; s++) gt_step(acc[s][t], v[s], xv);
                }
                xo += 32;
                if (--cleft == 0) { /* row ci done: its warp sum to red */
#pragma unroll
                    for (int s = 0; s < S; s++)
#pragma unroll
                        for (int t = 0; t < NT; t++) {
                            const float r = gt_sum(acc[s][t], lane);
                            if (lane == 0) red[(((rg * a.rpw + ci) * ks + kq) * S + s) * NT + t] = r;
#pragma unroll
                            for (int i = 0; i < 8; i++) acc[s][t][i / 4][i % 4] = 0.f;
                        }
                    cleft = spr;
                    xo = c0 + lane;
                    ci++;
                }
            }
        }
    } else {
        float acc[S][NT][2];
#pragma unroll
        for (int s = 0; s < S; s++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[s][t][0] = acc[s][t][1] = 0.f;
        int ci = 0, cj = 0; /* step being computed: row ci, run cj */
        for (int s0 = 0; s0 < nsteps; s0 += D) {
#pragma unroll
            for (int u = 0; u < D; u++) {
                if (s0 + u >= nsteps) break; /* warp-uniform */
                cu_cp_wait<D - 2>();         /* step s0 + u landed (D - 1 groups were in flight) */
                uint4 v[S];
#pragma unroll
                for (int s = 0; s < S; s++) v[s] = ring[(s * D + u) * 32];
                put((u + D - 1) % D); /* step s0 + u + D - 1, into the stage read at step s0 + u - 1 */
                const int ch = cj * 32 + lane;
                if (ch < kc) {
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        const uint4 xv = gb_smem[t * K8 + c0 + ch];
#pragma unroll
                        for (int s = 0; s < S; s++) gb_dot8(acc[s][t], v[s], xv);
                    }
                }
                if (++cj == spr) { /* row ci done: its warp sum to red */
#pragma unroll
                    for (int s = 0; s < S; s++)
#pragma unroll
                        for (int t = 0; t < NT; t++) {
                            float r = acc[s][t][0] + acc[s][t][1];
#pragma unroll
                            for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
                            if (lane == 0) red[(((rg * a.rpw + ci) * ks + kq) * S + s) * NT + t] = r;
                            acc[s][t][0] = acc[s][t][1] = 0.f;
                        }
                    cj = 0;
                    ci++;
                }
            }
        }
    }
    cu_cp_wait<0>(); /* no copy outlives the block */
    __syncthreads();
    /* t-major, so consecutive threads write consecutive outputs */
    for (int i = threadIdx.x; i < NT * rows_pb; i += GB_THREADS) {
        const int t = i / rows_pb, rl = i - t * rows_pb, n = blockIdx.x * rows_pb + rl;
        if (n >= a.N) continue;
        float v[S];
#pragma unroll
        for (int s = 0; s < S; s++) {
            float sum = 0.f;
            for (int q = 0; q < ks; q++) sum += red[((rl * ks + q) * S + s) * NT + t];
            v[s] = sum;
        }
        const size_t yi = (size_t)t * a.ldy + n;
        if (MODE == 1) ((bf16 *)a.y)[yi] = __float2bfloat16_rn(cu_silu(v[0]) * v[S - 1]);
        else cu_st(a.y, a.y_type, yi, v[0] + (a.bias ? a.bias[n] : 0.f));
    }
}

/* Dynamic shared memory of a k_gvb launch: T rows of x of K bf16 (tc: 512 zero bytes after each), the
 * partials (red_units 16-byte units), the rings of D stages of 8 warps and S streams. (Here, before the
 * claiming form, so that the host emulation of k_gvb sizes its launches with it.) */
static size_t gb_smem_bytes(int T, int K, int S, int tc, int red_units, int D) {
    return (size_t)T * K * 2 + (tc ? (size_t)T * 512 : 0) + (size_t)16 * red_units + (size_t)16 * GB_WARPS * S * D * 32;
}

/* ---- The claiming form (MS_CU_BF16_STREAM_DYN, off by default) ----
 *
 * Why: k_gvb fixes every warp's rows before it starts, so the kernel lasts as long as its slowest warp.
 * The warps stream at different rates (DRAM channels, SMs holding 3 or 4 blocks), and a 117 MB
 * projection reaches 3.6 TB/s where the 1.2 GB lm_head reaches 4.38 (session 21). Here the work is cut
 * into units, one K share of one row (2^kshift shares a row, kc chunks each); every warp first streams a
 * static range of q0 units, then claims ranges of g units from a counter, so a warp that ran ahead
 * takes more and the warps finish within about one range of each other.
 *
 * Same bits as k_gvb with the same K split: a unit's sum is the one k_gvb's warp computes for that
 * (row, share) (lane-strided products in two accumulators, the same shuffle tree), and a row's shares
 * are summed in share order from 0.f as k_gvb sums its partials. A row wholly inside a warp's static
 * range is that warp's alone: it sums the shares itself and writes y, as k_gvb does. Any other unit is
 * a share of a row that other warps share (claimed, or at the edge of a static range): its warp stores
 * the partial in part[] and counts the row in rowcnt[]; the warp whose count completes the row sums the
 * partials and writes y. So with static ranges of whole rows only the claimed tail pays for the count.
 *
 * The walk over the ranges (the load stream GB_D - 1 steps ahead of the math, the claims, the hand-over
 * of a range from one stream to the other) is gemv_walk.cuh's, checked on the host by
 * tests/backend/gvd_walk_emu. The counters (ctl[0] claims, ctl[1] warps done) and rowcnt are touched
 * only after griddepcontrol.wait, so a launch sees the previous one's resets; the last warp to finish
 * zeroes ctl, a row's finisher zeroes its rowcnt. Weights before the wait come from the static range
 * only (the host makes q0 units hold the GB_D - 1 early steps, or sets q0 = 0 and copies nothing early). */
struct gd_args {
    const bf16 *w0, *w1; /* [N][K] row-major; w1 = up (mode 1) */
    const float *bias;   /* [N] or NULL (mode 0) */
    const bf16 *x;       /* [NT][K], 16-byte aligned */
    void *y;             /* [NT][ldy] of y_type (mode 1: bf16) */
    int y_type, ldy;
    int N, K;
    int kshift;       /* a row is 2^kshift units (K shares) */
    int kc;           /* 16-byte chunks of a share, a multiple of 32 (the last share may be shorter) */
    int q0;           /* units of each warp's static range (warp w: [w q0, (w + 1) q0)) */
    int g;            /* units a claim takes */
    int early;        /* the first GB_D - 1 steps (all in the static range) are copied before the wait */
    float *part;      /* [N << kshift][S][NT] partials (kshift > 0) */
    unsigned *rowcnt; /* [N] shares of a row done (kshift > 0); zero between launches */
    unsigned *ctl;    /* [0] units claimed past the static ranges, [1] warps done; zero between launches */
};

/* *p += v at GPU scope with acquire-release order, returning the old value: the caller's earlier stores
 * (a row's partial) are seen by whoever reads the count after it, and the caller's later loads (the
 * other shares' partials) see the stores of everyone counted before it; one instruction instead of a
 * full fence before and after a relaxed atomic */
__device__ __forceinline__ unsigned gd_add_acq_rel(unsigned *p, unsigned v) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

/* y[t][n] from a row's S sums v (mode 1: silu(v0) * v1 as bf16; else v0 + bias in y_type) */
template <int MODE>
__device__ __forceinline__ void gd_store(const gd_args &a, int n, int t, const float (&v)[MODE == 1 ? 2 : 1]) {
    const size_t yi = (size_t)t * a.ldy + n;
    if (MODE == 1) ((bf16 *)a.y)[yi] = __float2bfloat16_rn(cu_silu(v[0]) * v[MODE == 1 ? 1 : 0]);
    else cu_st(a.y, a.y_type, yi, v[0] + (a.bias ? a.bias[n] : 0.f));
}

/* MODE 0: y = x·Wᵀ (+ bias); 1: silu(x·w0ᵀ) * (x·w1ᵀ). Shared memory: x as NT rows of K/8 16-byte units,
 * then each warp's weight ring [stream][stage][lane] as in k_gvb. */
template <int NT, int MODE>
__global__ __launch_bounds__(GB_THREADS, MODE == 1 ? 3 : 4) void k_gvd(gd_args a) {
    extern __shared__ uint4 gb_smem[];
    constexpr int S = MODE == 1 ? 2 : 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int K8 = a.K >> 3, W = gridDim.x * GB_WARPS, wid = blockIdx.x * GB_WARPS + warp;
    const gd_shape sh = {K8, a.kc, (1 << a.kshift) - 1, a.kshift, a.N << a.kshift, W * a.q0, a.g};
    const int sb = wid * a.q0, se = sb + a.q0; /* this warp's static range */
    uint4 *ring = gb_smem + NT * K8 + (size_t)warp * (S * GB_D * 32) + lane;
    const ptrdiff_t d1 = (const uint4 *)a.w1 - (const uint4 *)a.w0;
    gd_walk wk;
    gd_walk_init(wk, wid * a.q0, a.q0);
    unsigned claim = 0; /* lane 0: the answer of the claim in flight */
    bool may_claim = false;
    auto ask = [&]() {
        if (lane == 0) claim = atomicAdd(&a.ctl[0], (unsigned)a.g);
    };
    auto take = [&]() { return __shfl_sync(0xffffffffu, claim, 0); };
    auto put = [&](int stage) {
        int u, j, kcu;
        const bool real = gd_load(wk, sh, may_claim, ask, take, u, j, kcu);
        const bool ok = real && j * 32 + lane < kcu;
        const uint4 *src = (const uint4 *)a.w0 + (size_t)(u >> a.kshift) * K8 + (u & sh.msk) * a.kc + j * 32 + lane;
#pragma unroll
        for (int s = 0; s < S; s++)
            cu_cp16(cu_saddr(ring + (s * GB_D + stage) * 32), ok ? src + (s ? d1 : 0) : (const uint4 *)a.w0, ok);
        cu_cp_commit();
    };
    if (a.early) { /* the static range's first steps (see above) */
#pragma unroll
        for (int u = 0; u < GB_D - 1; u++) put(u);
    }
    cu_pdl_wait();
    cu_pdl_trigger();
    may_claim = true;
    if (!a.early) {
#pragma unroll
        for (int u = 0; u < GB_D - 1; u++) put(u);
    }
    for (int i = threadIdx.x; i < NT * K8; i += GB_THREADS) gb_smem[i] = __ldcg((const uint4 *)a.x + i);
    __syncthreads();

    float acc[S][NT][2], row[S][NT]; /* row: the shares so far of a row inside the static range */
#pragma unroll
    for (int s = 0; s < S; s++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[s][t][0] = acc[s][t][1] = row[s][t] = 0.f;
    bool fin = false;
    while (!fin) {
#pragma unroll
        for (int u = 0; u < GB_D; u++) {
            int cu, cj, kcu;
            bool last;
            if (!gd_math(wk, sh, cu, cj, kcu, last)) { /* warp-uniform */
                fin = true;
                break;
            }
            cu_cp_wait<GB_D - 2>(); /* this step landed (GB_D - 1 groups were in flight) */
            uint4 v[S];
#pragma unroll
            for (int s = 0; s < S; s++) v[s] = ring[(s * GB_D + u) * 32];
            put((u + GB_D - 1) % GB_D);
            const int c0 = (cu & sh.msk) * a.kc, ch = cj * 32 + lane;
            if (ch < kcu) {
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const uint4 xv = gb_smem[t * K8 + c0 + ch];
#pragma unroll
                    for (int s = 0; s < S; s++) gb_dot8(acc[s][t], v[s], xv);
                }
            }
            if (last) { /* unit cu done */
                float r[S][NT];
#pragma unroll
                for (int s = 0; s < S; s++)
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        float x = acc[s][t][0] + acc[s][t][1];
#pragma unroll
                        for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
                        r[s][t] = x;
                        acc[s][t][0] = acc[s][t][1] = 0.f;
                    }
                const int n = cu >> a.kshift, q = cu & sh.msk;
                if (gd_row_inside(sh, cu, sb, se)) { /* the row's shares are this warp's, in order */
#pragma unroll
                    for (int s = 0; s < S; s++)
#pragma unroll
                        for (int t = 0; t < NT; t++) row[s][t] = (q ? row[s][t] : 0.f) + r[s][t]; /* from 0.f */
                    if (q == sh.msk && lane == 0)
#pragma unroll
                        for (int t = 0; t < NT; t++) {
                            float vs[S];
#pragma unroll
                            for (int s = 0; s < S; s++) vs[s] = row[s][t];
                            gd_store<MODE>(a, n, t, vs);
                        }
                } else if (lane == 0) {
                    if (sh.msk == 0) {
#pragma unroll
                        for (int t = 0; t < NT; t++) {
                            float vs[S];
#pragma unroll
                            for (int s = 0; s < S; s++) vs[s] = 0.f + r[s][t]; /* k_gvb's sum from 0.f */
                            gd_store<MODE>(a, n, t, vs);
                        }
                    } else {
                        float *p = a.part + (size_t)cu * (S * NT);
#pragma unroll
                        for (int s = 0; s < S; s++)
#pragma unroll
                            for (int t = 0; t < NT; t++) p[s * NT + t] = r[s][t];
                        if (gd_add_acq_rel(&a.rowcnt[n], 1u) == (unsigned)sh.msk) { /* the row's last share */
                            const float *pr = a.part + ((size_t)n << a.kshift) * (S * NT);
#pragma unroll
                            for (int t = 0; t < NT; t++) {
                                float vs[S];
#pragma unroll
                                for (int s = 0; s < S; s++) {
                                    float sum = 0.f;
                                    for (int k = 0; k <= sh.msk; k++) sum += __ldcg(pr + k * (S * NT) + s * NT + t);
                                    vs[s] = sum;
                                }
                                gd_store<MODE>(a, n, t, vs);
                            }
                            a.rowcnt[n] = 0;
                        }
                    }
                }
                __syncwarp();
            }
        }
    }
    cu_cp_wait<0>(); /* no copy outlives the block */
    if (lane == 0) { /* after this warp's claims (their answers were taken) and row counts */
        if (gd_add_acq_rel(&a.ctl[1], 1u) == (unsigned)W - 1) {
            a.ctl[0] = 0;
            a.ctl[1] = 0;
        }
    }
}

static long long gvd_launches; /* ms_cuda_gvd_launches; updated atomically */

/* Contract in backend_cuda.h. */
extern "C" long long ms_cuda_gvd_launches(void) { return __atomic_load_n(&gvd_launches, __ATOMIC_RELAXED); }

/* k_gvd's instances by mode and rows of x: launched through this table and asked for their occupancy */
typedef void (*gd_fn)(gd_args);
static const gd_fn gd_kern[2][GB_MAX_T] = {{k_gvd<1, 0>, k_gvd<2, 0>, k_gvd<3, 0>, k_gvd<4, 0>},
                                            {k_gvd<1, 1>, k_gvd<2, 1>, k_gvd<3, 1>, k_gvd<4, 1>}};

static long long gvb_launches; /* ms_cuda_gvb_launches; updated atomically */

/* Contract in backend_cuda.h. */
extern "C" long long ms_cuda_gvb_launches(void) { return __atomic_load_n(&gvb_launches, __ATOMIC_RELAXED); }

static long long gvb_tc_launches;   /* ms_cuda_gvb_tc_launches; updated atomically */
static long long gvb_l2pf_launches; /* ms_cuda_gvb_l2pf_launches; updated atomically */
static long long gvb_deep_launches; /* ms_cuda_gvb_deep_launches; updated atomically */

/* Contract in backend_cuda.h. */
extern "C" long long ms_cuda_gvb_deep_launches(void) { return __atomic_load_n(&gvb_deep_launches, __ATOMIC_RELAXED); }

/* Contract in backend_cuda.h. */
extern "C" long long ms_cuda_gvb_l2pf_launches(void) { return __atomic_load_n(&gvb_l2pf_launches, __ATOMIC_RELAXED); }

/* Contract in backend_cuda.h. */
extern "C" long long ms_cuda_gvb_tc_launches(void) { return __atomic_load_n(&gvb_tc_launches, __ATOMIC_RELAXED); }

/* k_gvb's instances by step (CUDA cores, tensor cores), mode (2: the folded norm, one row only) and rows of x.
 * The tensor-core step keeps two C fragments per stream and row of x; where that spills under the launch
 * bounds (ptxas, sm_90a: 4 bytes at <4, 0>, 36 at <3, 1>, 616 at <4, 1>) there is no such instance and the
 * CUDA-core step runs. The folded-norm instance spills in both steps (48 bytes, 64 with tensor cores:
 * the norm's registers, outside the step loop). */
typedef void (*gb_fn)(gb_args);
static const gb_fn gb_kern[2][3][GB_MAX_T] = {
    {{k_gvb<1, 0, 0>, k_gvb<2, 0, 0>, k_gvb<3, 0, 0>, k_gvb<4, 0, 0>},
     {k_gvb<1, 1, 0>, k_gvb<2, 1, 0>, k_gvb<3, 1, 0>, k_gvb<4, 1, 0>},
     {k_gvb<1, 2, 0>, NULL, NULL, NULL}},
    {{k_gvb<1, 0, 1>, k_gvb<2, 0, 1>, k_gvb<3, 0, 1>, NULL},
     {k_gvb<1, 1, 1>, k_gvb<2, 1, 1>, NULL, NULL},
     {k_gvb<1, 2, 1>, NULL, NULL, NULL}}};

/* The claiming form (k_gvd) for c when MS_CU_BF16_STREAM_DYN = pct (the static share of the work, in
 * percent) and the shape suits it; *launched as cu_gemv_bf16. The plan is gd_make_plan's (gemv_walk.cuh)
 * over the resident warps, or over as many warps as units when there are fewer. Where weights may be
 * copied before the PDL wait but the plan cannot (too few units for every warp to hold GB_D - 1 steps),
 * it declines: the fixed form keeps those copies, worth more than the balance to a projection that
 * small. */
static int gd_try(ms_backend *b, const cu_gvb_call *c, int pct, int force_ks, int *launched, ms_err *err) {
    const int T = c->T, N = c->N, K8 = c->K / 8, S = c->mode == 1 ? 2 : 1;
    const size_t smem = (size_t)T * c->K * 2 + (size_t)16 * GB_WARPS * S * GB_D * 32;
    int bps = 0;
    MS_TRY(cu_occupancy(b, (const void *)gd_kern[c->mode][T - 1], GB_THREADS, smem, &bps, err));
    if (bps <= 0) return MS_OK;
    long long W = (long long)bps * (b->gpu.n_sm > 0 ? b->gpu.n_sm : 132) * GB_WARPS;
    const bool early = c->weights_quiet && cu_knob(CU_KNOB_BF16_STREAM_EARLY);
    gd_plan pl;
    if (!gd_make_plan(N, K8, W, pct, force_ks, early, GB_D, pl)) return MS_OK;
    /* fewer units than resident warps: only as many warps (in whole blocks) as units, so that the
     * counter is not asked by thousands of warps with nothing to do */
    const long long U = (long long)N * pl.ks;
    if (U < W) {
        W = (U + GB_WARPS - 1) / GB_WARPS * GB_WARPS;
        if (!gd_make_plan(N, K8, W, pct, force_ks, early, GB_D, pl)) return MS_OK;
    }
    /* too little work for every warp to hold the early copies: the fixed form keeps them */
    if (early && !pl.early) return MS_OK;
    const int ks = pl.ks;
    const size_t part_bytes = ks > 1 ? sizeof(float) * (size_t)N * ks * S * T : 0;
    if (part_bytes > ((size_t)64 << 20)) return MS_OK;
    /* the counters (ctl, then rowcnt from byte 64) in a slot of their own, zeroed when it moves and left
     * zero by every launch: partials in the same buffer would land on another shape's row counts */
    cu_impl *ci = cu_of(b);
    void *old = ci->scratch[SCR_GVD], *cnt = NULL, *part = NULL;
    const size_t old_bytes = ci->scratch_bytes[SCR_GVD];
    MS_TRY(cu_scratch(b, SCR_GVD, 64 + (ks > 1 ? sizeof(unsigned) * (size_t)N : 0), &cnt, err));
    if (cnt != old || ci->scratch_bytes[SCR_GVD] != old_bytes)
        CK(cudaMemsetAsync(cnt, 0, ci->scratch_bytes[SCR_GVD], ci->stream));
    if (ks > 1) MS_TRY(cu_scratch(b, SCR_GVP, part_bytes, &part, err));
    gd_args a;
    memset(&a, 0, sizeof a);
    a.w0 = c->w0, a.w1 = c->w1 ? c->w1 : c->w0, a.bias = c->bias, a.x = c->x, a.y = c->y;
    a.y_type = c->y_type, a.ldy = c->ldy, a.N = N, a.K = c->K;
    a.kshift = pl.kshift, a.kc = pl.kc, a.q0 = pl.q0, a.g = pl.g, a.early = pl.early;
    a.ctl = (unsigned *)cnt;
    a.rowcnt = (unsigned *)((char *)cnt + 64);
    a.part = (float *)part;
    CK(cu_launch(gd_kern[c->mode][T - 1], dim3((unsigned)(W / GB_WARPS)), dim3(GB_THREADS), smem, ci->stream, a));
    __atomic_fetch_add(&gvd_launches, 1, __ATOMIC_RELAXED);
    *launched = 1;
    return MS_OK;
}

/* Contract in cuda_internal.cuh. Launch shape: for each K split ks in {1, 2, 4, 8} (shares of whole
 * 512-byte runs, at least two runs each when split), rows per warp = ceil(N * ks / resident warps), so
 * one wave holds the grid (several waves of smaller blocks measured slower, bench/NOTES.md session 27);
 * the split with the fewest bytes on the busiest warp wins, a smaller split on ties within 1/16 (fewer
 * partials, longer sequential runs). */
int cu_gemv_bf16(ms_backend *b, const cu_gvb_call *c, int *launched, ms_err *err) {
    *launched = 0;
    const int T = c->T, N = c->N, K = c->K, S = c->mode == 1 ? 2 : 1;
    const int max_t = cu_knob(CU_KNOB_BF16_STREAM_MAX_T);
    if ((c->mode != 0 && c->mode != 1) || T < 1 || T > max_t || T > GB_MAX_T || N <= 0 || K <= 0 || K % 8 ||
        (c->mode == 1 && (!c->w1 || c->bias)) ||
        (c->mode == 1 && c->y_type != MS_BF16))
        return MS_OK;
    if (((uintptr_t)c->w0 & 15) || ((uintptr_t)c->w1 & 15) || (!c->norm && ((uintptr_t)c->x & 15)) ||
        ((size_t)K * 2) % 16)
        return MS_OK;
    if (c->norm && (c->mode != 0 || T != 1 || c->norm->H != K || K / 8 > CU_NORM_U * CU_NORM_T)) return MS_OK;
    const int K8 = K / 8;
    const size_t xbytes = (size_t)T * K * 2;
    if (xbytes > 96 * 1024) return MS_OK; /* longer rows take the other forms (at 96 KB one block an SM) */
    const int force_ks = cu_knob(CU_KNOB_BF16_STREAM_KS), dyn = cu_knob(CU_KNOB_BF16_STREAM_DYN);
    if (dyn && !c->norm) {
        MS_TRY(gd_try(b, c, dyn, force_ks, launched, err));
        if (*launched) return MS_OK;
    }
    const int nsm = b->gpu.n_sm > 0 ? b->gpu.n_sm : 132;
    const int rpw_cap = 64; /* bounds the partials in shared memory */
    const int red_units = GB_WARPS * rpw_cap * S * T / 4;
    /* the tensor-core step (mma.sync bf16: sm_80 on) where asked for and this mode and row count have it */
    const int tc = cu_knob(CU_KNOB_BF16_STREAM_MMA) && b->gpu.cc_major >= 8 &&
                   gb_kern[1][c->norm ? 2 : c->mode][c->norm ? 0 : T - 1];
    /* MS_CU_BF16_STREAM_DEEPK: one row of a long K (>= _L2PF_MINK, the output projections after attention)
     * through rings of 12 stages, so that more of its weights are copied before the wait */
    const int deep = !tc && !c->norm && c->mode == 0 && T == 1 && c->weights_quiet &&
                     cu_knob(CU_KNOB_BF16_STREAM_EARLY) && K >= cu_knob(CU_KNOB_BF16_STREAM_L2PF_MINK) &&
                     cu_knob(CU_KNOB_BF16_STREAM_DEEPK) == 12;
    const gb_fn kern = deep ? k_gvb<1, 0, 0, 12> : gb_kern[tc][c->norm ? 2 : c->mode][c->norm ? 0 : T - 1];
    const size_t smem = gb_smem_bytes(T, K, S, tc, red_units, deep ? 12 : GB_D);
    int bps = 0;
    MS_TRY(cu_occupancy(b, (const void *)kern, GB_THREADS, smem, &bps, err));
    if (bps <= 0) return MS_OK;
    const int64_t warps = (int64_t)bps * nsm * GB_WARPS;
    int best_ks = 0, best_rpw = 0;
    int64_t best_cost = 0;
    for (int pass = force_ks ? 0 : 1; pass < 2 && !best_ks; pass++) /* a forced split that cannot be: the others */
        for (int ks = 1; ks <= GB_WARPS && gd_split_ok(K8, ks); ks *= 2) {
            if (pass == 0 && ks != force_ks) continue;
            const int kc = gd_share(K8, ks);
            const int64_t rpw = ((int64_t)N * ks + warps - 1) / warps;
            if (rpw > rpw_cap) continue;
            const int64_t cost = rpw * (int64_t)(kc < K8 ? kc : K8);
            if (!best_ks || cost * 16 < best_cost * 15) best_ks = ks, best_rpw = (int)rpw, best_cost = cost;
        }
    if (!best_ks) return MS_OK;
    const int ks = best_ks, rpw = best_rpw, rows_pb = (GB_WARPS / ks) * rpw;
    gb_args a;
    memset(&a, 0, sizeof a);
    a.w0 = c->w0, a.w1 = c->w1 ? c->w1 : c->w0, a.bias = c->bias, a.x = c->x, a.y = c->y;
    a.y_type = c->y_type, a.ldy = c->ldy, a.N = N, a.K = K, a.ks = ks, a.rpw = rpw;
    a.kc = gd_share(K8, ks);
    a.early = c->weights_quiet && cu_knob(CU_KNOB_BF16_STREAM_EARLY);
    if (a.early && !c->norm && K >= cu_knob(CU_KNOB_BF16_STREAM_L2PF_MINK))
        a.early |= cu_knob(CU_KNOB_BF16_STREAM_L2PF) << 1;
    a.red_units = red_units;
    if (c->norm) a.nin = *c->norm;
    const dim3 grid((unsigned)((N + rows_pb - 1) / rows_pb));
    CK(cu_launch(kern, grid, dim3(GB_THREADS), smem, cu_of(b)->stream, a));
    __atomic_fetch_add(&gvb_launches, 1, __ATOMIC_RELAXED);
    if (tc) __atomic_fetch_add(&gvb_tc_launches, 1, __ATOMIC_RELAXED);
    if (a.early > 1) __atomic_fetch_add(&gvb_l2pf_launches, 1, __ATOMIC_RELAXED);
    if (deep) __atomic_fetch_add(&gvb_deep_launches, 1, __ATOMIC_RELAXED);
    *launched = 1;
    return MS_OK;
}
