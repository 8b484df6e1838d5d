/* cmd_tune.c - `moeserve tune [--model CONFIG] [--dummy-quant nvfp4] [--tokens 1,2,4,...]
 * [--out-dir configs/tuned] [--reps 20] [--forms-only]`
 *
 * The MoE `auto` policy runs the decode-specialised runner up to some token count and the grouped
 * GEMM runner above it. Where they cross depends on the GPU, so this measures both runners on one
 * MoE layer of the model's real shapes (dummy weights, generated on the device) for each token
 * count and writes the crossover to <out-dir>/<gpu-name>.json, which the executor applies at start
 * when the GPU matches (src/moe/tuned.c). The crossover is the largest measured token count up to
 * which decode is never slower than grouped.
 *
 * With CUDA it also times every launch form of the fused one-token MoE kernel at the layer's shape
 * (MS_CU_MOE_FUSED=2+f forces form f; the kernel's per-form launch counters confirm it ran) and
 * records the fastest under "moe_fused_forms", keyed by hidden, intermediate size and slots. The file
 * keeps the forms of other shapes from earlier runs, so one file serves several models; --forms-only
 * measures the forms alone and leaves the crossover of the earlier run in place.
 *
 * Each timed call routes the token(s) to one of TUNE_SETS random expert sets in turn: the same experts
 * every call would stay partly in L2 (one Air layer's 9 experts are 88 MB, the H200's L2 50 MB) and
 * time a read rate a decode step does not get. */
#include "common/args.h"
#include "common/model_args.h"
#include "core/dtype.h"
#include "core/fileutil.h"
#include "core/log.h"
#ifdef MS_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TUNE_MAX 16
#define TUNE_SETS 16   /* routings cycled through by the timed calls */
#define TUNE_FORMS 16  /* fused-kernel forms measured at most */
#define TUNE_ROUNDS 5  /* the forms are timed in turn this many times; each form's best round counts */

/* Times runner r on n_tok tokens routed at random (distinct experts per token, TUNE_SETS routings
 * used in turn); mean microseconds per call over reps after one untimed call. s: the layer's shape
 * (n_experts counts e's experts, topk the routed ones a token gets); e->shared_last adds the shared
 * expert, expert n_experts - 1, to every token as the forward's folded calls do. */
static int time_runner(ms_backend *b, const ms_moe_runner *r, const ms_experts *e, const ms_moe_shape *s, int n_tok,
                       int reps, double *us, ms_err *err) {
    const int H = s->hidden, k = s->topk, routed = s->n_experts - (e->shared_last ? 1 : 0);
    ms_tensor x = {0}, out = {0}, ids = {0}, w = {0}, ws = {0};
    const int64_t nk = (int64_t)n_tok * k;
    int64_t sx[2] = {n_tok, H}, si[2] = {TUNE_SETS * (int64_t)n_tok, k};
    ms_moe_shape sh = *s; /* with a folded shared expert the workspace counts it as one more per token */
    sh.n_tokens = n_tok;
    sh.topk += e->shared_last ? 1 : 0;
    size_t wsb = r->workspace_size(b, &sh);
    int64_t sw[1] = {(int64_t)(wsb ? wsb : 64)};
    uint16_t *hx = malloc(sizeof(uint16_t) * (size_t)n_tok * H);
    int32_t *hi = malloc(sizeof(int32_t) * (size_t)(TUNE_SETS * nk));
    float *hw = malloc(sizeof(float) * (size_t)(TUNE_SETS * nk));
    int rc = MS_OK;
    if (!hx || !hi || !hw) rc = ms_errf(err, MS_ERR_NOMEM, "tune: out of memory");
    uint64_t st = 0x1234567ull + (uint64_t)n_tok;
    for (int64_t i = 0; !rc && i < (int64_t)n_tok * H; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        hx[i] = ms_f32_to_bf16(((float)(st >> 40) / 16777216.0f) * 2.f - 1.f);
    }
    for (int t = 0; !rc && t < TUNE_SETS * n_tok; t++)
        for (int j = 0; j < k; j++) {
            int id, dup;
            do {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                id = (int)((st >> 33) % (uint64_t)routed);
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
    if (!rc) rc = b->ops->upload(b, ids.data, hi, sizeof(int32_t) * (size_t)(TUNE_SETS * nk), err);
    if (!rc) rc = b->ops->upload(b, w.data, hw, sizeof(float) * (size_t)(TUNE_SETS * nk), err);
    if (!rc) rc = r->run(b, e, &x, ids.data, w.data, k, &out, ws.data, wsb, err);
    if (!rc) rc = b->ops->sync(b, err);
    double t0 = ms_now();
    for (int i = 0; !rc && i < reps; i++) {
        const int64_t o = (i % TUNE_SETS) * nk;
        rc = r->run(b, e, &x, (const int32_t *)ids.data + o, (const float *)w.data + o, k, &out, ws.data, wsb, err);
    }
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

#ifdef MS_HAVE_CUDA
/* Times each form of the fused one-token kernel (moe_fused.cu) on the decode runner at one token,
 * TUNE_ROUNDS times in turn (each form's best round counts), and the cost model's own choice. *rec
 * gets the fastest form for the shape; us[f] its time or -1 for a form that did not launch (does not
 * fit the GPU). Returns MS_OK with rec->groups = 0 when the kernel does not take the shape. */
static int tune_forms(ms_backend *b, const ms_moe_runner *rd, const ms_experts *e, const ms_moe_shape *s, int reps,
                      ms_moe_form *rec, double *us, int *n_forms, double *us_model, int *model_form, ms_err *err) {
    const char *old = getenv("MS_CU_MOE_FUSED");
    char *saved = old ? strdup(old) : NULL;
    int nf = 0, g, d, rc = MS_OK;
    if (old && !saved) return ms_errf(err, MS_ERR_NOMEM, "tune: out of memory");
    while (nf < TUNE_FORMS && ms_cuda_moe_fused_form(nf, &g, &d)) us[nf++] = -1;
    *n_forms = nf, *us_model = -1, *model_form = -1;
    memset(rec, 0, sizeof *rec);
    rec->hidden = s->hidden, rec->inter = s->inter, rec->slots = s->topk + (e->shared_last ? 1 : 0);
    ms_moe_set_fused_form(&(ms_moe_form){rec->hidden, rec->inter, rec->slots, 0, 0}); /* no earlier tuning */
    for (int round = 0; round < TUNE_ROUNDS && !rc; round++)
        for (int f = -1; f < nf && !rc; f++) {
            char v[16];
            snprintf(v, sizeof v, "%d", f < 0 ? 1 : f + 2);
            setenv("MS_CU_MOE_FUSED", v, 1);
            long long n0[TUNE_FORMS], n1 = ms_cuda_moe_fused_launches();
            for (int q = 0; q < nf; q++) n0[q] = ms_cuda_moe_fused_form_launches(q);
            double t = 0;
            rc = time_runner(b, rd, e, s, 1, reps, &t, err);
            /* every call (reps + the untimed first) in the form asked for, else it does not fit */
            if (rc || ms_cuda_moe_fused_launches() - n1 != reps + 1) continue;
            int ran = -1;
            for (int q = 0; q < nf; q++)
                if (ms_cuda_moe_fused_form_launches(q) - n0[q] == reps + 1) ran = q;
            double *slot = f < 0 ? us_model : &us[f];
            if ((f < 0 || ran == f) && (*slot < 0 || t < *slot)) *slot = t;
            if (f < 0) *model_form = ran;
        }
    if (saved) setenv("MS_CU_MOE_FUSED", saved, 1);
    else unsetenv("MS_CU_MOE_FUSED");
    free(saved);
    int best = -1;
    for (int f = 0; f < nf && !rc; f++)
        if (us[f] >= 0 && (best < 0 || us[f] < us[best])) best = f;
    if (best >= 0) ms_cuda_moe_fused_form(best, &rec->groups, &rec->depth);
    return rc;
}
#endif

static const ms_opt tune_opts[] = {
    {"model", NULL, MS_OPT_VALUE, "CONFIG", "config.json whose expert shapes are tuned [configs/glm-4.5-air.json]"},
    {"dummy-quant", NULL, MS_OPT_VALUE, "nvfp4|fp8|bf16", "weight format [nvfp4]"},
    {"tokens", NULL, MS_OPT_VALUE, "1,2,4,..", "token counts to tune for [1,2,4,8,16,32,64,128,256]"},
    {"out-dir", NULL, MS_OPT_VALUE, "DIR", "where the tuned configs go [configs/tuned]"},
    {"reps", NULL, MS_OPT_VALUE, "N", "timed repetitions per candidate [20]"},
    {"device-index", NULL, MS_OPT_VALUE, "I", "GPU [0]"},
    {"forms-only", NULL, MS_OPT_BOOL, NULL, "time only the fused one-token MoE kernel's forms; the file keeps its crossover"},
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
    const int forms_only = ms_args_flag(&a, "forms-only");
    double td[TUNE_MAX], tg[TUNE_MAX];
    int cross = 0, broken = 0;
    printf("%s, %s experts [%d x %d], top-%d of %d\n", b->gpu.name, quant, s.inter, s.hidden, s.topk, s.n_experts);
    if (!forms_only) printf("tokens   decode us   grouped us\n");
    for (int i = 0; i < nt && !forms_only; i++) {
        if (time_runner(b, rd, &ly->experts, &s, tokens[i], (int)reps, &td[i], &err) ||
            time_runner(b, rg, &ly->experts, &s, tokens[i], (int)reps, &tg[i], &err)) {
            fprintf(stderr, "moeserve tune: %d tokens: %s\n", tokens[i], err.msg);
            goto done;
        }
        printf("%6d %11.1f %12.1f\n", tokens[i], td[i], tg[i]);
        if (!broken && td[i] <= tg[i]) cross = tokens[i] > cross ? tokens[i] : cross;
        else broken = 1;
    }
    ms_moe_form rec = {0}; /* the fastest form measured (groups 0: none) */
#ifdef MS_HAVE_CUDA
    double fus[TUNE_FORMS], model_us = -1;
    int nf = 0, model_form = -1;
    ms_experts fx; /* the forward's decode calls fold the shared expert in as the last expert */
    if (ms_layer_fold_shared(ly, &fx, &err)) {
        fprintf(stderr, "moeserve tune: %s\n", err.msg);
        goto done;
    }
    const int folded = fx.n > 0;
    ms_moe_shape sf = s; /* the forward's decode call: the shared expert folded in as the last expert */
    sf.n_experts += folded;
    const int frc = tune_forms(b, rd, folded ? &fx : &ly->experts, &sf, 5 * (int)reps, &rec, fus, &nf, &model_us,
                               &model_form, &err);
    if (folded) free(fx.gate); /* the three arrays are one allocation; the device tables stay with the backend */
    if (frc) {
        fprintf(stderr, "moeserve tune: fused MoE kernel forms: %s\n", err.msg);
        goto done;
    }
    if (rec.groups) {
        printf("fused one-token kernel, %d slots: form (groups of 8 warps, ring depth), us a call\n", rec.slots);
        for (int f = 0; f < nf; f++) {
            int g, d;
            ms_cuda_moe_fused_form(f, &g, &d);
            if (fus[f] < 0) printf("  (%d, %d)  does not fit\n", g, d);
            else printf("  (%d, %d) %7.2f%s%s\n", g, d, fus[f], g == rec.groups && d == rec.depth ? "  fastest" : "",
                        f == model_form ? "  (the cost model's choice)" : "");
        }
    } else {
        printf("fused one-token kernel: does not take this shape (%s experts)\n", quant);
    }
#endif
    if (mkdir(out_dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "moeserve tune: flag --out-dir: cannot create %s: %s\n", out_dir, strerror(errno));
        goto done;
    }
    ms_moe_tune_result res = {.gpu = b->gpu.name, .cc_major = b->gpu.cc_major, .cc_minor = b->gpu.cc_minor,
                              .forms_only = forms_only, .decode_max_tokens = cross, .model = model, .quant = quant,
                              .hidden = s.hidden, .inter = s.inter, .topk = s.topk, .n_experts = s.n_experts,
                              /* a forms-only run timed no token counts: the file keeps the old ones */
                              .n_tokens = forms_only ? 0 : nt, .tokens = forms_only ? NULL : tokens,
                              .us_decode = forms_only ? NULL : td, .us_grouped = forms_only ? NULL : tg, .best = rec,
                              .cost_model_us = -1};
#ifdef MS_HAVE_CUDA
    int fg[TUNE_FORMS], fd[TUNE_FORMS];
    for (int f = 0; f < nf; f++) ms_cuda_moe_fused_form(f, &fg[f], &fd[f]);
    res.n_forms = nf, res.form_groups = fg, res.form_depth = fd, res.form_us = fus, res.cost_model_us = model_us;
#endif
    char path[1200];
    if (ms_moe_tuned_write(out_dir, &res, path, sizeof path, &err)) {
        fprintf(stderr, "moeserve tune: %s\n", err.msg);
        goto done;
    }
    if (forms_only) printf("wrote %s\n", path);
    else printf("decode runner up to %d tokens; wrote %s\n", cross, path);
    rc = 0;
done:
    ms_model_executor_close(&ex);
    ms_args_free(&a);
    return rc;
}
