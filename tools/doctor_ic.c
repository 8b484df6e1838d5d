/* doctor_ic.c - `moeserve doctor --interconnect`: is the machine, not the kernels, the ceiling?
 * Measures host<->device copies (pinned, pageable), kernel launch cost, every GPU pair's peer path,
 * and NCCL all-reduce latency and bus bandwidth from 8 KB to 64 MB through the communicator the
 * forward uses (dist/comm.h), then projects the collective time of a decode step for a model
 * config and --tp from those measurements. Numbers far below what such hardware gives are flagged
 * in one sentence each (a virtualised PCIe path, a missing peer path, an all-reduce 10x too slow).
 *
 * The projection follows the forward: per layer one all-reduce of the attention output and one of
 * the MLP/MoE output (float32 [batch, hidden] each), one for the embedding, and the logits
 * all-gather (float32 [batch, vocab/tp] per rank), at the all-reduce time interpolated (log-log)
 * at each size. */
#include "backend/backend.h"
#include "core/fileutil.h"
#include "dist/comm.h"
#include "model/config.h"
#ifdef MS_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MS_HAVE_CUDA
#define IC_NSIZES 8
static const size_t ic_sizes[IC_NSIZES] = {8u << 10, 32u << 10, 128u << 10, 512u << 10, 2u << 20, 8u << 20, 32u << 20, 64u << 20};

/* Seconds of one all-reduce of `bytes` from the measured table (log-log interpolation, linear
 * extrapolation by bandwidth above the largest size, the smallest's latency below it). */
static double ic_ar_time(const double *t, size_t bytes) {
    if (bytes <= ic_sizes[0]) return t[0];
    for (int i = 1; i < IC_NSIZES; i++)
        if (bytes <= ic_sizes[i]) {
            double f = log((double)bytes / ic_sizes[i - 1]) / log((double)ic_sizes[i] / ic_sizes[i - 1]);
            return exp(log(t[i - 1]) + f * (log(t[i]) - log(t[i - 1])));
        }
    return t[IC_NSIZES - 1] * (double)bytes / ic_sizes[IC_NSIZES - 1];
}

typedef struct {
    ms_backend *b;
    ms_comm *c;
    const unsigned char *id;
    int rank, n, iters;
    size_t count;
    ms_tensor buf;
    double secs;
    int rc;
    ms_err err;
} ic_rank;

static void *ic_init(void *p) {
    ic_rank *r = p;
    r->rc = ms_comm_nccl_create(r->b, r->id, r->rank, r->n, 60, &r->c, &r->err);
    return NULL;
}

static void *ic_run(void *p) {
    ic_rank *r = p;
    ms_comm *c = r->c;
    r->rc = MS_OK;
    for (int i = 0; i < 3 && !r->rc; i++) r->rc = c->ops->all_reduce_sum(c, r->buf.data, r->count, MS_F32, &r->err);
    if (!r->rc) r->rc = r->b->ops->sync(r->b, &r->err);
    if (!r->rc) r->rc = c->ops->barrier(c, &r->err);
    if (!r->rc) r->rc = r->b->ops->sync(r->b, &r->err);
    double t0 = ms_now();
    for (int i = 0; i < r->iters && !r->rc; i++) r->rc = c->ops->all_reduce_sum(c, r->buf.data, r->count, MS_F32, &r->err);
    if (!r->rc) r->rc = r->b->ops->sync(r->b, &r->err);
    r->secs = (ms_now() - t0) / r->iters;
    return NULL;
}

/* Runs fn on every rank concurrently; 0 when all succeeded, else prints the first error. */
static int ic_all(ic_rank *R, int n, void *(*fn)(void *), const char *what) {
    pthread_t th[16];
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, fn, &R[i]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < n; i++)
        if (R[i].rc) {
            printf("  nccl %s: rank %d: %s\n", what, i, R[i].err.msg);
            return -1;
        }
    return 0;
}

/* NCCL all-reduce over GPUs first..first+n-1: fills t[IC_NSIZES] (seconds). 0 on success. */
static int ic_nccl(int first, int n, double *t) {
    unsigned char id[MS_COMM_NCCL_ID_BYTES];
    ms_err err = {0};
    char why[256];
    if (!ms_dist_available("nccl", why, sizeof why)) return printf("  nccl: not available: %s\n", why), -1;
    if (ms_comm_nccl_unique_id(id, &err)) return printf("  nccl: %s\n", err.msg), -1;
    ic_rank R[16];
    memset(R, 0, sizeof R);
    int ok = 0;
    for (int i = 0; i < n; i++) {
        R[i].id = id, R[i].rank = i, R[i].n = n;
        if (ms_backend_create("cuda", first + i, &R[i].b, &err)) {
            printf("  nccl: GPU %d: %s\n", first + i, err.msg);
            goto out;
        }
        int64_t shp[1] = {(int64_t)(ic_sizes[IC_NSIZES - 1] / 4)};
        if (ms_backend_alloc(R[i].b, &R[i].buf, MS_F32, 1, shp, &err)) {
            printf("  nccl: GPU %d: %s\n", first + i, err.msg);
            goto out;
        }
    }
    if (ic_all(R, n, ic_init, "init")) goto out;
    for (int s = 0; s < IC_NSIZES; s++) {
        for (int i = 0; i < n; i++) R[i].count = ic_sizes[s] / 4, R[i].iters = ic_sizes[s] >= (8u << 20) ? 20 : 100;
        if (ic_all(R, n, ic_run, "all-reduce")) goto out;
        double worst = 0;
        for (int i = 0; i < n; i++) worst = R[i].secs > worst ? R[i].secs : worst;
        t[s] = worst;
    }
    ok = 1;
out:
    for (int i = 0; i < n; i++) {
        if (R[i].c) ms_comm_destroy(R[i].c);
        if (R[i].buf.data) R[i].b->ops->free(R[i].b, &R[i].buf);
        ms_backend_destroy(R[i].b);
    }
    return ok ? 0 : -1;
}

/* One flag sentence when measured is below want (or above for latencies: lower_is_better). */
static int ic_flag(const char *what, double got, double expect, int lower_is_better, double factor, const char *hint) {
    int bad = lower_is_better ? got > expect * factor : got * factor < expect;
    if (bad)
        printf("  FLAG: %s is %.3g, %s than the ~%.3g this hardware should give (%.0fx off): %s.\n", what, got,
               lower_is_better ? "far slower" : "far lower", expect, lower_is_better ? got / expect : expect / got, hint);
    return bad;
}

#endif

/* Contract in cmd_doctor.c: prints the measurements; 0, or 1 when a measurement could not be made. */
int doctor_interconnect(int dev, const char *config, const char *const *overrides, int n_overrides, int tp) {
#ifndef MS_HAVE_CUDA
    (void)dev, (void)config, (void)overrides, (void)n_overrides, (void)tp;
    printf("\ninterconnect: not measured (build without CUDA)\n");
    return 0;
#else
    int ng = ms_cuda_device_count();
    printf("\ninterconnect (GPU %d; %d visible):\n", dev, ng);
    if (ng <= 0) return printf("  no GPU visible: nothing to measure\n"), 0;
    int flags = 0;
    ms_err err = {0};
    ms_cuda_link_stats L;
    if (ms_cuda_bench_host_links(dev, 64u << 20, &L, &err)) return printf("  host links: %s\n", err.msg), 1;
    printf("  %-26s %12s %12s\n", "host<->device (64 MB)", "GB/s", "4 B lat us");
    printf("  %-26s %12.1f %12.1f\n", "H2D pinned", L.h2d_pinned_gbs, L.h2d_pinned_lat_us);
    printf("  %-26s %12.1f %12.1f\n", "D2H pinned", L.d2h_pinned_gbs, L.d2h_pinned_lat_us);
    printf("  %-26s %12.1f %12.1f\n", "H2D pageable", L.h2d_pageable_gbs, L.h2d_pageable_lat_us);
    printf("  %-26s %12.1f %12.1f\n", "D2H pageable", L.d2h_pageable_gbs, L.d2h_pageable_lat_us);
    printf("  kernel launch: %.2f us enqueued back to back, %.1f us launch + wait\n", L.launch_us, L.launch_sync_us);
    const char *virt = "typical of a virtualised or oversubscribed PCIe path; every step's small copies pay it";
    flags += ic_flag("H2D pinned bandwidth (GB/s)", L.h2d_pinned_gbs, 25, 0, 2.5, "check the PCIe link width/generation (nvidia-smi -q | grep -A3 Link)");
    flags += ic_flag("D2H pinned bandwidth (GB/s)", L.d2h_pinned_gbs, 25, 0, 2.5, "check the PCIe link width/generation");
    flags += ic_flag("D2H 4-byte copy latency (us)", L.d2h_pinned_lat_us, 10, 1, 5, virt);
    flags += ic_flag("H2D 4-byte copy latency (us)", L.h2d_pinned_lat_us, 10, 1, 5, virt);
    flags += ic_flag("kernel launch + wait (us)", L.launch_sync_us, 8, 1, 5, virt);
    flags += ic_flag("kernel launch enqueue (us)", L.launch_us, 3, 1, 5, "CUDA graphs (on by default) hide it; a slow host CPU or a busy driver shows here");
    if (ng > 1) {
        printf("  %-12s %6s %5s %7s %10s %10s\n", "GPU pair", "peer", "rank", "atomics", "GB/s", "lat us");
        for (int i = 0; i < ng; i++)
            for (int j = 0; j < ng; j++) {
                if (i == j) continue;
                ms_cuda_peer_stats P;
                if (ms_cuda_bench_peer(i, j, 64u << 20, &P, &err)) {
                    printf("  %d -> %d: %s\n", i, j, err.msg);
                    continue;
                }
                printf("  %d -> %-7d %6s %5d %7s %10.1f %10.1f   %s\n", i, j, P.access ? "yes" : "no", P.perf_rank,
                       P.native_atomics ? "yes" : "no", P.gbs, P.lat_us,
                       P.gbs > 150 ? "NVLink-class" : P.access ? "PCIe-class peer path" : "through the host");
                char what[64];
                snprintf(what, sizeof what, "GPU %d -> %d copy bandwidth (GB/s)", i, j);
                if (!P.access) {
                    printf("  FLAG: GPUs %d and %d have no peer access: collectives between them go through host memory.\n", i, j);
                    flags++;
                } else {
                    flags += ic_flag(what, P.gbs, 40, 0, 2, "a peer path slower than PCIe Gen4 x16");
                }
            }
    }
    double t[IC_NSIZES];
    int n = ng < 16 ? ng : 16;
    printf("  nccl all-reduce (float32, %d GPU%s):\n", n, n > 1 ? "s" : "");
    int have = ic_nccl(0, n, t) == 0;
    if (have) {
        printf("  %10s %12s %12s %12s\n", "size", "time us", "algbw GB/s", "busbw GB/s");
        for (int s = 0; s < IC_NSIZES; s++) {
            double alg = ic_sizes[s] / t[s] / 1e9;
            printf("  %9zuK %12.1f %12.2f %12.2f\n", ic_sizes[s] >> 10, t[s] * 1e6, alg, n > 1 ? alg * 2.0 * (n - 1) / n : 0.0);
        }
        /* expected small all-reduce: ~6 us on one GPU (a copy kernel), ~15-25 us over NVLink */
        flags += ic_flag("8 KB all-reduce time (us)", t[0] * 1e6, n > 1 ? 20 : 8, 1, 10,
                         "a small all-reduce this slow dominates every decode step under --tp (check NCCL_P2P/NVLS settings, "
                         "peer access, and whether the GPUs sit behind a virtualised PCIe switch)");
    }
    if (config && have) {
        ms_config c;
        if (ms_config_load_with_overrides(config, overrides, n_overrides, &c, &err))
            return printf("  projection: %s\n", err.msg), 1;
        const int tpp = tp > 0 ? tp : n;
        printf("  projected collectives per decode step (%s, %d layers, hidden %d, --tp %d%s):\n", c.model_type,
               c.num_layers, c.hidden_size, tpp,
               tpp != n ? "; measured on a different GPU count, so only indicative" : "");
        printf("  %8s %12s %12s %14s\n", "batch", "all-reduces", "ms/step", "of which logits");
        const int batches[4] = {1, 8, 64, 256};
        for (int k = 0; k < 4; k++) {
            const int B = batches[k];
            double ar = (2.0 * c.num_layers + 1) * ic_ar_time(t, (size_t)B * c.hidden_size * 4);
            double lg = tpp > 1 ? ic_ar_time(t, (size_t)B * c.vocab_size * 4) : 0; /* all-gather ~ all-reduce of the whole */
            printf("  %8d %12d %12.3f %14.3f\n", B, 2 * c.num_layers + 1, (ar + lg) * 1e3, lg * 1e3);
        }
        if (tpp <= 1) printf("  (with --tp 1 the forward makes no collectives: these are what --tp %d would add)\n", n > 1 ? n : 2);
    }
    printf("  interconnect: %s\n", flags ? "see the FLAG lines above" : "no number far below expectation");
    return 0;
#endif
}
