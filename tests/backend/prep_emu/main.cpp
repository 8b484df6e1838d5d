/* main.cpp - the fused indexer-key kernel k_idx_k_prep and the rotating rope-part copy k_copy_rope
 * (src/backend/cuda/elementwise.cu, cut into prep_cut.cpp by test_prep_emu.sh) run on the host, every
 * thread of a block a host thread (__syncthreads a block barrier, the warp sum a per-warp butterfly
 * through shared slots), blocks one after another. Each fused kernel is held to the kernels it replaces,
 * emulated the same way from the same file: k_idx_k_prep to k_norm (layernorm) + k_rope + k_kv_store,
 * k_copy_rope to k_rope on q followed by the plain copy; bit for bit on the key rows, the whole cache
 * (rows it must not touch, a padding slot) and the whole q_abs buffer (columns it must not touch), and
 * within bf16 rounding of a float64 LayerNorm + RoPE. Host sinf/cosf stand in for sincosf on both
 * sides: the GPU's own float ops are test_cuda_ops' to check on the GPU machine. */
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

/* ---- CUDA shims ---- */
struct bf16 {
    uint16_t v;
};
static inline float __bfloat162float(bf16 h) {
    uint32_t u = (uint32_t)h.v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline bf16 __float2bfloat16_rn(float f) { /* round to nearest even (no NaN inputs here) */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16{(uint16_t)(u >> 16)};
}
struct dim3 {
    unsigned x, y, z;
};
static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static thread_local float *EMU_SH; /* the block's __shared__ float sh[32] */
static thread_local float *EMU_WB; /* one float per thread for the warp sums */
static std::barrier<> *BAR;
static inline void __syncthreads() { BAR->arrive_and_wait(); }
static inline void cu_pdl_wait() {}
static inline void cu_pdl_trigger() {}
static inline void emu_sincosf(float a, float *s, float *c) {
    *s = sinf(a);
    *c = cosf(a);
}
#define sincosf emu_sincosf
enum { MS_F32 = 0, MS_BF16 = 1 };
static inline float cu_ld(const void *p, int dt, size_t i) {
    return dt == MS_F32 ? ((const float *)p)[i] : __bfloat162float(((const bf16 *)p)[i]);
}
static inline void cu_st(void *p, int dt, size_t i, float v) {
    if (dt == MS_F32) ((float *)p)[i] = v;
    else ((bf16 *)p)[i] = __float2bfloat16_rn(v);
}
/* __shfl_xor_sync butterfly of the warp (every lane ends with the same order of additions as on the GPU) */
static inline float warp_sum(float v) {
    const int t = threadIdx.x, w = t / 32, l = t % 32;
    EMU_WB[t] = v;
    __syncthreads();
    float a[32];
    for (int i = 0; i < 32; i++) a[i] = EMU_WB[w * 32 + i];
    for (int o = 16; o > 0; o >>= 1) {
        float b[32];
        for (int i = 0; i < 32; i++) b[i] = a[i] + a[i ^ o];
        memcpy(a, b, sizeof a);
    }
    __syncthreads();
    return a[l];
}
#define __global__
#define __device__
#define __forceinline__ inline
using std::max;
using std::min;
#include "prep_cut.cpp"

/* One launch: grid g of blocks of bd threads (a multiple of 32). bd host threads run the blocks one
 * after another, all of a block's threads together, meeting at a barrier between blocks. */
static void launch(dim3 g, unsigned bd, const std::function<void()> &body) {
    gridDim = g;
    blockDim = dim3{bd, 1, 1};
    std::vector<float> sh(32, NAN), wb(bd, NAN);
    std::barrier<> bar((std::ptrdiff_t)bd);
    BAR = &bar;
    std::vector<std::thread> th;
    for (unsigned t = 0; t < bd; t++)
        th.emplace_back([&, t] {
            threadIdx = dim3{t, 0, 0};
            EMU_SH = sh.data();
            EMU_WB = wb.data();
            for (unsigned by = 0; by < g.y; by++)
                for (unsigned bx = 0; bx < g.x; bx++) {
                    blockIdx = dim3{bx, by, 0};
                    body();
                    __syncthreads(); /* the block ends before the next one uses the shared slots */
                }
        });
    for (auto &x : th) x.join();
}

static std::mt19937 R(7);
static int n_pass, n_fail;
static bf16 rnd_bf(float amp) { return __float2bfloat16_rn(std::uniform_real_distribution<float>(-amp, amp)(R)); }
static std::vector<float> inv_freq(int rot_dim, float theta) { /* as rope_table */
    std::vector<float> f(rot_dim / 2 + 1);
    for (int i = 0; i < rot_dim / 2; i++) f[i] = 1.0f / powf(theta, (float)(2 * i) / (float)rot_dim);
    return f;
}
static void ref_rope(double *v, int pos, int rot_dim, int il, double theta) {
    std::vector<double> t(v, v + rot_dim);
    for (int i = 0; i < rot_dim / 2; i++) {
        const double a = pos * pow(theta, -2.0 * i / rot_dim), cs = cos(a), sn = sin(a);
        const int i0 = il ? 2 * i : i, i1 = il ? 2 * i + 1 : i + rot_dim / 2;
        v[i0] = t[i0] * cs - t[i1] * sn;
        v[i1] = t[i1] * cs + t[i0] * sn;
    }
}
static int n_diff(const std::vector<bf16> &a, const std::vector<bf16> &b) {
    int n = 0;
    for (size_t i = 0; i < a.size(); i++) n += a[i].v != b[i].v;
    return n;
}

/* T keys of width D at positions 37, 42, ..., slots with gaps in a cache of 3T+5 rows (token 1 a
 * padding slot -1 when T > 2), the rotation rd dims from ro. */
static void idx_case(int T, int D, int ro, int rd, int il, int with_bias) {
    const int S = 3 * T + 5;
    std::vector<bf16> x(T * D), w(D), b(D), c(S * D);
    for (auto &v : x) v = rnd_bf(3);
    for (auto &v : w) v = rnd_bf(1);
    for (auto &v : b) v = rnd_bf(0.5f);
    for (auto &v : c) v = rnd_bf(1);
    std::vector<int32_t> pos(T), slot(T);
    for (int t = 0; t < T; t++) pos[t] = 37 + 5 * t, slot[t] = S - 1 - 3 * t;
    if (T > 2) slot[1] = -1;
    const std::vector<float> inv = inv_freq(rd, 1e6f);
    const std::vector<bf16> x0 = x;
    std::vector<bf16> x2 = x, c2 = c;
    const bf16 *bp = with_bias ? b.data() : nullptr;
    const unsigned th = (unsigned)ln_threads(D);
    launch(dim3{(unsigned)T, 1, 1}, th, [&] {
        k_idx_k_prep(x.data(), MS_BF16, D, w.data(), MS_BF16, bp, MS_BF16, 1e-6f, pos.data(), inv.data(), ro, rd, il,
                     c.data(), MS_BF16, S, slot.data());
    });
    /* the three ops as cu_op_layernorm, cu_op_rope and cu_op_kv_store launch them */
    launch(dim3{(unsigned)T, 1, 1}, th, [&] {
        k_norm(2, x2.data(), MS_BF16, nullptr, 0, w.data(), MS_BF16, bp, MS_BF16, 1e-6f, x2.data(), MS_BF16, D);
    });
    const unsigned per_tok = (unsigned)std::min((rd / 2 + 255) / 256, 16);
    if (rd)
        launch(dim3{(unsigned)T, per_tok, 1}, 256,
               [&] { k_rope(x2.data(), MS_BF16, 1, D, pos.data(), inv.data(), ro, rd, il); });
    launch(dim3{(unsigned)T, 1, 1}, 256, [&] { k_kv_store(c2.data(), MS_BF16, S, x2.data(), MS_BF16, D, slot.data()); });
    const int nk = n_diff(x, x2), nc = n_diff(c, c2);
    /* float64 reference of the key rows */
    double md = 0, mx = 1e-6;
    std::vector<double> r(D);
    for (int t = 0; t < T; t++) {
        double m = 0, v = 0;
        for (int i = 0; i < D; i++) m += __bfloat162float(x0[t * D + i]);
        m /= D;
        for (int i = 0; i < D; i++) v += (__bfloat162float(x0[t * D + i]) - m) * (__bfloat162float(x0[t * D + i]) - m);
        const double rs = 1.0 / sqrt(v / D + 1e-6);
        for (int i = 0; i < D; i++)
            r[i] = (__bfloat162float(x0[t * D + i]) - m) * rs * __bfloat162float(w[i]) + (bp ? __bfloat162float(b[i]) : 0.0);
        ref_rope(r.data() + ro, pos[t], rd, il, 1e6);
        for (int i = 0; i < D; i++) {
            md = std::max(md, fabs(r[i] - __bfloat162float(x[t * D + i])));
            mx = std::max(mx, fabs(r[i]));
        }
    }
    const bool ok = nk == 0 && nc == 0 && md <= 1e-2 * mx;
    if (!ok)
        printf("FAIL idx_k_prep T %d D %d rot %d+%d il %d bias %d: %d key / %d cache values differ from the three "
               "kernels, %g off float64 (scale %g)\n", T, D, ro, rd, il, with_bias, nk, nc, md, mx);
    ok ? n_pass++ : n_fail++;
}

/* q [T, nh, dn+dr] at positions 11, 18, ...: the rope part copied into q_abs [T, nh, kvl+dr] (its first
 * kvl columns left as they were) and rotated rd dims from q column ro; q itself unchanged. */
static void absorb_case(int T, int nh, int dn, int dr, int kvl, int ro, int rd, int il) {
    std::vector<bf16> q(T * nh * (dn + dr)), o(T * nh * (kvl + dr));
    for (auto &v : q) v = rnd_bf(1);
    for (auto &v : o) v = rnd_bf(1);
    std::vector<bf16> q2 = q, o2 = o;
    const std::vector<bf16> q0 = q;
    std::vector<int32_t> pos(T);
    for (int t = 0; t < T; t++) pos[t] = 11 + 7 * t;
    const std::vector<float> inv = inv_freq(rd, 1e4f);
    const size_t tot = (size_t)T * nh * (dr - rd / 2); /* as cu_copy_rope_part launches it */
    launch(dim3{(unsigned)std::min<size_t>((tot + 255) / 256, 65535), 1, 1}, 256,
           [&] { k_copy_rope(q.data(), o.data(), T, nh, dn, dr, kvl, pos.data(), inv.data(), ro - dn, rd, il); });
    /* before: k_rope on q in place, then the plain copy (k_copy_rope without rotation) */
    const unsigned per_tok = (unsigned)std::min((nh * (rd / 2) + 255) / 256, 16);
    launch(dim3{(unsigned)T, per_tok, 1}, 256,
           [&] { k_rope(q2.data(), MS_BF16, nh, dn + dr, pos.data(), inv.data(), ro, rd, il); });
    launch(dim3{(unsigned)std::min<size_t>(((size_t)T * nh * dr + 255) / 256, 65535), 1, 1}, 256,
           [&] { k_copy_rope(q2.data(), o2.data(), T, nh, dn, dr, kvl, pos.data(), nullptr, 0, 0, 0); });
    const int no = n_diff(o, o2), nq = n_diff(q, q0);
    double md = 0, mx = 1e-6;
    std::vector<double> r(dr);
    for (int th = 0; th < T * nh; th++) {
        for (int j = 0; j < dr; j++) r[j] = __bfloat162float(q0[th * (dn + dr) + dn + j]);
        ref_rope(r.data() + ro - dn, pos[th / nh], rd, il, 1e4);
        for (int j = 0; j < dr; j++) {
            md = std::max(md, fabs(r[j] - __bfloat162float(o[th * (kvl + dr) + kvl + j])));
            mx = std::max(mx, fabs(r[j]));
        }
    }
    const bool ok = no == 0 && nq == 0 && md <= 1e-2 * mx;
    if (!ok)
        printf("FAIL absorb rope T %d nh %d dn %d dr %d kvl %d rot %d+%d il %d: %d q_abs values differ from rope + "
               "copy, q changed in %d, %g off float64 (scale %g)\n", T, nh, dn, dr, kvl, ro, rd, il, no, nq, md, mx);
    ok ? n_pass++ : n_fail++;
}

int main() {
    for (int T : {1, 3, 17}) {
        idx_case(T, 128, 0, 64, 0, 1); /* GLM-5: 128-wide keys, NeoX rotation of the first 64 */
        idx_case(T, 128, 0, 64, 1, 0); /* interleaved, no bias */
        idx_case(T, 24, 8, 8, 1, 1);   /* rotation in the middle of an odd row */
        idx_case(T, 300, 36, 128, 0, 1); /* wider than the block (256 threads) */
        idx_case(T, 37, 5, 0, 0, 1);   /* no rotary dims */
        absorb_case(T, 2, 32, 64, 64, 32, 64, 1);
        absorb_case(T, 3, 24, 8, 40, 24, 8, 1);  /* the odd fixture */
        absorb_case(T, 3, 12, 16, 48, 16, 8, 0); /* rotation inside the rope part, pass-through around it */
    }
    /* GLM-5's dims (every host thread costs: one token of 64 heads, several blocks per token) */
    absorb_case(1, 64, 192, 64, 512, 192, 64, 0);
    absorb_case(2, 8, 192, 64, 512, 192, 64, 1);
    printf("## test_prep_emu: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
