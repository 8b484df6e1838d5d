/* moe.h - MoE expert computation behind one interface, with named runners.
 *
 * Routing (backend router op) produces per token the top-k expert ids and weights; a runner then
 * computes out[t] = sum_k w[t,k] * expert_{ids[t,k]}(x[t]) with SwiGLU experts
 * (down(silu(gate(x)) * up(x))). A shared expert is either run by the forward beside the runner, or
 * folded in as expert n - 1 of a layer's ms_experts (shared_last), which the runner adds for every
 * token itself (MS_MOE_CAP_SHARED_LAST) or receives appended to the ids.
 * Runners declare what they support; `auto` picks among those that do; a forced runner that cannot
 * run fails at start-up with a sentence naming the GPU, compute capability, reason and the runners
 * that can. */
#ifndef MS_MOE_MOE_H
#define MS_MOE_MOE_H

#include "backend/backend.h"

/* Routed experts of one layer: n experts, each three linears in the same format. */
typedef struct ms_experts {
    int n;
    ms_linear *gate; /* [n], each [I, H] */
    ms_linear *up;   /* [n], each [I, H] */
    ms_linear *down; /* [n], each [H, I] */
    void *prepared;  /* runner/backend-private form (e.g. device pointer tables); may be NULL */
    /* 1: expert n - 1 is a shared expert that every token also uses with weight 1 (a folded shared
     * expert). A runner with MS_MOE_CAP_SHARED_LAST is then given the router's top-k only and adds it
     * itself; the others are given ids with it appended as column k (ms_backend_ops.moe_append). */
    int shared_last;
} ms_experts;

/* What a runner can do beyond computing the routed MoE of a shape it supports (capability flags;
 * callers choose by these, never by a runner's name). */
enum {
    MS_MOE_CAP_GRAPHS = 1u << 0,      /* run() may be recorded into a backend graph (no host waits inside) */
    MS_MOE_CAP_PARTIAL = 1u << 1,     /* takes id -1 for an expert held by another rank (expert parallelism) */
    MS_MOE_CAP_FEW_TOKENS = 1u << 2,  /* made for decode-sized calls (auto prefers it up to the threshold) */
    MS_MOE_CAP_MANY_TOKENS = 1u << 3, /* made for prefill-sized calls (auto prefers it above the threshold) */
    MS_MOE_CAP_SHARED_LAST = 1u << 4, /* adds ms_experts.shared_last's expert itself (ids without it) */
};

/* What a runner is asked to do in one call (for supports/workspace/auto choice). */
typedef struct ms_moe_shape {
    int n_tokens, hidden, inter, n_experts, topk;
    ms_wfmt fmt;
    ms_dtype plain_dtype; /* weight dtype when fmt == PLAIN */
    unsigned need_caps;   /* MS_MOE_CAP_* the caller relies on (e.g. PARTIAL under expert parallelism) */
} ms_moe_shape;

typedef struct ms_moe_runner {
    const char *name;    /* "cpu", "naive", "grouped", "decode" */
    const char *backend; /* backend name it runs on */
    /* 1 if it can run this shape on b; otherwise 0 and a reason in why (one clause). */
    int (*supports)(const ms_backend *b, const ms_moe_shape *s, char *why, size_t why_cap);
    /* Scratch bytes run() needs for this shape (backend memory). */
    size_t (*workspace_size)(const ms_backend *b, const ms_moe_shape *s);
    /* One-time preparation of a layer's experts after placement (may be NULL). */
    int (*prepare)(ms_backend *b, ms_experts *e, ms_err *err);
    /* out [T,H] = routed MoE of x [T,H] (overwrites out). ids_d/w_d [T,topk] from the router. With
     * e->shared_last and MS_MOE_CAP_SHARED_LAST, topk excludes the shared expert (the caller sizes the
     * workspace with workspace_size of the shape that counts it: topk + 1). */
    int (*run)(ms_backend *b, const ms_experts *e, const ms_tensor *x, const int32_t *ids_d, const float *w_d,
               int topk, ms_tensor *out, void *workspace, size_t ws_bytes, ms_err *err);
    unsigned caps; /* MS_MOE_CAP_* */
    /* Optional (NULL: never), one token: n's add_rmsnorm (n->out written), the router (gate [E, H],
     * score-correction bias or NULL, rc) on n->out into ids_d / w_d [rc->topk], then run() on them, all
     * in the runner's launches. Why: at one token the router is a launch of its own in the decode chain
     * (~8 us a GLM-4.5-Air layer on the H200) that the experts' kernel can do in its blocks. The same
     * results as the backend's norm_router + run() (CUDA: the same bits, see mf_route in moe_fused.cu),
     * and as add_rmsnorm + router + run() where norm_router refuses, up to the order in which the norm's
     * sum of squares is added. May refuse (CUDA: also under MS_CU_ROUTER=warp or MS_CU_ROUTER_UNFUSED) with MS_ERR_UNSUPPORTED, nothing queued:
     * the caller then routes and calls run(). With e->shared_last, the runner has MS_MOE_CAP_SHARED_LAST
     * and adds the shared expert; the workspace is sized as for run(). */
    int (*run_routed)(ms_backend *b, const ms_experts *e, const ms_norm_in *n, const ms_linear *gate,
                      const ms_tensor *bias, const ms_route_cfg *rc, int32_t *ids_d, float *w_d, ms_tensor *out,
                      void *workspace, size_t ws_bytes, ms_err *err);
} ms_moe_runner;

/* All runners compiled into this build (NULL-terminated). */
const ms_moe_runner *const *ms_moe_runners(void);
/* Finds a runner by name for backend b; "auto" returns NULL in *out with MS_OK (choose per call
 * with ms_moe_pick). An unknown name or one that does not run on b fails with the one-sentence
 * explanation required above. `s` is a representative shape (model's). */
int ms_moe_resolve(const ms_backend *b, const char *name, const ms_moe_shape *s, const ms_moe_runner **out,
                   ms_err *err);
/* Picks the runner for one call: `forced` if non-NULL, else the best supported for s (auto policy,
 * using tuned thresholds when present). Never NULL on success. */
const ms_moe_runner *ms_moe_pick(const ms_backend *b, const ms_moe_runner *forced, const ms_moe_shape *s);
/* Sets the auto policy's threshold: calls with at most this many tokens prefer the "decode" runner
 * (default 16; a tuned value from `moeserve tune` replaces it). */
void ms_moe_set_auto_threshold(int decode_max_tokens);
/* Current auto threshold (tokens at most which prefer "decode"). */
int ms_moe_auto_threshold(void);
/* A launch form of the fused one-token MoE kernel (backend/cuda moe_fused.cu) for one expert shape:
 * hidden and intermediate sizes, slots (top-k plus a folded shared expert), and the form: groups of 8
 * warps a block and ring depth. Which form is fastest is not predictable from the shape (the kernel's
 * cost model misses by 0.5-1.5% of a decode step on the H200), so `moeserve tune` measures them and
 * the tuned file names the winner per shape. */
typedef struct ms_moe_form {
    int hidden, inter, slots;
    int groups, depth;
} ms_moe_form;
#define MS_MOE_MAX_FORMS 16 /* shapes with a recorded form in one process */
/* Records f's form for its shape, replacing one recorded for the same shape; groups == 0 drops the
 * shape's record. Returns 1, or 0 when the table already holds MS_MOE_MAX_FORMS other shapes or a
 * field is out of range (sizes 1..1048576, slots 1..64, groups 0..8, depth 1..64). Process-wide;
 * call it at start-up or between calls, never while a forward runs. */
int ms_moe_set_fused_form(const ms_moe_form *f);
/* The recorded form of shape (hidden, inter, slots): 1 with *groups and *depth set, or 0 (the kernel's
 * cost model decides). */
int ms_moe_fused_form(int hidden, int inter, int slots, int *groups, int *depth);
/* File base name (no .json) for a GPU's tuned values: lowercase, runs of other characters -> '-'
 * ("NVIDIA H200" -> "nvidia-h200"). */
void ms_moe_tuned_file_name(const char *gpu_name, char *out, size_t cap);
/* Applies dir/<tuned name of b's GPU>.json (written by `moeserve tune`) when the file exists and its
 * "gpu" equals b->gpu.name exactly: "moe_decode_max_tokens" sets the auto policy's threshold, each
 * well-formed entry of "moe_fused_forms" ({"hidden", "inter", "slots", "groups", "depth"}) records a
 * form (ms_moe_set_fused_form). Returns 1 when anything was applied, 0 otherwise (missing file, CPU
 * backend, other GPU, bad content: the heuristic defaults stay). */
int ms_moe_apply_tuned(const ms_backend *b, const char *dir);

/* One `moeserve tune` run's results, for ms_moe_tuned_write. Arrays are the caller's. */
typedef struct ms_moe_tune_result {
    const char *gpu;                 /* the backend's GPU name (the file's "gpu"), cc "major.minor" */
    int cc_major, cc_minor;
    int forms_only;                  /* 1: no crossover measured (the old file's is kept) */
    int decode_max_tokens;           /* the crossover: the decode runner up to this many tokens */
    const char *model, *quant;       /* what was measured: config path, expert format name */
    int hidden, inter, topk, n_experts;
    int n_tokens;                    /* token counts timed, with each runner's us a call (0 with forms_only) */
    const int *tokens;
    const double *us_decode, *us_grouped;
    ms_moe_form best;                /* the fastest fused form (groups 0: none measured) */
    int n_forms;                     /* every form timed: its groups, depth and us a call (< 0: did not fit) */
    const int *form_groups, *form_depth;
    const double *form_us;
    double cost_model_us;            /* the time of the cost model's choice (< 0: unknown) */
} ms_moe_tune_result;
/* Writes dir/<tuned name of r->gpu>.json (through a temporary file renamed over it), which
 * ms_moe_apply_tuned reads back: the crossover, what was measured and the per-call times (with
 * forms_only, the old file's, when it names the same GPU), and the fused forms: the old file's entries
 * for other shapes kept, this run's best form added with its per-form times. path [cap] receives the
 * file's path. Returns MS_OK or an error naming the file. dir must exist. */
int ms_moe_tuned_write(const char *dir, const ms_moe_tune_result *r, char *path, size_t cap, ms_err *err);

#endif
