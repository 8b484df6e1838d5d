/* test_spec.c - speculative decoding in the engine, with the fake model (tests/sched/fake_exec.h,
 * whose logits come only from the context it reads back through the KV slots) and draft hooks
 * instead of an MTP layer: "oracle" proposes the model's own greedy continuation (every draft
 * accepted: the multi-token commit), "wrong" proposes tokens the model never picks (every draft
 * rejected: the KV rollback), "mixed" proposes a pseudo-random mix (rows of one step accept
 * different lengths). Checked: greedy outputs equal the cache-free oracle under continuous batching,
 * chunked prefill, the prefix cache and preemption; stop ids landing inside an accepted run and
 * max_tokens; one event per token in order (streaming); seeded sampling and logprobs identical with
 * and without speculation; the accept counters; pages freed by rollbacks and none leaked (the
 * scheduler's integrity check when idle). */
#include "engine/engine.h"
#include "sched/fake_exec.h"
#include "test.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

enum { VOCAB = 32, MAXR = 32, MAXLEN = 256 };
_Static_assert((int)VOCAB == (int)FAKE_GRAMMAR_VOCAB, "the grammar tests run over fake_grammar's vocabulary");

/* ---- draft hooks ---- */

enum { D_ORACLE, D_WRONG, D_MIXED, D_REPLAY };
typedef struct hook {
    int kind;
    int calls;
} hook;

/* D_REPLAY: the outputs of an earlier run without speculation, proposed again (every draft right) */
static int32_t replay_out[32][MAXLEN];
static int replay_n[32];
static int32_t (*replay_prompts)[MAXLEN];
static int *replay_np, replay_count;

static int replay_hook(const int32_t *tokens, int n_tokens, int32_t *out, int max) {
    for (int i = 0; i < replay_count; i++) {
        int np = replay_np[i];
        if (np > n_tokens || memcmp(tokens, replay_prompts[i], sizeof(int32_t) * (size_t)np)) continue;
        int k = n_tokens - np, n = 0;
        if (k > replay_n[i] || memcmp(tokens + np, replay_out[i], sizeof(int32_t) * (size_t)k)) continue;
        while (n < max && k + n < replay_n[i]) out[n] = replay_out[i][k + n], n++;
        return n;
    }
    return 0;
}

static int draft_hook(void *user, const int32_t *tokens, int n_tokens, int n_prompt, int32_t *out, int max) {
    hook *h = user;
    (void)n_prompt;
    h->calls++;
    if (h->kind == D_REPLAY) return replay_hook(tokens, n_tokens, out, max);
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(n_tokens + max));
    float lg[VOCAB];
    memcpy(seq, tokens, sizeof(int32_t) * (size_t)n_tokens);
    uint64_t x = XXH64(tokens, sizeof(int32_t) * (size_t)n_tokens, 99);
    for (int j = 0; j < max; j++) {
        fake_logits(seq, n_tokens + j, VOCAB, 4.0f, lg);
        int g = fake_argmax(lg, VOCAB);
        int ok = h->kind == D_ORACLE || (h->kind == D_MIXED && ((x = fake_mix(x)) % 10) < 7);
        out[j] = seq[n_tokens + j] = ok ? g : (g + 1) % VOCAB;
    }
    free(seq);
    return max;
}

/* ---- event collector ---- */

typedef struct slot {
    uint64_t id;
    int32_t toks[MAXLEN];
    float logprob[MAXLEN];
    int n, finish, n_final, bad_order;
} slot;
typedef struct coll {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_final;
    slot s[MAXR];
} coll;
static coll C;

static void on_event(void *user, const ms_token_event *ev) {
    slot *s = user;
    pthread_mutex_lock(&C.mu);
    if (s->n_final) s->bad_order = 1;
    if (ev->token >= 0) {
        if (s->n < MAXLEN) s->toks[s->n] = ev->token, s->logprob[s->n] = ev->logprob;
        s->n++;
        if (ev->n_generated != s->n) s->bad_order = 1; /* one event per token, in order */
    }
    if (ev->finish != MS_FINISH_NONE) {
        s->finish = ev->finish;
        s->n_final++;
        C.n_final++;
        pthread_cond_broadcast(&C.cv);
    }
    pthread_mutex_unlock(&C.mu);
}

static int coll_wait(int n) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 30;
    pthread_mutex_lock(&C.mu);
    int rc = 0;
    while (C.n_final < n && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&C.cv, &C.mu, &dl);
    int ok = C.n_final >= n;
    pthread_mutex_unlock(&C.mu);
    CHECK_MSG(ok, "timed out waiting for %d final events (have %d)", n, C.n_final);
    return ok;
}

static void coll_reset(void) {
    memset(C.s, 0, sizeof C.s);
    C.n_final = 0;
}

/* ---- workloads ---- */

static uint64_t rng_state = 4242;
static uint32_t rnd(uint32_t n) {
    rng_state = fake_mix(rng_state);
    return (uint32_t)(rng_state >> 20) % n;
}

static int32_t prompts[MAXR][MAXLEN];
static int n_prompts[MAXR], max_new[MAXR];

static void make_prompts(int n, int max_len) {
    int32_t stem[MAXLEN];
    for (int j = 0; j < MAXLEN; j++) stem[j] = (int32_t)rnd(VOCAB);
    for (int i = 0; i < n; i++) {
        n_prompts[i] = 1 + (int)rnd((uint32_t)max_len);
        int shared = rnd(2) ? (int)rnd((uint32_t)n_prompts[i]) : 0; /* prefix cache hits */
        for (int j = 0; j < n_prompts[i]; j++) prompts[i][j] = j < shared ? stem[j] : (int32_t)rnd(VOCAB);
        max_new[i] = 1 + (int)rnd(40);
    }
}

typedef struct run_opts {
    int steps;      /* speculative_num_steps (0 = off) */
    int kind;       /* draft hook */
    int n_pages, page_size, chunk;
    int sampled;    /* temperature 0.8 with seeds */
    int logprobs;
    int n_stop;     /* stop id per request: the greedy reference's token at index stop_at[i] */
    ms_grammar *grammar; /* every other request (even i) constrained by it */
    int argmax;          /* the executor offers forward_argmax (greedy steps come back as ids) */
} run_opts;

static int stop_at[MAXR];

/* Runs n requests through one engine; fills C and *st. */
static void run(const run_opts *o, int n, ms_engine_stats *st, fake_exec *fout) {
    fake_exec f;
    fake_init(&f, VOCAB, o->n_pages, o->page_size, 64);
    f.any_logit_rows = 1;
    f.hold = 1; /* released once every request is submitted: the same schedule however threads run */
    ms_executor ex = fake_executor(&f);
    if (o->argmax) ex.forward_argmax = fake_forward_argmax;
    ms_engine_config cfg;
    ms_engine_config_default(&cfg);
    cfg.page_size = o->page_size;
    cfg.max_running_requests = 8;
    cfg.max_waiting_requests = MAXR;
    cfg.context_length = 512;
    cfg.check_integrity = 1;
    cfg.chunked_prefill_size = o->chunk;
    cfg.max_prefill_tokens = o->chunk * 2;
    hook h = {o->kind, 0};
    cfg.speculative_num_steps = o->steps;
    if (o->steps) cfg.draft_fn = draft_hook, cfg.draft_user = &h;
    ms_engine *e;
    ms_err err = {0};
    CHECK_EQ_INT(ms_engine_create(&cfg, &ex, &e, &err), MS_OK);
    coll_reset();
    for (int i = 0; i < n; i++) {
        ms_sampling sp;
        ms_sampling_default(&sp);
        sp.temperature = o->sampled ? 0.8f : 0.0f;
        sp.has_seed = 1;
        sp.seed = 1000 + (uint64_t)i;
        sp.max_tokens = max_new[i];
        sp.ignore_eos = 1;
        sp.logprobs = o->logprobs;
        if (o->n_stop) {
            int32_t ref[MAXLEN];
            fake_greedy_ref(prompts[i], n_prompts[i], max_new[i], VOCAB, 4.0f, ref);
            sp.n_stop_ids = 1;
            sp.stop_ids[0] = ref[stop_at[i] < max_new[i] ? stop_at[i] : max_new[i] - 1];
        }
        if (o->grammar && i % 2 == 0) sp.grammar = ms_grammar_matcher_new(o->grammar);
        CHECK_EQ_INT(ms_engine_submit(e, prompts[i], n_prompts[i], &sp, on_event, &C.s[i], &C.s[i].id, &err), MS_OK);
    }
    __atomic_store_n(&f.hold, 0, __ATOMIC_RELEASE);
    coll_wait(n);
    /* idle: every page is free or held by the prefix cache alone, and the integrity check ran */
    T_WAIT_UNTIL((ms_engine_get_stats(e, st), st->running == 0 && st->waiting == 0 && st->kv_pages_used == st->kv_pages_cached));
    ms_engine_destroy(e);
    CHECK_EQ_INT(st->kv_pages_used, st->kv_pages_cached);
    CHECK_EQ_INT(st->integrity_failures, 0);
    CHECK_MSG(f.errors == 0, "fake model: %s", f.first_error);
    if (fout) *fout = f;
    else fake_free(&f);
}

static void check_greedy(int n, int with_stop) {
    for (int i = 0; i < n; i++) {
        int32_t ref[MAXLEN];
        fake_greedy_ref(prompts[i], n_prompts[i], max_new[i], VOCAB, 4.0f, ref);
        int want = max_new[i], fin = MS_FINISH_LENGTH;
        if (with_stop) {
            int32_t stop = ref[stop_at[i] < max_new[i] ? stop_at[i] : max_new[i] - 1];
            for (int j = 0; j < max_new[i]; j++)
                if (ref[j] == stop) {
                    want = j + 1, fin = MS_FINISH_STOP;
                    break;
                }
        }
        CHECK_MSG(C.s[i].n == want, "request %d: %d tokens, want %d", i, C.s[i].n, want);
        CHECK_EQ_INT(C.s[i].finish, fin);
        CHECK_EQ_INT(C.s[i].n_final, 1);
        CHECK_EQ_INT(C.s[i].bad_order, 0);
        CHECK_MSG(memcmp(ref, C.s[i].toks, sizeof(int32_t) * (size_t)(want < C.s[i].n ? want : C.s[i].n)) == 0,
                  "request %d differs from the greedy oracle", i);
    }
}

/* every draft accepted: multi-token commits; accept length 1 + steps where max_tokens leaves room */
static void test_oracle_drafts_all_accepted(void) {
    enum { N = 20 };
    make_prompts(N, 50);
    run_opts o = {3, D_ORACLE, 200, 4, 16, 0, 0, 0};
    ms_engine_stats st;
    run(&o, N, &st, NULL);
    check_greedy(N, 0);
    CHECK(st.spec_verifications > 0);
    CHECK_MSG(st.spec_accepted_tokens == st.spec_draft_tokens, "accepted %llu of %llu", (unsigned long long)st.spec_accepted_tokens,
              (unsigned long long)st.spec_draft_tokens);
    double al = (double)(st.spec_accepted_tokens + st.spec_verifications) / (double)st.spec_verifications;
    printf("  oracle: %llu verifications, %llu drafts, accept length %.2f, %llu steps\n",
           (unsigned long long)st.spec_verifications, (unsigned long long)st.spec_draft_tokens, al,
           (unsigned long long)st.steps);
    CHECK(al > 2.5); /* 3 drafts each, fewer only near max_tokens */
    CHECK_EQ_INT(st.spec_pages_freed, 0);
}

/* every draft rejected: the target's token each step, the drafts' KV rolled back */
static void test_wrong_drafts_all_rejected(void) {
    enum { N = 20 };
    make_prompts(N, 50);
    run_opts o = {3, D_WRONG, 200, 2, 16, 0, 0, 0};
    ms_engine_stats st;
    run(&o, N, &st, NULL);
    check_greedy(N, 0);
    CHECK(st.spec_draft_tokens > 0);
    CHECK_EQ_INT(st.spec_accepted_tokens, 0);
    printf("  wrong: %llu verifications, %llu drafts, %llu pages freed by rollbacks\n",
           (unsigned long long)st.spec_verifications, (unsigned long long)st.spec_draft_tokens,
           (unsigned long long)st.spec_pages_freed);
    CHECK(st.spec_pages_freed > 0);
}

/* The executor's greedy ids (forward_argmax) were what every step with logit rows took: all rows
 * were plain greedy, verification rows included. */
static void check_all_argmax(const fake_exec *f, const ms_engine_stats *st) {
    CHECK_MSG(f->rows_calls == 0 && f->argmax_calls > 0, "%d forwards returned rows, %d ids", f->rows_calls, f->argmax_calls);
    CHECK_EQ_INT(st->argmax_steps, (uint64_t)f->argmax_calls);
}

/* rows of one step accept different lengths; small pool (preemption), small chunks, prefix hits; the
 * second time with the verification rows' tokens taken as greedy ids on the "device" */
static void test_mixed_continuous_batching(void) {
    enum { N = 24 };
    make_prompts(N, 60);
    for (int am = 0; am <= 1; am++) {
        run_opts o = {4, D_MIXED, 40, 4, 8, 0, 0, 0};
        o.argmax = am;
        ms_engine_stats st;
        fake_exec f;
        run(&o, N, &st, &f);
        check_greedy(N, 0);
        CHECK(st.spec_accepted_tokens > 0 && st.spec_accepted_tokens < st.spec_draft_tokens);
        CHECK(st.preemptions > 0);
        if (am) check_all_argmax(&f, &st);
        else CHECK_EQ_INT(st.argmax_steps, 0);
        fake_free(&f);
        printf("  mixed%s: accepted %llu of %llu drafts, %llu preemptions, %llu pages freed\n", am ? " (ids)" : "",
               (unsigned long long)st.spec_accepted_tokens, (unsigned long long)st.spec_draft_tokens,
               (unsigned long long)st.preemptions, (unsigned long long)st.spec_pages_freed);
    }
}

/* a stop id inside an accepted run ends the request at it */
static void test_stop_inside_accepted_run(void) {
    enum { N = 16 };
    make_prompts(N, 30);
    for (int i = 0; i < N; i++) max_new[i] = 20 + (int)rnd(20), stop_at[i] = 1 + (int)rnd(15);
    for (int am = 0; am <= 1; am++) {
        run_opts o = {4, D_ORACLE, 200, 4, 16, 0, 0, 1};
        o.argmax = am;
        ms_engine_stats st;
        fake_exec f;
        run(&o, N, &st, &f);
        check_greedy(N, 1);
        if (am) check_all_argmax(&f, &st);
        fake_free(&f);
    }
}

/* seeded sampling with logprobs: the same tokens and logprobs with and without speculation */
static void test_sampled_same_as_without(void) {
    enum { N = 12 };
    make_prompts(N, 40);
    run_opts o = {0, D_MIXED, 200, 4, 16, 1, 1, 0};
    ms_engine_stats st;
    run(&o, N, &st, NULL);
    static slot ref[N];
    memcpy(ref, C.s, sizeof ref);
    o.steps = 3;
    run(&o, N, &st, NULL);
    CHECK(st.spec_accepted_tokens > 0);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(C.s[i].n, ref[i].n);
        CHECK_MSG(memcmp(C.s[i].toks, ref[i].toks, sizeof(int32_t) * (size_t)ref[i].n) == 0, "request %d: tokens differ", i);
        CHECK_MSG(memcmp(C.s[i].logprob, ref[i].logprob, sizeof(float) * (size_t)ref[i].n) == 0, "request %d: logprobs differ", i);
    }
}

/* structured outputs: the matcher advances per accepted token, a draft the grammar forbids ends the
 * accepted run, and GRAMMAR_END can land inside a run; outputs equal the non-speculative run's, with
 * drafts that ignore the grammar (the unconstrained greedy continuation) and with drafts that replay
 * the right answer (all accepted) */
static void test_grammar_with_drafts(void) {
    ms_grammar_vocab *v = NULL;
    ms_grammar *gr = NULL;
    ms_err err = {0};
    CHECK_EQ_INT(fake_grammar("\\[[0-9]{1,2}(,[0-9]{1,2}){0,5}\\]", &v, &gr, &err), MS_OK);
    enum { N = 12 };
    make_prompts(N, 20);
    for (int i = 0; i < N; i++) max_new[i] = 40;
    for (int sampled = 0; sampled < 2; sampled++) {
        run_opts o = {0, D_ORACLE, 200, 4, 16, sampled, 0, 0, gr};
        ms_engine_stats st;
        run(&o, N, &st, NULL);
        static slot ref[N];
        memcpy(ref, C.s, sizeof ref);
        for (int i = 0; i < N; i += 2) CHECK_EQ_INT(ref[i].finish, MS_FINISH_GRAMMAR_END);
        for (int kind = D_ORACLE; kind <= D_REPLAY; kind += D_REPLAY - D_ORACLE) {
            for (int i = 0; i < N; i++) memcpy(replay_out[i], ref[i].toks, sizeof(int32_t) * (size_t)ref[i].n), replay_n[i] = ref[i].n;
            replay_prompts = prompts, replay_np = n_prompts, replay_count = N;
            o.steps = 4, o.kind = kind;
            run(&o, N, &st, NULL);
            for (int i = 0; i < N; i++) {
                CHECK_EQ_INT(C.s[i].finish, ref[i].finish);
                CHECK_EQ_INT(C.s[i].n, ref[i].n);
                CHECK_MSG(memcmp(C.s[i].toks, ref[i].toks, sizeof(int32_t) * (size_t)ref[i].n) == 0,
                          "request %d (%s, drafts %s): output differs", i, sampled ? "sampled" : "greedy",
                          kind == D_REPLAY ? "replayed" : "unconstrained greedy");
            }
            if (kind == D_REPLAY)
                CHECK_MSG(st.spec_accepted_tokens == st.spec_draft_tokens && st.spec_accepted_tokens > 0,
                          "replayed drafts: %llu of %llu accepted", (unsigned long long)st.spec_accepted_tokens,
                          (unsigned long long)st.spec_draft_tokens);
        }
    }
    ms_grammar_unref(gr);
    ms_grammar_vocab_free(v);
}

/* speculation needs a draft source: refused clearly without one */
static void test_refused_without_draft_layer(void) {
    fake_exec f;
    fake_init(&f, VOCAB, 16, 4, 64);
    ms_executor ex = fake_executor(&f);
    ms_engine_config cfg;
    ms_engine_config_default(&cfg);
    cfg.page_size = 4;
    cfg.speculative_num_steps = 2;
    ms_engine *e = NULL;
    ms_err err = {0};
    CHECK_EQ_INT(ms_engine_create(&cfg, &ex, &e, &err), MS_ERR_INVALID);
    CHECK_MSG(strstr(err.msg, "--speculative-num-steps") != NULL, "message: %s", err.msg);
    fake_free(&f);
}

int main(void) {
    pthread_mutex_init(&C.mu, NULL);
    pthread_cond_init(&C.cv, NULL);
    RUN(test_oracle_drafts_all_accepted);
    RUN(test_wrong_drafts_all_rejected);
    RUN(test_mixed_continuous_batching);
    RUN(test_stop_inside_accepted_run);
    RUN(test_sampled_same_as_without);
    RUN(test_grammar_with_drafts);
    RUN(test_refused_without_draft_layer);
    return TEST_SUMMARY();
}
