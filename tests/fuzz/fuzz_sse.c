/* fuzz_sse.c - libFuzzer target: the bench client's SSE parser fed arbitrary bytes in arbitrary
 * pieces. Checks that pieces do not change the events (count and bytes) and that events respect
 * max_event. */
#include "bench/sse.h"
#include "fuzz_util.h"

typedef struct acc {
    size_t n, bytes;
    uint64_t hash;
} acc;

static int on_event(void *ud, const char *d, size_t len) {
    acc *a = ud;
    if (len > 4096 || d[len] != 0) abort();
    a->n++;
    a->bytes += len;
    for (size_t i = 0; i < len; i++) a->hash = (a->hash ^ (uint8_t)d[i]) * 1099511628211ull;
    a->hash ^= 0xff;
    return MS_OK;
}

static int run(const uint8_t *data, size_t n, uint32_t seed, int whole, acc *a) {
    ms_bench_sse s;
    ms_bench_sse_init(&s, 4096);
    ms_err err = {0};
    int rc = MS_OK;
    for (size_t off = 0; off < n && rc == MS_OK;) {
        size_t k = whole ? n : fz_chunk(&seed);
        if (k > n - off) k = n - off;
        rc = ms_bench_sse_feed(&s, (const char *)data + off, k, on_event, a, &err);
        off += k;
    }
    if (rc == MS_OK) rc = ms_bench_sse_finish(&s, on_event, a, &err);
    ms_bench_sse_free(&s);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    acc a = {0, 0, 1469598103934665603ull}, b = {0, 0, 1469598103934665603ull};
    int ra = run(data + 1, n - 1, data[0], 1, &a);
    int rb = run(data + 1, n - 1, data[0], 0, &b);
    if (ra == MS_OK && rb == MS_OK && (a.n != b.n || a.bytes != b.bytes || a.hash != b.hash)) abort();
    return 0;
}
