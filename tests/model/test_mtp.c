/* test_mtp.c - the MTP (NEXTN) layer: loading, its forward and its own KV cache, on the CPU.
 *
 * Against transformers: tests/fixtures/{glm4_moe,glm_moe_dsa}_mtp (written by tools/make_fixtures.py
 * on the GPU machine) hold a checkpoint with random MTP tensors and the PyTorch reference of the MTP
 * forward (transformers' own decoder-layer class for the layer, enorm/hnorm/eh_proj/shared_head in
 * plain torch): for the sequence ids, the MTP logits of positions 0..S-2 given the main model's
 * final-normed hidden states and the next tokens. Checked within the fixture's tol, once from the
 * reference hidden states and once end to end from our own main forward. While a fixture does not
 * exist yet the check SKIPS LOUDLY (a line starting "SKIP") without failing.
 *
 * Without PyTorch: tools/add_mtp.py (standard library only) gives a copy of the committed fixtures
 * an MTP layer of random weights, in a temporary directory; on it the MTP cache logic is checked:
 * one multi-token MTP step equals the same positions fed one token at a time through the MTP layer's
 * paged KV cache and equals two chunks; two sequences batched equal each alone; the main model's
 * logits are unchanged by the MTP layer's presence; loading fails with the tensor or field named
 * when a checkpoint has no MTP layer; a checkpoint without shared_head.head uses the lm_head; the
 * executor's draft step under --tp 2 / 3-way splits (CPU ranks) gives the single rank's logits.
 *
 * `test_mtp cuda` (scripts/gpu-check.sh) runs the transformers check on the GPU within TOL_GPU (bf16
 * activations) and compares the GPU's MTP logits with the CPU's on the add_mtp checkpoints, with the
 * hidden rows of the main step kept by a CUDA graph decode step as well.
 *
 * The speculative lockstep (spec_graphs) runs every main and MTP step on three forwards: op by op,
 * with graphs, and with graphs through the argmax forms (ms_forward_run_argmax /
 * ms_forward_mtp_run_argmax, the engine's greedy and draft steps): the graphs' logits within tol of
 * op by op, and each argmax id the first largest of the graphs' logit row. */
#include "backend/backend.h"
#include "core/fileutil.h"
#include "engine/model_executor.h"
#include "model/arch.h"
#include "model/model.h"
#include "test.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ms_backend *B;
static ms_err E;
static char g_tmp[256];
static int g_gpu;
#define TOL_GPU 5e-2 /* bf16 activations against float32 (test_forward_cache's bound) */

enum { PS = 4, NPAGES = 32, MAXT = 64 };

/* relative max difference of two rows sets: max|a-b| / max(1, max|b|), per row, the worst row */
static double rel_diff(const float *a, const float *b, int rows, int cols) {
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        double md = 0, mb = 1;
        for (int c = 0; c < cols; c++) {
            double d = fabs((double)a[(size_t)r * cols + c] - b[(size_t)r * cols + c]);
            md = d > md ? d : md;
            double v = fabs((double)b[(size_t)r * cols + c]);
            mb = v > mb ? v : mb;
        }
        worst = md / mb > worst ? md / mb : worst;
    }
    return worst;
}

static ms_model *load(const char *dir, int mtp) {
    ms_load_opts o = {0};
    o.load_mtp = mtp;
    o.prefetch_threads = -1;
    ms_model *m = NULL;
    int rc = ms_model_load(dir, &o, &m, &E);
    if (rc) fprintf(stderr, "    load %s: %s\n", dir, E.msg);
    CHECK(rc == MS_OK);
    if (m) CHECK(ms_model_place(m, B, &E) == MS_OK);
    return m;
}

static ms_forward *fwd(ms_model *m, int mtp) {
    ms_forward_opts o = {0};
    o.max_tokens = MAXT;
    o.n_pages = NPAGES;
    o.page_size = PS;
    o.moe_runner = "auto";
    o.mtp = mtp;
    ms_forward *f = NULL;
    int rc = ms_forward_create(m, B, &o, &f, &E);
    if (rc) fprintf(stderr, "    forward: %s\n", E.msg);
    CHECK(rc == MS_OK);
    return f;
}

/* A batch of sequences: sequence s has its tokens tok[s][0..n[s]) at positions start[s].., pages
 * page0[s] + j (contiguous), logits for every token. */
typedef struct {
    int ns;
    const int32_t *tok[4];
    int start[4], n[4], page0[4];
} bspec;

typedef struct {
    ms_batch b;
    int32_t tok[MAXT], pos[MAXT], st[5], ctx[4], slot[MAXT], bt[4 * NPAGES], lidx[MAXT];
} bbuf;

static const ms_batch *mkbatch(bbuf *u, const bspec *s) {
    int t = 0, mb = 1;
    for (int i = 0; i < s->ns; i++) {
        int c = s->start[i] + s->n[i];
        mb = (c + PS - 1) / PS > mb ? (c + PS - 1) / PS : mb;
    }
    for (int i = 0; i < s->ns; i++) {
        u->st[i] = t;
        for (int j = 0; j < s->n[i]; j++, t++) {
            int p = s->start[i] + j;
            u->tok[t] = s->tok[i][j];
            u->pos[t] = p;
            u->slot[t] = (s->page0[i] + p / PS) * PS + p % PS;
            u->lidx[t] = t;
        }
        u->ctx[i] = s->start[i] + s->n[i];
        for (int j = 0; j < mb; j++) u->bt[i * mb + j] = s->page0[i] + j;
    }
    u->st[s->ns] = t;
    u->b = (ms_batch){t, s->ns, u->tok, u->pos, u->st, u->ctx, u->slot, u->bt, mb, PS, t, u->lidx};
    return &u->b;
}

static int32_t *read_ids(json_t *a, int *n) {
    *n = (int)json_array_size(a);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(*n + 1));
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return ids;
}

static float *read_f32(const char *path, size_t n) {
    float *p = malloc(n * sizeof(float) + 1);
    FILE *fp = fopen(path, "rb");
    size_t got = fp ? fread(p, sizeof(float), n, fp) : 0;
    if (fp) fclose(fp);
    CHECK_MSG(got == n, "%s: %zu of %zu floats", path, got, n);
    return p;
}

/* ------------------------------------------------------------------ against transformers */

static void fixture_check(const char *name) {
    char dir[256], path[320];
    snprintf(dir, sizeof dir, "tests/fixtures/%s_mtp", name);
    snprintf(path, sizeof path, "%s/ref.json", dir);
    if (access(path, R_OK) != 0) {
        printf("SKIP (fixture missing) %s: the transformers reference of the MTP forward is not generated yet; on the "
               "GPU machine run `python3 tools/make_fixtures.py tests/fixtures` and commit tests/fixtures/%s_mtp\n",
               path, name);
        return;
    }
    json_error_t je;
    json_t *ref = json_load_file(path, 0, &je);
    CHECK_MSG(ref != NULL, "%s: %s", path, je.text);
    if (!ref) return;
    json_t *mt = json_object_get(ref, "mtp");
    CHECK_MSG(mt != NULL, "%s has no \"mtp\" object", path);
    if (!mt) { json_decref(ref); return; }
    int S;
    int32_t *ids = read_ids(json_object_get(mt, "ids"), &S);
    const int n = (int)json_integer_value(json_object_get(mt, "n")); /* S - 1 positions */
    double tol = json_real_value(json_object_get(mt, "tol"));
    if (g_gpu && tol < TOL_GPU) tol = TOL_GPU;
    ms_model *m = load(dir, 1);
    if (!m) { free(ids); json_decref(ref); return; }
    const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    CHECK_EQ_INT(n, S - 1);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(mt, "hidden")), H);
    snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_object_get(mt, "hidden_file")));
    float *href = read_f32(path, (size_t)n * H);
    snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_object_get(mt, "logits_file")));
    float *lref = read_f32(path, (size_t)n * V);
    ms_forward *f = fwd(m, 1);
    float *lg = malloc(sizeof(float) * (size_t)S * V), *h = malloc(sizeof(float) * (size_t)S * H);
    int32_t hidx[MAXT];
    for (int i = 0; i < n; i++) hidx[i] = i;
    /* the main model over the sequence: its hidden rows against the reference's */
    bbuf u;
    bspec sm = {1, {ids}, {0}, {S}, {0}};
    CHECK(ms_forward_run(f, mkbatch(&u, &sm), lg, &E) == MS_OK);
    CHECK(ms_forward_get_hidden(f, h, n, &E) == MS_OK);
    double dh = rel_diff(h, href, n, H);
    /* On the GPU the main model of the DSA fixture crosses a near-tie at layer 0 (one expert and one
     * DSA key choice differ from the CPU's in gpu-check's free run of glm_moe_dsa_mtp, while its
     * replayed-choice run agrees within 7.6e-3), so its own hidden rows, and the MTP logits computed
     * from them, are not comparable there; the MTP layer itself is checked from the reference's hidden
     * rows below, and the main model by gpu-check with the CPU's choices replayed. */
    const int free_ok = !(g_gpu && m->cfg.index_topk > 0);
    printf("  %s: main hidden rows vs transformers: %.2e%s\n", name, dh, free_ok ? "" : " (not checked on the GPU)");
    if (free_ok) CHECK_MSG(dh < tol, "%s: hidden rows differ by %.3e (tol %.1e)", name, dh, tol);
    /* end to end: MTP over positions 0..S-2 with tokens 1..S-1 and our own hidden rows */
    bspec sd = {1, {ids + 1}, {0}, {n}, {0}};
    CHECK(ms_forward_mtp_run(f, mkbatch(&u, &sd), MS_MTP_HID_TARGET, hidx, lg, &E) == MS_OK);
    double d1 = rel_diff(lg, lref, n, V);
    /* from the reference hidden rows */
    CHECK(ms_forward_set_hidden(f, href, n, &E) == MS_OK);
    CHECK(ms_forward_mtp_run(f, mkbatch(&u, &sd), MS_MTP_HID_TARGET, hidx, lg, &E) == MS_OK);
    double d2 = rel_diff(lg, lref, n, V);
    printf("  %s: MTP logits vs transformers: %.2e end to end, %.2e from the reference hidden rows (tol %.1e)\n", name,
           d1, d2, tol);
    CHECK_MSG((d1 < tol || !free_ok) && d2 < tol, "%s: MTP logits differ: %.3e / %.3e (tol %.1e)", name, d1, d2, tol);
    ms_forward_free(f);
    ms_model_free(m);
    free(lg), free(h), free(href), free(lref), free(ids);
    json_decref(ref);
}

static void test_fixture_glm4_moe(void) { fixture_check("glm4_moe"); }
static void test_fixture_glm_moe_dsa(void) { fixture_check("glm_moe_dsa"); }

/* ------------------------------------------------------------------ cache logic (no torch) */

static int make_mtp_dir(const char *src, const char *dst, const char *extra) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 tools/add_mtp.py %s %s %s >/dev/null", src, dst, extra);
    int rc = system(cmd);
    CHECK_MSG(rc == 0, "%s failed", cmd);
    return rc == 0;
}

static void cache_check(const char *fixture, const char *extra) {
    char src[256], dst[300];
    snprintf(src, sizeof src, "tests/fixtures/%s", fixture);
    snprintf(dst, sizeof dst, "%s/%s%s", g_tmp, fixture, extra[0] ? "_nohead" : "");
    if (!make_mtp_dir(src, dst, extra)) return;
    ms_model *m = load(dst, 1), *m0 = load(src, 0);
    if (!m || !m0) { ms_model_free(m); ms_model_free(m0); return; }
    CHECK(m->mtp.loaded);
    CHECK_EQ_INT(m->mtp.ckpt_layer, m->cfg.num_layers);
    if (extra[0]) CHECK(m->mtp.head_shared && m->mtp.head.w.data == m->lm_head.w.data);
    else CHECK(!m->mtp.head_shared && m->mtp.head.w.data != m->lm_head.w.data);
    /* one more layer of KV per token */
    size_t kv1 = ms_forward_kv_bytes_per_token(m, B), kv0 = ms_forward_kv_bytes_per_token(m0, B);
    CHECK(kv1 > kv0 && kv1 - kv0 == m->cfg.arch->kv_bytes_per_token(&m->cfg, m->cfg.num_layers, sizeof(float), 1));
    const int V = m->cfg.vocab_size, S = 14, n = S - 1;
    int32_t ids[2][16];
    for (int i = 0; i < 16; i++) ids[0][i] = 3 + (i * 37) % (V - 3), ids[1][i] = 5 + (i * 53 + 11) % (V - 5);
    ms_forward *f = fwd(m, 1), *f0 = fwd(m0, 0);
    float *a = malloc(sizeof(float) * (size_t)MAXT * V), *b = malloc(sizeof(float) * (size_t)MAXT * V);
    float *c = malloc(sizeof(float) * (size_t)MAXT * V);
    bbuf u;
    int32_t hidx[MAXT];
    /* the main logits do not change with the MTP layer loaded */
    bspec sm = {1, {ids[0]}, {0}, {S}, {0}};
    CHECK(ms_forward_run(f0, mkbatch(&u, &sm), a, &E) == MS_OK);
    CHECK(ms_forward_run(f, mkbatch(&u, &sm), b, &E) == MS_OK);
    CHECK_MSG(rel_diff(b, a, S, V) == 0.0, "%s: main logits changed with the MTP layer on", fixture);
    /* one MTP step over positions 0..n-1 */
    for (int i = 0; i < n; i++) hidx[i] = i;
    bspec sd = {1, {ids[0] + 1}, {0}, {n}, {0}};
    CHECK(ms_forward_mtp_run(f, mkbatch(&u, &sd), MS_MTP_HID_TARGET, hidx, a, &E) == MS_OK);
    for (int i = 0; i < n * V; i++) CHECK_MSG(isfinite(a[i]), "%s: MTP logit %d is not finite", fixture, i);
    /* one token at a time through the MTP cache (pages 8..): the main step of each position is rerun
     * to make its hidden row the kept row 0 */
    for (int p = 0; p < n; p++) {
        bspec s1 = {1, {ids[0] + p}, {p}, {1}, {8}};
        if (p == 0) {
            bspec pre = {1, {ids[0]}, {0}, {1}, {8}};
            CHECK(ms_forward_run(f, mkbatch(&u, &pre), NULL, &E) == MS_OK);
        } else {
            CHECK(ms_forward_run(f, mkbatch(&u, &s1), NULL, &E) == MS_OK);
        }
        int32_t z = 0;
        bspec d1 = {1, {ids[0] + p + 1}, {p}, {1}, {8}};
        CHECK(ms_forward_mtp_run(f, mkbatch(&u, &d1), MS_MTP_HID_TARGET, &z, b + (size_t)p * V, &E) == MS_OK);
    }
    double dinc = rel_diff(b, a, n, V);
    CHECK_MSG(dinc < 1e-4, "%s: MTP token by token through its cache differs by %.3e", fixture, dinc);
    /* two chunks (pages 16..), hidden rows from one main step over the whole sequence */
    CHECK(ms_forward_run(f, mkbatch(&u, &sm), NULL, &E) == MS_OK);
    int k = 6;
    bspec c1 = {1, {ids[0] + 1}, {0}, {k}, {16}}, c2 = {1, {ids[0] + 1 + k}, {k}, {n - k}, {16}};
    CHECK(ms_forward_mtp_run(f, mkbatch(&u, &c1), MS_MTP_HID_TARGET, hidx, c, &E) == MS_OK);
    CHECK(ms_forward_mtp_run(f, mkbatch(&u, &c2), MS_MTP_HID_TARGET, hidx + k, c + (size_t)k * V, &E) == MS_OK);
    double dch = rel_diff(c, a, n, V);
    CHECK_MSG(dch < 1e-4, "%s: MTP in two chunks differs by %.3e", fixture, dch);
    /* two sequences batched (pages 0.. and 16..) equal each alone */
    bspec m2 = {2, {ids[0], ids[1]}, {0, 0}, {S, S}, {0, 16}};
    CHECK(ms_forward_run(f, mkbatch(&u, &m2), NULL, &E) == MS_OK);
    for (int i = 0; i < n; i++) hidx[i] = i, hidx[n + i] = S + i;
    bspec d2 = {2, {ids[0] + 1, ids[1] + 1}, {0, 0}, {n, n}, {0, 16}};
    CHECK(ms_forward_mtp_run(f, mkbatch(&u, &d2), MS_MTP_HID_TARGET, hidx, c, &E) == MS_OK);
    double db0 = rel_diff(c, a, n, V);
    bspec s2 = {1, {ids[1]}, {0}, {S}, {24}};
    CHECK(ms_forward_run(f, mkbatch(&u, &s2), NULL, &E) == MS_OK);
    bspec d3 = {1, {ids[1] + 1}, {0}, {n}, {24}};
    CHECK(ms_forward_mtp_run(f, mkbatch(&u, &d3), MS_MTP_HID_TARGET, hidx, b, &E) == MS_OK);
    double db1 = rel_diff(c + (size_t)n * V, b, n, V);
    CHECK_MSG(db0 < 1e-4 && db1 < 1e-4, "%s: batched MTP differs from alone: %.3e / %.3e", fixture, db0, db1);
    /* a chained draft step reads the MTP's own normed rows: position n-1's row feeds position n */
    for (int i = 0; i < n; i++) hidx[i] = i;
    CHECK(ms_forward_mtp_run(f, mkbatch(&u, &sd), MS_MTP_HID_TARGET, hidx, a, &E) == MS_OK);
    int32_t last = n - 1, nx = 7;
    bspec ch = {1, {&nx}, {n}, {1}, {0}};
    CHECK(ms_forward_mtp_run(f, mkbatch(&u, &ch), MS_MTP_HID_DRAFT, &last, b, &E) == MS_OK);
    for (int i = 0; i < V; i++) CHECK_MSG(isfinite(b[i]), "%s: chained draft logit %d is not finite", fixture, i);
    printf("  %s%s: MTP incremental %.2e, chunked %.2e, batched %.2e / %.2e\n", fixture, extra, dinc, dch, db0, db1);
    ms_forward_free(f);
    ms_forward_free(f0);
    ms_model_free(m);
    ms_model_free(m0);
    free(a), free(b), free(c);
}

static void test_cache_glm4_moe(void) { cache_check("glm4_moe", ""); }
static void test_cache_glm_moe_dsa(void) { cache_check("glm_moe_dsa", ""); }
static void test_cache_no_head(void) { cache_check("glm4_moe", "--no-head"); }

/* Through the executor: a main step over the sequence, then the MTP step over it, with tp ranks;
 * logits [n, V] of the draft step. */
static int exec_mtp(const char *dir, int tp, const int32_t *ids, int S, float *out, ms_err *err) {
    ms_exec_opts o = {0};
    o.model_path = dir;
    o.device = "cpu";
    o.max_total_tokens = NPAGES * PS;
    o.page_size = PS;
    o.max_batch_tokens = MAXT;
    o.tp = tp;
    o.dist_timeout_s = 30;
    o.speculative_num_steps = 3;
    ms_executor ex;
    MS_TRY(ms_model_executor_open(&o, &ex, NULL, err));
    int rc = ex.draft ? MS_OK : ms_errf(err, MS_ERR_RUNTIME, "executor has no draft step");
    float *lg = malloc(sizeof(float) * (size_t)S * ex.vocab);
    bbuf u;
    int32_t hidx[MAXT];
    for (int i = 0; i < S; i++) hidx[i] = i;
    bspec sm = {1, {ids}, {0}, {S}, {0}}, sd = {1, {ids + 1}, {0}, {S - 1}, {0}};
    if (!rc) rc = ex.forward(ex.ctx, mkbatch(&u, &sm), lg, err);
    if (!rc) rc = ex.draft(ex.ctx, mkbatch(&u, &sd), MS_MTP_HID_TARGET, hidx, out, err);
    /* a chained step from the draft layer's own row */
    int32_t last = S - 2, nx = 9;
    bspec ch = {1, {&nx}, {S - 1}, {1}, {0}};
    if (!rc) rc = ex.draft(ex.ctx, mkbatch(&u, &ch), MS_MTP_HID_DRAFT, &last, out + (size_t)(S - 1) * ex.vocab, err);
    free(lg);
    ms_model_executor_close(&ex);
    return rc;
}

static void test_tensor_parallel(void) {
    const char *fx[2] = {"glm4_moe", "glm_moe_dsa"};
    for (int k = 0; k < 2; k++) {
        char src[256], dst[300];
        snprintf(src, sizeof src, "tests/fixtures/%s", fx[k]);
        snprintf(dst, sizeof dst, "%s/%s_tp", g_tmp, fx[k]);
        if (!make_mtp_dir(src, dst, "")) return;
        const int V = 384, S = 12;
        int32_t ids[16];
        for (int i = 0; i < 16; i++) ids[i] = 3 + (i * 29) % (V - 3);
        float *a = malloc(sizeof(float) * (size_t)S * V), *b = malloc(sizeof(float) * (size_t)S * V);
        ms_err err = {0};
        int rc = exec_mtp(dst, 1, ids, S, a, &err);
        CHECK_MSG(rc == MS_OK, "%s tp 1: %s", fx[k], err.msg);
        for (int tp = 2; tp <= 2 && !rc; tp++) {
            rc = exec_mtp(dst, tp, ids, S, b, &err);
            CHECK_MSG(rc == MS_OK, "%s tp %d: %s", fx[k], tp, err.msg);
            double d = rc ? 1 : rel_diff(b, a, S, V);
            printf("  %s: MTP logits tp %d vs 1: %.2e\n", fx[k], tp, d);
            CHECK_MSG(d < 1e-4, "%s: MTP logits under tp %d differ by %.3e", fx[k], tp, d);
        }
        free(a), free(b);
    }
}

/* load_mtp on a checkpoint without an MTP layer names the tensor; num_nextn_predict_layers 0 names
 * the field; without load_mtp the MTP tensors are skipped */
static void test_load_errors(void) {
    ms_load_opts o = {0};
    o.load_mtp = 1;
    o.prefetch_threads = -1;
    ms_model *m = NULL;
    int rc = ms_model_load("tests/fixtures/glm4_moe", &o, &m, &E);
    CHECK(rc == MS_ERR_NOT_FOUND && !m);
    CHECK_MSG(strstr(E.msg, "model.layers.3.eh_proj.weight") != NULL, "message: %s", E.msg);
    char dst[300], cfgp[320];
    snprintf(dst, sizeof dst, "%s/nonextn", g_tmp);
    if (!make_mtp_dir("tests/fixtures/glm4_moe", dst, "")) return;
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dst);
    json_t *c = json_load_file(cfgp, 0, NULL);
    CHECK(c != NULL);
    if (!c) return;
    json_object_set_new(c, "num_nextn_predict_layers", json_integer(0));
    json_dump_file(c, cfgp, JSON_INDENT(1));
    json_decref(c);
    rc = ms_model_load(dst, &o, &m, &E);
    CHECK(rc == MS_ERR_INVALID && !m);
    CHECK_MSG(strstr(E.msg, "num_nextn_predict_layers") != NULL, "message: %s", E.msg);
    o.load_mtp = 0;
    rc = ms_model_load(dst, &o, &m, &E);
    CHECK(rc == MS_OK);
    if (m) CHECK(!m->mtp.loaded && m->stats.n_mtp_tensors_skipped > 0);
    ms_model_free(m);
}

/* GPU: the MTP logits of the add_mtp checkpoints against the CPU's, after a prefill step and after
 * a one-token decode step (recorded as a CUDA graph from its second run on) */
static void gpu_vs_cpu(const char *fixture) {
    char src[256], dst[300];
    snprintf(src, sizeof src, "tests/fixtures/%s", fixture);
    snprintf(dst, sizeof dst, "%s/%s_gpu", g_tmp, fixture);
    if (!make_mtp_dir(src, dst, "")) return;
    ms_backend *gb = B, *cb = NULL;
    CHECK(ms_backend_create("cpu", -1, &cb, &E) == MS_OK);
    ms_model *mg = load(dst, 1);
    B = cb;
    ms_model *mc = load(dst, 1);
    ms_forward *fc = mc ? fwd(mc, 1) : NULL;
    B = gb;
    ms_forward_opts o = {0};
    o.max_tokens = MAXT, o.n_pages = NPAGES, o.page_size = PS, o.moe_runner = "auto", o.mtp = 1, o.graphs = 1;
    ms_forward *fg = NULL;
    if (mg) CHECK(ms_forward_create(mg, B, &o, &fg, &E) == MS_OK);
    if (!fg || !fc) { ms_forward_free(fg); ms_forward_free(fc); ms_model_free(mg); ms_model_free(mc); ms_backend_destroy(cb); return; }
    /* the MTP step covers every prefilled position (0..S-1, as the engine runs it), so the decode
     * steps below find no unwritten position in the MTP layer's cache */
    /* S tokens of prefill: at most the DSA index_topk, so the MTP layer's own indexer keeps every key
     * in this step on both backends (its random weights put near-ties in the key ranking that bf16
     * and f32 order differently: 0.40 relative on the H200 at S = 12 with top-5); the decode steps
     * below go past it and select */
    const int topk = mg->cfg.index_topk > 0 ? mg->cfg.index_topk : 12;
    const int V = mg->cfg.vocab_size, S = topk < 12 ? topk : 12, n = S;
    int32_t ids[16], hidx[MAXT];
    for (int i = 0; i < 16; i++) ids[i] = 3 + (i * 41) % (V - 3);
    float *a = malloc(sizeof(float) * (size_t)MAXT * V), *b = malloc(sizeof(float) * (size_t)MAXT * V);
    bbuf u;
    for (int i = 0; i < n; i++) hidx[i] = i;
    bspec sm = {1, {ids}, {0}, {S}, {0}}, sd = {1, {ids + 1}, {0}, {n}, {0}};
    /* The MTP step of both backends reads the CPU's hidden rows: the main models may part at a routing
     * or key-selection near-tie (the DSA fixture does at layer 0), which gpu-check covers with the
     * CPU's choices replayed; this checks the MTP layer's own kernels. */
    float *hc = malloc(sizeof(float) * (size_t)MAXT * (size_t)mg->cfg.hidden_size);
    CHECK(ms_forward_run(fg, mkbatch(&u, &sm), NULL, &E) == MS_OK);
    CHECK(ms_forward_run(fc, mkbatch(&u, &sm), NULL, &E) == MS_OK);
    CHECK(ms_forward_get_hidden(fc, hc, n, &E) == MS_OK);
    CHECK(ms_forward_set_hidden(fg, hc, n, &E) == MS_OK);
    CHECK(ms_forward_mtp_run(fg, mkbatch(&u, &sd), MS_MTP_HID_TARGET, hidx, a, &E) == MS_OK);
    CHECK(ms_forward_mtp_run(fc, mkbatch(&u, &sd), MS_MTP_HID_TARGET, hidx, b, &E) == MS_OK);
    double d1 = rel_diff(a, b, n, V), d2 = 0;
    /* decode steps at positions S.. (graph-recorded on the GPU from the second on) then one MTP token */
    for (int p = S; p < S + 3; p++) {
        int32_t t = ids[p % 16], nx = ids[(p + 1) % 16], z = 0;
        bspec s1 = {1, {&t}, {p}, {1}, {0}}, d1s = {1, {&nx}, {p}, {1}, {0}};
        CHECK(ms_forward_run(fg, mkbatch(&u, &s1), NULL, &E) == MS_OK);
        CHECK(ms_forward_run(fc, mkbatch(&u, &s1), NULL, &E) == MS_OK);
        CHECK(ms_forward_get_hidden(fc, hc, 1, &E) == MS_OK);
        CHECK(ms_forward_set_hidden(fg, hc, 1, &E) == MS_OK);
        CHECK(ms_forward_mtp_run(fg, mkbatch(&u, &d1s), MS_MTP_HID_TARGET, &z, a, &E) == MS_OK);
        CHECK(ms_forward_mtp_run(fc, mkbatch(&u, &d1s), MS_MTP_HID_TARGET, &z, b, &E) == MS_OK);
        double d = rel_diff(a, b, 1, V);
        d2 = d > d2 ? d : d2;
    }
    printf("  %s: GPU vs CPU MTP logits: prefill %.2e, decode %.2e (tol %.0e)\n", fixture, d1, d2, TOL_GPU);
    CHECK_MSG(d1 < TOL_GPU && d2 < TOL_GPU, "%s: GPU MTP logits differ from the CPU's: %.3e / %.3e", fixture, d1, d2);
    free(a), free(b), free(hc);
    ms_forward_free(fg);
    ms_forward_free(fc);
    ms_model_free(mg);
    ms_model_free(mc);
    ms_backend_destroy(cb);
}

static void test_gpu_glm4_moe(void) { gpu_vs_cpu("glm4_moe"); }
static void test_gpu_glm_moe_dsa(void) { gpu_vs_cpu("glm_moe_dsa"); }

/* ------------------------------------------------------------------ speculative steps as graphs */

/* Two forwards of one checkpoint stepped in lockstep: [0] op by op (graphs off), [1] with graphs
 * (decode, verification of N + 1 tokens per sequence, chained MTP draft steps; recorded up front as
 * the executor does). The second takes the first's tokens (drafts, accepted and bonus tokens), so both
 * see the same inputs at every step even where a near-tie would part their own greedy choices. */
enum { SG_N = 3 };
typedef struct {
    ms_forward *f[3]; /* op by op, graphs, graphs taking the argmax forms (sg_ids) */
    float *lg[2];
    int V;
    double worst;            /* max over steps and rows of rel_diff(graphs, op by op) */
    int rows, argmax_same, near_ties, argmax_parted, fails;
    int ids_rows, ids_near, ids_bad; /* the graphs forward's argmax steps (sg_ids) */
    int32_t *ids;
} sg_run;

static int argmax_f(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* After a step on both forwards: compares their logit rows (n rows). A row's greedy token must agree
 * unless the op-by-op row's top-2 gap is within twice the rows' largest difference (a near-tie). */
static void sg_compare(sg_run *r, int n) {
    for (int i = 0; i < n; i++) {
        const float *a = r->lg[1] + (size_t)i * r->V, *b = r->lg[0] + (size_t)i * r->V;
        double d = rel_diff(a, b, 1, r->V), md = 0;
        r->worst = d > r->worst ? d : r->worst;
        for (int c = 0; c < r->V; c++) md = fabs((double)a[c] - b[c]) > md ? fabs((double)a[c] - b[c]) : md;
        const int ia = argmax_f(a, r->V), ib = argmax_f(b, r->V);
        double top1 = b[ib], top2 = -INFINITY;
        for (int c = 0; c < r->V; c++)
            if (c != ib && b[c] > top2) top2 = b[c];
        r->rows++;
        if (ia == ib) r->argmax_same++;
        else if (top1 - top2 <= 2 * md) r->near_ties++;
        else r->argmax_parted++;
    }
}

/* After a step, the same step on the third forward (graphs, as the second) through its argmax form (rc
 * = its status; a step cannot simply run again on one forward: a chained draft step overwrites the
 * hidden rows it reads): each id must be the first largest of the second forward's logit rows, which
 * took the same path; on the GPU a value within 1e-2 of it (relative) is counted apart. */
static int sg_ids(sg_run *r, int rc, int n) {
    if (rc != MS_OK) {
        fprintf(stderr, "    argmax step: %s\n", E.msg);
        r->fails++;
        return 0;
    }
    for (int i = 0; i < n; i++) {
        const float *row = r->lg[1] + (size_t)i * r->V;
        const int best = argmax_f(row, r->V), id = r->ids[i];
        r->ids_rows++;
        if (id == best) continue;
        const int near = g_gpu && id >= 0 && id < r->V && row[id] >= row[best] - 1e-2f * fmaxf(1.f, fabsf(row[best]));
        r->ids_near += near;
        r->ids_bad += !near;
    }
    return 1;
}

static int sg_main(sg_run *r, const ms_batch *b) {
    for (int k = 0; k < 2; k++)
        if (ms_forward_run(r->f[k], b, r->lg[k], &E) != MS_OK) {
            fprintf(stderr, "    main step (graphs %s): %s\n", k ? "on" : "off", E.msg);
            r->fails++;
            return 0;
        }
    sg_compare(r, b->n_logits);
    for (int i = 0; i < b->n_logits; i++) r->ids[i] = -1;
    return sg_ids(r, ms_forward_run_argmax(r->f[2], b, r->ids, &E), b->n_logits);
}

static int sg_mtp(sg_run *r, const ms_batch *b, int src, const int32_t *hidx) {
    for (int k = 0; k < 2; k++)
        if (ms_forward_mtp_run(r->f[k], b, src, hidx, r->lg[k], &E) != MS_OK) {
            fprintf(stderr, "    MTP step (graphs %s): %s\n", k ? "on" : "off", E.msg);
            r->fails++;
            return 0;
        }
    sg_compare(r, b->n_logits);
    for (int i = 0; i < b->n_logits; i++) r->ids[i] = -1;
    return sg_ids(r, ms_forward_mtp_run_argmax(r->f[2], b, src, hidx, r->ids, &E), b->n_logits);
}

/* logits on each sequence's last token only (as the engine asks for prefill and first draft steps) */
static const ms_batch *last_only(bbuf *u) {
    for (int i = 0; i < u->b.n_seqs; i++) u->lidx[i] = u->st[i + 1] - 1;
    u->b.n_logits = u->b.n_seqs;
    return &u->b;
}

/* ns sequences (pages page0[s].., contiguous) prefill p0 prompt tokens in chunks, then `rounds`
 * speculative rounds as the engine runs them: SG_N - 1 chained MTP draft steps (one token per
 * sequence, hidden rows of the last MTP step: draft graphs), the verification of the last committed
 * token and SG_N drafts (SG_N + 1 tokens per sequence, logits on all: verify graphs), the acceptance
 * (greedy, or a set number of drafts per round and sequence, so lengths vary), and the MTP step over the accepted positions (the next round's first draft; a graph,
 * hidden rows of the main step, when every sequence accepted nothing). Logits compared at every step
 * within tol (per row: max |graph - op by op| / max(1, max |op by op|)). */
static void spec_graphs_case(const char *name, const char *dir, int ns, const int *page0, int p0, int chunk, int rounds, double tol) {
    ms_model *m[3] = {load(dir, 1), load(dir, 1), load(dir, 1)};
    sg_run r = {{NULL, NULL, NULL}, {NULL, NULL}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL};
    for (int k = 0; k < 3 && m[k]; k++) {
        ms_forward_opts o = {0};
        o.max_tokens = MAXT, o.n_pages = NPAGES, o.page_size = PS, o.moe_runner = "auto", o.mtp = 1;
        o.graphs = k > 0, o.graph_verify_tokens = k ? SG_N + 1 : 0;
        int rc = ms_forward_create(m[k], B, &o, &r.f[k], &E);
        if (rc) fprintf(stderr, "    forward: %s\n", E.msg);
        CHECK(rc == MS_OK);
    }
    if (!r.f[0] || !r.f[1] || !r.f[2]) {
        for (int k = 0; k < 3; k++) ms_forward_free(r.f[k]), ms_model_free(m[k]);
        return;
    }
    const int V = r.V = m[0]->cfg.vocab_size;
    int nrec = 0, nrec2 = 0;
    CHECK(ms_forward_record_graphs(r.f[2], &nrec2, &E) == MS_OK);
    CHECK(ms_forward_record_graphs(r.f[1], &nrec, &E) == MS_OK);
    CHECK_EQ_INT(nrec2, nrec);
    ms_graph_counts g0, g1;
    ms_forward_graph_counts(r.f[1], &g1);
    if (g_gpu) {
        /* MAXT 64 tokens: decode buckets 1..64 (10), verification of 4 tokens 1..16 sequences (6),
         * chained draft steps 1..64 (10) */
        CHECK_MSG(g1.recorded[MS_GRAPH_DECODE] == 10 && g1.recorded[MS_GRAPH_VERIFY] == 6 && g1.recorded[MS_GRAPH_DRAFT] == 10,
                  "recorded at start: %d decode, %d verify, %d draft (want 10, 6, 10)", g1.recorded[MS_GRAPH_DECODE],
                  g1.recorded[MS_GRAPH_VERIFY], g1.recorded[MS_GRAPH_DRAFT]);
        CHECK_EQ_INT(nrec, 26);
    } else {
        CHECK_EQ_INT(nrec, 0);
    }
    for (int k = 0; k < 2; k++) r.lg[k] = malloc(sizeof(float) * (size_t)MAXT * V);
    r.ids = malloc(sizeof(int32_t) * MAXT);
    int32_t seq[4][NPAGES * PS + 8], L[4], d[4][SG_N], acc[4];
    for (int s = 0; s < ns; s++)
        for (int i = 0; i < p0; i++) seq[s][i] = 3 + (i * (31 + 6 * s) + 7 * s) % (V - 3);
    bbuf u;
    int32_t hidx[MAXT];
    int ok = 1;
    /* prefill: each chunk's main step, then the MTP step over the same positions (token p + 1 with the
     * main step's row of position p; the last chunk's next token is the first generated one) */
    for (int c0 = 0; c0 < p0 && ok; c0 += chunk) {
        const int n = p0 - c0 < chunk ? p0 - c0 : chunk;
        bspec sm = {ns, {0}, {0}, {0}, {0}};
        for (int s = 0; s < ns; s++) sm.tok[s] = seq[s] + c0, sm.start[s] = c0, sm.n[s] = n, sm.page0[s] = page0[s];
        mkbatch(&u, &sm);
        if (!(ok = sg_main(&r, last_only(&u)))) break;
        if (c0 + n == p0)
            for (int s = 0; s < ns; s++) seq[s][p0] = argmax_f(r.lg[0] + (size_t)s * V, V), L[s] = p0 + 1;
        for (int s = 0; s < ns; s++) sm.tok[s] = seq[s] + c0 + 1;
        for (int t = 0; t < ns * n; t++) hidx[t] = t;
        mkbatch(&u, &sm);
        if (!(ok = sg_mtp(&r, last_only(&u), MS_MTP_HID_TARGET, hidx))) break;
        if (c0 + n == p0)
            for (int s = 0; s < ns; s++) d[s][0] = argmax_f(r.lg[0] + (size_t)s * V, V);
    }
    /* the start-up graphs still hold unless the prefill's op-by-op steps grew a backend buffer (then
     * each records again on its second use, as in serving) */
    ms_graph_counts gp;
    ms_forward_graph_counts(r.f[1], &gp);
    const int kept = gp.recorded[MS_GRAPH_VERIFY] == g1.recorded[MS_GRAPH_VERIFY] &&
                     gp.recorded[MS_GRAPH_DRAFT] == g1.recorded[MS_GRAPH_DRAFT];
    int n_verify = 0, n_chained = 0, n_accepted = 0;
    for (int it = 0; it < rounds && ok; it++) {
        /* chained draft steps: draft j at position L - 2 + j from draft j - 1 and the MTP's own row */
        for (int j = 1; j < SG_N && ok; j++) {
            bspec sd = {ns, {0}, {0}, {0}, {0}};
            for (int s = 0; s < ns; s++)
                sd.tok[s] = &d[s][j - 1], sd.start[s] = L[s] - 2 + j, sd.n[s] = 1, sd.page0[s] = page0[s], hidx[s] = s;
            if (!(ok = sg_mtp(&r, mkbatch(&u, &sd), MS_MTP_HID_DRAFT, hidx))) break;
            for (int s = 0; s < ns; s++) d[s][j] = argmax_f(r.lg[0] + (size_t)s * V, V);
            n_chained++;
        }
        if (!ok) break;
        /* verification: the last committed token and the drafts, logits on all */
        int32_t vt[4][SG_N + 1];
        bspec sv = {ns, {0}, {0}, {0}, {0}};
        for (int s = 0; s < ns; s++) {
            vt[s][0] = seq[s][L[s] - 1];
            memcpy(vt[s] + 1, d[s], sizeof d[s]);
            sv.tok[s] = vt[s], sv.start[s] = L[s] - 1, sv.n[s] = SG_N + 1, sv.page0[s] = page0[s];
        }
        if (!(ok = sg_main(&r, mkbatch(&u, &sv)))) break;
        n_verify++;
        int lold[4];
        for (int s = 0; s < ns; s++) {
            const float *row = r.lg[0] + (size_t)s * (SG_N + 1) * V;
            int a = 0, forced = (it + s) % (SG_N + 1);
            while (a < SG_N && argmax_f(row + (size_t)a * V, V) == d[s][a]) a++;
            /* random MTP weights rarely draft the target's token: take `forced` drafts anyway (a valid
             * sequence all the same: their K/V were written by this step), so acceptance lengths vary */
            a = a > forced ? a : forced;
            for (int i = 0; i < a; i++) seq[s][L[s] + i] = d[s][i];
            seq[s][L[s] + a] = argmax_f(row + (size_t)a * V, V);
            acc[s] = a, lold[s] = L[s], L[s] += a + 1;
            n_accepted += a;
        }
        /* the next round's first draft: the MTP step over the kept positions lold - 1 .. lold - 1 + a */
        bspec sf = {ns, {0}, {0}, {0}, {0}};
        int t = 0;
        for (int s = 0; s < ns; s++) {
            sf.tok[s] = seq[s] + lold[s], sf.start[s] = lold[s] - 1, sf.n[s] = acc[s] + 1, sf.page0[s] = page0[s];
            for (int j = 0; j <= acc[s]; j++) hidx[t++] = s * (SG_N + 1) + j;
        }
        mkbatch(&u, &sf);
        if (!(ok = sg_mtp(&r, last_only(&u), MS_MTP_HID_TARGET, hidx))) break;
        for (int s = 0; s < ns; s++) d[s][0] = argmax_f(r.lg[0] + (size_t)s * V, V);
    }
    ms_forward_graph_counts(r.f[0], &g0);
    ms_forward_graph_counts(r.f[1], &g1);
    printf("  %s, %d sequence%s: %d verifications (%d drafts accepted), %d chained draft steps; graphs vs op by op: "
           "max rel diff %.3e over %d rows (tol %.0e), greedy same %d, near-ties %d, parted %d; graph launches: %llu "
           "decode, %llu verify, %llu draft\n",
           name, ns, ns > 1 ? "s" : "", n_verify, n_accepted, n_chained, r.worst, r.rows, tol, r.argmax_same, r.near_ties,
           r.argmax_parted, (unsigned long long)g1.launches[MS_GRAPH_DECODE],
           (unsigned long long)g1.launches[MS_GRAPH_VERIFY], (unsigned long long)g1.launches[MS_GRAPH_DRAFT]);
    CHECK(ok && r.fails == 0);
    CHECK_EQ_INT(n_verify, rounds);
    CHECK_MSG(r.worst <= tol, "%s: graph logits differ from op by op by %.3e (tol %.0e)", name, r.worst, tol);
    CHECK_MSG(r.argmax_parted == 0, "%s: %d greedy tokens differ with a clear top-2 gap", name, r.argmax_parted);
    printf("  %s, %d sequence%s: argmax steps %d rows, %d near-equal ids, %d wrong\n", name, ns, ns > 1 ? "s" : "", r.ids_rows,
           r.ids_near, r.ids_bad);
    CHECK(r.ids_rows > 0);
    CHECK_MSG(r.ids_bad == 0, "%s: %d argmax ids are not their row's largest", name, r.ids_bad);
    for (int k = 0; k < MS_GRAPH_KINDS; k++) CHECK_EQ_INT((int)g0.launches[k], 0);
    if (g_gpu) {
        /* every verification and chained draft step replayed a graph recorded at start (contexts stay
         * in the first block-table class; all but the first of each shape if the prefill outdated
         * them); first drafts of one token per sequence add to draft */
        if (!kept) printf("  (the prefill outdated the start-up graphs: they recorded again on second use)\n");
        CHECK_MSG((int)g1.launches[MS_GRAPH_VERIFY] >= rounds - (kept ? 0 : 1), "verify graph launches %llu of %d",
                  (unsigned long long)g1.launches[MS_GRAPH_VERIFY], rounds);
        CHECK_MSG((int)g1.launches[MS_GRAPH_DRAFT] >= n_chained - (kept ? 0 : 1), "draft graph launches %llu < chained steps %d",
                  (unsigned long long)g1.launches[MS_GRAPH_DRAFT], n_chained);
        CHECK_EQ_INT((int)g1.launches[MS_GRAPH_DECODE], 0);
    } else {
        for (int k = 0; k < MS_GRAPH_KINDS; k++) CHECK_EQ_INT((int)g1.launches[k], 0);
    }
    for (int k = 0; k < 2; k++) free(r.lg[k]);
    for (int k = 0; k < 3; k++) ms_forward_free(r.f[k]), ms_model_free(m[k]);
    free(r.ids);
}

/* On the GPU the comparison shows the graphs replay the op-by-op kernels: one sequence (no padding:
 * the same token counts as op by op) with contexts of 97..128 tokens, where the op-by-op attention
 * sized for the longest context takes the same key tiles and splits as the graph sized for its
 * 32-page class (128 tokens), within 1e-3; three sequences (padded to 4, so other token counts and
 * kernels) within test_forward_cache's graph-vs-op-by-op bound 1e-2. On the CPU (no graphs) both
 * forwards run op by op: equal, and no graph counted. */
static void spec_graphs(const char *fixture) {
    char src[256], dst[300];
    snprintf(src, sizeof src, "tests/fixtures/%s", fixture);
    snprintf(dst, sizeof dst, "%s/%s_sg", g_tmp, fixture);
    if (!make_mtp_dir(src, dst, "")) return;
    const int one[1] = {0}, three[3] = {0, 10, 20};
    spec_graphs_case(fixture, dst, 1, one, 96, 48, 6, g_gpu ? 1e-3 : 0);
    spec_graphs_case(fixture, dst, 3, three, 16, 16, 5, g_gpu ? 1e-2 : 0);
}

static void test_spec_graphs_glm4_moe(void) { spec_graphs("glm4_moe"); }
static void test_spec_graphs_glm_moe_dsa(void) { spec_graphs("glm_moe_dsa"); }

int main(int argc, char **argv) {
    g_gpu = argc > 1 && !strcmp(argv[1], "cuda");
    if (g_gpu) {
        if (ms_backend_create("cuda", 0, &B, &E) != MS_OK) {
            printf("SKIP (no GPU): %s\n## tests/model/test_mtp.c (cuda): 0 passed, 0 failed\n", E.msg);
            return 0;
        }
    } else {
        CHECK(ms_backend_create("cpu", -1, &B, &E) == MS_OK);
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/ms_test_mtp_%d", (int)getpid());
    char cmd[320];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", g_tmp);
    CHECK(system(cmd) == 0);
    if (g_gpu) {
        RUN(test_gpu_glm4_moe);
        RUN(test_gpu_glm_moe_dsa);
    } else {
        RUN(test_load_errors);
        RUN(test_cache_glm4_moe);
        RUN(test_cache_glm_moe_dsa);
        RUN(test_cache_no_head);
        RUN(test_tensor_parallel);
    }
    RUN(test_spec_graphs_glm4_moe);
    RUN(test_spec_graphs_glm_moe_dsa);
    RUN(test_fixture_glm4_moe);
    RUN(test_fixture_glm_moe_dsa);
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    ms_backend_destroy(B);
    return TEST_SUMMARY();
}
