/* quantize.c - NVFP4 and FP8-block weight quantization (see quantize.h for the exact math).
 *
 * Kept apart from the tool so tests can call it directly and compare with an independent
 * re-implementation of the format definitions. Rows are independent (NVFP4) or independent in
 * 128-row strips (FP8), so both parallelize over the default pool with per-worker scratch rows. */
#include "model/quantize.h"

#include "core/threads.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint8_t ms_quant_f32_to_e4m3(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return 0x7f;
    float a;
    memcpy(&a, &u, 4);
    if (a >= 448.0f) return sign | 0x7e;
    if (a < 0.015625f) /* below 2^-6: subnormal codes, quantum 2^-9 (a * 512 is exact) */
        return sign | (uint8_t)nearbyintf(a * 512.0f);
    uint32_t r = u + 0x7ffffu + ((u >> 20) & 1u); /* round the mantissa to 3 bits, ties to even */
    int e = (int)(r >> 23) - 127 + 7;
    return sign | (uint8_t)((e << 3) | ((r >> 20) & 7u));
}

typedef struct qctx {
    ms_dtype dt;
    const char *src;
    int64_t N, K;
    uint8_t *codes, *scales; /* NVFP4 */
    float *scale_inv;        /* FP8 */
    float scale2;
    float *scratch;          /* per worker: K floats (+ block amax for FP8) */
    int64_t scratch_stride;
    float *amax_w;           /* per worker amax */
} qctx;

static void amax_rows(void *c_, int64_t r0, int64_t r1, int worker) {
    qctx *c = c_;
    float *row = c->scratch + worker * c->scratch_stride;
    float m = c->amax_w[worker];
    size_t es = ms_dtype_size(c->dt);
    for (int64_t r = r0; r < r1; r++) {
        ms_convert_to_f32(c->dt, c->src + (size_t)(r * c->K) * es, row, (size_t)c->K);
        for (int64_t k = 0; k < c->K; k++) {
            float a = fabsf(row[k]);
            if (!(a <= 3.4e38f)) a = INFINITY; /* NaN and inf poison the amax */
            if (a > m) m = a;
        }
    }
    c->amax_w[worker] = m;
}

static int setup(qctx *c, ms_dtype dt, const void *src, int64_t N, int64_t K, int64_t extra, const char *what, ms_err *err) {
    memset(c, 0, sizeof *c);
    if (dt != MS_F32 && dt != MS_F16 && dt != MS_BF16)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "%s: cannot quantize dtype %s (need F32, F16 or BF16)", what, ms_dtype_name(dt));
    ms_dtype_init();
    int nw = ms_pool_size(ms_pool_default());
    c->dt = dt;
    c->src = src;
    c->N = N;
    c->K = K;
    c->scratch_stride = K + extra + 16;
    c->scratch = malloc((size_t)nw * (size_t)c->scratch_stride * sizeof(float));
    c->amax_w = calloc((size_t)nw, sizeof(float));
    if (!c->scratch || !c->amax_w) {
        free(c->scratch);
        free(c->amax_w);
        return ms_errf(err, MS_ERR_NOMEM, "%s: out of memory for quantization scratch", what);
    }
    return MS_OK;
}

static void teardown(qctx *c) {
    free(c->scratch);
    free(c->amax_w);
}

static float pool_amax(qctx *c) {
    int nw = ms_pool_size(ms_pool_default());
    for (int i = 0; i < nw; i++) c->amax_w[i] = 0;
    ms_pool_run(ms_pool_default(), c->N, 1 + (1 << 16) / (c->K ? c->K : 1), amax_rows, c);
    float m = 0;
    for (int i = 0; i < nw; i++) m = c->amax_w[i] > m ? c->amax_w[i] : m;
    return m;
}

float ms_quant_amax(ms_dtype dt, const void *src, int64_t n) {
    qctx c;
    if (setup(&c, dt, src, 1, n, 0, "amax", NULL)) return INFINITY;
    float m = pool_amax(&c);
    teardown(&c);
    return m;
}

float ms_quant_nvfp4_scale2(float amax) { return amax > 0 ? amax / (6.0f * 448.0f) : 1.0f; }

static void nvfp4_rows(void *c_, int64_t r0, int64_t r1, int worker) {
    qctx *c = c_;
    float *row = c->scratch + worker * c->scratch_stride;
    const int64_t K = c->K, nb = K / 16;
    size_t es = ms_dtype_size(c->dt);
    const float s6 = 6.0f * c->scale2;
    for (int64_t r = r0; r < r1; r++) {
        ms_convert_to_f32(c->dt, c->src + (size_t)(r * K) * es, row, (size_t)K);
        for (int64_t b = 0; b < nb; b++) {
            const float *x = row + b * 16;
            float am = 0;
            for (int j = 0; j < 16; j++) am = fabsf(x[j]) > am ? fabsf(x[j]) : am;
            uint8_t sc = ms_quant_f32_to_e4m3(am / s6);
            c->scales[r * nb + b] = sc;
            if (!c->codes) continue;
            float denom = ms_e4m3_to_f32(sc) * c->scale2;
            uint8_t *q = c->codes + r * (K / 2) + b * 8;
            for (int j = 0; j < 16; j += 2) {
                uint8_t lo = denom > 0 ? ms_f32_to_e2m1(x[j] / denom) : 0;
                uint8_t hi = denom > 0 ? ms_f32_to_e2m1(x[j + 1] / denom) : 0;
                q[j / 2] = (uint8_t)(lo | (hi << 4));
            }
        }
    }
}

static int nvfp4(ms_dtype dt, const void *src, int64_t N, int64_t K, uint8_t *codes, uint8_t *scales, float *scale2,
                 const char *what, ms_err *err) {
    if (K % 16) return ms_errf(err, MS_ERR_INVALID, "%s: NVFP4 needs the input size (%lld) to be a multiple of 16", what, (long long)K);
    qctx c;
    MS_TRY(setup(&c, dt, src, N, K, 0, what, err));
    float amax = pool_amax(&c);
    if (!isfinite(amax)) {
        teardown(&c);
        return ms_errf(err, MS_ERR_NUMERICS, "%s: weight holds NaN or Inf; refusing to quantize", what);
    }
    c.scale2 = ms_quant_nvfp4_scale2(amax);
    c.codes = codes;
    c.scales = scales;
    ms_pool_run(ms_pool_default(), N, 1 + (1 << 15) / K, nvfp4_rows, &c);
    *scale2 = c.scale2;
    teardown(&c);
    return MS_OK;
}

int ms_quantize_nvfp4(ms_dtype dt, const void *src, int64_t N, int64_t K, uint8_t *codes, uint8_t *scales,
                      float *scale2, const char *what, ms_err *err) {
    return nvfp4(dt, src, N, K, codes, scales, scale2, what, err);
}

int ms_quantize_nvfp4_scales(ms_dtype dt, const void *src, int64_t N, int64_t K, uint8_t *scales, float *scale2,
                             const char *what, ms_err *err) {
    return nvfp4(dt, src, N, K, NULL, scales, scale2, what, err);
}

static void fp8_strips(void *c_, int64_t s0, int64_t s1, int worker) {
    qctx *c = c_;
    float *row = c->scratch + worker * c->scratch_stride;
    const int64_t K = c->K, nb = (K + 127) / 128;
    float *am = row + K; /* nb floats */
    size_t es = ms_dtype_size(c->dt);
    for (int64_t s = s0; s < s1; s++) {
        int64_t r0 = s * 128, r1 = r0 + 128 < c->N ? r0 + 128 : c->N;
        for (int64_t b = 0; b < nb; b++) am[b] = 0;
        for (int64_t r = r0; r < r1; r++) {
            ms_convert_to_f32(c->dt, c->src + (size_t)(r * K) * es, row, (size_t)K);
            for (int64_t k = 0; k < K; k++) {
                float a = fabsf(row[k]);
                if (a > am[k / 128]) am[k / 128] = a;
            }
        }
        float *sc = c->scale_inv + s * nb;
        for (int64_t b = 0; b < nb; b++) sc[b] = am[b] > 0 ? am[b] / 448.0f : 1.0f;
        if (!c->codes) continue;
        for (int64_t r = r0; r < r1; r++) {
            ms_convert_to_f32(c->dt, c->src + (size_t)(r * K) * es, row, (size_t)K);
            uint8_t *q = c->codes + r * K;
            for (int64_t k = 0; k < K; k++) q[k] = ms_quant_f32_to_e4m3(row[k] / sc[k / 128]);
        }
    }
}

int ms_quantize_fp8_block(ms_dtype dt, const void *src, int64_t N, int64_t K, uint8_t *codes, float *scale_inv,
                          const char *what, ms_err *err) {
    qctx c;
    MS_TRY(setup(&c, dt, src, N, K, (K + 127) / 128, what, err));
    float amax = pool_amax(&c);
    if (!isfinite(amax)) {
        teardown(&c);
        return ms_errf(err, MS_ERR_NUMERICS, "%s: weight holds NaN or Inf; refusing to quantize", what);
    }
    c.codes = codes;
    c.scale_inv = scale_inv;
    ms_pool_run(ms_pool_default(), (N + 127) / 128, 1, fp8_strips, &c);
    teardown(&c);
    return MS_OK;
}
