/* emu.h - what the host emulation of src/backend/cuda/attn_mla_mma.cu stands on (see
 * tests/backend/test_mla_mma_emu.sh). Why: the kernel's warp choreography (which warp sums which
 * k-steps, the partial-S exchange slots, the named barriers of a head tile's warps, ldmatrix
 * addressing) can be checked without a GPU. Every CUDA thread of a block runs as a host thread;
 * __syncthreads is a block barrier and bar.sync id, n a barrier of n threads per id (the first arrival
 * fixes n; another n on the same id, or more than n / 32 distinct warps on it, aborts; a missing
 * partner hangs, which the script's timeout reports); ldmatrix (.x4, .trans) and mma.sync m16n8k16 are rebuilt warp-wide from
 * the PTX ISA tables (ldmatrix: lanes 8i..8i+7 address the rows of matrix i, register i of a lane gets
 * row lane/4, elements 2(lane%4), +1; .trans gets rows 2(lane%4), +1 of column lane/4. mma A: a_i row g
 * for i in {0,1,4,5} else g+8, column 2t+(i&1) (+8 for i >= 4); B: b_i k 2t+(i&1) (+8 for i >= 2),
 * column g; C: c_i row g (i < 2) else g+8, column 2t+(i&1)), accumulated in float64; cp.async copies
 * land at the wait that covers their group (or, with MS_EMU_CP_EARLY=1, at once), and shared memory
 * starts NaN-poisoned, so a read before the right wait or barrier, or of a slot nobody wrote, shows in
 * the result. */
#ifndef MS_TESTS_MLA_MMA_EMU_H
#define MS_TESTS_MLA_MMA_EMU_H
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct bf16 {
    uint16_t v;
};
struct __nv_bfloat162 {
    bf16 x, y;
};
struct float4 {
    float x, y, z, w;
};
struct float2 {
    float x, y;
};
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
static inline float2 make_float2(float a, float b) { return float2{a, b}; }
static thread_local dim3 threadIdx, blockIdx;
using std::max;
using std::min;

static inline float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t f2bf(float f) { /* round to nearest even, NaN kept */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    return __nv_bfloat162{bf16{f2bf(lo)}, bf16{f2bf(hi)}};
}

/* programmatic dependent launch: nothing to wait for or trigger on the host */
static inline void cu_pdl_wait() {}
static inline void cu_pdl_trigger() {}

/* host side of mm_launch */
struct ms_backend {
    int unused;
};
struct ms_err {
    int unused;
};
enum { MS_OK = 0 };
typedef int cudaError_t;
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <class F> static cudaError_t cudaFuncSetAttribute(F, int, int) { return 0; }
#define CK(call)                                                                                                       \
    do {                                                                                                               \
        if ((call) != 0) return 1;                                                                                     \
    } while (0)
#define CK_LAUNCH()                                                                                                    \
    do {                                                                                                               \
    } while (0)

/* ---- per-block emulation state ---- */
struct emu_block {
    std::unique_ptr<std::barrier<>> bar;
    std::vector<std::unique_ptr<std::barrier<>>> wbar, pbar; /* per warp; per named-barrier id 1..15 */
    int pbar_n[16] = {0};                                     /* a named barrier's thread count */
    std::atomic<unsigned> pbar_warps[16];                     /* warps seen at each named barrier */
    std::mutex pbar_mu;
    unsigned char *smem;
    size_t smem_bytes;
    struct ex {
        uint32_t a[32][4], b[32][2], addr[32];
        float c[32][4], d[32][4], f[32];
    };
    std::vector<ex> xw;
    std::atomic<long> n_mma{0}; /* lane 0 of every warp counts */
};
static thread_local emu_block *EB;
static thread_local std::vector<std::pair<unsigned char *, const void *>> *cpq; /* src NULL: zero fill */
static thread_local std::vector<int> *cpgid;
static thread_local int cp_open;
static long emu_total_mma;

static inline void __syncthreads() { EB->bar->arrive_and_wait(); }
static inline void wsync() { EB->wbar[threadIdx.x >> 5]->arrive_and_wait(); }
/* bar.sync id, n: the barrier of id is made with n threads at its first arrival */
static inline void emu_pair_sync(int id, int n) {
    const int w = (int)threadIdx.x >> 5;
    std::barrier<> *b;
    {
        std::lock_guard<std::mutex> g(EB->pbar_mu);
        if (id < 1 || id > 15 || n <= 0 || n % 32 || (EB->pbar_n[id] && EB->pbar_n[id] != n)) {
            fprintf(stderr, "warp %d at named barrier %d of %d threads (made with %d)\n", w, id, n, EB->pbar_n[id]);
            abort();
        }
        if (!EB->pbar_n[id]) {
            EB->pbar_n[id] = n;
            EB->pbar[id] = std::make_unique<std::barrier<>>(n);
        }
        b = EB->pbar[id].get();
        const unsigned seen = EB->pbar_warps[id].fetch_or(1u << w) | (1u << w);
        if (__builtin_popcount(seen) > n / 32) {
            fprintf(stderr, "named barrier %d of %d threads used by warps %#x\n", id, n, seen);
            abort();
        }
    }
    b->arrive_and_wait();
}
static inline float __shfl_xor_sync(unsigned mask, float v, int o) {
    if (mask != 0xffffffffu) abort();
    const int lane = threadIdx.x & 31;
    auto &X = EB->xw[threadIdx.x >> 5];
    X.f[lane] = v;
    wsync();
    const float r = X.f[lane ^ o];
    wsync();
    return r;
}
static inline uint32_t cu_saddr(const void *p) {
    const unsigned char *c = (const unsigned char *)p;
    if (c < EB->smem || c >= EB->smem + EB->smem_bytes) {
        fprintf(stderr, "cu_saddr outside the block's shared memory\n");
        abort();
    }
    return (uint32_t)(c - EB->smem);
}
static inline const unsigned char *sm_at(uint32_t a, size_t n) {
    if ((size_t)a + n > EB->smem_bytes) {
        fprintf(stderr, "shared read at %u + %zu past %zu bytes\n", a, n, EB->smem_bytes);
        abort();
    }
    return EB->smem + a;
}
/* MS_EMU_CP_EARLY=1: copies land when issued instead of at their wait, so a copy into a buffer that
 * another warp still reads (a missing barrier before the issue) shows in the result */
static const bool emu_cp_early = getenv("MS_EMU_CP_EARLY") && atoi(getenv("MS_EMU_CP_EARLY"));
static inline void cu_cp16(uint32_t dst, const void *src, bool full) {
    if ((size_t)dst + 16 > EB->smem_bytes || dst % 16) abort();
    if (emu_cp_early) {
        if (full) memcpy(EB->smem + dst, src, 16);
        else memset(EB->smem + dst, 0, 16);
        return;
    }
    cpq->push_back({EB->smem + dst, full ? src : nullptr});
    cpgid->push_back(cp_open);
}
static inline void cu_cp_commit() { cp_open++; }
static inline void emu_cp_land(int keep) { /* cp.async.wait_group keep */
    size_t o = 0;
    for (size_t i = 0; i < cpq->size(); i++) {
        auto e = (*cpq)[i];
        if ((*cpgid)[i] < cp_open - keep) {
            if (e.second) memcpy(e.first, e.second, 16);
            else memset(e.first, 0, 16);
        } else {
            (*cpq)[o] = e;
            (*cpgid)[o++] = (*cpgid)[i];
        }
    }
    cpq->resize(o);
    cpgid->resize(o);
}
template <int N> static inline void cu_cp_wait() { emu_cp_land(N); }
static inline void cu_ldsm4(uint32_t (&r)[4], uint32_t addr) {
    const int lane = threadIdx.x & 31;
    auto &X = EB->xw[threadIdx.x >> 5];
    X.addr[lane] = addr;
    wsync();
    for (int i = 0; i < 4; i++) {
        const uint32_t ra = X.addr[8 * i + lane / 4];
        if (ra % 16) abort();
        memcpy(&r[i], sm_at(ra + 4 * (lane % 4), 4), 4);
    }
    wsync();
}
static inline void cu_ldsm4t(uint32_t (&r)[4], uint32_t addr) {
    const int lane = threadIdx.x & 31;
    auto &X = EB->xw[threadIdx.x >> 5];
    X.addr[lane] = addr;
    wsync();
    for (int i = 0; i < 4; i++) {
        uint16_t lo, hi;
        const uint32_t r0 = X.addr[8 * i + 2 * (lane % 4)], r1 = X.addr[8 * i + 2 * (lane % 4) + 1];
        if (r0 % 16 || r1 % 16) abort();
        memcpy(&lo, sm_at(r0 + 2 * (lane / 4), 2), 2);
        memcpy(&hi, sm_at(r1 + 2 * (lane / 4), 2), 2);
        r[i] = (uint32_t)lo | (uint32_t)hi << 16;
    }
    wsync();
}
static inline void cu_mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    auto &X = EB->xw[w];
    for (int i = 0; i < 4; i++) X.a[lane][i] = a[i], X.c[lane][i] = d[i];
    X.b[lane][0] = b0;
    X.b[lane][1] = b1;
    wsync();
    if (lane == 0) {
        double A[16][16], B[16][8], C[16][8];
        for (int l = 0; l < 32; l++) {
            const int g = l >> 2, t = l & 3;
            for (int i = 0; i < 8; i++) {
                const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8, col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
                const uint32_t reg = X.a[l][i / 2];
                A[row][col] = bf2f((uint16_t)((i & 1) ? reg >> 16 : reg & 0xffff));
            }
            for (int i = 0; i < 4; i++) {
                const int k = t * 2 + (i & 1) + (i >= 2 ? 8 : 0);
                const uint32_t reg = X.b[l][i / 2];
                B[k][g] = bf2f((uint16_t)((i & 1) ? reg >> 16 : reg & 0xffff));
            }
            for (int i = 0; i < 4; i++) C[(i < 2) ? g : g + 8][t * 2 + (i & 1)] = X.c[l][i];
        }
        for (int l = 0; l < 32; l++) {
            const int g = l >> 2, t = l & 3;
            for (int i = 0; i < 4; i++) {
                const int r = (i < 2) ? g : g + 8, c = t * 2 + (i & 1);
                double s = C[r][c];
                for (int k = 0; k < 16; k++) s += A[r][k] * B[k][c];
                X.d[l][i] = (float)s;
            }
        }
        EB->n_mma++;
    }
    wsync();
    for (int i = 0; i < 4; i++) d[i] = X.d[lane][i];
    wsync();
}

/* the flash-attention tile steps of cuda_internal.cuh, cut from it by the script */
#include "frag_tiles.inc"

template <class A> static void emu_launch(void (*k)(A), dim3 grid, int threads, size_t smem, const A &a) {
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                emu_block B;
                B.bar = std::make_unique<std::barrier<>>(threads);
                for (int w = 0; w < threads / 32; w++) B.wbar.push_back(std::make_unique<std::barrier<>>(32));
                B.pbar.resize(16);
                for (int i = 0; i < 16; i++) B.pbar_warps[i] = 0;
                B.xw.resize(threads / 32);
                std::vector<unsigned char> sm(smem);
                memset(sm.data(), 0xff, smem); /* poison: NaN in bf16 and f32 */
                B.smem = sm.data();
                B.smem_bytes = smem;
                std::vector<std::thread> th;
                for (int t = 0; t < threads; t++)
                    th.emplace_back([&, t]() {
                        EB = &B;
                        threadIdx = dim3(t);
                        blockIdx = dim3(bx, by, bz);
                        std::vector<std::pair<unsigned char *, const void *>> q;
                        std::vector<int> qg;
                        cpq = &q;
                        cpgid = &qg;
                        cp_open = 0;
                        k(a);
                        if (!q.empty()) {
                            fprintf(stderr, "cp.async never waited\n");
                            abort();
                        }
                    });
                for (auto &x : th) x.join();
                emu_total_mma += B.n_mma;
            }
}
#endif
