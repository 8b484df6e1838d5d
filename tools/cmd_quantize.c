/* cmd_quantize.c - `moeserve quantize --to nvfp4|fp8 --in DIR --out DIR [--exclude GLOB]...`
 *
 * Writes checkpoints in the layouts real exports use (ModelOpt NVFP4, DeepSeek-style FP8 block),
 * so quantized test models and user conversions exercise exactly the loader paths that
 * nvidia/GLM-5-NVFP4 or zai-org/GLM-5-FP8 would.
 *
 * Default policy (documented in --help):
 *   fp8:   routed experts, shared experts, dense MLP and attention projections
 *          (q/k/v/o, q_a/q_b/kv_a/kv_b) are quantized.
 *   nvfp4: routed experts, shared experts and dense MLP only; attention stays bf16 as in real
 *          NVFP4 exports of GLM-5.
 *   Never quantized: embeddings, lm_head, norms, router (mlp.gate), DSA indexer, MTP layers.
 * --exclude GLOB keeps matching modules (vLLM matching rules) unquantized as well. Output is one
 * model.safetensors, produced tensor by tensor (memory stays bounded by the largest tensor). */
#include "common/args.h"
#include "common/model_path.h"
#include "core/fileutil.h"
#include "model/config.h"
#include "model/quantize.h"
#include "model/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_EXCL 256

/* One output Linear: the source view and what to produce. */
typedef struct qmod {
    char module[256];
    ms_dtype dt;
    const void *src;
    int64_t N, K;
    int fmt; /* 1 fp8, 2 nvfp4 */
} qmod;

typedef struct qstate {
    qmod *mods;
    int n, cap;
    /* NVFP4 cache of the last module computed in full (weight and weight_scale are written adjacently) */
    int cached;
    uint8_t *c_codes, *c_scales;
    float c_scale2;
    float input_scale;
    int done, last_layer; /* progress: modules quantized so far, layer of the last one */
    double t0;
} qstate;

typedef struct fillref { qstate *q; int idx; int part; } fillref; /* part: 0 weight, 1 scale, 2 scale2, 3 input_scale */

static int compute_nvfp4(qstate *q, int idx, ms_err *err) {
    if (q->cached == idx) return MS_OK;
    qmod *m = &q->mods[idx];
    free(q->c_codes);
    free(q->c_scales);
    q->cached = -1;
    q->c_codes = malloc((size_t)(m->N * m->K / 2));
    q->c_scales = malloc((size_t)(m->N * m->K / 16));
    if (!q->c_codes || !q->c_scales) return ms_errf(err, MS_ERR_NOMEM, "%s: out of memory", m->module);
    MS_TRY(ms_quantize_nvfp4(m->dt, m->src, m->N, m->K, q->c_codes, q->c_scales, &q->c_scale2, m->module, err));
    q->cached = idx;
    return MS_OK;
}

static int fill(void *ctx, const char *name, void *buf, size_t nbytes, ms_err *err) {
    fillref *f = ctx;
    qstate *q = f->q;
    qmod *m = &q->mods[f->idx];
    (void)name;
    if (f->part == 0) { /* progress, one line per layer (a tensor group), on stderr */
        int L = -1;
        sscanf(m->module, "model.layers.%d.", &L);
        if (L != q->last_layer && q->done)
            fprintf(stderr, "quantize: layer %d done, %d/%d modules (%.0f%%, %.1f s)\n", q->last_layer, q->done, q->n,
                    100.0 * q->done / q->n, ms_now() - q->t0);
        q->last_layer = L;
        q->done++;
    }
    if (m->fmt == 1) {
        if (f->part == 0) {
            float *sc = malloc((size_t)((m->N + 127) / 128 * ((m->K + 127) / 128)) * sizeof(float));
            if (!sc) return ms_errf(err, MS_ERR_NOMEM, "%s: out of memory", m->module);
            int rc = ms_quantize_fp8_block(m->dt, m->src, m->N, m->K, buf, sc, m->module, err);
            free(sc);
            return rc;
        }
        return ms_quantize_fp8_block(m->dt, m->src, m->N, m->K, NULL, buf, m->module, err);
    }
    if (f->part == 2) {
        float s2;
        uint8_t *sc = malloc((size_t)(m->N * m->K / 16));
        if (!sc) return ms_errf(err, MS_ERR_NOMEM, "%s: out of memory", m->module);
        int rc = ms_quantize_nvfp4_scales(m->dt, m->src, m->N, m->K, sc, &s2, m->module, err);
        free(sc);
        if (!rc) memcpy(buf, &s2, 4);
        return rc;
    }
    if (f->part == 3) {
        memcpy(buf, &q->input_scale, 4);
        return MS_OK;
    }
    MS_TRY(compute_nvfp4(q, f->idx, err));
    memcpy(buf, f->part == 0 ? q->c_codes : q->c_scales, nbytes);
    return MS_OK;
}

/* Group of a Linear module by name; -1 when it is not a candidate. L gets the layer index or -1. */
enum { G_EXPERT, G_SHARED, G_DENSE, G_ATTN };
static int classify(const char *module, int *L) {
    *L = -1;
    int n = 0;
    if (sscanf(module, "model.layers.%d.%n", L, &n) != 1 || n == 0) return -1;
    const char *r = module + n;
    static const char *attn[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                 "self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa",
                                 "self_attn.kv_b_proj", NULL};
    for (int i = 0; attn[i]; i++)
        if (!strcmp(r, attn[i])) return G_ATTN;
    if (!strcmp(r, "mlp.gate_proj") || !strcmp(r, "mlp.up_proj") || !strcmp(r, "mlp.down_proj")) return G_DENSE;
    if (!strncmp(r, "mlp.shared_experts.", 19)) return G_SHARED;
    int e, m = 0;
    if (sscanf(r, "mlp.experts.%d.%n", &e, &m) == 1 && m > 0) {
        const char *p = r + m;
        if (!strcmp(p, "gate_proj") || !strcmp(p, "up_proj") || !strcmp(p, "down_proj")) return G_EXPERT;
    }
    return -1;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int copy_file(const char *src, const char *dst, ms_err *err) {
    char *data;
    size_t len;
    MS_TRY(ms_read_file(src, (size_t)4 << 30, &data, &len, err));
    int rc = ms_write_file(dst, data, len, err);
    free(data);
    return rc;
}

static const ms_opt quantize_opts[] = {
    {"to", NULL, MS_OPT_VALUE, "nvfp4|fp8", "target format"},
    {"in", NULL, MS_OPT_VALUE, "DIR", "BF16 checkpoint directory"},
    {"out", NULL, MS_OPT_VALUE, "DIR", "output directory (new or empty; see --force)"},
    {"exclude", NULL, MS_OPT_MULTI, "GLOB", "keep matching modules unquantized (exact, substring, glob,\nor name* as vLLM)"},
    {"input-scale", NULL, MS_OPT_VALUE, "X", "NVFP4 input_scale of every module (uncalibrated; default 1/448,\n"
                                               "i.e. |x| up to 6; W4A16 paths ignore it, W4A4 engines use it)"},
    {"force", NULL, MS_OPT_BOOL, NULL, "write into a non-empty --out, replacing the files quantize writes"},
    MS_OPT_END,
};

static const ms_cmd quantize_cmd = {
    "quantize", "--to nvfp4|fp8 --in DIR --out DIR [--exclude GLOB]... [--input-scale X] [--force]",
    "Quantizes a BF16 checkpoint.\n"
    "  fp8:   routed + shared experts, dense MLP and attention projections (128x128 blocks)\n"
    "  nvfp4: routed + shared experts and dense MLP (ModelOpt layout, group 16); attention stays bf16\n"
    "  never: embeddings, lm_head, norms, router, DSA indexer, MTP layers",
    {quantize_opts, NULL},
};

struct qjob {
    ms_st_set *st;
    ms_st_writer *w;
    qstate q;
    fillref **refs; /* individually allocated: the writer borrows the pointers */
    int nrefs, caprefs;
    json_t *excl;     /* output exclude list */
    const char *user_excl[MAX_EXCL];
    int n_user;
    int to;           /* 1 fp8, 2 nvfp4 */
    int n_quant, n_kept;
};

static int add_ref(struct qjob *j, int idx, int part, fillref **out) {
    if (j->nrefs == j->caprefs) {
        int nc = j->caprefs ? 2 * j->caprefs : 1024;
        fillref **nr = realloc(j->refs, (size_t)nc * sizeof *nr);
        if (!nr) return -1;
        j->refs = nr;
        j->caprefs = nc;
    }
    fillref *r = malloc(sizeof *r);
    if (!r) return -1;
    *r = (fillref){&j->q, idx, part};
    j->refs[j->nrefs++] = r;
    *out = r;
    return 0;
}

/* Adds one Linear source view either quantized or passed through (weight only). */
static int add_linear(struct qjob *j, const char *module, ms_dtype dt, const void *src, int64_t N, int64_t K,
                      int mtp_first, ms_err *err) {
    int L, g = classify(module, &L);
    int want = g == G_EXPERT || g == G_SHARED || g == G_DENSE || (g == G_ATTN && j->to == 1);
    if (L >= mtp_first) want = 0;
    for (int i = 0; i < j->n_user && want; i++)
        if (ms_quant_pattern_match(j->user_excl[i], module)) want = 0;
    if (want && j->to == 2 && K % 16) {
        want = 0;
        json_array_append_new(j->excl, json_string(module)); /* cannot be NVFP4: say so in the exclude list */
    }
    if (want && dt != MS_F32 && dt != MS_F16 && dt != MS_BF16)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "%s: weight dtype %s cannot be quantized", module, ms_dtype_name(dt));
    char nm[300];
    int64_t shp[2] = {N, K};
    size_t es = ms_dtype_size(dt);
    if (!want) {
        j->n_kept++;
        snprintf(nm, sizeof nm, "%s.weight", module);
        return ms_st_writer_add(j->w, nm, dt, 2, shp, src, (size_t)(N * K) * es, err);
    }
    if (j->q.n == j->q.cap) {
        int nc = j->q.cap ? 2 * j->q.cap : 1024;
        qmod *nm2 = realloc(j->q.mods, (size_t)nc * sizeof *nm2);
        if (!nm2) return ms_errf(err, MS_ERR_NOMEM, "out of memory");
        j->q.mods = nm2;
        j->q.cap = nc;
    }
    int idx = j->q.n++;
    qmod *m = &j->q.mods[idx];
    snprintf(m->module, sizeof m->module, "%s", module);
    m->dt = dt;
    m->src = src;
    m->N = N;
    m->K = K;
    m->fmt = j->to;
    j->n_quant++;
    fillref *r;
    if (j->to == 1) {
        int64_t ss[2] = {(N + 127) / 128, (K + 127) / 128};
        if (add_ref(j, idx, 0, &r)) return ms_errf(err, MS_ERR_NOMEM, "out of memory");
        snprintf(nm, sizeof nm, "%s.weight", module);
        MS_TRY(ms_st_writer_add_fill(j->w, nm, MS_F8E4M3, 2, shp, (size_t)(N * K), fill, r, err));
        if (add_ref(j, idx, 1, &r)) return ms_errf(err, MS_ERR_NOMEM, "out of memory");
        snprintf(nm, sizeof nm, "%s.weight_scale_inv", module);
        return ms_st_writer_add_fill(j->w, nm, MS_F32, 2, ss, (size_t)(ss[0] * ss[1]) * 4, fill, r, err);
    }
    int64_t ws[2] = {N, K / 2}, ss[2] = {N, K / 16};
    if (add_ref(j, idx, 0, &r)) return ms_errf(err, MS_ERR_NOMEM, "out of memory");
    snprintf(nm, sizeof nm, "%s.weight", module);
    MS_TRY(ms_st_writer_add_fill(j->w, nm, MS_U8, 2, ws, (size_t)(N * K / 2), fill, r, err));
    if (add_ref(j, idx, 1, &r)) return ms_errf(err, MS_ERR_NOMEM, "out of memory");
    snprintf(nm, sizeof nm, "%s.weight_scale", module);
    MS_TRY(ms_st_writer_add_fill(j->w, nm, MS_F8E4M3, 2, ss, (size_t)(N * K / 16), fill, r, err));
    if (add_ref(j, idx, 2, &r)) return ms_errf(err, MS_ERR_NOMEM, "out of memory");
    snprintf(nm, sizeof nm, "%s.weight_scale_2", module);
    MS_TRY(ms_st_writer_add_fill(j->w, nm, MS_F32, 0, NULL, 4, fill, r, err));
    if (add_ref(j, idx, 3, &r)) return ms_errf(err, MS_ERR_NOMEM, "out of memory");
    snprintf(nm, sizeof nm, "%s.input_scale", module);
    return ms_st_writer_add_fill(j->w, nm, MS_F32, 0, NULL, 4, fill, r, err);
}

/* Files quantize writes into --out: the weights, their index, the configs, and what it copies from --in. */
static int owned_file(const char *in, const char *f) {
    if (ends_with(f, ".safetensors") || !strcmp(f, "model.safetensors.index.json") || !strcmp(f, "config.json") ||
        !strcmp(f, "hf_quant_config.json"))
        return 1;
    char a[4096];
    struct stat st;
    return !ms_path_join(a, sizeof a, in, f) && stat(a, &st) == 0 && S_ISREG(st.st_mode);
}

/* --out must be new or empty; with --force the files quantize owns are removed first (so no stale
 * hf_quant_config.json or shard survives from an earlier run), anything else in it stays. */
static int prepare_out(const char *in, const char *out, int force, ms_err *err) {
    DIR *d = opendir(out);
    if (!d) {
        if (errno != ENOENT) return ms_errf(err, MS_ERR_IO, "flag --out: %s: %s", out, strerror(errno));
        if (mkdir(out, 0755) != 0) return ms_errf(err, MS_ERR_IO, "flag --out: %s: %s", out, strerror(errno));
        return MS_OK;
    }
    struct dirent *e;
    int n = 0, rc = MS_OK;
    while (!rc && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        n++;
        if (!force || !owned_file(in, e->d_name)) continue;
        char p[4096];
        if (!ms_path_join(p, sizeof p, out, e->d_name) && unlink(p) != 0)
            rc = ms_errf(err, MS_ERR_IO, "flag --force: cannot remove %s: %s", p, strerror(errno));
    }
    closedir(d);
    if (!rc && n && !force)
        rc = ms_errf(err, MS_ERR_INVALID, "flag --out: %s is not empty (%d entr%s); choose a new folder, or pass --force to "
                     "replace the files quantize writes there", out, n, n == 1 ? "y" : "ies");
    return rc;
}

static int run(const char *to, const char *in, const char *out, struct qjob *j, float input_scale, int force, ms_err *err) {
    if (!strcmp(to, "fp8")) j->to = 1;
    else if (!strcmp(to, "nvfp4")) j->to = 2;
    else return ms_errf(err, MS_ERR_INVALID, "flag --to: '%s' is not one of nvfp4, fp8", to);
    j->q.cached = -1;
    j->q.input_scale = input_scale;
    ms_config cfg;
    MS_TRY(ms_config_load(in, &cfg, err));
    ms_quant_decl decl;
    MS_TRY(ms_quant_decl_load(in, &decl, err));
    int already = decl.algo != MS_QUANT_NONE;
    ms_quant_decl_free(&decl);
    if (already) return ms_errf(err, MS_ERR_INVALID, "%s: the checkpoint is already quantized (it has a quantization declaration)", in);
    MS_TRY(ms_st_open(in, &j->st, err));
    int n = ms_st_count(j->st);
    for (int i = 0; i < n; i++) {
        const char *nm = ms_st_at(j->st, i)->name;
        if (ends_with(nm, ".weight_scale_inv") || ends_with(nm, ".weight_scale") || ends_with(nm, ".weight_scale_2"))
            return ms_errf(err, MS_ERR_INVALID, "%s: tensor '%s' shows the checkpoint is already quantized", in, nm);
    }
    MS_TRY(prepare_out(in, out, force, err));
    j->q.t0 = ms_now();
    j->q.last_layer = -1;
    j->w = ms_st_writer_new();
    j->excl = json_array();
    if (!j->w || !j->excl) return ms_errf(err, MS_ERR_NOMEM, "out of memory");
    const int mtp_first = cfg.num_layers_ckpt;
    for (int i = 0; i < n; i++) {
        const ms_st_tensor *t = ms_st_at(j->st, i);
        char module[256];
        int L, k = 0;
        /* fused experts -> per-expert modules */
        if (sscanf(t->name, "model.layers.%d.mlp.experts.%n", &L, &k) == 1 && k > 0 &&
            (!strcmp(t->name + k, "gate_up_proj") || !strcmp(t->name + k, "down_proj")) && t->ndim == 3) {
            int gu = !strcmp(t->name + k, "gate_up_proj");
            int64_t E = t->shape[0], R = t->shape[1], C = t->shape[2];
            if (gu && R % 2) return ms_errf(err, MS_ERR_FORMAT, "%s: tensor '%s' has an odd gate_up row count", in, t->name);
            size_t es = ms_dtype_size(t->dtype);
            for (int64_t e = 0; e < E; e++) {
                const char *base = (const char *)t->data + (size_t)(e * R * C) * es;
                if (gu) {
                    snprintf(module, sizeof module, "model.layers.%d.mlp.experts.%lld.gate_proj", L, (long long)e);
                    MS_TRY(add_linear(j, module, t->dtype, base, R / 2, C, mtp_first, err));
                    snprintf(module, sizeof module, "model.layers.%d.mlp.experts.%lld.up_proj", L, (long long)e);
                    MS_TRY(add_linear(j, module, t->dtype, base + (size_t)(R / 2 * C) * es, R / 2, C, mtp_first, err));
                } else {
                    snprintf(module, sizeof module, "model.layers.%d.mlp.experts.%lld.down_proj", L, (long long)e);
                    MS_TRY(add_linear(j, module, t->dtype, base, R, C, mtp_first, err));
                }
            }
            continue;
        }
        size_t nl = strlen(t->name);
        if (t->ndim == 2 && ends_with(t->name, ".weight") && nl - 7 < sizeof module) {
            memcpy(module, t->name, nl - 7);
            module[nl - 7] = 0;
            int LL;
            if (classify(module, &LL) >= 0) {
                MS_TRY(add_linear(j, module, t->dtype, t->data, t->shape[0], t->shape[1], mtp_first, err));
                continue;
            }
        }
        MS_TRY(ms_st_writer_add(j->w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, err));
    }
    /* exclude list: what stays unquantized, as patterns that match no quantized module */
    json_t *ex = json_array();
    json_array_append_new(ex, json_string("lm_head"));
    json_array_append_new(ex, json_string("*mlp.gate"));
    json_array_append_new(ex, json_string(j->to == 2 ? "*self_attn*" : "*self_attn.indexer*"));
    for (int m = 0; m < cfg.num_nextn_predict_layers; m++) {
        char p[64];
        snprintf(p, sizeof p, "model.layers.%d.*", mtp_first + m);
        json_array_append_new(ex, json_string(p));
    }
    for (int i = 0; i < j->n_user; i++) json_array_append_new(ex, json_string(j->user_excl[i]));
    json_array_extend(ex, j->excl);
    json_decref(j->excl);
    j->excl = ex;
    for (int i = 0; i < j->q.n; i++) /* self-check: the declaration must agree with the tensors */
        for (size_t p = 0; p < json_array_size(ex); p++)
            if (ms_quant_pattern_match(json_string_value(json_array_get(ex, p)), j->q.mods[i].module))
                return ms_errf(err, MS_ERR_INVALID, "exclude pattern '%s' matches quantized module '%s'; choose a narrower --exclude",
                               json_string_value(json_array_get(ex, p)), j->q.mods[i].module);
    char path[4096];
    if (ms_path_join(path, sizeof path, out, "model.safetensors")) return ms_errf(err, MS_ERR_INVALID, "%s: path too long", out);
    MS_TRY(ms_st_writer_meta(j->w, "format", "pt", err));
    MS_TRY(ms_st_writer_finish(j->w, path, err));

    /* config.json with quantization_config; hf_quant_config.json for NVFP4 */
    char src[4096];
    ms_path_join(src, sizeof src, in, "config.json");
    json_error_t je;
    json_t *c = json_load_file(src, 0, &je);
    if (!c) return ms_errf(err, MS_ERR_FORMAT, "%s: %s", src, je.text);
    json_t *qc;
    if (j->to == 2) {
        qc = json_pack("{s:s,s:s,s:i,s:n,s:O}", "quant_method", "modelopt", "quant_algo", "NVFP4", "group_size", 16,
                       "kv_cache_quant_algo", "ignore", ex);
        json_t *h = json_pack("{s:{s:s,s:s},s:{s:s,s:i,s:n,s:O}}", "producer", "name", "modelopt", "version", "moeserve",
                              "quantization", "quant_algo", "NVFP4", "group_size", 16, "kv_cache_quant_algo",
                              "exclude_modules", ex);
        ms_path_join(path, sizeof path, out, "hf_quant_config.json");
        int bad = json_dump_file(h, path, JSON_INDENT(2));
        json_decref(h);
        if (bad) { json_decref(qc); json_decref(c); return ms_errf(err, MS_ERR_IO, "%s: write failed", path); }
    } else {
        qc = json_pack("{s:s,s:s,s:s,s:[i,i],s:O}", "quant_method", "fp8", "fmt", "e4m3", "activation_scheme", "dynamic",
                       "weight_block_size", 128, 128, "modules_to_not_convert", ex);
    }
    json_object_set_new(c, "quantization_config", qc);
    ms_path_join(path, sizeof path, out, "config.json");
    int bad = json_dump_file(c, path, JSON_INDENT(2));
    json_decref(c);
    if (bad) return ms_errf(err, MS_ERR_IO, "%s: write failed", path);

    /* tokenizer, generation config, template, ... */
    DIR *d = opendir(in);
    if (!d) return ms_errf(err, MS_ERR_IO, "%s: %s", in, strerror(errno));
    struct dirent *e;
    int rc = MS_OK;
    while (!rc && (e = readdir(d))) {
        const char *f = e->d_name;
        if (f[0] == '.' || ends_with(f, ".safetensors") || !strcmp(f, "model.safetensors.index.json") ||
            !strcmp(f, "config.json") || !strcmp(f, "hf_quant_config.json"))
            continue;
        char a[4096], b[4096];
        struct stat st;
        if (ms_path_join(a, sizeof a, in, f) || ms_path_join(b, sizeof b, out, f)) continue;
        if (stat(a, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        rc = copy_file(a, b, err);
    }
    closedir(d);
    return rc;
}

int cmd_quantize(int argc, char **argv) {
    ms_args a;
    int prc = ms_args_parse(&a, &quantize_cmd, argc, argv);
    if (prc) return ms_args_exit(prc);
    struct qjob j;
    memset(&j, 0, sizeof j);
    const char *to = ms_args_str(&a, "to", NULL), *in = ms_args_str(&a, "in", NULL), *out = ms_args_str(&a, "out", NULL);
    int badnum = 0;
    double is = ms_args_float(&a, "input-scale", 1.0 / 448.0, &badnum);
    j.n_user = ms_args_multi(&a, "exclude", j.user_excl, MAX_EXCL);
    int force = ms_args_flag(&a, "force");
    if (badnum || !to || !in || !out) {
        if (!badnum) fprintf(stderr, "moeserve quantize: flag --%s is required (see moeserve quantize --help)\n", !to ? "to" : !in ? "in" : "out");
        ms_args_free(&a);
        return 2;
    }
    if (!(is > 0 && is < 3e38)) {
        fprintf(stderr, "moeserve quantize: flag --input-scale: must be a positive number\n");
        ms_args_free(&a);
        return 2;
    }
    char in_dir[4096];
    if (ms_model_path_resolve("quantize", "in", in, NULL, MS_NEED_CONFIG | MS_NEED_WEIGHTS, in_dir, sizeof in_dir)) {
        ms_args_free(&a);
        return 2;
    }
    in = in_dir;
    ms_err err = {0};
    double t0 = ms_now();
    int rc = run(to, in, out, &j, (float)is, force, &err);
    if (rc) fprintf(stderr, "moeserve quantize: %s\n", err.msg);
    else
        printf("quantized %d modules to %s, kept %d linears unquantized; wrote %s in %.1f s\n", j.n_quant, to, j.n_kept, out,
               ms_now() - t0);
    ms_st_writer_free(j.w);
    ms_st_close(j.st);
    json_decref(j.excl);
    for (int i = 0; i < j.nrefs; i++) free(j.refs[i]);
    free(j.refs);
    free(j.q.mods);
    free(j.q.c_codes);
    free(j.q.c_scales);
    ms_args_free(&a);
    return rc ? 1 : 0;
}
