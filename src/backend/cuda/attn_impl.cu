/* attn_impl.cu - the CUDA attention implementations of the registry (backend/attn.h): what each
 * supports and why not, its scratch, and the call into its kernels. Four algorithms:
 *   mma           tensor-core flash attention on sm_80+: GQA with head dim 64/128 (attn_mma.cu; in a
 *                 decode step it also does gqa_prep's bias, RoPE and cache stores itself), and
 *                 absorbed MLA / DSA with latent widths 64, 128, 512 (attn_mla_mma.cu); keys split
 *                 across blocks when the grid is small (flash decoding);
 *   flash         CUDA-core flash attention (k_attn, attention.cu) with the same split-K: any even
 *                 head dims, GQA, dense MLA and DSA (it gathers the top-k keys of each query);
 *   flash_nosplit k_attn with one key range per block (the split and its merge are the suspects);
 *   ref           one block per (token, head), no split, no shared K/V tiles (attn_ref.cu); DSA as
 *                 dense-equivalent masked attention over the whole context. */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/attn.h"

#include <stdio.h>

/* Bytes of split-K partials at most (64 ranges) for s. */
static size_t split_ws(const ms_attn_shape *s) {
    return sizeof(float) * (size_t)s->n_tokens * (size_t)s->n_heads * 64 * (size_t)(s->dv + 2);
}

static int bf16_only(const ms_attn_shape *s, char *why, size_t cap) {
    if (s->dtype == MS_BF16) return 1;
    return snprintf(why, cap, "it takes bf16 activations and caches only"), 0;
}

/* ---- mma ---- */

static int mma_supports(const ms_backend *b, const ms_attn_shape *s, char *why, size_t cap) {
    if (!bf16_only(s, why, cap)) return 0;
    if (b->gpu.cc_major < 8)
        return snprintf(why, cap, "it needs bf16 tensor cores (mma.sync, compute capability 8.0 or newer)"), 0;
    if (s->kind != MS_ATTN_GQA) return cu_attn_mla_mma_covers(b, s->dk, s->dv, why, cap);
    if (s->dk != s->dv || (s->dk != 64 && s->dk != 128))
        return snprintf(why, cap, "it takes head dim 64 or 128 only (this model: %d)", s->dk), 0;
    return 1;
}

static size_t mma_ws(const ms_backend *b, const ms_attn_shape *s) {
    (void)b;
    return split_ws(s);
}

static int mma_run(ms_backend *b, const ms_attn_call *c, ms_err *err) {
    int done = 0;
    if (c->prep) { /* attn.h: gqa_prep's work in the kernel where it can, else gqa_prep's kernel first */
        MS_TRY(cu_attn_gqa_mma_prep(b, c, &done, err));
        if (done) return MS_OK;
        const ms_attn_gqa_prep *p = c->prep;
        MS_TRY(cu_op_gqa_prep(b, (ms_tensor *)c->q, p->k, p->v, p->bq, p->bk, p->bv, p->pos_d, p->rc, (ms_tensor *)c->k,
                              (ms_tensor *)c->v, p->slot_d, p->qkv, err));
    }
    if (c->kind == MS_ATTN_GQA) MS_TRY(cu_attn_gqa_try_mma(b, c->q, c->k, c->v, c->m, c->scale, c->out, 1, &done, err));
    else
        MS_TRY(cu_attn_mla_mma(b, c->q, c->k, c->m, c->kind == MS_ATTN_DSA ? c->topk_d : NULL, c->topk, c->kvl, c->scale,
                               c->out, 1, &done, err));
    if (!done)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "attention mma: head dims %d/%d on %s (compute capability %d.%d) are not covered",
                       (int)c->q->shape[2], c->kind == MS_ATTN_GQA ? (int)c->q->shape[2] : c->kvl, b->gpu.name,
                       b->gpu.cc_major, b->gpu.cc_minor);
    return MS_OK;
}

extern "C" const ms_attn_impl ms_attn_impl_mma = {
    "mma", "cuda",
    "tensor-core flash attention (mma.sync bf16), split-KV with a merge pass when the grid is small, GQA decode "
    "steps with the q/k/v bias, RoPE and cache stores in the same kernel; MLA/DSA: "
    "the 64 heads of a token as one tile over shared latent rows (gathered top-k keys for DSA)",
    mma_supports, mma_ws, mma_run,
    MS_ATTN_CAP_GQA | MS_ATTN_CAP_MLA | MS_ATTN_CAP_DSA | MS_ATTN_CAP_GRAPHS | MS_ATTN_CAP_SPLIT_KV |
        MS_ATTN_CAP_TENSOR_CORES | MS_ATTN_CAP_GQA_PREP,
};

/* ---- flash / flash_nosplit ---- */

static int flash_supports(const ms_backend *b, const ms_attn_shape *s, char *why, size_t cap) {
    if (!bf16_only(s, why, cap)) return 0;
    if (s->dk % 2 || s->dv % 2) return snprintf(why, cap, "it takes even head dims only (this model: %d/%d)", s->dk, s->dv), 0;
    size_t need = cu_attn_flash_min_smem(s->dk, s->dv, s->kind == MS_ATTN_GQA);
    if (need > (size_t)cu_smem_optin(b))
        return snprintf(why, cap, "head dims %d/%d need %zu bytes of shared memory per block, the GPU allows %d", s->dk,
                        s->dv, need, cu_smem_optin(b)), 0;
    return 1;
}

static size_t flash_ws(const ms_backend *b, const ms_attn_shape *s) {
    (void)b;
    return split_ws(s);
}

static size_t none_ws(const ms_backend *b, const ms_attn_shape *s) {
    (void)b;
    (void)s;
    return 0;
}

static int flash_call(ms_backend *b, const ms_attn_call *c, int split, ms_err *err) {
    if (c->kind == MS_ATTN_GQA) return cu_attn_gqa_flash(b, c->q, c->k, c->v, c->m, c->scale, c->out, split, err);
    return cu_attn_mla_flash(b, c->q, c->k, c->m, c->kind == MS_ATTN_DSA ? c->topk_d : NULL, c->topk, c->kvl, c->scale,
                             c->out, split, err);
}

static int flash_run(ms_backend *b, const ms_attn_call *c, ms_err *err) { return flash_call(b, c, 1, err); }
static int flash_nosplit_run(ms_backend *b, const ms_attn_call *c, ms_err *err) { return flash_call(b, c, 0, err); }

extern "C" const ms_attn_impl ms_attn_impl_flash = {
    "flash", "cuda",
    "CUDA-core flash attention (fp32 online softmax over 32-key shared tiles), split-KV when the grid is small; "
    "DSA: gathers each query's top-k keys",
    flash_supports, flash_ws, flash_run,
    MS_ATTN_CAP_GQA | MS_ATTN_CAP_MLA | MS_ATTN_CAP_DSA | MS_ATTN_CAP_GRAPHS | MS_ATTN_CAP_SPLIT_KV,
};

extern "C" const ms_attn_impl ms_attn_impl_flash_nosplit = {
    "flash_nosplit", "cuda", "the flash kernel with one key range per block (no split-KV, no merge pass)",
    flash_supports, none_ws, flash_nosplit_run,
    MS_ATTN_CAP_GQA | MS_ATTN_CAP_MLA | MS_ATTN_CAP_DSA | MS_ATTN_CAP_GRAPHS,
};

/* ---- ref ---- */

static int ref_supports(const ms_backend *b, const ms_attn_shape *s, char *why, size_t cap) {
    if (!bf16_only(s, why, cap)) return 0;
    if (s->dv > CU_ATTN_REF_MAX_DV)
        return snprintf(why, cap, "it takes value widths up to %d (this model: %d)", CU_ATTN_REF_MAX_DV, s->dv), 0;
    size_t need = (size_t)(s->dk + 1 + 128) * 4 + 128 * 8 + 8;
    if (need > (size_t)cu_smem_optin(b))
        return snprintf(why, cap, "key width %d needs %zu bytes of shared memory, the GPU allows %d", s->dk, need,
                        cu_smem_optin(b)), 0;
    return 1;
}

static size_t ref_ws(const ms_backend *b, const ms_attn_shape *s) {
    (void)b;
    return s->kind == MS_ATTN_DSA ? (size_t)s->n_tokens * (size_t)(s->max_ctx > 0 ? s->max_ctx : 1) : 0;
}

static int ref_run(ms_backend *b, const ms_attn_call *c, ms_err *err) {
    if (c->kind == MS_ATTN_GQA)
        return cu_attn_ref(b, c->q, c->k, c->v, c->m, NULL, 0, (int)c->v->shape[2], c->scale, c->out, err);
    return cu_attn_ref(b, c->q, c->k, NULL, c->m, c->kind == MS_ATTN_DSA ? c->topk_d : NULL, c->topk, c->kvl, c->scale,
                       c->out, err);
}

/* Not GRAPHS: the DSA mask's size follows the step's context, which a recorded graph would freeze. */
extern "C" const ms_attn_impl ms_attn_impl_ref = {
    "ref", "cuda",
    "straightforward kernel: one block per (token, head), fp32 online softmax, no split, no tensor cores; "
    "DSA: dense-equivalent masked attention over the whole context",
    ref_supports, ref_ws, ref_run, MS_ATTN_CAP_GQA | MS_ATTN_CAP_MLA | MS_ATTN_CAP_DSA,
};
