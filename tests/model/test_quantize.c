/* test_quantize.c - `moeserve quantize` round trips checked against an independent
 * re-implementation of the format definitions (spec 4.1, 4.2) written here from the spec text:
 * E4M3 and E2M1 decoded from their bit fields and encoded by exhaustive nearest-value search, not
 * through core/dtype.h. The tool's codes and scales must match bit for bit, dequantized rows
 * (ms_linear_dequant_row) must match the reference dequantization bit for bit, and the errors must
 * stay within the formats' bounds. Also: zero blocks, NaN refusal, exclude lists and the loader's
 * cross-checks on the written declaration, fused-expert input. */
#include "model/model.h"
#include "model/quantize.h"
#include "test.h"
#include "tiny_ckpt.h"

static char *g_root;

/* ---- reference formats ---- */

static double ref_e4m3_val(int code) {
    int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -v : v;
}

static uint8_t ref_e4m3(float x) {
    int sign = signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    if (a >= 448.0) return (uint8_t)(sign | 0x7e);
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c <= 0x7e; c++) {
        double d = fabs(ref_e4m3_val(c) - a);
        if (d < bd || (d == bd && (c & 1) == 0)) { best = c; bd = d; }
    }
    return (uint8_t)(sign | best);
}

static const double ref_e2m1_grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

static uint8_t ref_e2m1(float x) {
    int sign = signbit(x) ? 8 : 0;
    double a = fabs((double)x);
    if (a >= 6.0) return (uint8_t)(sign | 7); /* saturating */
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c < 8; c++) {
        double d = fabs(ref_e2m1_grid[c] - a);
        if (d < bd || (d == bd && (c & 1) == 0)) { best = c; bd = d; }
    }
    return (uint8_t)(sign | best);
}
static float ref_e2m1_val(uint8_t c) { return (float)((c & 8) ? -ref_e2m1_grid[c & 7] : ref_e2m1_grid[c & 7]); }

/* NVFP4 per spec 4.1 (ModelOpt convention). W [N,K] float. */
static void ref_nvfp4(const float *W, int64_t N, int64_t K, uint8_t *codes, uint8_t *scales, float *s2out) {
    float amax = 0;
    for (int64_t i = 0; i < N * K; i++) amax = fabsf(W[i]) > amax ? fabsf(W[i]) : amax;
    float s2 = amax > 0 ? amax / (6.0f * 448.0f) : 1.0f;
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < K / 16; b++) {
            const float *x = W + n * K + b * 16;
            float am = 0;
            for (int j = 0; j < 16; j++) am = fabsf(x[j]) > am ? fabsf(x[j]) : am;
            uint8_t s = ref_e4m3(am / (6.0f * s2));
            scales[n * (K / 16) + b] = s;
            float denom = (float)ref_e4m3_val(s) * s2;
            for (int j = 0; j < 16; j += 2) {
                uint8_t lo = denom > 0 ? ref_e2m1(x[j] / denom) : 0, hi = denom > 0 ? ref_e2m1(x[j + 1] / denom) : 0;
                codes[n * (K / 2) + b * 8 + j / 2] = (uint8_t)(lo | hi << 4);
            }
        }
    *s2out = s2;
}

/* W[n,k] = E2M1(code) * (float(scale) * scale2): the per-block multiplier is formed first, as the
 * kernels do (tensor.c does the same). */
static float ref_nvfp4_deq(const uint8_t *codes, const uint8_t *scales, float s2, int64_t K, int64_t n, int64_t k) {
    uint8_t b = codes[n * (K / 2) + k / 2];
    float bs = (float)ref_e4m3_val(scales[n * (K / 16) + k / 16]) * s2;
    return ref_e2m1_val(k % 2 ? b >> 4 : b & 15) * bs;
}

/* FP8 block per spec 4.2. */
static void ref_fp8(const float *W, int64_t N, int64_t K, uint8_t *codes, float *sc) {
    int64_t nbk = (K + 127) / 128;
    for (int64_t bn = 0; bn < (N + 127) / 128; bn++)
        for (int64_t bk = 0; bk < nbk; bk++) {
            float am = 0;
            for (int64_t n = bn * 128; n < N && n < bn * 128 + 128; n++)
                for (int64_t k = bk * 128; k < K && k < bk * 128 + 128; k++) am = fabsf(W[n * K + k]) > am ? fabsf(W[n * K + k]) : am;
            sc[bn * nbk + bk] = am > 0 ? am / 448.0f : 1.0f;
        }
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) codes[n * K + k] = ref_e4m3(W[n * K + k] / sc[(n / 128) * nbk + k / 128]);
}

/* ---- helpers ---- */

static const char *bin(void) {
    const char *b = getenv("MS_BIN");
    return b && *b ? b : "build/moeserve";
}

static int run_quantize(const char *to, const char *in, const char *out, const char *extra) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' quantize --to %s --in '%s' --out '%s' %s >/dev/null", bin(), to, in, out, extra ? extra : "");
    return system(cmd);
}

/* The original float weights of a generated tensor (F32 tiny checkpoint: exactly tiny_val). */
static float *orig(const char *tensor, int64_t N, int64_t K) {
    float *w = malloc((size_t)(N * K) * sizeof(float));
    for (int64_t i = 0; i < N * K; i++) w[i] = tiny_val(tensor, i, 0, 1.0f / sqrtf((float)K), 0);
    return w;
}

typedef struct qstats { double err2, ref2; int bound_ok, bits_ok, deq_ok; } qstats;

static void check_nvfp4_linear(const ms_linear *W, const char *tensor, qstats *st) {
    const int64_t N = W->n_out, K = W->n_in;
    float *w = orig(tensor, N, K);
    uint8_t *codes = malloc((size_t)(N * K / 2)), *scales = malloc((size_t)(N * K / 16));
    float s2;
    ref_nvfp4(w, N, K, codes, scales, &s2);
    st->bits_ok &= W->fmt == MS_WFMT_NVFP4 && W->scale2 == s2 && memcmp(W->w.data, codes, (size_t)(N * K / 2)) == 0 &&
                   memcmp(W->scale.data, scales, (size_t)(N * K / 16)) == 0;
    float *row = malloc((size_t)K * sizeof(float));
    for (int64_t n = 0; n < N; n++) {
        ms_linear_dequant_row(W, n, row);
        for (int64_t k = 0; k < K; k++) {
            float want = ref_nvfp4_deq(codes, scales, s2, K, n, k);
            if (memcmp(&row[k], &want, 4)) st->deq_ok = 0;
            double e = (double)row[k] - w[n * K + k];
            st->err2 += e * e;
            st->ref2 += (double)w[n * K + k] * w[n * K + k];
            /* grid gaps are at most 2 (between 4 and 6): error <= 1 step unit of the block */
            double unit = ref_e4m3_val(scales[n * (K / 16) + k / 16]) * s2;
            if (fabs(e) > unit * 1.0 + 1e-12) st->bound_ok = 0;
        }
    }
    free(row);
    free(w);
    free(codes);
    free(scales);
}

static void check_fp8_linear(const ms_linear *W, const char *tensor, qstats *st) {
    const int64_t N = W->n_out, K = W->n_in, nb = ((N + 127) / 128) * ((K + 127) / 128);
    float *w = orig(tensor, N, K);
    uint8_t *codes = malloc((size_t)(N * K));
    float *sc = malloc((size_t)nb * sizeof(float));
    ref_fp8(w, N, K, codes, sc);
    st->bits_ok &= W->fmt == MS_WFMT_FP8 && memcmp(W->w.data, codes, (size_t)(N * K)) == 0 &&
                   memcmp(W->scale.data, sc, (size_t)nb * sizeof(float)) == 0;
    float *row = malloc((size_t)K * sizeof(float));
    for (int64_t n = 0; n < N; n++) {
        ms_linear_dequant_row(W, n, row);
        for (int64_t k = 0; k < K; k++) {
            float s = sc[(n / 128) * ((K + 127) / 128) + k / 128];
            float want = (float)ref_e4m3_val(codes[n * K + k]) * s;
            if (memcmp(&row[k], &want, 4)) st->deq_ok = 0;
            double e = (double)row[k] - w[n * K + k];
            st->err2 += e * e;
            st->ref2 += (double)w[n * K + k] * w[n * K + k];
            /* 3 mantissa bits: relative half-step 2^-4 for normals, absolute 2^-10 * s below 2^-6 */
            if (fabs(e) > fabs((double)w[n * K + k]) / 16.0 + ldexp(s, -10) + 1e-12) st->bound_ok = 0;
        }
    }
    free(row);
    free(w);
    free(codes);
    free(sc);
}

static ms_model *load(const char *dir) {
    ms_model *m = NULL;
    ms_err err = {0};
    if (ms_model_load(dir, NULL, &m, &err)) fprintf(stderr, "  load %s: %s\n", dir, err.msg);
    return m;
}

static void test_nvfp4_round_trip(void) {
    char in[1024], out[1024];
    snprintf(in, sizeof in, "%s/src_dsa", g_root);
    snprintf(out, sizeof out, "%s/dsa_nvfp4", g_root);
    tiny_opts o = {.arch = TINY_GLM_MOE_DSA, .mtp = 1};
    CHECK(tiny_write(in, &o) == 0);
    CHECK(run_quantize("nvfp4", in, out, NULL) == 0);
    ms_model *m = load(out);
    CHECK(m != NULL);
    if (!m) return;
    CHECK_STR(m->quant_desc, "nvfp4 (group 16)");
    qstats st = {0, 0, 1, 1, 1};
    char t[256];
    for (int L = 1; L < 3; L++)
        for (int e = 0; e < TINY_E; e++) {
            const char *kinds[3] = {"gate_proj", "up_proj", "down_proj"};
            const ms_linear *ls[3] = {&m->layers[L].experts.gate[e], &m->layers[L].experts.up[e], &m->layers[L].experts.down[e]};
            for (int k = 0; k < 3; k++) {
                snprintf(t, sizeof t, "model.layers.%d.mlp.experts.%d.%s.weight", L, e, kinds[k]);
                check_nvfp4_linear(ls[k], t, &st);
            }
        }
    check_nvfp4_linear(&m->layers[2].sh_down, "model.layers.2.mlp.shared_experts.down_proj.weight", &st);
    check_nvfp4_linear(&m->layers[0].gate_proj, "model.layers.0.mlp.gate_proj.weight", &st);
    CHECK(st.bits_ok);
    CHECK(st.deq_ok);
    CHECK(st.bound_ok);
    double rel = sqrt(st.err2 / st.ref2);
    fprintf(stderr, "  nvfp4 relative RMS error %.4f\n", rel);
    CHECK(rel > 0.02 && rel < 0.15);
    /* policy: attention, indexer, router, embeddings, lm_head and the MTP layer stay as stored */
    CHECK_EQ_INT(m->layers[0].q_a_proj.fmt, MS_WFMT_PLAIN);
    CHECK_EQ_INT(m->layers[0].idx_wk.fmt, MS_WFMT_PLAIN);
    CHECK_EQ_INT(m->layers[1].router.fmt, MS_WFMT_PLAIN);
    CHECK_EQ_INT(m->lm_head.fmt, MS_WFMT_PLAIN);
    CHECK(m->stats.n_mtp_tensors_skipped > 0);
    CHECK(m->layers[1].experts.gate[0].input_scale == (float)(1.0 / 448.0));
    ms_model_free(m);
    /* the written declaration */
    ms_quant_decl q;
    ms_err err = {0};
    CHECK(ms_quant_decl_load(out, &q, &err) == 0);
    CHECK_EQ_INT(q.algo, MS_QUANT_NVFP4);
    CHECK_STR(q.source, "hf_quant_config.json");
    CHECK(ms_quant_excluded(&q, "model.layers.0.self_attn.q_a_proj", NULL));
    CHECK(ms_quant_excluded(&q, "model.layers.3.mlp.experts.0.up_proj", NULL)); /* MTP */
    CHECK(!ms_quant_excluded(&q, "model.layers.1.mlp.experts.0.up_proj", NULL));
    ms_quant_decl_free(&q);
    char p[1100];
    snprintf(p, sizeof p, "%s/config.json", out);
    json_t *c = json_load_file(p, 0, NULL);
    json_t *qc = json_object_get(c, "quantization_config");
    CHECK_STR(json_string_value(json_object_get(qc, "quant_method")), "modelopt");
    CHECK_STR(json_string_value(json_object_get(qc, "quant_algo")), "NVFP4");
    CHECK(json_is_array(json_object_get(qc, "ignore")));
    json_decref(c);
    /* scalars are 0-dim F32 as ModelOpt writes them */
    ms_st_set *s = NULL;
    CHECK(ms_st_open(out, &s, &err) == 0);
    const ms_st_tensor *ts = s ? ms_st_find(s, "model.layers.1.mlp.experts.3.up_proj.weight_scale_2") : NULL;
    CHECK(ts && ts->ndim == 0 && ts->dtype == MS_F32);
    ts = s ? ms_st_find(s, "model.layers.1.mlp.experts.3.up_proj.input_scale") : NULL;
    CHECK(ts && ts->ndim == 0 && ts->dtype == MS_F32);
    ts = s ? ms_st_find(s, "model.layers.1.mlp.experts.3.up_proj.weight_scale") : NULL;
    CHECK(ts && ts->dtype == MS_F8E4M3 && ts->shape[0] == TINY_MI && ts->shape[1] == TINY_H / 16);
    ms_st_close(s);
}

static void test_fp8_round_trip(void) {
    char in[1024], out[1024];
    snprintf(in, sizeof in, "%s/src_glm4", g_root);
    snprintf(out, sizeof out, "%s/glm4_fp8", g_root);
    tiny_opts o = {0};
    CHECK(tiny_write(in, &o) == 0);
    CHECK(run_quantize("fp8", in, out, NULL) == 0);
    ms_model *m = load(out);
    CHECK(m != NULL);
    if (!m) return;
    CHECK_STR(m->quant_desc, "fp8 (block 128)");
    qstats st = {0, 0, 1, 1, 1};
    char t[256];
    for (int e = 0; e < TINY_E; e++) {
        snprintf(t, sizeof t, "model.layers.2.mlp.experts.%d.down_proj.weight", e);
        check_fp8_linear(&m->layers[2].experts.down[e], t, &st);
    }
    check_fp8_linear(&m->layers[0].q_proj, "model.layers.0.self_attn.q_proj.weight", &st);
    check_fp8_linear(&m->layers[0].o_proj, "model.layers.0.self_attn.o_proj.weight", &st);
    check_fp8_linear(&m->layers[0].down_proj, "model.layers.0.mlp.down_proj.weight", &st);
    check_fp8_linear(&m->layers[1].sh_gate, "model.layers.1.mlp.shared_experts.gate_proj.weight", &st);
    CHECK(st.bits_ok);
    CHECK(st.deq_ok);
    CHECK(st.bound_ok);
    double rel = sqrt(st.err2 / st.ref2);
    fprintf(stderr, "  fp8 relative RMS error %.4f\n", rel);
    CHECK(rel > 0.005 && rel < 0.05);
    CHECK(m->layers[0].q_proj.bias.data != NULL); /* bias passes through */
    CHECK_EQ_INT(m->layers[1].router.fmt, MS_WFMT_PLAIN);
    ms_model_free(m);
    ms_quant_decl q;
    ms_err err = {0};
    CHECK(ms_quant_decl_load(out, &q, &err) == 0 && q.algo == MS_QUANT_FP8_BLOCK && q.block_n == 128);
    ms_quant_decl_free(&q);
}

static void test_excludes_and_cross_checks(void) {
    char in[1024], out[1024], p[1100];
    snprintf(in, sizeof in, "%s/src_fused", g_root);
    snprintf(out, sizeof out, "%s/fused_nvfp4", g_root);
    tiny_opts o = {.fused_experts = 1, .dtype = MS_BF16};
    CHECK(tiny_write(in, &o) == 0);
    CHECK(run_quantize("nvfp4", in, out, "--exclude '*shared_experts*' --exclude model.layers.0.mlp.down_proj") == 0);
    ms_model *m = load(out);
    CHECK(m != NULL);
    if (m) {
        CHECK_EQ_INT(m->layers[1].experts.gate[7].fmt, MS_WFMT_NVFP4); /* fused input -> per-expert output */
        CHECK_STR(m->layers[1].experts.gate[7].name, "model.layers.1.mlp.experts.7.gate_proj");
        CHECK_EQ_INT(m->layers[1].sh_up.fmt, MS_WFMT_PLAIN);
        CHECK_EQ_INT(m->layers[0].down_proj.fmt, MS_WFMT_PLAIN);
        CHECK_EQ_INT(m->layers[0].up_proj.fmt, MS_WFMT_NVFP4);
        /* expert 7's gate is rows [14I, 15I) of the fused tensor (bf16 source) */
        float *w = malloc(TINY_MI * TINY_H * sizeof(float));
        for (int64_t i = 0; i < TINY_MI * TINY_H; i++)
            w[i] = ms_bf16_to_f32(ms_f32_to_bf16(tiny_val("model.layers.1.mlp.experts.gate_up_proj", 7 * 2 * TINY_MI * TINY_H + i, 0,
                                                          1.0f / sqrtf(TINY_H), 0)));
        uint8_t codes[TINY_MI * TINY_H / 2], scales[TINY_MI * TINY_H / 16];
        float s2;
        ref_nvfp4(w, TINY_MI, TINY_H, codes, scales, &s2);
        CHECK(memcmp(m->layers[1].experts.gate[7].w.data, codes, sizeof codes) == 0);
        CHECK(m->layers[1].experts.gate[7].scale2 == s2);
        free(w);
    }
    ms_model_free(m);
    /* declaration edited so it no longer excludes the bf16 shared experts -> load fails naming one */
    snprintf(p, sizeof p, "%s/hf_quant_config.json", out);
    json_t *h = json_load_file(p, 0, NULL);
    json_t *ex = json_object_get(json_object_get(h, "quantization"), "exclude_modules");
    json_t *keep = json_array();
    for (size_t i = 0; i < json_array_size(ex); i++)
        if (strcmp(json_string_value(json_array_get(ex, i)), "*shared_experts*")) json_array_append(keep, json_array_get(ex, i));
    json_object_set_new(json_object_get(h, "quantization"), "exclude_modules", keep);
    json_dump_file(h, p, 0);
    ms_model *m2 = NULL;
    ms_err err = {0};
    CHECK(ms_model_load(out, NULL, &m2, &err) != 0);
    CHECK_MSG(strstr(err.msg, "shared_experts") && strstr(err.msg, "no scale tensors"), "%s", err.msg);
    /* ... and one that excludes quantized experts -> fails naming the module and pattern */
    json_array_append_new(keep, json_string("*shared_experts*"));
    json_array_append_new(keep, json_string("model.layers.2.mlp.experts.5.*"));
    json_dump_file(h, p, 0);
    json_decref(h);
    CHECK(ms_model_load(out, NULL, &m2, &err) != 0);
    CHECK_MSG(strstr(err.msg, "model.layers.2.mlp.experts.5.") && strstr(err.msg, "exclude pattern"), "%s", err.msg);
    /* already quantized input and bad flags are refused */
    snprintf(p, sizeof p, "%s/again", g_root);
    CHECK(run_quantize("fp8", out, p, "2>/dev/null") != 0);
    CHECK(run_quantize("int4", in, p, "2>/dev/null") != 0);
    /* a user exclude uses the loader's matching (substring too): all experts of layer 1 stay bf16 */
    CHECK(run_quantize("fp8", in, p, "--exclude model.layers.1.mlp.experts") == 0);
    ms_model *m3 = load(p);
    CHECK(m3 && m3->layers[1].experts.up[1].fmt == MS_WFMT_PLAIN && m3->layers[2].experts.up[1].fmt == MS_WFMT_FP8);
    CHECK(m3 && m3->layers[1].sh_up.fmt == MS_WFMT_FP8);
    ms_model_free(m3);
}

static void test_direct_api(void) {
    enum { N = 130, K = 160 };
    static float w[N * K];
    for (int i = 0; i < N * K; i++) w[i] = tiny_val("direct", i, 1, 0.05f, 0);
    for (int k = 0; k < 16; k++) w[5 * K + 32 + k] = 0; /* one zero NVFP4 block */
    for (int n = 0; n < N; n++) w[n * K + 3] *= 1e-12f;  /* tiny values */
    for (int n = 128; n < N; n++)
        for (int k = 128; k < K; k++) w[n * K + k] = 0; /* one zero FP8 block */
    static uint8_t c1[N * K / 2], s1[N * K / 16], c2[N * K / 2], s2b[N * K / 16], f1[N * K], f2[N * K];
    static float sc1[2 * 2], sc2[2 * 2];
    float g1, g2;
    ms_err err = {0};
    CHECK(ms_quantize_nvfp4(MS_F32, w, N, K, c1, s1, &g1, "direct", &err) == 0);
    ref_nvfp4(w, N, K, c2, s2b, &g2);
    CHECK(g1 == g2 && memcmp(c1, c2, sizeof c1) == 0 && memcmp(s1, s2b, sizeof s1) == 0);
    CHECK(s1[5 * (K / 16) + 2] == 0); /* zero block: scale 0, codes 0 */
    CHECK(c1[5 * (K / 2) + 16] == 0);
    CHECK(ms_quantize_fp8_block(MS_F32, w, N, K, f1, sc1, "direct", &err) == 0);
    ref_fp8(w, N, K, f2, sc2);
    CHECK(memcmp(f1, f2, sizeof f1) == 0 && memcmp(sc1, sc2, sizeof sc1) == 0);
    CHECK(sc1[3] == 1.0f);
    /* all-zero tensor */
    static float z[16 * 16];
    CHECK(ms_quantize_nvfp4(MS_F32, z, 16, 16, c1, s1, &g1, "zero", &err) == 0 && g1 == 1.0f && c1[0] == 0 && s1[0] == 0);
    /* NaN is refused naming the tensor; K not a multiple of 16 too */
    w[77] = NAN;
    CHECK(ms_quantize_nvfp4(MS_F32, w, N, K, c1, s1, &g1, "nan-tensor", &err) != 0 && strstr(err.msg, "nan-tensor"));
    CHECK(ms_quantize_fp8_block(MS_F32, w, N, K, f1, sc1, "nan-tensor", &err) != 0);
    CHECK(ms_quantize_nvfp4(MS_F32, w, 8, 24, c1, s1, &g1, "k24", &err) != 0 && strstr(err.msg, "16"));
    /* the reference encoders agree with core/dtype.h on every bf16 value (sanity of both) */
    int agree = 1;
    for (uint32_t h = 0; h < 65536; h += 7) {
        float f = ms_bf16_to_f32((uint16_t)h);
        if (!isfinite(f)) continue;
        if (ref_e4m3(f) != ms_f32_to_e4m3(f) || ref_e2m1(f) != ms_f32_to_e2m1(f)) {
            if (agree) fprintf(stderr, "  %g: e4m3 ref %02x core %02x, e2m1 ref %x core %x\n", f, ref_e4m3(f), ms_f32_to_e4m3(f),
                               ref_e2m1(f), ms_f32_to_e2m1(f));
            agree = 0;
        }
    }
    CHECK(agree);
    /* the fast encoder equals core's on every code midpoint (+-1 ulp) and on random floats */
    int fast_ok = 1;
    for (int c = 0; c < 0x7f; c++) {
        float mid = (float)((ref_e4m3_val(c) + ref_e4m3_val(c + 1)) / 2);
        for (int d = -1; d <= 1; d++) {
            uint32_t u;
            memcpy(&u, &mid, 4);
            u += (uint32_t)d;
            float f;
            memcpy(&f, &u, 4);
            fast_ok &= ms_quant_f32_to_e4m3(f) == ms_f32_to_e4m3(f) && ms_quant_f32_to_e4m3(-f) == ms_f32_to_e4m3(-f);
        }
    }
    uint64_t lcg = 12345;
    for (int i = 0; i < 200000; i++) {
        lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(lcg >> 32);
        float f;
        memcpy(&f, &u, 4);
        if (!isfinite(f)) continue;
        fast_ok &= ms_quant_f32_to_e4m3(f) == ms_f32_to_e4m3(f);
        float g = f * 1e-30f; /* bring into the interesting range */
        fast_ok &= ms_quant_f32_to_e4m3(g) == ms_f32_to_e4m3(g);
    }
    fast_ok &= ms_quant_f32_to_e4m3(448.0f) == 0x7e && ms_quant_f32_to_e4m3(1e30f) == 0x7e && ms_quant_f32_to_e4m3(-0.0f) == 0x80;
    CHECK(fast_ok);
}

/* tests/fixtures/<arch>_{nvfp4,fp8} were quantized by tools/make_fixtures.py (torch, written from the
 * spec independently of this code): quantizing the bf16 fixture must give the same file contents. */
static void test_matches_torch_fixtures(void) {
    const char *archs[] = {"glm4_moe", "glm_moe_dsa"}, *fmts[] = {"nvfp4", "fp8"};
    for (int a = 0; a < 2; a++)
        for (int f = 0; f < 2; f++) {
            char in[256], ref[256], out[1024];
            snprintf(in, sizeof in, "tests/fixtures/%s", archs[a]);
            snprintf(ref, sizeof ref, "tests/fixtures/%s_%s", archs[a], fmts[f]);
            snprintf(out, sizeof out, "%s/fx_%s_%s", g_root, archs[a], fmts[f]);
            CHECK_MSG(run_quantize(fmts[f], in, out, NULL) == 0, "quantize %s", in);
            ms_st_set *x = NULL, *y = NULL;
            ms_err err = {0};
            CHECK_MSG(ms_st_open(out, &x, &err) == 0, "%s", err.msg);
            CHECK_MSG(ms_st_open(ref, &y, &err) == 0, "%s", err.msg);
            if (x && y) {
                CHECK_EQ_INT(ms_st_count(x), ms_st_count(y));
                int same = 0, n = ms_st_count(y);
                for (int i = 0; i < n; i++) {
                    const ms_st_tensor *t = ms_st_at(y, i), *u = ms_st_find(x, t->name);
                    int ok = u && u->dtype == t->dtype && u->ndim == t->ndim && u->nbytes == t->nbytes &&
                             !memcmp(u->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) && !memcmp(u->data, t->data, t->nbytes);
                    if (!ok) fprintf(stderr, "  %s %s: tensor %s differs\n", archs[a], fmts[f], t->name);
                    same += ok;
                }
                CHECK_EQ_INT(same, n);
            }
            ms_st_close(x);
            ms_st_close(y);
            ms_model *m = load(out); /* and our output loads */
            CHECK(m != NULL);
            ms_model_free(m);
        }
}

int main(void) {
    g_root = tiny_tmpdir("quant");
    if (!g_root) return 1;
    ms_dtype_init();
    RUN(test_direct_api);
    RUN(test_nvfp4_round_trip);
    RUN(test_fp8_round_trip);
    RUN(test_excludes_and_cross_checks);
    RUN(test_matches_torch_fixtures);
    tiny_rmrf(g_root);
    free(g_root);
    return TEST_SUMMARY();
}
