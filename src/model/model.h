/* model.h - a loaded model: config plus weight views per layer, and the forward pass.
 *
 * Loading maps the checkpoint (safetensors) and builds ms_linear views in each tensor's own format
 * (plain, FP8 block, NVFP4 — decided per module by the scale tensors present, cross-checked against
 * the quantization config's exclude list). Nothing is expanded to float32: the CPU backend reads the
 * mmap directly; other backends copy at placement. `--load-format dummy` builds random weights of the
 * real shapes instead (host or device). */
#ifndef MS_MODEL_MODEL_H
#define MS_MODEL_MODEL_H

#include "backend/backend.h"
#include "core/status.h"
#include "core/batch.h"
#include "dist/comm.h"
#include "model/config.h"
#include "core/tensor.h"
#include "moe/moe.h"

typedef struct ms_layer {
    ms_tensor attn_norm, ffn_norm;
    /* glm4_moe GQA */
    ms_linear q_proj, k_proj, v_proj, o_proj; /* o_proj is shared with MLA */
    ms_linear a_stack; /* the projections of the attention input stacked on the backend after placement
                        * (stack_linears; glm4_moe q|k|v, glm_moe_dsa q_a|indexer wk|kv_a), or w.data
                        * NULL; the parts are then views into it */
    ms_tensor q_norm, k_norm;                 /* per-head RMSNorm weights [d] or data NULL */
    /* glm_moe_dsa MLA */
    ms_linear q_a_proj, q_b_proj, kv_a_proj, kv_b_proj;
    ms_tensor q_a_norm, kv_a_norm;
    /* DSA indexer (full layers only) */
    int has_indexer;
    ms_linear idx_wq_b, idx_wk, idx_wproj;
    ms_tensor idx_k_norm_w, idx_k_norm_b;
    /* MLP */
    int is_moe;
    ms_linear gate_proj, up_proj, down_proj; /* dense MLP */
    ms_linear router;                        /* [E, H] */
    ms_tensor router_bias;                   /* [E] F32 e_score_correction_bias, or data NULL */
    ms_experts experts;
    int has_shared;
    ms_linear sh_gate, sh_up, sh_down;
} ms_layer;

/* Bytes and tensor counts per module group and format, for `inspect` and bench byte counts. */
typedef struct ms_weight_stats {
    uint64_t bytes_total;
    uint64_t bytes_by_group[8][3]; /* group x format(plain/fp8/nvfp4) */
    int linears_by_group[8][3];
    int n_tensors, n_mtp_tensors_skipped;
    int n_layer_tensors_skipped; /* layers past an overridden num_hidden_layers */
    int n_unexpected_tensors;    /* neither used nor MTP (warned once at load) */
    uint8_t plain_dtype[8];      /* ms_dtype of the group's unquantized weights (last seen) */
} ms_weight_stats;
enum { MS_GROUP_EMBED, MS_GROUP_ATTN, MS_GROUP_INDEXER, MS_GROUP_DENSE_MLP, MS_GROUP_ROUTER, MS_GROUP_EXPERTS,
       MS_GROUP_SHARED, MS_GROUP_LM_HEAD, MS_N_GROUPS };
extern const char *const ms_group_names[MS_N_GROUPS];

/* This rank's part of the model under tensor / expert parallelism (all 1-way for one rank). The
 * world is the tensor-parallel group of tp_size ranks; ep_size (dividing it) groups partition the
 * routed experts, and within a group each owned expert is sliced moe_tp_size = tp_size / ep_size
 * ways along its intermediate dimension (SGLang's --tp / --ep meaning). */
typedef struct ms_shard {
    int tp_rank, tp_size;
    int ep_rank, ep_size;         /* ep_rank = tp_rank / moe_tp_size */
    int moe_tp_rank, moe_tp_size; /* moe_tp_rank = tp_rank % moe_tp_size */
    int e0, ne;                   /* routed experts held: global ids [e0, e0 + ne) */
    int64_t v0, nv;               /* vocabulary rows of the embedding and lm_head held: [v0, v0 + nv) */
} ms_shard;

/* Fills sh for rank `rank` of a tp-way world with ep expert groups, refusing (naming the config field
 * and the values) splits the model cannot take: tp or ep < 1, ep not dividing tp, tp not dividing
 * the heads (the architecture's rule), the vocabulary or the dense / shared-expert widths, ep not
 * dividing the routed experts, tp/ep not dividing the expert width. */
int ms_shard_make(const ms_config *cfg, int tp, int ep, int rank, ms_shard *sh, ms_err *err);

/* The multi-token-prediction (NEXTN) module of GLM-4.5+/GLM-5 checkpoints, at checkpoint layer index
 * ckpt_layer = num_hidden_layers (DeepSeek-V3 MTP, as SGLang's glm4_moe_nextn / deepseek_nextn run it):
 *   x  = eh_proj([enorm(embed(token_{t+1})) ; hnorm(h_t)])        (concat order: embedding first)
 *   h' = decoder_layer(x)        (a full attention + MoE layer, its own KV cache, at position t)
 *   g  = shared_head.norm(h');  logits = head(g)
 * h_t is what the main model feeds its lm_head at position t (the last layer's output after the final
 * norm); g is what a chained draft step feeds the next one. The embedding is the main model's (SGLang
 * shares it); head is shared_head.head when the checkpoint has it, else the main lm_head. The decoder
 * layer itself is ms_model.layers[cfg.num_layers]. */
typedef struct ms_mtp {
    int loaded;          /* loaded (ms_load_opts.load_mtp) */
    int ckpt_layer;      /* L of the checkpoint's model.layers.L.* tensors */
    ms_tensor enorm, hnorm, head_norm; /* [H] */
    ms_linear eh_proj;   /* [H, 2H], replicated under tensor parallelism */
    ms_linear head;      /* [V, H] (this rank's vocabulary rows); a copy of lm_head when head_shared */
    int head_shared;     /* no shared_head.head in the checkpoint: the main lm_head is used */
} ms_mtp;

typedef struct ms_model {
    ms_config cfg;
    ms_shard shard; /* this rank's part (tp_size 1: the whole model) */
    char dir[1024];
    struct ms_st_set *st; /* mmap'd checkpoint (NULL for dummy weights) */
    ms_tensor embed;      /* [V, H] */
    ms_tensor final_norm; /* [H] */
    ms_linear lm_head;    /* [V, H] (views embed when tied) */
    ms_layer *layers;     /* [cfg.num_layers + 1]: the decoder layers, then the MTP layer (when loaded) */
    ms_mtp mtp;
    ms_weight_stats stats;
    char quant_desc[64];  /* "bf16", "fp8 (block 128)", "nvfp4 (group 16)", "mixed" */
    void *owned;          /* model-owned host memory (names, dummy data, converted tensors) */
    int tied_lm_head;     /* lm_head.w is the embedding (tie_word_embeddings, no lm_head.weight) */
    int placed;           /* weights moved to a backend */
    int placed_at_load;   /* dummy weights generated on placed_on's device by ms_model_load */
    ms_backend *placed_on;
} ms_model;

typedef struct ms_load_opts {
    const char *load_format;  /* "auto" (default) or "dummy" */
    const char *dummy_quant;  /* dummy weights: "bf16", "fp8" or "nvfp4" (experts; others bf16) */
    const char *const *overrides; /* config overrides "key=value" */
    int n_overrides;
    int prefetch_threads;     /* parallel shard readers (0 = auto; < 0: no prefetch, pages load on use).
                               * Prefetch is skipped when the checkpoint exceeds free memory. */
    int progress;             /* show loading progress (tensors, GB, MB/s) on a terminal */
    uint64_t seed;            /* dummy weights */
    /* Dummy weights only: when this is a GPU backend, every tensor is generated directly in its
     * memory in its own format (no host copy of the model) and the model comes back already placed
     * on it (ms_model_place on the same backend is then a no-op). NULL or cpu: host generation. */
    ms_backend *dummy_device;
    /* Tensor / expert parallelism: load only rank tp_rank's part of a tp_size-way split with ep_size
     * expert groups (0 or 1: unsplit). Only the byte ranges of the rank's slices are read. */
    int tp_rank, tp_size, ep_size;
    /* Also load the MTP (NEXTN) layer (speculative decoding); fails naming the config field or the
     * tensor when the checkpoint has none. 0: its tensors are skipped (no memory). */
    int load_mtp;
} ms_load_opts;

/* Loads config + weights from DIR (or just config for dummy; DIR may then be a config .json path).
 * opts may be NULL (auto format, prefetch, no progress). Errors name file and tensor/field; on
 * error *out is NULL. Views point into the mmap (or model memory); free with ms_model_free. */
int ms_model_load(const char *dir, const ms_load_opts *opts, ms_model **out, ms_err *err);
/* Releases views, the mapping, model-owned memory and (if placed) the backend copies. NULL is ok. */
void ms_model_free(ms_model *m);
/* Moves all weights into backend memory (place_tensor / place_linear on each). MoE runner
 * preparation happens in ms_forward_create. ms_model_free releases the placement, so free the
 * model before destroying the backend. A model generated on b at load (dummy_device) is left as is. */
int ms_model_place(ms_model *m, ms_backend *b, ms_err *err);

/* ---- forward ---- */

typedef struct ms_forward ms_forward; /* per-backend forward state: workspace, KV memory, runner */

/* The discrete choices of one forward step: MoE expert ids per layer and token, and the DSA key
 * selection per full indexer layer and token. Recorded on one backend and replayed on another, they
 * let `compare` and the GPU conformance check every op of two backends against each other even
 * where a near-tie (a router or indexer margin below bf16 resolution) makes them choose
 * differently; the recorded margins show whether a differing choice was such a near-tie. */
typedef struct ms_decisions {
    int n_layers, n_tokens, topk, index_topk;
    int32_t *expert_ids;  /* [n_layers, n_tokens, topk]; -1 on dense layers */
    float *expert_margin; /* [n_layers, n_tokens]: how far the k-th choice beat the best excluded one
                             (biased sigmoid score; group-limited routing takes the smaller of the
                             expert and group margins); +inf on dense layers */
    int32_t *index_sel;   /* [n_layers, n_tokens, index_topk] selected key positions, ascending, -1
                             padded; all -1 where the layer made no sparse selection */
} ms_decisions;

/* Allocates zeroed decision arrays (all ids -1, margins +inf). */
int ms_decisions_alloc(ms_decisions *d, int n_layers, int n_tokens, int topk, int index_topk, ms_err *err);
void ms_decisions_free(ms_decisions *d);
/* Saves / loads as a small safetensors file (tensors expert_ids, expert_margin, index_sel). */
int ms_decisions_save(const ms_decisions *d, const char *path, ms_err *err);
int ms_decisions_load(const char *path, ms_decisions *d, ms_err *err);

typedef struct ms_forward_opts {
    int max_tokens;          /* most tokens per step (workspace size) */
    int n_pages, page_size;  /* KV cache geometry (pages per layer) */
    const char *moe_runner;  /* "auto" or a runner name */
    /* Attention implementations (backend/attn.h), "auto" (or NULL) or a name: attn_backend for GQA and
     * dense MLA, nsa_prefill / nsa_decode for DSA sparse attention in steps with / without prefill
     * tokens. A forced one that cannot run fails ms_forward_create with the flag's sentence. */
    const char *attn_backend, *nsa_prefill, *nsa_decode;
    /* 1: check every op's output for NaN/Inf (syncs after each op: a debugging mode); 2 ("step"):
     * only the residual stream after every layer and the logits, queued on the stream without a
     * host wait until the step's logits are downloaded (cheap enough for serving). */
    int check_numerics;
    /* Optional per-layer hook (moeserve compare): called after each decoder layer with the residual
     * stream [T,H] in backend memory; layer == num_layers for the final normed hidden state. */
    void (*on_layer)(void *ctx, int layer, const ms_tensor *hidden);
    void *on_layer_ctx;
    /* Optional: record this step's decisions into *record (allocated by the caller for the step's
     * token count), or replay *replay's instead of choosing. Single-step debugging aids (logits,
     * compare); the step's token count must equal the decisions' n_tokens. */
    ms_decisions *record;
    const ms_decisions *replay;
    /* Record, per MoE layer, how many distinct experts the last step routed to (bench-model's byte
     * count; costs a small device->host copy per layer). */
    int record_routing;
    /* Run pure decode steps (one token per sequence, up to 256) as recorded backend graphs where the
     * backend has them (CUDA): one launch instead of ~25 per layer; with graph_verify_tokens also
     * speculative verification steps, with mtp also MTP draft steps of one token per sequence. Off
     * with check_numerics 1, on_layer, record/replay or while record_routing or profiling is on. */
    int graphs;
    /* With graphs: also record speculative verification steps, where every sequence has the same
     * number q of tokens (2..16) and every token wants logits (no prefill chunk in the step), as graphs
     * keyed by q as well; ms_forward_record_graphs records those of q = graph_verify_tokens (the
     * engine's speculative_num_steps + 1) at start-up. 0: such steps run op by op. (With opts.mtp and
     * graphs, MTP steps of one token per sequence with logits for each always run as graphs.) */
    int graph_verify_tokens;
    /* Tensor parallelism: the communicator of the model's tp_size ranks (this rank's handle; buffers in
     * this backend's memory). Required when the model is split; given with one rank, the split code
     * paths (vocab-parallel embedding, collectives, gathered logits) run as one-rank collectives, which
     * is how one GPU checks the NCCL path. Not owned. */
    ms_comm *comm;
    /* 1: also run the MTP (NEXTN) layer (the model must be loaded with load_mtp): its KV cache (same
     * pages and slots as the decoder layers), and every step keeps its final-normed hidden rows for
     * ms_forward_mtp_run. */
    int mtp;
} ms_forward_opts;

int ms_forward_create(ms_model *m, ms_backend *b, const ms_forward_opts *o, ms_forward **out, ms_err *err);
void ms_forward_free(ms_forward *f);
/* The experts the forward's decode calls run for MoE layer l: its routed experts with its shared
 * expert appended as expert n (out->shared_last = 1), when l has a shared expert of the routed
 * experts' shapes and formats; otherwise out->n = 0. The linears are copies of l's (same memory);
 * out->gate owns one allocation holding the three arrays (free(out->gate)); out->prepared is NULL.
 * Fails only out of memory. `moeserve tune` times the calls the forward makes with it. */
int ms_layer_fold_shared(const ms_layer *l, ms_experts *out, ms_err *err);
/* Runs one step: writes the batch's K/V into the cache, computes logits for batch->logit_idx into
 * logits_host [n_logits, vocab] (float32). With check_numerics, a NaN/Inf fails with
 * MS_ERR_NUMERICS naming the layer, op and token position. */
int ms_forward_run(ms_forward *f, const ms_batch *batch, float *logits_host, ms_err *err);
/* 1 when ms_forward_run_argmax can run (the backend has an argmax op). */
int ms_forward_can_argmax(const ms_forward *f);
/* As ms_forward_run, but each logit row's greedy choice (backend.h's argmax rule, which is
 * engine/sampler.h's greedy rule) is taken on the backend and only the ids come back: ids_host
 * [n_logits] (NULL: a rank that takes no result, as under tensor parallelism). At batch 64 this moves
 * 256 bytes instead of 39 MB of a 150k vocabulary's logits. MS_ERR_UNSUPPORTED when
 * !ms_forward_can_argmax(f). */
int ms_forward_run_argmax(ms_forward *f, const ms_batch *batch, int32_t *ids_host, ms_err *err);
/* Records, for the shortest context class, the graphs of every batch bucket of: pure decode steps
 * (up to min(256, max_tokens) sequences), verification steps of opts.graph_verify_tokens tokens per
 * sequence (when 2..16; buckets up to min(256, max_tokens) / q sequences) and, with opts.mtp, chained
 * MTP draft steps (one token per sequence, hidden rows of the last MTP step), so the first requests do
 * not pay for it (their longer contexts, and the MTP steps reading the main step's rows, are recorded
 * when first seen). Padding-only steps: they write K/V into the pad page alone. No-op when graphs are
 * off; *n_recorded = graphs made. Call it before the first step: the padding-only steps overwrite the
 * kept hidden rows (MTP) that a following draft step would read. */
int ms_forward_record_graphs(ms_forward *f, int *n_recorded, ms_err *err);
/* Graph use, by step kind: pure decode steps of the main model, speculative verification steps (q >= 2
 * tokens per sequence), MTP draft steps. */
typedef enum ms_graph_kind { MS_GRAPH_DECODE = 0, MS_GRAPH_VERIFY = 1, MS_GRAPH_DRAFT = 2, MS_GRAPH_KINDS = 3 } ms_graph_kind;
typedef struct ms_graph_counts {
    uint64_t launches[MS_GRAPH_KINDS]; /* steps run by launching a recorded graph, since creation */
    int recorded[MS_GRAPH_KINDS];      /* graphs held now that are valid in the backend's memory epoch */
} ms_graph_counts;
/* f's graph counters (all 0 on backends without graphs or with graphs off). */
void ms_forward_graph_counts(const ms_forward *f, ms_graph_counts *out);
/* Name of a graph kind for reports: "decode", "verify", "draft". */
const char *ms_graph_kind_name(int kind);
/* With record_routing: distinct experts routed to by the last step, per layer (0 for dense
 * layers); array of cfg.num_layers owned by f. NULL otherwise. */
const int *ms_forward_routed_experts(const ms_forward *f);
/* With record_routing: on = 0 pauses the record (its per-layer device->host copy and sync stay out
 * of timed steps; the array keeps the last recorded step), on = 1 resumes it. */
void ms_forward_set_record_routing(ms_forward *f, int on);
/* Bytes of KV cache per token over all layers (for sizing the pool). */
/* Profiling for bench-model --profile: while on, every major section of a step is bracketed by
 * backend syncs and its wall time accumulated (slower than a normal step; sections are: batch_upload,
 * norms, attention (with attn_kernel and indexer inside it), router, moe_experts, shared_expert,
 * dense_mlp, lm_head, logits_download). Turning it on resets the totals. */
void ms_forward_set_profile(ms_forward *f, int on);
/* Copies up to cap (name, seconds) totals since profiling was turned on; returns the count. */
int ms_forward_profile(const ms_forward *f, const char **names, double *seconds, int cap);
/* The attention implementations f uses, as "name" or "kind=name,..." text for messages (e.g.
 * "flash" or "attn=flash,nsa_prefill=flash,nsa_decode=ref"). */
void ms_forward_attn_desc(const ms_forward *f, char *buf, size_t cap);
/* The MoE runner forced for f ("auto" when chosen per call). */
const char *ms_forward_moe_desc(const ms_forward *f);
size_t ms_forward_kv_bytes_per_token(const ms_model *m, const ms_backend *b);

/* Where the hidden inputs of an MTP step come from: the rows the last ms_forward_run kept (the main
 * model's final-normed hidden state of each of its tokens), or the rows the last MTP step produced
 * for its logit rows (a chained draft step). */
enum { MS_MTP_HID_TARGET = 0, MS_MTP_HID_DRAFT = 1 };

/* Runs the MTP layer (model.h ms_mtp) for one step (forward created with opts.mtp). bt is laid out
 * like a main step: token t is the NEXT token (token_{p+1}) paired with the hidden state of position
 * p = positions[t]; its MTP K/V go to slot_mapping[t] of the MTP layer's cache (same pages as the
 * main cache, so freeing a page frees both). hid_idx[t] (host, [n_tokens]) is the row of the hidden
 * source (hid_src: MS_MTP_HID_TARGET rows of the last ms_forward_run, or MS_MTP_HID_DRAFT rows =
 * logit rows of the last MTP step). Writes the draft logits of bt->logit_idx rows into logits_host
 * [n_logits, vocab] (float32; NULL: none downloaded) and keeps their normed hidden rows for a chained
 * step. With graphs on, a step of one token per sequence with logits for every token in order (the
 * engine's chained draft steps) runs as a recorded graph keyed by hid_src (hid_idx is uploaded to a
 * fixed device buffer the graph reads); other steps (the first draft step of a round: several tokens
 * per sequence, logits on some) run op by op. Every rank of a split runs it with the same batch. */
int ms_forward_mtp_run(ms_forward *f, const ms_batch *bt, int hid_src, const int32_t *hid_idx, float *logits_host,
                       ms_err *err);
/* As ms_forward_mtp_run, with each logit row's greedy choice taken on the backend (the draft's token:
 * drafts are always greedy) into ids_host [n_logits] instead of the logits (as ms_forward_run_argmax).
 * MS_ERR_UNSUPPORTED when !ms_forward_can_argmax(f). */
int ms_forward_mtp_run_argmax(ms_forward *f, const ms_batch *bt, int hid_src, const int32_t *hid_idx, int32_t *ids_host,
                              ms_err *err);
/* Test hook: overwrites rows [0, n) of the kept target hidden rows with h [n, H] (float32, host) as
 * if a main step had produced them; ms_forward_get_hidden reads them back (float32). */
int ms_forward_set_hidden(ms_forward *f, const float *h, int n, ms_err *err);
int ms_forward_get_hidden(ms_forward *f, float *h, int n, ms_err *err);

#endif
