/* backend_cuda.h - the CUDA backend's C entry points, free of CUDA headers so host C (tools, the
 * registry, tests) can call them in any build that has MS_HAVE_CUDA. */
#ifndef MS_BACKEND_CUDA_BACKEND_CUDA_H
#define MS_BACKEND_CUDA_BACKEND_CUDA_H

#include "backend/backend.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Creates the CUDA backend on GPU `device` (ordinal): one stream, a cuBLASLt handle and workspace.
 * Fails with MS_ERR_UNSUPPORTED (clear sentence) when no GPU/driver is present or the ordinal is out
 * of range. The caller owns *out (ms_backend_destroy). */
int ms_backend_cuda_create(int device, ms_backend **out, ms_err *err);

/* The backend's stream (a cudaStream_t, as void * so this header stays free of CUDA headers): code
 * outside backend/ that enqueues its own work in order with the backend's ops (NCCL collectives). */
void *ms_cuda_stream(ms_backend *b);

/* Number of visible GPUs (0 when the driver or devices are missing; never fails). */
int ms_cuda_device_count(void);
/* Fills info for GPU `device` without creating a backend. */
int ms_cuda_device_info(int device, ms_gpu_info *info, ms_err *err);
/* Host<->device link figures of one GPU (doctor --interconnect): 4-byte copy latency (copy + wait,
 * microseconds) and `bytes`-sized copy bandwidth (GB/s), pinned and pageable, each way; kernel
 * launch cost back to back (enqueue only) and launch + wait. */
typedef struct ms_cuda_link_stats {
    double h2d_pinned_lat_us, d2h_pinned_lat_us, h2d_pageable_lat_us, d2h_pageable_lat_us;
    double h2d_pinned_gbs, d2h_pinned_gbs, h2d_pageable_gbs, d2h_pageable_gbs;
    double launch_us, launch_sync_us;
} ms_cuda_link_stats;
int ms_cuda_bench_host_links(int device, size_t bytes, ms_cuda_link_stats *out, ms_err *err);
/* GPU src -> dst: peer access (1/0), the driver's performance rank and native atomics of the pair,
 * 4-byte copy latency (us) and `bytes`-sized copy bandwidth (GB/s; staged through the host when
 * there is no peer access). */
typedef struct ms_cuda_peer_stats {
    int access, perf_rank, native_atomics;
    double lat_us, gbs;
} ms_cuda_peer_stats;
int ms_cuda_bench_peer(int src, int dst, size_t bytes, ms_cuda_peer_stats *out, ms_err *err);

/* CUDA driver and runtime versions as 1000*major + 10*minor (0 when unknown). */
void ms_cuda_versions(int *driver, int *runtime);

/* Fills n random weight bytes on the device for dummy models: dst_d (device memory) gets values of
 * `dtype` (BF16/F32: uniform in [-amp, amp]; F8E4M3/U8: random codes that decode to finite values)
 * from a counter-based generator seeded by `seed` (same seed -> same bytes). */
int ms_cuda_fill_random(ms_backend *b, void *dst_d, ms_dtype dtype, size_t n_elems, float amp, uint64_t seed,
                        ms_err *err);

/* --load-format dummy on the GPU without a host copy: allocates t->data in device memory for t's
 * dtype (F32 or BF16) and shape and fills it with offset + amp * U(-1,1), seeded (same seed, same
 * values). The memory is released by the backend's unplace_tensor. */
int ms_cuda_dummy_tensor(ms_backend *b, ms_tensor *t, float offset, float amp, uint64_t seed, ms_err *err);
/* Makes W (name, fmt, n_out, n_in set; w/scale unset) a placed weight of random values generated in
 * device memory in its own format, scaled like model/dummy.c (dequantized variance ~ 1/n_in):
 * PLAIN -> BF16, FP8 -> e4m3 codes + F32 128x128 block scales, NVFP4 -> E2M1 nibbles + e4m3 group
 * scales + scale2. with_bias adds an F32 bias of U(-0.1, 0.1). Sets W->prepared exactly as
 * place_linear would, so the weight is used and released (unplace_linear) like any placed one. */
int ms_cuda_dummy_linear(ms_backend *b, ms_linear *W, int with_bias, uint64_t seed, ms_err *err);

/* Prints the CUDA backend's environment knobs (knobs.h) to out, one line each: name, value in effect,
 * default, when it is read (once per process or at each call) and its meaning, under a header line.
 * Needs no GPU; reading a read-once knob here fixes its value for the process, as its first use would. */
void ms_cuda_knobs_print(FILE *out);

/* Launches of the wgmma grouped GEMM (gemm_mma.cu k_gw) so far in this process, all backends: lets a
 * test assert which prefill kernel ran (a silent fall-back to mma.sync would still pass on results). */
long long ms_cuda_gw_launches(void);
/* Launches of the one-token NVFP4 product on FP8 wgmma (gemv_w8.cu k_gw8) so far in this process, all
 * backends: lets a test assert that batch-1 NVFP4 decode takes it on sm_90a, and that the knob's
 * mma.sync forms do not. */
long long ms_cuda_w8_launches(void);
/* Launches of the streaming bf16 GEMV (gemv_bf16.cu k_gvb) so far in this process, all backends: tests
 * use it to tell which form a linear took. Thread-safe. */
long long ms_cuda_gvb_launches(void);
/* Of ms_cuda_gvb_launches, those with the tensor-core step (k_gvb's TC form, MS_CU_BF16_STREAM_MMA) so far
 * in this process, all backends. Thread-safe. */
long long ms_cuda_gvb_tc_launches(void);
/* Launches of the split-K attention merge (k_attn_combine) so far in this process, all backends: early 1
 * counts those that trigger the next kernel before their wait (MS_CU_ATTN_MERGE_EARLY), 0 the others.
 * Thread-safe. */
long long ms_cuda_attn_merge_launches(int early);
/* Of ms_cuda_gvb_launches, those whose warps asked the L2 for more weight steps before their PDL wait
 * (MS_CU_BF16_STREAM_L2PF) so far in this process, all backends. Thread-safe. */
long long ms_cuda_gvb_l2pf_launches(void);
/* Of ms_cuda_gvb_launches, those through rings of 12 stages (MS_CU_BF16_STREAM_DEEPK) so far in this
 * process, all backends. Thread-safe. */
long long ms_cuda_gvb_deep_launches(void);
/* Of the streaming bf16 GEMV's calls, the launches of its claiming form (gemv_bf16.cu k_gvd,
 * MS_CU_BF16_STREAM_DYN) so far in this process, all backends; not counted in ms_cuda_gvb_launches.
 * Thread-safe. */
long long ms_cuda_gvd_launches(void);
/* Launches of the fused one-token MoE kernel (moe_fused.cu k_moe_fused) so far in this process, all
 * backends: tests use it to tell which form a decode MoE call took. Thread-safe. */
long long ms_cuda_moe_fused_launches(void);
/* Of those, the launches of its routed form (the norm and the router in the kernel, cu_moe_route). */
long long ms_cuda_moe_fused_routed_launches(void);
/* Launches of the GQA tensor-core attention kernel that does gqa_prep's work itself (attn_mma.cu, PREP)
 * so far in this process, all backends: tests tell by it whether a decode step took the fused form. */
long long ms_cuda_attn_prep_launches(void);
/* Of those, the launches that read before their PDL wait (which = 0: pp.early, MS_CU_ATTN_PREP=2 with
 * the weights quiet) and those whose keys were split across blocks (which = 1: a merge follows); 0 for
 * another which. Thread-safe. */
long long ms_cuda_attn_prep_form_launches(int which);
/* Launch form f of that kernel (f >= 0, MS_CU_MOE_FUSED=2+f forces it): 1 with groups of 8 warps a
 * block and ring depth set, 0 when the kernel has no form f. */
int ms_cuda_moe_fused_form(int f, int *groups, int *depth);
/* Launches of that kernel in form f so far in this process (0 for an f it does not have). Thread-safe. */
long long ms_cuda_moe_fused_form_launches(int f);

#ifdef __cplusplus
}
#endif

#endif
