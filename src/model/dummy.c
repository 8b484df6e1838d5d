/* dummy.c - host-side random weights of a config's real shapes (`--load-format dummy`).
 *
 * Benchmarks and tests need full-size models without downloads. Values are seeded per tensor and
 * per row (the same bits whatever the thread count) and scaled so the dequantized weight has
 * variance about 1/fan_in: activations stay O(1) through any number of layers, unlike the 0.02 init
 * which would hide numerical bugs. Quantized formats are generated directly as codes + scales (no
 * float round trip), so filling tens of GB takes seconds. */
#include "core/dtype.h"
#include "core/threads.h"
#include "model/model_internal.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

static inline uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) from 24 random bits */
static inline float u24(uint32_t bits) { return (float)(bits >> 8) * (2.0f / 16777216.0f) - 1.0f; }

/* bf16 bit pattern -> e4m3 code (RNE), for generating FP8 codes without a search per element */
static uint8_t g_bf16_to_e4m3[65536];
static pthread_once_t g_lut_once = PTHREAD_ONCE_INIT;
static void lut_init(void) {
    for (uint32_t h = 0; h < 65536; h++) g_bf16_to_e4m3[h] = ms_f32_to_e4m3(ms_bf16_to_f32((uint16_t)h));
}
static inline uint8_t to_e4m3_fast(float f) { return g_bf16_to_e4m3[ms_f32_to_bf16(f)]; }

typedef struct gen {
    void *dst;
    ms_dtype dtype;
    int64_t row_len;  /* elements (or bytes for codes) per row */
    float scale, offset;
    int mode;         /* 0 floats, 1 e4m3 codes of u*448, 2 random bytes, 3 e4m3 of (0.625+0.375u)*448 */
    uint64_t seed;
} gen;

static void gen_rows(void *ctx, int64_t r0, int64_t r1, int worker) {
    (void)worker;
    const gen *g = ctx;
    for (int64_t r = r0; r < r1; r++) {
        uint64_t s = g->seed ^ ((uint64_t)r * 0xd1b54a32d192ed03ull);
        splitmix(&s);
        int64_t n = g->row_len;
        if (g->mode == 2) {
            uint8_t *d = (uint8_t *)g->dst + r * n;
            for (int64_t i = 0; i < n; i += 8) {
                uint64_t x = splitmix(&s);
                int64_t k = n - i < 8 ? n - i : 8;
                memcpy(d + i, &x, (size_t)k);
            }
            continue;
        }
        if (g->mode == 1 || g->mode == 3) {
            uint8_t *d = (uint8_t *)g->dst + r * n;
            for (int64_t i = 0; i < n; i++) {
                uint32_t x = (uint32_t)splitmix(&s);
                float u = u24(x);
                d[i] = to_e4m3_fast(g->mode == 1 ? u * 448.0f : (0.625f + 0.375f * u) * 448.0f);
            }
            continue;
        }
        for (int64_t i = 0; i < n; i += 2) {
            uint64_t x = splitmix(&s);
            for (int k = 0; k < 2 && i + k < n; k++) {
                float v = g->offset + g->scale * u24((uint32_t)(x >> (32 * k)));
                int64_t idx = r * n + i + k;
                switch (g->dtype) {
                case MS_F32: ((float *)g->dst)[idx] = v; break;
                case MS_F16: ((uint16_t *)g->dst)[idx] = ms_f32_to_f16(v); break;
                default: ((uint16_t *)g->dst)[idx] = ms_f32_to_bf16(v); break;
                }
            }
        }
    }
}

static void run_gen(gen *g, int64_t rows) {
    int64_t grain = g->row_len > 0 ? (1 << 16) / g->row_len + 1 : rows;
    ms_pool_run(ms_pool_default(), rows, grain, gen_rows, g);
}

void ms_dummy_fill_tensor(ms_tensor *t, ms_dummy_kind kind, uint64_t seed) {
    int64_t n = ms_tensor_numel(t);
    int64_t row = t->ndim >= 2 ? t->shape[t->ndim - 1] : n;
    if (row <= 0) return;
    gen g = {t->data, t->dtype, row, 1.0f, 0.0f, 0, seed};
    switch (kind) {
    case MS_DUMMY_NORM: g.offset = 1.0f; g.scale = 0.1f; break;
    case MS_DUMMY_BIAS: g.scale = 0.1f; break;
    case MS_DUMMY_EMBED: g.scale = sqrtf(3.0f); break;
    }
    run_gen(&g, n / row);
}

int ms_dummy_linear(ms_model *m, ms_linear *W, uint64_t seed, ms_err *err) {
    const int64_t N = W->n_out, K = W->n_in;
    pthread_once(&g_lut_once, lut_init);
    ms_dtype_init();
    switch (W->fmt) {
    case MS_WFMT_PLAIN: {
        W->w = ms_tensor_2d(MS_BF16, N, K);
        if (!(W->w.data = ms_model_alloc(m, ms_tensor_nbytes(&W->w)))) break;
        gen g = {W->w.data, MS_BF16, K, sqrtf(3.0f / (float)K), 0.0f, 0, seed};
        run_gen(&g, N);
        return MS_OK;
    }
    case MS_WFMT_FP8: {
        W->w = ms_tensor_2d(MS_F8E4M3, N, K);
        W->scale = ms_tensor_2d(MS_F32, (N + 127) / 128, (K + 127) / 128);
        if (!(W->w.data = ms_model_alloc(m, ms_tensor_nbytes(&W->w)))) break;
        if (!(W->scale.data = ms_model_alloc(m, ms_tensor_nbytes(&W->scale)))) break;
        gen g = {W->w.data, MS_U8, K, 0, 0, 1, seed};
        run_gen(&g, N);
        /* W = code * s with code ~ U(-448,448): s = sqrt(3/K)/448 gives variance 1/K; jitter the blocks */
        gen gs = {W->scale.data, MS_F32, W->scale.shape[1], 0.25f * sqrtf(3.0f / (float)K) / 448.0f,
                  sqrtf(3.0f / (float)K) / 448.0f, 0, seed ^ 0x5ca1e};
        run_gen(&gs, W->scale.shape[0]);
        return MS_OK;
    }
    case MS_WFMT_NVFP4: {
        W->w = ms_tensor_2d(MS_U8, N, K / 2);
        W->scale = ms_tensor_2d(MS_F8E4M3, N, K / 16);
        if (!(W->w.data = ms_model_alloc(m, ms_tensor_nbytes(&W->w)))) break;
        if (!(W->scale.data = ms_model_alloc(m, ms_tensor_nbytes(&W->scale)))) break;
        gen g = {W->w.data, MS_U8, K / 2, 0, 0, 2, seed};
        run_gen(&g, N);
        gen gs = {W->scale.data, MS_U8, K / 16, 0, 0, 3, seed ^ 0x5ca1e};
        run_gen(&gs, N);
        /* E[code^2] over uniform codes = 68.5/8; E[(blockscale/448)^2] for U(0.25,1) = 0.4375 */
        W->scale2 = 1.0f / (448.0f * sqrtf((float)K * (68.5f / 8.0f) * 0.4375f));
        W->input_scale = 1.0f;
        return MS_OK;
    }
    }
    return ms_errf(err, MS_ERR_NOMEM, "out of memory for dummy weight '%s' [%lld, %lld]", W->name, (long long)N, (long long)K);
}
