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
 *   - Q is read from global memory straight into A fragments once per block (no shared copy).
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

/* First block of sequence s (see the header): ceil((seq_start[s] + s*(tpb-1)) / tpb). */
__device__ __forceinline__ int am_first_block(const int32_t *seq_start, int s, int tpb) {
    return (seq_start[s] + (s + 1) * (tpb - 1)) / tpb;
}

/* (cu_saddr, cu_cp16, cu_ldsm4, cu_ldsm4t, cu_mma_bf16, cu_pack_bf16 etc. are in cuda_internal.cuh.) */

template <int D> static constexpr size_t am_smem_bytes() { return (size_t)2 * 2 * AM_BN * (D + 8) * sizeof(bf16); }

template <int D>
__global__ __launch_bounds__(AM_THREADS, 3) void k_attn_mma(am_args a) {
    cu_pdl_wait();
    cu_pdl_trigger();
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

    /* Q fragments of the warp's 16 rows (zero for empty rows) */
    uint32_t qf[KS][4];
    {
        const uint32_t *q0 = (const uint32_t *)(a.q + orow[0] * D), *q1 = (const uint32_t *)(a.q + orow[1] * D);
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            qf[kk][0] = lim[0] >= 0 ? q0[kk * 8 + tq] : 0u;
            qf[kk][1] = lim[1] >= 0 ? q1[kk * 8 + tq] : 0u;
            qf[kk][2] = lim[0] >= 0 ? q0[kk * 8 + 4 + tq] : 0u;
            qf[kk][3] = lim[1] >= 0 ? q1[kk * 8 + 4 + tq] : 0u;
        }
    }

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

    float o[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}; /* l: this thread's share of the row sum */

    if (kt0 < kt1) {
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

template <int D> static int am_launch(ms_backend *b, const am_args *a, dim3 grid, ms_err *err) {
    const size_t sm = am_smem_bytes<D>();
    CK(cudaFuncSetAttribute(k_attn_mma<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    CK(cu_launch(k_attn_mma<D>, grid, AM_THREADS, sm, cu_of(b)->stream, *a));
    return MS_OK;
}

/* Contract in cuda_internal.cuh. */
int cu_attn_gqa_mma(ms_backend *b, const bf16 *q, const bf16 *kc, const bf16 *vc, int nh, int nkv, int d,
                    const ms_attn_meta *m, float scale, bf16 *out, int allow_split, int *launched, ms_err *err) {
    *launched = 0;
    if ((d != 64 && d != 128) || b->gpu.cc_major < 8) return MS_OK;
    const size_t sm = d == 64 ? am_smem_bytes<64>() : am_smem_bytes<128>();
    if (sm + 64 > (size_t)cu_of(b)->max_smem_optin) return MS_OK;
    const ms_batch *hb = m->host;
    const int T = hb->n_tokens;
    am_args a;
    memset(&a, 0, sizeof a);
    a.q = q;
    a.k = kc;
    a.v = vc;
    a.out = out;
    a.nh = nh;
    a.nkv = nkv;
    a.g = nh / nkv;
    a.hc = a.g < AM_BM ? a.g : AM_BM;
    a.n_chunks = (a.g + a.hc - 1) / a.hc;
    a.tpb = AM_BM / a.hc;
    a.n_seqs = hb->n_seqs;
    a.sl2 = scale * 1.4426950408889634f;
    a.positions = m->positions_d;
    a.seq_start = m->seq_start_d;
    a.block_table = m->block_table_d;
    a.max_blocks = hb->max_blocks;
    a.page_size = hb->page_size;
    /* blocks that have rows (the grid also holds up to n_seqs spare ones), for the split decision */
    int64_t groups = 0;
    for (int s = 0; s < hb->n_seqs; s++) groups += (hb->seq_start[s + 1] - hb->seq_start[s] + a.tpb - 1) / a.tpb;
    const int tiles = m->max_ctx > 0 ? (m->max_ctx + AM_BN - 1) / AM_BN : 1;
    MS_TRY(cu_attn_split(b, groups * nkv * a.n_chunks, tiles, 4, T, nh, d, allow_split, &a.n_split, &a.part, err));
    const int64_t gx = ((int64_t)T + (int64_t)(hb->n_seqs + 1) * (a.tpb - 1)) / a.tpb; /* P(n_seqs) */
    dim3 grid((unsigned)gx, (unsigned)(nkv * a.n_chunks), (unsigned)a.n_split);
    if (d == 64) MS_TRY(am_launch<64>(b, &a, grid, err));
    else MS_TRY(am_launch<128>(b, &a, grid, err));
    MS_TRY(cu_attn_combine(b, a.part, a.n_split, T, nh, d, out, err));
    *launched = 1;
    return MS_OK;
}
