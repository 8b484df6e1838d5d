/* test_parallel.c - tensor and expert parallelism on the CPU (ranks are threads, the in-process
 * communicator): every split of a model must give the logits of one rank within 1e-4 (relative to
 * the row's largest logit) and the same greedy choices, through chunked prefill and cached decode.
 * The one-rank run is the oracle here: it is itself checked against transformers by the conformance
 * fixtures. The fixtures of tests/fixtures are split where their shapes allow (bf16); "wide"
 * checkpoints written here (tiny_ckpt.h) and quantized with `moeserve quantize` cover FP8 and
 * NVFP4 slices. Splits a model cannot take must be refused at start-up with a sentence naming the
 * field or module. */
#include "core/fileutil.h"
#include "engine/model_executor.h"
#include "test.h"
#include "tiny_ckpt.h"

#include <stdlib.h>

#define N_PROMPT 12 /* prefilled as chunks of 8 and 4 */
#define N_DECODE 4  /* then decoded one token at a time */
#define N_ROWS (N_PROMPT + N_DECODE)
#define PAGE 4

static const char *g_bin;
static int g_ids_rows; /* rows checked through the executor's forward_argmax */

/* Runs the fixed schedule on an executor: logits of every position [N_ROWS, V]; the decode steps feed
 * `feed` (the reference's greedy choices) when given, else this run's own argmax (written to feed).
 * Each step runs again through forward_argmax (the engine's all-greedy steps; the K/V written again
 * are the same): every id must be the first largest of the step's logit row, on every split. */
static int run_schedule(const ms_executor *ex, int32_t *toks, float *logits, int V, int feed_given, ms_err *err) {
    const int nb = (N_ROWS + PAGE - 1) / PAGE;
    int32_t bt[16], pos[N_ROWS], slot[N_ROWS], lidx[N_ROWS], st[2];
    for (int j = 0; j < nb; j++) bt[j] = j;
    int done = 0;
    while (done < N_ROWS) {
        int n = done == 0 ? 8 : done < N_PROMPT ? N_PROMPT - done : 1;
        for (int i = 0; i < n; i++) pos[i] = done + i, slot[i] = done + i, lidx[i] = i;
        st[0] = 0, st[1] = n;
        int32_t ctx = done + n;
        ms_batch b = {n, 1, toks + done, pos, st, &ctx, slot, bt, nb, PAGE, n, lidx};
        MS_TRY(ex->forward(ex->ctx, &b, logits + (int64_t)done * V, err));
        if (ex->forward_argmax) {
            int32_t ids[N_ROWS];
            for (int i = 0; i < n; i++) ids[i] = -1;
            MS_TRY(ex->forward_argmax(ex->ctx, &b, ids, err));
            for (int i = 0; i < n; i++) {
                const float *r = logits + (int64_t)(done + i) * V;
                int best = 0;
                for (int v = 1; v < V; v++) best = r[v] > r[best] ? v : best;
                if (ids[i] != best)
                    return ms_errf(err, MS_ERR_RUNTIME, "position %d: forward_argmax gave %d, the logits' first largest is %d",
                                   done + i, ids[i], best);
            }
            g_ids_rows += n;
        }
        done += n;
        if (done >= N_PROMPT && done < N_ROWS && !feed_given) { /* greedy next token */
            const float *r = logits + (int64_t)(done - 1) * V;
            int best = 0;
            for (int v = 1; v < V; v++) best = r[v] > r[best] ? v : best;
            toks[done] = best;
        }
    }
    return MS_OK;
}

typedef struct split {
    int tp, ep;
} split;

/* Opens dir with the split, runs the schedule; rc and err as open/forward give them. */
static int run_split(const char *dir, split s, int32_t *toks, float *logits, int V, int feed_given, ms_err *err) {
    ms_exec_opts o = {0};
    o.model_path = dir;
    o.device = "cpu";
    o.max_total_tokens = 64;
    o.page_size = PAGE;
    o.max_batch_tokens = 16;
    o.tp = s.tp;
    o.ep = s.ep;
    o.dist_timeout_s = 30;
    ms_executor ex;
    MS_TRY(ms_model_executor_open(&o, &ex, NULL, err));
    int rc = run_schedule(&ex, toks, logits, V, feed_given, err);
    ms_model_executor_close(&ex);
    return rc;
}

/* Compares a split's rows with the reference: max relative error per row and greedy agreement where
 * the reference's top-2 gap is clear. */
static void compare(const char *what, const float *ref, const float *got, int V) {
    double worst = 0;
    int greedy_bad = 0;
    for (int r = 0; r < N_ROWS; r++) {
        const float *a = ref + (int64_t)r * V, *b = got + (int64_t)r * V;
        double m = 0, d = 0;
        int ia = 0, ib = 0;
        for (int v = 0; v < V; v++) {
            m = fabs(a[v]) > m ? fabs(a[v]) : m;
            d = fabs(a[v] - b[v]) > d ? fabs(a[v] - b[v]) : d;
            ia = a[v] > a[ia] ? v : ia;
            ib = b[v] > b[ib] ? v : ib;
        }
        double second = -INFINITY;
        for (int v = 0; v < V; v++)
            if (v != ia && a[v] > second) second = a[v];
        if (ia != ib && a[ia] - second > 1e-3 * m) greedy_bad++;
        double rel = m > 0 ? d / m : d;
        worst = rel > worst ? rel : worst;
    }
    CHECK_MSG(worst <= 1e-4, "%s: max relative logit error %.3g", what, worst);
    CHECK_MSG(greedy_bad == 0, "%s: %d rows choose another greedy token", what, greedy_bad);
    fprintf(stderr, "  %-40s max rel err %.2e\n", what, worst);
}

static const split g_splits[] = {{2, 1}, {4, 1}, {2, 2}, {4, 2}, {4, 4}};

/* Every split of dir against one rank. refuse(s) says which splits must be refused and with which
 * phrase (NULL: must run). */
static void check_model(const char *dir, const char *const *refusals) {
    ms_config cfg;
    ms_err err = {0};
    if (ms_config_load(dir, &cfg, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    const int V = cfg.vocab_size;
    float *ref = malloc(sizeof(float) * (size_t)N_ROWS * (size_t)V);
    float *got = malloc(sizeof(float) * (size_t)N_ROWS * (size_t)V);
    int32_t toks[N_ROWS];
    for (int i = 0; i < N_PROMPT; i++) toks[i] = (int32_t)((i * 37 + 11) % V);
    int rc = run_split(dir, (split){1, 1}, toks, ref, V, 0, &err);
    CHECK_MSG(rc == MS_OK, "%s one rank: %s", dir, err.msg);
    for (size_t i = 0; rc == MS_OK && i < sizeof g_splits / sizeof g_splits[0]; i++) {
        split s = g_splits[i];
        char what[600];
        snprintf(what, sizeof what, "%s --tp %d --ep %d", strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir, s.tp, s.ep);
        ms_err e2 = {0};
        int rc2 = run_split(dir, s, toks, got, V, 1, &e2);
        const char *want_refusal = refusals ? refusals[i] : NULL;
        if (want_refusal) {
            CHECK_MSG(rc2 != MS_OK && strstr(e2.msg, want_refusal), "%s: expected a refusal naming '%s', got rc %d: %s",
                      what, want_refusal, rc2, e2.msg);
            fprintf(stderr, "  %-40s refused: %s\n", what, e2.msg);
        } else {
            CHECK_MSG(rc2 == MS_OK, "%s: %s", what, e2.msg);
            if (rc2 == MS_OK) compare(what, ref, got, V);
        }
    }
    free(ref);
    free(got);
}

/* The transformers-made fixtures: glm4_moe has 6 heads (tp 4 refused), glm_moe_dsa 4 heads. */
static void test_fixtures_bf16(void) {
    static const char *const glm4[] = {NULL, "num_attention_heads", NULL, "num_attention_heads", "num_attention_heads"};
    check_model("tests/fixtures/glm4_moe", glm4);
    check_model("tests/fixtures/glm4_moe_legacy", glm4);
    check_model("tests/fixtures/glm_moe_dsa", NULL);
    check_model("tests/fixtures/glm_moe_dsa_legacy", NULL);
    CHECK_MSG(g_ids_rows > 0, "no step went through forward_argmax");
}

/* Writes a wide bf16 checkpoint of arch and its FP8 / NVFP4 quantizations into base-{bf16,fp8,nvfp4}. */
static int make_wide(const char *base, int arch) {
    tiny_opts o = {.arch = arch, .dtype = MS_BF16, .wide = 1, .seed = 7};
    char d[600], q[600], cmd[2000];
    snprintf(d, sizeof d, "%s-bf16", base);
    if (tiny_write(d, &o)) return -1;
    static const char *const fmts[] = {"fp8", "nvfp4"};
    for (int i = 0; i < 2; i++) {
        snprintf(q, sizeof q, "%s-%s", base, fmts[i]);
        snprintf(cmd, sizeof cmd, "'%s' quantize --to %s --in '%s' --out '%s' >/dev/null 2>&1", g_bin, fmts[i], d, q);
        if (system(cmd) != 0) return fprintf(stderr, "  %s failed\n", cmd), -1;
    }
    return 0;
}

/* Quantized slices: FP8 keeps 128-row blocks whole only at tp 2 (tp 4 must be refused naming the
 * block); NVFP4 groups of 16 stay whole at every split here. */
static void check_wide(int arch, const char *tag) {
    char *tmp = tiny_tmpdir(tag);
    CHECK(tmp != NULL);
    if (!tmp) return;
    char base[600], d[700];
    snprintf(base, sizeof base, "%s/m", tmp);
    CHECK(make_wide(base, arch) == 0);
    static const char *const fp8[] = {NULL, "would cut a block", NULL, "would cut a block", "would cut a block"};
    snprintf(d, sizeof d, "%s-bf16", base);
    check_model(d, NULL);
    snprintf(d, sizeof d, "%s-fp8", base);
    check_model(d, fp8);
    snprintf(d, sizeof d, "%s-nvfp4", base);
    check_model(d, NULL);
    tiny_rmrf(tmp);
    free(tmp);
}

static void test_wide_glm4(void) { check_wide(TINY_GLM4_MOE, "tp_glm4"); }
static void test_wide_dsa(void) { check_wide(TINY_GLM_MOE_DSA, "tp_dsa"); }

/* Flags that cannot split a model name what does not divide. */
static void test_refusals(void) {
    float *l = malloc(sizeof(float) * N_ROWS * 384);
    int32_t toks[N_ROWS] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    ms_err err = {0};
    CHECK(run_split("tests/fixtures/glm_moe_dsa", (split){3, 1}, toks, l, 384, 1, &err) != MS_OK);
    CHECK_MSG(strstr(err.msg, "--tp 3") && strstr(err.msg, "num_attention_heads (4)"), "%s", err.msg);
    err = (ms_err){0};
    CHECK(run_split("tests/fixtures/glm_moe_dsa", (split){2, 4}, toks, l, 384, 1, &err) != MS_OK);
    CHECK_MSG(strstr(err.msg, "--ep 4") && strstr(err.msg, "--tp 2"), "%s", err.msg);
    free(l);
}

int main(void) {
    g_bin = getenv("MS_BIN");
    if (!g_bin) g_bin = "build/moeserve";
    RUN(test_fixtures_bf16);
    RUN(test_wide_glm4);
    RUN(test_wide_dsa);
    RUN(test_refusals);
    return TEST_SUMMARY();
}
