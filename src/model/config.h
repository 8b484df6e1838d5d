/* config.h - a model's config.json reduced to the numbers the forward needs.
 *
 * Accepts both legacy keys (rope_theta, partial_rotary_factor, torch_dtype, rope_scaling) and
 * transformers-5 keys (rope_parameters, dtype). Values that do not fit the architecture (NaN,
 * negative sizes, head dims that do not divide) are rejected with the field named. */
#ifndef MS_MODEL_CONFIG_H
#define MS_MODEL_CONFIG_H

#include "core/status.h"

#include <stdint.h>

#define MS_MAX_LAYERS 256
#define MS_MAX_EOS 8

struct ms_arch;

typedef struct ms_config {
    const struct ms_arch *arch; /* the architecture table of model_type (model/arch.h) */
    char model_type[32];
    int vocab_size;
    int hidden_size;          /* H */
    int num_layers;           /* decoder layers (MTP layers excluded) */
    int num_heads;            /* attention heads */
    int num_kv_heads;         /* GQA kv heads (glm4_moe) */
    int head_dim;             /* glm4_moe head dim */
    int rotary_dim;           /* glm4_moe: head_dim * partial_rotary_factor */
    int use_qk_norm;          /* glm4_moe */
    int attention_bias;       /* glm4_moe: q/k/v bias */
    double rope_theta;
    float rms_norm_eps;
    int max_position_embeddings;
    int tie_word_embeddings;
    /* MLA (glm_moe_dsa) */
    int q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    int rope_interleave;      /* main attention RoPE interleaved (GPT-J); glm_moe_dsa: 1 */
    /* DSA indexer */
    int index_topk, index_n_heads, index_head_dim;
    int indexer_rope_interleave;
    uint8_t indexer_full[MS_MAX_LAYERS]; /* 1: layer computes its own top-k; 0: reuses the last full layer's */
    /* MLP / MoE */
    int intermediate_size;    /* dense MLP width */
    int moe_intermediate_size;
    int n_routed_experts, n_shared_experts, num_experts_per_tok;
    int first_k_dense_replace;
    uint8_t layer_is_moe[MS_MAX_LAYERS];
    int n_group, topk_group;
    int norm_topk_prob;
    float routed_scaling_factor;
    int num_nextn_predict_layers; /* MTP layers present in the checkpoint (recognised, skipped) */
    int num_layers_ckpt;      /* num_hidden_layers before overrides: MTP layers start at this index */
    /* tokens */
    int n_eos;
    int32_t eos_token_ids[MS_MAX_EOS];
    int32_t bos_token_id, pad_token_id; /* -1 when absent */
    char torch_dtype[16];
} ms_config;

/* Parses DIR/config.json text (json) into cfg. `path` is used in error messages only. */
int ms_config_parse(const char *json_text, const char *path, ms_config *cfg, ms_err *err);
/* Loads DIR/config.json, and DIR/generation_config.json for eos ids when present (its eos list
 * wins, as transformers' generate uses it). */
int ms_config_load(const char *dir, ms_config *cfg, ms_err *err);
/* Applies "key=value" overrides (e.g. num_hidden_layers=12) by re-parsing; see ms_config_parse. */
int ms_config_load_with_overrides(const char *path_or_dir, const char *const *overrides, int n_overrides,
                                  ms_config *cfg, ms_err *err);
/* The supported model_types, comma-separated (from the architecture tables) - for error messages. */
const char *ms_config_supported_types(void);

/* ---- quantization declaration (hf_quant_config.json or config.json quantization_config) ----
 * What the checkpoint says about itself. The loader decides each module's format by the tensors
 * present and uses this only to cross-check (spec 4.1, 4.2). */
typedef enum ms_quant_algo {
    MS_QUANT_NONE = 0,  /* no declaration */
    MS_QUANT_FP8_BLOCK, /* quant_method fp8, weight_block_size [128,128] */
    MS_QUANT_NVFP4,     /* ModelOpt NVFP4, group_size 16 */
    MS_QUANT_MIXED,     /* ModelOpt MIXED_PRECISION: per-module, no cross-check possible */
    MS_QUANT_OTHER,     /* a declaration we do not check (e.g. FP8 per-tensor); tensors decide */
} ms_quant_algo;

typedef struct ms_quant_decl {
    ms_quant_algo algo;
    char source[48];     /* "hf_quant_config.json" or "config.json quantization_config" */
    char algo_name[32];  /* as declared: "NVFP4", "fp8", ... */
    int group_size;      /* NVFP4 (16) */
    int block_n, block_k; /* FP8 weight_block_size */
    char kv_cache_quant_algo[16]; /* "" when null/absent */
    char **exclude;      /* exclude_modules / ignore / modules_to_not_convert patterns (owned) */
    int n_exclude;
} ms_quant_decl;

/* Reads DIR/hf_quant_config.json if present, else DIR/config.json's quantization_config. No
 * declaration is MS_OK with algo NONE. Malformed ones fail naming the file and field. Free with
 * ms_quant_decl_free. */
int ms_quant_decl_load(const char *dir, ms_quant_decl *q, ms_err *err);
void ms_quant_decl_free(ms_quant_decl *q);
/* 1 when a module name (dotted, without ".weight") matches an exclude pattern the way vLLM
 * matches them: exact, substring, fnmatch glob, or a trailing "name*" meaning name or name.*.
 * *pattern (may be NULL) gets the matching pattern. */
int ms_quant_excluded(const ms_quant_decl *q, const char *module, const char **pattern);
/* Same matching for one pattern. */
int ms_quant_pattern_match(const char *pattern, const char *module);

#endif
