/* cmd_compare.c - `moeserve compare`: runs the same prompt through two backends and prints, layer by
 * layer, how far their residual streams drift apart, so a numerics bug is pinned to the first layer
 * that diverges instead of showing up as wrong text.
 *
 * moeserve compare --model DIR [--a cuda] [--b cpu] [--moe-runner-backend NAME] [--ids 1,2,3]
 *                  [--load-format auto|dummy] [--device N] [--tp N] [--ep N]
 * A side is a backend name with optional choices: `cuda:attn=ref`, `cuda:attn=flash,nsa=ref,moe=naive`
 * (attn = --attention-backend, nsa = both NSA backends, nsa_prefill / nsa_decode each, moe =
 * --moe-runner-backend), so two implementations on the same GPU can be diffed layer by layer.
 * Each backend loads its own copy of the model (placement rewrites weight pointers); with --tp/--ep
 * both sides run split, so `compare --a cpu --b cpu --tp 2` is not a split check but the same
 * command as the unsplit one, as every command that runs a model takes the parallel flags. Differences are
 * max|a-b| / max|b| over all tokens and channels. Exit code 1 when the final logits differ by more
 * than 5e-2 relative or a forward fails.
 * Side b replays side a's discrete choices (MoE experts, DSA key sets; model/decisions), so a
 * difference is the kernels' and not a near-tie routed the other way, which on random fixtures moves
 * logits by tens of percent; --free lets each side choose for itself (and prints how many choices
 * differ is then left to `logits --record-decisions`). */
#include "backend/backend.h"
#include "common/args.h"
#include "common/model_args.h"
#include "common/model_path.h"
#include "core/dtype.h"
#include "model/config.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    ms_backend *b;
    int n_layers, T, H;
    float **hid; /* [n_layers+1][T*H] */
    int failed;
} cmp_side;

static void on_layer(void *ctx, int layer, const ms_tensor *hidden) {
    cmp_side *s = ctx;
    if (layer < 0 || layer > s->n_layers || s->failed) return;
    size_t n = (size_t)ms_tensor_numel(hidden), es = ms_dtype_size(hidden->dtype);
    if (n != (size_t)s->T * s->H) return;
    void *buf = malloc(n * es);
    float *out = malloc(n * sizeof(float));
    ms_err err = {0};
    if (!buf || !out || s->b->ops->sync(s->b, &err) != MS_OK || s->b->ops->download(s->b, buf, hidden->data, n * es, &err) != MS_OK) {
        fprintf(stderr, "compare: reading layer %d hidden state: %s\n", layer, err.msg);
        s->failed = 1;
        free(buf);
        free(out);
        return;
    }
    if (hidden->dtype == MS_F32) memcpy(out, buf, n * 4);
    else ms_convert_to_f32(hidden->dtype, buf, out, n);
    free(buf);
    free(s->hid[layer]);
    s->hid[layer] = out;
}

/* One side of the comparison: backend name and the implementation choices of its spec. */
typedef struct {
    char name[16];
    const char *attn, *nsa_prefill, *nsa_decode, *moe;
    char buf[256];
} cmp_spec;

/* Parses "backend[:key=value,...]" (keys attn, nsa, nsa_prefill, nsa_decode, moe) into sp; moe
 * defaults to runner. Returns 0, or -1 after printing an error naming the flag. */
static int parse_spec(const char *flag, const char *text, const char *runner, cmp_spec *sp) {
    memset(sp, 0, sizeof *sp);
    sp->moe = runner;
    snprintf(sp->buf, sizeof sp->buf, "%s", text);
    char *colon = strchr(sp->buf, ':');
    if (colon) *colon = 0;
    snprintf(sp->name, sizeof sp->name, "%s", sp->buf);
    for (char *kv = colon ? colon + 1 : NULL, *next; kv && *kv; kv = next) {
        next = strchr(kv, ',');
        if (next) *next++ = 0;
        char *eq = strchr(kv, '=');
        if (!eq || eq == kv || !eq[1])
            return fprintf(stderr, "compare: flag --%s: '%s' is not key=value (in '%s')\n", flag, kv, text), -1;
        *eq = 0;
        const char *v = eq + 1;
        if (!strcmp(kv, "attn")) sp->attn = v;
        else if (!strcmp(kv, "nsa")) sp->nsa_prefill = sp->nsa_decode = v;
        else if (!strcmp(kv, "nsa_prefill")) sp->nsa_prefill = v;
        else if (!strcmp(kv, "nsa_decode")) sp->nsa_decode = v;
        else if (!strcmp(kv, "moe")) sp->moe = v;
        else
            return fprintf(stderr, "compare: flag --%s: unknown key '%s' (attn, nsa, nsa_prefill, nsa_decode, moe)\n", flag,
                           kv), -1;
    }
    return 0;
}

/* Opens the model on backend `name` with the parallel flags of par (ranks as threads, one per
 * device), runs the prompt once and fills side (each layer's residual stream, read on rank 0 where
 * it is whole) and logits [T, V]. */
/* dec: side a records into it (replay 0), side b replays it (replay 1); NULL = free choices. */
static int run_side(const cmp_spec *sp, int device, const char *model_dir, const char *load_format,
                    const ms_exec_opts *par, const int32_t *ids, int T, ms_decisions *dec, int replay, cmp_side *side,
                    float **logits, int *vocab, ms_err *err) {
    ms_exec_opts o = *par;
    if (dec && replay) o.replay_decisions = dec;
    else if (dec) o.record_decisions = dec;
    o.model_path = model_dir;
    o.device = sp->name;
    o.device_index = device;
    o.load_format = load_format;
    o.dummy_quant = "bf16";
    o.moe_runner = sp->moe;
    o.attn_backend = sp->attn;
    o.nsa_prefill = sp->nsa_prefill;
    o.nsa_decode = sp->nsa_decode;
    o.page_size = 16;
    o.max_total_tokens = T + 16;
    o.max_batch_tokens = T;
    o.disable_graphs = 1;
    o.on_layer = on_layer;
    o.on_layer_ctx = side;
    ms_executor ex;
    ms_model *m = NULL;
    MS_TRY(ms_model_executor_open(&o, &ex, &m, err));
    side->b = ms_model_executor_backend(&ex);
    side->n_layers = m->cfg.num_layers;
    side->T = T;
    side->H = m->cfg.hidden_size;
    side->hid = calloc((size_t)side->n_layers + 1, sizeof(float *));
    *vocab = m->cfg.vocab_size;
    *logits = malloc(sizeof(float) * (size_t)T * (size_t)*vocab);
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)(4 * T + 2));
    int rc = side->hid && *logits && buf ? MS_OK : ms_errf(err, MS_ERR_NOMEM, "compare: out of memory");
    if (!rc) {
        const int npages = (T + 15) / 16;
        int32_t *pos = buf, *lidx = buf + T, *table = buf + 2 * T, seq_start[2] = {0, T}, ctx[1] = {T};
        for (int i = 0; i < T; i++) pos[i] = lidx[i] = i;
        for (int i = 0; i < npages; i++) table[i] = i;
        /* pages in order: a token's slot is its position */
        ms_batch bt = {T, 1, ids, pos, seq_start, ctx, pos, table, npages, 16, T, lidx};
        rc = ex.forward(ex.ctx, &bt, *logits, err);
    }
    free(buf);
    side->b = NULL; /* the executor owns its backends */
    ms_model_executor_close(&ex);
    return rc;
}

static double rel_diff(const float *a, const float *b, size_t n) {
    double md = 0, mr = 1e-12;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md)) md = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > mr) mr = fabs(b[i]);
    }
    return md / mr;
}

static const ms_opt compare_opts[] = {
    {"model", "model-path", MS_OPT_VALUE, "DIR", "checkpoint directory (or config.json with --load-format dummy)"},
    {"a", NULL, MS_OPT_VALUE, "BACKEND", "first backend [cuda]"},
    {"b", NULL, MS_OPT_VALUE, "BACKEND", "second backend [cpu]"},
    {"moe-runner-backend", NULL, MS_OPT_VALUE, "auto|NAME", "MoE runner of backend a [auto]"},
    {"ids", NULL, MS_OPT_VALUE, "3,1,4", "token ids to run [1,2,3,4,5,6,7,8]"},
    {"load-format", NULL, MS_OPT_VALUE, "auto|dummy", "[auto]"},
    {"device", NULL, MS_OPT_VALUE, "I", "GPU index [0]"},
    {"free", NULL, MS_OPT_BOOL, NULL, "each side makes its own discrete choices (default: b replays a's)"},
    MS_OPT_END,
};

static const ms_cmd compare_cmd = {
    "compare", "--model DIR [--a cuda] [--b cpu] [flags]",
    "Runs one forward on two backends and prints, layer by layer, where their results part.",
    {compare_opts, ms_parallel_opts, NULL},
};

int cmd_compare(int argc, char **argv) {
    ms_args a;
    int prc = ms_args_parse(&a, &compare_cmd, argc, argv);
    if (prc) return ms_args_exit(prc);
    int bad = 0;
    const char *model = ms_args_str(&a, "model", NULL);
    const char *na = ms_args_str(&a, "a", "cuda"), *nb = ms_args_str(&a, "b", "cpu");
    const char *runner = ms_args_str(&a, "moe-runner-backend", "auto");
    const char *ids_s = ms_args_str(&a, "ids", "1,2,3,4,5,6,7,8");
    const char *lf = ms_args_str(&a, "load-format", "auto");
    int device = (int)ms_args_int(&a, "device", 0, &bad);
    ms_exec_opts par = {0};
    if (ms_parallel_args_parse(&a, "compare", &par)) bad = 1;
    if (bad) {
        ms_args_free(&a);
        return 2;
    }
    if (!model) {
        fprintf(stderr, "compare: flag --model: required (a checkpoint directory)\n");
        ms_args_free(&a);
        return 2;
    }
    char dir[4096];
    if (ms_model_path_resolve("compare", "model", model, NULL,
                              MS_NEED_CONFIG | (!strcmp(lf, "dummy") ? MS_ALLOW_CONFIG_FILE : MS_NEED_WEIGHTS), dir, sizeof dir)) {
        ms_args_free(&a);
        return 2;
    }
    model = dir;
    int32_t *ids = NULL;
    int T = 0;
    if (ms_parse_ids(ids_s, &ids, &T) != 0 || T <= 0) {
        fprintf(stderr, "compare: flag --ids: expected comma-separated token ids, got '%s'\n", ids_s);
        ms_args_free(&a);
        return 2;
    }
    cmp_side sa = {0}, sb = {0};
    float *la = NULL, *lb = NULL;
    int va = 0, vb = 0;
    ms_err err = {0};
    /* backend b's runner: "cpu" is the only runner there; runner names apply to backend a */
    cmp_spec spa, spb;
    if (parse_spec("a", na, runner, &spa) || parse_spec("b", nb, !strncmp(nb, "cpu", 3) ? "auto" : runner, &spb)) {
        free(ids);
        ms_args_free(&a);
        return 2;
    }
    const int free_choices = ms_args_flag(&a, "free");
    ms_decisions dec = {0}, *decp = NULL;
    int rc = MS_OK;
    if (!free_choices) {
        ms_config cfg;
        rc = ms_config_load_with_overrides(model, par.overrides, par.n_overrides, &cfg, &err);
        if (!rc)
            rc = ms_decisions_alloc(&dec, cfg.num_layers, T, cfg.num_experts_per_tok > 0 ? cfg.num_experts_per_tok : 1,
                                    cfg.index_topk > 0 ? cfg.index_topk : 1, &err);
        if (rc) fprintf(stderr, "compare: %s\n", err.msg);
        else decp = &dec;
    }
    if (!rc) {
        rc = run_side(&spa, device, model, lf, &par, ids, T, decp, 0, &sa, &la, &va, &err);
        if (rc) fprintf(stderr, "compare: backend %s: %s\n", na, err.msg);
    }
    if (!rc) {
        rc = run_side(&spb, device, model, lf, &par, ids, T, decp, 1, &sb, &lb, &vb, &err);
        if (rc) fprintf(stderr, "compare: backend %s: %s\n", nb, err.msg);
    }
    int status = rc ? 1 : 0;
    if (!rc) {
        printf("compare %s vs %s, %d tokens, moe runner %s, tp %d ep %d, %s\n", na, nb, T, runner, par.tp, par.ep,
               free_choices ? "each side chooses experts and DSA keys itself" : "b replays a's experts and DSA keys");
        printf("%-8s %14s\n", "layer", "max rel diff");
        int n = sa.n_layers < sb.n_layers ? sa.n_layers : sb.n_layers;
        for (int l = 0; l <= n; l++) {
            if (!sa.hid[l] || !sb.hid[l]) {
                printf("%-8d %14s\n", l, "(no hook call)");
                continue;
            }
            char nm[16];
            if (l == n) snprintf(nm, sizeof nm, "final");
            else snprintf(nm, sizeof nm, "%d", l);
            printf("%-8s %14.3e\n", nm, rel_diff(sa.hid[l], sb.hid[l], (size_t)T * sa.H));
        }
        if (va == vb) {
            double d = rel_diff(la, lb, (size_t)T * va);
            int agree = 0;
            for (int t = 0; t < T; t++) {
                int ia = 0, ib = 0;
                for (int v = 1; v < va; v++) {
                    if (la[(size_t)t * va + v] > la[(size_t)t * va + ia]) ia = v;
                    if (lb[(size_t)t * va + v] > lb[(size_t)t * va + ib]) ib = v;
                }
                agree += ia == ib;
            }
            printf("%-8s %14.3e   greedy ids agree at %d/%d positions\n", "logits", d, agree, T);
            if (!(d <= 5e-2)) status = 1;
        }
    }
    cmp_side *sides[2] = {&sa, &sb};
    for (int k = 0; k < 2; k++) {
        for (int l = 0; sides[k]->hid && l <= sides[k]->n_layers; l++) free(sides[k]->hid[l]);
        free(sides[k]->hid);
    }
    ms_decisions_free(&dec);
    free(la);
    free(lb);
    free(ids);
    ms_args_free(&a);
    return status;
}
