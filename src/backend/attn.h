/* attn.h - attention implementations behind one interface, with names a user can force.
 *
 * The default kernel of a GPU can be the one that corrupts numerics there (a NaN in decode that only
 * a different sparse-attention kernel avoided, in a real GLM-5 deployment). So every attention path
 * has several implementations with different algorithms, each declaring what it supports and why
 * not, exactly like the MoE runners (moe/moe.h): `--attention-backend` chooses the one for GQA and
 * dense MLA, `--nsa-prefill-backend` / `--nsa-decode-backend` the one for DSA sparse attention (MLA
 * restricted to the indexer's top-k keys) in steps with / without prefill tokens (SGLang's flags).
 * `auto` takes the first supported implementation in registry order (fastest first); a forced one
 * that cannot run fails at start-up with a sentence naming the GPU, its compute capability, the
 * reason and the implementations that can. Callers choose by capability flags, never by name. */
#ifndef MS_BACKEND_ATTN_H
#define MS_BACKEND_ATTN_H

#include "backend/backend.h"

/* The attention paths a model asks for. */
typedef enum ms_attn_kind {
    MS_ATTN_GQA = 0, /* paged causal GQA over separate K/V caches (backend op attn_gqa) */
    MS_ATTN_MLA = 1, /* absorbed MLA over the latent cache, dense causal (mla_attn, topk NULL) */
    MS_ATTN_DSA = 2, /* absorbed MLA restricted to the DSA indexer's top-k keys (mla_attn with topk) */
    MS_ATTN_KINDS = 3
} ms_attn_kind;

/* What an implementation can do (callers choose by these flags, never by a name). */
enum {
    MS_ATTN_CAP_GQA = 1u << 0,          /* runs MS_ATTN_GQA */
    MS_ATTN_CAP_MLA = 1u << 1,          /* runs MS_ATTN_MLA */
    MS_ATTN_CAP_DSA = 1u << 2,          /* runs MS_ATTN_DSA */
    MS_ATTN_CAP_GRAPHS = 1u << 3,       /* run() may be recorded into a backend graph */
    MS_ATTN_CAP_SPLIT_KV = 1u << 4,     /* splits a long context across blocks (flash decoding) */
    MS_ATTN_CAP_TENSOR_CORES = 1u << 5, /* uses tensor-core MMA instructions */
    MS_ATTN_CAP_GQA_PREP = 1u << 6,     /* takes ms_attn_call.prep (GQA): does gqa_prep's work itself */
};

/* One attention call (or, for supports/workspace, a representative one: the model's shape with the
 * step's largest token count and context). */
typedef struct ms_attn_shape {
    ms_attn_kind kind;
    int n_heads, n_kv_heads; /* query heads on this rank; KV heads (1 for MLA) */
    int dk, dv;              /* key row width per head (MLA: kvl + dr), value width (MLA: kvl) */
    int topk;                /* DSA: keys per query; else 0 */
    int n_tokens, max_ctx;   /* largest step */
    ms_dtype dtype;          /* q / cache / output dtype */
    unsigned need_caps;      /* MS_ATTN_CAP_* the caller relies on beyond the kind (e.g. GRAPHS) */
} ms_attn_shape;

/* A GQA call whose q/k/v are still the raw projection outputs: the implementation first does exactly
 * what the backend op gqa_prep (backend.h) does with these arguments, with q = the call's q (written:
 * biased and rotated), kcache / vcache = the call's k / v (this step's rows stored at slot_d), then
 * attends. Why: in a decode step the tensor-core kernel does it in its own blocks, one launch less a
 * layer; where it cannot (a sequence with several new tokens, a shape it lacks) it runs gqa_prep's
 * kernel first, so a caller never needs to know which. The tensors are the caller's. The raw rows come
 * from the device work just before the call (the projection), which must write nothing else the call
 * reads (the caches, the batch meta, the biases): a kernel form may read those while that work is
 * still finishing. */
typedef struct ms_attn_gqa_prep {
    const ms_tensor *k, *v;        /* [T, nkv, d]: the raw k / v (only shapes when qkv is given) */
    const ms_tensor *bq, *bk, *bv; /* F32 biases or NULL */
    const int32_t *pos_d, *slot_d; /* device: position and cache slot of each token. A slot inside the
                                    * cache must be the token's own (its block-table row at its position,
                                    * as in every step the engine makes): the kernel form stores it while
                                    * other blocks read the cache. -1 or past the cache: nothing stored. */
    const ms_rope_cfg *rc;         /* NULL: no rotary dims */
    const ms_tensor *qkv;          /* NULL, or the stacked q|k|v projection output [T, (nh + 2 nkv) d] */
} ms_attn_gqa_prep;

/* The tensors of one call. GQA: k = kcache [S, nkv, d], v = vcache, out [T, nh, d]. MLA/DSA: k = the
 * latent cache [S, kvl+dr], v = NULL, out [T, nh, kvl]; DSA: topk_d [T, topk] (-1 = unused). */
typedef struct ms_attn_call {
    ms_attn_kind kind;
    const ms_tensor *q, *k, *v;
    const ms_attn_meta *m;
    const int32_t *topk_d;
    int topk, kvl;
    float scale;
    ms_tensor *out;
    const ms_attn_gqa_prep *prep; /* GQA, implementations with MS_ATTN_CAP_GQA_PREP only; NULL: q is
                                   * rotated and this step's keys and values are in the caches */
} ms_attn_call;

typedef struct ms_attn_impl {
    const char *name;    /* "mma", "flash", "flash_nosplit", "ref", "cpu" */
    const char *backend; /* backend name it runs on */
    const char *algo;    /* one line for doctor: what the algorithm is */
    /* 1 if it can run s on b; otherwise 0 and a reason in why (one clause). */
    int (*supports)(const ms_backend *b, const ms_attn_shape *s, char *why, size_t why_cap);
    /* Scratch bytes run() takes from the backend's scratch for shape s (reported; the backend holds it). */
    size_t (*workspace_size)(const ms_backend *b, const ms_attn_shape *s);
    /* Runs one call (asynchronously, as any backend op); overwrites c->out. */
    int (*run)(ms_backend *b, const ms_attn_call *c, ms_err *err);
    unsigned caps; /* MS_ATTN_CAP_* */
} ms_attn_impl;

/* All implementations compiled into this build (NULL-terminated), fastest first. */
const ms_attn_impl *const *ms_attn_impls(void);
/* The flag that chooses kind k's implementation ("--attention-backend", or "--nsa-prefill-backend"
 * when decode is 0 and "--nsa-decode-backend" when 1 for MS_ATTN_DSA). */
const char *ms_attn_flag(ms_attn_kind k, int decode);
/* 1 when impl runs s on b (its backend, its kind flag, need_caps, supports()); else 0 and why. */
int ms_attn_ok(const ms_attn_impl *impl, const ms_backend *b, const ms_attn_shape *s, char *why, size_t cap);
/* Resolves a flag value for shape s on b: "auto" (or NULL/empty) picks the first supported
 * implementation; a name must exist and support s. On failure the error is the one sentence
 * (flag, name, GPU and compute capability, reason, the implementations that can). *out is never NULL
 * on success. flag names the flag in messages. */
int ms_attn_resolve(const ms_backend *b, const char *flag, const char *name, const ms_attn_shape *s,
                    const ms_attn_impl **out, ms_err *err);
/* Runs c with impl, checking its kind against impl's capabilities (a mismatch is a clear error). */
int ms_attn_run(const ms_attn_impl *impl, ms_backend *b, const ms_attn_call *c, ms_err *err);

#endif
