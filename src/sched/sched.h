/* sched.h - continuous batching: which tokens of which requests go into the next forward.
 *
 * Requests wait in a bounded FCFS queue, run, and finish. Each step builds one ms_batch that mixes
 * the decode token of every running request with prefill chunks (chunked prefill) of requests
 * still reading their prompt, under a per-step token budget. The scheduler owns the KV page pool
 * and the radix prefix cache: admission reuses cached prefix pages (skipping their prefill, but the
 * last token is always computed so there are logits), finished requests give their full pages to
 * the cache, and when pages run out the newest running request is preempted: its computed pages go
 * to the cache, it returns to the head of the queue, and its prompt + generated tokens are
 * recomputed later. All state is single-threaded (the engine thread); a step costs O(tokens and
 * pages in the batch) and never allocates.
 *
 * Per step: ms_sched_step -> executor forward -> ms_sched_commit (or ms_sched_release on failure)
 * -> for each logits row: sample, ms_sched_append_token, maybe ms_sched_release.
 *
 * Speculative decoding: a running request may carry draft tokens at the tail of its tokens
 * (ms_sched_set_drafts, pages reserved for them); the next step schedules the last real token and
 * its drafts together as one decode sequence with logits on every one of them (verification), or, when
 * the step has no room for them, drops the drafts. After the verification ms_sched_rollback keeps the
 * accepted tokens and returns the pages that only held rejected ones. Preemption drops drafts. */
#ifndef MS_SCHED_SCHED_H
#define MS_SCHED_SCHED_H

#include "core/status.h"
#include "kv/kv_pool.h"
#include "kv/radix.h"
#include "core/batch.h"
#include "sched/request.h"

#include <stdint.h>

typedef struct ms_sched_config {
    int n_pages;               /* KV pages the pool manages */
    int page_size;             /* tokens per page */
    int max_running_requests;
    int max_waiting_requests;  /* ms_sched_add fails with MS_ERR_BUSY beyond it */
    int max_batch_tokens;      /* tokens per forward (decode + prefill) */
    int max_prefill_tokens;    /* prefill tokens per step */
    int chunked_prefill_size;  /* prefill tokens per sequence per step */
    int context_length;        /* tokens per request at most (sizes the block table) */
    int enable_prefix_cache;
    int max_draft_tokens;      /* draft tokens a request may carry (0 = no speculative decoding) */
} ms_sched_config;

typedef struct ms_sched_list {
    ms_request *head, *tail;
    int n;
} ms_sched_list;

typedef struct ms_sched {
    ms_sched_config cfg;
    ms_kv_pool pool;
    ms_radix radix;
    ms_sched_list waiting, running;
    uint64_t step_no;
    /* the batch being built; arrays sized once to the limits */
    ms_batch batch;
    int32_t *token_ids, *positions, *slot_mapping; /* [max_batch_tokens] */
    int32_t *seq_start;                            /* [max_running + 1] */
    int32_t *ctx_len;                              /* [max_running] */
    int32_t *logit_idx;                            /* [max_batch_tokens] */
    int32_t *block_table;                          /* [max_running * max_blocks_seq] */
    int max_blocks_seq;                            /* pages one request can hold at most */
    ms_request **seq_req;                          /* [max_running] request of each sequence */
    ms_request **logit_req;                        /* [max_batch_tokens] request of each logits row */
    /* counters */
    uint64_t preemptions;
    uint64_t prompt_tokens, cached_tokens;         /* at first admission */
    uint64_t draft_pages_freed;                    /* pages returned by ms_sched_rollback */
} ms_sched;

/* Validates cfg (all sizes >= 1) and allocates the pool, cache and batch arrays. */
int ms_sched_init(ms_sched *s, const ms_sched_config *cfg, ms_err *err);
/* Frees everything. Requests still queued are released (pages returned) but not freed. */
void ms_sched_destroy(ms_sched *s);

/* Appends a new request (state NEW) to the waiting queue. MS_ERR_BUSY when max_waiting_requests
 * are already waiting; MS_ERR_INVALID when its prompt + max_new can never fit the pool. */
int ms_sched_add(ms_sched *s, ms_request *r, ms_err *err);

/* Builds the next batch; returns NULL when there is nothing to run. The batch and the
 * seq_req / logit_req tables stay valid until the next call to ms_sched_step. */
const ms_batch *ms_sched_step(ms_sched *s);
/* Marks the last batch as computed (advances each sequence's n_computed). Call after a successful
 * forward, before ms_sched_append_token. */
void ms_sched_commit(ms_sched *s);
/* Appends a sampled token to a running request (room is guaranteed by max_new; the caller
 * finishes the request when it has max_new tokens). */
void ms_sched_append_token(ms_sched *s, ms_request *r, int32_t token);
/* Takes r out of the scheduler (waiting or running), returning its pages; with cache != 0 its
 * computed full pages are first offered to the prefix cache. State becomes FINISHED. The caller
 * keeps ownership of r. */
void ms_sched_release(ms_sched *s, ms_request *r, int cache);

/* Speculative decoding: reserves pages so that r (running, no drafts, one uncomputed token) can
 * carry up to n draft tokens, evicting cache pages if needed but never preempting; returns how many
 * fit (0..n). Then ms_sched_set_drafts appends n draft tokens (at most the returned count; 0 is
 * fine) and gives back the reserved pages the drafts do not need. */
int ms_sched_reserve_drafts(ms_sched *s, ms_request *r, int n);
void ms_sched_set_drafts(ms_sched *s, ms_request *r, const int32_t *drafts, int n);
/* After a step verified r's drafts: r's sequence becomes tokens[0..n_tokens) as the caller wrote them
 * (the verified tokens, then the one token the verification produced, which is uncomputed; n_tokens
 * in [1, cap_tokens]), n_computed becomes n_tokens - 1 when it was larger, the drafts are dropped, and
 * the pages past those n_computed tokens go back to the pool (they held only rejected drafts' KV).
 * Returns the pages freed. */
int ms_sched_rollback(ms_sched *s, ms_request *r, int n_tokens);

/* Pages held by someone (requests or cache), and pages held only by the prefix cache. */
int ms_sched_pages_used(const ms_sched *s);
int ms_sched_pages_cached(const ms_sched *s);

/* Full integrity check from scratch: pool refcounts rebuilt from every request and cache node,
 * cache locks rebuilt from running requests, per-request page counts, queue links and counts.
 * Only meaningful between steps (after commit). Returns MS_OK or MS_ERR_RUNTIME. O(pages). */
int ms_sched_check(const ms_sched *s, ms_err *err);

#endif
