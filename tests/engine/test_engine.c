/* test_engine.c - the engine thread end to end with the fake model (tests/sched/fake_exec.h):
 * outputs against the cache-free oracle under concurrency, seeded reproducibility regardless of
 * batching / chunking / preemption, stop ids, bounded queue, abort, forward failures, invalid
 * requests, stats, and an idle engine that does not spin. */
#include "engine/engine.h"
#include "sched/fake_exec.h"
#include "test.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

enum { VOCAB = 32, MAXR = 48, MAXLEN = 256 };
_Static_assert((int)VOCAB == (int)FAKE_GRAMMAR_VOCAB, "the grammar tests run over fake_grammar's vocabulary");

/* ---- executor wrapper with a gate (to hold the engine inside a forward) ---- */

typedef struct gated {
    fake_exec f;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open, in_forward, healthy;
    int delay_us; /* sleep per forward */
} gated;

/* Holds the caller while the gate is shut, then sleeps delay_us. */
static void gated_enter(gated *g) {
    pthread_mutex_lock(&g->mu);
    g->in_forward++;
    pthread_cond_broadcast(&g->cv);
    while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
    int delay = g->delay_us;
    pthread_mutex_unlock(&g->mu);
    if (delay) {
        struct timespec ts = {0, (long)delay * 1000};
        nanosleep(&ts, NULL);
    }
}

static int gated_forward(void *ctx, const ms_batch *b, float *logits, ms_err *err) {
    gated_enter(ctx);
    return fake_forward(&((gated *)ctx)->f, b, logits, err);
}

static int gated_forward_argmax(void *ctx, const ms_batch *b, int32_t *ids, ms_err *err) {
    gated_enter(ctx);
    return fake_forward_argmax(&((gated *)ctx)->f, b, ids, err);
}

static int gated_healthy(void *ctx) { return ((gated *)ctx)->healthy; }

static ms_executor gated_init(gated *g, int n_pages, int page_size, int max_batch_tokens) {
    memset(g, 0, sizeof *g);
    fake_init(&g->f, VOCAB, n_pages, page_size, max_batch_tokens);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->open = 1;
    g->healthy = 1;
    ms_executor e = fake_executor(&g->f);
    e.ctx = g;
    e.forward = gated_forward;
    e.healthy = gated_healthy;
    return e;
}

static void gated_set(gated *g, int open) {
    pthread_mutex_lock(&g->mu);
    g->open = open;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* Waits (30 s at most) until n forwards have started. */
static void gated_wait_forward(gated *g, int n) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 30;
    pthread_mutex_lock(&g->mu);
    int rc = 0;
    while (g->in_forward < n && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&g->cv, &g->mu, &dl);
    int ok = g->in_forward >= n;
    pthread_mutex_unlock(&g->mu);
    CHECK_MSG(ok, "timed out waiting for forward %d", n);
}

static void gated_free(gated *g) {
    fake_free(&g->f);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
}

/* ---- event collector ---- */

typedef struct coll coll;
typedef struct slot {
    coll *c;
    uint64_t id;
    int32_t toks[MAXLEN];
    float logprob[MAXLEN];
    int n_top[MAXLEN];
    int n, finish, n_final, bad_order, n_cached, n_generated_last;
    char err[256];
} slot;
struct coll {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_final;
    slot s[MAXR];
};

static void on_event(void *user, const ms_token_event *ev) {
    slot *s = user;
    coll *c = s->c;
    pthread_mutex_lock(&c->mu);
    if (s->n_final) s->bad_order = 1; /* an event after the final one */
    if (ev->token >= 0) {
        if (s->n < MAXLEN) {
            s->toks[s->n] = ev->token;
            s->logprob[s->n] = ev->logprob;
            s->n_top[s->n] = ev->n_top;
        }
        s->n++;
        if (ev->n_generated != s->n) s->bad_order = 1;
    }
    s->n_generated_last = ev->n_generated;
    s->n_cached = ev->n_cached;
    if (ev->finish != MS_FINISH_NONE) {
        s->finish = ev->finish;
        s->n_final++;
        if (ev->error) snprintf(s->err, sizeof s->err, "%s", ev->error);
        c->n_final++;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

static void coll_init(coll *c) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    for (int i = 0; i < MAXR; i++) c->s[i].c = c;
}

/* Waits until n requests have their final event; 0 on timeout (30 s). */
static int coll_wait(coll *c, int n) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 30;
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    while (c->n_final < n && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&c->cv, &c->mu, &dl);
    int ok = c->n_final >= n;
    pthread_mutex_unlock(&c->mu);
    CHECK_MSG(ok, "timed out waiting for %d final events (have %d)", n, c->n_final);
    return ok;
}

static void coll_free(coll *c) {
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

/* ---- workloads ---- */

static uint64_t rng_state = 31337;
static uint32_t rnd(uint32_t n) {
    rng_state = fake_mix(rng_state);
    return (uint32_t)(rng_state >> 20) % n;
}

static int32_t prompts[MAXR][MAXLEN];
static int n_prompts[MAXR];

static void make_prompts(int n, int max_len) {
    int32_t stem[MAXLEN];
    for (int j = 0; j < MAXLEN; j++) stem[j] = (int32_t)rnd(VOCAB);
    for (int i = 0; i < n; i++) {
        n_prompts[i] = 1 + (int)rnd((uint32_t)max_len);
        int shared = rnd(2) ? (int)rnd((uint32_t)n_prompts[i]) : 0;
        for (int j = 0; j < n_prompts[i]; j++) prompts[i][j] = j < shared ? stem[j] : (int32_t)rnd(VOCAB);
    }
}

static ms_engine_config small_cfg(int page_size) {
    ms_engine_config c;
    ms_engine_config_default(&c);
    c.page_size = page_size;
    c.max_running_requests = 8;
    c.max_waiting_requests = MAXR;
    c.context_length = 512;
    c.check_integrity = 1;
    return c;
}

static void check_clean(ms_engine *e) {
    ms_engine_stats st;
    /* stats are published after each step; the idle check runs once the engine goes idle */
    T_WAIT_UNTIL((ms_engine_get_stats(e, &st), st.running == 0 && st.waiting == 0 &&
                                                st.kv_pages_used == st.kv_pages_cached));
    CHECK_EQ_INT(st.running, 0);
    CHECK_EQ_INT(st.waiting, 0);
    CHECK_EQ_INT(st.kv_pages_used, st.kv_pages_cached);
    CHECK_EQ_INT(st.integrity_failures, 0);
}

/* ---- fixture: a gated executor, an engine on it and a collector ---- */

typedef struct fixture {
    gated g;
    ms_executor ex;
    ms_engine *e;
    coll c;
    ms_err err;
} fixture;

/* The executor half of fx_open (gated_init's arguments), for a test that adjusts fx->ex or fx->g
 * before fx_start creates the engine. */
static void fx_gate(fixture *fx, int n_pages, int page_size, int max_batch_tokens) {
    fx->ex = gated_init(&fx->g, n_pages, page_size, max_batch_tokens);
    fx->err = (ms_err){0};
}

/* Creates the engine with *cfg on fx's executor (expected to succeed) and an empty collector. */
static void fx_start(fixture *fx, const ms_engine_config *cfg) {
    CHECK_EQ_INT(ms_engine_create(cfg, &fx->ex, &fx->e, &fx->err), MS_OK);
    coll_init(&fx->c);
}

/* The usual set-up: fx_gate, then fx_start with *cfg. */
static void fx_open(fixture *fx, int n_pages, int page_size, int max_batch_tokens, const ms_engine_config *cfg) {
    fx_gate(fx, n_pages, page_size, max_batch_tokens);
    fx_start(fx, cfg);
}

/* Tear-down without the idle check: destroys the engine, frees the collector and the executor. */
static void fx_free(fixture *fx) {
    ms_engine_destroy(fx->e);
    coll_free(&fx->c);
    gated_free(&fx->g);
}

/* The usual tear-down: the engine is idle and clean (check_clean), then fx_free. */
static void fx_close(fixture *fx) {
    check_clean(fx->e);
    fx_free(fx);
}

/* Default sampling made greedy (temperature 0), max_tokens new tokens at most. */
static ms_sampling greedy(int max_tokens) {
    ms_sampling sp;
    ms_sampling_default(&sp);
    sp.temperature = 0;
    sp.max_tokens = max_tokens;
    return sp;
}

static void test_greedy_concurrent_matches_oracle(void) {
    ms_engine_config cfg = small_cfg(4);
    fixture fx;
    fx_open(&fx, 30, 4, 64, &cfg);
    enum { N = 24 };
    make_prompts(N, 60);
    int max_new[N];
    uint64_t total_gen = 0;
    /* hold the engine in its first forward until every request is queued, so the run always has
     * more concurrent work than the 30 pages hold (preemption must happen, whatever the timing) */
    gated_set(&fx.g, 0);
    for (int i = 0; i < N; i++) {
        max_new[i] = 1 + (int)rnd(40);
        ms_sampling sp = greedy(max_new[i]);
        total_gen += (uint64_t)max_new[i];
        CHECK_EQ_INT(ms_engine_submit(fx.e, prompts[i], n_prompts[i], &sp, on_event, &fx.c.s[i], &fx.c.s[i].id, &fx.err), MS_OK);
        if (i == 0) gated_wait_forward(&fx.g, 1);
    }
    gated_set(&fx.g, 1);
    if (coll_wait(&fx.c, N)) {
        for (int i = 0; i < N; i++) {
            int32_t ref[MAXLEN];
            fake_greedy_ref(prompts[i], n_prompts[i], max_new[i], VOCAB, 4.0f, ref);
            CHECK_EQ_INT(fx.c.s[i].n, max_new[i]);
            CHECK_EQ_INT(fx.c.s[i].finish, MS_FINISH_LENGTH);
            CHECK_EQ_INT(fx.c.s[i].n_final, 1);
            CHECK_EQ_INT(fx.c.s[i].bad_order, 0);
            CHECK_MSG(memcmp(ref, fx.c.s[i].toks, (size_t)max_new[i] * sizeof(int32_t)) == 0, "request %d differs from the oracle", i);
        }
    }
    check_clean(fx.e);
    ms_engine_stats st;
    ms_engine_get_stats(fx.e, &st);
    CHECK_EQ_INT(st.requests_finished, N);
    CHECK_EQ_INT(st.generated_tokens_total, total_gen);
    CHECK(st.preemptions > 0); /* 30 pages of 4 tokens for 8 running requests of up to 100 tokens */
    CHECK_EQ_INT(st.healthy, 1);
    /* the engine thread's time, as /metrics reports it: the parts of a step fall inside its busy time */
    CHECK(st.steps > 0 && st.forward_seconds > 0 && st.sample_seconds >= 0 && st.schedule_seconds >= 0);
    CHECK_MSG(st.forward_seconds + st.sample_seconds + st.schedule_seconds <= st.busy_seconds * (1 + 1e-9),
              "forward %.6f + sample %.6f + schedule %.6f s exceed the busy %.6f s", st.forward_seconds,
              st.sample_seconds, st.schedule_seconds, st.busy_seconds);
    CHECK_MSG(fx.g.f.errors == 0, "fake model: %s", fx.g.f.first_error);
    fx_free(&fx);
}

/* Steps whose rows are all plain greedy take the executor's forward_argmax (ids, no logits); a step
 * with any row that reads its logits (here: logprobs) takes the plain forward. Tokens equal the
 * oracle's either way, the logprob requests get their logprobs, and the counters say which ran. */
static void test_device_argmax(void) {
    for (int mixed = 0; mixed <= 1; mixed++) {
        fixture fx;
        fx_gate(&fx, 64, 4, 64);
        fx.ex.forward_argmax = gated_forward_argmax;
        ms_engine_config cfg = small_cfg(4);
        fx_start(&fx, &cfg);
        enum { N = 12 };
        make_prompts(N, 30);
        int max_new[N];
        gated_set(&fx.g, 0); /* every request queued before the first step: the logprob ones share steps */
        for (int i = 0; i < N; i++) {
            /* mixed: every third request asks for logprobs and stops early; the rest run on alone */
            int logprobs = mixed && i % 3 == 0;
            max_new[i] = logprobs ? 3 : 12 + (int)rnd(20);
            ms_sampling sp = greedy(max_new[i]);
            sp.logprobs = logprobs;
            CHECK_EQ_INT(ms_engine_submit(fx.e, prompts[i], n_prompts[i], &sp, on_event, &fx.c.s[i], &fx.c.s[i].id, &fx.err), MS_OK);
        }
        gated_set(&fx.g, 1);
        if (coll_wait(&fx.c, N)) {
            for (int i = 0; i < N; i++) {
                int32_t ref[MAXLEN];
                fake_greedy_ref(prompts[i], n_prompts[i], max_new[i], VOCAB, 4.0f, ref);
                CHECK_EQ_INT(fx.c.s[i].n, max_new[i]);
                CHECK_MSG(memcmp(ref, fx.c.s[i].toks, (size_t)max_new[i] * sizeof(int32_t)) == 0,
                          "%s: request %d differs from the oracle", mixed ? "mixed" : "greedy", i);
                for (int j = 0; j < max_new[i] && j < MAXLEN; j++)
                    CHECK_MSG(mixed && i % 3 == 0 ? fx.c.s[i].logprob[j] < 0 : fx.c.s[i].logprob[j] == 0,
                              "request %d token %d: logprob %g", i, j, fx.c.s[i].logprob[j]);
            }
        }
        check_clean(fx.e);
        ms_engine_stats st;
        ms_engine_get_stats(fx.e, &st);
        CHECK_EQ_INT(st.argmax_steps, (uint64_t)fx.g.f.argmax_calls);
        CHECK(fx.g.f.argmax_calls > 0);
        /* all greedy: no step returned rows; mixed: the steps with a logprob row did */
        CHECK_MSG(mixed ? fx.g.f.rows_calls > 0 : fx.g.f.rows_calls == 0, "%s: %d forwards returned rows", mixed ? "mixed" : "greedy",
                  fx.g.f.rows_calls);
        CHECK_MSG(fx.g.f.errors == 0, "fake model: %s", fx.g.f.first_error);
        fx_free(&fx);
    }
}

/* Runs request X (seeded, temperature sampling) alone or among others; returns its tokens. */
static int run_seeded(int crowd, int n_pages, int chunk, int32_t *out, uint64_t seed, uint64_t *preempts) {
    ms_engine_config cfg = small_cfg(2);
    cfg.chunked_prefill_size = chunk;
    cfg.max_prefill_tokens = chunk * 2;
    fixture fx;
    fx_open(&fx, n_pages, 2, 48, &cfg);
    int32_t px[40];
    for (int j = 0; j < 40; j++) px[j] = (int32_t)((j * 13 + 5) % VOCAB);
    ms_sampling sx;
    ms_sampling_default(&sx);
    sx.temperature = 0.9f;
    sx.top_p = 0.95f;
    sx.top_k = 20;
    sx.frequency_penalty = 0.3f;
    sx.has_seed = 1;
    sx.seed = seed;
    sx.max_tokens = 60;
    sx.logprobs = 1;
    make_prompts(crowd, 50);
    int n = 0;
    for (int i = 0; i <= crowd; i++) {
        if (i == crowd / 2) { /* X goes in the middle of the crowd */
            CHECK_EQ_INT(ms_engine_submit(fx.e, px, 40, &sx, on_event, &fx.c.s[MAXR - 1], NULL, &fx.err), MS_OK);
            n++;
        }
        if (i == crowd) break;
        ms_sampling sp;
        ms_sampling_default(&sp);
        sp.temperature = 1.0f;
        sp.has_seed = i % 2; /* half of them unseeded */
        sp.seed = (uint64_t)i;
        sp.max_tokens = 1 + (int)rnd(40);
        CHECK_EQ_INT(ms_engine_submit(fx.e, prompts[i], n_prompts[i], &sp, on_event, &fx.c.s[i], NULL, &fx.err), MS_OK);
        n++;
    }
    coll_wait(&fx.c, n);
    int nx = fx.c.s[MAXR - 1].n;
    memcpy(out, fx.c.s[MAXR - 1].toks, (size_t)nx * sizeof *out);
    check_clean(fx.e);
    ms_engine_stats st;
    ms_engine_get_stats(fx.e, &st);
    *preempts = st.preemptions;
    CHECK_MSG(fx.g.f.errors == 0, "fake model: %s", fx.g.f.first_error);
    fx_free(&fx);
    return nx;
}

static void test_seed_reproducible_regardless_of_batching(void) {
    int32_t a[MAXLEN], b[MAXLEN], d[MAXLEN], x[MAXLEN];
    uint64_t pa, pb, pd, px;
    int na = run_seeded(0, 512, 512, a, 1234, &pa);
    int nb = run_seeded(20, 512, 512, b, 1234, &pb);
    int nd = run_seeded(20, 60, 3, d, 1234, &pd); /* tiny pool + tiny chunks: preemption + chunking */
    int nx = run_seeded(0, 512, 512, x, 999, &px);
    CHECK_EQ_INT(na, 60);
    CHECK_EQ_INT(nb, na);
    CHECK_EQ_INT(nd, na);
    CHECK(memcmp(a, b, (size_t)na * sizeof *a) == 0);
    CHECK(memcmp(a, d, (size_t)na * sizeof *a) == 0);
    CHECK(pd > 0);
    CHECK(nx == na && memcmp(a, x, (size_t)na * sizeof *a) != 0); /* another seed, another sample */
}

static void test_stop_ids_and_ignore_eos(void) {
    int32_t p[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, ref[40];
    fake_greedy_ref(p, 10, 40, VOCAB, 4.0f, ref);
    int k = 2; /* first position >= 2 whose token did not appear before */
    for (;; k++) {
        int seen = 0;
        for (int j = 0; j < k; j++) seen |= ref[j] == ref[k];
        if (!seen) break;
    }
    /* 0: request stop id; 1: executor eos; 2: eos with ignore_eos (ignored); 3: request stop id
     * with ignore_eos (still stops, as in vLLM) */
    for (int mode = 0; mode < 4; mode++) {
        fixture fx;
        fx_gate(&fx, 64, 4, 64);
        if (mode == 1 || mode == 2) { fx.ex.n_eos = 1; fx.ex.eos_ids[0] = ref[k]; }
        ms_engine_config cfg = small_cfg(4);
        fx_start(&fx, &cfg);
        ms_sampling sp = greedy(40);
        if (mode == 0 || mode == 3) { sp.n_stop_ids = 2; sp.stop_ids[0] = VOCAB - 1 == ref[k] ? 0 : VOCAB - 1; sp.stop_ids[1] = ref[k]; }
        if (mode >= 2) sp.ignore_eos = 1;
        if (sp.n_stop_ids && sp.stop_ids[0] != ref[k]) {
            int used = 0;
            for (int j = 0; j <= k; j++) used |= ref[j] == sp.stop_ids[0];
            if (used) sp.n_stop_ids = 1, sp.stop_ids[0] = ref[k];
        }
        CHECK_EQ_INT(ms_engine_submit(fx.e, p, 10, &sp, on_event, &fx.c.s[0], NULL, &fx.err), MS_OK);
        coll_wait(&fx.c, 1);
        if (mode != 2) {
            CHECK_EQ_INT(fx.c.s[0].finish, MS_FINISH_STOP);
            CHECK_EQ_INT(fx.c.s[0].n, k + 1);
            CHECK_EQ_INT(fx.c.s[0].toks[k], ref[k]); /* the stop token is reported with the final event */
        } else {
            CHECK_EQ_INT(fx.c.s[0].finish, MS_FINISH_LENGTH);
            CHECK_EQ_INT(fx.c.s[0].n, 40);
        }
        CHECK(memcmp(fx.c.s[0].toks, ref, (size_t)(fx.c.s[0].n < 40 ? fx.c.s[0].n : 40) * sizeof(int32_t)) == 0);
        fx_free(&fx);
    }
}

/* Rows with a grammar sample only what it allows and end with GRAMMAR_END once it is complete;
 * rows without one in the same batches stay exactly the unconstrained greedy output. */
static void test_grammar_rows(void) {
    ms_grammar_vocab *v = NULL;
    ms_grammar *gr = NULL;
    ms_err err = {0};
    CHECK_EQ_INT(fake_grammar("\\[[0-9]{1,2}(,[0-9]{1,2}){0,3}\\]", &v, &gr, &err), MS_OK);
    ms_engine_config cfg = small_cfg(4);
    fixture fx;
    fx_open(&fx, 200, 4, 64, &cfg);
    enum { N = 12 };
    make_prompts(N, 20);
    for (int i = 0; i < N; i++) {
        ms_sampling sp;
        ms_sampling_default(&sp);
        sp.max_tokens = 40;
        sp.temperature = i % 3 == 0 ? 0.0f : 1.0f;
        sp.has_seed = 1;
        sp.seed = (uint64_t)i;
        if (i % 2 == 0) sp.grammar = ms_grammar_matcher_new(gr);
        CHECK_EQ_INT(ms_engine_submit(fx.e, prompts[i], n_prompts[i], &sp, on_event, &fx.c.s[i], NULL, &fx.err), MS_OK);
    }
    coll_wait(&fx.c, N);
    for (int i = 0; i < N; i++) {
        slot *s = &fx.c.s[i];
        if (i % 2 == 0) {
            CHECK_EQ_INT(s->finish, MS_FINISH_GRAMMAR_END);
            ms_grammar_matcher *m = ms_grammar_matcher_new(gr);
            int ok = 1;
            for (int k = 0; k < s->n && ok; k++) ok = ms_grammar_matcher_accept(m, s->toks[k]);
            CHECK_MSG(ok && ms_grammar_matcher_done(m), "request %d: output is not a sentence of the grammar", i);
            ms_grammar_matcher_free(m);
        } else if (i % 3 == 0) {
            int32_t ref[40];
            fake_greedy_ref(prompts[i], n_prompts[i], 40, VOCAB, 4.0f, ref);
            CHECK_EQ_INT(s->finish, MS_FINISH_LENGTH);
            CHECK(memcmp(s->toks, ref, sizeof ref) == 0);
        }
    }
    fx_close(&fx);
    ms_grammar_unref(gr);
    ms_grammar_vocab_free(v);
}

/* In a grammar's free prefix (a reasoning model's thinking) a stop token is never sampled: greedy
 * decoding whose first token is the stop id goes on past it instead of ending with no content. */
static void test_grammar_free_prefix_no_stop(void) {
    ms_grammar_vocab *v = NULL;
    ms_grammar *gr = NULL;
    ms_err err = {0};
    CHECK_EQ_INT(fake_grammar("[0-9]+", &v, &gr, &err), MS_OK);
    make_prompts(1, 20);
    int32_t ref[8];
    fake_greedy_ref(prompts[0], n_prompts[0], 8, VOCAB, 4.0f, ref);
    for (int with_grammar = 0; with_grammar < 2; with_grammar++) {
        ms_engine_config cfg = small_cfg(4);
        fixture fx;
        fx_open(&fx, 200, 4, 64, &cfg);
        ms_sampling sp = greedy(6);
        sp.n_stop_ids = 1;
        sp.stop_ids[0] = ref[0];
        if (with_grammar) {
            sp.grammar = ms_grammar_matcher_new(gr);
            ms_grammar_matcher_set_free_until(sp.grammar, ref[0] == 0 ? 1 : 0); /* a "</think>" other than the stop id */
        }
        CHECK_EQ_INT(ms_engine_submit(fx.e, prompts[0], n_prompts[0], &sp, on_event, &fx.c.s[0], NULL, &fx.err), MS_OK);
        coll_wait(&fx.c, 1);
        if (!with_grammar) {
            CHECK_EQ_INT(fx.c.s[0].finish, MS_FINISH_STOP); /* the control: greedy stops at once */
        } else {
            CHECK(fx.c.s[0].finish != MS_FINISH_STOP);
            for (int k = 0; k < fx.c.s[0].n; k++) CHECK(fx.c.s[0].toks[k] != ref[0]);
        }
        fx_close(&fx);
    }
    ms_grammar_unref(gr);
    ms_grammar_vocab_free(v);
}

static void test_bounded_queue_busy(void) {
    ms_engine_config cfg = small_cfg(4);
    cfg.max_running_requests = 1;
    cfg.max_waiting_requests = 2;
    fixture fx;
    fx_open(&fx, 64, 4, 64, &cfg);
    int32_t p[5] = {1, 2, 3, 4, 5};
    ms_sampling sp = greedy(3);
    gated_set(&fx.g, 0);
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 5, &sp, on_event, &fx.c.s[0], NULL, &fx.err), MS_OK);
    gated_wait_forward(&fx.g, 1); /* request 0 is running, the engine is held in its forward */
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 5, &sp, on_event, &fx.c.s[1], NULL, &fx.err), MS_OK);
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 5, &sp, on_event, &fx.c.s[2], NULL, &fx.err), MS_OK);
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 5, &sp, on_event, &fx.c.s[3], NULL, &fx.err), MS_ERR_BUSY);
    CHECK(strstr(fx.err.msg, "max_waiting_requests") != NULL);
    ms_engine_stats st;
    ms_engine_get_stats(fx.e, &st);
    CHECK_EQ_INT(st.waiting, 2);
    gated_set(&fx.g, 1);
    coll_wait(&fx.c, 3);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(fx.c.s[i].finish, MS_FINISH_LENGTH);
    CHECK_EQ_INT(fx.c.s[3].n_final, 0);
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 5, &sp, on_event, &fx.c.s[3], NULL, &fx.err), MS_OK);
    coll_wait(&fx.c, 4);
    fx_close(&fx);
}

/* max_queue_wait_s: with one request running in steps of >= 0.25 s and two waiting that no step
 * admits, the measured admission rate falls to <= 1 / 0.75 s, so the estimated wait of a third
 * (2 ahead) is >= 1.5 s > 1 s: refused as busy, naming the estimate; once nobody waits, accepted. */
static void test_queue_wait_busy(void) {
    CHECK(ms_engine_queue_wait(0, 5.0) == 0 && ms_engine_queue_wait(3, -1) == 0);
    CHECK(ms_engine_queue_wait(4, 2.0) == 2.0 && ms_engine_queue_wait(1, 0) >= 1e9);
    fixture fx;
    fx_gate(&fx, 64, 4, 64);
    fx.g.delay_us = 250000;
    ms_engine_config cfg = small_cfg(4);
    cfg.max_running_requests = 1;
    cfg.max_queue_wait_s = 1.0;
    fx_start(&fx, &cfg);
    int32_t p[5] = {1, 2, 3, 4, 5};
    ms_sampling sp = greedy(6);
    gated_set(&fx.g, 1);
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 5, &sp, on_event, &fx.c.s[0], NULL, &fx.err), MS_OK);
    gated_wait_forward(&fx.g, 1);
    sp.max_tokens = 1;
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 5, &sp, on_event, &fx.c.s[1], NULL, &fx.err), MS_OK);
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 5, &sp, on_event, &fx.c.s[2], NULL, &fx.err), MS_OK);
    gated_wait_forward(&fx.g, 4); /* steps 1..3 done and published, 2 and 3 admitted nobody */
    ms_engine_stats st;
    ms_engine_get_stats(fx.e, &st);
    CHECK_MSG(st.admit_rate >= 0 && st.admit_rate <= 1.0 / 0.75 + 1e-9, "admit rate %g", st.admit_rate);
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 5, &sp, on_event, &fx.c.s[3], NULL, &fx.err), MS_ERR_BUSY);
    CHECK_MSG(strstr(fx.err.msg, "estimated queue wait") != NULL, "%s", fx.err.msg);
    pthread_mutex_lock(&fx.g.mu);
    fx.g.delay_us = 0;
    pthread_mutex_unlock(&fx.g.mu);
    coll_wait(&fx.c, 3);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(fx.c.s[i].finish, MS_FINISH_LENGTH);
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 5, &sp, on_event, &fx.c.s[3], NULL, &fx.err), MS_OK);
    coll_wait(&fx.c, 4);
    fx_close(&fx);
}

static void test_abort(void) {
    ms_engine_config cfg = small_cfg(4);
    cfg.max_running_requests = 4;
    fixture fx;
    fx_open(&fx, 128, 4, 64, &cfg);
    enum { N = 8 };
    make_prompts(N, 30);
    ms_sampling sp = greedy(100);
    gated_set(&fx.g, 0);
    for (int i = 0; i < N; i++)
        CHECK_EQ_INT(ms_engine_submit(fx.e, prompts[i], n_prompts[i], &sp, on_event, &fx.c.s[i], &fx.c.s[i].id, &fx.err), MS_OK);
    gated_wait_forward(&fx.g, 1); /* four running (one held in its first forward), four waiting */
    for (int i = 0; i < N; i += 2) ms_engine_abort(fx.e, fx.c.s[i].id);
    ms_engine_abort(fx.e, fx.c.s[0].id);   /* twice: harmless */
    ms_engine_abort(fx.e, 987654321);      /* unknown id: harmless */
    gated_set(&fx.g, 1);
    coll_wait(&fx.c, N);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(fx.c.s[i].n_final, 1);
        CHECK_EQ_INT(fx.c.s[i].finish, i % 2 == 0 ? MS_FINISH_ABORT : MS_FINISH_LENGTH);
        if (i % 2 == 0) CHECK(fx.c.s[i].n <= 1);
        else {
            int32_t ref[100];
            fake_greedy_ref(prompts[i], n_prompts[i], 100, VOCAB, 4.0f, ref);
            CHECK(fx.c.s[i].n == 100 && memcmp(ref, fx.c.s[i].toks, sizeof ref) == 0);
        }
    }
    ms_engine_abort(fx.e, fx.c.s[1].id); /* finished: harmless, no event */
    check_clean(fx.e);
    ms_engine_stats st;
    ms_engine_get_stats(fx.e, &st);
    CHECK_EQ_INT(st.requests_aborted, N / 2);
    CHECK_EQ_INT(st.requests_finished, N / 2);
    CHECK_EQ_INT(fx.c.s[1].n_final, 1);
    fx_free(&fx);
}

static void test_forward_error(void) {
    for (int fatal = 0; fatal < 2; fatal++) {
        fixture fx;
        fx_gate(&fx, 128, 4, 64);
        fx.g.f.fail_at_call = 3;
        ms_engine_config cfg = small_cfg(4);
        fx_start(&fx, &cfg);
        int32_t p[6] = {3, 1, 4, 1, 5, 9};
        ms_sampling sp = greedy(20);
        fx.g.healthy = !fatal;
        gated_set(&fx.g, 0);
        for (int i = 0; i < 3; i++) CHECK_EQ_INT(ms_engine_submit(fx.e, p, 6, &sp, on_event, &fx.c.s[i], NULL, &fx.err), MS_OK);
        gated_wait_forward(&fx.g, 1);
        gated_set(&fx.g, 1);
        coll_wait(&fx.c, 3);
        for (int i = 0; i < 3; i++) {
            CHECK_EQ_INT(fx.c.s[i].finish, MS_FINISH_ERROR);
            CHECK(strstr(fx.c.s[i].err, "injected failure") != NULL);
            /* a NaN/Inf step (the fake fails with MS_ERR_NUMERICS) leaves its sequences' token ids for
             * `compare --ids` in a file the message names */
            const char *dump = strstr(fx.c.s[i].err, "step inputs in ");
            CHECK_MSG(dump != NULL, "%s", fx.c.s[i].err);
            if (i == 0 && dump) {
                FILE *fp = fopen(dump + strlen("step inputs in "), "r");
                char text[4096] = "";
                size_t n = fp ? fread(text, 1, sizeof text - 1, fp) : 0;
                text[n] = 0;
                if (fp) fclose(fp);
                CHECK_MSG(strstr(text, "ids 3,1,4,1,5,9") != NULL, "%s", text);
                remove(dump + strlen("step inputs in "));
            }
            /* tokens of the forwards before the failing third arrived: request 0 was in forwards 1
             * and 2; requests 1 and 2 in forward 2 and, if they were queued before the engine
             * started its first forward, in forward 1 too */
            if (i == 0) CHECK_EQ_INT(fx.c.s[i].n, 2);
            else CHECK_MSG(fx.c.s[i].n >= 1 && fx.c.s[i].n <= 2, "request %d got %d tokens", i, fx.c.s[i].n);
        }
        ms_engine_stats st;
        /* stats are published at the end of the step */
        T_WAIT_UNTIL((ms_engine_get_stats(fx.e, &st), st.requests_failed == 3));
        CHECK_EQ_INT(st.forward_errors, 1);
        CHECK_EQ_INT(st.requests_failed, 3);
        CHECK_EQ_INT(st.healthy, !fatal);
        int rc = ms_engine_submit(fx.e, p, 6, &sp, on_event, &fx.c.s[3], NULL, &fx.err);
        if (!fatal) {
            CHECK_EQ_INT(rc, MS_OK);
            coll_wait(&fx.c, 4);
            CHECK_EQ_INT(fx.c.s[3].finish, MS_FINISH_LENGTH);
            int32_t ref[20];
            fake_greedy_ref(p, 6, 20, VOCAB, 4.0f, ref);
            CHECK(memcmp(ref, fx.c.s[3].toks, sizeof ref) == 0);
            check_clean(fx.e);
        } else {
            CHECK_EQ_INT(rc, MS_ERR_RUNTIME);
            CHECK(strstr(fx.err.msg, "injected failure") != NULL);
        }
        fx_free(&fx);
    }
}

static void test_invalid_submits(void) {
    ms_engine_config cfg = small_cfg(4);
    cfg.context_length = 100;
    fixture fx;
    fx_open(&fx, 16, 4, 64, &cfg); /* 64 KV tokens */
    int32_t p[120] = {0};
    ms_sampling sp;
    ms_sampling_default(&sp);
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 0, &sp, on_event, &fx.c.s[0], NULL, &fx.err), MS_ERR_INVALID);
    CHECK(strstr(fx.err.msg, "empty") != NULL);
    sp.max_tokens = 10;
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 95, &sp, on_event, &fx.c.s[0], NULL, &fx.err), MS_ERR_INVALID);
    CHECK(strstr(fx.err.msg, "context length") != NULL);
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 60, &sp, on_event, &fx.c.s[0], NULL, &fx.err), MS_ERR_INVALID);
    CHECK(strstr(fx.err.msg, "KV cache") != NULL);
    p[3] = VOCAB;
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 5, &sp, on_event, &fx.c.s[0], NULL, &fx.err), MS_ERR_INVALID);
    CHECK(strstr(fx.err.msg, "vocabulary") != NULL);
    p[3] = 0;
    sp.temperature = -1;
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 5, &sp, on_event, &fx.c.s[0], NULL, &fx.err), MS_ERR_INVALID);
    CHECK(strstr(fx.err.msg, "temperature") != NULL);
    ms_sampling_default(&sp);
    sp.top_p = 0;
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 5, &sp, on_event, &fx.c.s[0], NULL, &fx.err), MS_ERR_INVALID);
    CHECK(strstr(fx.err.msg, "top_p") != NULL);
    ms_sampling_default(&sp);
    sp.top_logprobs = 21;
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 5, &sp, on_event, &fx.c.s[0], NULL, &fx.err), MS_ERR_INVALID);
    CHECK(strstr(fx.err.msg, "top_logprobs") != NULL);
    ms_sampling_default(&sp);
    sp.max_tokens = 0; /* until the context length, which the KV cache cannot hold */
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 5, &sp, on_event, &fx.c.s[0], NULL, &fx.err), MS_ERR_INVALID);
    ms_engine_config bad = cfg;
    bad.page_size = 8;
    ms_engine *e2 = NULL;
    CHECK_EQ_INT(ms_engine_create(&bad, &fx.ex, &e2, &fx.err), MS_ERR_INVALID);
    CHECK(strstr(fx.err.msg, "page_size") != NULL);
    CHECK_EQ_INT(fx.c.n_final, 0);
    fx_free(&fx);
}

static void test_prefix_cache_stats_and_logprobs(void) {
    ms_engine_config cfg = small_cfg(4);
    fixture fx;
    fx_open(&fx, 64, 4, 64, &cfg);
    int32_t p[30];
    for (int j = 0; j < 30; j++) p[j] = (int32_t)((j * 5) % VOCAB);
    ms_sampling sp = greedy(8);
    sp.logprobs = 1;
    sp.top_logprobs = 3;
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 30, &sp, on_event, &fx.c.s[0], NULL, &fx.err), MS_OK);
    coll_wait(&fx.c, 1);
    CHECK_EQ_INT(ms_engine_submit(fx.e, p, 30, &sp, on_event, &fx.c.s[1], NULL, &fx.err), MS_OK);
    coll_wait(&fx.c, 2);
    CHECK_EQ_INT(fx.c.s[0].n_cached, 0);
    CHECK_EQ_INT(fx.c.s[1].n_cached, 28);
    CHECK(memcmp(fx.c.s[0].toks, fx.c.s[1].toks, 8 * sizeof(int32_t)) == 0);
    /* logprob of each greedy token = raw log-softmax at it */
    int32_t seq[40];
    memcpy(seq, p, sizeof p);
    float lg[VOCAB];
    for (int k = 0; k < 8; k++) {
        fake_logits(seq, 30 + k, VOCAB, 4.0f, lg);
        double z = 0;
        for (int v = 0; v < VOCAB; v++) z += exp(lg[v]);
        seq[30 + k] = fx.c.s[1].toks[k];
        CHECK_CLOSE(fx.c.s[1].logprob[k], lg[fx.c.s[1].toks[k]] - log(z), 1e-4);
        CHECK_EQ_INT(fx.c.s[1].n_top[k], 3);
    }
    check_clean(fx.e);
    ms_engine_stats st;
    ms_engine_get_stats(fx.e, &st);
    CHECK_EQ_INT(st.prefix_hit_tokens, 28);
    CHECK_EQ_INT(st.prefix_query_tokens, 60);
    CHECK_EQ_INT(st.cached_tokens_total, 28);
    CHECK_EQ_INT(st.prompt_tokens_total, 60);
    CHECK(st.kv_pages_cached > 0);
    fx_free(&fx);
}

/* An idle engine runs nothing; destroy with pending requests aborts each exactly once. */
static void test_idle_and_destroy(void) {
    ms_engine_config cfg = small_cfg(4);
    fixture fx;
    fx_open(&fx, 64, 4, 64, &cfg);
    /* idle: no step and no forward without work (a count, not a CPU-time window: the CPU-time
     * view of idling belongs to benchmarks, a loaded machine makes it flaky) */
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    ms_engine_stats st;
    ms_engine_get_stats(fx.e, &st);
    CHECK_EQ_INT(st.steps, 0);
    CHECK_EQ_INT(fx.g.f.calls, 0);
    int32_t p[5] = {1, 2, 3, 4, 5};
    ms_sampling sp;
    ms_sampling_default(&sp);
    sp.max_tokens = 200; /* 205 of the 256 KV tokens */
    gated_set(&fx.g, 0);
    for (int i = 0; i < 12; i++) CHECK_EQ_INT(ms_engine_submit(fx.e, p, 5, &sp, on_event, &fx.c.s[i], NULL, &fx.err), MS_OK);
    gated_wait_forward(&fx.g, 1);
    /* from here on every forward takes 20 ms: finishing any request takes over 4 s, far longer
     * than destroy needs to stop after the forward in flight */
    pthread_mutex_lock(&fx.g.mu);
    fx.g.delay_us = 20000;
    pthread_mutex_unlock(&fx.g.mu);
    gated_set(&fx.g, 1);
    ms_engine_destroy(fx.e); /* the test itself: destroy with requests pending, then the events */
    CHECK_EQ_INT(fx.c.n_final, 12);
    for (int i = 0; i < 12; i++) {
        CHECK_EQ_INT(fx.c.s[i].n_final, 1);
        CHECK_EQ_INT(fx.c.s[i].finish, MS_FINISH_ABORT);
        CHECK_EQ_INT(fx.c.s[i].bad_order, 0);
    }
    coll_free(&fx.c);
    gated_free(&fx.g);
}

int main(void) {
    RUN(test_greedy_concurrent_matches_oracle);
    RUN(test_device_argmax);
    RUN(test_seed_reproducible_regardless_of_batching);
    RUN(test_stop_ids_and_ignore_eos);
    RUN(test_grammar_rows);
    RUN(test_grammar_free_prefix_no_stop);
    RUN(test_bounded_queue_busy);
    RUN(test_queue_wait_busy);
    RUN(test_abort);
    RUN(test_forward_error);
    RUN(test_invalid_submits);
    RUN(test_prefix_cache_stats_and_logprobs);
    RUN(test_idle_and_destroy);
    return TEST_SUMMARY();
}
