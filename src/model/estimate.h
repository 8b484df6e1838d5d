/* estimate.h - how much memory a model needs, from its config alone (no weights read): weight bytes
 * per format (BF16, FP8 block, NVFP4) following the layouts moeserve loads and `quantize` writes,
 * KV cache bytes per token, a workspace allowance, per tensor-parallel rank; and how many GPUs of a
 * given memory size a context length and batch need. `inspect` prints it; docs/deployment.md's
 * table comes from it. */
#ifndef MS_MODEL_ESTIMATE_H
#define MS_MODEL_ESTIMATE_H

#include "core/status.h"
#include "model/config.h"

typedef enum { MS_EST_BF16, MS_EST_FP8, MS_EST_NVFP4 } ms_est_format;

typedef struct ms_estimate {
    double params_total;      /* weight elements loaded (MTP layers excluded) */
    double params_active;     /* elements one token reads (shared + top-k routed experts) */
    double weight_bytes;      /* all ranks together */
    double weight_bytes_rank; /* one tensor-parallel rank */
    double kv_bytes_token;    /* KV cache bytes of one token, all layers, one rank (bf16 cache) */
    double workspace_rank;    /* activations, logits, library workspaces: an allowance per rank */
} ms_estimate;

/* Parses "bf16" | "fp8" | "nvfp4" into *f; -1 on anything else. */
int ms_est_format_parse(const char *s, ms_est_format *f);

/* Fills e for cfg stored in format f, split over tp ranks, with room for batch_tokens tokens in one
 * forward step. Returns MS_OK, or an error when tp cannot split the model (the architecture's own
 * check, naming the field). */
int ms_estimate_memory(const ms_config *cfg, ms_est_format f, int tp, int batch_tokens, ms_estimate *e, ms_err *err);

/* The smallest power-of-two tensor-parallel degree (1..max_tp) at which weights + kv_tokens tokens
 * of KV + workspace fit in gpu_bytes * usable per GPU; 0 when none does. */
int ms_estimate_min_tp(const ms_config *cfg, ms_est_format f, double kv_tokens, int batch_tokens, double gpu_bytes,
                       double usable, int max_tp);

#endif
