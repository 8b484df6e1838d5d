/* gvb_emu.h - what the host emulation of src/backend/cuda/gemv_bf16.cu's streaming GEMV (k_gvb) stands on
 * (tests/backend/test_gemv_tc_emu.sh): gemv_mma_emu's emu.h (every CUDA thread a host thread, mma.sync
 * rebuilt from the PTX ISA fragment tables, cp.async landing at the wait that covers its group) plus the
 * few device helpers k_gvb uses under other names: the shared-memory copies, warp shuffles, bf16 halves,
 * the L2 prefetch (recorded in EMU_PF for the test to check), and a stand-in for the folded norm (k_gvb<1, 2, *>) that writes a given x, so that the form's staging
 * of x after the norm runs too. */
#ifndef MS_TESTS_GVB_EMU_H
#define MS_TESTS_GVB_EMU_H
#include "emu.h"

#include <mutex>

static dim3 gridDim; /* set by the test before each launch */

#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif
/* the L2 prefetches (MS_CU_BF16_STREAM_L2PF) are recorded, not made: the test checks their bytes */
struct emu_pf {
    const char *p;
    unsigned n;
};
static std::mutex EMU_PF_MU;
static std::vector<emu_pf> EMU_PF;
static inline void cu_l2_prefetch(const void *p, unsigned n) {
    std::lock_guard<std::mutex> g(EMU_PF_MU);
    EMU_PF.push_back({(const char *)p, n});
}

template <class T> static inline T __ldcg(const T *p) { return *p; }
static inline float cu_bf_lo(uint32_t v) { return __uint_as_float(v << 16); }
static inline float cu_bf_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
/* a shared-memory "address" is the host pointer itself here */
static inline void *cu_saddr(const void *p) { return const_cast<void *>(p); }
static inline void cu_cp16(void *dst, const void *src, bool full) { gm_cp16(dst, src, full ? 16 : 0); }
static inline void cu_cp_commit() { gm_cp_commit(); }
template <int N> static inline void cu_cp_wait() { gm_cp_wait<N>(); }
static inline void cu_mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    gm_mma(c, a[0], a[1], a[2], a[3], b0, b1);
}

/* __shfl_xor_sync over the 32 host threads of a warp (full mask only, as k_gvb uses it) */
struct emu_shfl { float v[64][32]; }; /* [warp][lane], blocks of up to 64 warps */
static thread_local emu_shfl *EMU_SHFL;
static inline float __shfl_xor_sync(unsigned mask, float v, int o) {
    if (mask != 0xffffffffu) abort();
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    static emu_shfl buf[1]; /* one block runs at a time (emu_launch) */
    EMU_SHFL = buf;
    EB->wbar[w]->arrive_and_wait();
    EMU_SHFL->v[w][lane] = v;
    EB->wbar[w]->arrive_and_wait();
    const float r = EMU_SHFL->v[w][lane ^ o];
    EB->wbar[w]->arrive_and_wait();
    return r;
}

/* The folded norm's interface as k_gvb<1, 2, *> sees it: here the block only copies a ready x (src, bf16
 * [u1 units of 8]) into xs and ends in a barrier, as cu_norm_stage does. */
#define CU_NORM_T 256
#define CU_NORM_U 8
typedef struct cu_norm_in { const uint4 *src; } cu_norm_in;
static inline void cu_norm_stage(const cu_norm_in n, uint4 *xs, int u0, int u1, unsigned, bool) {
    for (int u = u0 + (int)threadIdx.x; u < u1; u += (int)blockDim.x) xs[u - u0] = n.src[u];
    __syncthreads();
}
#endif
