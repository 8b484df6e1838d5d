/* model_args.c - see model_args.h. */
#include "common/model_args.h"
#include "common/model_path.h"
#include "common/preflight.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const ms_opt ms_parallel_opts[] = {
    {"tp", "tp-size,tensor-parallel-size", MS_OPT_VALUE, "N", "tensor-parallel ranks (one per GPU, or CPU threads) [1]"},
    {"ep", "ep-size,expert-parallel-size", MS_OPT_VALUE, "N", "expert-parallel groups; must divide --tp (alone it implies --tp N)"},
    {"nnodes", NULL, MS_OPT_VALUE, "N", "processes (nodes) of one model [1]; node 0 serves HTTP"},
    {"node-rank", NULL, MS_OPT_VALUE, "R", "this node's rank in [0, --nnodes) [0]"},
    {"dist-init-addr", NULL, MS_OPT_VALUE, "HOST:PORT", "node 0's rendezvous address (required with --nnodes > 1)"},
    {"dist-timeout", NULL, MS_OPT_VALUE, "S", "seconds to wait for the other nodes [60]"},
    MS_OPT_END,
};

static int count_flag(ms_args *a, const char *cmd, const char *name, int def, int max, int *out);

const ms_opt ms_spec_opts[] = {
    {"speculative-algorithm", NULL, MS_OPT_VALUE, "NEXTN|EAGLE", "speculative decoding with the checkpoint's MTP layer as the draft\n(EAGLE: alias of NEXTN) [off]"},
    {"speculative-num-steps", NULL, MS_OPT_VALUE, "N", "draft tokens per step (chained MTP steps) [3]"},
    {"speculative-eagle-topk", NULL, MS_OPT_VALUE, "1", "draft branching; only 1 (a chain) is supported [1]"},
    {"speculative-num-draft-tokens", NULL, MS_OPT_VALUE, "N+1", "tokens verified per step: --speculative-num-steps + 1"},
    MS_OPT_END,
};

int ms_spec_args_parse(ms_args *a, const char *cmd, ms_exec_opts *e) {
    const char *alg = ms_args_str(a, "speculative-algorithm", NULL);
    const char *st = ms_args_str(a, "speculative-num-steps", NULL), *tk = ms_args_str(a, "speculative-eagle-topk", NULL),
               *nd = ms_args_str(a, "speculative-num-draft-tokens", NULL);
    e->speculative_num_steps = 0;
    if (!alg) {
        const char *f = st ? "speculative-num-steps" : tk ? "speculative-eagle-topk" : nd ? "speculative-num-draft-tokens" : NULL;
        if (f) return fprintf(stderr, "moeserve %s: flag --%s needs --speculative-algorithm NEXTN\n", cmd, f), -1;
        return 0;
    }
    if (strcmp(alg, "NEXTN") && strcmp(alg, "EAGLE") && strcmp(alg, "nextn") && strcmp(alg, "eagle"))
        return fprintf(stderr, "moeserve %s: flag --speculative-algorithm: '%s' is not NEXTN or EAGLE (the draft is the "
                       "checkpoint's MTP layer)\n", cmd, alg), -1;
    int steps = 3, topk = 1, ndraft = 0;
    if (st && count_flag(a, cmd, "speculative-num-steps", 3, 16, &steps)) return -1;
    if (tk && count_flag(a, cmd, "speculative-eagle-topk", 1, 1024, &topk)) return -1;
    if (nd && count_flag(a, cmd, "speculative-num-draft-tokens", 0, 17, &ndraft)) return -1;
    if (topk != 1)
        return fprintf(stderr, "moeserve %s: flag --speculative-eagle-topk %d: only 1 is supported (drafts form one chain; "
                       "tree drafts are not implemented)\n", cmd, topk), -1;
    if (nd && !st) steps = ndraft - 1;
    if (steps < 1)
        return fprintf(stderr, "moeserve %s: flag --speculative-num-draft-tokens %d must be at least 2\n", cmd, ndraft), -1;
    if (nd && ndraft != steps + 1)
        return fprintf(stderr, "moeserve %s: flag --speculative-num-draft-tokens %d must be --speculative-num-steps + 1 "
                       "(%d) with --speculative-eagle-topk 1\n", cmd, ndraft, steps + 1), -1;
    e->speculative_num_steps = steps;
    return 0;
}

const ms_opt ms_model_opts[] = {
    {"model", "model-path", MS_OPT_VALUE, "DIR|ORG/NAME", "checkpoint directory, config.json (with --load-format dummy)\nor a Hugging Face repo id (cache, else download)"},
    {"revision", NULL, MS_OPT_VALUE, "REV", "Hugging Face branch, tag or commit of a repo id [main]"},
    {"device", NULL, MS_OPT_VALUE, "cpu|cuda", "where the model runs [cpu]"},
    {"device-index", NULL, MS_OPT_VALUE, "I", "first GPU to use [0]"},
    {"moe-runner-backend", NULL, MS_OPT_VALUE, "auto|NAME", "MoE expert runner [auto]"},
    {"attention-backend", NULL, MS_OPT_VALUE, "auto|NAME", "GQA / dense MLA attention implementation [auto]"},
    {"nsa-prefill-backend", NULL, MS_OPT_VALUE, "auto|NAME", "DSA sparse attention for prefill [auto]"},
    {"nsa-decode-backend", NULL, MS_OPT_VALUE, "auto|NAME", "DSA sparse attention for decode [auto]"},
    {"load-format", NULL, MS_OPT_VALUE, "auto|dummy", "dummy: random weights of the config's shapes [auto]"},
    {"dummy-quant", NULL, MS_OPT_VALUE, "bf16|fp8|nvfp4", "weight format of --load-format dummy [bf16]"},
    {"override", NULL, MS_OPT_MULTI, "KEY=VALUE", "config override, e.g. num_hidden_layers=4"},
    {"check-numerics", NULL, MS_OPT_BOOL, NULL, "per-step NaN/Inf check; a bad step is re-run op by op to name\nthe layer and op"},
    {"check-numerics-ops", NULL, MS_OPT_BOOL, NULL, "check every op's output (slow; debugging)"},
    {"disable-cuda-graph", NULL, MS_OPT_BOOL, NULL, "run decode steps op by op"},
    {"max-total-tokens", NULL, MS_OPT_VALUE, "N", "KV cache size in tokens [from memory]"},
    {"page-size", NULL, MS_OPT_VALUE, "N", "tokens per KV page [16]"},
    {"max-batch-tokens", NULL, MS_OPT_VALUE, "N", "tokens per forward step at most"},
    {"mem-fraction-static", NULL, MS_OPT_VALUE, "F", "share of GPU memory for weights + KV cache"},
    MS_OPT_END,
};

/* A positive count flag in [1, max]; def when absent. */
static int count_flag(ms_args *a, const char *cmd, const char *name, int def, int max, int *out) {
    const char *v = ms_args_str(a, name, NULL);
    if (!v) return *out = def, 0;
    char *end;
    long long n = strtoll(v, &end, 10);
    if (!*v || *end || n < 1 || n > max)
        return fprintf(stderr, "moeserve %s: flag --%s: '%s' is not a number in [1, %d]\n", cmd, name, v, max), -1;
    *out = (int)n;
    return 0;
}

int ms_parallel_args_parse(ms_args *a, const char *cmd, ms_exec_opts *e) {
    int tp = 0, ep = 0, nn = 1, bad = 0;
    if (count_flag(a, cmd, "tp", 0, 1024, &tp) || count_flag(a, cmd, "ep", 0, 1024, &ep) ||
        count_flag(a, cmd, "nnodes", 1, 1024, &nn))
        return -1;
    if (!tp) tp = ep ? ep : 1; /* --ep N alone: N ranks, each holding 1/N of the experts */
    if (!ep) ep = 1;
    long long nr = ms_args_int(a, "node-rank", 0, &bad);
    double to = ms_args_float(a, "dist-timeout", 60, &bad);
    e->dist_init_addr = ms_args_str(a, "dist-init-addr", NULL);
    if (bad) return -1;
    if (tp % ep)
        return fprintf(stderr, "moeserve %s: flag --ep %d must divide --tp %d (expert groups partition the ranks)\n", cmd, ep, tp), -1;
    if (nr < 0 || nr >= nn) return fprintf(stderr, "moeserve %s: flag --node-rank %lld is not in [0, --nnodes %d)\n", cmd, nr, nn), -1;
    if (!(to > 0) || to > 86400) return fprintf(stderr, "moeserve %s: flag --dist-timeout %g is not in (0, 86400] seconds\n", cmd, to), -1;
    if (nn > 1 && !e->dist_init_addr)
        return fprintf(stderr, "moeserve %s: flag --dist-init-addr HOST:PORT is required with --nnodes %d\n", cmd, nn), -1;
    e->tp = tp, e->ep = ep, e->nnodes = nn, e->node_rank = (int)nr, e->dist_timeout_s = to;
    return 0;
}

int ms_model_args_parse(ms_args *a, const char *cmd, ms_model_args *o) {
    memset(o, 0, sizeof *o);
    ms_exec_opts *e = &o->ex;
    int bad = 0;
    e->model_path = ms_args_str(a, "model", NULL);
    e->device = ms_args_str(a, "device", "cpu");
    e->device_index = (int)ms_args_int(a, "device-index", 0, &bad);
    e->moe_runner = ms_args_str(a, "moe-runner-backend", "auto");
    e->attn_backend = ms_args_str(a, "attention-backend", "auto");
    e->nsa_prefill = ms_args_str(a, "nsa-prefill-backend", "auto");
    e->nsa_decode = ms_args_str(a, "nsa-decode-backend", "auto");
    e->load_format = ms_args_str(a, "load-format", "auto");
    e->dummy_quant = ms_args_str(a, "dummy-quant", "bf16");
    e->n_overrides = ms_args_multi(a, "override", o->overrides, MS_MAX_OVERRIDES);
    e->overrides = o->overrides;
    /* --check-numerics: the per-step check (a bad step is re-run op by op to name the op);
     * --check-numerics-ops: every op's output, waiting after each (debugging) */
    e->check_numerics = ms_args_flag(a, "check-numerics-ops") ? 1 : ms_args_flag(a, "check-numerics") ? 2 : 0;
    e->disable_graphs = ms_args_flag(a, "disable-cuda-graph");
    long long mt = ms_args_int(a, "max-total-tokens", 0, &bad);
    long long ps = ms_args_int(a, "page-size", 16, &bad);
    long long mb = ms_args_int(a, "max-batch-tokens", 0, &bad);
    e->mem_fraction_static = ms_args_float(a, "mem-fraction-static", 0, &bad);
    if (bad || ms_parallel_args_parse(a, cmd, e)) return -1;
    if (mt < 0 || mt > 1 << 30) return fprintf(stderr, "moeserve %s: flag --max-total-tokens: %lld is out of range\n", cmd, mt), -1;
    if (ps < 1 || ps > 4096) return fprintf(stderr, "moeserve %s: flag --page-size: %lld is out of range (1..4096)\n", cmd, ps), -1;
    if (mb < 0 || mb > 1 << 20) return fprintf(stderr, "moeserve %s: flag --max-batch-tokens: %lld is out of range\n", cmd, mb), -1;
    if (e->mem_fraction_static < 0 || e->mem_fraction_static > 1)
        return fprintf(stderr, "moeserve %s: flag --mem-fraction-static: %g is not in (0, 1]\n", cmd, e->mem_fraction_static), -1;
    e->max_total_tokens = (int)mt;
    e->page_size = (int)ps;
    e->max_batch_tokens = (int)mb;
    if (!e->model_path) return fprintf(stderr, "moeserve %s: flag --model DIR is required\n", cmd), -1;
    if (ms_preflight_device(cmd, e->device, e->device_index)) return -1;
    int need = MS_NEED_CONFIG | (!strcmp(e->load_format, "dummy") ? MS_ALLOW_CONFIG_FILE : MS_NEED_WEIGHTS);
    if (ms_model_path_resolve(cmd, "model", e->model_path, ms_args_str(a, "revision", NULL), need, o->model_dir,
                              sizeof o->model_dir))
        return -1;
    e->model_path = o->model_dir;
    return 0;
}

int ms_run_single(const ms_executor *ex, const int32_t *ids, int start, int n_new, int all_logits, float *logits,
                  ms_err *err) {
    const int ps = ex->page_size, ctx = start + n_new, nb = (ctx + ps - 1) / ps;
    if (nb > ex->n_pages)
        return ms_errf(err, MS_ERR_INVALID, "sequence of %d tokens does not fit the KV cache (%d pages of %d tokens)", ctx,
                       ex->n_pages, ps);
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)(4 * n_new + nb + 2));
    if (!buf) return ms_errf(err, MS_ERR_NOMEM, "out of memory");
    int32_t *pos = buf, *slot = pos + n_new, *lidx = slot + n_new, *bt = lidx + n_new, *sstart = bt + nb;
    for (int j = 0; j < nb; j++) bt[j] = j;
    for (int i = 0; i < n_new; i++) {
        pos[i] = start + i;
        slot[i] = start + i; /* pages in order: slot == position */
        lidx[i] = i;
    }
    sstart[0] = 0;
    sstart[1] = n_new;
    int32_t ctx_len = ctx;
    ms_batch b = {n_new, 1, ids + start, pos, sstart, &ctx_len, slot, bt, nb, ps,
                  all_logits ? n_new : 1, all_logits ? lidx : lidx + n_new - 1};
    int rc = ex->forward(ex->ctx, &b, logits, err);
    free(buf);
    return rc;
}
