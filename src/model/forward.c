/* forward.c - the model forward, written once against the backend ops: embedding, the decoder
 * layer skeleton (pre-norm attention + dense MLP or routed MoE with a shared expert), the final norm
 * and lm_head on just the rows that need logits. The attention block is per architecture
 * (arch_glm4_moe.c: GQA; arch_glm_moe_dsa.c: MLA + DSA indexer).
 *
 * All memory (activations for max_tokens, KV for n_pages * page_size slots per layer, MoE runner
 * workspace, batch-array copies) is allocated in ms_forward_create; a step allocates nothing
 * except when a batch's block table outgrows every earlier one. */
#include "model/forward_internal.h"
#include "model/arch.h"

#include "core/dtype.h"
#include "core/fileutil.h"
#include "core/log.h"

#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LOGIT_CHUNK 64

ms_tensor fw_view2(const ms_tensor *buf, int64_t rows, int64_t cols) {
    MS_ASSERT(rows * cols <= ms_tensor_numel(buf));
    ms_tensor t = ms_tensor_2d(buf->dtype, rows, cols);
    t.data = buf->data;
    return t;
}

ms_tensor fw_piece(const ms_tensor *row, int64_t c0, int64_t n) {
    MS_ASSERT(row->ndim == 2 && row->shape[0] == 1 && c0 >= 0 && n >= 0 && c0 + n <= row->shape[1]);
    ms_tensor t = ms_tensor_2d(row->dtype, 1, n);
    t.data = (char *)row->data + (size_t)c0 * ms_dtype_size(row->dtype);
    return t;
}

ms_tensor fw_view3(const ms_tensor *buf, int64_t a, int64_t b, int64_t c) {
    MS_ASSERT(a * b * c <= ms_tensor_numel(buf));
    int64_t s[3] = {a, b, c};
    ms_tensor t = ms_tensor_make(buf->dtype, 3, s);
    t.data = buf->data;
    return t;
}

/* Contract in forward_internal.h. */
int fw_optional(int rc, const ms_err *ferr, ms_err *err) {
    if (rc != MS_OK && rc != MS_ERR_UNSUPPORTED && err) *err = *ferr;
    return rc;
}

int fw_norm_flush(ms_forward *f, ms_err *err) {
    if (!f->pend.on) return MS_OK;
    f->pend.on = 0;
    return f->b->ops->add_rmsnorm(f->b, &f->pend.resid, &f->pend.delta, f->pend.w, f->pend.eps, &f->pend.out, err);
}

/* The pending norm f->pend as a backend op's argument. */
static ms_norm_in pend_in(ms_forward *f) {
    const ms_norm_in n = {&f->pend.resid, &f->pend.delta, f->pend.w, f->pend.eps, &f->pend.out};
    return n;
}

int fw_linear_a(ms_forward *f, const ms_linear *W, const ms_tensor *a, ms_tensor *y, ms_err *err) {
    const ms_backend_ops *op = f->b->ops;
    if (f->pend.on && op->norm_linear && a->data == f->pend.out.data) {
        const ms_norm_in n = pend_in(f);
        ms_err ferr = {0};
        const int rc = fw_optional(op->norm_linear(f->b, &n, W, y, &ferr), &ferr, err);
        if (rc != MS_ERR_UNSUPPORTED) {
            f->pend.on = 0;
            return rc;
        }
    }
    MS_TRY(fw_norm_flush(f, err));
    return op->linear(f->b, W, a, y, err);
}

/* resid += delta; out = rmsnorm(resid) * w, now or left pending for the op that reads out (f->pend) when
 * fold says so. */
static int fw_add_norm(ms_forward *f, int fold, ms_tensor *resid, const ms_tensor *delta, const ms_tensor *w,
                       ms_tensor *out, ms_err *err) {
    MS_ASSERT(!f->pend.on);
    if (!fold) return f->b->ops->add_rmsnorm(f->b, resid, delta, w, f->m->cfg.rms_norm_eps, out, err);
    f->pend.on = 1;
    f->pend.resid = *resid, f->pend.delta = *delta, f->pend.out = *out;
    f->pend.w = w;
    f->pend.eps = f->m->cfg.rms_norm_eps;
    return MS_OK;
}

int fw_check(ms_forward *f, const ms_tensor *t, const char *op, int logit_rows, ms_err *err) {
    int64_t bad = -1;
    MS_TRY(f->b->ops->find_nonfinite(f->b, t, &bad, err));
    if (bad < 0) return MS_OK;
    const ms_batch *bt = f->batch;
    int64_t tok = logit_rows ? bt->logit_idx[bad] : bad;
    int pos = (tok >= 0 && tok < bt->n_tokens) ? bt->positions[tok] : -1;
    if (f->layer >= f->m->cfg.num_layers)
        return ms_errf(err, MS_ERR_NUMERICS, "final op %s token position %d produced NaN/Inf", op, pos);
    return ms_errf(err, MS_ERR_NUMERICS, "layer %d op %s token position %d produced NaN/Inf", f->layer, op, pos);
}

/* ------------------------------------------------------------------ attention implementations */

/* The attention shape of kind k for this model on this rank, at the forward's largest step. */
static ms_attn_shape attn_shape(const ms_forward *f, ms_attn_kind k) {
    const ms_config *c = &f->m->cfg;
    const int tp = f->m->shard.tp_size > 0 ? f->m->shard.tp_size : 1;
    ms_attn_shape s;
    memset(&s, 0, sizeof s);
    s.kind = k;
    s.n_heads = c->num_heads / tp;
    s.n_tokens = f->o.max_tokens;
    s.max_ctx = f->o.n_pages * f->o.page_size;
    s.dtype = f->b->act_dtype;
    if (k == MS_ATTN_GQA) {
        s.n_kv_heads = c->num_kv_heads / tp > 0 ? c->num_kv_heads / tp : 1;
        s.dk = s.dv = c->head_dim;
    } else {
        s.n_kv_heads = 1;
        s.dk = c->kv_lora_rank + c->qk_rope_head_dim;
        s.dv = c->kv_lora_rank;
        s.topk = k == MS_ATTN_DSA ? c->index_topk : 0;
    }
    return s;
}

/* Resolves the three flags for the paths this model has (MLA models: dense MLA, plus DSA when the
 * config has an indexer; others GQA). */
static int resolve_attn(ms_forward *f, ms_err *err) {
    const ms_config *c = &f->m->cfg;
    const ms_backend *b = f->b;
    if (c->kv_lora_rank <= 0) {
        ms_attn_shape s = attn_shape(f, MS_ATTN_GQA);
        return ms_attn_resolve(b, ms_attn_flag(MS_ATTN_GQA, 0), f->o.attn_backend, &s, &f->attn_impl[MS_ATTN_GQA], err);
    }
    ms_attn_shape s = attn_shape(f, MS_ATTN_MLA);
    MS_TRY(ms_attn_resolve(b, ms_attn_flag(MS_ATTN_MLA, 0), f->o.attn_backend, &s, &f->attn_impl[MS_ATTN_MLA], err));
    if (c->index_topk <= 0) return MS_OK;
    s = attn_shape(f, MS_ATTN_DSA);
    MS_TRY(ms_attn_resolve(b, ms_attn_flag(MS_ATTN_DSA, 0), f->o.nsa_prefill, &s, &f->attn_impl[MS_ATTN_DSA], err));
    return ms_attn_resolve(b, ms_attn_flag(MS_ATTN_DSA, 1), f->o.nsa_decode, &s, &f->nsa_decode, err);
}

/* 1 when every resolved attention implementation may be recorded into a graph. */
static int attn_graphs_ok(const ms_forward *f) {
    for (int k = 0; k < MS_ATTN_KINDS; k++)
        if (f->attn_impl[k] && !(f->attn_impl[k]->caps & MS_ATTN_CAP_GRAPHS)) return 0;
    return !f->nsa_decode || (f->nsa_decode->caps & MS_ATTN_CAP_GRAPHS);
}

int fw_attention(ms_forward *f, ms_attn_call *c, ms_err *err) {
    const ms_attn_impl *impl = f->attn_impl[c->kind];
    if (c->kind == MS_ATTN_DSA && f->batch && f->batch->n_tokens == f->batch->n_seqs) impl = f->nsa_decode;
    if (!impl)
        return ms_errf(err, MS_ERR_INVALID, "forward: no attention implementation was resolved for kind %d", (int)c->kind);
    return ms_attn_run(impl, f->b, c, err);
}

unsigned fw_attn_caps(const ms_forward *f, ms_attn_kind k) { return f->attn_impl[k] ? f->attn_impl[k]->caps : 0; }

void ms_forward_attn_desc(const ms_forward *f, char *buf, size_t cap) {
    if (f->attn_impl[MS_ATTN_GQA]) {
        snprintf(buf, cap, "%s", f->attn_impl[MS_ATTN_GQA]->name);
        return;
    }
    size_t n = (size_t)snprintf(buf, cap, "attn=%s", f->attn_impl[MS_ATTN_MLA] ? f->attn_impl[MS_ATTN_MLA]->name : "none");
    if (f->attn_impl[MS_ATTN_DSA] && n < cap)
        snprintf(buf + n, cap - n, ",nsa_prefill=%s,nsa_decode=%s", f->attn_impl[MS_ATTN_DSA]->name, f->nsa_decode->name);
}

const char *ms_forward_moe_desc(const ms_forward *f) { return f->forced ? f->forced->name : "auto"; }

/* ------------------------------------------------------------------ create / free */

static int alloc2(ms_forward *f, ms_tensor *t, ms_dtype dt, int64_t rows, int64_t cols, ms_err *err) {
    int64_t s[2] = {rows, cols > 0 ? cols : 1};
    return ms_backend_alloc(f->b, t, dt, 2, s, err);
}

static void free_t(ms_forward *f, ms_tensor *t) {
    if (t->data) f->b->ops->free(f->b, t);
    t->data = NULL;
}

const int *ms_forward_routed_experts(const ms_forward *f) { return f->routed; }

void ms_forward_set_record_routing(ms_forward *f, int on) { f->routing_paused = !on; }

void ms_forward_set_profile(ms_forward *f, int on) {
    f->prof_on = on;
    f->prof_n = 0;
}

int ms_forward_profile(const ms_forward *f, const char **names, double *seconds, int cap) {
    int n = f->prof_n < cap ? f->prof_n : cap;
    for (int i = 0; i < n; i++) names[i] = f->prof_name[i], seconds[i] = f->prof_s[i];
    return n;
}

int fw_prof_begin(ms_forward *f, double *t0, ms_err *err) {
    MS_TRY(f->b->ops->sync(f->b, err));
    *t0 = ms_now();
    return MS_OK;
}

int fw_prof_end(ms_forward *f, const char *name, double t0, ms_err *err) {
    MS_TRY(f->b->ops->sync(f->b, err));
    double dt = ms_now() - t0;
    for (int i = 0; i < f->prof_n; i++)
        if (!strcmp(f->prof_name[i], name)) {
            f->prof_s[i] += dt;
            return MS_OK;
        }
    if (f->prof_n < 32) {
        f->prof_name[f->prof_n] = name;
        f->prof_s[f->prof_n++] = dt;
    }
    return MS_OK;
}

size_t ms_forward_kv_bytes_per_token(const ms_model *m, const ms_backend *b) {
    const ms_config *c = &m->cfg;
    size_t es = ms_dtype_size(b->act_dtype), n = 0;
    for (int L = 0; L < c->num_layers; L++) n += c->arch->kv_bytes_per_token(c, L, es, m->shard.tp_size);
    if (m->mtp.loaded) n += c->arch->kv_bytes_per_token(c, c->num_layers, es, m->shard.tp_size);
    return n;
}

/* Drops every recorded graph and its buffers (the backend's memory moved, or the table is full). */
static void graphs_reset(ms_forward *f) {
    for (int i = 0; i < f->n_graphs; i++) {
        fw_graph *g = &f->graphs[i];
        if (g->exec) f->b->ops->graph_free(f->b, g->exec);
        free_t(f, &g->db.buf);
        free(g->hbuf);
    }
    memset(f->graphs, 0, sizeof f->graphs);
    f->n_graphs = 0;
}

void ms_forward_free(ms_forward *f) {
    if (!f) return;
    if (f->kc)
        for (int L = 0; L < fw_cache_layers(f); L++) free_t(f, &f->kc[L]), free_t(f, &f->vc[L]);
    free(f->kc);
    free(f->vc);
    ms_tensor *all[] = {&f->x, &f->a, &f->delta, &f->g, &f->u, &f->moe_out, &f->sh_out, &f->q, &f->k, &f->v, &f->qkv,
                        &f->attn, &f->qa, &f->qb, &f->qabs, &f->kva, &f->c, &f->olat, &f->vout, &f->qI, &f->kI,
                        &f->iw, &f->topk, &f->ids, &f->rw, &f->rlog, &f->lrows, &f->lnorm, &f->logits, &f->moe_ws,
                        &f->db.buf, &f->glogits, &f->lgather, &f->nf_flag, &f->hid, &f->mtp_out, &f->mcat, &f->hidx,
                        &f->amax};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free_t(f, all[i]);
    graphs_reset(f);
    free_t(f, &f->ids2);
    free_t(f, &f->rw2);
    if (f->fold)
        for (int L = 0; L <= f->m->cfg.num_layers; L++) free(f->fold[L].gate);
    free(f->fold);
    free(f->h_pack);
    free(f->routed);
    free(f->h_ids);
    free(f->h_rlog);
    free(f->h_rw);
    free(f);
}

static ms_moe_shape moe_shape(const ms_model *m, int T) {
    const ms_config *c = &m->cfg;
    const ms_shard *sh = &m->shard;
    ms_moe_shape s = {T, c->hidden_size, c->moe_intermediate_size / sh->moe_tp_size, sh->ne, c->num_experts_per_tok,
                      MS_WFMT_PLAIN, MS_BF16, sh->ep_size > 1 ? MS_MOE_CAP_PARTIAL : 0u};
    for (int L = 0; L < c->num_layers; L++)
        if (m->layers[L].is_moe && m->layers[L].experts.n > 0) {
            s.fmt = m->layers[L].experts.gate[0].fmt;
            s.plain_dtype = m->layers[L].experts.gate[0].w.dtype;
            break;
        }
    return s;
}

/* Steps of at most this many tokens fold the shared expert into the routed call. Measured on the
 * H200 (GLM-4.5-Air, 46 layers): batch 1 8.76 -> 8.29 ms with the fused router, batch 64 39.1 -> 38.2
 * ms, but batch 256 86.5 -> 99.4 ms, where the shared expert's 256 rows are one group of the decode
 * runner instead of one dequantize + cuBLASLt GEMM. */
#define FOLD_MAX_TOKENS 64

/* 1 if two linears hold the same shape in the same format (the expert tables need that). */
static int same_kind(const ms_linear *a, const ms_linear *b) {
    return a->fmt == b->fmt && a->n_out == b->n_out && a->n_in == b->n_in && a->w.dtype == b->w.dtype && !a->bias.data &&
           !b->bias.data;
}

/* Contract in model.h. */
int ms_layer_fold_shared(const ms_layer *l, ms_experts *out, ms_err *err) {
    const ms_experts *e = &l->experts;
    memset(out, 0, sizeof *out);
    if (!l->is_moe || !l->has_shared || e->n < 1 || !same_kind(&l->sh_gate, &e->gate[0]) ||
        !same_kind(&l->sh_up, &e->up[0]) || !same_kind(&l->sh_down, &e->down[0]))
        return MS_OK;
    ms_linear *arr = malloc(sizeof(ms_linear) * 3 * (size_t)(e->n + 1));
    if (!arr) return ms_errf(err, MS_ERR_NOMEM, "forward: out of memory folding a shared expert");
    out->n = e->n + 1;
    out->gate = arr;
    out->up = arr + out->n;
    out->down = arr + 2 * out->n;
    memcpy(out->gate, e->gate, sizeof(ms_linear) * (size_t)e->n);
    memcpy(out->up, e->up, sizeof(ms_linear) * (size_t)e->n);
    memcpy(out->down, e->down, sizeof(ms_linear) * (size_t)e->n);
    out->gate[e->n] = l->sh_gate;
    out->up[e->n] = l->sh_up;
    out->down[e->n] = l->sh_down;
    out->shared_last = 1;
    return MS_OK;
}

/* Folds each MoE layer's shared expert into its routed experts as expert n (ms_layer_fold_shared), so
 * one runner call does both (the shared expert's own GEMVs, launches and the add go away; at decode
 * batch 64 the shared expert alone cost ~130 us per GLM-4.5-Air layer). Only where the shared expert
 * has the routed experts' shapes and formats, on one unsplit rank (under tensor or expert parallelism
 * the runner's partial sums would count it once per rank), when the backend has moe_append. f owns
 * the arrays. MS_SHARED_EXPERT_SEPARATE=1 turns it off. */
static int fold_shared(ms_forward *f, ms_err *err) {
    const ms_model *m = f->m;
    const char *off = getenv("MS_SHARED_EXPERT_SEPARATE");
    if ((off && *off && strcmp(off, "0")) || !f->b->ops->moe_append || m->shard.tp_size != 1 || m->shard.ep_size != 1)
        return MS_OK;
    /* the MTP layer, when loaded, sits at layers[num_layers] and runs the same MoE code */
    const int nl = m->cfg.num_layers + (m->mtp.loaded ? 1 : 0);
    for (int L = 0; L < nl; L++) {
        ms_experts x;
        MS_TRY(ms_layer_fold_shared(&m->layers[L], &x, err));
        if (!x.n) continue;
        if (!f->fold && !(f->fold = calloc((size_t)m->cfg.num_layers + 1, sizeof *f->fold))) {
            free(x.gate);
            return ms_errf(err, MS_ERR_NOMEM, "forward: out of memory");
        }
        f->fold[L] = x;
    }
    return MS_OK;
}

int ms_forward_create(ms_model *m, ms_backend *b, const ms_forward_opts *o, ms_forward **out, ms_err *err) {
    *out = NULL;
    const ms_config *c = &m->cfg;
    if (o->max_tokens < 1 || o->n_pages < 1 || o->page_size < 1)
        return ms_errf(err, MS_ERR_INVALID, "forward: max_tokens (%d), n_pages (%d) and page_size (%d) must be >= 1",
                       o->max_tokens, o->n_pages, o->page_size);
    if (m->shard.tp_size < 1) /* a model built by hand (tests) is one unsplit rank */
        MS_TRY(ms_shard_make(c, 1, 1, 0, &m->shard, err));
    const int tp = m->shard.tp_size;
    if ((tp > 1 && !o->comm) || (o->comm && o->comm->size != tp))
        return ms_errf(err, MS_ERR_INVALID, "forward: the model is rank %d of a %d-way split but the communicator has %d ranks",
                       m->shard.tp_rank, tp, o->comm ? o->comm->size : 0);
    ms_forward *f = calloc(1, sizeof *f);
    if (!f) return ms_errf(err, MS_ERR_NOMEM, "forward: out of memory");
    f->m = m;
    f->b = b;
    f->o = *o;
    f->max_tokens = o->max_tokens;
    f->lchunk = o->max_tokens < LOGIT_CHUNK ? o->max_tokens : LOGIT_CHUNK;
    /* one page more than the engine's: the pad page that padding tokens of graph steps write to */
    f->n_slots = (int64_t)(o->n_pages + 1) * o->page_size;
    int rc = MS_OK;
    ms_moe_shape ms = moe_shape(m, o->max_tokens);
    int any_moe = 0;
    for (int L = 0; L < c->num_layers; L++) any_moe |= m->layers[L].is_moe;
    if (any_moe) {
        rc = ms_moe_resolve(b, o->moe_runner, &ms, &f->forced, err);
        if (rc) goto fail;
    }
    if ((rc = resolve_attn(f, err))) goto fail;
    const int T = o->max_tokens, H = c->hidden_size;
    const ms_dtype ad = b->act_dtype;
    int64_t inter = c->intermediate_size;
    if ((int64_t)c->moe_intermediate_size * (c->n_shared_experts > 0 ? c->n_shared_experts : 1) > inter)
        inter = (int64_t)c->moe_intermediate_size * (c->n_shared_experts > 0 ? c->n_shared_experts : 1);
    /* The residual stream (x), the sublayer outputs added to it (delta, sh_out) and the rows taken for
     * the final norm stay float32 on every backend: with bf16 activations, rounding the running sum
     * once per layer was the largest error against the float32 reference (and costs T*H*4 bytes). */
    if ((rc = alloc2(f, &f->x, MS_F32, T, H, err)) || (rc = alloc2(f, &f->a, ad, T, H, err)) ||
        (rc = alloc2(f, &f->delta, MS_F32, T, H, err)) || (rc = alloc2(f, &f->g, ad, T, inter, err)) ||
        (rc = alloc2(f, &f->u, ad, T, inter, err)) || (rc = alloc2(f, &f->lrows, MS_F32, f->lchunk, H, err)) ||
        (rc = alloc2(f, &f->lnorm, ad, f->lchunk, H, err)) ||
        (rc = alloc2(f, &f->logits, MS_F32, f->lchunk, c->vocab_size, err)))
        goto fail;
    if (b->ops->argmax && (rc = alloc2(f, &f->amax, MS_I32, T, 1, err))) goto fail;
    f->split = o->comm != NULL;
    if (f->split) {
        if (!b->ops->embed_part || !b->ops->remap_ids) {
            rc = ms_errf(err, MS_ERR_UNSUPPORTED, "flag --tp %d: the %s backend cannot run a split model", tp, b->name);
            goto fail;
        }
        /* rank-major gathered logits [tp][rows][V/tp] of one lm_head chunk */
        if ((rc = alloc2(f, &f->lgather, MS_F32, f->lchunk, c->vocab_size, err))) goto fail;
    }
    if (any_moe) {
        int k = c->num_experts_per_tok;
        if ((rc = alloc2(f, &f->sh_out, MS_F32, T, H, err)) ||
            (rc = alloc2(f, &f->ids, MS_I32, T, k, err)) || (rc = alloc2(f, &f->rw, MS_F32, T, k, err)))
            goto fail;
        if ((rc = fold_shared(f, err))) goto fail;
        ms_moe_shape msf = ms; /* the folded calls: one more expert, one more per token */
        msf.n_experts++;
        msf.topk++;
        if (f->fold && ((rc = alloc2(f, &f->ids2, MS_I32, T, k + 1, err)) || (rc = alloc2(f, &f->rw2, MS_F32, T, k + 1, err))))
            goto fail;
        size_t ws = 0;
        for (const ms_moe_runner *const *r = ms_moe_runners(); *r; r++) {
            char why[128];
            if (strcmp((*r)->backend, b->name)) continue;
            for (int v = 0; v < (f->fold ? 2 : 1); v++) {
                const ms_moe_shape *sp = v ? &msf : &ms;
                if (!(*r)->supports(b, sp, why, sizeof why)) continue;
                size_t n = (*r)->workspace_size(b, sp);
                if (n > ws) ws = n;
            }
        }
        if ((rc = alloc2(f, &f->moe_ws, MS_U8, 1, (int64_t)(ws ? ws : 64), err))) goto fail;
    }
    if (o->check_numerics == 2 && b->ops->nonfinite_flag && (rc = alloc2(f, &f->nf_flag, MS_I32, 1, 1, err))) goto fail;
    f->gmax = T < 256 ? T : 256;
    f->graphs_on = o->graphs && b->ops->graph_begin && o->check_numerics != 1 && !o->on_layer && !o->record &&
                   !o->replay && !(f->forced && !(f->forced->caps & MS_MOE_CAP_GRAPHS)) && attn_graphs_ok(f);
    if (o->record_routing) {
        f->routed = calloc((size_t)c->num_layers, sizeof(int));
        f->h_ids = malloc(sizeof(int32_t) * (size_t)T * (size_t)(c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1));
        if (!f->routed || !f->h_ids) {
            rc = ms_errf(err, MS_ERR_NOMEM, "forward: out of memory");
            goto fail;
        }
    }
    if (o->record || o->replay) {
        const int E = c->n_routed_experts > 0 ? c->n_routed_experts : 1, k = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1;
        if ((rc = alloc2(f, &f->rlog, MS_F32, T, E, err))) goto fail;
        f->h_rlog = malloc(sizeof(float) * (size_t)T * (size_t)E);
        f->h_rw = malloc(sizeof(float) * (size_t)T * (size_t)k);
        if (!f->h_rlog || !f->h_rw) {
            rc = ms_errf(err, MS_ERR_NOMEM, "forward: out of memory");
            goto fail;
        }
    }
    if (o->mtp) {
        if (!m->mtp.loaded) {
            rc = ms_errf(err, MS_ERR_INVALID, "forward: the MTP layer was requested but the model was loaded without it");
            goto fail;
        }
        f->mtp_on = 1;
        if ((rc = alloc2(f, &f->hid, ad, T, H, err)) || (rc = alloc2(f, &f->mtp_out, ad, T, H, err)) ||
            (rc = alloc2(f, &f->mcat, ad, T, 2 * (int64_t)H, err)) || (rc = alloc2(f, &f->hidx, MS_I32, 1, T, err)))
            goto fail;
    }
    f->kc = calloc((size_t)c->num_layers + 1, sizeof(ms_tensor));
    f->vc = calloc((size_t)c->num_layers + 1, sizeof(ms_tensor));
    if (!f->kc || !f->vc) {
        rc = ms_errf(err, MS_ERR_NOMEM, "forward: out of memory");
        goto fail;
    }
    rc = c->arch->alloc(f, err);
    if (rc) goto fail;
    *out = f;
    return MS_OK;
fail:
    ms_forward_free(f);
    return rc;
}

/* ------------------------------------------------------------------ MLP / MoE */

static int swiglu(ms_forward *f, const ms_linear *gate, const ms_linear *up, const ms_linear *down, int T,
                  ms_tensor *out, ms_err *err) {
    const ms_backend_ops *op = f->b->ops;
    ms_tensor a = fw_view2(&f->a, T, f->m->cfg.hidden_size);
    ms_tensor g = fw_view2(&f->g, T, gate->n_out), u = fw_view2(&f->u, T, up->n_out);
    if (op->linear_swiglu && f->o.check_numerics != 1) {
        ms_err ferr = {0};
        int rc = fw_optional(op->linear_swiglu(f->b, gate, up, &a, &g, &ferr), &ferr, err);
        if (rc == MS_OK) {
            MS_TRY(op->linear(f->b, down, &g, out, err));
            FW_TRY_CHECK(f, out, "down_proj", err);
            return MS_OK;
        }
        if (rc != MS_ERR_UNSUPPORTED) return rc;
    }
    MS_TRY(op->linear(f->b, gate, &a, &g, err));
    FW_TRY_CHECK(f, &g, "gate_proj", err);
    MS_TRY(op->linear(f->b, up, &a, &u, err));
    FW_TRY_CHECK(f, &u, "up_proj", err);
    MS_TRY(op->silu_mul(f->b, &g, &u, &g, err));
    MS_TRY(op->linear(f->b, down, &g, out, err));
    FW_TRY_CHECK(f, out, "down_proj", err);
    return MS_OK;
}

/* The router of layer l on a (f->a) into f->ids / f->rw, with the pending norm (f->pend) folded in where
 * the backend can (norm_router), else run first. */
static int route(ms_forward *f, const ms_layer *l, const ms_tensor *a, const ms_route_cfg *rc, ms_err *err) {
    const ms_backend_ops *op = f->b->ops;
    const ms_tensor *rbias = l->router_bias.data ? &l->router_bias : NULL;
    if (f->pend.on && op->norm_router && a->data == f->pend.out.data) {
        const ms_norm_in n = pend_in(f);
        ms_err ferr = {0};
        const int rc2 = fw_optional(op->norm_router(f->b, &n, &l->router, rbias, rc, f->ids.data, f->rw.data, &ferr), &ferr,
                                    err);
        if (rc2 != MS_ERR_UNSUPPORTED) {
            f->pend.on = 0;
            return rc2;
        }
    }
    MS_TRY(fw_norm_flush(f, err));
    return op->router(f->b, a, &l->router, rbias, rc, f->ids.data, f->rw.data, err);
}

/* delta += the layer's (unfolded) shared expert of T tokens (transformers adds it to the routed sum). */
static int shared_expert(ms_forward *f, const ms_layer *l, int T, ms_tensor *delta, ms_err *err) {
    ms_tensor sh = fw_view2(&f->sh_out, T, f->m->cfg.hidden_size);
    FW_PROF(f, "shared_expert", swiglu(f, &l->sh_gate, &l->sh_up, &l->sh_down, T, &sh, err), err);
    return f->b->ops->add(f->b, delta, &sh, err);
}

/* The experts of layer L for a call of T tokens and the runner for them: the shared expert rides along
 * as expert n with weight 1 (transformers adds it unscaled) when the forward folded it (f->fold) and T
 * allows, else the layer's routed experts alone. *folded says which. */
static const ms_moe_runner *moe_runner_of(ms_forward *f, int L, int T, const ms_experts **ex, int *folded) {
    ms_moe_shape s = moe_shape(f->m, T);
    *folded = f->fold && f->fold[L].n && T <= FOLD_MAX_TOKENS;
    *ex = *folded ? &f->fold[L] : &f->m->layers[L].experts;
    if (*folded) {
        s.n_experts++;
        s.topk++;
    }
    return ms_moe_pick(f->b, f->forced, &s);
}

/* A one-token MoE layer's norm, router and experts in one runner call (run_routed), when nothing needs
 * the choice between the router and the experts: no decision record or replay, no routing statistics,
 * no expert parallelism (the remap). Writes delta and f->ids / f->rw as route() + run() would; the shared
 * expert goes in the call when folded, else *sh_left = 1 (the caller adds it). MS_ERR_UNSUPPORTED with
 * nothing done when the form does not apply. */
static int mlp_routed(ms_forward *f, int L, const ms_tensor *a, const ms_route_cfg *rc, ms_tensor *delta, int *sh_left,
                      ms_err *err) {
    const ms_layer *l = &f->m->layers[L];
    if (!f->pend.on || a->data != f->pend.out.data || f->o.record || f->o.replay || f->m->shard.ep_size > 1 ||
        (f->routed && !f->routing_paused && L < f->m->cfg.num_layers))
        return MS_ERR_UNSUPPORTED;
    const ms_experts *ex;
    int folded;
    const ms_moe_runner *r = moe_runner_of(f, L, 1, &ex, &folded);
    if (!r->run_routed || (folded && !(r->caps & MS_MOE_CAP_SHARED_LAST))) return MS_ERR_UNSUPPORTED;
    const ms_norm_in n = pend_in(f);
    const ms_tensor *rbias = l->router_bias.data ? &l->router_bias : NULL;
    double t0 = 0;
    if (f->prof_on) MS_TRY(fw_prof_begin(f, &t0, err));
    ms_err ferr = {0};
    const int rc2 = fw_optional(r->run_routed(f->b, ex, &n, &l->router, rbias, rc, f->ids.data, f->rw.data, delta,
                                              f->moe_ws.data, ms_tensor_nbytes(&f->moe_ws), &ferr),
                                &ferr, err);
    if (rc2 == MS_ERR_UNSUPPORTED) return rc2;
    f->pend.on = 0;
    MS_TRY(rc2);
    /* under moe_experts (bench-model's moe share counts router and experts alike) */
    if (f->prof_on) MS_TRY(fw_prof_end(f, "moe_experts", t0, err));
    *sh_left = !folded && l->has_shared;
    return MS_OK;
}

static int mlp(ms_forward *f, int L, int T, ms_err *err) {
    const ms_config *c = &f->m->cfg;
    const ms_layer *l = &f->m->layers[L];
    const ms_backend_ops *op = f->b->ops;
    const int H = c->hidden_size;
    ms_tensor delta = fw_view2(&f->delta, T, H);
    if (!l->is_moe) {
        MS_TRY(fw_norm_flush(f, err));
        FW_PROF(f, "dense_mlp", swiglu(f, &l->gate_proj, &l->up_proj, &l->down_proj, T, &delta, err), err);
        return MS_OK;
    }
    const int k = c->num_experts_per_tok;
    ms_tensor a = fw_view2(&f->a, T, H);
    ms_route_cfg rc = {c->n_routed_experts, k, c->n_group > 0 ? c->n_group : 1, c->topk_group > 0 ? c->topk_group : 1,
                       c->norm_topk_prob, c->routed_scaling_factor};
    if (T == 1) {
        int sh_left = 0;
        const int rr = mlp_routed(f, L, &a, &rc, &delta, &sh_left, err);
        if (rr != MS_ERR_UNSUPPORTED) {
            MS_TRY(rr);
            FW_TRY_CHECK(f, &delta, "moe_experts (routed in the call)", err);
            return sh_left ? shared_expert(f, l, T, &delta, err) : MS_OK;
        }
    }
    FW_PROF(f, "router", route(f, l, &a, &rc, err), err);
    MS_TRY(fw_decide_experts(f, L, T, &rc, err));
    if (f->routed && !f->routing_paused && L < c->num_layers) {
        MS_TRY(op->download(f->b, f->h_ids, f->ids.data, sizeof(int32_t) * (size_t)T * (size_t)k, err));
        unsigned char seen[4096] = {0};
        int n = 0;
        for (int i = 0; i < T * k; i++)
            if (f->h_ids[i] >= 0 && f->h_ids[i] < 4096 && !seen[f->h_ids[i]]) seen[f->h_ids[i]] = 1, n++;
        f->routed[L] = n;
    }
    if (f->m->shard.ep_size > 1) /* experts of other groups become -1: their ranks add them */
        MS_TRY(op->remap_ids(f->b, f->ids.data, (int64_t)T * k, f->m->shard.e0, f->m->shard.ne, err));
    const ms_experts *ex;
    int folded;
    const ms_moe_runner *r = moe_runner_of(f, L, T, &ex, &folded);
    if (folded) {
        /* the runner adds the shared expert itself when it can, else it is appended to every token's ids */
        const int self = (r->caps & MS_MOE_CAP_SHARED_LAST) != 0;
        if (!self)
            MS_TRY(op->moe_append(f->b, f->ids.data, f->rw.data, T, k, ex->n - 1, 1.0f, f->ids2.data, f->rw2.data, err));
        FW_PROF(f, "moe_experts",
                r->run(f->b, ex, &a, self ? f->ids.data : f->ids2.data, self ? f->rw.data : f->rw2.data,
                       self ? k : k + 1, &delta, f->moe_ws.data, ms_tensor_nbytes(&f->moe_ws), err), err);
        FW_TRY_CHECK(f, &delta, "moe_experts + shared expert", err);
        return MS_OK;
    }
    FW_PROF(f, "moe_experts", r->run(f->b, ex, &a, f->ids.data, f->rw.data, k, &delta, f->moe_ws.data,
                                     ms_tensor_nbytes(&f->moe_ws), err), err);
    FW_TRY_CHECK(f, &delta, "moe_experts", err);
    return l->has_shared ? shared_expert(f, l, T, &delta, err) : MS_OK;
}

/* ------------------------------------------------------------------ step */

static int validate(const ms_forward *f, const ms_batch *bt, ms_err *err) {
    const int T = bt->n_tokens, V = f->m->cfg.vocab_size;
    if (T < 1 || T > f->max_tokens)
        return ms_errf(err, MS_ERR_INVALID, "forward: batch of %d tokens (this forward takes 1..%d)", T, f->max_tokens);
    if (bt->n_seqs < 1 || bt->n_seqs > T || bt->seq_start[0] != 0 || bt->seq_start[bt->n_seqs] != T)
        return ms_errf(err, MS_ERR_INVALID, "forward: batch sequence ranges are malformed (%d sequences, %d tokens)",
                       bt->n_seqs, T);
    if (bt->page_size != f->o.page_size || bt->max_blocks < 1)
        return ms_errf(err, MS_ERR_INVALID, "forward: batch page_size %d / max_blocks %d do not match the cache (page %d)",
                       bt->page_size, bt->max_blocks, f->o.page_size);
    if (bt->n_logits < 0 || bt->n_logits > T)
        return ms_errf(err, MS_ERR_INVALID, "forward: %d logit rows requested for %d tokens", bt->n_logits, T);
    for (int i = 0; i < bt->n_logits; i++)
        if (bt->logit_idx[i] < 0 || bt->logit_idx[i] >= T)
            return ms_errf(err, MS_ERR_INVALID, "forward: logit_idx[%d] = %d is not a token of the batch", i, bt->logit_idx[i]);
    for (int s = 0; s < bt->n_seqs; s++) {
        int t0 = bt->seq_start[s], t1 = bt->seq_start[s + 1], ctx = bt->ctx_len[s];
        if (t1 <= t0 || ctx < t1 - t0 || ctx > (int64_t)bt->max_blocks * bt->page_size)
            return ms_errf(err, MS_ERR_INVALID, "forward: sequence %d has %d new tokens and context %d (max %d)", s,
                           t1 - t0, ctx, bt->max_blocks * bt->page_size);
        int nb = (ctx + bt->page_size - 1) / bt->page_size;
        for (int j = 0; j < nb; j++) {
            int32_t pg = bt->block_table[(int64_t)s * bt->max_blocks + j];
            if (pg < 0 || pg >= f->o.n_pages)
                return ms_errf(err, MS_ERR_INVALID, "forward: sequence %d block %d names page %d (cache has %d)", s, j,
                               pg, f->o.n_pages);
        }
        for (int t = t0; t < t1; t++) {
            if (bt->positions[t] < 0 || bt->positions[t] >= ctx)
                return ms_errf(err, MS_ERR_INVALID, "forward: token %d position %d is outside its context %d", t,
                               bt->positions[t], ctx);
            if (bt->token_ids[t] < 0 || bt->token_ids[t] >= V)
                return ms_errf(err, MS_ERR_INVALID, "forward: token id %d at index %d is out of range (vocab %d)",
                               bt->token_ids[t], t, V);
            int p = bt->positions[t];
            int64_t want = (int64_t)bt->block_table[(int64_t)s * bt->max_blocks + p / bt->page_size] * bt->page_size +
                           p % bt->page_size;
            if (bt->slot_mapping[t] != want)
                return ms_errf(err, MS_ERR_INVALID, "forward: token %d slot %d does not match its block table slot %lld",
                               t, bt->slot_mapping[t], (long long)want);
        }
    }
    return MS_OK;
}

/* Uploads bt's arrays (and token -> sequence) packed into d->buf in one copy and points f->meta,
 * f->tok_d and f->lidx_d at them. meta_max_ctx sizes attention launches (>= every ctx_len). d->buf
 * grows when too small (graph entries size it once and keep their addresses). */
static int pack_upload(ms_forward *f, fw_dbatch *d, const ms_batch *bt, int meta_max_ctx, ms_err *err) {
    const int T = bt->n_tokens, S = bt->n_seqs, NL = bt->n_logits;
    const int64_t nbt = (int64_t)S * bt->max_blocks;
    const int64_t n = 4 * (int64_t)T + (S + 1) + S + NL + nbt;
    if (!d->buf.data || ms_tensor_numel(&d->buf) < n) {
        free_t(f, &d->buf);
        MS_TRY(alloc2(f, &d->buf, MS_I32, 1, n + n / 2 + 16, err));
    }
    if (f->h_pack_cap < n) {
        int32_t *p = realloc(f->h_pack, sizeof(int32_t) * (size_t)n);
        if (!p) return ms_errf(err, MS_ERR_NOMEM, "forward: out of memory staging a batch of %d tokens", T);
        f->h_pack = p;
        f->h_pack_cap = n;
    }
    int32_t *h = f->h_pack, *dp = (int32_t *)d->buf.data;
    int64_t o = 0;
#define PACK(dst, src, cnt)                                                                        \
    do {                                                                                           \
        d->dst = dp + o;                                                                           \
        if (cnt) memcpy(h + o, (src), sizeof(int32_t) * (size_t)(cnt));                           \
        o += (cnt);                                                                                \
    } while (0)
    PACK(tok, bt->token_ids, T);
    PACK(pos, bt->positions, T);
    PACK(start, bt->seq_start, S + 1);
    PACK(ctx, bt->ctx_len, S);
    PACK(slot, bt->slot_mapping, T);
    PACK(lidx, bt->logit_idx, NL);
    PACK(bt, bt->block_table, nbt);
#undef PACK
    d->seq = dp + o;
    for (int s = 0; s < S; s++)
        for (int t = bt->seq_start[s]; t < bt->seq_start[s + 1]; t++) h[o + t] = s;
    MS_TRY(f->b->ops->upload(f->b, dp, h, sizeof(int32_t) * (size_t)n, err));
    f->meta = (ms_attn_meta){bt, meta_max_ctx, d->pos, d->start, d->ctx, d->slot, d->bt, d->seq};
    f->tok_d = d->tok;
    f->lidx_d = d->lidx;
    return MS_OK;
}

/* Sums a [T, H] float32 partial result over the tensor-parallel ranks (no-op on one rank). */
static int tp_sum(ms_forward *f, ms_tensor *t, ms_err *err) {
    if (!f->split) return MS_OK;
    ms_comm *cm = f->o.comm;
    return cm->ops->all_reduce_sum(cm, t->data, (size_t)ms_tensor_numel(t), MS_F32, err);
}

/* --check-numerics step mode: marks code (layer, or num_layers for the logits) in f->nf_flag when t
 * holds NaN/Inf, without waiting; x == NULL resets the flag. Backends without nonfinite_flag check
 * at once (a wait) and fail the step there. */
static int step_check(ms_forward *f, const ms_tensor *t, int code, ms_err *err) {
    if (f->b->ops->nonfinite_flag) return f->b->ops->nonfinite_flag(f->b, t, code, f->nf_flag.data, err);
    if (!t) return MS_OK;
    int64_t bad = -1;
    MS_TRY(f->b->ops->find_nonfinite(f->b, t, &bad, err));
    if (bad >= 0) return ms_errf(err, MS_ERR_NUMERICS, "--check-numerics: %s%d produced NaN/Inf",
                                 code >= f->m->cfg.num_layers ? "the logits of step row " : "the residual stream of layer ",
                                 code >= f->m->cfg.num_layers ? (int)bad : code);
    return MS_OK;
}

/* The logit rows of a step: for each chunk of bt->n_logits rows, gather those rows of x, normalise
 * them with norm (into keep + r0 rows when keep is not NULL: the MTP step keeps its normed rows for a
 * chained step; else into the f->lnorm scratch), apply head and, under tensor parallelism, gather
 * every rank's vocabulary columns as rows [n, V]. graph = 0: each chunk goes to logits_host (when not
 * NULL) as the step goes; graph = 1: the rows go to f->glogits and nothing waits for the host. layer:
 * the code the --check-numerics step mode marks (-1: none, the MTP step keeps no step flag); what: the
 * op --check-numerics names. */
static int head_rows(ms_forward *f, const ms_batch *bt, const ms_tensor *x, const ms_tensor *norm, const ms_linear *head,
                     ms_tensor *keep, int layer, const char *what, float *logits_host, int graph, ms_err *err) {
    const ms_config *c = &f->m->cfg;
    const ms_backend_ops *op = f->b->ops;
    const ms_shard *sh = &f->m->shard;
    const int H = c->hidden_size, V = c->vocab_size;
    for (int r0 = 0; r0 < bt->n_logits; r0 += f->lchunk) {
        int n = bt->n_logits - r0 < f->lchunk ? bt->n_logits - r0 : f->lchunk;
        const int64_t nv = sh->nv; /* this rank's vocabulary rows (all of them on one rank) */
        ms_tensor rows = fw_view2(&f->lrows, n, H), nrm = fw_view2(&f->lnorm, n, H), lg = fw_view2(&f->logits, n, nv);
        if (keep) {
            nrm = ms_tensor_2d(keep->dtype, n, H);
            nrm.data = (char *)keep->data + (size_t)r0 * (size_t)H * ms_dtype_size(keep->dtype);
        }
        /* where the chunk's rows [n, V] end up: the graph's logits buffer, or the eager staging buffer */
        float *dst = graph ? (float *)f->glogits.data + (int64_t)r0 * V : lg.data;
        if (graph && !f->split) lg.data = dst;
        MS_TRY(op->gather_rows(f->b, x, f->lidx_d + r0, n, &rows, err));
        MS_TRY(op->rmsnorm(f->b, &rows, norm, c->rms_norm_eps, &nrm, err));
        FW_PROF(f, "lm_head", op->linear(f->b, head, &nrm, &lg, err), err);
        if (f->split) {
            /* every rank's columns, gathered rank-major [tp][n][V/tp], then laid out as rows [n, V] on
             * the device (the local rows were consumed by the gather before dst is written) */
            ms_comm *cm = f->o.comm;
            FW_PROF(f, "collectives", cm->ops->all_gather(cm, lg.data, f->lgather.data, (size_t)n * (size_t)nv, MS_F32, err),
                    err);
            ms_tensor full = ms_tensor_2d(MS_F32, n, V);
            full.data = dst;
            for (int r = 0; r < sh->tp_size; r++) {
                ms_tensor part = ms_tensor_2d(MS_F32, n, nv);
                part.data = (float *)f->lgather.data + (int64_t)r * n * nv;
                MS_TRY(op->set_cols(f->b, &part, (int)(r * nv), &full, err));
            }
        }
        if (f->o.check_numerics == 2 && layer >= 0) MS_TRY(step_check(f, &lg, layer, err));
        if (f->o.check_numerics == 1) {
            /* logit rows r0.. map to tokens logit_idx[r0..] */
            int64_t bad = -1;
            MS_TRY(op->find_nonfinite(f->b, &lg, &bad, err)); /* this rank's columns: each rank checks its own */
            if (bad >= 0)
                return ms_errf(err, MS_ERR_NUMERICS, "%s token position %d produced NaN/Inf", what,
                               bt->positions[bt->logit_idx[r0 + bad]]);
        }
        if (!graph && f->argmax_step) { /* ms_forward_run_argmax: the chunk's greedy ids, not its rows */
            ms_tensor full = ms_tensor_2d(MS_F32, n, V);
            full.data = dst;
            MS_TRY(op->argmax(f->b, &full, (int32_t *)f->amax.data + r0, err));
        }
        if (!graph && logits_host)
            FW_PROF(f, "logits_download",
                    op->download(f->b, logits_host + (int64_t)r0 * V, dst, sizeof(float) * (size_t)n * (size_t)V, err), err);
    }
    return MS_OK;
}

/* The step once its arrays are on the device: embedding, layers, final norm and lm_head for the
 * bt->n_logits rows. graph = 0: each chunk of logits is downloaded into logits_host (when not NULL:
 * under tensor parallelism only rank 0 asks for them) as the step goes; graph = 1: the rows go to
 * f->glogits and nothing waits for the host (recordable graph step). Every rank runs the same
 * collectives in the same order. */
static int forward_body(ms_forward *f, const ms_batch *bt, float *logits_host, int graph, ms_err *err) {
    const ms_config *c = &f->m->cfg;
    const ms_backend_ops *op = f->b->ops;
    const int T = bt->n_tokens, H = c->hidden_size;
    f->batch = bt;
    f->layer = 0;
    ms_tensor x = fw_view2(&f->x, T, H), a = fw_view2(&f->a, T, H), delta = fw_view2(&f->delta, T, H);
    const ms_shard *sh = &f->m->shard;
    if (f->split) { /* vocab-parallel: each rank embeds its rows, the sum is the embedding */
        MS_TRY(op->embed_part(f->b, &f->m->embed, f->tok_d, T, sh->v0, &x, err));
        FW_PROF(f, "collectives", tp_sum(f, &x, err), err);
    } else {
        MS_TRY(op->embed(f->b, &f->m->embed, f->tok_d, T, &x, err));
    }
    FW_TRY_CHECK(f, &x, "embed", err);
    if (f->o.check_numerics == 2) MS_TRY(step_check(f, NULL, 0, err));
    f->topk_valid = 0;
    f->pend.on = 0;
    /* one-token steps leave the residual add + norm to the op that reads it (f->pend), unless a check or
     * a per-layer callback reads the residual or the normed rows in between */
    const int fold = T == 1 && (op->norm_linear || op->norm_router) && !f->o.check_numerics && !f->o.on_layer;
    for (int L = 0; L < c->num_layers; L++) {
        const ms_layer *l = &f->m->layers[L];
        f->layer = L;
        /* layer 0 normalises the embedding; later layers got their input norm fused into the
         * previous layer's residual add below */
        if (L == 0) FW_PROF(f, "norms", op->rmsnorm(f->b, &x, &l->attn_norm, c->rms_norm_eps, &a, err), err);
        FW_TRY_CHECK(f, &a, "input_layernorm", err);
        FW_PROF(f, "attention", c->arch->attention(f, L, T, err), err);
        MS_ASSERT(!f->pend.on); /* the attention's first op took it (arch.h input_norm_pending) */
        FW_PROF(f, "collectives", tp_sum(f, &delta, err), err);
        FW_PROF(f, "norms", fw_add_norm(f, fold, &x, &delta, &l->ffn_norm, &a, err), err);
        FW_TRY_CHECK(f, &a, "post_attention_layernorm", err);
        MS_TRY(mlp(f, L, T, err));
        MS_ASSERT(!f->pend.on); /* mlp's first op took it */
        FW_PROF(f, "collectives", tp_sum(f, &delta, err), err);
        if (L + 1 < c->num_layers)
            FW_PROF(f, "norms",
                    fw_add_norm(f, fold && c->arch->input_norm_pending, &x, &delta, &f->m->layers[L + 1].attn_norm, &a, err),
                    err);
        else
            MS_TRY(op->add(f->b, &x, &delta, err));
        FW_TRY_CHECK(f, &x, "residual", err);
        if (f->o.check_numerics == 2) MS_TRY(step_check(f, &x, L, err));
        if (f->o.on_layer) {
            MS_TRY(op->sync(f->b, err));
            f->o.on_layer(f->o.on_layer_ctx, L, &x);
        }
    }
    f->layer = c->num_layers;
    if (f->mtp_on) { /* what the lm_head reads, for every token: the MTP step's hidden input */
        ms_tensor hid = fw_view2(&f->hid, T, H);
        MS_TRY(op->rmsnorm(f->b, &x, &f->m->final_norm, c->rms_norm_eps, &hid, err));
    }
    if (f->o.on_layer) {
        MS_TRY(op->rmsnorm(f->b, &x, &f->m->final_norm, c->rms_norm_eps, &a, err));
        MS_TRY(op->sync(f->b, err));
        f->o.on_layer(f->o.on_layer_ctx, c->num_layers, &a);
    }
    return head_rows(f, bt, &x, &f->m->final_norm, &f->m->lm_head, NULL, c->num_layers, "final op lm_head", logits_host,
                     graph, err);
}

/* ------------------------------------------------------------------ MTP (NEXTN) layer body */

/* The MTP step once its arrays (f->meta, f->tok_d, f->lidx_d) and hidden-row indices (f->hidx) are on
 * the device: e = enorm(embed(token)), h = hnorm(hidden row of the hid_src rows), eh_proj([e; h]), the
 * decoder layer at index num_layers, then shared_head's norm and head on the bt->n_logits rows (the
 * normed rows stay in f->mtp_out for a chained step). graph = 0: each chunk of logits is downloaded
 * into logits_host (when not NULL) as the step goes; graph = 1: the rows go to f->glogits and nothing
 * waits for the host (recordable graph step). */
static int mtp_body(ms_forward *f, const ms_batch *bt, int hid_src, float *logits_host, int graph, ms_err *err) {
    const ms_config *c = &f->m->cfg;
    const ms_backend_ops *op = f->b->ops;
    const ms_mtp *mt = &f->m->mtp;
    const int T = bt->n_tokens, H = c->hidden_size, Lm = c->num_layers;
    const ms_tensor *src = hid_src == MS_MTP_HID_DRAFT ? &f->mtp_out : &f->hid;
    f->batch = bt;
    f->layer = Lm;
    f->topk_valid = 0;
    f->pend.on = 0; /* a main step that failed may have left one; this step's norms run as they come */
    ms_tensor x = fw_view2(&f->x, T, H), a = fw_view2(&f->a, T, H), delta = fw_view2(&f->delta, T, H);
    ms_tensor cat = fw_view2(&f->mcat, T, 2 * (int64_t)H);
    const ms_shard *sh = &f->m->shard;
    /* e = enorm(embed(token)) -> cat[:, :H] */
    if (f->split) {
        MS_TRY(op->embed_part(f->b, &f->m->embed, f->tok_d, T, sh->v0, &x, err));
        MS_TRY(tp_sum(f, &x, err));
    } else {
        MS_TRY(op->embed(f->b, &f->m->embed, f->tok_d, T, &x, err));
    }
    MS_TRY(op->rmsnorm(f->b, &x, &mt->enorm, c->rms_norm_eps, &a, err));
    MS_TRY(op->set_cols(f->b, &a, 0, &cat, err));
    /* h = hnorm(hidden row) -> cat[:, H:] */
    MS_TRY(op->gather_rows(f->b, src, (const int32_t *)f->hidx.data, T, &a, err));
    MS_TRY(op->rmsnorm(f->b, &a, &mt->hnorm, c->rms_norm_eps, &a, err));
    MS_TRY(op->set_cols(f->b, &a, H, &cat, err));
    MS_TRY(op->linear(f->b, &mt->eh_proj, &cat, &x, err));
    FW_TRY_CHECK(f, &x, "mtp eh_proj", err);
    /* the decoder layer (index Lm: its weights, KV cache and indexer), float32 residual stream */
    const ms_layer *l = &f->m->layers[Lm];
    MS_TRY(op->rmsnorm(f->b, &x, &l->attn_norm, c->rms_norm_eps, &a, err));
    MS_TRY(c->arch->attention(f, Lm, T, err));
    MS_TRY(tp_sum(f, &delta, err));
    MS_TRY(op->add_rmsnorm(f->b, &x, &delta, &l->ffn_norm, c->rms_norm_eps, &a, err));
    MS_TRY(mlp(f, Lm, T, err));
    MS_TRY(tp_sum(f, &delta, err));
    MS_TRY(op->add(f->b, &x, &delta, err));
    FW_TRY_CHECK(f, &x, "mtp residual", err);
    /* logits = head(shared_head.norm(h')) of the logit rows; the normed rows stay in mtp_out */
    return head_rows(f, bt, &x, &mt->head_norm, &mt->head, &f->mtp_out, -1, "MTP op head", logits_host, graph, err);
}

/* ------------------------------------------------------------------ graph steps */

static const int fw_buckets[] = {1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256};

const char *ms_graph_kind_name(int kind) {
    static const char *const names[MS_GRAPH_KINDS] = {"decode", "verify", "draft"};
    return kind >= 0 && kind < MS_GRAPH_KINDS ? names[kind] : "?";
}

/* The counter (ms_graph_kind) of graph g's steps. */
static int graph_counter(const fw_graph *g) {
    if (g->kind != FW_G_MAIN) return MS_GRAPH_DRAFT;
    return g->q > 1 ? MS_GRAPH_VERIFY : MS_GRAPH_DECODE;
}

void ms_forward_graph_counts(const ms_forward *f, ms_graph_counts *out) {
    memset(out, 0, sizeof *out);
    memcpy(out->launches, f->glaunch, sizeof out->launches);
    const uint64_t ep = f->graphs_on ? f->b->ops->mem_epoch(f->b) : 0;
    for (int i = 0; i < f->n_graphs; i++)
        if (f->graphs[i].exec && f->graphs[i].epoch == ep) out->recorded[graph_counter(&f->graphs[i])]++;
}

/* The padded sequence count of a graph step of S sequences of q tokens each: the smallest bucket >= S,
 * or gmax / q when that bucket's tokens would exceed gmax (the glogits rows); 0 when S sequences of q
 * tokens do not fit at all. */
static int graph_bucket(const ms_forward *f, int S, int q) {
    const int cap = f->gmax / q;
    for (size_t i = 0; i < sizeof fw_buckets / sizeof fw_buckets[0]; i++)
        if (fw_buckets[i] >= S) return fw_buckets[i] <= cap ? fw_buckets[i] : S <= cap ? cap : 0;
    return S <= cap ? cap : 0;
}

/* Tokens per sequence q when bt can run as a recorded graph, else 0: every sequence has q tokens,
 * every token wants logits in order, the padded shape fits, and nothing is on that needs the host
 * inside the step. Main steps (mtp = 0): q = 1 (pure decode), or 2..FW_GRAPH_MAX_Q with
 * opts.graph_verify_tokens set (verification). MTP steps (mtp = 1): q = 1 only. */
static int graph_q(const ms_forward *f, const ms_batch *bt, int mtp) {
    if (!f->graphs_on || f->prof_on || (!mtp && f->routed && !f->routing_paused)) return 0;
    const int S = bt->n_seqs, T = bt->n_tokens;
    if (S < 1 || T % S || bt->n_logits != T) return 0;
    const int q = T / S;
    if (q > 1 && (mtp || q > FW_GRAPH_MAX_Q || f->o.graph_verify_tokens < 2)) return 0;
    if (!graph_bucket(f, S, q)) return 0;
    for (int s = 0; s <= S; s++)
        if (bt->seq_start[s] != s * q) return 0;
    for (int i = 0; i < bt->n_logits; i++)
        if (bt->logit_idx[i] != i) return 0;
    return q;
}

/* The table entry for key (kind, B, q, mbc), made if new (NULL in *out when it cannot be made). */
static int graph_entry(ms_forward *f, int kind, int B, int q, int mbc, fw_graph **out, ms_err *err) {
    *out = NULL;
    for (int i = 0; i < f->n_graphs; i++) {
        fw_graph *g = &f->graphs[i];
        if (g->kind == kind && g->B == B && g->q == q && g->mbc == mbc) {
            *out = g;
            return MS_OK;
        }
    }
    if (f->n_graphs == FW_MAX_GRAPHS) graphs_reset(f); /* many context classes seen: start over */
    if (!f->glogits.data) MS_TRY(alloc2(f, &f->glogits, MS_F32, f->gmax, f->m->cfg.vocab_size, err));
    fw_graph *g = &f->graphs[f->n_graphs];
    memset(g, 0, sizeof *g);
    const int T = B * q;
    const int64_t n = 5 * (int64_t)T + 2 * (int64_t)B + 1 + (int64_t)B * mbc;
    g->hbuf = malloc(sizeof(int32_t) * (size_t)n);
    if (!g->hbuf) return ms_errf(err, MS_ERR_NOMEM, "forward: out of memory for a graph batch of %d tokens", T);
    g->kind = kind;
    g->B = B;
    g->q = q;
    g->mbc = mbc;
    /* hbuf: tokens, positions, slots, logit rows, hidden rows [T] each; seq_start [B + 1]; ctx [B];
     * block table [B, mbc] */
    int32_t *p = g->hbuf;
    ms_batch *h = &g->hb;
    h->n_tokens = h->n_logits = T;
    h->n_seqs = B;
    h->token_ids = p, p += T;
    h->positions = p, p += T;
    h->slot_mapping = p, p += T;
    for (int t = 0; t < T; t++) p[t] = t;
    h->logit_idx = p, p += T;
    g->hidx = p, p += T;
    for (int i = 0; i <= B; i++) p[i] = i * q;
    h->seq_start = p, p += B + 1;
    h->ctx_len = p, p += B;
    h->block_table = p;
    h->max_blocks = mbc;
    h->page_size = f->o.page_size;
    f->n_graphs++;
    *out = g;
    return MS_OK;
}

/* The step of graph g (its padded batch, arrays uploaded) run op by op, or recorded. */
static int graph_body(ms_forward *f, fw_graph *g, ms_err *err) {
    if (g->kind == FW_G_MAIN) return forward_body(f, &g->hb, NULL, 1, err);
    return mtp_body(f, &g->hb, g->kind == FW_G_MTP_DRAFT ? MS_MTP_HID_DRAFT : MS_MTP_HID_TARGET, NULL, 1, err);
}

/* Runs step bt (graph_q(bt) = q; kind FW_G_*; hid_idx [n_tokens] for MTP kinds) through the recorded
 * graph of its padded shape (recording it on the second step of that shape). *done = 0 when this step
 * cannot use a graph (the caller runs it eagerly). */
static int run_graph(ms_forward *f, const ms_batch *bt, int kind, int q, const int32_t *hid_idx, float *logits_host,
                     int *done, ms_err *err) {
    const ms_backend_ops *op = f->b->ops;
    const int S = bt->n_seqs, ps = f->o.page_size, V = f->m->cfg.vocab_size;
    *done = 0;
    const int B = graph_bucket(f, S, q);
    if (!B) return MS_OK;
    int need = 1;
    for (int s = 0; s < S; s++) {
        int nb = (bt->ctx_len[s] + ps - 1) / ps;
        need = nb > need ? nb : need;
    }
    /* block-table classes are powers of two from 32 pages: few shapes to record, and attention sized
     * for at most twice the longest context (32 pages also hold a padding sequence's q <= 16 tokens) */
    int mbc = 32;
    while (mbc < need) mbc *= 2;
    fw_graph *g;
    MS_TRY(graph_entry(f, kind, B, q, mbc, &g, err));
    if (!g) return MS_OK;
    /* the padded batch (arrays laid out in hbuf by graph_entry): real sequences first, then padding
     * sequences of q tokens at positions 0..q-1 in the pad page (q > page_size: tokens share its slots,
     * which only padding reads) */
    ms_batch *h = &g->hb;
    const int T = B * q;
    int32_t *tok = g->hbuf, *pos = tok + T, *slot = pos + T, *ctx = g->hbuf + 5 * (int64_t)T + B + 1, *btab = ctx + B;
    const int32_t pad = f->o.n_pages;
    for (int s = 0; s < B; s++) {
        int32_t *row = btab + (int64_t)s * mbc;
        int nb = 0;
        for (int j = 0; j < q; j++) {
            const int t = s * q + j;
            if (s < S) {
                tok[t] = bt->token_ids[t];
                pos[t] = bt->positions[t];
                slot[t] = bt->slot_mapping[t];
                if (hid_idx) g->hidx[t] = hid_idx[t];
            } else {
                tok[t] = 0;
                pos[t] = j;
                slot[t] = pad * ps + j % ps;
                g->hidx[t] = 0;
            }
        }
        if (s < S) {
            ctx[s] = bt->ctx_len[s];
            nb = (bt->ctx_len[s] + ps - 1) / ps;
            memcpy(row, bt->block_table + (int64_t)s * bt->max_blocks, sizeof(int32_t) * (size_t)nb);
        } else {
            ctx[s] = q;
        }
        for (int j = nb; j < mbc; j++) row[j] = pad;
    }
    FW_PROF(f, "batch_upload", pack_upload(f, &g->db, h, mbc * ps, err), err);
    if (kind != FW_G_MAIN) /* the graph reads the hidden-row indices from this fixed buffer */
        MS_TRY(op->upload(f->b, f->hidx.data, g->hidx, sizeof(int32_t) * (size_t)h->n_tokens, err));
    const uint64_t ep = op->mem_epoch(f->b);
    if (g->exec && g->epoch != ep) {
        op->graph_free(f->b, g->exec);
        g->exec = NULL;
        g->runs = 0;
    }
    if (g->exec) {
        MS_TRY(op->graph_launch(f->b, g->exec, err));
        f->glaunch[graph_counter(g)]++;
    } else if (g->failed || g->runs < 1) {
        /* first run of this shape eagerly: lazily made buffers reach their size before recording */
        MS_TRY(graph_body(f, g, err));
        g->runs++;
    } else {
        ms_err cerr = {0}, eerr = {0};
        void *x = NULL;
        MS_TRY(op->graph_begin(f->b, err));
        int rc = graph_body(f, g, &cerr);
        int rc2 = op->graph_end(f->b, &x, &eerr);
        if (rc || rc2 || op->mem_epoch(f->b) != ep) {
            if (x) op->graph_free(f->b, x);
            g->failed = 1;
            if (!f->graph_warned++)
                MS_LOGW("forward: a %s step of %d sequences x %d tokens could not be recorded as a graph (%s); such "
                        "steps run op by op", ms_graph_kind_name(graph_counter(g)), B, q,
                        rc ? cerr.msg : rc2 ? eerr.msg : "a backend buffer moved while recording");
            MS_TRY(graph_body(f, g, err));
        } else {
            g->exec = x;
            g->epoch = ep;
            MS_TRY(op->graph_launch(f->b, x, err));
            f->glaunch[graph_counter(g)]++;
        }
    }
    if (f->argmax_step) {
        ms_tensor rows = fw_view2(&f->glogits, bt->n_tokens, V); /* the real rows: padding comes after them */
        MS_TRY(op->argmax(f->b, &rows, (int32_t *)f->amax.data, err));
    }
    if (logits_host)
        FW_PROF(f, "logits_download",
                op->download(f->b, logits_host, f->glogits.data, sizeof(float) * (size_t)bt->n_tokens * (size_t)V, err),
                err);
    *done = 1;
    return op->sync(f->b, err);
}

int ms_forward_record_graphs(ms_forward *f, int *n_recorded, ms_err *err) {
    *n_recorded = 0;
    if (!f->graphs_on) return MS_OK;
    const int G = f->gmax, ps = f->o.page_size, H = f->m->cfg.hidden_size;
    /* the step kinds recorded now: (graph kind, tokens per sequence) */
    int kinds[3][2], nk = 0;
    kinds[nk][0] = FW_G_MAIN, kinds[nk++][1] = 1;
    const int vq = f->o.graph_verify_tokens;
    if (vq >= 2 && vq <= FW_GRAPH_MAX_Q && vq <= G) kinds[nk][0] = FW_G_MAIN, kinds[nk++][1] = vq;
    if (f->mtp_on) kinds[nk][0] = FW_G_MTP_DRAFT, kinds[nk++][1] = 1;
    int32_t *a = malloc(sizeof(int32_t) * (size_t)(7 * G + 1));
    if (!a) return ms_errf(err, MS_ERR_NOMEM, "forward: out of memory recording graphs");
    int32_t *tok = a, *pos = a + G, *slot = a + 2 * G, *lidx = a + 3 * G, *hidx = a + 4 * G, *ctx = a + 5 * G,
            *start = a + 6 * G;
    /* the launches of these padding-only steps are not steps of the caller's: counters stay as they were */
    uint64_t saved[MS_GRAPH_KINDS];
    memcpy(saved, f->glaunch, sizeof saved);
    int rc = MS_OK;
    if (f->mtp_on) {
        /* the padding tokens of MTP steps read hidden row 0: finite before any step has written it */
        const size_t rb = (size_t)H * ms_dtype_size(f->b->act_dtype);
        void *z = calloc(1, rb);
        if (!z) rc = ms_errf(err, MS_ERR_NOMEM, "forward: out of memory recording graphs");
        if (!rc) rc = f->b->ops->upload(f->b, f->hid.data, z, rb, err);
        if (!rc) rc = f->b->ops->upload(f->b, f->mtp_out.data, z, rb, err);
        free(z);
    }
    int32_t *pages = malloc(sizeof(int32_t) * (size_t)G * (FW_GRAPH_MAX_Q + 1));
    if (!pages && !rc) rc = ms_errf(err, MS_ERR_NOMEM, "forward: out of memory recording graphs");
    /* pass 0 runs every shape once eagerly, so every scratch buffer reaches its largest size; pass 1
     * records them all in the memory epoch that then stays (recording shape by shape would let a larger
     * shape's first run outdate the graphs recorded before it) */
    for (int r = 0; r < 2 && !rc; r++)
        for (int k = 0; k < nk && !rc; k++) {
            const int kind = kinds[k][0], q = kinds[k][1], cap = G / q, mb = (q + ps - 1) / ps;
            for (size_t i = 0; i < sizeof fw_buckets / sizeof fw_buckets[0] && !rc; i++) {
                const int n = fw_buckets[i] < cap ? fw_buckets[i] : cap, T = n * q;
                /* n padding-only sequences of q tokens (the pad page; validate() would refuse it from
                 * a caller) */
                for (int s = 0; s < n; s++) {
                    start[s] = s * q;
                    ctx[s] = q;
                    for (int j = 0; j < mb; j++) pages[s * mb + j] = f->o.n_pages;
                    for (int j = 0; j < q; j++) {
                        const int t = s * q + j;
                        tok[t] = 0, pos[t] = j, slot[t] = f->o.n_pages * ps + j % ps, lidx[t] = t, hidx[t] = 0;
                    }
                }
                start[n] = T;
                ms_batch bt = {T, n, tok, pos, start, ctx, slot, pages, mb, ps, T, lidx};
                int done = 0;
                rc = run_graph(f, &bt, kind, q, kind == FW_G_MAIN ? NULL : hidx, NULL, &done, err);
                if (fw_buckets[i] >= cap) break;
            }
        }
    memcpy(f->glaunch, saved, sizeof saved);
    ms_graph_counts gc;
    ms_forward_graph_counts(f, &gc);
    for (int k = 0; !rc && k < MS_GRAPH_KINDS; k++) *n_recorded += gc.recorded[k];
    free(pages);
    free(a);
    return rc;
}

/* A step whose check flag says NaN/Inf first appeared at `code`: runs it again op by op with the
 * per-op check (same inputs, same cache slots, so the cache ends as it was) to name the op, and fails
 * with the sentence naming where, the op, the backend, the attention implementations and the MoE
 * runner. Under tensor parallelism with several ranks the re-run is skipped (the other ranks would
 * not join its collectives). */
static int numerics_fail(ms_forward *f, const ms_batch *bt, int32_t code, ms_err *err) {
    const ms_config *c = &f->m->cfg;
    char where[96], attn[128], dev[192], how[320] = "";
    if (code >= c->num_layers) snprintf(where, sizeof where, "the logits (lm_head)");
    else snprintf(where, sizeof where, "the residual stream after layer %d", code);
    ms_forward_attn_desc(f, attn, sizeof attn);
    if (f->b->device >= 0 && f->b->gpu.name[0])
        snprintf(dev, sizeof dev, "%s on %s (compute capability %d.%d)", f->b->name, f->b->gpu.name, f->b->gpu.cc_major,
                 f->b->gpu.cc_minor);
    else
        snprintf(dev, sizeof dev, "%s", f->b->name);
    if (!f->split || f->m->shard.tp_size <= 1) {
        ms_err e2 = {0};
        int max_ctx = 0;
        for (int s = 0; s < bt->n_seqs; s++) max_ctx = bt->ctx_len[s] > max_ctx ? bt->ctx_len[s] : max_ctx;
        const int saved = f->o.check_numerics;
        f->o.check_numerics = 1;
        int rc = pack_upload(f, &f->db, bt, max_ctx, &e2);
        if (!rc) rc = forward_body(f, bt, NULL, 0, &e2);
        if (!rc) rc = f->b->ops->sync(f->b, &e2);
        f->o.check_numerics = saved;
        if (rc == MS_ERR_NUMERICS) snprintf(how, sizeof how, "; op by op: %s", e2.msg);
        else if (rc) snprintf(how, sizeof how, "; the op-by-op re-run failed: %s", e2.msg);
        else snprintf(how, sizeof how, "; the op-by-op re-run did not reproduce it (a nondeterministic fault)");
    }
    return ms_errf(err, MS_ERR_NUMERICS, "--check-numerics: NaN/Inf in %s of a step of %d tokens%s; backend %s, attention %s, MoE runner %s",
                   where, bt->n_tokens, how, dev, attn, ms_forward_moe_desc(f));
}

/* The step's check flag (after the step's sync): fails the step when it is set. */
static int step_verdict(ms_forward *f, const ms_batch *bt, ms_err *err) {
    if (f->o.check_numerics != 2 || !f->nf_flag.data) return MS_OK;
    int32_t code = INT32_MAX;
    MS_TRY(f->b->ops->download(f->b, &code, f->nf_flag.data, sizeof code, err));
    return code == INT32_MAX ? MS_OK : numerics_fail(f, bt, code, err);
}

int ms_forward_run(ms_forward *f, const ms_batch *bt, float *logits_host, ms_err *err) {
    MS_TRY(validate(f, bt, err));
    const int q = graph_q(f, bt, 0);
    if (q) {
        int done = 0;
        MS_TRY(run_graph(f, bt, FW_G_MAIN, q, NULL, logits_host, &done, err));
        if (done) return step_verdict(f, bt, err);
    }
    int max_ctx = 0;
    for (int s = 0; s < bt->n_seqs; s++) max_ctx = bt->ctx_len[s] > max_ctx ? bt->ctx_len[s] : max_ctx;
    FW_PROF(f, "batch_upload", pack_upload(f, &f->db, bt, max_ctx, err), err);
    MS_TRY(forward_body(f, bt, logits_host, 0, err));
    MS_TRY(f->b->ops->sync(f->b, err));
    return step_verdict(f, bt, err);
}

int ms_forward_can_argmax(const ms_forward *f) { return f->amax.data != NULL; }

/* The ids of the step just run with argmax_step set (amax, synced by the step) into ids_host. */
static int argmax_ids(ms_forward *f, const ms_batch *bt, int rc, int32_t *ids_host, ms_err *err) {
    f->argmax_step = 0;
    if (rc || !ids_host || !bt->n_logits) return rc;
    return f->b->ops->download(f->b, ids_host, f->amax.data, sizeof(int32_t) * (size_t)bt->n_logits, err);
}

int ms_forward_run_argmax(ms_forward *f, const ms_batch *bt, int32_t *ids_host, ms_err *err) {
    if (!f->amax.data)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "forward: the %s backend takes no argmax of the logits", f->b->name);
    f->argmax_step = 1;
    return argmax_ids(f, bt, ms_forward_run(f, bt, NULL, err), ids_host, err);
}

/* ------------------------------------------------------------------ MTP (NEXTN) draft layer */

int ms_forward_set_hidden(ms_forward *f, const float *h, int n, ms_err *err) {
    const int H = f->m->cfg.hidden_size;
    if (!f->mtp_on || n < 0 || n > f->max_tokens)
        return ms_errf(err, MS_ERR_INVALID, "forward: set_hidden of %d rows (MTP %s, %d rows kept)", n, f->mtp_on ? "on" : "off",
                       f->max_tokens);
    const size_t cnt = (size_t)n * (size_t)H;
    if (f->b->act_dtype == MS_F32) return f->b->ops->upload(f->b, f->hid.data, h, cnt * sizeof(float), err);
    uint16_t *tmp = malloc(cnt * sizeof(uint16_t) + 1);
    if (!tmp) return ms_errf(err, MS_ERR_NOMEM, "forward: out of memory staging %d hidden rows", n);
    for (size_t i = 0; i < cnt; i++) tmp[i] = ms_f32_to_bf16(h[i]);
    int rc = f->b->ops->upload(f->b, f->hid.data, tmp, cnt * sizeof(uint16_t), err);
    free(tmp);
    return rc;
}

int ms_forward_get_hidden(ms_forward *f, float *h, int n, ms_err *err) {
    const int H = f->m->cfg.hidden_size;
    if (!f->mtp_on || n < 0 || n > f->max_tokens)
        return ms_errf(err, MS_ERR_INVALID, "forward: get_hidden of %d rows (MTP %s)", n, f->mtp_on ? "on" : "off");
    const size_t cnt = (size_t)n * (size_t)H, es = ms_dtype_size(f->b->act_dtype);
    void *tmp = malloc(cnt * es + 1);
    if (!tmp) return ms_errf(err, MS_ERR_NOMEM, "forward: out of memory reading %d hidden rows", n);
    int rc = f->b->ops->sync(f->b, err);
    if (!rc) rc = f->b->ops->download(f->b, tmp, f->hid.data, cnt * es, err);
    if (!rc) ms_convert_to_f32(f->b->act_dtype, tmp, h, cnt);
    free(tmp);
    return rc;
}

int ms_forward_mtp_run(ms_forward *f, const ms_batch *bt, int hid_src, const int32_t *hid_idx, float *logits_host,
                       ms_err *err) {
    if (!f->mtp_on) return ms_errf(err, MS_ERR_INVALID, "forward: MTP step on a forward created without the MTP layer");
    if (f->o.record || f->o.replay)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "forward: MTP steps cannot record or replay decisions");
    MS_TRY(validate(f, bt, err));
    const int T = bt->n_tokens;
    for (int t = 0; t < T; t++)
        if (hid_idx[t] < 0 || hid_idx[t] >= f->max_tokens)
            return ms_errf(err, MS_ERR_INVALID, "forward: MTP token %d takes hidden row %d (0..%d)", t, hid_idx[t], f->max_tokens - 1);
    if (graph_q(f, bt, 1)) {
        int done = 0;
        MS_TRY(run_graph(f, bt, hid_src == MS_MTP_HID_DRAFT ? FW_G_MTP_DRAFT : FW_G_MTP_TARGET, 1, hid_idx, logits_host,
                         &done, err));
        if (done) return MS_OK;
    }
    int max_ctx = 0;
    for (int s = 0; s < bt->n_seqs; s++) max_ctx = bt->ctx_len[s] > max_ctx ? bt->ctx_len[s] : max_ctx;
    MS_TRY(pack_upload(f, &f->db, bt, max_ctx, err));
    MS_TRY(f->b->ops->upload(f->b, f->hidx.data, hid_idx, sizeof(int32_t) * (size_t)T, err));
    MS_TRY(mtp_body(f, bt, hid_src, logits_host, 0, err));
    return f->b->ops->sync(f->b, err);
}

int ms_forward_mtp_run_argmax(ms_forward *f, const ms_batch *bt, int hid_src, const int32_t *hid_idx, int32_t *ids_host,
                              ms_err *err) {
    if (!f->amax.data)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "forward: the %s backend takes no argmax of the logits", f->b->name);
    f->argmax_step = 1;
    return argmax_ids(f, bt, ms_forward_mtp_run(f, bt, hid_src, hid_idx, NULL, err), ids_host, err);
}
