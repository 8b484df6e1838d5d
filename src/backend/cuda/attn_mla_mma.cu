/* attn_mla_mma.cu - absorbed MLA attention (dense causal, or restricted to the DSA indexer's top-k
 * keys) on tensor cores: the fast path of mla_attn for GLM-5-style models in prefill and decode.
 *
 * Why a kernel of its own: in absorbed form every head of a token reads the same latent rows
 * (kvl + dr = 576 wide for GLM-5), so the 64 heads of one token are the M dimension of one MMA tile
 * (FlashMLA's layout) and a latent row is loaded once per block for all of them. The CUDA-core kernel
 * (k_attn) re-reads it per 16-head chunk and does the dot products on CUDA cores: 1.9 s of a 4096-token
 * GLM-5 prefill (bench/NOTES.md).
 *
 * Work split, 64-head form (prefill and large grids). A block (8 warps) takes one query token, up to
 * 64 of its heads (blockIdx.y picks the group) and, with n_split > 1, one range of its key tiles
 * (blockIdx.z). Warp w owns heads 16*(w&3).. +15 of the group (its head tile) and output columns
 * (w>>2)*DV/2 .. +DV/2 (its part), so each keeps half of O in registers (128 floats a thread for DV =
 * 512 instead of 256). The two warps of a head tile need the same scores; they split Q·Kᵀ's reduction
 * (576 wide for GLM-5): part dh sums the k-steps of its half of the dims (18 of 36; with an odd count
 * the first half takes one more), writes its partial S to a shared slot, meets its partner at a
 * 64-thread named barrier (id 1 + head tile) and adds the partner's partial, always as part(dh 0) +
 * part(dh 1), so both warps hold bit-identical S and take the same softmax maxima. Per 32-key tile that
 * is 8 x 72 + 8 x 64 = 1088 MMAs; computing S in both warps, as the first version did, was 1664.
 *
 * 16-head form (decode). At batch 1 the 64-head grid is T x groups x key ranges = 32 blocks at ctx 1024
 * even with one-tile ranges (100 of 132 SMs idle), and each block's time is one tile's chain of
 * dependent steps: Q (73 KB) and the tile in, 36 k-steps of Q·Kᵀ over two warps, the exchange, softmax,
 * P·V over 256 columns a warp, 131 KB of partials out. Here a block takes 16 heads (blockIdx.y picks
 * the 16-head group), so 4x the blocks run, and its 4 warps are one head tile split 4 ways: part p
 * (warp p) sums the k-steps [ceil(p·KS/4), ceil((p+1)·KS/4)) (9 of 36 at 576; 3+2+3+2 at 160, 2+1+1+1
 * at 80) and owns output columns p·DV/4 .. +DV/4 (128 at 512: 64 floats of O a thread). The partial S
 * go through the same per-warp shared slots; after a 128-thread named barrier every warp forms ((p0 +
 * p1) + p2) + p3 in that fixed order (its own part from registers: the same floats it stored), so all
 * four hold bit-identical S. Per warp and tile: 36 + 32 MMAs in chains of 9 (Q·Kᵀ, 4 accumulators) and
 * 2 (P·V, 16 n-tiles) instead of 72 + 64 in chains of 18 and 2 (32 n-tiles); the MMA total per head
 * tile is unchanged. The cost: every latent row is gathered by the 4 head groups' blocks (4 x 1.2 MB
 * at ctx 1024, from L2 after the first), and each warp reads 3 partner slots (1.5 KB) a tile instead of 1. Shared memory at
 * 576: Q 16 rows + two 32-row tiles (stride 584) + tables + 4 slots = 102,400 bytes, so two blocks fit
 * an H200 SM (the split then aims at two blocks an SM) and one an A100's. Alternatives weighed: 2 warps
 * x halves as the 64-head form (same per-warp chain as today: only the grid grows); 8 warps x 8 parts
 * (chains of 5, but 7 partner slots a warp: 4x the exchange's shared-memory traffic, and 8-way sums).
 * The host picks the form (cu_attn_mla_mma, mm_pick_hb): 16 heads when nh <= 16 (a 64-head block would
 * leave head tiles idle), else 64; MS_CU_MLA_HEADS=64|16 forces one. The 16-head form for small decode
 * grids (T x 64-head groups x key tiles below the SM count) was built for batch-1 GLM-5 and measured no
 * faster on the H200 (3.351-3.384 vs 3.324 ms a step, bench/NOTES.md), so it is not chosen there.
 *
 * Keys (both forms). The token's keys are either 0..position (dense MLA, and DSA tokens
 * whose position is below index_topk, where the top-k list must hold every causal key) or the
 * token's top-k list (-1 entries unused). Keys come in tiles of 32 latent rows gathered from the paged
 * cache (slot = block_table[s][pos / page] * page + pos % page) by 16-byte cp.async, double-buffered,
 * one __syncthreads per tile; the slots are resolved two tiles ahead by one thread per row into small
 * shared tables (its top-k and block-table loads land during the compute of earlier tiles), so
 * issuing a tile's copies waits on no global load. A missing key is zero-filled and masked, so it
 * never brings NaN into P·V. Q (HB x DK) sits in shared memory for the whole walk and its A fragments
 * are reloaded by ldmatrix per k-step.
 *
 * Math per warp and tile: S = Q·Kᵀ (16 x 32, fp32, mma.m16n8k16 bf16, partial sums as above); online softmax in the log2
 * domain as attn_mma.cu (a row that has seen no key keeps m = -inf and uses 0 as its base); P rounded
 * to bf16 and O += P·V over the first DV columns of the same shared rows (ldmatrix .trans). Output O/l
 * in bf16, or with n_split > 1 the partials (O, m in natural log, l) that cu_attn_combine merges.
 * Fragment layouts: cuda_internal.cuh. Shared rows are padded so a row is an odd number of 16-byte
 * chunks: ldmatrix's 8 row addresses then fall in 8 different bank groups. */
#include "backend/cuda/cuda_internal.cuh"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define MM_BN 32 /* keys per tile */
/* Blocks come in two forms (template HB, heads per block; the host picks one per call, see
 * cu_attn_mla_mma): HB 64, 8 warps = 4 head tiles x 2 parts; HB 16, 4 warps = 1 head tile x 4 parts.
 * A part is a warp's share of a head tile: 1/NP of Q·Kᵀ's k-steps and 1/NP of the output columns. */
template <int HB> struct mm_form {
    static constexpr int HT = HB / 16;            /* head tiles per block */
    static constexpr int NW = HB == 64 ? 8 : 4;   /* warps */
    static constexpr int NP = NW / HT;            /* parts (warps) per head tile */
    static constexpr int THREADS = NW * 32;
    static_assert(HB == 64 || HB == 16, "compiled forms: 64 and 16 heads a block");
};
/* Partial-S exchange slot per warp: [MM_BN / 8 n-tiles][32 lanes] float4 (a lane's C fragment of one
 * n-tile), so a warp's store or load of one n-tile is 512 contiguous bytes: no bank conflicts. */
static constexpr int mm_xs_bytes(int nw) { return nw * (MM_BN / 8) * 32 * 16; }
/* Stages of the per-tile key tables (key, cache slot): a tile's entries are written two iterations
 * before its P·V reads them, and the stage is rewritten three tiles later. */
#define MM_ST 3

struct mm_args {
    const bf16 *q, *lat;
    bf16 *out;
    int nh;
    float sl2; /* scale * log2(e) */
    const int32_t *positions, *token_seq, *block_table, *topk;
    int topk_n, max_blocks, page_size;
    int n_split;
    float *part; /* n_split > 1: [T][nh][n_split][DV + 2] */
};

/* Shared row stride (elements) for a row of dk: dk + 8 or dk + 16, whichever is an odd number of
 * 16-byte chunks. */
static int mm_lds(int dk) { return (dk / 8) % 2 == 0 ? dk + 8 : dk + 16; }

/* Dynamic shared memory of a block of hb heads (64 or 16) for a latent row of dk: Q, two key tiles,
 * the key tables, the partial-S slots (576: 166,656 bytes at 64 heads, 102,400 at 16). */
static size_t mm_smem(int dk, int hb) {
    const int nw = hb == 64 ? 8 : 4;
    return (size_t)(hb + 2 * MM_BN) * (size_t)mm_lds(dk) * sizeof(bf16) + 2 * MM_ST * MM_BN * sizeof(int) +
           (size_t)mm_xs_bytes(nw);
}

/* Barrier of the n threads of one head tile's warps (ids 1..4; 0 is __syncthreads; n = 64 for the
 * two warps of a 64-head block's tile, 128 for the four of a 16-head block). Orders their
 * shared-memory accesses like __syncthreads does for the block. */
__device__ __forceinline__ void mm_pair_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

template <int DK, int DV, int HB>
__global__ __launch_bounds__(mm_form<HB>::THREADS, 1) void k_mla_mma(mm_args a) {
    cu_pdl_wait();
    cu_pdl_trigger();
    constexpr int TH = mm_form<HB>::THREADS, HT = mm_form<HB>::HT, NP = mm_form<HB>::NP;
    constexpr int DVW = DV / NP; /* output columns per warp */
    constexpr int NT = DVW / 8;  /* 8-wide n-tiles of O per warp */
    constexpr int LDS = (DK / 8) % 2 == 0 ? DK + 8 : DK + 16, CPR = DK / 8;
    /* Q·Kᵀ k-steps: part p takes [ks_lo(p), ks_lo(p + 1)), ks_lo(p) = ceil(p * KS / NP) (NP 2: the
     * first half one more when KS is odd), at most KSP */
    constexpr int KS = DK / 16, KSP = (KS + NP - 1) / NP;
    static_assert(DV % (16 * NP) == 0 && DK % 16 == 0 && DK >= DV, "latent widths");
    extern __shared__ __align__(16) unsigned char mm_sm[];
    bf16 *Qs = (bf16 *)mm_sm;                 /* [HB][LDS] */
    bf16 *Ks = Qs + HB * LDS;                 /* [2][MM_BN][LDS] */
    int *kpos = (int *)(Ks + 2 * MM_BN * LDS); /* [MM_ST][MM_BN]: key position, -1 = masked */
    int *kslot = kpos + MM_ST * MM_BN;         /* [MM_ST][MM_BN]: cache slot of an unmasked key */
    float4 *xs = (float4 *)(kslot + MM_ST * MM_BN); /* [warps][MM_BN / 8][32]: partial S (16-byte
                                                       aligned: LDS is a multiple of 8 elements, MM_ST *
                                                       MM_BN ints a multiple of 16 bytes) */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int hw = warp % HT, dh = warp / HT; /* head tile, part */
    const int t = blockIdx.x, h0 = blockIdx.y * HB;
    /* warp-uniform, and the same for all warps of a head tile (it does not depend on dh): a tile's
     * warps are active or idle together, so none waits at mm_pair_sync for a partner that never comes */
    const bool active = h0 + hw * 16 < a.nh;
    const int pos = a.positions[t], s = a.token_seq[t];
    const bool dense = !a.topk || pos + 1 <= a.topk_n;
    const int nkeys = dense ? pos + 1 : a.topk_n;
    const int ntiles = (nkeys + MM_BN - 1) / MM_BN;
    const int per = (ntiles + a.n_split - 1) / a.n_split;
    const int kt0 = (int)blockIdx.z * per, kt1 = min(ntiles, kt0 + per);
    const int32_t *bt = a.block_table + (size_t)s * a.max_blocks;
    const int32_t *tl = a.topk ? a.topk + (size_t)t * a.topk_n : NULL;

    for (int i = tid; i < HB * CPR; i += TH) {
        const int r = i / CPR, c = (i % CPR) * 8, h = h0 + r;
        const bool ok = h < a.nh;
        cu_cp16(cu_saddr(Qs + r * LDS + c), ok ? a.q + ((size_t)t * a.nh + h) * DK + c : a.q, ok);
    }
    /* Key addresses run two tiles ahead of the copies, so no global load sits on a cp.async's issue
     * path (before, each of a thread's 9 chunks did top-k entry -> block table -> address -> cp.async,
     * the chains in series behind the copies' memory clobber, all warps at once). Thread r < MM_BN
     * owns row r of every tile: at the top of iteration kt it issues the block-table load of tile
     * kt + 2 (its key arrived during iteration kt - 1) and the top-k load of tile kt + 3; after tile
     * kt's compute it publishes tile kt + 2's key and slot in stage (kt + 2 - kt0) % MM_ST, which the
     * barrier of iteration kt + 1 makes visible to that iteration's copies (of tile kt + 2). The
     * prologue resolves tiles kt0 and kt0 + 1 directly. */
    auto key_of = [&](int kt) -> int { /* row tid of tile kt: -1 none, else a key (maybe out of range) */
        const int idx = kt * MM_BN + tid;
        return kt < kt1 && idx < nkeys ? (dense ? idx : tl[idx]) : -1;
    };
    auto page_of = [&](int key) -> int { /* block-table entry of a key in range, or -1 */
        return key >= 0 && key <= pos && key / a.page_size < a.max_blocks ? bt[key / a.page_size] : -1;
    };
    /* A key is masked (kpos -1, kslot -1, its row zero-filled) when < 0, past the position, on a page
     * at or past max_blocks, or on a page the block table does not map (entry < 0). Slots fit an int:
     * 2^31 latent rows would be over 160 GB even at width 80. */
    auto publish = [&](int kt, int key, int pg) {
        const int st = (kt - kt0) % MM_ST;
        const bool ok = key >= 0 && key <= pos && key / a.page_size < a.max_blocks && pg >= 0;
        kpos[st * MM_BN + tid] = ok ? key : -1;
        kslot[st * MM_BN + tid] = ok ? pg * a.page_size + key % a.page_size : -1;
    };
    constexpr int NCH = (MM_BN * CPR + TH - 1) / TH; /* 16-byte chunks a thread copies */
    auto load_tile = [&](int kt, int buf) { /* the copies of a published tile */
        bf16 *kd = Ks + buf * MM_BN * LDS;
        const int *ks = kslot + ((kt - kt0) % MM_ST) * MM_BN;
        /* every slot read before the first copy: the copies' memory clobber keeps later reads behind them */
        int sl[NCH];
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            const int i = tid + ch * TH;
            sl[ch] = (MM_BN * CPR) % TH == 0 || i < MM_BN * CPR ? ks[i / CPR] : -1;
        }
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            const int i = tid + ch * TH, j = i / CPR, c = (i % CPR) * 8;
            if ((MM_BN * CPR) % TH == 0 || i < MM_BN * CPR)
                cu_cp16(cu_saddr(kd + j * LDS + c), sl[ch] >= 0 ? a.lat + (size_t)sl[ch] * DK + c : a.lat, sl[ch] >= 0);
        }
    };
    const bool owner = tid < MM_BN;
    int key2 = -1, key3 = -1, pg2 = -1; /* owner: keys of tiles kt + 2, kt + 3; block-table entry of kt + 2 */

    float o[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}; /* l: this thread's share of the row sum */

    if (owner && kt0 < kt1) {
        const int k0 = key_of(kt0), k1 = key_of(kt0 + 1);
        key2 = key_of(kt0 + 2);
        publish(kt0, k0, page_of(k0));
        publish(kt0 + 1, k1, page_of(k1));
    }
    __syncthreads();
    if (kt0 < kt1) load_tile(kt0, 0);
    cu_cp_commit(); /* Q and the first tile */
    for (int kt = kt0; kt < kt1; kt++) {
        const int buf = (kt - kt0) & 1;
        if (owner) { /* loads only: their values are used after this tile's compute */
            pg2 = page_of(key2);
            key3 = key_of(kt + 3);
        }
        cu_cp_wait<0>(); /* tile kt (and Q) */
        /* One barrier a tile: it publishes tile kt's rows and tile kt + 1's keys, and every warp has left
         * tile kt - 1, so its buffer, its key-table stage and the partial-S slots can be rewritten. */
        __syncthreads();
        if (kt + 1 < kt1) {
            load_tile(kt + 1, buf ^ 1);
            cu_cp_commit();
        }
        if (active) {
            const bf16 *kb = Ks + buf * MM_BN * LDS;
            const int *kp = kpos + ((kt - kt0) % MM_ST) * MM_BN;
            float sc[MM_BN / 8][4];
#pragma unroll
            for (int i = 0; i < MM_BN / 8; i++) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
            /* This warp's partial S = Q·Kᵀ over its k-steps [k0, k0 + nks). A (heads x dims) by ldmatrix:
             * lane address row lane & 15, dims + 8 * (lane >> 4); B as attn_mma.cu: key (lane & 7) + 8 *
             * (lane >> 4), dims + 8 * ((lane >> 3) & 1). Four independent accumulators. */
            const int k0 = (dh * KS + NP - 1) / NP, nks = ((dh + 1) * KS + NP - 1) / NP - k0;
            const bf16 *qrow = Qs + (hw * 16 + (lane & 15)) * LDS + ((lane >> 4) << 3) + k0 * 16;
            const bf16 *krow = kb + ((lane & 7) + ((lane >> 4) << 3)) * LDS + (((lane >> 3) & 1) << 3) + k0 * 16;
#pragma unroll 6
            for (int kk = 0; kk < KSP; kk++) {
                if (KS % NP == 0 || kk < nks) { /* KS not a multiple of NP leaves some parts one step short */
                    uint32_t qa[4];
                    cu_ldsm4(qa, cu_saddr(qrow + kk * 16));
#pragma unroll
                    for (int np = 0; np < MM_BN / 16; np++) {
                        uint32_t bk[4];
                        cu_ldsm4(bk, cu_saddr(krow + np * 16 * LDS + kk * 16));
                        cu_mma_bf16(sc[2 * np], qa, bk[0], bk[1]);
                        cu_mma_bf16(sc[2 * np + 1], qa, bk[2], bk[3]);
                    }
                }
            }
            /* S = part 0 + part 1 (+ part 2 + part 3), summed left to right in every warp of the tile, so
             * all of them hold bit-identical S and take the same softmax maxima. Lane l of every warp of
             * the tile holds the same (head, key) elements of the C fragment. NP 2: each warp adds own +
             * partner's: IEEE 754 addition is commutative (both orders round the same exact sum), so both
             * get the bits of part(0) + part(1) without selecting operands by dh (a fused or
             * reassociated form would break this: none exists for one add). NP 4: ((p0 + p1) + p2) + p3,
             * this warp's own part taken from its registers (the same floats it stored). A slot is
             * reused next tile only after the next iteration's __syncthreads, which every warp of the
             * tile reaches after its reads. */
            float4 *mine = xs + (warp * (MM_BN / 8)) * 32 + lane;
#pragma unroll
            for (int nt = 0; nt < MM_BN / 8; nt++) mine[nt * 32] = make_float4(sc[nt][0], sc[nt][1], sc[nt][2], sc[nt][3]);
            mm_pair_sync(1 + hw, 32 * NP);
            if constexpr (NP == 2) {
                const float4 *other = xs + ((warp ^ 4) * (MM_BN / 8)) * 32 + lane;
#pragma unroll
                for (int nt = 0; nt < MM_BN / 8; nt++) {
                    const float4 p = other[nt * 32];
                    sc[nt][0] += p.x;
                    sc[nt][1] += p.y;
                    sc[nt][2] += p.z;
                    sc[nt][3] += p.w;
                }
            } else {
#pragma unroll
                for (int nt = 0; nt < MM_BN / 8; nt++) {
                    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                    for (int p = 0; p < NP; p++) {
                        const float4 v = p == dh ? make_float4(sc[nt][0], sc[nt][1], sc[nt][2], sc[nt][3])
                                                 : xs[((hw + p * HT) * (MM_BN / 8) + nt) * 32 + lane];
                        if (p == 0) acc = v;
                        else {
                            acc.x += v.x;
                            acc.y += v.y;
                            acc.z += v.z;
                            acc.w += v.w;
                        }
                    }
                    sc[nt][0] = acc.x;
                    sc[nt][1] = acc.y;
                    sc[nt][2] = acc.z;
                    sc[nt][3] = acc.w;
                }
            }
            /* mask missing keys, online softmax (log2 domain), O += P·V over this warp's value columns */
#pragma unroll
            for (int nt = 0; nt < MM_BN / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float &v = sc[nt][e];
                    v = kp[nt * 8 + 2 * tq + (e & 1)] >= 0 ? v * a.sl2 : -INFINITY;
                }
            cu_softmax_tile(sc, m, l, o);
            cu_pv_tile(sc, kb + ((lane & 7) + (((lane >> 3) & 1) << 3)) * LDS + dh * DVW + ((lane >> 4) << 3), LDS, o);
        }
        if (owner) { /* read by the copies of iteration kt + 1, after its barrier */
            publish(kt + 2, key2, pg2);
            key2 = key3;
        }
    }
    cu_cp_wait<0>(); /* an empty key range still committed Q's copies */
    if (!active) return;

#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 1);
        l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 2);
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int h = h0 + hw * 16 + gq + 8 * hf;
        if (h >= a.nh) continue;
        const size_t row = (size_t)t * a.nh + h;
        if (a.part) {
            float *p = a.part + (row * a.n_split + blockIdx.z) * (DV + 2);
#pragma unroll
            for (int dt = 0; dt < NT; dt++)
                *(float2 *)(p + dh * DVW + dt * 8 + 2 * tq) = make_float2(o[dt][2 * hf], o[dt][2 * hf + 1]);
            if (dh == 0 && tq == 0) {
                p[DV] = m[hf] * 0.69314718f; /* natural-log max, as k_attn_combine expects */
                p[DV + 1] = l[hf];
            }
        } else {
            const float inv = l[hf] > 0.f ? 1.f / l[hf] : 0.f;
            bf16 *op = a.out + row * DV + dh * DVW;
#pragma unroll
            for (int dt = 0; dt < NT; dt++)
                *(__nv_bfloat162 *)(op + dt * 8 + 2 * tq) =
                    __floats2bfloat162_rn(o[dt][2 * hf] * inv, o[dt][2 * hf + 1] * inv);
        }
    }
}

template <int DK, int DV, int HB> static int mm_launch(ms_backend *b, const mm_args *a, dim3 grid, ms_err *err) {
    const size_t sm = mm_smem(DK, HB);
    CK(cudaFuncSetAttribute(k_mla_mma<DK, DV, HB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    CK(cu_launch(k_mla_mma<DK, DV, HB>, grid, mm_form<HB>::THREADS, sm, cu_of(b)->stream, *a));
    return MS_OK;
}

/* Heads a block for a model of nh heads (per rank): 16 when nh <= 16, where a 64-head block would idle
 * head tiles, else 64; force 64 or 16 (MS_CU_MLA_HEADS) wins, 0 = choose. The grid-size rule this was
 * built with (16 heads when T x 64-head groups x key tiles < SMs, i.e. small decode grids) measured no
 * gain on the H200 (bench/NOTES.md "MLA decode head split"), so the grid does not decide. */
static int mm_pick_hb(int nh, int force) {
    if (force == 64 || force == 16) return force;
    return nh <= 16 ? 16 : 64;
}

/* The (latent row, value width) pairs compiled: GLM-5 / DeepSeek (512 + 64) and two small shapes the
 * fixtures and tests use; the k-loop is unrolled per row width, which a runtime width prevented. */
static const int mm_shapes[][2] = {{576, 512}, {160, 128}, {80, 64}};

/* Contract in cuda_internal.cuh. */
int cu_attn_mla_mma_covers(const ms_backend *b, int dk, int dv, char *why, size_t cap) {
    char tmp[8];
    if (!why) why = tmp, cap = sizeof tmp;
    if (b->gpu.cc_major < 8)
        return snprintf(why, cap, "it needs bf16 tensor cores (mma.sync, compute capability 8.0 or newer)"), 0;
    int known = 0;
    for (size_t i = 0; i < sizeof mm_shapes / sizeof mm_shapes[0]; i++) known |= mm_shapes[i][0] == dk && mm_shapes[i][1] == dv;
    if (!known)
        return snprintf(why, cap,
                        "it is compiled for latent widths (kv_lora_rank + rope dims) 512+64, 128+32 and 64+16 only "
                        "(this model: %d+%d)", dv, dk - dv), 0;
    /* the 64-head form is the larger: a GPU that fits it fits the 16-head one */
    if (mm_smem(dk, 64) > (size_t)cu_smem_optin(b))
        return snprintf(why, cap, "a latent row of %d needs %zu bytes of shared memory per block, the GPU allows %d", dk,
                        mm_smem(dk, 64), cu_smem_optin(b)), 0;
    return 1;
}

/* Contract in cuda_internal.cuh. */
int cu_attn_mla_mma(ms_backend *b, const ms_tensor *q, const ms_tensor *latent, const ms_attn_meta *m,
                    const int32_t *topk_d, int topk, int kvl, float scale, ms_tensor *out, int allow_split,
                    int *launched, ms_err *err) {
    *launched = 0;
    MS_ASSERT(q->ndim == 3);
    const int T = (int)q->shape[0], nh = (int)q->shape[1], D = (int)q->shape[2];
    MS_ASSERT(latent->shape[latent->ndim - 1] == D && kvl <= D && T == m->host->n_tokens);
    if (q->dtype != MS_BF16 || latent->dtype != MS_BF16 || out->dtype != MS_BF16) return MS_OK;
    if (!cu_attn_mla_mma_covers(b, D, kvl, NULL, 0)) return MS_OK;
    *launched = 1;
    if (T == 0) return MS_OK;
    mm_args a;
    memset(&a, 0, sizeof a);
    a.q = (const bf16 *)q->data;
    a.lat = (const bf16 *)latent->data;
    a.out = (bf16 *)out->data;
    a.nh = nh;
    a.sl2 = scale * 1.4426950408889634f;
    a.positions = m->positions_d;
    a.token_seq = m->token_seq_d;
    a.block_table = m->block_table_d;
    a.topk = topk_d;
    a.topk_n = topk_d ? topk : 0;
    a.max_blocks = m->host->max_blocks;
    a.page_size = m->host->page_size;
    const int max_keys = topk_d ? (topk < m->max_ctx ? topk : m->max_ctx) : m->max_ctx;
    const int tiles = max_keys > 0 ? (max_keys + MM_BN - 1) / MM_BN : 1;
    const int knob = cu_knob(CU_KNOB_MLA_HEADS);
    const int hb = mm_pick_hb(nh, knob == CU_MLA_HEADS_64 ? 64 : knob == CU_MLA_HEADS_16 ? 16 : 0);
    const int groups = (nh + hb - 1) / hb;
    /* one key tile per split-K range where the grid is small: a tile costs a block ~6 us of latency
     * (one block per SM), so at batch 1 many one-tile ranges and a fast combine beat fewer longer
     * ranges (H200, GLM-5 ctx 1024: 9 ranges of 4 tiles 26.9 us + 6.9 us combine). A 16-head block
     * of width 576 takes 100 KB of shared memory, so two share an SM where the GPU allows it (H200;
     * one on A100): the split aims at two blocks an SM then */
    const int per_sm = hb == 16 && (size_t)cu_smem_optin(b) >= 2 * mm_smem(D, 16) ? 2 : 1;
    MS_TRY(cu_attn_split(b, (int64_t)T * groups, tiles, per_sm, T, nh, kvl, allow_split, &a.n_split, &a.part, err));
    dim3 grid((unsigned)T, (unsigned)groups, (unsigned)a.n_split);
    if (hb == 64) {
        if (D == 576) MS_TRY((mm_launch<576, 512, 64>(b, &a, grid, err)));
        else if (D == 160) MS_TRY((mm_launch<160, 128, 64>(b, &a, grid, err)));
        else MS_TRY((mm_launch<80, 64, 64>(b, &a, grid, err)));
    } else {
        if (D == 576) MS_TRY((mm_launch<576, 512, 16>(b, &a, grid, err)));
        else if (D == 160) MS_TRY((mm_launch<160, 128, 16>(b, &a, grid, err)));
        else MS_TRY((mm_launch<80, 64, 16>(b, &a, grid, err)));
    }
    return cu_attn_combine(b, a.part, a.n_split, T, nh, kvl, (bf16 *)out->data, err);
}
