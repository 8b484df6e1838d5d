/* dist_test_util.h - shared by the communicator tests: deterministic per-rank data, the serial
 * rank-order reference, free TCP ports, and one "every op, every dtype, several sizes" routine that
 * a rank runs and checks on its own (so the same code checks threads and forked processes). */
#ifndef MS_TESTS_DIST_UTIL_H
#define MS_TESTS_DIST_UTIL_H

#include "core/dtype.h"
#include "dist/comm.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static inline double tu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void tu_sleep(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* A TCP port on 127.0.0.1 that was free a moment ago, with port+1 free too (the control channel). */
static inline int tu_free_port(void) {
    for (int tries = 0; tries < 50; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {0};
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t sl = sizeof sa;
        if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
            if (fd >= 0) close(fd);
            continue;
        }
        int port = ntohs(sa.sin_port);
        close(fd);
        if (port >= 65535) continue;
        int fd2 = socket(AF_INET, SOCK_STREAM, 0);
        sa.sin_port = htons((uint16_t)(port + 1));
        int ok = fd2 >= 0 && bind(fd2, (struct sockaddr *)&sa, sizeof sa) == 0;
        if (fd2 >= 0) close(fd2);
        if (ok) return port;
    }
    return 0;
}

/* Value i of rank r's buffer for a salt: mixed magnitudes so the order of a float sum matters. */
static inline float tu_val(int r, size_t i, uint32_t salt) {
    uint64_t x = ((uint64_t)(uint32_t)r << 40) ^ ((uint64_t)i * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)salt << 20);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    float u = (float)(x & 0xffffff) / 16777216.0f * 2.f - 1.f;
    int ex = (int)((x >> 32) % 24) - 12;
    return ldexpf(u, ex);
}

static inline void tu_fill(void *buf, ms_dtype dt, int r, size_t off, size_t n, uint32_t salt) {
    for (size_t i = 0; i < n; i++) {
        float v = tu_val(r, off + i, salt);
        if (dt == MS_F32) ((float *)buf)[i] = v;
        else ((uint16_t *)buf)[i] = ms_f32_to_bf16(v);
    }
}

/* ref[i] = sum over ranks (rank order, float32, rounded once) of element off+i. */
static inline void tu_ref_sum(void *ref, ms_dtype dt, int n_ranks, size_t off, size_t n, uint32_t salt) {
    for (size_t i = 0; i < n; i++) {
        float acc = 0;
        for (int r = 0; r < n_ranks; r++) {
            float v = tu_val(r, off + i, salt);
            if (dt == MS_BF16) v = ms_bf16_to_f32(ms_f32_to_bf16(v));
            acc = r == 0 ? v : acc + v;
        }
        if (dt == MS_F32) ((float *)ref)[i] = acc;
        else ((uint16_t *)ref)[i] = ms_f32_to_bf16(acc);
    }
}

#define TU_FAIL(...)                                                                              \
    do {                                                                                          \
        fprintf(stderr, "  rank %d: ", c->rank);                                                  \
        fprintf(stderr, __VA_ARGS__);                                                             \
        fputc('\n', stderr);                                                                      \
        fails++;                                                                                  \
    } while (0)

/* Runs every op for both dtypes and each count in counts[0..nc), checking the results against the
 * serial reference bit for bit. Returns the number of failed checks (0 = pass). */
static inline int tu_rank_suite(ms_comm *c, const size_t *counts, int nc, uint32_t salt) {
    int fails = 0, n = c->size, me = c->rank;
    ms_dtype dts[2] = {MS_F32, MS_BF16};
    for (int d = 0; d < 2; d++) {
        ms_dtype dt = dts[d];
        size_t es = ms_dtype_size(dt);
        for (int k = 0; k < nc; k++) {
            size_t cnt = counts[k];
            uint32_t s = salt + (uint32_t)(k * 16 + d * 8);
            ms_err err = {0};
            unsigned char *buf = malloc(cnt * es * (size_t)n + 16), *ref = malloc(cnt * es * (size_t)n + 16);
            unsigned char *recv = malloc(cnt * es * (size_t)n + 16);
            /* all_reduce */
            tu_fill(buf, dt, me, 0, cnt, s);
            tu_ref_sum(ref, dt, n, 0, cnt, s);
            if (c->ops->all_reduce_sum(c, buf, cnt, dt, &err) != MS_OK) TU_FAIL("all_reduce: %s", err.msg);
            else if (memcmp(buf, ref, cnt * es)) TU_FAIL("all_reduce %s count %zu: wrong bits", ms_dtype_name(dt), cnt);
            /* all_gather (separate buffers) */
            tu_fill(buf, dt, me, 0, cnt, s + 1);
            for (int r = 0; r < n; r++) tu_fill(ref + (size_t)r * cnt * es, dt, r, 0, cnt, s + 1);
            memset(recv, 0xab, cnt * es * (size_t)n);
            if (c->ops->all_gather(c, buf, recv, cnt, dt, &err) != MS_OK) TU_FAIL("all_gather: %s", err.msg);
            else if (memcmp(recv, ref, cnt * es * (size_t)n)) TU_FAIL("all_gather %s count %zu: wrong", ms_dtype_name(dt), cnt);
            /* all_gather in place */
            memset(recv, 0xcd, cnt * es * (size_t)n);
            tu_fill(recv + (size_t)me * cnt * es, dt, me, 0, cnt, s + 1);
            if (c->ops->all_gather(c, recv + (size_t)me * cnt * es, recv, cnt, dt, &err) != MS_OK)
                TU_FAIL("all_gather in place: %s", err.msg);
            else if (memcmp(recv, ref, cnt * es * (size_t)n))
                TU_FAIL("all_gather in place %s count %zu: wrong", ms_dtype_name(dt), cnt);
            /* reduce_scatter: send is [n*cnt] */
            tu_fill(buf, dt, me, 0, cnt * (size_t)n, s + 2);
            tu_ref_sum(ref, dt, n, (size_t)me * cnt, cnt, s + 2);
            memset(recv, 0xef, cnt * es);
            if (c->ops->reduce_scatter_sum(c, buf, recv, cnt, dt, &err) != MS_OK) TU_FAIL("reduce_scatter: %s", err.msg);
            else if (memcmp(recv, ref, cnt * es)) TU_FAIL("reduce_scatter %s count %zu: wrong", ms_dtype_name(dt), cnt);
            /* broadcast from the last rank (root != 0 whenever n > 1) and from rank 0 */
            for (int root = n - 1; root >= 0; root -= (n - 1 > 0 ? n - 1 : 1)) {
                tu_fill(ref, dt, root, 0, cnt, s + 3);
                if (me == root) memcpy(buf, ref, cnt * es);
                else memset(buf, 0x11, cnt * es);
                if (c->ops->broadcast(c, buf, cnt * es, root, &err) != MS_OK) TU_FAIL("broadcast: %s", err.msg);
                else if (memcmp(buf, ref, cnt * es)) TU_FAIL("broadcast root %d count %zu: wrong", root, cnt);
                if (root == 0) break;
            }
            if (c->ops->barrier(c, &err) != MS_OK) TU_FAIL("barrier: %s", err.msg);
            free(buf);
            free(ref);
            free(recv);
        }
    }
    return fails;
}

#endif
