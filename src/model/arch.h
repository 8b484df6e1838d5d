/* arch.h - one table per model architecture: everything that differs between glm4_moe and
 * glm_moe_dsa (and the next family) lives behind these entries, implemented once in its
 * model/arch_*.c. The config parser, the loader, the forward, `inspect` and `bench-model` call the
 * table and never branch on an architecture's name, so adding an architecture is one new arch_*.c
 * (plus its entry in arch.c's list and its fixtures).
 *
 * What the table owns: the config keys of the attention block, the attention tensors of a layer and
 * how each splits across tensor-parallel ranks, the attention's workspace and KV cache, the
 * attention part of the forward, KV bytes per token, and the attention terms of the per-step cost
 * model. The decoder skeleton (norms, dense MLP, routed MoE, shared experts, embedding, lm_head) is
 * common to every table and stays in forward.c / loader.c. */
#ifndef MS_MODEL_ARCH_H
#define MS_MODEL_ARCH_H

#include "core/status.h"

#include <stddef.h>
#include <stdio.h>

struct ms_config;
struct ms_cfg_reader;
struct ms_load_ctx;
struct ms_layer;
struct ms_forward;
struct ms_model;
struct ms_backend;

typedef struct ms_arch {
    const char *name;      /* config.json model_type */
    const char *attention_kind; /* one phrase for listings ("GQA", "MLA + DSA indexer") */
    /* Reads the attention block's own keys from the reader's root into cfg (the common keys are
     * already parsed) and validates them; errors name the field. */
    int (*parse_config)(struct ms_cfg_reader *r, struct ms_config *cfg);
    /* Refuses a tensor-parallel degree tp the attention cannot split (heads, KV heads), naming the
     * field and the values; MS_OK when tp divides what must be divided. */
    int (*check_tp)(const struct ms_config *cfg, int tp, ms_err *err);
    /* Loads the attention (and indexer) tensors of layer L into ly, each with its tensor-parallel
     * split (the loader context knows this rank's part). */
    int (*load_layer)(struct ms_load_ctx *c, int L, struct ms_layer *ly);
    /* Allocates the attention activations (rows = the forward's max_tokens) and the KV cache of every
     * layer (f->kc / f->vc, n_slots rows each) on the forward's backend. */
    int (*alloc)(struct ms_forward *f, ms_err *err);
    /* Attention of layer L for the step's T tokens: reads f->a [T,H], writes f->delta [T,H] (F32,
     * this rank's partial sum under tensor parallelism) and stores this step's keys in the cache. */
    int (*attention)(struct ms_forward *f, int L, int T, ms_err *err);
    /* KV cache bytes one token takes in layer L with elements of elem bytes (one rank's cache). */
    size_t (*kv_bytes_per_token)(const struct ms_config *cfg, int L, size_t elem, int tp);
    /* Cost model (bench-model): KV bytes one query token at context ctx reads in layer L, and the
     * attention FLOPs of that query (QK and PV products, indexer scoring). prefill_len > 0 means the
     * query belongs to a prefill of that many tokens (selection policies that depend on the step). */
    double (*kv_read_bytes)(const struct ms_config *cfg, int L, double ctx, double elem);
    double (*attn_flops)(const struct ms_config *cfg, int L, double ctx, int prefill_len);
    /* Weight elements of layer L's attention (memory estimates from a config alone): projections
     * split across tensor-parallel ranks, projections every rank holds whole, and tensors that are
     * never quantized (norms, the DSA indexer). */
    void (*attn_params)(const struct ms_config *cfg, int L, double *split, double *replicated, double *plain);
    /* Writes the attention lines of `inspect` (each ending in a newline). */
    void (*describe)(const struct ms_config *cfg, FILE *out);
    /* Sets the attention facts of the MTP (NEXTN) layer kept at config index L (the layer after the
     * decoder layers): it runs in its own forward step, so it cannot reuse another layer's state
     * (glm_moe_dsa: its indexer is a full one, computing its own top-k). The decoder skeleton's facts
     * (layer_is_moe) are set by the loader. */
    void (*mtp_layer)(struct ms_config *cfg, int L);
    /* Optional: once every weight of m is placed on b, builds the fused forms this architecture's
     * forward prefers where b can make them (glm4_moe: q|k|v stacked into one linear). A fusion b
     * cannot make is skipped; only a failing backend call is an error. */
    int (*fuse_placed)(struct ms_model *m, struct ms_backend *b, ms_err *err);
    /* 1: attention()'s first op on f->a is fw_linear_a (or it calls fw_norm_flush before reading f->a),
     * so the forward may leave the layer's input norm pending (forward_internal.h, f->pend) */
    int input_norm_pending;
} ms_arch;

/* The architecture whose model_type is name, or NULL. */
const ms_arch *ms_arch_find(const char *name);
/* Every architecture compiled in (NULL-terminated), in the order error messages list them. */
const ms_arch *const *ms_arch_all(void);

extern const ms_arch ms_arch_glm4_moe;
extern const ms_arch ms_arch_glm_moe_dsa;

#endif
