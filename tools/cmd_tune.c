/* cmd_tune.c - `moeserve tune [--model CONFIG] [--dummy-quant nvfp4] [--tokens 1,2,4,...]
 * [--out-dir configs/tuned] [--reps 20]`
 *
 * The MoE `auto` policy runs the decode-specialised runner up to some token count and the grouped
 * GEMM runner above it. Where they cross depends on the GPU, so this measures both runners on one
 * MoE layer of the model's real shapes (dummy weights, generated on the device) for each token
 * count and writes the crossover to <out-dir>/<gpu-name>.json, which the executor applies at start
 * when the GPU matches (src/moe/tuned.c). The crossover is the largest measured token count up to
 * which decode is never slower than grouped. */
#include "common/args.h"
#include "common/model_args.h"
#include "core/dtype.h"
#include "core/fileutil.h"
#include "core/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TUNE_MAX 16

/* Times runner r on n_tok tokens routed at random (distinct experts per token); mean microseconds
 * per call over reps after one untimed call. */
static int time_runner(ms_backend *b, const ms_moe_runner *r, const ms_experts *e, const ms_moe_shape *s, int n_tok,
                       int reps, double *us, ms_err *err) {
    const int H = s->hidden, k = s->topk;
    ms_tensor x = {0}, out = {0}, ids = {0}, w = {0}, ws = {0};
    int64_t sx[2] = {n_tok, H}, si[2] = {n_tok, k};
    ms_moe_shape sh = *s;
    sh.n_tokens = n_tok;
    size_t wsb = r->workspace_size(b, &sh);
    int64_t sw[1] = {(int64_t)(wsb ? wsb : 64)};
    uint16_t *hx = malloc(sizeof(uint16_t) * (size_t)n_tok * H);
    int32_t *hi = malloc(sizeof(int32_t) * (size_t)n_tok * k);
    float *hw = malloc(sizeof(float) * (size_t)n_tok * k);
    int rc = MS_OK;
    if (!hx || !hi || !hw) rc = ms_errf(err, MS_ERR_NOMEM, "tune: out of memory");
    uint64_t st = 0x1234567ull + (uint64_t)n_tok;
    for (int64_t i = 0; !rc && i < (int64_t)n_tok * H; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        hx[i] = ms_f32_to_bf16(((float)(st >> 40) / 16777216.0f) * 2.f - 1.f);
    }
    for (int t = 0; !rc && t < n_tok; t++)
        for (int j = 0; j < k; j++) {
            int id, dup;
            do {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                id = (int)((st >> 33) % (uint64_t)s->n_experts);
                dup = 0;
                for (int q = 0; q < j; q++) dup |= hi[t * k + q] == id;
            } while (dup);
            hi[t * k + j] = id;
            hw[t * k + j] = 1.0f / k;
        }
    if (!rc) rc = ms_backend_alloc(b, &x, b->act_dtype, 2, sx, err);
    if (!rc) rc = ms_backend_alloc(b, &out, b->act_dtype, 2, sx, err);
    if (!rc) rc = ms_backend_alloc(b, &ids, MS_I32, 2, si, err);
    if (!rc) rc = ms_backend_alloc(b, &w, MS_F32, 2, si, err);
    if (!rc) rc = ms_backend_alloc(b, &ws, MS_U8, 1, sw, err);
    if (!rc && b->act_dtype != MS_BF16) rc = ms_errf(err, MS_ERR_UNSUPPORTED, "tune: needs a GPU backend (bf16 activations)");
    if (!rc) rc = b->ops->upload(b, x.data, hx, sizeof(uint16_t) * (size_t)n_tok * H, err);
    if (!rc) rc = b->ops->upload(b, ids.data, hi, sizeof(int32_t) * (size_t)n_tok * k, err);
    if (!rc) rc = b->ops->upload(b, w.data, hw, sizeof(float) * (size_t)n_tok * k, err);
    if (!rc) rc = r->run(b, e, &x, ids.data, w.data, k, &out, ws.data, wsb, err);
    if (!rc) rc = b->ops->sync(b, err);
    double t0 = ms_now();
    for (int i = 0; !rc && i < reps; i++) rc = r->run(b, e, &x, ids.data, w.data, k, &out, ws.data, wsb, err);
    if (!rc) rc = b->ops->sync(b, err);
    if (!rc) *us = (ms_now() - t0) / reps * 1e6;
    ms_tensor *all[] = {&x, &out, &ids, &w, &ws};
    for (int i = 0; i < 5; i++)
        if (all[i]->data) b->ops->free(b, all[i]);
    free(hx);
    free(hi);
    free(hw);
    return rc;
}

static const ms_opt tune_opts[] = {
    {"model", NULL, MS_OPT_VALUE, "CONFIG", "config.json whose expert shapes are tuned [configs/glm-4.5-air.json]"},
    {"dummy-quant", NULL, MS_OPT_VALUE, "nvfp4|fp8|bf16", "weight format [nvfp4]"},
    {"tokens", NULL, MS_OPT_VALUE, "1,2,4,..", "token counts to tune for [1,2,4,8,16,32,64,128,256]"},
    {"out-dir", NULL, MS_OPT_VALUE, "DIR", "where the tuned configs go [configs/tuned]"},
    {"reps", NULL, MS_OPT_VALUE, "N", "timed repetitions per candidate [20]"},
    {"device-index", NULL, MS_OPT_VALUE, "I", "GPU [0]"},
    MS_OPT_END,
};

static const ms_cmd tune_cmd = {
    "tune", "[--model CONFIG] [--dummy-quant nvfp4|fp8|bf16] [--tokens 1,2,4,...] [flags]",
    "Measures the MoE kernels' launch configurations on the GPU at hand and stores the fastest.",
    {tune_opts, NULL},
};

int cmd_tune(int argc, char **argv) {
    ms_args a;
    int prc = ms_args_parse(&a, &tune_cmd, argc, argv);
    if (prc) return ms_args_exit(prc);
    if (!getenv("MS_LOG")) ms_log_set_level(MS_LOG_WARN);
    int bad = 0, rc = 1;
    const char *model = ms_args_str(&a, "model", "configs/glm-4.5-air.json");
    const char *quant = ms_args_str(&a, "dummy-quant", "nvfp4");
    const char *toks = ms_args_str(&a, "tokens", "1,2,4,8,16,32,64,128,256");
    const char *out_dir = ms_args_str(&a, "out-dir", "configs/tuned");
    long long reps = ms_args_int(&a, "reps", 20, &bad), dev = ms_args_int(&a, "device-index", 0, &bad);
    ms_executor ex = {0};
    rc = 2; /* a flag at fault until the model loads */
    if (bad) goto done;
    if (reps < 1 || reps > 10000) {
        fprintf(stderr, "moeserve tune: flag --reps: %lld is out of range (1..10000)\n", reps);
        goto done;
    }
    int tokens[TUNE_MAX], nt = 0, maxt = 1;
    for (const char *p = toks; *p && nt < TUNE_MAX;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 65536 || (*end && *end != ',')) {
            fprintf(stderr, "moeserve tune: flag --tokens: expected a comma-separated list of 1..65536\n");
            goto done;
        }
        tokens[nt++] = (int)v;
        maxt = v > maxt ? (int)v : maxt;
        p = *end ? end + 1 : end;
    }
    /* two layers: enough for one MoE layer whatever first_k_dense_replace is (1 for GLM-4.5, 3 for
     * GLM-5: then 4 layers) */
    const char *ov[2] = {"num_hidden_layers=2", NULL};
    if (strstr(model, "glm-5") || strstr(model, "glm5")) ov[0] = "num_hidden_layers=4";
    rc = 1;
    ms_exec_opts o = {0};
    o.model_path = model;
    o.device = "cuda";
    o.device_index = (int)dev;
    o.load_format = "dummy";
    o.dummy_quant = quant;
    o.overrides = ov;
    o.n_overrides = 1;
    o.max_total_tokens = 256;
    o.max_batch_tokens = maxt;
    ms_err err = {0};
    ms_model *m = NULL;
    if (ms_model_executor_open(&o, &ex, &m, &err)) {
        fprintf(stderr, "moeserve tune: %s\n", err.msg);
        goto done;
    }
    ms_backend *b = ms_model_executor_backend(&ex);
    const ms_layer *ly = NULL;
    for (int L = 0; L < m->cfg.num_layers && !ly; L++)
        if (m->layers[L].is_moe && m->layers[L].experts.n > 0) ly = &m->layers[L];
    if (!ly) {
        fprintf(stderr, "moeserve tune: model %s has no MoE layer in its first %d layers\n", model, m->cfg.num_layers);
        goto done;
    }
    ms_moe_shape s = {1, m->cfg.hidden_size, m->cfg.moe_intermediate_size, m->cfg.n_routed_experts,
                      m->cfg.num_experts_per_tok, ly->experts.gate[0].fmt, ly->experts.gate[0].w.dtype};
    const ms_moe_runner *rd = NULL, *rg = NULL;
    if (ms_moe_resolve(b, "decode", &s, &rd, &err) || ms_moe_resolve(b, "grouped", &s, &rg, &err)) {
        fprintf(stderr, "moeserve tune: %s\n", err.msg);
        goto done;
    }
    double td[TUNE_MAX], tg[TUNE_MAX];
    int cross = 0, broken = 0;
    printf("%s, %s experts [%d x %d], top-%d of %d\n", b->gpu.name, quant, s.inter, s.hidden, s.topk, s.n_experts);
    printf("tokens   decode us   grouped us\n");
    for (int i = 0; i < nt; i++) {
        if (time_runner(b, rd, &ly->experts, &s, tokens[i], (int)reps, &td[i], &err) ||
            time_runner(b, rg, &ly->experts, &s, tokens[i], (int)reps, &tg[i], &err)) {
            fprintf(stderr, "moeserve tune: %d tokens: %s\n", tokens[i], err.msg);
            goto done;
        }
        printf("%6d %11.1f %12.1f\n", tokens[i], td[i], tg[i]);
        if (!broken && td[i] <= tg[i]) cross = tokens[i] > cross ? tokens[i] : cross;
        else broken = 1;
    }
    if (mkdir(out_dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "moeserve tune: flag --out-dir: cannot create %s: %s\n", out_dir, strerror(errno));
        goto done;
    }
    char base[160], path[1200];
    ms_moe_tuned_file_name(b->gpu.name, base, sizeof base);
    snprintf(path, sizeof path, "%s/%s.json", out_dir, base);
    FILE *fp = fopen(path, "w");
    if (!fp) {
        fprintf(stderr, "moeserve tune: cannot write %s: %s\n", path, strerror(errno));
        goto done;
    }
    fprintf(fp, "{\n  \"gpu\": \"%s\",\n  \"compute_capability\": \"%d.%d\",\n  \"moe_decode_max_tokens\": %d,\n",
            b->gpu.name, b->gpu.cc_major, b->gpu.cc_minor, cross);
    fprintf(fp, "  \"measured_on\": {\"model\": \"%s\", \"experts\": \"%s\", \"hidden\": %d, \"inter\": %d, \"topk\": %d, "
                "\"n_experts\": %d},\n  \"us_per_call\": [",
            model, quant, s.hidden, s.inter, s.topk, s.n_experts);
    for (int i = 0; i < nt; i++)
        fprintf(fp, "%s\n    {\"tokens\": %d, \"decode\": %.2f, \"grouped\": %.2f}", i ? "," : "", tokens[i], td[i], tg[i]);
    fprintf(fp, "\n  ]\n}\n");
    if (fclose(fp)) {
        fprintf(stderr, "moeserve tune: writing %s failed\n", path);
        goto done;
    }
    printf("decode runner up to %d tokens; wrote %s\n", cross, path);
    rc = 0;
done:
    ms_model_executor_close(&ex);
    ms_args_free(&a);
    return rc;
}
