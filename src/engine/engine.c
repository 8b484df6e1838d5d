/* engine.c - the serving loop on its own thread: schedule -> forward -> sample -> callbacks.
 *
 * Other threads only touch the inbox (new requests), the abort list and the published stats, all
 * under one mutex; everything else (scheduler, KV pool, prefix cache, sampler, requests once
 * taken from the inbox) belongs to the engine thread, so the hot loop takes the lock once per step.
 * An idle engine sleeps on a condition variable. */
#include "engine/engine.h"

#include "core/fileutil.h"
#include "core/log.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "engine/sampler.h"
#include "sched/sched.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct ms_engine {
    ms_engine_config cfg;
    ms_executor exec;
    ms_sched sched;
    ms_sampler sampler;
    /* parallel sampling of a step's rows: a small pool and one sampler per worker (lazily made),
     * the tokens and events computed there, delivered in row order on the engine thread */
    ms_pool *spool;
    ms_sampler *wsamplers;
    int n_wsamplers;
    int32_t *row_tok;
    ms_token_event *row_ev;
    int row_cap;
    float *logits;
    int logits_rows;
    /* a step whose rows are all plain greedy (ms_sampler_plain_greedy) runs exec.forward_argmax: the
     * rows' tokens come back in step_ids [max_batch_tokens] and the logits are not copied out */
    int32_t *step_ids;
    int ids_step;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    ms_request *inbox_head, *inbox_tail;
    int n_inbox;
    uint64_t *aborts;
    int n_aborts, cap_aborts;
    int stop;
    uint64_t next_id;
    uint64_t seed_rng[4];   /* draws seeds for unseeded requests */
    int pub_waiting;        /* scheduler waiting count as of the last step */
    double pub_admit_rate;  /* admissions per second while requests waited (see adm_*); -1 = not measured */
    int healthy;
    char fatal_msg[MS_ERR_MSG_MAX];
    ms_engine_stats stats;
    /* engine thread only */
    uint64_t *abort_work;
    int cap_abort_work;
    ms_engine_stats acc;    /* counters accumulated by the thread, published into stats */
    int need_check;
    /* admission rate while the queue is not empty, for the queue-wait estimate: time of such steps and
     * the requests they admitted, both decayed with a 5 s time constant */
    double adm_busy_s, adm_busy_n;
    /* a step's logit rows grouped by request (a request verifying drafts has several, sampled in
     * order by one worker): first row, rows, batch sequence, rows emitted */
    int *grp_row0, *grp_nrow, *grp_seq, *grp_emit;
    int n_groups;
    uint8_t *seq_dead;      /* [max_running] sequence of the step whose request finished */
    /* speculative decoding (cfg.speculative_num_steps > 0): draft step batch arrays */
    int32_t *d_tok, *d_pos, *d_slot, *d_hidx, *d_start, *d_ctx, *d_bt, *d_lidx, *d_prev, *drafts;
    int32_t *d_ids; /* a draft step's greedy ids from exec.draft_argmax (then d_logits stays unused) */
    ms_request **d_sreq, **d_lreq;
    int *d_nd;
    float *d_logits;
    int draft_warned;
};

void ms_sampling_default(ms_sampling *s) {
    memset(s, 0, sizeof *s);
    s->temperature = 1.0f;
    s->top_p = 1.0f;
    s->repetition_penalty = 1.0f;
    s->max_tokens = 16;
}

void ms_engine_config_default(ms_engine_config *c) {
    memset(c, 0, sizeof *c);
    c->page_size = 16;
    c->max_running_requests = 256;
    c->max_waiting_requests = 1024;
    c->chunked_prefill_size = 2048;
    c->max_prefill_tokens = 8192;
    c->max_queue_wait_s = 0;
    c->enable_prefix_cache = 1;
    const char *ck = getenv("MS_CHECK_INTEGRITY");
    c->check_integrity = ck && ck[0] == '1';
}

/* ---- events ---- */

/* What the engine keeps per request beside the scheduler's view of it (sched/request.h): sampling
 * parameters, the request's own random stream and where its tokens go. Hung on ms_request.owner. */
typedef struct req_ext {
    ms_sampling sp;
    uint64_t rng[4]; /* xoshiro256** state */
    ms_token_cb cb;
    void *user;
} req_ext;
#define REQ_EXT(r) ((req_ext *)(r)->owner)

/* Frees a request and the engine's part of it. */
static void req_free(ms_request *r) {
    if (!r) return;
    if (r->owner) ms_grammar_matcher_free(REQ_EXT(r)->sp.grammar);
    free(r->owner);
    ms_request_free(r);
}

static void emit_final(ms_engine *e, ms_request *r, int finish, const char *error) {
    ms_token_event ev;
    memset(&ev, 0, sizeof ev);
    ev.req_id = r->id;
    ev.token = -1;
    ev.finish = finish;
    ev.n_prompt = r->n_prompt;
    ev.n_cached = r->n_cached;
    ev.n_generated = ms_request_n_generated(r);
    ev.error = error;
    ev.t_submit = r->t_submit;
    ev.t_admit = r->t_admit;
    if (REQ_EXT(r)->cb) REQ_EXT(r)->cb(REQ_EXT(r)->user, &ev);
    if (finish == MS_FINISH_ABORT) e->acc.requests_aborted++;
    else if (finish == MS_FINISH_ERROR) e->acc.requests_failed++;
    else e->acc.requests_finished++;
}

/* Ends r with a final event and frees it; it must already be out of the scheduler. */
static void end_request(ms_engine *e, ms_request *r, int finish, const char *error) {
    emit_final(e, r, finish, error);
    req_free(r);
}

/* vLLM semantics: the request's stop ids always stop; the executor's eos ids unless ignore_eos.
 * n_gen: generated tokens counting tok. */
static int is_stop(const ms_engine *e, const ms_request *r, int n_gen, int32_t tok) {
    if (n_gen < REQ_EXT(r)->sp.min_tokens) return 0; /* min_tokens: nothing stops yet */
    for (int i = 0; i < REQ_EXT(r)->sp.n_stop_ids; i++) if (REQ_EXT(r)->sp.stop_ids[i] == tok) return 1;
    if (REQ_EXT(r)->sp.ignore_eos) return 0;
    for (int i = 0; i < e->exec.n_eos; i++) if (e->exec.eos_ids[i] == tok) return 1;
    return 0;
}

/* ---- one step ---- */

static void fail_all(ms_engine *e, const char *msg) {
    ms_sched *s = &e->sched;
    while (s->running.head) {
        ms_request *r = s->running.head;
        ms_sched_release(s, r, 0);
        end_request(e, r, MS_FINISH_ERROR, msg);
    }
    while (s->waiting.head) {
        ms_request *r = s->waiting.head;
        ms_sched_release(s, r, 0);
        end_request(e, r, MS_FINISH_ERROR, msg);
    }
}

typedef struct sample_job {
    ms_engine *e;
} sample_job;

/* Groups [g0, g1) of this step's logit rows: each group is one request (own rng, own grammar), so
 * groups are independent; worker w owns sampler w. A group of several rows is a request verifying
 * its drafts: row j holds the target's logits after the last real token and drafts 1..j; each row is
 * sampled exactly as a plain decode step would sample it, in order, until the sampled token differs
 * from the draft (that token is the target's), a stop, the grammar's end or max_tokens. */
static void sample_range(void *ctx, int64_t g0, int64_t g1, int worker) {
    ms_engine *e = ((sample_job *)ctx)->e;
    ms_sampler *sm = worker < e->n_wsamplers ? &e->wsamplers[worker] : &e->sampler;
    for (int64_t g = g0; g < g1; g++) {
        const int row0 = e->grp_row0[g], nrow = e->grp_nrow[g];
        ms_request *r = e->sched.logit_req[row0];
        const ms_sampling *sp = &REQ_EXT(r)->sp;
        ms_grammar_matcher *gm = sp->grammar;
        const int base = r->n_tokens - r->spec_n; /* tokens up to the last real one */
        int emit = 0;
        for (int j = 0; j < nrow; j++) {
            const int row = row0 + j;
            ms_token_event *ev = &e->row_ev[row];
            memset(ev, 0, sizeof *ev);
            emit = j + 1;
            int32_t tok;
            if (e->ids_step) { /* plain greedy, no grammar: the device took the row's argmax */
                tok = ev->token = e->step_ids[row];
            } else {
                float *lg = e->logits + (size_t)row * e->exec.vocab;
                if (gm && ms_grammar_matcher_active(gm)) {
                    /* the stop ids stay allowed once the grammar may end */
                    int32_t stops[2 * MS_MAX_STOP_IDS];
                    int ns = 0;
                    for (int i = 0; i < sp->n_stop_ids; i++) stops[ns++] = sp->stop_ids[i];
                    if (!sp->ignore_eos)
                        for (int i = 0; i < e->exec.n_eos; i++) stops[ns++] = e->exec.eos_ids[i];
                    if (ms_sampler_apply_grammar(sm, gm, stops, ns, lg) == 0) {
                        e->row_tok[row] = -1; /* the grammar cannot go on: run_step ends the request */
                        break;
                    }
                } else if (gm) {
                    /* the free prefix (thinking): the reply may not end before the constrained content
                     * has begun, else a "stop" would come with no content at all */
                    for (int i = 0; i < sp->n_stop_ids; i++)
                        if (sp->stop_ids[i] >= 0 && sp->stop_ids[i] < e->exec.vocab) lg[sp->stop_ids[i]] = -INFINITY;
                    if (!sp->ignore_eos)
                        for (int i = 0; i < e->exec.n_eos; i++)
                            if (e->exec.eos_ids[i] >= 0 && e->exec.eos_ids[i] < e->exec.vocab) lg[e->exec.eos_ids[i]] = -INFINITY;
                }
                tok = ms_sampler_sample(sm, sp, lg, r->tokens, r->n_prompt, base + j, REQ_EXT(r)->rng, ev);
            }
            e->row_tok[row] = tok;
            if (gm) ms_grammar_matcher_accept(gm, tok); /* a stop id is refused and ends the request anyway */
            if (j + 1 == nrow || tok != r->tokens[base + j]) break; /* the last row, or a rejected draft */
            const int n_gen = base + j + 1 - r->n_prompt;
            if (is_stop(e, r, n_gen, tok) || (gm && ms_grammar_matcher_done(gm)) || n_gen >= r->max_new) break;
        }
        e->grp_emit[g] = emit;
    }
}

/* Samples the step's n logit rows (e->n_groups groups) into row_tok / row_ev: on the sampling pool
 * when there are several groups (a 150k-vocabulary row costs ~0.1-1 ms), else inline. Falls back to
 * one sampler when the per-worker ones cannot be made. */
static void sample_rows(ms_engine *e, int n) {
    if (n > e->row_cap) {
        int cap = n > 2 * e->row_cap ? n : 2 * e->row_cap;
        int32_t *t = realloc(e->row_tok, sizeof(int32_t) * (size_t)cap);
        if (t) e->row_tok = t;
        ms_token_event *v = t ? realloc(e->row_ev, sizeof(ms_token_event) * (size_t)cap) : NULL;
        if (v) e->row_ev = v;
        if (t && v) e->row_cap = cap;
    }
    MS_ASSERT(n <= e->row_cap); /* the rows fit (engine create reserved max_running_requests) */
    if (!e->spool && n >= 4) {
        e->spool = ms_pool_create(8);
        int nw = e->spool ? ms_pool_size(e->spool) : 0;
        ms_sampler *ws = nw ? calloc((size_t)nw, sizeof *ws) : NULL;
        int ok = ws != NULL;
        for (int i = 0; ok && i < nw; i++) {
            ms_err err = {0};
            if (ms_sampler_init(&ws[i], e->exec.vocab, &err) != MS_OK) {
                for (int j = 0; j < i; j++) ms_sampler_destroy(&ws[j]);
                ok = 0;
            }
        }
        if (ok) e->wsamplers = ws, e->n_wsamplers = nw;
        else free(ws);
    }
    sample_job job = {e};
    const int ng = e->n_groups;
    if (e->spool && e->n_wsamplers && ng >= 4) ms_pool_run(e->spool, ng, 2, sample_range, &job);
    else sample_range(&job, 0, ng, 1 << 30);
}

/* --check-numerics found NaN/Inf in a step: writes each of its sequences' token ids up to the step's
 * context (what `moeserve compare --ids` replays) to $MS_NUMERICS_DUMP_DIR (default /tmp) and appends
 * the file's path to the error message. Best effort: a file that cannot be written is named so. */
static void numerics_dump(ms_engine *e, const ms_batch *b, ms_err *err) {
    const char *dir = getenv("MS_NUMERICS_DUMP_DIR");
    char path[512];
    snprintf(path, sizeof path, "%s/moeserve-numerics-%ld-%llu.txt", dir && *dir ? dir : "/tmp", (long)getpid(),
             (unsigned long long)e->acc.steps);
    FILE *fp = fopen(path, "w");
    if (fp) {
        fprintf(fp, "# %s\n# one line per sequence of the step: request id, context, token ids (moeserve compare --ids)\n",
                err->msg);
        for (int i = 0; i < b->n_seqs; i++) {
            const ms_request *r = e->sched.seq_req[i];
            fprintf(fp, "request %llu ctx %d ids ", (unsigned long long)r->id, b->ctx_len[i]);
            for (int j = 0; j < b->ctx_len[i]; j++) fprintf(fp, "%s%d", j ? "," : "", r->tokens[j]);
            fputc('\n', fp);
        }
    }
    int ok = fp && fclose(fp) == 0;
    size_t n = strlen(err->msg);
    snprintf(err->msg + n, sizeof err->msg - n, ok ? "; step inputs in %s" : "; could not write the step inputs to %s", path);
}

/* Accounts one step of dt seconds that admitted n requests, if requests were waiting before it. */
static void note_admissions(ms_engine *e, int queued, double dt, int n) {
    if (!queued || dt <= 0) return;
    double d = exp(-dt / 5.0);
    e->adm_busy_s = e->adm_busy_s * d + dt;
    e->adm_busy_n = e->adm_busy_n * d + n;
}

/* ---- speculative decoding: drafts ---- */

/* Fills a block table of S sequences from their requests' pages, rows as long as the longest
 * context (ctx[i] tokens each); returns the row length. */
static int fill_block_table(ms_engine *e, ms_request **req, const int32_t *ctx, int S) {
    const int ps = e->sched.cfg.page_size;
    int mb = 1;
    for (int i = 0; i < S; i++) mb = (ctx[i] + ps - 1) / ps > mb ? (ctx[i] + ps - 1) / ps : mb;
    for (int i = 0; i < S; i++)
        memcpy(e->d_bt + (size_t)i * mb, req[i]->pages, sizeof(int32_t) * (size_t)((ctx[i] + ps - 1) / ps));
    return mb;
}

/* After a step: every request of it that is now decoding gets its draft tokens for the next step.
 * With the executor's draft layer (MTP), first one draft step over the step's positions whose KV is
 * kept (token = the next token, hidden row = the main step's row: this also fills the MTP layer's
 * own cache, prefill chunks included), whose last row gives each decoding request's first draft;
 * then chained one-token steps (hidden = the draft layer's own output row) give the others. Drafts
 * are greedy (the draft distribution is one-hot). A failing draft step costs only the drafts. The
 * chained steps (one token per sequence, logits on each) run as the forward's recorded draft graphs;
 * the first (several tokens per sequence, logits on the last) runs op by op. */
static void draft_phase(ms_engine *e, const ms_batch *b) {
    ms_sched *s = &e->sched;
    const int N = e->cfg.speculative_num_steps, V = e->exec.vocab, ps = s->cfg.page_size;
    if (N <= 0) return;
    const int use_mtp = e->exec.draft && (!e->cfg.draft_fn || e->cfg.draft_fn_after_layer);
    const int dev_ids = e->exec.draft_argmax != NULL; /* drafts are greedy: their ids from the device */
    int T = 0, S = 0, NL = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        if (e->seq_dead[i]) continue;
        ms_request *r = s->seq_req[i];
        const int t0 = b->seq_start[i], p0 = b->positions[t0];
        int n = b->seq_start[i + 1] - t0;
        if (n > r->n_computed - p0) n = r->n_computed - p0;
        if (n < 1) continue;
        const int n_gen = r->n_tokens - r->n_prompt;
        const int drafting = r->spec_n == 0 && r->n_tokens == r->n_computed + 1 && r->max_new - n_gen >= 2 &&
                             p0 + n == r->n_computed;
        if (use_mtp) {
            e->d_start[S] = T;
            for (int j = 0; j < n; j++, T++) {
                e->d_tok[T] = r->tokens[p0 + j + 1];
                e->d_pos[T] = p0 + j;
                e->d_slot[T] = b->slot_mapping[t0 + j];
                e->d_hidx[T] = t0 + j;
            }
            e->d_ctx[S] = p0 + n;
            e->d_sreq[S++] = r;
            if (drafting) e->d_lidx[NL] = T - 1;
        }
        if (drafting) e->d_lreq[NL++] = r;
    }
    if (use_mtp && T > 0) {
        e->d_start[S] = T;
        int mb = fill_block_table(e, e->d_sreq, e->d_ctx, S);
        ms_batch db = {T, S, e->d_tok, e->d_pos, e->d_start, e->d_ctx, e->d_slot, e->d_bt, mb, ps, NL, e->d_lidx};
        ms_err err = {0};
        int rc = dev_ids ? e->exec.draft_argmax(e->exec.ctx, &db, 0, e->d_hidx, e->d_ids, &err)
                         : e->exec.draft(e->exec.ctx, &db, 0, e->d_hidx, e->d_logits, &err);
        e->acc.spec_draft_steps++;
        if (rc != MS_OK) {
            if (!e->draft_warned++) MS_LOGW("engine: a draft step failed (%s); those requests decode without drafts", err.msg);
            return;
        }
    }
    int max_nd = 0;
    for (int q = 0; q < NL; q++) {
        ms_request *r = e->d_lreq[q];
        const int n_gen = r->n_tokens - r->n_prompt;
        int n_max = N < r->max_new - n_gen - 1 ? N : r->max_new - n_gen - 1;
        int nd = ms_sched_reserve_drafts(s, r, n_max);
        int32_t *d = e->drafts + (size_t)q * N;
        if (use_mtp && nd > 0) d[0] = dev_ids ? e->d_ids[q] : (int32_t)ms_greedy_argmax(e->d_logits + (size_t)q * V, V);
        e->d_nd[q] = nd;
        e->d_prev[q] = q; /* its row in the last draft step's logit rows */
        max_nd = nd > max_nd ? nd : max_nd;
    }
    /* chained draft steps: draft j+1 from draft j at position n_computed + j - 1 */
    for (int j = 1; use_mtp && j < max_nd; j++) {
        int n = 0;
        for (int q = 0; q < NL; q++) {
            if (e->d_nd[q] <= j) continue;
            ms_request *r = e->d_lreq[q];
            const int p = r->n_computed + j - 1;
            e->d_tok[n] = e->drafts[(size_t)q * N + j - 1];
            e->d_pos[n] = p;
            e->d_slot[n] = r->pages[p / ps] * ps + p % ps;
            e->d_hidx[n] = e->d_prev[q];
            e->d_start[n] = n;
            e->d_ctx[n] = p + 1;
            e->d_lidx[n] = n;
            e->d_sreq[n] = r;
            e->d_prev[q] = n;
            n++;
        }
        e->d_start[n] = n;
        int mb = fill_block_table(e, e->d_sreq, e->d_ctx, n);
        ms_batch db = {n, n, e->d_tok, e->d_pos, e->d_start, e->d_ctx, e->d_slot, e->d_bt, mb, ps, n, e->d_lidx};
        ms_err err = {0};
        int rc = dev_ids ? e->exec.draft_argmax(e->exec.ctx, &db, 1, e->d_hidx, e->d_ids, &err)
                         : e->exec.draft(e->exec.ctx, &db, 1, e->d_hidx, e->d_logits, &err);
        e->acc.spec_draft_steps++;
        if (rc != MS_OK) {
            if (!e->draft_warned++) MS_LOGW("engine: a draft step failed (%s); drafts cut short", err.msg);
            for (int q = 0; q < NL; q++)
                if (e->d_nd[q] > j) e->d_nd[q] = j;
            break;
        }
        for (int q = 0; q < NL; q++)
            if (e->d_nd[q] > j)
                e->drafts[(size_t)q * N + j] = dev_ids ? e->d_ids[e->d_prev[q]] : (int32_t)ms_greedy_argmax(e->d_logits + (size_t)e->d_prev[q] * V, V);
    }
    for (int q = 0; q < NL; q++) {
        ms_request *r = e->d_lreq[q];
        int nd = e->d_nd[q];
        if (e->cfg.draft_fn && nd > 0) { /* the hook's tokens (after the layer's steps, when asked) */
            int got = e->cfg.draft_fn(e->cfg.draft_user, r->tokens, r->n_tokens, r->n_prompt, e->drafts + (size_t)q * N, nd);
            nd = got < 0 ? 0 : got < nd ? got : nd;
        }
        ms_sched_set_drafts(s, r, e->drafts + (size_t)q * N, nd);
    }
}

static void run_step(ms_engine *e) {
    ms_sched *s = &e->sched;
    const int queued = s->waiting.n > 0;
    const double t_step = ms_now();
    const ms_batch *b = ms_sched_step(s);
    if (!b) return;
    int n_admitted = 0;
    e->acc.steps++;
    e->need_check = 1;
    ms_err err = {0};
    int rc = MS_OK;
    /* all rows plain greedy: their ids from the device instead of the logits (the same tokens) */
    e->ids_step = e->exec.forward_argmax != NULL && b->n_logits > 0;
    for (int row = 0; e->ids_step && row < b->n_logits; row++) {
        const ms_request *r = s->logit_req[row];
        e->ids_step = ms_sampler_plain_greedy(&REQ_EXT(r)->sp, r->n_prompt, r->n_tokens - r->spec_n);
    }
    if (!e->ids_step && b->n_logits > e->logits_rows) {
        /* grow geometrically: the buffer is page-locked for the GPU, which costs time per change */
        int rows = b->n_logits > 2 * e->logits_rows ? b->n_logits : 2 * e->logits_rows;
        if (rows > e->row_cap && b->n_logits <= e->row_cap) rows = e->row_cap; /* never more rows than a step has */
        if (e->logits && e->exec.unpin) e->exec.unpin(e->exec.ctx, e->logits);
        float *nl = realloc(e->logits, (size_t)rows * (size_t)e->exec.vocab * sizeof(float));
        if (nl) {
            e->logits = nl;
            e->logits_rows = rows;
        }
        if (e->logits && e->exec.pin)
            e->exec.pin(e->exec.ctx, e->logits, (size_t)e->logits_rows * (size_t)e->exec.vocab * sizeof(float));
        if (!nl) {
            rc = ms_errf(&err, MS_ERR_NOMEM, "engine: out of memory for %d logits rows of %d", b->n_logits, e->exec.vocab);
        }
    }
    const double t0 = ms_now();
    e->acc.schedule_seconds += t0 - t_step;
    for (int i = 0; i < b->n_seqs; i++)
        if (s->seq_req[i]->t_admit == 0) s->seq_req[i]->t_admit = t0, n_admitted++;
    if (rc == MS_OK) {
        rc = e->ids_step ? e->exec.forward_argmax(e->exec.ctx, b, e->step_ids, &err)
                         : e->exec.forward(e->exec.ctx, b, e->logits, &err);
        e->acc.forward_seconds += ms_now() - t0;
        e->acc.argmax_steps += rc == MS_OK && e->ids_step;
        e->acc.decode_steps += rc == MS_OK && b->n_tokens == b->n_seqs;
        if (rc != MS_OK && err.msg[0] == '\0') ms_errf(&err, rc, "forward failed (%s)", ms_code_name(rc));
    }
    if (rc != MS_OK) {
        e->acc.forward_errors++;
        if (rc == MS_ERR_NUMERICS) numerics_dump(e, b, &err);
        MS_LOGE("engine: forward of %d tokens / %d sequences failed: %s", b->n_tokens, b->n_seqs, err.msg);
        /* decide first, so that nothing is accepted once the failed requests hear about it */
        int fatal = e->exec.healthy && !e->exec.healthy(e->exec.ctx);
        if (fatal) {
            pthread_mutex_lock(&e->mu);
            e->healthy = 0;
            snprintf(e->fatal_msg, sizeof e->fatal_msg, "the engine stopped after a failed forward: %s", err.msg);
            pthread_mutex_unlock(&e->mu);
            MS_LOGE("engine: executor cannot continue; failing all requests");
        }
        for (int i = 0; i < b->n_seqs; i++) {
            ms_request *r = s->seq_req[i];
            ms_sched_release(s, r, 0);
            end_request(e, r, MS_FINISH_ERROR, err.msg);
        }
        if (fatal) fail_all(e, e->fatal_msg);
        return;
    }
    ms_sched_commit(s);
    const double t1 = ms_now();
    /* group the logit rows by request (add_seq writes a request's rows together, in sequence order) */
    e->n_groups = 0;
    for (int row = 0, seq = 0; row < b->n_logits;) {
        ms_request *r = s->logit_req[row];
        int n = 1;
        while (row + n < b->n_logits && s->logit_req[row + n] == r) n++;
        while (seq + 1 < b->n_seqs && b->seq_start[seq + 1] <= b->logit_idx[row]) seq++;
        e->grp_row0[e->n_groups] = row;
        e->grp_nrow[e->n_groups] = n;
        e->grp_seq[e->n_groups++] = seq;
        row += n;
    }
    memset(e->seq_dead, 0, (size_t)b->n_seqs);
    sample_rows(e, b->n_logits);
    for (int g = 0; g < e->n_groups; g++) {
        const int row0 = e->grp_row0[g], emit = e->grp_emit[g];
        ms_request *r = s->logit_req[row0];
        const int spec = r->spec_n, base = r->n_tokens - spec;
        const int dead = emit > 0 && e->row_tok[row0 + emit - 1] < 0; /* no token can continue the grammar */
        const int n_ok = dead ? emit - 1 : emit;
        if (spec) {
            int k = 0;
            while (k < n_ok && k < spec && e->row_tok[row0 + k] == r->tokens[base + k]) k++;
            e->acc.spec_verifications++;
            e->acc.spec_draft_tokens += (uint64_t)spec;
            e->acc.spec_accepted_tokens += (uint64_t)k;
            /* keep the verified tokens and the target's own; the KV of rejected drafts goes */
            for (int j = 0; j < n_ok; j++) r->tokens[base + j] = e->row_tok[row0 + j];
            e->acc.spec_pages_freed += (uint64_t)ms_sched_rollback(s, r, base + n_ok);
        } else {
            for (int j = 0; j < n_ok; j++) ms_sched_append_token(s, r, e->row_tok[row0 + j]);
        }
        int finish = MS_FINISH_NONE;
        for (int j = 0; j < n_ok; j++) {
            ms_token_event ev = e->row_ev[row0 + j];
            int32_t tok = e->row_tok[row0 + j];
            e->acc.generated_tokens_total++;
            int n_gen = base + j + 1 - r->n_prompt;
            const ms_grammar_matcher *gm = REQ_EXT(r)->sp.grammar;
            if (j == n_ok - 1 && !dead)
                finish = is_stop(e, r, n_gen, tok)                ? MS_FINISH_STOP
                       : gm && ms_grammar_matcher_done(gm)        ? MS_FINISH_GRAMMAR_END
                       : n_gen >= r->max_new                      ? MS_FINISH_LENGTH
                                                                  : MS_FINISH_NONE;
            ev.req_id = r->id;
            ev.finish = finish;
            ev.n_prompt = r->n_prompt;
            ev.n_cached = r->n_cached;
            ev.n_generated = n_gen;
            ev.t_submit = r->t_submit;
            ev.t_admit = r->t_admit;
            if (REQ_EXT(r)->cb) REQ_EXT(r)->cb(REQ_EXT(r)->user, &ev);
        }
        if (dead) {
            ms_sched_release(s, r, 1);
            e->seq_dead[e->grp_seq[g]] = 1;
            end_request(e, r, MS_FINISH_GRAMMAR_DEAD, NULL);
        } else if (finish != MS_FINISH_NONE) {
            ms_sched_release(s, r, 1);
            e->seq_dead[e->grp_seq[g]] = 1;
            e->acc.requests_finished++;
            req_free(r);
        }
    }
    draft_phase(e, b);
    e->acc.sample_seconds += ms_now() - t1;
    note_admissions(e, queued, ms_now() - t_step, n_admitted);
}

static ms_request *find_request(ms_sched *s, uint64_t id) {
    for (ms_request *r = s->running.head; r; r = r->next) if (r->id == id) return r;
    for (ms_request *r = s->waiting.head; r; r = r->next) if (r->id == id) return r;
    return NULL;
}

static void publish_stats(ms_engine *e) {
    ms_sched *s = &e->sched;
    ms_engine_stats st = e->acc;
    st.running = s->running.n;
    st.waiting = s->waiting.n;
    st.prompt_tokens_total = s->prompt_tokens;
    st.cached_tokens_total = s->cached_tokens;
    st.preemptions = s->preemptions;
    st.kv_pages_total = s->pool.n_pages;
    st.kv_pages_used = ms_sched_pages_used(s);
    st.kv_pages_cached = ms_sched_pages_cached(s);
    st.prefix_hit_tokens = s->radix.hit_tokens;
    st.prefix_query_tokens = s->radix.query_tokens;
    /* a rate from less than half a second of queued steps says little: not measured yet */
    st.admit_rate = e->adm_busy_s >= 0.5 ? e->adm_busy_n / e->adm_busy_s : -1;
    pthread_mutex_lock(&e->mu);
    e->stats = st;
    e->pub_waiting = s->waiting.n;
    e->pub_admit_rate = st.admit_rate;
    pthread_mutex_unlock(&e->mu);
}

static void idle_check(ms_engine *e) {
    ms_err err = {0};
    if (ms_sched_check(&e->sched, &err) != MS_OK) {
        e->acc.integrity_failures++;
        MS_LOGE("engine: integrity check failed: %s", err.msg);
    }
}

static void *engine_main(void *arg) {
    ms_engine *e = arg;
    ms_sched *s = &e->sched;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->stop && !e->inbox_head && e->n_aborts == 0 && s->running.n == 0 && s->waiting.n == 0) {
            if (e->need_check && e->cfg.check_integrity) {
                e->need_check = 0;
                pthread_mutex_unlock(&e->mu);
                idle_check(e);
                publish_stats(e);
                pthread_mutex_lock(&e->mu);
                continue;
            }
            pthread_cond_wait(&e->cv, &e->mu);
        }
        if (e->stop) break;
        const double t_busy = ms_now();
        ms_request *in = e->inbox_head;
        e->inbox_head = e->inbox_tail = NULL;
        e->n_inbox = 0;
        /* swap the abort list with the thread's work array */
        uint64_t *ab = e->aborts;
        int n_ab = e->n_aborts, cap_ab = e->cap_aborts;
        e->aborts = e->abort_work;
        e->cap_aborts = e->cap_abort_work;
        e->n_aborts = 0;
        e->abort_work = ab;
        e->cap_abort_work = cap_ab;
        int healthy = e->healthy;
        pthread_mutex_unlock(&e->mu);

        while (in) {
            ms_request *r = in;
            in = in->next;
            r->next = r->prev = NULL;
            ms_err err = {0};
            if (!healthy) end_request(e, r, MS_FINISH_ERROR, e->fatal_msg);
            else if (ms_sched_add(s, r, &err) != MS_OK) end_request(e, r, MS_FINISH_ERROR, err.msg);
        }
        for (int i = 0; i < n_ab; i++) {
            ms_request *r = find_request(s, ab[i]);
            if (!r) continue;
            ms_sched_release(s, r, 1);
            end_request(e, r, MS_FINISH_ABORT, NULL);
            e->need_check = 1;
        }
        if (healthy) run_step(e);
        else fail_all(e, e->fatal_msg);
        e->acc.busy_seconds += ms_now() - t_busy; /* this iteration's publishing falls in the next one's */
        publish_stats(e);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- public API ---- */

static void free_step_arrays(ms_engine *e) {
    void *all[] = {e->grp_row0, e->grp_nrow, e->grp_seq, e->grp_emit, e->seq_dead, e->d_tok, e->d_pos, e->d_slot,
                   e->d_hidx, e->d_start, e->d_ctx, e->d_bt, e->d_lidx, e->d_prev, e->drafts, e->d_sreq, e->d_lreq,
                   e->d_nd, e->d_logits, e->step_ids, e->d_ids};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* The step's row groups, and with speculative decoding the draft steps' batch arrays: sized once
 * for the largest step (every token a row; every running request a sequence). */
static int alloc_step_arrays(ms_engine *e, ms_err *err) {
    const size_t nt = (size_t)e->exec.max_batch_tokens, ns = (size_t)e->sched.cfg.max_running_requests + 1;
    int ok = (e->grp_row0 = malloc(nt * sizeof(int))) && (e->grp_nrow = malloc(nt * sizeof(int))) &&
             (e->grp_seq = malloc(nt * sizeof(int))) && (e->grp_emit = malloc(nt * sizeof(int))) &&
             (e->seq_dead = calloc(ns, 1)) && (e->step_ids = malloc(nt * sizeof(int32_t)));
    const int N = e->cfg.speculative_num_steps;
    if (ok && N > 0) {
        const size_t mbs = (size_t)e->sched.max_blocks_seq;
        ok = (e->d_tok = malloc(nt * 4)) && (e->d_pos = malloc(nt * 4)) && (e->d_slot = malloc(nt * 4)) &&
             (e->d_hidx = malloc(nt * 4)) && (e->d_start = malloc((ns + 1) * 4)) && (e->d_ctx = malloc(ns * 4)) &&
             (e->d_bt = malloc(ns * mbs * 4)) && (e->d_lidx = malloc(ns * 4)) && (e->d_prev = malloc(ns * 4)) &&
             (e->drafts = malloc(ns * (size_t)N * 4)) && (e->d_sreq = malloc(ns * sizeof(ms_request *))) &&
             (e->d_lreq = malloc(ns * sizeof(ms_request *))) && (e->d_nd = malloc(ns * sizeof(int))) &&
             (e->d_ids = malloc(ns * sizeof(int32_t))) &&
             (e->exec.draft_argmax || (e->d_logits = malloc(ns * (size_t)e->exec.vocab * sizeof(float))));
    }
    return ok ? MS_OK : ms_errf(err, MS_ERR_NOMEM, "engine: out of memory for step arrays (%zu tokens)", nt);
}

int ms_engine_create(const ms_engine_config *cfg_in, const ms_executor *exec, ms_engine **out, ms_err *err) {
    *out = NULL;
    ms_engine_config cfg = *cfg_in;
    if (!exec || !exec->forward || exec->vocab < 1 || exec->n_pages < 1 || exec->page_size < 1 || exec->max_batch_tokens < 1)
        return ms_errf(err, MS_ERR_INVALID, "engine: the executor needs forward, vocab, n_pages, page_size and max_batch_tokens >= 1");
    if (exec->n_eos < 0 || exec->n_eos > MS_MAX_STOP_IDS)
        return ms_errf(err, MS_ERR_INVALID, "engine: executor n_eos %d out of [0, %d]", exec->n_eos, MS_MAX_STOP_IDS);
    if (cfg.page_size == 0) cfg.page_size = exec->page_size;
    if (cfg.page_size != exec->page_size)
        return ms_errf(err, MS_ERR_INVALID, "engine: page_size %d differs from the executor's KV page size %d", cfg.page_size,
                       exec->page_size);
    long long exec_tokens = (long long)exec->n_pages * exec->page_size;
    if (cfg.max_total_tokens <= 0 || cfg.max_total_tokens > exec_tokens)
        cfg.max_total_tokens = exec_tokens > INT32_MAX ? INT32_MAX : (int)exec_tokens;
    if (cfg.context_length <= 0) cfg.context_length = cfg.max_total_tokens;
    if (cfg.max_running_requests > exec->max_batch_tokens) cfg.max_running_requests = exec->max_batch_tokens;
    if (cfg.max_running_requests < 1 || cfg.max_waiting_requests < 1 || cfg.chunked_prefill_size < 1 ||
        cfg.max_prefill_tokens < 1 || cfg.max_total_tokens < cfg.page_size)
        return ms_errf(err, MS_ERR_INVALID,
                       "engine config: max_running_requests %d, max_waiting_requests %d, chunked_prefill_size %d, "
                       "max_prefill_tokens %d must be >= 1 and max_total_tokens %d >= page_size",
                       cfg.max_running_requests, cfg.max_waiting_requests, cfg.chunked_prefill_size,
                       cfg.max_prefill_tokens, cfg.max_total_tokens);
    if (cfg.speculative_num_steps < 0 || cfg.speculative_num_steps > 64)
        return ms_errf(err, MS_ERR_INVALID, "flag --speculative-num-steps %d is not in [0, 64]", cfg.speculative_num_steps);
    if (cfg.speculative_num_steps > 0 && !cfg.draft_fn && !exec->draft)
        return ms_errf(err, MS_ERR_INVALID,
                       "flag --speculative-num-steps %d: speculative decoding needs a draft layer and this executor has none",
                       cfg.speculative_num_steps);
    ms_engine *e = calloc(1, sizeof *e);
    if (!e) return ms_errf(err, MS_ERR_NOMEM, "engine: out of memory");
    e->cfg = cfg;
    e->exec = *exec;
    e->healthy = 1;
    e->pub_admit_rate = e->stats.admit_rate = -1; /* not measured */
    e->next_id = 1;
    ms_sched_config sc = {0};
    sc.n_pages = cfg.max_total_tokens / cfg.page_size;
    sc.page_size = cfg.page_size;
    sc.max_running_requests = cfg.max_running_requests;
    sc.max_waiting_requests = INT32_MAX; /* the engine bounds the queue at submit */
    sc.max_batch_tokens = exec->max_batch_tokens;
    sc.max_prefill_tokens = cfg.max_prefill_tokens;
    sc.chunked_prefill_size = cfg.chunked_prefill_size;
    sc.context_length = cfg.context_length;
    sc.enable_prefix_cache = cfg.enable_prefix_cache;
    sc.max_draft_tokens = cfg.speculative_num_steps;
    int rc = ms_sched_init(&e->sched, &sc, err);
    if (rc == MS_OK) rc = ms_sampler_init(&e->sampler, exec->vocab, err);
    if (rc == MS_OK) {
        e->row_cap = sc.max_running_requests > 0 ? sc.max_running_requests : 1;
        e->row_tok = malloc(sizeof(int32_t) * (size_t)e->row_cap);
        e->row_ev = malloc(sizeof(ms_token_event) * (size_t)e->row_cap);
        if (!e->row_tok || !e->row_ev) rc = ms_errf(err, MS_ERR_NOMEM, "engine: out of memory for sampled rows");
    }
    if (rc == MS_OK) rc = alloc_step_arrays(e, err);
    if (rc != MS_OK) {
        ms_sched_destroy(&e->sched);
        ms_sampler_destroy(&e->sampler);
        free_step_arrays(e);
        free(e->row_tok);
        free(e->row_ev);
        free(e);
        return rc;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ms_rng_seed(e->seed_rng, (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ (uint64_t)(uintptr_t)e);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    publish_stats(e);
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        ms_engine_destroy(e);
        return ms_errf(err, MS_ERR_RUNTIME, "engine: cannot start the engine thread");
    }
    e->thread_started = 1;
    *out = e;
    return MS_OK;
}

void ms_engine_destroy(ms_engine *e) {
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    /* the thread is gone: everything is ours */
    if (e->acc.steps)
        MS_LOGI("engine: %llu steps (%llu pure decode), %.1f s in forward, %.1f s sampling and callbacks",
                (unsigned long long)e->acc.steps, (unsigned long long)e->acc.decode_steps, e->acc.forward_seconds,
                e->acc.sample_seconds);
    while (e->inbox_head) {
        ms_request *r = e->inbox_head;
        e->inbox_head = r->next;
        end_request(e, r, MS_FINISH_ABORT, NULL);
    }
    ms_sched *s = &e->sched;
    while (s->running.head) {
        ms_request *r = s->running.head;
        ms_sched_release(s, r, 0);
        end_request(e, r, MS_FINISH_ABORT, NULL);
    }
    while (s->waiting.head) {
        ms_request *r = s->waiting.head;
        ms_sched_release(s, r, 0);
        end_request(e, r, MS_FINISH_ABORT, NULL);
    }
    ms_sched_destroy(s);
    ms_sampler_destroy(&e->sampler);
    for (int i = 0; i < e->n_wsamplers; i++) ms_sampler_destroy(&e->wsamplers[i]);
    free(e->wsamplers);
    if (e->spool) ms_pool_destroy(e->spool);
    free(e->row_tok);
    free(e->row_ev);
    free_step_arrays(e);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    if (e->logits && e->exec.unpin) e->exec.unpin(e->exec.ctx, e->logits);
    free(e->logits);
    free(e->aborts);
    free(e->abort_work);
    free(e);
}

static int check_sampling(const ms_sampling *sp, int vocab, ms_err *err) {
    if (!(sp->temperature >= 0.0f) || !isfinite(sp->temperature))
        return ms_errf(err, MS_ERR_INVALID, "temperature %g must be a finite number >= 0", (double)sp->temperature);
    if (!(sp->top_p > 0.0f && sp->top_p <= 1.0f)) return ms_errf(err, MS_ERR_INVALID, "top_p %g must be in (0, 1]", (double)sp->top_p);
    if (!(sp->min_p >= 0.0f && sp->min_p <= 1.0f)) return ms_errf(err, MS_ERR_INVALID, "min_p %g must be in [0, 1]", (double)sp->min_p);
    if (!isfinite(sp->presence_penalty) || !isfinite(sp->frequency_penalty))
        return ms_errf(err, MS_ERR_INVALID, "presence_penalty and frequency_penalty must be finite");
    if (!(sp->repetition_penalty > 0.0f) || !isfinite(sp->repetition_penalty))
        return ms_errf(err, MS_ERR_INVALID, "repetition_penalty %g must be > 0", (double)sp->repetition_penalty);
    if (sp->top_logprobs < 0 || sp->top_logprobs > MS_MAX_TOP_LOGPROBS)
        return ms_errf(err, MS_ERR_INVALID, "top_logprobs %d must be in [0, %d]", sp->top_logprobs, MS_MAX_TOP_LOGPROBS);
    if (sp->n_stop_ids < 0 || sp->n_stop_ids > MS_MAX_STOP_IDS)
        return ms_errf(err, MS_ERR_INVALID, "stop_token_ids: %d ids, at most %d", sp->n_stop_ids, MS_MAX_STOP_IDS);
    for (int i = 0; i < sp->n_stop_ids; i++)
        if (sp->stop_ids[i] < 0 || sp->stop_ids[i] >= vocab)
            return ms_errf(err, MS_ERR_INVALID, "stop_token_ids[%d] = %d is outside the vocabulary (%d)", i, sp->stop_ids[i], vocab);
    return MS_OK;
}

int ms_engine_submit(ms_engine *e, const int32_t *prompt, int n_prompt, const ms_sampling *sp, ms_token_cb cb, void *user,
                     uint64_t *req_id, ms_err *err) {
    const ms_engine_config *c = &e->cfg;
    if (n_prompt < 1 || !prompt) return ms_errf(err, MS_ERR_INVALID, "the prompt is empty");
    if (n_prompt > c->context_length)
        return ms_errf(err, MS_ERR_INVALID, "the prompt has %d tokens, more than the context length %d", n_prompt, c->context_length);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= e->exec.vocab)
            return ms_errf(err, MS_ERR_INVALID, "prompt token %d at position %d is outside the vocabulary (%d)", prompt[i], i, e->exec.vocab);
    MS_TRY(check_sampling(sp, e->exec.vocab, err));
    int max_new = sp->max_tokens > 0 ? sp->max_tokens : c->context_length - n_prompt;
    if (max_new < 1 || (long long)n_prompt + max_new > c->context_length)
        return ms_errf(err, MS_ERR_INVALID, "prompt (%d tokens) + max_tokens (%d) exceed the context length %d", n_prompt,
                       sp->max_tokens, c->context_length);
    int ps = c->page_size, n_pages = c->max_total_tokens / ps;
    if ((n_prompt + max_new - 1 + ps - 1) / ps > n_pages)
        return ms_errf(err, MS_ERR_INVALID, "prompt (%d tokens) + max_tokens (%d) exceed the KV cache capacity (%d tokens)",
                       n_prompt, max_new, n_pages * ps);
    ms_request *r = ms_request_create(0, prompt, n_prompt, max_new, ps);
    if (r && !(r->owner = calloc(1, sizeof(req_ext)))) ms_request_free(r), r = NULL;
    if (!r) return ms_errf(err, MS_ERR_NOMEM, "out of memory for a request of %d + %d tokens", n_prompt, max_new);
    REQ_EXT(r)->sp = *sp;
    REQ_EXT(r)->cb = cb;
    REQ_EXT(r)->user = user;
    pthread_mutex_lock(&e->mu);
    if (!e->healthy) {
        pthread_mutex_unlock(&e->mu);
        REQ_EXT(r)->sp.grammar = NULL; /* stays with the caller */
        req_free(r);
        return ms_errf(err, MS_ERR_RUNTIME, "%s", e->fatal_msg);
    }
    if (e->n_inbox + e->pub_waiting >= c->max_waiting_requests) {
        pthread_mutex_unlock(&e->mu);
        REQ_EXT(r)->sp.grammar = NULL; /* stays with the caller */
        req_free(r);
        return ms_errf(err, MS_ERR_BUSY, "the waiting queue is full (%d requests, max_waiting_requests)", c->max_waiting_requests);
    }
    double wait = ms_engine_queue_wait(e->n_inbox + e->pub_waiting, e->pub_admit_rate);
    if (c->max_queue_wait_s > 0 && wait > c->max_queue_wait_s) {
        pthread_mutex_unlock(&e->mu);
        REQ_EXT(r)->sp.grammar = NULL; /* stays with the caller */
        req_free(r);
        return ms_errf(err, MS_ERR_BUSY, "the estimated queue wait of %.1f s exceeds max_queue_wait_s %.1f", wait,
                       c->max_queue_wait_s);
    }
    r->id = e->next_id++;
    r->t_submit = ms_now();
    ms_rng_seed(REQ_EXT(r)->rng, sp->has_seed ? sp->seed : ms_rng_next(e->seed_rng));
    if (e->inbox_tail) e->inbox_tail->next = r;
    else e->inbox_head = r;
    e->inbox_tail = r;
    e->n_inbox++;
    if (req_id) *req_id = r->id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return MS_OK;
}

void ms_engine_abort(ms_engine *e, uint64_t req_id) {
    pthread_mutex_lock(&e->mu);
    if (e->n_aborts == e->cap_aborts) {
        int cap = e->cap_aborts ? e->cap_aborts * 2 : 64;
        uint64_t *na = realloc(e->aborts, (size_t)cap * sizeof *na);
        if (!na) { /* cannot queue it; the request will finish on its own */
            pthread_mutex_unlock(&e->mu);
            MS_LOGE("engine: out of memory queueing abort of request %llu", (unsigned long long)req_id);
            return;
        }
        e->aborts = na;
        e->cap_aborts = cap;
    }
    e->aborts[e->n_aborts++] = req_id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

double ms_engine_queue_wait(int waiting, double admit_rate) {
    if (waiting <= 0 || admit_rate < 0) return 0;
    if (admit_rate < 1e-3) return 1e9; /* requests wait and none got in for seconds */
    return waiting / admit_rate;
}

void ms_engine_get_stats(ms_engine *e, ms_engine_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    out->waiting += e->n_inbox; /* submitted, not yet taken by the engine thread */
    out->healthy = e->healthy;
    pthread_mutex_unlock(&e->mu);
}
