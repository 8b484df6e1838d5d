/* test_radix.c - the radix prefix cache against a brute-force model: a flat list of every cached
 * page-prefix with its page, last-use tick and lock count. Random insert / match / lock / unlock /
 * evict workloads over a tiny alphabet (so prefixes collide) must agree with the model on matched
 * pages, adopted pages and LRU victims, with both integrity checkers after every operation. */
#include "kv/radix.h"
#include "test.h"

#include <stdint.h>
#include <stdlib.h>

enum { PS = 2, MAXP = 6, NPAGES = 24, MAXE = 256, MAXH = 16 };

static uint64_t rng_state = 99;
static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11) % n;
}

typedef struct { int k; int32_t tok[MAXP * PS]; int32_t page; uint64_t time; int lock; int live; } bentry;
typedef struct { int32_t node; int k; int32_t tok[MAXP * PS]; int32_t pages[MAXP]; } holder;

static bentry E[MAXE];
static int nE;
static uint64_t bclock;
static holder H[MAXH];
static int nH;

static int bfind(const int32_t *tok, int k) {
    for (int i = 0; i < nE; i++)
        if (E[i].live && E[i].k == k && memcmp(E[i].tok, tok, (size_t)k * PS * sizeof *tok) == 0) return i;
    return -1;
}

static int bmatch(const int32_t *tok, int max_k, int32_t *pages) {
    int k = 0;
    while (k < max_k) {
        int e = bfind(tok, k + 1);
        if (e < 0) break;
        pages[k++] = E[e].page;
    }
    if (k > 0) {
        bclock++;
        for (int j = 1; j <= k; j++) E[bfind(tok, j)].time = bclock;
    }
    return k;
}

static int binsert(const int32_t *tok, int k, const int32_t *pages) {
    int adopted = 0;
    bclock++;
    for (int j = 1; j <= k; j++) {
        int e = bfind(tok, j);
        if (e < 0) {
            int slot = -1;
            for (int i = 0; i < nE; i++) if (!E[i].live) { slot = i; break; }
            if (slot < 0) slot = nE++;
            MS_ASSERT(slot < MAXE);
            memset(&E[slot], 0, sizeof E[slot]);
            E[slot].k = j;
            memcpy(E[slot].tok, tok, (size_t)j * PS * sizeof *tok);
            E[slot].page = pages[j - 1];
            E[slot].live = 1;
            e = slot;
            adopted++;
        }
        E[e].time = bclock;
    }
    return adopted;
}

static int bhas_child(int e) {
    for (int i = 0; i < nE; i++)
        if (E[i].live && E[i].k == E[e].k + 1 && memcmp(E[i].tok, E[e].tok, (size_t)E[e].k * PS * sizeof(int32_t)) == 0)
            return 1;
    return 0;
}

/* Evicts one LRU unlocked leaf from the model; returns its page or -1. Flags ties (should not occur). */
static int32_t bevict_one(int *tie) {
    int best = -1;
    for (int i = 0; i < nE; i++) {
        if (!E[i].live || E[i].lock || bhas_child(i)) continue;
        if (best < 0 || E[i].time < E[best].time) best = i;
        else if (E[i].time == E[best].time) *tie = 1;
    }
    if (best < 0) return -1;
    E[best].live = 0;
    return E[best].page;
}

static void block(const int32_t *tok, int k, int d) {
    for (int j = 1; j <= k; j++) E[bfind(tok, j)].lock += d;
}

static void random_seq(int32_t *tok, int k) {
    /* half the time extend a cached prefix so that sharing is common */
    int start = 0;
    if (nE > 0 && rnd(2)) {
        int e = (int)rnd((uint32_t)nE);
        if (E[e].live && E[e].k <= k) { memcpy(tok, E[e].tok, (size_t)E[e].k * PS * sizeof *tok); start = E[e].k * PS; }
    }
    for (int i = start; i < k * PS; i++) tok[i] = (int32_t)rnd(3);
}

/* Every consistency check: both checkers, pool refs rebuilt from the model, tree pages = model pages. */
static int verify(ms_radix *t, ms_kv_pool *pool, int step) {
    ms_err err = {0};
    int32_t locks[MAXH], expect[NPAGES] = {0}, tree_refs[NPAGES] = {0}, model_refs[NPAGES] = {0};
    for (int h = 0; h < nH; h++) {
        locks[h] = H[h].node;
        for (int j = 0; j < H[h].k; j++) expect[H[h].pages[j]]++;
    }
    for (int i = 0; i < nE; i++) if (E[i].live) { expect[E[i].page]++; model_refs[E[i].page]++; }
    ms_radix_add_refs(t, tree_refs);
    if (ms_radix_check(t, locks, nH, &err) != MS_OK) { CHECK_MSG(0, "step %d: %s", step, err.msg); return 0; }
    if (ms_kv_pool_check(pool, expect, &err) != MS_OK) { CHECK_MSG(0, "step %d: %s", step, err.msg); return 0; }
    if (memcmp(tree_refs, model_refs, sizeof tree_refs) != 0) { CHECK_MSG(0, "step %d: cached pages differ from the model", step); return 0; }
    int unlocked = 0;
    for (int i = 0; i < nE; i++) unlocked += E[i].live && E[i].lock == 0;
    if (unlocked != ms_radix_n_evictable(t)) { CHECK_MSG(0, "step %d: evictable %d vs %d", step, ms_radix_n_evictable(t), unlocked); return 0; }
    return 1;
}

/* Evicts n from both and compares; returns number evicted. */
static int evict_both(ms_radix *t, int n, int step) {
    int32_t before[NPAGES] = {0};
    ms_radix_add_refs(t, before);
    int got = ms_radix_evict(t, n), want = 0, tie = 0;
    for (int i = 0; i < n; i++) { if (bevict_one(&tie) < 0) break; want++; }
    CHECK_MSG(!tie, "step %d: equal LRU ticks among leaves", step);
    CHECK_MSG(got == want, "step %d: evicted %d, model %d", step, got, want);
    return got;
}

static void release_holder(ms_radix *t, ms_kv_pool *pool, int h) {
    ms_radix_unlock(t, H[h].node);
    block(H[h].tok, H[h].k, -1);
    ms_kv_pool_unref_n(pool, H[h].pages, H[h].k);
    H[h] = H[--nH];
}

static void run_workload(uint64_t seed, int steps) {
    ms_kv_pool pool;
    ms_radix t;
    ms_err err = {0};
    rng_state = seed; nE = 0; bclock = 0; nH = 0;
    CHECK_EQ_INT(ms_kv_pool_init(&pool, NPAGES, PS, &err), MS_OK);
    CHECK_EQ_INT(ms_radix_init(&t, &pool, &err), MS_OK);
    int matches = 0, hits = 0, evictions = 0;
    for (int step = 0; step < steps; step++) {
        uint32_t op = rnd(10);
        int32_t tok[MAXP * PS], pages[MAXP];
        if (op < 3) { /* insert a sequence computed into fresh pages (duplicates are not adopted) */
            int k = 1 + (int)rnd(MAXP);
            random_seq(tok, k);
            int need = k - ms_kv_pool_n_free(&pool);
            if (need > 0) evictions += evict_both(&t, need, step);
            if (ms_kv_pool_alloc(&pool, k, pages) == MS_OK) {
                int a = ms_radix_insert(&t, tok, k, pages);
                int b = binsert(tok, k, pages);
                CHECK_MSG(a == b, "step %d: adopted %d, model %d", step, a, b);
                ms_kv_pool_unref_n(&pool, pages, k);
            }
        } else if (op < 6) { /* match; keep it locked half the time (a running request) */
            int k = 1 + (int)rnd(MAXP), max_k = (int)rnd(MAXP + 1);
            random_seq(tok, k);
            int32_t node, bp[MAXP];
            int n_tok = k * PS - (int)rnd(2); /* a partial last page never matches */
            int got = ms_radix_match(&t, tok, n_tok, max_k, pages, &node);
            int lim = n_tok / PS < max_k ? n_tok / PS : max_k;
            int want = bmatch(tok, lim, bp);
            matches++; hits += got > 0;
            CHECK_MSG(got == want && memcmp(pages, bp, (size_t)got * sizeof *bp) == 0, "step %d: match %d vs %d", step, got, want);
            if (got > 0 && nH < MAXH && rnd(2)) {
                holder *h = &H[nH++];
                h->node = node; h->k = got;
                memcpy(h->tok, tok, sizeof tok);
                memcpy(h->pages, pages, (size_t)got * sizeof *pages);
                for (int j = 0; j < got; j++) ms_kv_pool_ref(&pool, pages[j]);
                ms_radix_lock(&t, node);
                block(tok, got, +1);
            }
        } else if (op < 8 && nH > 0) { /* a holder finishes: extend its sequence, insert, release */
            int h = (int)rnd((uint32_t)nH);
            int k = H[h].k + (int)rnd((uint32_t)(MAXP - H[h].k + 1));
            memcpy(tok, H[h].tok, (size_t)H[h].k * PS * sizeof *tok);
            for (int i = H[h].k * PS; i < k * PS; i++) tok[i] = (int32_t)rnd(3);
            int extra = k - H[h].k;
            int need = extra - ms_kv_pool_n_free(&pool);
            if (need > 0) evictions += evict_both(&t, need, step);
            memcpy(pages, H[h].pages, (size_t)H[h].k * sizeof *pages);
            if (ms_kv_pool_alloc(&pool, extra, pages + H[h].k) == MS_OK) {
                int a = ms_radix_insert(&t, tok, k, pages);
                int b = binsert(tok, k, pages);
                CHECK_MSG(a == b, "step %d: adopted %d, model %d", step, a, b);
                ms_kv_pool_unref_n(&pool, pages + H[h].k, extra);
            }
            release_holder(&t, &pool, h);
        } else if (op < 9 && nH > 0) {
            release_holder(&t, &pool, (int)rnd((uint32_t)nH));
        } else {
            evictions += evict_both(&t, 1 + (int)rnd(4), step);
        }
        if (!verify(&t, &pool, step)) break;
    }
    CHECK(matches > 0 && hits > 0 && evictions > 0); /* the workload exercised all paths */
    while (nH > 0) release_holder(&t, &pool, nH - 1);
    ms_radix_evict(&t, NPAGES);
    CHECK_EQ_INT(t.n_nodes, 0);
    CHECK_EQ_INT(ms_kv_pool_n_free(&pool), NPAGES);
    ms_radix_destroy(&t);
    ms_kv_pool_destroy(&pool);
}

static void test_random_workloads(void) {
    for (uint64_t s = 1; s <= 6; s++) run_workload(s * 7919, 3000);
}

static void test_basic_match_and_lru(void) {
    ms_kv_pool pool;
    ms_radix t;
    ms_err err = {0};
    CHECK_EQ_INT(ms_kv_pool_init(&pool, 8, 2, &err), MS_OK);
    CHECK_EQ_INT(ms_radix_init(&t, &pool, &err), MS_OK);
    int32_t a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 2, 3, 4, 9, 9}, pa[3], pb[3], out[3], node;
    CHECK_EQ_INT(ms_kv_pool_alloc(&pool, 3, pa), MS_OK);
    CHECK_EQ_INT(ms_radix_insert(&t, a, 3, pa), 3);
    ms_kv_pool_unref_n(&pool, pa, 3);
    CHECK_EQ_INT(ms_radix_match(&t, b, 6, 3, out, &node), 2); /* shares two pages */
    CHECK(out[0] == pa[0] && out[1] == pa[1]);
    CHECK_EQ_INT(ms_radix_match(&t, a, 5, 3, out, &node), 2); /* partial last page does not match */
    CHECK_EQ_INT(ms_radix_match(&t, a, 6, 1, out, &node), 1); /* max_pages caps */
    CHECK_EQ_INT(ms_kv_pool_alloc(&pool, 3, pb), MS_OK);
    CHECK_EQ_INT(ms_radix_insert(&t, b, 3, pb), 1); /* only the third page is new */
    ms_kv_pool_unref_n(&pool, pb, 3);
    CHECK_EQ_INT(ms_kv_pool_n_free(&pool), 4);
    CHECK_EQ_INT(ms_radix_match(&t, a, 6, 3, out, &node), 3); /* a is now the most recent */
    ms_radix_lock(&t, node);
    CHECK_EQ_INT(ms_radix_n_evictable(&t), 1);
    CHECK_EQ_INT(ms_radix_evict(&t, 5), 1); /* only b's last page is unlocked */
    CHECK_EQ_INT(ms_radix_match(&t, b, 6, 3, out, &node), 2);
    int32_t lk = 0;
    ms_radix_match(&t, a, 6, 3, out, &lk);
    CHECK_EQ_INT(ms_radix_check(&t, &lk, 1, &err), MS_OK);
    ms_radix_unlock(&t, lk);
    CHECK_EQ_INT(ms_radix_check(&t, NULL, 0, &err), MS_OK);
    CHECK_EQ_INT(ms_radix_evict(&t, 5), 3);
    CHECK_EQ_INT(ms_kv_pool_n_free(&pool), 8);
    ms_radix_destroy(&t);
    ms_kv_pool_destroy(&pool);
}

/* The checker must fail on a corrupted tree. */
static void test_checker_detects_corruption(void) {
    ms_kv_pool pool;
    ms_radix t;
    ms_err err = {0};
    CHECK_EQ_INT(ms_kv_pool_init(&pool, 4, 2, &err), MS_OK);
    CHECK_EQ_INT(ms_radix_init(&t, &pool, &err), MS_OK);
    int32_t a[4] = {1, 2, 3, 4}, pa[2];
    CHECK_EQ_INT(ms_kv_pool_alloc(&pool, 2, pa), MS_OK);
    ms_radix_insert(&t, a, 2, pa);
    ms_kv_pool_unref_n(&pool, pa, 2);
    CHECK_EQ_INT(ms_radix_check(&t, NULL, 0, &err), MS_OK);
    int32_t node = 1;
    CHECK_EQ_INT(ms_radix_check(&t, &node, 1, &err), MS_ERR_RUNTIME); /* a holder the tree lacks */
    t.tokens[t.page_size * 1] ^= 7; /* key changed behind the hash table's back */
    CHECK_EQ_INT(ms_radix_check(&t, NULL, 0, &err), MS_ERR_RUNTIME);
    t.tokens[t.page_size * 1] ^= 7;
    t.n_unlocked++;
    CHECK_EQ_INT(ms_radix_check(&t, NULL, 0, &err), MS_ERR_RUNTIME);
    t.n_unlocked--;
    ms_radix_destroy(&t);
    CHECK_EQ_INT(ms_kv_pool_n_free(&pool), 4);
    ms_kv_pool_destroy(&pool);
}

int main(void) {
    RUN(test_basic_match_and_lru);
    RUN(test_checker_detects_corruption);
    RUN(test_random_workloads);
    return TEST_SUMMARY();
}
