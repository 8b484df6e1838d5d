/* main.cpp - the streaming bf16 GEMV (k_gvb, src/backend/cuda/gemv_bf16.cu) run on the host through
 * gvb_emu.h, both steps: CUDA cores (TC 0) and tensor cores (TC 1, gemv_tc.cuh's placement of each
 * lane's 16 bytes on the diagonals of two mma). Every launch is compared with a float64 reference, for
 * the shapes the host's plan can give (K splits 1, 2, 4; several rows a warp; warps and blocks with no
 * rows) and the ones that reach the form's edges: a row of K not a multiple of 256 (lanes past a K
 * share in a row's last run, which must meet zero weights and finite x), 1..3 rows of x, the fused
 * gate/up mode, the folded-norm instance, rings of 10 and 12 stages (the template's depth; the GPU runs
 * 8, and 12 under MS_CU_BF16_STREAM_DEEPK), the L2 prefetch before the wait (MS_CU_BF16_STREAM_L2PF: the
 * recorded pieces must cover each warp's next steps after its ring's exactly once), and an infinite x value in one row of x that must not reach another row's results. Shared memory
 * starts as NaN (emu.h's poison), so x read past what the kernel staged shows. The GPU's own mma and
 * timing are test_cuda_ops' and the benchmarks' (GPU machine). */
#include "gvb_emu.cpp"

#include <random>

static int n_pass, n_fail;

struct gcase {
    const char *what;
    int N, K, NT, mode, ks, rpw;
    int bias, y_f32; /* mode 0 */
    int inf_row;     /* >= 0: x[inf_row][0] = +inf (needs NT > 1; the other rows are checked) */
    int D;           /* ring stages (0: GB_D; 10 or 12: deeper rings, NT 1, mode 0) */
    int pf;          /* > 0: the early copies with this many steps a warp asked of the L2 (MS_CU_BF16_STREAM_L2PF) */
};

/* The 16-byte units of w that the L2 prefetches of a launch must cover, once each: for every warp (the
 * kernel's work split, written out here from its file comment) the units of its steps D - 1 ..
 * D - 2 + pf, a step being one 32-unit run of a row's K share (the last run of a share may be shorter). */
static std::vector<int> pf_expected(const gcase &c, int D, int kc_plan, int rows_pb, int grid) {
    const int K8 = c.K / 8;
    std::vector<int> cov((size_t)c.N * K8, 0);
    for (int b = 0; b < grid; b++)
        for (int w = 0; w < GB_WARPS; w++) {
            const int rg = w / c.ks, kq = w % c.ks, r0 = b * rows_pb + rg * c.rpw;
            const int nrow = std::max(0, std::min(c.rpw, c.N - r0)), c0 = kq * kc_plan;
            const int kc = std::max(0, std::min(kc_plan, K8 - c0)), spr = (kc + 31) / 32;
            for (int s = D - 1; s < std::min(nrow * spr, D - 1 + c.pf); s++) {
                const int row = s / spr, run = s % spr;
                for (int u = run * 32; u < std::min(run * 32 + 32, kc); u++) cov[(size_t)(r0 + row) * K8 + c0 + u]++;
            }
        }
    return cov;
}

/* The recorded prefetches of one weight matrix w (N x K bf16) as unit counts; a piece that is not 16-byte
 * aligned, is empty, or leaves w counts as an error. Pieces of the other stream are skipped. */
static int pf_recorded(const gcase &c, const uint16_t *w, std::vector<int> &cov) {
    const int K8 = c.K / 8;
    const char *lo = (const char *)w, *hi = lo + (size_t)c.N * c.K * 2;
    cov.assign((size_t)c.N * K8, 0);
    int bad = 0;
    for (const emu_pf &f : EMU_PF) {
        if (f.p < lo || f.p >= hi) continue;
        if ((f.p - lo) % 16 || f.n % 16 || !f.n || f.p + f.n > hi) {
            bad++;
            continue;
        }
        for (unsigned i = 0; i < f.n / 16; i++) cov[(size_t)(f.p - lo) / 16 + i]++;
    }
    return bad;
}

static uint16_t bfr(std::mt19937 &r, float scale) {
    std::uniform_real_distribution<float> u(-scale, scale);
    return ms_f32_to_bf16(u(r));
}

template <int NT, int MODE, int TC, int D = GB_D>
static void launch(const gb_args &a, int rows_pb, size_t smem) {
    gridDim = dim3((unsigned)((a.N + rows_pb - 1) / rows_pb));
    emu_launch(k_gvb<NT, MODE, TC, D>, gridDim, GB_THREADS, smem, a);
}

template <int NT>
static void run_nt(const gcase &c, int tc, const gb_args &a, int rows_pb, size_t smem) {
    if (c.D) {
        if constexpr (NT == 1) {
            if (c.mode != 0 || (c.D != 10 && c.D != 12)) abort();
            if (c.D == 10) (tc ? launch<1, 0, 1, 10> : launch<1, 0, 0, 10>)(a, rows_pb, smem);
            else (tc ? launch<1, 0, 1, 12> : launch<1, 0, 0, 12>)(a, rows_pb, smem);
        } else {
            abort();
        }
    } else if (c.mode == 0) (tc ? launch<NT, 0, 1> : launch<NT, 0, 0>)(a, rows_pb, smem);
    else if (c.mode == 1) (tc ? launch<NT, 1, 1> : launch<NT, 1, 0>)(a, rows_pb, smem);
    else if constexpr (NT == 1) (tc ? launch<1, 2, 1> : launch<1, 2, 0>)(a, rows_pb, smem);
    else abort();
}

static void run_case(const gcase &c, unsigned seed) {
    std::mt19937 r(seed);
    const int S = c.mode == 1 ? 2 : 1, K8 = c.K / 8;
    std::vector<uint16_t> w0((size_t)c.N * c.K), w1(c.mode == 1 ? (size_t)c.N * c.K : 0), x((size_t)c.NT * c.K);
    for (auto &v : w0) v = bfr(r, 0.5f);
    for (auto &v : w1) v = bfr(r, 0.5f);
    for (auto &v : x) v = bfr(r, 2.f);
    if (c.inf_row >= 0) x[(size_t)c.inf_row * c.K] = 0x7f80; /* +inf */
    std::vector<float> bias(c.N);
    for (auto &v : bias) v = (float)(r() % 1000) / 250.f - 2.f;
    /* the plan's fields as cu_gemv_bf16 sets them, for the given K split and rows a warp */
    const int rows_pb = (GB_WARPS / c.ks) * c.rpw, rpw_cap = 64;
    const int red_units = GB_WARPS * rpw_cap * S * c.NT / 4;
    for (int tc = 0; tc < 2; tc++) {
        const size_t smem = gb_smem_bytes(c.NT, c.K, S, tc, red_units, c.D ? c.D : GB_D);
        const int yt = c.mode == 0 && c.y_f32 ? MS_F32 : MS_BF16, ldy = c.N + 3;
        std::vector<float> yf((size_t)c.NT * ldy, NAN);
        std::vector<uint16_t> yb((size_t)c.NT * ldy, 0x7fc0);
        gb_args a;
        memset(&a, 0, sizeof a);
        a.w0 = (const bf16 *)w0.data();
        a.w1 = c.mode == 1 ? (const bf16 *)w1.data() : a.w0;
        a.bias = c.mode == 0 && c.bias ? bias.data() : NULL;
        a.x = (const bf16 *)x.data();
        a.y = yt == MS_F32 ? (void *)yf.data() : (void *)yb.data();
        a.y_type = yt, a.ldy = ldy, a.N = c.N, a.K = c.K, a.ks = c.ks, a.rpw = c.rpw;
        a.kc = gd_share(K8, c.ks);
        a.early = c.pf ? 1 | c.pf << 1 : (seed & 1) != 0;
        EMU_PF.clear();
        a.red_units = red_units;
        a.nin.src = (const uint4 *)x.data();
        if (c.NT == 1) run_nt<1>(c, tc, a, rows_pb, smem);
        else if (c.NT == 2) run_nt<2>(c, tc, a, rows_pb, smem);
        else if (c.NT == 3) run_nt<3>(c, tc, a, rows_pb, smem);
        else abort();
        int bad = 0;
        double worst = 0;
        for (int t = 0; t < c.NT; t++) {
            if (t == c.inf_row) continue;
            for (int n = 0; n < c.N; n++) {
                double s[2] = {0, 0}, mag[2] = {0, 0};
                for (int k = 0; k < c.K; k++) {
                    const double xv = ms_bf16_to_f32(x[(size_t)t * c.K + k]);
                    const double p0 = ms_bf16_to_f32(w0[(size_t)n * c.K + k]) * xv;
                    s[0] += p0, mag[0] += fabs(p0);
                    if (S == 2) {
                        const double p1 = ms_bf16_to_f32(w1[(size_t)n * c.K + k]) * xv;
                        s[1] += p1, mag[1] += fabs(p1);
                    }
                }
                double ref, tol;
                if (c.mode == 1) {
                    ref = s[0] / (1 + exp(-s[0])) * s[1];
                    tol = 1e-5 * (mag[0] * fabs(s[1]) + mag[1] * fabs(s[0]) + mag[0] * mag[1] * 1e-5) + fabs(ref) / 128 + 1e-30;
                } else {
                    ref = s[0] + (a.bias ? bias[n] : 0);
                    tol = 1e-5 * mag[0] + (yt == MS_F32 ? 0 : fabs(ref) / 128) + 1e-30;
                }
                const double got = yt == MS_F32 ? yf[(size_t)t * ldy + n] : ms_bf16_to_f32(yb[(size_t)t * ldy + n]);
                const double e = fabs(got - ref);
                if (!(e <= tol)) {
                    if (bad++ < 3)
                        fprintf(stderr, "  %s TC %d: y[%d][%d] = %.9g, float64 %.9g (tol %.3g)\n", c.what, tc, t, n, got, ref, tol);
                } else if (e / tol > worst) {
                    worst = e / tol;
                }
            }
        }
        /* the L2 prefetches: exactly each warp's next pf steps after its ring's, in each weight stream */
        {
            const int D = c.D ? c.D : GB_D, grid = (c.N + rows_pb - 1) / rows_pb;
            const std::vector<int> want = c.pf ? pf_expected(c, D, a.kc, rows_pb, grid) : std::vector<int>((size_t)c.N * K8, 0);
            for (int s = 0; s < S; s++) {
                std::vector<int> got;
                const int badp = pf_recorded(c, s ? w1.data() : w0.data(), got);
                size_t diff = 0, nwant = 0;
                for (size_t i = 0; i < want.size(); i++) diff += got[i] != want[i], nwant += want[i];
                if (badp || diff || (c.pf && !nwant)) {
                    bad++;
                    fprintf(stderr, "  %s TC %d stream %d: %d malformed prefetches, %zu of %zu units covered wrongly (%zu wanted)\n",
                            c.what, tc, s, badp, diff, want.size(), nwant);
                }
            }
            if (c.pf == 0 && !EMU_PF.empty()) bad++, fprintf(stderr, "  %s TC %d: prefetches without the knob\n", c.what, tc);
        }
        /* nothing written past the N outputs of a row */
        for (int t = 0; t < c.NT; t++)
            for (int n = c.N; n < ldy; n++)
                if (yt == MS_F32 ? !std::isnan(yf[(size_t)t * ldy + n]) : yb[(size_t)t * ldy + n] != 0x7fc0) bad++;
        if (bad) {
            n_fail++;
            printf("FAIL %s (TC %d): %d outputs wrong\n", c.what, tc, bad);
        } else {
            n_pass++;
            printf("ok   %s (TC %d): worst error %.2f of its bound\n", c.what, tc, worst);
        }
    }
}

int main() {
    const gcase cases[] = {
        /* what, N, K, NT, mode, ks, rpw, bias, y_f32, inf_row */
        {"one row of x, K 4096, whole rows, 2 a warp, bias, f32", 37, 4096, 1, 0, 1, 2, 1, 1, -1},
        {"one row, K 808 (runs of 5 lanes at a row's end), 3 rows a warp, bf16", 50, 808, 1, 0, 1, 3, 0, 0, -1},
        {"two rows of x, K 808, whole rows, bias, f32", 29, 808, 2, 0, 1, 1, 1, 1, -1},
        {"three rows of x, K 1344 in 2 shares (the last of 72 chunks), f32", 21, 1344, 3, 0, 2, 1, 0, 1, -1},
        {"one row, K 4096 in 4 shares, 5 rows a warp (the last block's second row group without rows)", 93, 4096, 1, 0, 4, 5, 1, 1, -1},
        {"fused gate/up, one row, K 1344 in 2 shares", 33, 1344, 1, 1, 2, 1, 0, 0, -1},
        {"fused gate/up, two rows of x, K 808, 2 rows a warp", 19, 808, 2, 1, 1, 2, 0, 0, -1},
        {"folded-norm instance, K 808, 2 rows a warp", 27, 808, 1, 2, 1, 2, 1, 1, -1},
        {"two rows of x, x[1][0] infinite, K 808: row 0 unharmed", 23, 808, 2, 0, 1, 2, 0, 1, 1},
        {"three rows of x, x[0][0] infinite, K 1344 in 2 shares: rows 1, 2 unharmed", 17, 1344, 3, 0, 2, 1, 0, 1, 0},
        {"ring of 10 stages, K 808, 3 rows a warp, bias", 41, 808, 1, 0, 1, 3, 1, 1, -1, 10},
        {"ring of 12 stages, K 1344 in 2 shares, 2 rows a warp", 45, 1344, 1, 0, 2, 2, 0, 1, -1, 12},
        {"ring of 12 stages, K 4096 in 4 shares, a row shorter than the ring", 30, 4096, 1, 0, 4, 1, 1, 0, -1, 12},
        /* the L2 prefetch before the wait: within a row, across rows, past a warp's last step, partial runs */
        {"L2 prefetch of 5 steps, K 4096 (16 runs a row), 2 rows a warp", 37, 4096, 1, 0, 1, 2, 1, 1, -1, 0, 5},
        {"L2 prefetch of 40 steps (past every warp's end), K 808, 3 rows a warp", 50, 808, 1, 0, 1, 3, 0, 0, -1, 0, 40},
        {"L2 prefetch of 3 steps, K 1344 in 2 shares (partial last runs), 4 rows a warp", 61, 1344, 1, 0, 2, 4, 0, 1, -1, 0, 3},
        {"L2 prefetch of 7 steps, fused gate/up (both streams), K 808, 2 rows a warp", 19, 808, 1, 1, 1, 2, 0, 0, -1, 0, 7},
        {"L2 prefetch of 9 steps, two rows of x, K 4104 in 4 shares", 26, 4104, 2, 0, 4, 3, 0, 1, -1, 0, 9},
        {"L2 prefetch of 20 steps, ring of 12 stages, K 4096 in 2 shares, 3 rows a warp", 45, 4096, 1, 0, 2, 3, 1, 1, -1, 12, 20},
    };
    unsigned seed = 1;
    for (const gcase &c : cases) run_case(c, seed++);
    const char *early = getenv("MS_EMU_CP_EARLY");
    printf("## test_gemv_tc_emu%s: %d passed, %d failed\n", early && atoi(early) ? " (copies landing at issue)" : "", n_pass,
           n_fail);
    return n_fail ? 1 : 0;
}
