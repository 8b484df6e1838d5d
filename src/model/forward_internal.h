/* forward_internal.h - state shared by the architecture-independent forward (forward.c) and the
 * architecture tables (arch_*.c: attention, its workspace and KV cache). Everything here is
 * allocated once in ms_forward_create; a step only takes views of it. */
#ifndef MS_MODEL_FORWARD_INTERNAL_H
#define MS_MODEL_FORWARD_INTERNAL_H

#include "model/model.h"
#include "backend/attn.h"

/* A step's batch arrays in backend memory, packed in one buffer so a step uploads them at once. */
typedef struct fw_dbatch {
    ms_tensor buf; /* I32 */
    int32_t *tok, *pos, *start, *ctx, *slot, *seq, *lidx, *bt;
} fw_dbatch;

/* A step recorded as a backend graph (CUDA graph). Three kinds (fw_graph.kind): FW_G_MAIN, the main
 * model over B sequences of q tokens each with logits for every token (q = 1: a pure decode step;
 * 2 <= q <= FW_GRAPH_MAX_Q: a speculative verification), and FW_G_MTP_TARGET / FW_G_MTP_DRAFT, one MTP
 * (NEXTN) step of one token per sequence whose hidden rows come from f->hid (the last main step) or
 * f->mtp_out (the last MTP step: draft_phase's chained steps). The key is (kind, B, q, mbc): the
 * sequence count B (a bucket), the tokens per sequence q and the block-table class mbc (attention is
 * sized for mbc * page_size keys: meta.max_ctx). Every host-side decision inside a step (attention
 * launch grids and key splits, the DSA dense/sparse choice and decode/prefill implementation, the
 * indexer's score layout, the MoE runner and shared-expert folding, logit chunks) is a function of
 * T = B * q, B, the uniform q and mbc, so one recording serves every step of its key. The graph replays
 * fixed kernels on fixed buffers, so the batch is padded to exactly this shape: padding sequences have
 * q tokens of id 0 at positions 0..q-1 with a context of q, hidden row 0 for MTP kinds, and write
 * their K/V into the pad page (the cache's extra last page, never handed to the engine). */
#define FW_MAX_GRAPHS 144
#define FW_GRAPH_MAX_Q 16
enum { FW_G_MAIN = 0, FW_G_MTP_TARGET = 1, FW_G_MTP_DRAFT = 2 };
typedef struct fw_graph {
    int kind, B, q, mbc;
    int runs;       /* eager runs of this shape so far: the first runs eagerly, the second records */
    int failed;     /* recording failed: this shape always runs eagerly */
    void *exec;     /* backend graph, or NULL */
    uint64_t epoch; /* backend memory epoch the graph was recorded in */
    fw_dbatch db;   /* device arrays the graph reads (fixed addresses) */
    ms_batch hb;    /* the padded host batch; arrays in hbuf */
    int32_t *hbuf;
    int32_t *hidx;  /* MTP kinds: the padded hidden-row indices (in hbuf), uploaded to f->hidx */
} fw_graph;

struct ms_forward {
    ms_model *m;
    ms_backend *b;
    ms_forward_opts o;
    const ms_moe_runner *forced; /* NULL = auto per call */
    /* attention implementations, resolved at creation: [MS_ATTN_GQA], [MS_ATTN_MLA], [MS_ATTN_DSA] for
     * steps with prefill tokens (NULL where the model has no such path); nsa_decode for DSA in pure
     * decode steps */
    const ms_attn_impl *attn_impl[MS_ATTN_KINDS], *nsa_decode;
    int max_tokens, lchunk;      /* lchunk: logit rows per lm_head call */
    int64_t n_slots;             /* n_pages * page_size */
    /* KV memory per layer: glm4_moe k/v [S, nkv, d]; glm_moe_dsa latent [S, kvl+dr] (k slot) and
     * indexer keys [S, di] (v slot, full layers only) */
    ms_tensor *kc, *vc;
    /* activations (backend memory, row capacity max_tokens): act dtype, except x, delta, sh_out and lrows
     * which are F32 (the residual stream and what is added to it) */
    ms_tensor x, a, delta, g, u, moe_out, sh_out;
    ms_tensor q, k, v, attn;                   /* glm4_moe */
    ms_tensor qkv;                             /* output of the layers' a_stack [qkv_rows, W], or NULL data */
    int qkv_rows;                              /* steps of at most this many tokens use a_stack */
    ms_tensor qa, qb, qabs, kva, c, olat, vout; /* glm_moe_dsa */
    ms_tensor qI, kI, iw, topk;                 /* DSA indexer (topk: I32 [T, index_topk]) */
    ms_tensor ids, rw;                          /* router out: I32/F32 [T, topk] */
    /* Shared expert folded into the routed call: per layer the routed experts plus the shared one as
     * expert n (n = 0 where the layer keeps it separate); ids2/rw2 [T, topk + 1] carry it. */
    ms_experts *fold;
    ms_tensor ids2, rw2;
    ms_tensor rlog;                             /* F32 [T, E] router logits (record/replay only) */
    float *h_rlog, *h_rw;                       /* host copies for record/replay */
    int32_t *h_sel;                             /* host [T, index_topk] (record/replay only) */
    ms_tensor lrows, lnorm, logits;             /* [lchunk, H], [lchunk, H], F32 [lchunk, V] */
    ms_tensor lgather;                          /* tensor parallelism: F32 [lchunk, V] gathered rank-major */
    ms_tensor moe_ws;                           /* U8 */
    ms_tensor nf_flag;                          /* I32 [1]: --check-numerics step flag (first bad layer) */
    /* batch arrays in backend memory (eager steps) and the step's current token ids / logit rows */
    fw_dbatch db;
    const int32_t *tok_d, *lidx_d;
    int32_t *h_pack; /* host staging of the packed arrays */
    int64_t h_pack_cap;
    /* recorded steps (CUDA graphs); graphs_on = allowed by the options and the backend; gmax = most
     * tokens (B * q) of a graph step; glaunch = graph launches per ms_graph_kind (model.h) */
    int graphs_on, gmax, graph_warned, n_graphs;
    fw_graph graphs[FW_MAX_GRAPHS];
    ms_tensor glogits; /* F32 [gmax, V]: logits of graph steps */
    /* ms_forward_run_argmax: amax I32 [max_tokens] takes each logit row's greedy choice on the backend
     * (data NULL when the backend has no argmax op); argmax_step = 1 while such a step runs, which makes
     * head_rows and run_graph fill amax instead of downloading logits */
    ms_tensor amax;
    int argmax_step;
    uint64_t glaunch[MS_GRAPH_KINDS];
    int *routed;    /* [num_layers] distinct experts of the last step (record_routing) */
    int routing_paused; /* record_routing switched off for timed steps (no per-layer download) */
    int32_t *h_ids; /* [max_tokens * topk] host copy of router ids (record_routing) */
    /* profiling (bench-model --profile): per-section GPU time, each section bracketed by syncs */
    int prof_on;
    int prof_n;
    const char *prof_name[32];
    double prof_s[32];
    double prof_t0;
    /* MTP (NEXTN) draft layer (opts.mtp): hid = the last step's final-normed hidden rows [T, H] (what
     * the lm_head reads, kept for every token), mtp_out = the last MTP step's shared_head-normed rows of
     * its logit rows (what a chained draft step reads), mcat [T, 2H] the eh_proj input, hidx I32 [T]
     * the hidden row of each MTP token */
    int mtp_on;
    ms_tensor hid, mtp_out, mcat, hidx;
    /* per-step state */
    const ms_batch *batch;
    ms_attn_meta meta;
    int layer;
    int split;      /* a communicator is given: the split code paths run (also with one rank) */
    int topk_valid; /* DSA: f->topk holds a sparse selection made by the last full indexer layer */
    /* A residual add + RMSNorm not run yet (one-token steps, fw_add_norm): resid += delta, out =
     * rmsnorm(resid) * w, with out = f->a. The next op that reads f->a runs it, folded into itself where
     * the backend can (fw_linear_a, the router in mlp: backend.h norm_linear / norm_router), or first
     * (fw_norm_flush). Why: at one token the norm kernel moves almost nothing but is a link of ~4 us in
     * the step's chain of kernels; the consumer's blocks compute it for ~1 us. */
    struct {
        int on;
        ms_tensor resid, delta, out;
        const ms_tensor *w;
        float eps;
    } pend;
};

/* Layers with a KV cache: the decoder layers, plus the MTP layer (index cfg.num_layers) when on. */
static inline int fw_cache_layers(const ms_forward *f) { return f->m->cfg.num_layers + (f->mtp_on ? 1 : 0); }

/* Runs this step's attention of kind k (GQA / MLA / DSA) with the implementation resolved for it:
 * for DSA the decode one when every sequence has one token in the step, the prefill one otherwise. */
int fw_attention(ms_forward *f, ms_attn_call *c, ms_err *err);
/* Capability flags (MS_ATTN_CAP_*) of the implementation resolved for kind k; 0 when none is. */
unsigned fw_attn_caps(const ms_forward *f, ms_attn_kind k);

/* View of the first rows*cols elements of buffer buf as a [rows, cols] tensor (asserts capacity). */
ms_tensor fw_view2(const ms_tensor *buf, int64_t rows, int64_t cols);
ms_tensor fw_view3(const ms_tensor *buf, int64_t a, int64_t b, int64_t c);
/* Columns [c0, c0 + n) of the one-row tensor row ([1, W]) as a [1, n] tensor: a stacked projection's
 * output split into its parts without a copy (only one row is contiguous per part). */
ms_tensor fw_piece(const ms_tensor *row, int64_t c0, int64_t n);
/* With check_numerics: fails with MS_ERR_NUMERICS naming layer, op and token position when t (rows =
 * tokens of this step, or logit rows when logit_rows) holds NaN/Inf. */
int fw_check(ms_forward *f, const ms_tensor *t, const char *op, int logit_rows, ms_err *err);
/* The result rc of an optional fused backend op (linear_swiglu, idx_k_prep, ...) that was given its
 * own error record ferr: MS_OK (done), MS_ERR_UNSUPPORTED (refused with nothing done: the caller runs
 * the unfused ops, and the refusal's message never reaches err), or any other failure, whose message is
 * copied into err (when not NULL). Why: a refusal is not an error of the step, and a stale message
 * must not outlive it. */
int fw_optional(int rc, const ms_err *ferr, ms_err *err);

/* y = W·a where a (f->a) may hold the pending norm f->pend: folded into the projection when the backend
 * can (norm_linear), else run first. The architectures' attention calls this for its first read of a. */
int fw_linear_a(ms_forward *f, const ms_linear *W, const ms_tensor *a, ms_tensor *y, ms_err *err);
/* Runs the pending norm f->pend, if any (MS_OK when there is none). */
int fw_norm_flush(ms_forward *f, ms_err *err);

/* Record / replay of this step's DSA selection of layer L in f->topk (no-op without the options). */
int fw_decide_index(ms_forward *f, int L, int T, ms_err *err);
/* Record / replay of layer L's expert choice: replay overwrites f->ids / f->rw with the recorded ids
 * and their weights from this backend's router logits; record stores ids and margins. */
int fw_decide_experts(ms_forward *f, int L, int T, const ms_route_cfg *rc, ms_err *err);

/* Profiling brackets: with f->prof_on, sync the backend before and after and add the wall time to
 * the named section. Sections nest only as documented by bench-model (attn_kernel inside attention). */
int fw_prof_begin(ms_forward *f, double *t0, ms_err *err);
int fw_prof_end(ms_forward *f, const char *name, double t0, ms_err *err);
#define FW_PROF(f, name, expr, err)                                                                \
    do {                                                                                           \
        if ((f)->prof_on) {                                                                        \
            double fw_t0_;                                                                         \
            MS_TRY(fw_prof_begin((f), &fw_t0_, (err)));                                            \
            MS_TRY(expr);                                                                          \
            MS_TRY(fw_prof_end((f), (name), fw_t0_, (err)));                                       \
        } else {                                                                                   \
            MS_TRY(expr);                                                                          \
        }                                                                                          \
    } while (0)

#define FW_TRY_CHECK(f, t, op, err)                                                                \
    do {                                                                                           \
        if ((f)->o.check_numerics == 1) MS_TRY(fw_check((f), (t), (op), 0, (err)));                \
    } while (0)

#endif
