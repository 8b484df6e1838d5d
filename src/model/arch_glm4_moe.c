/* arch_glm4_moe.c - the glm4_moe table (GLM-4.5/4.6/4.7): grouped-query attention with q/k/v
 * bias, optional per-head RMSNorm of q and k (before RoPE), NeoX RoPE on the first rotary_dim dims
 * of each head, paged K/V cache per layer (spec 1.3).
 *
 * Tensor parallelism splits the heads: q/k/v projections by output rows (whole heads, so q/k norm
 * and RoPE need nothing from other ranks), o_proj by input columns; each rank caches only its KV
 * heads, and the partial o_proj outputs are summed by the forward's all-reduce. */
#include "model/arch.h"
#include "model/config_internal.h"
#include "model/forward_internal.h"
#include "model/loader_internal.h"

#include <math.h>

static int parse_config(ms_cfg_reader *c, ms_config *cfg) {
    json_t *r = c->root;
    if (cfg->num_heads % cfg->num_kv_heads) return ms_cfg_bad(c, "num_key_value_heads", "must divide num_attention_heads");
    MS_TRY(ms_cfg_int(c, r, "head_dim", cfg->hidden_size / cfg->num_heads, 2, &cfg->head_dim));
    double prf = c->prf_present ? c->partial_rotary_factor : 0.5; /* Glm4MoeConfig default */
    if (prf > 1.0) return ms_cfg_bad(c, "partial_rotary_factor", "must be at most 1");
    double rd = cfg->head_dim * prf;
    cfg->rotary_dim = (int)rd;
    if (rd != cfg->rotary_dim || cfg->rotary_dim % 2 || cfg->rotary_dim <= 0)
        return ms_cfg_bad(c, "partial_rotary_factor", "times head_dim must give an even positive rotary dimension");
    MS_TRY(ms_cfg_bool(c, r, "use_qk_norm", 0, &cfg->use_qk_norm));
    cfg->rope_interleave = 0;
    return MS_OK;
}

static int check_tp(const ms_config *c, int tp, ms_err *err) {
    if (c->num_heads % tp)
        return ms_errf(err, MS_ERR_INVALID, "--tp %d does not divide num_attention_heads (%d) of the %s config", tp,
                       c->num_heads, c->model_type);
    if (c->num_kv_heads % tp)
        return ms_errf(err, MS_ERR_INVALID, "--tp %d does not divide num_key_value_heads (%d) of the %s config", tp,
                       c->num_kv_heads, c->model_type);
    return MS_OK;
}

static int load_layer(ms_load_ctx *c, int L, ms_layer *ly) {
    const ms_config *cfg = ms_ld_config(c);
    const int64_t H = cfg->hidden_size, nh = cfg->num_heads, hd = cfg->head_dim, nkv = cfg->num_kv_heads;
    const int bias = cfg->attention_bias ? 2 : 1;
    char nm[256];
#define NM(suffix) (snprintf(nm, sizeof nm, "model.layers.%d.self_attn.%s", L, suffix), nm)
    MS_TRY(ms_ld_linear(c, NM("q_proj"), nh * hd, H, MS_GROUP_ATTN, bias, MS_SPLIT_OUT, &ly->q_proj));
    MS_TRY(ms_ld_linear(c, NM("k_proj"), nkv * hd, H, MS_GROUP_ATTN, bias, MS_SPLIT_OUT, &ly->k_proj));
    MS_TRY(ms_ld_linear(c, NM("v_proj"), nkv * hd, H, MS_GROUP_ATTN, bias, MS_SPLIT_OUT, &ly->v_proj));
    MS_TRY(ms_ld_linear(c, NM("o_proj"), H, nh * hd, MS_GROUP_ATTN, 0, MS_SPLIT_IN, &ly->o_proj));
    MS_TRY(ms_ld_tensor1(c, NM("q_norm.weight"), hd, cfg->use_qk_norm, MS_GROUP_ATTN, MS_DUMMY_NORM, &ly->q_norm));
    MS_TRY(ms_ld_tensor1(c, NM("k_norm.weight"), hd, cfg->use_qk_norm, MS_GROUP_ATTN, MS_DUMMY_NORM, &ly->k_norm));
#undef NM
    return MS_OK;
}

static int alloc(ms_forward *f, ms_err *err) {
    const ms_config *c = &f->m->cfg;
    const int tp = f->m->shard.tp_size;
    const int T = f->max_tokens, nh = c->num_heads / tp, nkv = c->num_kv_heads / tp, d = c->head_dim;
    const ms_dtype ad = f->b->act_dtype;
    if (nh < 1 || nkv < 1 || nh % nkv || d < 1 || c->rotary_dim < 0 || c->rotary_dim > d || c->rotary_dim % 2)
        return ms_errf(err, MS_ERR_FORMAT, "config: glm4_moe heads %d / kv heads %d / head_dim %d / rotary dim %d do not fit",
                       c->num_heads, c->num_kv_heads, d, c->rotary_dim);
    int64_t s[2] = {T, (int64_t)nh * d}, skv[2] = {T, (int64_t)nkv * d};
    MS_TRY(ms_backend_alloc(f->b, &f->q, ad, 2, s, err));
    MS_TRY(ms_backend_alloc(f->b, &f->attn, ad, 2, s, err));
    MS_TRY(ms_backend_alloc(f->b, &f->k, ad, 2, skv, err));
    MS_TRY(ms_backend_alloc(f->b, &f->v, ad, 2, skv, err));
    /* stacked q|k|v output for steps of up to 256 tokens (decode, verify): one GEMV streams all three
     * weights; longer steps are GEMM-bound and keep the three calls (no [T, W] buffer at prefill size) */
    const ms_layer *l0 = &f->m->layers[0];
    if (l0->a_stack.w.data) {
        f->qkv_rows = T < 256 ? T : 256;
        MS_TRY(ms_backend_alloc(f->b, &f->qkv, ad, 2, (int64_t[]){f->qkv_rows, (int64_t)(nh + 2 * nkv) * d}, err));
    }
    int64_t sc[3] = {f->n_slots, nkv, d};
    for (int L = 0; L < fw_cache_layers(f); L++) {
        MS_TRY(ms_backend_alloc(f->b, &f->kc[L], ad, 3, sc, err));
        MS_TRY(ms_backend_alloc(f->b, &f->vc[L], ad, 3, sc, err));
    }
    return MS_OK;
}

/* Whether the forward takes the fused bias + RoPE + cache-store path (gqa_prep) for layer l. */
static int prep_fusable(const ms_config *c, const ms_layer *l) {
    return !(c->use_qk_norm && l->q_norm.data && l->k_norm.data) && c->rotary_dim <= 1024;
}

static int attend(ms_forward *f, int L, int T, const ms_attn_gqa_prep *prep, ms_err *err);

static int attention(ms_forward *f, int L, int T, ms_err *err) {
    const ms_config *c = &f->m->cfg;
    const ms_layer *l = &f->m->layers[L];
    const ms_backend_ops *op = f->b->ops;
    ms_backend *b = f->b;
    const int tp = f->m->shard.tp_size;
    const int H = c->hidden_size, nh = c->num_heads / tp, nkv = c->num_kv_heads / tp, d = c->head_dim;
    ms_tensor a = fw_view2(&f->a, T, H);
    ms_tensor q = fw_view2(&f->q, T, (int64_t)nh * d), k = fw_view2(&f->k, T, (int64_t)nkv * d),
              v = fw_view2(&f->v, T, (int64_t)nkv * d);
    ms_tensor q3 = fw_view3(&f->q, T, nh, d), k3 = fw_view3(&f->k, T, nkv, d);
    ms_rope_cfg rc = {0, c->rotary_dim, 0, c->rope_theta};
    if (op->gqa_prep && prep_fusable(c, l)) {
        /* one kernel for the biases, RoPE and both cache stores after bias-free projections
         * (7 launches -> 1 per layer: these move almost no bytes and cost a launch each) */
        ms_linear qp = l->q_proj, kp = l->k_proj, vp = l->v_proj;
        qp.bias.data = kp.bias.data = vp.bias.data = NULL;
        ms_tensor v3 = fw_view3(&f->v, T, nkv, d), qkv = {0};
        const int stacked = l->a_stack.w.data && f->qkv.data && T <= f->qkv_rows;
        if (stacked) { /* the views' biases are slices of the stacked bias */
            ms_linear sp = l->a_stack;
            sp.bias.data = NULL;
            qkv = fw_view2(&f->qkv, T, (int64_t)(nh + 2 * nkv) * d);
            MS_TRY(fw_linear_a(f, &sp, &a, &qkv, err));
        } else {
            MS_TRY(fw_linear_a(f, &qp, &a, &q, err));
            MS_TRY(op->linear(b, &kp, &a, &k, err));
            MS_TRY(op->linear(b, &vp, &a, &v, err));
        }
        const ms_attn_gqa_prep pp = {&k3, &v3, l->q_proj.bias.data ? &l->q_proj.bias : NULL,
                                     l->k_proj.bias.data ? &l->k_proj.bias : NULL,
                                     l->v_proj.bias.data ? &l->v_proj.bias : NULL, f->meta.positions_d,
                                     f->meta.slot_mapping_d, c->rotary_dim > 0 ? &rc : NULL, stacked ? &qkv : NULL};
        /* an implementation that takes the raw rows does the preparation in its own kernel where it can */
        if (fw_attn_caps(f, MS_ATTN_GQA) & MS_ATTN_CAP_GQA_PREP) return attend(f, L, T, &pp, err);
        MS_TRY(op->gqa_prep(b, &q3, &k3, &v3, pp.bq, pp.bk, pp.bv, pp.pos_d, pp.rc, &f->kc[L], &f->vc[L], pp.slot_d,
                            pp.qkv, err));
        FW_TRY_CHECK(f, &q, "q_proj + bias + rope", err);
        return attend(f, L, T, NULL, err);
    }
    MS_TRY(fw_linear_a(f, &l->q_proj, &a, &q, err));
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
    if (c->rotary_dim > 0) {
        MS_TRY(op->rope(b, &q3, f->meta.positions_d, &rc, err));
        MS_TRY(op->rope(b, &k3, f->meta.positions_d, &rc, err));
    }
    MS_TRY(op->kv_store(b, &f->kc[L], &k, f->meta.slot_mapping_d, err));
    MS_TRY(op->kv_store(b, &f->vc[L], &v, f->meta.slot_mapping_d, err));
    return attend(f, L, T, NULL, err);
}

/* Attention over the cache and o_proj into delta: q rotated and this step's keys and values stored, or
 * (prep) the raw rows, which the attention implementation prepares itself (backend/attn.h). */
static int attend(ms_forward *f, int L, int T, const ms_attn_gqa_prep *prep, ms_err *err) {
    const ms_config *c = &f->m->cfg;
    const ms_layer *l = &f->m->layers[L];
    const ms_backend_ops *op = f->b->ops;
    ms_backend *b = f->b;
    const int H = c->hidden_size, nh = c->num_heads / f->m->shard.tp_size, d = c->head_dim;
    ms_tensor q3 = fw_view3(&f->q, T, nh, d);
    ms_tensor o3 = fw_view3(&f->attn, T, nh, d), o = fw_view2(&f->attn, T, (int64_t)nh * d);
    ms_attn_call ac = {.kind = MS_ATTN_GQA, .q = &q3, .k = &f->kc[L], .v = &f->vc[L], .m = &f->meta,
                       .scale = 1.0f / sqrtf((float)d), .out = &o3, .prep = prep};
    FW_PROF(f, "attn_kernel (in attention)", fw_attention(f, &ac, err), err);
    if (prep) FW_TRY_CHECK(f, &q3, "q_proj + bias + rope", err);
    FW_TRY_CHECK(f, &o, "attention", err);
    ms_tensor delta = fw_view2(&f->delta, T, H);
    MS_TRY(op->linear(b, &l->o_proj, &o, &delta, err));
    FW_TRY_CHECK(f, &delta, "o_proj", err);
    return MS_OK;
}

static size_t kv_bytes_per_token(const ms_config *c, int L, size_t elem, int tp) {
    return 2 * (size_t)(c->num_kv_heads / tp) * (size_t)c->head_dim * elem;
}

static double kv_read_bytes(const ms_config *c, int L, double ctx, double elem) {
    return 2.0 * c->num_kv_heads * c->head_dim * elem * ctx;
}

static double attn_flops(const ms_config *c, int L, double ctx, int prefill_len) {
    return 4.0 * c->num_heads * c->head_dim * ctx;
}

static void attn_params(const ms_config *c, int L, double *split, double *repl, double *plain) {
    const double H = c->hidden_size, q = (double)c->num_heads * c->head_dim, kv = (double)c->num_kv_heads * c->head_dim;
    *split = H * q + 2 * H * kv + q * H + (c->attention_bias ? q + 2 * kv : 0);
    *repl = 0;
    *plain = c->use_qk_norm ? 2.0 * c->head_dim : 0;
}

static void describe(const ms_config *c, FILE *out) {
    fprintf(out, "attention:     GQA, %d heads / %d kv heads, head dim %d (rotary %d), rope theta %g%s%s\n", c->num_heads,
            c->num_kv_heads, c->head_dim, c->rotary_dim, c->rope_theta, c->use_qk_norm ? ", qk-norm" : "",
            c->attention_bias ? ", qkv bias" : "");
}

/* q|k|v of a layer that takes the gqa_prep path, for ms_ld_stack_layers. */
static int qkv_parts(const ms_model *m, ms_layer *l, ms_linear **parts) {
    if (!l->q_proj.w.data || !l->k_proj.w.data || !l->v_proj.w.data || !prep_fusable(&m->cfg, l)) return 0;
    parts[0] = &l->q_proj, parts[1] = &l->k_proj, parts[2] = &l->v_proj;
    return 3;
}

/* q|k|v of every layer stacked into one linear (ms_layer.a_stack) when the backend can stack them and
 * fuses what follows (gqa_prep reads the stacked rows). */
static int fuse_placed(ms_model *m, ms_backend *b, ms_err *err) {
    if (!b->ops->gqa_prep) return MS_OK;
    return ms_ld_stack_layers(m, b, "q|k|v", qkv_parts, err);
}

/* GQA keeps no state between layers: the MTP layer is an ordinary one. */
static void mtp_layer(ms_config *cfg, int L) {
    (void)cfg;
    (void)L;
}

const ms_arch ms_arch_glm4_moe = {
    .name = "glm4_moe",
    .attention_kind = "GQA",
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
