/* kv_pool.h - the paged KV pool: hands out page ids, counts who holds them.
 *
 * The KV memory itself belongs to the executor (model side), laid out as n_pages pages of
 * page_size token slots per layer; this pool only decides which page ids are in use. Because it
 * deals in ids alone it serves GQA K/V caches and MLA latent + indexer caches alike. Every holder
 * of a page (a running request, a prefix-cache node) owns one reference; a page whose count drops
 * to zero returns to the free set. All calls are single-threaded (the engine thread). */
#ifndef MS_KV_KV_POOL_H
#define MS_KV_KV_POOL_H

#include "core/status.h"

#include <stdint.h>

typedef struct ms_kv_pool {
    int n_pages;
    int page_size;      /* tokens per page */
    int32_t *refcnt;    /* [n_pages] holders of each page */
    int32_t *free_ids;  /* [n_pages] stack of free page ids; the first n_free are valid */
    int n_free;
} ms_kv_pool;

/* Creates a pool of n_pages pages (ids 0..n_pages-1, all free). page_size is informative (tokens
 * per page) and must be >= 1. Fails with MS_ERR_INVALID for bad sizes, MS_ERR_NOMEM on OOM. */
int ms_kv_pool_init(ms_kv_pool *p, int n_pages, int page_size, ms_err *err);
/* Frees the pool's arrays (not the struct). Safe on a zeroed struct. */
void ms_kv_pool_destroy(ms_kv_pool *p);

/* Takes n free pages (all or nothing), each with refcount 1, into out[n]. Returns MS_OK, or
 * MS_ERR_NOMEM (nothing taken) when fewer than n are free. O(n). */
int ms_kv_pool_alloc(ms_kv_pool *p, int n, int32_t *out);
/* Adds a reference to a page in use (refcount >= 1). */
void ms_kv_pool_ref(ms_kv_pool *p, int32_t page);
/* Drops a reference; the page becomes free when its count reaches 0. */
void ms_kv_pool_unref(ms_kv_pool *p, int32_t page);
/* Drops one reference on each of pages[0..n). */
void ms_kv_pool_unref_n(ms_kv_pool *p, const int32_t *pages, int n);

static inline int ms_kv_pool_n_free(const ms_kv_pool *p) { return p->n_free; }
static inline int ms_kv_pool_refcount(const ms_kv_pool *p, int32_t page) { return p->refcnt[page]; }

/* Integrity check, recomputed from scratch: the free stack holds distinct valid ids, exactly the
 * pages with refcount 0, and no count is negative. When expected_ref is not NULL it is the
 * per-page reference count [n_pages] rebuilt by the caller from every holder it knows of, and must
 * equal the pool's counts. Returns MS_OK or MS_ERR_RUNTIME with the first inconsistency. O(n_pages). */
int ms_kv_pool_check(const ms_kv_pool *p, const int32_t *expected_ref, ms_err *err);

#endif
