/* test_kv_pool.c - the page pool against a shadow count of every reference the test holds, with
 * the integrity checker after every operation. */
#include "kv/kv_pool.h"
#include "test.h"

#include <stdint.h>
#include <stdlib.h>

static uint64_t rng_state = 12345;
static uint32_t rnd(uint32_t n) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33) % n;
}

static void test_init_and_alloc_all(void) {
    ms_kv_pool p;
    ms_err err = {0};
    CHECK_EQ_INT(ms_kv_pool_init(&p, 0, 16, &err), MS_ERR_INVALID);
    CHECK_EQ_INT(ms_kv_pool_init(&p, 8, 16, &err), MS_OK);
    CHECK_EQ_INT(ms_kv_pool_n_free(&p), 8);
    CHECK_EQ_INT(ms_kv_pool_check(&p, NULL, &err), MS_OK);
    int32_t ids[9];
    CHECK_EQ_INT(ms_kv_pool_alloc(&p, 9, ids), MS_ERR_NOMEM);
    CHECK_EQ_INT(ms_kv_pool_n_free(&p), 8); /* all or nothing */
    CHECK_EQ_INT(ms_kv_pool_alloc(&p, 8, ids), MS_OK);
    int seen[8] = {0};
    for (int i = 0; i < 8; i++) {
        CHECK(ids[i] >= 0 && ids[i] < 8);
        if (ids[i] >= 0 && ids[i] < 8) seen[ids[i]]++;
        CHECK_EQ_INT(ms_kv_pool_refcount(&p, ids[i]), 1);
    }
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(seen[i], 1);
    CHECK_EQ_INT(ms_kv_pool_n_free(&p), 0);
    CHECK_EQ_INT(ms_kv_pool_alloc(&p, 1, ids + 8), MS_ERR_NOMEM);
    ms_kv_pool_ref(&p, ids[3]);
    ms_kv_pool_unref(&p, ids[3]);
    CHECK_EQ_INT(ms_kv_pool_n_free(&p), 0);
    ms_kv_pool_unref_n(&p, ids, 8);
    CHECK_EQ_INT(ms_kv_pool_n_free(&p), 8);
    CHECK_EQ_INT(ms_kv_pool_check(&p, NULL, &err), MS_OK);
    ms_kv_pool_destroy(&p);
}

/* Random alloc/ref/unref; a shadow list of held references is the oracle for refcounts. */
static void test_random_against_shadow(void) {
    enum { NP = 37, MAXH = 4096 };
    ms_kv_pool p;
    ms_err err = {0};
    CHECK_EQ_INT(ms_kv_pool_init(&p, NP, 4, &err), MS_OK);
    int32_t held[MAXH];
    int n_held = 0, bad = 0;
    int32_t expect[NP];
    for (int step = 0; step < 20000 && !bad; step++) {
        uint32_t op = rnd(10);
        if (op < 4) {
            int n = (int)rnd(6);
            int32_t got[6];
            int free_before = ms_kv_pool_n_free(&p);
            int rc = ms_kv_pool_alloc(&p, n, got);
            if (n > free_before) { CHECK_EQ_INT(rc, MS_ERR_NOMEM); CHECK_EQ_INT(ms_kv_pool_n_free(&p), free_before); }
            else {
                CHECK_EQ_INT(rc, MS_OK);
                for (int i = 0; i < n && n_held < MAXH; i++) held[n_held++] = got[i];
            }
        } else if (op < 6 && n_held > 0 && n_held < MAXH) {
            int32_t pg = held[rnd((uint32_t)n_held)];
            ms_kv_pool_ref(&p, pg);
            held[n_held++] = pg;
        } else if (n_held > 0) {
            int k = (int)rnd((uint32_t)n_held);
            ms_kv_pool_unref(&p, held[k]);
            held[k] = held[--n_held];
        }
        memset(expect, 0, sizeof expect);
        for (int i = 0; i < n_held; i++) expect[held[i]]++;
        int nfree = 0;
        for (int i = 0; i < NP; i++) nfree += expect[i] == 0;
        if (ms_kv_pool_check(&p, expect, &err) != MS_OK || nfree != ms_kv_pool_n_free(&p)) {
            CHECK_MSG(0, "step %d: %s (free %d vs %d)", step, err.msg, nfree, ms_kv_pool_n_free(&p));
            bad = 1;
        }
    }
    while (n_held > 0) ms_kv_pool_unref(&p, held[--n_held]);
    CHECK_EQ_INT(ms_kv_pool_n_free(&p), NP);
    CHECK_EQ_INT(ms_kv_pool_check(&p, NULL, &err), MS_OK);
    ms_kv_pool_destroy(&p);
}

/* The checker must notice corruption, not just pass. */
static void test_checker_detects_corruption(void) {
    ms_kv_pool p;
    ms_err err = {0};
    CHECK_EQ_INT(ms_kv_pool_init(&p, 4, 2, &err), MS_OK);
    int32_t a[2];
    CHECK_EQ_INT(ms_kv_pool_alloc(&p, 2, a), MS_OK);
    int32_t expect[4] = {0};
    expect[a[0]] = 1; expect[a[1]] = 1;
    CHECK_EQ_INT(ms_kv_pool_check(&p, expect, &err), MS_OK);
    expect[a[1]] = 2; /* a holder the pool does not know about */
    CHECK_EQ_INT(ms_kv_pool_check(&p, expect, &err), MS_ERR_RUNTIME);
    CHECK(strstr(err.msg, "refcount") != NULL);
    p.refcnt[a[0]] = 0; /* leaked: count zero but not in the free set */
    CHECK_EQ_INT(ms_kv_pool_check(&p, NULL, &err), MS_ERR_RUNTIME);
    p.refcnt[a[0]] = 1;
    p.free_ids[0] = p.free_ids[1]; /* duplicate in the free set */
    CHECK_EQ_INT(ms_kv_pool_check(&p, NULL, &err), MS_ERR_RUNTIME);
    ms_kv_pool_destroy(&p);
}

int main(void) {
    RUN(test_init_and_alloc_all);
    RUN(test_random_against_shadow);
    RUN(test_checker_detects_corruption);
    return TEST_SUMMARY();
}
