/* config.c - config.json (and generation_config.json, the quantization declaration) reduced to
 * the numbers the forward needs.
 *
 * Hugging Face configs drift between transformers releases (rope_theta moved into rope_parameters,
 * torch_dtype became dtype, layer-type lists replaced first_k_dense_replace), and exported configs
 * carry values that would silently corrupt a forward (a NaN epsilon, a head_dim that does not apply
 * to MLA). So every value is read once here, both spellings are accepted, and anything out of range
 * fails with the field named. */
#include "model/config.h"

#include "model/arch.h"
#include "model/config_internal.h"

#include "core/fileutil.h"

#include <ctype.h>
#include <fnmatch.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CFG_MAX_BYTES (16u << 20)

static char supported_list[256];
static void make_supported_list(void) {
    size_t o = 0;
    for (const ms_arch *const *a = ms_arch_all(); *a && o < sizeof supported_list; a++)
        o += (size_t)snprintf(supported_list + o, sizeof supported_list - o, "%s%s", o ? ", " : "", (*a)->name);
}

const char *ms_config_supported_types(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, make_supported_list);
    return supported_list;
}


/* A JSON value that is absent or null counts as absent. */
json_t *ms_cfg_get(json_t *o, const char *key) {
    json_t *v = json_is_object(o) ? json_object_get(o, key) : NULL;
    return json_is_null(v) ? NULL : v;
}

int ms_cfg_bad(ms_cfg_reader *c, const char *field, const char *what) {
    return ms_errf(c->err, MS_ERR_FORMAT, "%s: field '%s' %s", c->path, field, what);
}

/* Reads a number field. min_kind: 0 any finite, 1 >= 0, 2 > 0. */
int ms_cfg_double(ms_cfg_reader *c, json_t *o, const char *key, double def, int min_kind, double *out) {
    json_t *v = ms_cfg_get(o, key);
    if (!v) { *out = def; return MS_OK; }
    if (!json_is_number(v)) return ms_cfg_bad(c, key, "must be a number");
    double x = json_number_value(v);
    if (!isfinite(x)) return ms_cfg_bad(c, key, "must be a finite number");
    if (min_kind == 1 && x < 0) return ms_cfg_bad(c, key, "must not be negative");
    if (min_kind == 2 && !(x > 0)) return ms_cfg_bad(c, key, "must be positive");
    *out = x;
    return MS_OK;
}

/* Reads an integer field (an integral real such as 4096.0 is accepted). min_kind as above. */
int ms_cfg_int(ms_cfg_reader *c, json_t *o, const char *key, int def, int min_kind, int *out) {
    json_t *v = ms_cfg_get(o, key);
    if (!v) { *out = def; return MS_OK; }
    double x;
    if (json_is_integer(v)) x = (double)json_integer_value(v);
    else if (json_is_real(v)) {
        x = json_real_value(v);
        if (!isfinite(x) || x != floor(x)) return ms_cfg_bad(c, key, "must be an integer");
    } else return ms_cfg_bad(c, key, "must be an integer");
    if (x > 2147483647.0 || x < -2147483648.0) return ms_cfg_bad(c, key, "is out of range");
    if (min_kind == 1 && x < 0) return ms_cfg_bad(c, key, "must not be negative");
    if (min_kind == 2 && x <= 0) return ms_cfg_bad(c, key, "must be positive");
    *out = (int)x;
    return MS_OK;
}

int ms_cfg_req_int(ms_cfg_reader *c, json_t *o, const char *key, int *out) {
    if (!ms_cfg_get(o, key)) return ms_errf(c->err, MS_ERR_FORMAT, "%s: required field '%s' is missing", c->path, key);
    return ms_cfg_int(c, o, key, 0, 2, out);
}

int ms_cfg_bool(ms_cfg_reader *c, json_t *o, const char *key, int def, int *out) {
    json_t *v = ms_cfg_get(o, key);
    if (!v) { *out = def; return MS_OK; }
    if (!json_is_boolean(v)) return ms_cfg_bad(c, key, "must be true or false");
    *out = json_is_true(v);
    return MS_OK;
}

static int get_token_id(ms_cfg_reader *c, json_t *o, const char *key, int32_t *out) {
    json_t *v = ms_cfg_get(o, key);
    *out = -1;
    if (!v) return MS_OK;
    if (json_is_array(v)) v = json_array_size(v) ? json_array_get(v, 0) : NULL; /* some configs list one */
    if (!v) return MS_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 0x7fffffff)
        return ms_cfg_bad(c, key, "must be a non-negative token id");
    *out = (int32_t)json_integer_value(v);
    return MS_OK;
}

/* eos_token_id: an int or a list of ints. */
static int parse_eos(ms_cfg_reader *c, json_t *o, int *n, int32_t *ids) {
    json_t *v = ms_cfg_get(o, "eos_token_id");
    if (!v) return MS_OK;
    if (json_is_integer(v)) {
        if (json_integer_value(v) < 0 || json_integer_value(v) > 0x7fffffff) return ms_cfg_bad(c, "eos_token_id", "must be a non-negative token id");
        *n = 1;
        ids[0] = (int32_t)json_integer_value(v);
        return MS_OK;
    }
    if (!json_is_array(v)) return ms_cfg_bad(c, "eos_token_id", "must be an integer or a list of integers");
    if (json_array_size(v) > MS_MAX_EOS) return ms_cfg_bad(c, "eos_token_id", "lists more ids than supported (8)");
    int k = 0;
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 0x7fffffff)
            return ms_cfg_bad(c, "eos_token_id", "must list non-negative token ids");
        ids[k++] = (int32_t)json_integer_value(x);
    }
    *n = k;
    return MS_OK;
}

/* RoPE: legacy (rope_theta, partial_rotary_factor, rope_scaling) or v5 (rope_parameters). */
static int parse_rope(ms_cfg_reader *c, json_t *r, double *theta, double *prf, int *prf_present) {
    json_t *rp = ms_cfg_get(r, "rope_parameters");
    if (rp && !json_is_object(rp)) return ms_cfg_bad(c, "rope_parameters", "must be an object");
    *prf_present = 0;
    MS_TRY(ms_cfg_double(c, r, "rope_theta", 10000.0, 2, theta));
    MS_TRY(ms_cfg_double(c, r, "partial_rotary_factor", 1.0, 2, prf));
    if (ms_cfg_get(r, "partial_rotary_factor")) *prf_present = 1;
    if (rp) {
        if (ms_cfg_get(rp, "rope_theta")) {
            const char *f = "rope_parameters.rope_theta";
            json_t *x = ms_cfg_get(rp, "rope_theta");
            if (!json_is_number(x) || !isfinite(json_number_value(x))) return ms_cfg_bad(c, f, "must be a finite number");
            if (!(json_number_value(x) > 0)) return ms_cfg_bad(c, f, "must be positive");
            *theta = json_number_value(x);
        }
        if (ms_cfg_get(rp, "partial_rotary_factor")) {
            json_t *x = ms_cfg_get(rp, "partial_rotary_factor");
            if (!json_is_number(x) || !isfinite(json_number_value(x)) || !(json_number_value(x) > 0))
                return ms_cfg_bad(c, "rope_parameters.partial_rotary_factor", "must be a positive number");
            *prf = json_number_value(x);
            *prf_present = 1;
        }
        json_t *t = ms_cfg_get(rp, "rope_type");
        if (!t) t = ms_cfg_get(rp, "type");
        if (t && (!json_is_string(t) || strcmp(json_string_value(t), "default")))
            return ms_errf(c->err, MS_ERR_UNSUPPORTED, "%s: field 'rope_parameters.rope_type' is '%s'; only 'default' RoPE is supported",
                           c->path, json_is_string(t) ? json_string_value(t) : "?");
    }
    json_t *rs = ms_cfg_get(r, "rope_scaling");
    if (rs) {
        if (!json_is_object(rs)) return ms_cfg_bad(c, "rope_scaling", "must be an object or null");
        json_t *t = ms_cfg_get(rs, "rope_type");
        if (!t) t = ms_cfg_get(rs, "type");
        if (t && (!json_is_string(t) || strcmp(json_string_value(t), "default")))
            return ms_errf(c->err, MS_ERR_UNSUPPORTED, "%s: field 'rope_scaling' type '%s' is not supported (only default RoPE)",
                           c->path, json_is_string(t) ? json_string_value(t) : "?");
        if (ms_cfg_get(rs, "rope_theta")) {
            json_t *x = ms_cfg_get(rs, "rope_theta");
            if (!json_is_number(x) || !isfinite(json_number_value(x)) || !(json_number_value(x) > 0))
                return ms_cfg_bad(c, "rope_scaling.rope_theta", "must be a positive number");
            *theta = json_number_value(x);
        }
    }
    return MS_OK;
}

static int parse_root(ms_cfg_reader *c, ms_config *cfg) {
    json_t *r = c->root;
    memset(cfg, 0, sizeof *cfg);
    if (!json_is_object(r)) return ms_errf(c->err, MS_ERR_FORMAT, "%s: top level is not a JSON object", c->path);
    json_t *mt = ms_cfg_get(r, "model_type");
    if (!mt) return ms_errf(c->err, MS_ERR_FORMAT, "%s: required field 'model_type' is missing (supported: %s)", c->path,
                            ms_config_supported_types());
    if (!json_is_string(mt)) return ms_cfg_bad(c, "model_type", "must be a string");
    const char *mts = json_string_value(mt);
    cfg->arch = ms_arch_find(mts);
    if (!cfg->arch)
        return ms_errf(c->err, MS_ERR_UNSUPPORTED, "%s: model_type '%.64s' is not supported (supported: %s)", c->path, mts,
                       ms_config_supported_types());
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", mts);

    MS_TRY(ms_cfg_req_int(c, r, "vocab_size", &cfg->vocab_size));
    MS_TRY(ms_cfg_req_int(c, r, "hidden_size", &cfg->hidden_size));
    MS_TRY(ms_cfg_req_int(c, r, "num_hidden_layers", &cfg->num_layers));
    if (cfg->num_layers > MS_MAX_LAYERS) return ms_cfg_bad(c, "num_hidden_layers", "exceeds the supported maximum (256)");
    MS_TRY(ms_cfg_req_int(c, r, "num_attention_heads", &cfg->num_heads));
    MS_TRY(ms_cfg_int(c, r, "num_key_value_heads", cfg->num_heads, 2, &cfg->num_kv_heads));
    double eps;
    MS_TRY(ms_cfg_double(c, r, "rms_norm_eps", 1e-5, 2, &eps));
    cfg->rms_norm_eps = (float)eps;
    if (!(cfg->rms_norm_eps > 0)) return ms_cfg_bad(c, "rms_norm_eps", "is too small for float32");
    MS_TRY(ms_cfg_int(c, r, "max_position_embeddings", 131072, 2, &cfg->max_position_embeddings));
    MS_TRY(ms_cfg_bool(c, r, "tie_word_embeddings", 0, &cfg->tie_word_embeddings));
    MS_TRY(ms_cfg_bool(c, r, "attention_bias", 0, &cfg->attention_bias));

    double theta = 0, prf = 1;
    int prf_present = 0;
    MS_TRY(parse_rope(c, r, &theta, &prf, &prf_present));
    cfg->rope_theta = theta;

    c->partial_rotary_factor = prf;
    c->prf_present = prf_present;
    MS_TRY(cfg->arch->parse_config(c, cfg));
    if (cfg->head_dim <= 0) return ms_cfg_bad(c, "head_dim", "must be positive");

    /* MLP / MoE */
    MS_TRY(ms_cfg_int(c, r, "intermediate_size", 0, 1, &cfg->intermediate_size));
    MS_TRY(ms_cfg_int(c, r, "moe_intermediate_size", 0, 1, &cfg->moe_intermediate_size));
    MS_TRY(ms_cfg_int(c, r, "n_routed_experts", 0, 1, &cfg->n_routed_experts));
    MS_TRY(ms_cfg_int(c, r, "n_shared_experts", 0, 1, &cfg->n_shared_experts));
    MS_TRY(ms_cfg_int(c, r, "num_experts_per_tok", 0, 1, &cfg->num_experts_per_tok));
    MS_TRY(ms_cfg_int(c, r, "first_k_dense_replace", 0, 1, &cfg->first_k_dense_replace));
    int freq;
    MS_TRY(ms_cfg_int(c, r, "moe_layer_freq", 1, 2, &freq));
    MS_TRY(ms_cfg_int(c, r, "n_group", 1, 2, &cfg->n_group));
    MS_TRY(ms_cfg_int(c, r, "topk_group", 1, 2, &cfg->topk_group));
    MS_TRY(ms_cfg_bool(c, r, "norm_topk_prob", 1, &cfg->norm_topk_prob));
    json_t *tkm = ms_cfg_get(r, "topk_method"); /* absent: noaux_tc, the routing both architectures define */
    if (tkm && !json_is_string(tkm)) return ms_cfg_bad(c, "topk_method", "must be a string");
    if (tkm && strcmp(json_string_value(tkm), "noaux_tc"))
        return ms_errf(c->err, MS_ERR_UNSUPPORTED, "%s: field 'topk_method' is '%.64s'; only 'noaux_tc' (score + e_score_correction_bias) is supported",
                       c->path, json_string_value(tkm));
    double rsf;
    MS_TRY(ms_cfg_double(c, r, "routed_scaling_factor", 1.0, 2, &rsf));
    cfg->routed_scaling_factor = (float)rsf;
    MS_TRY(ms_cfg_int(c, r, "num_nextn_predict_layers", 0, 1, &cfg->num_nextn_predict_layers));
    json_t *mlt = ms_cfg_get(r, "mlp_layer_types");
    int n_moe = 0, n_dense = 0;
    if (mlt) {
        if (!json_is_array(mlt)) return ms_cfg_bad(c, "mlp_layer_types", "must be a list");
        if ((int)json_array_size(mlt) < cfg->num_layers) return ms_cfg_bad(c, "mlp_layer_types", "has fewer entries than num_hidden_layers");
        for (int i = 0; i < cfg->num_layers; i++) {
            const char *s = json_string_value(json_array_get(mlt, (size_t)i));
            if (!s || (strcmp(s, "dense") && strcmp(s, "sparse")))
                return ms_cfg_bad(c, "mlp_layer_types", "entries must be \"dense\" or \"sparse\"");
            cfg->layer_is_moe[i] = !strcmp(s, "sparse");
        }
    } else {
        for (int i = 0; i < cfg->num_layers; i++)
            cfg->layer_is_moe[i] = cfg->n_routed_experts > 0 && i >= cfg->first_k_dense_replace && i % freq == 0;
    }
    for (int i = 0; i < cfg->num_layers; i++) cfg->layer_is_moe[i] ? n_moe++ : n_dense++;
    if (n_dense && cfg->intermediate_size <= 0) return ms_cfg_bad(c, "intermediate_size", "must be positive (the model has dense MLP layers)");
    if (n_moe) {
        if (cfg->n_routed_experts <= 0) return ms_cfg_bad(c, "n_routed_experts", "must be positive (the model has MoE layers)");
        if (cfg->moe_intermediate_size <= 0) return ms_cfg_bad(c, "moe_intermediate_size", "must be positive (the model has MoE layers)");
        if (cfg->num_experts_per_tok <= 0 || cfg->num_experts_per_tok > cfg->n_routed_experts)
            return ms_cfg_bad(c, "num_experts_per_tok", "must be between 1 and n_routed_experts");
        if (cfg->n_routed_experts % cfg->n_group) return ms_cfg_bad(c, "n_group", "must divide n_routed_experts");
        if (cfg->topk_group > cfg->n_group) return ms_cfg_bad(c, "topk_group", "must not exceed n_group");
        if ((int64_t)cfg->topk_group * (cfg->n_routed_experts / cfg->n_group) < cfg->num_experts_per_tok)
            return ms_cfg_bad(c, "topk_group", "selects fewer experts than num_experts_per_tok");
    }

    /* tokens, dtype */
    cfg->n_eos = 0;
    MS_TRY(parse_eos(c, r, &cfg->n_eos, cfg->eos_token_ids));
    MS_TRY(get_token_id(c, r, "bos_token_id", &cfg->bos_token_id));
    MS_TRY(get_token_id(c, r, "pad_token_id", &cfg->pad_token_id));
    json_t *dt = ms_cfg_get(r, "dtype");
    if (!dt) dt = ms_cfg_get(r, "torch_dtype");
    if (dt && !json_is_string(dt)) return ms_cfg_bad(c, "dtype", "must be a string");
    snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "%s", dt ? json_string_value(dt) : "bfloat16");
    cfg->num_layers_ckpt = cfg->num_layers;
    return MS_OK;
}

/* The last object key that starts before byte `pos` (for naming the field at a parse error).
 * Returns 1 and fills field when found. */
static int last_key_before(const char *s, size_t len, size_t pos, char *field, size_t cap) {
    int in_str = 0, found = 0;
    const char *str_start = NULL;
    for (size_t i = 0; i < len && i < pos; i++) {
        const char *p = s + i;
        if (in_str) {
            if (*p == '\\' && i + 1 < len) { i++; continue; }
            if (*p == '"') {
                in_str = 0;
                size_t j = i + 1;
                while (j < len && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r')) j++;
                if (j < len && s[j] == ':') { /* it was a key */
                    size_t kl = (size_t)(p - str_start);
                    snprintf(field, cap, "%.*s", (int)(kl < 100 ? kl : 100), str_start);
                    found = 1;
                }
            }
            continue;
        }
        if (*p == '"') { in_str = 1; str_start = p + 1; }
    }
    return found;
}

/* jansson rejects NaN/Infinity (Python's json writes them) and out-of-range reals; name the field
 * they belong to instead of a byte offset. */
static int load_json(const char *text, size_t len, const char *path, json_t **out, ms_err *err) {
    json_error_t je;
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (*out) return MS_OK;
    char field[128];
    size_t pos = je.position > 0 ? (size_t)je.position : 0;
    /* the bad token may extend past the reported position */
    size_t scan = pos + 16 < len ? pos + 16 : len;
    int have = last_key_before(text, len, pos, field, sizeof field);
    int nonfinite = 0;
    for (size_t i = pos > 12 ? pos - 12 : 0; i < scan; i++)
        if (!strncmp(text + i, "NaN", 3) || !strncmp(text + i, "Infinity", 8)) nonfinite = 1;
    if (have && (nonfinite || strstr(je.text, "overflow")))
        return ms_errf(err, MS_ERR_FORMAT, "%s: field '%s' must be a finite number (%s)", path, field,
                       nonfinite ? "NaN/Infinity are not allowed" : "out of range");
    if (have)
        return ms_errf(err, MS_ERR_FORMAT, "%s: malformed JSON at line %d column %d (after field '%s'): %s", path, je.line,
                       je.column, field, je.text);
    return ms_errf(err, MS_ERR_FORMAT, "%s: malformed JSON at line %d column %d: %s", path, je.line, je.column, je.text);
}

int ms_config_parse(const char *json_text, const char *path, ms_config *cfg, ms_err *err) {
    ms_cfg_reader c = {path, err, NULL};
    MS_TRY(load_json(json_text, strlen(json_text), path, &c.root, err));
    int rc = parse_root(&c, cfg);
    json_decref(c.root);
    return rc;
}

/* Resolves path_or_dir into the config.json path and the model directory. */
static int resolve(const char *path_or_dir, char *cfg_path, size_t cap, char *dir, size_t dcap, ms_err *err) {
    struct stat st;
    if (stat(path_or_dir, &st) != 0) return ms_errf(err, MS_ERR_NOT_FOUND, "%s: no such file or directory", path_or_dir);
    if (S_ISDIR(st.st_mode)) {
        snprintf(dir, dcap, "%s", path_or_dir);
        if (ms_path_join(cfg_path, cap, path_or_dir, "config.json")) return ms_errf(err, MS_ERR_INVALID, "%s: path too long", path_or_dir);
    } else {
        snprintf(cfg_path, cap, "%s", path_or_dir);
        snprintf(dir, dcap, "%s", path_or_dir);
        char *sl = strrchr(dir, '/');
        if (sl) *sl = 0;
        else snprintf(dir, dcap, ".");
    }
    return MS_OK;
}

/* generation_config.json's eos list wins over config.json's (transformers' generate uses it). */
static int apply_generation_config(const char *dir, ms_config *cfg, ms_err *err) {
    char p[4096];
    if (ms_path_join(p, sizeof p, dir, "generation_config.json") || !ms_path_exists(p)) return MS_OK;
    char *text;
    size_t len;
    MS_TRY(ms_read_file(p, CFG_MAX_BYTES, &text, &len, err));
    ms_cfg_reader c = {p, err, NULL};
    int rc = load_json(text, len, p, &c.root, err);
    free(text);
    if (rc) return rc;
    if (!json_is_object(c.root)) rc = ms_errf(err, MS_ERR_FORMAT, "%s: top level is not a JSON object", p);
    int n = 0;
    int32_t ids[MS_MAX_EOS];
    if (!rc) rc = parse_eos(&c, c.root, &n, ids);
    if (!rc && n > 0) {
        cfg->n_eos = n;
        memcpy(cfg->eos_token_ids, ids, sizeof ids);
    }
    json_decref(c.root);
    return rc;
}

static const char *const g_known_keys[] = {
    "num_hidden_layers", "vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "rms_norm_eps", "max_position_embeddings", "rope_theta", "partial_rotary_factor", "intermediate_size",
    "moe_intermediate_size", "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace",
    "moe_layer_freq", "n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob", "index_topk",
    "index_n_heads", "index_head_dim", "index_topk_freq", "index_skip_topk_offset", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_nextn_predict_layers", "tie_word_embeddings",
    "use_qk_norm", "attention_bias", "rope_interleave", "indexer_rope_interleave", NULL};

static int apply_override(json_t *root, const char *ov, const char *path, ms_err *err) {
    const char *eq = strchr(ov, '=');
    if (!eq || eq == ov) return ms_errf(err, MS_ERR_INVALID, "override '%s': expected key=value", ov);
    char key[128];
    size_t kl = (size_t)(eq - ov);
    if (kl >= sizeof key) return ms_errf(err, MS_ERR_INVALID, "override '%s': key too long", ov);
    memcpy(key, ov, kl);
    key[kl] = 0;
    const char *val = eq + 1;
    json_error_t je;
    json_t *v = json_loads(val, JSON_DECODE_ANY, &je);
    if (!v) v = json_string(val); /* bare words are strings */
    if (!v) return ms_errf(err, MS_ERR_NOMEM, "override '%s': out of memory", ov);
    if (json_is_real(v) && !isfinite(json_real_value(v))) {
        json_decref(v);
        return ms_errf(err, MS_ERR_INVALID, "override '%s': value must be finite", ov);
    }
    json_t *target = root;
    char *dot = strchr(key, '.');
    const char *leaf = key;
    if (dot) { /* one nested level, e.g. rope_parameters.rope_theta */
        *dot = 0;
        leaf = dot + 1;
        target = json_object_get(root, key);
        if (!json_is_object(target)) {
            json_decref(v);
            return ms_errf(err, MS_ERR_INVALID, "override '%s': %s has no object '%s'", ov, path, key);
        }
    } else {
        int known = json_object_get(root, key) != NULL;
        for (int i = 0; g_known_keys[i] && !known; i++) known = !strcmp(g_known_keys[i], key);
        if (!known) {
            json_decref(v);
            return ms_errf(err, MS_ERR_INVALID, "override '%s': '%s' is not a key of %s", ov, key, path);
        }
        /* "rope_theta" with only rope_parameters present: set it there too so it takes effect */
        json_t *rp = json_object_get(root, "rope_parameters");
        if (json_is_object(rp) && json_object_get(rp, key)) json_object_set(rp, key, v);
    }
    json_object_set_new(target, leaf, v);
    return MS_OK;
}

int ms_config_load_with_overrides(const char *path_or_dir, const char *const *overrides, int n_overrides,
                                  ms_config *cfg, ms_err *err) {
    char cfg_path[4096], dir[4096];
    MS_TRY(resolve(path_or_dir, cfg_path, sizeof cfg_path, dir, sizeof dir, err));
    char *text;
    size_t len;
    MS_TRY(ms_read_file(cfg_path, CFG_MAX_BYTES, &text, &len, err));
    ms_cfg_reader c = {cfg_path, err, NULL};
    int rc = load_json(text, len, cfg_path, &c.root, err);
    free(text);
    if (rc) return rc;
    int n_orig_layers = -1;
    if (n_overrides > 0) {
        /* MTP layers sit after the checkpoint's own layer count, whatever the override says */
        if (json_is_object(c.root)) {
            json_t *nl = json_object_get(c.root, "num_hidden_layers");
            if (json_is_integer(nl)) n_orig_layers = (int)json_integer_value(nl);
        }
        for (int i = 0; i < n_overrides && !rc; i++)
            if (!json_is_object(c.root)) rc = ms_errf(err, MS_ERR_FORMAT, "%s: top level is not a JSON object", cfg_path);
            else rc = apply_override(c.root, overrides[i], cfg_path, err);
    }
    if (!rc) rc = parse_root(&c, cfg);
    json_decref(c.root);
    if (rc) return rc;
    if (n_orig_layers >= 0) cfg->num_layers_ckpt = n_orig_layers;
    return apply_generation_config(dir, cfg, err);
}

int ms_config_load(const char *dir, ms_config *cfg, ms_err *err) {
    return ms_config_load_with_overrides(dir, NULL, 0, cfg, err);
}

/* ---- quantization declaration ---- */

void ms_quant_decl_free(ms_quant_decl *q) {
    if (!q) return;
    for (int i = 0; i < q->n_exclude; i++) free(q->exclude[i]);
    free(q->exclude);
    q->exclude = NULL;
    q->n_exclude = 0;
}

static int read_patterns(json_t *a, const char *path, const char *field, ms_quant_decl *q, ms_err *err) {
    if (!a) return MS_OK;
    if (!json_is_array(a)) return ms_errf(err, MS_ERR_FORMAT, "%s: field '%s' must be a list of module patterns", path, field);
    size_t n = json_array_size(a);
    if (n > 1000000) return ms_errf(err, MS_ERR_FORMAT, "%s: field '%s' lists too many patterns", path, field);
    char **nx = realloc(q->exclude, (size_t)(q->n_exclude + (int)n + 1) * sizeof *nx);
    if (!nx) return ms_errf(err, MS_ERR_NOMEM, "%s: out of memory", path);
    q->exclude = nx;
    for (size_t i = 0; i < n; i++) {
        const char *s = json_string_value(json_array_get(a, i));
        if (!s) return ms_errf(err, MS_ERR_FORMAT, "%s: field '%s' entry %zu is not a string", path, field, i);
        if (!(q->exclude[q->n_exclude] = strdup(s))) return ms_errf(err, MS_ERR_NOMEM, "%s: out of memory", path);
        q->n_exclude++;
    }
    return MS_OK;
}

static void set_algo(ms_quant_decl *q, const char *a) {
    snprintf(q->algo_name, sizeof q->algo_name, "%s", a);
    if (!strcasecmp(a, "NVFP4")) q->algo = MS_QUANT_NVFP4;
    else if (!strcasecmp(a, "MIXED_PRECISION")) q->algo = MS_QUANT_MIXED;
    else q->algo = MS_QUANT_OTHER;
}

static int parse_modelopt(json_t *qz, const char *path, const char *excl_field, ms_quant_decl *q, ms_err *err) {
    json_t *a = ms_cfg_get(qz, "quant_algo");
    if (!json_is_string(a)) return ms_errf(err, MS_ERR_FORMAT, "%s: field 'quant_algo' missing or not a string", path);
    set_algo(q, json_string_value(a));
    ms_cfg_reader c = {path, err, NULL};
    MS_TRY(ms_cfg_int(&c, qz, "group_size", 16, 2, &q->group_size));
    if (q->algo == MS_QUANT_NVFP4 && q->group_size != 16)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "%s: field 'group_size' is %d; NVFP4 uses 16", path, q->group_size);
    json_t *kv = ms_cfg_get(qz, "kv_cache_quant_algo");
    if (json_is_string(kv)) snprintf(q->kv_cache_quant_algo, sizeof q->kv_cache_quant_algo, "%s", json_string_value(kv));
    MS_TRY(read_patterns(ms_cfg_get(qz, excl_field), path, excl_field, q, err));
    if (strcmp(excl_field, "exclude_modules")) MS_TRY(read_patterns(ms_cfg_get(qz, "exclude_modules"), path, "exclude_modules", q, err));
    return MS_OK;
}

static int decl_from_config(json_t *qc, const char *path, ms_quant_decl *q, ms_err *err) {
    if (!json_is_object(qc)) return ms_errf(err, MS_ERR_FORMAT, "%s: field 'quantization_config' must be an object", path);
    json_t *m = ms_cfg_get(qc, "quant_method");
    if (!json_is_string(m)) return ms_errf(err, MS_ERR_FORMAT, "%s: field 'quantization_config.quant_method' missing or not a string", path);
    const char *ms = json_string_value(m);
    snprintf(q->source, sizeof q->source, "config.json quantization_config");
    if (!strcmp(ms, "modelopt") || !strcmp(ms, "modelopt_fp4")) {
        MS_TRY(parse_modelopt(qc, path, "ignore", q, err));
        return MS_OK;
    }
    if (!strcmp(ms, "fp8")) {
        json_t *bs = ms_cfg_get(qc, "weight_block_size");
        snprintf(q->algo_name, sizeof q->algo_name, "fp8");
        if (!bs) { q->algo = MS_QUANT_OTHER; /* per-tensor FP8: tensors decide */ }
        else {
            if (!json_is_array(bs) || json_array_size(bs) != 2 || !json_is_integer(json_array_get(bs, 0)) ||
                !json_is_integer(json_array_get(bs, 1)))
                return ms_errf(err, MS_ERR_FORMAT, "%s: field 'quantization_config.weight_block_size' must be [n, k]", path);
            q->block_n = (int)json_integer_value(json_array_get(bs, 0));
            q->block_k = (int)json_integer_value(json_array_get(bs, 1));
            if (q->block_n != 128 || q->block_k != 128)
                return ms_errf(err, MS_ERR_UNSUPPORTED, "%s: field 'quantization_config.weight_block_size' is [%d, %d]; only [128, 128] is supported",
                               path, q->block_n, q->block_k);
            q->algo = MS_QUANT_FP8_BLOCK;
        }
        MS_TRY(read_patterns(ms_cfg_get(qc, "modules_to_not_convert"), path, "modules_to_not_convert", q, err));
        MS_TRY(read_patterns(ms_cfg_get(qc, "ignored_layers"), path, "ignored_layers", q, err));
        return MS_OK;
    }
    q->algo = MS_QUANT_OTHER;
    snprintf(q->algo_name, sizeof q->algo_name, "%.31s", ms);
    return MS_OK;
}

int ms_quant_decl_load(const char *dir, ms_quant_decl *q, ms_err *err) {
    memset(q, 0, sizeof *q);
    char p[4096];
    char *text;
    size_t len;
    json_t *root;
    int rc = MS_OK;
    if (!ms_path_join(p, sizeof p, dir, "hf_quant_config.json") && ms_path_exists(p)) {
        MS_TRY(ms_read_file(p, CFG_MAX_BYTES, &text, &len, err));
        rc = load_json(text, len, p, &root, err);
        free(text);
        if (rc) return rc;
        json_t *qz = ms_cfg_get(root, "quantization");
        snprintf(q->source, sizeof q->source, "hf_quant_config.json");
        if (!json_is_object(qz)) rc = ms_errf(err, MS_ERR_FORMAT, "%s: field 'quantization' missing or not an object", p);
        else rc = parse_modelopt(qz, p, "exclude_modules", q, err);
        json_decref(root);
        if (rc) ms_quant_decl_free(q);
        return rc;
    }
    if (ms_path_join(p, sizeof p, dir, "config.json") || !ms_path_exists(p)) return MS_OK;
    MS_TRY(ms_read_file(p, CFG_MAX_BYTES, &text, &len, err));
    rc = load_json(text, len, p, &root, err);
    free(text);
    if (rc) return rc;
    json_t *qc = ms_cfg_get(root, "quantization_config");
    if (qc) rc = decl_from_config(qc, p, q, err);
    json_decref(root);
    if (rc) ms_quant_decl_free(q);
    return rc;
}

int ms_quant_pattern_match(const char *pat, const char *module) {
    if (!strcmp(pat, module)) return 1;
    if (strstr(module, pat)) return 1;
    if (fnmatch(pat, module, 0) == 0) return 1;
    size_t n = strlen(pat);
    if (n > 1 && pat[n - 1] == '*') {
        char base[512];
        if (n - 1 < sizeof base) {
            memcpy(base, pat, n - 1);
            base[n - 1] = 0;
            if (base[n - 2] == '.') base[n - 2] = 0;
            size_t bl = strlen(base);
            if (!strcmp(module, base)) return 1;
            if (!strncmp(module, base, bl) && module[bl] == '.') return 1;
        }
    }
    return 0;
}

int ms_quant_excluded(const ms_quant_decl *q, const char *module, const char **pattern) {
    for (int i = 0; i < q->n_exclude; i++)
        if (ms_quant_pattern_match(q->exclude[i], module)) {
            if (pattern) *pattern = q->exclude[i];
            return 1;
        }
    return 0;
}
