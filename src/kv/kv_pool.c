/* kv_pool.c - page id allocator with reference counts (see kv_pool.h). A stack of free ids keeps
 * alloc and free O(1) per page; the integrity checker rebuilds everything from scratch so tests
 * can run it after every operation. */
#include "kv/kv_pool.h"

#include <stdlib.h>
#include <string.h>

int ms_kv_pool_init(ms_kv_pool *p, int n_pages, int page_size, ms_err *err) {
    memset(p, 0, sizeof *p);
    if (n_pages < 1 || page_size < 1)
        return ms_errf(err, MS_ERR_INVALID, "kv pool: n_pages (%d) and page_size (%d) must be >= 1",
                       n_pages, page_size);
    p->refcnt = calloc((size_t)n_pages, sizeof *p->refcnt);
    p->free_ids = malloc((size_t)n_pages * sizeof *p->free_ids);
    if (!p->refcnt || !p->free_ids) {
        ms_kv_pool_destroy(p);
        return ms_errf(err, MS_ERR_NOMEM, "kv pool: out of memory for %d pages", n_pages);
    }
    p->n_pages = n_pages;
    p->page_size = page_size;
    /* Stack top is the lowest id, so a fresh pool hands out 0, 1, 2, ... (easier to read in logs). */
    for (int i = 0; i < n_pages; i++) p->free_ids[i] = n_pages - 1 - i;
    p->n_free = n_pages;
    return MS_OK;
}

void ms_kv_pool_destroy(ms_kv_pool *p) {
    free(p->refcnt);
    free(p->free_ids);
    memset(p, 0, sizeof *p);
}

int ms_kv_pool_alloc(ms_kv_pool *p, int n, int32_t *out) {
    MS_ASSERT(n >= 0);
    if (n > p->n_free) return MS_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        int32_t id = p->free_ids[--p->n_free];
        MS_ASSERT(p->refcnt[id] == 0);
        p->refcnt[id] = 1;
        out[i] = id;
    }
    return MS_OK;
}

void ms_kv_pool_ref(ms_kv_pool *p, int32_t page) {
    MS_ASSERT(page >= 0 && page < p->n_pages && p->refcnt[page] >= 1);
    p->refcnt[page]++;
}

void ms_kv_pool_unref(ms_kv_pool *p, int32_t page) {
    MS_ASSERT(page >= 0 && page < p->n_pages && p->refcnt[page] >= 1);
    if (--p->refcnt[page] == 0) {
        MS_ASSERT(p->n_free < p->n_pages);
        p->free_ids[p->n_free++] = page;
    }
}

void ms_kv_pool_unref_n(ms_kv_pool *p, const int32_t *pages, int n) {
    for (int i = 0; i < n; i++) ms_kv_pool_unref(p, pages[i]);
}

int ms_kv_pool_check(const ms_kv_pool *p, const int32_t *expected_ref, ms_err *err) {
    if (p->n_free < 0 || p->n_free > p->n_pages)
        return ms_errf(err, MS_ERR_RUNTIME, "kv pool check: n_free %d out of [0, %d]", p->n_free, p->n_pages);
    uint8_t *seen = calloc((size_t)p->n_pages, 1);
    if (!seen) return ms_errf(err, MS_ERR_NOMEM, "kv pool check: out of memory");
    int rc = MS_OK;
    for (int i = 0; i < p->n_free && rc == MS_OK; i++) {
        int32_t id = p->free_ids[i];
        if (id < 0 || id >= p->n_pages)
            rc = ms_errf(err, MS_ERR_RUNTIME, "kv pool check: free slot %d holds invalid page %d", i, id);
        else if (seen[id])
            rc = ms_errf(err, MS_ERR_RUNTIME, "kv pool check: page %d is in the free set twice", id);
        else if (p->refcnt[id] != 0)
            rc = ms_errf(err, MS_ERR_RUNTIME, "kv pool check: free page %d has refcount %d", id, p->refcnt[id]);
        else
            seen[id] = 1;
    }
    for (int id = 0; id < p->n_pages && rc == MS_OK; id++) {
        if (p->refcnt[id] < 0)
            rc = ms_errf(err, MS_ERR_RUNTIME, "kv pool check: page %d has negative refcount %d", id, p->refcnt[id]);
        else if (p->refcnt[id] == 0 && !seen[id])
            rc = ms_errf(err, MS_ERR_RUNTIME, "kv pool check: page %d has refcount 0 but is not free (leaked)", id);
        else if (expected_ref && expected_ref[id] != p->refcnt[id])
            rc = ms_errf(err, MS_ERR_RUNTIME, "kv pool check: page %d has refcount %d but its holders count %d",
                         id, p->refcnt[id], expected_ref[id]);
    }
    free(seen);
    return rc;
}
