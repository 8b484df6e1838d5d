/* backend.h - the ops every backend implements; the model forward is written once against it.
 *
 * A backend owns a memory space (host for "cpu", one GPU for "cuda") and a stream of ops on it.
 * Ops may run asynchronously (CUDA); sync() waits. All tensors are contiguous views in the
 * backend's memory (core/tensor.h). Activations use the backend's act_dtype (F32 on the CPU, BF16
 * on CUDA) unless an op says otherwise; reductions accumulate in float32 everywhere.
 *
 * Shapes below use T = tokens in the step, H = hidden size, nh = heads, d = head dim. Every op
 * returns MS_OK or an error status with a message (never aborts on bad data; asserts on shape
 * mismatches, which are bugs). Pointer arguments suffixed _d are backend memory (device arrays). */
#ifndef MS_BACKEND_BACKEND_H
#define MS_BACKEND_BACKEND_H

#include "core/status.h"
#include "core/batch.h"
#include "core/tensor.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ms_backend ms_backend;

/* Per-step attention metadata: the batch arrays copied into backend memory once per forward
 * (host copies kept for launch sizing). token_seq_d[t] = sequence index of token t. */
typedef struct ms_attn_meta {
    const ms_batch *host;
    int max_ctx;                 /* max over ctx_len */
    const int32_t *positions_d;  /* [T] */
    const int32_t *seq_start_d;  /* [n_seqs+1] */
    const int32_t *ctx_len_d;    /* [n_seqs] */
    const int32_t *slot_mapping_d; /* [T] */
    const int32_t *block_table_d;  /* [n_seqs*max_blocks] */
    const int32_t *token_seq_d;    /* [T] */
} ms_attn_meta;

/* Routing parameters of noaux_tc (spec 3.9). */
typedef struct ms_route_cfg {
    int n_experts, topk, n_group, topk_group;
    int norm_topk_prob;
    float routed_scaling_factor;
} ms_route_cfg;

/* Rotary embedding of dims [rot_off, rot_off+rot_dim) of each head: inv_freq_i = theta^(-2i/rot_dim),
 * angle = pos * inv_freq_i computed in float32 as transformers does. interleaved=1: GPT-J pairs
 * (2i, 2i+1); 0: NeoX pairs (i, i+rot_dim/2). */
typedef struct ms_rope_cfg {
    int rot_off, rot_dim, interleaved;
    double theta;
} ms_rope_cfg;

/* An add_rmsnorm handed to the op that reads its output (norm_linear, norm_router): resid += delta
 * (delta NULL: resid is only read), out = resid / sqrt(mean(resid²) + eps) * w, one row or more of
 * [R, H]. The tensors are the caller's. */
typedef struct ms_norm_in {
    ms_tensor *resid;
    const ms_tensor *delta;
    const ms_tensor *w;
    float eps;
    ms_tensor *out;
} ms_norm_in;

/* The one-row preparations between an MLA layer's input projections and the products that read them
 * (mla_prep): cq [T, ql] = RMSNorm(cq) * q_norm (q_eps), in place; the latent kva as mla_kv_prep (kvl,
 * kv_norm, kv_eps, kv_rope, kv_cache); with kI != NULL the indexer key as idx_k_prep (kI_w, kI_b may be
 * NULL, kI_eps, kI_rope, kI_cache). Positions and cache slots pos_d / slot_d [T] serve both stores. The
 * tensors are the caller's. */
typedef struct ms_mla_prep {
    ms_tensor *cq;
    const ms_tensor *q_norm;
    float q_eps;
    ms_tensor *kva;
    int kvl;
    const ms_tensor *kv_norm;
    float kv_eps;
    const ms_rope_cfg *kv_rope;
    ms_tensor *kv_cache;
    ms_tensor *kI;
    const ms_tensor *kI_w, *kI_b;
    float kI_eps;
    const ms_rope_cfg *kI_rope;
    ms_tensor *kI_cache;
    const int32_t *pos_d, *slot_d;
} ms_mla_prep;

typedef struct ms_backend_ops {
    void (*destroy)(ms_backend *b);

    /* ---- memory ---- */
    /* Allocates t->data for t's dtype/shape (uninitialised). */
    int (*alloc)(ms_backend *b, ms_tensor *t, ms_err *err);
    void (*free)(ms_backend *b, ms_tensor *t);
    int (*upload)(ms_backend *b, void *dst_d, const void *src_host, size_t n, ms_err *err);
    int (*download)(ms_backend *b, void *dst_host, const void *src_d, size_t n, ms_err *err);
    int (*sync)(ms_backend *b, ms_err *err);
    /* Moves a host-memory weight view into backend memory (CPU: keeps the view, no copy). After
     * this t->data is backend memory. place_linear may also build a prepared form (W->prepared). */
    int (*place_tensor)(ms_backend *b, ms_tensor *t, ms_err *err);
    int (*place_linear)(ms_backend *b, ms_linear *W, ms_err *err);
    /* Releases what place_* made (CPU: nothing). */
    void (*unplace_tensor)(ms_backend *b, ms_tensor *t);
    void (*unplace_linear)(ms_backend *b, ms_linear *W);
    /* Optional: stacks n placed linears of one input width, format and dtype into out, whose output
     * rows are the parts' rows in order (x·outᵀ = the parts' outputs side by side), biases likewise
     * (zeros for a part without one; out has a bias if any part has). The parts become views into
     * out's memory (their own is released; they stay usable and unplace_linear of a part frees
     * nothing), so memory does not grow. Why: at decode one launch streaming all the rows reaches the
     * bandwidth the three separate small GEMVs miss. MS_ERR_UNSUPPORTED (nothing changed) when the
     * parts cannot be stacked; out owns the memory (unplace_linear frees it). */
    int (*stack_linears)(ms_backend *b, ms_linear *const *parts, int n, const char *name, ms_linear *out, ms_err *err);

    /* ---- elementwise / norms ---- */
    /* out[t,:] = table[ids_d[t],:] converted to out's dtype. table [V,H] (any float dtype). */
    int (*embed)(ms_backend *b, const ms_tensor *table, const int32_t *ids_d, int n, ms_tensor *out, ms_err *err);
    /* out = x / sqrt(mean(x²)+eps) * w over the last dim D of x [R,D]; out may alias x. */
    int (*rmsnorm)(ms_backend *b, const ms_tensor *x, const ms_tensor *w, float eps, ms_tensor *out, ms_err *err);
    /* resid += delta (when delta != NULL), then out = rmsnorm(resid). */
    int (*add_rmsnorm)(ms_backend *b, ms_tensor *resid, const ms_tensor *delta, const ms_tensor *w, float eps,
                       ms_tensor *out, ms_err *err);
    /* LayerNorm over last dim with weight and bias; out may alias x. */
    int (*layernorm)(ms_backend *b, const ms_tensor *x, const ms_tensor *w, const ms_tensor *bias, float eps,
                     ms_tensor *out, ms_err *err);
    /* y += x (same shape). */
    int (*add)(ms_backend *b, ms_tensor *y, const ms_tensor *x, ms_err *err);
    /* out = silu(g) * u, all [T,I]. */
    int (*silu_mul)(ms_backend *b, const ms_tensor *g, const ms_tensor *u, ms_tensor *out, ms_err *err);
    /* dst[t, :] = src[t, c0:c0+nc] for src [T,C], dst [T,nc]. */
    int (*copy_cols)(ms_backend *b, const ms_tensor *src, int c0, int nc, ms_tensor *dst, ms_err *err);
    /* dst[r,:] = src[idx_d[r],:] for r < n. */
    int (*gather_rows)(ms_backend *b, const ms_tensor *src, const int32_t *idx_d, int n, ms_tensor *dst, ms_err *err);
    /* dst[t, c0:c0+nc] = src[t, :] for src [T,nc], dst [T,C] (inverse of copy_cols). */
    int (*set_cols)(ms_backend *b, const ms_tensor *src, int c0, ms_tensor *dst, ms_err *err);
    /* x *= alpha elementwise (in place). */
    int (*scale)(ms_backend *b, ms_tensor *x, float alpha, ms_err *err);
    /* x [T, nh, d] rotated in place at positions pos_d[T]. */
    int (*rope)(ms_backend *b, ms_tensor *x, const int32_t *pos_d, const ms_rope_cfg *rc, ms_err *err);

    /* Vocabulary-parallel embedding (tensor parallelism): the table holds rows [v0, v0 + rows) of the
     * vocabulary; out[t,:] = table[ids_d[t] - v0,:] for ids in that range and 0 for the others (another
     * rank contributes them; the forward sums over ranks). Ids outside [0, vocab) are the caller's
     * to refuse. Optional (NULL: the backend cannot take a split model). */
    int (*embed_part)(ms_backend *b, const ms_tensor *table, const int32_t *ids_d, int n, int64_t v0, ms_tensor *out,
                      ms_err *err);
    /* Expert parallelism: ids_d[i] becomes ids_d[i] - lo when lo <= ids_d[i] < lo + count, else -1 (an
     * expert another rank holds), for i < n. Optional, as embed_part. */
    int (*remap_ids)(ms_backend *b, int32_t *ids_d, int64_t n, int lo, int count, ms_err *err);
    /* ids_out [T, k+1] / w_out [T, k+1] = ids [T, k] / w [T, k] with column k set to (id, weight) in
     * every row: how the forward hands a shared expert to the routed-expert runner as one more expert
     * of each token (one runner call instead of the shared expert's own GEMMs and an add). Optional. */
    int (*moe_append)(ms_backend *b, const int32_t *ids_d, const float *w_d, int T, int k, int32_t id, float weight,
                      int32_t *ids_out_d, float *w_out_d, ms_err *err);

    /* ---- GEMM ---- */
    /* y [T,N] = x [T,K] · Wᵀ (+ bias). y may be act_dtype or F32. Any weight format. */
    int (*linear)(ms_backend *b, const ms_linear *W, const ms_tensor *x, ms_tensor *y, ms_err *err);

    /* Optional fused forms of an add_rmsnorm and the op that reads its output first: n's
     * add_rmsnorm (n->resid += n->delta, n->out = rmsnorm(n->resid) · n->w; n->out is written too, later
     * ops read it), then linear(W, n->out, y) / router(n->out, gate, ...). Why: at one row the norm is a
     * launch of its own that moves almost nothing, ~4 us of a decode step's kernel chain a norm (H200);
     * the consumer's blocks can compute it themselves. May refuse (MS_ERR_UNSUPPORTED, nothing done):
     * the caller then runs add_rmsnorm and the op. NULL = never. */
    int (*norm_linear)(ms_backend *b, const ms_norm_in *n, const ms_linear *W, ms_tensor *y, ms_err *err);
    int (*norm_router)(ms_backend *b, const ms_norm_in *n, const ms_linear *gate, const ms_tensor *bias,
                       const ms_route_cfg *rc, int32_t *ids_d, float *w_d, ms_err *err);

    /* Optional fused form of silu(x·gateᵀ) * (x·upᵀ) -> out [T, I] (act dtype). May refuse a shape
     * with MS_ERR_UNSUPPORTED; the caller then runs the two linears and silu_mul. NULL = never. */
    int (*linear_swiglu)(ms_backend *b, const ms_linear *gate, const ms_linear *up, const ms_tensor *x, ms_tensor *out,
                         ms_err *err);

    /* Optional fused form of what follows the q/k/v projections of a GQA layer without q/k norm:
     * q [T,nh,d] += bq then rotated in place; k [T,nkv,d] + bk rotated and stored into kcache rows
     * slot_d[t]; v + bv stored into vcache (k and v themselves unchanged). Biases F32 or NULL; rc
     * NULL = no rotary dims, else rc->rot_dim <= 1024. Equals add-bias, rope and kv_store up to one bf16
     * rounding fewer. With qkv non-NULL (the output [T, (nh + 2 nkv) d] of a stack_linears'd q|k|v
     * projection), q, k and v are read from its rows instead (k and v are then only shapes: their data
     * is not read) and q is written to q. */
    int (*gqa_prep)(ms_backend *b, ms_tensor *q, const ms_tensor *k, const ms_tensor *v, const ms_tensor *bq,
                    const ms_tensor *bk, const ms_tensor *bv, const int32_t *pos_d, const ms_rope_cfg *rc,
                    ms_tensor *kcache, ms_tensor *vcache, const int32_t *slot_d, const ms_tensor *qkv, ms_err *err);

    /* Optional fused form of what follows kv_a_proj in an MLA layer: for each token t, the row
     * kva [T, kvl + dr] becomes [RMSNorm(kva[:kvl]) * w (eps) ; RoPE(kva[kvl:])] (rc covers columns
     * kvl..kvl+dr, positions pos_d), written back into kva and into latent-cache row slot_d[t] (skipped
     * when out of range). Equals copy_cols, rmsnorm, set_cols, rope and kv_store up to the order of the
     * norm's fp32 sum. w bf16 or f32 [kvl]. */
    int (*mla_kv_prep)(ms_backend *b, ms_tensor *kva, int kvl, const ms_tensor *w, float eps, const int32_t *pos_d,
                       const ms_rope_cfg *rc, ms_tensor *cache, const int32_t *slot_d, ms_err *err);

    /* Optional fused form of the DSA indexer key's preparation: each row t of x [T, d] becomes
     * RoPE(LayerNorm(x[t]) * w + bias) (LayerNorm over all d columns with eps; bias NULL = none; rc a
     * rotation inside the row, at position pos_d[t]), written back into x and into row slot_d[t] of
     * cache [S, d]. Gives exactly what layernorm (out = x), rope (x seen as [T, 1, d]) and kv_store give,
     * bit for bit, including kv_store's handling of an out-of-range slot. Why: three launches that move
     * a few hundred bytes per token in every indexer layer of a decode step. MS_ERR_UNSUPPORTED (nothing
     * done) for a shape the backend cannot take; the caller then runs the three ops. */
    int (*idx_k_prep)(ms_backend *b, ms_tensor *x, const ms_tensor *w, const ms_tensor *bias, float eps,
                      const int32_t *pos_d, const ms_rope_cfg *rc, ms_tensor *cache, const int32_t *slot_d, ms_err *err);

    /* Optional: rmsnorm of p->cq, mla_kv_prep of p->kva and (p->kI) idx_k_prep of p->kI in one launch
     * (ms_mla_prep), each as its op gives it up to the order of its fp32 sums. Why: at a one-token step
     * these are three single-block kernels of a dependent chain, ~4-6 us each (H200, session 14), for a
     * few KB. MS_ERR_UNSUPPORTED (nothing done) when a part's shape is one its op would refuse or the
     * parts' row counts differ; the caller then runs the ops. */
    int (*mla_prep)(ms_backend *b, const ms_mla_prep *p, ms_err *err);

    /* ---- KV cache and attention ---- */
    /* cache [S, W] row slot_d[t] = x [T, W] row t (converting dtype). */
    int (*kv_store)(ms_backend *b, ms_tensor *cache, const ms_tensor *x, const int32_t *slot_d, ms_err *err);
    /* Paged causal GQA. q [T, nh, d]; kcache/vcache [S, nkv, d]; token t of sequence s attends
     * positions 0..positions[t] of s, found via block_table. out [T, nh, d]. */
    int (*attn_gqa)(ms_backend *b, const ms_tensor *q, const ms_tensor *kcache, const ms_tensor *vcache,
                    const ms_attn_meta *m, float scale, ms_tensor *out, ms_err *err);
    /* MLA in absorbed form (spec 3.6) over the latent cache [S, kvl + dr] (c ; k_rope). q [T, nh, kvl+dr]
     * = (q_abs ; q_rope). topk_d [T, topk] lists the key positions each query may attend (-1 =
     * unused); NULL = dense causal. out [T, nh, kvl] = softmax-weighted sum of c. */
    int (*mla_attn)(ms_backend *b, const ms_tensor *q, const ms_tensor *latent, const ms_attn_meta *m,
                    const int32_t *topk_d, int topk, int kvl, float scale, ms_tensor *out, ms_err *err);
    /* q [T, nh, dn+dr] -> out [T, nh, kvl+dr]: out[:,h,:kvl] = q_nope_h · W_UK_h, out[:,h,kvl:] = q_rope_h.
     * kv_b is kv_b_proj [nh*(dn+dv), kvl] in any format. rc != NULL: the copied rope part is rotated at
     * positions pos_d[T] exactly as the rope op with rc on q [T, nh, dn+dr] would rotate it (rc's columns
     * are q's, inside [dn, dn+dr); MS_ERR_INVALID otherwise), while q itself stays unrotated. Why: the
     * forward's separate RoPE launch on q, whose only reader is this op. */
    int (*mla_absorb_q)(ms_backend *b, const ms_linear *kv_b, const ms_tensor *q, int nh, int dn, int dr, int dv,
                        const int32_t *pos_d, const ms_rope_cfg *rc, ms_tensor *out, ms_err *err);
    /* o_lat [T, nh, kvl] -> out [T, nh*dv]: out[:,h,:] = o_lat_h · W_UV_hᵀ. */
    int (*mla_v_up)(ms_backend *b, const ms_linear *kv_b, const ms_tensor *o_lat, int nh, int dn, int dv,
                    ms_tensor *out, ms_err *err);
    /* DSA indexer (spec 3.8): score I(s,t) = sum_j w[s,j] * relu(qI[s,j]·kI(t) * d^-1/2) over causal keys
     * t (positions 0..positions[s] of s's sequence, read from idx_cache [S, d] via block_table); writes
     * the positions of the top-k scores to out_d [T, topk] (any order; -1 pads when fewer keys).
     * qI [T, nih, d], w [T, nih] (already multiplied by nih^-1/2). */
    int (*indexer_topk)(ms_backend *b, const ms_tensor *qI, const ms_tensor *w, const ms_tensor *idx_cache,
                        const ms_attn_meta *m, int topk, int32_t *out_d, ms_err *err);

    /* ---- MoE routing ---- */
    /* logits = x [T,H] · gateᵀ in float32; s = sigmoid; choose by s + bias (bias may be NULL) with
     * group-limited top-k; weights = s[idx] (normalized if asked) * scale. ids_d [T,k] int32,
     * w_d [T,k] float32. */
    int (*router)(ms_backend *b, const ms_tensor *x, const ms_linear *gate, const ms_tensor *bias,
                  const ms_route_cfg *rc, int32_t *ids_d, float *w_d, ms_err *err);

    /* ---- checks and sampling helpers ---- */
    /* Finds the first row of x [R, C] holding NaN/Inf: *bad_row = row or -1. */
    int (*find_nonfinite)(ms_backend *b, const ms_tensor *x, int64_t *bad_row, ms_err *err);
    /* The per-step check of --check-numerics, queued without a host wait (recordable into graphs):
     * x == NULL sets *flag_d = INT32_MAX; otherwise, when x (F32 or BF16) holds a NaN/Inf,
     * *flag_d = min(*flag_d, code). flag_d: one int32 in backend memory. Optional (NULL: the forward
     * uses find_nonfinite, which waits). */
    int (*nonfinite_flag)(ms_backend *b, const ms_tensor *x, int32_t code, int32_t *flag_d, ms_err *err);
    /* out_d[r] = the greedy choice of logits row r (F32 [R, V]), by ms_greedy_argmax's rule (core/tensor.h): the first
     * index holding the largest value, where NaN never wins and +inf counts as FLT_MAX; 0 when no value
     * is above -inf. So a step whose rows are all greedy can download R ids instead of R x V floats. */
    int (*argmax)(ms_backend *b, const ms_tensor *logits, int32_t *out_d, ms_err *err);

    /* ---- recorded op sequences (CUDA graphs); all NULL on backends without them ---- */
    /* From graph_begin to graph_end the ops are recorded, not run: nothing executes, and ops that need
     * the host to wait (upload, download, sync, buffer growth) fail, which makes graph_end fail too. */
    int (*graph_begin)(ms_backend *b, ms_err *err);
    /* Ends the recording. *exec = an executable graph owned by the caller (graph_free), or on failure
     * NULL and an error; either way the backend runs ops normally again. */
    int (*graph_end)(ms_backend *b, void **exec, ms_err *err);
    /* Runs a recorded graph on the backend's stream (asynchronously, like any op). */
    int (*graph_launch)(ms_backend *b, void *exec, ms_err *err);
    void (*graph_free)(ms_backend *b, void *exec);
    /* Page-locks host memory [p, p+n) for fast downloads into it (optional; undo with host_unpin before
     * the memory is freed). */
    int (*host_pin)(ms_backend *b, void *p, size_t n, ms_err *err);
    void (*host_unpin)(ms_backend *b, void *p);
    /* Changes whenever the backend's internal buffers (scratch, workspaces) move; a graph recorded at
     * another epoch may point at freed memory and must not be launched. */
    uint64_t (*mem_epoch)(const ms_backend *b);

    /* ---- weights generated in backend memory, device facts (optional; NULL: the host does it) ---- */
    /* --load-format dummy without a host copy: allocates t->data (t's dtype F32/BF16 and shape set)
     * and fills it with offset + amp * U(-1,1) seeded by seed; released by unplace_tensor. */
    int (*dummy_tensor)(ms_backend *b, ms_tensor *t, float offset, float amp, uint64_t seed, ms_err *err);
    /* Makes W (name, fmt, n_out, n_in set) a placed weight of seeded random values in its own format,
     * dequantized variance about 1/n_in (as model/dummy.c), with an F32 bias when with_bias; released
     * by unplace_linear. */
    int (*dummy_linear)(ms_backend *b, ms_linear *W, int with_bias, uint64_t seed, ms_err *err);
    /* Refreshes b->gpu (name, compute capability, memory total and free now). */
    int (*device_info)(ms_backend *b, ms_err *err);
} ms_backend_ops;

typedef struct ms_gpu_info {
    char name[128];
    int cc_major, cc_minor;
    size_t mem_total, mem_free;
    int n_sm;
} ms_gpu_info;

struct ms_backend {
    const ms_backend_ops *ops;
    const char *name;     /* "cpu" or "cuda" */
    ms_dtype act_dtype;   /* F32 (cpu) or BF16 (cuda) */
    int device;           /* GPU ordinal, -1 for cpu */
    ms_gpu_info gpu;      /* filled by cuda */
    void *impl;
};

/* Creates a backend by name: "cpu" or "cuda" (device = GPU ordinal). A build without CUDA or a
 * machine without a GPU gives a clear MS_ERR_UNSUPPORTED. */
int ms_backend_create(const char *name, int device, ms_backend **out, ms_err *err);
void ms_backend_destroy(ms_backend *b);
/* 1 when this build has the CUDA backend compiled in. */
int ms_backend_cuda_compiled(void);

/* GPU ceilings for benchmarks: device-to-device copy bandwidth (GB/s, bytes read + written counted
 * once each) and dense bf16 GEMM rate (TFLOP/s), measured now. MS_ERR_UNSUPPORTED on the CPU. */
int ms_backend_gpu_ceilings(ms_backend *b, double *copy_gbs, double *bf16_tflops, ms_err *err);

/* Convenience: allocate a tensor of dtype/shape in backend memory. */
int ms_backend_alloc(ms_backend *b, ms_tensor *t, ms_dtype dtype, int ndim, const int64_t *shape, ms_err *err);

#endif
