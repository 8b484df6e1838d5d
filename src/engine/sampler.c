/* sampler.c - penalties, temperature, top-k / top-p / min-p and the draw (see sampler.h).
 *
 * Nothing sorts the whole vocabulary in the usual cases: top_k selects k in O(vocab) before
 * sorting them; top_p alone histograms the mass by (max - logit) / T into fine buckets, takes
 * every bucket above the one where the cumulative mass reaches top_p, and sorts only that one. */
#include "engine/sampler.h"

#include "core/tensor.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int ms_sampler_init(ms_sampler *s, int vocab, ms_err *err) {
    memset(s, 0, sizeof *s);
    if (vocab < 1) return ms_errf(err, MS_ERR_INVALID, "sampler: vocab %d must be >= 1", vocab);
    s->vocab = vocab;
    s->work = malloc((size_t)vocab * sizeof *s->work);
    s->cand = malloc((size_t)vocab * sizeof *s->cand);
    s->prob = malloc((size_t)vocab * sizeof *s->prob);
    s->count = calloc((size_t)vocab, sizeof *s->count);
    s->touched = malloc((size_t)vocab * sizeof *s->touched);
    s->ex = malloc((size_t)vocab * sizeof *s->ex);
    s->bucket_mass = malloc(MS_SAMPLER_BUCKETS * sizeof *s->bucket_mass);
    if (!s->work || !s->cand || !s->prob || !s->count || !s->touched || !s->ex || !s->bucket_mass) {
        ms_sampler_destroy(s);
        return ms_errf(err, MS_ERR_NOMEM, "sampler: out of memory for vocab %d", vocab);
    }
    return MS_OK;
}

void ms_sampler_destroy(ms_sampler *s) {
    free(s->work); free(s->cand); free(s->prob); free(s->count); free(s->touched);
    free(s->ex); free(s->bucket_mass); free(s->gmask);
    memset(s, 0, sizeof *s);
}

/* ---- RNG: splitmix64 seeding, xoshiro256** stream ---- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void ms_rng_seed(uint64_t st[4], uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) st[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t ms_rng_next(uint64_t st[4]) {
    uint64_t r = rotl(st[1] * 5, 7) * 9, t = st[1] << 17;
    st[2] ^= st[0]; st[3] ^= st[1]; st[1] ^= st[2]; st[0] ^= st[3];
    st[2] ^= t;
    st[3] = rotl(st[3], 45);
    return r;
}

double ms_rng_uniform(uint64_t st[4]) { return (double)(ms_rng_next(st) >> 11) * 0x1.0p-53; }

/* ---- ordering helpers: (value desc, id asc) is a strict total order ---- */

static inline int better(const float *x, int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); }

static int cmp_desc(const void *pa, const void *pb, void *ctx) {
    const float *x = ctx;
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return better(x, a, b) ? -1 : better(x, b, a) ? 1 : 0;
}

static void swap_i(int32_t *a, int32_t *b) { int32_t t = *a; *a = *b; *b = t; }

/* Rearranges idx[0..n) so that idx[0..k) are the k best by x, sorted best first. O(n + k log k). */
static void select_top(const float *x, int32_t *idx, int n, int k) {
    if (k <= 0) return;
    if (k < n) {
        int lo = 0, hi = n - 1, target = k - 1;
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            if (better(x, idx[mid], idx[lo])) swap_i(&idx[mid], &idx[lo]);
            if (better(x, idx[hi], idx[lo])) swap_i(&idx[hi], &idx[lo]);
            if (better(x, idx[mid], idx[hi])) swap_i(&idx[mid], &idx[hi]); /* median now at hi */
            int32_t piv = idx[hi];
            int store = lo;
            for (int i = lo; i < hi; i++)
                if (better(x, idx[i], piv)) swap_i(&idx[i], &idx[store++]);
            swap_i(&idx[store], &idx[hi]);
            if (store == target) break;
            if (store < target) lo = store + 1;
            else hi = store - 1;
        }
    }
    qsort_r(idx, (size_t)k, sizeof *idx, cmp_desc, (void *)x);
}

/* ---- penalties ---- */

static void apply_penalties(ms_sampler *s, const ms_sampling *sp, const int32_t *tokens, int n_prompt, int n_tokens) {
    int V = s->vocab, nt = 0;
    if (sp->repetition_penalty > 0 && sp->repetition_penalty != 1.0f) {
        float p = sp->repetition_penalty;
        for (int i = 0; i < n_tokens; i++) {
            int32_t t = tokens[i];
            if (t < 0 || t >= V || s->count[t]++) continue;
            s->touched[nt++] = t;
            s->work[t] = s->work[t] > 0 ? s->work[t] / p : s->work[t] * p;
        }
        for (int i = 0; i < nt; i++) s->count[s->touched[i]] = 0;
        nt = 0;
    }
    if (sp->frequency_penalty != 0.0f || sp->presence_penalty != 0.0f) {
        for (int i = n_prompt; i < n_tokens; i++) {
            int32_t t = tokens[i];
            if (t < 0 || t >= V) continue;
            if (s->count[t]++ == 0) s->touched[nt++] = t;
        }
        for (int i = 0; i < nt; i++) {
            int32_t t = s->touched[i];
            s->work[t] -= sp->frequency_penalty * (float)s->count[t] + sp->presence_penalty;
            s->count[t] = 0;
        }
    }
}

/* logit_bias, then min_tokens' masking of the stop ids (sampler.h step 2b). */
static void apply_bias(ms_sampler *s, const ms_sampling *sp, int n_prompt, int n_tokens) {
    int V = s->vocab;
    for (int i = 0; i < sp->n_logit_bias && i < MS_MAX_LOGIT_BIAS; i++)
        if (sp->bias_ids[i] >= 0 && sp->bias_ids[i] < V && s->work[sp->bias_ids[i]] > -INFINITY)
            s->work[sp->bias_ids[i]] += sp->bias_vals[i];
    if (n_tokens - n_prompt < sp->min_tokens)
        for (int i = 0; i < sp->n_stop_ids && i < MS_MAX_STOP_IDS; i++)
            if (sp->stop_ids[i] >= 0 && sp->stop_ids[i] < V) s->work[sp->stop_ids[i]] = -INFINITY;
}

static int is_greedy(const ms_sampling *sp) { return sp->temperature <= 0.0f || sp->top_k == 1; }

/* Bucket of a token for the top_p histogram: monotone in (max - logit) / T, about 100 per nat. */
static inline int top_p_bucket(float d) {
    float b = d * (MS_SAMPLER_BUCKETS / 40.0f);
    return b < (float)(MS_SAMPLER_BUCKETS - 1) ? (int)b : MS_SAMPLER_BUCKETS - 1;
}

/* 1 when a penalty, logit_bias or the min_tokens mask changes the logits at n_tokens (steps 1-2b) */
static int any_penalty(const ms_sampling *sp, int n_prompt, int n_tokens) {
    return (sp->repetition_penalty > 0 && sp->repetition_penalty != 1.0f) || sp->frequency_penalty != 0.0f ||
           sp->presence_penalty != 0.0f || sp->n_logit_bias > 0 || n_tokens - n_prompt < sp->min_tokens;
}

int ms_sampler_plain_greedy(const ms_sampling *sp, int n_prompt, int n_tokens) {
    return is_greedy(sp) && !any_penalty(sp, n_prompt, n_tokens) && !sp->logprobs && sp->top_logprobs <= 0 &&
           !sp->grammar;
}

int ms_sampler_dist(ms_sampler *s, const ms_sampling *sp, const float *logits, const int32_t *tokens, int n_prompt,
                    int n_tokens, const int32_t **ids, const float **probs) {
    int V = s->vocab;
    float *w = s->work, *ex = s->ex;
    *ids = s->cand;
    *probs = s->prob;
    const int pen = any_penalty(sp, n_prompt, n_tokens);
    if (is_greedy(sp) && !pen) {
        const int best = (int)ms_greedy_argmax(logits, V);
        s->cand[0] = best;
        s->prob[0] = 1.0f;
        return 1;
    }
    for (int i = 0; i < V; i++) {
        const float v = logits[i];
        w[i] = v != v ? -INFINITY : v > FLT_MAX ? FLT_MAX : v;
    }
    apply_penalties(s, sp, tokens, n_prompt, n_tokens);
    apply_bias(s, sp, n_prompt, n_tokens);
    int best = 0;
    for (int i = 1; i < V; i++) if (w[i] > w[best]) best = i;
    if (is_greedy(sp) || w[best] == -INFINITY) {
        s->cand[0] = best;
        s->prob[0] = 1.0f;
        return 1;
    }
    float inv_t = 1.0f / sp->temperature, wmax = w[best];
    int k = sp->top_k > 0 && sp->top_k < V ? sp->top_k : V;
    int use_p = sp->top_p > 0.0f && sp->top_p < 1.0f;
    int n, sorted = 0;
    double z = 0; /* normalizer of the distribution top_p sees */
    if (k < V) {
        for (int i = 0; i < V; i++) s->cand[i] = i;
        select_top(w, s->cand, V, k);
        n = k;
        sorted = 1;
        for (int i = 0; i < n; i++) z += s->prob[i] = expf((w[s->cand[i]] - wmax) * inv_t);
        for (int i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / z);
        if (use_p) { /* shortest head whose mass reaches top_p */
            double cum = 0;
            int keep = n;
            for (int i = 0; i < n; i++) {
                if (cum >= sp->top_p) { keep = i; break; }
                cum += s->prob[i];
            }
            n = keep;
        }
    } else {
        for (int i = 0; i < V; i++) z += ex[i] = expf((w[i] - wmax) * inv_t);
        if (use_p) {
            double *mass = s->bucket_mass, target = sp->top_p * z, cum = 0;
            memset(mass, 0, MS_SAMPLER_BUCKETS * sizeof *mass);
            for (int i = 0; i < V; i++) mass[top_p_bucket((wmax - w[i]) * inv_t)] += ex[i];
            int edge = MS_SAMPLER_BUCKETS - 1;
            for (int b = 0; b < MS_SAMPLER_BUCKETS; b++) {
                if (cum + mass[b] >= target) { edge = b; break; }
                cum += mass[b];
            }
            /* buckets above the edge are in whole; the edge bucket goes last, sorted */
            n = 0;
            int n_edge = 0;
            for (int i = 0; i < V; i++) {
                int b = top_p_bucket((wmax - w[i]) * inv_t);
                if (b < edge) s->cand[n++] = i;
                else if (b == edge) s->touched[n_edge++] = i; /* touched is free scratch here */
            }
            qsort_r(s->touched, (size_t)n_edge, sizeof *s->touched, cmp_desc, w);
            for (int j = 0; j < n_edge && cum < target; j++) {
                s->cand[n++] = s->touched[j];
                cum += ex[s->touched[j]];
            }
        } else {
            n = V;
            for (int i = 0; i < V; i++) s->cand[i] = i;
        }
        for (int i = 0; i < n; i++) s->prob[i] = (float)(ex[s->cand[i]] / z);
    }
    if (sp->min_p > 0.0f) {
        float pmax = 0;
        for (int i = 0; i < n; i++) if (s->prob[i] > pmax) pmax = s->prob[i];
        float thr = sp->min_p * pmax;
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (s->prob[i] >= thr) {
                s->cand[m] = s->cand[i];
                s->prob[m++] = s->prob[i];
            } else if (sorted) {
                break;
            }
        }
        n = m;
    }
    double sum = 0;
    for (int i = 0; i < n; i++) sum += s->prob[i];
    for (int i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    return n;
}

int32_t ms_sampler_sample(ms_sampler *s, const ms_sampling *sp, const float *logits, const int32_t *tokens, int n_prompt,
                          int n_tokens, uint64_t rng[4], ms_token_event *ev) {
    const int32_t *ids;
    const float *probs;
    int n = ms_sampler_dist(s, sp, logits, tokens, n_prompt, n_tokens, &ids, &probs);
    int32_t tok = ids[n - 1];
    if (!is_greedy(sp)) {
        double u = ms_rng_uniform(rng), cum = 0;
        for (int i = 0; i < n; i++) {
            cum += probs[i];
            if (u < cum) { tok = ids[i]; break; }
        }
    } else {
        tok = ids[0];
    }
    ev->token = tok;
    ev->n_top = 0;
    if (sp->logprobs || sp->top_logprobs > 0) {
        int V = s->vocab;
        float m = logits[0];
        for (int i = 1; i < V; i++) if (logits[i] > m) m = logits[i];
        double sum = 0;
        for (int i = 0; i < V; i++) sum += expf(logits[i] - m);
        double lse = m + log(sum);
        ev->logprob = (float)(logits[tok] - lse);
        int nt = sp->top_logprobs;
        if (nt > MS_MAX_TOP_LOGPROBS) nt = MS_MAX_TOP_LOGPROBS;
        if (nt > V) nt = V;
        if (nt > 0) {
            for (int i = 0; i < V; i++) s->cand[i] = i;
            select_top(logits, s->cand, V, nt);
            while (nt > 0 && logits[s->cand[nt - 1]] == -INFINITY) nt--; /* masked out by a grammar */
            for (int i = 0; i < nt; i++) {
                ev->top_ids[i] = s->cand[i];
                ev->top_logprobs[i] = (float)(logits[s->cand[i]] - lse);
            }
            ev->n_top = nt;
        }
    }
    return tok;
}

int ms_sampler_apply_grammar(ms_sampler *s, ms_grammar_matcher *m, const int32_t *stop_ids, int n_stop, float *logits) {
    int gv = ms_grammar_matcher_vocab_size(m), words = (gv + 31) / 32;
    if (words > s->gmask_words) {
        uint32_t *nm = realloc(s->gmask, (size_t)words * sizeof *nm);
        if (!nm) return 0; /* treated as "cannot continue": the request ends with a clear reason */
        s->gmask = nm;
        s->gmask_words = words;
    }
    uint32_t *mask = s->gmask;
    int n = ms_grammar_matcher_fill_mask(m, mask);
    int V = s->vocab;
    if (ms_grammar_matcher_can_end(m))
        for (int i = 0; i < n_stop; i++) {
            int32_t t = stop_ids[i];
            if (t >= 0 && t < gv && !((mask[t >> 5] >> (t & 31)) & 1u)) { mask[t >> 5] |= 1u << (t & 31); n++; }
            else if (t >= gv && t < V) n++; /* beyond the tokenizer's ids: kept below */
        }
    int full = V < gv ? V : gv;
    for (int w = 0; w * 32 < full; w++) {
        uint32_t bits = mask[w];
        if (bits == 0xffffffffu) continue;
        int hi = (w + 1) * 32 < full ? 32 : full - w * 32;
        for (int b = 0; b < hi; b++)
            if (!((bits >> b) & 1u)) logits[w * 32 + b] = -INFINITY;
    }
    for (int i = full; i < V; i++) {
        int keep = 0;
        if (ms_grammar_matcher_can_end(m))
            for (int k = 0; k < n_stop; k++) keep |= stop_ids[k] == i;
        if (!keep) logits[i] = -INFINITY;
    }
    return n;
}
