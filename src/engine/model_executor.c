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
#include "dist/comm.h"
#include "dist/ctl.h"

#include <pthread.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MS_MAX_LOCAL_RANKS 64 /* ranks (threads) of one node */
typedef struct exec_ctx exec_ctx;

/* ------------------------------------------------------------------ ranks */

/* One rank: its backend, model part and forward. Under tensor parallelism every rank of this node
 * is a thread that runs the jobs the executor posts (so a GPU is only ever driven from its own
 * thread); a single unsplit rank runs on the caller's thread. */
typedef struct rank_st {
    struct exec_ctx *x;
    int local, rank; /* index on this node; global rank */
    pthread_t th;
    int started;
    ms_backend *b;
    ms_model *m;
    ms_forward *f;
    ms_comm *comm;
    int64_t kv_tokens;
    int rc;
    ms_err err;
} rank_st;

enum { JOB_OPEN = 1, JOB_FORWARD, JOB_GRAPHS, JOB_STEP, JOB_DRAFT, JOB_CLOSE };

struct exec_ctx {
    ms_model *m; /* rank 0 of this node (the only one when unsplit) */
    ms_backend *b;
    ms_forward *f;
    ms_exec_opts o;
    int tp, ep, nnodes, node_rank, n_local;
    double timeout_s;
    rank_st *ranks;
    int threaded;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;
    int n_done, job;
    int first_bad; /* local index of the first rank that failed the current job, -1 none (under mu) */
    const ms_batch *batch;
    float *logits;
    int32_t *ids; /* JOB_STEP: the greedy ids instead of the logits (exec_forward_argmax), else NULL */
    int draft_src;            /* JOB_DRAFT: hidden source and rows (ms_forward_mtp_run) */
    const int32_t *draft_hidx;
    ms_forward_opts fo;
    ms_comm *local_comms[MS_MAX_LOCAL_RANKS];
    unsigned char nccl_id[MS_COMM_NCCL_ID_BYTES];
    int use_nccl;
    int with_comm; /* ranks run with a communicator (tp > 1, or forced for one rank) */
    ms_dist_ctl *ctl;
    int broken; /* atomic; broken_err and the control channel under bmu */
    pthread_mutex_t bmu;
    ms_err broken_err;
    int32_t *plan; /* node 0: serialized step plan */
    size_t plan_cap;
    int32_t *fplan; /* follower: the received plan, aligned */
    size_t fplan_cap;
};


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

/* Backend, model part, placement and this rank's KV budget (in tokens). */
static int rank_open(rank_st *r, ms_err *err) {
    exec_ctx *x = r->x;
    const ms_exec_opts *o = &x->o;
    ms_load_opts lo = {0};
    lo.load_format = o->load_format ? o->load_format : "auto";
    lo.dummy_quant = o->dummy_quant ? o->dummy_quant : "bf16";
    lo.overrides = o->overrides;
    lo.n_overrides = o->n_overrides;
    lo.progress = o->progress && r->rank == 0;
    lo.seed = 1;
    lo.tp_rank = r->rank;
    lo.tp_size = x->tp;
    lo.ep_size = x->ep;
    if (x->tp > 1) lo.prefetch_threads = -1; /* each rank touches only its slices */
    lo.load_mtp = o->speculative_num_steps > 0;
    /* backend first: dummy weights for a GPU are generated in its memory, never on the host */
    int rc = ms_backend_create(o->device ? o->device : "cpu", o->device_index + r->local, &r->b, err);
    if (!rc && !strcmp(lo.load_format, "dummy")) lo.dummy_device = r->b;
    if (!rc && r->b->device >= 0 && r->rank == 0) {
        /* measured decode-vs-grouped crossover and fused-kernel forms for this GPU, when `moeserve tune`
         * left them */
        const char *td = getenv("MS_TUNED_DIR");
        if (ms_moe_apply_tuned(r->b, td && td[0] ? td : "configs/tuned"))
            MS_LOGI("MoE: tuned values for %s applied (auto threshold now %d tokens)", r->b->gpu.name,
                    ms_moe_auto_threshold());
    }
    if (!rc) rc = ms_model_load(o->model_path, &lo, &r->m, err);
    if (!rc) rc = ms_model_place(r->m, r->b, err);
    /* KV sizing needs the free memory after the weights are in (the backend's figure is from its
     * creation) */
    if (!rc && r->b->ops->device_info) rc = r->b->ops->sync(r->b, err);
    if (!rc && r->b->ops->device_info) rc = r->b->ops->device_info(r->b, err);
    const int page_size = o->page_size > 0 ? o->page_size : 16;
    const int max_batch = o->max_batch_tokens > 0 ? o->max_batch_tokens : 8192;
    if (!rc) rc = size_kv(o, r->m, r->b, page_size, max_batch, &r->kv_tokens, err);
    if (!rc && x->with_comm) {
        if (x->use_nccl) rc = ms_comm_nccl_create(r->b, x->nccl_id, r->rank, x->tp, x->timeout_s, &r->comm, err);
        else if (x->nnodes > 1) rc = ms_comm_tcp_create(o->dist_init_addr, r->rank, x->tp, x->timeout_s, &r->comm, err);
        else r->comm = x->local_comms[r->local], x->local_comms[r->local] = NULL;
    }
    return rc;
}

static int rank_forward(rank_st *r, ms_err *err) {
    ms_forward_opts fo = r->x->fo;
    fo.comm = r->comm;
    if (r->rank != 0) fo.record = NULL; /* one record of the step's choices (replay goes to every rank) */
    if (r->rank == 0) fo.on_layer = r->x->o.on_layer, fo.on_layer_ctx = r->x->o.on_layer_ctx;
    return ms_forward_create(r->m, r->b, &fo, &r->f, err);
}

static int rank_graphs(rank_st *r, ms_err *err) {
    /* decode graphs now (with speculation also the verification and MTP draft graphs), so start-up
     * (not the first requests) pays for recording them */
    double t0 = ms_now();
    int n = 0;
    ms_err gerr = {0};
    /* an optimisation: on failure the steps run op by op (or record on first use) */
    if (ms_forward_record_graphs(r->f, &n, &gerr) == MS_OK) {
        ms_graph_counts gc;
        ms_forward_graph_counts(r->f, &gc);
        if (r->rank == 0)
            MS_LOGI("executor: recorded %d graphs (%d decode, %d verify, %d draft) in %.2f s", n, gc.recorded[MS_GRAPH_DECODE],
                    gc.recorded[MS_GRAPH_VERIFY], gc.recorded[MS_GRAPH_DRAFT], ms_now() - t0);
        return MS_OK;
    }
    MS_LOGW("executor: rank %d: recording graphs at start-up failed (%s); continuing without them", r->rank, gerr.msg);
    /* under tensor parallelism a failed recording may have left the ranks' collectives out of step */
    if (r->x->tp > 1) return ms_errf(err, MS_ERR_RUNTIME, "rank %d: %s", r->rank, gerr.msg);
    return MS_OK;
}

static void rank_close(rank_st *r) {
    ms_forward_free(r->f);
    ms_model_free(r->m);
    ms_backend_destroy(r->b);
    ms_comm_destroy(r->comm);
    r->f = NULL, r->m = NULL, r->b = NULL, r->comm = NULL;
}

static int rank_job(rank_st *r, int job, ms_err *err) {
    exec_ctx *x = r->x;
    switch (job) {
    case JOB_OPEN: return rank_open(r, err);
    case JOB_FORWARD: return rank_forward(r, err);
    case JOB_GRAPHS: return rank_graphs(r, err);
    case JOB_STEP: { /* node 0's first rank takes the step's result; the others run its collectives */
        const int mine = r->local == 0 && x->node_rank == 0;
        if (mine && x->ids) return ms_forward_run_argmax(r->f, x->batch, x->ids, err);
        return ms_forward_run(r->f, x->batch, mine ? x->logits : NULL, err);
    }
    case JOB_DRAFT: {
        const int mine = r->local == 0 && x->node_rank == 0;
        if (mine && x->ids) return ms_forward_mtp_run_argmax(r->f, x->batch, x->draft_src, x->draft_hidx, x->ids, err);
        return ms_forward_mtp_run(r->f, x->batch, x->draft_src, x->draft_hidx, mine ? x->logits : NULL, err);
    }
    case JOB_CLOSE: rank_close(r); return MS_OK;
    }
    return MS_OK;
}

static void *rank_main(void *arg) {
    rank_st *r = arg;
    exec_ctx *x = r->x;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&x->mu);
        while (x->gen == seen) pthread_cond_wait(&x->go, &x->mu);
        seen = x->gen;
        const int job = x->job;
        pthread_mutex_unlock(&x->mu);
        r->err = (ms_err){0};
        r->rc = rank_job(r, job, &r->err);
        if (r->rc) { /* the first rank to fail is the cause; its peers' errors echo its abort */
            pthread_mutex_lock(&x->mu);
            if (x->first_bad < 0) x->first_bad = r->local;
            pthread_mutex_unlock(&x->mu);
        }
        /* a rank that fails must not leave its peers waiting in a collective */
        if (r->rc && r->comm) r->comm->ops->abort(r->comm, r->err.msg);
        pthread_mutex_lock(&x->mu);
        x->n_done++;
        pthread_cond_broadcast(&x->done);
        pthread_mutex_unlock(&x->mu);
        if (job == JOB_CLOSE) break;
    }
    return NULL;
}

/* Runs job on every rank of this node and waits for all. The error reported is the first failing
 * rank's (the others then fail on its abort). */
static int run_job(exec_ctx *x, int job, ms_err *err) {
    if (!x->threaded) {
        x->ranks[0].err = (ms_err){0};
        x->ranks[0].rc = rank_job(&x->ranks[0], job, &x->ranks[0].err);
    } else {
        pthread_mutex_lock(&x->mu);
        x->job = job;
        x->n_done = 0;
        x->first_bad = -1;
        x->gen++;
        pthread_cond_broadcast(&x->go);
        while (x->n_done < x->n_local) pthread_cond_wait(&x->done, &x->mu);
        pthread_mutex_unlock(&x->mu);
    }
    const rank_st *bad = x->threaded && x->first_bad >= 0 ? &x->ranks[x->first_bad] : NULL;
    for (int i = 0; !bad && i < x->n_local; i++)
        if (x->ranks[i].rc) bad = &x->ranks[i];
    if (!bad) return MS_OK;
    if (err) *err = bad->err;
    return bad->rc;
}

/* ------------------------------------------------------------------ step plans (multi-node) */

/* The batch as int32 words: n_tokens, n_seqs, max_blocks, page_size, n_logits, then the arrays. */
static int plan_pack(exec_ctx *x, const ms_batch *b, size_t *nbytes, ms_err *err) {
    const size_t T = (size_t)b->n_tokens, S = (size_t)b->n_seqs, NL = (size_t)b->n_logits;
    const size_t nw = 5 + 3 * T + (S + 1) + S + S * (size_t)b->max_blocks + NL;
    if (x->plan_cap < nw) {
        int32_t *p = realloc(x->plan, nw * sizeof(int32_t));
        if (!p) return ms_errf(err, MS_ERR_NOMEM, "executor: out of memory packing a step of %zu tokens", T);
        x->plan = p, x->plan_cap = nw;
    }
    int32_t *w = x->plan;
    *w++ = b->n_tokens, *w++ = b->n_seqs, *w++ = b->max_blocks, *w++ = b->page_size, *w++ = b->n_logits;
#define PUT(src, n) (memcpy(w, (src), sizeof(int32_t) * (n)), w += (n))
    PUT(b->token_ids, T);
    PUT(b->positions, T);
    PUT(b->slot_mapping, T);
    PUT(b->seq_start, S + 1);
    PUT(b->ctx_len, S);
    PUT(b->block_table, S * (size_t)b->max_blocks);
    PUT(b->logit_idx, NL);
#undef PUT
    *nbytes = nw * sizeof(int32_t);
    return MS_OK;
}

/* Views a received plan as a batch; sizes are checked against the message length (the forward
 * validates the contents). */
static int plan_unpack(const int32_t *w, size_t nbytes, ms_batch *b, ms_err *err) {
    const size_t nw = nbytes / sizeof(int32_t);
    if (nbytes % sizeof(int32_t) || nw < 5) return ms_errf(err, MS_ERR_FORMAT, "step plan from node 0: %zu bytes is malformed", nbytes);
    const int64_t T = w[0], S = w[1], MB = w[2], NL = w[4];
    if (T < 1 || S < 1 || MB < 1 || NL < 0 || T > (1 << 24) || S > T || MB > (1 << 24) || NL > T)
        return ms_errf(err, MS_ERR_FORMAT, "step plan from node 0: header (%lld tokens, %lld sequences) is malformed",
                       (long long)T, (long long)S);
    if ((int64_t)nw != 5 + 3 * T + (S + 1) + S + S * MB + NL)
        return ms_errf(err, MS_ERR_FORMAT, "step plan from node 0: %zu words do not match its header", nw);
    *b = (ms_batch){0};
    b->n_tokens = (int)T, b->n_seqs = (int)S, b->max_blocks = (int)MB, b->page_size = w[3], b->n_logits = (int)NL;
    const int32_t *p = w + 5;
    b->token_ids = p, p += T;
    b->positions = p, p += T;
    b->slot_mapping = p, p += T;
    b->seq_start = p, p += S + 1;
    b->ctx_len = p, p += S;
    b->block_table = p, p += S * MB;
    b->logit_idx = p;
    return MS_OK;
}

/* The first failure that broke the run (steps and the health check run on different threads: the
 * cause is written before the flag is published). */
static void mark_broken(exec_ctx *x, const ms_err *err) {
    pthread_mutex_lock(&x->bmu);
    if (!x->broken) {
        x->broken_err = *err;
        __atomic_store_n(&x->broken, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&x->bmu);
}

static int is_broken(exec_ctx *x, ms_err *err) {
    if (!__atomic_load_n(&x->broken, __ATOMIC_ACQUIRE)) return 0;
    if (err) {
        pthread_mutex_lock(&x->bmu);
        *err = x->broken_err;
        pthread_mutex_unlock(&x->bmu);
    }
    return 1;
}

/* One step on every rank; node 0's first rank fills logits, or ids when ids is not NULL. */
static int exec_step(exec_ctx *x, const ms_batch *batch, float *logits, int32_t *ids, ms_err *err) {
    if (!x->threaded) return ids ? ms_forward_run_argmax(x->f, batch, ids, err) : ms_forward_run(x->f, batch, logits, err);
    if (is_broken(x, err)) return MS_ERR_RUNTIME;
    int rc = MS_OK;
    if (x->nnodes > 1) {
        size_t n = 0;
        rc = plan_pack(x, batch, &n, err);
        if (!rc) {
            pthread_mutex_lock(&x->bmu); /* the health check reads the channel from another thread */
            rc = ms_dist_ctl_send_all(x->ctl, x->plan, n, err);
            pthread_mutex_unlock(&x->bmu);
        }
    }
    x->batch = batch;
    x->logits = logits;
    x->ids = ids;
    if (!rc) rc = run_job(x, JOB_STEP, err);
    x->ids = NULL;
    /* a collective that failed leaves the communicator broken: no later step can run */
    if (rc && rc != MS_ERR_INVALID) mark_broken(x, err);
    return rc;
}

static int exec_forward(void *ctx, const ms_batch *batch, float *logits, ms_err *err) {
    return exec_step(ctx, batch, logits, NULL, err);
}

static int exec_forward_argmax(void *ctx, const ms_batch *batch, int32_t *ids, ms_err *err) {
    return exec_step(ctx, batch, NULL, ids, err);
}

static int exec_healthy(void *ctx) { return !is_broken(ctx, NULL); }

/* One MTP draft step on every rank of this node (open refuses speculation on multi-node runs: the
 * step plan sent to other nodes has no draft form yet). */
static int draft_step(exec_ctx *x, const ms_batch *batch, int hid_src, const int32_t *hid_idx, float *logits, int32_t *ids,
                      ms_err *err) {
    if (!x->threaded)
        return ids ? ms_forward_mtp_run_argmax(x->f, batch, hid_src, hid_idx, ids, err)
                   : ms_forward_mtp_run(x->f, batch, hid_src, hid_idx, logits, err);
    if (is_broken(x, err)) return MS_ERR_RUNTIME;
    x->batch = batch;
    x->logits = logits;
    x->ids = ids;
    x->draft_src = hid_src;
    x->draft_hidx = hid_idx;
    int rc = run_job(x, JOB_DRAFT, err);
    x->ids = NULL;
    if (rc && rc != MS_ERR_INVALID) mark_broken(x, err);
    return rc;
}

static int exec_draft(void *ctx, const ms_batch *batch, int hid_src, const int32_t *hid_idx, float *logits, ms_err *err) {
    return draft_step(ctx, batch, hid_src, hid_idx, logits, NULL, err);
}

static int exec_draft_argmax(void *ctx, const ms_batch *batch, int hid_src, const int32_t *hid_idx, int32_t *ids,
                             ms_err *err) {
    return draft_step(ctx, batch, hid_src, hid_idx, NULL, ids, err);
}

static void exec_free(exec_ctx *x) {
    if (!x) return;
    if (x->ctl && x->node_rank == 0) {
        ms_err e = {0};
        ms_dist_ctl_shutdown(x->ctl, &e);
    }
    if (x->ranks) {
        if (x->threaded) {
            run_job(x, JOB_CLOSE, NULL);
            for (int i = 0; i < x->n_local; i++)
                if (x->ranks[i].started) pthread_join(x->ranks[i].th, NULL);
        } else {
            rank_close(&x->ranks[0]);
        }
    }
    for (int i = 0; i < MS_MAX_LOCAL_RANKS; i++) ms_comm_destroy(x->local_comms[i]);
    ms_dist_ctl_close(x->ctl);
    if (x->threaded) {
        pthread_mutex_destroy(&x->mu);
        pthread_cond_destroy(&x->go);
        pthread_cond_destroy(&x->done);
    }
    pthread_mutex_destroy(&x->bmu);
    free(x->ranks);
    free(x->plan);
    free(x->fplan);
    free(x);
}

/* Checks the parallel flags and works out this node's ranks. */
static int plan_ranks(exec_ctx *x, const ms_exec_opts *o, ms_err *err) {
    x->tp = o->tp > 0 ? o->tp : 1;
    x->ep = o->ep > 0 ? o->ep : 1;
    x->nnodes = o->nnodes > 0 ? o->nnodes : 1;
    x->node_rank = o->node_rank;
    x->timeout_s = o->dist_timeout_s > 0 ? o->dist_timeout_s : 60.0;
    if (x->nnodes > x->tp || x->tp % x->nnodes)
        return ms_errf(err, MS_ERR_INVALID, "flag --nnodes %d must divide --tp %d (each node runs the same number of ranks)",
                       x->nnodes, x->tp);
    if (x->node_rank < 0 || x->node_rank >= x->nnodes)
        return ms_errf(err, MS_ERR_INVALID, "flag --node-rank %d is not in [0, --nnodes %d)", x->node_rank, x->nnodes);
    if (x->nnodes > 1 && (!o->dist_init_addr || !o->dist_init_addr[0]))
        return ms_errf(err, MS_ERR_INVALID, "flag --dist-init-addr HOST:PORT is required with --nnodes %d", x->nnodes);
    x->n_local = x->tp / x->nnodes;
    if (x->n_local > MS_MAX_LOCAL_RANKS)
        return ms_errf(err, MS_ERR_INVALID, "flag --tp %d: %d ranks on one node exceed the %d this build runs per node", x->tp,
                       x->n_local, MS_MAX_LOCAL_RANKS);
    const char *dev = o->device ? o->device : "cpu";
    /* MS_DIST_FORCE_COMM=1: one rank still runs through a communicator (its split code paths and, on
     * a GPU, NCCL), so a machine with one GPU checks the collectives path (scripts/gpu-check.sh) */
    const char *force = getenv("MS_DIST_FORCE_COMM");
    x->with_comm = x->tp > 1 || (force && !strcmp(force, "1"));
    if (x->with_comm) {
        const char *kind = ms_comm_kind_for_backend(dev, x->nnodes);
        char why[256] = "";
        if (!ms_dist_available(kind, why, sizeof why))
            return ms_errf(err, MS_ERR_UNSUPPORTED, "flag --tp %d on device %s: the %s communicator is not available: %s", x->tp,
                           dev, kind, why);
        x->use_nccl = !strcmp(kind, "nccl");
        if (!strcmp(kind, "tcp") && x->n_local > 1)
            return ms_errf(err, MS_ERR_UNSUPPORTED,
                           "flags --tp %d --nnodes %d on device %s: CPU ranks across processes run one rank per process "
                           "(give --tp %d, or one process with --tp %d)", x->tp, x->nnodes, dev, x->nnodes, x->tp);
    }
    return MS_OK;
}

int ms_model_executor_open(const ms_exec_opts *o, ms_executor *out, ms_model **model_out, ms_err *err) {
    memset(out, 0, sizeof *out);
    if (model_out) *model_out = NULL;
    exec_ctx *x = calloc(1, sizeof *x);
    if (!x) return ms_errf(err, MS_ERR_NOMEM, "executor: out of memory");
    x->o = *o;
    pthread_mutex_init(&x->bmu, NULL);
    int rc = plan_ranks(x, o, err);
    if (!rc && o->speculative_num_steps > 0 && x->nnodes > 1)
        rc = ms_errf(err, MS_ERR_UNSUPPORTED,
                     "flag --speculative-algorithm: speculative decoding runs on one node in this build; it cannot be "
                     "combined with --nnodes %d yet", x->nnodes);
    if (!rc && o->speculative_num_steps > 0 && (o->record_decisions || o->replay_decisions || o->on_layer))
        rc = ms_errf(err, MS_ERR_INVALID, "flag --speculative-algorithm cannot be combined with decision record/replay or layer hooks");
    if (!rc) {
        x->ranks = calloc((size_t)x->n_local, sizeof *x->ranks);
        if (!x->ranks) rc = ms_errf(err, MS_ERR_NOMEM, "executor: out of memory");
    }
    for (int i = 0; !rc && i < x->n_local; i++)
        x->ranks[i] = (rank_st){.x = x, .local = i, .rank = x->node_rank * x->n_local + i};
    /* the communicators' rendezvous: an NCCL id shared by node 0; local ranks' handles; the control
     * channel that carries node 0's step plans to the other nodes */
    if (!rc && x->with_comm && x->use_nccl) {
        if (x->node_rank == 0) rc = ms_comm_nccl_unique_id(x->nccl_id, err);
        if (!rc && x->nnodes > 1)
            rc = ms_dist_bootstrap_share(o->dist_init_addr, x->node_rank, x->nnodes, x->timeout_s, x->nccl_id,
                                         sizeof x->nccl_id, err);
    } else if (!rc && x->with_comm && x->nnodes == 1) {
        rc = ms_comm_local_create(x->n_local, x->timeout_s, x->local_comms, err);
    }
    if (!rc && x->nnodes > 1) {
        char caddr[300];
        rc = ms_dist_ctl_addr(o->dist_init_addr, caddr, sizeof caddr, err);
        if (!rc) rc = ms_dist_ctl_open(caddr, x->node_rank, x->nnodes, x->timeout_s, &x->ctl, err);
    }
    if (!rc && x->with_comm) {
        x->threaded = 1;
        pthread_mutex_init(&x->mu, NULL);
        pthread_cond_init(&x->go, NULL);
        pthread_cond_init(&x->done, NULL);
        for (int i = 0; i < x->n_local && !rc; i++) {
            if (pthread_create(&x->ranks[i].th, NULL, rank_main, &x->ranks[i]))
                rc = ms_errf(err, MS_ERR_NOMEM, "executor: cannot start the thread of rank %d", x->ranks[i].rank);
            else x->ranks[i].started = 1;
        }
        if (rc) { /* threads started so far wait for a job: hand them the close */
            int n = x->n_local;
            for (x->n_local = 0; x->n_local < n && x->ranks[x->n_local].started;) x->n_local++;
        }
    }
    if (!rc) rc = run_job(x, JOB_OPEN, err);
    const int page_size = o->page_size > 0 ? o->page_size : 16;
    const int max_batch = o->max_batch_tokens > 0 ? o->max_batch_tokens : 8192;
    if (!rc) {
        /* every rank gets the same pages: the smallest budget of this node's ranks (across nodes the
         * same flags on the same hardware give the same figure) */
        int64_t total = x->ranks[0].kv_tokens;
        for (int i = 1; i < x->n_local; i++) total = x->ranks[i].kv_tokens < total ? x->ranks[i].kv_tokens : total;
        ms_forward_opts *fo = &x->fo;
        fo->max_tokens = max_batch;
        fo->page_size = page_size;
        fo->n_pages = (int)((total + page_size - 1) / page_size);
        fo->moe_runner = o->moe_runner ? o->moe_runner : "auto";
        fo->attn_backend = o->attn_backend;
        fo->nsa_prefill = o->nsa_prefill;
        fo->nsa_decode = o->nsa_decode;
        fo->check_numerics = o->check_numerics;
        fo->graphs = !o->disable_graphs;
        fo->record_routing = o->record_routing;
        fo->record = o->record_decisions;
        fo->replay = o->replay_decisions;
        fo->mtp = o->speculative_num_steps > 0;
        /* verification steps of N + 1 tokens per sequence as graphs too (the forward takes 2..16) */
        fo->graph_verify_tokens = o->speculative_num_steps > 0 ? o->speculative_num_steps + 1 : 0;
        rc = run_job(x, JOB_FORWARD, err);
    }
    if (!rc) {
        rank_st *r0 = &x->ranks[0];
        x->m = r0->m, x->b = r0->b, x->f = r0->f;
        if (x->fo.graphs && !o->record_routing && x->b->ops->graph_begin) rc = run_job(x, JOB_GRAPHS, err);
    }
    if (!rc) {
        out->ctx = x;
        out->vocab = x->m->cfg.vocab_size;
        out->n_pages = x->fo.n_pages;
        out->page_size = page_size;
        out->max_batch_tokens = max_batch;
        out->forward = exec_forward;
        /* greedy steps take their ids on the device (MS_HOST_ARGMAX=1: download the logits always) */
        const char *host_am = getenv("MS_HOST_ARGMAX");
        const int dev_am = ms_forward_can_argmax(x->f) && !(host_am && *host_am && strcmp(host_am, "0"));
        if (dev_am) out->forward_argmax = exec_forward_argmax;
        out->healthy = exec_healthy;
        out->pin = exec_pin;
        out->unpin = exec_unpin;
        if (x->fo.mtp) out->draft = exec_draft;
        if (x->fo.mtp && dev_am) out->draft_argmax = exec_draft_argmax;
        MS_LOGI("executor: %s on %s, KV cache %d pages x %d tokens (%.1f MiB per rank), max %d tokens per step%s",
                x->m->cfg.model_type, x->b->name, x->fo.n_pages, page_size,
                (double)ms_forward_kv_bytes_per_token(x->m, x->b) * x->fo.n_pages * page_size / 1048576.0, max_batch,
                x->fo.mtp ? " (MTP draft layer loaded: NEXTN speculative decoding)" : "");
        if (x->with_comm)
            MS_LOGI("executor: %d ranks (tp %d, ep %d, %d node%s; this node runs ranks %d..%d), collectives: %s", x->tp, x->tp,
                    x->ep, x->nnodes, x->nnodes == 1 ? "" : "s", x->ranks[0].rank, x->ranks[x->n_local - 1].rank,
                    x->ranks[0].comm ? x->ranks[0].comm->name : "?");
    }
    if (rc) {
        exec_free(x);
        return rc;
    }
    if (model_out) *model_out = x->m;
    return MS_OK;
}

int ms_model_executor_follow(const ms_executor *ex, ms_err *err) {
    exec_ctx *x = ex->ctx;
    if (!x || x->nnodes <= 1 || x->node_rank == 0) return MS_OK;
    for (;;) {
        const void *msg = NULL;
        size_t n = 0;
        MS_TRY(ms_dist_ctl_recv(x->ctl, &msg, &n, -1, err));
        if (!msg) return MS_OK; /* node 0 stops the run */
        if (x->fplan_cap < n) { /* the channel's buffer may not be aligned for int32 */
            int32_t *p = realloc(x->fplan, n);
            if (!p) return ms_errf(err, MS_ERR_NOMEM, "node %d: out of memory for a step plan of %zu bytes", x->node_rank, n);
            x->fplan = p, x->fplan_cap = n;
        }
        memcpy(x->fplan, msg, n);
        ms_batch b;
        MS_TRY(plan_unpack(x->fplan, n, &b, err));
        x->batch = &b;
        x->logits = NULL;
        int rc = run_job(x, JOB_STEP, err);
        if (rc) {
            mark_broken(x, err);
            return rc;
        }
    }
}

int ms_model_executor_check(const ms_executor *ex, ms_err *err) {
    exec_ctx *x = ex->ctx;
    if (!x) return MS_OK;
    if (is_broken(x, err)) return MS_ERR_RUNTIME;
    if (x->ctl && x->node_rank == 0) {
        pthread_mutex_lock(&x->bmu);
        int rc = ms_dist_ctl_check(x->ctl, err);
        pthread_mutex_unlock(&x->bmu);
        if (rc) mark_broken(x, err);
        return rc;
    }
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
    exec_free(ex->ctx);
    memset(ex, 0, sizeof *ex);
}
