/* cpu_kernels.h - the CPU backend's single-thread building blocks, shared with the CPU MoE runner
 * (moe/runner_cpu.c) so expert GEMMs use exactly the same dequantizing kernels as `linear`.
 *
 * Every function here runs on the calling thread only; parallelism is the caller's business (it
 * splits rows/tokens over the pool and passes each worker its own scratch). Weights are read in
 * their stored format (core/tensor.h): plain F32/F16/BF16, FP8 block-scaled, NVFP4. */
#ifndef MS_BACKEND_CPU_KERNELS_H
#define MS_BACKEND_CPU_KERNELS_H

#include "core/threads.h"
#include "core/tensor.h"

#include <stddef.h>
#include <stdint.h>

/* Which code path the CPU kernels are built with, chosen at build time from the compiler's target
 * macros (no run-time dispatch): MS_CPU_AVX2 (x86-64-v3: AVX2 + FMA + F16C), MS_CPU_NEON (aarch64),
 * or neither: plain C, written as 8-lane loops that keep the SIMD paths' summation order. Building
 * with MS_CPU_PORTABLE (make PORTABLE=1) forces plain C on any target so CI tests it. x86 or Arm
 * intrinsics appear only under these macros. */
#if !defined(MS_CPU_PORTABLE) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define MS_CPU_AVX2 1
#include <immintrin.h>
#elif !defined(MS_CPU_PORTABLE) && defined(__ARM_NEON) && defined(__aarch64__)
#define MS_CPU_NEON 1
#include <arm_neon.h>
#endif

/* Token counts up to this use the fused dequant+dot kernel; above it rows are dequantized to an f32
 * tile and multiplied with OpenBLAS sgemm. */
#define MS_CPU_FUSED_MAX_T 16

/* Name of the code path this build's kernels use: "avx2", "neon" or "portable". */
const char *ms_cpu_simd_name(void);

/* Floats of per-thread scratch ms_cpu_linear_rows needs for a block of nr rows of W and T tokens
 * (0 when the fused path or a plain-F32 weight needs none). */
size_t ms_cpu_linear_scratch_floats(const ms_linear *W, int64_t nr, int T);

/* y[t*ldy + (n-n0)] = sum_k x[t*ldx + k] * W[n,k] (+ bias[n]) for rows n in [n0,n1) and t < T.
 * x, y: float32 host arrays; scratch: ms_cpu_linear_scratch_floats(W, n1-n0, T) floats (may be
 * NULL when that is 0). Uses the fused kernel for T <= MS_CPU_FUSED_MAX_T, sgemm otherwise. */
void ms_cpu_linear_rows(const ms_linear *W, int64_t n0, int64_t n1, const float *x, int64_t ldx, int T, float *y,
                        int64_t ldy, float *scratch);

/* Dequantizes columns [k0, k0+len) of row n of W into out (float32). k0 must be a multiple of 16,
 * and for NVFP4 len too. */
void ms_cpu_dequant(const ms_linear *W, int64_t n, int64_t k0, int64_t len, float *out);

/* The plain C path of ms_cpu_dequant, compiled in every build so tests can check that the SIMD
 * path gives the same floats, bit for bit. Same contract as ms_cpu_dequant. */
void ms_cpu_dequant_portable(const ms_linear *W, int64_t n, int64_t k0, int64_t len, float *out);

/* Dot product of a and b over n floats in plain C: 16 partial sums (two 8-lane accumulators, as
 * the SIMD paths), added in the AVX2 path's order. Compiled in every build (tests compare). */
static inline float ms_cpu_dot_portable(const float *a, const float *b, int64_t n) {
    float s0[8] = {0}, s1[8] = {0};
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
        for (int l = 0; l < 8; l++) {
            s0[l] += a[k + l] * b[k + l];
            s1[l] += a[k + 8 + l] * b[k + 8 + l];
        }
    for (; k + 8 <= n; k += 8)
        for (int l = 0; l < 8; l++) s0[l] += a[k + l] * b[k + l];
    float v[8];
    for (int l = 0; l < 8; l++) v[l] = s0[l] + s1[l];
    float q[4] = {v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]};
    float s = (q[0] + q[2]) + (q[1] + q[3]);
    for (; k < n; k++) s += a[k] * b[k];
    return s;
}

/* Dot product and out += a*x over n floats (AVX2, NEON or plain C). */
/* Inline because attention calls them per (key, head) on short rows (head dims 32..576), where a
 * call and its horizontal sum cost as much as the arithmetic (perf showed them at half of a serving
 * run's CPU time when they were out of line). */
static inline float ms_cpu_dot(const float *a, const float *b, int64_t n) {
#if defined(MS_CPU_AVX2)
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), s1);
    }
    for (; k + 8 <= n; k += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), s0);
    __m256 v = _mm256_add_ps(s0, s1);
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    float s = _mm_cvtss_f32(lo);
    for (; k < n; k++) s += a[k] * b[k];
    return s;
#elif defined(MS_CPU_NEON)
    float32x4_t s0 = vdupq_n_f32(0), s1 = s0, s2 = s0, s3 = s0;
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + k), vld1q_f32(b + k));
        s1 = vfmaq_f32(s1, vld1q_f32(a + k + 4), vld1q_f32(b + k + 4));
        s2 = vfmaq_f32(s2, vld1q_f32(a + k + 8), vld1q_f32(b + k + 8));
        s3 = vfmaq_f32(s3, vld1q_f32(a + k + 12), vld1q_f32(b + k + 12));
    }
    for (; k + 8 <= n; k += 8) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + k), vld1q_f32(b + k));
        s1 = vfmaq_f32(s1, vld1q_f32(a + k + 4), vld1q_f32(b + k + 4));
    }
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s2), vaddq_f32(s1, s3)));
    for (; k < n; k++) s += a[k] * b[k];
    return s;
#else
    return ms_cpu_dot_portable(a, b, n);
#endif
}

/* out[0..n) += a * x[0..n) */
static inline void ms_cpu_axpy(float a, const float *x, float *out, int64_t n) {
    int64_t k = 0;
#if defined(MS_CPU_AVX2)
    __m256 va = _mm256_set1_ps(a);
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(out + k, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + k), _mm256_loadu_ps(out + k)));
#elif defined(MS_CPU_NEON)
    for (; k + 4 <= n; k += 4) vst1q_f32(out + k, vfmaq_n_f32(vld1q_f32(out + k), vld1q_f32(x + k), a));
#endif
    for (; k < n; k++) out[k] += a * x[k];
}

/* The pool every CPU op and the CPU MoE runner use (process default pool). */
ms_pool *ms_cpu_pool(void);

/* Grain (items per chunk) so that one chunk holds at least ~min_work units of work when each item
 * costs work_per_item; makes tiny ops run inline on the caller instead of waking the pool. */
int64_t ms_cpu_grain(double work_per_item);

#endif
