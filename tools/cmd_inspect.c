/* cmd_inspect.c - `moeserve inspect --model DIR [--override key=value]...`
 *
 * Answers "what is in this checkpoint and will moeserve load it" without running anything: the
 * architecture and layer layout, which format each module group is stored in, bytes per group, and
 * the quantization declaration. It runs the real loader (every check included), so a checkpoint
 * that inspects cleanly loads cleanly; a bad one fails with the loader's one-line error. */
#include "common/args.h"
#include "model/arch.h"
#include "model/model.h"
#include "model/safetensors.h"

#include <stdio.h>
#include <string.h>

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

int cmd_inspect(int argc, char **argv) {
    ms_args a;
    if (ms_args_init(&a, argc, argv)) return 1;
    if (ms_args_flag(&a, "help")) {
        fprintf(stderr, "usage: moeserve inspect --model DIR [--override key=value]...\n");
        ms_args_free(&a);
        return 0;
    }
    const char *dir = ms_args_str(&a, "model", NULL);
    const char *ov[MAX_OV];
    int n_ov = ms_args_multi(&a, "override", ov, MAX_OV);
    if (ms_args_check_unknown(&a, "inspect") || !dir) {
        if (!dir) fprintf(stderr, "moeserve inspect: --model DIR is required\n");
        ms_args_free(&a);
        return 2;
    }
    ms_err err = {0};
    ms_model *m = NULL;
    ms_load_opts lo = {.overrides = ov, .n_overrides = n_ov, .prefetch_threads = -1};
    int rc = ms_model_load(dir, &lo, &m, &err);
    ms_quant_decl q;
    memset(&q, 0, sizeof q);
    if (!rc) rc = ms_quant_decl_load(dir, &q, &err);
    if (rc) {
        fprintf(stderr, "moeserve inspect: %s\n", err.msg);
    } else {
        print_model(m, &q);
    }
    ms_quant_decl_free(&q);
    ms_model_free(m);
    ms_args_free(&a);
    return rc ? 1 : 0;
}
