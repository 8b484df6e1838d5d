/* test_moe_cuda.c - every CUDA MoE runner (naive, grouped, decode) against the CPU runner on the
 * same weights and routing: all three weight formats, batch sizes 1, 3, 64 and 257, routing with
 * empty experts and with every token on one expert (up to 48 rows on it), and hidden/intermediate
 * sizes that are and are not multiples of the kernels' vector widths and super-steps; plus
 * routing where some ids are -1 (experts held by other ranks); prefill-scale cases (2048 tokens) for the grouped runner's tensor-core GEMM. CUDA outputs are
 * poisoned before each run. Without a GPU the program reports 0 cases and says so. */
#include "backend/backend.h"
#include "core/dtype.h"
#include "moe/moe.h"
#include "test.h"
#include "test_linear.h"
#ifdef MS_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static ms_backend *CPU, *GPU;
static ms_err E;
static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float rnd_f(void) { return ((float)(rnd_u32() & 0xffffff) / 16777216.0f) * 2.f - 1.f; }
#define R(call) CHECK_MSG((call) == MS_OK, "%s: %s", #call, E.msg)

/* One layer's experts in host memory plus its placed copies on both backends. */
typedef struct {
    int n, H, I;
    ms_wfmt fmt;
    ms_linear *hg, *hu, *hd; /* host views (kept for freeing) */
    ms_experts eg, ec;
    void **bufs;
    int nbufs;
} layer;

static void *keep(layer *L, size_t n) {
    void *p = malloc(n + 16);
    L->bufs[L->nbufs++] = p;
    return p;
}

static void fill_linear(layer *L, ms_linear *W, int64_t N, int64_t K) {
    test_linear_init(W, "test.expert", L->fmt, N, K);
    if (L->fmt == MS_WFMT_PLAIN) {
        W->w = ms_tensor_2d(MS_BF16, N, K);
        uint16_t *w = keep(L, (size_t)(N * K) * 2);
        for (int64_t i = 0; i < N * K; i++) w[i] = ms_f32_to_bf16(rnd_f() * 0.15f);
        W->w.data = w;
    } else if (L->fmt == MS_WFMT_FP8) {
        W->w = ms_tensor_2d(MS_F8E4M3, N, K);
        uint8_t *w = keep(L, (size_t)(N * K));
        for (int64_t i = 0; i < N * K; i++) {
            uint8_t q = (uint8_t)rnd_u32();
            if ((q & 0x7f) >= 0x70) q &= 0xbf; /* keep magnitudes moderate, never NaN */
            w[i] = q;
        }
        int64_t sn = (N + 127) / 128, sk = (K + 127) / 128;
        W->scale = ms_tensor_2d(MS_F32, sn, sk);
        float *s = keep(L, (size_t)(sn * sk) * 4);
        for (int64_t i = 0; i < sn * sk; i++) s[i] = 0.002f + 0.002f * (float)(rnd_u32() % 100) / 100.f;
        W->w.data = w;
        W->scale.data = s;
    } else {
        W->w = ms_tensor_2d(MS_U8, N, K / 2);
        uint8_t *w = keep(L, (size_t)(N * K / 2));
        for (int64_t i = 0; i < N * K / 2; i++) w[i] = (uint8_t)rnd_u32();
        W->scale = ms_tensor_2d(MS_F8E4M3, N, K / 16);
        uint8_t *s = keep(L, (size_t)(N * K / 16));
        for (int64_t i = 0; i < N * K / 16; i++) s[i] = (uint8_t)(0x28 + rnd_u32() % 0x18);
        W->scale2 = 0.04f;
        W->w.data = w;
        W->scale.data = s;
    }
}

static void make_layer(layer *L, ms_wfmt fmt, int n, int H, int I) {
    memset(L, 0, sizeof *L);
    L->n = n; L->H = H; L->I = I; L->fmt = fmt;
    L->bufs = calloc((size_t)n * 6 + 4, sizeof(void *));
    L->hg = calloc((size_t)n, sizeof(ms_linear));
    L->hu = calloc((size_t)n, sizeof(ms_linear));
    L->hd = calloc((size_t)n, sizeof(ms_linear));
    for (int e = 0; e < n; e++) {
        fill_linear(L, &L->hg[e], I, H);
        fill_linear(L, &L->hu[e], I, H);
        fill_linear(L, &L->hd[e], H, I);
    }
    ms_experts *es[2] = {&L->eg, &L->ec};
    ms_backend *bs[2] = {GPU, CPU};
    for (int k = 0; k < 2; k++) {
        es[k]->n = n;
        es[k]->gate = malloc(sizeof(ms_linear) * (size_t)n);
        es[k]->up = malloc(sizeof(ms_linear) * (size_t)n);
        es[k]->down = malloc(sizeof(ms_linear) * (size_t)n);
        memcpy(es[k]->gate, L->hg, sizeof(ms_linear) * (size_t)n);
        memcpy(es[k]->up, L->hu, sizeof(ms_linear) * (size_t)n);
        memcpy(es[k]->down, L->hd, sizeof(ms_linear) * (size_t)n);
        es[k]->prepared = NULL;
        for (int e = 0; e < n; e++) {
            R(bs[k]->ops->place_linear(bs[k], &es[k]->gate[e], &E));
            R(bs[k]->ops->place_linear(bs[k], &es[k]->up[e], &E));
            R(bs[k]->ops->place_linear(bs[k], &es[k]->down[e], &E));
        }
    }
}

static void free_layer(layer *L) {
    ms_experts *es[2] = {&L->eg, &L->ec};
    ms_backend *bs[2] = {GPU, CPU};
    for (int k = 0; k < 2; k++) {
        for (int e = 0; e < L->n; e++) {
            bs[k]->ops->unplace_linear(bs[k], &es[k]->gate[e]);
            bs[k]->ops->unplace_linear(bs[k], &es[k]->up[e]);
            bs[k]->ops->unplace_linear(bs[k], &es[k]->down[e]);
        }
        free(es[k]->gate); free(es[k]->up); free(es[k]->down);
    }
    for (int i = 0; i < L->nbufs; i++) free(L->bufs[i]);
    free(L->bufs); free(L->hg); free(L->hu); free(L->hd);
}

static ms_tensor upload(ms_backend *b, ms_dtype dt, int64_t rows, int64_t cols, const void *host) {
    ms_tensor t;
    int64_t s[2] = {rows, cols};
    if (ms_backend_alloc(b, &t, dt, 2, s, &E) != MS_OK) abort();
    size_t n = ms_tensor_nbytes(&t);
    if (host) {
        if (b->ops->upload(b, t.data, host, n, &E) != MS_OK) abort();
    } else {
        void *p = malloc(n);
        memset(p, 0xff, n);
        if (b->ops->upload(b, t.data, p, n, &E) != MS_OK) abort();
        free(p);
    }
    return t;
}

/* routing patterns: 0 random distinct experts, 1 everything on expert 1 (+ distinct fillers for
 * topk > 1: experts 1 and 3 only), 2 only the first half of the experts used (others empty). */
/* Pattern 4's rows per expert (1000 tokens, top-1, 16 experts): one row, tile edges (63/64/65,
 * 127/128/129 around the 64-row tiles and 128-row pairs), an empty expert and odd sizes. */
static const int skew_rows[16] = {1, 63, 64, 65, 127, 128, 129, 0, 1, 2, 17, 100, 150, 90, 40, 23};

static void make_routing(int pattern, int T, int topk, int n, int32_t *ids, float *w) {
    for (int t = 0; t < T; t++) {
        for (int k = 0; k < topk; k++) {
            int e;
            if (pattern == 1) e = k == 0 ? 1 : (k == 1 ? 3 : (4 + k) % n);
            else if (pattern == 4) { /* token t goes to the expert whose skew_rows range holds it */
                e = n - 1;
                for (int i = 0, c = 0; i < 16 && i < n; i++) {
                    c += skew_rows[i];
                    if (t < c) {
                        e = i;
                        break;
                    }
                }
            } else {
                int lim = pattern == 2 ? n / 2 : n;
                for (;;) {
                    e = (int)(rnd_u32() % (uint32_t)lim);
                    int dup = 0;
                    for (int j = 0; j < k; j++) dup |= ids[t * topk + j] == e;
                    if (!dup) break;
                }
            }
            if (pattern == 3 && rnd_u32() % 3 == 0) e = -1; /* expert parallelism: held by another rank */
            ids[t * topk + k] = e;
            w[t * topk + k] = 0.1f + 0.9f * (float)(rnd_u32() % 1000) / 1000.f;
        }
    }
}

/* shared: expert n - 1 is a folded shared expert (ms_experts.shared_last on the GPU runner, which gets
 * the top-k ids only; the CPU runner gets it appended as column topk with weight 1), routing over the
 * other n - 1 experts. */
static int OUT_F32; /* the GPU runner writes F32 (as the forward's delta) instead of BF16 */
/* relative error allowed (max |gpu - cpu| over max |cpu|), and the largest seen since it was reset */
static double TOL = 2e-2, worst_rel;

static void run_case_sh(layer *L, const ms_moe_runner *cpu_r, const ms_moe_runner *gr, int T, int topk, int pattern,
                        int shared) {
    int H = L->H, n = L->n;
    float *xf = malloc(sizeof(float) * (size_t)T * H);
    uint16_t *xb = malloc(2 * (size_t)T * H);
    for (int i = 0; i < T * H; i++) {
        xb[i] = ms_f32_to_bf16(rnd_f() * 2.f);
        xf[i] = ms_bf16_to_f32(xb[i]);
    }
    const int kc = topk + (shared ? 1 : 0); /* the CPU runner's columns */
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T * topk), *idc = malloc(sizeof(int32_t) * (size_t)T * kc);
    float *w = malloc(sizeof(float) * (size_t)T * topk), *wcp = malloc(sizeof(float) * (size_t)T * kc);
    make_routing(pattern, T, topk, shared ? n - 1 : n, ids, w);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < kc; j++) {
            idc[t * kc + j] = j < topk ? ids[t * topk + j] : n - 1;
            wcp[t * kc + j] = j < topk ? w[t * topk + j] : 1.f;
        }
    L->eg.shared_last = shared;
    ms_moe_shape s = {T, H, L->I, n, kc, L->fmt, MS_BF16};
    ms_tensor xg = upload(GPU, MS_BF16, T, H, xb), xc = upload(CPU, MS_F32, T, H, xf);
    ms_tensor ig = upload(GPU, MS_I32, T, topk, ids), ic = upload(CPU, MS_I32, T, kc, idc);
    ms_tensor wg = upload(GPU, MS_F32, T, topk, w), wc = upload(CPU, MS_F32, T, kc, wcp);
    ms_tensor og = upload(GPU, OUT_F32 ? MS_F32 : MS_BF16, T, H, NULL), oc = upload(CPU, MS_F32, T, H, NULL);
    size_t wsg = gr->workspace_size(GPU, &s), wsc = cpu_r->workspace_size(CPU, &s);
    ms_tensor Wg = upload(GPU, MS_U8, 1, (int64_t)wsg + 1, NULL), Wc = upload(CPU, MS_U8, 1, (int64_t)wsc + 1, NULL);
    char why[256] = "";
    CHECK_MSG(gr->supports(GPU, &s, why, sizeof why), "%s: %s", gr->name, why);
    R(gr->run(GPU, &L->eg, &xg, ig.data, wg.data, topk, &og, Wg.data, wsg, &E));
    R(cpu_r->run(CPU, &L->ec, &xc, ic.data, wc.data, kc, &oc, Wc.data, wsc, &E));
    L->eg.shared_last = 0;
    uint16_t *ob = malloc(4 * (size_t)T * H);
    float *orf = malloc(4 * (size_t)T * H);
    R(GPU->ops->sync(GPU, &E));
    R(GPU->ops->download(GPU, ob, og.data, (OUT_F32 ? 4 : 2) * (size_t)T * H, &E));
    R(CPU->ops->download(CPU, orf, oc.data, 4 * (size_t)T * H, &E));
    double md = 0, mr = 1e-6;
    int nan = 0;
    for (int i = 0; i < T * H; i++) {
        float a = OUT_F32 ? ((const float *)ob)[i] : ms_bf16_to_f32(ob[i]);
        if (!isfinite(a) || !isfinite(orf[i])) { nan++; continue; }
        if (fabs(a - orf[i]) > md) md = fabs(a - orf[i]);
        if (fabs(orf[i]) > mr) mr = fabs(orf[i]);
    }
    if (md / mr > worst_rel) worst_rel = md / mr;
    CHECK_MSG(nan == 0 && md / mr <= TOL,
              "%s fmt=%s T=%d topk=%d pattern=%d shared=%d H=%d I=%d: rel err %.3g, %d non-finite", gr->name,
              ms_wfmt_name(L->fmt, MS_BF16), T, topk, pattern, shared, H, L->I, md / mr, nan);
    free(ob); free(orf); free(xf); free(xb); free(ids); free(w); free(idc); free(wcp);
    ms_tensor *tg[5] = {&xg, &ig, &wg, &og, &Wg}, *tc[5] = {&xc, &ic, &wc, &oc, &Wc};
    for (int i = 0; i < 5; i++) { GPU->ops->free(GPU, tg[i]); CPU->ops->free(CPU, tc[i]); }
}
static void run_case(layer *L, const ms_moe_runner *cpu_r, const ms_moe_runner *gr, int T, int topk, int pattern) {
    run_case_sh(L, cpu_r, gr, T, topk, pattern, 0);
}

/* Makes a layer of n experts (fmt, H, I) and resolves and prepares the CPU runner and the CUDA runner
 * `name` for calls of T tokens, top-k; 0 (layer freed) when either is missing. */
static int layer_and_runners(layer *L, ms_wfmt fmt, int n, int H, int I, int T, int topk, const char *name,
                             const ms_moe_runner **cpu_r, const ms_moe_runner **gr) {
    make_layer(L, fmt, n, H, I);
    ms_moe_shape s = {T, H, I, n, topk, fmt, MS_BF16};
    *cpu_r = *gr = NULL;
    R(ms_moe_resolve(CPU, "cpu", &s, cpu_r, &E));
    R(ms_moe_resolve(GPU, name, &s, gr, &E));
    if (!*cpu_r || !*gr) {
        free_layer(L);
        return 0;
    }
    if ((*cpu_r)->prepare) R((*cpu_r)->prepare(CPU, &L->ec, &E));
    if ((*gr)->prepare) R((*gr)->prepare(GPU, &L->eg, &E));
    return 1;
}

static const char *const RUNNERS[3] = {"naive", "grouped", "decode"};

static void fmt_case(ms_wfmt fmt, int H, int I) {
    layer L;
    int n = 8;
    make_layer(&L, fmt, n, H, I);
    ms_moe_shape s = {64, H, I, n, 2, fmt, MS_BF16};
    const ms_moe_runner *cpu_r = NULL;
    R(ms_moe_resolve(CPU, "cpu", &s, &cpu_r, &E));
    if (!cpu_r) { free_layer(&L); return; }
    if (cpu_r->prepare) R(cpu_r->prepare(CPU, &L.ec, &E));
    for (int r = 0; r < 3; r++) {
        const ms_moe_runner *gr = NULL;
        R(ms_moe_resolve(GPU, RUNNERS[r], &s, &gr, &E));
        if (!gr) continue;
        if (gr->prepare) R(gr->prepare(GPU, &L.eg, &E));
        const int Ts[4] = {1, 3, 64, 257};
        for (int i = 0; i < 4; i++) {
            run_case(&L, cpu_r, gr, Ts[i], 2, 0);
            run_case(&L, cpu_r, gr, Ts[i], 2, 1);
            run_case(&L, cpu_r, gr, Ts[i], 3, 2);
            run_case(&L, cpu_r, gr, Ts[i], 3, 3); /* some ids -1 (MS_MOE_CAP_PARTIAL) */
        }
        run_case(&L, cpu_r, gr, 5, 1, 1);  /* every token on one expert */
        run_case(&L, cpu_r, gr, 48, 1, 1); /* 48 rows on one expert: several token passes in decode */
    }
    free_layer(&L);
}

/* Prefill scale for the grouped runner, whose GEMMs run on the mma.sync kernel (gemm_mma.cu) when the
 * format and K allow: 2048 tokens on 16 experts top-4 (about 512 rows and 8 64-row tiles per expert),
 * then everything on experts 1, 3, 6 and 7 (2048 rows each), half the experts empty, top-1 onto one
 * expert with 1000 rows (its last 128-row pair holds a single, partial tile), and top-1 with skewed
 * groups (1 row, 63/64/65, 127/128/129, empty: make_routing pattern 4). The gate/up kernel
 * computes 128 columns per block and down 256, so inter 320 / 352 and hidden 384 / 392 leave column
 * tails, and K = 352 / 344 / 392 leaves a partial 64-wide k-step. The first random routing is run again
 * with MS_CU_GG=old so the wmma fallback is checked at this scale too, and with MS_CU_GG=sync (with the
 * one-expert case) so the mma.sync kernel stays checked where FP8/NVFP4 take the wgmma one (sm_90), and
 * with MS_CU_GW_N=256 for the wgmma kernel's wide block. */
static void prefill_case(ms_wfmt fmt, int H, int I, int full) {
    layer L;
    const ms_moe_runner *cpu_r, *gr;
    if (!layer_and_runners(&L, fmt, 16, H, I, 2048, 4, "grouped", &cpu_r, &gr)) return;
#ifdef MS_HAVE_CUDA
    /* which kernel ran: FP8/NVFP4 on sm_90 take the wgmma form (when the build has it, as the H200 builds
     * do: CUDA_ARCHS carries sm_90a) for the grouped runner's GEMMs it covers; nothing else does */
    const long long gw0 = ms_cuda_gw_launches();
#endif
    run_case(&L, cpu_r, gr, 2048, 4, 0);
    run_case(&L, cpu_r, gr, 2048, 4, 1);
#ifdef MS_HAVE_CUDA
    /* the tensor-core kernels need K (H for gate/up, I for down) a multiple of 16 (FP8) / 32 (NVFP4) */
    const int al = fmt == MS_WFMT_FP8 ? 16 : 32;
    const int want_gw = fmt != MS_WFMT_PLAIN && GPU->gpu.cc_major == 9 && (H % al == 0 || I % al == 0);
    CHECK_MSG((ms_cuda_gw_launches() > gw0) == want_gw, "%s prefill: wgmma grouped GEMM launched %lld times (want %s)",
              ms_wfmt_name(fmt, MS_BF16), ms_cuda_gw_launches() - gw0, want_gw ? "some" : "none");
#endif
    if (full) {
        run_case(&L, cpu_r, gr, 2048, 4, 2);
        run_case(&L, cpu_r, gr, 1000, 1, 1);
        run_case(&L, cpu_r, gr, 1000, 1, 4); /* groups of 1, 63-65, 127-129 rows */
        setenv("MS_CU_GG", "old", 1);
        run_case(&L, cpu_r, gr, 2048, 4, 0);
        /* FP8 and NVFP4 on sm_90 take the wgmma kernel by default: the mma.sync one stays checked */
        setenv("MS_CU_GG", "sync", 1);
#ifdef MS_HAVE_CUDA
        const long long gw1 = ms_cuda_gw_launches();
#endif
        run_case(&L, cpu_r, gr, 2048, 4, 0);
        run_case(&L, cpu_r, gr, 1000, 1, 1);
        run_case(&L, cpu_r, gr, 1000, 1, 4);
#ifdef MS_HAVE_CUDA
        CHECK_MSG(ms_cuda_gw_launches() == gw1, "MS_CU_GG=sync still launched the wgmma grouped GEMM");
#endif
        unsetenv("MS_CU_GG");
        /* the wgmma kernel's other block width (256 weight rows); the caller's setting comes back */
        const char *gw = getenv("MS_CU_GW_N");
        char *gw_saved = gw ? strdup(gw) : NULL;
        setenv("MS_CU_GW_N", "256", 1);
        run_case(&L, cpu_r, gr, 2048, 4, 0);
        run_case(&L, cpu_r, gr, 1000, 1, 1);
        run_case(&L, cpu_r, gr, 1000, 1, 4);
        if (gw_saved) setenv("MS_CU_GW_N", gw_saved, 1);
        else unsetenv("MS_CU_GW_N");
        free(gw_saved);
    }
    free_layer(&L);
}

static void test_prefill_bf16(void) { prefill_case(MS_WFMT_PLAIN, 512, 320, 1); }
static void test_prefill_fp8(void) { prefill_case(MS_WFMT_FP8, 512, 320, 1); }
static void test_prefill_nvfp4(void) { prefill_case(MS_WFMT_NVFP4, 512, 320, 1); }
static void test_prefill_tails(void) {
    prefill_case(MS_WFMT_PLAIN, 392, 344, 0);
    prefill_case(MS_WFMT_FP8, 384, 352, 0);
    prefill_case(MS_WFMT_FP8, 336, 352, 0); /* K % 64 = 16: a last k-step with one FP8 piece of four */
    prefill_case(MS_WFMT_NVFP4, 384, 352, 0);
}

static void test_bf16(void) { fmt_case(MS_WFMT_PLAIN, 128, 96); }
static void test_fp8(void) { fmt_case(MS_WFMT_FP8, 256, 160); }
static void test_nvfp4(void) { fmt_case(MS_WFMT_NVFP4, 128, 96); }
/* H and I multiples of 128, MS_CU_GEMV_FP4=w8: one-token decode groups take the FP8 wgmma form
 * (gemv_w8.cu) on sm_90; the caller's setting comes back */
static void test_nvfp4_w8(void) {
    const char *f = getenv("MS_CU_GEMV_FP4");
    char *saved = f ? strdup(f) : NULL;
    setenv("MS_CU_GEMV_FP4", "w8", 1);
    setenv("MS_CU_MOE_FUSED", "0", 1); /* one-token calls would take the fused kernel first */
#ifdef MS_HAVE_CUDA
    const long long n0 = ms_cuda_w8_launches();
#endif
    fmt_case(MS_WFMT_NVFP4, 256, 384);
#ifdef MS_HAVE_CUDA
    const char *g = getenv("MS_CU_GEMV"); /* the form belongs to the tensor-core GEMV (not gv2's kernels) */
    const int want = GPU->gpu.cc_major == 9 && (!g || !strcmp(g, "mma"));
    CHECK_MSG((ms_cuda_w8_launches() > n0) == want, "NVFP4 one-token decode: FP8 wgmma form launched %lld times (want %s)",
              ms_cuda_w8_launches() - n0, want ? "some" : "none");
#endif
    if (saved) setenv("MS_CU_GEMV_FP4", saved, 1);
    else unsetenv("MS_CU_GEMV_FP4");
    free(saved);
    unsetenv("MS_CU_MOE_FUSED");
}

/* The fused one-token kernel (moe_fused.cu) through the decode runner: NVFP4 with hidden and
 * intermediate multiples of 128, 16 experts, top-1/3/9 (9 = GLM-4.5-Air's 8 + the folded shared
 * expert), random and partial routing (ids -1, possibly all of them), each call twice in a row (the
 * phase counters must be back at zero for the second), the chosen form (MS_CU_MOE_FUSED=1), each form
 * forced (2..8: one, two or three groups of warps a block, ring depths 3-6) and each named as tuned
 * (ms_moe_set_fused_form, with the per-form launch counters), more slots than its
 * grid has groups for one phase and fewer, a folded shared expert (ms_experts.shared_last: the
 * kernel's extra slot at T = 1, appended by the runner above); the launch counter says it ran exactly
 * for T = 1 and that MS_CU_MOE_FUSED=0 and I % 128 != 0 keep the two-kernel form. */
static void fused_shapes(int H, int I, int want) {
    layer L;
    const ms_moe_runner *cpu_r, *gr;
    if (!layer_and_runners(&L, MS_WFMT_NVFP4, 16, H, I, 1, 9, "decode", &cpu_r, &gr)) return;
#ifdef MS_HAVE_CUDA
    long long n0 = ms_cuda_moe_fused_launches();
#endif
    int nforms = 0, g, dp;
#ifdef MS_HAVE_CUDA
    while (ms_cuda_moe_fused_form(nforms, &g, &dp)) nforms++;
    CHECK_MSG(nforms >= 5, "the fused kernel lists %d forms", nforms);
#endif
    for (int d = 0; d <= nforms; d++) { /* 1: the cost model's form; 2 + f: form f */
        char form[16];
        snprintf(form, sizeof form, "%d", d + 1);
        setenv("MS_CU_MOE_FUSED", form, 1);
        const int topks[3] = {1, 3, 9};
        for (int i = 0; i < 3; i++)
            for (int rep = 0; rep < 2; rep++) {
                run_case(&L, cpu_r, gr, 1, topks[i], 0);
                run_case(&L, cpu_r, gr, 1, topks[i], 3);
            }
    }
    unsetenv("MS_CU_MOE_FUSED");
    /* a tuned form (ms_moe_fused_form: configs/tuned via ms_moe_apply_tuned) is the one launched; one the
     * kernel does not have leaves the choice to the cost model; a record for another shape changes nothing */
    for (int f = 0; f < nforms; f++) {
#ifdef MS_HAVE_CUDA
        ms_cuda_moe_fused_form(f, &g, &dp);
        CHECK(ms_moe_set_fused_form(&(ms_moe_form){H, I, 3, g, dp}));
        const long long nf0 = ms_cuda_moe_fused_form_launches(f);
        run_case(&L, cpu_r, gr, 1, 3, 0);
        CHECK_MSG(ms_cuda_moe_fused_form_launches(f) - nf0 == want, "H=%d I=%d: tuned form (%d, %d) launched %lld times",
                  H, I, g, dp, ms_cuda_moe_fused_form_launches(f) - nf0);
#endif
    }
    /* the cost model's form for these calls: the one launched with no record (the form depends on the
     * slots, not on which of them are -1) */
    CHECK(ms_moe_set_fused_form(&(ms_moe_form){H, I, 3, 0, 0}));
    int og = 1, od = 6;
#ifdef MS_HAVE_CUDA
    int cm = -1;
    long long c0[16];
    for (int f = 0; f < nforms && f < 16; f++) c0[f] = ms_cuda_moe_fused_form_launches(f);
#endif
    run_case(&L, cpu_r, gr, 1, 3, 0);
#ifdef MS_HAVE_CUDA
    for (int f = 0; f < nforms && f < 16; f++)
        if (ms_cuda_moe_fused_form_launches(f) - c0[f] == 1) cm = f;
    CHECK_MSG(!want || cm >= 0, "H=%d I=%d: no form counted the cost model's launch", H, I);
    if (cm >= 0) ms_cuda_moe_fused_form(cm == 0 ? 1 : 0, &og, &od); /* a form other than the cost model's */
    long long m0 = cm >= 0 ? ms_cuda_moe_fused_form_launches(cm) : 0;
#endif
    CHECK(ms_moe_set_fused_form(&(ms_moe_form){H, I, 3, 8, 64})); /* a form the kernel does not have */
    run_case(&L, cpu_r, gr, 1, 3, 0);
    CHECK(ms_moe_set_fused_form(&(ms_moe_form){H, I, 3, 0, 0}));
    CHECK(ms_moe_set_fused_form(&(ms_moe_form){H, I, 4, og, od})); /* another shape's record */
    run_case(&L, cpu_r, gr, 1, 3, 3);
#ifdef MS_HAVE_CUDA
    CHECK_MSG(!want || ms_cuda_moe_fused_form_launches(cm) - m0 == 2,
              "H=%d I=%d: a form the kernel lacks, or another shape's record, did not leave the cost model's form", H, I);
#endif
    CHECK(ms_moe_set_fused_form(&(ms_moe_form){H, I, 4, 0, 0}));
    CHECK(!ms_moe_fused_form(H, I, 3, &g, &dp));
    /* a folded shared expert (expert 15) as the kernel's extra slot, with and without ids -1 */
    for (int i = 0; i < 3; i++) {
        run_case_sh(&L, cpu_r, gr, 1, i == 2 ? 8 : 2 * i + 1, 0, 1);
        run_case_sh(&L, cpu_r, gr, 1, i == 2 ? 8 : 2 * i + 1, 3, 1);
    }
#ifdef MS_HAVE_CUDA
    /* 12 calls a setting of the knob, one a tuned form, 3 for the cost model's form, 6 with the shared
     * expert */
    const long long nwant = want ? 12 * (nforms + 1) + nforms + 3 + 6 : 0;
    CHECK_MSG(ms_cuda_moe_fused_launches() - n0 == nwant, "H=%d I=%d: fused MoE kernel launched %lld times (want %lld)",
              H, I, ms_cuda_moe_fused_launches() - n0, nwant);
    n0 = ms_cuda_moe_fused_launches();
#endif
    /* an F32 result, as the forward's delta: without the bf16 rounding of the output the fused
     * kernel's error is h's bf16 rounding and fp32 sums (1.7e-3 to 2.1e-3 measured on the H200); a
     * decode that lost e2m1's 0.5 (a bf16 subnormal in the kernel's mma) would be off by percents */
    OUT_F32 = 1, TOL = 4e-3, worst_rel = 0;
    run_case_sh(&L, cpu_r, gr, 1, 8, 0, 1);
    run_case_sh(&L, cpu_r, gr, 1, 3, 3, 0);
    printf("  H=%d I=%d F32 out: worst rel err %.3g\n", H, I, worst_rel);
    OUT_F32 = 0, TOL = 2e-2;
#ifdef MS_HAVE_CUDA
    CHECK_MSG(ms_cuda_moe_fused_launches() - n0 == (want ? 2 : 0), "H=%d I=%d: F32 cases launched the fused kernel %lld times",
              H, I, ms_cuda_moe_fused_launches() - n0);
    n0 = ms_cuda_moe_fused_launches();
#endif
    run_case(&L, cpu_r, gr, 3, 3, 0); /* more than one token: the two-kernel form */
    run_case_sh(&L, cpu_r, gr, 3, 8, 0, 1); /* ... with the shared expert appended by the runner */
    run_case_sh(&L, cpu_r, gr, 5, 3, 3, 1);
    setenv("MS_CU_MOE_FUSED", "0", 1);
    run_case(&L, cpu_r, gr, 1, 9, 0);
    run_case_sh(&L, cpu_r, gr, 1, 8, 0, 1);
#ifdef MS_HAVE_CUDA
    CHECK_MSG(ms_cuda_moe_fused_launches() == n0, "fused MoE kernel launched for T = 3 or with MS_CU_MOE_FUSED=0");
#endif
    unsetenv("MS_CU_MOE_FUSED");
    free_layer(&L);
}
static void test_nvfp4_fused(void) {
    /* the later tests keep the random data they had before this test existed (test_fp8_odd's naive
     * runner sits near its tolerance on some draws: 0.021 against 0.02 seen on the H200) */
    const uint64_t rng_saved = rng;
    const int want = GPU->gpu.cc_major >= 8;
    fused_shapes(256, 384, want);
    fused_shapes(1024, 128, want);
    fused_shapes(128, 1280, want); /* one gate/up super-step per row: warps 1-3 and 5-7 have none */
    fused_shapes(384, 96, 0);      /* I % 128 != 0: not covered */
    rng = rng_saved;
}
/* The decode runner's routed form (run_routed: the residual add + RMSNorm and the router inside the
 * fused kernel) against the backend's norm_router followed by run() on the same inputs: the ids, weights,
 * output, updated residual and normed row must be bit-identical, since the routed kernel sums
 * k_router_split's partials in its order with its arithmetic (router_dot.cuh) and its norm deals the row
 * over the router's 256 threads (CU_NORM_T) in every form. (Where run_routed refuses, the reference's
 * fallback, add_rmsnorm + router, runs in its place.) n experts (the last a folded shared expert when
 * shared), routing settings rc, bias or none. Calls: the reference on row A, the routed call on A, the
 * reference on row B, the routed call on B (a decoy between the two on A: a partial logit, count or
 * staged value it left behind would show in the last call's bits), the routed call on A again; each
 * routed call is compared with its row's reference. */
#ifdef MS_HAVE_CUDA
/* The reference path of routed_case: norm_router (or add_rmsnorm + router where it refuses), then run().
 * Returns 1 when norm_router took the call (the norm folded into the split router). */
static int routed_ref(const ms_moe_runner *gr, layer *L, ms_norm_in *nin, const ms_linear *gate, const ms_tensor *bp,
                      const ms_route_cfg *rc, ms_tensor *ig, ms_tensor *wg, ms_tensor *og, void *ws, size_t wsg) {
    const int rc0 = GPU->ops->norm_router(GPU, nin, gate, bp, rc, ig->data, wg->data, &E);
    CHECK_MSG(rc0 == MS_OK || rc0 == MS_ERR_UNSUPPORTED, "norm_router: %s", E.msg);
    if (rc0 == MS_ERR_UNSUPPORTED) {
        R(GPU->ops->add_rmsnorm(GPU, nin->resid, nin->delta, nin->w, nin->eps, nin->out, &E));
        R(GPU->ops->router(GPU, nin->out, gate, bp, rc, ig->data, wg->data, &E));
    }
    R(gr->run(GPU, &L->eg, nin->out, ig->data, wg->data, rc->topk, og, ws, wsg, &E));
    return rc0 == MS_OK;
}
#endif

#define RT_CALLS 5 /* routed_case's calls: reference A, routed A, reference B, routed B (decoy), routed A */
/* want: run_routed takes the call; fused: each call launches the fused kernel (routed or plain); form:
 * -1 for the kernel's own choice, else the fused form f forced (MS_CU_MOE_FUSED=2+f) and its launches
 * counted */
static void routed_case(int H, int I, int n, int shared, ms_route_cfg rc, int bias_on, int want, int fused, int form) {
#ifdef MS_HAVE_CUDA
    layer L;
    const ms_moe_runner *cpu_r, *gr;
    if (!layer_and_runners(&L, MS_WFMT_NVFP4, n, H, I, 1, rc.topk + shared, "decode", &cpu_r, &gr)) return;
    CHECK(gr->run_routed != NULL);
    const int Er = rc.n_experts, k = rc.topk;
    static const int row_b[RT_CALLS] = {0, 0, 1, 1, 0}, ref_of[RT_CALLS] = {0, 0, 2, 2, 0};
    L.eg.shared_last = shared;
    float *resid = malloc(sizeof(float) * (size_t)H), *resid2 = malloc(sizeof(float) * (size_t)H);
    float *delta = malloc(sizeof(float) * (size_t)H);
    uint16_t *nw = malloc(2 * (size_t)H), *gw = malloc(2 * (size_t)Er * H);
    float *bias = malloc(sizeof(float) * (size_t)Er);
    for (int i = 0; i < H; i++) {
        resid[i] = rnd_f() * 3.f;
        resid2[i] = rnd_f() * 5.f;
        delta[i] = rnd_f();
        nw[i] = ms_f32_to_bf16(0.5f + rnd_f() * 0.4f);
    }
    for (int i = 0; i < Er * H; i++) gw[i] = ms_f32_to_bf16(rnd_f() * 0.2f);
    for (int e = 0; e < Er; e++) bias[e] = rnd_f() * 0.05f;
    ms_linear gate = test_plain_linear("test.router", MS_BF16, Er, H, gw);
    R(GPU->ops->place_linear(GPU, &gate, &E));
    ms_tensor bg = upload(GPU, MS_F32, 1, Er, bias), nwg = upload(GPU, MS_BF16, 1, H, nw);
    ms_tensor dg = upload(GPU, MS_F32, 1, H, delta);
    ms_moe_shape s = {1, H, I, n, k + shared, MS_WFMT_NVFP4, MS_BF16};
    const size_t wsg = gr->workspace_size(GPU, &s);
    ms_tensor Wg = upload(GPU, MS_U8, 1, (int64_t)wsg + 1, NULL);
    ms_tensor rg[RT_CALLS], ag[RT_CALLS], ig[RT_CALLS], wg[RT_CALLS], og[RT_CALLS];
    for (int p = 0; p < RT_CALLS; p++) {
        rg[p] = upload(GPU, MS_F32, 1, H, row_b[p] ? resid2 : resid);
        ag[p] = upload(GPU, MS_BF16, 1, H, NULL);
        ig[p] = upload(GPU, MS_I32, 1, k, NULL);
        wg[p] = upload(GPU, MS_F32, 1, k, NULL);
        og[p] = upload(GPU, MS_F32, 1, H, NULL);
    }
    const ms_tensor *bp = bias_on ? &bg : NULL;
    char fv[16];
    snprintf(fv, sizeof fv, "%d", 2 + form);
    if (form >= 0) setenv("MS_CU_MOE_FUSED", fv, 1);
    const long long n0 = ms_cuda_moe_fused_launches(), f0 = form >= 0 ? ms_cuda_moe_fused_form_launches(form) : 0,
                    r0 = ms_cuda_moe_fused_routed_launches();
    int folded = 1;
    for (int p = 0; p < RT_CALLS; p++) {
        ms_norm_in nin = {&rg[p], &dg, &nwg, 1e-5f, &ag[p]};
        if (ref_of[p] == p) {
            folded &= routed_ref(gr, &L, &nin, &gate, bp, &rc, &ig[p], &wg[p], &og[p], Wg.data, wsg);
        } else {
            const int rr = gr->run_routed(GPU, &L.eg, &nin, &gate, bp, &rc, ig[p].data, wg[p].data, &og[p], Wg.data,
                                          wsg, &E);
            CHECK_MSG(rr == (want ? MS_OK : MS_ERR_UNSUPPORTED), "H=%d I=%d E=%d top-%d: run_routed returned %d (%s)",
                      H, I, Er, k, rr, E.msg);
            /* refused: nothing was queued or written, so the reference path gives call 0's bits again */
            if (rr != MS_OK) routed_ref(gr, &L, &nin, &gate, bp, &rc, &ig[p], &wg[p], &og[p], Wg.data, wsg);
        }
    }
    R(GPU->ops->sync(GPU, &E));
    if (form >= 0) unsetenv("MS_CU_MOE_FUSED");
    const long long nl = ms_cuda_moe_fused_launches() - n0, nr = ms_cuda_moe_fused_routed_launches() - r0;
    CHECK_MSG(nl == fused * RT_CALLS, "H=%d I=%d E=%d top-%d: the fused kernel ran %lld times (want %d)", H, I, Er, k, nl,
              fused * RT_CALLS);
    CHECK_MSG(nr == (want ? 3 : 0), "H=%d: the routed form ran %lld times (want %d)", H, nr, want ? 3 : 0);
    /* the bits are the split router's with its folded norm: the reference must have folded it too, which
     * it does when the router's grid, (E / 8) x (H / 512) blocks, fits on the GPU's SMs */
    const int rgrid = ((Er + 7) / 8) * ((H + 511) / 512), cmp = !want || folded;
    if (want && !folded) {
        CHECK_MSG(GPU->gpu.n_sm < rgrid, "H=%d E=%d: the reference router did not fold the norm (%d blocks, %d SMs)", H, Er,
                  rgrid, GPU->gpu.n_sm);
        printf("  H=%d E=%d: %d router blocks exceed this GPU's %d SMs: the reference norm is a kernel of its own, so "
               "only the choices' sanity is checked\n", H, Er, rgrid, GPU->gpu.n_sm);
    }
    if (form >= 0) {
        const long long nf = ms_cuda_moe_fused_form_launches(form) - f0;
        CHECK_MSG(nf == fused * RT_CALLS, "H=%d: form %d ran %lld times (want %d)", H, form, nf, fused * RT_CALLS);
    }
    const size_t nb[5] = {4 * (size_t)H, 2 * (size_t)H, 4 * (size_t)k, 4 * (size_t)k, 4 * (size_t)H};
    const char *what[5] = {"residual", "normed row", "ids", "weights", "output"};
    void *hb[RT_CALLS][5];
    for (int p = 0; p < RT_CALLS; p++) {
        const ms_tensor *t[5] = {&rg[p], &ag[p], &ig[p], &wg[p], &og[p]};
        for (int q = 0; q < 5; q++) {
            hb[p][q] = malloc(nb[q]);
            R(GPU->ops->download(GPU, hb[p][q], t[q]->data, nb[q], &E));
        }
    }
    for (int p = 0; p < RT_CALLS && cmp; p++)
        for (int q = 0; q < 5; q++)
            if (ref_of[p] != p)
                CHECK_MSG(!memcmp(hb[ref_of[p]][q], hb[p][q], nb[q]),
                          "H=%d I=%d E=%d top-%d bias=%d shared=%d form=%d: call %d's %s differs from call %d's", H, I, Er,
                          k, bias_on, shared, form, p, what[q], ref_of[p]);
    /* the decoy's row is another row (its normed row differs from A's), and each choice is sane: distinct
     * experts of the routed range, finite positive weights, and the residual is resid + delta */
    CHECK_MSG(memcmp(hb[1][1], hb[3][1], nb[1]) != 0, "H=%d: the decoy's normed row equals row A's", H);
    for (int p = 1; p <= 3; p += 2) {
        const int32_t *ids = hb[p][2];
        const float *wts = hb[p][3], *r1 = hb[p][0], *r0 = row_b[p] ? resid2 : resid;
        for (int j = 0; j < k; j++) {
            CHECK_MSG(ids[j] >= 0 && ids[j] < Er && isfinite(wts[j]) && wts[j] > 0, "call %d slot %d: expert %d weight %g",
                      p, j, ids[j], wts[j]);
            for (int i = 0; i < j; i++) CHECK_MSG(ids[i] != ids[j], "call %d: expert %d chosen twice", p, ids[j]);
        }
        for (int i = 0; i < H; i++)
            CHECK_MSG(r1[i] == r0[i] + delta[i], "call %d: residual[%d] = %g, want %g", p, i, r1[i], r0[i] + delta[i]);
    }
    for (int p = 0; p < RT_CALLS; p++)
        for (int q = 0; q < 5; q++) free(hb[p][q]);
    for (int p = 0; p < RT_CALLS; p++) {
        ms_tensor *t[5] = {&rg[p], &ag[p], &ig[p], &wg[p], &og[p]};
        for (int q = 0; q < 5; q++) GPU->ops->free(GPU, t[q]);
    }
    ms_tensor *t[4] = {&bg, &nwg, &dg, &Wg};
    for (int q = 0; q < 4; q++) GPU->ops->free(GPU, t[q]);
    GPU->ops->unplace_linear(GPU, &gate);
    L.eg.shared_last = 0;
    free(resid); free(resid2); free(delta); free(nw); free(gw); free(bias);
    free_layer(&L);
#else
    (void)H, (void)I, (void)n, (void)shared, (void)rc, (void)bias_on, (void)want, (void)fused, (void)form;
#endif
}
/* The fused form with ng groups of 8 warps a block and ring depth d (ms_cuda_moe_fused_form), or -1. */
static int fused_form_of(int ng, int d) {
#ifdef MS_HAVE_CUDA
    int g, dd;
    for (int f = 0; ms_cuda_moe_fused_form(f, &g, &dd); f++)
        if (g == ng && dd == d) return f;
#else
    (void)ng, (void)d;
#endif
    return -1;
}
static void test_nvfp4_routed(void) {
    const uint64_t rng_saved = rng;
    const int want = GPU->gpu.cc_major >= 8;
    /* GLM-5's routing (256 experts, 8 groups, 4 kept, top-8, normalised, scaled) with a folded shared expert */
    routed_case(256, 128, 257, 1, (ms_route_cfg){256, 8, 8, 4, 1, 2.5f}, 1, want, want, -1);
    /* GLM-4.5-Air's (128 experts, one group, top-8) at a K of two router slices, the second partial (640) */
    routed_case(640, 256, 129, 1, (ms_route_cfg){128, 8, 1, 1, 1, 1.0f}, 1, want, want, -1);
    /* an expert count that leaves a partial group of 8 rows, no bias, no shared expert, unnormalised */
    routed_case(384, 128, 20, 0, (ms_route_cfg){20, 3, 1, 1, 0, 1.5f}, 0, want, want, -1);
    /* Air's and GLM-5's widths (4096: 2 units a norm thread, 6144: 3) in the forms the tuned file picks for
     * them, two and three groups of 8 warps (512 and 768 threads, of which the norm's 256 hold the row),
     * and in a one-group form; 32 experts, so the reference router folds the norm too (4 x 8 or 4 x 12
     * blocks, within the GPU's SMs) */
    const int f24 = fused_form_of(2, 4), f33 = fused_form_of(3, 3), f14 = fused_form_of(1, 4);
    CHECK_MSG(f24 >= 0 && f33 >= 0 && f14 >= 0, "fused forms (2, 4), (3, 3), (1, 4): %d %d %d", f24, f33, f14);
    const ms_route_cfg r32 = {32, 8, 1, 1, 1, 1.0f}, g32 = {32, 8, 8, 4, 1, 2.5f};
    routed_case(4096, 128, 33, 1, r32, 1, want, want, f24);
    routed_case(4096, 128, 33, 1, r32, 1, want, want, f14);
    routed_case(6144, 128, 33, 1, g32, 1, want, want, f33);
    routed_case(6144, 128, 33, 1, g32, 1, want, want, f24);
    /* refused: top-16 plus the shared expert is 17 slots, past the kernel's 16 (no fused launch at all) */
    routed_case(256, 128, 33, 1, (ms_route_cfg){32, 16, 1, 1, 1, 1.0f}, 1, 0, 0, -1);
    /* refused where the router would not be the split form the routed kernel reproduces
     * (MS_CU_ROUTER=warp, MS_CU_ROUTER_UNFUSED) or with MS_CU_MOE_ROUTE=0: the plain fused kernel runs */
    const char *off[3][2] = {{"MS_CU_MOE_ROUTE", "0"}, {"MS_CU_ROUTER", "warp"}, {"MS_CU_ROUTER_UNFUSED", "1"}};
    for (int i = 0; i < 3; i++) {
        setenv(off[i][0], off[i][1], 1);
        routed_case(256, 128, 17, 1, (ms_route_cfg){16, 4, 1, 1, 1, 1.0f}, 1, 0, want, -1);
        unsetenv(off[i][0]);
    }
    rng = rng_saved;
}
static void test_bf16_odd(void) { fmt_case(MS_WFMT_PLAIN, 72, 40); }
static void test_fp8_odd(void) { fmt_case(MS_WFMT_FP8, 80, 56); }
static void test_nvfp4_odd(void) { fmt_case(MS_WFMT_NVFP4, 80, 48); }
/* K a multiple of the tensor-core GEMV's alignment (nvfp4 32, fp8 16, bf16 8) but not of its 64-byte
 * super-step, so the last step is partial; N not a multiple of 16 where the format allows */
static void test_nvfp4_mma(void) { fmt_case(MS_WFMT_NVFP4, 160, 96); }
static void test_fp8_mma(void) { fmt_case(MS_WFMT_FP8, 208, 80); }
static void test_bf16_mma(void) { fmt_case(MS_WFMT_PLAIN, 200, 88); }

/* the odd-dimension fixtures' expert shapes (tools/make_fixtures.py --only odd): hidden 136 with moe
 * intermediate 40 (multiples of 8, not 16: bf16 and fp8 only, fp8 K % 16 == 8 and partial 128 blocks)
 * and hidden 112 with 80 (multiples of 16, not 32: nvfp4 K % 32 == 16), decode and prefill runners */
static void test_odd_fixture_shapes(void) {
    fmt_case(MS_WFMT_PLAIN, 136, 40);
    fmt_case(MS_WFMT_FP8, 136, 40);
    fmt_case(MS_WFMT_PLAIN, 112, 80);
    fmt_case(MS_WFMT_FP8, 112, 80);
    fmt_case(MS_WFMT_NVFP4, 112, 80);
    prefill_case(MS_WFMT_FP8, 136, 40, 0);
    prefill_case(MS_WFMT_NVFP4, 112, 80, 0);
}

static void test_supports_message(void) {
    ms_moe_shape s = {1, 128, 96, 8, 2, MS_WFMT_NVFP4, MS_BF16};
    for (int r = 0; r < 3; r++) {
        const ms_moe_runner *gr = NULL;
        R(ms_moe_resolve(GPU, RUNNERS[r], &s, &gr, &E));
        CHECK(gr != NULL);
        if (!gr) continue;
        char why[256] = "";
        CHECK(gr->supports(GPU, &s, why, sizeof why) == 1);
        /* the CUDA runners refuse the CPU backend with a reason */
        CHECK(gr->supports(CPU, &s, why, sizeof why) == 0 && why[0]);
    }
}

int main(void) {
    ms_err err = {0};
    if (ms_backend_create("cuda", 0, &GPU, &err) != MS_OK) {
        printf("## %s: 0 passed, 0 failed\n", __FILE__);
        printf("no GPU: skipped (%s)\n", err.msg);
        return 0;
    }
    if (ms_backend_create("cpu", -1, &CPU, &err) != MS_OK) {
        fprintf(stderr, "cpu backend: %s\n", err.msg);
        return 1;
    }
    RUN(test_supports_message);
    RUN(test_bf16);
    RUN(test_fp8);
    RUN(test_nvfp4);
    RUN(test_nvfp4_w8);
    RUN(test_nvfp4_fused);
    RUN(test_nvfp4_routed);
    RUN(test_bf16_odd);
    RUN(test_fp8_odd);
    RUN(test_nvfp4_odd);
    RUN(test_nvfp4_mma);
    RUN(test_fp8_mma);
    RUN(test_bf16_mma);
    RUN(test_prefill_bf16);
    RUN(test_prefill_fp8);
    RUN(test_prefill_nvfp4);
    RUN(test_prefill_tails);
    RUN(test_odd_fixture_shapes);
    ms_backend_destroy(GPU);
    ms_backend_destroy(CPU);
    return TEST_SUMMARY();
}
