/* attn_mma.cu - tensor-core flash attention for paged causal GQA (bf16 K/V caches, head dim 64 or
 * 128): the fast path of attn_gqa for prefill chunks, decode tokens and mixes of both. Shapes it does
 * not cover (and MLA) stay on k_attn in attention.cu.
 *
 * Work split. A block (4 warps) takes one sequence, one KV head and up to 64 query rows, a row being
 * a (query token, query head of that KV head's group) pair, token-major: row r = (token tb + r / hc,
 * head h0 + r % hc), hc = min(group, 64) heads per chunk, tpb = 64 / hc tokens per block. A decode
 * token of GLM-4.5-Air (12 heads per KV head) is 12 rows, a prefill chunk 60 rows per block, so both
 * fill 16-row MMA tiles. Warp w owns rows 16w..16w+15; a warp whose rows are all empty (decode) only
 * helps to load. Blocks walk keys 0..max position of their rows in tiles of 64, gathered from the
 * paged cache (slot = block_table[s][pos / page] * page + pos % page) into shared memory by 16-byte
 * cp.async, double-buffered; keys past that maximum, or past the block table, are zero-filled so a
 * masked key never brings NaN into P·V. Blocks map to (sequence, token group) without a host table:
 * sequence s owns blocks [P(s), P(s+1)) with P(s) = ceil((seq_start[s] + s*(tpb-1)) / tpb), which
 * leaves room for ceil(n_s / tpb) groups; the grid is walked backwards so the longest (latest) rows
 * start first. With n_split > 1 (small grids) blockIdx.z takes a range of the block's key tiles and
 * writes unnormalised partials (O, m, l) in k_attn's format; cu_attn_combine merges them.
 *
 * Decode steps with the preparation fused (PREP, backend/attn.h ms_attn_gqa_prep): every sequence has one
 * new token, so a block's rows are that token's heads and only the block whose key range holds the last
 * tile reads the token's own key. Each block makes its q rows itself from the raw projection output
 * (bias, RoPE: gqa_prep's arithmetic through cu_gqa_prep_unit) into shared memory while its first tile
 * loads, the blocks of range 0 also write them out as q; the block of the last tile makes the new k and v
 * rows, stores them into the caches and puts them into its tile in shared memory after the tile lands
 * (the copy it loaded from the cache may be the old row). Why: the gqa_prep kernel before this one is a
 * launch that moves ~30 KB a layer, and at batch 1 every launch in the layer's chain costs ~4 us.
 *
 * Before the wait. A PREP launch with pp.early (the weights are quiet, cu_impl.weights_quiet) does all
 * its work up to the raw rows before griddepcontrol.wait: the sequence starts, positions and block table
 * it needs for its key range, the first key tile of the cache, the biases and the rotary angles. None of
 * these is written by the kernel just before it: that kernel is the q|k|v projection (ms_attn_gqa_prep's
 * contract), and whatever wrote them earlier has completed, since a kernel starts only once every block
 * of the one before it has triggered or exited, and some block of that one waited first (cuda_internal.cuh).
 * The new token's cache row is the one row of the tile the step writes; the block that owns it puts the
 * new row over its copy, as above. After the wait come the raw rows (L2), the slot and the later tiles
 * as in the wait-first form. The meta stays on plain loads (through L1), as after a wait: read through
 * the L2 only (ld.global.cg) it measured 0.16 ms a step slower at batch 1 and 9.7 ms at batch 64 with
 * 8192 keys (the block table is read for every tile). H200, session
 * 20 (runs 8, 9), Air's step against the wait-first kernel: batch 1 5.37-5.40 ms against 5.41-5.43 at
 * 256 keys and 6.03 against 6.29 at 8192; batch 64 35.58 against 35.44 and 64.61 against 64.27 (the
 * projection before it is then a cuBLAS GEMM, so nothing overlaps, and the rows wait for the tile).
 *
 * Math, per warp and key tile: S = Q·Kᵀ (16 x 64, fp32) by mma.m16n8k16 bf16; per-row online softmax
 * in the log2 domain (scores times scale*log2(e), exp2f, running max m and sum l; a row that has seen
 * no key keeps m = -inf and uses 0 as its base so no inf - inf appears); P rounded to bf16 and
 * O += P·V (16 x D, fp32). Output O / l in bf16 (or the partials, with m converted back to natural log).
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16 .bf16; g = lane >> 2, t = lane & 3):
 *   A 16x16 (row-major): reg0 = A[g][2t..2t+1], reg1 = A[g+8][2t..], reg2 = A[g][2t+8..], reg3 = A[g+8][2t+8..]
 *   B 16x8  (k x n):     reg0 = B[2t..2t+1][g],  reg1 = B[2t+8..2t+9][g]
 *   C 16x8  (fp32):      c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]
 * (lower index in the low 16 bits of each register). Consequences used below:
 *   - Q is read from global memory straight into A fragments once per block (no shared copy; PREP
 *     reads the rows it made in shared memory instead).
 *   - For S = Q·Kᵀ, B[k][n] = K[key n][dim k]: a K row in shared memory is B's column, so plain
 *     ldmatrix (thread gets row g, columns 2t, 2t+1 of each 8x8 matrix) yields B fragments; one .x4
 *     covers two 8-key n-tiles x 16 dims (matrices: keys 0-7/dims 0-7, keys 0-7/dims 8-15, keys
 *     8-15/dims 0-7, keys 8-15/dims 8-15 -> reg0/reg1 of n-tile 0, reg0/reg1 of n-tile 1).
 *   - The C fragment of S for 8-key n-tiles 2j and 2j+1 is exactly the A fragment of P for keys
 *     16j..16j+15 (rows g and g+8, columns 2t.. and 2t+8..), so P never leaves registers.
 *   - For O += P·V, B[k][n] = V[key k][dim n] is row-major in shared memory, so ldmatrix .trans
 *     (thread gets rows 2t, 2t+1 of column g) yields B; one .x4.trans covers 16 keys x two 8-dim
 *     n-tiles (matrices: keys 0-7/dims 0-7, keys 8-15/dims 0-7, keys 0-7/dims 8-15, keys 8-15/dims 8-15).
 * Shared rows are padded to D + 8 elements (272 bytes for D = 128): the 8 row addresses of an
 * ldmatrix then fall in 8 different 16-byte bank groups, so reads are conflict-free without a swizzle. */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/attn.h"

#include <math.h>
#include <stdlib.h>

#define AM_WARPS 4
#define AM_THREADS (AM_WARPS * 32)
#define AM_BM (AM_WARPS * 16) /* query rows per block */
#define AM_BN 64              /* keys per tile */

struct am_args {
    const bf16 *q, *k, *v;
    bf16 *out;
    int nh, nkv, g, hc, n_chunks, tpb, n_seqs;
    float sl2; /* scale * log2(e) */
    const int32_t *positions, *seq_start, *block_table;
    int max_blocks, page_size;
    int n_split;
    float *part; /* n_split > 1: [T][nh][n_split][D + 2] */
};

/* PREP only: row t of the raw q / k / v at qi / ki / vi + t * ldq / ldk / ldv; F32 biases or NULL; RoPE
 * as ms_rope_cfg with inv its inverse frequencies; rotated q out to qo [T][nh][D]; this step's cache rows
 * written to kw / vw at slot[t] when 0 <= slot[t] < n_slots. early: the meta, the first key tile and the
 * biases are read before griddepcontrol.wait (file comment, "Before the wait"). A parameter of its own: in
 * am_args it cost the plain kernel a register spill (ptxas, sm_90a). Its layout is measured: the same
 * fields as qkv + ld (the stacked row and one stride, 32 bytes less) made Air's batch-1 step 0.11 ms
 * slower on the H200 (session 20, run 7), for reasons not found; early sits in the former padding. */
struct am_prep {
    const bf16 *qi, *ki, *vi;
    int64_t ldq, ldk, ldv;
    const float *bq, *bk, *bv, *inv;
    int rot_off, rot_dim, interleaved, early;
    bf16 *qo, *kw, *vw;
    const int32_t *slot;
    int64_t n_slots;
};

/* First block of sequence s (see the header): ceil((seq_start[s] + s*(tpb-1)) / tpb). */
__device__ __forceinline__ int am_first_block(const int32_t *seq_start, int s, int tpb) {
    return (seq_start[s] + (s + 1) * (tpb - 1)) / tpb;
}

/* (cu_saddr, cu_cp16, cu_ldsm4, cu_ldsm4t, cu_mma_bf16, cu_pack_bf16 etc. are in cuda_internal.cuh.) */

template <int D> static constexpr size_t am_smem_bytes() { return (size_t)2 * 2 * AM_BN * (D + 8) * sizeof(bf16); }
/* PREP's shared memory after the tiles: the block's q rows [hc][d], the new k and v rows [d] each (bf16),
 * then cos and sin of the rotary pairs (rot_dim floats). */
static size_t am_prep_bytes(int hc, int d, int rot_dim) {
    return (size_t)(hc + 2) * d * sizeof(bf16) + (size_t)rot_dim * sizeof(float);
}

template <int D, bool PREP>
__global__ __launch_bounds__(AM_THREADS, 3) void k_attn_mma(am_args a, am_prep pp) {
    /* a decode step's PREP launch reads everything but the raw rows before the wait (file comment) */
    const bool early = PREP && pp.early;
    if (!early) {
        cu_pdl_wait();
        cu_pdl_trigger();
    }
    constexpr int LDS = D + 8;            /* shared row stride in elements */
    constexpr int KS = D / 16;            /* k-steps of Q·Kᵀ */
    constexpr int NT = D / 8;             /* 8-wide n-tiles of O */
    constexpr int CPR = D / 8;            /* 16-byte chunks per key row */
    constexpr int RPP = AM_THREADS / CPR; /* key rows per load pass */
    static_assert(D % 16 == 0 && AM_THREADS % CPR == 0 && AM_BN % RPP == 0, "head dim");
    extern __shared__ __align__(16) unsigned char am_sm[];
    bf16 *Ks = (bf16 *)am_sm;           /* [2][AM_BN][LDS] */
    bf16 *Vs = Ks + 2 * AM_BN * LDS;    /* [2][AM_BN][LDS] */
    __shared__ int sh_seq, sh_wmax[AM_WARPS];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;

    /* which sequence and token group: exactly one s has P(s) <= x < P(s+1) */
    const int x = (int)gridDim.x - 1 - (int)blockIdx.x;
    if (tid == 0) sh_seq = -1;
    __syncthreads();
    for (int s = tid; s < a.n_seqs; s += AM_THREADS)
        if (am_first_block(a.seq_start, s, a.tpb) <= x && x < am_first_block(a.seq_start, s + 1, a.tpb)) sh_seq = s;
    __syncthreads();
    const int s = sh_seq;
    if (s < 0) return;
    const int s1 = a.seq_start[s + 1];
    const int tb = a.seq_start[s] + (x - am_first_block(a.seq_start, s, a.tpb)) * a.tpb;
    if (tb >= s1) return; /* a spare block of this sequence */
    const int ntok = min(a.tpb, s1 - tb);
    const int kvh = blockIdx.y / a.n_chunks, h0 = (blockIdx.y % a.n_chunks) * a.hc;
    const int nhc = min(a.hc, a.g - h0), hq0 = kvh * a.g + h0;

    /* this thread's two rows (g and g+8 of its warp's tile): last visible key, -1 = empty row */
    int lim[2];
    size_t orow[2]; /* token * nh + head of the row */
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = warp * 16 + gq + 8 * hf, ti = r / a.hc, hi = r % a.hc;
        const bool ok = ti < ntok && hi < nhc;
        lim[hf] = ok ? a.positions[tb + ti] : -1;
        orow[hf] = ok ? (size_t)(tb + ti) * a.nh + hq0 + hi : 0;
    }
    const int wmax = __reduce_max_sync(0xffffffffu, max(lim[0], lim[1]));
    if (lane == 0) sh_wmax[warp] = wmax;
    __syncthreads();
    int maxkey = sh_wmax[0];
#pragma unroll
    for (int w = 1; w < AM_WARPS; w++) maxkey = max(maxkey, sh_wmax[w]);

    /* Q fragments of the warp's 16 rows (zero for empty rows): from global memory, or (PREP) from the
     * rows the block makes below */
    uint32_t qf[KS][4];
    auto load_q = [&](const uint32_t *q0, const uint32_t *q1) {
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            qf[kk][0] = lim[0] >= 0 ? q0[kk * 8 + tq] : 0u;
            qf[kk][1] = lim[1] >= 0 ? q1[kk * 8 + tq] : 0u;
            qf[kk][2] = lim[0] >= 0 ? q0[kk * 8 + 4 + tq] : 0u;
            qf[kk][3] = lim[1] >= 0 ? q1[kk * 8 + 4 + tq] : 0u;
        }
    };
    if constexpr (!PREP) load_q((const uint32_t *)(a.q + orow[0] * D), (const uint32_t *)(a.q + orow[1] * D));

    /* this block's key tiles: range z of the tiles covering keys 0..maxkey */
    const int ntiles = maxkey / AM_BN + 1;
    const int per = (ntiles + a.n_split - 1) / a.n_split;
    const int kt0 = (int)blockIdx.z * per, kt1 = min(ntiles, kt0 + per);

    const int32_t *bt = a.block_table + (size_t)s * a.max_blocks;
    const int lrow = tid / CPR, lcol = (tid % CPR) * 8;
    auto load_tile = [&](int kt, int buf) {
        bf16 *kd = Ks + buf * AM_BN * LDS, *vd = Vs + buf * AM_BN * LDS;
#pragma unroll
        for (int i = 0; i < AM_BN / RPP; i++) {
            const int jj = lrow + i * RPP, key = kt * AM_BN + jj;
            const bf16 *ksrc = a.k, *vsrc = a.v;
            bool ok = false;
            if (key <= maxkey) {
                const int pg = key / a.page_size;
                if (pg < a.max_blocks) {
                    const size_t row = ((size_t)bt[pg] * a.page_size + key % a.page_size) * a.nkv + kvh;
                    ksrc = a.k + row * D + lcol;
                    vsrc = a.v + row * D + lcol;
                    ok = true;
                }
            }
            cu_cp16(cu_saddr(kd + jj * LDS + lcol), ksrc, ok);
            cu_cp16(cu_saddr(vd + jj * LDS + lcol), vsrc, ok);
        }
    };
    /* PREP: the block's q rows (and, for the block of the last tile, the new k / v rows) made while the
     * first tile loads. The raw rows and biases come in by cp.async (one round trip, not one a unit): raw
     * q into qs, raw k / v into kn / vn, all made in place; the biases (q [nhc][D], k [D], v [D], fp32)
     * into the second K buffer, which the loop first fills after this. ovr = the new key's row in the
     * last tile when this block puts it there itself. With pp.early the first tile and the biases go
     * out before the wait and only the raw rows, which the previous kernel writes, after it; the rows
     * then wait for the tile too (cp.async groups complete in order). Without, the rows go first and the
     * tile lands while they are made (file comment, "Before the wait"). */
    int ovr = -1;
    bf16 *qs = NULL, *kn = NULL, *vn = NULL;
    float *cs = NULL, *sb = NULL;
    const bool last = kt0 <= ntiles - 1 && ntiles - 1 < kt1;
    if constexpr (PREP) {
        qs = Vs + 2 * AM_BN * LDS;
        kn = qs + a.hc * D;
        vn = kn + D;
        cs = (float *)(vn + D);
        sb = (float *)(Ks + AM_BN * LDS);
        const size_t t = (size_t)tb;
        auto put_biases = [&]() {
            if (pp.bq)
                for (int c = tid; c < nhc * D / 4; c += AM_THREADS)
                    cu_cp16(cu_saddr(sb + c * 4), pp.bq + (size_t)hq0 * D + c * 4, true);
            if (last)
                for (int c = tid; c < D / 4; c += AM_THREADS) {
                    if (pp.bk) cu_cp16(cu_saddr(sb + nhc * D + c * 4), pp.bk + (size_t)kvh * D + c * 4, true);
                    if (pp.bv) cu_cp16(cu_saddr(sb + (nhc + 1) * D + c * 4), pp.bv + (size_t)kvh * D + c * 4, true);
                }
        };
        auto put_rows = [&]() {
            const bf16 *qrow = pp.qi + t * pp.ldq + (size_t)hq0 * D;
            for (int c = tid; c < nhc * D / 8; c += AM_THREADS) cu_cp16(cu_saddr(qs + c * 8), qrow + c * 8, true);
            if (last) {
                const bf16 *krow = pp.ki + t * pp.ldk + (size_t)kvh * D, *vrow = pp.vi + t * pp.ldv + (size_t)kvh * D;
                for (int c = tid; c < D / 8; c += AM_THREADS) {
                    cu_cp16(cu_saddr(kn + c * 8), krow + c * 8, true);
                    cu_cp16(cu_saddr(vn + c * 8), vrow + c * 8, true);
                }
            }
        };
        if (early) {
            if (kt0 < kt1) load_tile(kt0, 0);
            put_biases();
            cu_cp_commit();
        } else {
            put_rows();
            put_biases();
            cu_cp_commit();
            if (kt0 < kt1) {
                load_tile(kt0, 0);
                cu_cp_commit();
            }
        }
        const int half = pp.rot_dim / 2, per_h = half + (D - pp.rot_dim);
        const int p = a.positions[tb];
        for (int j = tid; j < half; j += AM_THREADS) sincosf((float)p * pp.inv[j], &cs[half + j], &cs[j]);
        if (early) {
            cu_pdl_wait();
            cu_pdl_trigger();
            put_rows();
            cu_cp_commit();
            cu_cp_wait<0>();
        } else if (kt0 < kt1) {
            cu_cp_wait<1>(); /* the rows, not the tile */
        } else {
            cu_cp_wait<0>();
        }
        __syncthreads();
        bf16 *qg = blockIdx.z == 0 ? pp.qo + (t * a.nh + hq0) * D : NULL;
        for (int u = tid; u < nhc * per_h; u += AM_THREADS) {
            const int hi = u / per_h;
            cu_gqa_prep_unit(qs + hi * D, pp.bq ? sb + hi * D : NULL, cs, u % per_h, pp.rot_off, pp.rot_dim,
                             pp.interleaved, qs + hi * D, qg ? qg + (size_t)hi * D : NULL);
        }
        if (last) {
            const int64_t sl = pp.slot[tb];
            const bool st = sl >= 0 && sl < pp.n_slots;
            bf16 *kg = st ? pp.kw + ((size_t)sl * a.nkv + kvh) * D : NULL, *vg = st ? pp.vw + ((size_t)sl * a.nkv + kvh) * D : NULL;
            for (int u = tid; u < per_h; u += AM_THREADS)
                cu_gqa_prep_unit(kn, pp.bk ? sb + nhc * D : NULL, cs, u, pp.rot_off, pp.rot_dim, pp.interleaved, kn, kg);
            for (int i = tid; i < D; i += AM_THREADS) {
                const bf16 r = __float2bfloat16_rn(__bfloat162float(vn[i]) + (pp.bv ? sb[(nhc + 1) * D + i] : 0.f));
                vn[i] = r;
                if (vg) vg[i] = r;
            }
            /* the tile reads the row the block table names; the new key belongs there only when that is
             * the slot just written (as it is in every decode step); otherwise the cache's row stands, as
             * it would after the separate gqa_prep kernel */
            const int pg = p / a.page_size;
            if (st && pg < a.max_blocks && (int64_t)bt[pg] * a.page_size + p % a.page_size == sl)
                ovr = p - (ntiles - 1) * AM_BN;
        }
        __syncthreads();
    }

    if constexpr (PREP) {
        load_q((const uint32_t *)(qs + ((warp * 16 + gq) % a.hc) * D),
               (const uint32_t *)(qs + ((warp * 16 + gq + 8) % a.hc) * D));
    }

    float o[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}; /* l: this thread's share of the row sum */

    if (!PREP && kt0 < kt1) {
        load_tile(kt0, 0);
        cu_cp_commit();
    }
    for (int kt = kt0; kt < kt1; kt++) {
        const int buf = (kt - kt0) & 1;
        if (kt + 1 < kt1) {
            load_tile(kt + 1, buf ^ 1);
            cu_cp_commit();
            cu_cp_wait<1>();
        } else {
            cu_cp_wait<0>();
        }
        __syncthreads();
        if (PREP && ovr >= 0 && kt == ntiles - 1) { /* block-uniform: the new key's row, made above */
            if (tid < D / 4) {
                const int c = (tid % (D / 8)) * 8;
                const bf16 *src = (tid < D / 8 ? kn : vn) + c;
                bf16 *dst = (tid < D / 8 ? Ks : Vs) + buf * AM_BN * LDS + ovr * LDS + c;
                *(uint4 *)dst = *(const uint4 *)src;
            }
            __syncthreads();
        }
        if (kt * AM_BN <= wmax) { /* warp-uniform: some row of this warp sees a key of the tile */
            const bf16 *kb = Ks + buf * AM_BN * LDS, *vb = Vs + buf * AM_BN * LDS;
            float sc[AM_BN / 8][4];
#pragma unroll
            for (int i = 0; i < AM_BN / 8; i++) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
            /* S = Q·Kᵀ; ldmatrix lane address: key (lane & 7) + 8 * (lane >> 4), dims + 8 * ((lane >> 3) & 1) */
#pragma unroll
            for (int kk = 0; kk < KS; kk++)
#pragma unroll
                for (int np = 0; np < AM_BN / 16; np++) {
                    uint32_t bk[4];
                    cu_ldsm4(bk, cu_saddr(kb + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDS + kk * 16 +
                                          (((lane >> 3) & 1) << 3)));
                    cu_mma_bf16(sc[2 * np], qf[kk], bk[0], bk[1]);
                    cu_mma_bf16(sc[2 * np + 1], qf[kk], bk[2], bk[3]);
                }
            /* causal mask, online softmax (log2 domain), O += P·V */
            const int key0 = kt * AM_BN + 2 * tq;
#pragma unroll
            for (int nt = 0; nt < AM_BN / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float &v = sc[nt][e];
                    v = key0 + nt * 8 + (e & 1) <= lim[e >> 1] ? v * a.sl2 : -INFINITY;
                }
            cu_softmax_tile(sc, m, l, o);
            cu_pv_tile(sc, vb + ((lane & 7) + (((lane >> 3) & 1) << 3)) * LDS + ((lane >> 4) << 3), LDS, o);
        }
        __syncthreads(); /* the next iteration's loads overwrite this buffer */
    }

    /* row sums across the 4 lanes holding a row, then write */
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 1);
        l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 2);
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        if (lim[hf] < 0) continue;
        if (a.part) {
            float *p = a.part + (orow[hf] * a.n_split + blockIdx.z) * (D + 2);
#pragma unroll
            for (int dt = 0; dt < NT; dt++)
                *(float2 *)(p + dt * 8 + 2 * tq) = make_float2(o[dt][2 * hf], o[dt][2 * hf + 1]);
            if (tq == 0) {
                p[D] = m[hf] * 0.69314718f; /* natural-log max, as k_attn_combine expects */
                p[D + 1] = l[hf];
            }
        } else {
            const float inv = l[hf] > 0.f ? 1.f / l[hf] : 0.f;
            bf16 *op = a.out + orow[hf] * D;
#pragma unroll
            for (int dt = 0; dt < NT; dt++)
                *(__nv_bfloat162 *)(op + dt * 8 + 2 * tq) =
                    __floats2bfloat162_rn(o[dt][2 * hf] * inv, o[dt][2 * hf + 1] * inv);
        }
    }
}

template <int D, bool PREP>
static int am_launch(ms_backend *b, const am_args *a, const am_prep *pp, dim3 grid, size_t sm, ms_err *err) {
    CK(cudaFuncSetAttribute(k_attn_mma<D, PREP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    CK(cu_launch(k_attn_mma<D, PREP>, grid, AM_THREADS, sm, cu_of(b)->stream, *a, *pp));
    return MS_OK;
}

static long long am_prep_launches;       /* ms_cuda_attn_prep_launches; updated atomically */
static long long am_prep_early_launches; /* ms_cuda_attn_prep_form_launches(0); the same */
static long long am_prep_split_launches; /* ms_cuda_attn_prep_form_launches(1); the same */

/* Contract in backend_cuda.h. */
extern "C" long long ms_cuda_attn_prep_launches(void) { return __atomic_load_n(&am_prep_launches, __ATOMIC_RELAXED); }

/* Contract in backend_cuda.h. */
extern "C" long long ms_cuda_attn_prep_form_launches(int which) {
    return which == 0   ? __atomic_load_n(&am_prep_early_launches, __ATOMIC_RELAXED)
           : which == 1 ? __atomic_load_n(&am_prep_split_launches, __ATOMIC_RELAXED)
                        : 0;
}

/* The launch of q [T][nh][d] against caches kc / vc (prep_sm > 0: a PREP launch with *pp and that many
 * extra shared bytes), then the merge of split-K partials into out. */
static int am_run(ms_backend *b, am_args *a, const am_prep *pp, const bf16 *q, const bf16 *kc, const bf16 *vc, int nh, int nkv, int d,
                  const ms_attn_meta *m, float scale, bf16 *out, int allow_split, size_t prep_sm, ms_err *err) {
    const ms_batch *hb = m->host;
    const int T = hb->n_tokens;
    a->q = q;
    a->k = kc;
    a->v = vc;
    a->out = out;
    a->nh = nh;
    a->nkv = nkv;
    a->g = nh / nkv;
    a->hc = a->g < AM_BM ? a->g : AM_BM;
    a->n_chunks = (a->g + a->hc - 1) / a->hc;
    a->tpb = AM_BM / a->hc;
    a->n_seqs = hb->n_seqs;
    a->sl2 = scale * 1.4426950408889634f;
    a->positions = m->positions_d;
    a->seq_start = m->seq_start_d;
    a->block_table = m->block_table_d;
    a->max_blocks = hb->max_blocks;
    a->page_size = hb->page_size;
    /* blocks that have rows (the grid also holds up to n_seqs spare ones), for the split decision */
    int64_t groups = 0;
    for (int s = 0; s < hb->n_seqs; s++) groups += (hb->seq_start[s + 1] - hb->seq_start[s] + a->tpb - 1) / a->tpb;
    const int tiles = m->max_ctx > 0 ? (m->max_ctx + AM_BN - 1) / AM_BN : 1;
    if (tiles <= cu_knob(CU_KNOB_ATTN_SPLIT_TILES)) allow_split = 0;
    MS_TRY(cu_attn_split(b, groups * nkv * a->n_chunks, tiles, 4, T, nh, d, allow_split, &a->n_split, &a->part, err));
    const int64_t gx = ((int64_t)T + (int64_t)(hb->n_seqs + 1) * (a->tpb - 1)) / a->tpb; /* P(n_seqs) */
    dim3 grid((unsigned)gx, (unsigned)(nkv * a->n_chunks), (unsigned)a->n_split);
    const size_t sm = (d == 64 ? am_smem_bytes<64>() : am_smem_bytes<128>()) + prep_sm;
    if (prep_sm) {
        if (d == 64) MS_TRY((am_launch<64, true>(b, a, pp, grid, sm, err)));
        else MS_TRY((am_launch<128, true>(b, a, pp, grid, sm, err)));
        __atomic_fetch_add(&am_prep_launches, 1, __ATOMIC_RELAXED);
        if (pp->early) __atomic_fetch_add(&am_prep_early_launches, 1, __ATOMIC_RELAXED);
        if (a->n_split > 1) __atomic_fetch_add(&am_prep_split_launches, 1, __ATOMIC_RELAXED);
    } else if (d == 64) {
        MS_TRY((am_launch<64, false>(b, a, pp, grid, sm, err)));
    } else {
        MS_TRY((am_launch<128, false>(b, a, pp, grid, sm, err)));
    }
    return cu_attn_combine(b, a->part, a->n_split, T, nh, d, out, err);
}

/* Contract in cuda_internal.cuh. */
int cu_attn_gqa_mma(ms_backend *b, const bf16 *q, const bf16 *kc, const bf16 *vc, int nh, int nkv, int d,
                    const ms_attn_meta *m, float scale, bf16 *out, int allow_split, int *launched, ms_err *err) {
    *launched = 0;
    if ((d != 64 && d != 128) || b->gpu.cc_major < 8) return MS_OK;
    const size_t sm = d == 64 ? am_smem_bytes<64>() : am_smem_bytes<128>();
    if (sm + 64 > (size_t)cu_of(b)->max_smem_optin) return MS_OK;
    am_args a;
    am_prep pp;
    memset(&a, 0, sizeof a);
    memset(&pp, 0, sizeof pp);
    MS_TRY(am_run(b, &a, &pp, q, kc, vc, nh, nkv, d, m, scale, out, allow_split, 0, err));
    *launched = 1;
    return MS_OK;
}

/* Contract in cuda_internal.cuh. */
int cu_attn_gqa_mma_prep(ms_backend *b, const ms_attn_call *c, int *launched, ms_err *err) {
    *launched = 0;
    const ms_attn_gqa_prep *p = c->prep;
    const ms_tensor *q = c->q, *kc = c->k, *vc = c->v, *qkv = p->qkv;
    const ms_batch *hb = c->m->host;
    /* the kernel rotates at the batch's positions (the meta's), so prep's must be those */
    if (!cu_knob(CU_KNOB_ATTN_PREP) || !qkv || !qkv->data || q->ndim != 3 || kc->ndim != 3 || vc->ndim != 3 ||
        b->gpu.cc_major < 8 || p->pos_d != c->m->positions_d)
        return MS_OK;
    const int T = (int)q->shape[0], nh = (int)q->shape[1], d = (int)q->shape[2], nkv = (int)kc->shape[1];
    if ((d != 64 && d != 128) || T < 1 || nkv < 1 || nh % nkv || nh / nkv > AM_BM || T != hb->n_tokens ||
        T != hb->n_seqs || kc->shape[2] != d || vc->shape[1] != nkv || vc->shape[2] != d ||
        vc->shape[0] != kc->shape[0] || q->dtype != MS_BF16 || kc->dtype != MS_BF16 || vc->dtype != MS_BF16 ||
        qkv->dtype != MS_BF16 || c->out->dtype != MS_BF16 || qkv->ndim != 2 || qkv->shape[0] != T ||
        qkv->shape[1] != (int64_t)(nh + 2 * nkv) * d || qkv->data == q->data)
        return MS_OK;
    for (int s = 0; s < hb->n_seqs; s++) /* one new token a sequence (T == n_seqs, no empty sequence) */
        if (hb->seq_start[s + 1] - hb->seq_start[s] != 1) return MS_OK;
    const ms_rope_cfg *rc = p->rc;
    const int rot_dim = rc ? rc->rot_dim : 0, rot_off = rc ? rc->rot_off : 0;
    if (rot_dim % 2 || rot_dim < 0 || rot_off < 0 || rot_off + rot_dim > d) return MS_OK;
    int ok = 1;
    am_args a;
    am_prep pp;
    memset(&a, 0, sizeof a);
    memset(&pp, 0, sizeof pp);
    pp.bq = cu_f32_opt(p->bq, (int64_t)nh * d, &ok);
    pp.bk = cu_f32_opt(p->bk, (int64_t)nkv * d, &ok);
    pp.bv = cu_f32_opt(p->bv, (int64_t)nkv * d, &ok);
    if (!ok) return MS_OK;
    const int hc = nh / nkv;
    /* the biases are staged in the second K buffer; cp.async moves 16-byte pieces */
    if ((size_t)(hc + 2) * d * sizeof(float) > (size_t)AM_BN * (d + 8) * sizeof(bf16)) return MS_OK;
    if (((uintptr_t)qkv->data | (uintptr_t)pp.bq | (uintptr_t)pp.bk | (uintptr_t)pp.bv) & 15) return MS_OK;
    const size_t prep_sm = am_prep_bytes(hc, d, rot_dim);
    if ((d == 64 ? am_smem_bytes<64>() : am_smem_bytes<128>()) + prep_sm + 64 > (size_t)cu_of(b)->max_smem_optin)
        return MS_OK;
    if (rot_dim) MS_TRY(cu_rope_table(b, rc, &pp.inv, err));
    pp.ldq = pp.ldk = pp.ldv = qkv->shape[1];
    pp.qi = (const bf16 *)qkv->data;
    pp.ki = pp.qi + (size_t)nh * d;
    pp.vi = pp.ki + (size_t)nkv * d;
    /* before the wait (file comment): the biases and the RoPE table are weights (quiet); the meta and the
     * old cache rows are not written by the projection that precedes this call (ms_attn_gqa_prep) */
    pp.early = cu_of(b)->weights_quiet && cu_knob(CU_KNOB_ATTN_PREP) == 2 && !cu_prev_early;
    pp.rot_off = rot_off;
    pp.rot_dim = rot_dim;
    pp.interleaved = rc ? rc->interleaved : 0;
    pp.qo = (bf16 *)q->data;
    pp.kw = (bf16 *)kc->data;
    pp.vw = (bf16 *)vc->data;
    pp.slot = p->slot_d;
    pp.n_slots = kc->shape[0];
    MS_TRY(am_run(b, &a, &pp, (const bf16 *)q->data, (const bf16 *)kc->data, (const bf16 *)vc->data, nh, nkv, d, c->m,
                  c->scale, (bf16 *)c->out->data, 1, prep_sm, err));
    *launched = 1;
    return MS_OK;
}
