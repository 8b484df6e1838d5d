/* test_core.c - core layer: dtype conversions against their definitions, the worker pool under
 * many back-to-back jobs (no lost, duplicated or cross-job items), the default thread count
 * following the CPU affinity mask and MS_THREADS, error formatting. */
#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"
#include "test.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static void test_e4m3_roundtrip(void) {
    ms_dtype_init();
    for (int b = 0; b < 256; b++) {
        float f = ms_e4m3_to_f32((uint8_t)b);
        if (f != f) continue;
        uint8_t back = ms_f32_to_e4m3(f);
        /* +0 and -0 are distinct codes; every finite code must round-trip */
        CHECK_MSG(back == b, "code %d -> %g -> %d", b, f, back);
    }
    CHECK_EQ_INT(ms_f32_to_e4m3(1000.0f), 0x7e);
    CHECK_EQ_INT(ms_f32_to_e4m3(-1000.0f), 0xfe);
    CHECK_CLOSE(ms_e4m3_to_f32(0x7e), 448.0, 0);
}

static void test_e2m1(void) {
    const float in[] = {0.0f, 0.24f, 0.25f, 0.26f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 7.0f, -0.75f, -6.5f};
    const int want[] = {0, 0, 0, 1, 2, 2, 4, 4, 6, 6, 7, 8 | 2, 8 | 7};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) CHECK_EQ_INT(ms_f32_to_e2m1(in[i]), want[i]);
    for (int c = 0; c < 16; c++) CHECK_EQ_INT(ms_f32_to_e2m1(ms_e2m1_to_f32((uint8_t)c)) & 7, c & 7);
}

static void test_bf16_f16(void) {
    CHECK_EQ_INT(ms_f32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ_INT(ms_f32_to_bf16(1.00390625f), 0x3f80);   /* tie -> even */
    CHECK_EQ_INT(ms_f32_to_bf16(1.01171875f), 0x3f82);   /* tie -> even (up) */
    for (int h = 0; h < 65536; h++) {
        float f = ms_f16_to_f32((uint16_t)h);
        if (f != f) continue;
        CHECK_MSG(ms_f32_to_f16(f) == h, "f16 %04x", h);
    }
}

typedef struct { _Atomic int *hits; int64_t n; } pool_ctx;
static void mark(void *vctx, int64_t b, int64_t e, int worker) {
    pool_ctx *c = vctx;
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void test_pool_many_jobs(void) {
    ms_pool *p = ms_pool_create(4);
    CHECK(p != NULL);
    _Atomic int *hits = calloc(5000, sizeof *hits);
    int bad = 0;
    for (int job = 0; job < 3000; job++) {
        int64_t n = 1 + (job * 7919) % 5000;
        for (int64_t i = 0; i < n; i++) atomic_store(&hits[i], 0);
        pool_ctx c = {hits, n};
        ms_pool_run(p, n, 1 + job % 5, mark, &c);
        for (int64_t i = 0; i < n; i++) bad += atomic_load(&hits[i]) != 1;
    }
    CHECK_EQ_INT(bad, 0);
    free(hits);
    ms_pool_destroy(p);
}

/* The counts follow the affinity mask: narrowed to one CPU, every count is 1 (the pool must not
 * start a worker per machine CPU when the process may use one); MS_THREADS overrides. */
static void test_cpu_count_affinity(void) {
    cpu_set_t old;
    CPU_ZERO(&old);
    CHECK(sched_getaffinity(0, sizeof old, &old) == 0);
    int allowed = ms_cpu_count_allowed(), cores = ms_cpu_count_cores();
    CHECK_EQ_INT(allowed, CPU_COUNT(&old));
    CHECK_MSG(cores >= 1 && cores <= allowed, "cores %d, allowed cpus %d", cores, allowed);
    int first = 0;
    while (first < CPU_SETSIZE && !CPU_ISSET(first, &old)) first++;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    CHECK(sched_setaffinity(0, sizeof one, &one) == 0);
    CHECK_EQ_INT(ms_cpu_count_allowed(), 1);
    CHECK_EQ_INT(ms_cpu_count_cores(), 1);
    const char *env = getenv("MS_THREADS");
    char *saved = env ? strdup(env) : NULL;
    unsetenv("MS_THREADS");
    CHECK_EQ_INT(ms_default_threads(), 1);
    ms_pool *p = ms_pool_create(0);
    CHECK(p != NULL);
    CHECK_EQ_INT(ms_pool_size(p), 1);
    ms_pool_destroy(p);
    setenv("MS_THREADS", "3", 1);
    CHECK_EQ_INT(ms_default_threads(), 3);
    setenv("MS_THREADS", "0", 1);
    CHECK_EQ_INT(ms_default_threads(), 1);
    if (saved) setenv("MS_THREADS", saved, 1);
    else unsetenv("MS_THREADS");
    free(saved);
    CHECK(sched_setaffinity(0, sizeof old, &old) == 0);
    CHECK_EQ_INT(ms_cpu_count_allowed(), allowed);
    CHECK_EQ_INT(ms_cpu_count_cores(), cores);
}

static void test_errf(void) {
    ms_err e = {0};
    int rc = ms_errf(&e, MS_ERR_FORMAT, "%s: field %s", "f.json", "x");
    CHECK_EQ_INT(rc, MS_ERR_FORMAT);
    CHECK_STR(e.msg, "f.json: field x");
    ms_err_prefix(&e, "loading %s", "m");
    CHECK_STR(e.msg, "loading m: f.json: field x");
    CHECK_STR(ms_code_name(MS_ERR_NUMERICS), "numerics");
}

int main(void) {
    RUN(test_e4m3_roundtrip);
    RUN(test_e2m1);
    RUN(test_bf16_f16);
    RUN(test_pool_many_jobs);
    RUN(test_cpu_count_affinity);
    RUN(test_errf);
    return TEST_SUMMARY();
}
