/* arch_glm_moe_dsa.c - attention of glm_moe_dsa (GLM-5): MLA in the weight-absorbed form over a
 * latent cache [c ; k_rope] per token per layer (spec 3.6, 3.12), with the DSA lightning indexer
 * (spec 3.8) choosing each query's top-k keys over its causal prefix. "Shared" indexer layers
 * (GLM-5.2 IndexShare) reuse the most recent full layer's selection. When no query sees more than
 * index_topk keys the selection is every causal key, so attention runs dense (same result, no
 * indexer scoring); the indexer keys are still cached for later steps. */
#include "model/forward_internal.h"

#include <math.h>

int fw_alloc_dsa(ms_forward *f, ms_err *err) {
    const ms_config *c = &f->m->cfg;
    const int T = f->max_tokens, nh = c->num_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim,
              dv = c->v_head_dim, kvl = c->kv_lora_rank, ql = c->q_lora_rank;
    const int nih = c->index_n_heads, di = c->index_head_dim;
    const ms_dtype ad = f->b->act_dtype;
    if (nh < 1 || dn < 1 || dr < 2 || dr % 2 || dv < 1 || kvl < 1 || ql < 1 || c->index_topk < 1 || nih < 1 ||
        di < dr)
        return ms_errf(err, MS_ERR_FORMAT,
                       "config: glm_moe_dsa dims do not fit (heads %d, qk_nope %d, qk_rope %d, v %d, kv_lora %d, q_lora %d, "
                       "index heads %d, index head_dim %d, index_topk %d)",
                       nh, dn, dr, dv, kvl, ql, nih, di, c->index_topk);
    if (!c->indexer_full[0])
        return ms_errf(err, MS_ERR_FORMAT, "config: indexer_types[0] is 'shared' but no earlier layer computes a top-k");
    for (int L = 0; L < c->num_layers; L++)
        if (c->indexer_full[L] && !f->m->layers[L].has_indexer)
            return ms_errf(err, MS_ERR_FORMAT, "model: layer %d is a full indexer layer but has no indexer weights", L);
    int64_t r;
#define A2(t, cols) (r = (cols), ms_backend_alloc(f->b, (t), ad, 2, (int64_t[]){T, r}, err))
    MS_TRY(A2(&f->qa, ql));
    MS_TRY(A2(&f->qb, (int64_t)nh * (dn + dr)));
    MS_TRY(A2(&f->qabs, (int64_t)nh * (kvl + dr)));
    MS_TRY(A2(&f->kva, kvl + dr));
    MS_TRY(A2(&f->c, kvl));
    MS_TRY(A2(&f->olat, (int64_t)nh * kvl));
    MS_TRY(A2(&f->vout, (int64_t)nh * dv));
    MS_TRY(A2(&f->qI, (int64_t)nih * di));
    MS_TRY(A2(&f->kI, di));
    MS_TRY(ms_backend_alloc(f->b, &f->iw, MS_F32, 2, (int64_t[]){T, nih}, err));
    MS_TRY(ms_backend_alloc(f->b, &f->topk, MS_I32, 2, (int64_t[]){T, c->index_topk}, err));
#undef A2
    for (int L = 0; L < c->num_layers; L++) {
        MS_TRY(ms_backend_alloc(f->b, &f->kc[L], ad, 2, (int64_t[]){f->n_slots, kvl + dr}, err));
        if (c->indexer_full[L]) MS_TRY(ms_backend_alloc(f->b, &f->vc[L], ad, 2, (int64_t[]){f->n_slots, di}, err));
    }
    return MS_OK;
}

/* Indexer of a full layer: caches this step's keys; when selection is sparse, writes f->topk. */
static int indexer(ms_forward *f, int L, int T, const ms_tensor *cq, int dense, ms_err *err) {
    const ms_config *c = &f->m->cfg;
    const ms_layer *l = &f->m->layers[L];
    const ms_backend_ops *op = f->b->ops;
    ms_backend *b = f->b;
    const int nih = c->index_n_heads, di = c->index_head_dim, dr = c->qk_rope_head_dim;
    ms_rope_cfg rc = {0, dr, c->indexer_rope_interleave, c->rope_theta};
    ms_tensor a = fw_view2(&f->a, T, c->hidden_size);
    ms_tensor kI = fw_view2(&f->kI, T, di), kI3 = fw_view3(&f->kI, T, 1, di);
    MS_TRY(op->linear(b, &l->idx_wk, &a, &kI, err));
    MS_TRY(op->layernorm(b, &kI, &l->idx_k_norm_w, l->idx_k_norm_b.data ? &l->idx_k_norm_b : NULL, 1e-6f, &kI, err));
    MS_TRY(op->rope(b, &kI3, f->meta.positions_d, &rc, err));
    FW_TRY_CHECK(f, &kI, "indexer_k", err);
    MS_TRY(op->kv_store(b, &f->vc[L], &kI, f->meta.slot_mapping_d, err));
    if (dense) return MS_OK;
    ms_tensor qI = fw_view2(&f->qI, T, (int64_t)nih * di), qI3 = fw_view3(&f->qI, T, nih, di);
    MS_TRY(op->linear(b, &l->idx_wq_b, cq, &qI, err));
    MS_TRY(op->rope(b, &qI3, f->meta.positions_d, &rc, err));
    FW_TRY_CHECK(f, &qI, "indexer_q", err);
    ms_tensor iw = fw_view2(&f->iw, T, nih);
    MS_TRY(op->linear(b, &l->idx_wproj, &a, &iw, err));
    MS_TRY(op->scale(b, &iw, 1.0f / sqrtf((float)nih), err));
    FW_TRY_CHECK(f, &iw, "indexer_weights", err);
    return op->indexer_topk(b, &qI3, &iw, &f->vc[L], &f->meta, c->index_topk, f->topk.data, err);
}

int fw_attn_dsa(ms_forward *f, int L, int T, int *topk_valid, ms_err *err) {
    const ms_config *c = &f->m->cfg;
    const ms_layer *l = &f->m->layers[L];
    const ms_backend_ops *op = f->b->ops;
    ms_backend *b = f->b;
    const int H = c->hidden_size, nh = c->num_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim,
              dv = c->v_head_dim, kvl = c->kv_lora_rank, ql = c->q_lora_rank;
    ms_tensor a = fw_view2(&f->a, T, H);
    /* queries: cq = RMSNorm(a q_a^T); q = cq q_b^T, RoPE on each head's last dr dims */
    ms_tensor cq = fw_view2(&f->qa, T, ql);
    MS_TRY(op->linear(b, &l->q_a_proj, &a, &cq, err));
    MS_TRY(op->rmsnorm(b, &cq, &l->q_a_norm, c->rms_norm_eps, &cq, err));
    FW_TRY_CHECK(f, &cq, "q_a", err);
    ms_tensor q = fw_view2(&f->qb, T, (int64_t)nh * (dn + dr)), q3 = fw_view3(&f->qb, T, nh, dn + dr);
    MS_TRY(op->linear(b, &l->q_b_proj, &cq, &q, err));
    ms_rope_cfg rc = {dn, dr, c->rope_interleave, c->rope_theta};
    MS_TRY(op->rope(b, &q3, f->meta.positions_d, &rc, err));
    FW_TRY_CHECK(f, &q, "q_b", err);
    /* latent: [RMSNorm(c) ; RoPE(k_rope)] stored per token */
    ms_tensor kva = fw_view2(&f->kva, T, kvl + dr), kva3 = fw_view3(&f->kva, T, 1, kvl + dr);
    ms_tensor cl = fw_view2(&f->c, T, kvl);
    MS_TRY(op->linear(b, &l->kv_a_proj, &a, &kva, err));
    MS_TRY(op->copy_cols(b, &kva, 0, kvl, &cl, err));
    MS_TRY(op->rmsnorm(b, &cl, &l->kv_a_norm, c->rms_norm_eps, &cl, err));
    MS_TRY(op->set_cols(b, &cl, 0, &kva, err));
    ms_rope_cfg rk = {kvl, dr, c->rope_interleave, c->rope_theta};
    MS_TRY(op->rope(b, &kva3, f->meta.positions_d, &rk, err));
    FW_TRY_CHECK(f, &kva, "kv_a", err);
    MS_TRY(op->kv_store(b, &f->kc[L], &kva, f->meta.slot_mapping_d, err));
    ms_tensor qabs = fw_view3(&f->qabs, T, nh, kvl + dr);
    MS_TRY(op->mla_absorb_q(b, &l->kv_b_proj, &q, nh, dn, dr, dv, &qabs, err));
    FW_TRY_CHECK(f, &qabs, "absorb_q", err);
    /* key selection */
    const int dense = f->meta.max_ctx <= c->index_topk;
    if (c->indexer_full[L]) {
        FW_PROF(f, "indexer (in attention)", indexer(f, L, T, &cq, dense, err), err);
        *topk_valid = !dense;
        if (!dense) MS_TRY(fw_decide_index(f, L, T, err));
    }
    const int32_t *topk = *topk_valid ? f->topk.data : NULL;
    ms_tensor olat = fw_view3(&f->olat, T, nh, kvl);
    FW_PROF(f, "attn_kernel (in attention)",
            op->mla_attn(b, &qabs, &f->kc[L], &f->meta, topk, c->index_topk, kvl, 1.0f / sqrtf((float)(dn + dr)), &olat, err),
            err);
    FW_TRY_CHECK(f, &olat, "attention", err);
    ms_tensor vout = fw_view2(&f->vout, T, (int64_t)nh * dv);
    MS_TRY(op->mla_v_up(b, &l->kv_b_proj, &olat, nh, dn, dv, &vout, err));
    ms_tensor delta = fw_view2(&f->delta, T, H);
    MS_TRY(op->linear(b, &l->o_proj, &vout, &delta, err));
    FW_TRY_CHECK(f, &delta, "o_proj", err);
    return MS_OK;
}
