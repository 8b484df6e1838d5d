/* cmd_doctor.c - `moeserve doctor`: what this machine and build can run, and a few-second proof.
 *
 * Prints the build (CUDA compiled in or not), each GPU (name, compute capability, memory, SMs),
 * driver/runtime versions, the CUDA backend's environment knobs (name, value in effect, default,
 * meaning; printed with or without a GPU), NCCL's version when libnccl loads, which MoE runners and
 * attention paths are supported here (with the reason when not), then self-tests each supported GPU
 * runner against the CPU runner on a small random layer in every weight format. Exit code 1 when a self-test fails.
 * The CPU, its kernel path and the memory come first, and the CPU runner is self-tested against a
 * plain float reference on every machine, so a CPU-only machine gets a real check too.
 * With --bench, also times the GPU runners on a GLM-5-sized expert layer (hidden 6144, inter 2048,
 * 64 experts, top-8): decode at small batches (GB/s of distinct expert weights read) and grouped /
 * naive at a prefill batch (TFLOP/s).
 * Attention implementations (backend/attn.h) are listed per path (GQA, dense MLA, DSA) for GLM-4.5-
 * and GLM-5-shaped attention with supported / refused and the reason.
 * With --interconnect, the machine's links (doctor_ic.c): copies, launches, GPU pairs, NCCL all-reduce
 * and, with --config FILE|DIR [--override k=v] [--tp N], the projected collective time per decode step.
 * Flags: --device N (GPU ordinal, default 0), --no-selftest, --bench, --interconnect, --config, --tp. */
#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "common/args.h"
#include "common/version.h"
#include "core/dtype.h"
#include "core/fileutil.h"
#include "backend/attn.h"
#include "moe/moe.h"
#ifdef MS_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t d_rng = 0x1234567887654321ull;
static uint32_t d_u32(void) {
    d_rng ^= d_rng << 13;
    d_rng ^= d_rng >> 7;
    d_rng ^= d_rng << 17;
    return (uint32_t)(d_rng >> 11);
}
static float d_f(void) { return ((float)(d_u32() & 0xffffff) / 16777216.0f) * 2.f - 1.f; }

static void print_nccl(void) {
    const char *names[] = {"libnccl.so.2", "libnccl.so", NULL};
    for (int i = 0; names[i]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) continue;
        int (*getv)(int *) = (int (*)(int *))dlsym(h, "ncclGetVersion");
        int v = 0;
        if (getv && getv(&v) == 0)
            printf("nccl: %d.%d.%d (%s)\n", v / 10000, (v / 100) % 100, v % 100, names[i]);
        else printf("nccl: %s loaded, version unknown\n", names[i]);
        dlclose(h);
        return;
    }
    printf("nccl: not found (libnccl.so.2 not loadable; multi-GPU runs need it)\n");
}

/* ---- self-test: one random layer per format, every supported GPU runner vs the CPU runner ---- */

typedef struct {
    ms_linear *lin; /* host views: gate[n], up[n], down[n] */
    void **bufs;
    int nb;
} hlayer;

static void *hb(hlayer *L, size_t n) { return L->bufs[L->nb++] = malloc(n + 16); }

static void fill(hlayer *L, ms_linear *W, ms_wfmt fmt, int64_t N, int64_t K) {
    memset(W, 0, sizeof *W);
    W->name = "doctor.expert";
    W->fmt = fmt;
    W->n_out = N;
    W->n_in = K;
    if (fmt == MS_WFMT_PLAIN) {
        uint16_t *w = hb(L, (size_t)(N * K) * 2);
        for (int64_t i = 0; i < N * K; i++) w[i] = ms_f32_to_bf16(d_f() * 0.1f);
        W->w = ms_tensor_2d(MS_BF16, N, K);
        W->w.data = w;
    } else if (fmt == MS_WFMT_FP8) {
        uint8_t *w = hb(L, (size_t)(N * K));
        for (int64_t i = 0; i < N * K; i++) w[i] = (uint8_t)(d_u32() & 0xb7);
        int64_t sn = (N + 127) / 128, sk = (K + 127) / 128;
        float *s = hb(L, (size_t)(sn * sk) * 4);
        for (int64_t i = 0; i < sn * sk; i++) s[i] = 0.002f;
        W->w = ms_tensor_2d(MS_F8E4M3, N, K);
        W->w.data = w;
        W->scale = ms_tensor_2d(MS_F32, sn, sk);
        W->scale.data = s;
    } else {
        uint8_t *w = hb(L, (size_t)(N * K / 2)), *s = hb(L, (size_t)(N * K / 16));
        for (int64_t i = 0; i < N * K / 2; i++) w[i] = (uint8_t)d_u32();
        for (int64_t i = 0; i < N * K / 16; i++) s[i] = (uint8_t)(0x28 + d_u32() % 0x18);
        W->w = ms_tensor_2d(MS_U8, N, K / 2);
        W->w.data = w;
        W->scale = ms_tensor_2d(MS_F8E4M3, N, K / 16);
        W->scale.data = s;
        W->scale2 = 0.03f;
    }
}

/* Places a copy of the host views on b as experts (caller frees with unplace_experts). */
static int place_experts(ms_backend *b, const ms_linear *lin, int n, ms_experts *e, ms_err *err) {
    memset(e, 0, sizeof *e);
    e->n = n;
    e->gate = malloc(sizeof(ms_linear) * (size_t)n * 3);
    if (!e->gate) return ms_errf(err, MS_ERR_NOMEM, "doctor: out of memory");
    memcpy(e->gate, lin, sizeof(ms_linear) * (size_t)n * 3);
    e->up = e->gate + n;
    e->down = e->gate + 2 * n;
    for (int i = 0; i < 3 * n; i++) MS_TRY(b->ops->place_linear(b, &e->gate[i], err));
    return MS_OK;
}

static void unplace_experts(ms_backend *b, ms_experts *e) {
    for (int i = 0; e->gate && i < 3 * e->n; i++) b->ops->unplace_linear(b, &e->gate[i]);
    free(e->gate);
}

static int up_t(ms_backend *b, ms_tensor *t, ms_dtype dt, int64_t r, int64_t c, const void *h, ms_err *err) {
    int64_t s[2] = {r, c};
    MS_TRY(ms_backend_alloc(b, t, dt, 2, s, err));
    if (h) MS_TRY(b->ops->upload(b, t->data, h, ms_tensor_nbytes(t), err));
    return MS_OK;
}

/* Runs runner r on b over experts e; fills out_host (float). */
static int run_on(ms_backend *b, const ms_moe_runner *r, const ms_experts *e, int T, int H, int I, int topk,
                  ms_wfmt fmt, const float *xf, const int32_t *ids, const float *w, float *out_host, ms_err *err) {
    ms_moe_shape s = {T, H, I, e->n, topk, fmt, MS_BF16};
    ms_dtype adt = b->act_dtype;
    size_t n = (size_t)T * H;
    void *xh = malloc(n * 4);
    if (!xh) return ms_errf(err, MS_ERR_NOMEM, "doctor: out of memory");
    for (size_t i = 0; i < n; i++) {
        if (adt == MS_BF16) ((uint16_t *)xh)[i] = ms_f32_to_bf16(xf[i]);
        else ((float *)xh)[i] = xf[i];
    }
    ms_tensor x = {0}, ti = {0}, tw = {0}, o = {0}, ws = {0};
    size_t wsb = r->workspace_size(b, &s);
    int rc = up_t(b, &x, adt, T, H, xh, err);
    if (!rc) rc = up_t(b, &ti, MS_I32, T, topk, ids, err);
    if (!rc) rc = up_t(b, &tw, MS_F32, T, topk, w, err);
    if (!rc) rc = up_t(b, &o, adt, T, H, NULL, err);
    if (!rc) rc = up_t(b, &ws, MS_U8, 1, (int64_t)wsb + 1, NULL, err);
    if (!rc) rc = r->run(b, e, &x, ti.data, tw.data, topk, &o, ws.data, wsb, err);
    if (!rc) rc = b->ops->sync(b, err);
    if (!rc) rc = b->ops->download(b, xh, o.data, ms_tensor_nbytes(&o), err);
    if (!rc)
        for (size_t i = 0; i < n; i++) out_host[i] = adt == MS_BF16 ? ms_bf16_to_f32(((uint16_t *)xh)[i]) : ((float *)xh)[i];
    ms_tensor *all[5] = {&x, &ti, &tw, &o, &ws};
    for (int i = 0; i < 5; i++)
        if (all[i]->data) b->ops->free(b, all[i]);
    free(xh);
    return rc;
}

static int selftest(ms_backend *cpu, ms_backend *gpu) {
    const int n = 16, H = 256, I = 128, topk = 4;
    const ms_wfmt fmts[3] = {MS_WFMT_PLAIN, MS_WFMT_FP8, MS_WFMT_NVFP4};
    const int Ts[3] = {1, 7, 96};
    int failures = 0;
    printf("\nself-test (each CUDA runner vs the cpu runner, %d experts, hidden %d, inter %d, top-%d):\n", n, H, I, topk);
    for (int f = 0; f < 3; f++) {
        hlayer L = {0};
        L.lin = calloc((size_t)n * 3, sizeof(ms_linear));
        L.bufs = calloc((size_t)n * 6, sizeof(void *));
        for (int i = 0; i < n; i++) {
            fill(&L, &L.lin[i], fmts[f], I, H);
            fill(&L, &L.lin[n + i], fmts[f], I, H);
            fill(&L, &L.lin[2 * n + i], fmts[f], H, I);
        }
        ms_err err = {0};
        ms_experts ec, eg;
        int ok = place_experts(cpu, L.lin, n, &ec, &err) == MS_OK && place_experts(gpu, L.lin, n, &eg, &err) == MS_OK;
        ms_moe_shape s = {64, H, I, n, topk, fmts[f], MS_BF16};
        const ms_moe_runner *cr = NULL;
        if (ok && ms_moe_resolve(cpu, "cpu", &s, &cr, &err) != MS_OK) ok = 0;
        if (ok && cr && cr->prepare && cr->prepare(cpu, &ec, &err) != MS_OK) ok = 0;
        if (!ok || !cr) {
            printf("  %-6s setup failed: %s\n", ms_wfmt_name(fmts[f], MS_BF16), err.msg);
            failures++;
        }
        for (const ms_moe_runner *const *rp = ms_moe_runners(); ok && cr && *rp; rp++) {
            const ms_moe_runner *r = *rp;
            if (strcmp(r->backend, "cuda") != 0) continue;
            char why[256] = "";
            if (!r->supports(gpu, &s, why, sizeof why)) continue;
            if (r->prepare && r->prepare(gpu, &eg, &err) != MS_OK) {
                printf("  %-6s %-8s prepare failed: %s\n", ms_wfmt_name(fmts[f], MS_BF16), r->name, err.msg);
                failures++;
                continue;
            }
            for (int ti = 0; ti < 3; ti++) {
                int T = Ts[ti];
                float *x = malloc(sizeof(float) * (size_t)T * H), *w = malloc(sizeof(float) * (size_t)T * topk);
                float *oa = malloc(sizeof(float) * (size_t)T * H), *ob = malloc(sizeof(float) * (size_t)T * H);
                int32_t *ids = malloc(sizeof(int32_t) * (size_t)T * topk);
                for (int i = 0; i < T * H; i++) x[i] = ms_bf16_to_f32(ms_f32_to_bf16(d_f()));
                for (int t = 0; t < T; t++)
                    for (int k = 0; k < topk; k++) {
                        ids[t * topk + k] = (t * 5 + k * 3) % n; /* distinct for k < topk since 3k mod 16 differ */
                        w[t * topk + k] = 0.25f + 0.1f * (float)k;
                    }
                double t0 = 0;
                int rc = run_on(cpu, cr, &ec, T, H, I, topk, fmts[f], x, ids, w, ob, &err);
                if (rc == MS_OK) rc = run_on(gpu, r, &eg, T, H, I, topk, fmts[f], x, ids, w, oa, &err);
                double md = 0, mr = 1e-9;
                int bad = rc != MS_OK;
                for (int i = 0; !bad && i < T * H; i++) {
                    if (!isfinite(oa[i])) { bad = 1; break; }
                    double d = fabs((double)oa[i] - ob[i]);
                    if (d > md) md = d;
                    if (fabs(ob[i]) > mr) mr = fabs(ob[i]);
                }
                (void)t0;
                int pass = !bad && md / mr <= 2e-2;
                if (!pass) failures++;
                if (rc != MS_OK)
                    printf("  %-6s %-8s T=%-3d FAIL: %s\n", ms_wfmt_name(fmts[f], MS_BF16), r->name, T, err.msg);
                else
                    printf("  %-6s %-8s T=%-3d max rel diff %.2e  %s\n", ms_wfmt_name(fmts[f], MS_BF16), r->name, T,
                           md / mr, pass ? "ok" : "FAIL");
                free(x); free(w); free(oa); free(ob); free(ids);
            }
        }
        unplace_experts(cpu, &ec);
        unplace_experts(gpu, &eg);
        for (int i = 0; i < L.nb; i++) free(L.bufs[i]);
        free(L.bufs);
        free(L.lin);
    }
    return failures;
}


/* ---- the CPU: what it is, and a self-test of the CPU runner against a plain reference ---- */

static void print_cpu(void) {
    char model[256] = "unknown", line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (c && (!strncmp(line, "model name", 10) || !strncmp(line, "Model", 5))) {
            for (c++; *c == ' ' || *c == '\t'; c++) {}
            snprintf(model, sizeof model, "%s", c);
            model[strcspn(model, "\n")] = 0;
            break;
        }
    }
    if (f) fclose(f);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("cpu: %s, %ld logical cores, kernels: %s\n", model, cores, ms_cpu_simd_name());
    double total = 0, avail = 0;
    f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        double v;
        if (sscanf(line, "MemTotal: %lf kB", &v) == 1) total = v * 1024;
        if (sscanf(line, "MemAvailable: %lf kB", &v) == 1) avail = v * 1024;
    }
    if (f) fclose(f);
    printf("memory: %.1f GiB (%.1f GiB available)\n", total / 1073741824.0, avail / 1073741824.0);
}

static float silu(float x) { return x / (1.f + expf(-x)); }

/* The CPU runner on a small random layer in every weight format, against a float reference made
 * here from the dequantized weights (out = sum_k w_k * down(silu(gate x) * up x)). */
static int cpu_selftest(ms_backend *cpu) {
    const int n = 8, H = 256, I = 128, topk = 2, T = 5;
    const ms_wfmt fmts[3] = {MS_WFMT_PLAIN, MS_WFMT_FP8, MS_WFMT_NVFP4};
    const ms_moe_runner *r = NULL;
    for (const ms_moe_runner *const *rp = ms_moe_runners(); *rp; rp++)
        if (!strcmp((*rp)->backend, "cpu")) r = *rp;
    printf("\nself-test (the cpu runner vs a plain float reference, %d experts, hidden %d, inter %d, top-%d):\n", n, H, I, topk);
    if (!r) { printf("  no cpu runner in this build: FAIL\n"); return 1; }
    int failures = 0;
    for (int f = 0; f < 3; f++) {
        hlayer L = {0};
        L.lin = calloc((size_t)n * 3, sizeof(ms_linear));
        L.bufs = calloc((size_t)n * 6, sizeof(void *));
        float *x = malloc(sizeof(float) * T * H), *w = malloc(sizeof(float) * T * topk), *o = malloc(sizeof(float) * T * H),
              *ref = calloc((size_t)T * H, sizeof(float)), *row = malloc(sizeof(float) * (H > I ? H : I)),
              *g = malloc(sizeof(float) * I), *u = malloc(sizeof(float) * I);
        int32_t *ids = malloc(sizeof(int32_t) * T * topk);
        for (int i = 0; i < n; i++) {
            fill(&L, &L.lin[i], fmts[f], I, H);
            fill(&L, &L.lin[n + i], fmts[f], I, H);
            fill(&L, &L.lin[2 * n + i], fmts[f], H, I);
        }
        for (int i = 0; i < T * H; i++) x[i] = d_f();
        for (int t = 0; t < T; t++)
            for (int k = 0; k < topk; k++) ids[t * topk + k] = (t + 3 * k) % n, w[t * topk + k] = 0.5f + 0.25f * k;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < topk; k++) {
                int e = ids[t * topk + k];
                for (int j = 0; j < I; j++) {
                    double a = 0, b = 0;
                    ms_cpu_dequant(&L.lin[e], j, 0, H, row);
                    for (int h = 0; h < H; h++) a += (double)row[h] * x[t * H + h];
                    ms_cpu_dequant(&L.lin[n + e], j, 0, H, row);
                    for (int h = 0; h < H; h++) b += (double)row[h] * x[t * H + h];
                    g[j] = silu((float)a) * (float)b;
                }
                for (int h = 0; h < H; h++) {
                    double a = 0;
                    ms_cpu_dequant(&L.lin[2 * n + e], h, 0, I, row);
                    for (int j = 0; j < I; j++) a += (double)row[j] * g[j];
                    ref[t * H + h] += w[t * topk + k] * (float)a;
                }
            }
        ms_err err = {0};
        ms_experts ec;
        int rc = place_experts(cpu, L.lin, n, &ec, &err);
        if (rc == MS_OK && r->prepare) rc = r->prepare(cpu, &ec, &err);
        if (rc == MS_OK) rc = run_on(cpu, r, &ec, T, H, I, topk, fmts[f], x, ids, w, o, &err);
        double md = 0, mr = 1e-9;
        for (int i = 0; rc == MS_OK && i < T * H; i++) {
            double d = isfinite(o[i]) ? fabs((double)o[i] - ref[i]) : INFINITY;
            if (d > md) md = d;
            if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
        }
        int pass = rc == MS_OK && md / mr <= 1e-3;
        failures += !pass;
        if (rc != MS_OK) printf("  %-6s cpu      FAIL: %s\n", ms_wfmt_name(fmts[f], MS_BF16), err.msg);
        else printf("  %-6s cpu      T=%d max rel diff %.2e  %s\n", ms_wfmt_name(fmts[f], MS_BF16), T, md / mr, pass ? "ok" : "FAIL");
        unplace_experts(cpu, &ec);
        for (int i = 0; i < L.nb; i++) free(L.bufs[i]);
        free(L.bufs), free(L.lin), free(x), free(w), free(o), free(ref), free(row), free(g), free(u), free(ids);
    }
    return failures;
}

/* ---- micro-benchmarks ---- */

static double bench_one(ms_backend *gpu, const ms_moe_runner *r, ms_experts *e, int T, int H, int I, int topk,
                        ms_wfmt fmt, int iters, int *distinct, ms_err *err) {
    ms_moe_shape s = {T, H, I, e->n, topk, fmt, MS_BF16};
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T * topk);
    float *w = malloc(sizeof(float) * (size_t)T * topk);
    uint16_t *x = malloc(2 * (size_t)T * H);
    char *used = calloc((size_t)e->n, 1);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < topk; k++) {
            int ex;
            for (;;) {
                ex = (int)(d_u32() % (uint32_t)e->n);
                int dup = 0;
                for (int j = 0; j < k; j++) dup |= ids[t * topk + j] == ex;
                if (!dup) break;
            }
            ids[t * topk + k] = ex;
            used[ex] = 1;
            w[t * topk + k] = 0.1f;
        }
    *distinct = 0;
    for (int i = 0; i < e->n; i++) *distinct += used[i];
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] = ms_f32_to_bf16(d_f());
    ms_tensor tx = {0}, ti = {0}, tw = {0}, to = {0}, tws = {0};
    size_t wsb = r->workspace_size(gpu, &s);
    double dt = -1;
    int rc = up_t(gpu, &tx, MS_BF16, T, H, x, err);
    if (!rc) rc = up_t(gpu, &ti, MS_I32, T, topk, ids, err);
    if (!rc) rc = up_t(gpu, &tw, MS_F32, T, topk, w, err);
    if (!rc) rc = up_t(gpu, &to, MS_BF16, T, H, NULL, err);
    if (!rc) rc = up_t(gpu, &tws, MS_U8, 1, (int64_t)wsb + 1, NULL, err);
    for (int i = 0; !rc && i < 3; i++) rc = r->run(gpu, e, &tx, ti.data, tw.data, topk, &to, tws.data, wsb, err);
    if (!rc) rc = gpu->ops->sync(gpu, err);
    double t0 = ms_now();
    for (int i = 0; !rc && i < iters; i++) rc = r->run(gpu, e, &tx, ti.data, tw.data, topk, &to, tws.data, wsb, err);
    if (!rc) rc = gpu->ops->sync(gpu, err);
    if (!rc) dt = (ms_now() - t0) / iters;
    ms_tensor *all[5] = {&tx, &ti, &tw, &to, &tws};
    for (int i = 0; i < 5; i++)
        if (all[i]->data) gpu->ops->free(gpu, all[i]);
    free(ids); free(w); free(x); free(used);
    return dt;
}

static void bench(ms_backend *gpu) {
    const int H = 6144, I = 2048, topk = 8;
    const ms_wfmt fmts[2] = {MS_WFMT_NVFP4, MS_WFMT_FP8};
    const int nexp[2] = {64, 24};
    printf("\nmicro-benchmarks (expert layer hidden %d, inter %d, top-%d; times include routing stages):\n", H, I, topk);
    for (int f = 0; f < 2; f++) {
        int n = nexp[f];
        hlayer L = {0};
        L.lin = calloc((size_t)n * 3, sizeof(ms_linear));
        L.bufs = calloc((size_t)n * 6, sizeof(void *));
        for (int i = 0; i < n; i++) {
            fill(&L, &L.lin[i], fmts[f], I, H);
            fill(&L, &L.lin[n + i], fmts[f], I, H);
            fill(&L, &L.lin[2 * n + i], fmts[f], H, I);
        }
        ms_err err = {0};
        ms_experts eg;
        if (place_experts(gpu, L.lin, n, &eg, &err) != MS_OK) {
            printf("  %s: placing weights failed: %s\n", ms_wfmt_name(fmts[f], MS_BF16), err.msg);
        } else {
            double per_expert = (double)ms_linear_nbytes(&eg.gate[0]) * 2 + (double)ms_linear_nbytes(&eg.down[0]);
            for (const ms_moe_runner *const *rp = ms_moe_runners(); *rp; rp++) {
                const ms_moe_runner *r = *rp;
                if (strcmp(r->backend, "cuda") != 0) continue;
                if (r->prepare && r->prepare(gpu, &eg, &err) != MS_OK) continue;
                const int Ts[5] = {1, 4, 16, 64, 2048};
                for (int ti = 0; ti < 5; ti++) {
                    int T = Ts[ti];
                    if (!strcmp(r->name, "naive") && T < 2048 && T != 1) continue;
                    int distinct = 0;
                    double dt = bench_one(gpu, r, &eg, T, H, I, topk, fmts[f], T >= 2048 ? 5 : 30, &distinct, &err);
                    if (dt < 0) {
                        printf("  %-6s %-8s T=%-5d failed: %s\n", ms_wfmt_name(fmts[f], MS_BF16), r->name, T, err.msg);
                        continue;
                    }
                    double gbs = distinct * per_expert / dt / 1e9;
                    double tfl = 2.0 * T * topk * 3.0 * H * I / dt / 1e12;
                    printf("  %-6s %-8s T=%-5d %8.1f us  %7.1f GB/s weights (%d experts)  %6.1f TFLOP/s\n",
                           ms_wfmt_name(fmts[f], MS_BF16), r->name, T, dt * 1e6, gbs, distinct, tfl);
                }
            }
            unplace_experts(gpu, &eg);
        }
        for (int i = 0; i < L.nb; i++) free(L.bufs[i]);
        free(L.bufs);
        free(L.lin);
    }
}

static const ms_opt doctor_opts[] = {
    {"device", NULL, MS_OPT_VALUE, "I", "GPU index to check [0]"},
    {"no-selftest", NULL, MS_OPT_BOOL, NULL, "skip the kernel self-tests"},
    {"bench", NULL, MS_OPT_BOOL, NULL, "also measure bandwidth and GEMM rate"},
    {"interconnect", NULL, MS_OPT_BOOL, NULL, "measure copies, launches, GPU pairs and NCCL all-reduce"},
    {"config", NULL, MS_OPT_VALUE, "FILE|DIR", "with --interconnect: project the collective time per decode step"},
    {"override", NULL, MS_OPT_MULTI, "KEY=VALUE", "config override for the projection"},
    {"tp", NULL, MS_OPT_VALUE, "N", "tensor-parallel ranks of the projection [the GPUs measured]"},
    MS_OPT_END,
};

static const ms_cmd doctor_cmd = {
    "doctor", "[--device I] [--no-selftest] [--bench] [--interconnect [--config FILE --tp N]]",
    "Reports the build, the CPU, memory, the GPUs and their drivers, and self-tests the kernels.",
    {doctor_opts, NULL},
};

/* --interconnect (doctor_ic.c): measures GPU dev's host links and launches, every GPU pair, NCCL
 * all-reduce over the visible GPUs, and with config (file or dir, plus overrides) the collective time
 * per decode step at --tp tp (0 = the GPUs measured). Prints; 0, or 1 when a measurement failed. */
int doctor_interconnect(int dev, const char *config, const char *const *overrides, int n_overrides, int tp);

/* The attention implementations per path, for representative shapes: supported, or refused and why. */
static void print_attention(ms_backend *cpu, ms_backend *gpu) {
    static const struct {
        const char *label;
        ms_attn_shape s;
    } shapes[] = {
        {"GQA (GLM-4.5-Air: 96 heads / 8 KV, d 128)", {MS_ATTN_GQA, 96, 8, 128, 128, 0, 256, 8192, MS_BF16, 0}},
        {"GQA (head dim 96)", {MS_ATTN_GQA, 32, 4, 96, 96, 0, 256, 8192, MS_BF16, 0}},
        {"MLA (GLM-5: 64 heads, 576/512)", {MS_ATTN_MLA, 64, 1, 576, 512, 0, 256, 8192, MS_BF16, 0}},
        {"DSA (GLM-5, top-2048)", {MS_ATTN_DSA, 64, 1, 576, 512, 2048, 256, 8192, MS_BF16, 0}},
    };
    printf("\nattention implementations (--attention-backend for GQA/MLA, --nsa-prefill-backend / "
           "--nsa-decode-backend for DSA; auto = first supported in this order):\n");
    for (const ms_attn_impl *const *ip = ms_attn_impls(); *ip; ip++)
        printf("  %-14s (%s) %s\n", (*ip)->name, (*ip)->backend, (*ip)->algo);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        printf("  %s:\n", shapes[k].label);
        for (const ms_attn_impl *const *ip = ms_attn_impls(); *ip; ip++) {
            const ms_attn_impl *r = *ip;
            ms_backend *b = !strcmp(r->backend, "cuda") ? gpu : cpu;
            ms_attn_shape sh = shapes[k].s;
            if (b) sh.dtype = b->act_dtype;
            char why[256] = "";
            int ok = b && ms_attn_ok(r, b, &sh, why, sizeof why);
            if (!b) snprintf(why, sizeof why, "no %s backend on this machine", r->backend);
            printf("    %-14s %s%s\n", r->name, ok ? "supported" : "refused: ", ok ? "" : why);
        }
    }
}

int cmd_doctor(int argc, char **argv) {
    ms_args a;
    int prc = ms_args_parse(&a, &doctor_cmd, argc, argv);
    if (prc) return ms_args_exit(prc);
    int bad = 0;
    int dev = (int)ms_args_int(&a, "device", 0, &bad);
    int no_self = ms_args_flag(&a, "no-selftest");
    int do_bench = ms_args_flag(&a, "bench");
    int do_ic = ms_args_flag(&a, "interconnect");
    const char *ic_config = ms_args_str(&a, "config", NULL);
    const char *ic_over[64];
    int n_ic_over = ms_args_multi(&a, "override", ic_over, 64);
    int ic_tp = (int)ms_args_int(&a, "tp", 0, &bad);
    (void)dev; /* only used when the build has CUDA */
    if (bad) {
        ms_args_free(&a);
        return 2;
    }
    ms_args_free(&a);
    printf("moeserve doctor\n");
    printf("build: moeserve %s, cuda backend %s\n", MS_VERSION, ms_backend_cuda_compiled() ? "compiled in" : "not compiled (no nvcc at build time)");
    print_cpu();
    ms_backend *gpu = NULL, *cpu = NULL;
    ms_err err = {0};
#ifdef MS_HAVE_CUDA
    int drv = 0, rt = 0;
    ms_cuda_versions(&drv, &rt);
    printf("cuda driver: %d.%d   runtime: %d.%d\n", drv / 1000, (drv % 1000) / 10, rt / 1000, (rt % 1000) / 10);
    int ng = ms_cuda_device_count();
    printf("gpus: %d\n", ng);
    for (int i = 0; i < ng; i++) {
        ms_gpu_info gi;
        ms_err e2 = {0};
        if (ms_cuda_device_info(i, &gi, &e2) != MS_OK) {
            printf("  [%d] unreadable: %s\n", i, e2.msg);
            continue;
        }
        printf("  [%d] %s  cc %d.%d  %d SMs  memory %.1f GiB (%.1f GiB free)\n", i, gi.name, gi.cc_major, gi.cc_minor,
               gi.n_sm, gi.mem_total / 1073741824.0, gi.mem_free / 1073741824.0);
    }
    printf("cuda knobs (environment; once = read at first use, each = at every call):\n");
    ms_cuda_knobs_print(stdout);
    if (ng > 0 && ms_backend_create("cuda", dev, &gpu, &err) != MS_OK) {
        printf("cuda backend on GPU %d: cannot start: %s\n", dev, err.msg);
        gpu = NULL;
    }
#else
    printf("gpus: not probed (build without CUDA)\n");
#endif
    print_nccl();
    if (ms_backend_create("cpu", -1, &cpu, &err) != MS_OK) {
        printf("cpu backend: cannot start: %s\n", err.msg);
        cpu = NULL;
    }
    ms_moe_shape rep = {1, 6144, 2048, 256, 8, MS_WFMT_NVFP4, MS_BF16};
    printf("\nmoe runners (shape: GLM-5 expert layer, nvfp4):\n");
    for (const ms_moe_runner *const *rp = ms_moe_runners(); *rp; rp++) {
        const ms_moe_runner *r = *rp;
        ms_backend *b = !strcmp(r->backend, "cuda") ? gpu : cpu;
        char why[256] = "";
        int ok = b && r->supports(b, &rep, why, sizeof why);
        if (!b) snprintf(why, sizeof why, "no %s backend on this machine", r->backend);
        printf("  %-8s (%s)  %s%s%s\n", r->name, r->backend, ok ? "supported" : "not supported: ", ok ? "" : why, "");
    }
    print_attention(cpu, gpu);
    int failures = 0;
    if (!no_self && cpu) failures += cpu_selftest(cpu);
    if (!no_self && gpu && cpu) failures += selftest(cpu, gpu);
    else if (!no_self) printf("\n(no GPU here: the CUDA runners were not tested)\n");
    if (!no_self) printf("\nself-test: %s\n", failures ? "FAILED" : "all ok");
    if (do_bench && gpu) bench(gpu);
    ms_backend_destroy(gpu);
    gpu = NULL;
    if (do_ic && doctor_interconnect(dev, ic_config, ic_over, n_ic_over, ic_tp)) failures++;
    ms_backend_destroy(cpu);
    return failures ? 1 : 0;
}
