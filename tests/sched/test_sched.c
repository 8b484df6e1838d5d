/* test_sched.c - the scheduler driven step by step against the fake model (fake_exec.h).
 *
 * Every workload's greedy outputs must equal the cache-free oracle (fake_greedy_ref), whatever the
 * chunk size, prefix cache, pool size (preemption) or arrival order; limits are checked on every
 * batch and the full integrity check runs after every step. */
#include "sched/sched.h"
#include "sched/fake_exec.h"
#include "test.h"

#include <stdint.h>
#include <stdlib.h>

enum { VOCAB = 32, MAXR = 64, MAXLEN = 160 };

static uint64_t rng_state = 4242;
static uint32_t rnd(uint32_t n) {
    rng_state = fake_mix(rng_state);
    return (uint32_t)(rng_state >> 20) % n;
}

typedef struct workload {
    int n;
    int32_t prompt[MAXR][MAXLEN];
    int n_prompt[MAXR], max_new[MAXR];
    int arrive[MAXR];      /* step at which the request is added */
    int abort_at[MAXR];    /* step at which it is aborted (released), -1 = never */
} workload;

typedef struct result {
    int32_t out[MAXR][MAXLEN];
    int n_out[MAXR];
    int aborted[MAXR];
    int n_cached[MAXR];
    uint64_t preemptions, hit_tokens, query_tokens;
    int steps, bad_steps;
    int max_running_seen;
} result;

static ms_sched_config base_cfg(int n_pages, int page_size) {
    ms_sched_config c = {0};
    c.n_pages = n_pages;
    c.page_size = page_size;
    c.max_running_requests = 16;
    c.max_waiting_requests = MAXR;
    c.max_batch_tokens = 256;
    c.max_prefill_tokens = 256;
    c.chunked_prefill_size = 256;
    c.context_length = 4096;
    c.enable_prefix_cache = 1;
    return c;
}

/* Runs a workload to completion; checks limits per batch and integrity per step. */
static void run(const ms_sched_config *cfg, const workload *w, result *res) {
    ms_sched s;
    ms_err err = {0};
    memset(res, 0, sizeof *res);
    CHECK_EQ_INT(ms_sched_init(&s, cfg, &err), MS_OK);
    fake_exec f;
    fake_init(&f, VOCAB, cfg->n_pages, cfg->page_size, cfg->max_batch_tokens);
    ms_request *reqs[MAXR] = {0};
    int done[MAXR] = {0}, n_done = 0;
    float *logits = malloc((size_t)cfg->max_running_requests * VOCAB * sizeof(float));
    for (int step = 0; n_done < w->n && step < 100000; step++) {
        for (int i = 0; i < w->n; i++) {
            if (w->arrive[i] == step) {
                reqs[i] = ms_request_create((uint64_t)i + 1, w->prompt[i], w->n_prompt[i], w->max_new[i], cfg->page_size);
                CHECK_EQ_INT(ms_sched_add(&s, reqs[i], &err), MS_OK);
            }
            if (w->abort_at[i] == step && reqs[i] && !done[i]) {
                ms_sched_release(&s, reqs[i], 1);
                done[i] = 1; n_done++; res->aborted[i] = 1;
            }
        }
        const ms_batch *b = ms_sched_step(&s);
        if (!b) {
            int pending = 0;
            for (int i = 0; i < w->n; i++) pending += reqs[i] && !done[i];
            if (pending) { CHECK_MSG(0, "step %d: no batch with %d requests pending", step, pending); break; }
            continue;
        }
        res->steps++;
        /* limits */
        int prefill = 0, bad = 0;
        for (int i = 0; i < b->n_seqs; i++) {
            ms_request *r = s.seq_req[i];
            int n_new = b->seq_start[i + 1] - b->seq_start[i];
            if (r->n_tokens - r->n_computed > 1 || r->n_computed < r->n_prompt - 1) prefill += n_new;
            if (n_new > 1 && n_new > cfg->chunked_prefill_size) bad = 1;
        }
        if (prefill > cfg->max_prefill_tokens || b->n_tokens > cfg->max_batch_tokens || b->n_seqs > cfg->max_running_requests ||
            s.running.n > cfg->max_running_requests)
            bad = 1;
        res->bad_steps += bad;
        if (s.running.n > res->max_running_seen) res->max_running_seen = s.running.n;
        CHECK_EQ_INT(fake_forward(&f, b, logits, &err), MS_OK);
        ms_sched_commit(&s);
        for (int r = 0; r < b->n_logits; r++) {
            ms_request *q = s.logit_req[r];
            int32_t tok = fake_argmax(logits + (size_t)r * VOCAB, VOCAB);
            ms_sched_append_token(&s, q, tok);
            if (ms_request_n_generated(q) == q->max_new) {
                int i = (int)q->id - 1;
                ms_sched_release(&s, q, 1);
                done[i] = 1; n_done++;
            }
        }
        if (ms_sched_check(&s, &err) != MS_OK) { CHECK_MSG(0, "step %d: %s", step, err.msg); break; }
    }
    CHECK_EQ_INT(n_done, w->n);
    CHECK_MSG(f.errors == 0, "fake model saw %d contract violations, first: %s", f.errors, f.first_error);
    for (int i = 0; i < w->n; i++) {
        if (!reqs[i]) continue;
        res->n_out[i] = ms_request_n_generated(reqs[i]);
        memcpy(res->out[i], reqs[i]->tokens + reqs[i]->n_prompt, (size_t)res->n_out[i] * sizeof(int32_t));
        res->n_cached[i] = reqs[i]->n_cached;
    }
    res->preemptions = s.preemptions;
    res->hit_tokens = s.radix.hit_tokens;
    res->query_tokens = s.radix.query_tokens;
    /* everything left is held by the prefix cache alone */
    CHECK_EQ_INT(ms_sched_pages_used(&s), ms_sched_pages_cached(&s));
    ms_radix_evict(&s.radix, cfg->n_pages);
    CHECK_EQ_INT(s.pool.n_free, cfg->n_pages);
    CHECK_EQ_INT(ms_sched_check(&s, &err), MS_OK);
    ms_sched_destroy(&s);
    for (int i = 0; i < w->n; i++) ms_request_free(reqs[i]);
    free(logits);
    fake_free(&f);
}

/* Outputs of non-aborted requests equal the oracle. */
static int check_oracle(const workload *w, const result *res) {
    int bad = 0;
    for (int i = 0; i < w->n; i++) {
        if (res->aborted[i]) continue;
        int32_t ref[MAXLEN];
        fake_greedy_ref(w->prompt[i], w->n_prompt[i], w->max_new[i], VOCAB, 4.0f, ref);
        if (res->n_out[i] != w->max_new[i] || memcmp(ref, res->out[i], (size_t)w->max_new[i] * sizeof(int32_t)) != 0) {
            CHECK_MSG(0, "request %d output differs from the oracle", i);
            bad = 1;
        }
    }
    return !bad;
}

/* n requests, prompts built from a few shared stems so prefixes repeat. */
static void make_workload(workload *w, int n, int max_prompt, int max_new, int spread) {
    memset(w, 0, sizeof *w);
    w->n = n;
    int32_t stems[3][MAXLEN];
    for (int k = 0; k < 3; k++) for (int j = 0; j < MAXLEN; j++) stems[k][j] = (int32_t)rnd(VOCAB);
    for (int i = 0; i < n; i++) {
        int np = 1 + (int)rnd((uint32_t)max_prompt);
        int stem = (int)rnd(4), shared = stem < 3 ? (int)rnd((uint32_t)np + 1) : 0;
        for (int j = 0; j < np; j++) w->prompt[i][j] = j < shared ? stems[stem][j] : (int32_t)rnd(VOCAB);
        w->n_prompt[i] = np;
        w->max_new[i] = 1 + (int)rnd((uint32_t)max_new);
        w->arrive[i] = spread ? (int)rnd((uint32_t)spread) : 0;
        w->abort_at[i] = -1;
    }
}

static workload W;
static result R1, R2;

static void test_basic_matches_oracle(void) {
    make_workload(&W, 8, 40, 12, 0);
    ms_sched_config c = base_cfg(256, 4);
    run(&c, &W, &R1);
    check_oracle(&W, &R1);
    CHECK_EQ_INT(R1.bad_steps, 0);
}

static void test_chunked_equals_unchunked(void) {
    make_workload(&W, 10, 60, 8, 6);
    ms_sched_config c = base_cfg(512, 4);
    c.enable_prefix_cache = 0;
    run(&c, &W, &R1);
    c.chunked_prefill_size = 3;
    c.max_prefill_tokens = 7;
    run(&c, &W, &R2);
    check_oracle(&W, &R1);
    check_oracle(&W, &R2);
    CHECK(R2.steps > R1.steps); /* chunking really happened */
    CHECK_EQ_INT(R1.bad_steps, 0);
    CHECK_EQ_INT(R2.bad_steps, 0);
}

/* Same prompt family run one after another: later ones hit the cache, outputs unchanged. */
static void test_prefix_cache_reuse(void) {
    memset(&W, 0, sizeof W);
    W.n = 4;
    for (int i = 0; i < W.n; i++) {
        W.n_prompt[i] = 40;
        for (int j = 0; j < 40; j++) W.prompt[i][j] = (int32_t)((j * 7 + (j >= 30 ? i : 0)) % VOCAB);
        W.max_new[i] = 6;
        W.arrive[i] = i * 50; /* each after the previous has finished */
        W.abort_at[i] = -1;
    }
    W.prompt[3][39] = W.prompt[0][39]; /* ... */
    memcpy(W.prompt[3], W.prompt[0], sizeof W.prompt[0]); /* request 3 repeats request 0 exactly */
    ms_sched_config c = base_cfg(128, 4);
    run(&c, &W, &R1);
    check_oracle(&W, &R1);
    CHECK_EQ_INT(R1.n_cached[0], 0);
    CHECK_EQ_INT(R1.n_cached[1], 28); /* 30 shared tokens -> 7 whole pages */
    CHECK_EQ_INT(R1.n_cached[2], 28);
    CHECK_EQ_INT(R1.n_cached[3], 36); /* fully cached 40-token prompt: the last page is recomputed */
    CHECK_EQ_INT(R1.hit_tokens, 28 + 28 + 36);
    CHECK_EQ_INT(R1.query_tokens, 160);
    c.enable_prefix_cache = 0;
    run(&c, &W, &R2);
    check_oracle(&W, &R2);
    CHECK_EQ_INT(R2.hit_tokens, 0);
    for (int i = 0; i < W.n; i++) CHECK(memcmp(R1.out[i], R2.out[i], sizeof R1.out[i]) == 0);
}

/* A prompt that is a whole number of pages and fully cached still computes its last token. */
static void test_fully_cached_prompt(void) {
    memset(&W, 0, sizeof W);
    W.n = 2;
    for (int i = 0; i < 2; i++) {
        W.n_prompt[i] = 8;
        for (int j = 0; j < 8; j++) W.prompt[i][j] = (int32_t)(j + 3);
        W.max_new[i] = 5;
        W.arrive[i] = i * 20;
        W.abort_at[i] = -1;
    }
    ms_sched_config c = base_cfg(64, 4);
    run(&c, &W, &R1);
    check_oracle(&W, &R1);
    CHECK_EQ_INT(R1.n_cached[1], 4); /* 8 tokens cached, but only 1 page reused: token 8 must be computed */
    c.page_size = 1;
    run(&c, &W, &R1);
    check_oracle(&W, &R1);
    CHECK_EQ_INT(R1.n_cached[1], 7);
}

/* Multi-turn: the next prompt is the previous prompt + its output + more, so it can reuse pages
 * holding generated tokens (but never the last, uncomputed one). */
static void test_multiturn_continuation(void) {
    for (int ps = 1; ps <= 5; ps++) {
        memset(&W, 0, sizeof W);
        W.n = 4;
        int len = 5 + ps;
        for (int j = 0; j < len; j++) W.prompt[0][j] = (int32_t)rnd(VOCAB);
        W.n_prompt[0] = len;
        for (int i = 0; i < W.n; i++) {
            W.max_new[i] = 3 + (int)rnd(6);
            W.arrive[i] = i * 60;
            W.abort_at[i] = -1;
            if (i == 0) continue;
            int32_t out[MAXLEN];
            fake_greedy_ref(W.prompt[i - 1], W.n_prompt[i - 1], W.max_new[i - 1], VOCAB, 4.0f, out);
            int n = W.n_prompt[i - 1];
            memcpy(W.prompt[i], W.prompt[i - 1], (size_t)n * sizeof(int32_t));
            memcpy(W.prompt[i] + n, out, (size_t)W.max_new[i - 1] * sizeof(int32_t));
            n += W.max_new[i - 1];
            int extra = 1 + (int)rnd(4);
            for (int j = 0; j < extra; j++) W.prompt[i][n + j] = (int32_t)rnd(VOCAB);
            W.n_prompt[i] = n + extra;
        }
        ms_sched_config c = base_cfg(256, ps);
        run(&c, &W, &R1);
        check_oracle(&W, &R1);
        for (int i = 1; i < W.n; i++) {
            /* cached: whole pages of the previous turn's computed tokens (all but its last) */
            int computed = W.n_prompt[i - 1] + W.max_new[i - 1] - 1;
            CHECK_EQ_INT(R1.n_cached[i], computed / ps * ps);
        }
    }
}

/* A pool barely big enough for the largest request forces preemption; outputs are unchanged. */
static void test_preemption_tiny_pool(void) {
    make_workload(&W, 12, 30, 30, 4);
    ms_sched_config big = base_cfg(1024, 2);
    run(&big, &W, &R1);
    check_oracle(&W, &R1);
    CHECK_EQ_INT(R1.preemptions, 0);
    int maxlen = 0;
    for (int i = 0; i < W.n; i++) if (W.n_prompt[i] + W.max_new[i] > maxlen) maxlen = W.n_prompt[i] + W.max_new[i];
    for (int pc = 0; pc < 2; pc++) {
        ms_sched_config tiny = base_cfg((maxlen + 1) / 2 + 2, 2);
        tiny.enable_prefix_cache = pc;
        run(&tiny, &W, &R2);
        check_oracle(&W, &R2);
        CHECK_MSG(R2.preemptions > 0, "prefix cache %d: no preemption happened", pc);
        CHECK_EQ_INT(R2.bad_steps, 0);
        for (int i = 0; i < W.n; i++) CHECK(memcmp(R1.out[i], R2.out[i], sizeof R1.out[i]) == 0);
    }
}

static void test_limits(void) {
    make_workload(&W, 20, 50, 10, 3);
    ms_sched_config c = base_cfg(512, 4);
    c.max_running_requests = 3;
    c.max_prefill_tokens = 16;
    c.chunked_prefill_size = 8;
    c.max_batch_tokens = 20;
    run(&c, &W, &R1);
    check_oracle(&W, &R1);
    CHECK_EQ_INT(R1.bad_steps, 0);
    CHECK_EQ_INT(R1.max_running_seen, 3);
}

static void test_bounded_queue_and_invalid(void) {
    ms_sched s;
    ms_err err = {0};
    ms_sched_config c = base_cfg(8, 4); /* 32 KV tokens */
    c.max_waiting_requests = 2;
    c.context_length = 30;
    CHECK_EQ_INT(ms_sched_init(&s, &c, &err), MS_OK);
    int32_t p[40] = {0};
    ms_request *a = ms_request_create(1, p, 4, 4, 4), *b = ms_request_create(2, p, 4, 4, 4),
               *d = ms_request_create(3, p, 4, 4, 4), *big = ms_request_create(4, p, 20, 20, 4);
    CHECK_EQ_INT(ms_sched_add(&s, a, &err), MS_OK);
    CHECK_EQ_INT(ms_sched_add(&s, big, &err), MS_ERR_INVALID);
    CHECK_EQ_INT(ms_sched_add(&s, b, &err), MS_OK);
    CHECK_EQ_INT(ms_sched_add(&s, d, &err), MS_ERR_BUSY);
    CHECK(strstr(err.msg, "max_waiting_requests") != NULL);
    ms_sched_release(&s, a, 1);
    CHECK_EQ_INT(ms_sched_add(&s, d, &err), MS_OK);
    ms_sched_destroy(&s);
    ms_request_free(a); ms_request_free(b); ms_request_free(d); ms_request_free(big);
    c.chunked_prefill_size = 0;
    CHECK_EQ_INT(ms_sched_init(&s, &c, &err), MS_ERR_INVALID);
}

/* Aborted requests (waiting or mid-run) return their pages; the rest are unaffected. */
static void test_abort_frees_pages(void) {
    make_workload(&W, 10, 40, 20, 3);
    for (int i = 0; i < W.n; i += 2) W.abort_at[i] = 2 + i;
    ms_sched_config c = base_cfg(64, 4);
    run(&c, &W, &R1); /* run() checks the pool ends up held by the cache alone */
    check_oracle(&W, &R1);
}


/* Draft tokens: reserved pages, a verification sequence with logits on every draft, rollback of the
 * rejected drafts' pages, drafts dropped under preemption and when the step has no room; the
 * integrity check holds throughout. */
static void test_drafts_reserve_verify_rollback(void) {
    ms_sched_config c = base_cfg(12, 2);
    c.max_draft_tokens = 4;
    c.max_batch_tokens = 16;
    ms_sched s;
    ms_err err = {0};
    CHECK_EQ_INT(ms_sched_init(&s, &c, &err), MS_OK);
    int32_t p[5] = {1, 2, 3, 4, 5};
    ms_request *r = ms_request_create(1, p, 5, 20, 2), *q = ms_request_create(2, p, 3, 20, 2);
    CHECK_EQ_INT(ms_sched_add(&s, r, &err), MS_OK);
    const ms_batch *b = ms_sched_step(&s); /* prefill of 5 tokens */
    CHECK(b && b->n_tokens == 5 && b->n_logits == 1);
    ms_sched_commit(&s);
    ms_sched_append_token(&s, r, 9);
    CHECK_EQ_INT(r->n_pages, 3); /* 5 computed tokens, pages of 2 */
    int nd = ms_sched_reserve_drafts(&s, r, 4);
    CHECK_EQ_INT(nd, 4);
    CHECK_EQ_INT(r->n_pages, 5); /* positions 5 (the real token) .. 9 (drafts) */
    int32_t d[4] = {10, 11, 12, 13};
    ms_sched_set_drafts(&s, r, d, 4);
    CHECK_EQ_INT(ms_sched_check(&s, &err), MS_OK);
    b = ms_sched_step(&s); /* verification: the real token and 4 drafts, logits on all five */
    CHECK(b && b->n_tokens == 5 && b->n_logits == 5);
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(b->logit_idx[i], i);
    CHECK_EQ_INT(b->token_ids[0], 9);
    CHECK_EQ_INT(b->token_ids[4], 13);
    ms_sched_commit(&s);
    /* one draft accepted (10), then the target's own token 20 */
    r->tokens[6] = 10, r->tokens[7] = 20;
    int freed = ms_sched_rollback(&s, r, 8);
    CHECK_EQ_INT(r->n_computed, 7);
    CHECK_EQ_INT(r->n_pages, 4);
    CHECK_EQ_INT(freed, 1);
    CHECK_EQ_INT(r->spec_n, 0);
    CHECK_EQ_INT(ms_sched_check(&s, &err), MS_OK);
    /* drafts that do not fit the step's token budget are dropped: a plain decode step */
    nd = ms_sched_reserve_drafts(&s, r, 4);
    ms_sched_set_drafts(&s, r, d, nd);
    s.cfg.max_batch_tokens = 2;
    b = ms_sched_step(&s);
    CHECK(b && b->n_tokens == 1 && b->n_logits == 1 && r->spec_n == 0);
    ms_sched_commit(&s);
    ms_sched_append_token(&s, r, 21);
    s.cfg.max_batch_tokens = 16;
    CHECK_EQ_INT(ms_sched_check(&s, &err), MS_OK);
    /* preemption drops drafts first: a newer request carrying drafts is the victim */
    CHECK_EQ_INT(ms_sched_add(&s, q, &err), MS_OK);
    b = ms_sched_step(&s);
    ms_sched_commit(&s);
    ms_sched_append_token(&s, r, 22);
    ms_sched_append_token(&s, q, 7);
    b = ms_sched_step(&s);
    ms_sched_commit(&s);
    ms_sched_append_token(&s, r, 23);
    ms_sched_append_token(&s, q, 8);
    CHECK_EQ_INT(r->n_computed % 2, 0); /* r's next token starts a page */
    nd = ms_sched_reserve_drafts(&s, q, 4);
    CHECK(nd > 0);
    ms_sched_set_drafts(&s, q, d, nd);
    int pre = (int)s.preemptions;
    while (s.pool.n_free > 0) { /* fill the pool so that r's next page preempts q */
        int32_t pg;
        if (ms_kv_pool_alloc(&s.pool, 1, &pg) != MS_OK) break;
    }
    b = ms_sched_step(&s);
    CHECK_MSG((int)s.preemptions > pre, "no preemption (r at %d computed, %d pages)", r->n_computed, r->n_pages);
    if ((int)s.preemptions > pre) {
        CHECK_EQ_INT(q->spec_n, 0);
        CHECK_EQ_INT(q->n_tokens, 5); /* prompt 3 + two generated: the drafts are gone */
        CHECK_EQ_INT(q->n_pages, 0);
    }
    ms_sched_destroy(&s);
    ms_request_free(r);
    ms_request_free(q);
}

/* Random configurations and workloads, with aborts; every run against the oracle. */
static void test_random_stress(void) {
    for (int it = 0; it < 30; it++) {
        int ps = 1 + (int)rnd(5);
        make_workload(&W, 4 + (int)rnd(14), 1 + (int)rnd(70), 1 + (int)rnd(25), (int)rnd(20));
        for (int i = 0; i < W.n; i++) if (rnd(8) == 0) W.abort_at[i] = (int)rnd(40);
        int maxlen = 0;
        for (int i = 0; i < W.n; i++) if (W.n_prompt[i] + W.max_new[i] > maxlen) maxlen = W.n_prompt[i] + W.max_new[i];
        ms_sched_config c = base_cfg((maxlen + ps - 1) / ps + (int)rnd(60), ps);
        c.max_running_requests = 1 + (int)rnd(8);
        c.max_batch_tokens = c.max_running_requests + (int)rnd(64);
        c.max_prefill_tokens = 1 + (int)rnd(64);
        c.chunked_prefill_size = 1 + (int)rnd(40);
        c.enable_prefix_cache = (int)rnd(2);
        run(&c, &W, &R1);
        if (!check_oracle(&W, &R1) || R1.bad_steps) {
            CHECK_MSG(0, "iteration %d: ps %d pages %d running %d batch %d prefill %d chunk %d cache %d", it, ps, c.n_pages,
                      c.max_running_requests, c.max_batch_tokens, c.max_prefill_tokens, c.chunked_prefill_size, c.enable_prefix_cache);
            break;
        }
    }
}

int main(void) {
    RUN(test_basic_matches_oracle);
    RUN(test_chunked_equals_unchunked);
    RUN(test_prefix_cache_reuse);
    RUN(test_fully_cached_prompt);
    RUN(test_multiturn_continuation);
    RUN(test_preemption_tiny_pool);
    RUN(test_limits);
    RUN(test_bounded_queue_and_invalid);
    RUN(test_abort_frees_pages);
    RUN(test_random_stress);
    RUN(test_drafts_reserve_verify_rollback);
    return TEST_SUMMARY();
}
