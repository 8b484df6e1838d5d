/* gemv_walk.cuh - the order in which a warp of the claiming bf16 GEMV (k_gvd, gemv_bf16.cu) walks its
 * work, apart from the arithmetic, so that the host can check it (tests/backend/gvd_walk_emu: many
 * warps' walks interleaved at random against one claim counter). Plain C++ without CUDA headers; the
 * kernel includes it.
 *
 * The work is U units (a unit: one K share of one row). A warp walks a static range of q0 units, then
 * ranges of g units that it claims from a counter shared by the grid. It walks them twice: the load
 * stream (gd_load) copies each step's weights into a ring of GB_D stages, GB_D - 1 steps ahead of the
 * math stream (gd_math), which must see the same (unit, run) at the same step index. When the load
 * stream enters a range it leaves the range in pend_s / pend_e, where the math stream takes it on
 * leaving its current one. So every range followed by another must be at least GB_D - 1 steps long
 * (else the load stream would overwrite pend before the math stream took it); the host sizes q0 and g
 * so, and only a warp's last range (cut short by the end of the work) may be shorter. */
#ifndef MS_BACKEND_CUDA_GEMV_WALK_CUH
#define MS_BACKEND_CUDA_GEMV_WALK_CUH

/* ring stages of gemv_bf16.cu's warps (its GB_D): the load stream runs GD_RING - 1 steps ahead */
#define GD_RING 8

#if defined(__CUDACC__)
#define GD_HD __host__ __device__ __forceinline__
#else
#define GD_HD inline
#endif

GD_HD int gd_min(int a, int b) { return a < b ? a : b; }

/* 16-byte chunks of a K share when a row of K8 chunks is cut into ks shares of whole 512-byte runs */
GD_HD int gd_share(int K8, int ks) { return ((K8 + ks - 1) / ks + 31) / 32 * 32; }

/* 1 when a row of K8 chunks can be cut into ks shares (ks > 1: at least two runs each, none empty);
 * the fixed form (k_gvb) asks it too */
GD_HD bool gd_split_ok(int K8, int ks) {
    const int kc = gd_share(K8, ks);
    return ks == 1 || (kc >= 64 && (long long)kc * (ks - 1) < K8);
}

/* A claiming launch's plan: K split, static range and claim size. */
struct gd_plan {
    int ks, kshift; /* shares a row, log2 */
    int kc;         /* chunks of a share (K8 when ks = 1) */
    int spu_min;    /* 512-byte steps of the shortest unit */
    int q0;         /* units of each warp's static range */
    int g;          /* units a claim takes */
    bool early;     /* the first GB_D - 1 steps may be copied before the PDL wait */
};

/* The plan for N rows of K8 chunks over W warps with pct percent of the units static (1..95) and ring
 * depth D (GD_RING): ks = force_ks when set and possible, else the fewest shares that give every warp at
 * least 4 units (the most the row allows when none does); g such that a claimed range holds at least
 * D - 1 steps; q0 = the static share of a warp, raised to the units that hold D - 1 steps when the work
 * has that many for every warp (so that the early copies are kept), else 0 when it could not hold them
 * (then early = false: nothing is copied before the wait, where no claim may be made). false when no split fits or the units exceed 2^28. */
GD_HD bool gd_make_plan(int N, int K8, long long W, int pct, int force_ks, bool early_wanted, int D, gd_plan &p) {
    p.ks = 0;
    for (int k = 1; k <= 8 && gd_split_ok(K8, k); k *= 2)
        if (k == force_ks) p.ks = k;
    for (int k = 1; !p.ks && k <= 8 && gd_split_ok(K8, k); k *= 2) /* none forced, or not possible here */
        if ((long long)N * k >= 4 * W || k == 8 || !gd_split_ok(K8, 2 * k)) p.ks = k;
    const long long U = (long long)N * p.ks;
    if (!p.ks || N <= 0 || W <= 0 || U > (1 << 28)) return false;
    p.kshift = p.ks == 1 ? 0 : p.ks == 2 ? 1 : p.ks == 4 ? 2 : 3;
    p.kc = p.ks == 1 ? K8 : gd_share(K8, p.ks);
    const int last = K8 - (p.ks - 1) * p.kc;
    p.spu_min = (gd_min(p.kc, last) + 31) / 32;
    p.g = (D - 1 + p.spu_min - 1) / p.spu_min;
    long long q0 = U * pct / 100 / W;
    const long long qmin = (D - 1 + p.spu_min - 1) / p.spu_min; /* the fewest units that hold the early steps */
    if (q0 < qmin && W * qmin <= U) q0 = qmin;
    p.q0 = (int)q0;
    p.early = early_wanted;
    if (q0 * p.spu_min < D - 1) p.q0 = 0, p.early = false;
    return true;
}

/* The launch's cut of the work (the same for every warp). */
struct gd_shape {
    int K8;     /* 16-byte chunks of a row */
    int kc;     /* chunks of a share (a multiple of 32; the last share of a row may be shorter) */
    int msk;    /* shares a row - 1 (a power of two - 1) */
    int kshift; /* log2 of the shares a row */
    int U;      /* units: rows << kshift */
    int ustat;  /* the first unit claims hand out: warps * q0 */
    int g;      /* units a claim takes */
};

/* 1 when every unit of unit u's row lies in [b, e) (a warp's static range): the warp computes the row's
 * shares one after another and sums them itself; otherwise each share's partial meets the others'
 * through global memory (k_gvd) */
GD_HD bool gd_row_inside(const gd_shape &s, int u, int b, int e) {
    const int r0 = u & ~s.msk;
    return r0 >= b && r0 + s.msk < e;
}

/* chunks of unit u */
GD_HD int gd_kcu(const gd_shape &s, int u) { return gd_min(s.kc, s.K8 - (u & s.msk) * s.kc); }

/* One warp's two streams. Warp-uniform: every lane holds the same values. */
struct gd_walk {
    int lu, lend, lj, nreal; /* load stream: unit, end of its range, run in the unit, real steps issued */
    int pend_s, pend_e;      /* the range the load stream entered last */
    int cu, cend, cj, ndone; /* math stream: unit, end of its range, run, steps done */
    bool ldone;              /* the load stream found no more work */
    bool claimed;            /* a claim is in flight (asked, answer not taken) */
};

/* A warp's walk before its first step: static range [first, first + q0). */
GD_HD void gd_walk_init(gd_walk &w, int first, int q0) {
    w.lu = w.cu = w.pend_s = w.pend_e = first;
    w.lend = w.cend = first + q0;
    w.lj = w.cj = w.nreal = w.ndone = 0;
    w.ldone = w.claimed = false;
}

/* The load stream's next step. Returns true when it is real, with its unit, run (512-byte step of the
 * unit) and the unit's chunks; false once the work is done (the step copies nothing). ask() issues a
 * claim of s.g units (its answer: the units claimed before it, from 0 at the first unit past the static
 * ranges); take() waits for the answer of the claim asked last. may_claim: false before the kernel's
 * PDL wait, when the counter may still belong to the previous launch (the host makes the static range
 * long enough that no claim is needed then). The next claim is asked when the stream enters a range's
 * last unit, so that its answer is back before it is taken. */
template <class Ask, class Take>
GD_HD bool gd_load(gd_walk &w, const gd_shape &s, bool may_claim, Ask ask, Take take, int &unit, int &run, int &kcu) {
    if (!w.ldone && w.lu == w.lend) {
        if (!w.claimed) ask();
        const int st = s.ustat + (int)take();
        w.claimed = false;
        if (st >= s.U) {
            w.ldone = true;
        } else {
            w.lu = w.pend_s = st;
            w.lend = w.pend_e = gd_min(st + s.g, s.U);
            w.lj = 0;
        }
    }
    if (w.ldone) {
        unit = run = kcu = 0;
        return false;
    }
    unit = w.lu;
    run = w.lj;
    kcu = gd_kcu(s, w.lu);
    w.nreal++;
    if (++w.lj * 32 >= kcu) w.lj = 0, w.lu++;
    if (may_claim && !w.claimed && w.lu + 1 >= w.lend) {
        ask();
        w.claimed = true;
    }
    return true;
}

/* The math stream's next step, called before the load stream's step of this round (which is GB_D - 1
 * steps ahead): false when the warp's work is done; else the unit, run and chunks of the step the load
 * stream issued at the same index, and last = 1 when the step ends its unit. */
GD_HD bool gd_math(gd_walk &w, const gd_shape &s, int &unit, int &run, int &kcu, bool &last) {
    if (w.ldone && w.ndone >= w.nreal) return false;
    if (w.cu == w.cend) w.cu = w.pend_s, w.cend = w.pend_e;
    unit = w.cu;
    run = w.cj;
    kcu = gd_kcu(s, w.cu);
    w.ndone++;
    last = ++w.cj * 32 >= kcu;
    if (last) w.cj = 0, w.cu++;
    return true;
}

#endif
