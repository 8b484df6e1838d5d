/* main.cpp - runs the tensor-core GEMV of src/backend/cuda/gemv_mma.cu on the host (through emu.h; the
 * kernel source is included after test_gemv_mma_emu.sh swaps its CUDA-only lines) and compares it
 * with a float64 reference built from the weight formats' definitions: one linear at T = 1..33 in
 * every format with N and K off the tile sizes, K long enough to be staged in slices, and MoE device
 * tables (gate/up fused, then down) with empty groups, inactive slots, a 40-row group (several
 * token passes), a row permutation and row strides wider than N. Weights, x and shared memory are
 * allocated to the byte, so an address sanitizer build also catches any out-of-bounds load. */
#include "gm_emu.cpp"

#include <cstdarg>
#include <random>

/* the library functions the kernel's host side calls */
extern "C" int ms_errf(ms_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}
extern "C" void ms_log(int level, const char *fmt, ...) {
    (void)level;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
extern "C" void ms_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "assertion failed: %s at %s:%d\n", expr, file, line);
    abort();
}

static std::mt19937_64 R(12345);
static ms_backend B;
static cu_impl CI;
static int n_pass, n_fail;

static double e4m3v(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
    return s ? -v : v;
}
static double e2m1v(int c) {
    static const double t[8] = {0, .5, 1, 1.5, 2, 3, 4, 6};
    return (c & 8 ? -1 : 1) * t[c & 7];
}

/* One weight in format fmt (0 bf16, 1 fp8 block-scaled, 2 nvfp4) with random contents, including
 * e4m3 subnormals and zero scales. */
struct Wt {
    int fmt, n, k;
    std::vector<uint8_t> w, sc;
    std::vector<float> scf;
    float s2;
    cu_wdesc d;
};
static void mkw(Wt &W, int fmt, int n, int k, float s2) {
    W.fmt = fmt;
    W.n = n;
    W.k = k;
    W.s2 = s2;
    memset(&W.d, 0, sizeof W.d);
    W.d.fmt = fmt == 0 ? MS_WFMT_PLAIN : fmt == 1 ? MS_WFMT_FP8 : MS_WFMT_NVFP4;
    W.d.dtype = MS_BF16;
    W.d.n = n;
    W.d.k = k;
    if (fmt == 0) {
        W.w.resize((size_t)n * k * 2);
        for (size_t i = 0; i < (size_t)n * k; i++) {
            uint16_t h = ms_f32_to_bf16(std::uniform_real_distribution<float>(-0.2f, 0.2f)(R));
            memcpy(&W.w[2 * i], &h, 2);
        }
    } else if (fmt == 1) {
        W.w.resize((size_t)n * k);
        for (auto &v : W.w) {
            v = (uint8_t)R();
            if ((v & 0x7f) == 0x7f) v ^= 1; /* no NaN */
        }
        int sn = (n + 127) / 128, sk = (k + 127) / 128;
        W.scf.resize((size_t)sn * sk);
        for (auto &v : W.scf) v = 0.001f + 0.004f * (float)(R() % 100) / 100.f;
        W.d.scale_ld = sk;
        W.d.scale = W.scf.data();
    } else {
        W.w.resize((size_t)n * k / 2);
        for (auto &v : W.w) v = (uint8_t)R();
        W.sc.resize((size_t)n * k / 16);
        for (auto &v : W.sc) v = (uint8_t)(R() % 0x7f); /* every finite positive e4m3, 0 and subnormals included */
        W.d.scale_ld = k / 16;
        W.d.scale = W.sc.data();
        W.d.scale2 = s2;
    }
    W.d.w = W.w.data();
}
static double wval(const Wt &W, int n, int k) {
    if (W.fmt == 0) {
        uint16_t h;
        memcpy(&h, &W.w[((size_t)n * W.k + k) * 2], 2);
        return ms_bf16_to_f32(h);
    }
    if (W.fmt == 1) return e4m3v(W.w[(size_t)n * W.k + k]) * W.scf[(size_t)(n / 128) * W.d.scale_ld + k / 128];
    uint8_t q = W.w[(size_t)n * (W.k / 2) + k / 2];
    return e2m1v(k & 1 ? q >> 4 : q & 15) * (e4m3v(W.sc[(size_t)n * (W.k / 16) + k / 16]) * (double)W.s2);
}
static std::vector<uint16_t> mkx(int rows, int k) {
    std::vector<uint16_t> x((size_t)rows * k);
    for (auto &v : x) v = ms_f32_to_bf16(std::uniform_real_distribution<float>(-2.f, 2.f)(R));
    return x;
}
static void check(const char *what, const std::vector<double> &ref, const std::vector<float> &got, double tol) {
    double md = 0, mr = 1e-9;
    int bad = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!std::isfinite(got[i])) { bad++; continue; }
        md = std::max(md, fabs(got[i] - ref[i]));
        mr = std::max(mr, fabs(ref[i]));
    }
    if (bad || md / mr > tol) {
        n_fail++;
        printf("FAIL %s: rel err %.3g, %d non-finite\n", what, md / mr, bad);
    } else {
        n_pass++;
        printf("ok   %s: rel err %.3g\n", what, md / mr);
    }
}

/* One linear: y [T,N] = x [T,K] · Wᵀ. */
static void single(int fmt, int T, int N, int K, int yf32) {
    char what[128];
    snprintf(what, sizeof what, "linear fmt=%d T=%d N=%d K=%d y=%s", fmt, T, N, K, yf32 ? "f32" : "bf16");
    Wt W;
    mkw(W, fmt, N, K, 0.037f);
    std::vector<uint16_t> x = mkx(T, K);
    std::vector<double> ref((size_t)T * N);
    for (int r = 0; r < T; r++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += ms_bf16_to_f32(x[(size_t)r * K + k]) * wval(W, n, k);
            ref[(size_t)r * N + n] = s;
        }
    std::vector<uint16_t> yb((size_t)T * N, 0xffff);
    std::vector<float> yf((size_t)T * N, NAN), got((size_t)T * N);
    ms_err err = {};
    if (!cu_gemv_mma_usable(&B, &W.d, x.data(), 1)) {
        n_fail++;
        printf("FAIL %s: not usable\n", what);
        return;
    }
    const cu_gemv_call c = {.mode = 0, .n_groups = 1, .w0 = W.d, .rows_total = T, .x = (const bf16 *)x.data(),
                            .y = yf32 ? (void *)yf.data() : (void *)yb.data(), .y_type = yf32 ? MS_F32 : MS_BF16,
                            .ldy = N};
    int rc = cu_gemv_mma(&B, &c, &err);
    if (rc) {
        n_fail++;
        printf("FAIL %s: %s\n", what, err.msg);
        return;
    }
    for (size_t i = 0; i < got.size(); i++) got[i] = yf32 ? yf[i] : ms_bf16_to_f32(yb[i]);
    check(what, ref, got, yf32 ? 2e-5 : 8e-3);
}

/* MoE layer through the device-table form: E experts, counts[e] rows each (grouped by expert, x
 * rows permuted), slots launched groups of which the active ones come first in reverse order. */
static void moe(int fmt, int E, int H, int I, const std::vector<int> &counts, int hint) {
    std::vector<Wt> G(E), U(E), D(E);
    std::vector<cu_wdesc> gd(E), ud(E), dd(E);
    for (int e = 0; e < E; e++) {
        mkw(G[e], fmt, I, H, 0.037f);
        mkw(U[e], fmt, I, H, 0.05f);
        mkw(D[e], fmt, H, I, 0.029f);
        gd[e] = G[e].d;
        ud[e] = U[e].d;
        dd[e] = D[e].d;
    }
    int P = 0;
    std::vector<int32_t> off(E), cnt(E);
    for (int e = 0; e < E; e++) {
        off[e] = P;
        cnt[e] = counts[e];
        P += counts[e];
    }
    const int T = P + 3;
    std::vector<uint16_t> x = mkx(T, H);
    std::vector<int32_t> ridx(P), active;
    for (int i = 0; i < P; i++) ridx[i] = (i * 7 + 3) % T;
    for (int e = E - 1; e >= 0; e--)
        if (cnt[e] > 0) active.push_back(e);
    int32_t nact = (int32_t)active.size();
    active.resize(E, 0);
    char what[160];
    snprintf(what, sizeof what, "moe gate/up fmt=%d E=%d H=%d I=%d rows=%d hint=%d", fmt, E, H, I, P, hint);
    const int ldh = I + 5;
    std::vector<uint16_t> h((size_t)P * ldh, 0xffff);
    ms_err err = {};
    if (!cu_gemv_mma_usable(&B, &gd[0], x.data(), 0)) {
        n_fail++;
        printf("FAIL %s: not usable\n", what);
        return;
    }
    const cu_gemv_call gate_up = {.mode = 1, .n_groups = E, .W0 = gd.data(), .W1 = ud.data(), .w0 = gd[0],
                                  .n_active = &nact, .group_w = active.data(), .row_off = off.data(),
                                  .row_cnt = cnt.data(), .row_idx = ridx.data(), .rows_total = hint,
                                  .x = (const bf16 *)x.data(), .y = h.data(), .y_type = MS_BF16, .ldy = ldh};
    int rc = cu_gemv_mma(&B, &gate_up, &err);
    if (rc) {
        n_fail++;
        printf("FAIL %s: %s\n", what, err.msg);
        return;
    }
    std::vector<double> ref;
    std::vector<float> got;
    for (int e = 0; e < E; e++)
        for (int r = 0; r < cnt[e]; r++)
            for (int n = 0; n < I; n++) {
                const int xr = ridx[off[e] + r];
                double g = 0, u = 0;
                for (int k = 0; k < H; k++) {
                    const double xv = ms_bf16_to_f32(x[(size_t)xr * H + k]);
                    g += xv * wval(G[e], n, k);
                    u += xv * wval(U[e], n, k);
                }
                ref.push_back(g / (1 + exp(-g)) * u);
                got.push_back(ms_bf16_to_f32(h[(size_t)(off[e] + r) * ldh + n]));
            }
    check(what, ref, got, 1e-2);
    /* down on the packed h rows, f32 out with a wider row stride that must stay untouched past H */
    std::vector<uint16_t> hx((size_t)P * I);
    for (int p = 0; p < P; p++) memcpy(&hx[(size_t)p * I], &h[(size_t)p * ldh], (size_t)I * 2);
    const int ldy = H + 3;
    std::vector<float> y((size_t)P * ldy, NAN);
    snprintf(what, sizeof what, "moe down fmt=%d E=%d H=%d I=%d rows=%d hint=%d", fmt, E, H, I, P, hint);
    const cu_gemv_call down = {.mode = 0, .n_groups = E, .W0 = dd.data(), .w0 = dd[0], .n_active = &nact,
                               .group_w = active.data(), .row_off = off.data(), .row_cnt = cnt.data(),
                               .rows_total = hint, .x = (const bf16 *)hx.data(), .y = y.data(), .y_type = MS_F32,
                               .ldy = ldy};
    rc = cu_gemv_mma(&B, &down, &err);
    if (rc) {
        n_fail++;
        printf("FAIL %s: %s\n", what, err.msg);
        return;
    }
    ref.clear();
    got.clear();
    int stray = 0;
    for (int e = 0; e < E; e++)
        for (int r = 0; r < cnt[e]; r++) {
            const int p = off[e] + r;
            for (int n = 0; n < H; n++) {
                double s = 0;
                for (int k = 0; k < I; k++) s += ms_bf16_to_f32(hx[(size_t)p * I + k]) * wval(D[e], n, k);
                ref.push_back(s);
                got.push_back(y[(size_t)p * ldy + n]);
            }
            for (int c = H; c < ldy; c++) stray += !std::isnan(y[(size_t)p * ldy + c]);
        }
    check(what, ref, got, 2e-5);
    if (stray) {
        n_fail++;
        printf("FAIL %s: %d writes past N\n", what, stray);
    }
}

int main(void) {
    B.gpu.cc_major = 9;
    B.gpu.n_sm = 132;
    CI.max_smem_optin = 232448; /* H100/H200 */
    B.impl = &CI;
    /* one linear: T across n-tile and pass boundaries; N off 16, K off the 64-byte super-step */
    const int Ts[5] = {1, 3, 9, 16, 33};
    for (int i = 0; i < 5; i++) {
        single(0, Ts[i], 70, 88, i & 1);
        single(1, Ts[i], 200, 208, !(i & 1));
        single(2, Ts[i], 130, 160, i & 1);
    }
    /* 16 tokens of these K exceed the staging budget: K sliced and double-buffered */
    single(0, 16, 40, 3112, 1);
    single(1, 16, 200, 1552, 1);
    single(2, 16, 66, 2080, 1);
    /* MoE tables: empty and inactive groups, one group of 40 rows (3 passes of 16), batch-1 style */
    for (int fmt = 0; fmt < 3; fmt++) {
        const int H = fmt == 0 ? 200 : fmt == 1 ? 208 : 160, I = fmt == 0 ? 88 : fmt == 1 ? 80 : 96;
        moe(fmt, 6, H, I, {3, 0, 1, 40, 5, 0}, 64);
        moe(fmt, 6, H, I, {1, 0, 1, 0, 1, 1}, 1);
        moe(fmt, 4, H, I, {0, 7, 9, 0}, 9);
    }
    /* few groups and a long K: gate/up split over K across warps (partials summed in shared memory) */
    moe(2, 2, 1024, 64, {1, 2}, 2);
    moe(1, 2, 1024, 64, {1, 0}, 1);
    moe(0, 2, 512, 48, {3, 1}, 3);
    /* nvfp4 with K % 128 == 0, which MS_CU_GEMV_FP4=v3 streams through shared memory (the other
     * nvfp4 cases above take its v2 fallback): several warps' rings, K split, passes, sliced x */
    single(2, 1, 130, 384, 0);
    single(2, 9, 40, 4096, 1);
    single(2, 33, 24, 1024, 0);
    single(2, 16, 20, 2176, 1);
    moe(2, 6, 256, 128, {3, 0, 1, 40, 5, 0}, 64);
    moe(2, 4, 1024, 128, {1, 0, 2, 1}, 1);
    printf("## test_gemv_mma_emu: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}
