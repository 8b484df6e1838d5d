/* test_comm_nccl.c - the NCCL communicator on real GPUs: every op in F32 and BF16 with one rank,
 * and with every visible GPU as a thread when there are several; abort; an initialisation whose
 * peer never joins fails within the timeout. Values are small integers, so every sum is exact
 * whatever order NCCL adds in, and results are compared bit for bit. Without a GPU (or in a build
 * without CUDA) the GPU cases are skipped, as in test_cuda_ops, and only the capability check runs
 * (scripts/gpu-check.sh runs the rest). */
#include "backend/backend.h"
#include "core/dtype.h"
#include "dist/comm.h"
#include "test.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* element i of rank r: a small integer, exact in bf16 and in any sum of up to 8 ranks */
static float ival(int r, size_t i, int salt) { return (float)((int)((i * 7 + (size_t)r * 13 + (size_t)salt) % 31) - 15); }

static void fill(void *h, ms_dtype dt, int r, size_t off, size_t n, int salt) {
    for (size_t i = 0; i < n; i++) {
        float v = ival(r, off + i, salt);
        if (dt == MS_F32) ((float *)h)[i] = v;
        else ((uint16_t *)h)[i] = ms_f32_to_bf16(v);
    }
}

static void ref_sum(void *h, ms_dtype dt, int nr, size_t off, size_t n, int salt) {
    for (size_t i = 0; i < n; i++) {
        float acc = 0;
        for (int r = 0; r < nr; r++) acc += ival(r, off + i, salt);
        if (dt == MS_F32) ((float *)h)[i] = acc;
        else ((uint16_t *)h)[i] = ms_f32_to_bf16(acc);
    }
}

typedef struct rank_ctx {
    int rank, size, mode;
    const unsigned char *id;
    int fails;
    int rc;
    char msg[MS_ERR_MSG_MAX];
} rank_ctx;

#define RFAIL(...)                                                                                \
    do {                                                                                          \
        fprintf(stderr, "  rank %d: ", x->rank);                                                  \
        fprintf(stderr, __VA_ARGS__);                                                             \
        fputc('\n', stderr);                                                                      \
        x->fails++;                                                                               \
    } while (0)

static void *rank_main(void *p) {
    rank_ctx *x = p;
    ms_err err = {0};
    ms_backend *b = NULL;
    ms_comm *c = NULL;
    if (ms_backend_create("cuda", x->rank, &b, &err) != MS_OK) {
        RFAIL("backend: %s", err.msg);
        return NULL;
    }
    if (ms_comm_nccl_create(b, x->id, x->rank, x->size, 60, &c, &err) != MS_OK) {
        RFAIL("create: %s", err.msg);
        ms_backend_destroy(b);
        return NULL;
    }
    const size_t counts[] = {1, 7, 1000, (size_t)1 << 20};
    const ms_dtype dts[] = {MS_F32, MS_BF16};
    int n = x->size, me = x->rank;
    for (int d = 0; d < 2; d++) {
        ms_dtype dt = dts[d];
        size_t es = ms_dtype_size(dt);
        for (int k = 0; k < 4; k++) {
            size_t cnt = counts[k], big = cnt * (size_t)n * es;
            unsigned char *h = malloc(big), *ref = malloc(big), *got = malloc(big);
            ms_tensor A, B;
            int64_t shape[1] = {(int64_t)(cnt * (size_t)n)};
            if (ms_backend_alloc(b, &A, dt, 1, shape, &err) != MS_OK || ms_backend_alloc(b, &B, dt, 1, shape, &err) != MS_OK) {
                RFAIL("alloc: %s", err.msg);
                break;
            }
            int salt = k * 4 + d;
            /* all_reduce */
            fill(h, dt, me, 0, cnt, salt);
            ref_sum(ref, dt, n, 0, cnt, salt);
            if (b->ops->upload(b, A.data, h, cnt * es, &err) || c->ops->all_reduce_sum(c, A.data, cnt, dt, &err) ||
                b->ops->sync(b, &err) || b->ops->download(b, got, A.data, cnt * es, &err))
                RFAIL("all_reduce: %s", err.msg);
            else if (memcmp(got, ref, cnt * es)) RFAIL("all_reduce %s count %zu wrong", ms_dtype_name(dt), cnt);
            /* all_gather */
            fill(h, dt, me, 0, cnt, salt + 1);
            for (int r = 0; r < n; r++) fill(ref + (size_t)r * cnt * es, dt, r, 0, cnt, salt + 1);
            if (b->ops->upload(b, A.data, h, cnt * es, &err) || c->ops->all_gather(c, A.data, B.data, cnt, dt, &err) ||
                b->ops->sync(b, &err) || b->ops->download(b, got, B.data, big, &err))
                RFAIL("all_gather: %s", err.msg);
            else if (memcmp(got, ref, big)) RFAIL("all_gather %s count %zu wrong", ms_dtype_name(dt), cnt);
            /* reduce_scatter */
            fill(h, dt, me, 0, cnt * (size_t)n, salt + 2);
            ref_sum(ref, dt, n, (size_t)me * cnt, cnt, salt + 2);
            if (b->ops->upload(b, A.data, h, big, &err) || c->ops->reduce_scatter_sum(c, A.data, B.data, cnt, dt, &err) ||
                b->ops->sync(b, &err) || b->ops->download(b, got, B.data, cnt * es, &err))
                RFAIL("reduce_scatter: %s", err.msg);
            else if (memcmp(got, ref, cnt * es)) RFAIL("reduce_scatter %s count %zu wrong", ms_dtype_name(dt), cnt);
            /* broadcast from the last rank */
            int root = n - 1;
            fill(ref, dt, root, 0, cnt, salt + 3);
            if (me == root) memcpy(h, ref, cnt * es);
            else memset(h, 0x5a, cnt * es);
            if (b->ops->upload(b, A.data, h, cnt * es, &err) || c->ops->broadcast(c, A.data, cnt * es, root, &err) ||
                b->ops->sync(b, &err) || b->ops->download(b, got, A.data, cnt * es, &err))
                RFAIL("broadcast: %s", err.msg);
            else if (memcmp(got, ref, cnt * es)) RFAIL("broadcast count %zu wrong", cnt);
            if (c->ops->barrier(c, &err) != MS_OK) RFAIL("barrier: %s", err.msg);
            b->ops->free(b, &A);
            b->ops->free(b, &B);
            free(h);
            free(ref);
            free(got);
        }
    }
    /* 1000 small all-reduces in a row: no deadlock, watchdog ring wraps */
    ms_tensor S;
    int64_t s1[1] = {8};
    if (ms_backend_alloc(b, &S, MS_F32, 1, s1, &err) == MS_OK) {
        float h[8] = {1, 1, 1, 1, 1, 1, 1, 1}, got[8];
        b->ops->upload(b, S.data, h, sizeof h, &err);
        for (int it = 0; it < 1000 && x->fails == 0; it++)
            if (c->ops->all_reduce_sum(c, S.data, 8, MS_F32, &err) != MS_OK) RFAIL("loop: %s", err.msg);
        if (b->ops->sync(b, &err) || b->ops->download(b, got, S.data, sizeof got, &err)) RFAIL("loop sync: %s", err.msg);
        else if (n == 1 && got[3] != 1.f) RFAIL("loop: %g", got[3]);
        b->ops->free(b, &S);
    }
    ms_comm_destroy(c);
    ms_backend_destroy(b);
    return NULL;
}

static int n_gpus;

static void run_group(int n) {
    unsigned char id[MS_COMM_NCCL_ID_BYTES];
    ms_err err = {0};
    if (ms_comm_nccl_unique_id(id, &err) != MS_OK) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    rank_ctx x[8];
    pthread_t th[8];
    for (int r = 0; r < n; r++) {
        x[r] = (rank_ctx){.rank = r, .size = n, .id = id};
        pthread_create(&th[r], NULL, rank_main, &x[r]);
    }
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        CHECK_MSG(x[r].fails == 0, "rank %d of %d: %d failures", r, n, x[r].fails);
    }
}

static void test_one_rank(void) { run_group(1); }
static void test_all_gpus(void) { run_group(n_gpus > 8 ? 8 : n_gpus); }

static void test_abort(void) {
    ms_err err = {0};
    ms_backend *b = NULL;
    ms_comm *c = NULL;
    unsigned char id[MS_COMM_NCCL_ID_BYTES];
    CHECK(ms_backend_create("cuda", 0, &b, &err) == MS_OK);
    CHECK(ms_comm_nccl_unique_id(id, &err) == MS_OK);
    CHECK_MSG(ms_comm_nccl_create(b, id, 0, 1, 10, &c, &err) == MS_OK, "%s", err.msg);
    if (c) {
        c->ops->abort(c, "test abort cause 7");
        ms_tensor S;
        int64_t s1[1] = {4};
        CHECK(ms_backend_alloc(b, &S, MS_F32, 1, s1, &err) == MS_OK);
        CHECK(c->ops->all_reduce_sum(c, S.data, 4, MS_F32, &err) != MS_OK);
        CHECK_MSG(strstr(err.msg, "test abort cause 7") != NULL, "%s", err.msg);
        b->ops->free(b, &S);
        ms_comm_destroy(c);
    }
    ms_backend_destroy(b);
}

/* rank 0 of a group of 2 whose rank 1 never comes: the init must fail within about the timeout. */
static void test_init_timeout(void) {
    ms_err err = {0};
    ms_backend *b = NULL;
    ms_comm *c = NULL;
    unsigned char id[MS_COMM_NCCL_ID_BYTES];
    CHECK(ms_backend_create("cuda", 0, &b, &err) == MS_OK);
    CHECK(ms_comm_nccl_unique_id(id, &err) == MS_OK);
    double t0 = now_s();
    CHECK(ms_comm_nccl_create(b, id, 0, 2, 3.0, &c, &err) != MS_OK);
    double dt = now_s() - t0;
    fprintf(stderr, "  (init without rank 1: %.2f s: %s)\n", dt, err.msg);
    CHECK_MSG(dt < 10.0, "took %.2f s", dt);
    CHECK(c == NULL);
    ms_backend_destroy(b);
}

static void test_capability(void) {
    char why[256] = "";
    int ok = ms_dist_available("nccl", why, sizeof why);
    CHECK(ok || why[0]);
    CHECK_STR(ms_comm_kind_for_backend("cuda", 1), "nccl");
    ms_comm *c = NULL;
    ms_err err = {0};
    unsigned char id[MS_COMM_NCCL_ID_BYTES] = {0};
    CHECK(ms_comm_nccl_create(NULL, id, 0, 1, 1, &c, &err) != MS_OK); /* no backend: refused, not a crash */
    CHECK(c == NULL);
}

int main(void) {
    ms_err err = {0};
    ms_backend *probe = NULL;
    RUN(test_capability);
    if (!ms_backend_cuda_compiled() || ms_backend_create("cuda", 0, &probe, &err) != MS_OK) {
        printf("no GPU: skipped the NCCL cases (%s)\n", ms_backend_cuda_compiled() ? err.msg : "build without CUDA");
        return TEST_SUMMARY();
    }
    ms_backend_destroy(probe);
    char why[256] = "";
    if (!ms_dist_available("nccl", why, sizeof why)) {
        printf("NCCL unavailable: %s\n", why);
        return TEST_SUMMARY();
    }
    /* count GPUs by trying ordinals (the count helper lives in the CUDA folder's header) */
    for (n_gpus = 1; n_gpus < 8; n_gpus++) {
        ms_backend *t = NULL;
        if (ms_backend_create("cuda", n_gpus, &t, &err) != MS_OK) break;
        ms_backend_destroy(t);
    }
    printf("%d GPU(s)\n", n_gpus);
    RUN(test_one_rank);
    if (n_gpus > 1) RUN(test_all_gpus);
    RUN(test_abort);
    RUN(test_init_timeout);
    return TEST_SUMMARY();
}
