/* test_config.c - config.json parsing: legacy and transformers-5 spellings give identical
 * ms_config, the shipped GLM configs carry the spec's values, layer-type rules, overrides,
 * generation_config eos, rejected values, and the quantization declaration + exclude matching. */
#include "model/config.h"
#include "test.h"
#include "tiny_ckpt.h"

static char *g_root;

static void test_legacy_equals_v5(void) {
    for (int arch = 1; arch <= 2; arch++) {
        tiny_opts a = {.arch = arch}, b = {.arch = arch, .v5_keys = 1};
        char *ja = tiny_config_json(&a), *jb = tiny_config_json(&b);
        ms_config ca, cb;
        ms_err err = {0};
        CHECK_MSG(ms_config_parse(ja, "legacy.json", &ca, &err) == 0, "%s", err.msg);
        CHECK_MSG(ms_config_parse(jb, "v5.json", &cb, &err) == 0, "%s", err.msg);
        CHECK(memcmp(&ca, &cb, sizeof ca) == 0);
        CHECK(ca.rope_theta == 1e6);
        if (arch == TINY_GLM4_MOE) CHECK_EQ_INT(ca.rotary_dim, TINY_HD / 2);
        free(ja);
        free(jb);
    }
}

static void test_shipped_configs(void) {
    ms_config c;
    ms_err err = {0};
    CHECK_MSG(ms_config_load("configs/glm-5.json", &c, &err) == 0, "%s", err.msg);
    CHECK(c.arch == &ms_arch_glm_moe_dsa);
    CHECK_EQ_INT(c.num_layers, 78);
    CHECK_EQ_INT(c.head_dim, 256); /* config says 64; derived from qk dims */
    CHECK_EQ_INT(c.rotary_dim, 64);
    CHECK(c.rope_interleave && c.indexer_rope_interleave);
    CHECK(!c.layer_is_moe[2] && c.layer_is_moe[3] && c.layer_is_moe[77]);
    int full = 0;
    for (int i = 0; i < 78; i++) full += c.indexer_full[i];
    CHECK_EQ_INT(full, 78);
    CHECK_EQ_INT(c.n_eos, 3);
    CHECK_EQ_INT(c.eos_token_ids[2], 154829);
    CHECK_CLOSE(c.routed_scaling_factor, 2.5, 0);
    CHECK_EQ_INT(c.num_nextn_predict_layers, 1);
    CHECK(c.rope_theta == 1e6);
    CHECK_STR(c.torch_dtype, "bfloat16");
    CHECK_MSG(ms_config_load("configs/glm-4.5-air.json", &c, &err) == 0, "%s", err.msg);
    CHECK(c.arch == &ms_arch_glm4_moe);
    CHECK_EQ_INT(c.num_layers, 46);
    CHECK_EQ_INT(c.head_dim, 128);
    CHECK_EQ_INT(c.rotary_dim, 64);
    CHECK_EQ_INT(c.num_kv_heads, 8);
    CHECK(!c.use_qk_norm && c.attention_bias);
    CHECK(!c.layer_is_moe[0] && c.layer_is_moe[1] && c.layer_is_moe[45]);
    CHECK_EQ_INT(c.n_routed_experts, 128);
    CHECK_EQ_INT(c.moe_intermediate_size, 1408);
    CHECK_EQ_INT(c.intermediate_size, 10944);
}

static int parse_with(const char *base_json, const char *key, const char *raw, ms_config *c, ms_err *err) {
    json_t *r = json_loads(base_json, 0, NULL);
    json_t *v = raw ? json_loads(raw, JSON_DECODE_ANY, NULL) : NULL;
    if (raw) json_object_set_new(r, key, v);
    else json_object_del(r, key);
    char *s = json_dumps(r, 0);
    json_decref(r);
    int rc = ms_config_parse(s, "t.json", c, err);
    free(s);
    return rc;
}

static void test_layer_rules(void) {
    tiny_opts o = {.arch = TINY_GLM_MOE_DSA, .n_layers = 78};
    char *j = tiny_config_json(&o);
    json_t *r = json_loads(j, 0, NULL);
    free(j);
    json_object_del(r, "indexer_types");
    json_object_set_new(r, "index_topk_freq", json_integer(4));
    json_object_set_new(r, "index_skip_topk_offset", json_integer(3));
    json_object_set_new(r, "mlp_layer_types", json_null());
    j = json_dumps(r, 0);
    ms_config c;
    ms_err err = {0};
    CHECK_MSG(ms_config_parse(j, "t.json", &c, &err) == 0, "%s", err.msg);
    /* GLM-5.2 rule: full layers {0,1,2,6,10,...,74} = 21 layers */
    int full = 0, ok = 1;
    for (int i = 0; i < 78; i++) {
        full += c.indexer_full[i];
        int want = i <= 2 || (i >= 6 && (i - 6) % 4 == 0);
        ok &= c.indexer_full[i] == want;
    }
    CHECK(ok);
    CHECK_EQ_INT(full, 21);
    free(j);
    /* mlp_layer_types wins over first_k_dense_replace */
    json_t *m = json_array();
    for (int i = 0; i < 78; i++) json_array_append_new(m, json_string(i % 2 ? "sparse" : "dense"));
    json_object_set_new(r, "mlp_layer_types", m);
    j = json_dumps(r, 0);
    CHECK(ms_config_parse(j, "t.json", &c, &err) == 0);
    CHECK(!c.layer_is_moe[0] && c.layer_is_moe[1] && !c.layer_is_moe[2] && c.layer_is_moe[77]);
    free(j);
    /* moe_layer_freq */
    json_object_del(r, "mlp_layer_types");
    json_object_set_new(r, "moe_layer_freq", json_integer(2));
    json_object_set_new(r, "first_k_dense_replace", json_integer(1));
    j = json_dumps(r, 0);
    CHECK(ms_config_parse(j, "t.json", &c, &err) == 0);
    CHECK(!c.layer_is_moe[0] && !c.layer_is_moe[1] && c.layer_is_moe[2] && !c.layer_is_moe[3] && c.layer_is_moe[4]);
    free(j);
    json_decref(r);
}

static void test_rejections(void) {
    tiny_opts o = {.arch = TINY_GLM_MOE_DSA};
    char *j = tiny_config_json(&o);
    ms_config c;
    ms_err err = {0};
    struct { const char *key, *raw, *needle; } cases[] = {
        {"model_type", "\"llama\"", "glm4_moe, glm_moe_dsa"},
        {"model_type", NULL, "model_type"},
        {"hidden_size", "0", "hidden_size"},
        {"hidden_size", "-5", "hidden_size"},
        {"hidden_size", "\"64\"", "hidden_size"},
        {"hidden_size", "64.5", "hidden_size"},
        {"rms_norm_eps", "-1e-6", "rms_norm_eps"},
        {"rms_norm_eps", "0", "rms_norm_eps"},
        {"routed_scaling_factor", "0", "routed_scaling_factor"},
        {"num_experts_per_tok", "9", "num_experts_per_tok"},
        {"n_group", "3", "n_group"},
        {"topk_group", "3", "topk_group"},
        {"index_head_dim", "4", "index_head_dim"},
        {"qk_rope_head_dim", "7", "qk_rope_head_dim"},
        {"q_lora_rank", "null", "q_lora_rank"},
        {"indexer_types", "[\"shared\", \"full\", \"full\"]", "indexer_types"},
        {"indexer_types", "[\"full\"]", "indexer_types"},
        {"indexer_types", "[\"full\", \"half\", \"full\"]", "indexer_types"},
        {"mlp_layer_types", "[\"dense\", \"moe\", \"dense\"]", "mlp_layer_types"},
        {"rope_parameters", "{\"rope_theta\": 10000, \"rope_type\": \"yarn\"}", "rope_type"},
        {"rope_scaling", "{\"type\": \"linear\", \"factor\": 2}", "rope_scaling"},
        {"eos_token_id", "[1, -2]", "eos_token_id"},
        {"eos_token_id", "\"</s>\"", "eos_token_id"},
        {"num_hidden_layers", "300", "num_hidden_layers"},
        {"qk_head_dim", "99", "qk_head_dim"},
        {"tie_word_embeddings", "1", "tie_word_embeddings"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(&err, 0, sizeof err);
        int rc = parse_with(j, cases[i].key, cases[i].raw, &c, &err);
        CHECK_MSG(rc != 0, "%s=%s accepted", cases[i].key, cases[i].raw ? cases[i].raw : "(absent)");
        CHECK_MSG(strstr(err.msg, "t.json") && strstr(err.msg, cases[i].needle), "%s: %s", cases[i].key, err.msg);
    }
    /* glm4_moe specific */
    tiny_opts g = {0};
    char *jg = tiny_config_json(&g);
    CHECK(parse_with(jg, "num_key_value_heads", "3", &c, &err) != 0 && strstr(err.msg, "num_key_value_heads"));
    CHECK(parse_with(jg, "partial_rotary_factor", "0.3", &c, &err) != 0 && strstr(err.msg, "partial_rotary_factor"));
    CHECK(parse_with(jg, "partial_rotary_factor", NULL, &c, &err) == 0 && c.rotary_dim == TINY_HD / 2); /* default 0.5 */
    CHECK(parse_with(jg, "eos_token_id", "7", &c, &err) == 0 && c.n_eos == 1 && c.eos_token_ids[0] == 7);
    CHECK(parse_with(jg, "bos_token_id", "null", &c, &err) == 0 && c.bos_token_id == -1);
    CHECK(ms_config_parse("{\"model_type\": \"glm4_moe\", \"hidden_size\": NaN}", "n.json", &c, &err) != 0 &&
          strstr(err.msg, "'hidden_size'"));
    free(jg);
    free(j);
}

static void test_overrides_and_generation(void) {
    char d[1024], p[1100];
    snprintf(d, sizeof d, "%s/ov", g_root);
    mkdir(d, 0755);
    tiny_opts o = {.arch = TINY_GLM_MOE_DSA, .v5_keys = 1, .n_layers = 6};
    char *j = tiny_config_json(&o);
    ms_err err = {0};
    snprintf(p, sizeof p, "%s/config.json", d);
    CHECK(ms_write_file(p, j, strlen(j), &err) == 0);
    free(j);
    const char *ov[] = {"num_hidden_layers=2", "rope_theta=50000", "index_topk=16", "routed_scaling_factor=1.5"};
    ms_config c;
    CHECK_MSG(ms_config_load_with_overrides(d, ov, 4, &c, &err) == 0, "%s", err.msg);
    CHECK_EQ_INT(c.num_layers, 2);
    CHECK_EQ_INT(c.num_layers_ckpt, 6);
    CHECK(c.rope_theta == 50000.0); /* reaches rope_parameters too */
    CHECK_EQ_INT(c.index_topk, 16);
    CHECK_CLOSE(c.routed_scaling_factor, 1.5, 0);
    const char *ov2[] = {"rope_parameters.rope_theta=123"};
    CHECK(ms_config_load_with_overrides(p, ov2, 1, &c, &err) == 0 && c.rope_theta == 123.0);
    const char *bad[][1] = {{"num_hidden_layerz=2"}, {"num_hidden_layers"}, {"num_hidden_layers=-1"}, {"hidden_size=abc"}};
    const char *needles[] = {"num_hidden_layerz", "key=value", "num_hidden_layers", "hidden_size"};
    for (int i = 0; i < 4; i++) {
        int rc = ms_config_load_with_overrides(d, bad[i], 1, &c, &err);
        CHECK_MSG(rc != 0 && strstr(err.msg, needles[i]), "override %s: %s", bad[i][0], err.msg);
    }
    /* generation_config.json eos list wins */
    snprintf(p, sizeof p, "%s/generation_config.json", d);
    const char *g = "{\"eos_token_id\": [5, 6, 7], \"temperature\": 1.0}";
    CHECK(ms_write_file(p, g, strlen(g), &err) == 0);
    CHECK(ms_config_load(d, &c, &err) == 0);
    CHECK_EQ_INT(c.n_eos, 3);
    CHECK(c.eos_token_ids[0] == 5 && c.eos_token_ids[2] == 7);
    g = "{\"eos_token_id\": NaN}";
    CHECK(ms_write_file(p, g, strlen(g), &err) == 0);
    CHECK(ms_config_load(d, &c, &err) != 0 && strstr(err.msg, "generation_config.json") && strstr(err.msg, "eos_token_id"));
}

static void test_quant_decl(void) {
    char d[1024], p[1100];
    snprintf(d, sizeof d, "%s/q", g_root);
    mkdir(d, 0755);
    ms_err err = {0};
    ms_quant_decl q;
    CHECK(ms_quant_decl_load(d, &q, &err) == 0 && q.algo == MS_QUANT_NONE);
    snprintf(p, sizeof p, "%s/config.json", d);
    const char *c1 = "{\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"activation_scheme\": \"dynamic\","
                     " \"weight_block_size\": [128, 128], \"modules_to_not_convert\": [\"lm_head\", \"model.layers.0.mlp*\"]}}";
    CHECK(ms_write_file(p, c1, strlen(c1), &err) == 0);
    CHECK_MSG(ms_quant_decl_load(d, &q, &err) == 0, "%s", err.msg);
    CHECK_EQ_INT(q.algo, MS_QUANT_FP8_BLOCK);
    CHECK_EQ_INT(q.n_exclude, 2);
    CHECK(strstr(q.source, "config.json") != NULL);
    const char *pat = NULL;
    CHECK(ms_quant_excluded(&q, "model.layers.0.mlp", &pat) && !strcmp(pat, "model.layers.0.mlp*"));
    CHECK(ms_quant_excluded(&q, "model.layers.0.mlp.down_proj", NULL));
    CHECK(ms_quant_excluded(&q, "lm_head", NULL));
    CHECK(!ms_quant_excluded(&q, "model.layers.1.mlp.down_proj", NULL));
    ms_quant_decl_free(&q);
    const char *c2 = "{\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [64, 64]}}";
    CHECK(ms_write_file(p, c2, strlen(c2), &err) == 0);
    CHECK(ms_quant_decl_load(d, &q, &err) != 0 && strstr(err.msg, "weight_block_size"));
    const char *c3 = "{\"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\", \"group_size\": 16,"
                     " \"ignore\": [\"*self_attn*\"]}}";
    CHECK(ms_write_file(p, c3, strlen(c3), &err) == 0);
    CHECK(ms_quant_decl_load(d, &q, &err) == 0 && q.algo == MS_QUANT_NVFP4 && q.n_exclude == 1);
    CHECK(ms_quant_excluded(&q, "model.layers.3.self_attn.q_a_proj", NULL));
    ms_quant_decl_free(&q);
    /* hf_quant_config.json takes precedence */
    snprintf(p, sizeof p, "%s/hf_quant_config.json", d);
    const char *h = "{\"producer\": {\"name\": \"modelopt\", \"version\": \"0.29\"}, \"quantization\": {\"quant_algo\": \"NVFP4\","
                    " \"group_size\": 16, \"kv_cache_quant_algo\": \"FP8\", \"exclude_modules\": [\"lm_head\", \"model.layers.78*\"]}}";
    CHECK(ms_write_file(p, h, strlen(h), &err) == 0);
    CHECK(ms_quant_decl_load(d, &q, &err) == 0 && q.algo == MS_QUANT_NVFP4);
    CHECK_STR(q.source, "hf_quant_config.json");
    CHECK_STR(q.kv_cache_quant_algo, "FP8");
    CHECK(ms_quant_excluded(&q, "model.layers.78.mlp.experts.3.up_proj", NULL));
    CHECK(ms_quant_excluded(&q, "model.layers.78", NULL));
    ms_quant_decl_free(&q);
    h = "{\"quantization\": {\"quant_algo\": \"NVFP4\", \"group_size\": 32}}";
    CHECK(ms_write_file(p, h, strlen(h), &err) == 0);
    CHECK(ms_quant_decl_load(d, &q, &err) != 0 && strstr(err.msg, "group_size"));
    /* matching rules: exact, substring, glob, trailing name* */
    CHECK(ms_quant_pattern_match("lm_head", "lm_head"));
    CHECK(ms_quant_pattern_match("shared_experts", "model.layers.3.mlp.shared_experts.up_proj"));
    CHECK(ms_quant_pattern_match("model.layers.*.mlp.gate", "model.layers.12.mlp.gate"));
    CHECK(!ms_quant_pattern_match("*mlp.gate", "model.layers.12.mlp.gate_proj"));
    CHECK(ms_quant_pattern_match("model.layers.7*", "model.layers.7.self_attn.o_proj"));
    CHECK(!ms_quant_pattern_match("model.layers.7.*", "model.layers.70.self_attn.o_proj"));
    CHECK(!ms_quant_pattern_match("experts.9.", "model.layers.1.mlp.experts.8.up_proj"));
}

int main(void) {
    g_root = tiny_tmpdir("cfg");
    if (!g_root) return 1;
    RUN(test_legacy_equals_v5);
    RUN(test_shipped_configs);
    RUN(test_layer_rules);
    RUN(test_rejections);
    RUN(test_overrides_and_generation);
    RUN(test_quant_decl);
    tiny_rmrf(g_root);
    free(g_root);
    return TEST_SUMMARY();
}
