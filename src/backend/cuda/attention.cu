/* attention.cu - paged attention for the CUDA backend: causal GQA over separate K/V caches, absorbed
 * MLA over the latent cache (dense causal or restricted to DSA top-k lists), and the DSA indexer
 * (scores over the indexer key cache, then a per-query radix top-k). One kernel does both attention
 * kinds: a block takes a few query tokens of one sequence times a chunk of the heads sharing one
 * key/value head, walks the keys in tiles of 32 through shared memory and keeps a flash-style online
 * softmax in fp32.
 *
 * Split-K ("flash decoding"): a decode step has one query per sequence, so the blocks above would be
 * a handful (8 for GLM-4.5-Air at batch 1) on a 132-SM GPU and each would walk the whole context
 * alone; bench-model --profile measured that attention kernel at 10 ms of a 28 ms step at context 256
 * and 274 ms of 292 ms at 8192. When the grid is small, the keys are split into n_split ranges on
 * gridDim.z; each block writes its unnormalised output with its running max and sum to a float
 * workspace, and k_attn_combine merges the ranges (rescaling each by exp(m_z - M)).
 *
 * GQA with head dim 64 or 128 on sm_80+ goes to the tensor-core kernel in attn_mma.cu instead (it
 * shares the split sizing and the combine below); k_attn remains for other head dims and for MLA. */
#include "backend/cuda/cuda_internal.cuh"

#include <math.h>

#define AT_TK 32
#define AT_THREADS 256
#define AT_MAXR 32

struct at_args {
    const bf16 *q;
    bf16 *out;
    const bf16 *k, *v; /* v == NULL: values are the first Dv columns of the key row (MLA) */
    int64_t k_stride, v_stride; /* elements per cache slot row */
    int nh, g, hc, n_chunks, bq, Dk, Dv;
    float scale;
    int T;
    const int32_t *positions, *seq_start, *token_seq, *block_table;
    int max_blocks, page_size;
    const int32_t *topk;
    int topk_n;
    int n_split;  /* key ranges on gridDim.z; 1 = no split */
    int allow_split; /* 0: n_split stays 1 (implementation flash_nosplit) */
    const ms_batch *meta_host; /* host view for launch sizing (not read on the device) */
    int max_ctx;
    float *part;  /* n_split > 1: [T][nh][n_split][Dv + 2] partial O, then m, l */
};

__global__ __launch_bounds__(AT_THREADS) void k_attn(at_args a) {
    cu_pdl_wait();
    cu_pdl_trigger();
    extern __shared__ __align__(16) unsigned char at_sm[];
    const int t0 = blockIdx.x;
    const int s = a.token_seq[t0];
    const int s0 = a.seq_start[s], s1 = a.seq_start[s + 1];
    if ((t0 - s0) % a.bq) return;
    const int ntok = min(a.bq, s1 - t0);
    const int kvh = blockIdx.y / a.n_chunks, chunk = blockIdx.y % a.n_chunks;
    const int h0 = chunk * a.hc, nhc = min(a.hc, a.g - h0);
    const int R = a.bq * a.hc;
    const int Dk = a.Dk, Dv = a.Dv, Dk2 = Dk + 2;
    float *Qs = (float *)at_sm;               /* [R][Dk] */
    float *Os = Qs + (size_t)R * Dk;          /* [R][Dv] */
    float *Ps = Os + (size_t)R * Dv;          /* [R][TK] */
    float *mrow = Ps + R * AT_TK, *lrow = mrow + R, *arow = lrow + R;
    int *lim = (int *)(arow + R);
    int *kslot = lim + R;                     /* [TK] slot of each key in the tile, -1 = none */
    bf16 *Ks = (bf16 *)(kslot + AT_TK);       /* [TK][Dk+2] */
    bf16 *Vs = Ks + (size_t)AT_TK * Dk2;      /* [TK][Dv] (GQA only) */
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int nw = AT_THREADS / 32;
    const int64_t koff = (int64_t)kvh * Dk, voff = (int64_t)kvh * Dv;

    int maxlim = -1;
    for (int r = 0; r < R; r++) {
        int ti = r / a.hc, hi = r % a.hc;
        int l = (ti < ntok && hi < nhc) ? a.positions[t0 + ti] : -1;
        if (tid == 0) lim[r] = l;
        maxlim = max(maxlim, l);
    }
    for (int i = tid; i < R * Dk; i += AT_THREADS) {
        int r = i / Dk, c = i % Dk, ti = r / a.hc, hi = r % a.hc;
        float v = 0.f;
        if (ti < ntok && hi < nhc) {
            int h = kvh * a.g + h0 + hi;
            v = __bfloat162float(a.q[((size_t)(t0 + ti) * a.nh + h) * Dk + c]);
        }
        Qs[i] = v;
    }
    for (int i = tid; i < R * Dv; i += AT_THREADS) Os[i] = 0.f;
    for (int r = tid; r < R; r += AT_THREADS) { mrow[r] = -INFINITY; lrow[r] = 0.f; }
    __syncthreads();
    const int nkeys = a.topk ? a.topk_n : maxlim + 1;
    const int32_t *tk = a.topk ? a.topk + (size_t)t0 * a.topk_n : NULL;
    /* this block's key range: tiles [z*per, (z+1)*per) of the nkeys keys */
    const int ntiles = (nkeys + AT_TK - 1) / AT_TK, per = (ntiles + a.n_split - 1) / a.n_split;
    const int jb = (int)blockIdx.z * per * AT_TK, je = min(nkeys, ((int)blockIdx.z + 1) * per * AT_TK);
    for (int j0 = jb; j0 < je; j0 += AT_TK) {
        if (tid < AT_TK) {
            int j = j0 + tid, key = -1;
            if (j < je) key = tk ? tk[j] : j;
            int slot = -1;
            if (key >= 0 && key <= maxlim) {
                int pg = key / a.page_size;
                if (pg < a.max_blocks) slot = a.block_table[(size_t)s * a.max_blocks + pg] * a.page_size + key % a.page_size;
            }
            kslot[tid] = slot;
            Ps[tid] = (float)key; /* stash key positions for the mask */
        }
        __syncthreads();
        for (int i = tid; i < AT_TK * (Dk / 2); i += AT_THREADS) {
            int j = i / (Dk / 2), c2 = i % (Dk / 2);
            int slot = kslot[j];
            __nv_bfloat162 v = __floats2bfloat162_rn(0.f, 0.f);
            if (slot >= 0) v = *(const __nv_bfloat162 *)(a.k + (size_t)slot * a.k_stride + koff + 2 * c2);
            *(__nv_bfloat162 *)(Ks + (size_t)j * Dk2 + 2 * c2) = v;
        }
        if (a.v) {
            for (int i = tid; i < AT_TK * Dv; i += AT_THREADS) {
                int j = i / Dv, c = i % Dv;
                int slot = kslot[j];
                Vs[i] = slot >= 0 ? a.v[(size_t)slot * a.v_stride + voff + c] : __float2bfloat16_rn(0.f);
            }
        }
        int keypos = -1;
        if (lane < AT_TK) keypos = (int)Ps[lane];
        __syncthreads();
        /* scores */
        for (int i = tid; i < R * AT_TK; i += AT_THREADS) {
            int r = i / AT_TK, j = i % AT_TK;
            const float *qr = Qs + (size_t)r * Dk;
            const __nv_bfloat162 *kr = (const __nv_bfloat162 *)(Ks + (size_t)j * Dk2);
            float acc = 0.f;
            for (int c2 = 0; c2 < Dk / 2; c2++) {
                float2 kv = __bfloat1622float2(kr[c2]);
                acc = fmaf(qr[2 * c2], kv.x, acc);
                acc = fmaf(qr[2 * c2 + 1], kv.y, acc);
            }
            int kp = keypos; /* j == lane: AT_TK is the warp width */
            bool ok = kslot[j] >= 0 && kp >= 0 && kp <= lim[r];
            Ps[i] = ok ? acc * a.scale : -INFINITY;
        }
        __syncthreads();
        /* online softmax, one warp per row */
        for (int r = warp; r < R; r += nw) {
            float v = Ps[r * AT_TK + lane];
            float mx = warp_max(v);
            float mo = mrow[r];
            float mn = fmaxf(mo, mx);
            float p = (mn == -INFINITY || v == -INFINITY) ? 0.f : expf(v - mn);
            float ps = warp_sum(p);
            Ps[r * AT_TK + lane] = p;
            if (lane == 0) {
                float al = (mo == -INFINITY) ? 0.f : expf(mo - mn);
                arow[r] = al;
                lrow[r] = lrow[r] * al + ps;
                mrow[r] = mn;
            }
        }
        __syncthreads();
        const bf16 *Vb = a.v ? Vs : Ks;
        const int vld = a.v ? Dv : Dk2;
        for (int i = tid; i < R * Dv; i += AT_THREADS) {
            int r = i / Dv, c = i % Dv;
            const float *pr = Ps + r * AT_TK;
            float o = Os[i] * arow[r];
#pragma unroll 8
            for (int j = 0; j < AT_TK; j++) o = fmaf(pr[j], __bfloat162float(Vb[(size_t)j * vld + c]), o);
            Os[i] = o;
        }
        __syncthreads();
    }
    if (a.part) { /* split-K: unnormalised partials with their max and sum, merged by k_attn_combine */
        for (int i = tid; i < R * (Dv + 2); i += AT_THREADS) {
            int r = i / (Dv + 2), c = i % (Dv + 2), ti = r / a.hc, hi = r % a.hc;
            if (ti < ntok && hi < nhc) {
                int h = kvh * a.g + h0 + hi;
                float v = c < Dv ? Os[(size_t)r * Dv + c] : c == Dv ? mrow[r] : lrow[r];
                a.part[(((size_t)(t0 + ti) * a.nh + h) * a.n_split + blockIdx.z) * (Dv + 2) + c] = v;
            }
        }
        return;
    }
    for (int i = tid; i < R * Dv; i += AT_THREADS) {
        int r = i / Dv, c = i % Dv, ti = r / a.hc, hi = r % a.hc;
        if (ti < ntok && hi < nhc) {
            int h = kvh * a.g + h0 + hi;
            float l = lrow[r];
            a.out[((size_t)(t0 + ti) * a.nh + h) * Dv + c] = __float2bfloat16_rn(l > 0.f ? Os[i] / l : 0.f);
        }
    }
}

/* Merges the n_split partial results of each (token, head): M = max m_z, L = sum l_z e^(m_z - M),
 * out = sum O_z e^(m_z - M) / L. Ranges that saw no key have m = -inf and drop out. */
/* Block (t, h, z): columns z*128.. of head h of token t. One warp turns the ranges' (max, sum) pairs
 * (at most 64 ranges) into per-range factors exp(m_z - M) and 1/L in shared memory, then every thread
 * sums its columns over the ranges with independent loads. The first form recomputed exp per column
 * and range and walked the ranges serially: 14 us for GLM-5's 64 heads x 512 at 33 ranges. A range
 * whose max is -inf (no key) is skipped, whatever its partial row holds. */
/* EARLY (MS_CU_ATTN_MERGE_EARLY): trigger before the wait, so that the kernel after the merge (the output
 * projection, whose weight copies before its own wait are all it does early) launches while the attention
 * still runs. Safe by cuda_internal.cuh's PDL argument: the merge is launched only once every attention
 * block has started, and the next kernel's wait still waits for the merge's completion. */
#define AC_MAX_SPLIT 64
template <int EARLY> __global__ void k_attn_combine(const float *part, int n_split, int Dv, int nh, bf16 *out) {
    if (EARLY) cu_pdl_trigger();
    cu_pdl_wait();
    if (!EARLY) cu_pdl_trigger();
    __shared__ float s_e[AC_MAX_SPLIT];
    __shared__ float s_inv;
    const int t = blockIdx.x, h = blockIdx.y;
    const float *p = part + ((size_t)t * nh + h) * n_split * (Dv + 2);
    if (threadIdx.x < 32) {
        const int z0 = threadIdx.x, z1 = threadIdx.x + 32;
        const float m0 = z0 < n_split ? p[(size_t)z0 * (Dv + 2) + Dv] : -INFINITY;
        const float m1 = z1 < n_split ? p[(size_t)z1 * (Dv + 2) + Dv] : -INFINITY;
        float M = fmaxf(m0, m1);
#pragma unroll
        for (int o = 16; o; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        const float e0 = m0 == -INFINITY ? 0.f : expf(m0 - M), e1 = m1 == -INFINITY ? 0.f : expf(m1 - M);
        float L = (e0 > 0.f ? p[(size_t)z0 * (Dv + 2) + Dv + 1] * e0 : 0.f) +
                  (e1 > 0.f ? p[(size_t)z1 * (Dv + 2) + Dv + 1] * e1 : 0.f);
#pragma unroll
        for (int o = 16; o; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
        s_e[z0] = e0;
        s_e[z1] = e1;
        if (threadIdx.x == 0) s_inv = L > 0.f ? 1.f / L : 0.f;
    }
    __syncthreads();
    const float inv = s_inv;
    for (int c = blockIdx.z * blockDim.x + threadIdx.x; c < Dv; c += gridDim.z * blockDim.x) {
        float o = 0.f;
#pragma unroll 8
        for (int z = 0; z < n_split; z++) {
            const float e = s_e[z];
            if (e > 0.f) o += p[(size_t)z * (Dv + 2) + c] * e;
        }
        out[((size_t)t * nh + h) * Dv + c] = __float2bfloat16_rn(o * inv);
    }
}

static size_t at_smem(int R, int Dk, int Dv, int gqa) {
    size_t f = (size_t)R * Dk + (size_t)R * Dv + (size_t)R * AT_TK + 3 * (size_t)R;
    size_t i = (size_t)R + AT_TK;
    size_t h = (size_t)AT_TK * (Dk + 2) + (gqa ? (size_t)AT_TK * Dv : 0);
    return f * 4 + i * 4 + h * 2 + 16;
}

/* Contract in cuda_internal.cuh (the smallest launch: one query row per block). */
size_t cu_attn_flash_min_smem(int Dk, int Dv, int gqa) { return at_smem(1, Dk, Dv, gqa); }

int cu_smem_optin(const ms_backend *b) { return cu_of(b)->max_smem_optin; }

/* Split-K sizing and workspace shared with attn_mma.cu; contract in cuda_internal.cuh. */
int cu_attn_split(ms_backend *b, int64_t blocks, int tiles, int per_sm, int T, int nh, int Dv, int allow_split,
                  int *n_split, float **part, ms_err *err) {
    int64_t target = (int64_t)per_sm * (b->gpu.n_sm > 0 ? b->gpu.n_sm : 100);
    int64_t want = blocks > 0 ? (target + blocks - 1) / blocks : 1;
    int ns = want < tiles ? (int)want : tiles;
    if (ns > AC_MAX_SPLIT) ns = AC_MAX_SPLIT; /* k_attn_combine keeps one factor per range in shared memory */
    if (ns < 1 || !allow_split) ns = 1;
    *n_split = ns;
    *part = NULL;
    if (ns > 1) {
        void *ws;
        size_t n = sizeof(float) * (size_t)T * (size_t)nh * (size_t)ns * (size_t)(Dv + 2);
        MS_TRY(cu_scratch(b, SCR_ATTN, n, &ws, err));
        *part = (float *)ws;
    }
    return MS_OK;
}

static long long merge_launches[2]; /* ms_cuda_attn_merge_launches; updated atomically */

/* Contract in backend_cuda.h. */
extern "C" long long ms_cuda_attn_merge_launches(int early) {
    return __atomic_load_n(&merge_launches[early ? 1 : 0], __ATOMIC_RELAXED);
}

/* Launches k_attn_combine over the partials; contract in cuda_internal.cuh. */
int cu_attn_combine(ms_backend *b, const float *part, int n_split, int T, int nh, int Dv, bf16 *out, ms_err *err) {
    if (n_split <= 1) return MS_OK;
    MS_ASSERT(n_split <= AC_MAX_SPLIT); /* cu_attn_split caps the ranges */
    dim3 cg(T, nh, (Dv + 127) / 128);
    const int early = cu_knob(CU_KNOB_ATTN_MERGE_EARLY);
    CK(cu_launch(early ? k_attn_combine<1> : k_attn_combine<0>, cg, 128, 0, cu_of(b)->stream, part, n_split, Dv, nh,
                 out));
    cu_prev_early = early;
    __atomic_fetch_add(&merge_launches[early ? 1 : 0], 1, __ATOMIC_RELAXED);
    return MS_OK;
}

static int at_launch(ms_backend *b, at_args *a, int nkv, size_t sm, ms_err *err) {
    cu_impl *c = cu_of(b);
    if ((int)sm > c->max_smem_optin)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "attention: head dims need %zu bytes of shared memory, GPU allows %d",
                       sm, c->max_smem_optin);
    if (sm > 48 * 1024) CK(cudaFuncSetAttribute(k_attn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    /* Split the keys when the grid would leave most SMs idle: leader blocks ~ one per bq-token group
     * of each sequence; aim at two blocks per SM, at least a tile per range, at most 64 ranges. */
    const ms_batch *hb = a->meta_host;
    int64_t groups = (a->T + a->bq - 1) / a->bq + hb->n_seqs;
    int max_keys = a->topk ? a->topk_n : a->max_ctx;
    MS_TRY(cu_attn_split(b, groups * nkv * a->n_chunks, (max_keys + AT_TK - 1) / AT_TK, 2, a->T, a->nh, a->Dv,
                         a->allow_split, &a->n_split, &a->part, err));
    dim3 grid(a->T, nkv * a->n_chunks, a->n_split);
    CK(cu_launch(k_attn, grid, AT_THREADS, sm, c->stream, *a));
    return cu_attn_combine(b, a->part, a->n_split, a->T, a->nh, a->Dv, a->out, err);
}

static void at_meta(at_args *a, const ms_attn_meta *m) {
    a->positions = m->positions_d;
    a->seq_start = m->seq_start_d;
    a->token_seq = m->token_seq_d;
    a->block_table = m->block_table_d;
    a->max_blocks = m->host->max_blocks;
    a->page_size = m->host->page_size;
    a->T = m->host->n_tokens;
    a->meta_host = m->host;
    a->max_ctx = m->max_ctx;
}

/* The backend op: the tensor-core kernel where it applies, else k_attn; the legacy environment knobs
 * MS_ATTN_NO_MMA / MS_ATTN_NO_SPLIT still steer it (the forward chooses through backend/attn.h). */
int cu_op_attn_gqa(ms_backend *b, const ms_tensor *q, const ms_tensor *kcache, const ms_tensor *vcache,
                   const ms_attn_meta *m, float scale, ms_tensor *out, ms_err *err) {
    const int split = !cu_knob(CU_KNOB_ATTN_NO_SPLIT);
    if (!cu_knob(CU_KNOB_ATTN_NO_MMA)) {
        int done = 0;
        MS_TRY(cu_attn_gqa_try_mma(b, q, kcache, vcache, m, scale, out, split, &done, err));
        if (done) return MS_OK;
    }
    return cu_attn_gqa_flash(b, q, kcache, vcache, m, scale, out, split, err);
}

/* Checks shapes and dtypes of a GQA call (contract of attn_gqa). */
static int gqa_check(const ms_tensor *q, const ms_tensor *kcache, const ms_tensor *vcache, const ms_attn_meta *m,
                     const ms_tensor *out, ms_err *err) {
    MS_ASSERT(q->ndim == 3 && kcache->ndim == 3 && vcache->ndim == 3);
    const int T = (int)q->shape[0], nh = (int)q->shape[1], d = (int)q->shape[2];
    const int nkv = (int)kcache->shape[1];
    MS_ASSERT(kcache->shape[2] == d && vcache->shape[2] == d && nh % nkv == 0 && T == m->host->n_tokens);
    if (q->dtype != MS_BF16 || kcache->dtype != MS_BF16 || vcache->dtype != MS_BF16 || out->dtype != MS_BF16)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "attn_gqa: the CUDA backend needs bf16 q, caches and output");
    return MS_OK;
}

/* Contract in cuda_internal.cuh. */
int cu_attn_gqa_try_mma(ms_backend *b, const ms_tensor *q, const ms_tensor *kcache, const ms_tensor *vcache,
                        const ms_attn_meta *m, float scale, ms_tensor *out, int allow_split, int *launched, ms_err *err) {
    *launched = 0;
    MS_TRY(gqa_check(q, kcache, vcache, m, out, err));
    if (q->shape[0] == 0) return *launched = 1, MS_OK;
    return cu_attn_gqa_mma(b, (const bf16 *)q->data, (const bf16 *)kcache->data, (const bf16 *)vcache->data,
                           (int)q->shape[1], (int)kcache->shape[1], (int)q->shape[2], m, scale, (bf16 *)out->data,
                           allow_split, launched, err);
}

/* Contract in cuda_internal.cuh. */
int cu_attn_gqa_flash(ms_backend *b, const ms_tensor *q, const ms_tensor *kcache, const ms_tensor *vcache,
                      const ms_attn_meta *m, float scale, ms_tensor *out, int allow_split, ms_err *err) {
    MS_TRY(gqa_check(q, kcache, vcache, m, out, err));
    const int T = (int)q->shape[0], nh = (int)q->shape[1], d = (int)q->shape[2];
    const int nkv = (int)kcache->shape[1];
    if (T == 0) return MS_OK;
    if (d % 2) return ms_errf(err, MS_ERR_UNSUPPORTED, "attn_gqa: odd head dim %d", d);
    at_args a;
    memset(&a, 0, sizeof a);
    at_meta(&a, m);
    a.q = (const bf16 *)q->data;
    a.out = (bf16 *)out->data;
    a.k = (const bf16 *)kcache->data;
    a.v = (const bf16 *)vcache->data;
    a.k_stride = a.v_stride = (int64_t)nkv * d;
    a.nh = nh;
    a.g = nh / nkv;
    a.hc = a.g < AT_MAXR ? a.g : AT_MAXR;
    a.n_chunks = (a.g + a.hc - 1) / a.hc;
    a.bq = AT_MAXR / a.hc;
    /* pure decode (one token per sequence): extra query rows would be padding, computed for nothing */
    if (a.bq < 1 || m->host->n_tokens == m->host->n_seqs) a.bq = 1;
    a.Dk = a.Dv = d;
    a.scale = scale;
    a.allow_split = allow_split;
    size_t sm = at_smem(a.bq * a.hc, d, d, 1);
    while (sm > (size_t)cu_of(b)->max_smem_optin && a.bq > 1) sm = at_smem(--a.bq * a.hc, d, d, 1);
    return at_launch(b, &a, nkv, sm, err);
}

/* The backend op: the tensor-core kernel where it covers the shape, else k_attn; both split the keys
 * where the grid is small (MS_ATTN_NO_SPLIT turns that off). */
int cu_op_mla_attn(ms_backend *b, const ms_tensor *q, const ms_tensor *latent, const ms_attn_meta *m,
                   const int32_t *topk_d, int topk, int kvl, float scale, ms_tensor *out, ms_err *err) {
    int done = 0;
    if (!cu_knob(CU_KNOB_ATTN_NO_MMA))
        MS_TRY(cu_attn_mla_mma(b, q, latent, m, topk_d, topk, kvl, scale, out, !cu_knob(CU_KNOB_ATTN_NO_SPLIT), &done,
                               err));
    if (done) return MS_OK;
    return cu_attn_mla_flash(b, q, latent, m, topk_d, topk, kvl, scale, out, !cu_knob(CU_KNOB_ATTN_NO_SPLIT), err);
}

/* Contract in cuda_internal.cuh. */
int cu_attn_mla_flash(ms_backend *b, const ms_tensor *q, const ms_tensor *latent, const ms_attn_meta *m,
                      const int32_t *topk_d, int topk, int kvl, float scale, ms_tensor *out, int allow_split,
                      ms_err *err) {
    MS_ASSERT(q->ndim == 3);
    const int T = (int)q->shape[0], nh = (int)q->shape[1], D = (int)q->shape[2];
    MS_ASSERT(latent->shape[latent->ndim - 1] == D && kvl <= D && T == m->host->n_tokens);
    if (T == 0) return MS_OK;
    if (q->dtype != MS_BF16 || latent->dtype != MS_BF16 || out->dtype != MS_BF16)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "mla_attn: the CUDA backend needs bf16 q, latent cache and output");
    if (D % 2) return ms_errf(err, MS_ERR_UNSUPPORTED, "mla_attn: odd latent row width %d", D);
    at_args a;
    memset(&a, 0, sizeof a);
    at_meta(&a, m);
    a.q = (const bf16 *)q->data;
    a.out = (bf16 *)out->data;
    a.k = (const bf16 *)latent->data;
    a.v = NULL;
    a.k_stride = D;
    a.nh = nh;
    a.g = nh;
    a.hc = nh < 16 ? nh : 16;
    a.n_chunks = (nh + a.hc - 1) / a.hc;
    a.bq = 1;
    a.Dk = D;
    a.Dv = kvl;
    a.scale = scale;
    a.topk = topk_d;
    a.topk_n = topk_d ? topk : 0;
    a.allow_split = allow_split;
    size_t sm = at_smem(a.hc, D, kvl, 0);
    while (sm > (size_t)cu_of(b)->max_smem_optin && a.hc > 1) {
        a.hc /= 2;
        a.n_chunks = (nh + a.hc - 1) / a.hc;
        sm = at_smem(a.hc, D, kvl, 0);
    }
    return at_launch(b, &a, 1, sm, err);
}

/* ---- DSA indexer ---- */

#define IX_TK 64

__global__ __launch_bounds__(256) void k_idx_scores(const bf16 *qI, const void *w, int wt, const bf16 *cache, int nih,
                                                    int d, int max_ctx, const int32_t *positions,
                                                    const int32_t *token_seq, const int32_t *block_table,
                                                    int max_blocks, int page_size, float *scores) {
    cu_pdl_wait();
    cu_pdl_trigger();
    extern __shared__ float ix_sm[];
    float *qs = ix_sm;                    /* [nih][d+1] */
    float *ws = qs + (size_t)nih * (d + 1); /* [nih] */
    float *ks = ws + nih;                 /* [IX_TK][d] */
    const int t = blockIdx.y, k0 = blockIdx.x * IX_TK;
    const int pos = positions[t], s = token_seq[t];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    float *srow = scores + (size_t)t * max_ctx;
    if (k0 > pos) {
        for (int j = tid; j < IX_TK && k0 + j < max_ctx; j += 256) srow[k0 + j] = -INFINITY;
        return;
    }
    for (int i = tid; i < nih * d; i += 256) {
        int h = i / d, c = i % d;
        qs[h * (d + 1) + c] = __bfloat162float(qI[((size_t)t * nih + h) * d + c]);
    }
    for (int h = tid; h < nih; h += 256) ws[h] = cu_ld(w, wt, (size_t)t * nih + h);
    for (int i = tid; i < IX_TK * d; i += 256) {
        int j = i / d, c = i % d, key = k0 + j;
        float v = 0.f;
        if (key <= pos) {
            int pg = key / page_size;
            if (pg < max_blocks) {
                size_t slot = (size_t)block_table[(size_t)s * max_blocks + pg] * page_size + key % page_size;
                v = __bfloat162float(cache[slot * d + c]);
            }
        }
        ks[i] = v;
    }
    __syncthreads();
    const float rs = rsqrtf((float)d);
    for (int j = warp; j < IX_TK; j += 8) {
        int key = k0 + j;
        if (key >= max_ctx) break;
        float tot = 0.f;
        for (int h = lane; h < nih; h += 32) {
            const float *qh = qs + (size_t)h * (d + 1);
            const float *kj = ks + (size_t)j * d;
            float acc = 0.f;
            for (int c = 0; c < d; c++) acc = fmaf(qh[c], kj[c], acc);
            tot += ws[h] * fmaxf(acc * rs, 0.f);
        }
        tot = warp_sum(tot);
        if (lane == 0) srow[key] = key <= pos ? tot : -INFINITY;
    }
}

/* The indexer's scores on tensor cores. Block (t, z) takes token t and range z of its key tiles (64
 * causal keys each, gathered from the paged cache by cp.async, double-buffered); its 4 warps take 16
 * keys of a tile each. S = qI · kᵀ for all heads (m-tiles of 16 heads from shared memory, zero rows
 * past nih) by mma.m16n8k16 bf16 with fp32 accumulation, then each lane folds its rows into
 * w[h] * relu(S * d^-1/2) and a shuffle over the 8 row groups sums the heads. Only keys <= position
 * are written; k_topk reads no further. Why: the CUDA-core k_idx_scores reloads q per 64-key block
 * and multiplies in fp32 FMAs: 133 ms of a 4096-token GLM-5 prefill over 12 layers. */
#define IM_WARPS 4
#define IM_BN 64
__global__ __launch_bounds__(IM_WARPS * 32) void k_idx_mma(const bf16 *qI, const void *w, int wt, const bf16 *cache,
                                                           int nih, int d, int mt_n, const int32_t *positions,
                                                           const int32_t *token_seq, const int32_t *block_table,
                                                           int max_blocks, int page_size, int max_ctx, int n_split,
                                                           float *scores) {
    cu_pdl_wait();
    cu_pdl_trigger();
    extern __shared__ __align__(16) unsigned char im_sm[];
    const int LDS = (d / 8) % 2 == 0 ? d + 8 : d + 16, CPR = d / 8, MR = mt_n * 16;
    bf16 *Qs = (bf16 *)im_sm;          /* [MR][LDS] */
    bf16 *Ks = Qs + (size_t)MR * LDS;  /* [2][IM_BN][LDS] */
    float *ws = (float *)(Ks + 2 * IM_BN * LDS); /* [MR] */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int t = blockIdx.x, pos = positions[t], s = token_seq[t];
    const int ntiles = (min(pos + 1, max_ctx) + IM_BN - 1) / IM_BN;
    const int per = (ntiles + n_split - 1) / n_split;
    const int kt0 = (int)blockIdx.y * per, kt1 = min(ntiles, kt0 + per);
    if (kt0 >= kt1) return;
    const int32_t *bt = block_table + (size_t)s * max_blocks;
    for (int i = tid; i < MR * CPR; i += IM_WARPS * 32) {
        const int r = i / CPR, c = (i % CPR) * 8;
        const bool ok = r < nih;
        cu_cp16(cu_saddr(Qs + r * LDS + c), ok ? qI + ((size_t)t * nih + r) * d + c : qI, ok);
    }
    for (int h = tid; h < MR; h += IM_WARPS * 32) ws[h] = h < nih ? cu_ld(w, wt, (size_t)t * nih + h) : 0.f;
    auto load_tile = [&](int kt, int buf) {
        bf16 *kd = Ks + buf * IM_BN * LDS;
        for (int i = tid; i < IM_BN * CPR; i += IM_WARPS * 32) {
            const int j = i / CPR, c = (i % CPR) * 8, key = kt * IM_BN + j;
            const bf16 *src = cache;
            bool ok = false;
            if (key <= pos) {
                const int pg = key / page_size;
                if (pg < max_blocks) {
                    src = cache + ((size_t)bt[pg] * page_size + key % page_size) * d + c;
                    ok = true;
                }
            }
            cu_cp16(cu_saddr(kd + j * LDS + c), src, ok);
        }
    };
    load_tile(kt0, 0);
    cu_cp_commit();
    const float rs = rsqrtf((float)d);
    float *srow = scores + (size_t)t * max_ctx;
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
        const bf16 *kb = Ks + buf * IM_BN * LDS + (size_t)warp * 16 * LDS;
        float part[2][2] = {{0.f, 0.f}, {0.f, 0.f}}; /* [n-tile][column]: this lane's rows folded */
        for (int mt = 0; mt < mt_n; mt++) {
            float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
            for (int kk = 0; kk < d / 16; kk++) {
                uint32_t qa[4], bk[4];
                cu_ldsm4(qa, cu_saddr(Qs + (mt * 16 + (lane & 15)) * LDS + kk * 16 + ((lane >> 4) << 3)));
                cu_ldsm4(bk, cu_saddr(kb + ((lane & 7) + ((lane >> 4) << 3)) * LDS + kk * 16 + (((lane >> 3) & 1) << 3)));
                cu_mma_bf16(sc[0], qa, bk[0], bk[1]);
                cu_mma_bf16(sc[1], qa, bk[2], bk[3]);
            }
            const float w0 = ws[mt * 16 + gq], w1 = ws[mt * 16 + gq + 8];
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    part[j][e] += w0 * fmaxf(sc[j][e] * rs, 0.f) + w1 * fmaxf(sc[j][2 + e] * rs, 0.f);
        }
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float v = part[j][e];
                v += __shfl_xor_sync(0xffffffffu, v, 4);
                v += __shfl_xor_sync(0xffffffffu, v, 8);
                v += __shfl_xor_sync(0xffffffffu, v, 16);
                const int key = kt * IM_BN + warp * 16 + j * 8 + 2 * tq + e;
                if (gq == 0 && key <= pos && key < max_ctx) srow[key] = v;
            }
        __syncthreads(); /* the next iteration's loads overwrite this buffer */
    }
}

__device__ __forceinline__ uint32_t f2ord(float f) {
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ __launch_bounds__(512) void k_topk(const float *scores, int max_ctx, const int32_t *positions, int topk,
                                              int32_t *out) {
    cu_pdl_wait();
    cu_pdl_trigger();
    __shared__ int hist[256];
    __shared__ uint32_t s_prefix, s_mask;
    __shared__ int s_need, s_cnt_gt, s_cnt_eq;
    const int t = blockIdx.x, tid = threadIdx.x;
    const int n = min(positions[t] + 1, max_ctx);
    const float *row = scores + (size_t)t * max_ctx;
    int32_t *o = out + (size_t)t * topk;
    if (n <= topk) {
        for (int j = tid; j < topk; j += blockDim.x) o[j] = j < n ? j : -1;
        return;
    }
    if (tid == 0) { s_prefix = 0; s_mask = 0; s_need = topk; }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        uint32_t pre = s_prefix, msk = s_mask;
        for (int i = tid; i < n; i += blockDim.x) {
            uint32_t u = f2ord(row[i]);
            if ((u & msk) == pre) atomicAdd(&hist[(u >> shift) & 255], 1);
        }
        __syncthreads();
        if (tid == 0) {
            int need = s_need, cum = 0, dg = 0;
            for (dg = 255; dg >= 0; dg--) {
                if (cum + hist[dg] >= need) break;
                cum += hist[dg];
            }
            s_need = need - cum;
            s_prefix = pre | ((uint32_t)dg << shift);
            s_mask = msk | (255u << shift);
        }
        __syncthreads();
    }
    /* s_prefix is the k-th largest value; s_need of its copies are taken */
    if (tid == 0) { s_cnt_gt = 0; s_cnt_eq = 0; }
    __syncthreads();
    const uint32_t thr = s_prefix;
    const int need_eq = s_need, n_gt = topk - need_eq;
    for (int i = tid; i < n; i += blockDim.x) {
        uint32_t u = f2ord(row[i]);
        if (u > thr) {
            int p = atomicAdd(&s_cnt_gt, 1);
            o[p] = i;
        } else if (u == thr) {
            int p = atomicAdd(&s_cnt_eq, 1);
            if (p < need_eq) o[n_gt + p] = i;
        }
    }
}

int cu_op_indexer_topk(ms_backend *b, const ms_tensor *qI, const ms_tensor *w, const ms_tensor *idx_cache,
                       const ms_attn_meta *m, int topk, int32_t *out_d, ms_err *err) {
    MS_ASSERT(qI->ndim == 3);
    const int T = (int)qI->shape[0], nih = (int)qI->shape[1], d = (int)qI->shape[2];
    MS_ASSERT(idx_cache->shape[idx_cache->ndim - 1] == d && T == m->host->n_tokens && topk > 0);
    if (T == 0) return MS_OK;
    if (qI->dtype != MS_BF16 || idx_cache->dtype != MS_BF16)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "indexer_topk: the CUDA backend needs bf16 queries and key cache");
    int max_ctx = m->max_ctx;
    for (int i = 0; i < T; i++)
        if (m->host->positions[i] + 1 > max_ctx) max_ctx = m->host->positions[i] + 1;
    if (max_ctx <= 0) max_ctx = 1;
    float *scores;
    MS_TRY(cu_scratch(b, SCR_TMP2, (size_t)T * max_ctx * 4, (void **)&scores, err));
    cu_impl *c = cu_of(b);
    if (d % 16 == 0 && d <= 512 && nih <= 64 && b->gpu.cc_major >= 8 && !cu_knob(CU_KNOB_ATTN_NO_MMA)) {
        const int mt_n = (nih + 15) / 16, lds = (d / 8) % 2 == 0 ? d + 8 : d + 16;
        const size_t smm = ((size_t)mt_n * 16 + 2 * IM_BN) * lds * sizeof(bf16) + (size_t)mt_n * 16 * sizeof(float);
        if ((int)smm <= c->max_smem_optin) {
            const int tiles = (max_ctx + IM_BN - 1) / IM_BN;
            int64_t want = ((int64_t)2 * (b->gpu.n_sm > 0 ? b->gpu.n_sm : 100) + T - 1) / T;
            const int ns = (int)(want < tiles ? want : tiles) < 64 ? (int)(want < tiles ? want : tiles) : 64;
            CK(cudaFuncSetAttribute(k_idx_mma, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smm > 48 * 1024 ? (int)smm : 48 * 1024));
            dim3 g2((unsigned)T, (unsigned)(ns > 0 ? ns : 1));
            CK(cu_launch(k_idx_mma, g2, IM_WARPS * 32, smm, c->stream, (const bf16 *)qI->data, w->data, w->dtype,
                         (const bf16 *)idx_cache->data, nih, d, mt_n, m->positions_d,
                         m->token_seq_d, m->block_table_d, m->host->max_blocks,
                         m->host->page_size, max_ctx, ns > 0 ? ns : 1, scores));
            CK(cu_launch(k_topk, T, 512, 0, c->stream, scores, max_ctx, m->positions_d, topk, out_d));
            return MS_OK;
        }
    }
    size_t sm = ((size_t)nih * (d + 1) + nih + (size_t)IX_TK * d) * 4;
    if ((int)sm > c->max_smem_optin)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "indexer_topk: %d heads x dim %d exceed shared memory", nih, d);
    CK(cudaFuncSetAttribute(k_idx_scores, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm > 48 * 1024 ? (int)sm : 48 * 1024));
    dim3 grid((max_ctx + IX_TK - 1) / IX_TK, T);
    CK(cu_launch(k_idx_scores, grid, 256, sm, c->stream, (const bf16 *)qI->data, w->data, w->dtype,
                 (const bf16 *)idx_cache->data, nih, d, max_ctx, m->positions_d,
                 m->token_seq_d, m->block_table_d, m->host->max_blocks,
                 m->host->page_size, scores));
    CK(cu_launch(k_topk, T, 512, 0, c->stream, scores, max_ctx, m->positions_d, topk, out_d));
    return MS_OK;
}
