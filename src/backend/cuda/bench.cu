/* bench.cu - the two ceilings `moeserve bench-model` compares the forward against on a GPU: the
 * device-to-device copy bandwidth (what a memory-bound decode step can at best stream) and the dense
 * bf16 GEMM rate through cuBLASLt (what a compute-bound prefill can at best reach). Both are measured
 * on the machine at hand rather than taken from a datasheet, so "percent of ceiling" means percent
 * of what this GPU demonstrably does (reference/perf-anchors.md section 9 has the H200's numbers). */
#include "backend/cuda/cuda_internal.cuh"

#include <stdio.h>
#include <string.h>

/* Times `reps` launches of fn between CUDA events on the backend stream; returns the best single
 * repetition in seconds through *best_s. */
template <typename F>
static int time_best(ms_backend *b, int reps, F fn, double *best_s, ms_err *err) {
    cudaStream_t s = cu_of(b)->stream;
    cudaEvent_t e0 = NULL, e1 = NULL;
    CK(cudaEventCreate(&e0));
    if (cudaEventCreate(&e1) != cudaSuccess) {
        cudaEventDestroy(e0);
        return ms_errf(err, MS_ERR_RUNTIME, "bench: cudaEventCreate failed");
    }
    double best = 1e30;
    int rc = MS_OK;
    for (int r = 0; r < reps && rc == MS_OK; r++) {
        cudaEventRecord(e0, s);
        rc = fn();
        if (rc) break;
        cudaEventRecord(e1, s);
        cudaError_t e = cudaEventSynchronize(e1);
        if (e != cudaSuccess) {
            rc = ms_errf(err, MS_ERR_RUNTIME, "bench: cudaEventSynchronize failed: %s", cudaGetErrorString(e));
            break;
        }
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (ms > 0 && ms * 1e-3 < best) best = ms * 1e-3;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    *best_s = best;
    return rc;
}

/* Device-to-device copy of two buffers of `bytes` each (as large as memory allows, at most 2 GiB,
 * so the copy streams far past the 60 MB L2). Result counts read + written bytes. */
static int copy_ceiling(ms_backend *b, double *gbs, size_t *bytes_used, ms_err *err) {
    size_t fr = 0, tot = 0;
    CK(cudaMemGetInfo(&fr, &tot));
    size_t bytes = (size_t)2 << 30;
    while (bytes > ((size_t)64 << 20) && 2 * bytes + ((size_t)256 << 20) > fr) bytes /= 2;
    void *src = NULL, *dst = NULL;
    CK(cudaMalloc(&src, bytes));
    if (cudaMalloc(&dst, bytes) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(src);
        return ms_errf(err, MS_ERR_NOMEM, "bench: no device memory for a %zu MiB copy buffer", bytes >> 20);
    }
    cudaStream_t s = cu_of(b)->stream;
    int rc = MS_OK;
    if (cudaMemsetAsync(src, 1, bytes, s) != cudaSuccess || cudaMemsetAsync(dst, 0, bytes, s) != cudaSuccess)
        rc = ms_errf(err, MS_ERR_RUNTIME, "bench: cudaMemsetAsync failed");
    double best = 0;
    if (!rc)
        rc = time_best(b, 6, [&]() -> int {
            CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
            return MS_OK;
        }, &best, err);
    cudaStreamSynchronize(s);
    cudaFree(src);
    cudaFree(dst);
    if (rc) return rc;
    *gbs = 2.0 * (double)bytes / best / 1e9;
    *bytes_used = bytes;
    return MS_OK;
}

/* cuBLASLt bf16 x bf16 -> bf16 with fp32 accumulation, n x n x n (8192 when memory allows). */
static int gemm_ceiling(ms_backend *b, double *tflops, int *n_used, ms_err *err) {
    size_t fr = 0, tot = 0;
    CK(cudaMemGetInfo(&fr, &tot));
    int n = 8192;
    while (n > 1024 && 3 * (size_t)n * n * sizeof(bf16) + ((size_t)256 << 20) > fr) n /= 2;
    size_t nb = (size_t)n * n * sizeof(bf16);
    void *A = NULL, *B = NULL, *C = NULL;
    CK(cudaMalloc(&A, nb));
    int rc = MS_OK;
    if (cudaMalloc(&B, nb) != cudaSuccess || cudaMalloc(&C, nb) != cudaSuccess) {
        cudaGetLastError();
        rc = ms_errf(err, MS_ERR_NOMEM, "bench: no device memory for %d x %d bf16 GEMM operands", n, n);
    }
    if (!rc) rc = ms_cuda_fill_random(b, A, MS_BF16, (size_t)n * n, 1.0f, 11, err);
    if (!rc) rc = ms_cuda_fill_random(b, B, MS_BF16, (size_t)n * n, 1.0f, 12, err);
    double best = 0;
    auto run = [&]() -> int { return cu_gemm(b, n, n, n, A, n, MS_BF16, B, n, 1, C, n, MS_BF16, 0.f, err); };
    if (!rc) rc = time_best(b, 2, run, &best, err); /* warm-up: algorithm choice, clocks */
    if (!rc) rc = time_best(b, 8, run, &best, err);
    cudaStreamSynchronize(cu_of(b)->stream);
    cudaFree(A);
    if (B) cudaFree(B);
    if (C) cudaFree(C);
    if (rc) return rc;
    *tflops = 2.0 * (double)n * n * n / best / 1e12;
    *n_used = n;
    return MS_OK;
}

/* Measured ceilings of the GPU behind b: copy_gbs = device-to-device cudaMemcpyAsync bandwidth in
 * GB/s (1e9), counting the bytes read plus the bytes written (perf-anchors section 9 convention;
 * a read-only stream's ceiling is about the same number); bf16_tflops = best cuBLASLt bf16 GEMM
 * (fp32 accumulate) rate in TFLOP/s. Allocates and frees its buffers (needs ~4.3 GiB free for the
 * full sizes; smaller sizes are used when less is free). */
extern "C" int ms_bench_gpu_ceilings(ms_backend *b, double *copy_gbs, double *bf16_tflops, ms_err *err) {
    *copy_gbs = 0;
    *bf16_tflops = 0;
    if (!b || strcmp(b->name, "cuda") != 0)
        return ms_errf(err, MS_ERR_INVALID, "bench: GPU ceilings need the cuda backend (got %s)", b ? b->name : "none");
    CK(cudaSetDevice(b->device));
    size_t cb = 0;
    int gn = 0;
    MS_TRY(copy_ceiling(b, copy_gbs, &cb, err));
    MS_TRY(gemm_ceiling(b, bf16_tflops, &gn, err));
    (void)cb;
    (void)gn;
    return MS_OK;
}
