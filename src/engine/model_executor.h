/* model_executor.h - builds the ms_executor the engine runs from a model directory: loads the
 * checkpoint, creates the backend, places weights, sizes the KV cache from the memory left, and
 * wraps ms_forward_run. This is what `serve`, `generate` and `bench-model` use. */
#ifndef MS_ENGINE_MODEL_EXECUTOR_H
#define MS_ENGINE_MODEL_EXECUTOR_H

#include "engine/engine.h"
#include "model/model.h"

typedef struct ms_exec_opts {
    const char *model_path;   /* checkpoint dir (or config file/dir for dummy) */
    const char *device;       /* "cpu" (default) or "cuda" */
    int device_index;
    const char *moe_runner;   /* "auto" default */
    /* attention implementations (backend/attn.h): --attention-backend (GQA, dense MLA),
     * --nsa-prefill-backend / --nsa-decode-backend (DSA sparse attention); NULL or "auto" default */
    const char *attn_backend, *nsa_prefill, *nsa_decode;
    const char *load_format;  /* "auto" | "dummy" */
    const char *dummy_quant;  /* for dummy: "bf16" | "fp8" | "nvfp4" */
    const char *const *overrides;
    int n_overrides;
    double mem_fraction_static; /* share of device memory for weights + KV (cuda); 0 = default 0.88 */
    int max_total_tokens;     /* KV tokens; 0 = derive from memory (cpu: 32768 capped by a quarter of RAM) */
    int page_size;            /* default 16 */
    int max_batch_tokens;     /* most tokens per forward; default 8192 */
    int check_numerics;       /* 1: every op (debugging); 2: per step, cheap (see ms_forward_opts) */
    int disable_graphs;       /* run decode steps op by op even where the backend can record graphs */
    int progress;
    int record_routing;       /* forward records distinct routed experts per layer (bench-model) */
    ms_decisions *record_decisions;        /* single-step record/replay (logits, compare); see model.h */
    const ms_decisions *replay_decisions;
    /* Tensor / expert parallelism (SGLang's flags): tp ranks (0/1 = one), ep expert groups dividing tp.
     * Ranks are threads of this process, one per local device (cpu: each rank its own CPU backend;
     * cuda: GPUs device_index, device_index + 1, ...), tp / nnodes of them per node. */
    int tp, ep;
    int nnodes, node_rank;       /* processes (nodes) of the run and this one's index (0 = serves) */
    const char *dist_init_addr;  /* HOST:PORT node 0 listens at (needed when nnodes > 1) */
    double dist_timeout_s;       /* bound on every collective and control message (0 = 60 s) */
    /* Speculative decoding (NEXTN): > 0 loads the checkpoint's MTP layer, gives it its KV cache layer
     * and sets ms_executor.draft (one rank only in this build). The value is the engine's
     * speculative_num_steps; the executor only needs it to be > 0. */
    int speculative_num_steps;
    /* Optional per-layer hook of rank 0's forward (see ms_forward_opts.on_layer; `compare`). */
    void (*on_layer)(void *ctx, int layer, const ms_tensor *hidden);
    void *on_layer_ctx;
} ms_exec_opts;

/* Opens everything; on success *out is ready for ms_engine_create and *model_out (may be NULL)
 * gets the loaded model (owned by the executor). */
int ms_model_executor_open(const ms_exec_opts *o, ms_executor *out, ms_model **model_out, ms_err *err);
/* Writes the model's end-of-sequence ids (generation_config wins over config) into ids[0..cap);
 * returns how many. */
int ms_model_executor_eos(const ms_executor *ex, int32_t *ids, int cap);
/* The backend and forward open made (owned by the executor), for tools that time or inspect them. */
ms_backend *ms_model_executor_backend(const ms_executor *ex);
ms_forward *ms_model_executor_forward(const ms_executor *ex);
/* Frees what open made (forward, backend, model; every rank's). On node 0 of a multi-node run it
 * first tells the other nodes to stop. */
void ms_model_executor_close(ms_executor *ex);
/* Node > 0 of a multi-node run: runs the forward of every step plan node 0 sends until node 0 says
 * stop (MS_OK) or the run breaks (node 0 gone, a collective failed or timed out: the error names the
 * cause). Node 0 and single-node executors return MS_OK at once. */
int ms_model_executor_follow(const ms_executor *ex, ms_err *err);
/* MS_OK while every rank and node of the executor can run steps; otherwise the cause (a failed
 * collective, a node whose connection closed). Cheap: for a health loop. */
int ms_model_executor_check(const ms_executor *ex, ms_err *err);

#endif
