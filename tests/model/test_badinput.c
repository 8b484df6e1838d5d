/* test_badinput.c - broken checkpoints must fail to load with one line naming the file and the
 * tensor or field, never crash or read outside the mapping (run under ASan by `make asan`).
 *
 * Each case starts from a valid tiny checkpoint and breaks one thing. `test_badinput --write DIR`
 * writes the cases into DIR and prints "name<TAB>needle<TAB>needle" lines, which
 * tests/model/test_badinput.sh uses to check `moeserve inspect` on the same files. */
#include "model/model.h"
#include "test.h"
#include "tiny_ckpt.h"

#include <fcntl.h>

typedef struct bad_case {
    const char *name;
    const char *needle1, *needle2; /* both must appear in the error */
    void (*make)(const char *dir);
} bad_case;

/* ---- header surgery on DIR/model.safetensors ---- */

static int read_all(const char *p, char **buf, size_t *len) {
    ms_err e = {0};
    return ms_read_file(p, 1 << 28, buf, len, &e);
}

/* Rewrites the header through fn(root), keeping the data section bytes. */
static void edit_header(const char *dir, void (*fn)(json_t *root)) {
    char p[1024], *buf;
    size_t len;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (read_all(p, &buf, &len)) return;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | (uint8_t)buf[i];
    json_t *root = json_loadb(buf + 8, hl, 0, NULL);
    fn(root);
    char *h = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    size_t nl = strlen(h), pad = (8 - nl % 8) % 8, tot = 8 + nl + pad + (len - 8 - hl);
    char *out = malloc(tot);
    uint64_t L = nl + pad;
    for (int i = 0; i < 8; i++) out[i] = (char)(L >> (8 * i));
    memcpy(out + 8, h, nl);
    memset(out + 8 + nl, ' ', pad);
    memcpy(out + 8 + nl + pad, buf + 8 + hl, len - 8 - hl);
    ms_err e = {0};
    ms_write_file(p, out, tot, &e);
    free(h);
    free(out);
    free(buf);
}

static const char *T_K = "model.layers.0.self_attn.k_proj.weight";
static const char *T_V = "model.layers.0.self_attn.v_proj.weight";

static void set_offsets(json_t *root, const char *name, json_int_t b, json_int_t e) {
    json_object_set_new(json_object_get(root, name), "data_offsets", json_pack("[I,I]", b, e));
}
static json_int_t off(json_t *root, const char *name, int i) {
    return json_integer_value(json_array_get(json_object_get(json_object_get(root, name), "data_offsets"), (size_t)i));
}

static void h_outside(json_t *r) { set_offsets(r, T_K, off(r, T_K, 0), off(r, T_K, 0) + (json_int_t)(1 << 24)); }
static void h_overlap(json_t *r) { set_offsets(r, T_K, off(r, T_V, 0), off(r, T_V, 1)); }
static void h_bytesize(json_t *r) { json_object_set_new(json_object_get(r, T_K), "shape", json_pack("[i,i]", 33, 64)); }
static void h_dtype(json_t *r) { json_object_set_new(json_object_get(r, T_K), "dtype", json_string("F4_E2M1")); }
static void h_negdim(json_t *r) { json_object_set_new(json_object_get(r, T_K), "shape", json_pack("[i,i]", -32, -64)); }
static void h_begin_gt_end(json_t *r) { set_offsets(r, T_K, off(r, T_K, 1), off(r, T_K, 0)); }
static void h_overflow(json_t *r) {
    json_object_set_new(json_object_get(r, T_K), "shape", json_pack("[I,I,I]", (json_int_t)1 << 40, (json_int_t)1 << 40, (json_int_t)1 << 40));
}

static void base(const char *dir) { tiny_opts o = {0}; tiny_write(dir, &o); }

static void mk_outside(const char *d) { base(d); edit_header(d, h_outside); }
static void mk_overlap(const char *d) { base(d); edit_header(d, h_overlap); }
static void mk_bytesize(const char *d) { base(d); edit_header(d, h_bytesize); }
static void mk_dtype(const char *d) { base(d); edit_header(d, h_dtype); }
static void mk_negdim(const char *d) { base(d); edit_header(d, h_negdim); }
static void mk_begin_gt_end(const char *d) { base(d); edit_header(d, h_begin_gt_end); }
static void mk_overflow(const char *d) { base(d); edit_header(d, h_overflow); }

static void mk_truncated(const char *d) {
    base(d);
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    struct stat st;
    if (stat(p, &st) == 0 && truncate(p, st.st_size / 2) != 0) fprintf(stderr, "truncate failed\n");
}
static void mk_truncated_hdr(const char *d) {
    base(d);
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    if (truncate(p, 5) != 0) fprintf(stderr, "truncate failed\n");
}
static void mk_hdr_len(const char *d) {
    base(d);
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    int fd = open(p, O_WRONLY);
    uint8_t big[8] = {0, 0, 0, 0, 0, 0, 0x10, 0};
    if (fd < 0 || pwrite(fd, big, 8, 0) != 8) fprintf(stderr, "pwrite failed\n");
    if (fd >= 0) close(fd);
}
static void mk_bad_hdr_json(const char *d) {
    base(d);
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    int fd = open(p, O_WRONLY);
    const char *junk = "{\"model.norm.weight\": {\"dtype\": ";
    if (fd < 0 || pwrite(fd, junk, strlen(junk), 8) != (ssize_t)strlen(junk)) fprintf(stderr, "pwrite failed\n");
    /* the rest of the old header follows: not a valid continuation at this point */
    if (fd >= 0) close(fd);
}
static void mk_missing(const char *d) { tiny_opts o = {.omit = "model.layers.1.mlp.experts.4.down_proj.weight"}; tiny_write(d, &o); }
static void mk_no_router_bias(const char *d) { tiny_opts o = {.omit = "model.layers.1.mlp.gate.e_score_correction_bias"}; tiny_write(d, &o); }
static void mk_shape(const char *d) { tiny_opts o = {.bad_shape = "model.layers.2.mlp.shared_experts.up_proj.weight"}; tiny_write(d, &o); }

/* config.json edits: replace the first occurrence of `from` with `to` */
static void cfg_replace(const char *d, const char *from, const char *to) {
    char p[1024], *buf;
    size_t len;
    snprintf(p, sizeof p, "%s/config.json", d);
    if (read_all(p, &buf, &len)) return;
    char *at = strstr(buf, from);
    if (!at) { free(buf); return; }
    size_t fl = strlen(from), tl = strlen(to);
    char *out = malloc(len - fl + tl + 1);
    memcpy(out, buf, (size_t)(at - buf));
    memcpy(out + (at - buf), to, tl);
    memcpy(out + (at - buf) + tl, at + fl, len - (size_t)(at - buf) - fl);
    ms_err e = {0};
    ms_write_file(p, out, len - fl + tl, &e);
    free(out);
    free(buf);
}
/* Sets the raw JSON text of a top-level number field, whatever its current spelling. */
static void cfg_set_raw(const char *d, const char *key, const char *raw) {
    char p[1024], *buf, pat[128];
    size_t len;
    snprintf(p, sizeof p, "%s/config.json", d);
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    if (read_all(p, &buf, &len)) return;
    char *at = strstr(buf, pat);
    if (!at) { free(buf); return; }
    char *v = at + strlen(pat), *e = v + strcspn(v, ",}\n");
    ms_err er = {0};
    size_t head = (size_t)(v - buf), tail = len - (size_t)(e - buf), rl = strlen(raw);
    char *out = malloc(head + rl + tail + 1);
    memcpy(out, buf, head);
    memcpy(out + head, raw, rl);
    memcpy(out + head + rl, e, tail);
    ms_write_file(p, out, head + rl + tail, &er);
    free(out);
    free(buf);
}
static void mk_cfg_json(const char *d) { base(d); cfg_replace(d, "\"hidden_size\": 64,", "\"hidden_size\": 64,,"); }
static void mk_cfg_nan(const char *d) { base(d); cfg_set_raw(d, "rms_norm_eps", "NaN"); }
static void mk_cfg_neg(const char *d) { base(d); cfg_set_raw(d, "hidden_size", "-64"); }
static void mk_cfg_zero(const char *d) { base(d); cfg_set_raw(d, "num_attention_heads", "0"); }
static void mk_cfg_type(const char *d) { base(d); cfg_replace(d, "\"glm4_moe\"", "\"llama\""); }
static void mk_cfg_inf(const char *d) { base(d); cfg_set_raw(d, "routed_scaling_factor", "1e999"); }
static void mk_cfg_topk_method(const char *d) { base(d); cfg_replace(d, "\"hidden_size\": 64,", "\"hidden_size\": 64, \"topk_method\": \"greedy\","); }
static void mk_decl(const char *d) {
    base(d);
    char p[1024];
    snprintf(p, sizeof p, "%s/hf_quant_config.json", d);
    const char *s = "{\"producer\": {\"name\": \"modelopt\"}, \"quantization\": {\"quant_algo\": \"NVFP4\", \"group_size\": 16,"
                    " \"kv_cache_quant_algo\": null, \"exclude_modules\": [\"lm_head\", \"*self_attn*\"]}}";
    ms_err e = {0};
    ms_write_file(p, s, strlen(s), &e);
}
static void mk_index(const char *d) {
    tiny_opts o = {.sharded = 1};
    tiny_write(d, &o);
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    json_t *r = json_load_file(p, 0, NULL);
    json_object_set_new(json_object_get(r, "weight_map"), "model.layers.0.mlp.phantom.weight",
                        json_string("model-00001-of-00002.safetensors"));
    json_dump_file(r, p, 0);
    json_decref(r);
}
static void mk_no_weights(const char *d) {
    base(d);
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    unlink(p);
}

static const bad_case g_cases[] = {
    {"truncated", "model.safetensors", "past the data section", mk_truncated},
    {"truncated_header", "model.safetensors", "truncated", mk_truncated_hdr},
    {"header_len_past_end", "model.safetensors", "header length", mk_hdr_len},
    {"malformed_header_json", "model.safetensors", "JSON", mk_bad_hdr_json},
    {"offsets_outside", "model.safetensors", "model.layers.0.self_attn.k_proj.weight", mk_outside},
    {"offsets_overlap", "model.safetensors", "overlaps", mk_overlap},
    {"offsets_reversed", "model.safetensors", "model.layers.0.self_attn.k_proj.weight", mk_begin_gt_end},
    {"bytesize_mismatch", "model.layers.0.self_attn.k_proj.weight", "needs", mk_bytesize},
    {"negative_dim", "model.layers.0.self_attn.k_proj.weight", "shape", mk_negdim},
    {"shape_overflow", "model.layers.0.self_attn.k_proj.weight", "overflow", mk_overflow},
    {"unknown_dtype", "model.layers.0.self_attn.k_proj.weight", "F4_E2M1", mk_dtype},
    {"missing_tensor", "model.layers.1.mlp.experts.4.down_proj.weight", "missing", mk_missing},
    {"missing_router_bias", "model.layers.1.mlp.gate.e_score_correction_bias", "missing", mk_no_router_bias},
    {"wrong_shape", "model.layers.2.mlp.shared_experts.up_proj.weight", "[33, 64]", mk_shape},
    {"malformed_config_json", "config.json", "malformed JSON", mk_cfg_json},
    {"nan_in_config", "config.json", "rms_norm_eps", mk_cfg_nan},
    {"inf_in_config", "config.json", "routed_scaling_factor", mk_cfg_inf},
    {"negative_in_config", "config.json", "hidden_size", mk_cfg_neg},
    {"zero_in_config", "config.json", "num_attention_heads", mk_cfg_zero},
    {"unsupported_topk_method", "config.json", "topk_method", mk_cfg_topk_method},
    {"unknown_model_type", "config.json", "glm4_moe, glm_moe_dsa", mk_cfg_type},
    {"quant_decl_mismatch", "hf_quant_config.json", "model.layers.1.mlp.experts.0.gate_proj", mk_decl},
    {"index_lists_absent_tensor", "model.safetensors.index.json", "model.layers.0.mlp.phantom.weight", mk_index},
    {"no_weights", "no model.safetensors", NULL, mk_no_weights},
};
#define N_CASES ((int)(sizeof g_cases / sizeof g_cases[0]))

static void run_case(const char *root, const bad_case *c) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, c->name);
    c->make(dir);
    ms_model *m = NULL;
    ms_err err = {0};
    int rc = ms_model_load(dir, NULL, &m, &err);
    t_case_name = c->name;
    CHECK_MSG(rc != 0, "%s: loaded without error", c->name);
    CHECK(m == NULL);
    CHECK_MSG(strstr(err.msg, dir) != NULL, "%s: message does not name the file: %s", c->name, err.msg);
    CHECK_MSG(strstr(err.msg, c->needle1) && (!c->needle2 || strstr(err.msg, c->needle2)), "%s: %s", c->name, err.msg);
    CHECK_MSG(!strchr(err.msg, '\n') && strlen(err.msg) < MS_ERR_MSG_MAX - 1, "%s: not one line: %s", c->name, err.msg);
    ms_model_free(m);
}

static char *g_root;
#define CASE_FN(i)                                                                                \
    static void case_##i(void) {                                                                  \
        if (i < N_CASES) run_case(g_root, &g_cases[i]);                                           \
    }
CASE_FN(0) CASE_FN(1) CASE_FN(2) CASE_FN(3) CASE_FN(4) CASE_FN(5) CASE_FN(6) CASE_FN(7) CASE_FN(8) CASE_FN(9)
CASE_FN(10) CASE_FN(11) CASE_FN(12) CASE_FN(13) CASE_FN(14) CASE_FN(15) CASE_FN(16) CASE_FN(17) CASE_FN(18)
CASE_FN(19) CASE_FN(20) CASE_FN(21) CASE_FN(22) CASE_FN(23)

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write")) {
        for (int i = 0; i < N_CASES; i++) {
            char dir[1024];
            snprintf(dir, sizeof dir, "%s/%s", argv[2], g_cases[i].name);
            g_cases[i].make(dir);
            printf("%s\t%s\t%s\n", g_cases[i].name, g_cases[i].needle1, g_cases[i].needle2 ? g_cases[i].needle2 : "");
        }
        return 0;
    }
    _Static_assert(N_CASES == 24, "add a CASE_FN line for every case");
    g_root = tiny_tmpdir("bad");
    if (!g_root) return 1;
    RUN(case_0); RUN(case_1); RUN(case_2); RUN(case_3); RUN(case_4); RUN(case_5); RUN(case_6); RUN(case_7);
    RUN(case_8); RUN(case_9); RUN(case_10); RUN(case_11); RUN(case_12); RUN(case_13); RUN(case_14); RUN(case_15);
    RUN(case_16); RUN(case_17); RUN(case_18); RUN(case_19); RUN(case_20); RUN(case_21); RUN(case_22); RUN(case_23);
    tiny_rmrf(g_root);
    free(g_root);
    return TEST_SUMMARY();
}
