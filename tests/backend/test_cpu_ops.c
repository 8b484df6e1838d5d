/* test_cpu_ops.c - every CPU backend op against a naive double-precision scalar reference on random
 * inputs, with odd shapes (tails of the AVX loops, row blocks, token blocks on both sides of the
 * fused/sgemm switch), all three weight formats, paged caches with scattered pages, several
 * sequences per batch, grouped routing and sparse (top-k) MLA attention. The weight formats are
 * decoded by ms_linear_dequant_row (core/tensor.c), the format definition the kernels must match.
 * The build's SIMD kernels (AVX2 or NEON) are also checked against the plain C ones that
 * `make test-portable` runs: dequantization bit for bit, dot products to rounding. */
#include "backend/attn.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/dtype.h"
#include "test.h"
#include "test_linear.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}
static float frand(void) { return (float)((rnd() & 0xffffff) / (double)0x1000000 * 2.0 - 1.0); }
static void fill(float *p, int64_t n, float sc) {
    for (int64_t i = 0; i < n; i++) p[i] = frand() * sc;
}

static ms_backend *B;
static ms_err E;

static ms_tensor t_f32(int ndim, int64_t a, int64_t b, int64_t c) {
    int64_t s[3] = {a, b, c};
    ms_tensor t;
    CHECK(ms_backend_alloc(B, &t, MS_F32, ndim, s, &E) == MS_OK);
    return t;
}
static void t_free(ms_tensor *t) { B->ops->free(B, t); }

/* Relative closeness over a whole array: max|a-b| <= tol * max(max|b|, floor). */
static int close_arr(const float *a, const double *b, int64_t n, double tol, double floor) {
    double mx = floor, md = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(b[i]) > mx) mx = fabs(b[i]);
        double d = fabs(a[i] - b[i]);
        if (!(d <= md)) md = d; /* NaN propagates as failure */
    }
    if (!(md <= tol * mx)) fprintf(stderr, "    max diff %g vs scale %g\n", md, mx);
    return md <= tol * mx;
}

/* ------------------------------------------------------------------ linear */

typedef struct {
    ms_linear W;
    void *w, *s, *bias;
} qlin;

static qlin make_linear(int fmt, ms_dtype pdt, int64_t N, int64_t K, int with_bias) {
    qlin q;
    memset(&q, 0, sizeof q);
    ms_linear *W = &q.W;
    test_linear_init(W, "test.linear", fmt, N, K);
    if (fmt == MS_WFMT_PLAIN) {
        W->w = ms_tensor_2d(pdt, N, K);
        q.w = malloc(ms_tensor_nbytes(&W->w));
        for (int64_t i = 0; i < N * K; i++) {
            float v = frand();
            if (pdt == MS_F32) ((float *)q.w)[i] = v;
            else if (pdt == MS_BF16) ((uint16_t *)q.w)[i] = ms_f32_to_bf16(v);
            else ((uint16_t *)q.w)[i] = ms_f32_to_f16(v);
        }
    } else if (fmt == MS_WFMT_FP8) {
        W->w = ms_tensor_2d(MS_F8E4M3, N, K);
        q.w = malloc((size_t)(N * K));
        for (int64_t i = 0; i < N * K; i++) {
            uint8_t b = (uint8_t)rnd();
            if ((b & 0x7f) == 0x7f) b = 0x3c;
            ((uint8_t *)q.w)[i] = b;
        }
        int64_t sr = (N + 127) / 128, sc = (K + 127) / 128;
        W->scale = ms_tensor_2d(MS_F32, sr, sc);
        q.s = malloc((size_t)(sr * sc) * 4);
        for (int64_t i = 0; i < sr * sc; i++) ((float *)q.s)[i] = 0.01f + 0.02f * (rnd() % 100) / 100.0f;
    } else {
        W->w = ms_tensor_2d(MS_U8, N, K / 2);
        q.w = malloc((size_t)(N * K / 2));
        for (int64_t i = 0; i < N * K / 2; i++) ((uint8_t *)q.w)[i] = (uint8_t)rnd();
        W->scale = ms_tensor_2d(MS_F8E4M3, N, K / 16);
        q.s = malloc((size_t)(N * K / 16));
        for (int64_t i = 0; i < N * K / 16; i++) ((uint8_t *)q.s)[i] = ms_f32_to_e4m3(0.5f + (rnd() % 100) / 50.0f);
        W->scale2 = 0.37f;
    }
    W->w.data = q.w;
    W->scale.data = q.s;
    if (with_bias) {
        W->bias = ms_tensor_make(MS_BF16, 1, &N);
        q.bias = malloc((size_t)N * 2);
        for (int64_t i = 0; i < N; i++) ((uint16_t *)q.bias)[i] = ms_f32_to_bf16(frand());
        W->bias.data = q.bias;
    }
    CHECK(B->ops->place_linear(B, W, &E) == MS_OK);
    return q;
}
static void free_linear(qlin *q) {
    free(q->w);
    free(q->s);
    free(q->bias);
}

static void ref_linear(const ms_linear *W, const float *x, int64_t T, double *y) {
    int64_t N = W->n_out, K = W->n_in;
    float *row = malloc((size_t)K * 4);
    for (int64_t n = 0; n < N; n++) {
        ms_linear_dequant_row(W, n, row);
        double bv = W->bias.data ? ms_bf16_to_f32(((const uint16_t *)W->bias.data)[n]) : 0;
        for (int64_t t = 0; t < T; t++) {
            double s = bv;
            for (int64_t k = 0; k < K; k++) s += (double)row[k] * x[t * K + k];
            y[t * N + n] = s;
        }
    }
    free(row);
}

static void check_linear(int fmt, ms_dtype pdt, int64_t N, int64_t K, int T, int bias) {
    qlin q = make_linear(fmt, pdt, N, K, bias);
    ms_tensor x = t_f32(2, T, K, 0), y = t_f32(2, T, N, 0);
    fill(x.data, T * K, 1.0f);
    CHECK(B->ops->linear(B, &q.W, &x, &y, &E) == MS_OK);
    double *ref = malloc(sizeof(double) * (size_t)(T * N));
    ref_linear(&q.W, x.data, T, ref);
    CHECK_MSG(close_arr(y.data, ref, T * N, 2e-5, 1e-3), "fmt %d dtype %d N %lld K %lld T %d", fmt, pdt, (long long)N,
              (long long)K, T);
    free(ref);
    t_free(&x);
    t_free(&y);
    free_linear(&q);
}

static void test_linear_plain(void) {
    const ms_dtype dts[3] = {MS_F32, MS_BF16, MS_F16};
    const int Ts[5] = {1, 3, 16, 17, 300};
    for (int d = 0; d < 3; d++)
        for (int ti = 0; ti < 5; ti++) {
            check_linear(MS_WFMT_PLAIN, dts[d], 7, 13, Ts[ti], 1);
            check_linear(MS_WFMT_PLAIN, dts[d], 70, 257, Ts[ti], 0);
        }
    check_linear(MS_WFMT_PLAIN, MS_BF16, 131, 600, 2, 1);
}

static void test_linear_fp8(void) {
    const int Ts[4] = {1, 5, 17, 260};
    for (int ti = 0; ti < 4; ti++) {
        check_linear(MS_WFMT_FP8, MS_F8E4M3, 5, 9, Ts[ti], 0);
        check_linear(MS_WFMT_FP8, MS_F8E4M3, 200, 300, Ts[ti], 1);
    }
}

static void test_linear_nvfp4(void) {
    const int Ts[4] = {1, 4, 17, 259};
    for (int ti = 0; ti < 4; ti++) {
        check_linear(MS_WFMT_NVFP4, MS_U8, 3, 16, Ts[ti], 0);
        check_linear(MS_WFMT_NVFP4, MS_U8, 129, 272, Ts[ti], 1);
    }
}

/* A token's output row does not depend on how many tokens share the call (up to the fused kernel's
 * 16): speculative decoding verifies N+1 tokens in one step and its greedy output must equal the
 * one-token decode steps', which holds only if each row's logits are the same bits. Checked for
 * every format, K with a tail past the multiple of 8 and several CHUNKs, T = 1..16. */
static void test_linear_t_invariant(void) {
    const int fmts[4] = {MS_WFMT_PLAIN, MS_WFMT_PLAIN, MS_WFMT_FP8, MS_WFMT_NVFP4};
    const ms_dtype dts[4] = {MS_F32, MS_BF16, MS_F8E4M3, MS_U8};
    const int64_t Ks[4] = {300, 1029, 544, 608};
    for (int f = 0; f < 4; f++) {
        const int64_t N = 37, K = Ks[f];
        qlin q = make_linear(fmts[f], dts[f], N, K, 1);
        ms_tensor x = t_f32(2, 16, K, 0), y = t_f32(2, 16, N, 0), y1 = t_f32(2, 1, N, 0), x1 = t_f32(2, 1, K, 0);
        fill(x.data, 16 * K, 1.0f);
        for (int T = 1; T <= 16; T++) {
            ms_tensor xt = ms_tensor_2d(MS_F32, T, K), yt = ms_tensor_2d(MS_F32, T, N);
            xt.data = x.data, yt.data = y.data;
            CHECK(B->ops->linear(B, &q.W, &xt, &yt, &E) == MS_OK);
            for (int t = 0; t < T; t++) {
                memcpy(x1.data, (float *)x.data + (int64_t)t * K, (size_t)K * 4);
                CHECK(B->ops->linear(B, &q.W, &x1, &y1, &E) == MS_OK);
                CHECK_MSG(memcmp(y1.data, (float *)y.data + (int64_t)t * N, (size_t)N * 4) == 0,
                          "format %d: token %d of %d differs from the same token alone", fmts[f], t, T);
            }
        }
        t_free(&x), t_free(&y), t_free(&x1), t_free(&y1);
        free_linear(&q);
    }
}

/* ------------------------------------------------------------------ SIMD vs plain C kernels */

/* The path PORTABLE=1 selects must really be the plain C one, and a default x86-64-v3 build AVX2. */
static void test_simd_path(void) {
    const char *name = ms_cpu_simd_name();
    fprintf(stderr, "    cpu kernels: %s\n", name);
#if defined(MS_CPU_PORTABLE)
    CHECK_STR(name, "portable");
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    CHECK_STR(name, "avx2");
#elif defined(__ARM_NEON) && defined(__aarch64__)
    CHECK_STR(name, "neon");
#endif
}

/* ms_cpu_dequant (the build's path) and ms_cpu_dequant_portable give the same floats, and both
 * the reference row dequantizer's, for every format, in chunks as the kernels call it. */
static void test_dequant_paths(void) {
    const int fmts[5] = {MS_WFMT_PLAIN, MS_WFMT_PLAIN, MS_WFMT_PLAIN, MS_WFMT_FP8, MS_WFMT_NVFP4};
    const ms_dtype dts[5] = {MS_F32, MS_BF16, MS_F16, MS_F8E4M3, MS_U8};
    const int64_t N = 130, K = 400;
    float *a = malloc(K * 4), *b = malloc(K * 4), *r = malloc(K * 4);
    for (int f = 0; f < 5; f++) {
        qlin q = make_linear(fmts[f], dts[f], N, K, 0);
        int bad = 0;
        for (int64_t n = 0; n < N; n++) {
            for (int64_t k0 = 0; k0 < K; k0 += 256) {
                int64_t len = K - k0 < 256 ? K - k0 : 256;
                ms_cpu_dequant(&q.W, n, k0, len, a + k0);
                ms_cpu_dequant_portable(&q.W, n, k0, len, b + k0);
            }
            ms_linear_dequant_row(&q.W, n, r);
            bad += memcmp(a, b, K * 4) != 0 || memcmp(a, r, K * 4) != 0;
        }
        CHECK_MSG(bad == 0, "format %d dtype %d: %d rows differ between the SIMD, plain C and reference dequantizers",
                  fmts[f], dts[f], bad);
        free_linear(&q);
    }
    free(a);
    free(b);
    free(r);
}

/* ms_cpu_dot / ms_cpu_axpy against the plain C dot and a scalar axpy on lengths around every
 * vector width and tail. */
static void test_dot_axpy_paths(void) {
    const int64_t ns[12] = {1, 3, 4, 7, 8, 9, 15, 16, 17, 33, 128, 577};
    float *a = malloc(577 * 4), *b = malloc(577 * 4), *o1 = malloc(577 * 4), *o2 = malloc(577 * 4);
    for (int i = 0; i < 12; i++) {
        int64_t n = ns[i];
        fill(a, n, 1.0f);
        fill(b, n, 2.0f);
        double mag = 0, exact = 0;
        for (int64_t k = 0; k < n; k++) {
            mag += fabs((double)a[k] * b[k]);
            exact += (double)a[k] * b[k];
        }
        float d1 = ms_cpu_dot(a, b, n), d2 = ms_cpu_dot_portable(a, b, n);
        CHECK_MSG(fabs(d1 - d2) <= 1e-6 * mag + 1e-30, "dot n=%lld: %.9g vs plain C %.9g", (long long)n, d1, d2);
        CHECK_MSG(fabs(d2 - exact) <= 1e-6 * mag + 1e-30, "plain C dot n=%lld: %.9g vs %.9g", (long long)n, d2, exact);
        fill(o1, n, 1.0f);
        memcpy(o2, o1, (size_t)n * 4);
        ms_cpu_axpy(0.37f, a, o1, n);
        int bad = 0;
        for (int64_t k = 0; k < n; k++) {
            float want = o2[k] + 0.37f * a[k];
            bad += fabsf(o1[k] - want) > 1e-6f * (fabsf(want) + 1.0f);
        }
        CHECK_MSG(bad == 0, "axpy n=%lld: %d elements differ", (long long)n, bad);
    }
    free(a);
    free(b);
    free(o1);
    free(o2);
}

/* ------------------------------------------------------------------ elementwise and norms */

static void test_embed_gather(void) {
    int64_t V = 11, H = 37;
    uint16_t *tab = malloc((size_t)(V * H) * 2);
    for (int64_t i = 0; i < V * H; i++) tab[i] = ms_f32_to_bf16(frand());
    ms_tensor table = ms_tensor_2d(MS_BF16, V, H);
    table.data = tab;
    int32_t ids[5] = {3, 0, 10, 3, 7};
    ms_tensor out = t_f32(2, 5, H, 0);
    CHECK(B->ops->embed(B, &table, ids, 5, &out, &E) == MS_OK);
    int ok = 1;
    for (int t = 0; t < 5; t++)
        for (int64_t i = 0; i < H; i++) ok &= ((float *)out.data)[t * H + i] == ms_bf16_to_f32(tab[ids[t] * H + i]);
    CHECK(ok);
    int32_t bad[1] = {11};
    CHECK(B->ops->embed(B, &table, bad, 1, &out, &E) == MS_ERR_INVALID);
    int32_t idx[3] = {4, 1, 4};
    ms_tensor g = t_f32(2, 3, H, 0);
    CHECK(B->ops->gather_rows(B, &out, idx, 3, &g, &E) == MS_OK);
    ok = 1;
    for (int r = 0; r < 3; r++) ok &= !memcmp((float *)g.data + r * H, (float *)out.data + idx[r] * H, (size_t)H * 4);
    CHECK(ok);
    free(tab);
    t_free(&out);
    t_free(&g);
}

static void test_norms(void) {
    int64_t R = 5, D = 67;
    ms_tensor x = t_f32(2, R, D, 0), d = t_f32(2, R, D, 0), o = t_f32(2, R, D, 0);
    fill(x.data, R * D, 3.0f);
    fill(d.data, R * D, 1.0f);
    uint16_t wb[67];
    float wf[67], bf[67];
    for (int i = 0; i < D; i++) {
        wb[i] = ms_f32_to_bf16(frand() + 1.5f);
        wf[i] = ms_bf16_to_f32(wb[i]);
        bf[i] = frand();
    }
    ms_tensor w = ms_tensor_make(MS_BF16, 1, &D);
    w.data = wb;
    ms_tensor wb32 = ms_tensor_make(MS_F32, 1, &D);
    wb32.data = bf;
    double *ref = malloc(sizeof(double) * (size_t)(R * D));
    float *x0 = malloc((size_t)(R * D) * 4);
    memcpy(x0, x.data, (size_t)(R * D) * 4);
    /* rmsnorm */
    CHECK(B->ops->rmsnorm(B, &x, &w, 1e-6f, &o, &E) == MS_OK);
    for (int64_t r = 0; r < R; r++) {
        double ss = 0;
        for (int64_t i = 0; i < D; i++) ss += (double)x0[r * D + i] * x0[r * D + i];
        double rs = 1.0 / sqrt(ss / D + 1e-6);
        for (int64_t i = 0; i < D; i++) ref[r * D + i] = wf[i] * x0[r * D + i] * rs;
    }
    CHECK(close_arr(o.data, ref, R * D, 1e-6, 1));
    /* add_rmsnorm: resid updated, out normed */
    CHECK(B->ops->add_rmsnorm(B, &x, &d, &w, 1e-5f, &o, &E) == MS_OK);
    for (int64_t i = 0; i < R * D; i++) x0[i] += ((float *)d.data)[i];
    CHECK(!memcmp(x0, x.data, (size_t)(R * D) * 4));
    for (int64_t r = 0; r < R; r++) {
        double ss = 0;
        for (int64_t i = 0; i < D; i++) ss += (double)x0[r * D + i] * x0[r * D + i];
        double rs = 1.0 / sqrt(ss / D + 1e-5);
        for (int64_t i = 0; i < D; i++) ref[r * D + i] = wf[i] * x0[r * D + i] * rs;
    }
    CHECK(close_arr(o.data, ref, R * D, 1e-6, 1));
    /* layernorm with bias, in place */
    CHECK(B->ops->layernorm(B, &x, &w, &wb32, 1e-6f, &x, &E) == MS_OK);
    for (int64_t r = 0; r < R; r++) {
        double m = 0, v = 0;
        for (int64_t i = 0; i < D; i++) m += x0[r * D + i];
        m /= D;
        for (int64_t i = 0; i < D; i++) v += (x0[r * D + i] - m) * (x0[r * D + i] - m);
        v /= D;
        for (int64_t i = 0; i < D; i++) ref[r * D + i] = (x0[r * D + i] - m) / sqrt(v + 1e-6) * wf[i] + bf[i];
    }
    CHECK(close_arr(x.data, ref, R * D, 1e-6, 1));
    free(ref);
    free(x0);
    t_free(&x);
    t_free(&d);
    t_free(&o);
}

static void test_elementwise(void) {
    int64_t T = 9, C = 23;
    ms_tensor a = t_f32(2, T, C, 0), b = t_f32(2, T, C, 0), o = t_f32(2, T, C, 0);
    fill(a.data, T * C, 4.0f);
    fill(b.data, T * C, 2.0f);
    float *a0 = malloc((size_t)(T * C) * 4);
    memcpy(a0, a.data, (size_t)(T * C) * 4);
    double *ref = malloc(sizeof(double) * (size_t)(T * C));
    CHECK(B->ops->silu_mul(B, &a, &b, &o, &E) == MS_OK);
    for (int64_t i = 0; i < T * C; i++) {
        double g = a0[i];
        ref[i] = g / (1 + exp(-g)) * ((float *)b.data)[i];
    }
    CHECK(close_arr(o.data, ref, T * C, 1e-6, 1));
    CHECK(B->ops->add(B, &a, &b, &E) == MS_OK);
    for (int64_t i = 0; i < T * C; i++) ref[i] = (double)a0[i] + ((float *)b.data)[i];
    CHECK(close_arr(a.data, ref, T * C, 1e-7, 1));
    CHECK(B->ops->scale(B, &a, 0.5f, &E) == MS_OK);
    for (int64_t i = 0; i < T * C; i++) ref[i] *= 0.5;
    CHECK(close_arr(a.data, ref, T * C, 1e-7, 1));
    /* copy_cols then set_cols back into a zeroed tensor at another offset */
    ms_tensor part = t_f32(2, T, 5, 0);
    CHECK(B->ops->copy_cols(B, &b, 7, 5, &part, &E) == MS_OK);
    int ok = 1;
    for (int64_t t = 0; t < T; t++)
        ok &= !memcmp((float *)part.data + t * 5, (float *)b.data + t * C + 7, 20);
    CHECK(ok);
    memset(o.data, 0, (size_t)(T * C) * 4);
    CHECK(B->ops->set_cols(B, &part, 18, &o, &E) == MS_OK);
    ok = 1;
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < C; c++) {
            float want = (c >= 18) ? ((float *)b.data)[t * C + 7 + c - 18] : 0.0f;
            ok &= ((float *)o.data)[t * C + c] == want;
        }
    CHECK(ok);
    free(a0);
    free(ref);
    t_free(&a);
    t_free(&b);
    t_free(&o);
    t_free(&part);
}

static void ref_rope(double *v, int pos, int rot_dim, int interleaved, double theta) {
    int half = rot_dim / 2;
    double tmp[256];
    for (int i = 0; i < rot_dim; i++) tmp[i] = v[i];
    for (int i = 0; i < half; i++) {
        double ang = pos * pow(theta, -2.0 * i / rot_dim);
        if (interleaved) {
            v[2 * i] = tmp[2 * i] * cos(ang) - tmp[2 * i + 1] * sin(ang);
            v[2 * i + 1] = tmp[2 * i + 1] * cos(ang) + tmp[2 * i] * sin(ang);
        } else {
            v[i] = tmp[i] * cos(ang) - tmp[i + half] * sin(ang);
            v[i + half] = tmp[i + half] * cos(ang) + tmp[i] * sin(ang);
        }
    }
}

static void test_rope(void) {
    int64_t T = 4, nh = 3, d = 24;
    int32_t pos[4] = {0, 1, 17, 301};
    for (int il = 0; il < 2; il++) {
        ms_rope_cfg rc = {il ? 8 : 0, il ? 16 : 12, il, il ? 1e6 : 1e4};
        ms_tensor x = t_f32(3, T, nh, d);
        fill(x.data, T * nh * d, 1.0f);
        double *ref = malloc(sizeof(double) * (size_t)(T * nh * d));
        for (int64_t i = 0; i < T * nh * d; i++) ref[i] = ((float *)x.data)[i];
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < nh; h++) ref_rope(ref + (t * nh + h) * d + rc.rot_off, pos[t], rc.rot_dim, il, rc.theta);
        CHECK(B->ops->rope(B, &x, pos, &rc, &E) == MS_OK);
        CHECK_MSG(close_arr(x.data, ref, T * nh * d, 2e-5, 1), "interleaved %d", il);
        free(ref);
        t_free(&x);
    }
}

/* The fused indexer-key op (LayerNorm + RoPE + cache store) against the three ops it replaces, bit for
 * bit (key row and whole cache, so rows it must not touch are checked too), and both against a double
 * LayerNorm + RoPE. T tokens at positions from 37 on, slots with gaps in a cache of 3T + 5 rows. */
static void idx_k_prep_case(int64_t T, int64_t d, int rot_off, int rot_dim, int il, int with_bias) {
    const int64_t S = 3 * T + 5;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T), *slot = malloc(sizeof(int32_t) * (size_t)T);
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(37 + 5 * t), slot[t] = (int32_t)(S - 1 - 3 * t);
    ms_tensor x = t_f32(2, T, d, 0), xr = t_f32(2, T, d, 0), c = t_f32(2, S, d, 0), cr = t_f32(2, S, d, 0);
    ms_tensor w = t_f32(1, d, 0, 0), bias = t_f32(1, d, 0, 0);
    fill(x.data, T * d, 3.0f);
    fill(c.data, S * d, 1.0f);
    fill(w.data, d, 1.0f);
    fill(bias.data, d, 0.5f);
    memcpy(xr.data, x.data, sizeof(float) * (size_t)(T * d));
    memcpy(cr.data, c.data, sizeof(float) * (size_t)(S * d));
    double *ref = malloc(sizeof(double) * (size_t)(T * d));
    for (int64_t t = 0; t < T; t++) {
        const float *xv = (const float *)x.data + t * d;
        double m = 0, v = 0;
        for (int64_t i = 0; i < d; i++) m += xv[i];
        m /= (double)d;
        for (int64_t i = 0; i < d; i++) v += (xv[i] - m) * (xv[i] - m);
        double rs = 1.0 / sqrt(v / (double)d + 1e-6);
        for (int64_t i = 0; i < d; i++)
            ref[t * d + i] = (xv[i] - m) * rs * ((float *)w.data)[i] + (with_bias ? ((float *)bias.data)[i] : 0.0);
        ref_rope(ref + t * d + rot_off, pos[t], rot_dim, il, 1e4);
    }
    ms_rope_cfg rc = {rot_off, rot_dim, il, 1e4};
    const ms_tensor *bp = with_bias ? &bias : NULL;
    CHECK(B->ops->idx_k_prep(B, &x, &w, bp, 1e-6f, pos, &rc, &c, slot, &E) == MS_OK);
    ms_tensor xr3 = ms_tensor_reshape(&xr, 3, (int64_t[]){T, 1, d});
    CHECK(B->ops->layernorm(B, &xr, &w, bp, 1e-6f, &xr, &E) == MS_OK);
    CHECK(B->ops->rope(B, &xr3, pos, &rc, &E) == MS_OK);
    CHECK(B->ops->kv_store(B, &cr, &xr, slot, &E) == MS_OK);
    CHECK_MSG(!memcmp(x.data, xr.data, sizeof(float) * (size_t)(T * d)), "key rows T %lld d %lld", (long long)T, (long long)d);
    CHECK_MSG(!memcmp(c.data, cr.data, sizeof(float) * (size_t)(S * d)), "cache T %lld d %lld", (long long)T, (long long)d);
    CHECK_MSG(close_arr(x.data, ref, T * d, 2e-5, 1), "vs double T %lld d %lld", (long long)T, (long long)d);
    /* a rotation outside the row is refused with a status, nothing written */
    ms_rope_cfg bad = {(int)d - 2, 4, il, 1e4};
    CHECK(B->ops->idx_k_prep(B, &x, &w, bp, 1e-6f, pos, &bad, &c, slot, &E) == MS_ERR_UNSUPPORTED);
    CHECK(!memcmp(x.data, xr.data, sizeof(float) * (size_t)(T * d)));
    free(ref);
    free(pos);
    free(slot);
    t_free(&x); t_free(&xr); t_free(&c); t_free(&cr); t_free(&w); t_free(&bias);
}

static void test_idx_k_prep(void) {
    const int64_t Ts[3] = {1, 3, 17};
    for (int i = 0; i < 3; i++) {
        idx_k_prep_case(Ts[i], 128, 0, 64, 0, 1); /* GLM-5: 128-wide keys, NeoX rotation of the first 64 */
        idx_k_prep_case(Ts[i], 128, 0, 64, 1, 0); /* interleaved pairs, no bias */
        idx_k_prep_case(Ts[i], 24, 8, 8, 1, 1);   /* odd: rotation in the middle of a 24-wide row */
        idx_k_prep_case(Ts[i], 37, 5, 0, 0, 1);   /* no rotary dims, a width no multiple of anything */
    }
}

/* ------------------------------------------------------------------ paged attention */

/* Two sequences in one step: seq 0 decodes 3 new tokens at positions 6..8 on top of 6 cached ones,
 * seq 1 is a 5-token prefill. Pages are scattered (page_size 4). */
#define PS 4
#define NPAGES 16
static int32_t g_bt[2 * 4] = {5, 2, 9, 0, 0, 7, 0, 0};
static int32_t g_pos[8] = {6, 7, 8, 0, 1, 2, 3, 4};
static int32_t g_seq[8] = {0, 0, 0, 1, 1, 1, 1, 1};
static int32_t g_start[3] = {0, 3, 8};
static int32_t g_ctx[2] = {9, 5};
static int32_t g_slots[8];
static ms_batch g_batch;
static ms_attn_meta g_meta;

static int slot_of(int s, int p) { return g_bt[s * 4 + p / PS] * PS + p % PS; }

static void setup_batch(void) {
    for (int t = 0; t < 8; t++) g_slots[t] = slot_of(g_seq[t], g_pos[t]);
    g_batch = (ms_batch){.n_tokens = 8, .n_seqs = 2, .positions = g_pos, .seq_start = g_start, .ctx_len = g_ctx,
                         .slot_mapping = g_slots, .block_table = g_bt, .max_blocks = 4, .page_size = PS};
    g_meta = (ms_attn_meta){.host = &g_batch, .max_ctx = 9, .positions_d = g_pos, .seq_start_d = g_start,
                            .ctx_len_d = g_ctx, .slot_mapping_d = g_slots, .block_table_d = g_bt, .token_seq_d = g_seq};
}

static void test_gqa(void) {
    setup_batch();
    const int64_t nh = 6, nkv = 2, d = 20, S = NPAGES * PS, T = 8;
    ms_tensor kc = t_f32(3, S, nkv, d), vc = t_f32(3, S, nkv, d);
    fill(kc.data, S * nkv * d, 1.0f); /* cached positions hold random keys already */
    fill(vc.data, S * nkv * d, 1.0f);
    ms_tensor kn = t_f32(2, T, nkv * d, 0), vn = t_f32(2, T, nkv * d, 0), q = t_f32(3, T, nh, d), o = t_f32(3, T, nh, d);
    fill(kn.data, T * nkv * d, 1.0f);
    fill(vn.data, T * nkv * d, 1.0f);
    fill(q.data, T * nh * d, 1.0f);
    CHECK(B->ops->kv_store(B, &kc, &kn, g_slots, &E) == MS_OK);
    CHECK(B->ops->kv_store(B, &vc, &vn, g_slots, &E) == MS_OK);
    int ok = 1;
    for (int t = 0; t < T; t++) ok &= !memcmp((float *)kc.data + g_slots[t] * nkv * d, (float *)kn.data + t * nkv * d, (size_t)(nkv * d) * 4);
    CHECK(ok);
    int32_t badslot[8] = {0, 0, 0, 0, 0, 0, 0, (int32_t)S};
    CHECK(B->ops->kv_store(B, &kc, &kn, badslot, &E) == MS_ERR_INVALID);
    float scale = 0.3f;
    CHECK(B->ops->attn_gqa(B, &q, &kc, &vc, &g_meta, scale, &o, &E) == MS_OK);
    double *ref = calloc((size_t)(T * nh * d), sizeof(double));
    const float *K = kc.data, *V = vc.data, *Q = q.data;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            int g = h / (nh / nkv), s = g_seq[t], n = g_pos[t] + 1;
            double sc[16], mx = -1e300, sum = 0;
            for (int p = 0; p < n; p++) {
                double v = 0;
                for (int i = 0; i < d; i++) v += (double)Q[(t * nh + h) * d + i] * K[(slot_of(s, p) * nkv + g) * d + i];
                sc[p] = v * scale;
                if (sc[p] > mx) mx = sc[p];
            }
            for (int p = 0; p < n; p++) sum += (sc[p] = exp(sc[p] - mx));
            for (int p = 0; p < n; p++)
                for (int i = 0; i < d; i++) ref[(t * nh + h) * d + i] += sc[p] / sum * V[(slot_of(s, p) * nkv + g) * d + i];
        }
    CHECK(close_arr(o.data, ref, T * nh * d, 1e-5, 1));
    free(ref);
    t_free(&kc);
    t_free(&vc);
    t_free(&kn);
    t_free(&vn);
    t_free(&q);
    t_free(&o);
}

static void test_mla(void) {
    setup_batch();
    const int64_t nh = 5, kvl = 32, dr = 8, W = kvl + dr, S = NPAGES * PS, T = 8;
    ms_tensor lat = t_f32(2, S, W, 0), q = t_f32(3, T, nh, W), o = t_f32(3, T, nh, kvl);
    fill(lat.data, S * W, 1.0f);
    fill(q.data, T * nh * W, 0.5f);
    /* sparse: each query keeps at most 3 keys; -1 pads; one entry in the future must be ignored */
    int32_t topk[8 * 3];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < 3; j++) topk[t * 3 + j] = j <= g_pos[t] ? (int32_t)((g_pos[t] - j * 2 + 100) % (g_pos[t] + 1)) : -1;
    topk[0 * 3 + 2] = 8; /* token 0 is at position 6: position 8 is in its future */
    for (int sparse = 0; sparse < 2; sparse++) {
        float scale = 0.25f;
        CHECK(B->ops->mla_attn(B, &q, &lat, &g_meta, sparse ? topk : NULL, 3, (int)kvl, scale, &o, &E) == MS_OK);
        double *ref = calloc((size_t)(T * nh * kvl), sizeof(double));
        const float *L = lat.data, *Q = q.data;
        for (int t = 0; t < T; t++) {
            int s = g_seq[t], keys[16], n = 0;
            if (sparse) {
                for (int j = 0; j < 3; j++) {
                    int p = topk[t * 3 + j];
                    int dup = 0;
                    for (int u = 0; u < j; u++) dup |= topk[t * 3 + u] == p;
                    (void)dup;
                    if (p >= 0 && p <= g_pos[t]) keys[n++] = p;
                }
            } else {
                for (int p = 0; p <= g_pos[t]; p++) keys[n++] = p;
            }
            for (int h = 0; h < nh; h++) {
                double sc[16], mx = -1e300, sum = 0;
                for (int j = 0; j < n; j++) {
                    double v = 0;
                    for (int i = 0; i < W; i++) v += (double)Q[(t * nh + h) * W + i] * L[slot_of(s, keys[j]) * W + i];
                    sc[j] = v * scale;
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int j = 0; j < n; j++) sum += (sc[j] = exp(sc[j] - mx));
                for (int j = 0; j < n; j++)
                    for (int i = 0; i < kvl; i++) ref[(t * nh + h) * kvl + i] += sc[j] / sum * L[slot_of(s, keys[j]) * W + i];
            }
        }
        CHECK_MSG(close_arr(o.data, ref, T * nh * kvl, 1e-5, 1), "sparse %d", sparse);
        free(ref);
    }
    t_free(&lat);
    t_free(&q);
    t_free(&o);
}

static void test_mla_heads(void) {
    const int nh = 3, dn = 12, dr = 8, dv = 10, kvl = 48;
    const int Ts[3] = {1, 7, 40};
    for (int f = 0; f < 2; f++)
        for (int ti = 0; ti < 3; ti++) {
            int64_t T = Ts[ti];
            qlin kvb = make_linear(f ? MS_WFMT_FP8 : MS_WFMT_PLAIN, MS_BF16, (int64_t)nh * (dn + dv), kvl, 0);
            float *Wd = malloc(sizeof(float) * (size_t)(nh * (dn + dv) * kvl));
            for (int64_t n = 0; n < nh * (dn + dv); n++) ms_linear_dequant_row(&kvb.W, n, Wd + n * kvl);
            ms_tensor q = t_f32(3, T, nh, dn + dr), qa = t_f32(3, T, nh, kvl + dr);
            fill(q.data, T * nh * (dn + dr), 1.0f);
            CHECK(B->ops->mla_absorb_q(B, &kvb.W, &q, nh, dn, dr, dv, NULL, NULL, &qa, &E) == MS_OK);
            double *ref = calloc((size_t)(T * nh * (kvl + dr)), sizeof(double));
            const float *Q = q.data;
            for (int64_t t = 0; t < T; t++)
                for (int h = 0; h < nh; h++) {
                    double *o = ref + (t * nh + h) * (kvl + dr);
                    for (int j = 0; j < kvl; j++)
                        for (int i = 0; i < dn; i++) o[j] += (double)Q[(t * nh + h) * (dn + dr) + i] * Wd[(h * (dn + dv) + i) * kvl + j];
                    for (int i = 0; i < dr; i++) o[kvl + i] = Q[(t * nh + h) * (dn + dr) + dn + i];
                }
            CHECK_MSG(close_arr(qa.data, ref, T * nh * (kvl + dr), 2e-6, 1), "absorb fmt %d T %lld", f, (long long)T);
            free(ref);
            ms_tensor ol = t_f32(3, T, nh, kvl), ov = t_f32(2, T, nh * dv, 0);
            fill(ol.data, T * nh * kvl, 1.0f);
            CHECK(B->ops->mla_v_up(B, &kvb.W, &ol, nh, dn, dv, &ov, &E) == MS_OK);
            ref = calloc((size_t)(T * nh * dv), sizeof(double));
            const float *OL = ol.data;
            for (int64_t t = 0; t < T; t++)
                for (int h = 0; h < nh; h++)
                    for (int v = 0; v < dv; v++) {
                        double s = 0;
                        for (int j = 0; j < kvl; j++) s += (double)OL[(t * nh + h) * kvl + j] * Wd[(h * (dn + dv) + dn + v) * kvl + j];
                        ref[t * nh * dv + h * dv + v] = s;
                    }
            CHECK_MSG(close_arr(ov.data, ref, T * nh * dv, 2e-6, 1), "v_up fmt %d T %lld", f, (long long)T);
            free(ref);
            free(Wd);
            free_linear(&kvb);
            t_free(&q);
            t_free(&qa);
            t_free(&ol);
            t_free(&ov);
        }
}

/* The absorbed query with its rope part rotated by the op against the rope op on q followed by the
 * plain absorb, bit for bit; q itself must come back unrotated. T tokens at positions from 11 on. */
static void absorb_rope_case(int64_t T, int nh, int dn, int dr, int dv, int kvl, ms_rope_cfg rc) {
    qlin kvb = make_linear(MS_WFMT_FP8, MS_BF16, (int64_t)nh * (dn + dv), kvl, 0);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(11 + 7 * t);
    const int64_t nq = T * nh * (dn + dr), no = T * nh * (kvl + dr);
    ms_tensor q = t_f32(3, T, nh, dn + dr), qr = t_f32(3, T, nh, dn + dr), o = t_f32(3, T, nh, kvl + dr),
              orf = t_f32(3, T, nh, kvl + dr);
    fill(q.data, nq, 1.0f);
    memcpy(qr.data, q.data, sizeof(float) * (size_t)nq);
    CHECK(B->ops->mla_absorb_q(B, &kvb.W, &q, nh, dn, dr, dv, pos, &rc, &o, &E) == MS_OK);
    CHECK(B->ops->rope(B, &qr, pos, &rc, &E) == MS_OK);
    CHECK(B->ops->mla_absorb_q(B, &kvb.W, &qr, nh, dn, dr, dv, NULL, NULL, &orf, &E) == MS_OK);
    CHECK_MSG(!memcmp(o.data, orf.data, sizeof(float) * (size_t)no), "T %lld dn %d dr %d", (long long)T, dn, dr);
    /* q unrotated: rotating it now gives the reference's q */
    if (rc.rot_dim) CHECK(memcmp(q.data, qr.data, sizeof(float) * (size_t)nq));
    CHECK(B->ops->rope(B, &q, pos, &rc, &E) == MS_OK);
    CHECK(!memcmp(q.data, qr.data, sizeof(float) * (size_t)nq));
    /* rotary columns outside the rope part: refused */
    ms_rope_cfg bad = rc;
    bad.rot_off = dn - 2;
    CHECK(B->ops->mla_absorb_q(B, &kvb.W, &q, nh, dn, dr, dv, pos, &bad, &o, &E) == MS_ERR_INVALID);
    free_linear(&kvb);
    free(pos);
    t_free(&q); t_free(&qr); t_free(&o); t_free(&orf);
}

static void test_absorb_rope(void) {
    const int64_t Ts[3] = {1, 3, 17};
    for (int i = 0; i < 3; i++) {
        absorb_rope_case(Ts[i], 4, 32, 64, 24, 64, (ms_rope_cfg){32, 64, 0, 1e6});     /* GLM-5's rope part (64, NeoX) */
        absorb_rope_case(Ts[i], 4, 32, 64, 24, 64, (ms_rope_cfg){32, 64, 1, 1e4});     /* interleaved */
        absorb_rope_case(Ts[i], 3, 24, 8, 20, 40, (ms_rope_cfg){24, 8, 1, 1e4});       /* odd fixture dims */
        absorb_rope_case(Ts[i], 3, 12, 16, 10, 48, (ms_rope_cfg){16, 8, 0, 1e4});      /* rotation inside the part */
    }
}

static void test_indexer(void) {
    setup_batch();
    const int64_t nih = 4, d = 16, S = NPAGES * PS, T = 8;
    ms_tensor kc = t_f32(2, S, d, 0), q = t_f32(3, T, nih, d), w = t_f32(2, T, nih, 0);
    fill(kc.data, S * d, 1.0f);
    fill(q.data, T * nih * d, 1.0f);
    fill(w.data, T * nih, 1.0f);
    for (int topk = 2; topk <= 6; topk += 4) {
        int32_t out[8 * 6];
        CHECK(B->ops->indexer_topk(B, &q, &w, &kc, &g_meta, topk, out, &E) == MS_OK);
        const float *K = kc.data, *Q = q.data, *Wt = w.data;
        for (int t = 0; t < T; t++) {
            int s = g_seq[t], n = g_pos[t] + 1;
            double sc[16];
            for (int p = 0; p < n; p++) {
                double acc = 0;
                for (int j = 0; j < nih; j++) {
                    double v = 0;
                    for (int i = 0; i < d; i++) v += (double)Q[(t * nih + j) * d + i] * K[slot_of(s, p) * d + i];
                    v /= sqrt((double)d);
                    if (v > 0) acc += Wt[t * nih + j] * v;
                }
                sc[p] = acc;
            }
            int want = n < topk ? n : topk, got = 0, ok = 1;
            unsigned char sel[16] = {0};
            for (int j = 0; j < topk; j++) {
                int p = out[t * topk + j];
                if (p < 0) continue;
                ok &= p < n && !sel[p];
                if (p < n) sel[p] = 1;
                got++;
            }
            ok &= got == want;
            /* every selected key scores at least as high as every unselected one */
            for (int a = 0; a < n; a++)
                for (int b = 0; b < n; b++)
                    if (sel[a] && !sel[b]) ok &= sc[a] >= sc[b] - 1e-5;
            CHECK_MSG(ok, "token %d topk %d", t, topk);
        }
    }
    t_free(&kc);
    t_free(&q);
    t_free(&w);
}

/* ------------------------------------------------------------------ routing */

static void ref_route(const double *logit, const float *bias, const ms_route_cfg *rc, int *ids, double *w) {
    int E_ = rc->n_experts;
    double s[64], ch[64];
    for (int i = 0; i < E_; i++) {
        s[i] = 1 / (1 + exp(-logit[i]));
        ch[i] = s[i] + bias[i];
    }
    int gs = E_ / rc->n_group;
    if (rc->n_group > 1) {
        double gsc[64];
        int keep[64] = {0};
        for (int g = 0; g < rc->n_group; g++) {
            double a = -1e300, b = -1e300;
            for (int i = g * gs; i < (g + 1) * gs; i++) {
                if (ch[i] > a) { b = a; a = ch[i]; } else if (ch[i] > b) b = ch[i];
            }
            gsc[g] = a + b;
        }
        for (int j = 0; j < rc->topk_group; j++) {
            int best = -1;
            for (int g = 0; g < rc->n_group; g++) if (!keep[g] && (best < 0 || gsc[g] > gsc[best])) best = g;
            keep[best] = 1;
        }
        for (int g = 0; g < rc->n_group; g++)
            if (!keep[g]) for (int i = g * gs; i < (g + 1) * gs; i++) ch[i] = -INFINITY;
    }
    int taken[64] = {0};
    double sum = 0;
    for (int j = 0; j < rc->topk; j++) {
        int best = -1;
        for (int i = 0; i < E_; i++) if (!taken[i] && (best < 0 || ch[i] > ch[best])) best = i;
        taken[best] = 1;
        ids[j] = best;
        w[j] = s[best];
        sum += s[best];
    }
    for (int j = 0; j < rc->topk; j++) w[j] = (rc->norm_topk_prob ? w[j] / (sum + 1e-20) : w[j]) * rc->routed_scaling_factor;
}

static void test_router(void) {
    const int64_t T = 7, H = 40;
    const int cfgs[3][4] = {{16, 4, 1, 1}, {32, 6, 8, 3}, {24, 3, 4, 2}}; /* experts, topk, n_group, topk_group */
    for (int c = 0; c < 3; c++) {
        int E_ = cfgs[c][0];
        ms_route_cfg rc = {E_, cfgs[c][1], cfgs[c][2], cfgs[c][3], c != 2, c == 0 ? 2.5f : 1.0f};
        qlin gate = make_linear(MS_WFMT_PLAIN, MS_BF16, E_, H, 0);
        ms_tensor x = t_f32(2, T, H, 0);
        fill(x.data, T * H, 0.3f);
        float bias[64];
        for (int i = 0; i < E_; i++) bias[i] = frand() * 0.5f;
        ms_tensor bt = ms_tensor_make(MS_F32, 1, (int64_t[]){E_});
        bt.data = bias;
        int32_t ids[7 * 8];
        float w[7 * 8];
        CHECK(B->ops->router(B, &x, &gate.W, &bt, &rc, ids, w, &E) == MS_OK);
        double *lg = malloc(sizeof(double) * (size_t)(T * E_));
        ref_linear(&gate.W, x.data, T, lg);
        int ok = 1;
        for (int t = 0; t < T; t++) {
            int rid[8];
            double rw[8];
            ref_route(lg + t * E_, bias, &rc, rid, rw);
            /* same set with the same weights (order free) */
            for (int j = 0; j < rc.topk; j++) {
                int found = 0;
                for (int u = 0; u < rc.topk; u++)
                    if (ids[t * rc.topk + u] == rid[j]) found = fabs(w[t * rc.topk + u] - rw[j]) < 1e-5;
                ok &= found;
            }
        }
        CHECK_MSG(ok, "config %d", c);
        free(lg);
        free_linear(&gate);
        t_free(&x);
    }
}

static void test_checks(void) {
    ms_tensor x = t_f32(2, 4, 9, 0);
    fill(x.data, 36, 1.0f);
    int64_t bad = 7;
    CHECK(B->ops->find_nonfinite(B, &x, &bad, &E) == MS_OK && bad == -1);
    ((float *)x.data)[2 * 9 + 4] = NAN;
    ((float *)x.data)[3 * 9 + 1] = INFINITY;
    CHECK(B->ops->find_nonfinite(B, &x, &bad, &E) == MS_OK && bad == 2);
    ((float *)x.data)[2 * 9 + 4] = 0;
    CHECK(B->ops->find_nonfinite(B, &x, &bad, &E) == MS_OK && bad == 3);
    ((float *)x.data)[3 * 9 + 1] = 0;
    ((float *)x.data)[0 * 9 + 5] = 50;
    ((float *)x.data)[1 * 9 + 8] = 50;
    ((float *)x.data)[1 * 9 + 0] = 50;
    int32_t am[4];
    CHECK(B->ops->argmax(B, &x, am, &E) == MS_OK);
    CHECK(am[0] == 5 && am[1] == 0);
    t_free(&x);
}

/* The attention registry on the CPU: auto resolves to the cpu implementation for every kind, every
 * implementation names a reason when it refuses, the flag names follow SGLang's, a CUDA
 * implementation (when compiled in) is refused with the alternatives, and a call of a kind the
 * implementation does not run fails cleanly. */
static void test_attn_registry(void) {
    for (int k = 0; k < MS_ATTN_KINDS; k++) {
        ms_attn_shape s = {(ms_attn_kind)k, 8, k == MS_ATTN_GQA ? 2 : 1, 64, 64, k == MS_ATTN_DSA ? 16 : 0, 4, 64,
                           MS_F32, 0};
        const ms_attn_impl *r = NULL;
        CHECK(ms_attn_resolve(B, ms_attn_flag((ms_attn_kind)k, 1), "auto", &s, &r, &E) == MS_OK && r &&
              !strcmp(r->name, "cpu"));
        for (const ms_attn_impl *const *ip = ms_attn_impls(); *ip; ip++) {
            char why[256] = "";
            int ok = ms_attn_ok(*ip, B, &s, why, sizeof why);
            CHECK_MSG(ok == !strcmp((*ip)->backend, "cpu"), "%s on cpu: %d (%s)", (*ip)->name, ok, why);
            CHECK_MSG(ok || why[0], "%s refused without a reason", (*ip)->name);
            if (!ok) {
                CHECK(ms_attn_resolve(B, "--attention-backend", (*ip)->name, &s, &r, &E) == MS_ERR_UNSUPPORTED);
                CHECK_MSG(strstr(E.msg, "--attention-backend") && strstr(E.msg, "those that can: cpu"), "%s", E.msg);
            }
        }
    }
    CHECK_STR(ms_attn_flag(MS_ATTN_GQA, 0), "--attention-backend");
    CHECK_STR(ms_attn_flag(MS_ATTN_DSA, 0), "--nsa-prefill-backend");
    CHECK_STR(ms_attn_flag(MS_ATTN_DSA, 1), "--nsa-decode-backend");
    /* an implementation that does not run a kind refuses the call (no kernel runs) */
    static const ms_attn_impl gqa_only = {"gqa_only", "cpu", "test", NULL, NULL, NULL, MS_ATTN_CAP_GQA};
    ms_attn_call c = {MS_ATTN_DSA, NULL, NULL, NULL, NULL, NULL, 0, 0, 1.f, NULL};
    CHECK(ms_attn_run(&gqa_only, B, &c, &E) == MS_ERR_UNSUPPORTED && strstr(E.msg, "DSA sparse attention"));
}

int main(void) {
    ms_dtype_init();
    if (ms_backend_create("cpu", -1, &B, &E) != MS_OK) {
        fprintf(stderr, "%s\n", E.msg);
        return 1;
    }
    RUN(test_simd_path);
    RUN(test_dequant_paths);
    RUN(test_dot_axpy_paths);
    RUN(test_linear_plain);
    RUN(test_linear_fp8);
    RUN(test_linear_nvfp4);
    RUN(test_linear_t_invariant);
    RUN(test_embed_gather);
    RUN(test_norms);
    RUN(test_elementwise);
    RUN(test_rope);
    RUN(test_idx_k_prep);
    RUN(test_gqa);
    RUN(test_mla);
    RUN(test_mla_heads);
    RUN(test_absorb_rope);
    RUN(test_indexer);
    RUN(test_attn_registry);
    RUN(test_router);
    RUN(test_checks);
    ms_backend_destroy(B);
    return TEST_SUMMARY();
}
