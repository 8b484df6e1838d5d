/* cpu_linear.c - dequantizing GEMM kernels of the CPU backend.
 *
 * Decode (few tokens) is memory-bound: each weight row is read once, dequantized in L1-sized chunks
 * (AVX2: bf16 by shift, f16 by F16C, fp8 through the e4m3 table, nvfp4 through an 8-entry
 * magnitude permute plus sign bit; NEON: bf16 by shift, f16 by vcvt; plain C otherwise, see
 * cpu_kernels.h) and dotted with every token at once, so the weight stream is
 * the only memory traffic. Prefill (many tokens) is compute-bound: a block of rows is dequantized
 * into an f32 tile and handed to OpenBLAS sgemm (single-threaded; we parallelise over tiles).
 * Nothing is ever expanded to float32 beyond one tile per thread. */
#include "backend/cpu/cpu_kernels.h"

#include "core/dtype.h"
#include "core/status.h"

#include <cblas.h>
#include <string.h>

#define CHUNK 256 /* columns dequantized at a time in the fused kernel (multiple of 128) */

ms_pool *ms_cpu_pool(void) { return ms_pool_default(); }

const char *ms_cpu_simd_name(void) {
#if defined(MS_CPU_AVX2)
    return "avx2";
#elif defined(MS_CPU_NEON)
    return "neon";
#else
    return "portable";
#endif
}

int64_t ms_cpu_grain(double work_per_item) {
    const double min_work = 262144.0; /* ~50-100 us of work: below that waking a worker (worse on a loaded machine) costs more than it saves */
    if (work_per_item <= 0) return 1 << 30;
    double g = min_work / work_per_item;
    if (g < 1) g = 1;
    if (g > (double)(1 << 30)) g = (double)(1 << 30);
    return (int64_t)g;
}

/* Element n of a float vector stored as F32, BF16 or F16 (biases, norm weights). */
static inline float vec_at(const ms_tensor *v, int64_t n) {
    switch (v->dtype) {
    case MS_F32: return ((const float *)v->data)[n];
    case MS_BF16: return ms_bf16_to_f32(((const uint16_t *)v->data)[n]);
    case MS_F16: return ms_f16_to_f32(((const uint16_t *)v->data)[n]);
    default: MS_ASSERT(!"unsupported vector dtype"); return 0;
    }
}

#if defined(MS_CPU_AVX2)
static inline float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* 8 E2M1 values from 4 bytes (low nibble first), times sc. */
static inline __m256 nvfp4_8(uint32_t four, __m256 sc) {
    const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i sh = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    __m128i b = _mm_cvtsi32_si128((int)four);
    b = _mm_unpacklo_epi8(b, b);
    __m256i c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu8_epi32(b), sh), _mm256_set1_epi32(15));
    __m256 v = _mm256_permutevar8x32_ps(mag, c);
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(8)), 28);
    return _mm256_mul_ps(_mm256_xor_ps(v, _mm256_castsi256_ps(sign)), sc);
}
#endif

/* E2M1 magnitudes by 3-bit code; bit 3 of a nibble is the sign. */
static const float e2m1_mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

void ms_cpu_dequant_portable(const ms_linear *W, int64_t n, int64_t k0, int64_t len, float *out) {
    const int64_t K = W->n_in;
    switch (W->fmt) {
    case MS_WFMT_PLAIN:
        switch (W->w.dtype) {
        case MS_F32: memcpy(out, (const float *)W->w.data + n * K + k0, (size_t)len * 4); return;
        case MS_BF16: {
            const uint16_t *p = (const uint16_t *)W->w.data + n * K + k0;
            for (int64_t i = 0; i < len; i++) out[i] = ms_bf16_to_f32(p[i]);
            return;
        }
        case MS_F16: {
            const uint16_t *p = (const uint16_t *)W->w.data + n * K + k0;
            for (int64_t i = 0; i < len; i++) out[i] = ms_f16_to_f32(p[i]);
            return;
        }
        default: MS_ASSERT(!"linear: unsupported plain weight dtype");
        }
        return;
    case MS_WFMT_FP8: {
        const uint8_t *q = (const uint8_t *)W->w.data + n * K + k0;
        const float *s = (const float *)W->scale.data + (n / 128) * W->scale.shape[1];
        for (int64_t i = 0; i < len; i++) out[i] = ms_e4m3_table[q[i]] * s[(k0 + i) / 128];
        return;
    }
    case MS_WFMT_NVFP4: {
        MS_ASSERT(k0 % 16 == 0 && len % 16 == 0);
        const uint8_t *q = (const uint8_t *)W->w.data + n * (K / 2) + k0 / 2;
        const uint8_t *s = (const uint8_t *)W->scale.data + n * (K / 16) + k0 / 16;
        for (int64_t i = 0; i < len; i += 16) {
            float sc = ms_e4m3_table[s[i / 16]] * W->scale2;
            for (int j = 0; j < 16; j++) {
                uint8_t c = (uint8_t)(q[(i + j) / 2] >> (4 * (j & 1))) & 15;
                float v = e2m1_mag[c & 7];
                out[i + j] = (c & 8 ? -v : v) * sc;
            }
        }
        return;
    }
    }
}

#if defined(MS_CPU_AVX2)
void ms_cpu_dequant(const ms_linear *W, int64_t n, int64_t k0, int64_t len, float *out) {
    const int64_t K = W->n_in;
    int64_t i = 0;
    switch (W->fmt) {
    case MS_WFMT_PLAIN:
        switch (W->w.dtype) {
        case MS_F32: memcpy(out, (const float *)W->w.data + n * K + k0, (size_t)len * 4); return;
        case MS_BF16: {
            const uint16_t *p = (const uint16_t *)W->w.data + n * K + k0;
            for (; i + 8 <= len; i += 8) {
                __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + i)));
                _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
            }
            for (; i < len; i++) out[i] = ms_bf16_to_f32(p[i]);
            return;
        }
        case MS_F16: {
            const uint16_t *p = (const uint16_t *)W->w.data + n * K + k0;
            for (; i + 8 <= len; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + i))));
            for (; i < len; i++) out[i] = ms_f16_to_f32(p[i]);
            return;
        }
        default: MS_ASSERT(!"linear: unsupported plain weight dtype");
        }
        return;
    case MS_WFMT_FP8: {
        const uint8_t *q = (const uint8_t *)W->w.data + n * K + k0;
        const float *s = (const float *)W->scale.data + (n / 128) * W->scale.shape[1];
        for (; i + 8 <= len; i += 8) {
            __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + i)));
            __m256 v = _mm256_i32gather_ps(ms_e4m3_table, idx, 4);
            _mm256_storeu_ps(out + i, _mm256_mul_ps(v, _mm256_set1_ps(s[(k0 + i) / 128])));
        }
        for (; i < len; i++) out[i] = ms_e4m3_table[q[i]] * s[(k0 + i) / 128];
        return;
    }
    case MS_WFMT_NVFP4: {
        MS_ASSERT(k0 % 16 == 0 && len % 16 == 0);
        const uint8_t *q = (const uint8_t *)W->w.data + n * (K / 2) + k0 / 2;
        const uint8_t *s = (const uint8_t *)W->scale.data + n * (K / 16) + k0 / 16;
        for (; i < len; i += 16) {
            __m256 sc = _mm256_set1_ps(ms_e4m3_table[s[i / 16]] * W->scale2);
            uint32_t lo, hi;
            memcpy(&lo, q + i / 2, 4);
            memcpy(&hi, q + i / 2 + 4, 4);
            _mm256_storeu_ps(out + i, nvfp4_8(lo, sc));
            _mm256_storeu_ps(out + i + 8, nvfp4_8(hi, sc));
        }
        return;
    }
    }
}

#elif defined(MS_CPU_NEON)
void ms_cpu_dequant(const ms_linear *W, int64_t n, int64_t k0, int64_t len, float *out) {
    const int64_t K = W->n_in;
    int64_t i = 0;
    if (W->fmt == MS_WFMT_PLAIN && W->w.dtype == MS_BF16) {
        const uint16_t *p = (const uint16_t *)W->w.data + n * K + k0;
        for (; i + 8 <= len; i += 8) {
            uint16x8_t v = vld1q_u16(p + i);
            vst1q_f32(out + i, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16)));
            vst1q_f32(out + i + 4, vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(v), 16)));
        }
        for (; i < len; i++) out[i] = ms_bf16_to_f32(p[i]);
        return;
    }
    if (W->fmt == MS_WFMT_PLAIN && W->w.dtype == MS_F16) {
        const uint16_t *p = (const uint16_t *)W->w.data + n * K + k0;
        for (; i + 4 <= len; i += 4) vst1q_f32(out + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + i))));
        for (; i < len; i++) out[i] = ms_f16_to_f32(p[i]);
        return;
    }
    ms_cpu_dequant_portable(W, n, k0, len, out); /* fp8 / nvfp4: table lookups, plain C */
}
#else
void ms_cpu_dequant(const ms_linear *W, int64_t n, int64_t k0, int64_t len, float *out) {
    ms_cpu_dequant_portable(W, n, k0, len, out);
}
#endif

size_t ms_cpu_linear_scratch_floats(const ms_linear *W, int64_t nr, int T) {
    if (T <= MS_CPU_FUSED_MAX_T) return 0;
    if (W->fmt == MS_WFMT_PLAIN && W->w.dtype == MS_F32) return 0;
    return (size_t)nr * (size_t)W->n_in;
}

/* Fused path: each row is dequantized CHUNK columns at a time into an aligned L1 buffer and dotted
 * with up to 16 tokens per pass. A token's summation order is fixed whatever the token count: its
 * result does not depend on how many tokens share the pass (a verify step of several tokens
 * reproduces the one-token decode step's logits bit for bit, which speculative decoding's greedy
 * equality relies on). facc is a token's accumulator state; facc_dot2 adds one chunk's products for
 * one or two tokens (x1 may be NULL). AVX2 keeps four 8-wide accumulators per token, k-step j (8
 * columns) going to accumulator j % 4, and runs two tokens per weight vector loaded: four independent
 * FMA chains per token instead of one latency-bound chain. */
#if defined(MS_CPU_AVX2)
typedef struct {
    __m256 a[4];
} facc;
static inline void facc_zero(facc *f) {
    for (int j = 0; j < 4; j++) f->a[j] = _mm256_setzero_ps();
}
static inline float facc_sum(const facc *f) {
    return hsum256(_mm256_add_ps(_mm256_add_ps(f->a[0], f->a[1]), _mm256_add_ps(f->a[2], f->a[3])));
}
static inline void facc_dot2(const float *wp, int64_t len8, const float *x0, const float *x1, facc *f0, facc *f1) {
    __m256 p0 = f0->a[0], p1 = f0->a[1], p2 = f0->a[2], p3 = f0->a[3];
    __m256 q0 = x1 ? f1->a[0] : p0, q1 = x1 ? f1->a[1] : p1, q2 = x1 ? f1->a[2] : p2, q3 = x1 ? f1->a[3] : p3;
    int64_t k = 0;
    if (x1) {
        for (; k + 32 <= len8; k += 32) {
            __m256 w0 = _mm256_load_ps(wp + k), w1 = _mm256_load_ps(wp + k + 8), w2 = _mm256_load_ps(wp + k + 16),
                   w3 = _mm256_load_ps(wp + k + 24);
            p0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + k), p0);
            p1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + k + 8), p1);
            p2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x0 + k + 16), p2);
            p3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x0 + k + 24), p3);
            q0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + k), q0);
            q1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + k + 8), q1);
            q2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x1 + k + 16), q2);
            q3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x1 + k + 24), q3);
        }
    } else {
        for (; k + 32 <= len8; k += 32) {
            p0 = _mm256_fmadd_ps(_mm256_load_ps(wp + k), _mm256_loadu_ps(x0 + k), p0);
            p1 = _mm256_fmadd_ps(_mm256_load_ps(wp + k + 8), _mm256_loadu_ps(x0 + k + 8), p1);
            p2 = _mm256_fmadd_ps(_mm256_load_ps(wp + k + 16), _mm256_loadu_ps(x0 + k + 16), p2);
            p3 = _mm256_fmadd_ps(_mm256_load_ps(wp + k + 24), _mm256_loadu_ps(x0 + k + 24), p3);
        }
    }
    /* the last < 32 columns of a multiple of 8: k-step j -> accumulator j % 4 as above (k is a
     * multiple of 32 here, so j % 4 restarts at 0) */
    for (int j = 0; k < len8; k += 8, j++) {
        __m256 w = _mm256_load_ps(wp + k);
        __m256 *pa = j == 0 ? &p0 : j == 1 ? &p1 : &p2;
        *pa = _mm256_fmadd_ps(w, _mm256_loadu_ps(x0 + k), *pa);
        if (x1) {
            __m256 *qa = j == 0 ? &q0 : j == 1 ? &q1 : &q2;
            *qa = _mm256_fmadd_ps(w, _mm256_loadu_ps(x1 + k), *qa);
        }
    }
    f0->a[0] = p0, f0->a[1] = p1, f0->a[2] = p2, f0->a[3] = p3;
    if (x1) f1->a[0] = q0, f1->a[1] = q1, f1->a[2] = q2, f1->a[3] = q3;
}
#elif defined(MS_CPU_NEON)
typedef struct {
    float32x4_t a0, a1;
} facc;
static inline void facc_zero(facc *f) { f->a0 = f->a1 = vdupq_n_f32(0); }
static inline float facc_sum(const facc *f) { return vaddvq_f32(vaddq_f32(f->a0, f->a1)); }
static inline void facc_dot1(const float *wp, int64_t len8, const float *xp, facc *f) {
    float32x4_t a0 = f->a0, a1 = f->a1;
    for (int64_t k = 0; k < len8; k += 8) {
        a0 = vfmaq_f32(a0, vld1q_f32(wp + k), vld1q_f32(xp + k));
        a1 = vfmaq_f32(a1, vld1q_f32(wp + k + 4), vld1q_f32(xp + k + 4));
    }
    f->a0 = a0, f->a1 = a1;
}
static inline void facc_dot2(const float *wp, int64_t len8, const float *x0, const float *x1, facc *f0, facc *f1) {
    facc_dot1(wp, len8, x0, f0);
    if (x1) facc_dot1(wp, len8, x1, f1);
}
#else
typedef struct {
    float a[8];
} facc;
static inline void facc_zero(facc *f) {
    for (int l = 0; l < 8; l++) f->a[l] = 0;
}
static inline float facc_sum(const facc *f) {
    const float *a = f->a;
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}
static inline void facc_dot1(const float *wp, int64_t len8, const float *xp, facc *f) {
    float a[8];
    for (int l = 0; l < 8; l++) a[l] = f->a[l];
    for (int64_t k = 0; k < len8; k += 8)
        for (int l = 0; l < 8; l++) a[l] += wp[k + l] * xp[k + l];
    for (int l = 0; l < 8; l++) f->a[l] = a[l];
}
static inline void facc_dot2(const float *wp, int64_t len8, const float *x0, const float *x1, facc *f0, facc *f1) {
    facc_dot1(wp, len8, x0, f0);
    if (x1) facc_dot1(wp, len8, x1, f1);
}
#endif

static void rows_fused(const ms_linear *W, int64_t n0, int64_t n1, const float *x, int64_t ldx, int T, float *y,
                       int64_t ldy) {
    const int64_t K = W->n_in;
    const int direct = W->fmt == MS_WFMT_PLAIN && W->w.dtype == MS_F32;
    const ms_tensor *bias = W->bias.data ? &W->bias : NULL;
    float buf[CHUNK] __attribute__((aligned(32)));
    for (int64_t n = n0; n < n1; n++) {
        for (int t0 = 0; t0 < T; t0 += MS_CPU_FUSED_MAX_T) {
            int nt = T - t0 < MS_CPU_FUSED_MAX_T ? T - t0 : MS_CPU_FUSED_MAX_T;
            facc acc[MS_CPU_FUSED_MAX_T];
            float tail[MS_CPU_FUSED_MAX_T];
            for (int t = 0; t < nt; t++) facc_zero(&acc[t]), tail[t] = 0;
            for (int64_t k0 = 0; k0 < K; k0 += CHUNK) {
                int64_t len = K - k0 < CHUNK ? K - k0 : CHUNK;
                /* the weights always come from the aligned L1 buffer (a copy for f32 rows) */
                if (direct) memcpy(buf, (const float *)W->w.data + n * K + k0, (size_t)len * 4);
                else ms_cpu_dequant(W, n, k0, len, buf);
                const int64_t len8 = len & ~(int64_t)7;
                for (int t = 0; t < nt; t += 2) {
                    const float *x0 = x + (int64_t)(t0 + t) * ldx + k0;
                    const float *x1 = t + 1 < nt ? x0 + ldx : NULL;
                    facc_dot2(buf, len8, x0, x1, &acc[t], x1 ? &acc[t + 1] : NULL);
                }
                for (int t = 0; t < nt; t++) {
                    const float *xp = x + (int64_t)(t0 + t) * ldx + k0;
                    for (int64_t k = len8; k < len; k++) tail[t] += buf[k] * xp[k];
                }
            }
            for (int t = 0; t < nt; t++) {
                float v = facc_sum(&acc[t]) + tail[t];
                if (bias) v += vec_at(bias, n);
                y[(int64_t)(t0 + t) * ldy + (n - n0)] = v;
            }
        }
    }
}

static void rows_gemm(const ms_linear *W, int64_t n0, int64_t n1, const float *x, int64_t ldx, int T, float *y,
                      int64_t ldy, float *scratch) {
    const int64_t K = W->n_in, nr = n1 - n0;
    const float *wt;
    if (W->fmt == MS_WFMT_PLAIN && W->w.dtype == MS_F32) {
        wt = (const float *)W->w.data + n0 * K;
    } else {
        MS_ASSERT(scratch != NULL);
        for (int64_t n = n0; n < n1; n++) {
            float *row = scratch + (n - n0) * K;
            for (int64_t k0 = 0; k0 < K; k0 += 4096) {
                int64_t len = K - k0 < 4096 ? K - k0 : 4096;
                ms_cpu_dequant(W, n, k0, len, row + k0);
            }
        }
        wt = scratch;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, (int)nr, (int)K, 1.0f, x, (int)ldx, wt, (int)K, 0.0f, y,
                (int)ldy);
    if (W->bias.data) {
        for (int64_t n = n0; n < n1; n++) {
            float bv = vec_at(&W->bias, n);
            for (int t = 0; t < T; t++) y[(int64_t)t * ldy + (n - n0)] += bv;
        }
    }
}

void ms_cpu_linear_rows(const ms_linear *W, int64_t n0, int64_t n1, const float *x, int64_t ldx, int T, float *y,
                        int64_t ldy, float *scratch) {
    if (n1 <= n0 || T <= 0) return;
    if (T <= MS_CPU_FUSED_MAX_T) rows_fused(W, n0, n1, x, ldx, T, y, ldy);
    else rows_gemm(W, n0, n1, x, ldx, T, y, ldy, scratch);
}
