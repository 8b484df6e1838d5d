/* arch_glm_moe_dsa.c - the glm_moe_dsa table (GLM-5): MLA in the weight-absorbed form over a
 * latent cache [c ; k_rope] per token per layer (spec 3.6, 3.12), with the DSA lightning indexer
 * (spec 3.8) choosing each query's top-k keys over its causal prefix. "Shared" indexer layers
 * (GLM-5.2 IndexShare) reuse the most recent full layer's selection. When no query sees more than
 * index_topk keys the selection is every causal key, so attention runs dense (same result, no
 * indexer scoring); the indexer keys are still cached for later steps.
 *
 * Tensor parallelism splits the heads: q_b_proj and kv_b_proj by output rows (whole heads), o_proj
 * by input columns. The latent projections, their norms and the indexer are replicated: every rank
 * computes the same latent and the same key selection from the same (all-reduced) input, caches the
 * whole latent, and attends with its own heads. */
#include "model/arch.h"
#include "model/config_internal.h"
#include "model/forward_internal.h"
#include "model/loader_internal.h"

#include <math.h>
#include <string.h>

static int parse_config(ms_cfg_reader *c, ms_config *cfg) {
    json_t *r = c->root;
    /* MLA: head_dim in exported configs is unreliable (spec 1.1); derive from the MLA dims. */
    if (!ms_cfg_get(r, "q_lora_rank"))
        return ms_errf(c->err, MS_ERR_UNSUPPORTED, "%s: field 'q_lora_rank' is missing or null (MLA without a query LoRA is not supported)", c->path);
    MS_TRY(ms_cfg_req_int(c, r, "q_lora_rank", &cfg->q_lora_rank));
    MS_TRY(ms_cfg_req_int(c, r, "kv_lora_rank", &cfg->kv_lora_rank));
    MS_TRY(ms_cfg_req_int(c, r, "qk_nope_head_dim", &cfg->qk_nope_head_dim));
    MS_TRY(ms_cfg_req_int(c, r, "qk_rope_head_dim", &cfg->qk_rope_head_dim));
    MS_TRY(ms_cfg_req_int(c, r, "v_head_dim", &cfg->v_head_dim));
    if (cfg->qk_rope_head_dim % 2) return ms_cfg_bad(c, "qk_rope_head_dim", "must be even");
    int qkh;
    MS_TRY(ms_cfg_int(c, r, "qk_head_dim", cfg->qk_nope_head_dim + cfg->qk_rope_head_dim, 2, &qkh));
    if (qkh != cfg->qk_nope_head_dim + cfg->qk_rope_head_dim)
        return ms_cfg_bad(c, "qk_head_dim", "must equal qk_nope_head_dim + qk_rope_head_dim");
    cfg->head_dim = qkh;
    cfg->rotary_dim = cfg->qk_rope_head_dim;
    MS_TRY(ms_cfg_bool(c, r, "rope_interleave", 1, &cfg->rope_interleave));
    MS_TRY(ms_cfg_int(c, r, "index_topk", 2048, 2, &cfg->index_topk));
    MS_TRY(ms_cfg_int(c, r, "index_n_heads", 32, 2, &cfg->index_n_heads));
    MS_TRY(ms_cfg_int(c, r, "index_head_dim", 128, 2, &cfg->index_head_dim));
    if (cfg->index_head_dim < cfg->qk_rope_head_dim)
        return ms_cfg_bad(c, "index_head_dim", "must be at least qk_rope_head_dim (the indexer rotates that many dims)");
    MS_TRY(ms_cfg_bool(c, r, "indexer_rope_interleave", 1, &cfg->indexer_rope_interleave));
    json_t *it = ms_cfg_get(r, "indexer_types");
    if (it) {
        if (!json_is_array(it)) return ms_cfg_bad(c, "indexer_types", "must be a list");
        if ((int)json_array_size(it) < cfg->num_layers) return ms_cfg_bad(c, "indexer_types", "has fewer entries than num_hidden_layers");
        for (int i = 0; i < cfg->num_layers; i++) {
            const char *s = json_string_value(json_array_get(it, (size_t)i));
            if (!s || (strcmp(s, "full") && strcmp(s, "shared")))
                return ms_cfg_bad(c, "indexer_types", "entries must be \"full\" or \"shared\"");
            cfg->indexer_full[i] = !strcmp(s, "full");
        }
    } else {
        int freq, off;
        MS_TRY(ms_cfg_int(c, r, "index_topk_freq", 1, 2, &freq));
        MS_TRY(ms_cfg_int(c, r, "index_skip_topk_offset", 2, 1, &off));
        for (int i = 0; i < cfg->num_layers; i++) {
            int x = i - off + 1;
            if (x < 0) x = 0;
            cfg->indexer_full[i] = x % freq == 0;
        }
    }
    if (cfg->num_layers > 0 && !cfg->indexer_full[0])
        return ms_cfg_bad(c, "indexer_types", "must make layer 0 \"full\" (a shared layer reuses an earlier full layer)");
    return MS_OK;
}

static int check_tp(const ms_config *c, int tp, ms_err *err) {
    if (c->num_heads % tp)
        return ms_errf(err, MS_ERR_INVALID, "--tp %d does not divide num_attention_heads (%d) of the %s config", tp,
                       c->num_heads, c->model_type);
    return MS_OK;
}

static int load_layer(ms_load_ctx *c, int L, ms_layer *ly) {
    const ms_config *cfg = ms_ld_config(c);
    const int64_t H = cfg->hidden_size, nh = cfg->num_heads, rq = cfg->q_lora_rank, rkv = cfg->kv_lora_rank,
                  dn = cfg->qk_nope_head_dim, dr = cfg->qk_rope_head_dim, dv = cfg->v_head_dim;
    char nm[256];
#define NM(suffix) (snprintf(nm, sizeof nm, "model.layers.%d.self_attn.%s", L, suffix), nm)
    MS_TRY(ms_ld_linear(c, NM("q_a_proj"), rq, H, MS_GROUP_ATTN, 0, MS_SPLIT_NONE, &ly->q_a_proj));
    MS_TRY(ms_ld_tensor1(c, NM("q_a_layernorm.weight"), rq, 1, MS_GROUP_ATTN, MS_DUMMY_NORM, &ly->q_a_norm));
    MS_TRY(ms_ld_linear(c, NM("q_b_proj"), nh * (dn + dr), rq, MS_GROUP_ATTN, 0, MS_SPLIT_OUT, &ly->q_b_proj));
    MS_TRY(ms_ld_linear(c, NM("kv_a_proj_with_mqa"), rkv + dr, H, MS_GROUP_ATTN, 0, MS_SPLIT_NONE, &ly->kv_a_proj));
    MS_TRY(ms_ld_tensor1(c, NM("kv_a_layernorm.weight"), rkv, 1, MS_GROUP_ATTN, MS_DUMMY_NORM, &ly->kv_a_norm));
    MS_TRY(ms_ld_linear(c, NM("kv_b_proj"), nh * (dn + dv), rkv, MS_GROUP_ATTN, 0, MS_SPLIT_OUT, &ly->kv_b_proj));
    MS_TRY(ms_ld_linear(c, NM("o_proj"), H, nh * dv, MS_GROUP_ATTN, 0, MS_SPLIT_IN, &ly->o_proj));
    ly->has_indexer = cfg->indexer_full[L];
    if (ly->has_indexer) {
        int64_t nih = cfg->index_n_heads, dih = cfg->index_head_dim;
        MS_TRY(ms_ld_linear(c, NM("indexer.wq_b"), nih * dih, rq, MS_GROUP_INDEXER, 0, MS_SPLIT_NONE, &ly->idx_wq_b));
        MS_TRY(ms_ld_linear(c, NM("indexer.wk"), dih, H, MS_GROUP_INDEXER, 0, MS_SPLIT_NONE, &ly->idx_wk));
        MS_TRY(ms_ld_tensor1(c, NM("indexer.k_norm.weight"), dih, 1, MS_GROUP_INDEXER, MS_DUMMY_NORM, &ly->idx_k_norm_w));
        MS_TRY(ms_ld_tensor1(c, NM("indexer.k_norm.bias"), dih, 1, MS_GROUP_INDEXER, MS_DUMMY_BIAS, &ly->idx_k_norm_b));
        MS_TRY(ms_ld_linear(c, NM("indexer.weights_proj"), nih, H, MS_GROUP_INDEXER, 0, MS_SPLIT_NONE, &ly->idx_wproj));
    }
#undef NM
    return MS_OK;
}

static int alloc(ms_forward *f, ms_err *err) {
    const ms_config *c = &f->m->cfg;
    const int T = f->max_tokens, nh = c->num_heads / f->m->shard.tp_size, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim,
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
    for (int L = 0; L < fw_cache_layers(f); L++)
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
    if (f->m->layers[0].a_stack.w.data) { /* one-token steps: [q_a | indexer wk | kv_a] of one row */
        f->qkv_rows = 1;
        MS_TRY(ms_backend_alloc(f->b, &f->qkv, ad, 2, (int64_t[]){1, (int64_t)ql + di + kvl + dr}, err));
    }
    for (int L = 0; L < fw_cache_layers(f); L++) {
        MS_TRY(ms_backend_alloc(f->b, &f->kc[L], ad, 2, (int64_t[]){f->n_slots, kvl + dr}, err));
        if (c->indexer_full[L]) MS_TRY(ms_backend_alloc(f->b, &f->vc[L], ad, 2, (int64_t[]){f->n_slots, di}, err));
    }
    return MS_OK;
}

/* The indexer key's RoPE (its first qk_rope_head_dim columns). */
static ms_rope_cfg idx_rope(const ms_config *c) {
    return (ms_rope_cfg){0, c->qk_rope_head_dim, c->indexer_rope_interleave, c->rope_theta};
}

/* Indexer of a full layer: caches this step's keys; when selection is sparse, writes f->topk. kI_in:
 * this step's keys already projected (the layer's a_stack), or NULL to project them here; kI_ready: they
 * are also normalised, rotated and stored (mla_prep did it). */
static int indexer(ms_forward *f, int L, int T, const ms_tensor *cq, const ms_tensor *kI_in, int kI_ready, int dense,
                   ms_err *err) {
    const ms_config *c = &f->m->cfg;
    const ms_layer *l = &f->m->layers[L];
    const ms_backend_ops *op = f->b->ops;
    ms_backend *b = f->b;
    const int nih = c->index_n_heads, di = c->index_head_dim;
    ms_rope_cfg rc = idx_rope(c);
    ms_tensor a = fw_view2(&f->a, T, c->hidden_size);
    ms_tensor kI = kI_in ? *kI_in : fw_view2(&f->kI, T, di), kI3 = fw_view3(&kI, T, 1, di);
    if (!kI_in) MS_TRY(op->linear(b, &l->idx_wk, &a, &kI, err));
    const ms_tensor *kb = l->idx_k_norm_b.data ? &l->idx_k_norm_b : NULL;
    /* LayerNorm, RoPE and the cache store in one launch where the backend has it */
    ms_err ferr = {0};
    int fused = kI_in && kI_ready ? MS_OK
                : op->idx_k_prep  ? fw_optional(op->idx_k_prep(b, &kI, &l->idx_k_norm_w, kb, 1e-6f, f->meta.positions_d,
                                                               &rc, &f->vc[L], f->meta.slot_mapping_d, &ferr),
                                                &ferr, err)
                                  : MS_ERR_UNSUPPORTED;
    if (fused == MS_OK) {
        FW_TRY_CHECK(f, &kI, "indexer_k", err);
    } else if (fused == MS_ERR_UNSUPPORTED) { /* NULL, or a shape it refused without doing anything */
        MS_TRY(op->layernorm(b, &kI, &l->idx_k_norm_w, kb, 1e-6f, &kI, err));
        MS_TRY(op->rope(b, &kI3, f->meta.positions_d, &rc, err));
        FW_TRY_CHECK(f, &kI, "indexer_k", err);
        MS_TRY(op->kv_store(b, &f->vc[L], &kI, f->meta.slot_mapping_d, err));
    } else {
        return fused;
    }
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

static int attention(ms_forward *f, int L, int T, ms_err *err) {
    const ms_config *c = &f->m->cfg;
    const ms_layer *l = &f->m->layers[L];
    const ms_backend_ops *op = f->b->ops;
    ms_backend *b = f->b;
    const int H = c->hidden_size, nh = c->num_heads / f->m->shard.tp_size, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim,
              dv = c->v_head_dim, kvl = c->kv_lora_rank, ql = c->q_lora_rank;
    ms_tensor a = fw_view2(&f->a, T, H);
    /* a one-token step reads its three input projections in one launch (a_stack): cq, the indexer key
     * and the latent are then consecutive pieces of one row */
    const int stacked = l->a_stack.w.data && f->qkv.data && T <= f->qkv_rows;
    const int64_t di = l->has_indexer ? c->index_head_dim : 0;
    ms_tensor row = {0}, kI_st = {0};
    if (stacked) {
        row = fw_view2(&f->qkv, T, l->a_stack.n_out);
        MS_TRY(fw_linear_a(f, &l->a_stack, &a, &row, err));
        kI_st = fw_piece(&row, ql, di);
    }
    /* queries: cq = RMSNorm(a q_a^T); q = cq q_b^T (RoPE on each head's last dr dims comes with the absorb) */
    ms_tensor cq = stacked ? fw_piece(&row, 0, ql) : fw_view2(&f->qa, T, ql);
    if (!stacked) MS_TRY(fw_linear_a(f, &l->q_a_proj, &a, &cq, err));
    ms_tensor kva = stacked ? fw_piece(&row, ql + di, kvl + dr) : fw_view2(&f->kva, T, kvl + dr),
              kva3 = fw_view3(&kva, T, 1, kvl + dr);
    ms_rope_cfg rk = {kvl, dr, c->rope_interleave, c->rope_theta}, ri = idx_rope(c);
    /* a one-token step: the q_a norm, the latent's and the indexer key's preparation in one launch
     * where the backend has it (prepped) */
    int prepped = 0;
    if (stacked && op->mla_prep && dr <= 1024) { /* the separate latent prep's condition */
        const ms_mla_prep p = {.cq = &cq, .q_norm = &l->q_a_norm, .q_eps = c->rms_norm_eps, .kva = &kva, .kvl = kvl,
                               .kv_norm = &l->kv_a_norm, .kv_eps = c->rms_norm_eps, .kv_rope = &rk, .kv_cache = &f->kc[L],
                               .kI = c->indexer_full[L] ? &kI_st : NULL, .kI_w = &l->idx_k_norm_w,
                               .kI_b = l->idx_k_norm_b.data ? &l->idx_k_norm_b : NULL, .kI_eps = 1e-6f,
                               .kI_rope = &ri, .kI_cache = &f->vc[L], .pos_d = f->meta.positions_d,
                               .slot_d = f->meta.slot_mapping_d};
        ms_err perr = {0};
        const int rc = fw_optional(op->mla_prep(b, &p, &perr), &perr, err);
        if (rc != MS_OK && rc != MS_ERR_UNSUPPORTED) return rc;
        prepped = rc == MS_OK;
    }
    if (!prepped) MS_TRY(op->rmsnorm(b, &cq, &l->q_a_norm, c->rms_norm_eps, &cq, err));
    FW_TRY_CHECK(f, &cq, "q_a", err);
    ms_tensor q = fw_view2(&f->qb, T, (int64_t)nh * (dn + dr));
    MS_TRY(op->linear(b, &l->q_b_proj, &cq, &q, err));
    FW_TRY_CHECK(f, &q, "q_b", err);
    /* latent: [RMSNorm(c) ; RoPE(k_rope)] stored per token */
    ms_tensor cl = fw_view2(&f->c, T, kvl);
    if (!stacked) MS_TRY(op->linear(b, &l->kv_a_proj, &a, &kva, err));
    if (prepped) {
        FW_TRY_CHECK(f, &kva, "kv_a", err);
    } else if (op->mla_kv_prep && dr <= 1024) { /* norm, RoPE and the cache store in one launch */
        MS_TRY(op->mla_kv_prep(b, &kva, kvl, &l->kv_a_norm, c->rms_norm_eps, f->meta.positions_d, &rk, &f->kc[L],
                               f->meta.slot_mapping_d, err));
        FW_TRY_CHECK(f, &kva, "kv_a", err);
    } else {
        MS_TRY(op->copy_cols(b, &kva, 0, kvl, &cl, err));
        MS_TRY(op->rmsnorm(b, &cl, &l->kv_a_norm, c->rms_norm_eps, &cl, err));
        MS_TRY(op->set_cols(b, &cl, 0, &kva, err));
        MS_TRY(op->rope(b, &kva3, f->meta.positions_d, &rk, err));
        FW_TRY_CHECK(f, &kva, "kv_a", err);
        MS_TRY(op->kv_store(b, &f->kc[L], &kva, f->meta.slot_mapping_d, err));
    }
    /* q_abs = q_nope W_UK per head, next to q's rope part, which the copy rotates (q itself is not
     * rotated: this op is its only reader) */
    ms_tensor qabs = fw_view3(&f->qabs, T, nh, kvl + dr);
    ms_rope_cfg rc = {dn, dr, c->rope_interleave, c->rope_theta};
    MS_TRY(op->mla_absorb_q(b, &l->kv_b_proj, &q, nh, dn, dr, dv, f->meta.positions_d, &rc, &qabs, err));
    FW_TRY_CHECK(f, &qabs, "absorb_q", err);
    /* key selection */
    const int dense = f->meta.max_ctx <= c->index_topk;
    if (c->indexer_full[L]) {
        FW_PROF(f, "indexer (in attention)", indexer(f, L, T, &cq, stacked ? &kI_st : NULL, prepped, dense, err), err);
        f->topk_valid = !dense;
        if (!dense) MS_TRY(fw_decide_index(f, L, T, err));
    }
    const int32_t *topk = f->topk_valid ? f->topk.data : NULL;
    ms_tensor olat = fw_view3(&f->olat, T, nh, kvl);
    ms_attn_call ac = {.kind = topk ? MS_ATTN_DSA : MS_ATTN_MLA, .q = &qabs, .k = &f->kc[L], .m = &f->meta,
                       .topk_d = topk, .topk = c->index_topk, .kvl = kvl, .scale = 1.0f / sqrtf((float)(dn + dr)),
                       .out = &olat};
    FW_PROF(f, "attn_kernel (in attention)", fw_attention(f, &ac, err), err);
    FW_TRY_CHECK(f, &olat, "attention", err);
    ms_tensor vout = fw_view2(&f->vout, T, (int64_t)nh * dv);
    MS_TRY(op->mla_v_up(b, &l->kv_b_proj, &olat, nh, dn, dv, &vout, err));
    ms_tensor delta = fw_view2(&f->delta, T, H);
    MS_TRY(op->linear(b, &l->o_proj, &vout, &delta, err));
    FW_TRY_CHECK(f, &delta, "o_proj", err);
    return MS_OK;
}

static size_t kv_bytes_per_token(const ms_config *c, int L, size_t elem, int tp) {
    size_t n = (size_t)(c->kv_lora_rank + c->qk_rope_head_dim) * elem;
    if (c->indexer_full[L]) n += (size_t)c->index_head_dim * elem;
    return n;
}

static double kv_read_bytes(const ms_config *c, int L, double ctx, double elem) {
    double keys = ctx < c->index_topk ? ctx : c->index_topk;
    double n = (double)(c->kv_lora_rank + c->qk_rope_head_dim) * elem * keys;
    if (c->indexer_full[L] && ctx > c->index_topk) n += (double)c->index_head_dim * elem * ctx;
    return n;
}

static double attn_flops(const ms_config *c, int L, double ctx, int prefill_len) {
    double keys = ctx < c->index_topk ? ctx : c->index_topk;
    double f = 2.0 * c->num_heads * (2.0 * c->kv_lora_rank + c->qk_rope_head_dim) * keys;
    /* the indexer scores every causal key once the step's longest context exceeds top-k */
    int scored = prefill_len > 0 ? prefill_len > c->index_topk : ctx > c->index_topk;
    if (c->indexer_full[L] && scored) f += 2.0 * c->index_n_heads * c->index_head_dim * ctx;
    return f;
}

static void attn_params(const ms_config *c, int L, double *split, double *repl, double *plain) {
    const double H = c->hidden_size, nh = c->num_heads, rq = c->q_lora_rank, rkv = c->kv_lora_rank,
                 dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim;
    *split = rq * nh * (dn + dr) + rkv * nh * (dn + dv) + nh * dv * H; /* q_b, kv_b, o */
    *repl = H * rq + H * (rkv + dr);                                   /* q_a, kv_a_with_mqa */
    *plain = rq + rkv;                                                 /* their norms */
    if (c->indexer_full[L]) /* wq_b, wk, k_norm, weights_proj */
        *plain += rq * c->index_n_heads * c->index_head_dim + H * c->index_head_dim + 2.0 * c->index_head_dim +
                  H * c->index_n_heads;
}

static void describe(const ms_config *c, FILE *out) {
    int n_full = 0;
    for (int i = 0; i < c->num_layers; i++) n_full += c->indexer_full[i];
    fprintf(out, "attention:     MLA, %d heads, q_lora %d, kv_lora %d, qk %d+%d (rope), v %d, rope theta %g%s\n", c->num_heads,
            c->q_lora_rank, c->kv_lora_rank, c->qk_nope_head_dim, c->qk_rope_head_dim, c->v_head_dim, c->rope_theta,
            c->rope_interleave ? " interleaved" : "");
    fprintf(out, "indexer:       %d heads x %d, top-k %d; %d full layers, %d shared\n", c->index_n_heads, c->index_head_dim,
            c->index_topk, n_full, c->num_layers - n_full);
}

/* q_a | indexer wk (full layers) | kv_a of a layer, for ms_ld_stack_layers: a one-token step then
 * reads the ~34 MB of GLM-5's input projections in one launch instead of three small GEMVs. kv_a goes
 * last so that FP8 parts keep whole 128-row scale blocks. */
static int in_parts(const ms_model *m, ms_layer *l, ms_linear **parts) {
    (void)m;
    if (!l->q_a_proj.w.data || !l->kv_a_proj.w.data || (l->has_indexer && !l->idx_wk.w.data)) return 0;
    int n = 0;
    parts[n++] = &l->q_a_proj;
    if (l->has_indexer) parts[n++] = &l->idx_wk;
    parts[n++] = &l->kv_a_proj;
    return n;
}

static int fuse_placed(ms_model *m, ms_backend *b, ms_err *err) {
    return ms_ld_stack_layers(m, b, "q_a|indexer wk|kv_a", in_parts, err);
}

/* The MTP layer runs in a step of its own, where no earlier layer made a selection to share: its
 * indexer computes its own top-k (the MTP layer of DeepSeek-V3.2-style checkpoints has indexer
 * weights). */
static void mtp_layer(ms_config *cfg, int L) {
    if (L >= 0 && L < MS_MAX_LAYERS) cfg->indexer_full[L] = 1;
}

const ms_arch ms_arch_glm_moe_dsa = {
    .name = "glm_moe_dsa",
    .attention_kind = "MLA + DSA indexer",
    .parse_config = parse_config,
    .check_tp = check_tp,
    .load_layer = load_layer,
    .alloc = alloc,
    .attention = attention,
    .kv_bytes_per_token = kv_bytes_per_token,
    .kv_read_bytes = kv_read_bytes,
    .attn_flops = attn_flops,
    .attn_params = attn_params,
    .describe = describe,
    .mtp_layer = mtp_layer,
    .fuse_placed = fuse_placed,
    .input_norm_pending = 1,
};
