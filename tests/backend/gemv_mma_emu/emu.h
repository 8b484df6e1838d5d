/* emu.h - what the host emulation of src/backend/cuda/gemv_mma.cu stands on (see
 * tests/backend/test_gemv_mma_emu.sh): every CUDA thread of a block runs as a host thread,
 * __syncthreads is a block barrier, mma.sync m16n8k16 is rebuilt warp-wide from the PTX ISA fragment
 * tables ("Matrix Fragments for mma.m16n8k16 with floating point type": a_i row g for i in
 * {0,1,4,5} else g+8, column 2t+(i&1) (+8 for i >= 4); b_i k 2t+(i&1) (+8 for i >= 2), column g;
 * c_i row g (i < 2) else g+8, column 2t+(i&1)) and accumulated in float64, fma.rn.bf16x2 aborts
 * unless its product is an exact normal bf16, cp.async copies happen at the wait that covers their
 * group (cp.async.wait_group N lands all committed groups but the newest N), or with MS_EMU_CP_EARLY=1
 * when issued. */
#ifndef MS_TESTS_GEMV_MMA_EMU_H
#define MS_TESTS_GEMV_MMA_EMU_H
#include <cstdint>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <barrier>
#include <vector>
#include <algorithm>
#include <memory>
#include <utility>
#define _Noreturn [[noreturn]]
extern "C" {
#include "backend/backend.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/log.h"
#include "core/tensor.h"
#undef _Noreturn
}
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
struct alignas(16) uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct bf16 { uint16_t v; };
static thread_local dim3 threadIdx, blockIdx, blockDim;
using std::min; using std::max;
template <class T> static inline T __ldg(const T *p) { return *p; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    uint8_t b[8]; memcpy(b, &x, 4); memcpy(b + 4, &y, 4);
    unsigned r = 0;
    for (int i = 0; i < 4; i++) { unsigned sel = (s >> (4 * i)) & 7; if ((s >> (4 * i)) & 8) abort(); r |= (unsigned)b[sel] << (8 * i); }
    return r;
}
static inline bf16 __float2bfloat16_rn(float f) { return bf16{ms_f32_to_bf16(f)}; }
static inline float cu_silu(float g) { return g / (1.f + expf(-g)); }
static inline void cu_st(void *p, int dt, size_t i, float v) {
    if (dt == MS_F32) ((float *)p)[i] = v;
    else if (dt == MS_BF16) ((uint16_t *)p)[i] = ms_f32_to_bf16(v);
    else abort();
}
#include "backend/cuda/grouped_call.cuh" /* cu_wdesc and the call description, as on the GPU */
#include "backend/cuda/knobs.h" /* cu_knob: knobs.c is linked in, as in the library */
typedef int cudaError_t; enum { cudaSuccess = 0, cudaErrorInvalidValue = 1 }; typedef void *cudaStream_t;
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <class F> static cudaError_t cudaFuncSetAttribute(F, int, int) { return 0; }
static cudaError_t cudaGetLastError() { return 0; }
/* Programmatic Dependent Launch: emu_launch runs one grid to completion at a time, so nothing to wait for. */
static inline void cu_pdl_wait() {}
static inline void cu_pdl_trigger() {}
static const char *cudaGetErrorString(cudaError_t) { return "?"; }
#define CK(call) do { cudaError_t e_ = (call); if (e_) return ms_errf(err, MS_ERR_RUNTIME, "%s", #call); } while (0)
struct cu_impl { int max_smem_optin; cudaStream_t stream; };
static inline cu_impl *cu_of(const ms_backend *b) { return (cu_impl *)b->impl; }
/* the FP8 wgmma form (gemv_w8.cu) needs sm_90a hardware: here it never takes a call */
static inline int cu_gemv_w8(ms_backend *, const cu_gemv_call *, int *launched, ms_err *) {
    *launched = 0;
    return MS_OK;
}

/* ---- per-block emulation state ---- */
struct emu_block {
    std::unique_ptr<std::barrier<>> bar;
    std::vector<std::unique_ptr<std::barrier<>>> wbar;
    uint4 *smem; size_t smem_bytes;
    /* mma operands of one warp, exchanged through here */
    struct ex { uint32_t a[32][4], b[32][2]; float c[32][4], d[32][4]; };
    std::vector<ex> xw;
    long n_mma = 0, n_bmul = 0;
};
static thread_local emu_block *EB;
static thread_local std::vector<std::pair<void *, std::pair<const void *, int>>> *cpq;
static inline void __syncthreads() { EB->bar->arrive_and_wait(); }
static double bfv(uint32_t h16) { return (double)ms_bf16_to_f32((uint16_t)h16); }
static inline void gm_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    auto &X = EB->xw[w];
    X.a[lane][0] = a0; X.a[lane][1] = a1; X.a[lane][2] = a2; X.a[lane][3] = a3; X.b[lane][0] = b0; X.b[lane][1] = b1;
    for (int i = 0; i < 4; i++) X.c[lane][i] = d[i];
    EB->wbar[w]->arrive_and_wait();
    if (lane == 0) {
        double A[16][16], B[16][8], C[16][8];
        for (int l = 0; l < 32; l++) {
            int g = l >> 2, t = l & 3;
            for (int i = 0; i < 8; i++) {
                int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
                int col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
                uint32_t reg = X.a[l][i / 2];
                A[row][col] = bfv((i & 1) ? reg >> 16 : reg & 0xffff);
            }
            for (int i = 0; i < 4; i++) {
                int k = t * 2 + (i & 1) + (i >= 2 ? 8 : 0);
                uint32_t reg = X.b[l][i / 2];
                B[k][g] = bfv((i & 1) ? reg >> 16 : reg & 0xffff);
            }
            for (int i = 0; i < 4; i++) C[(i < 2) ? g : g + 8][t * 2 + (i & 1)] = X.c[l][i];
        }
        for (int l = 0; l < 32; l++) {
            int g = l >> 2, t = l & 3;
            for (int i = 0; i < 4; i++) {
                int r = (i < 2) ? g : g + 8, c = t * 2 + (i & 1);
                double s = C[r][c];
                for (int k = 0; k < 16; k++) s += A[r][k] * B[k][c];
                X.d[l][i] = (float)s;
            }
        }
        EB->n_mma++;
    }
    EB->wbar[w]->arrive_and_wait();
    for (int i = 0; i < 4; i++) d[i] = X.d[lane][i];
    EB->wbar[w]->arrive_and_wait();
}
/* fma.rn.bf16x2 with c = -0: the kernel relies on the product being exact */
static inline uint32_t gm_bmul2(uint32_t a, uint32_t b) {
    uint32_t r = 0;
    for (int h = 0; h < 2; h++) {
        double p = bfv(a >> (16 * h)) * bfv(b >> (16 * h));
        uint16_t o = ms_f32_to_bf16((float)p);
        if ((double)ms_bf16_to_f32(o) != p) { fprintf(stderr, "inexact bf16 product %g\n", p); abort(); }
        if (p != 0 && fabs(p) < 1.17549435e-38) { fprintf(stderr, "subnormal product %g\n", p); abort(); }
        r |= (uint32_t)o << (16 * h);
    }
    return r;
}
/* cp.async: each copy is queued with its group (the thread's commit count when issued) and lands at a
 * wait that covers its group, so a read before the right wait sees the old bytes */
static thread_local std::vector<int> *cpgid;
static thread_local int cp_open; /* the thread's commit count: the group new copies join */
/* MS_EMU_CP_EARLY=1: copies land when issued instead of at their wait, so a copy into a stage or buffer
 * that is still to be read shows in the result */
static const bool emu_cp_early = getenv("MS_EMU_CP_EARLY") && atoi(getenv("MS_EMU_CP_EARLY"));
static inline void gm_cp16(void *smem, const void *gmem, int src_bytes) {
    if (emu_cp_early) {
        if (src_bytes == 16) memcpy(smem, gmem, 16);
        else memset(smem, 0, 16);
        return;
    }
    cpq->push_back({smem, {gmem, src_bytes}});
    cpgid->push_back(cp_open);
}
static inline void gm_cp8(void *smem, const void *gmem) {
    if (emu_cp_early) {
        memcpy(smem, gmem, 8);
        return;
    }
    cpq->push_back({smem, {gmem, 8}});
    cpgid->push_back(cp_open);
}
static inline void gm_cp_commit() { cp_open++; }
/* cp.async.wait_group N: every committed group but the newest N lands */
static inline void emu_cp_land(int keep) {
    size_t o = 0;
    for (size_t i = 0; i < cpq->size(); i++) {
        auto &e = (*cpq)[i];
        if ((*cpgid)[i] < cp_open - keep) {
            if (e.second.second == 16 || e.second.second == 8) memcpy(e.first, e.second.first, e.second.second);
            else memset(e.first, 0, 16);
        } else {
            (*cpq)[o] = e;
            (*cpgid)[o++] = (*cpgid)[i];
        }
    }
    cpq->resize(o);
    cpgid->resize(o);
}
static inline void gm_cp_wait_all() { emu_cp_land(0); }
template <int N> static inline void gm_cp_wait() { emu_cp_land(N); }
static inline void __syncwarp() { EB->wbar[threadIdx.x >> 5]->arrive_and_wait(); }
template <class A>
static void emu_launch(void (*k)(A), dim3 grid, int threads, size_t smem, const A &a) {
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            emu_block B;
            B.bar = std::make_unique<std::barrier<>>(threads);
            for (int w = 0; w < threads / 32; w++) B.wbar.push_back(std::make_unique<std::barrier<>>(32));
            B.xw.resize(threads / 32);
            if (smem % 16) { fprintf(stderr, "dynamic shared memory %zu is not a multiple of 16\n", smem); abort(); }
            std::vector<uint4> sm(smem / 16);
            memset(sm.data(), 0xff, sm.size() * 16); /* poison: NaN in bf16 and f32 */
            B.smem = sm.data(); B.smem_bytes = smem;
            std::vector<std::thread> th;
            for (int t = 0; t < threads; t++)
                th.emplace_back([&, t]() {
                    EB = &B; threadIdx = dim3(t); blockIdx = dim3(bx, by); blockDim = dim3(threads);
                    std::vector<std::pair<void *, std::pair<const void *, int>>> q; cpq = &q;
                    std::vector<int> qg; cpgid = &qg; cp_open = 0;
                    k(a);
                    if (!q.empty()) { fprintf(stderr, "cp.async never waited\n"); abort(); }
                });
            for (auto &x : th) x.join();
        }
}

#endif
