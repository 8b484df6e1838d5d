/* cmd_generate.c - `moeserve generate --model DIR --ids 3,1,4 --max-tokens N --temperature 0
 * --ignore-eos --print-ids [--no-cache] [--seed S]`
 *
 * Continues one prompt and prints only the new token ids, comma-separated, on one line. Decoding is
 * incremental through the KV cache (one prefill, then one token per step); --no-cache recomputes
 * the whole sequence every step, which tests use to check the cache. Temperature 0 is greedy
 * (first maximum); a positive temperature samples from softmax(logits / T). Without --ignore-eos
 * generation stops after the model's eos token (which is printed, as transformers' generate does). */
#include "common/args.h"
#include "common/model_args.h"
#include "core/log.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int pick(const float *l, int V, double temp, uint64_t *rng) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[best]) best = i;
    if (temp <= 0) return best;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((l[i] - l[best]) / temp);
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    double u = (double)(*rng >> 11) / 9007199254740992.0 * sum, acc = 0;
    for (int i = 0; i < V; i++) {
        acc += exp((l[i] - l[best]) / temp);
        if (acc >= u) return i;
    }
    return best;
}

static const ms_opt generate_opts[] = {
    {"ids", NULL, MS_OPT_VALUE, "3,1,4", "prompt token ids"},
    {"max-tokens", NULL, MS_OPT_VALUE, "N", "new tokens at most [16]"},
    {"temperature", NULL, MS_OPT_VALUE, "T", "0 = greedy [0]"},
    {"seed", NULL, MS_OPT_VALUE, "S", "sampling seed [0]"},
    {"ignore-eos", NULL, MS_OPT_BOOL, NULL, "do not stop at the model's eos token"},
    {"no-cache", NULL, MS_OPT_BOOL, NULL, "recompute the whole sequence every step (checks the KV cache)"},
    {"print-ids", NULL, MS_OPT_BOOL, NULL, "print the new ids (what this command always prints)"},
    MS_OPT_END,
};

static const ms_cmd generate_cmd = {
    "generate", "--model DIR --ids 3,1,4 [--max-tokens N] [--temperature 0] [--ignore-eos] [flags]",
    "Continues one prompt and prints only the new token ids, comma-separated, on one line.",
    {generate_opts, ms_model_opts, ms_parallel_opts, ms_spec_opts},
};

/* --speculative-algorithm: the request runs through the engine (which owns drafting and
 * verification); greedy output equals the plain loop's. */
typedef struct gen_sink {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t *out;
    int n, cap, done;
    char err[MS_ERR_MSG_MAX];
} gen_sink;

static void gen_event(void *user, const ms_token_event *ev) {
    gen_sink *g = user;
    pthread_mutex_lock(&g->mu);
    if (ev->token >= 0 && g->n < g->cap) g->out[g->n++] = ev->token;
    if (ev->finish != MS_FINISH_NONE) {
        g->done = 1;
        if (ev->error) snprintf(g->err, sizeof g->err, "%s", ev->error);
        pthread_cond_signal(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

static int generate_spec(const ms_executor *ex, int steps, const int32_t *ids, int n, int max_new, double temp,
                         long long seed, int ignore_eos, int32_t *out, int *n_out, ms_err *err) {
    ms_engine_config ec;
    ms_engine_config_default(&ec);
    ec.page_size = ex->page_size;
    ec.max_running_requests = 1;
    ec.speculative_num_steps = steps;
    ec.context_length = n + max_new;
    ms_engine *e = NULL;
    MS_TRY(ms_engine_create(&ec, ex, &e, err));
    gen_sink g = {.out = out, .cap = max_new};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    ms_sampling sp;
    ms_sampling_default(&sp);
    sp.temperature = (float)temp;
    sp.has_seed = 1;
    sp.seed = (uint64_t)seed;
    sp.max_tokens = max_new;
    sp.ignore_eos = ignore_eos;
    if (!ignore_eos) sp.n_stop_ids = ms_model_executor_eos(ex, sp.stop_ids, MS_MAX_STOP_IDS);
    uint64_t id;
    int rc = ms_engine_submit(e, ids, n, &sp, gen_event, &g, &id, err);
    if (rc == MS_OK) {
        pthread_mutex_lock(&g.mu);
        while (!g.done) pthread_cond_wait(&g.cv, &g.mu);
        pthread_mutex_unlock(&g.mu);
        if (g.err[0]) rc = ms_errf(err, MS_ERR_RUNTIME, "%s", g.err);
    }
    ms_engine_stats st;
    ms_engine_get_stats(e, &st);
    if (st.spec_verifications)
        fprintf(stderr, "speculative: %llu verifications, %llu of %llu draft tokens accepted, accept length %.2f\n",
                (unsigned long long)st.spec_verifications, (unsigned long long)st.spec_accepted_tokens,
                (unsigned long long)st.spec_draft_tokens,
                (double)(st.spec_accepted_tokens + st.spec_verifications) / (double)st.spec_verifications);
    ms_engine_destroy(e);
    pthread_mutex_destroy(&g.mu);
    pthread_cond_destroy(&g.cv);
    *n_out = g.n;
    return rc;
}

int cmd_generate(int argc, char **argv) {
    ms_args a;
    int prc = ms_args_parse(&a, &generate_cmd, argc, argv);
    if (prc) return ms_args_exit(prc);
    if (!getenv("MS_LOG")) ms_log_set_level(MS_LOG_WARN); /* stdout/stderr stay parseable */
    ms_model_args ma;
    int rc = 1, bad = 0;
    int32_t *ids = NULL, *seq = NULL;
    float *lg = NULL;
    ms_executor ex = {0};
    const char *ids_s = ms_args_str(&a, "ids", NULL);
    long long max_new = ms_args_int(&a, "max-tokens", 16, &bad);
    double temp = ms_args_float(&a, "temperature", 0, &bad);
    long long seed = ms_args_int(&a, "seed", 0, &bad);
    int ignore_eos = ms_args_flag(&a, "ignore-eos"), no_cache = ms_args_flag(&a, "no-cache");
    (void)ms_args_flag(&a, "print-ids"); /* ids are what this command prints */
    rc = 2; /* a flag at fault until the model opens */
    if (ms_model_args_parse(&a, "generate", &ma) || bad) goto done;
    if (ms_spec_args_parse(&a, "generate", &ma.ex)) goto done;
    if (ma.ex.speculative_num_steps && no_cache) {
        fprintf(stderr, "moeserve generate: flag --no-cache cannot be combined with --speculative-algorithm\n");
        goto done;
    }
    int n = 0;
    if (!ids_s || ms_parse_ids(ids_s, &ids, &n) || n < 1) {
        fprintf(stderr, "moeserve generate: flag --ids: expected a comma-separated list of token ids\n");
        goto done;
    }
    if (max_new < 0 || max_new > 1 << 20) {
        fprintf(stderr, "moeserve generate: flag --max-tokens: %lld is out of range\n", max_new);
        goto done;
    }
    if (temp < 0) {
        fprintf(stderr, "moeserve generate: flag --temperature: must be >= 0\n");
        goto done;
    }
    const int total = n + (int)max_new;
    if (!ma.ex.max_batch_tokens) ma.ex.max_batch_tokens = no_cache ? total : n;
    /* a verification step takes the last token and every draft */
    if (ma.ex.speculative_num_steps && ma.ex.max_batch_tokens < ma.ex.speculative_num_steps + 1)
        ma.ex.max_batch_tokens = ma.ex.speculative_num_steps + 1;
    if (!ma.ex.max_total_tokens) ma.ex.max_total_tokens = total + ma.ex.page_size;
    ms_err err = {0};
    rc = 1;
    if (ms_model_executor_open(&ma.ex, &ex, NULL, &err)) {
        fprintf(stderr, "moeserve generate: %s\n", err.msg);
        goto done;
    }
    int32_t eos[16];
    int n_eos = ignore_eos ? 0 : ms_model_executor_eos(&ex, eos, 16);
    seq = malloc(sizeof(int32_t) * (size_t)(total > 0 ? total : 1));
    lg = malloc(sizeof(float) * (size_t)ex.vocab);
    if (!seq || !lg) {
        fprintf(stderr, "moeserve generate: out of memory\n");
        goto done;
    }
    memcpy(seq, ids, sizeof(int32_t) * (size_t)n);
    if (ma.ex.speculative_num_steps && max_new > 0) {
        int got = 0;
        if (generate_spec(&ex, ma.ex.speculative_num_steps, ids, n, (int)max_new, temp, seed, ignore_eos, seq + n, &got, &err)) {
            fprintf(stderr, "moeserve generate: %s\n", err.msg);
            goto done;
        }
        for (int i = 0; i < got; i++) printf("%s%d", i ? "," : "", seq[n + i]);
        printf("\n");
        rc = 0;
        goto done;
    }
    uint64_t rng = (uint64_t)seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
    int len = n;
    for (int step = 0; step < max_new; step++) {
        int start = no_cache || step == 0 ? 0 : len - 1;
        if (ms_run_single(&ex, seq, start, len - start, 0, lg, &err)) {
            fprintf(stderr, "moeserve generate: %s\n", err.msg);
            goto done;
        }
        int tok = pick(lg, ex.vocab, temp, &rng);
        seq[len++] = tok;
        int stop = 0;
        for (int i = 0; i < n_eos; i++) stop |= tok == eos[i];
        if (stop) break;
    }
    for (int i = n; i < len; i++) printf("%s%d", i > n ? "," : "", seq[i]);
    printf("\n");
    rc = 0;
done:
    ms_model_executor_close(&ex);
    free(lg);
    free(seq);
    free(ids);
    ms_args_free(&a);
    return rc;
}
