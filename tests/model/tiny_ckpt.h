/* tiny_ckpt.h - writes tiny random glm4_moe / glm_moe_dsa checkpoints for tests, so model tests
 * do not depend on fixture files. Header-only (static functions); include from one test file.
 *
 * Values are a pure function of (tensor name, element index) - tiny_val() - so a test can recompute
 * any weight it reads back. Weights are O(1)/sqrt(fan_in) scaled; norms around 1. */
#ifndef MS_TESTS_TINY_CKPT_H
#define MS_TESTS_TINY_CKPT_H

#include "core/dtype.h"
#include "core/fileutil.h"
#include "model/arch.h"
#include "model/config.h"
#include "model/safetensors.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { TINY_GLM4_MOE = 1, TINY_GLM_MOE_DSA = 2 }; /* tiny_opts.arch */

typedef struct tiny_opts {
    int arch;              /* TINY_GLM4_MOE (default when 0) or TINY_GLM_MOE_DSA */
    ms_dtype dtype;        /* weight dtype: MS_F32 (default when 0), MS_BF16, MS_F16 */
    int fused_experts;     /* transformers-5 fused expert tensors */
    int tie;               /* tie_word_embeddings, no lm_head.weight */
    int sharded;           /* two shards + model.safetensors.index.json */
    int v5_keys;           /* rope_parameters / dtype instead of rope_theta / torch_dtype */
    int mtp;               /* add one MTP layer's tensors (num_nextn_predict_layers 1) */
    int n_layers;          /* default 3 */
    int bf16_router_bias;  /* store e_score_correction_bias as BF16 instead of F32 */
    const char *omit;      /* leave out this tensor */
    const char *bad_shape; /* write this tensor with its first dim + 1 */
    const char *extra;     /* add an unexpected tensor of this name */
    uint64_t seed;
    int wide;              /* split-friendly dims (tiny_dims_of) for tensor-parallel tests of quantized weights */
} tiny_opts;

/* tiny dims */
enum { TINY_V = 128, TINY_H = 64, TINY_NH = 4, TINY_NKV = 2, TINY_HD = 16, TINY_I = 96, TINY_MI = 32, TINY_E = 8,
       TINY_TOPK = 2, TINY_RQ = 32, TINY_RKV = 16, TINY_DN = 16, TINY_DR = 8, TINY_DV = 16, TINY_NIH = 2, TINY_DIH = 16 };

/* The dims a checkpoint is written with: the TINY_* defaults, or with o->wide dims whose per-rank
 * slices keep FP8 128-row blocks and NVFP4 16-column groups whole at --tp 2 (and most at --tp 4). */
typedef struct tiny_dims {
    int V, H, NH, NKV, HD, I, MI, E, TOPK, RQ, RKV, DN, DR, DV, NIH, DIH;
} tiny_dims;
static inline tiny_dims tiny_dims_of(const tiny_opts *o) {
    if (o->wide) return (tiny_dims){512, 256, 8, 4, 64, 256, 256, 8, 2, 128, 128, 32, 32, 32, 4, 64};
    return (tiny_dims){TINY_V, TINY_H, TINY_NH, TINY_NKV, TINY_HD, TINY_I, TINY_MI, TINY_E, TINY_TOPK,
                       TINY_RQ, TINY_RKV, TINY_DN, TINY_DR, TINY_DV, TINY_NIH, TINY_DIH};
}

static inline uint64_t tiny_hash(const char *s, uint64_t seed) {
    uint64_t h = 1469598103934665603ull ^ seed;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Value of element i of tensor `name`: uniform in +-sqrt(3)*scale (+ offset). */
static inline float tiny_val(const char *name, int64_t i, uint64_t seed, float scale, float offset) {
    uint64_t z = tiny_hash(name, seed) + (uint64_t)i * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float u = (float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
    return offset + scale * 1.7320508f * u;
}

typedef struct tiny_w {
    ms_st_writer *w[2];
    void **bufs;
    int nbufs;
    const tiny_opts *o;
    json_t *wmap;
    int count;
} tiny_w;

static __attribute__((unused)) void tiny_add(tiny_w *t, const char *name, int ndim, const int64_t *shape0, float scale, float offset, ms_dtype dt) {
    if (t->o->omit && !strcmp(name, t->o->omit)) return;
    int64_t shape[4];
    for (int i = 0; i < ndim; i++) shape[i] = shape0[i];
    if (t->o->bad_shape && !strcmp(name, t->o->bad_shape)) shape[0] += 1;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    size_t es = ms_dtype_size(dt);
    void *buf = malloc((size_t)n * es + 1);
    for (int64_t i = 0; i < n; i++) {
        float v = tiny_val(name, i, t->o->seed, scale, offset);
        if (dt == MS_F32) ((float *)buf)[i] = v;
        else if (dt == MS_BF16) ((uint16_t *)buf)[i] = ms_f32_to_bf16(v);
        else ((uint16_t *)buf)[i] = ms_f32_to_f16(v);
    }
    t->bufs = realloc(t->bufs, (size_t)(t->nbufs + 1) * sizeof *t->bufs);
    t->bufs[t->nbufs++] = buf;
    int shard = t->o->sharded ? (t->count++ % 2) : 0;
    ms_err err = {0};
    if (ms_st_writer_add(t->w[shard], name, dt, ndim, shape, buf, (size_t)n * es, &err))
        fprintf(stderr, "tiny_ckpt: %s\n", err.msg);
    if (t->wmap) json_object_set_new(t->wmap, name, json_string(shard ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors"));
}

static __attribute__((unused)) void tiny_lin(tiny_w *t, const char *name, int64_t N, int64_t K) {
    int64_t s[2] = {N, K};
    tiny_add(t, name, 2, s, 1.0f / sqrtf((float)K), 0.0f, t->o->dtype);
}
static __attribute__((unused)) void tiny_vec(tiny_w *t, const char *name, int64_t N, float scale, float offset) {
    tiny_add(t, name, 1, &N, scale, offset, t->o->dtype);
}

static __attribute__((unused)) void tiny_layer(tiny_w *t, int L, int moe, int full_indexer) {
    const tiny_dims D = tiny_dims_of(t->o);
    const tiny_opts *o = t->o;
    char n[256];
#define TN(fmt_) (snprintf(n, sizeof n, "model.layers.%d." fmt_, L), n)
    tiny_vec(t, TN("input_layernorm.weight"), D.H, 0.1f, 1.0f);
    tiny_vec(t, TN("post_attention_layernorm.weight"), D.H, 0.1f, 1.0f);
    if (o->arch == TINY_GLM_MOE_DSA) {
        tiny_lin(t, TN("self_attn.q_a_proj.weight"), D.RQ, D.H);
        tiny_vec(t, TN("self_attn.q_a_layernorm.weight"), D.RQ, 0.1f, 1.0f);
        tiny_lin(t, TN("self_attn.q_b_proj.weight"), D.NH * (D.DN + D.DR), D.RQ);
        tiny_lin(t, TN("self_attn.kv_a_proj_with_mqa.weight"), D.RKV + D.DR, D.H);
        tiny_vec(t, TN("self_attn.kv_a_layernorm.weight"), D.RKV, 0.1f, 1.0f);
        tiny_lin(t, TN("self_attn.kv_b_proj.weight"), D.NH * (D.DN + D.DV), D.RKV);
        tiny_lin(t, TN("self_attn.o_proj.weight"), D.H, D.NH * D.DV);
        if (full_indexer) {
            tiny_lin(t, TN("self_attn.indexer.wq_b.weight"), D.NIH * D.DIH, D.RQ);
            tiny_lin(t, TN("self_attn.indexer.wk.weight"), D.DIH, D.H);
            tiny_vec(t, TN("self_attn.indexer.k_norm.weight"), D.DIH, 0.1f, 1.0f);
            tiny_vec(t, TN("self_attn.indexer.k_norm.bias"), D.DIH, 0.1f, 0.0f);
            tiny_lin(t, TN("self_attn.indexer.weights_proj.weight"), D.NIH, D.H);
        }
    } else {
        tiny_lin(t, TN("self_attn.q_proj.weight"), D.NH * D.HD, D.H);
        tiny_vec(t, TN("self_attn.q_proj.bias"), D.NH * D.HD, 0.1f, 0.0f);
        tiny_lin(t, TN("self_attn.k_proj.weight"), D.NKV * D.HD, D.H);
        tiny_vec(t, TN("self_attn.k_proj.bias"), D.NKV * D.HD, 0.1f, 0.0f);
        tiny_lin(t, TN("self_attn.v_proj.weight"), D.NKV * D.HD, D.H);
        tiny_vec(t, TN("self_attn.v_proj.bias"), D.NKV * D.HD, 0.1f, 0.0f);
        tiny_lin(t, TN("self_attn.o_proj.weight"), D.H, D.NH * D.HD);
        tiny_vec(t, TN("self_attn.q_norm.weight"), D.HD, 0.1f, 1.0f);
        tiny_vec(t, TN("self_attn.k_norm.weight"), D.HD, 0.1f, 1.0f);
    }
    if (!moe) {
        tiny_lin(t, TN("mlp.gate_proj.weight"), D.I, D.H);
        tiny_lin(t, TN("mlp.up_proj.weight"), D.I, D.H);
        tiny_lin(t, TN("mlp.down_proj.weight"), D.H, D.I);
        return;
    }
    tiny_lin(t, TN("mlp.gate.weight"), D.E, D.H);
    int64_t e = D.E;
    tiny_add(t, TN("mlp.gate.e_score_correction_bias"), 1, &e, 0.1f, 0.0f, o->bf16_router_bias ? MS_BF16 : MS_F32);
    if (o->fused_experts) {
        int64_t gu[3] = {D.E, 2 * D.MI, D.H}, dn[3] = {D.E, D.H, D.MI};
        tiny_add(t, TN("mlp.experts.gate_up_proj"), 3, gu, 1.0f / sqrtf(D.H), 0, o->dtype);
        tiny_add(t, TN("mlp.experts.down_proj"), 3, dn, 1.0f / sqrtf(D.MI), 0, o->dtype);
    } else {
        for (int x = 0; x < D.E; x++) {
            snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.gate_proj.weight", L, x);
            tiny_lin(t, n, D.MI, D.H);
            snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.up_proj.weight", L, x);
            tiny_lin(t, n, D.MI, D.H);
            snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.down_proj.weight", L, x);
            tiny_lin(t, n, D.H, D.MI);
        }
    }
    tiny_lin(t, TN("mlp.shared_experts.gate_proj.weight"), D.MI, D.H);
    tiny_lin(t, TN("mlp.shared_experts.up_proj.weight"), D.MI, D.H);
    tiny_lin(t, TN("mlp.shared_experts.down_proj.weight"), D.H, D.MI);
#undef TN
}

/* config.json text for the options (caller frees). */
static char *tiny_config_json(const tiny_opts *o) {
    const tiny_dims D = tiny_dims_of(o);
    int nl = o->n_layers ? o->n_layers : 3;
    json_t *c = json_object();
    int dsa = o->arch == TINY_GLM_MOE_DSA;
    json_object_set_new(c, "architectures", json_pack("[s]", dsa ? "GlmMoeDsaForCausalLM" : "Glm4MoeForCausalLM"));
    json_object_set_new(c, "model_type", json_string(dsa ? "glm_moe_dsa" : "glm4_moe"));
    json_object_set_new(c, "vocab_size", json_integer(D.V));
    json_object_set_new(c, "hidden_size", json_integer(D.H));
    json_object_set_new(c, "num_hidden_layers", json_integer(nl));
    json_object_set_new(c, "num_attention_heads", json_integer(D.NH));
    json_object_set_new(c, "num_key_value_heads", json_integer(dsa ? D.NH : D.NKV));
    json_object_set_new(c, "intermediate_size", json_integer(D.I));
    json_object_set_new(c, "moe_intermediate_size", json_integer(D.MI));
    json_object_set_new(c, "n_routed_experts", json_integer(D.E));
    json_object_set_new(c, "n_shared_experts", json_integer(1));
    json_object_set_new(c, "num_experts_per_tok", json_integer(D.TOPK));
    json_object_set_new(c, "first_k_dense_replace", json_integer(1));
    json_object_set_new(c, "n_group", json_integer(2));
    json_object_set_new(c, "topk_group", json_integer(1));
    json_object_set_new(c, "norm_topk_prob", json_true());
    json_object_set_new(c, "routed_scaling_factor", json_real(2.5));
    json_object_set_new(c, "rms_norm_eps", json_real(1e-6));
    json_object_set_new(c, "max_position_embeddings", json_integer(4096));
    json_object_set_new(c, "tie_word_embeddings", json_boolean(o->tie));
    json_object_set_new(c, "num_nextn_predict_layers", json_integer(o->mtp ? 1 : 0));
    json_object_set_new(c, "eos_token_id", json_pack("[i,i]", 1, 2));
    json_object_set_new(c, "pad_token_id", json_integer(1));
    json_object_set_new(c, o->v5_keys ? "dtype" : "torch_dtype", json_string("bfloat16"));
    if (dsa) {
        json_object_set_new(c, "q_lora_rank", json_integer(D.RQ));
        json_object_set_new(c, "kv_lora_rank", json_integer(D.RKV));
        json_object_set_new(c, "qk_nope_head_dim", json_integer(D.DN));
        json_object_set_new(c, "qk_rope_head_dim", json_integer(D.DR));
        json_object_set_new(c, "v_head_dim", json_integer(D.DV));
        json_object_set_new(c, "head_dim", json_integer(D.DR)); /* as transformers writes it: must be ignored */
        json_object_set_new(c, "index_topk", json_integer(4));
        json_object_set_new(c, "index_n_heads", json_integer(D.NIH));
        json_object_set_new(c, "index_head_dim", json_integer(D.DIH));
        json_object_set_new(c, "indexer_rope_interleave", json_true());
        json_object_set_new(c, "rope_interleave", json_true());
        json_t *it = json_array();
        for (int i = 0; i < nl; i++) json_array_append_new(it, json_string(i == 1 ? "shared" : "full"));
        json_object_set_new(c, "indexer_types", it);
        json_object_set_new(c, "attention_bias", json_false());
        if (o->v5_keys) json_object_set_new(c, "rope_parameters", json_pack("{s:f,s:s}", "rope_theta", 1e6, "rope_type", "default"));
        else json_object_set_new(c, "rope_theta", json_real(1e6));
    } else {
        json_object_set_new(c, "head_dim", json_integer(D.HD));
        json_object_set_new(c, "use_qk_norm", json_true());
        json_object_set_new(c, "attention_bias", json_true());
        if (o->v5_keys)
            json_object_set_new(c, "rope_parameters", json_pack("{s:f,s:s,s:f}", "rope_theta", 1e6, "rope_type", "default",
                                                               "partial_rotary_factor", 0.5));
        else {
            json_object_set_new(c, "rope_theta", json_real(1e6));
            json_object_set_new(c, "partial_rotary_factor", json_real(0.5));
            json_object_set_new(c, "rope_scaling", json_null());
        }
    }
    char *s = json_dumps(c, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(c);
    return s;
}

/* Writes config.json and the weights into dir (created if needed). Returns 0 on success. */
static __attribute__((unused)) int tiny_write(const char *dir, const tiny_opts *o0) {
    const tiny_dims D = tiny_dims_of(o0);
    tiny_opts o = *o0;
    if (!o.arch) o.arch = TINY_GLM4_MOE;
    if (!o.dtype) o.dtype = MS_F32;
    int nl = o.n_layers ? o.n_layers : 3;
    mkdir(dir, 0755);
    char p[1024];
    char *cfg = tiny_config_json(&o);
    ms_err err = {0};
    snprintf(p, sizeof p, "%s/config.json", dir);
    int rc = ms_write_file(p, cfg, strlen(cfg), &err);
    free(cfg);
    if (rc) { fprintf(stderr, "tiny_ckpt: %s\n", err.msg); return rc; }
    tiny_w t = {{ms_st_writer_new(), ms_st_writer_new()}, NULL, 0, &o, o.sharded ? json_object() : NULL, 0};
    int64_t eshape[2] = {D.V, D.H};
    tiny_add(&t, "model.embed_tokens.weight", 2, eshape, 1.0f, 0.0f, o.dtype);
    tiny_vec(&t, "model.norm.weight", D.H, 0.1f, 1.0f);
    if (!o.tie) tiny_lin(&t, "lm_head.weight", D.V, D.H);
    for (int L = 0; L < nl + (o.mtp ? 1 : 0); L++) tiny_layer(&t, L, L >= 1, L != 1 || L >= nl);
    if (o.mtp) {
        char n[128];
        snprintf(n, sizeof n, "model.layers.%d.enorm.weight", nl);
        tiny_vec(&t, n, D.H, 0.1f, 1.0f);
        snprintf(n, sizeof n, "model.layers.%d.eh_proj.weight", nl);
        tiny_lin(&t, n, D.H, 2 * D.H);
    }
    if (o.extra) tiny_vec(&t, o.extra, 4, 1.0f, 0.0f);
    if (o.sharded) {
        snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
        rc = ms_st_writer_finish(t.w[0], p, &err);
        snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
        if (!rc) rc = ms_st_writer_finish(t.w[1], p, &err);
        json_t *idx = json_pack("{s:{s:i},s:o}", "metadata", "total_size", 0, "weight_map", t.wmap);
        char *s = json_dumps(idx, JSON_INDENT(2));
        json_decref(idx);
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        if (!rc) rc = ms_write_file(p, s, strlen(s), &err);
        free(s);
    } else {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        rc = ms_st_writer_finish(t.w[0], p, &err);
    }
    if (rc) fprintf(stderr, "tiny_ckpt: %s\n", err.msg);
    ms_st_writer_free(t.w[0]);
    ms_st_writer_free(t.w[1]);
    for (int i = 0; i < t.nbufs; i++) free(t.bufs[i]);
    free(t.bufs);
    return rc;
}

/* mkdtemp under $TMPDIR (or /tmp); returns a malloc'd path. */
static char *tiny_tmpdir(const char *tag) {
    const char *base = getenv("TMPDIR");
    char p[512];
    snprintf(p, sizeof p, "%s/ms_%s_XXXXXX", base && *base ? base : "/tmp", tag);
    char *d = mkdtemp(p);
    return d ? strdup(d) : NULL;
}

static __attribute__((unused)) void tiny_rmrf(const char *dir) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "tiny_ckpt: could not remove %s\n", dir);
}

#endif
