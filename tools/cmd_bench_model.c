/* cmd_bench_model.c - `moeserve bench-model --model DIR [--device cpu|cuda] [--load-format dummy
 * --override num_hidden_layers=2 --dummy-quant nvfp4] [--batches 1,4] [--ctx 256] [--prefill 512]
 * [--json]`
 *
 * How close the forward gets to what the hardware allows. Decode is memory-bound, so for each
 * (batch, context) it counts the bytes one step must read — attention, indexer, dense MLP, router,
 * shared expert, the experts the step actually routed to, lm_head and the KV cache — and reports
 * the achieved bandwidth against the machine's measured read (CPU) or copy (GPU) bandwidth.
 * Prefill is compute-bound: it reports FLOP/s against the measured GEMM rate where one exists.
 * The GPU ceilings come from the backend (ms_backend_gpu_ceilings); everything else is
 * device-independent. --profile adds a per-section breakdown of a few extra decode steps; --greedy-ids
 * times decode steps as a server runs an all-greedy step (ids from the device, no logits). The report
 * ends with how many steps of each kind (decode / verify / draft) ran as recorded CUDA graphs. */
#include "common/args.h"
#include "common/model_args.h"
#include "engine/sampler.h"
#include "model/arch.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/fileutil.h"
#include "core/log.h"
#include "core/threads.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_profile; /* --profile */
static int g_greedy_ids; /* --greedy-ids: timed decode steps take the rows' greedy ids, not the logits */
static int g_spec;    /* --speculative-num-steps N (0 = off): time verify and draft steps too */
static int g_dummy;   /* --load-format dummy: random weights give near-flat logits */

/* Seconds of the profile section called name (0 when absent). */
static double prof_sec(const char **names, const double *secs, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], name)) return secs[i];
    return 0;
}

/* The step split by kind of work, so the bottleneck is named by measurement: attention kernels
 * (attention + DSA indexer), MoE (router + routed experts), dense GEMMs (attention projections,
 * dense MLPs, shared experts, lm_head), collectives, sampling (host) and the rest (norms, batch
 * upload, logits download, anything else). per = steps profiled; samp_s = sampling seconds per step.
 * With dummy weights the logits are near-flat, the top-p sampler's worst case (its nucleus is most of
 * the vocabulary): sampling is then printed but left out of the sum and the verdict, since a real
 * model's peaked distribution costs a fraction of it. */
static void print_split(const char *label, const char **names, const double *secs, int n, int per, double samp_s) {
    double total = 0;
    for (int i = 0; i < n; i++)
        if (!strstr(names[i], "(in ")) total += secs[i];
    const double kern = prof_sec(names, secs, n, "attn_kernel (in attention)"), idx = prof_sec(names, secs, n, "indexer (in attention)");
    const double attn_all = prof_sec(names, secs, n, "attention");
    const double moe = prof_sec(names, secs, n, "router") + prof_sec(names, secs, n, "moe_experts");
    const double gemm = (attn_all - kern - idx) + prof_sec(names, secs, n, "dense_mlp") +
                        prof_sec(names, secs, n, "shared_expert") + prof_sec(names, secs, n, "lm_head");
    const double coll = prof_sec(names, secs, n, "collectives");
    const double rest = total - attn_all - moe - prof_sec(names, secs, n, "dense_mlp") -
                        prof_sec(names, secs, n, "shared_expert") - prof_sec(names, secs, n, "lm_head") - coll;
    const char *cat[6] = {"attention", "moe", "dense_gemm", "collectives", "sampling", "rest"};
    double v[6] = {(kern + idx) / per, moe / per, gemm / per, coll / per, samp_s, rest / per};
    int top = 0;
    double sum = 0;
    for (int i = 0; i < 6; i++) {
        if (i == 4 && g_dummy) continue;
        sum += v[i];
        if (v[i] > v[top]) top = i;
    }
    fprintf(stderr, "profile split %s (ms per step, sum %.3f):", label, sum * 1e3);
    for (int i = 0; i < 6; i++) {
        if (i == 4 && g_dummy)
            fprintf(stderr, " sampling %.3f (not counted: dummy weights' near-flat logits are top-p's worst case);",
                    v[i] * 1e3);
        else
            fprintf(stderr, " %s %.3f (%.0f%%);", cat[i], v[i] * 1e3, sum > 0 ? 100 * v[i] / sum : 0);
    }
    fprintf(stderr, " bottleneck: %s\n", cat[top]);
}

/* Host seconds to sample B rows of logits lg [B, V] once each as the engine does (temperature 0.7,
 * top-p 0.95, one thread: the engine spreads rows of bigger batches over a pool). */
static double time_sampling(const float *lg, int B, int V) {
    ms_sampler sm;
    ms_err err = {0};
    if (ms_sampler_init(&sm, V, &err) != MS_OK) return 0;
    ms_sampling sp;
    memset(&sp, 0, sizeof sp);
    sp.temperature = 0.7f;
    sp.top_p = 0.95f;
    sp.repetition_penalty = 1.0f;
    uint64_t rng[4];
    ms_rng_seed(rng, 1);
    int32_t toks[1] = {0};
    const int reps = 3;
    double t0 = ms_now();
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < B; i++) {
            ms_token_event ev;
            (void)ms_sampler_sample(&sm, &sp, lg + (size_t)i * V, toks, 1, 1, rng, &ev);
        }
    double s = (ms_now() - t0) / reps;
    ms_sampler_destroy(&sm);
    return s;
}

#define MAX_LIST 16

typedef struct {
    double mem_gbs;     /* read bandwidth ceiling */
    double gemm_tflops; /* 0 = not measured */
    const char *mem_what;
} ceilings;

/* ------------------------------------------------------------------ CPU read bandwidth */

typedef struct {
    const float *p;
    int64_t n;
    float sums[256 * 16];
} bw_ctx;

/* Sums every float of the blocks (the sum is kept so the loads are not optimised away). AVX2: four
 * 8-float accumulators; elsewhere 32 plain C lanes, which the compiler turns into SIMD loads. */
static void bw_fn(void *ctx, int64_t b, int64_t e, int w) {
    bw_ctx *c = ctx;
#if defined(MS_CPU_AVX2)
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t blk = b; blk < e; blk++) {
        const float *p = c->p + blk * 4096;
        for (int i = 0; i < 4096; i += 32) {
            s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
            s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
            s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
            s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
        }
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    c->sums[w * 16] += t[0] + t[7];
#else
    float s[32] = {0};
    for (int64_t blk = b; blk < e; blk++) {
        const float *p = c->p + blk * 4096;
        for (int i = 0; i < 4096; i += 32)
            for (int l = 0; l < 32; l++) s[l] += p[i + l];
    }
    c->sums[w * 16] += s[0] + s[31];
#endif
}

static double cpu_read_bw(size_t mb) {
    size_t bytes = mb << 20;
    float *p = aligned_alloc(64, bytes);
    if (!p) return 0;
    memset(p, 0, bytes);
    bw_ctx *c = calloc(1, sizeof *c);
    c->p = p;
    c->n = (int64_t)(bytes / 4);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = ms_now();
        ms_pool_run(ms_cpu_pool(), c->n / 4096, 16, bw_fn, c);
        double dt = ms_now() - t0;
        if (dt > 0 && bytes / dt > best) best = bytes / dt;
    }
    free(c);
    free(p);
    return best / 1e9;
}

/* ------------------------------------------------------------------ byte / FLOP model */

static double lin_bytes(const ms_linear *W) { return W->w.data ? (double)ms_linear_nbytes(W) : 0; }
static double lin_params(const ms_linear *W) { return W->w.data ? (double)W->n_out * (double)W->n_in : 0; }

typedef struct {
    double attn, indexer, dense, router, shared, expert_each, lm_head; /* bytes (this rank's part) */
    double ep_frac; /* share of the routed experts this rank holds */
    double p_attn, p_indexer, p_dense, p_router, p_shared, p_expert, p_lm; /* params (sum over layers) */
} weight_model;

static void model_weights(const ms_model *m, weight_model *w) {
    memset(w, 0, sizeof *w);
    for (int L = 0; L < m->cfg.num_layers; L++) {
        const ms_layer *l = &m->layers[L];
        const ms_linear *att[] = {&l->q_proj, &l->k_proj, &l->v_proj, &l->o_proj, &l->q_a_proj, &l->q_b_proj,
                                  &l->kv_a_proj, &l->kv_b_proj};
        for (size_t i = 0; i < sizeof att / sizeof att[0]; i++) w->attn += lin_bytes(att[i]), w->p_attn += lin_params(att[i]);
        if (l->has_indexer) {
            const ms_linear *ix[] = {&l->idx_wq_b, &l->idx_wk, &l->idx_wproj};
            for (int i = 0; i < 3; i++) w->indexer += lin_bytes(ix[i]), w->p_indexer += lin_params(ix[i]);
        }
        if (!l->is_moe) {
            const ms_linear *d[] = {&l->gate_proj, &l->up_proj, &l->down_proj};
            for (int i = 0; i < 3; i++) w->dense += lin_bytes(d[i]), w->p_dense += lin_params(d[i]);
        } else {
            w->router += lin_bytes(&l->router);
            w->p_router += lin_params(&l->router);
            if (l->has_shared) {
                const ms_linear *s[] = {&l->sh_gate, &l->sh_up, &l->sh_down};
                for (int i = 0; i < 3; i++) w->shared += lin_bytes(s[i]), w->p_shared += lin_params(s[i]);
            }
            if (l->experts.n > 0 && w->expert_each == 0) {
                w->expert_each = lin_bytes(&l->experts.gate[0]) + lin_bytes(&l->experts.up[0]) + lin_bytes(&l->experts.down[0]);
                w->p_expert = lin_params(&l->experts.gate[0]) + lin_params(&l->experts.up[0]) + lin_params(&l->experts.down[0]);
            }
        }
    }
    w->lm_head = lin_bytes(&m->lm_head);
    w->p_lm = lin_params(&m->lm_head);
    /* under expert parallelism a rank holds ne of the routed experts: its share of a step's routed
     * experts (the record counts them over all experts) */
    w->ep_frac = m->cfg.n_routed_experts > 0 ? (double)m->shard.ne / m->cfg.n_routed_experts : 1.0;
}

/* KV bytes one decode step reads for one sequence at context ctx on one rank (a rank caches its
 * share of a layer's KV: kv_bytes_per_token with and without the split gives it). */
static double kv_read_bytes(const ms_model *m, const ms_backend *b, int ctx) {
    const ms_config *c = &m->cfg;
    const size_t es = ms_dtype_size(b->act_dtype);
    double n = 0;
    for (int L = 0; L < c->num_layers; L++)
        n += c->arch->kv_read_bytes(c, L, ctx, (double)es) * (double)c->arch->kv_bytes_per_token(c, L, es, m->shard.tp_size) /
             (double)c->arch->kv_bytes_per_token(c, L, es, 1);
    return n;
}

/* FLOPs of prefilling P tokens of one sequence (logits for the last token only). */
static double prefill_flops(const ms_model *m, const weight_model *w, int P) {
    const ms_config *c = &m->cfg;
    double per_tok = 2.0 * (w->p_attn + w->p_indexer + w->p_dense + w->p_router + w->p_shared);
    int n_moe = 0;
    for (int L = 0; L < c->num_layers; L++) n_moe += m->layers[L].is_moe;
    per_tok += 2.0 * n_moe * c->num_experts_per_tok * w->ep_frac * w->p_expert;
    double attn = 0, avg_ctx = (P + 1) / 2.0;
    for (int L = 0; L < c->num_layers; L++) attn += c->arch->attn_flops(c, L, avg_ctx, P) / m->shard.tp_size;
    return (per_tok + attn) * P + 2.0 * w->p_lm;
}

/* ------------------------------------------------------------------ runs */

typedef struct {
    int batch, ctx, steps;
    double tok_s, ms_step, bytes_step, gbs, pct;
    double flops_step, tflops, pct_gemm; /* FLOPs the step needs; achieved rate; share of the GEMM ceiling */
    double routed_avg; /* distinct experts per MoE layer per step */
    char skipped[160]; /* non-empty: not run, and why (e.g. the KV cache cannot hold it) */
    double verify_ms, draft_ms; /* speculative decoding: a verification step of N+1 tokens per sequence, one
                                 * MTP draft step of one token per sequence (0 when not measured) */
} decode_res;

/* Speculative decoding's two step kinds at this batch and context, on the sequences' own pages:
 * the target verifying N+1 tokens per sequence (logits on all of them) and one MTP draft step (one
 * token per sequence, hidden rows of the verification). Each is the mean of several timed runs after
 * warm-up (where graphs are on, both run as CUDA graphs from the third run on); positions ctx .. ctx+N
 * are rewritten every run (only the time matters here). */
static int run_spec(const ms_executor *ex, int B, int ctx, const int32_t *bt, int pps, const int32_t *ids, decode_res *r,
                    ms_err *err) {
    const int N = g_spec, ps = ex->page_size, V = ex->vocab, T = B * (N + 1);
    if (!ex->draft || T > ex->max_batch_tokens) return MS_OK;
    int32_t *arr = malloc(sizeof(int32_t) * (size_t)(6 * T + 2 * B + 2));
    float *lg = malloc(sizeof(float) * (size_t)T * (size_t)V);
    if (!arr || !lg) {
        free(arr), free(lg);
        return ms_errf(err, MS_ERR_NOMEM, "bench-model: out of memory for the speculative steps");
    }
    int32_t *tok = arr, *pos = tok + T, *slot = pos + T, *lidx = slot + T, *hidx = lidx + T, *st = hidx + T,
            *ctxl = st + B + 1;
    int rc = MS_OK;
    double tv = 0, td = 0;
    int nv = 0;
    for (int it = 0; it < 12 && !rc; it++) {
        for (int s = 0; s < B; s++) {
            st[s] = s * (N + 1);
            ctxl[s] = ctx + N + 1;
            for (int j = 0; j <= N; j++) {
                int t = s * (N + 1) + j, p = ctx + j;
                tok[t] = ids[(s + j + it) % (ctx + 1)];
                pos[t] = p;
                slot[t] = bt[s * pps + p / ps] * ps + p % ps;
                lidx[t] = t;
            }
        }
        st[B] = T;
        ms_batch vb = {T, B, tok, pos, st, ctxl, slot, bt, pps, ps, T, lidx};
        double t0 = ms_now();
        rc = ex->forward(ex->ctx, &vb, lg, err);
        double t1 = ms_now();
        if (rc) break;
        /* one draft step: position ctx + 1 of each sequence, hidden row of its second token */
        for (int s = 0; s < B; s++) {
            int p = ctx + 1;
            tok[s] = ids[(s + it + 2) % (ctx + 1)];
            pos[s] = p;
            slot[s] = bt[s * pps + p / ps] * ps + p % ps;
            lidx[s] = s;
            st[s] = s;
            ctxl[s] = p + 1;
            hidx[s] = s * (N + 1) + 1;
        }
        st[B] = B;
        ms_batch db = {B, B, tok, pos, st, ctxl, slot, bt, pps, ps, B, lidx};
        double t2 = ms_now();
        rc = ex->draft(ex->ctx, &db, 0, hidx, lg, err);
        double t3 = ms_now();
        if (!rc && it >= 2) tv += t1 - t0, td += t3 - t2, nv++;
    }
    if (!rc && nv) r->verify_ms = tv / nv * 1e3, r->draft_ms = td / nv * 1e3;
    free(arr);
    free(lg);
    return rc;
}

#define MAX_STEPS 200
/* Private KV pages per sequence for the decode steps (positions ctx .. ctx + MAX_STEPS + warm-up). */
static int priv_pages(int ps) { return (MAX_STEPS + 8 + ps - 1) / ps + 1; }
/* KV pages a (batch, context) run needs: when ctx is a whole number of pages all sequences share one
 * prefilled context (read-only pages, as a prefix cache would) and only their decode pages are
 * private; otherwise each sequence is prefilled into its own pages. */
static int64_t pages_needed(int B, int ctx, int ps) {
    if (ctx % ps == 0) return (int64_t)ctx / ps + (int64_t)B * priv_pages(ps);
    return (int64_t)B * ((ctx + MAX_STEPS + 8 + ps - 1) / ps);
}

/* Attention FLOPs of one decode token that sees ctx positions (all layers). */
static double attn_flops_tok(const ms_model *m, int ctx) {
    const ms_config *c = &m->cfg;
    double f = 0;
    for (int L = 0; L < c->num_layers; L++) f += c->arch->attn_flops(c, L, ctx, 0);
    return f;
}

/* Prefills ctx tokens of sequence s (pages s*pps..) in chunks. */
static int fill_seq(const ms_executor *ex, int s, int pps, const int32_t *ids, int ctx, float *logits, ms_err *err) {
    const int ps = ex->page_size, chunk = ex->max_batch_tokens;
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)(4 * chunk + pps + 2));
    if (!buf) return ms_errf(err, MS_ERR_NOMEM, "bench-model: out of memory");
    int32_t *pos = buf, *slot = pos + chunk, *lidx = slot + chunk, *bt = lidx + chunk, *st = bt + pps;
    for (int j = 0; j < pps; j++) bt[j] = s * pps + j;
    int rc = MS_OK;
    for (int t0 = 0; t0 < ctx && !rc; t0 += chunk) {
        int n = ctx - t0 < chunk ? ctx - t0 : chunk;
        for (int i = 0; i < n; i++) {
            int p = t0 + i;
            pos[i] = p;
            slot[i] = bt[p / ps] * ps + p % ps;
        }
        lidx[0] = n - 1;
        st[0] = 0;
        st[1] = n;
        int32_t cl = t0 + n;
        ms_batch b = {n, 1, ids + t0, pos, st, &cl, slot, bt, pps, ps, 1, lidx};
        rc = ex->forward(ex->ctx, &b, logits, err);
    }
    free(buf);
    return rc;
}

static int run_decode(const ms_executor *ex, ms_forward *fw, const ms_model *m, const ms_backend *be,
                      const weight_model *w, const ceilings *ce, int B, int ctx, decode_res *r, ms_err *err) {
    const int ps = ex->page_size, V = ex->vocab, shared = ctx % ps == 0;
    const int pps = shared ? ctx / ps + priv_pages(ps) : (ctx + MAX_STEPS + 8 + ps - 1) / ps;
    memset(r, 0, sizeof *r);
    r->batch = B;
    r->ctx = ctx;
    int64_t need = pages_needed(B, ctx, ps);
    if (need > ex->n_pages) {
        snprintf(r->skipped, sizeof r->skipped, "needs %lld KV pages, the cache has %d", (long long)need, ex->n_pages);
        return MS_OK;
    }
    if (B > ex->max_batch_tokens) {
        snprintf(r->skipped, sizeof r->skipped, "batch exceeds %d tokens per step", ex->max_batch_tokens);
        return MS_OK;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(ctx + 1));
    int32_t *arr = malloc(sizeof(int32_t) * ((size_t)B * (6 + (size_t)pps) + 1));
    float *lg = malloc(sizeof(float) * (size_t)B * (size_t)V);
    int32_t *gid = malloc(sizeof(int32_t) * (size_t)B);
    if (!ids || !arr || !lg || !gid) {
        free(ids), free(arr), free(lg), free(gid);
        return ms_errf(err, MS_ERR_NOMEM, "bench-model: out of memory");
    }
    /* page-locked like the engine's logits buffer, so the timed download is the server's */
    if (ex->pin) ex->pin(ex->ctx, lg, sizeof(float) * (size_t)B * (size_t)V);
    uint64_t rng = 12345;
    for (int i = 0; i <= ctx; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((rng >> 33) % (uint64_t)V);
    }
    int32_t *tok = arr, *pos = tok + B, *slot = pos + B, *lidx = slot + B, *ctxl = lidx + B, *st = ctxl + B,
            *bt = st + B + 1;
    int rc = MS_OK;
    if (shared) {
        /* one prefill of the context into pages 0 .. ctx/ps-1; every sequence's table starts with them */
        rc = fill_seq(ex, 0, pps, ids, ctx, lg, err);
        for (int s = 0; s < B; s++)
            for (int j = 0; j < pps; j++)
                bt[s * pps + j] = j < ctx / ps ? j : ctx / ps + s * priv_pages(ps) + (j - ctx / ps);
    } else {
        for (int s = 0; s < B && !rc; s++) rc = fill_seq(ex, s, pps, ids, ctx, lg, err);
        for (int s = 0; s < B; s++)
            for (int j = 0; j < pps; j++) bt[s * pps + j] = s * pps + j;
    }
    double t_total = 0, routed_total = 0;
    int steps = 0, n_moe = 0, routed_steps = 0;
    for (int L = 0; L < m->cfg.num_layers; L++) n_moe += m->layers[L].is_moe;
    /* warm-up steps; then timed steps with the routing record paused (its per-layer copy would be
     * timed too); then 3 untimed steps that record which experts the batch routes to */
    int timing_done = 0, extra = 0;
    for (int it = 0; !rc && it < MAX_STEPS + 5 && extra < 3; it++) {
        int p = ctx + it;
        for (int s = 0; s < B; s++) {
            tok[s] = ids[(s + it) % (ctx + 1)];
            pos[s] = p;
            slot[s] = bt[s * pps + p / ps] * ps + p % ps;
            lidx[s] = s;
            ctxl[s] = p + 1;
            st[s] = s;
        }
        st[B] = B;
        ms_batch b = {B, B, tok, pos, st, ctxl, slot, bt, pps, ps, B, lidx};
        /* steps 0-2 warm up (the first run of a batch shape is eager, the second records its CUDA
         * graph) with the record paused, so they are what the timed steps will be */
        const int warm = it < 3, timed = !warm && !timing_done;
        if (fw) ms_forward_set_record_routing(fw, !warm && !timed);
        double t0 = ms_now();
        /* a greedy server step: the ids from the device (int32 per row) instead of the logits */
        if (g_greedy_ids && ex->forward_argmax) rc = ex->forward_argmax(ex->ctx, &b, gid, err);
        else rc = ex->forward(ex->ctx, &b, lg, err);
        double dt = ms_now() - t0;
        if (rc) break;
        if (timed) {
            t_total += dt;
            steps++;
            if ((steps >= 10 && t_total > 0.3) || it + 4 >= MAX_STEPS) timing_done = 1;
        } else if (timing_done) {
            extra++;
        }
        if (!warm && !timed) {
            const int *routed = fw ? ms_forward_routed_experts(fw) : NULL;
            double routed_n = 0;
            for (int L = 0; routed && L < m->cfg.num_layers; L++) routed_n += routed[L];
            routed_total += n_moe ? routed_n / n_moe : 0;
            routed_steps++;
        }
    }
    if (fw) ms_forward_set_record_routing(fw, 1);
    if (!rc && g_profile && fw) {
        /* a few more steps with every section bracketed by syncs: where the step's time goes */
        ms_forward_set_profile(fw, 1);
        const int np = 3;
        for (int it = 0; it < np && !rc; it++) {
            ms_batch b = {B, B, tok, pos, st, ctxl, slot, bt, pps, ps, B, lidx};
            rc = ex->forward(ex->ctx, &b, lg, err);
        }
        const char *names[32];
        double secs[32], tot = 0;
        int n = ms_forward_profile(fw, names, secs, 32);
        for (int i = 0; i < n; i++)
            if (!strstr(names[i], "(in ")) tot += secs[i];
        fprintf(stderr, "profile batch %d ctx %d (synchronised sections, ms per step; sum %.3f):", B, ctx, tot / np * 1e3);
        for (int i = 0; i < n; i++) fprintf(stderr, " %s %.3f;", names[i], secs[i] / np * 1e3);
        fprintf(stderr, "\n");
        char label[64];
        snprintf(label, sizeof label, "batch %d ctx %d", B, ctx);
        print_split(label, names, secs, n, np, rc ? 0 : time_sampling(lg, B, m->cfg.vocab_size));
        ms_forward_set_profile(fw, 0);
    }
    if (!rc && steps == 0) rc = ms_errf(err, MS_ERR_RUNTIME, "bench-model: no decode step was timed");
    if (!rc && g_spec) {
        /* the routing record off, as for the timed decode steps: verification steps can then run as
         * CUDA graphs (the first run of a shape is eager, the second records it; both are warm-up) */
        if (fw) ms_forward_set_record_routing(fw, 0);
        rc = run_spec(ex, B, ctx, bt, pps, ids, r, err);
        if (fw) ms_forward_set_record_routing(fw, 1);
    }
    if (!rc) {
        const int p_mid = ctx + 2 + steps / 2 + 1; /* context of the middle timed step */
        r->steps = steps;
        r->routed_avg = routed_steps ? routed_total / routed_steps : 0;
        r->ms_step = t_total / steps * 1e3;
        r->tok_s = B * steps / t_total;
        r->bytes_step = w->attn + w->dense + w->router + w->shared + n_moe * r->routed_avg * w->ep_frac * w->expert_each +
                        w->lm_head + w->indexer + B * kv_read_bytes(m, be, p_mid);
        r->gbs = r->bytes_step / (t_total / steps) / 1e9;
        r->pct = ce->mem_gbs > 0 ? 100.0 * r->gbs / ce->mem_gbs : 0;
        r->flops_step = B * (2.0 * (w->p_attn + w->p_indexer + w->p_dense + w->p_router + w->p_shared + w->p_lm) +
                             2.0 * n_moe * m->cfg.num_experts_per_tok * w->ep_frac * w->p_expert +
                             attn_flops_tok(m, p_mid) / m->shard.tp_size);
        r->tflops = r->flops_step / (t_total / steps) / 1e12;
        r->pct_gemm = ce->gemm_tflops > 0 ? 100.0 * r->tflops / ce->gemm_tflops : 0;
    }
    free(ids);
    free(arr);
    free(gid);
    if (ex->unpin) ex->unpin(ex->ctx, lg);
    free(lg);
    return rc;
}

static int parse_list(const char *s, int *out, const char *flag) {
    int n = 0;
    while (s && *s && n < MAX_LIST) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1 << 20) {
            fprintf(stderr, "moeserve bench-model: flag --%s: expected a comma-separated list of positive integers\n", flag);
            return -1;
        }
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            fprintf(stderr, "moeserve bench-model: flag --%s: unexpected '%c'\n", flag, *end);
            return -1;
        }
    }
    return n;
}

static const ms_opt bench_model_opts[] = {
    {"batches", NULL, MS_OPT_VALUE, "1,8,..", "decode batch sizes [1,8,64,256 on a GPU, 1,4 on CPU]"},
    {"ctx", NULL, MS_OPT_VALUE, "256,..", "context lengths [256,8192 on a GPU, 256 on CPU]"},
    {"prefill", NULL, MS_OPT_VALUE, "N", "prefill tokens [4096 on a GPU, 512 on CPU]"},
    {"mem-mb", NULL, MS_OPT_VALUE, "MB", "bandwidth probe size [256]"},
    {"json", NULL, MS_OPT_BOOL, NULL, "print the results as JSON"},
    {"profile", NULL, MS_OPT_BOOL, NULL, "add a per-section breakdown of a few extra decode steps"},
    {"greedy-ids", NULL, MS_OPT_BOOL, NULL,
     "time decode steps as a server's all-greedy steps run: each row's argmax taken on the device, ids "
     "downloaded instead of the logits (where the backend can)"},
    MS_OPT_END,
};

static const ms_cmd bench_model_cmd = {
    "bench-model", "--model DIR [flags]",
    "How close the forward gets to what the hardware allows: decode bandwidth and prefill FLOP/s\n"
    "against the machine's measured ceilings.",
    {bench_model_opts, ms_model_opts, ms_parallel_opts, ms_spec_opts},
};

int cmd_bench_model(int argc, char **argv) {
    ms_args a;
    int parsed = ms_args_parse(&a, &bench_model_cmd, argc, argv);
    if (parsed) return ms_args_exit(parsed);
    if (!getenv("MS_LOG")) ms_log_set_level(MS_LOG_WARN);
    ms_model_args ma;
    int rc = 1, bad = 0, batches[MAX_LIST], ctxs[MAX_LIST], nb, nc;
    ms_executor ex = {0};
    const char *bs = ms_args_str(&a, "batches", NULL), *cs = ms_args_str(&a, "ctx", NULL);
    long long prefill = ms_args_int(&a, "prefill", 0, &bad), mem_mb = ms_args_int(&a, "mem-mb", 256, &bad);
    int json = ms_args_flag(&a, "json");
    g_profile = ms_args_flag(&a, "profile");
    g_greedy_ids = ms_args_flag(&a, "greedy-ids");
    if (g_greedy_ids && getenv("MS_HOST_ARGMAX") && strcmp(getenv("MS_HOST_ARGMAX"), "0"))
        fprintf(stderr, "bench-model: --greedy-ids with MS_HOST_ARGMAX set: the steps download the logits\n");
    rc = 2; /* a flag at fault until the model opens */
    if (ms_model_args_parse(&a, "bench-model", &ma) || bad) goto done;
    if (ms_spec_args_parse(&a, "bench-model", &ma.ex)) goto done;
    g_spec = ma.ex.speculative_num_steps;
    const int gpu = strcmp(ma.ex.device, "cpu") != 0;
    g_dummy = ma.ex.load_format && !strcmp(ma.ex.load_format, "dummy");
    if ((nb = parse_list(bs ? bs : gpu ? "1,8,64,256" : "1,4", batches, "batches")) <= 0) goto done;
    if ((nc = parse_list(cs ? cs : gpu ? "256,8192" : "256", ctxs, "ctx")) <= 0) goto done;
    if (!prefill) prefill = gpu ? 4096 : 512;
    if (prefill < 1 || prefill > 1 << 20 || mem_mb < 16 || mem_mb > 65536) {
        fprintf(stderr, "moeserve bench-model: flag --prefill or --mem-mb is out of range\n");
        goto done;
    }
    int maxb = 1, maxc = 1;
    for (int i = 0; i < nb; i++) maxb = batches[i] > maxb ? batches[i] : maxb;
    for (int i = 0; i < nc; i++) maxc = ctxs[i] > maxc ? ctxs[i] : maxc;
    (void)maxc;
    const int ps = ma.ex.page_size > 0 ? ma.ex.page_size : 16;
    ma.ex.page_size = ps;
    if (!ma.ex.max_batch_tokens) ma.ex.max_batch_tokens = (int)(prefill > maxb ? prefill : maxb);
    if (g_spec && ma.ex.max_batch_tokens < maxb * (g_spec + 1)) ma.ex.max_batch_tokens = maxb * (g_spec + 1);
    if (!ma.ex.max_total_tokens) {
        /* pages for the largest (batch, context) run; runs that memory cannot hold are skipped */
        int64_t need = prefill + ps;
        for (int ci = 0; ci < nc; ci++)
            for (int bi = 0; bi < nb; bi++)
                if (pages_needed(batches[bi], ctxs[ci], ps) * ps > need) need = pages_needed(batches[bi], ctxs[ci], ps) * ps;
        ma.ex.max_total_tokens = need > (1 << 30) ? 1 << 30 : (int)need;
    }
    ma.ex.record_routing = 1;
    rc = 1;
    ms_err err = {0};
    ms_model *m = NULL;
    double t_load = ms_now();
    if (ms_model_executor_open(&ma.ex, &ex, &m, &err)) {
        fprintf(stderr, "moeserve bench-model: %s\n", err.msg);
        goto done;
    }
    t_load = ms_now() - t_load;
    ms_backend *be = ms_model_executor_backend(&ex);
    ms_forward *fw = ms_model_executor_forward(&ex);
    ceilings ce = {0};
    if (!gpu) {
        ce.mem_gbs = cpu_read_bw((size_t)mem_mb);
        ce.mem_what = "read bandwidth, all threads";
    } else {
        if (ms_backend_gpu_ceilings(be, &ce.mem_gbs, &ce.gemm_tflops, &err)) {
            fprintf(stderr, "moeserve bench-model: %s\n", err.msg);
            goto done;
        }
        ce.mem_what = "device-to-device copy (bytes read + written)";
    }
    weight_model w;
    model_weights(m, &w);
    decode_res res[MAX_LIST * MAX_LIST];
    int nres = 0;
    for (int ci = 0; ci < nc; ci++)
        for (int bi = 0; bi < nb; bi++) {
            if (!json) fprintf(stderr, "bench-model: decode batch %d ctx %d ...\n", batches[bi], ctxs[ci]);
            if (run_decode(&ex, fw, m, be, &w, &ce, batches[bi], ctxs[ci], &res[nres], &err)) {
                fprintf(stderr, "moeserve bench-model: decode batch %d ctx %d: %s\n", batches[bi], ctxs[ci], err.msg);
                goto done;
            }
            nres++;
        }
    /* prefill: one sequence of `prefill` tokens in one step (timed twice, best) */
    int32_t *pids = malloc(sizeof(int32_t) * (size_t)prefill);
    float *lg = malloc(sizeof(float) * (size_t)ex.vocab);
    if (!pids || !lg) {
        free(pids), free(lg);
        fprintf(stderr, "moeserve bench-model: out of memory\n");
        goto done;
    }
    for (int i = 0; i < prefill; i++) pids[i] = (int32_t)((i * 7919u + 13u) % (unsigned)ex.vocab);
    double best = 1e30;
    int prc = 0;
    for (int rep = 0; rep < 2 && !prc; rep++) {
        double t0 = ms_now();
        prc = fill_seq(&ex, 0, (int)((prefill + ps - 1) / ps), pids, (int)prefill, lg, &err);
        double dt = ms_now() - t0;
        best = dt < best ? dt : best;
    }
    if (!prc && g_profile && fw) {
        ms_forward_set_profile(fw, 1);
        prc = fill_seq(&ex, 0, (int)((prefill + ps - 1) / ps), pids, (int)prefill, lg, &err);
        const char *names[32];
        double secs[32];
        int n = ms_forward_profile(fw, names, secs, 32);
        fprintf(stderr, "profile prefill %lld (synchronised sections, ms):", prefill);
        for (int i = 0; i < n; i++) fprintf(stderr, " %s %.3f;", names[i], secs[i] * 1e3);
        fprintf(stderr, "\n");
        ms_forward_set_profile(fw, 0);
    }
    free(pids);
    free(lg);
    if (prc) {
        fprintf(stderr, "moeserve bench-model: prefill %lld: %s\n", prefill, err.msg);
        goto done;
    }
    double pf_tok_s = prefill / best, pf_flops = prefill_flops(m, &w, (int)prefill) / best;
    double total_bytes = (double)m->stats.bytes_total;
    int nth = gpu ? 0 : ms_pool_size(ms_cpu_pool());
    ms_graph_counts gc = {{0}, {0}};
    if (fw) ms_forward_graph_counts(fw, &gc);
    if (json) {
        printf("{\"device\":\"%s\",\"threads\":%d,\"model_type\":\"%s\",\"layers\":%d,\"weights\":\"%s\",\"weight_bytes\":%.0f,"
               "\"load_s\":%.3f,\"mem_bw_gbs\":%.3f,\"gemm_tflops\":%.3f,\"decode\":[",
               be->name, nth, m->cfg.model_type, m->cfg.num_layers, m->quant_desc, total_bytes, t_load, ce.mem_gbs,
               ce.gemm_tflops);
        for (int i = 0; i < nres; i++) {
            if (res[i].skipped[0]) {
                printf("%s{\"batch\":%d,\"ctx\":%d,\"skipped\":\"%s\"}", i ? "," : "", res[i].batch, res[i].ctx,
                       res[i].skipped);
                continue;
            }
            printf("%s{\"batch\":%d,\"ctx\":%d,\"steps\":%d,\"tok_s\":%.3f,\"ms_per_step\":%.4f,\"bytes_per_step\":%.0f,"
                   "\"achieved_gbs\":%.4f,\"pct_of_bw\":%.2f,\"flops_per_step\":%.0f,\"achieved_tflops\":%.4f,"
                   "\"pct_of_gemm\":%.2f,\"experts_per_layer\":%.2f,\"spec_verify_ms\":%.4f,\"spec_draft_ms\":%.4f}",
                   i ? "," : "", res[i].batch, res[i].ctx, res[i].steps, res[i].tok_s, res[i].ms_step, res[i].bytes_step,
                   res[i].gbs, res[i].pct, res[i].flops_step, res[i].tflops, res[i].pct_gemm, res[i].routed_avg,
                   res[i].verify_ms, res[i].draft_ms);
        }
        printf("],\"prefill\":{\"tokens\":%lld,\"tok_s\":%.3f,\"gflops\":%.3f,\"pct_of_gemm\":%.2f},", prefill, pf_tok_s,
               pf_flops / 1e9, ce.gemm_tflops > 0 ? 100.0 * pf_flops / (ce.gemm_tflops * 1e12) : 0.0);
        /* steps of the whole run that launched a recorded graph, by kind (decode / verify / draft) */
        printf("\"graph_launches\":{");
        for (int k = 0; k < MS_GRAPH_KINDS; k++)
            printf("%s\"%s\":%llu", k ? "," : "", ms_graph_kind_name(k), (unsigned long long)gc.launches[k]);
        printf("}}\n");
    } else {
        printf("device:     %s%s%d threads\n", be->name, gpu ? "" : ", ", nth);
        printf("model:      %s, %d layers, weights %s, %.1f MiB (loaded in %.2f s)\n", m->cfg.model_type, m->cfg.num_layers,
               m->quant_desc, total_bytes / 1048576.0, t_load);
        if (m->shard.tp_size > 1)
            printf("ranks:      tp %d, ep %d: bytes and FLOPs are one rank's share, ceilings one device's%s\n",
                   m->shard.tp_size, m->shard.ep_size, gpu ? "" : " (CPU ranks share the memory and cores)");
        printf("ceiling:    %.2f GB/s %s", ce.mem_gbs, ce.mem_what);
        if (ce.gemm_tflops > 0) printf(", %.1f TFLOP/s bf16 GEMM", ce.gemm_tflops);
        printf("\n");
        for (int i = 0; i < nres; i++) {
            if (res[i].skipped[0]) {
                printf("decode      batch %3d ctx %5d: skipped (%s)\n", res[i].batch, res[i].ctx, res[i].skipped);
                continue;
            }
            printf("decode      batch %3d ctx %5d: %9.2f tok/s  %8.3f ms/step  %8.2f MB/step  %7.2f GB/s (%5.1f%% of ceiling)  "
                   "%8.2f GFLOP/step %6.2f TFLOP/s, %.1f experts/layer\n",
                   res[i].batch, res[i].ctx, res[i].tok_s, res[i].ms_step, res[i].bytes_step / 1e6, res[i].gbs, res[i].pct,
                   res[i].flops_step / 1e9, res[i].tflops, res[i].routed_avg);
            if (res[i].verify_ms > 0) {
                /* a round: one verification and N draft steps (the MTP extend counts as the first); the
                 * projection takes accept length 3.5 (SGLang's GLM-5 figure), or N + 1 when that is less */
                const double round = res[i].verify_ms + g_spec * res[i].draft_ms;
                const double al = g_spec + 1 < 3.5 ? g_spec + 1 : 3.5;
                printf("speculative batch %3d ctx %5d: verify of %d tokens/seq %8.3f ms, MTP draft step %8.3f ms; round "
                       "(verify + %d drafts) %8.3f ms = %.2fx a decode step; projected %.2f tok/s at accept length %.1f "
                       "(%.2fx plain decode)\n",
                       res[i].batch, res[i].ctx, g_spec + 1, res[i].verify_ms, res[i].draft_ms, g_spec, round,
                       round / res[i].ms_step, res[i].batch * al / round * 1e3, al, al * res[i].ms_step / round);
            }
        }
        printf("prefill     %lld tokens: %.1f tok/s, %.2f GFLOP/s", prefill, pf_tok_s, pf_flops / 1e9);
        if (ce.gemm_tflops > 0) printf(" (%.1f%% of GEMM ceiling)", 100.0 * pf_flops / (ce.gemm_tflops * 1e12));
        printf("\n");
        printf("graphs:     steps run as recorded graphs: %llu decode, %llu verify, %llu draft\n",
               (unsigned long long)gc.launches[MS_GRAPH_DECODE], (unsigned long long)gc.launches[MS_GRAPH_VERIFY],
               (unsigned long long)gc.launches[MS_GRAPH_DRAFT]);
    }
    rc = 0;
done:
    ms_model_executor_close(&ex);
    ms_args_free(&a);
    return rc;
}
