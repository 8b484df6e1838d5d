/* interconnect.cu - measurements of the links around the GPU for `moeserve doctor --interconnect`:
 * host<->device copies (pinned and pageable; latency of a 4-byte copy as the forward's small
 * downloads see it, bandwidth of a large one), kernel launch cost, and GPU<->GPU peer copies. A
 * machine can be the throughput ceiling (PCIe latency under virtualisation, a missing peer path),
 * and these numbers show it before a model is blamed. Host-timed with a sync after each copy:
 * that is the cost the engine pays. */
#include "backend/cuda/cuda_internal.cuh"

#include <stdlib.h>
#include <time.h>

static double ic_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

__global__ void k_ic_empty(int *p) {
    cu_pdl_wait();
    cu_pdl_trigger();
    if (p && threadIdx.x == 1024) *p = 0; /* never true: keeps the kernel from being optimised away */
}

/* Seconds per copy of n bytes (dir 0: host->device, 1: device->host), mean of iters after a warm-up. */
static int ic_copy(void *h, void *d, size_t n, int dir, int iters, cudaStream_t st, double *s, ms_err *err) {
    for (int w = 0; w < 2; w++) {
        CK(cudaMemcpyAsync(dir ? h : d, dir ? d : h, n, dir ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, st));
        CK(cudaStreamSynchronize(st));
    }
    double t0 = ic_now();
    for (int i = 0; i < iters; i++) {
        CK(cudaMemcpyAsync(dir ? h : d, dir ? d : h, n, dir ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, st));
        CK(cudaStreamSynchronize(st));
    }
    *s = (ic_now() - t0) / iters;
    return MS_OK;
}

static int ic_host(size_t bytes, void *pin, void *page, void *dev, cudaStream_t st, ms_cuda_link_stats *o, ms_err *err) {
    double s;
    for (int dir = 0; dir < 2; dir++) {
        MS_TRY(ic_copy(pin, dev, 4, dir, 200, st, &s, err));
        (dir ? o->d2h_pinned_lat_us : o->h2d_pinned_lat_us) = s * 1e6;
        MS_TRY(ic_copy(page, dev, 4, dir, 200, st, &s, err));
        (dir ? o->d2h_pageable_lat_us : o->h2d_pageable_lat_us) = s * 1e6;
        MS_TRY(ic_copy(pin, dev, bytes, dir, 5, st, &s, err));
        (dir ? o->d2h_pinned_gbs : o->h2d_pinned_gbs) = bytes / s / 1e9;
        MS_TRY(ic_copy(page, dev, bytes, dir, 5, st, &s, err));
        (dir ? o->d2h_pageable_gbs : o->h2d_pageable_gbs) = bytes / s / 1e9;
    }
    /* launch: enqueue cost of back-to-back launches, and launch + wait as a step's last kernel sees it */
    CK(cu_launch(k_ic_empty, 1, 32, 0, st, (int *)NULL));
    CK(cudaStreamSynchronize(st));
    double t0 = ic_now();
    for (int i = 0; i < 2000; i++) CK(cu_launch(k_ic_empty, 1, 32, 0, st, (int *)NULL));
    o->launch_us = (ic_now() - t0) / 2000 * 1e6;
    CK(cudaStreamSynchronize(st));
    t0 = ic_now();
    for (int i = 0; i < 200; i++) {
        CK(cu_launch(k_ic_empty, 1, 32, 0, st, (int *)NULL));
        CK(cudaStreamSynchronize(st));
    }
    o->launch_sync_us = (ic_now() - t0) / 200 * 1e6;
    return MS_OK;
}

extern "C" int ms_cuda_bench_host_links(int device, size_t bytes, ms_cuda_link_stats *out, ms_err *err) {
    memset(out, 0, sizeof *out);
    CK(cudaSetDevice(device));
    void *pin = NULL, *dev = NULL, *page = malloc(bytes);
    cudaStream_t st = NULL;
    if (!page) return ms_errf(err, MS_ERR_NOMEM, "doctor --interconnect: out of host memory for %zu bytes", bytes);
    memset(page, 1, bytes); /* touch the pages: first-touch faults are not the link's cost */
    int rc = MS_OK;
    cudaError_t e = cudaMallocHost(&pin, bytes);
    if (e == cudaSuccess) e = cudaMalloc(&dev, bytes);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        rc = ms_errf(err, MS_ERR_RUNTIME, "doctor --interconnect: GPU %d: allocating %zu-byte buffers: %s", device, bytes,
                     cudaGetErrorString(e));
    if (!rc) rc = ic_host(bytes, pin, page, dev, st, out, err);
    if (st) cudaStreamDestroy(st);
    if (dev) cudaFree(dev);
    if (pin) cudaFreeHost(pin);
    free(page);
    return rc;
}

static int ic_peer(int src, int dst, size_t bytes, void *a, void *b, cudaStream_t st, ms_cuda_peer_stats *o, ms_err *err) {
    for (int w = 0; w < 2; w++) CK(cudaMemcpyPeerAsync(b, dst, a, src, bytes, st));
    CK(cudaStreamSynchronize(st));
    double t0 = ic_now();
    for (int i = 0; i < 100; i++) {
        CK(cudaMemcpyPeerAsync(b, dst, a, src, 4, st));
        CK(cudaStreamSynchronize(st));
    }
    o->lat_us = (ic_now() - t0) / 100 * 1e6;
    t0 = ic_now();
    for (int i = 0; i < 5; i++) CK(cudaMemcpyPeerAsync(b, dst, a, src, bytes, st));
    CK(cudaStreamSynchronize(st));
    o->gbs = 5.0 * bytes / (ic_now() - t0) / 1e9;
    return MS_OK;
}

extern "C" int ms_cuda_bench_peer(int src, int dst, size_t bytes, ms_cuda_peer_stats *out, ms_err *err) {
    memset(out, 0, sizeof *out);
    int acc = 0, rank = 0, atom = 0;
    CK(cudaDeviceCanAccessPeer(&acc, src, dst));
    if (acc) {
        CK(cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, src, dst));
        CK(cudaDeviceGetP2PAttribute(&atom, cudaDevP2PAttrNativeAtomicSupported, src, dst));
    }
    out->access = acc, out->perf_rank = rank, out->native_atomics = atom;
    void *a = NULL, *b = NULL;
    cudaStream_t st = NULL;
    CK(cudaSetDevice(src));
    if (acc) {
        cudaError_t pe = cudaDeviceEnablePeerAccess(dst, 0);
        if (pe != cudaSuccess && pe != cudaErrorPeerAccessAlreadyEnabled) CK(pe);
        (void)cudaGetLastError();
    }
    cudaError_t e = cudaMalloc(&a, bytes);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaSetDevice(dst);
    if (e == cudaSuccess) e = cudaMalloc(&b, bytes);
    int rc = e == cudaSuccess ? MS_OK
                              : ms_errf(err, MS_ERR_RUNTIME, "doctor --interconnect: GPUs %d->%d: allocating buffers: %s", src,
                                        dst, cudaGetErrorString(e));
    if (!rc) rc = ic_peer(src, dst, bytes, a, b, st, out, err);
    if (b) cudaFree(b);
    cudaSetDevice(src);
    if (st) cudaStreamDestroy(st);
    if (a) cudaFree(a);
    return rc;
}
