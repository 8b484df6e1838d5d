/* radix.h - the prefix cache: KV pages of earlier requests, found again by their token ids.
 *
 * SGLang's RadixAttention idea at page granularity. The tree is keyed by token ids; each node
 * below the root stands for one full page (page_size tokens) and holds one pool reference on the
 * page whose KV it caches, so a path from the root spells a cached prefix. A new prompt matches the
 * longest cached prefix of whole pages; a finished (or preempted) request inserts its full pages.
 * Children are found through one hash table keyed by xxhash(parent node, page tokens) and confirmed
 * by comparing tokens, so matching costs O(pages of the prompt).
 *
 * Running requests lock the deepest node they use (the lock counts up to the root), and locked
 * nodes are never evicted. Unlocked leaves sit in a min-heap by last access time, so eviction takes
 * the least recently used one in O(log n); a parent whose last child goes becomes a leaf in turn.
 * Because a path is always touched as a whole, a parent is never older than its children.
 * Single-threaded (engine thread). */
#ifndef MS_KV_RADIX_H
#define MS_KV_RADIX_H

#include "core/status.h"
#include "kv/kv_pool.h"

#include <stdint.h>

typedef struct ms_radix_node {
    int32_t parent;        /* node index; -1 for the root and for free nodes */
    int32_t first_child, next_sibling, prev_sibling; /* -1 terminated */
    int32_t n_children;
    int32_t page;          /* pool page id (root: -1) */
    int32_t lock;          /* lock holders at or below this node */
    int32_t heap_pos;      /* position in the eviction heap, -1 when not evictable */
    int32_t hnext;         /* next node in the hash chain (or in the free list) */
    uint8_t live;
    uint64_t hash;         /* xxhash of (parent index, page tokens) */
    uint64_t last_access;  /* tick of the last match/insert through this node */
} ms_radix_node;

typedef struct ms_radix {
    ms_kv_pool *pool;      /* borrowed */
    int page_size;
    int max_nodes;         /* nodes besides the root (= pool pages: a page is cached at most once) */
    ms_radix_node *nodes;  /* [max_nodes + 1]; index 0 is the root */
    int32_t *tokens;       /* [(max_nodes + 1) * page_size] the page key of each node */
    int32_t *buckets;      /* [n_buckets] hash chain heads */
    uint32_t bucket_mask;
    int32_t *heap;         /* [max_nodes] evictable leaves, min (last_access, index) first */
    int n_heap;
    int32_t free_head;     /* free node list through hnext */
    int n_nodes;           /* live nodes besides the root */
    int n_unlocked;        /* live nodes with lock == 0: pages evictable now or after their leaves */
    uint64_t clock;
    uint64_t query_tokens, hit_tokens; /* counters, updated by ms_radix_record_hit */
    uint64_t evicted_pages;
} ms_radix;

/* Creates an empty tree over pool (borrowed; must outlive the tree) able to hold every pool page. */
int ms_radix_init(ms_radix *t, ms_kv_pool *pool, ms_err *err);
/* Releases every cached page reference (the tree must be unlocked) and frees the tree's memory. */
void ms_radix_destroy(ms_radix *t);

/* Finds the longest cached prefix of tokens[0..n_tokens) in whole pages, at most max_pages pages.
 * Writes their page ids to pages_out[<= max_pages] (no references taken) and the deepest matched
 * node to *node_out (0 = the root when nothing matched). Marks the path as just used (LRU).
 * Returns the number of matched pages. */
int ms_radix_match(ms_radix *t, const int32_t *tokens, int n_tokens, int max_pages, int32_t *pages_out,
                   int32_t *node_out);
/* Locks node and its ancestors against eviction (one holder). node 0 (root) is a no-op. The caller
 * holds its own pool references on the pages it uses; the lock only pins the tree's copies. */
void ms_radix_lock(ms_radix *t, int32_t node);
/* Undoes one ms_radix_lock(node). */
void ms_radix_unlock(ms_radix *t, int32_t node);

/* Inserts the prefix tokens[0 .. n_pages*page_size) whose KV lives in pages[0..n_pages). Pages
 * already cached for the same tokens stay as they are (the tree keeps its own copy; the caller's
 * duplicate is not adopted); new nodes take one pool reference on the caller's page. The caller
 * still owns its own references afterwards. Returns the number of pages adopted. */
int ms_radix_insert(ms_radix *t, const int32_t *tokens, int n_pages, const int32_t *pages);

/* Evicts up to n least recently used unlocked leaves, dropping the tree's page references.
 * Returns the number of nodes evicted (< n only when nothing else is evictable). */
int ms_radix_evict(ms_radix *t, int n);

/* Adds the request-level hit counters (prompt tokens looked up, tokens served from the cache). */
static inline void ms_radix_record_hit(ms_radix *t, int n_query, int n_hit) {
    t->query_tokens += (uint64_t)n_query;
    t->hit_tokens += (uint64_t)n_hit;
}

/* Pages held only by the tree (unlocked nodes): evictable now or once their descendants go. */
static inline int ms_radix_n_evictable(const ms_radix *t) { return t->n_unlocked; }

/* Adds one to counts[page] for every page the tree holds (rebuilding pool refcounts for
 * ms_kv_pool_check). */
void ms_radix_add_refs(const ms_radix *t, int32_t *counts);

/* Integrity check from scratch: parent/child links and counts, unique valid pages each with a pool
 * reference, every node reachable through the hash table, a parent never older than its child,
 * the eviction heap = exactly the unlocked leaves in heap order, counters. When lock_nodes is not
 * NULL it lists every current lock holder's node (n_lock entries, 0 allowed) and each node's
 * lock count must equal the holders at or below it. Returns MS_OK or MS_ERR_RUNTIME. */
int ms_radix_check(const ms_radix *t, const int32_t *lock_nodes, int n_lock, ms_err *err);

#endif
