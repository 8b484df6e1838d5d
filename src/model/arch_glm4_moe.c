/* arch_glm4_moe.c - attention of glm4_moe (GLM-4.5/4.6/4.7): grouped-query attention with q/k/v
 * bias, optional per-head RMSNorm of q and k (before RoPE), NeoX RoPE on the first rotary_dim dims
 * of each head, paged K/V cache per layer (spec 1.3). */
#include "model/forward_internal.h"

#include <math.h>

int fw_alloc_glm4(ms_forward *f, ms_err *err) {
    const ms_config *c = &f->m->cfg;
    const int T = f->max_tokens, nh = c->num_heads, nkv = c->num_kv_heads, d = c->head_dim;
    const ms_dtype ad = f->b->act_dtype;
    if (nh < 1 || nkv < 1 || nh % nkv || d < 1 || c->rotary_dim < 0 || c->rotary_dim > d || c->rotary_dim % 2)
        return ms_errf(err, MS_ERR_FORMAT, "config: glm4_moe heads %d / kv heads %d / head_dim %d / rotary dim %d do not fit",
                       nh, nkv, d, c->rotary_dim);
    int64_t s[2] = {T, (int64_t)nh * d}, skv[2] = {T, (int64_t)nkv * d};
    MS_TRY(ms_backend_alloc(f->b, &f->q, ad, 2, s, err));
    MS_TRY(ms_backend_alloc(f->b, &f->attn, ad, 2, s, err));
    MS_TRY(ms_backend_alloc(f->b, &f->k, ad, 2, skv, err));
    MS_TRY(ms_backend_alloc(f->b, &f->v, ad, 2, skv, err));
    int64_t sc[3] = {f->n_slots, nkv, d};
    for (int L = 0; L < c->num_layers; L++) {
        MS_TRY(ms_backend_alloc(f->b, &f->kc[L], ad, 3, sc, err));
        MS_TRY(ms_backend_alloc(f->b, &f->vc[L], ad, 3, sc, err));
    }
    return MS_OK;
}

int fw_attn_glm4(ms_forward *f, int L, int T, ms_err *err) {
    const ms_config *c = &f->m->cfg;
    const ms_layer *l = &f->m->layers[L];
    const ms_backend_ops *op = f->b->ops;
    ms_backend *b = f->b;
    const int H = c->hidden_size, nh = c->num_heads, nkv = c->num_kv_heads, d = c->head_dim;
    ms_tensor a = fw_view2(&f->a, T, H);
    ms_tensor q = fw_view2(&f->q, T, (int64_t)nh * d), k = fw_view2(&f->k, T, (int64_t)nkv * d),
              v = fw_view2(&f->v, T, (int64_t)nkv * d);
    MS_TRY(op->linear(b, &l->q_proj, &a, &q, err));
    FW_TRY_CHECK(f, &q, "q_proj", err);
    MS_TRY(op->linear(b, &l->k_proj, &a, &k, err));
    FW_TRY_CHECK(f, &k, "k_proj", err);
    MS_TRY(op->linear(b, &l->v_proj, &a, &v, err));
    FW_TRY_CHECK(f, &v, "v_proj", err);
    if (c->use_qk_norm && l->q_norm.data && l->k_norm.data) {
        ms_tensor qh = fw_view2(&f->q, (int64_t)T * nh, d), kh = fw_view2(&f->k, (int64_t)T * nkv, d);
        MS_TRY(op->rmsnorm(b, &qh, &l->q_norm, c->rms_norm_eps, &qh, err));
        MS_TRY(op->rmsnorm(b, &kh, &l->k_norm, c->rms_norm_eps, &kh, err));
    }
    ms_tensor q3 = fw_view3(&f->q, T, nh, d), k3 = fw_view3(&f->k, T, nkv, d);
    if (c->rotary_dim > 0) {
        ms_rope_cfg rc = {0, c->rotary_dim, 0, c->rope_theta};
        MS_TRY(op->rope(b, &q3, f->meta.positions_d, &rc, err));
        MS_TRY(op->rope(b, &k3, f->meta.positions_d, &rc, err));
    }
    MS_TRY(op->kv_store(b, &f->kc[L], &k, f->meta.slot_mapping_d, err));
    MS_TRY(op->kv_store(b, &f->vc[L], &v, f->meta.slot_mapping_d, err));
    ms_tensor o3 = fw_view3(&f->attn, T, nh, d), o = fw_view2(&f->attn, T, (int64_t)nh * d);
    FW_PROF(f, "attn_kernel (in attention)", op->attn_gqa(b, &q3, &f->kc[L], &f->vc[L], &f->meta, 1.0f / sqrtf((float)d), &o3, err), err);
    FW_TRY_CHECK(f, &o, "attention", err);
    ms_tensor delta = fw_view2(&f->delta, T, H);
    MS_TRY(op->linear(b, &l->o_proj, &o, &delta, err));
    FW_TRY_CHECK(f, &delta, "o_proj", err);
    return MS_OK;
}
