/* attn_ref.cu - the straightforward attention kernel: the implementation to swap in when a fast
 * kernel is suspected of corrupting numerics on a GPU (`--attention-backend ref`,
 * `--nsa-decode-backend ref`). It shares no code with k_attn or k_attn_mma: one block per (query
 * token, query head), no split-K, no tensor cores, no shared K/V tiles.
 *
 * Each block walks the causal keys 0..position in tiles of AR_THREADS: thread j scores key k0 + j
 * (fp32 dot product of the query with the bf16 key row read from the paged cache), the block takes
 * the tile's max and sum for an online softmax (running max m, sum l, output O rescaled by
 * exp(m_old - m_new); a tile without a key keeps m = -inf and contributes nothing, so no inf - inf),
 * then every thread adds p_j * V_j for its output columns. For DSA it is dense-equivalent masked:
 * k_ref_mask turns each query's top-k list into a byte mask over its context, and a key outside the
 * mask scores -inf, which is what the sparse attention defines (SGLang's masked reference). */
#include "backend/cuda/cuda_internal.cuh"

#include <math.h>

#define AR_THREADS 128
#define AR_MAXV (CU_ATTN_REF_MAX_DV / AR_THREADS) /* output columns per thread */

struct ar_args {
    const bf16 *q;
    bf16 *out;
    const bf16 *k, *v;          /* v: value rows (GQA: the V cache; MLA: the latent cache again) */
    int64_t k_stride, v_stride; /* elements per cache slot row */
    int nh, g, Dk, Dv;          /* g = query heads per KV head (MLA: nh) */
    float scale;
    const int32_t *positions, *token_seq, *block_table;
    int max_blocks, page_size;
    const uint8_t *mask; /* DSA: [T][mask_ld], non-zero admits the key; NULL = every causal key */
    int64_t mask_ld;
};

/* Block-wide max (is_max) or sum of v; every thread gets the result. red: AR_THREADS/32 floats. */
static __device__ float ar_reduce(float v, float *red, int is_max) {
    for (int off = 16; off; off >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, off);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    __syncthreads(); /* the previous reduction's readers are done with red */
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = red[0];
    for (int i = 1; i < AR_THREADS / 32; i++) r = is_max ? fmaxf(r, red[i]) : r + red[i];
    return r;
}

__global__ __launch_bounds__(AR_THREADS) void k_attn_ref(ar_args a) {
    cu_pdl_wait();
    cu_pdl_trigger();
    extern __shared__ float ar_sm[];
    float *qs = ar_sm;                       /* [Dk] */
    float *ps = qs + a.Dk;                   /* [AR_THREADS] probabilities of the tile */
    int64_t *vrow = (int64_t *)(ps + AR_THREADS + (a.Dk & 1)); /* [AR_THREADS] value row offsets */
    __shared__ float red[AR_THREADS / 32];
    const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    const int s = a.token_seq[t], pos = a.positions[t], kvh = h / a.g;
    for (int c = tid; c < a.Dk; c += AR_THREADS) qs[c] = __bfloat162float(a.q[((size_t)t * a.nh + h) * a.Dk + c]);
    float o[AR_MAXV];
    for (int i = 0; i < AR_MAXV; i++) o[i] = 0.f;
    float m = -INFINITY, l = 0.f;
    __syncthreads();
    for (int k0 = 0; k0 <= pos; k0 += AR_THREADS) {
        const int key = k0 + tid;
        float sc = -INFINITY;
        int64_t vr = -1;
        if (key <= pos && (!a.mask || a.mask[(size_t)t * a.mask_ld + key])) {
            const int pg = key / a.page_size;
            if (pg < a.max_blocks) {
                const int64_t slot = (int64_t)a.block_table[(size_t)s * a.max_blocks + pg] * a.page_size + key % a.page_size;
                const bf16 *kr = a.k + slot * a.k_stride + (int64_t)kvh * a.Dk;
                float acc = 0.f;
                for (int c = 0; c < a.Dk; c++) acc = fmaf(qs[c], __bfloat162float(kr[c]), acc);
                sc = acc * a.scale;
                vr = slot * a.v_stride + (int64_t)kvh * a.Dv;
            }
        }
        const float mn = fmaxf(m, ar_reduce(sc, red, 1));
        const float p = sc == -INFINITY ? 0.f : expf(sc - mn);
        const float alpha = m == -INFINITY ? 0.f : expf(m - mn);
        ps[tid] = p;
        vrow[tid] = vr;
        l = l * alpha + ar_reduce(p, red, 0); /* its barriers also publish ps and vrow */
        m = mn;
        for (int i = 0; i < AR_MAXV; i++) o[i] *= alpha;
        const int nk = min(AR_THREADS, pos + 1 - k0);
        for (int j = 0; j < nk; j++) {
            const float pj = ps[j];
            if (pj == 0.f) continue; /* same for every thread: no divergence */
            const bf16 *vp = a.v + vrow[j];
            for (int i = 0; i < AR_MAXV; i++) {
                const int c = tid + i * AR_THREADS;
                if (c < a.Dv) o[i] = fmaf(pj, __bfloat162float(vp[c]), o[i]);
            }
        }
        __syncthreads(); /* everyone is done with ps / vrow before the next tile */
    }
    for (int i = 0; i < AR_MAXV; i++) {
        const int c = tid + i * AR_THREADS;
        if (c < a.Dv) a.out[((size_t)t * a.nh + h) * a.Dv + c] = __float2bfloat16_rn(l > 0.f ? o[i] / l : 0.f);
    }
}

/* mask[t][key] = 1 for each key in t's top-k list (0 <= key < ld); the mask was zeroed before. */
__global__ void k_ref_mask(const int32_t *topk, int topk_n, int64_t ld, uint8_t *mask) {
    cu_pdl_wait();
    cu_pdl_trigger();
    const int t = blockIdx.x;
    for (int j = threadIdx.x; j < topk_n; j += blockDim.x) {
        const int key = topk[(size_t)t * topk_n + j];
        if (key >= 0 && key < ld) mask[(size_t)t * ld + key] = 1;
    }
}

/* Contract in cuda_internal.cuh. */
int cu_attn_ref(ms_backend *b, const ms_tensor *q, const ms_tensor *k, const ms_tensor *v, const ms_attn_meta *m,
                const int32_t *topk_d, int topk, int dv, float scale, ms_tensor *out, ms_err *err) {
    MS_ASSERT(q->ndim == 3);
    const int T = (int)q->shape[0], nh = (int)q->shape[1], Dk = (int)q->shape[2];
    MS_ASSERT(T == m->host->n_tokens);
    if (T == 0) return MS_OK;
    if (q->dtype != MS_BF16 || k->dtype != MS_BF16 || (v && v->dtype != MS_BF16) || out->dtype != MS_BF16)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "attention ref: the CUDA backend needs bf16 q, caches and output");
    if (dv > CU_ATTN_REF_MAX_DV)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "attention ref: value width %d exceeds %d", dv, CU_ATTN_REF_MAX_DV);
    cu_impl *c = cu_of(b);
    ar_args a;
    memset(&a, 0, sizeof a);
    a.q = (const bf16 *)q->data;
    a.out = (bf16 *)out->data;
    a.nh = nh;
    a.Dk = Dk;
    a.Dv = dv;
    a.scale = scale;
    if (v) { /* GQA: [S][nkv][d] caches */
        const int nkv = (int)k->shape[1];
        MS_ASSERT(k->ndim == 3 && v->ndim == 3 && k->shape[2] == Dk && v->shape[2] == dv && nh % nkv == 0);
        a.k = (const bf16 *)k->data;
        a.v = (const bf16 *)v->data;
        a.k_stride = (int64_t)nkv * Dk;
        a.v_stride = (int64_t)nkv * dv;
        a.g = nh / nkv;
    } else { /* MLA: [S][Dk] latent rows; values are their first dv columns */
        MS_ASSERT(k->shape[k->ndim - 1] == Dk && dv <= Dk);
        a.k = a.v = (const bf16 *)k->data;
        a.k_stride = a.v_stride = Dk;
        a.g = nh;
    }
    a.positions = m->positions_d;
    a.token_seq = m->token_seq_d;
    a.block_table = m->block_table_d;
    a.max_blocks = m->host->max_blocks;
    a.page_size = m->host->page_size;
    if (topk_d) {
        int64_t ld = m->max_ctx;
        for (int i = 0; i < T; i++)
            if (m->host->positions[i] + 1 > ld) ld = m->host->positions[i] + 1;
        if (ld < 1) ld = 1;
        void *mask;
        MS_TRY(cu_scratch(b, SCR_TMP2, (size_t)T * (size_t)ld, &mask, err));
        CK(cudaMemsetAsync(mask, 0, (size_t)T * (size_t)ld, c->stream));
        CK(cu_launch(k_ref_mask, T, 128, 0, c->stream, topk_d, topk, ld, (uint8_t *)mask));
        a.mask = (const uint8_t *)mask;
        a.mask_ld = ld;
    }
    const size_t sm = (size_t)(Dk + 1 + AR_THREADS) * sizeof(float) + (size_t)AR_THREADS * sizeof(int64_t) + 8;
    if ((int)sm > c->max_smem_optin)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "attention ref: key width %d needs %zu bytes of shared memory, GPU allows %d",
                       Dk, sm, c->max_smem_optin);
    if (sm > 48 * 1024) CK(cudaFuncSetAttribute(k_attn_ref, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    dim3 grid(T, nh);
    CK(cu_launch(k_attn_ref, grid, AR_THREADS, sm, c->stream, a));
    return MS_OK;
}
