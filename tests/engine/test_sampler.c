/* test_sampler.c - the sampler against a brute-force implementation of the documented semantics
 * (dense over the vocabulary, full sort), plus empirical draw frequencies, logprobs and RNG. */
#include "backend/backend.h"
#include "engine/sampler.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static uint64_t rng_state = 777;
static double urand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * 0x1.0p-53;
}

/* Brute force: dense probabilities p[V] of the next token. */
static void ref_dist(const ms_sampling *sp, const float *logits, int V, const int32_t *tok, int n_prompt, int n_tok, double *p) {
    double l[4096];
    int order[4096];
    for (int i = 0; i < V; i++) l[i] = logits[i];
    if (sp->repetition_penalty != 1.0f) {
        for (int v = 0; v < V; v++) {
            int present = 0;
            for (int i = 0; i < n_tok; i++) present |= tok[i] == v;
            if (present) l[v] = l[v] > 0 ? l[v] / sp->repetition_penalty : l[v] * sp->repetition_penalty;
        }
    }
    for (int v = 0; v < V; v++) {
        int cnt = 0;
        for (int i = n_prompt; i < n_tok; i++) cnt += tok[i] == v;
        /* float arithmetic as the sampler does it, so ties stay ties */
        l[v] = (float)l[v] - (sp->frequency_penalty * (float)cnt + (cnt > 0 ? sp->presence_penalty : 0.0f));
        l[v] = (float)l[v];
    }
    for (int i = 0; i < V; i++) order[i] = i;
    for (int i = 1; i < V; i++) /* insertion sort: value desc, id asc */
        for (int j = i; j > 0 && (l[order[j]] > l[order[j - 1]] || (l[order[j]] == l[order[j - 1]] && order[j] < order[j - 1])); j--) {
            int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
        }
    for (int i = 0; i < V; i++) p[i] = 0;
    if (sp->temperature <= 0 || sp->top_k == 1) { p[order[0]] = 1; return; }
    int keep = sp->top_k > 0 && sp->top_k < V ? sp->top_k : V;
    double q[4096], z = 0;
    for (int i = 0; i < keep; i++) z += q[i] = exp((l[order[i]] - l[order[0]]) / sp->temperature);
    for (int i = 0; i < keep; i++) q[i] /= z;
    if (sp->top_p < 1) {
        double cum = 0;
        int k2 = keep;
        for (int i = 0; i < keep; i++) { if (cum >= sp->top_p) { k2 = i; break; } cum += q[i]; }
        keep = k2;
    }
    if (sp->min_p > 0) {
        int k2 = 0;
        while (k2 < keep && q[k2] >= sp->min_p * q[0]) k2++;
        keep = k2;
    }
    z = 0;
    for (int i = 0; i < keep; i++) z += q[i];
    for (int i = 0; i < keep; i++) p[order[i]] = q[i] / z;
}

static void dense(const int32_t *ids, const float *probs, int n, int V, double *out) {
    for (int i = 0; i < V; i++) out[i] = 0;
    for (int i = 0; i < n; i++) out[ids[i]] += probs[i];
}

static void random_params(ms_sampling *sp) {
    ms_sampling_default(sp);
    double u = urand();
    sp->temperature = u < 0.1 ? 0.0f : (float)(0.2 + 1.8 * urand());
    if (urand() < 0.5) sp->top_k = 1 + (int)(urand() * 12);
    if (urand() < 0.5) sp->top_p = (float)(0.05 + 0.9 * urand());
    if (urand() < 0.4) sp->min_p = (float)(0.5 * urand());
    if (urand() < 0.4) sp->presence_penalty = (float)(urand() * 4 - 2);
    if (urand() < 0.4) sp->frequency_penalty = (float)(urand() * 2 - 1);
    if (urand() < 0.4) sp->repetition_penalty = (float)(0.5 + urand() * 1.5);
}

static void test_dist_matches_brute_force(void) {
    ms_sampler s;
    ms_err err = {0};
    float logits[64];
    int32_t tok[40];
    double want[64], got[64];
    int bad = 0;
    for (int it = 0; it < 3000 && !bad; it++) {
        int V = 1 + (int)(urand() * 60);
        CHECK_EQ_INT(ms_sampler_init(&s, V, &err), MS_OK);
        int quant = urand() < 0.3; /* coarse logits make ties */
        for (int i = 0; i < V; i++) logits[i] = quant ? (float)((int)(urand() * 5) - 2) : (float)(urand() * 8 - 4);
        int n_prompt = 1 + (int)(urand() * 20), n_tok = n_prompt + (int)(urand() * 20);
        for (int i = 0; i < n_tok; i++) tok[i] = (int32_t)(urand() * V);
        ms_sampling sp;
        random_params(&sp);
        const int32_t *ids;
        const float *probs;
        int n = ms_sampler_dist(&s, &sp, logits, tok, n_prompt, n_tok, &ids, &probs);
        dense(ids, probs, n, V, got);
        ref_dist(&sp, logits, V, tok, n_prompt, n_tok, want);
        for (int i = 0; i < V; i++)
            if (fabs(got[i] - want[i]) > 2e-5) {
                CHECK_MSG(0, "it %d V %d T %g k %d p %g minp %g pres %g freq %g rep %g: token %d p %g vs %g", it, V,
                          (double)sp.temperature, sp.top_k, (double)sp.top_p, (double)sp.min_p, (double)sp.presence_penalty,
                          (double)sp.frequency_penalty, (double)sp.repetition_penalty, i, got[i], want[i]);
                bad = 1;
                break;
            }
        ms_sampler_destroy(&s);
    }
}

/* top_p alone over a large flat vocabulary: the sorted head has to grow several times. */
static void test_top_p_large_vocab(void) {
    enum { V = 4000 };
    ms_sampler s;
    ms_err err = {0};
    static float logits[V];
    static double want[V], got[V];
    CHECK_EQ_INT(ms_sampler_init(&s, V, &err), MS_OK);
    for (int i = 0; i < V; i++) logits[i] = (float)(urand() * 0.5);
    int32_t tok[1] = {0};
    ms_sampling sp;
    ms_sampling_default(&sp);
    sp.top_p = 0.95f;
    const int32_t *ids;
    const float *probs;
    int n = ms_sampler_dist(&s, &sp, logits, tok, 1, 1, &ids, &probs);
    CHECK(n > 3000 && n < V);
    dense(ids, probs, n, V, got);
    ref_dist(&sp, logits, V, tok, 1, 1, want);
    double maxd = 0;
    for (int i = 0; i < V; i++) maxd = fmax(maxd, fabs(got[i] - want[i]));
    CHECK_MSG(maxd < 1e-6, "max diff %g", maxd);
    ms_sampler_destroy(&s);
}

/* Hand-computed penalties: HF repetition over prompt + generated, OpenAI frequency/presence over generated. */
static void test_penalties_by_hand(void) {
    ms_sampler s;
    ms_err err = {0};
    CHECK_EQ_INT(ms_sampler_init(&s, 3, &err), MS_OK);
    float logits[3] = {2, -2, 1};
    int32_t tok[3] = {0, 1, 1}; /* prompt [0], generated [1, 1] */
    ms_sampling sp;
    ms_sampling_default(&sp);
    sp.repetition_penalty = 2;
    sp.frequency_penalty = 0.5f;
    sp.presence_penalty = 0.25f;
    const int32_t *ids;
    const float *probs;
    int n = ms_sampler_dist(&s, &sp, logits, tok, 1, 3, &ids, &probs);
    double got[3];
    dense(ids, probs, n, 3, got);
    /* processed logits: token0 2/2 = 1; token1 -2*2 - 2*0.5 - 0.25 = -5.25; token2 1 */
    double z = exp(1.0) * 2 + exp(-5.25);
    CHECK_CLOSE(got[0], exp(1.0) / z, 1e-6);
    CHECK_CLOSE(got[1], exp(-5.25) / z, 1e-6);
    CHECK_CLOSE(got[2], exp(1.0) / z, 1e-6);
    ms_sampler_destroy(&s);
}

/* logit_bias shifts the logits before temperature; min_tokens masks the stop ids until enough new
 * tokens exist, greedy or not. */
static void test_logit_bias_min_tokens(void) {
    ms_sampler s;
    ms_err err = {0};
    CHECK_EQ_INT(ms_sampler_init(&s, 3, &err), MS_OK);
    float logits[3] = {2, -2, 1};
    int32_t tok[4] = {0, 1, 1, 1};
    ms_sampling sp;
    ms_sampling_default(&sp);
    sp.n_logit_bias = 2;
    sp.bias_ids[0] = 1, sp.bias_vals[0] = 3.0f;   /* token1: -2 + 3 = 1 */
    sp.bias_ids[1] = 2, sp.bias_vals[1] = -1.0f;  /* token2: 1 - 1 = 0 */
    const int32_t *ids;
    const float *probs;
    double got[3];
    int n = ms_sampler_dist(&s, &sp, logits, tok, 1, 1, &ids, &probs);
    dense(ids, probs, n, 3, got);
    double z = exp(2.0) + exp(1.0) + exp(0.0);
    CHECK_CLOSE(got[0], exp(2.0) / z, 1e-6);
    CHECK_CLOSE(got[1], exp(1.0) / z, 1e-6);
    CHECK_CLOSE(got[2], exp(0.0) / z, 1e-6);
    ms_sampling_default(&sp);
    sp.temperature = 0;
    sp.n_stop_ids = 1;
    sp.stop_ids[0] = 0; /* the greedy choice is a stop id */
    sp.min_tokens = 3;
    uint64_t rng[4];
    ms_rng_seed(rng, 1);
    ms_token_event ev;
    CHECK_EQ_INT(ms_sampler_sample(&s, &sp, logits, tok, 1, 3, rng, &ev), 2); /* 2 new tokens < 3: masked */
    CHECK_EQ_INT(ms_sampler_sample(&s, &sp, logits, tok, 1, 4, rng, &ev), 0); /* 3 new tokens: allowed */
    sp.temperature = 1;
    for (int i = 0; i < 50; i++) CHECK(ms_sampler_sample(&s, &sp, logits, tok, 1, 1, rng, &ev) != 0);
    ms_sampler_destroy(&s);
}

static void test_greedy_equivalents(void) {
    enum { V = 50 };
    ms_sampler s;
    ms_err err = {0};
    CHECK_EQ_INT(ms_sampler_init(&s, V, &err), MS_OK);
    float logits[V];
    int32_t tok[1] = {0};
    for (int it = 0; it < 200; it++) {
        int best = 0;
        for (int i = 0; i < V; i++) { logits[i] = (float)(urand() * 6); if (logits[i] > logits[best]) best = i; }
        uint64_t rng[4];
        ms_rng_seed(rng, (uint64_t)it);
        ms_token_event ev;
        ms_sampling sp;
        ms_sampling_default(&sp);
        sp.temperature = 0;
        CHECK_EQ_INT(ms_sampler_sample(&s, &sp, logits, tok, 1, 1, rng, &ev), best);
        ms_sampling_default(&sp);
        sp.top_k = 1; /* top_k = 1 is greedy at any temperature */
        sp.temperature = 1.5f;
        CHECK_EQ_INT(ms_sampler_sample(&s, &sp, logits, tok, 1, 1, rng, &ev), best);
        ms_sampling_default(&sp);
        sp.top_p = 1e-6f; /* a tiny nucleus holds only the top token */
        CHECK_EQ_INT(ms_sampler_sample(&s, &sp, logits, tok, 1, 1, rng, &ev), best);
        ms_sampling_default(&sp);
        sp.min_p = 1.0f; /* only tokens as likely as the best */
        CHECK_EQ_INT(ms_sampler_sample(&s, &sp, logits, tok, 1, 1, rng, &ev), best);
    }
    ms_sampler_destroy(&s);
}

/* ms_sampler_plain_greedy names exactly the requests whose token is the bare argmax (what the engine
 * may take on the device instead of the logits), and on rows where that rule has edges (ties, NaN,
 * +inf against FLT_MAX, nothing above -inf) the sampler's choice is the backend argmax op's (CPU). */
static void test_plain_greedy(void) {
    ms_sampling sp;
    ms_sampling_default(&sp);
    CHECK(!ms_sampler_plain_greedy(&sp, 4, 4)); /* temperature 1 */
    sp.temperature = 0;
    CHECK(ms_sampler_plain_greedy(&sp, 4, 4));
    sp.temperature = 1.5f, sp.top_k = 1;
    CHECK(ms_sampler_plain_greedy(&sp, 4, 4));
    sp.logprobs = 1;
    CHECK(!ms_sampler_plain_greedy(&sp, 4, 4)); /* the logprob is read from the row */
    sp.logprobs = 0, sp.top_logprobs = 2;
    CHECK(!ms_sampler_plain_greedy(&sp, 4, 4));
    sp.top_logprobs = 0, sp.repetition_penalty = 1.2f;
    CHECK(!ms_sampler_plain_greedy(&sp, 4, 4));
    sp.repetition_penalty = 1.0f, sp.frequency_penalty = 0.5f;
    CHECK(!ms_sampler_plain_greedy(&sp, 4, 4));
    sp.frequency_penalty = 0, sp.presence_penalty = -0.5f;
    CHECK(!ms_sampler_plain_greedy(&sp, 4, 4));
    sp.presence_penalty = 0, sp.n_logit_bias = 1, sp.bias_ids[0] = 3, sp.bias_vals[0] = 2;
    CHECK(!ms_sampler_plain_greedy(&sp, 4, 4));
    sp.n_logit_bias = 0, sp.min_tokens = 3; /* the stop ids are masked before the third new token */
    CHECK(!ms_sampler_plain_greedy(&sp, 4, 6));
    CHECK(ms_sampler_plain_greedy(&sp, 4, 7));
    sp.min_tokens = 0;
    sp.grammar = (ms_grammar_matcher *)&sp; /* never read: only whether there is one */
    CHECK(!ms_sampler_plain_greedy(&sp, 4, 4));
    sp.grammar = NULL;
    CHECK(ms_sampler_plain_greedy(&sp, 4, 4));

    enum { V = 6, R = 7 };
    const float inf = INFINITY, nan = NAN, big = 3.4028234663852886e38f;
    float rows[R][V] = {
        {1, 5, 2, 5, 0, 5},                /* ties: the first */
        {nan, 1, nan, 3, 3, -2},           /* NaN never wins */
        {big, 0, inf, 1, 2, 3},            /* +inf counts as FLT_MAX: ties with it, the first wins */
        {0, 1, 2, 3, inf, inf},            /* +inf wins over finite values */
        {-inf, -inf, -inf, -inf, -inf, -inf}, /* nothing above -inf: 0 */
        {nan, -inf, nan, -inf, nan, -inf}, /* the same with NaN */
        {-inf, -3, nan, -1e30f, -3, -inf}, /* negative values only */
    };
    const int want[R] = {1, 3, 0, 4, 0, 0, 1};
    ms_backend *B = NULL;
    ms_err err = {0};
    ms_sampler sm;
    CHECK_EQ_INT(ms_backend_create("cpu", -1, &B, &err), MS_OK);
    CHECK_EQ_INT(ms_sampler_init(&sm, V, &err), MS_OK);
    ms_tensor t = ms_tensor_2d(MS_F32, R, V);
    t.data = rows;
    int32_t am[R];
    CHECK_EQ_INT(B->ops->argmax(B, &t, am, &err), MS_OK);
    int32_t tok[1] = {0};
    for (int r = 0; r < R; r++) {
        uint64_t rng[4];
        ms_rng_seed(rng, 1);
        ms_token_event ev;
        CHECK_MSG(ms_sampler_sample(&sm, &sp, rows[r], tok, 1, 1, rng, &ev) == want[r], "row %d: sampler", r);
        CHECK_MSG(am[r] == want[r], "row %d: argmax op gave %d, want %d", r, am[r], want[r]);
    }
    ms_sampler_destroy(&sm);
    ms_backend_destroy(B);
}

/* Draw frequencies follow the distribution (fixed seed: deterministic, tolerance ~5 sigma). */
static void test_empirical_frequencies(void) {
    enum { V = 6, N = 40000 };
    ms_sampler s;
    ms_err err = {0};
    CHECK_EQ_INT(ms_sampler_init(&s, V, &err), MS_OK);
    float logits[V] = {1.0f, 0.5f, 0.2f, -0.3f, 2.0f, -1.0f};
    int32_t tok[2] = {0, 4};
    ms_sampling sp;
    ms_sampling_default(&sp);
    sp.temperature = 0.8f;
    sp.top_p = 0.97f;
    sp.presence_penalty = 0.5f;
    double want[V];
    ref_dist(&sp, logits, V, tok, 1, 2, want);
    int counts[V] = {0};
    uint64_t rng[4];
    ms_rng_seed(rng, 42);
    ms_token_event ev;
    for (int i = 0; i < N; i++) counts[ms_sampler_sample(&s, &sp, logits, tok, 1, 2, rng, &ev)]++;
    for (int v = 0; v < V; v++) {
        double f = (double)counts[v] / N, sd = sqrt(want[v] * (1 - want[v]) / N);
        CHECK_MSG(fabs(f - want[v]) <= 5 * sd + 1e-9, "token %d: frequency %g, probability %g", v, f, want[v]);
    }
    CHECK_EQ_INT(counts[5], 0); /* cut by top_p */
    ms_sampler_destroy(&s);
}

static void test_logprobs(void) {
    enum { V = 30 };
    ms_sampler s;
    ms_err err = {0};
    CHECK_EQ_INT(ms_sampler_init(&s, V, &err), MS_OK);
    float logits[V];
    for (int i = 0; i < V; i++) logits[i] = (float)((i * 7) % 11) * 0.5f; /* ties */
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(logits[i]);
    int32_t tok[1] = {3};
    ms_sampling sp;
    ms_sampling_default(&sp);
    sp.logprobs = 1;
    sp.top_logprobs = 5;
    sp.repetition_penalty = 3; /* penalties do not change the reported (raw) logprobs */
    uint64_t rng[4];
    ms_rng_seed(rng, 1);
    ms_token_event ev;
    int32_t t = ms_sampler_sample(&s, &sp, logits, tok, 1, 1, rng, &ev);
    CHECK_CLOSE(ev.logprob, logits[t] - log(z), 1e-5);
    CHECK_EQ_INT(ev.n_top, 5);
    /* largest raw logit is 5.0 (i*7 % 11 == 10: i = 3, 14, 25), then 4.5 (i = 6, 17, 28) */
    int want_ids[5] = {3, 14, 25, 6, 17};
    for (int i = 0; i < 5; i++) {
        CHECK_EQ_INT(ev.top_ids[i], want_ids[i]);
        CHECK_CLOSE(ev.top_logprobs[i], logits[want_ids[i]] - log(z), 1e-5);
    }
    sp.logprobs = 0;
    sp.top_logprobs = 0;
    ms_sampler_sample(&s, &sp, logits, tok, 1, 1, rng, &ev);
    CHECK_EQ_INT(ev.n_top, 0);
    ms_sampler_destroy(&s);
}

static void test_rng_streams(void) {
    uint64_t a[4], b[4], c[4];
    ms_rng_seed(a, 123);
    ms_rng_seed(b, 123);
    ms_rng_seed(c, 124);
    int same_ab = 1, same_ac = 1;
    double sum = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t x = ms_rng_next(a), y = ms_rng_next(b), z = ms_rng_next(c);
        same_ab &= x == y;
        same_ac &= x == z;
        double u = ms_rng_uniform(a);
        ms_rng_next(b);
        CHECK(u >= 0 && u < 1);
        sum += u;
    }
    CHECK(same_ab);
    CHECK(!same_ac);
    CHECK(fabs(sum / 1000 - 0.5) < 0.05);
}

int main(void) {
    RUN(test_dist_matches_brute_force);
    RUN(test_top_p_large_vocab);
    RUN(test_penalties_by_hand);
    RUN(test_logit_bias_min_tokens);
    RUN(test_greedy_equivalents);
    RUN(test_plain_greedy);
    RUN(test_empirical_frequencies);
    RUN(test_logprobs);
    RUN(test_rng_streams);
    return TEST_SUMMARY();
}
