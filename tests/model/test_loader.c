/* test_loader.c - ms_model_load on generated tiny checkpoints: views hold exactly the stored
 * values, both architectures, fused and per-expert names, tied embeddings, shards, MTP skipping,
 * overrides, quantization cross-checks, dummy weights, placement. */
#include "model/model.h"
#include "model/safetensors.h"
#include "test.h"
#include "tiny_ckpt.h"

static char *g_root;

static char *mkcase(const char *name, const tiny_opts *o) {
    static char buf[8][1024];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 1024, "%s/%s", g_root, name);
    if (tiny_write(p, o) != 0) return NULL;
    return p;
}

/* Element i of a linear's row r equals the value the generator wrote. */
static int linear_matches(const ms_linear *W, const char *tensor, int64_t rows_off, ms_dtype dt) {
    float *row = malloc((size_t)W->n_in * sizeof(float));
    int ok = 1;
    for (int64_t r = 0; r < W->n_out && ok; r += (W->n_out > 7 ? W->n_out / 7 : 1)) {
        ms_linear_dequant_row(W, r, row);
        for (int64_t k = 0; k < W->n_in; k++) {
            float want = tiny_val(tensor, (rows_off + r) * W->n_in + k, 0, 1.0f / sqrtf((float)W->n_in), 0);
            if (dt == MS_BF16) want = ms_bf16_to_f32(ms_f32_to_bf16(want));
            if (row[k] != want) { ok = 0; break; }
        }
    }
    free(row);
    return ok;
}

static void test_glm4_f32(void) {
    tiny_opts o = {0};
    char *dir = mkcase("glm4", &o);
    CHECK(dir);
    ms_model *m = NULL;
    ms_err err = {0};
    int rc = ms_model_load(dir, NULL, &m, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    CHECK(m->cfg.arch == &ms_arch_glm4_moe);
    CHECK_EQ_INT(m->cfg.num_layers, 3);
    CHECK(!m->layers[0].is_moe && m->layers[1].is_moe && m->layers[2].is_moe);
    CHECK_EQ_INT(m->layers[1].experts.n, TINY_E);
    CHECK(linear_matches(&m->layers[0].q_proj, "model.layers.0.self_attn.q_proj.weight", 0, MS_F32));
    CHECK(linear_matches(&m->layers[2].experts.down[5], "model.layers.2.mlp.experts.5.down_proj.weight", 0, MS_F32));
    CHECK(linear_matches(&m->lm_head, "lm_head.weight", 0, MS_F32));
    CHECK(m->layers[0].q_proj.bias.data != NULL);
    CHECK(m->layers[0].q_norm.data != NULL && m->layers[0].q_norm.shape[0] == TINY_HD);
    CHECK_EQ_INT(m->layers[1].router_bias.dtype, MS_F32);
    CHECK_EQ_INT(m->layers[1].router.n_out, TINY_E);
    CHECK(m->layers[1].has_shared && m->layers[1].sh_down.n_out == TINY_H);
    CHECK_STR(m->layers[2].experts.up[3].name, "model.layers.2.mlp.experts.3.up_proj");
    CHECK_STR(m->quant_desc, "f32");
    /* every tensor of the file is used */
    CHECK_EQ_INT(m->stats.n_tensors, ms_st_count(m->st));
    CHECK_EQ_INT(m->stats.n_unexpected_tensors, 0);
    CHECK_EQ_INT((int64_t)m->stats.bytes_total, (int64_t)ms_st_total_bytes(m->st));
    CHECK_EQ_INT(m->stats.linears_by_group[MS_GROUP_EXPERTS][0], 2 * TINY_E * 3);
    ms_model_free(m);
}

static void test_dsa_bf16_sharded_mtp(void) {
    tiny_opts o = {.arch = TINY_GLM_MOE_DSA, .dtype = MS_BF16, .sharded = 1, .mtp = 1, .v5_keys = 1};
    char *dir = mkcase("dsa", &o);
    ms_model *m = NULL;
    ms_err err = {0};
    int rc = ms_model_load(dir, NULL, &m, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    CHECK(m->cfg.arch == &ms_arch_glm_moe_dsa);
    CHECK_EQ_INT(m->cfg.head_dim, TINY_DN + TINY_DR); /* config's head_dim (8) ignored */
    CHECK(m->layers[0].has_indexer && !m->layers[1].has_indexer && m->layers[2].has_indexer);
    CHECK(m->layers[1].idx_wk.w.data == NULL);
    CHECK_EQ_INT(m->layers[0].kv_b_proj.n_out, TINY_NH * (TINY_DN + TINY_DV));
    CHECK(linear_matches(&m->layers[0].kv_b_proj, "model.layers.0.self_attn.kv_b_proj.weight", 0, MS_BF16));
    CHECK(linear_matches(&m->layers[2].idx_wq_b, "model.layers.2.self_attn.indexer.wq_b.weight", 0, MS_BF16));
    CHECK(m->stats.n_mtp_tensors_skipped > 10);
    CHECK_EQ_INT(m->stats.n_unexpected_tensors, 0);
    CHECK_EQ_INT(m->stats.n_tensors + m->stats.n_mtp_tensors_skipped, ms_st_count(m->st));
    CHECK_STR(m->quant_desc, "bf16");
    ms_model_free(m);
}

static void test_fused_tied_override(void) {
    tiny_opts o = {.fused_experts = 1, .tie = 1, .bf16_router_bias = 1};
    char *dir = mkcase("fused", &o);
    ms_model *m = NULL;
    ms_err err = {0};
    const char *ov[] = {"num_hidden_layers=2"};
    ms_load_opts lo = {.overrides = ov, .n_overrides = 1};
    int rc = ms_model_load(dir, &lo, &m, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    CHECK_EQ_INT(m->cfg.num_layers, 2);
    CHECK_EQ_INT(m->cfg.num_layers_ckpt, 3);
    CHECK(m->stats.n_layer_tensors_skipped > 0);
    CHECK_EQ_INT(m->stats.n_mtp_tensors_skipped, 0);
    CHECK(m->tied_lm_head && m->lm_head.w.data == m->embed.data);
    /* expert e gate = rows [2eI, 2eI+I) of gate_up, up = the next I rows, down = slice e */
    const ms_experts *e = &m->layers[1].experts;
    int ok = 1;
    float row[TINY_H], row2[TINY_MI];
    for (int x = 0; x < TINY_E && ok; x++)
        for (int r = 0; r < TINY_MI && ok; r++) {
            ms_linear_dequant_row(&e->gate[x], r, row);
            ok &= row[3] == tiny_val("model.layers.1.mlp.experts.gate_up_proj", ((int64_t)x * 2 * TINY_MI + r) * TINY_H + 3, 0,
                                     1.0f / sqrtf(TINY_H), 0);
            ms_linear_dequant_row(&e->up[x], r, row);
            ok &= row[5] == tiny_val("model.layers.1.mlp.experts.gate_up_proj",
                                     ((int64_t)x * 2 * TINY_MI + TINY_MI + r) * TINY_H + 5, 0, 1.0f / sqrtf(TINY_H), 0);
        }
    ms_linear_dequant_row(&e->down[6], 7, row2);
    ok &= row2[9] == tiny_val("model.layers.1.mlp.experts.down_proj", ((int64_t)6 * TINY_H + 7) * TINY_MI + 9, 0,
                              1.0f / sqrtf(TINY_MI), 0);
    CHECK(ok);
    /* BF16 router bias converted to F32 */
    CHECK_EQ_INT(m->layers[1].router_bias.dtype, MS_F32);
    CHECK(((float *)m->layers[1].router_bias.data)[2] ==
          ms_bf16_to_f32(ms_f32_to_bf16(tiny_val("model.layers.1.mlp.gate.e_score_correction_bias", 2, 0, 0.1f, 0))));
    ms_model_free(m);
}

static void test_unexpected_tensor_warns(void) {
    tiny_opts o = {.extra = "model.something_new.weight"};
    char *dir = mkcase("extra", &o);
    ms_model *m = NULL;
    ms_err err = {0};
    int rc = ms_model_load(dir, NULL, &m, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (!rc) CHECK_EQ_INT(m->stats.n_unexpected_tensors, 1);
    ms_model_free(m);
}

static void expect_fail(const char *name, const tiny_opts *o, const char *needle1, const char *needle2) {
    char *dir = mkcase(name, o);
    ms_model *m = NULL;
    ms_err err = {0};
    int rc = ms_model_load(dir, NULL, &m, &err);
    CHECK_MSG(rc != 0, "%s loaded", name);
    CHECK(m == NULL);
    CHECK_MSG(strstr(err.msg, needle1) && (!needle2 || strstr(err.msg, needle2)), "%s: message: %s", name, err.msg);
    CHECK(!strchr(err.msg, '\n'));
}

static void test_missing_and_bad_shape(void) {
    tiny_opts o = {.omit = "model.layers.2.mlp.experts.3.up_proj.weight"};
    expect_fail("missing", &o, "model.layers.2.mlp.experts.3.up_proj.weight", "missing");
    tiny_opts o2 = {.bad_shape = "model.layers.0.self_attn.k_proj.weight"};
    expect_fail("badshape", &o2, "model.layers.0.self_attn.k_proj.weight", "[33, 64]");
    tiny_opts o3 = {.arch = TINY_GLM_MOE_DSA, .omit = "model.layers.2.self_attn.indexer.k_norm.bias"};
    expect_fail("missing_idx", &o3, "indexer.k_norm.bias", "missing");
    tiny_opts o4 = {.tie = 0, .omit = "lm_head.weight"};
    expect_fail("nohead", &o4, "lm_head.weight", NULL);
}

/* A counting fake backend: place/unplace every weight once. */
static int g_pt, g_pl, g_ut, g_ul;
static int f_pt(ms_backend *b, ms_tensor *t, ms_err *e) { (void)b; (void)t; (void)e; g_pt++; return 0; }
static int f_pl(ms_backend *b, ms_linear *W, ms_err *e) { (void)b; (void)W; (void)e; g_pl++; return 0; }
static void f_ut(ms_backend *b, ms_tensor *t) { (void)b; (void)t; g_ut++; }
static void f_ul(ms_backend *b, ms_linear *W) { (void)b; (void)W; g_ul++; }

static void test_place(void) {
    tiny_opts o = {.tie = 1};
    char *dir = mkcase("place", &o);
    ms_model *m = NULL;
    ms_err err = {0};
    CHECK(ms_model_load(dir, NULL, &m, &err) == 0);
    if (!m) return;
    ms_backend_ops ops = {0};
    ops.place_tensor = f_pt;
    ops.place_linear = f_pl;
    ops.unplace_tensor = f_ut;
    ops.unplace_linear = f_ul;
    ms_backend b = {.ops = &ops, .name = "fake"};
    CHECK(ms_model_place(m, &b, &err) == 0);
    int lin = 0;
    for (int g = 0; g < MS_N_GROUPS; g++)
        for (int f = 0; f < 3; f++) lin += m->stats.linears_by_group[g][f];
    CHECK_EQ_INT(g_pl, lin - 1); /* tied lm_head is the embedding, placed once as a tensor */
    /* tensors: embed, final norm, per layer 2 norms + q/k norm, router bias on MoE layers */
    CHECK_EQ_INT(g_pt, 2 + 3 * 4 + 2);
    CHECK(ms_model_place(m, &b, &err) != 0);
    ms_model_free(m);
    CHECK_EQ_INT(g_ut, g_pt);
    CHECK_EQ_INT(g_ul, g_pl);
}

static double dummy_row_var(const ms_linear *W) {
    float *row = malloc((size_t)W->n_in * sizeof(float));
    double s = 0;
    int64_t n = 0;
    for (int64_t r = 0; r < W->n_out; r++) {
        ms_linear_dequant_row(W, r, row);
        for (int64_t k = 0; k < W->n_in; k++) { s += (double)row[k] * row[k]; n++; }
    }
    free(row);
    return s / (double)n;
}

static void test_dummy(void) {
    tiny_opts o = {.arch = TINY_GLM_MOE_DSA};
    char *dir = mkcase("dummycfg", &o);
    const char *fmts[] = {"bf16", "fp8", "nvfp4"};
    for (int f = 0; f < 3; f++) {
        ms_model *m = NULL;
        ms_err err = {0};
        ms_load_opts lo = {.load_format = "dummy", .dummy_quant = fmts[f], .seed = 7};
        int rc = ms_model_load(dir, &lo, &m, &err);
        CHECK_MSG(rc == 0, "%s", err.msg);
        if (rc) continue;
        CHECK(m->st == NULL);
        const ms_linear *W = &m->layers[2].experts.gate[1];
        CHECK_EQ_INT(W->fmt, f);
        double v = dummy_row_var(W) * (double)W->n_in; /* ~1 by construction */
        CHECK_MSG(v > 0.5 && v < 2.0, "%s expert variance*K = %g", fmts[f], v);
        v = dummy_row_var(&m->layers[0].q_a_proj) * TINY_H;
        CHECK_MSG(v > 0.5 && v < 2.0, "attention variance*K = %g", v);
        CHECK_EQ_INT(m->layers[0].q_a_proj.fmt, MS_WFMT_PLAIN);
        CHECK_EQ_INT(m->layers[2].sh_up.fmt, f);
        CHECK_EQ_INT(m->layers[2].router_bias.dtype, MS_F32);
        /* seeded: a second load gives the same bits */
        ms_model *m2 = NULL;
        CHECK(ms_model_load(dir, &lo, &m2, &err) == 0);
        if (m2) CHECK(memcmp(m->layers[2].experts.down[3].w.data, m2->layers[2].experts.down[3].w.data,
                             ms_tensor_nbytes(&m->layers[2].experts.down[3].w)) == 0);
        ms_model_free(m2);
        ms_model_free(m);
    }
    ms_model *m = NULL;
    ms_err err = {0};
    ms_load_opts lo = {.load_format = "dummy", .dummy_quant = "int3"};
    CHECK(ms_model_load(dir, &lo, &m, &err) != 0 && strstr(err.msg, "int3"));
}

/* The transformers-made fixtures (tools/make_fixtures.py) and the demo model load cleanly: every
 * tensor used, the declared formats present. */
static void test_fixtures(void) {
    struct { const char *dir; int fmt; int fused; } fx[] = {
        {"tests/fixtures/glm4_moe", 0, 0},          {"tests/fixtures/glm4_moe_legacy", 0, 1},
        {"tests/fixtures/glm4_moe_fp8", 1, 0},      {"tests/fixtures/glm4_moe_nvfp4", 2, 0},
        {"tests/fixtures/glm_moe_dsa", 0, 0},       {"tests/fixtures/glm_moe_dsa_legacy", 0, 1},
        {"tests/fixtures/glm_moe_dsa_fp8", 1, 0},   {"tests/fixtures/glm_moe_dsa_nvfp4", 2, 0},
        {"models/demo", 0, 0},
    };
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        ms_model *m = NULL;
        ms_err err = {0};
        int rc = ms_model_load(fx[i].dir, NULL, &m, &err);
        CHECK_MSG(rc == 0, "%s: %s", fx[i].dir, err.msg);
        if (rc) continue;
        CHECK_MSG(m->stats.n_tensors + m->stats.n_mtp_tensors_skipped == ms_st_count(m->st), "%s: unused tensors", fx[i].dir);
        CHECK_EQ_INT(m->stats.n_unexpected_tensors, 0);
        int L = 0;
        while (L < m->cfg.num_layers && !m->layers[L].is_moe) L++;
        CHECK(L < m->cfg.num_layers);
        if (L < m->cfg.num_layers) {
            CHECK_EQ_INT(m->layers[L].experts.gate[0].fmt, fx[i].fmt);
            CHECK_EQ_INT(m->layers[L].sh_down.fmt, fx[i].fmt);
            CHECK_EQ_INT(m->layers[L].router_bias.dtype, MS_F32);
            /* fused experts are views into one tensor: consecutive experts' gates are 2I rows apart */
            if (fx[i].fused)
                CHECK((char *)m->layers[L].experts.gate[1].w.data - (char *)m->layers[L].experts.gate[0].w.data ==
                      (ptrdiff_t)(2 * m->cfg.moe_intermediate_size * m->cfg.hidden_size * ms_dtype_size(m->layers[L].experts.gate[0].w.dtype)));
        }
        if (fx[i].fmt == 2) CHECK_EQ_INT(m->layers[0].o_proj.fmt, MS_WFMT_PLAIN); /* attention stays bf16 */
        if (fx[i].fmt == 1) CHECK_EQ_INT(m->layers[0].o_proj.fmt, MS_WFMT_FP8);
        ms_model_free(m);
    }
}

int main(void) {
    g_root = tiny_tmpdir("loader");
    if (!g_root) { fprintf(stderr, "no temp dir\n"); return 1; }
    RUN(test_glm4_f32);
    RUN(test_dsa_bf16_sharded_mtp);
    RUN(test_fused_tied_override);
    RUN(test_unexpected_tensor_warns);
    RUN(test_missing_and_bad_shape);
    RUN(test_place);
    RUN(test_dummy);
    RUN(test_fixtures);
    tiny_rmrf(g_root);
    free(g_root);
    return TEST_SUMMARY();
}
