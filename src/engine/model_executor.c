/* model_executor.c - turns a model directory into an ms_executor: load (mmap or dummy weights),
 * create the backend, place the weights, size the paged KV cache from the memory left, create the
 * forward. The engine and the one-shot commands (logits, generate, bench-model) all start here, so
 * sizing policy lives in one place.
 *
 * KV sizing: CPU takes --max-total-tokens (default 32768) capped by a quarter of the available RAM;
 * CUDA takes what --mem-fraction-static of device memory leaves after the weights, minus an
 * activation reserve, optionally capped by --max-total-tokens. */
#include "engine/model_executor.h"

#include "core/fileutil.h"
#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct exec_ctx {
    ms_model *m;
    ms_backend *b;
    ms_forward *f;
} exec_ctx;

static int exec_forward(void *ctx, const ms_batch *batch, float *logits, ms_err *err) {
    return ms_forward_run(((exec_ctx *)ctx)->f, batch, logits, err);
}

/* Page-locking is an optimisation: a refusal (e.g. a locked-memory limit) is logged, not fatal. */
static int exec_pin(void *ctx, void *p, size_t n) {
    ms_backend *b = ((exec_ctx *)ctx)->b;
    if (!b->ops->host_pin) return 0;
    ms_err err = {0};
    if (b->ops->host_pin(b, p, n, &err) == MS_OK) return 0;
    MS_LOGW("logits buffer of %zu bytes not page-locked (%s); downloads are slower", n, err.msg);
    return -1;
}

static void exec_unpin(void *ctx, void *p) {
    ms_backend *b = ((exec_ctx *)ctx)->b;
    if (b->ops->host_unpin) b->ops->host_unpin(b, p);
}

/* MemAvailable from /proc/meminfo in bytes (0 when unknown). */
static uint64_t mem_available(void) {
    FILE *fp = fopen("/proc/meminfo", "r");
    if (!fp) return 0;
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, fp))
        if (sscanf(line, "MemAvailable: %llu kB", (unsigned long long *)&kb) == 1) break;
    fclose(fp);
    return kb * 1024;
}

static int size_kv(const ms_exec_opts *o, ms_model *m, ms_backend *b, int page_size, int max_batch,
                   int64_t *total_tokens, ms_err *err) {
    size_t per_tok = ms_forward_kv_bytes_per_token(m, b);
    if (per_tok == 0) per_tok = 1;
    int64_t want = o->max_total_tokens > 0 ? o->max_total_tokens : 0;
    int64_t cap;
    if (!strcmp(b->name, "cpu")) {
        uint64_t avail = mem_available();
        cap = avail ? (int64_t)(avail / 4 / per_tok) : (int64_t)32768;
        if (!want) want = 32768;
    } else {
        double frac = o->mem_fraction_static > 0 ? o->mem_fraction_static : 0.88;
        double used = (double)(b->gpu.mem_total - b->gpu.mem_free);
        /* activations: ~64 KiB per batch token for hidden-size scale buffers plus 1 GiB for logits,
         * MoE workspace and library handles */
        double reserve = (double)max_batch * 65536.0 + (double)(1ull << 30);
        double usable = frac * (double)b->gpu.mem_total - used - reserve;
        if (usable <= 0)
            return ms_errf(err, MS_ERR_NOMEM,
                           "flag --mem-fraction-static %.2f leaves no memory for the KV cache on %s after the weights "
                           "(%.1f GiB used of %.1f GiB)",
                           frac, b->gpu.name, used / 1073741824.0, (double)b->gpu.mem_total / 1073741824.0);
        cap = (int64_t)(usable / (double)per_tok);
        if (!want) want = cap;
    }
    if (want > cap) {
        MS_LOGW("KV cache: %lld tokens requested but memory allows %lld; using %lld", (long long)want, (long long)cap,
                (long long)cap);
        want = cap;
    }
    if (want < page_size)
        return ms_errf(err, MS_ERR_NOMEM, "KV cache: memory allows only %lld tokens (%zu bytes each); need at least %d",
                       (long long)want, per_tok, page_size);
    *total_tokens = want;
    return MS_OK;
}

int ms_model_executor_open(const ms_exec_opts *o, ms_executor *out, ms_model **model_out, ms_err *err) {
    memset(out, 0, sizeof *out);
    if (model_out) *model_out = NULL;
    exec_ctx *x = calloc(1, sizeof *x);
    if (!x) return ms_errf(err, MS_ERR_NOMEM, "executor: out of memory");
    ms_load_opts lo = {0};
    lo.load_format = o->load_format ? o->load_format : "auto";
    lo.dummy_quant = o->dummy_quant ? o->dummy_quant : "bf16";
    lo.overrides = o->overrides;
    lo.n_overrides = o->n_overrides;
    lo.progress = o->progress;
    lo.seed = 1;
    /* backend first: dummy weights for a GPU are generated in its memory, never on the host */
    int rc = ms_backend_create(o->device ? o->device : "cpu", o->device_index, &x->b, err);
    if (!rc && !strcmp(lo.load_format, "dummy")) lo.dummy_device = x->b;
    if (!rc && x->b->device >= 0) {
        /* measured decode-vs-grouped crossover for this GPU, when `moeserve tune` left one */
        const char *td = getenv("MS_TUNED_DIR");
        if (ms_moe_apply_tuned(x->b, td && td[0] ? td : "configs/tuned"))
            MS_LOGI("MoE auto policy: tuned threshold %d tokens for %s", ms_moe_auto_threshold(), x->b->gpu.name);
    }
    if (!rc) rc = ms_model_load(o->model_path, &lo, &x->m, err);
    if (!rc) rc = ms_model_place(x->m, x->b, err);
    /* KV sizing needs the free memory after the weights are in (the backend's figure is from its
     * creation) */
    if (!rc && x->b->ops->device_info) rc = x->b->ops->sync(x->b, err);
    if (!rc && x->b->ops->device_info) rc = x->b->ops->device_info(x->b, err);
    const int page_size = o->page_size > 0 ? o->page_size : 16;
    const int max_batch = o->max_batch_tokens > 0 ? o->max_batch_tokens : 8192;
    int64_t total = 0;
    if (!rc) rc = size_kv(o, x->m, x->b, page_size, max_batch, &total, err);
    if (!rc) {
        ms_forward_opts fo = {0};
        fo.max_tokens = max_batch;
        fo.page_size = page_size;
        fo.n_pages = (int)((total + page_size - 1) / page_size);
        fo.moe_runner = o->moe_runner ? o->moe_runner : "auto";
        fo.check_numerics = o->check_numerics;
        fo.graphs = !o->disable_graphs;
        fo.record_routing = o->record_routing;
        fo.record = o->record_decisions;
        fo.replay = o->replay_decisions;
        rc = ms_forward_create(x->m, x->b, &fo, &x->f, err);
        if (!rc && fo.graphs && !o->record_routing && !strcmp(x->b->name, "cuda")) {
            /* decode graphs now, so start-up (not the first requests) pays for recording them */
            double t0 = ms_now();
            int n = 0;
            ms_err gerr = {0};
            /* an optimisation: on failure the steps run op by op (or record on first use) */
            if (ms_forward_record_graphs(x->f, &n, &gerr) == MS_OK)
                MS_LOGI("executor: recorded %d decode graphs in %.2f s", n, ms_now() - t0);
            else
                MS_LOGW("executor: recording decode graphs at start-up failed (%s); continuing without them", gerr.msg);
        }
        if (!rc) {
            out->ctx = x;
            out->vocab = x->m->cfg.vocab_size;
            out->n_pages = fo.n_pages;
            out->page_size = page_size;
            out->max_batch_tokens = max_batch;
            out->forward = exec_forward;
            out->pin = exec_pin;
            out->unpin = exec_unpin;
            MS_LOGI("executor: %s on %s, KV cache %d pages x %d tokens (%.1f MiB), max %d tokens per step",
                    x->m->cfg.model_type, x->b->name, fo.n_pages, page_size,
                    (double)ms_forward_kv_bytes_per_token(x->m, x->b) * fo.n_pages * page_size / 1048576.0, max_batch);
        }
    }
    if (rc) {
        ms_forward_free(x->f);
        ms_model_free(x->m);
        ms_backend_destroy(x->b);
        free(x);
        return rc;
    }
    if (model_out) *model_out = x->m;
    return MS_OK;
}

int ms_model_executor_eos(const ms_executor *ex, int32_t *ids, int cap) {
    const exec_ctx *x = ex->ctx;
    int n = 0;
    for (int i = 0; x && i < x->m->cfg.n_eos && n < cap; i++) ids[n++] = x->m->cfg.eos_token_ids[i];
    return n;
}

ms_backend *ms_model_executor_backend(const ms_executor *ex) { return ex->ctx ? ((exec_ctx *)ex->ctx)->b : NULL; }

ms_forward *ms_model_executor_forward(const ms_executor *ex) { return ex->ctx ? ((exec_ctx *)ex->ctx)->f : NULL; }

void ms_model_executor_close(ms_executor *ex) {
    exec_ctx *x = ex->ctx;
    if (!x) return;
    ms_forward_free(x->f);
    ms_model_free(x->m);
    ms_backend_destroy(x->b);
    free(x);
    memset(ex, 0, sizeof *ex);
}
