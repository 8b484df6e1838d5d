/* cmd_logits.c - `moeserve logits --model DIR --ids 3,1,4 --out FILE [--device cpu|cuda]
 * [--moe-runner-backend X] [--check-numerics] [--record-decisions FILE | --replay-decisions FILE]`
 *
 * Writes the logits of every position of one prompt, one prefill step, as float32 little-endian
 * rows n_ids x vocab: the raw numbers the conformance tests compare with transformers.
 * --record-decisions saves the step's discrete choices (MoE experts with their margins, DSA key
 * selections); --replay-decisions makes this run take those instead of choosing, so two backends
 * can be compared op for op even where a near-tie makes them choose differently. */
#include "common/args.h"
#include "common/model_args.h"
#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ms_opt logits_opts[] = {
    {"ids", NULL, MS_OPT_VALUE, "3,1,4", "prompt token ids"},
    {"out", NULL, MS_OPT_VALUE, "FILE", "float32 little-endian rows, n_ids x vocab"},
    {"record-decisions", NULL, MS_OPT_VALUE, "FILE", "save the step's discrete choices (experts, DSA keys)"},
    {"replay-decisions", NULL, MS_OPT_VALUE, "FILE", "take those choices instead of choosing"},
    MS_OPT_END,
};

static const ms_cmd logits_cmd = {
    "logits", "--model DIR --ids 3,1,4 --out FILE [flags]",
    "Writes the logits of every position of one prompt (one prefill step).",
    {logits_opts, ms_model_opts, ms_parallel_opts, NULL},
};

int cmd_logits(int argc, char **argv) {
    ms_args a;
    int prc = ms_args_parse(&a, &logits_cmd, argc, argv);
    if (prc) return ms_args_exit(prc);
    if (!getenv("MS_LOG")) ms_log_set_level(MS_LOG_WARN); /* stdout/stderr stay parseable */
    ms_model_args ma;
    int rc = 1;
    int32_t *ids = NULL;
    float *lg = NULL;
    ms_executor ex = {0};
    const char *ids_s = ms_args_str(&a, "ids", NULL), *outp = ms_args_str(&a, "out", NULL);
    const char *recp = ms_args_str(&a, "record-decisions", NULL), *repp = ms_args_str(&a, "replay-decisions", NULL);
    ms_decisions dec = {0};
    rc = 2; /* a flag at fault until the model opens */
    if (ms_model_args_parse(&a, "logits", &ma)) goto done;
    int n = 0;
    if (!ids_s || ms_parse_ids(ids_s, &ids, &n) || n < 1) {
        fprintf(stderr, "moeserve logits: flag --ids: expected a comma-separated list of token ids\n");
        goto done;
    }
    if (!outp) {
        fprintf(stderr, "moeserve logits: flag --out FILE is required\n");
        goto done;
    }
    /* one prefill of exactly this prompt: size the cache and batch to it */
    if (!ma.ex.max_batch_tokens) ma.ex.max_batch_tokens = n;
    if (!ma.ex.max_total_tokens) ma.ex.max_total_tokens = n + ma.ex.page_size;
    ms_err err = {0};
    rc = 1;
    if (repp) {
        if (ms_decisions_load(repp, &dec, &err)) {
            fprintf(stderr, "moeserve logits: flag --replay-decisions: %s\n", err.msg);
            goto done;
        }
        if (dec.n_tokens != n) {
            fprintf(stderr, "moeserve logits: flag --replay-decisions: %s holds %d tokens, --ids has %d\n", repp,
                    dec.n_tokens, n);
            goto done;
        }
        ma.ex.replay_decisions = &dec;
    } else if (recp) {
        ms_config cfg;
        if (ms_config_load_with_overrides(ma.ex.model_path, ma.ex.overrides, ma.ex.n_overrides, &cfg, &err) ||
            ms_decisions_alloc(&dec, cfg.num_layers, n, cfg.num_experts_per_tok > 0 ? cfg.num_experts_per_tok : 1,
                               cfg.index_topk > 0 ? cfg.index_topk : 1, &err)) {
            fprintf(stderr, "moeserve logits: flag --record-decisions: %s\n", err.msg);
            goto done;
        }
        ma.ex.record_decisions = &dec;
    }
    if (ms_model_executor_open(&ma.ex, &ex, NULL, &err)) {
        fprintf(stderr, "moeserve logits: %s\n", err.msg);
        goto done;
    }
    lg = malloc(sizeof(float) * (size_t)n * (size_t)ex.vocab);
    if (!lg) {
        fprintf(stderr, "moeserve logits: out of memory for %d x %d logits\n", n, ex.vocab);
        goto done;
    }
    if (ms_run_single(&ex, ids, 0, n, 1, lg, &err)) {
        fprintf(stderr, "moeserve logits: %s\n", err.msg);
        goto done;
    }
    FILE *fp = fopen(outp, "wb");
    if (!fp) {
        fprintf(stderr, "moeserve logits: flag --out: cannot create %s\n", outp);
        goto done;
    }
    size_t cnt = (size_t)n * (size_t)ex.vocab;
    int ok = fwrite(lg, sizeof(float), cnt, fp) == cnt; /* x86-64 and aarch64 Linux: host floats are little-endian */
    ok &= fclose(fp) == 0;
    if (!ok) {
        fprintf(stderr, "moeserve logits: writing %s failed\n", outp);
        goto done;
    }
    if (recp && !repp && ms_decisions_save(&dec, recp, &err)) {
        fprintf(stderr, "moeserve logits: flag --record-decisions: %s\n", err.msg);
        goto done;
    }
    rc = 0;
done:
    ms_decisions_free(&dec);
    ms_model_executor_close(&ex);
    free(lg);
    free(ids);
    ms_args_free(&a);
    return rc;
}
