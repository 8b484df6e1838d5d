/* runner_cpu.c - the CPU MoE runner: routed SwiGLU experts grouped by expert.
 *
 * Tokens are bucketed by the expert they were routed to so each selected expert's weights are read
 * once for all of its tokens (decode reads exactly the experts in use; prefill turns into small
 * GEMMs). Work is split over (expert, row block) pairs on the pool, with the same fused dequant
 * kernels as the backend's linear. Per-assignment down outputs are combined per token in ascending
 * expert order (as transformers' index_add loop does). Tokens are processed in chunks of at most
 * CHUNK_T so the workspace stays bounded for long prefills. */
#include "backend/cpu/cpu_kernels.h"
#include "core/dtype.h"
#include "moe/moe.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define CHUNK_T 256
#define RB 32 /* rows per work item */

static int cpu_supports(const ms_backend *b, const ms_moe_shape *s, char *why, size_t cap) {
    if (strcmp(b->name, "cpu") != 0) {
        snprintf(why, cap, "it runs only on the cpu backend");
        return 0;
    }
    if (s->fmt == MS_WFMT_PLAIN && s->plain_dtype != MS_F32 && s->plain_dtype != MS_BF16 && s->plain_dtype != MS_F16) {
        snprintf(why, cap, "plain expert weights of dtype %s are not supported", ms_dtype_name(s->plain_dtype));
        return 0;
    }
    if (s->fmt == MS_WFMT_NVFP4 && (s->hidden % 16 || s->inter % 16)) {
        snprintf(why, cap, "nvfp4 experts need hidden and intermediate sizes divisible by 16");
        return 0;
    }
    return 1;
}

typedef struct {
    size_t cnt, off, act_list, a_tok, a_inv; /* int32 arrays */
    size_t xg, act, part, thr;               /* float arrays */
    size_t thr_per, total;
} ws_layout;

static size_t al(size_t x) { return (x + 63) / 64 * 64; }

static ws_layout layout(int n_experts, int tc, int topk, int64_t H, int64_t I, int nth) {
    ws_layout L;
    size_t A = (size_t)tc * (size_t)topk, o = 0;
    L.cnt = o; o = al(o + 4 * (size_t)n_experts);
    L.off = o; o = al(o + 4 * ((size_t)n_experts + 1));
    L.act_list = o; o = al(o + 4 * (size_t)n_experts);
    L.a_tok = o; o = al(o + 4 * A);
    L.a_inv = o; o = al(o + 4 * A);
    L.xg = o; o = al(o + 4 * A * (size_t)H);
    L.act = o; o = al(o + 4 * A * (size_t)I);
    L.part = o; o = al(o + 4 * A * (size_t)H);
    /* per thread: gate and up tiles [A, RB] plus a dequantized weight tile for the sgemm path */
    L.thr_per = al(4 * (2 * A * RB + (size_t)RB * (size_t)(H > I ? H : I)));
    L.thr = o;
    o += L.thr_per * (size_t)nth;
    L.total = o;
    return L;
}

static size_t cpu_ws_size(const ms_backend *b, const ms_moe_shape *s) {
    int tc = s->n_tokens < CHUNK_T ? s->n_tokens : CHUNK_T;
    if (tc < 1) tc = 1;
    return layout(s->n_experts, tc, s->topk, s->hidden, s->inter, ms_pool_size(ms_cpu_pool())).total;
}

typedef struct {
    const ms_experts *e;
    int64_t H, I;
    const float *x;
    char *ws;
    ws_layout L;
    const int32_t *cnt, *off, *act_list;
    int n_rb1, n_rb2;
    float *xg, *act, *part;
} run_ctx;

static void up_fn(void *p, int64_t b, int64_t en, int wk) {
    run_ctx *c = p;
    float *g = (float *)(c->ws + c->L.thr + c->L.thr_per * (size_t)wk);
    for (int64_t it = b; it < en; it++) {
        int e = c->act_list[it / c->n_rb1];
        int64_t r0 = (it % c->n_rb1) * RB, r1 = r0 + RB < c->I ? r0 + RB : c->I, nr = r1 - r0;
        int n = c->cnt[e];
        float *u = g + (size_t)n * RB, *scr = u + (size_t)n * RB;
        const float *xs = c->xg + (int64_t)c->off[e] * c->H;
        ms_cpu_linear_rows(&c->e->gate[e], r0, r1, xs, c->H, n, g, nr, scr);
        ms_cpu_linear_rows(&c->e->up[e], r0, r1, xs, c->H, n, u, nr, scr);
        for (int i = 0; i < n; i++) {
            float *a = c->act + ((int64_t)c->off[e] + i) * c->I + r0;
            for (int64_t r = 0; r < nr; r++) {
                float gv = g[i * nr + r];
                a[r] = gv / (1.0f + expf(-gv)) * u[i * nr + r];
            }
        }
    }
}

static void down_fn(void *p, int64_t b, int64_t en, int wk) {
    run_ctx *c = p;
    float *scr = (float *)(c->ws + c->L.thr + c->L.thr_per * (size_t)wk);
    for (int64_t it = b; it < en; it++) {
        int e = c->act_list[it / c->n_rb2];
        int64_t r0 = (it % c->n_rb2) * RB, r1 = r0 + RB < c->H ? r0 + RB : c->H;
        int n = c->cnt[e];
        ms_cpu_linear_rows(&c->e->down[e], r0, r1, c->act + (int64_t)c->off[e] * c->I, c->I, n,
                           c->part + (int64_t)c->off[e] * c->H + r0, c->H, scr);
    }
}

typedef struct {
    const int32_t *ids, *a_inv;
    const float *w, *part;
    float *out;
    int topk;
    int64_t H;
} comb_ctx;

#define COMB_SORT_MAX 64

static void comb_fn(void *p, int64_t b, int64_t en, int wk) {
    comb_ctx *c = p;
    for (int64_t t = b; t < en; t++) {
        /* Summed in ascending (expert id, slot) order so the result does not depend on the router's
         * order. Up to COMB_SORT_MAX slots: insertion sort into a stack array; more (a legal config,
         * num_experts_per_tok > 64): selection of the next slot in that order, O(topk^2) but no storage. */
        const int32_t *id = c->ids + t * c->topk;
        float *o = c->out + t * c->H;
        memset(o, 0, (size_t)c->H * 4);
        if (c->topk <= COMB_SORT_MAX) {
            int ord[COMB_SORT_MAX];
            for (int j = 0; j < c->topk; j++) {
                int k = j;
                while (k > 0 && id[ord[k - 1]] > id[j]) { ord[k] = ord[k - 1]; k--; }
                ord[k] = j;
            }
            for (int j = 0; j < c->topk; j++) {
                int a = c->a_inv[t * c->topk + ord[j]];
                if (a < 0) continue; /* held by another rank */
                ms_cpu_axpy(c->w[t * c->topk + ord[j]], c->part + (int64_t)a * c->H, o, c->H);
            }
            continue;
        }
        int prev = -1; /* the slot summed last */
        for (int n = 0; n < c->topk; n++) {
            int best = -1;
            for (int j = 0; j < c->topk; j++) {
                int after_prev = prev < 0 || id[j] > id[prev] || (id[j] == id[prev] && j > prev);
                if (after_prev && (best < 0 || id[j] < id[best] || (id[j] == id[best] && j < best))) best = j;
            }
            prev = best;
            int a = c->a_inv[t * c->topk + best];
            if (a < 0) continue;
            ms_cpu_axpy(c->w[t * c->topk + best], c->part + (int64_t)a * c->H, o, c->H);
        }
    }
}

typedef struct {
    const float *x;
    const int32_t *a_tok;
    float *xg;
    int64_t H;
} gath_ctx;

static void gath_fn(void *p, int64_t b, int64_t en, int wk) {
    gath_ctx *c = p;
    for (int64_t a = b; a < en; a++) memcpy(c->xg + a * c->H, c->x + (int64_t)c->a_tok[a] * c->H, (size_t)c->H * 4);
}

static int cpu_run(ms_backend *b, const ms_experts *e, const ms_tensor *x, const int32_t *ids, const float *w, int topk,
                   ms_tensor *out, void *workspace, size_t ws_bytes, ms_err *err) {
    MS_ASSERT(x->dtype == MS_F32 && out->dtype == MS_F32);
    MS_ASSERT(topk >= 1 && e->n >= 1); /* any topk: config.c bounds it by n_routed_experts */
    const int64_t H = x->shape[x->ndim - 1], T = ms_tensor_numel(x) / H, I = e->gate[0].n_in == H ? e->gate[0].n_out : -1;
    MS_ASSERT(I > 0 && ms_tensor_numel(out) == T * H);
    ms_pool *pool = ms_cpu_pool();
    const int nth = ms_pool_size(pool);
    for (int64_t i = 0; i < T * topk; i++)
        if (ids[i] < -1 || ids[i] >= e->n) /* -1: an expert another rank holds (expert parallelism) */
            return ms_errf(err, MS_ERR_INVALID, "moe cpu runner: expert id %d of token %lld is out of range (%d experts)",
                           ids[i], (long long)(i / topk), e->n);
    for (int64_t t0 = 0; t0 < T; t0 += CHUNK_T) {
        int tc = (int)(T - t0 < CHUNK_T ? T - t0 : CHUNK_T);
        ws_layout L = layout(e->n, tc, topk, H, I, nth);
        if (!workspace || ws_bytes < L.total)
            return ms_errf(err, MS_ERR_INVALID, "moe cpu runner: workspace of %zu bytes is smaller than the %zu needed",
                           ws_bytes, L.total);
        char *ws = workspace;
        int32_t *cnt = (int32_t *)(ws + L.cnt), *off = (int32_t *)(ws + L.off), *act_list = (int32_t *)(ws + L.act_list);
        int32_t *a_tok = (int32_t *)(ws + L.a_tok), *a_inv = (int32_t *)(ws + L.a_inv);
        const int32_t *cid = ids + t0 * topk;
        const int A = tc * topk;
        memset(cnt, 0, 4 * (size_t)e->n);
        for (int i = 0; i < A; i++)
            if (cid[i] >= 0) cnt[cid[i]]++;
        int n_act = 0;
        off[0] = 0;
        for (int k = 0; k < e->n; k++) {
            off[k + 1] = off[k] + cnt[k];
            if (cnt[k]) act_list[n_act++] = k;
        }
        /* bucket assignments by expert (tokens stay in order within a bucket); reuse cnt as fill */
        memset(cnt, 0, 4 * (size_t)e->n);
        for (int i = 0; i < A; i++) {
            int k = cid[i];
            if (k < 0) {
                a_inv[i] = -1;
                continue;
            }
            int a = off[k] + cnt[k]++;
            a_tok[a] = i / topk;
            a_inv[i] = a;
        }
        run_ctx rc = {.e = e, .H = H, .I = I, .x = (const float *)x->data + t0 * H, .ws = ws, .L = L, .cnt = cnt,
                      .off = off, .act_list = act_list, .xg = (float *)(ws + L.xg), .act = (float *)(ws + L.act),
                      .part = (float *)(ws + L.part)};
        rc.n_rb1 = (int)((I + RB - 1) / RB);
        rc.n_rb2 = (int)((H + RB - 1) / RB);
        gath_ctx gc = {rc.x, a_tok, rc.xg, H};
        const int A_here = off[e->n]; /* assignments to experts of this rank (all of them without EP) */
        ms_pool_run(pool, A_here, ms_cpu_grain((double)H), gath_fn, &gc);
        double per_tok = (double)A_here / (n_act ? n_act : 1);
        ms_pool_run(pool, (int64_t)n_act * rc.n_rb1, ms_cpu_grain(4.0 * RB * H * per_tok), up_fn, &rc);
        ms_pool_run(pool, (int64_t)n_act * rc.n_rb2, ms_cpu_grain(2.0 * RB * I * per_tok), down_fn, &rc);
        comb_ctx cc = {cid, a_inv, w + t0 * topk, rc.part, (float *)out->data + t0 * H, topk, H};
        ms_pool_run(pool, tc, ms_cpu_grain(2.0 * H * topk), comb_fn, &cc);
    }
    return MS_OK;
}

const ms_moe_runner ms_moe_runner_cpu = {
    .name = "cpu",
    .backend = "cpu",
    .supports = cpu_supports,
    .workspace_size = cpu_ws_size,
    .prepare = NULL,
    .run = cpu_run,
    .caps = MS_MOE_CAP_PARTIAL | MS_MOE_CAP_FEW_TOKENS | MS_MOE_CAP_MANY_TOKENS,
};
