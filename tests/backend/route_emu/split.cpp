/* split.cpp - k_router_split (src/backend/cuda/elementwise.cu, the decode router: logits over E/8 x
 * K/512 blocks, the last block sums the slices and routes) run on the host: test_route_emu.sh cuts the
 * kernel's section out of elementwise.cu into rs_emu.cpp (dropping the L2 prefetch and turning its
 * shared memory into this file's), every thread of a block is a host thread (__syncthreads a block
 * barrier, warp collectives per warp), blocks run one after another so the last one to finish is the
 * last launched. Checked: the logits against a float64 reference (relative 1e-5), and the ids and
 * weights, bit for bit, against the CPU's routing rules (main.cpp's cpu_route) applied to the kernel's
 * own logits; shapes with partial slices, 1..8 tokens, groups, no bias, exact ties. k_router_split<1>
 * (one token, its x computed from a residual row by cu_norm_stage, norm_stage.cuh) also: the residual
 * written back as resid + delta exactly by one block, the normed row within 1 bf16 ulp of a float64
 * RMSNorm, the blocks' counter back at 0, and the logits and picks as above from that row. */
#include <atomic>
#include <memory>

struct alignas(16) uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
struct bf16 { uint16_t v; };
struct __nv_bfloat162 { bf16 x, y; };
struct float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline bf16 bf_rn(float f) { /* round to nearest even, as __float2bfloat16_rn (no NaN here) */
    uint32_t u = __float_as_uint(f);
    return bf16{(uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162{bf_rn(a), bf_rn(b)}; }

static inline float bfv(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline float2 __bfloat1622float2(__nv_bfloat162 v) { return float2{bfv(v.x.v), bfv(v.y.v)}; }
struct dim3 { unsigned x, y, z; };
static thread_local dim3 blockIdx, blockDim, gridDim;
template <class T> static inline T __ldg(const T *p) { return *p; }
template <class T> static inline T __ldcg(const T *p) { return *p; }
static inline void __threadfence() {}
/* Programmatic Dependent Launch: one grid at a time here, so nothing to wait for. */
static inline void cu_pdl_wait() {}
static inline void cu_pdl_trigger() {}
static std::barrier<> *BLOCK_BAR;
static inline void __syncthreads() { BLOCK_BAR->arrive_and_wait(); }
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
    return std::atomic_ref<unsigned>(*p).fetch_add(v);
}
static inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
enum { RS_EMU_F32 = 0, RS_EMU_BF16 = 1 };
#define MS_F32 RS_EMU_F32
static inline float cu_ld(const void *p, int dt, size_t i) {
    return dt == MS_F32 ? ((const float *)p)[i] : bfv(((const uint16_t *)p)[i]);
}
static void route_token(const float *, const void *, int, int, int, int, int, int, float, int32_t *, float *, float *) {
    fprintf(stderr, "route_token (past the register router's limits) is not emulated\n");
    abort();
}
#define RF_WARPS 8
#define RF_MAXT 8
#define __global__
#define __launch_bounds__(...)
static thread_local uint4 *EMU_SMEM;
using std::min;
#include "backend/cuda/router_dot.cuh"
#include "rs_emu.cpp"

/* One launch as cu_router_fused makes it (fold: k_router_split<1> at T = 1, x from a residual row);
 * returns the failures found. */
static int split_case(int T, int E, int K, int topk, int ng, int tg, int norm, int with_bias, int tie, std::mt19937 &R,
                      int fold = 0) {
    std::uniform_real_distribution<float> U(-1.f, 1.f);
    const int gsz = E / ng;
    std::vector<uint16_t> W((size_t)E * K), X((size_t)T * K);
    std::vector<float> bias(E);
    const float amp = 2.f / sqrtf((float)K);
    for (int e = 0; e < E; e++) {
        const int src = tie == 1 ? 3 * (e / 3) : tie == 2 ? e % gsz : e;
        for (int k = 0; k < K; k++) {
            float f = U(R) * amp;
            uint32_t u;
            memcpy(&u, &f, 4);
            W[(size_t)e * K + k] = src == e ? (uint16_t)(u >> 16) : W[(size_t)src * K + k];
        }
        bias[e] = src == e ? U(R) * 0.3f : bias[src];
    }
    for (auto &v : X) { float f = U(R) * 2.f; uint32_t u; memcpy(&u, &f, 4); v = (uint16_t)(u >> 16); }
    std::vector<float> res(K), del(K), res0;
    std::vector<uint16_t> nw(K);
    unsigned done = 0;
    cu_norm_in nin = {};
    if (fold) {
        for (int k = 0; k < K; k++) {
            res[k] = U(R) * 3.f, del[k] = U(R);
            const float f = U(R);
            uint32_t u;
            memcpy(&u, &f, 4);
            nw[k] = (uint16_t)(u >> 16);
        }
        res0 = res;
        std::fill(X.begin(), X.end(), (uint16_t)0xffff); /* the kernel writes the normed row here */
        nin = cu_norm_in{res.data(), del.data(), (const bf16 *)nw.data(), (bf16 *)X.data(), 1e-5f, K, &done};
    }
    const int nks = (K + RS_KS - 1) / RS_KS;
    const size_t xsm = (size_t)T * RS_KS * 2, sm = sizeof(float) * RF_WARPS * (2 * (size_t)E + 2 * ng);
    const size_t ssm = xsm > sm ? xsm : sm;
    std::vector<float> lg((size_t)T * E, -1.f), wout((size_t)T * topk, -1.f);
    std::vector<int32_t> ids((size_t)T * topk, -1);
    std::vector<uint4> smem((ssm + 15) / 16);
    for (unsigned by = 0; by < (unsigned)nks; by++)
        for (unsigned bx = 0; bx < (unsigned)((E + RS_WARPS - 1) / RS_WARPS); bx++) {
            memset(smem.data(), 0xff, smem.size() * 16);
            std::barrier<> bar(RS_WARPS * 32);
            BLOCK_BAR = &bar;
            std::vector<std::thread> th;
            for (int i = 0; i < RS_WARPS * 32; i++)
                th.emplace_back([&, i] {
                    threadIdx.x = i;
                    blockIdx = dim3{bx, by, 0};
                    blockDim = dim3{RS_WARPS * 32, 1, 1};
                    gridDim = dim3{(unsigned)((E + RS_WARPS - 1) / RS_WARPS), (unsigned)nks, 1};
                    EMU_SMEM = smem.data();
                    /* weight loads before or after the (here empty) PDL wait: both orders, block by block */
                    const int early = (int)((bx + by) & 1);
                    if (fold)
                        k_router_split<1>((const bf16 *)X.data(), (const bf16 *)W.data(), T, K, lg.data(),
                                          with_bias ? (const void *)bias.data() : nullptr, MS_F32, E, topk, ng, tg, norm,
                                          2.5f, ids.data(), wout.data(), nin, early);
                    else
                        k_router_split<0>((const bf16 *)X.data(), (const bf16 *)W.data(), T, K, lg.data(),
                                          with_bias ? (const void *)bias.data() : nullptr, MS_F32, E, topk, ng, tg, norm,
                                          2.5f, ids.data(), wout.data(), nin, early);
                });
            for (auto &t : th) t.join();
        }
    int bad = 0;
    if (fold) {
        double ss = 0;
        for (int k = 0; k < K; k++) {
            const float s = res0[k] + del[k];
            ss += (double)s * s;
            if (res[k] != s && !bad++) printf("FAIL fold K=%d: resid[%d] %g, not %g\n", K, k, res[k], s);
        }
        const double inv = 1.0 / sqrt(ss / K + 1e-5);
        for (int k = 0; k < K; k++) {
            const double ref = (double)(res0[k] + del[k]) * inv * bfv(nw[k]), got = bfv(X[k]);
            if (!(fabs(got - ref) <= fabs(ref) / 128 + 1e-30)) {
                printf("FAIL fold K=%d: x[%d] %g, float64 RMSNorm %g\n", K, k, got, ref);
                bad++;
                break;
            }
        }
        if (done != 0) { printf("FAIL fold: the norm's block count was not reset (%u)\n", done); bad++; }
    }
    if (g_rs_done != 0) { printf("FAIL the block count was not reset (%u)\n", g_rs_done); bad++; g_rs_done = 0; }
    double md = 0, mr = 0;
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            double r = 0;
            for (int k = 0; k < K; k++) r += (double)bfv(W[(size_t)e * K + k]) * bfv(X[(size_t)t * K + k]);
            md = std::max(md, fabs(r - lg[(size_t)t * E + e]));
            mr = std::max(mr, fabs(r));
        }
    if (!(md <= 1e-5 * mr)) { printf("FAIL logits T=%d E=%d K=%d: max err %g of %g\n", T, E, K, md, mr); bad++; }
    std::vector<float> zb(E, 0.f);
    for (int t = 0; t < T; t++) {
        int idc[32];
        float wc[32];
        cpu_route(lg.data() + (size_t)t * E, with_bias ? bias.data() : zb.data(), E, topk, ng, tg, norm, 2.5f, idc, wc);
        for (int j = 0; j < topk; j++)
            if (idc[j] != ids[(size_t)t * topk + j] || wc[j] != wout[(size_t)t * topk + j]) {
                printf("FAIL route T=%d E=%d K=%d groups %d/%d tie=%d token %d pick %d: %d/%d (%g/%g)\n", T, E, K, tg, ng,
                       tie, t, j, ids[(size_t)t * topk + j], idc[j], wout[(size_t)t * topk + j], wc[j]);
                bad++;
                break;
            }
    }
    return bad;
}

/* cu_norm_stage alone, as a kernel with blocks of nt threads calls it: nb blocks (one after another), each
 * staging the units [u0, u1) it is given, block 0 storing the row; returns the staged units of every block
 * (whole row concatenated), the stored row and the residual written back. */
struct norm_out { std::vector<uint4> xs; std::vector<uint16_t> out; std::vector<float> resid; unsigned done; };
static norm_out norm_block_run(int K, int nt, int nb, const std::vector<float> &res0, const std::vector<float> &del,
                               const std::vector<uint16_t> &nw) {
    norm_out o;
    o.resid = res0;
    o.out.assign(K, 0xffff);
    o.done = 0;
    const int U = K / 8, per = (U + nb - 1) / nb;
    o.xs.assign(U, uint4{~0u, ~0u, ~0u, ~0u});
    const cu_norm_in nin = {o.resid.data(), del.data(), (const bf16 *)nw.data(), (bf16 *)o.out.data(), 1e-5f, K, &o.done};
    for (int bx = 0; bx < nb; bx++) {
        const int u0 = std::min(U, bx * per), u1 = std::min(U, u0 + per);
        std::barrier<> bar(nt);
        BLOCK_BAR = &bar;
        std::vector<std::thread> th;
        for (int i = 0; i < nt; i++)
            th.emplace_back([&, i] {
                threadIdx.x = i;
                blockIdx = dim3{(unsigned)bx, 0, 0};
                blockDim = dim3{(unsigned)nt, 1, 1};
                gridDim = dim3{(unsigned)nb, 1, 1};
                cu_norm_stage(nin, o.xs.data() + u0, u0, u1, (unsigned)nb, bx == 0);
            });
        for (auto &t : th) t.join();
    }
    return o;
}

/* The row's 1 / rms as CU_NORM_T threads of cu_norm_stage compute it: thread t adds the squares of units
 * t, t + CU_NORM_T, ... (each unit as two float4 of resid + delta, four squares left to right), the warps
 * reduce by xor shuffles (16, 8, 4, 2, 1) and lane 0's sums are added in warp order. */
static float norm_inv_model(const std::vector<float> &res, const std::vector<float> &del, int K) {
    const int U = K / 8;
    std::vector<float> acc(CU_NORM_T, 0.f);
    for (int t = 0; t < CU_NORM_T; t++)
        for (int i = 0; i < CU_NORM_U; i++) {
            const int u = t + i * CU_NORM_T;
            if (u >= U) continue;
            for (int h = 0; h < 2; h++) {
                float a[4];
                for (int j = 0; j < 4; j++) a[j] = res[8 * u + 4 * h + j] + del[8 * u + 4 * h + j];
                const float sq = a[0] * a[0] + a[1] * a[1] + a[2] * a[2] + a[3] * a[3];
                acc[t] += sq;
            }
        }
    float tot = 0.f;
    for (int w = 0; w < CU_NORM_T / 32; w++) {
        float v[32];
        for (int l = 0; l < 32; l++) v[l] = acc[32 * w + l];
        for (int o = 16; o > 0; o >>= 1) {
            float nv[32];
            for (int l = 0; l < 32; l++) nv[l] = v[l] + v[l ^ o];
            memcpy(v, nv, sizeof v);
        }
        tot += v[0];
    }
    return 1.f / sqrtf(tot / (float)K + 1e-5f);
}

/* The folded norm's bits do not depend on the caller's block size (cu_norm_stage deals the row over
 * CU_NORM_T threads): blocks of 256, 512 and 768 threads, one block and two, must all give the normed
 * row of norm_inv_model's 1 / rms. Since the row is rounded to bf16, a 1 / rms one fp32 ulp off would
 * rarely show; so the norm weights are chosen so that some products sit next to a bf16 rounding point,
 * where one ulp up and one ulp down of 1 / rms each flip some output (checked from 1024 wide). Returns
 * the failures. */
static int norm_block_case(int K, std::mt19937 &R) {
    std::uniform_real_distribution<float> Uf(-1.f, 1.f);
    std::vector<float> res(K), del(K);
    std::vector<uint16_t> nw(K);
    for (int k = 0; k < K; k++) res[k] = Uf(R) * 3.f, del[k] = Uf(R);
    const float inv = norm_inv_model(res, del, K), up = nextafterf(inv, INFINITY), dn = nextafterf(inv, 0.f);
    auto outb = [&](int k, float iv, uint16_t w) { return bf_rn((res[k] + del[k]) * iv * bfv(w)).v; };
    int flips_up = 0, flips_dn = 0;
    for (int k = 0; k < K; k++) { /* the weight in [0.5, 1) whose product is nearest a flip, else a random one */
        nw[k] = 0x3f00 | (uint16_t)(R() & 0x7f);
        for (uint16_t w = 0x3f00; w < 0x3f80; w++) {
            const uint16_t o = outb(k, inv, w);
            if (o != outb(k, up, w) || o != outb(k, dn, w)) {
                nw[k] = w;
                flips_up += o != outb(k, up, w), flips_dn += o != outb(k, dn, w);
                break;
            }
        }
    }
    int bad = 0;
    if (K >= 1024 && (!flips_up || !flips_dn)) { /* a short row may have no such product */ printf("FAIL norm K=%d: no weight makes 1 / rms's ulp visible (%d, %d)\n", K, flips_up, flips_dn); bad++; }
    for (int nb : {1, 2})
        for (int nt : {CU_NORM_T, 512, 768}) {
            const norm_out o = norm_block_run(K, nt, nb, res, del, nw);
            int wrong = 0;
            for (int k = 0; k < K; k++) wrong += o.out[k] != outb(k, inv, nw[k]) || o.resid[k] != res[k] + del[k];
            for (int u = 0; u < K / 8; u++) wrong += memcmp(&o.xs[u], &o.out[8 * u], 16) != 0;
            if (wrong || o.done) {
                printf("FAIL norm K=%d, %d blocks of %d threads: %d values differ from the %d-thread order (count %u)\n", K, nb,
                       nt, wrong, CU_NORM_T, o.done);
                bad++;
            }
        }
    return bad;
}
