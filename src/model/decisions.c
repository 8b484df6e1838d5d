/* decisions.c - record/replay of a forward step's discrete choices (see ms_decisions in model.h)
 * and the host-side routing math they need: the margin of a router decision and the routing weights
 * of given expert ids, computed from float32 router logits exactly as the router op defines them
 * (sigmoid, +bias for choice only, group-limited top-k, normalisation, scaling). */
#include "model/forward_internal.h"
#include "model/safetensors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int ms_decisions_alloc(ms_decisions *d, int n_layers, int n_tokens, int topk, int index_topk, ms_err *err) {
    memset(d, 0, sizeof *d);
    if (n_layers < 1 || n_tokens < 1 || topk < 1 || index_topk < 1)
        return ms_errf(err, MS_ERR_INVALID, "decisions: bad sizes (%d layers, %d tokens, top-%d, index top-%d)",
                       n_layers, n_tokens, topk, index_topk);
    size_t lt = (size_t)n_layers * (size_t)n_tokens;
    d->expert_ids = malloc(sizeof(int32_t) * lt * (size_t)topk);
    d->expert_margin = malloc(sizeof(float) * lt);
    d->index_sel = malloc(sizeof(int32_t) * lt * (size_t)index_topk);
    if (!d->expert_ids || !d->expert_margin || !d->index_sel) {
        ms_decisions_free(d);
        return ms_errf(err, MS_ERR_NOMEM, "decisions: out of memory");
    }
    d->n_layers = n_layers, d->n_tokens = n_tokens, d->topk = topk, d->index_topk = index_topk;
    for (size_t i = 0; i < lt * (size_t)topk; i++) d->expert_ids[i] = -1;
    for (size_t i = 0; i < lt; i++) d->expert_margin[i] = INFINITY;
    for (size_t i = 0; i < lt * (size_t)index_topk; i++) d->index_sel[i] = -1;
    return MS_OK;
}

void ms_decisions_free(ms_decisions *d) {
    free(d->expert_ids);
    free(d->expert_margin);
    free(d->index_sel);
    memset(d, 0, sizeof *d);
}

int ms_decisions_save(const ms_decisions *d, const char *path, ms_err *err) {
    ms_st_writer *w = ms_st_writer_new();
    if (!w) return ms_errf(err, MS_ERR_NOMEM, "%s: out of memory", path);
    int64_t s3[3] = {d->n_layers, d->n_tokens, d->topk}, s2[2] = {d->n_layers, d->n_tokens},
            si[3] = {d->n_layers, d->n_tokens, d->index_topk};
    size_t lt = (size_t)d->n_layers * (size_t)d->n_tokens;
    int rc = ms_st_writer_add(w, "expert_ids", MS_I32, 3, s3, d->expert_ids, 4 * lt * (size_t)d->topk, err);
    if (!rc) rc = ms_st_writer_add(w, "expert_margin", MS_F32, 2, s2, d->expert_margin, 4 * lt, err);
    if (!rc) rc = ms_st_writer_add(w, "index_sel", MS_I32, 3, si, d->index_sel, 4 * lt * (size_t)d->index_topk, err);
    if (!rc) rc = ms_st_writer_finish(w, path, err);
    ms_st_writer_free(w);
    return rc;
}

int ms_decisions_load(const char *path, ms_decisions *d, ms_err *err) {
    memset(d, 0, sizeof *d);
    ms_st_set *s;
    MS_TRY(ms_st_open(path, &s, err));
    const ms_st_tensor *e = ms_st_find(s, "expert_ids"), *m = ms_st_find(s, "expert_margin"),
                       *x = ms_st_find(s, "index_sel");
    int rc = MS_OK;
    if (!e || !m || !x || e->dtype != MS_I32 || m->dtype != MS_F32 || x->dtype != MS_I32 || e->ndim != 3 ||
        m->ndim != 2 || x->ndim != 3 || m->shape[0] != e->shape[0] || m->shape[1] != e->shape[1] ||
        x->shape[0] != e->shape[0] || x->shape[1] != e->shape[1]) {
        rc = ms_errf(err, MS_ERR_FORMAT, "%s: not a decisions file (expert_ids, expert_margin, index_sel)", path);
    } else if (!(rc = ms_decisions_alloc(d, (int)e->shape[0], (int)e->shape[1], (int)e->shape[2], (int)x->shape[2], err))) {
        memcpy(d->expert_ids, e->data, e->nbytes);
        memcpy(d->expert_margin, m->data, m->nbytes);
        memcpy(d->index_sel, x->data, x->nbytes);
    }
    ms_st_close(s);
    return rc;
}

static float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Margin of the router's choice for one token: biased scores b = sigmoid(logit) + bias; within the
 * kept groups the k-th chosen must beat every excluded expert, and the last kept group must beat the
 * first dropped one. Returns the smaller of those two gaps. */
static float route_margin(const float *logit, const float *bias, const ms_route_cfg *rc, const int32_t *ids) {
    const int E = rc->n_experts, G = rc->n_group > 0 ? rc->n_group : 1, per = E / G;
    float b[4096];
    uint8_t chosen[4096] = {0}, keep_g[256] = {0};
    if (E > 4096 || G > 256) return NAN;
    for (int e = 0; e < E; e++) b[e] = sigm(logit[e]) + (bias ? bias[e] : 0.0f);
    float gs[256];
    for (int g = 0; g < G; g++) {
        float m1 = -INFINITY, m2 = -INFINITY;
        for (int e = g * per; e < (g + 1) * per; e++) {
            if (b[e] > m1) m2 = m1, m1 = b[e];
            else if (b[e] > m2) m2 = b[e];
        }
        gs[g] = per >= 2 ? m1 + m2 : m1;
    }
    float margin = INFINITY;
    if (G > rc->topk_group) {
        /* groups holding chosen experts are the kept ones */
        for (int k = 0; k < rc->topk; k++)
            if (ids[k] >= 0 && ids[k] < E) keep_g[ids[k] / per] = 1;
        float worst_kept = INFINITY, best_dropped = -INFINITY;
        for (int g = 0; g < G; g++) {
            if (keep_g[g]) worst_kept = fminf(worst_kept, gs[g]);
            else best_dropped = fmaxf(best_dropped, gs[g]);
        }
        margin = worst_kept - best_dropped;
    } else {
        for (int g = 0; g < G; g++) keep_g[g] = 1;
    }
    float kth = INFINITY, best_out = -INFINITY;
    for (int k = 0; k < rc->topk; k++)
        if (ids[k] >= 0 && ids[k] < E) chosen[ids[k]] = 1, kth = fminf(kth, b[ids[k]]);
    for (int e = 0; e < E; e++)
        if (!chosen[e] && keep_g[e / per]) best_out = fmaxf(best_out, b[e]);
    return fminf(margin, kth - best_out);
}

/* Routing weights of given ids from float32 logits, as the router op computes them. */
static void route_weights(const float *logit, const ms_route_cfg *rc, const int32_t *ids, float *w) {
    float sum = 0.0f;
    for (int k = 0; k < rc->topk; k++) w[k] = sigm(logit[ids[k]]), sum += w[k];
    for (int k = 0; k < rc->topk; k++) {
        if (rc->norm_topk_prob) w[k] /= sum + 1e-20f;
        w[k] *= rc->routed_scaling_factor;
    }
}

int fw_decide_experts(ms_forward *f, int L, int T, const ms_route_cfg *rc, ms_err *err) {
    ms_decisions *rec = f->o.record;
    const ms_decisions *rep = f->o.replay;
    if (!rec && !rep) return MS_OK;
    const ms_backend_ops *op = f->b->ops;
    const ms_layer *l = &f->m->layers[L];
    const int E = rc->n_experts, k = rc->topk;
    const ms_decisions *d = rec ? rec : rep;
    if (d->n_tokens != T || d->topk != k || L >= d->n_layers)
        return ms_errf(err, MS_ERR_INVALID, "decisions: recorded for %d tokens / top-%d / %d layers, step has %d / %d / layer %d",
                       d->n_tokens, d->topk, d->n_layers, T, k, L);
    ms_tensor a = fw_view2(&f->a, T, f->m->cfg.hidden_size), lg = fw_view2(&f->rlog, T, E);
    MS_TRY(op->linear(f->b, &l->router, &a, &lg, err));
    MS_TRY(op->download(f->b, f->h_rlog, lg.data, sizeof(float) * (size_t)T * (size_t)E, err));
    const float *bias = NULL;
    float *hb = NULL;
    if (l->router_bias.data) {
        hb = malloc(sizeof(float) * (size_t)E);
        if (!hb) return ms_errf(err, MS_ERR_NOMEM, "decisions: out of memory");
        int rc2 = op->download(f->b, hb, l->router_bias.data, sizeof(float) * (size_t)E, err);
        if (rc2) { free(hb); return rc2; }
        bias = hb;
    }
    int32_t *slot = (int32_t *)d->expert_ids + (size_t)L * (size_t)T * (size_t)k;
    int rc3 = MS_OK;
    if (rep) {
        for (int t = 0; t < T; t++) route_weights(f->h_rlog + (size_t)t * E, rc, slot + (size_t)t * k, f->h_rw + (size_t)t * k);
        rc3 = op->upload(f->b, f->ids.data, slot, sizeof(int32_t) * (size_t)T * (size_t)k, err);
        if (!rc3) rc3 = op->upload(f->b, f->rw.data, f->h_rw, sizeof(float) * (size_t)T * (size_t)k, err);
    } else {
        rc3 = op->download(f->b, slot, f->ids.data, sizeof(int32_t) * (size_t)T * (size_t)k, err);
        for (int t = 0; t < T && !rc3; t++)
            rec->expert_margin[(size_t)L * T + t] = route_margin(f->h_rlog + (size_t)t * E, bias, rc, slot + (size_t)t * k);
    }
    free(hb);
    return rc3;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (x < 0) return y < 0 ? 0 : 1; /* -1 padding last */
    if (y < 0) return -1;
    return (x > y) - (x < y);
}

int fw_decide_index(ms_forward *f, int L, int T, ms_err *err) {
    const ms_decisions *d = f->o.record ? f->o.record : f->o.replay;
    if (!d) return MS_OK;
    const int K = f->m->cfg.index_topk;
    if (d->n_tokens != T || d->index_topk != K || L >= d->n_layers)
        return ms_errf(err, MS_ERR_INVALID, "decisions: recorded for %d tokens / index top-%d, step has %d / %d", d->n_tokens,
                       d->index_topk, T, K);
    int32_t *slot = d->index_sel + (size_t)L * (size_t)T * (size_t)K;
    if (f->o.replay) return f->b->ops->upload(f->b, f->topk.data, slot, sizeof(int32_t) * (size_t)T * (size_t)K, err);
    MS_TRY(f->b->ops->download(f->b, slot, f->topk.data, sizeof(int32_t) * (size_t)T * (size_t)K, err));
    for (int t = 0; t < T; t++) qsort(slot + (size_t)t * K, (size_t)K, sizeof(int32_t), cmp_i32);
    return MS_OK;
}
