/* forward_internal.h - state shared by the architecture-independent forward (forward.c) and the
 * attention blocks of each architecture (arch_glm4_moe.c, arch_glm_moe_dsa.c). Everything here is
 * allocated once in ms_forward_create; a step only takes views of it. */
#ifndef MS_MODEL_FORWARD_INTERNAL_H
#define MS_MODEL_FORWARD_INTERNAL_H

#include "model/model.h"

struct ms_forward {
    ms_model *m;
    ms_backend *b;
    ms_forward_opts o;
    const ms_moe_runner *forced; /* NULL = auto per call */
    int max_tokens, lchunk;      /* lchunk: logit rows per lm_head call */
    int64_t n_slots;             /* n_pages * page_size */
    /* KV memory per layer: glm4_moe k/v [S, nkv, d]; glm_moe_dsa latent [S, kvl+dr] (k slot) and
     * indexer keys [S, di] (v slot, full layers only) */
    ms_tensor *kc, *vc;
    /* activations (backend memory, row capacity max_tokens): act dtype, except x, delta, sh_out and lrows
     * which are F32 (the residual stream and what is added to it) */
    ms_tensor x, a, delta, g, u, moe_out, sh_out;
    ms_tensor q, k, v, attn;                   /* glm4_moe */
    ms_tensor qa, qb, qabs, kva, c, olat, vout; /* glm_moe_dsa */
    ms_tensor qI, kI, iw, topk;                 /* DSA indexer (topk: I32 [T, index_topk]) */
    ms_tensor ids, rw;                          /* router out: I32/F32 [T, topk] */
    ms_tensor rlog;                             /* F32 [T, E] router logits (record/replay only) */
    float *h_rlog, *h_rw;                       /* host copies for record/replay */
    int32_t *h_sel;                             /* host [T, index_topk] (record/replay only) */
    ms_tensor lrows, lnorm, logits;             /* [lchunk, H], [lchunk, H], F32 [lchunk, V] */
    ms_tensor moe_ws;                           /* U8 */
    /* batch arrays in backend memory */
    ms_tensor d_tok, d_pos, d_start, d_ctx, d_slot, d_seq, d_lidx, d_bt;
    int32_t *h_seq; /* host token -> sequence */
    int *routed;    /* [num_layers] distinct experts of the last step (record_routing) */
    int routing_paused; /* record_routing switched off for timed steps (no per-layer download) */
    int32_t *h_ids; /* [max_tokens * topk] host copy of router ids (record_routing) */
    /* profiling (bench-model --profile): per-section GPU time, each section bracketed by syncs */
    int prof_on;
    int prof_n;
    const char *prof_name[32];
    double prof_s[32];
    double prof_t0;
    /* per-step state */
    const ms_batch *batch;
    ms_attn_meta meta;
    int layer;
};

/* View of the first rows*cols elements of buffer buf as a [rows, cols] tensor (asserts capacity). */
ms_tensor fw_view2(const ms_tensor *buf, int64_t rows, int64_t cols);
ms_tensor fw_view3(const ms_tensor *buf, int64_t a, int64_t b, int64_t c);
/* With check_numerics: fails with MS_ERR_NUMERICS naming layer, op and token position when t (rows =
 * tokens of this step, or logit rows when logit_rows) holds NaN/Inf. */
int fw_check(ms_forward *f, const ms_tensor *t, const char *op, int logit_rows, ms_err *err);

/* Attention of one layer: reads f->a [T,H], writes f->delta [T,H], stores this step's keys. */
int fw_attn_glm4(ms_forward *f, int L, int T, ms_err *err);
int fw_attn_dsa(ms_forward *f, int L, int T, int *topk_valid, ms_err *err);

/* Record / replay of this step's DSA selection of layer L in f->topk (no-op without the options). */
int fw_decide_index(ms_forward *f, int L, int T, ms_err *err);
/* Record / replay of layer L's expert choice: replay overwrites f->ids / f->rw with the recorded ids
 * and their weights from this backend's router logits; record stores ids and margins. */
int fw_decide_experts(ms_forward *f, int L, int T, const ms_route_cfg *rc, ms_err *err);

/* Bytes of activation workspace the architecture's attention needs per token (for sizing). */
int fw_alloc_glm4(ms_forward *f, ms_err *err);
int fw_alloc_dsa(ms_forward *f, ms_err *err);

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
        if ((f)->o.check_numerics) MS_TRY(fw_check((f), (t), (op), 0, (err)));                     \
    } while (0)

#endif
