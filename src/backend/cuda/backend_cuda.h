/* backend_cuda.h - the CUDA backend's C entry points, free of CUDA headers so host C (tools, the
 * registry, tests) can call them in any build that has MS_HAVE_CUDA. */
#ifndef MS_BACKEND_CUDA_BACKEND_CUDA_H
#define MS_BACKEND_CUDA_BACKEND_CUDA_H

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates the CUDA backend on GPU `device` (ordinal): one stream, a cuBLASLt handle and workspace.
 * Fails with MS_ERR_UNSUPPORTED (clear sentence) when no GPU/driver is present or the ordinal is out
 * of range. The caller owns *out (ms_backend_destroy). */
int ms_backend_cuda_create(int device, ms_backend **out, ms_err *err);

/* Number of visible GPUs (0 when the driver or devices are missing; never fails). */
int ms_cuda_device_count(void);
/* Fills info for GPU `device` without creating a backend. */
int ms_cuda_device_info(int device, ms_gpu_info *info, ms_err *err);
/* CUDA driver and runtime versions as 1000*major + 10*minor (0 when unknown). */
void ms_cuda_versions(int *driver, int *runtime);

/* Fills n random weight bytes on the device for dummy models: dst_d (device memory) gets values of
 * `dtype` (BF16/F32: uniform in [-amp, amp]; F8E4M3/U8: random codes that decode to finite values)
 * from a counter-based generator seeded by `seed` (same seed -> same bytes). */
int ms_cuda_fill_random(ms_backend *b, void *dst_d, ms_dtype dtype, size_t n_elems, float amp, uint64_t seed,
                        ms_err *err);

#ifdef __cplusplus
}
#endif

#endif
