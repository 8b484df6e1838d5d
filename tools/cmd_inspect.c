/* cmd_inspect.c - `moeserve inspect --model DIR|CONFIG [--tp N] [--dtype ...] [--gpu H200]`
 *
 * Answers "how much memory and how many GPUs" from a config alone (model/estimate.h), and for a
 * checkpoint also "what is in it and will moeserve load it" without running anything: the
 * architecture and layer layout, which format each module group is stored in, bytes per group, and
 * the quantization declaration. It runs the real loader (every check included), so a checkpoint
 * that inspects cleanly loads cleanly; a bad one fails with the loader's one-line error. */
#include "common/args.h"
#include "common/model_path.h"
#include "core/fileutil.h"
#include "model/arch.h"
#include "model/estimate.h"
#include "model/model.h"
#include "model/safetensors.h"

#ifdef MS_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define MAX_OV 64

static void human(char *buf, size_t cap, uint64_t b) {
    if (b >= (1ull << 30)) snprintf(buf, cap, "%.2f GiB", b / 1073741824.0);
    else if (b >= (1ull << 20)) snprintf(buf, cap, "%.2f MiB", b / 1048576.0);
    else if (b >= 1024) snprintf(buf, cap, "%.1f KiB", b / 1024.0);
    else snprintf(buf, cap, "%llu B", (unsigned long long)b);
}

static const char *algo_str(const ms_quant_decl *q) {
    switch (q->algo) {
    case MS_QUANT_NONE: return "none";
    case MS_QUANT_FP8_BLOCK: return "FP8 block 128x128";
    case MS_QUANT_NVFP4: return "NVFP4 group 16";
    case MS_QUANT_MIXED: return "MIXED_PRECISION (per module)";
    default: return q->algo_name;
    }
}

static void print_model(const ms_model *m, const ms_quant_decl *q) {
    const ms_config *c = &m->cfg;
    int n_moe = 0;
    for (int i = 0; i < c->num_layers; i++) n_moe += c->layer_is_moe[i];
    printf("model:         %s\n", m->dir);
    printf("architecture:  %s (%s), %d decoder layers (%d dense, %d MoE), hidden %d, vocab %d\n", c->model_type, c->arch->attention_kind, c->num_layers,
           c->num_layers - n_moe, n_moe, c->hidden_size, c->vocab_size);
    fflush(stdout);
    c->arch->describe(c, stdout);
    if (n_moe)
        printf("moe:           %d routed experts (top %d, groups %d/%d), %d shared, width %d, scaling %g\n", c->n_routed_experts,
               c->num_experts_per_tok, c->n_group, c->topk_group, c->n_shared_experts, c->moe_intermediate_size,
               (double)c->routed_scaling_factor);
    printf("mtp:           %d layer%s declared, %d tensors skipped\n", c->num_nextn_predict_layers,
           c->num_nextn_predict_layers == 1 ? "" : "s", m->stats.n_mtp_tensors_skipped);
    if (m->stats.n_layer_tensors_skipped)
        printf("skipped:       %d tensors of layers %d..%d (num_hidden_layers overridden)\n", m->stats.n_layer_tensors_skipped,
               c->num_layers, c->num_layers_ckpt - 1);
    if (m->stats.n_unexpected_tensors) printf("unexpected:    %d tensors ignored\n", m->stats.n_unexpected_tensors);
    printf("quantization:  %s", m->quant_desc);
    if (q->algo != MS_QUANT_NONE) {
        printf("; declared %s in %s", algo_str(q), q->source);
        if (q->kv_cache_quant_algo[0]) printf(", kv cache %s", q->kv_cache_quant_algo);
        printf(", %d exclude pattern%s", q->n_exclude, q->n_exclude == 1 ? "" : "s");
        for (int i = 0; i < q->n_exclude && i < 8; i++) printf("%s%s", i ? ", " : ": ", q->exclude[i]);
        if (q->n_exclude > 8) printf(", ...");
    } else {
        printf("; no quantization declaration");
    }
    printf("\n\n%-16s %8s %8s %8s  %12s  %s\n", "group", "plain", "fp8", "nvfp4", "bytes", "formats");
    for (int g = 0; g < MS_N_GROUPS; g++) {
        const int *n = m->stats.linears_by_group[g];
        uint64_t b = m->stats.bytes_by_group[g][0] + m->stats.bytes_by_group[g][1] + m->stats.bytes_by_group[g][2];
        if (!b && !n[0] && !n[1] && !n[2]) continue;
        char hb[32], fm[64] = "";
        human(hb, sizeof hb, b);
        for (int f = 0; f < 3; f++)
            if (n[f] || (f == 0 && !n[0] && !n[1] && !n[2])) { /* formats of the linears; plain tensors otherwise */
                const char *name = f ? ms_wfmt_name((ms_wfmt)f, MS_BF16) : ms_wfmt_name(MS_WFMT_PLAIN, (ms_dtype)m->stats.plain_dtype[g]);
                snprintf(fm + strlen(fm), sizeof fm - strlen(fm), "%s%s", fm[0] ? "+" : "", name);
            }
        printf("%-16s %8d %8d %8d  %12s  %s\n", ms_group_names[g], n[0], n[1], n[2], hb, fm);
    }
    char hb[32];
    human(hb, sizeof hb, m->stats.bytes_total);
    printf("\ntotal:         %s (%llu bytes) in %d tensors", hb, (unsigned long long)m->stats.bytes_total, m->stats.n_tensors);
    if (m->st) {
        char hf[32];
        human(hf, sizeof hf, ms_st_total_bytes(m->st));
        printf("; checkpoint files hold %s in %d tensors", hf, ms_st_count(m->st));
    }
    printf("\n");
}

/* GPUs the estimate is given for when none is named or visible: memory as sold (GB = 1e9 bytes). */
static const struct { const char *name; double gb; } k_gpus[] = {
    {"A100", 80}, {"H100", 80}, {"H20", 96}, {"RTX-PRO-6000", 96}, {"H200", 141}, {"B200", 180}, {"B300", 288},
};

static const ms_opt inspect_opts[] = {
    {"model", "model-path", MS_OPT_VALUE, "DIR|CONFIG", "checkpoint directory, Hugging Face repo id, or a config.json alone\n(then only the memory estimate)"},
    {"revision", NULL, MS_OPT_VALUE, "REV", "Hugging Face branch, tag or commit of a repo id [main]"},
    {"override", NULL, MS_OPT_MULTI, "KEY=VALUE", "config override, e.g. num_hidden_layers=4"},
    {"tp", "tp-size,tensor-parallel-size", MS_OPT_VALUE, "N", "estimate per GPU at this tensor-parallel degree [the fewest that fit]"},
    {"dtype", NULL, MS_OPT_VALUE, "bf16|fp8|nvfp4", "weight format of the estimate [the checkpoint's, else bf16]"},
    {"context-length", NULL, MS_OPT_VALUE, "N", "tokens per sequence the KV cache must hold [8192]"},
    {"batch", NULL, MS_OPT_VALUE, "N", "sequences at once [1]"},
    {"chunked-prefill-size", NULL, MS_OPT_VALUE, "N", "tokens per forward step (workspace) [8192]"},
    {"gpu", NULL, MS_OPT_VALUE, "NAME|GB", "GPU kind (H100, H200, B200, ...) or its memory in GB [the visible GPU,\nelse a table of common ones]"},
    {"mem-fraction-static", NULL, MS_OPT_VALUE, "F", "share of GPU memory usable for weights + KV + workspace [0.9]"},
    MS_OPT_END,
};

static const ms_cmd inspect_cmd = {
    "inspect", "--model DIR|CONFIG [--tp N] [--dtype bf16|fp8|nvfp4] [--context-length N] [--batch N] [--gpu H200]",
    "What is in a checkpoint and whether moeserve loads it (the real loader runs, nothing else), and a\n"
    "memory estimate: weights, KV cache per token and workspace per GPU, and how many GPUs it needs.\n"
    "A config.json alone (e.g. configs/glm-5.json) is enough for the estimate.",
    {inspect_opts, NULL},
};

static void gib(char *b, size_t cap, double x) {
    if (x >= 1099511627776.0) snprintf(b, cap, "%.2f TiB", x / 1099511627776.0);
    else if (x >= 1073741824.0) snprintf(b, cap, "%.1f GiB", x / 1073741824.0);
    else if (x >= 1048576.0) snprintf(b, cap, "%.1f MiB", x / 1048576.0);
    else snprintf(b, cap, "%.1f KiB", x / 1024.0);
}

/* The estimate section; gpu_gb <= 0: the visible GPU if any, else the table of common ones. */
static int print_estimate(const ms_config *c, ms_est_format f, const char *fname, int tp, long long ctx, long long batch,
                          long long chunk, const char *gpu_name, double gpu_gb, double usable) {
    const double kv_tokens = (double)ctx * (double)batch;
    ms_estimate e;
    ms_err err = {0};
    int shown_tp = tp ? tp : 1;
    if (!tp && gpu_gb > 0) { /* the details at the fewest GPUs of that kind */
        int need = ms_estimate_min_tp(c, f, kv_tokens, (int)chunk, gpu_gb * 1e9, usable, 1024);
        if (need) shown_tp = need;
    }
    if (ms_estimate_memory(c, f, shown_tp, (int)chunk, &e, &err) != MS_OK) {
        fprintf(stderr, "moeserve inspect: flag --tp %d: %s\n", shown_tp, err.msg);
        return -1;
    }
    char a[32], b[32], k[32], w[32], t[32];
    printf("\nmemory estimate (%s weights, bf16 KV cache; context %lld x batch %lld = %.0f tokens; steps of %lld tokens):\n",
           fname, ctx, batch, kv_tokens, chunk);
    printf("parameters:    %.1f B loaded (MTP layers skipped), %.1f B active per token\n", e.params_total / 1e9,
           e.params_active / 1e9);
    gib(a, sizeof a, e.weight_bytes);
    gib(b, sizeof b, e.weight_bytes_rank);
    printf("weights:       %s in all, %s per GPU at --tp %d\n", a, b, shown_tp);
    gib(k, sizeof k, e.kv_bytes_token);
    gib(w, sizeof w, e.kv_bytes_token * kv_tokens);
    printf("kv cache:      %s per token per GPU, %s per GPU for %.0f tokens\n", k, w, kv_tokens);
    gib(w, sizeof w, e.workspace_rank);
    printf("workspace:     ~%s per GPU (activations, logits, CUDA/cuBLAS/NCCL)\n", w);
    gib(t, sizeof t, e.weight_bytes_rank + e.kv_bytes_token * kv_tokens + e.workspace_rank);
    printf("per GPU:       %s at --tp %d\n", t, shown_tp);
    int n_rows = 0;
    const char *names[16];
    double gbs[16];
    if (gpu_gb > 0) names[n_rows] = gpu_name, gbs[n_rows++] = gpu_gb;
    else
        for (size_t i = 0; i < sizeof k_gpus / sizeof k_gpus[0]; i++) names[n_rows] = k_gpus[i].name, gbs[n_rows++] = k_gpus[i].gb;
    printf("GPUs needed:  ");
    for (int i = 0; i < n_rows; i++) {
        int need = ms_estimate_min_tp(c, f, kv_tokens, (int)chunk, gbs[i] * 1e9, usable, 1024);
        if (tp) { /* at the given --tp: does it fit? */
            double per = e.weight_bytes_rank + e.kv_bytes_token * kv_tokens + e.workspace_rank;
            printf(" %s %.0f GB: %s --tp %d", names[i], gbs[i], per <= gbs[i] * 1e9 * usable ? "fits at" : "does not fit at", tp);
            if (need) printf(" (fewest: %d)", need);
            printf(";");
        } else if (need) {
            printf(" %s %.0f GB: %d;", names[i], gbs[i], need);
        } else {
            printf(" %s %.0f GB: does not fit at any degree the model splits into;", names[i], gbs[i]);
        }
    }
    printf("\n               (powers of two the model splits into; --mem-fraction-static %.2f of each GPU usable;\n"
           "               more GPUs than this leave more room for the KV cache, i.e. longer contexts and batches)\n", usable);
    return 0;
}

int cmd_inspect(int argc, char **argv) {
    ms_args a;
    int prc = ms_args_parse(&a, &inspect_cmd, argc, argv);
    if (prc) return ms_args_exit(prc);
    const char *given = ms_args_str(&a, "model", NULL);
    const char *ov[MAX_OV];
    int n_ov = ms_args_multi(&a, "override", ov, MAX_OV);
    int bad = 0;
    long long tp = ms_args_int(&a, "tp", 0, &bad), ctx = ms_args_int(&a, "context-length", 8192, &bad),
              batch = ms_args_int(&a, "batch", 1, &bad), chunk = ms_args_int(&a, "chunked-prefill-size", 8192, &bad);
    double usable = ms_args_float(&a, "mem-fraction-static", 0.9, &bad);
    const char *dtype = ms_args_str(&a, "dtype", NULL), *gpu = ms_args_str(&a, "gpu", NULL);
    ms_est_format fmt = MS_EST_BF16;
    char dir[4096];
    int rc = 2;
    if (bad) goto out;
    if (!given) { fprintf(stderr, "moeserve inspect: flag --model DIR|CONFIG is required\n"); goto out; }
    if (tp < 0 || tp > 1024) { fprintf(stderr, "moeserve inspect: flag --tp: %lld is not in [1, 1024]\n", tp); goto out; }
    if (ctx < 1 || ctx > 1 << 24 || batch < 1 || batch > 1 << 20 || chunk < 1 || chunk > 1 << 20) {
        fprintf(stderr, "moeserve inspect: flag --context-length, --batch or --chunked-prefill-size is out of range\n");
        goto out;
    }
    if (!(usable > 0 && usable <= 1)) { fprintf(stderr, "moeserve inspect: flag --mem-fraction-static: %g is not in (0, 1]\n", usable); goto out; }
    if (dtype && ms_est_format_parse(dtype, &fmt)) {
        fprintf(stderr, "moeserve inspect: flag --dtype: '%s' is not bf16, fp8 or nvfp4\n", dtype);
        goto out;
    }
    double gpu_gb = 0;
    char gpu_label[160] = "";
    if (gpu) {
        char *end;
        double v = strtod(gpu, &end);
        if (end != gpu && (!*end || !strcasecmp(end, "gb")) && v > 0 && v < 1e6) gpu_gb = v, snprintf(gpu_label, sizeof gpu_label, "GPU");
        for (size_t i = 0; !gpu_gb && i < sizeof k_gpus / sizeof k_gpus[0]; i++)
            if (!strncasecmp(gpu, k_gpus[i].name, strlen(gpu)) && strlen(gpu) >= 3)
                gpu_gb = k_gpus[i].gb, snprintf(gpu_label, sizeof gpu_label, "%s", k_gpus[i].name);
        if (!gpu_gb) {
            fprintf(stderr, "moeserve inspect: flag --gpu: '%s' is not a GPU kind this knows (", gpu);
            for (size_t i = 0; i < sizeof k_gpus / sizeof k_gpus[0]; i++) fprintf(stderr, "%s%s", i ? ", " : "", k_gpus[i].name);
            fprintf(stderr, ") or a memory size in GB such as 96\n");
            goto out;
        }
    }
#ifdef MS_HAVE_CUDA
    if (!gpu_gb && ms_cuda_device_count() > 0) { /* the visible GPU */
        ms_gpu_info gi;
        ms_err ge = {0};
        if (ms_cuda_device_info(0, &gi, &ge) == MS_OK) gpu_gb = gi.mem_total / 1e9, snprintf(gpu_label, sizeof gpu_label, "%s", gi.name);
    }
#endif
    if (ms_model_path_resolve("inspect", "model", given, ms_args_str(&a, "revision", NULL), MS_NEED_CONFIG | MS_NEED_WEIGHTS | MS_ALLOW_CONFIG_FILE,
                              dir, sizeof dir))
        goto out;
    rc = 1;
    ms_err err = {0};
    struct stat st;
    int config_only = stat(dir, &st) == 0 && S_ISREG(st.st_mode); /* a config.json: the estimate alone */
    ms_config cfg;
    if (ms_config_load_with_overrides(dir, ov, n_ov, &cfg, &err)) {
        fprintf(stderr, "moeserve inspect: %s\n", err.msg);
        goto out;
    }
    ms_quant_decl q;
    memset(&q, 0, sizeof q);
    if (config_only) {
        int n_moe = 0;
        for (int i = 0; i < cfg.num_layers; i++) n_moe += cfg.layer_is_moe[i];
        printf("model:         %s (a config alone: no weights read)\n", dir);
        printf("architecture:  %s, %d decoder layers (%d dense, %d MoE), hidden %d, vocab %d\n", cfg.model_type, cfg.num_layers,
               cfg.num_layers - n_moe, n_moe, cfg.hidden_size, cfg.vocab_size);
        fflush(stdout);
        cfg.arch->describe(&cfg, stdout);
        if (n_moe)
            printf("moe:           %d routed experts (top %d), %d shared, width %d\n", cfg.n_routed_experts,
                   cfg.num_experts_per_tok, cfg.n_shared_experts, cfg.moe_intermediate_size);
        if (!dtype && ms_quant_decl_load(dir, &q, &err) == MS_OK) {
            if (q.algo == MS_QUANT_FP8_BLOCK) fmt = MS_EST_FP8;
            else if (q.algo == MS_QUANT_NVFP4) fmt = MS_EST_NVFP4;
        }
    } else {
        ms_model *m = NULL;
        ms_load_opts lo = {.overrides = ov, .n_overrides = n_ov, .prefetch_threads = -1};
        int lrc = ms_model_load(dir, &lo, &m, &err);
        if (!lrc) lrc = ms_quant_decl_load(dir, &q, &err);
        if (lrc) {
            fprintf(stderr, "moeserve inspect: %s\n", err.msg);
            ms_quant_decl_free(&q);
            ms_model_free(m);
            goto out;
        }
        print_model(m, &q);
        ms_model_free(m);
        if (!dtype) fmt = q.algo == MS_QUANT_FP8_BLOCK ? MS_EST_FP8 : q.algo == MS_QUANT_NVFP4 ? MS_EST_NVFP4 : MS_EST_BF16;
    }
    ms_quant_decl_free(&q);
    static const char *const fnames[] = {"bf16", "fp8", "nvfp4"};
    rc = print_estimate(&cfg, fmt, fnames[fmt], (int)tp, ctx, batch, chunk, gpu_label, gpu_gb, usable) ? 2 : 0;
out:
    ms_args_free(&a);
    return rc;
}
