/* moe_fused.cu - the whole routed MoE of one token in one kernel (decode at batch 1): for each of its
 * slots (the router's top-k experts, plus a folded shared expert), h = silu(x·gateᵀ) * (x·upᵀ), then
 * out = Σ_slot weight · (h·downᵀ), NVFP4 weights streamed from HBM once.
 *
 * Why one kernel. The two-kernel form (a routing permutation kernel, gate/up, down, then the combine
 * kernel) measured 3.2 + 30.3 + 19.4 + 5.5 us per GLM-4.5-Air layer on the H200 (ncu) for 87.6 MB of
 * weights: each boundary drains the GPU, the down kernel cannot read a byte before the last gate/up
 * block has finished, and both kernels run waves of short-lived blocks whose prologues (x staging,
 * first loads) and K-split reductions are paid per block. Here a persistent grid of co-resident blocks
 * streams gate/up rows, then down rows, through one cp.async ring per warp that never stops: a warp's
 * ring copies run up to D - 1 super-steps ahead across item boundaries and across the phase boundary,
 * so the first down rows are in flight while the last gate/up rows are still being multiplied. The
 * combine is the down phase's epilogue (a fixed-order sum), and the slot table is read straight from
 * the router's ids (no permutation kernel).
 *
 * Work. A block holds NG groups of 8 warps; groups take items round robin (group q of block c is
 * group c * NG + q of all, and takes items g, g + groups, ...). Phase A items are (valid slot v, 16 rows
 * of the intermediate): warps 0-3 of the group take the gate rows and 4-7 the up rows, warp w taking
 * super-steps j = (w & 3) + 4i of K = hidden (k_gmma's K split with ksplit 4); the partials meet in
 * warp 0 in warp order, which writes h[v, rows] as bf16. Phase B items are 16 rows of the output: the
 * item's super-steps over all valid slots (slot-major, nv x I/128 of them) are dealt round robin to the
 * 8 warps; each super-step's product is scaled by its slot's weight and added to the warp's sum; warp 0
 * adds the 8 sums in warp order and writes out. A super-step (mf_step) multiplies the raw e2m1 values
 * and applies the block scales to the mma results, per 16-k group (its comment says how); sums
 * therefore differ from the two-kernel form in rounding order only. A warp's walk (mf_pos) keeps the
 * lane's weight and scale pointers in registers and advances them by constants inside an item.
 *
 * Phase boundary. Every block adds 1 to sync[0] after its phase A (h stores fenced first); thread 0 of
 * each block spins until sync[0] reaches the grid size, then the block stages all of h (nv x I bf16,
 * L2 loads) in shared memory for its groups. The grid is no larger than the blocks that fit on the GPU
 * at once (occupancy), so every block that the spin waits for is running or will run. The last block to
 * leave resets sync (sync[1] counts leavers); the next launch on the stream starts after this one
 * completes. A spin that outlives ~2^31 polls traps (the kernel fails with an error instead of
 * hanging). sync is per backend (cu_impl.moe_sync): one launch in flight per backend stream. The
 * residency argument takes the device's SM count as available: under MPS with an SM limit it may not
 * be, and the spin would end in the trap (MS_CU_MOE_FUSED=0 then; a cooperative launch, which would
 * fail instead, is not used yet).
 *
 * Forms and measurements (H200, session 10; bench/NOTES.md): the busiest warp's super-steps decide.
 * Air (792 + 256 items) runs best with one group a block, 2 blocks an SM; GLM-5 (1152 + 384) with
 * three groups a block (one 37 KB h staging for 24 warps). Air b1 step 6.50 -> 6.05 ms, GLM-5 x12
 * 3.22 -> 3.13 ms; the kernel alone (ncu) 47.3 us for Air's 87.6 MB (one group a block), 84.4 us for
 * GLM-5's 181 MB (three), against 58.5 us for the four kernels it replaces at Air's shapes. What limits
 * it (session 16's diagnostics): not the arithmetic (without decode and mma Air's kernel takes ~4 us
 * less of ~43; sessions 15 and 16 cut 23% of its instructions for ~4% of its time) but the streaming
 * at ~3 TB/s in steady state, a 4-8 us prologue, ~2 us of h staging and the spread of phase A's end
 * across blocks, which the phase boundary turns into idle time.
 *
 * Requirements (host): NVFP4 gate/up/down, hidden and intermediate multiples of 128 (8-byte aligned
 * scale rows for the ring's copies), at most MF_MAXS slots, shared memory for max(x, h) staging. */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/norm_stage.cuh"
#include "backend/cuda/route_regs.cuh"
#include "backend/cuda/router_dot.cuh"

#include <cuda_fp8.h>
#include <string.h>

#define MF_WARPS 8  /* warps per group: one item at a time */
#define MF_MAXS 16  /* slots at most */
#define MF_RED_FLOATS (2 * 7 * 2 * 32) /* a group's reduction buffers: [parity][warps 1-7][row g, g + 8][lane] */
#define MF_XPOW 64     /* x and h are staged times 2^MF_XPOW (see mf_step) */
#define MF_ALIGN 128   /* the dynamic window's base, rounded up in the kernel (bytes) */
static_assert(MF_WARPS * 32 >= CU_NORM_T, "the routed form folds a norm: cu_norm_stage needs CU_NORM_T threads");

/* A valid slot's weights (rows of 16-byte units; scales e4m3 per 16 k) and factors. */
struct mf_slot {
    const uint8_t *w[3], *s[3]; /* gate, up, down */
    float post[2];              /* 2^(126 - MF_XPOW) * scale2 of gate, up (mf_step's factors undone) */
    float c;                    /* router weight * 2^(126 - MF_XPOW) * scale2 of down */
};

struct mf_args {
    const cu_wdesc *G, *U, *D; /* device tables indexed by expert id */
    const int32_t *ids;        /* [nslot], -1 = held elsewhere (skipped) */
    const float *wts;          /* [nslot] */
    int nslot, extra_id, H, I; /* extra_id >= 0: slot nslot is that expert with weight 1 */
    int n_experts;             /* table entries; ids outside [0, n_experts) are skipped like -1 */
    const bf16 *x; /* [H] */
    bf16 *h;       /* [nslot + 1 with an extra slot, I] workspace (row v = valid slot v) */
    void *out;     /* [H], out_type */
    int out_type;
    unsigned *sync;        /* [3] (phase boundary, leavers, the routed form's router barrier), zero between launches */
    int zero_off;          /* byte offset of 256 zero bytes in dynamic shared memory (64 mod 128) */
    int red_off, ring_off; /* byte offsets of the reduction buffers and the rings in dynamic shared memory */
};

/* The routed form's inputs (k_moe_fused<.., 1>): the token's residual add + RMSNorm (nin) and the
 * router (W [E, H] bf16 rows, bias F32/BF16 or NULL, noaux_tc settings) run in the kernel itself, the
 * top-k going to the slot table instead of through ids/wts (a.ids, a.wts unused). The router's
 * partial logits are k_router_split's: expert rows in groups of 8 (a warp each) times K slices of
 * MF_RKS, each lane MF_RD 16-byte chunks, in the same order and with the same arithmetic
 * (router_dot.cuh). The normed row has the split router's bits in every form: cu_norm_stage deals the
 * row over its first CU_NORM_T threads whatever the block size, so the two- and three-group forms (512,
 * 768 threads) add the sum of squares in the 256-thread router's order. */
#define MF_RD 2                /* 16-byte router weight chunks a lane (k_router_split's RS_D) */
#define MF_RKS (32 * MF_RD * 8) /* k of a router K slice (k_router_split's RS_KS) */
struct mf_route {
    const bf16 *W;
    const void *bias;
    int bt;
    int E, topk, n_group, topk_group, norm;
    float scale;
    int nks;        /* K slices: ceil(H / MF_RKS) */
    float *part;    /* [nks, E] partial logits scratch (device) */
    int32_t *ids;   /* [topk] out: the choice (block 0 stores it) */
    float *wts;     /* [topk] out: its weights */
    cu_norm_in nin; /* the pending norm: x = rmsnorm(resid + delta) * w; nin.out written by block 0 */
    int plain_off;  /* unit offset in the x staging of the plain (unpaired) x row, >= H / 8 */
    int early;      /* the router weights are quiet (cu_impl.weights_quiet): loaded before the PDL wait */
};

/* x (and h) staging in shared memory. Unit u of a row (k 8u..8u+7) of super-step jl = u / 16, lane
 * chunk t = (u % 16) / 4 and word q = u % 4 sits at jl * 16 + q * 4 + t: a lane's four units of a
 * super-step are 64 bytes apart (immediate offsets from one per-lane pointer that advances by whole
 * super-steps), and for each q the four chunks t are adjacent, so a warp's load touches 4 distinct
 * 16-byte units in 4 distinct bank groups. Rows are nss * 16 units long (no padding: one token). */
__device__ __forceinline__ int mf_xslot(int u) { return (u & ~15) | ((u & 3) << 2) | ((u >> 2) & 3); }
/* (mf_xslot is its own inverse: the staging loops walk the slots in order, so consecutive threads'
 * 16-byte shared stores hit distinct bank groups, and read unit mf_xslot(slot) from global memory.) */

/* x unit (8 bf16 at k 8u..8u+7) re-paired for the nvfp4 step, (k 0,4), (1,5), (2,6), (3,7), and times
 * 2^MF_XPOW: exact below 2^(128 - MF_XPOW) in magnitude; an x or h element at or above 2^64 (~1.8e19)
 * becomes inf here, where the bf16 limit alone is ~3.4e38. */
__device__ __forceinline__ uint4 mf_pair(uint4 v) {
    const uint32_t P = 0x5F805F80u; /* bf16 2^64, twice */
    static_assert(MF_XPOW == 64, "P is bf16 2^MF_XPOW");
    return make_uint4(gm_bmul2(__byte_perm(v.x, v.z, 0x5410), P), gm_bmul2(__byte_perm(v.x, v.z, 0x7632), P),
                      gm_bmul2(__byte_perm(v.y, v.w, 0x5410), P), gm_bmul2(__byte_perm(v.y, v.w, 0x7632), P));
}

/* One super-step of one token, the block scales applied after the products: acc[h] (row g, g + 8) +=
 * c * sum over the lane t's two 16-k groups of scale * (the group's e2m1 . x). Each mma pair of word q
 * takes the raw e2m1 values (gm_fp4x8_raw, no scale multiply) of all four lanes of a row, whose 16-k
 * groups differ; so B's column n holds x only at the k rows of lane n / 2 (lanes (g, t) with t = g / 2
 * read x, the others 256 zero bytes at xp, which then never advances): column 2t of the result is lane
 * t's group alone, in c0 (row g) and c2 (row g + 8) of lane (g, t), which scales it by its own scale
 * bytes (e4m3 -> fp16 -> fp32, exact). Against scaling the weights (gm_step) this saves 32 bf16
 * multiplies and the bf16 scale patterns a super-step, for 4 FMAs. Magnitudes: the raw weights are
 * e2m1 * 2^-126 (bf16 subnormals for e2m1's 0.5, which mma takes exactly), x was staged times 2^64,
 * so products of any |x| >= 2^-62 are normal fp32; acc carries 2^(64 - 126), undone by the slot's
 * factors. xp: the lane's x units of the super-step (mf_xslot layout; word q at xp + 64 q bytes). */
template <bool SCALED>
__device__ __forceinline__ void mf_step(float (&acc)[2], const gm_raw &r, const uint8_t *xp, float c) {
    float sf[2][2]; /* [row g / g + 8][16-k group] */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)r.sc[h], __NV_E4M3);
        const __half2 s2 = hr;
        sf[h][0] = __low2float(s2), sf[h][1] = __high2float(s2);
    }
    float d[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}}; /* [16-k group] c fragments */
    /* words 0, 2, 1, 3: consecutive mma pairs feed the two groups' chains in turn */
#pragma unroll
    for (int qi = 0; qi < 4; qi++) {
        const int q = ((qi & 1) << 1) | (qi >> 1);
        uint32_t A[2][4];
#pragma unroll
        for (int h = 0; h < 2; h++) gm_fp4x8_raw(gm_word(r, h, q), A[h]);
        const uint4 X = *(const uint4 *)(xp + 64 * q);
        gm_mma(d[q >> 1], A[0][0], A[1][0], A[0][1], A[1][1], X.x, X.y);
        gm_mma(d[q >> 1], A[0][2], A[1][2], A[0][3], A[1][3], X.z, X.w);
    }
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int gg = 0; gg < 2; gg++) acc[h] = fmaf(d[gg][2 * h], SCALED ? sf[h][gg] * c : sf[h][gg], acc[h]);
}

/* Sum of v over the 4 lanes t of the lane's row group (fixed order: every lane gets the same sum). */
__device__ __forceinline__ float mf_rowsum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* A warp's position in its stream of super-steps: phase A items of its group, then phase B items.
 * The pointers are the lane's own: its 16-byte chunk of row g (row g + 8 is rb8 further) and the
 * 8 scale bytes of row g (row g + 8 is rb8 / 8 further) at the current super-step, so that a step
 * inside an item only adds constants. */
struct mf_pos {
    int phase;    /* 0 A, 1 B, 2 done */
    int item, i;  /* item, and step i of the warp's n steps in it */
    int n;
    int v, j;     /* slot (valid index); super-step in the weight row (kept up to date in phase B only) */
    size_t roff;  /* byte offset of row g in the weight matrix */
    size_t rb8;   /* 8 rows of the phase's matrix in bytes */
    const uint8_t *wp, *sp;
};

/* Steps of warp w in an item of the phase (F: phase B's super-steps per item). */
__device__ __forceinline__ int mf_steps(int phase, int w, int nssA, int F) {
    if (phase == 0) return nssA > (w & 3) ? (nssA - (w & 3) + 3) >> 2 : 0;
    return F > w ? (F - w + MF_WARPS - 1) / MF_WARPS : 0;
}

/* Points p's pointers at super-step p.j of slot p.v's matrix (phase A: gate for warps 0-3, up for
 * 4-7; B: down). */
__device__ __forceinline__ void mf_rows(mf_pos &p, const mf_slot *sl, int w, int ti) {
    const int m = p.phase == 0 ? (w >> 2) : 2;
    p.wp = sl[p.v].w[m] + p.roff + (size_t)p.j * 64 + ti * 16;
    p.sp = sl[p.v].s[m] + (p.roff >> 3) + (size_t)p.j * 8; /* scale row bytes = row bytes / 8 */
}

/* Sets p's slot, super-step, row offset and pointers for its (phase, item), at the item's first step. */
__device__ __forceinline__ void mf_enter(mf_pos &p, const mf_slot *sl, int w, int gi, int ti, int H, int I, int mtA) {
    if (p.phase == 0) {
        p.v = p.item / mtA;
        p.j = w & 3;
        p.roff = (size_t)((p.item - p.v * mtA) * 16 + gi) * (size_t)(H / 2);
        p.rb8 = (size_t)8 * (size_t)(H / 2);
    } else {
        const int nssB = I / 128;
        p.v = w / nssB;
        p.j = w - p.v * nssB;
        p.roff = (size_t)(p.item * 16 + gi) * (size_t)(I / 2);
        p.rb8 = (size_t)8 * (size_t)(I / 2);
    }
    mf_rows(p, sl, w, ti);
}

/* From p's (phase, item) on, the first item that gives this warp a step (entered), else phase 2. */
__device__ __forceinline__ void mf_settle(mf_pos &p, const mf_slot *sl, int w, int gi, int ti, int grp0, int ngrp,
                                          int itemsA, int itemsB, int nssA, int F, int H, int I, int mtA) {
    for (;;) {
        if (p.phase == 2) return;
        if (p.item >= (p.phase == 0 ? itemsA : itemsB)) {
            p.phase++;
            p.item = grp0;
            p.n = mf_steps(p.phase, w, nssA, F);
            continue;
        }
        if (p.n > 0) break;
        p.item += ngrp;
    }
    p.i = 0;
    mf_enter(p, sl, w, gi, ti, H, I, mtA);
}

/* Moves p to its next step: within an item by constant increments (phase B re-points at a slot
 * change), else to the group's next item that gives this warp a step, in phase A then B, else to
 * phase 2. */
__device__ __forceinline__ void mf_next(mf_pos &p, const mf_slot *sl, int w, int gi, int ti, int grp0, int ngrp,
                                        int itemsA, int itemsB, int nssA, int F, int H, int I, int mtA) {
    if (++p.i < p.n) {
        if (p.phase == 0) {
            p.wp += 4 * 64;
            p.sp += 4 * 8;
        } else {
            const int nssB = I / 128;
            p.j += MF_WARPS;
            if (p.j < nssB) {
                p.wp += MF_WARPS * 64;
                p.sp += MF_WARPS * 8;
            } else {
                do p.j -= nssB, p.v++;
                while (p.j >= nssB);
                mf_rows(p, sl, w, ti);
            }
        }
        return;
    }
    p.item += ngrp;
    mf_settle(p, sl, w, gi, ti, grp0, ngrp, itemsA, itemsB, nssA, F, H, I, mtA);
}

/* Queues the ring copies of p's super-step into the stage whose lane chunk is at st (gm_ring_put_lane). */
__device__ __forceinline__ void mf_put(uint8_t *st, const mf_pos &p, int gi, int ti) {
    gm_ring_put_lane(st, p.wp, p.wp + p.rb8, p.sp, p.sp + (p.rb8 >> 3), gi, ti);
}

/* Spins until *p >= target (acquire); traps after ~2^31 polls. */
__device__ __forceinline__ void mf_wait_count(const unsigned *p, unsigned target) {
    for (unsigned n = 0;; n++) {
        unsigned v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
        if (v >= target) return;
        if (n > (1u << 31)) __trap();
        __nanosleep(64);
    }
}

/* Barrier of one group's 8 warps (named barrier 1 + group; __syncthreads is barrier 0). */
__device__ __forceinline__ void mf_group_sync(int grp) {
    asm volatile("bar.sync %0, %1;" ::"r"(grp + 1), "r"(MF_WARPS * 32) : "memory");
}

/* NG groups of 8 warps a block share the staged x and h; D ring stages per warp, D - 1 super-steps
 * (1.1 KB each) in flight. */
template <int NG, int D, int R>
__global__ __launch_bounds__(NG * MF_WARPS * 32, 1) void k_moe_fused(mf_args a, mf_route r) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, ti = lane & 3;
    const int grp = warp / MF_WARPS, w = warp - grp * MF_WARPS;
    const int grp0 = blockIdx.x * NG + grp, ngrp = gridDim.x * NG;
    const int H = a.H, I = a.I, nssA = H / 128, nssB = I / 128, mtA = I / 16, mtB = H / 16;
    /* routed form: the router weights of the group's first unit (experts 8 eg + w over K slice ks, unit
     * ks * neg + eg) in flight before the wait when they are quiet (cuda_internal.cuh's exception) */
    const int neg = R ? (r.E + MF_WARPS - 1) / MF_WARPS : 1, nru = R ? neg * r.nks : 0;
    uint4 rwv[MF_RD];
    auto rload = [&](int u) {
        const int ks = u / neg, e = (u - ks * neg) * MF_WARPS + w, k0 = ks * MF_RKS;
        const int nc = min(MF_RKS, H - k0) / 8;
#pragma unroll
        for (int q = 0; q < MF_RD; q++) {
            const int c = q * 32 + lane;
            rwv[q] = e < r.E && c < nc ? __ldg((const uint4 *)(r.W + (size_t)e * H + k0) + c) : make_uint4(0, 0, 0, 0);
        }
    };
    if (R && r.early && grp0 < nru) rload(grp0);
    cu_pdl_wait();
    cu_pdl_trigger();
    extern __shared__ uint4 mf_smem_raw[];
    __shared__ mf_slot sl[MF_MAXS];
    __shared__ int s_valid[MF_MAXS];
    __shared__ int s_nv;
    __shared__ int32_t s_ids[R ? MF_MAXS : 1];
    __shared__ float s_wts[R ? MF_MAXS : 1];
    /* the dynamic window starts after the static variables (1104 bytes: 80 mod 128); every offset below
     * is laid out from a 128-byte boundary, so the base is rounded up here and the host asks for MF_ALIGN
     * bytes more. Unaligned, the kernel measured 10 us a layer slower on GLM-5 (bench/NOTES.md, session 17) */
    uint4 *const mf_smem = mf_smem_raw + ((MF_ALIGN - (cu_saddr(mf_smem_raw) & (MF_ALIGN - 1))) & (MF_ALIGN - 1)) / 16;
    uint4 *xs = mf_smem;
    const uint8_t *xl = (const uint8_t *)mf_smem + 16 * ti; /* the lane's x units (mf_xslot) */
    const uint8_t *const zb = (const uint8_t *)mf_smem + a.zero_off + 16 * ti; /* ... for lanes without x */
    const bool xon = ti == (gi >> 1); /* this lane's B registers carry x (mf_step) */
    float *red = (float *)((uint8_t *)mf_smem + a.red_off) + grp * MF_RED_FLOATS; /* [2][7][2][32] */
    uint8_t *ring = (uint8_t *)mf_smem + a.ring_off + (size_t)warp * D * GM_STG + 16 * lane; /* lane chunk of stage 0 */
    uint8_t *const ring_end = ring + (D - 1) * GM_STG;

    if (R) { /* the norm, the router's partial logits, a grid barrier, then each block routes for itself */
        uint4 *const px = xs + r.plain_off;
        cu_norm_stage(r.nin, px, 0, H / 8, gridDim.x, blockIdx.x == 0); /* ends in a block barrier */
        for (int s = threadIdx.x; s < nssA * 16; s += blockDim.x) xs[s] = mf_pair(px[mf_xslot(s)]);
        for (int u = grp0; u < nru; u += ngrp) {
            if (!r.early || u != grp0) rload(u);
            const int ks = u / neg, e = (u - ks * neg) * MF_WARPS + w, k0 = ks * MF_RKS;
            const int nc = min(MF_RKS, H - k0) / 8;
            float acc = 0.f; /* k_router_split's chunks in its order, with its arithmetic */
#pragma unroll
            for (int q = 0; q < MF_RD; q++) {
                const int c = q * 32 + lane;
                if (c >= nc) break;
                acc = cu_router_fma8(acc, rwv[q], px[k0 / 8 + c]);
            }
            const float v = warp_sum(acc);
            if (lane == 0 && e < r.E) {
                r.part[(size_t)ks * r.E + e] = v;
                __threadfence(); /* before thread 0's count (as the h stores before the phase boundary) */
            }
        }
        __syncthreads(); /* the paired x complete, px free; the block's partials stored */
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(&a.sync[2], 1u);
            mf_wait_count(&a.sync[2], gridDim.x);
        }
        __syncthreads();
        /* the logits summed in slice order (as the split router's last block), scores into px's space:
         * s at 0, s + bias at E (the host sizes the staging for 8 E bytes there) */
        float *sc = (float *)px;
        for (int e = threadIdx.x; e < r.E; e += blockDim.x) {
            const float bv = r.bias ? cu_ld(r.bias, r.bt, e) : 0.f;
            float v = 0.f;
            for (int ks = 0; ks < r.nks; ks++) v += __ldcg(r.part + (size_t)ks * r.E + e);
            const float sv = cu_router_score(v);
            sc[e] = sv;
            sc[r.E + e] = sv + bv;
        }
        __syncthreads();
        if (warp == 0)
            route_token_regs(sc, sc + r.E, r.E, r.topk, r.n_group, r.topk_group, r.norm, r.scale, s_ids, s_wts);
        __syncthreads();
        if (blockIdx.x == 0 && threadIdx.x < r.topk) r.ids[threadIdx.x] = s_ids[threadIdx.x], r.wts[threadIdx.x] = s_wts[threadIdx.x];
    }

    /* the slot table: one thread per slot reads its id and descriptors; then the valid ones compacted */
    const int ns = a.nslot + (a.extra_id >= 0);
    if (threadIdx.x < ns) {
        const int s = threadIdx.x, id = s < a.nslot ? (R ? s_ids[s] : a.ids[s]) : a.extra_id;
        s_valid[s] = id >= 0 && id < a.n_experts;
        if (id >= 0 && id < a.n_experts) {
            const cu_wdesc g = a.G[id], u = a.U[id], d = a.D[id];
            mf_slot &o = sl[s];
            o.w[0] = (const uint8_t *)g.w, o.w[1] = (const uint8_t *)u.w, o.w[2] = (const uint8_t *)d.w;
            o.s[0] = (const uint8_t *)g.scale, o.s[1] = (const uint8_t *)u.scale, o.s[2] = (const uint8_t *)d.scale;
            static_assert(MF_XPOW == 64, "the factors below are 2^(126 - MF_XPOW)");
            o.post[0] = 0x1p62f * g.scale2, o.post[1] = 0x1p62f * u.scale2;
            o.c = (s < a.nslot ? (R ? s_wts[s] : a.wts[s]) : 1.f) * 0x1p62f * d.scale2;
        }
    }
    /* phase A's x, staged while the descriptors load: units re-paired, in mf_xslot order (the routed
     * form staged it from the norm above) */
    if (!R)
        for (int s = threadIdx.x; s < nssA * 16; s += blockDim.x) xs[s] = mf_pair(__ldcg((const uint4 *)a.x + mf_xslot(s)));
    if (threadIdx.x < 16) ((uint4 *)((uint8_t *)mf_smem + a.zero_off))[threadIdx.x] = make_uint4(0, 0, 0, 0);
    __syncthreads();
    if (threadIdx.x == 0) {
        int nv = 0;
        for (int s = 0; s < ns; s++)
            if (s_valid[s]) sl[nv++] = sl[s];
        s_nv = nv;
    }
    __syncthreads();
    const int nv = s_nv, itemsA = nv * mtA, itemsB = mtB, F = nv * nssB;

    /* the producer walk starts D - 1 super-steps ahead of the consumer */
    mf_pos P;
    P.phase = 0, P.item = grp0, P.n = mf_steps(0, w, nssA, F);
    mf_settle(P, sl, w, gi, ti, grp0, ngrp, itemsA, itemsB, nssA, F, H, I, mtA);
#pragma unroll
    for (int p = 0; p < D - 1; p++) {
        if (P.phase < 2) {
            mf_put(ring + p * GM_STG, P, gi, ti);
            mf_next(P, sl, w, gi, ti, grp0, ngrp, itemsA, itemsB, nssA, F, H, I, mtA);
        }
        gm_cp_commit();
    }
    uint8_t *cst = ring;          /* lane chunk of the consumer's next stage */
    uint8_t *pst = ring_end;      /* ... and of the stage the producer refills (the one consumed last) */
    const int soff = gm_ring_soff(gi, ti);
    int par = 0; /* reduction buffer parity (items so far) */
    const int rsB = nssB * 16;    /* h row stride in units */

    /* one consumed super-step: wait for its stage, refill the stage freed last step, multiply; xp:
     * the lane's x units of the super-step */
    auto step = [&](float (&acc)[2], const uint8_t *xp, bool scaled, float c) {
        gm_cp_wait<D - 2>();
        __syncwarp();
        gm_raw cur;
        gm_ring_get_lane(cur, cst, soff);
        if (P.phase < 2) {
            mf_put(pst, P, gi, ti);
            mf_next(P, sl, w, gi, ti, grp0, ngrp, itemsA, itemsB, nssA, F, H, I, mtA);
        }
        gm_cp_commit();
        if (scaled) mf_step<true>(acc, cur, xp, c);
        else mf_step<false>(acc, cur, xp, c);
        pst = cst;
        cst = cst == ring_end ? ring : cst + GM_STG;
    };
    /* partial sums of the group's warps meet in its warp 0 in warp order; s: warps from which on the
     * partials go to `up` (phase A: 4, the up rows) */
    auto reduce = [&](float (&acc)[2], float (&up)[2], int s) {
        float *rb = red + par * (7 * 2 * 32);
        if (w > 0)
#pragma unroll
            for (int q = 0; q < 2; q++) rb[((w - 1) * 2 + q) * 32 + lane] = acc[q];
        mf_group_sync(grp);
#pragma unroll
        for (int q = 0; q < 2; q++) up[q] = 0.f;
        if (w == 0)
            for (int k2 = 1; k2 < MF_WARPS; k2++)
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    const float v = rb[((k2 - 1) * 2 + q) * 32 + lane];
                    if (k2 >= s) up[q] += v;
                    else acc[q] += v;
                }
        par ^= 1;
    };

    /* ---- phase A: h = silu(gate) * up ---- */
    for (int item = grp0; item < itemsA; item += ngrp) {
        const int v = item / mtA, m0 = (item - v * mtA) * 16;
        float acc[2] = {0.f, 0.f};
        const int n = mf_steps(0, w, nssA, F);
        const uint8_t *xp = xon ? xl + (w & 3) * 256 : zb;
        const int xinc = xon ? 4 * 256 : 0;
        for (int i = 0; i < n; i++, xp += xinc) step(acc, xp, false, 1.f);
        float up[2];
        reduce(acc, up, 4);
        if (w == 0) {
            /* the 4 lanes t of a row hold its partials over their own 16-k groups */
#pragma unroll
            for (int h = 0; h < 2; h++) acc[h] = mf_rowsum(acc[h]), up[h] = mf_rowsum(up[h]);
            if (ti == 0) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = m0 + gi + 8 * h;
                    const float g = acc[h] * sl[v].post[0];
                    a.h[(size_t)v * I + r] = __float2bfloat16_rn(cu_silu(g) * (up[h] * sl[v].post[1]));
                }
                __threadfence();
            }
        }
    }

    /* ---- phase boundary: every block's h is stored and visible ---- */
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence(); /* the block's h stores (fenced by their writers, seen through the barrier) first */
        atomicAdd(&a.sync[0], 1u);
        mf_wait_count(&a.sync[0], gridDim.x);
    }
    __syncthreads();
    for (int s = threadIdx.x; s < nv * rsB; s += blockDim.x) /* h rows back to back: unit v * rsB + k8 */
        xs[s] = mf_pair(__ldcg((const uint4 *)a.h + mf_xslot(s)));
    __syncthreads();

    /* ---- phase B: out = Σ_slot c_slot · (h_slot · downᵀ) ---- */
    for (int item = grp0; item < itemsB; item += ngrp) {
        const int m0 = item * 16;
        float acc[2] = {0.f, 0.f};
        const int n = mf_steps(1, w, nssA, F);
        int v = w / nssB, j = w - v * nssB;
        const uint8_t *xp = xon ? xl + (v * rsB + j * 16) * 16 : zb;
        const int xinc = xon ? MF_WARPS * 256 : 0; /* slot v's row continues into slot v + 1's: back to back */
        for (int i = 0; i < n; i++) {
            step(acc, xp, true, sl[v].c);
            j += MF_WARPS;
            xp += xinc;
            while (j >= nssB) j -= nssB, v++;
        }
        float unused[2];
        reduce(acc, unused, MF_WARPS);
        if (w == 0) {
#pragma unroll
            for (int h = 0; h < 2; h++) acc[h] = mf_rowsum(acc[h]);
            if (ti == 0)
#pragma unroll
                for (int h = 0; h < 2; h++) cu_st(a.out, a.out_type, (size_t)(m0 + gi + 8 * h), acc[h]);
        }
    }
    gm_cp_wait_all(); /* no ring copy outlives the block */
    __syncthreads();

    /* the last block out resets the counters for the next launch */
    if (threadIdx.x == 0 && atomicAdd(&a.sync[1], 1u) == gridDim.x - 1) {
        atomicExch(&a.sync[0], 0u);
        atomicExch(&a.sync[1], 0u);
        if (R) atomicExch(&a.sync[2], 0u);
    }
}


/* The kernel's forms: groups of 8 warps a block, ring depth. More groups a block share one staged x
 * and h (GLM-5's h is 37 KB), one group a block lets several blocks share an SM and start on SMs the
 * previous kernel still partly holds. */
static const struct {
    const void *kern[2]; /* [routed] */
    cudaError_t (*go)(dim3, size_t, cudaStream_t, const mf_args &, const mf_route *);
    int ng, d;
} mf_forms[] = {
#define MF_FORM(NG, D)                                                                                            \
    {{(const void *)k_moe_fused<NG, D, 0>, (const void *)k_moe_fused<NG, D, 1>},                                 \
     [](dim3 g, size_t sm, cudaStream_t st, const mf_args &a, const mf_route *r) {                              \
         if (r) return cu_launch(k_moe_fused<NG, D, 1>, g, dim3(NG * MF_WARPS * 32), sm, st, a, *r);            \
         mf_route z;                                                                                              \
         memset(&z, 0, sizeof z);                                                                                 \
         return cu_launch(k_moe_fused<NG, D, 0>, g, dim3(NG * MF_WARPS * 32), sm, st, a, z);                      \
     },                                                                                                           \
     NG, D}
    /* in order of preference on a tie of the cost model: GLM-5's three-group forms tie, and the shallower
     * ring measured 0.01-0.02 ms a step faster (H200, s17 run 4: 2.894 / 2.891 against 2.919 / 2.902) */
    MF_FORM(1, 6), MF_FORM(1, 4), MF_FORM(2, 6), MF_FORM(3, 4), MF_FORM(3, 6),
    /* last, so that the cost model's ties keep going to the forms above; the cost model may still pick
     * them where they cost strictly less. Made for `moeserve tune` (forced in model runs, H200 s17 run
     * 6: Air (2, 4) 5.613 against the cost model's 5.686 ms a step, GLM-5 x12 (3, 3) 2.880 against 2.895) */
    MF_FORM(2, 4), MF_FORM(3, 3),
#undef MF_FORM
};
#define MF_NFORMS ((int)(sizeof mf_forms / sizeof mf_forms[0]))

static long long mf_routed_launches;         /* ms_cuda_moe_fused_routed_launches; the same */
static long long mf_form_launches[MF_NFORMS]; /* ms_cuda_moe_fused_form_launches; the same */

/* Contract in backend_cuda.h. */
extern "C" long long ms_cuda_moe_fused_launches(void) { /* every launch counts in its form's counter */
    long long n = 0;
    for (int f = 0; f < MF_NFORMS; f++) n += __atomic_load_n(&mf_form_launches[f], __ATOMIC_RELAXED);
    return n;
}

/* Contract in backend_cuda.h. */
extern "C" long long ms_cuda_moe_fused_routed_launches(void) {
    return __atomic_load_n(&mf_routed_launches, __ATOMIC_RELAXED);
}

/* Contract in backend_cuda.h. */
extern "C" int ms_cuda_moe_fused_form(int f, int *groups, int *depth) {
    if (f < 0 || f >= MF_NFORMS) return 0;
    *groups = mf_forms[f].ng, *depth = mf_forms[f].d;
    return 1;
}

/* Contract in backend_cuda.h. */
extern "C" long long ms_cuda_moe_fused_form_launches(int f) {
    return f < 0 || f >= MF_NFORMS ? 0 : __atomic_load_n(&mf_form_launches[f], __ATOMIC_RELAXED);
}

/* Contract in cuda_internal.cuh. Grid: as many blocks as fit on the GPU at once (occupancy: every block
 * the phase boundary waits for must be resident), capped by the larger phase's items over the groups a
 * block. Shared memory: max(x, h) staging + 256 zero bytes + 2 x 7 reduction partials a group + the
 * warps' rings. Form (MS_CU_MOE_FUSED=1): the least (rounds of phase A items x a warp's steps in one +
 * the same for B) x warps an SM, i.e. the busiest warp's steps if the SM's issue rate is what they share (measured on the
 * H200, session 10: Air's 792 + 256 items prefer one group a block at 2 blocks an SM, GLM-5's 1152 +
 * 384 three groups a block), unless the caller names a form (tuned); MS_CU_MOE_FUSED=2+f forces form f. */
int cu_moe_fused(ms_backend *b, const cu_moe_fused_call *c, int *launched, ms_err *err) {
    *launched = 0;
    const cu_wdesc &g = c->gate_h, &d = c->down_h;
    const int H = g.k, I = g.n, knob = cu_knob(CU_KNOB_MOE_FUSED);
    if (!knob || b->gpu.cc_major < 8 || !cu_of(b)->moe_sync) return MS_OK;
    const cu_wdesc &u = c->up_h;
    if (g.fmt != MS_WFMT_NVFP4 || d.fmt != MS_WFMT_NVFP4 || u.fmt != MS_WFMT_NVFP4 || d.n != H || d.k != I ||
        u.n != I || u.k != H || c->n_experts < 1 || b->gpu.n_sm <= 0)
        return MS_OK;
    const int ns = c->nslot + (c->extra_slot > 0);
    if (H <= 0 || I <= 0 || H % 128 || I % 128 || c->nslot < 0 || ns < 1 || ns > MF_MAXS) return MS_OK;
    /* expert 0's alignment stands for every expert's: each NVFP4 linear is its own cudaMalloc allocation
     * (cu_stack_linears refuses NVFP4 parts, so none is a view at an offset), and the shapes, hence the
     * row and scale strides, are equal across the layer (moe_cu_prepare checks) */
    if (((uintptr_t)c->x & 15) || ((uintptr_t)c->h & 15) || ((uintptr_t)g.w & 15) || ((uintptr_t)g.scale & 7) ||
        ((uintptr_t)d.w & 15) || ((uintptr_t)d.scale & 7) || ((uintptr_t)u.w & 15) || ((uintptr_t)u.scale & 7) || (c->out_type != MS_BF16 && c->out_type != MS_F32))
        return MS_OK;
    const int rsA = H / 8, rsB = I / 8; /* staged row units (mf_xslot: no padding) */
    /* the routed form: the plain x row past the paired one, later the 2 E scores in its place */
    const cu_moe_route *rt = c->route;
    mf_route mr;
    memset(&mr, 0, sizeof mr);
    int x_units = rsA > ns * rsB ? rsA : ns * rsB;
    if (rt) {
        const ms_route_cfg *rc = rt->rc;
        const int E = rc->n_experts, nks = (H + MF_RKS - 1) / MF_RKS;
        const int sc_units = (8 * E + 15) / 16, tail = rsA > sc_units ? rsA : sc_units;
        /* route_token_regs' limits; the norm's row in CU_NORM_U units for each of CU_NORM_T threads; the
         * partials in the backend's scratch */
        if (!cu_knob(CU_KNOB_MOE_ROUTE) || cu_knob(CU_KNOB_ROUTER) != CU_ROUTER_SPLIT || cu_knob(CU_KNOB_ROUTER_UNFUSED) ||
            !cu_of(b)->moe_part || E < 1 || rc->n_group < 1 || rc->topk < 1 ||
            !route_regs_fits(E, rc->n_group, rc->topk) || E % rc->n_group || rc->topk_group < 1 ||
            rc->topk_group > rc->n_group || rc->topk > E || rc->topk != c->nslot || rt->nin.H != H ||
            H / 8 > CU_NORM_U * CU_NORM_T || ((uintptr_t)rt->W & 15) || (int64_t)nks * E > CU_MOE_PART_MAX ||
            (rt->bias && rt->bias_t != MS_F32 && rt->bias_t != MS_BF16))
            return MS_OK;
        if (x_units < rsA + tail) x_units = rsA + tail;
        mr.W = rt->W, mr.bias = rt->bias, mr.bt = rt->bias_t, mr.E = E, mr.topk = rc->topk, mr.n_group = rc->n_group;
        mr.topk_group = rc->topk_group, mr.norm = rc->norm_topk_prob, mr.scale = rc->routed_scaling_factor;
        mr.nks = nks, mr.part = cu_of(b)->moe_part, mr.ids = rt->ids, mr.wts = rt->wts, mr.nin = rt->nin;
        mr.plain_off = rsA, mr.early = cu_of(b)->weights_quiet;
    }
    const int nsm = b->gpu.n_sm;
    const int itemsA = ns * (I / 16), itemsB = H / 16, most = itemsA > itemsB ? itemsA : itemsB;
    const int64_t sA = (H / 128 + 3) / 4, sB = ((int64_t)ns * (I / 128) + MF_WARPS - 1) / MF_WARPS;
    /* 256 zero bytes at 64 mod 128 past x (mf_step: the zero lanes' reads fall in the other half of the
     * banks than the x lanes'), then each group's reduction buffers, then the rings */
    const size_t zero_off = (((size_t)x_units * 16 + 127) & ~(size_t)127) + 64;
    const size_t red_off = (zero_off + 256 + 127) & ~(size_t)127;
    int best = -1, best_grid = 0;
    size_t best_smem = 0;
    int64_t best_cost = 0;
    int want = -1; /* the caller's form, tried alone first */
    for (int f = 0; f < MF_NFORMS && knob == 1; f++)
        if (mf_forms[f].ng == c->form_groups && mf_forms[f].d == c->form_depth) want = f;
    /* the caller's form alone, then (it does not fit, or none was named) the cost model over all */
    for (int pass = want >= 0 ? 0 : 1; pass < 2 && best < 0; pass++) {
        for (int f = 0; f < MF_NFORMS; f++) {
            if ((knob >= 2 && f != knob - 2) || (pass == 0 && f != want)) continue;
            const int ng = mf_forms[f].ng;
            const size_t smem = MF_ALIGN + red_off + (size_t)ng * MF_RED_FLOATS * sizeof(float) +
                                (size_t)ng * MF_WARPS * mf_forms[f].d * GM_STG;
            int bps = 0;
            MS_TRY(cu_occupancy(b, mf_forms[f].kern[rt != NULL], ng * MF_WARPS * 32, smem, &bps, err));
            if (bps <= 0) continue;
            int grid = bps * nsm;
            if (grid > (most + ng - 1) / ng) grid = (most + ng - 1) / ng;
            const int64_t groups = (int64_t)grid * ng, per_sm = (int64_t)((grid + nsm - 1) / nsm) * ng * MF_WARPS;
            const int64_t cost = (((itemsA + groups - 1) / groups) * sA + ((itemsB + groups - 1) / groups) * sB) * per_sm;
            if (best < 0 || cost < best_cost) best = f, best_cost = cost, best_grid = grid, best_smem = smem;
        }
    }
    if (best < 0) return MS_OK;
    mf_args a;
    memset(&a, 0, sizeof a);
    a.G = c->G, a.U = c->U, a.D = c->D, a.ids = c->ids, a.wts = c->wts, a.nslot = c->nslot, a.H = H, a.I = I;
    a.extra_id = c->extra_slot - 1, a.n_experts = c->n_experts;
    a.x = c->x, a.h = c->h, a.out = c->out, a.out_type = c->out_type, a.sync = cu_of(b)->moe_sync;
    a.zero_off = (int)zero_off, a.red_off = (int)red_off;
    a.ring_off = (int)(red_off + (size_t)mf_forms[best].ng * MF_RED_FLOATS * sizeof(float));
    CK(mf_forms[best].go(dim3(best_grid), best_smem, cu_of(b)->stream, a, rt ? &mr : NULL));
    if (rt) __atomic_fetch_add(&mf_routed_launches, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&mf_form_launches[best], 1, __ATOMIC_RELAXED);
    *launched = 1;
    return MS_OK;
}
