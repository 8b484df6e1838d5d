/* radix.c - page-granular prefix tree with LRU eviction (see radix.h for the design). */
#include "kv/radix.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define NIL (-1)

static uint64_t key_hash(int32_t parent, const int32_t *tok, int page_size) {
    return XXH64(tok, (size_t)page_size * sizeof *tok, (uint64_t)(uint32_t)parent * 0x9E3779B97F4A7C15ull + 1);
}

static const int32_t *node_tokens(const ms_radix *t, int32_t i) { return t->tokens + (size_t)i * t->page_size; }

/* ---- eviction heap: min by (last_access, index) ---- */

static int heap_less(const ms_radix *t, int32_t a, int32_t b) {
    const ms_radix_node *x = &t->nodes[a], *y = &t->nodes[b];
    return x->last_access < y->last_access || (x->last_access == y->last_access && a < b);
}

static void heap_set(ms_radix *t, int pos, int32_t node) {
    t->heap[pos] = node;
    t->nodes[node].heap_pos = pos;
}

static void heap_up(ms_radix *t, int pos) {
    int32_t n = t->heap[pos];
    while (pos > 0) {
        int par = (pos - 1) / 2;
        if (!heap_less(t, n, t->heap[par])) break;
        heap_set(t, pos, t->heap[par]);
        pos = par;
    }
    heap_set(t, pos, n);
}

static void heap_down(ms_radix *t, int pos) {
    int32_t n = t->heap[pos];
    for (;;) {
        int c = 2 * pos + 1;
        if (c >= t->n_heap) break;
        if (c + 1 < t->n_heap && heap_less(t, t->heap[c + 1], t->heap[c])) c++;
        if (!heap_less(t, t->heap[c], n)) break;
        heap_set(t, pos, t->heap[c]);
        pos = c;
    }
    heap_set(t, pos, n);
}

static void heap_push(ms_radix *t, int32_t node) {
    MS_ASSERT(t->nodes[node].heap_pos == NIL && t->n_heap < t->max_nodes);
    heap_set(t, t->n_heap++, node);
    heap_up(t, t->n_heap - 1);
}

static void heap_remove(ms_radix *t, int32_t node) {
    int pos = t->nodes[node].heap_pos;
    MS_ASSERT(pos >= 0 && pos < t->n_heap);
    t->nodes[node].heap_pos = NIL;
    int32_t last = t->heap[--t->n_heap];
    if (pos == t->n_heap) return;
    heap_set(t, pos, last);
    heap_up(t, pos);
    heap_down(t, t->nodes[last].heap_pos);
}

/* Puts node into / out of the heap so that it is there exactly when it is an unlocked leaf. */
static void heap_sync(ms_radix *t, int32_t i) {
    if (i == 0) return;
    ms_radix_node *n = &t->nodes[i];
    int want = n->live && n->lock == 0 && n->n_children == 0;
    if (want && n->heap_pos == NIL) heap_push(t, i);
    else if (!want && n->heap_pos != NIL) heap_remove(t, i);
}

static void touch(ms_radix *t, int32_t i, uint64_t now) {
    ms_radix_node *n = &t->nodes[i];
    n->last_access = now;
    if (n->heap_pos != NIL) heap_down(t, n->heap_pos); /* the key only grows */
}

/* ---- lifetime ---- */

int ms_radix_init(ms_radix *t, ms_kv_pool *pool, ms_err *err) {
    memset(t, 0, sizeof *t);
    t->pool = pool;
    t->page_size = pool->page_size;
    t->max_nodes = pool->n_pages;
    uint32_t nb = 1;
    while (nb < (uint32_t)t->max_nodes && nb < (1u << 30)) nb <<= 1;
    t->bucket_mask = nb - 1;
    t->nodes = calloc((size_t)t->max_nodes + 1, sizeof *t->nodes);
    t->tokens = malloc(((size_t)t->max_nodes + 1) * (size_t)t->page_size * sizeof *t->tokens);
    t->buckets = malloc((size_t)nb * sizeof *t->buckets);
    t->heap = malloc((size_t)t->max_nodes * sizeof *t->heap);
    if (!t->nodes || !t->tokens || !t->buckets || !t->heap) {
        free(t->nodes); free(t->tokens); free(t->buckets); free(t->heap);
        memset(t, 0, sizeof *t);
        return ms_errf(err, MS_ERR_NOMEM, "radix cache: out of memory for %d pages", pool->n_pages);
    }
    for (uint32_t b = 0; b < nb; b++) t->buckets[b] = NIL;
    ms_radix_node *root = &t->nodes[0];
    root->parent = NIL; root->first_child = root->next_sibling = root->prev_sibling = NIL;
    root->page = NIL; root->heap_pos = NIL; root->hnext = NIL; root->live = 1;
    t->free_head = NIL;
    for (int i = t->max_nodes; i >= 1; i--) {
        t->nodes[i].parent = NIL;
        t->nodes[i].heap_pos = NIL;
        t->nodes[i].hnext = t->free_head;
        t->free_head = i;
    }
    return MS_OK;
}

void ms_radix_destroy(ms_radix *t) {
    if (!t->nodes) return;
    for (int i = 1; i <= t->max_nodes; i++)
        if (t->nodes[i].live) ms_kv_pool_unref(t->pool, t->nodes[i].page);
    free(t->nodes); free(t->tokens); free(t->buckets); free(t->heap);
    memset(t, 0, sizeof *t);
}

/* ---- lookup ---- */

static int32_t find_child(const ms_radix *t, int32_t parent, const int32_t *tok, uint64_t h) {
    for (int32_t i = t->buckets[h & t->bucket_mask]; i != NIL; i = t->nodes[i].hnext) {
        const ms_radix_node *n = &t->nodes[i];
        if (n->hash == h && n->parent == parent &&
            memcmp(node_tokens(t, i), tok, (size_t)t->page_size * sizeof *tok) == 0)
            return i;
    }
    return NIL;
}

int ms_radix_match(ms_radix *t, const int32_t *tokens, int n_tokens, int max_pages, int32_t *pages_out,
                   int32_t *node_out) {
    int ps = t->page_size, n = 0;
    int32_t cur = 0;
    int limit = n_tokens / ps;
    if (limit > max_pages) limit = max_pages;
    while (n < limit) {
        const int32_t *tok = tokens + (size_t)n * ps;
        int32_t c = find_child(t, cur, tok, key_hash(cur, tok, ps));
        if (c == NIL) break;
        pages_out[n++] = t->nodes[c].page;
        cur = c;
    }
    if (n > 0) {
        uint64_t now = ++t->clock;
        for (int32_t i = cur; i > 0; i = t->nodes[i].parent) touch(t, i, now);
    }
    *node_out = cur;
    return n;
}

void ms_radix_lock(ms_radix *t, int32_t node) {
    for (int32_t i = node; i > 0; i = t->nodes[i].parent) {
        ms_radix_node *n = &t->nodes[i];
        MS_ASSERT(n->live);
        if (n->lock++ == 0) {
            t->n_unlocked--;
            if (n->heap_pos != NIL) heap_remove(t, i);
        }
    }
}

void ms_radix_unlock(ms_radix *t, int32_t node) {
    for (int32_t i = node; i > 0; i = t->nodes[i].parent) {
        ms_radix_node *n = &t->nodes[i];
        MS_ASSERT(n->live && n->lock > 0);
        if (--n->lock == 0) {
            t->n_unlocked++;
            heap_sync(t, i);
        }
    }
}

/* ---- insert / evict ---- */

int ms_radix_insert(ms_radix *t, const int32_t *tokens, int n_pages, const int32_t *pages) {
    int ps = t->page_size, adopted = 0;
    uint64_t now = ++t->clock;
    int32_t cur = 0;
    for (int p = 0; p < n_pages; p++) {
        const int32_t *tok = tokens + (size_t)p * ps;
        uint64_t h = key_hash(cur, tok, ps);
        int32_t c = find_child(t, cur, tok, h);
        if (c == NIL) {
            c = t->free_head;
            MS_ASSERT(c != NIL); /* a page is cached at most once, so nodes never run out */
            ms_radix_node *n = &t->nodes[c];
            t->free_head = n->hnext;
            memset(n, 0, sizeof *n);
            n->parent = cur;
            n->first_child = n->prev_sibling = NIL;
            n->heap_pos = NIL;
            n->page = pages[p];
            n->hash = h;
            n->live = 1;
            n->last_access = now;
            memcpy(t->tokens + (size_t)c * ps, tok, (size_t)ps * sizeof *tok);
            /* link into the parent's child list and the hash chain */
            ms_radix_node *par = &t->nodes[cur];
            n->next_sibling = par->first_child;
            if (par->first_child != NIL) t->nodes[par->first_child].prev_sibling = c;
            par->first_child = c;
            par->n_children++;
            n->hnext = t->buckets[h & t->bucket_mask];
            t->buckets[h & t->bucket_mask] = c;
            ms_kv_pool_ref(t->pool, pages[p]);
            t->n_nodes++;
            t->n_unlocked++;
            adopted++;
            heap_sync(t, cur); /* the parent is no longer a leaf */
        }
        cur = c;
    }
    /* mark the whole path as just used, then let the new leaf into the heap */
    for (int32_t i = cur; i > 0; i = t->nodes[i].parent) touch(t, i, now);
    heap_sync(t, cur);
    return adopted;
}

static void remove_leaf(ms_radix *t, int32_t i) {
    ms_radix_node *n = &t->nodes[i];
    MS_ASSERT(n->live && n->n_children == 0 && n->lock == 0 && i != 0);
    if (n->heap_pos != NIL) heap_remove(t, i);
    /* unlink from the hash chain */
    int32_t *link = &t->buckets[n->hash & t->bucket_mask];
    while (*link != i) {
        MS_ASSERT(*link != NIL);
        link = &t->nodes[*link].hnext;
    }
    *link = n->hnext;
    /* unlink from the parent's children */
    ms_radix_node *par = &t->nodes[n->parent];
    if (n->prev_sibling != NIL) t->nodes[n->prev_sibling].next_sibling = n->next_sibling;
    else par->first_child = n->next_sibling;
    if (n->next_sibling != NIL) t->nodes[n->next_sibling].prev_sibling = n->prev_sibling;
    par->n_children--;
    int32_t parent = n->parent;
    ms_kv_pool_unref(t->pool, n->page);
    n->live = 0;
    n->parent = NIL;
    n->page = NIL;
    n->hnext = t->free_head;
    t->free_head = i;
    t->n_nodes--;
    t->n_unlocked--;
    t->evicted_pages++;
    heap_sync(t, parent);
}

int ms_radix_evict(ms_radix *t, int n) {
    int done = 0;
    while (done < n && t->n_heap > 0) {
        remove_leaf(t, t->heap[0]);
        done++;
    }
    return done;
}

void ms_radix_add_refs(const ms_radix *t, int32_t *counts) {
    for (int i = 1; i <= t->max_nodes; i++)
        if (t->nodes[i].live) counts[t->nodes[i].page]++;
}

/* ---- integrity ---- */

int ms_radix_check(const ms_radix *t, const int32_t *lock_nodes, int n_lock, ms_err *err) {
    const ms_kv_pool *pool = t->pool;
    int N = t->max_nodes + 1, rc = MS_OK;
    int32_t *nchild = calloc((size_t)N, sizeof *nchild);
    int32_t *lockc = calloc((size_t)N, sizeof *lockc);
    uint8_t *page_seen = calloc((size_t)pool->n_pages, 1);
    if (!nchild || !lockc || !page_seen) {
        free(nchild); free(lockc); free(page_seen);
        return ms_errf(err, MS_ERR_NOMEM, "radix check: out of memory");
    }
#define FAIL(...) do { rc = ms_errf(err, MS_ERR_RUNTIME, "radix check: " __VA_ARGS__); goto out; } while (0)
    int live = 0, unlocked = 0, leaves = 0;
    for (int i = 1; i < N; i++) {
        const ms_radix_node *n = &t->nodes[i];
        if (!n->live) {
            if (n->heap_pos != NIL) FAIL("free node %d is in the eviction heap", i);
            continue;
        }
        live++;
        if (n->parent < 0 || n->parent >= N || !t->nodes[n->parent].live)
            FAIL("node %d has invalid parent %d", i, n->parent);
        nchild[n->parent]++;
        if (n->page < 0 || n->page >= pool->n_pages) FAIL("node %d has invalid page %d", i, n->page);
        if (page_seen[n->page]) FAIL("page %d is cached by two nodes", n->page);
        page_seen[n->page] = 1;
        if (pool->refcnt[n->page] < 1) FAIL("node %d page %d has no pool reference", i, n->page);
        if (n->hash != key_hash(n->parent, node_tokens(t, i), t->page_size)) FAIL("node %d has a stale hash", i);
        if (find_child(t, n->parent, node_tokens(t, i), n->hash) != i)
            FAIL("node %d is not found through the hash table", i);
        if (n->parent != 0 && t->nodes[n->parent].last_access < n->last_access)
            FAIL("node %d is newer than its parent %d", i, n->parent);
        if (n->lock < 0) FAIL("node %d has negative lock %d", i, n->lock);
        if (n->lock == 0) unlocked++;
    }
    for (int i = 0; i < N; i++) {
        const ms_radix_node *n = &t->nodes[i];
        if (!n->live) continue;
        if (nchild[i] != n->n_children) FAIL("node %d counts %d children, has %d", i, n->n_children, nchild[i]);
        int walked = 0;
        for (int32_t c = n->first_child, prev = NIL; c != NIL; prev = c, c = t->nodes[c].next_sibling) {
            if (c < 1 || c >= N || !t->nodes[c].live || t->nodes[c].parent != i || t->nodes[c].prev_sibling != prev)
                FAIL("child list of node %d is corrupt at %d", i, c);
            if (++walked > nchild[i]) FAIL("child list of node %d is too long", i);
        }
        if (walked != nchild[i]) FAIL("child list of node %d has %d of %d children", i, walked, nchild[i]);
        if (i > 0 && n->n_children == 0) leaves++;
    }
    if (live != t->n_nodes) FAIL("n_nodes %d but %d live nodes", t->n_nodes, live);
    if (unlocked != t->n_unlocked) FAIL("n_unlocked %d but %d unlocked nodes", t->n_unlocked, unlocked);
    /* locks: each holder counts on its node and every ancestor */
    if (lock_nodes) {
        for (int k = 0; k < n_lock; k++) {
            int32_t x = lock_nodes[k];
            if (x < 0 || x >= N || !t->nodes[x].live) FAIL("lock holder %d names invalid node %d", k, x);
            for (int32_t i = x, d = 0; i > 0; i = t->nodes[i].parent) {
                lockc[i]++;
                if (++d > N) FAIL("parent chain of node %d loops", x);
            }
        }
        for (int i = 1; i < N; i++)
            if (t->nodes[i].live && t->nodes[i].lock != lockc[i])
                FAIL("node %d lock %d but %d holders at or below it", i, t->nodes[i].lock, lockc[i]);
    } else {
        for (int i = 1; i < N; i++) {
            const ms_radix_node *n = &t->nodes[i];
            if (n->live && n->parent > 0 && t->nodes[n->parent].lock < n->lock)
                FAIL("node %d lock %d exceeds its parent's %d", i, n->lock, t->nodes[n->parent].lock);
        }
    }
    /* heap: exactly the unlocked leaves, heap-ordered, positions consistent */
    int want = 0;
    for (int i = 1; i < N; i++) {
        const ms_radix_node *n = &t->nodes[i];
        int ev = n->live && n->lock == 0 && n->n_children == 0;
        want += ev;
        if (ev != (n->heap_pos != NIL)) FAIL("node %d heap membership %d but evictable %d", i, n->heap_pos != NIL, ev);
        if (n->heap_pos != NIL && (n->heap_pos >= t->n_heap || t->heap[n->heap_pos] != i))
            FAIL("node %d heap position %d is stale", i, n->heap_pos);
    }
    if (want != t->n_heap) FAIL("heap holds %d nodes, %d are evictable", t->n_heap, want);
    for (int p = 1; p < t->n_heap; p++)
        if (heap_less(t, t->heap[p], t->heap[(p - 1) / 2])) FAIL("heap order broken at %d", p);
    (void)leaves;
#undef FAIL
out:
    free(nchild); free(lockc); free(page_seen);
    return rc;
}
