/* test_moe_cpu.c - the CPU MoE runner against a naive per-token loop (double precision, weights
 * decoded by the format definition ms_linear_dequant_row), over batch sizes on both sides of the
 * fused/sgemm switch and the token chunking, empty experts, all tokens on one expert, and all three
 * weight formats; plus the runner registry's resolve/pick behaviour. */
#include "backend/backend.h"
#include "core/dtype.h"
#include "core/threads.h"
#include "moe/moe.h"
#include "test.h"
#include "test_linear.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 0x1234567887654321ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}
static float frand(void) { return (float)((rnd() & 0xffffff) / (double)0x1000000 * 2.0 - 1.0); }

static ms_backend *B;
static ms_err E;

enum { NE = 8, H = 48, I = 32 };

typedef struct {
    ms_experts ex;
    ms_linear lin[3][NE];
    void *mem[3][NE][2];
} experts_t;

static void make_lin(ms_linear *W, void **mem, int fmt, int64_t N, int64_t K) {
    test_linear_init(W, "test.expert", fmt, N, K);
    if (fmt == MS_WFMT_PLAIN) {
        W->w = ms_tensor_2d(MS_BF16, N, K);
        uint16_t *p = malloc((size_t)(N * K) * 2);
        for (int64_t i = 0; i < N * K; i++) p[i] = ms_f32_to_bf16(frand() * 0.5f);
        mem[0] = p;
        mem[1] = NULL;
    } else if (fmt == MS_WFMT_FP8) {
        W->w = ms_tensor_2d(MS_F8E4M3, N, K);
        uint8_t *p = malloc((size_t)(N * K));
        for (int64_t i = 0; i < N * K; i++) p[i] = ms_f32_to_e4m3(frand() * 100);
        W->scale = ms_tensor_2d(MS_F32, (N + 127) / 128, (K + 127) / 128);
        float *s = malloc(ms_tensor_nbytes(&W->scale));
        for (int64_t i = 0; i < ms_tensor_numel(&W->scale); i++) s[i] = 0.004f;
        mem[0] = p;
        mem[1] = s;
    } else {
        W->w = ms_tensor_2d(MS_U8, N, K / 2);
        uint8_t *p = malloc((size_t)(N * K / 2));
        for (int64_t i = 0; i < N * K / 2; i++) p[i] = (uint8_t)rnd();
        W->scale = ms_tensor_2d(MS_F8E4M3, N, K / 16);
        uint8_t *s = malloc((size_t)(N * K / 16));
        for (int64_t i = 0; i < N * K / 16; i++) s[i] = ms_f32_to_e4m3(0.25f + (rnd() % 8) / 16.0f);
        W->scale2 = 0.5f;
        mem[0] = p;
        mem[1] = s;
    }
    W->w.data = mem[0];
    W->scale.data = mem[1];
}

static void make_experts(experts_t *x, int fmt) {
    for (int e = 0; e < NE; e++) {
        make_lin(&x->lin[0][e], x->mem[0][e], fmt, I, H);
        make_lin(&x->lin[1][e], x->mem[1][e], fmt, I, H);
        make_lin(&x->lin[2][e], x->mem[2][e], fmt, H, I);
    }
    x->ex = (ms_experts){NE, x->lin[0], x->lin[1], x->lin[2], NULL};
}

static void free_experts(experts_t *x) {
    for (int k = 0; k < 3; k++)
        for (int e = 0; e < NE; e++) free(x->mem[k][e][0]), free(x->mem[k][e][1]);
}

static void ref_expert(const ms_experts *ex, int e, const float *x, double *y) {
    float row[H > I ? H : I];
    double act[I];
    for (int i = 0; i < I; i++) {
        double g = 0, u = 0;
        ms_linear_dequant_row(&ex->gate[e], i, row);
        for (int k = 0; k < H; k++) g += (double)row[k] * x[k];
        ms_linear_dequant_row(&ex->up[e], i, row);
        for (int k = 0; k < H; k++) u += (double)row[k] * x[k];
        act[i] = g / (1 + exp(-g)) * u;
    }
    for (int h = 0; h < H; h++) {
        ms_linear_dequant_row(&ex->down[e], h, row);
        double s = 0;
        for (int i = 0; i < I; i++) s += row[i] * act[i];
        y[h] = s;
    }
}

/* mode 0: random distinct experts per token; 1: every token's first choice is expert 5 and experts
 * 0 and 7 are never used; 2: topk 1, all tokens on expert 2. */
static void check_run(int fmt, int T, int mode) {
    experts_t ex;
    make_experts(&ex, fmt);
    const int topk = mode == 2 ? 1 : 3;
    float *x = malloc(sizeof(float) * (size_t)T * H);
    for (int i = 0; i < T * H; i++) x[i] = frand();
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T * topk);
    float *w = malloc(sizeof(float) * (size_t)T * topk);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < topk; j++) {
            int id;
            for (;;) {
                id = mode == 2 ? 2 : (mode == 1 && j == 0) ? 5 : (int)(rnd() % NE);
                if (mode == 1 && (id == 0 || id == 7)) continue;
                int dup = 0;
                for (int u = 0; u < j; u++) dup |= ids[t * topk + u] == id;
                if (!dup) break;
            }
            ids[t * topk + j] = id;
            w[t * topk + j] = 0.2f + (rnd() % 100) / 100.0f;
        }
    ms_moe_shape s = {T, H, I, NE, topk, fmt, MS_BF16};
    const ms_moe_runner *r = ms_moe_pick(B, NULL, &s);
    CHECK_STR(r->name, "cpu");
    size_t ws = r->workspace_size(B, &s);
    void *wsp = malloc(ws);
    ms_tensor xt = ms_tensor_2d(MS_F32, T, H), ot = ms_tensor_2d(MS_F32, T, H);
    xt.data = x;
    ot.data = malloc(sizeof(float) * (size_t)T * H);
    CHECK(r->run(B, &ex.ex, &xt, ids, w, topk, &ot, wsp, ws, &E) == MS_OK);
    double *ref = calloc((size_t)T * H, sizeof(double)), y[H];
    double mx = 1e-3, md = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < topk; j++) {
            ref_expert(&ex.ex, ids[t * topk + j], x + t * H, y);
            for (int h = 0; h < H; h++) ref[t * H + h] += w[t * topk + j] * y[h];
        }
    for (int i = 0; i < T * H; i++) {
        mx = fmax(mx, fabs(ref[i]));
        md = fmax(md, fabs(ref[i] - ((float *)ot.data)[i]));
    }
    CHECK_MSG(md <= 2e-5 * mx, "fmt %d T %d mode %d: max diff %g scale %g", fmt, T, mode, md, mx);
    /* a too-small workspace is an error, not a crash */
    CHECK(r->run(B, &ex.ex, &xt, ids, w, topk, &ot, wsp, 16, &E) == MS_ERR_INVALID);
    ids[0] = NE;
    CHECK(r->run(B, &ex.ex, &xt, ids, w, topk, &ot, wsp, ws, &E) == MS_ERR_INVALID);
    free(ref);
    free(ot.data);
    free(wsp);
    free(x);
    free(ids);
    free(w);
    free_experts(&ex);
}

static void test_batches_bf16(void) {
    const int Ts[4] = {1, 3, 64, 257};
    for (int i = 0; i < 4; i++) check_run(MS_WFMT_PLAIN, Ts[i], 0);
}

static void test_empty_and_one_expert(void) {
    check_run(MS_WFMT_PLAIN, 3, 1);
    check_run(MS_WFMT_PLAIN, 64, 1);
    check_run(MS_WFMT_PLAIN, 1, 2);
    check_run(MS_WFMT_PLAIN, 257, 2);
}

static void test_formats(void) {
    const int Ts[3] = {1, 17, 257};
    for (int i = 0; i < 3; i++) {
        check_run(MS_WFMT_FP8, Ts[i], 0);
        check_run(MS_WFMT_NVFP4, Ts[i], 0);
    }
}

static void test_registry(void) {
    const ms_moe_runner *const *all = ms_moe_runners();
    int n = 0, has_cpu = 0;
    for (; all[n]; n++) has_cpu |= !strcmp(all[n]->name, "cpu");
    CHECK(has_cpu && n == (ms_backend_cuda_compiled() ? 4 : 1));
    ms_moe_shape s = {1, H, I, NE, 2, MS_WFMT_NVFP4, MS_BF16};
    const ms_moe_runner *r = (const ms_moe_runner *)1;
    CHECK(ms_moe_resolve(B, "auto", &s, &r, &E) == MS_OK && r == NULL);
    CHECK(ms_moe_resolve(B, "cpu", &s, &r, &E) == MS_OK && r && !strcmp(r->name, "cpu"));
    CHECK(ms_moe_resolve(B, "fastest", &s, &r, &E) == MS_ERR_INVALID);
    CHECK(strstr(E.msg, "--moe-runner-backend") && strstr(E.msg, "fastest") && strstr(E.msg, "runners that can run on the cpu backend: cpu"));
    if (ms_backend_cuda_compiled()) {
        CHECK(ms_moe_resolve(B, "grouped", &s, &r, &E) == MS_ERR_UNSUPPORTED);
        CHECK(strstr(E.msg, "runners that can: cpu") != NULL);
    }
    ms_moe_shape bad = {1, H, I, NE, 2, MS_WFMT_PLAIN, MS_I32};
    CHECK(ms_moe_resolve(B, "cpu", &bad, &r, &E) == MS_ERR_UNSUPPORTED);
    CHECK(strstr(E.msg, "cannot run on the cpu backend") && strstr(E.msg, "runners that can: none"));
    CHECK(ms_moe_pick(B, NULL, &s) == ms_moe_pick(B, all[0], &s));
}

int main(void) {
    ms_dtype_init();
    if (ms_backend_create("cpu", -1, &B, &E) != MS_OK) {
        fprintf(stderr, "%s\n", E.msg);
        return 1;
    }
    RUN(test_batches_bf16);
    RUN(test_empty_and_one_expert);
    RUN(test_formats);
    RUN(test_registry);
    ms_backend_destroy(B);
    return TEST_SUMMARY();
}
