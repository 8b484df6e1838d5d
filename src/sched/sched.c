/* sched.c - continuous batching with chunked prefill, prefix reuse and preemption (see sched.h).
 *
 * A step has three phases, oldest request first within each:
 *   1. decode: every running request with exactly one uncomputed token gets it; a request that
 *      needs a new page and finds none preempts the newest request not yet in the batch (itself,
 *      if it is the newest);
 *   2. prefill in progress: running requests with more than one uncomputed token get a chunk
 *      (chunked_prefill_size, the step's prefill budget, and the pages available);
 *   3. admission: waiting requests in FCFS order match the prefix cache and are admitted while
 *      their whole uncomputed prompt fits in free + evictable pages, leaving one page of headroom
 *      per running request for decode growth; the first one that does not fit stops admission. A step that preempted admits nobody.
 * "Available pages" are free pages plus cache pages no running request locks (evicted on demand,
 * least recently used first). */
#include "sched/sched.h"

#include <stdlib.h>
#include <string.h>

static int pages_for(const ms_sched *s, int tokens) { return (tokens + s->cfg.page_size - 1) / s->cfg.page_size; }
static int avail_pages(const ms_sched *s) { return s->pool.n_free + ms_radix_n_evictable(&s->radix); }
static int min_i(int a, int b) { return a < b ? a : b; }

/* ---- intrusive lists ---- */

static void list_remove(ms_sched_list *l, ms_request *r) {
    if (r->prev) r->prev->next = r->next; else l->head = r->next;
    if (r->next) r->next->prev = r->prev; else l->tail = r->prev;
    r->prev = r->next = NULL;
    l->n--;
}

static void list_push_tail(ms_sched_list *l, ms_request *r) {
    r->next = NULL;
    r->prev = l->tail;
    if (l->tail) l->tail->next = r; else l->head = r;
    l->tail = r;
    l->n++;
}

static void list_push_head(ms_sched_list *l, ms_request *r) {
    r->prev = NULL;
    r->next = l->head;
    if (l->head) l->head->prev = r; else l->tail = r;
    l->head = r;
    l->n++;
}

/* ---- lifetime ---- */

int ms_sched_init(ms_sched *s, const ms_sched_config *cfg, ms_err *err) {
    memset(s, 0, sizeof *s);
    const ms_sched_config *c = cfg;
    if (c->n_pages < 1 || c->page_size < 1 || c->max_running_requests < 1 || c->max_waiting_requests < 1 ||
        c->max_batch_tokens < 1 || c->max_prefill_tokens < 1 || c->chunked_prefill_size < 1 || c->context_length < 2)
        return ms_errf(err, MS_ERR_INVALID,
                       "scheduler config: n_pages %d, page_size %d, max_running_requests %d, max_waiting_requests %d, "
                       "max_batch_tokens %d, max_prefill_tokens %d, chunked_prefill_size %d must be >= 1 and "
                       "context_length %d >= 2",
                       c->n_pages, c->page_size, c->max_running_requests, c->max_waiting_requests,
                       c->max_batch_tokens, c->max_prefill_tokens, c->chunked_prefill_size, c->context_length);
    s->cfg = *c;
    MS_TRY(ms_kv_pool_init(&s->pool, c->n_pages, c->page_size, err));
    int rc = ms_radix_init(&s->radix, &s->pool, err);
    if (rc != MS_OK) {
        ms_kv_pool_destroy(&s->pool);
        return rc;
    }
    int nt = c->max_batch_tokens, ns = c->max_running_requests;
    s->max_blocks_seq = min_i(c->n_pages, pages_for(s, c->context_length));
    s->token_ids = malloc((size_t)nt * sizeof(int32_t));
    s->positions = malloc((size_t)nt * sizeof(int32_t));
    s->slot_mapping = malloc((size_t)nt * sizeof(int32_t));
    s->seq_start = malloc(((size_t)ns + 1) * sizeof(int32_t));
    s->ctx_len = malloc((size_t)ns * sizeof(int32_t));
    s->logit_idx = malloc((size_t)nt * sizeof(int32_t));
    s->block_table = calloc((size_t)ns * (size_t)s->max_blocks_seq, sizeof(int32_t));
    s->seq_req = calloc((size_t)ns, sizeof *s->seq_req);
    s->logit_req = calloc((size_t)nt, sizeof *s->logit_req);
    if (!s->token_ids || !s->positions || !s->slot_mapping || !s->seq_start || !s->ctx_len || !s->logit_idx ||
        !s->block_table || !s->seq_req || !s->logit_req) {
        ms_sched_destroy(s);
        return ms_errf(err, MS_ERR_NOMEM, "scheduler: out of memory for batch arrays (%d tokens, %d sequences)", nt, ns);
    }
    return MS_OK;
}

static void release_pages(ms_sched *s, ms_request *r, int cache);

void ms_sched_destroy(ms_sched *s) {
    if (s->pool.refcnt) {
        while (s->running.head) ms_sched_release(s, s->running.head, 0);
        while (s->waiting.head) ms_sched_release(s, s->waiting.head, 0);
        ms_radix_destroy(&s->radix);
        ms_kv_pool_destroy(&s->pool);
    }
    free(s->token_ids); free(s->positions); free(s->slot_mapping); free(s->seq_start);
    free(s->ctx_len); free(s->logit_idx); free(s->block_table); free(s->seq_req); free(s->logit_req);
    memset(s, 0, sizeof *s);
}

int ms_sched_add(ms_sched *s, ms_request *r, ms_err *err) {
    if (s->waiting.n >= s->cfg.max_waiting_requests)
        return ms_errf(err, MS_ERR_BUSY, "the waiting queue is full (%d requests, max_waiting_requests)",
                       s->cfg.max_waiting_requests);
    /* the last generated token is never computed, so cap_tokens - 1 tokens need KV at most */
    if (pages_for(s, r->cap_tokens - 1) > s->cfg.n_pages || r->cap_tokens > s->cfg.context_length)
        return ms_errf(err, MS_ERR_INVALID,
                       "prompt (%d tokens) + max_tokens (%d) exceed the KV capacity (%d tokens) or context length (%d)",
                       r->n_prompt, r->max_new, s->cfg.n_pages * s->cfg.page_size, s->cfg.context_length);
    r->state = MS_REQ_WAITING;
    list_push_tail(&s->waiting, r);
    return MS_OK;
}

/* ---- pages ---- */

/* Gives r pages for its first `upto` tokens, evicting cache pages if needed; no preemption.
 * Returns 1 on success, 0 (nothing changed) when the pages are not there. */
static int grow_pages(ms_sched *s, ms_request *r, int upto) {
    int need = pages_for(s, upto) - r->n_pages;
    if (need <= 0) return 1;
    MS_ASSERT(r->n_pages + need <= r->cap_pages);
    if (need > s->pool.n_free) ms_radix_evict(&s->radix, need - s->pool.n_free);
    if (ms_kv_pool_alloc(&s->pool, need, r->pages + r->n_pages) != MS_OK) return 0;
    r->n_pages += need;
    return 1;
}

/* Returns r's pages (and cache lock); with cache, its computed full pages go to the cache first. */
static void release_pages(ms_sched *s, ms_request *r, int cache) {
    if (cache && s->cfg.enable_prefix_cache) {
        int n_full = min_i(r->n_computed / s->cfg.page_size, r->n_pages);
        if (n_full > 0) ms_radix_insert(&s->radix, r->tokens, n_full, r->pages);
    }
    ms_kv_pool_unref_n(&s->pool, r->pages, r->n_pages);
    r->n_pages = 0;
    if (r->lock_node) ms_radix_unlock(&s->radix, r->lock_node);
    r->lock_node = 0;
}

/* Drops r's draft tokens (not computed) and the pages that were reserved only for them. */
static void drop_drafts(ms_sched *s, ms_request *r) {
    if (!r->spec_n) return;
    r->n_tokens -= r->spec_n;
    r->spec_n = 0;
    int keep = pages_for(s, r->n_computed);
    if (r->n_pages > keep) {
        ms_kv_pool_unref_n(&s->pool, r->pages + keep, r->n_pages - keep);
        r->n_pages = keep;
    }
}

static void preempt(ms_sched *s, ms_request *r) {
    drop_drafts(s, r);
    release_pages(s, r, 1);
    list_remove(&s->running, r);
    r->n_computed = 0;
    r->state = MS_REQ_WAITING;
    r->n_preempted++;
    s->preemptions++;
    list_push_head(&s->waiting, r);
}

static int in_batch(const ms_sched *s, const ms_request *r) { return r->step_id == s->step_no && r->step_new > 0; }

/* The newest running request newer than r that is not in the batch being built, or NULL. */
static ms_request *victim_after(ms_sched *s, ms_request *r) {
    for (ms_request *v = s->running.tail; v && v != r; v = v->prev)
        if (!in_batch(s, v)) return v;
    return NULL;
}

/* ---- batch building ---- */

static void add_seq(ms_sched *s, ms_request *r, int n) {
    ms_batch *b = &s->batch;
    int i = b->n_seqs, t0 = b->n_tokens, ps = s->cfg.page_size;
    s->seq_req[i] = r;
    s->seq_start[i] = t0;
    for (int j = 0; j < n; j++) {
        int pos = r->n_computed + j;
        s->token_ids[t0 + j] = r->tokens[pos];
        s->positions[t0 + j] = pos;
        s->slot_mapping[t0 + j] = r->pages[pos / ps] * ps + pos % ps;
    }
    b->n_tokens = t0 + n;
    s->seq_start[i + 1] = b->n_tokens;
    s->ctx_len[i] = r->n_computed + n;
    if (r->n_computed + n == r->n_tokens) {
        /* a request with drafts gets logits on its last real token and on every draft */
        int nl = r->spec_n > 0 && r->spec_n < n ? r->spec_n + 1 : 1;
        for (int j = nl - 1; j >= 0; j--) {
            s->logit_idx[b->n_logits] = b->n_tokens - 1 - j;
            s->logit_req[b->n_logits++] = r;
        }
    }
    r->step_new = n;
    r->step_id = s->step_no;
    b->n_seqs = i + 1;
}

const ms_batch *ms_sched_step(ms_sched *s) {
    const ms_sched_config *c = &s->cfg;
    ms_batch *b = &s->batch;
    memset(b, 0, sizeof *b);
    s->step_no++;
    int ps = c->page_size;
    int tok_left = c->max_batch_tokens, prefill_left = c->max_prefill_tokens;
    uint64_t preempt0 = s->preemptions;

    /* 1. decode tokens (with the request's draft tokens, if it carries any and they fit) */
    for (ms_request *r = s->running.head; r;) {
        if (r->n_tokens - r->n_computed != 1 + r->spec_n) { r = r->next; continue; }
        if (tok_left < 1 || b->n_seqs >= c->max_running_requests) break;
        if (r->spec_n && tok_left < 1 + r->spec_n) drop_drafts(s, r);
        int ok;
        while (!(ok = grow_pages(s, r, r->n_computed + 1 + r->spec_n))) {
            if (r->spec_n) { /* verification is optional: no preemption for it */
                drop_drafts(s, r);
                continue;
            }
            ms_request *v = victim_after(s, r);
            if (!v) break;
            preempt(s, v);
        }
        if (ok) {
            const int n = 1 + r->spec_n;
            add_seq(s, r, n);
            tok_left -= n;
            r = r->next;
        } else {
            ms_request *nx = r->next;
            preempt(s, r);
            r = nx;
        }
    }

    /* 2. prefill chunks of running requests */
    for (ms_request *r = s->running.head; r; r = r->next) {
        int remaining = r->n_tokens - r->n_computed;
        if (remaining <= 1 || in_batch(s, r)) continue;
        if (r->spec_n) { /* drafts not verified this step (no room): dropped */
            drop_drafts(s, r);
            continue;
        }
        int chunk = min_i(min_i(remaining, c->chunked_prefill_size), min_i(prefill_left, tok_left));
        if (chunk <= 0 || b->n_seqs >= c->max_running_requests) break;
        int fit = (r->n_pages + avail_pages(s)) * ps - r->n_computed;
        while (fit < chunk) {
            ms_request *v = victim_after(s, r);
            if (!v) break;
            preempt(s, v);
            fit = (r->n_pages + avail_pages(s)) * ps - r->n_computed;
        }
        chunk = min_i(chunk, fit);
        if (chunk <= 0) continue;
        int grown = grow_pages(s, r, r->n_computed + chunk);
        MS_ASSERT(grown); /* fit counted free + evictable pages */
        add_seq(s, r, chunk);
        prefill_left -= chunk;
        tok_left -= chunk;
    }

    /* 3. admission, FCFS; not in a step that had to preempt (memory is short, and the preempted
     * request at the head of the queue would only be taken back in) */
    while (s->preemptions == preempt0 && s->waiting.head && s->running.n < c->max_running_requests && b->n_seqs < c->max_running_requests &&
           prefill_left > 0 && tok_left > 0) {
        ms_request *r = s->waiting.head;
        MS_ASSERT(r->n_pages == 0 && r->lock_node == 0);
        int m = 0;
        int32_t node = 0;
        if (c->enable_prefix_cache) {
            m = ms_radix_match(&s->radix, r->tokens, r->n_tokens, (r->n_tokens - 1) / ps, r->pages, &node);
            if (m > 0) {
                ms_radix_lock(&s->radix, node);
                for (int j = 0; j < m; j++) ms_kv_pool_ref(&s->pool, r->pages[j]);
            }
        }
        r->n_pages = m;
        r->lock_node = node;
        r->n_computed = m * ps;
        int headroom = s->running.n;
        if (pages_for(s, r->n_tokens) - m > avail_pages(s) - headroom) {
            release_pages(s, r, 0);
            r->n_computed = 0;
            break;
        }
        int chunk = min_i(min_i(r->n_tokens - r->n_computed, c->chunked_prefill_size), min_i(prefill_left, tok_left));
        int grown = grow_pages(s, r, r->n_computed + chunk);
        MS_ASSERT(grown);
        list_remove(&s->waiting, r);
        list_push_tail(&s->running, r);
        r->state = MS_REQ_RUNNING;
        if (!r->admitted_once) {
            r->admitted_once = 1;
            r->n_cached = min_i(r->n_computed, r->n_prompt);
            s->prompt_tokens += (uint64_t)r->n_prompt;
            s->cached_tokens += (uint64_t)r->n_cached;
            if (c->enable_prefix_cache) ms_radix_record_hit(&s->radix, r->n_prompt, r->n_cached);
        }
        add_seq(s, r, chunk);
        prefill_left -= chunk;
        tok_left -= chunk;
    }

    if (b->n_seqs == 0) return NULL;
    /* block table: rows as long as the longest context in this step */
    int mb = 1;
    for (int i = 0; i < b->n_seqs; i++) mb = mb > pages_for(s, s->ctx_len[i]) ? mb : pages_for(s, s->ctx_len[i]);
    MS_ASSERT(mb <= s->max_blocks_seq);
    for (int i = 0; i < b->n_seqs; i++)
        memcpy(s->block_table + (size_t)i * mb, s->seq_req[i]->pages, (size_t)pages_for(s, s->ctx_len[i]) * sizeof(int32_t));
    b->token_ids = s->token_ids;
    b->positions = s->positions;
    b->seq_start = s->seq_start;
    b->ctx_len = s->ctx_len;
    b->slot_mapping = s->slot_mapping;
    b->block_table = s->block_table;
    b->max_blocks = mb;
    b->page_size = ps;
    b->logit_idx = s->logit_idx;
    return b;
}

void ms_sched_commit(ms_sched *s) {
    for (int i = 0; i < s->batch.n_seqs; i++) {
        ms_request *r = s->seq_req[i];
        r->n_computed += r->step_new;
        MS_ASSERT(r->n_computed <= r->n_tokens);
    }
}

int ms_sched_reserve_drafts(ms_sched *s, ms_request *r, int n) {
    MS_ASSERT(r->state == MS_REQ_RUNNING && r->spec_n == 0 && r->n_tokens == r->n_computed + 1);
    if (n > r->cap_tokens - r->n_tokens) n = r->cap_tokens - r->n_tokens;
    while (n > 0 && !grow_pages(s, r, r->n_tokens + n)) n--;
    return n > 0 ? n : 0;
}

void ms_sched_set_drafts(ms_sched *s, ms_request *r, const int32_t *drafts, int n) {
    MS_ASSERT(r->spec_n == 0 && n >= 0 && r->n_tokens + n <= r->cap_tokens && (!n || pages_for(s, r->n_tokens + n) <= r->n_pages));
    for (int i = 0; i < n; i++) r->tokens[r->n_tokens + i] = drafts[i];
    r->n_tokens += n;
    r->spec_n = n;
    /* pages reserved for drafts that were not proposed go back */
    int keep = pages_for(s, n ? r->n_tokens : r->n_computed);
    if (r->n_pages > keep) {
        ms_kv_pool_unref_n(&s->pool, r->pages + keep, r->n_pages - keep);
        r->n_pages = keep;
    }
}

int ms_sched_rollback(ms_sched *s, ms_request *r, int n_tokens) {
    MS_ASSERT(n_tokens >= 1 && n_tokens <= r->cap_tokens);
    r->spec_n = 0;
    r->n_tokens = n_tokens;
    if (r->n_computed > n_tokens - 1) r->n_computed = n_tokens - 1;
    int keep = pages_for(s, r->n_computed), freed = 0;
    if (r->n_pages > keep) {
        freed = r->n_pages - keep;
        ms_kv_pool_unref_n(&s->pool, r->pages + keep, freed);
        r->n_pages = keep;
        s->draft_pages_freed += (uint64_t)freed;
    }
    return freed;
}

void ms_sched_append_token(ms_sched *s, ms_request *r, int32_t token) {
    (void)s;
    MS_ASSERT(r->n_tokens < r->cap_tokens);
    r->tokens[r->n_tokens++] = token;
}

void ms_sched_release(ms_sched *s, ms_request *r, int cache) {
    if (r->state == MS_REQ_RUNNING) {
        release_pages(s, r, cache);
        list_remove(&s->running, r);
    } else if (r->state == MS_REQ_WAITING) {
        MS_ASSERT(r->n_pages == 0 && r->lock_node == 0);
        list_remove(&s->waiting, r);
    }
    r->state = MS_REQ_FINISHED;
}

int ms_sched_pages_used(const ms_sched *s) { return s->pool.n_pages - s->pool.n_free; }
int ms_sched_pages_cached(const ms_sched *s) { return ms_radix_n_evictable(&s->radix); }

/* ---- integrity ---- */

static int check_list(const ms_sched *s, const ms_sched_list *l, int state, int32_t *counts, int32_t *locks,
                      int *n_locks, ms_err *err) {
    int n = 0;
    const ms_request *prev = NULL;
    for (const ms_request *r = l->head; r; prev = r, r = r->next) {
        if (++n > l->n) return ms_errf(err, MS_ERR_RUNTIME, "scheduler check: list longer than its count %d", l->n);
        if (r->prev != prev) return ms_errf(err, MS_ERR_RUNTIME, "scheduler check: request %llu has a bad prev link", (unsigned long long)r->id);
        if (r->state != state) return ms_errf(err, MS_ERR_RUNTIME, "scheduler check: request %llu state %d in list of state %d", (unsigned long long)r->id, r->state, state);
        if (r->n_computed < 0 || r->n_computed >= r->n_tokens || r->n_tokens > r->cap_tokens)
            return ms_errf(err, MS_ERR_RUNTIME, "scheduler check: request %llu computed %d of %d tokens (cap %d)", (unsigned long long)r->id, r->n_computed, r->n_tokens, r->cap_tokens);
        /* pages cover the computed tokens, or every token while drafts are carried */
        if (r->n_pages != pages_for(s, r->spec_n ? r->n_tokens : r->n_computed))
            return ms_errf(err, MS_ERR_RUNTIME, "scheduler check: request %llu holds %d pages for %d computed tokens (%d drafts)", (unsigned long long)r->id, r->n_pages, r->n_computed, r->spec_n);
        if (state == MS_REQ_WAITING && (r->n_pages || r->lock_node))
            return ms_errf(err, MS_ERR_RUNTIME, "scheduler check: waiting request %llu holds pages or a cache lock", (unsigned long long)r->id);
        for (int j = 0; j < r->n_pages; j++) {
            if (r->pages[j] < 0 || r->pages[j] >= s->pool.n_pages)
                return ms_errf(err, MS_ERR_RUNTIME, "scheduler check: request %llu has invalid page %d", (unsigned long long)r->id, r->pages[j]);
            counts[r->pages[j]]++;
        }
        if (r->lock_node) locks[(*n_locks)++] = r->lock_node;
    }
    if (prev != l->tail || n != l->n) return ms_errf(err, MS_ERR_RUNTIME, "scheduler check: list tail or count (%d vs %d) is wrong", n, l->n);
    return MS_OK;
}

int ms_sched_check(const ms_sched *s, ms_err *err) {
    int32_t *counts = calloc((size_t)s->pool.n_pages, sizeof *counts);
    int32_t *locks = malloc(((size_t)s->running.n + 1) * sizeof *locks);
    int n_locks = 0, rc = MS_OK;
    if (!counts || !locks) { free(counts); free(locks); return ms_errf(err, MS_ERR_NOMEM, "scheduler check: out of memory"); }
    if (s->running.n > s->cfg.max_running_requests)
        rc = ms_errf(err, MS_ERR_RUNTIME, "scheduler check: %d running > max_running_requests %d", s->running.n, s->cfg.max_running_requests);
    if (rc == MS_OK) rc = check_list(s, &s->running, MS_REQ_RUNNING, counts, locks, &n_locks, err);
    if (rc == MS_OK) rc = check_list(s, &s->waiting, MS_REQ_WAITING, counts, locks, &n_locks, err);
    if (rc == MS_OK) {
        ms_radix_add_refs(&s->radix, counts);
        rc = ms_kv_pool_check(&s->pool, counts, err);
    }
    if (rc == MS_OK) rc = ms_radix_check(&s->radix, locks, n_locks, err);
    /* a cache page no running request locks is held by the cache alone, so evicting frees it */
    for (int i = 1; rc == MS_OK && i <= s->radix.max_nodes; i++) {
        const ms_radix_node *n = &s->radix.nodes[i];
        if (n->live && n->lock == 0 && s->pool.refcnt[n->page] != 1)
            rc = ms_errf(err, MS_ERR_RUNTIME, "scheduler check: unlocked cache page %d has refcount %d", n->page, s->pool.refcnt[n->page]);
    }
    free(counts);
    free(locks);
    return rc;
}
