/* test_spec_model.c - speculative decoding with a real model and its MTP layer (CPU): the committed
 * fixtures given a random MTP layer by tools/add_mtp.py (in a temporary directory), served by the
 * model executor and the engine. Many prompts at once (continuous batching, chunked prefill, shared
 * prefixes for the prefix cache, a KV pool small enough to preempt) give the same greedy tokens with
 * and without speculation:
 *   - the MTP layer's own drafts (random weights: nearly all rejected, the rollback path);
 *   - the MTP steps run, then every draft replaced by the right token (a replay of the run without
 *     speculation: all accepted, so several tokens per step are committed and the MTP layer's cache
 *     is extended over them);
 *   - the MTP steps run, then every draft replaced by a wrong token (all rejected).
 * Asserts on the accept counters and on pages returned by rollbacks, and on an empty pool at the end.
 * The executor is held until every request is queued, so a run's steps do not depend on thread timing.
 * The greedy steps and the drafts take their ids from the backend (forward_argmax, draft_argmax): the
 * outputs equal a run with MS_HOST_ARGMAX=1, and so do the drafts the MTP layer makes (a hook records
 * them, with their positions, per request; drafts never change outputs, so only this sees them).
 *
 * `test_spec_model cuda` (scripts/gpu-check.sh) serves the same requests with MTP drafts on the GPU,
 * once with CUDA graphs and once without (--disable-cuda-graph): asserts that the executor recorded
 * verification and draft graphs at start-up, that the engine's verification and chained draft steps
 * launched them (and nothing was launched without graphs), that every request finished and the pool
 * ended empty. Greedy outputs of the two runs are printed, not asserted (bf16 steps of other token
 * counts round differently, and a near-tie parts the rest of a request): test_mtp's lockstep check
 * asserts the graphs' logits. */
#include "engine/engine.h"
#include "engine/model_executor.h"
#include "test.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { NR = 14, MAXLEN = 96 };

static char g_tmp[256];
static int32_t prompts[NR][MAXLEN];
static int n_prompt[NR], max_new[NR];

typedef struct out {
    int32_t toks[MAXLEN];
    int n, finish;
} out;
static out ref[NR], got[NR];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int n_done;

static void on_event(void *user, const ms_token_event *ev) {
    out *o = user;
    pthread_mutex_lock(&mu);
    if (ev->token >= 0 && o->n < MAXLEN) o->toks[o->n++] = ev->token;
    if (ev->finish != MS_FINISH_NONE) {
        o->finish = ev->finish;
        n_done++;
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
}

enum { H_NONE, H_REPLAY, H_WRONG, H_TAP };
static int g_hook;
static uint64_t g_tap[NR]; /* H_TAP: per request, a hash of every draft the MTP layer made and its position */
static int g_gpu;          /* cuda mode */
static int g_nograph;      /* run() with --disable-cuda-graph */
static ms_graph_counts g_gc; /* run(): the executor's graph counters before it closed */

/* the reference continuation of the request whose prompt and output so far are tokens[0..n) */
static int hook(void *user, const int32_t *tokens, int n_tokens, int np, int32_t *o, int max) {
    (void)user;
    if (g_hook == H_TAP) { /* the MTP layer's drafts, kept as they are */
        for (int i = 0; i < NR; i++) {
            if (n_prompt[i] != np || memcmp(tokens, prompts[i], sizeof(int32_t) * (size_t)np)) continue;
            uint64_t h = g_tap[i] ^ (uint64_t)n_tokens * 0x9E3779B97F4A7C15ull;
            for (int j = 0; j < max; j++) h = (h ^ (uint64_t)(uint32_t)o[j]) * 1099511628211ull;
            g_tap[i] = h;
            break;
        }
        return max;
    }
    for (int i = 0; i < NR; i++) {
        if (n_prompt[i] != np || memcmp(tokens, prompts[i], sizeof(int32_t) * (size_t)np)) continue;
        int k = n_tokens - np;
        if (k > ref[i].n || memcmp(tokens + np, ref[i].toks, sizeof(int32_t) * (size_t)k)) continue;
        int n = 0;
        while (n < max && k + n < ref[i].n) {
            o[n] = g_hook == H_REPLAY ? ref[i].toks[k + n] : (ref[i].toks[k + n] + 1) % 384;
            n++;
        }
        return n;
    }
    return 0;
}

/* The executor behind a gate: no step runs until every request is queued, so the engine's batches (and
 * so every step's inputs) are the same in every run of the same requests, whatever the threads' timing. */
typedef struct held {
    ms_executor in;
    int hold; /* atomic */
} held;
static void held_wait(held *h) {
    for (int w = 0; __atomic_load_n(&h->hold, __ATOMIC_ACQUIRE) && w < 300000; w++) { /* ~30 s at most */
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}
static int held_forward(void *ctx, const ms_batch *b, float *l, ms_err *err) {
    held *h = ctx;
    held_wait(h);
    return h->in.forward(h->in.ctx, b, l, err);
}
static int held_forward_argmax(void *ctx, const ms_batch *b, int32_t *ids, ms_err *err) {
    held *h = ctx;
    held_wait(h);
    return h->in.forward_argmax(h->in.ctx, b, ids, err);
}
static int held_draft(void *ctx, const ms_batch *b, int src, const int32_t *hidx, float *l, ms_err *err) {
    held *h = ctx;
    return h->in.draft(h->in.ctx, b, src, hidx, l, err);
}
static int held_draft_argmax(void *ctx, const ms_batch *b, int src, const int32_t *hidx, int32_t *ids, ms_err *err) {
    held *h = ctx;
    return h->in.draft_argmax(h->in.ctx, b, src, hidx, ids, err);
}
static int held_healthy(void *ctx) {
    held *h = ctx;
    return h->in.healthy ? h->in.healthy(h->in.ctx) : 1;
}
static int held_pin(void *ctx, void *p, size_t n) {
    held *h = ctx;
    return h->in.pin ? h->in.pin(h->in.ctx, p, n) : 0;
}
static void held_unpin(void *ctx, void *p) {
    held *h = ctx;
    if (h->in.unpin) h->in.unpin(h->in.ctx, p);
}
static ms_executor held_wrap(held *h, const ms_executor *in) {
    h->in = *in;
    h->hold = 1;
    ms_executor e = *in;
    e.ctx = h;
    e.forward = held_forward;
    e.forward_argmax = in->forward_argmax ? held_forward_argmax : NULL;
    e.draft = in->draft ? held_draft : NULL;
    e.draft_argmax = in->draft_argmax ? held_draft_argmax : NULL;
    e.healthy = held_healthy;
    e.pin = held_pin;
    e.unpin = held_unpin;
    return e;
}

/* Runs every request through one engine on dir; fills got[] and *st. */
static void run(const char *dir, int steps, int hk, ms_engine_stats *st) {
    ms_exec_opts o = {0};
    o.model_path = dir;
    o.device = g_gpu ? "cuda" : "cpu";
    o.disable_graphs = g_nograph;
    o.page_size = 4;
    o.max_total_tokens = 4 * 70; /* small: some requests get preempted */
    o.max_batch_tokens = 64;
    o.speculative_num_steps = steps;
    ms_executor ex;
    ms_err err = {0};
    int rc = ms_model_executor_open(&o, &ex, NULL, &err);
    CHECK_MSG(rc == MS_OK, "%s: %s", dir, err.msg);
    if (rc) return;
    ms_engine_config ec;
    ms_engine_config_default(&ec);
    ec.page_size = 4;
    ec.max_running_requests = 6;
    ec.chunked_prefill_size = 8;
    ec.max_prefill_tokens = 16;
    ec.context_length = 4 * 70;
    ec.check_integrity = 1;
    ec.speculative_num_steps = steps;
    g_hook = hk;
    if (hk != H_NONE) ec.draft_fn = hook, ec.draft_fn_after_layer = 1;
    ms_engine *e = NULL;
    held h;
    const ms_executor hx = held_wrap(&h, &ex);
    CHECK_EQ_INT(ms_engine_create(&ec, &hx, &e, &err), MS_OK);
    if (!e) {
        ms_model_executor_close(&ex);
        return;
    }
    memset(got, 0, sizeof got);
    n_done = 0;
    for (int i = 0; i < NR; i++) {
        ms_sampling sp;
        ms_sampling_default(&sp);
        sp.temperature = 0;
        sp.max_tokens = max_new[i];
        sp.ignore_eos = 1;
        CHECK_EQ_INT(ms_engine_submit(e, prompts[i], n_prompt[i], &sp, on_event, &got[i], NULL, &err), MS_OK);
    }
    __atomic_store_n(&h.hold, 0, __ATOMIC_RELEASE);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 120;
    pthread_mutex_lock(&mu);
    int wrc = 0;
    while (n_done < NR && wrc != ETIMEDOUT) wrc = pthread_cond_timedwait(&cv, &mu, &dl);
    pthread_mutex_unlock(&mu);
    CHECK_MSG(n_done == NR, "%s: %d of %d requests finished", dir, n_done, NR);
    T_WAIT_UNTIL((ms_engine_get_stats(e, st), st->running == 0 && st->waiting == 0 && st->kv_pages_used == st->kv_pages_cached));
    CHECK_EQ_INT(st->kv_pages_used, st->kv_pages_cached);
    CHECK_EQ_INT(st->integrity_failures, 0);
    ms_engine_destroy(e);
    ms_forward_graph_counts(ms_model_executor_forward(&ex), &g_gc);
    ms_model_executor_close(&ex);
}

/* GPU: the same requests with MTP drafts, with and without CUDA graphs (see the file comment). */
static void gpu_check(const char *fixture, const char *dst) {
    static out on[NR];
    ms_engine_stats st;
    ms_graph_counts gon, goff;
    g_nograph = 0;
    run(dst, 3, H_NONE, &st);
    gon = g_gc;
    memcpy(on, got, sizeof on);
    CHECK(st.spec_verifications > 0 && st.spec_draft_steps > 0);
    g_nograph = 1;
    run(dst, 3, H_NONE, &st);
    goff = g_gc;
    g_nograph = 0;
    int same = 0, toks = 0, toks_same = 0;
    for (int i = 0; i < NR; i++) {
        int j = 0;
        while (j < on[i].n && j < got[i].n && on[i].toks[j] == got[i].toks[j]) j++;
        same += j == got[i].n && on[i].n == got[i].n;
        toks += got[i].n, toks_same += j;
        CHECK_MSG(on[i].n == max_new[i] && got[i].n == max_new[i], "request %d: %d / %d tokens (want %d)", i, on[i].n,
                  got[i].n, max_new[i]);
    }
    printf("  %s on the GPU: graphs recorded %d decode, %d verify, %d draft; launched %llu decode, %llu verify, %llu "
           "draft; without graphs launched %llu; greedy outputs with vs without graphs: %d of %d requests identical, "
           "%d of %d tokens before the first difference (not asserted)\n",
           fixture, gon.recorded[MS_GRAPH_DECODE], gon.recorded[MS_GRAPH_VERIFY], gon.recorded[MS_GRAPH_DRAFT],
           (unsigned long long)gon.launches[MS_GRAPH_DECODE], (unsigned long long)gon.launches[MS_GRAPH_VERIFY],
           (unsigned long long)gon.launches[MS_GRAPH_DRAFT],
           (unsigned long long)(goff.launches[0] + goff.launches[1] + goff.launches[2]), same, NR, toks_same, toks);
    /* max_batch_tokens 64: at start-up decode buckets 1..64, verification of 4 tokens 1..16 sequences,
     * chained draft steps 1..64 (10); draft steps that read the main step's rows (a round's first
     * draft step when it has one token per sequence) are recorded on their second use, so more may
     * exist by the end (13 on the H200) */
    CHECK_MSG(gon.recorded[MS_GRAPH_VERIFY] == 6 && gon.recorded[MS_GRAPH_DRAFT] >= 10,
              "graphs recorded: %d verify, %d draft (want 6, >= 10)", gon.recorded[MS_GRAPH_VERIFY], gon.recorded[MS_GRAPH_DRAFT]);
    CHECK_MSG(gon.launches[MS_GRAPH_VERIFY] > 0 && gon.launches[MS_GRAPH_DRAFT] > 0,
              "verify / draft graph launches: %llu / %llu", (unsigned long long)gon.launches[MS_GRAPH_VERIFY],
              (unsigned long long)gon.launches[MS_GRAPH_DRAFT]);
    for (int k = 0; k < MS_GRAPH_KINDS; k++) CHECK_EQ_INT((int)goff.launches[k], 0);
}

static void check_same(const char *what) {
    for (int i = 0; i < NR; i++) {
        CHECK_MSG(got[i].n == ref[i].n && got[i].finish == ref[i].finish, "%s: request %d has %d tokens (want %d)", what, i,
                  got[i].n, ref[i].n);
        int j = 0;
        while (j < ref[i].n && j < got[i].n && got[i].toks[j] == ref[i].toks[j]) j++;
        CHECK_MSG(j == ref[i].n, "%s: request %d differs from the run without speculation at token %d", what, i, j);
    }
}

static void model_check(const char *fixture) {
    char src[256], dst[300], cmd[700];
    snprintf(src, sizeof src, "tests/fixtures/%s", fixture);
    snprintf(dst, sizeof dst, "%s/%s", g_tmp, fixture);
    snprintf(cmd, sizeof cmd, "python3 tools/add_mtp.py %s %s >/dev/null", src, dst);
    if (system(cmd) != 0) {
        CHECK_MSG(0, "%s failed", cmd);
        return;
    }
    /* prompts with shared stems, 1..40 tokens; outputs 1..30 tokens */
    uint64_t x = 77;
    for (int i = 0; i < NR; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        n_prompt[i] = 1 + (int)((x >> 33) % 40);
        max_new[i] = 1 + (int)((x >> 13) % 30);
        for (int j = 0; j < n_prompt[i]; j++)
            prompts[i][j] = (int32_t)(3 + (j < 12 && i % 3 ? (j * 31) % 300 : ((x >> 20) + (uint64_t)j * 97) % 380));
    }
    if (g_gpu) {
        gpu_check(fixture, dst);
        return;
    }
    ms_engine_stats st;
    run(dst, 0, H_NONE, &st);
    memcpy(ref, got, sizeof ref);
    CHECK(st.spec_verifications == 0);
    run(dst, 3, H_NONE, &st);
    check_same("MTP drafts");
    CHECK(st.spec_verifications > 0 && st.spec_draft_steps > 0);
    /* the greedy steps and the drafts took their ids from the backend's argmax (test_mtp checks those
     * ids against the logits step by step); with the logits copied out and argmaxed on the host
     * instead (MS_HOST_ARGMAX=1) the outputs are the same and no step takes the device's ids */
    CHECK_MSG(st.argmax_steps > 0, "%s: no step took the backend's argmax", fixture);
    ms_engine_stats hs;
    setenv("MS_HOST_ARGMAX", "1", 1);
    run(dst, 3, H_NONE, &hs);
    unsetenv("MS_HOST_ARGMAX");
    check_same("MTP drafts, host argmax");
    CHECK_EQ_INT(hs.argmax_steps, 0);
    CHECK(hs.spec_verifications > 0 && hs.spec_draft_steps > 0);
    /* the drafts themselves (which do not change the outputs): the held executor makes both runs' steps
     * the same, so each request's drafts with their positions must be too, host argmax against the
     * device's draft ids (several requests a draft step: the rows' order matters) */
    uint64_t tap_host[NR];
    memset(g_tap, 0, sizeof g_tap);
    setenv("MS_HOST_ARGMAX", "1", 1);
    run(dst, 3, H_TAP, &hs);
    unsetenv("MS_HOST_ARGMAX");
    check_same("tapped drafts, host argmax");
    memcpy(tap_host, g_tap, sizeof tap_host);
    memset(g_tap, 0, sizeof g_tap);
    run(dst, 3, H_TAP, &hs);
    check_same("tapped drafts");
    int tapped = 0;
    for (int i = 0; i < NR; i++) {
        tapped += g_tap[i] != 0;
        CHECK_MSG(g_tap[i] == tap_host[i], "%s: request %d's drafts differ between device ids and host argmax", fixture, i);
    }
    CHECK(tapped > 0);
    printf("  %s, MTP drafts: %llu verifications, %llu of %llu accepted, %llu draft steps, %llu pages freed\n", fixture,
           (unsigned long long)st.spec_verifications, (unsigned long long)st.spec_accepted_tokens,
           (unsigned long long)st.spec_draft_tokens, (unsigned long long)st.spec_draft_steps,
           (unsigned long long)st.spec_pages_freed);
    run(dst, 3, H_REPLAY, &st);
    check_same("replayed drafts");
    CHECK_MSG(st.spec_accepted_tokens == st.spec_draft_tokens && st.spec_accepted_tokens > 0,
              "replayed drafts: %llu of %llu accepted", (unsigned long long)st.spec_accepted_tokens,
              (unsigned long long)st.spec_draft_tokens);
    printf("  %s, replayed drafts: %llu verifications, accept length %.2f\n", fixture,
           (unsigned long long)st.spec_verifications,
           (double)(st.spec_accepted_tokens + st.spec_verifications) / (double)st.spec_verifications);
    run(dst, 3, H_WRONG, &st);
    check_same("wrong drafts");
    CHECK_EQ_INT(st.spec_accepted_tokens, 0);
    CHECK(st.spec_pages_freed > 0);
}

static void test_glm4_moe(void) { model_check("glm4_moe"); }
static void test_glm_moe_dsa(void) { model_check("glm_moe_dsa"); }

int main(int argc, char **argv) {
    g_gpu = argc > 1 && !strcmp(argv[1], "cuda");
    if (g_gpu) {
        ms_backend *b = NULL;
        ms_err e = {0};
        if (ms_backend_create("cuda", 0, &b, &e) != MS_OK) {
            printf("SKIP (no GPU): %s\n## tests/engine/test_spec_model.c (cuda): 0 passed, 0 failed\n", e.msg);
            return 0;
        }
        ms_backend_destroy(b);
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/ms_test_spec_model_%d", (int)getpid());
    char cmd[320];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", g_tmp);
    CHECK(system(cmd) == 0);
    RUN(test_glm4_moe);
    RUN(test_glm_moe_dsa);
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    return TEST_SUMMARY();
}
