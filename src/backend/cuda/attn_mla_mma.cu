/* attn_mla_mma.cu - absorbed MLA attention (dense causal, or restricted to the DSA indexer's top-k
 * keys) on tensor cores: the fast path of mla_attn for GLM-5-style models in prefill and decode.
 *
 * Why a kernel of its own: in absorbed form every head of a token reads the same latent rows
 * (kvl + dr = 576 wide for GLM-5), so the 64 heads of one token are the M dimension of one MMA tile
 * (FlashMLA's layout) and a latent row is loaded once per block for all of them. The CUDA-core kernel
 * (k_attn) re-reads it per 16-head chunk and does the dot products on CUDA cores: 1.9 s of a 4096-token
 * GLM-5 prefill (bench/NOTES.md).
 *
 * Work split. A block (8 warps) takes one query token, up to 64 of its heads (blockIdx.y picks the
 * group) and, with n_split > 1, one range of its key tiles (blockIdx.z). Warp w owns heads 16*(w&3)..
 * +15 of the group and output columns (w>>2)*DV/2 .. +DV/2, so each keeps half of O in registers (128
 * floats a thread for DV = 512 instead of 256). The two warps of a head tile need the same scores; they
 * split Q·Kᵀ's reduction (576 wide for GLM-5): warp half dh sums the k-steps of its half of the dims
 * (18 of 36; with an odd count the first half takes one more), writes its partial S to a shared slot,
 * meets its partner at a 64-thread named barrier (id 1 + head tile) and adds the partner's partial,
 * always as part(dh 0) + part(dh 1), so both warps hold bit-identical S and take the same softmax
 * maxima. Per 32-key tile that is 8 x 72 + 8 x 64 = 1088 MMAs; computing S in both warps, as the first
 * version did, was 1664. The token's keys are either 0..position (dense MLA, and DSA tokens
 * whose position is below index_topk, where the top-k list must hold every causal key) or the
 * token's top-k list (-1 entries unused). Keys come in tiles of 32 latent rows gathered from the paged
 * cache (slot = block_table[s][pos / page] * page + pos % page) by 16-byte cp.async, double-buffered,
 * one __syncthreads per tile; the slots are resolved two tiles ahead by one thread per row into small
 * shared tables (its top-k and block-table loads land during the compute of earlier tiles), so
 * issuing a tile's copies waits on no global load. A missing key is zero-filled and masked, so it
 * never brings NaN into P·V. Q (64 x DK) sits in shared memory for the whole walk and its A fragments
 * are reloaded by ldmatrix per k-step.
 *
 * Math per warp and tile: S = Q·Kᵀ (16 x 32, fp32, mma.m16n8k16 bf16, two partial sums as above); online softmax in the log2
 * domain as attn_mma.cu (a row that has seen no key keeps m = -inf and uses 0 as its base); P rounded
 * to bf16 and O += P·V over the first DV columns of the same shared rows (ldmatrix .trans). Output O/l
 * in bf16, or with n_split > 1 the partials (O, m in natural log, l) that cu_attn_combine merges.
 * Fragment layouts: cuda_internal.cuh. Shared rows are padded so a row is an odd number of 16-byte
 * chunks: ldmatrix's 8 row addresses then fall in 8 different bank groups. */
#include "backend/cuda/cuda_internal.cuh"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define MM_WARPS 8
#define MM_THREADS (MM_WARPS * 32)
#define MM_HB 64 /* heads per block */
#define MM_BN 32 /* keys per tile */
/* Partial-S exchange slot per warp: [MM_BN / 8 n-tiles][32 lanes] float4 (a lane's C fragment of one
 * n-tile), so a warp's store or load of one n-tile is 512 contiguous bytes: no bank conflicts. */
#define MM_XS_BYTES (MM_WARPS * (MM_BN / 8) * 32 * 16)
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

static size_t mm_smem(int dk) {
    return (size_t)(MM_HB + 2 * MM_BN) * (size_t)mm_lds(dk) * sizeof(bf16) + 2 * MM_ST * MM_BN * sizeof(int) +
           MM_XS_BYTES;
}

/* Barrier of the 64 threads of one head tile's two warps (ids 1..4; 0 is __syncthreads). Orders their
 * shared-memory accesses like __syncthreads does for the block. */
__device__ __forceinline__ void mm_pair_sync(int id) { asm volatile("bar.sync %0, 64;\n" ::"r"(id) : "memory"); }

template <int DK, int DV>
__global__ __launch_bounds__(MM_THREADS, 1) void k_mla_mma(mm_args a) {
    cu_pdl_wait();
    cu_pdl_trigger();
    constexpr int DVW = DV / 2; /* output columns per warp */
    constexpr int NT = DVW / 8; /* 8-wide n-tiles of O per warp */
    constexpr int LDS = (DK / 8) % 2 == 0 ? DK + 8 : DK + 16, CPR = DK / 8;
    constexpr int KS = DK / 16, KS0 = (KS + 1) / 2; /* Q·Kᵀ k-steps: warp half 0 takes [0, KS0), 1 the rest */
    static_assert(DV % 32 == 0 && DK % 16 == 0 && DK >= DV, "latent widths");
    static_assert(MM_WARPS == 8, "a head tile is warps w and w ^ 4");
    extern __shared__ __align__(16) unsigned char mm_sm[];
    bf16 *Qs = (bf16 *)mm_sm;                 /* [MM_HB][LDS] */
    bf16 *Ks = Qs + MM_HB * LDS;              /* [2][MM_BN][LDS] */
    int *kpos = (int *)(Ks + 2 * MM_BN * LDS); /* [MM_ST][MM_BN]: key position, -1 = masked */
    int *kslot = kpos + MM_ST * MM_BN;         /* [MM_ST][MM_BN]: cache slot of an unmasked key */
    float4 *xs = (float4 *)(kslot + MM_ST * MM_BN); /* [MM_WARPS][MM_BN / 8][32]: partial S (16-byte
                                                       aligned: LDS is a multiple of 8 elements, MM_ST *
                                                       MM_BN ints a multiple of 16 bytes) */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int hw = warp & 3, dh = warp >> 2;
    const int t = blockIdx.x, h0 = blockIdx.y * MM_HB;
    /* warp-uniform, and the same for both warps of a head tile (it does not depend on dh): a pair is
     * active or idle together, so neither waits at mm_pair_sync for a partner that never comes */
    const bool active = h0 + hw * 16 < a.nh;
    const int pos = a.positions[t], s = a.token_seq[t];
    const bool dense = !a.topk || pos + 1 <= a.topk_n;
    const int nkeys = dense ? pos + 1 : a.topk_n;
    const int ntiles = (nkeys + MM_BN - 1) / MM_BN;
    const int per = (ntiles + a.n_split - 1) / a.n_split;
    const int kt0 = (int)blockIdx.z * per, kt1 = min(ntiles, kt0 + per);
    const int32_t *bt = a.block_table + (size_t)s * a.max_blocks;
    const int32_t *tl = a.topk ? a.topk + (size_t)t * a.topk_n : NULL;

    for (int i = tid; i < MM_HB * CPR; i += MM_THREADS) {
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
    constexpr int NCH = (MM_BN * CPR + MM_THREADS - 1) / MM_THREADS; /* 16-byte chunks a thread copies */
    auto load_tile = [&](int kt, int buf) { /* the copies of a published tile */
        bf16 *kd = Ks + buf * MM_BN * LDS;
        const int *ks = kslot + ((kt - kt0) % MM_ST) * MM_BN;
        /* every slot read before the first copy: the copies' memory clobber keeps later reads behind them */
        int sl[NCH];
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            const int i = tid + ch * MM_THREADS;
            sl[ch] = (MM_BN * CPR) % MM_THREADS == 0 || i < MM_BN * CPR ? ks[i / CPR] : -1;
        }
#pragma unroll
        for (int ch = 0; ch < NCH; ch++) {
            const int i = tid + ch * MM_THREADS, j = i / CPR, c = (i % CPR) * 8;
            if ((MM_BN * CPR) % MM_THREADS == 0 || i < MM_BN * CPR)
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
            /* This warp's partial S = Q·Kᵀ over its k-steps (dims 16 * dh * KS0 on). A (heads x dims) by
             * ldmatrix: lane address row lane & 15, dims + 8 * (lane >> 4); B as attn_mma.cu: key
             * (lane & 7) + 8 * (lane >> 4), dims + 8 * ((lane >> 3) & 1). Four independent accumulators. */
            const int nks = dh ? KS - KS0 : KS0;
            const bf16 *qrow = Qs + (hw * 16 + (lane & 15)) * LDS + ((lane >> 4) << 3) + dh * KS0 * 16;
            const bf16 *krow = kb + ((lane & 7) + ((lane >> 4) << 3)) * LDS + (((lane >> 3) & 1) << 3) + dh * KS0 * 16;
#pragma unroll 6
            for (int kk = 0; kk < KS0; kk++) {
                if (KS % 2 == 0 || kk < nks) { /* an odd KS leaves half 1 one step short */
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
            /* S = part(dh 0) + part(dh 1). Lane l of the partner warp holds the same (head, key) elements
             * of the C fragment as lane l here. Each warp adds own + partner's: IEEE 754 addition is
             * commutative (both orders round the same exact sum), so both warps get the bits of
             * part(dh 0) + part(dh 1) without selecting operands by dh (a fused or reassociated form would
             * break this: none exists for one add). The slot is reused next tile only after the next
             * iteration's __syncthreads, which the partner reaches after its read. */
            float4 *mine = xs + (warp * (MM_BN / 8)) * 32 + lane;
            const float4 *other = xs + ((warp ^ 4) * (MM_BN / 8)) * 32 + lane;
#pragma unroll
            for (int nt = 0; nt < MM_BN / 8; nt++) mine[nt * 32] = make_float4(sc[nt][0], sc[nt][1], sc[nt][2], sc[nt][3]);
            mm_pair_sync(1 + hw);
#pragma unroll
            for (int nt = 0; nt < MM_BN / 8; nt++) {
                const float4 p = other[nt * 32];
                sc[nt][0] += p.x;
                sc[nt][1] += p.y;
                sc[nt][2] += p.z;
                sc[nt][3] += p.w;
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

template <int DK, int DV> static int mm_launch(ms_backend *b, const mm_args *a, dim3 grid, ms_err *err) {
    const size_t sm = mm_smem(DK);
    CK(cudaFuncSetAttribute(k_mla_mma<DK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    CK(cu_launch(k_mla_mma<DK, DV>, grid, MM_THREADS, sm, cu_of(b)->stream, *a));
    return MS_OK;
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
    if (mm_smem(dk) > (size_t)cu_smem_optin(b))
        return snprintf(why, cap, "a latent row of %d needs %zu bytes of shared memory per block, the GPU allows %d", dk,
                        mm_smem(dk), cu_smem_optin(b)), 0;
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
    const int groups = (nh + MM_HB - 1) / MM_HB;
    const int max_keys = topk_d ? (topk < m->max_ctx ? topk : m->max_ctx) : m->max_ctx;
    /* one key tile per split-K range where the grid is small: a tile costs a block ~6 us of latency
     * (one block per SM), so at batch 1 many one-tile ranges and a fast combine beat fewer longer
     * ranges (H200, GLM-5 ctx 1024: 9 ranges of 4 tiles 26.9 us + 6.9 us combine) */
    MS_TRY(cu_attn_split(b, (int64_t)T * groups, max_keys > 0 ? (max_keys + MM_BN - 1) / MM_BN : 1, 1, T, nh, kvl,
                         allow_split, &a.n_split, &a.part, err));
    dim3 grid((unsigned)T, (unsigned)groups, (unsigned)a.n_split);
    if (D == 576) MS_TRY((mm_launch<576, 512>(b, &a, grid, err)));
    else if (D == 160) MS_TRY((mm_launch<160, 128>(b, &a, grid, err)));
    else MS_TRY((mm_launch<80, 64>(b, &a, grid, err)));
    return cu_attn_combine(b, a.part, a.n_split, T, nh, kvl, (bf16 *)out->data, err);
}
