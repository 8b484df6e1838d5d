/* mla_absorb.cu - the absorbed MLA products of a decode step (at most MA_MAX_T tokens) as kernels of
 * our own: q_abs[t][h] = q_nope[t][h] · W_UK[h] (kvl columns) with the query's rope part copied and
 * rotated next to it, and v[t][h] = o_lat[t][h] · W_UV[h]ᵀ (dv columns), W_UK / W_UV being head h's
 * rows of kv_b ([nh (dn + dv)][kvl], the first dn rows of a head for keys, the next dv for values).
 *
 * Why. At one token cuBLAS's strided-batched GEMM took 6.6 us for the 12.6 MB of GLM-5's W_UK and
 * 7.5 us for the 16.8 MB of W_UV (H200, ncu, bench/results/h200-ncu-graph-glm5-b1-session6.txt: about
 * 2 TB/s), the rope part needed a third kernel (k_copy_rope, 2.1 us), and cuBLAS's kernels carry no
 * PDL attribute, so the kernel after each of them starts only once it has drained. These are two PDL
 * kernels that stream the weights like the batch-1 GEMVs (gemv_bf16.cu): long 16-byte reads, all of
 * a thread's loads issued before its first multiply, and, when the weights are plain bf16 that no
 * kernel in flight writes (cu_impl.weights_quiet), issued before griddepcontrol.wait, so they overlap
 * the previous kernel (the q_b projection, the attention). Larger steps keep cuBLAS, whose GEMM tiles
 * reuse each weight across tokens.
 *
 * absorb (k_absorb_q). Block (h, c) takes columns 128 c .. +127 of head h: 16 threads of 8 columns
 * (one 16-byte load a row) times 16 row slices; slice s holds rows s, s + 16, ... of W_UK in registers
 * (dn <= 256: at most 16 loads a thread in flight), multiplies them by the staged q_nope rows of every
 * token in fp32, and the 16 slices' partials are summed in slice order (deterministic). Blocks with
 * c = 0 also write the rope part, rotated exactly as k_copy_rope (rope_pair).
 *
 * v_up (k_v_up). A warp takes MV_ROWS consecutive output rows (one head: dv % MV_ROWS == 0), each lane
 * 16-byte chunks lane, lane + 32, ... of the kvl-wide rows; the lane's weights are all loaded before
 * the math, the dot products end in a shuffle reduction (fixed order).
 *
 * Sums are in fp32 over bf16 products (exact), in an order of our own: results differ from cuBLAS's
 * in rounding only. */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/knobs.h"

#define MA_MAX_T 4    /* tokens per launch (template NT) */
#define MA_COLS 128   /* absorb: output columns a block */
#define MA_SLICES 16  /* absorb: row slices a block (256 threads / 16 column threads) */
#define MA_MAX_DN 256 /* absorb: W_UK rows a block holds (16 a slice) */
#define MV_ROWS 4     /* v_up: output rows a warp */
#define MV_CH 4       /* v_up: 16-byte chunks a lane and row: kvl <= 32 * 8 * MV_CH */

struct ma_q_args {
    const bf16 *W; /* kv_b [nh (dn + dv)][kvl] */
    const bf16 *q; /* [T][nh][dn + dr] */
    bf16 *out;     /* [T][nh][kvl + dr] */
    int nh, dn, dr, dv, kvl;
    const int32_t *pos; /* [T]; with inv: the rope part is rotated at these positions */
    const float *inv;   /* [rot_dim / 2] inverse frequencies, or NULL: the rope part is copied */
    int rot_off, rot_dim, interleaved; /* rotary columns rot_off.. of the rope part (relative to dn) */
    int early;                         /* weight loads may precede griddepcontrol.wait */
};

/* Slice rs's rows of W_UK at the thread's 8 columns (zero past dn or kvl). */
__device__ __forceinline__ void ma_q_load(uint4 (&w)[MA_MAX_DN / MA_SLICES], const ma_q_args &a, const bf16 *wh,
                                          int rs, bool cv) {
#pragma unroll
    for (int k = 0; k < MA_MAX_DN / MA_SLICES; k++) {
        const int i = rs + MA_SLICES * k;
        w[k] = (cv && i < a.dn) ? __ldg((const uint4 *)(wh + (size_t)i * a.kvl)) : make_uint4(0, 0, 0, 0);
    }
}

/* Block (head, 128-column block) of q_abs for NT tokens, and the rope part (file comment). */
template <int NT>
__global__ __launch_bounds__(256) void k_absorb_q(ma_q_args a) {
    __shared__ float xs[NT][MA_MAX_DN];
    __shared__ float red[MA_SLICES][NT][MA_COLS];
    const int h = blockIdx.x, tc = threadIdx.x & 15, rs = threadIdx.x >> 4;
    const int col = blockIdx.y * MA_COLS + tc * 8;
    const bool cv = col < a.kvl; /* kvl % 8 == 0: a thread's 8 columns are all in or all out */
    const bf16 *wh = a.W + (size_t)h * (size_t)(a.dn + a.dv) * (size_t)a.kvl + (cv ? col : 0);
    uint4 w[MA_MAX_DN / MA_SLICES];
    if (a.early) ma_q_load(w, a, wh, rs, cv);
    cu_pdl_wait();
    cu_pdl_trigger();
    if (!a.early) ma_q_load(w, a, wh, rs, cv);
    const int ldq = a.nh * (a.dn + a.dr);
    for (int i = threadIdx.x; i < NT * a.dn; i += blockDim.x) {
        const int t = i / a.dn, c = i - t * a.dn;
        xs[t][c] = __bfloat162float(a.q[(size_t)t * ldq + (size_t)h * (a.dn + a.dr) + c]);
    }
    __syncthreads();
    float acc[NT][8];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[t][e] = 0.f;
#pragma unroll
    for (int k = 0; k < MA_MAX_DN / MA_SLICES; k++) {
        const int i = rs + MA_SLICES * k;
        if (i < a.dn) {
            const uint32_t u[4] = {w[k].x, w[k].y, w[k].z, w[k].w};
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float x = xs[t][i];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    acc[t][2 * e] = fmaf(cu_bf_lo(u[e]), x, acc[t][2 * e]);
                    acc[t][2 * e + 1] = fmaf(cu_bf_hi(u[e]), x, acc[t][2 * e + 1]);
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float4 *r = (float4 *)&red[rs][t][tc * 8];
        r[0] = make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
        r[1] = make_float4(acc[t][4], acc[t][5], acc[t][6], acc[t][7]);
    }
    __syncthreads();
    const int ldo = a.nh * (a.kvl + a.dr);
    for (int u = threadIdx.x; u < NT * MA_COLS; u += blockDim.x) {
        const int t = u / MA_COLS, c = u - t * MA_COLS, oc = blockIdx.y * MA_COLS + c;
        if (oc >= a.kvl) continue;
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < MA_SLICES; k++) s += red[k][t][c];
        a.out[(size_t)t * ldo + (size_t)h * (a.kvl + a.dr) + oc] = __float2bfloat16_rn(s);
    }
    if (blockIdx.y != 0 || a.dr == 0) return;
    /* the rope part: one unit per rotary pair or pass-through column (k_copy_rope's) */
    const int per = a.dr - (a.inv ? a.rot_dim / 2 : 0);
    for (int u = threadIdx.x; u < NT * per; u += blockDim.x) {
        const int t = u / per;
        cu_rope_part_unit(a.q + (size_t)t * ldq + (size_t)h * (a.dn + a.dr) + a.dn,
                          a.out + (size_t)t * ldo + (size_t)h * (a.kvl + a.dr) + a.kvl, u - t * per, a.pos, t, a.inv,
                          a.rot_off, a.rot_dim, a.interleaved);
    }
}

struct ma_v_args {
    const bf16 *W;  /* kv_b [nh (dn + dv)][kvl] */
    const bf16 *ol; /* [T][nh][kvl], 16-byte aligned rows */
    bf16 *out;      /* [T][nh dv] */
    int nh, dn, dv, kvl;
    int early; /* weight loads may precede griddepcontrol.wait */
};

/* The warp's MV_ROWS rows of W_UV at the lane's chunks (zero past kvl or for a warp past the rows). */
__device__ __forceinline__ void ma_v_load(uint4 (&w)[MV_ROWS][MV_CH], const bf16 *wr, int kvl, int lane, bool live) {
    const int nch = kvl / 8;
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++)
#pragma unroll
        for (int k = 0; k < MV_CH; k++) {
            const int c = lane + 32 * k;
            w[r][k] = (live && c < nch) ? __ldg((const uint4 *)(wr + (size_t)r * kvl + (size_t)c * 8)) : make_uint4(0, 0, 0, 0);
        }
}

/* MV_ROWS output rows of one head a warp, for NT tokens (file comment). */
template <int NT>
__global__ __launch_bounds__(256) void k_v_up(ma_v_args a) {
    const int lane = threadIdx.x & 31;
    const int r0 = (blockIdx.x * 8 + (threadIdx.x >> 5)) * MV_ROWS;
    const bool live = r0 < a.nh * a.dv;
    const int h = live ? r0 / a.dv : 0, j0 = live ? r0 - h * a.dv : 0;
    const bf16 *wr = a.W + ((size_t)h * (size_t)(a.dn + a.dv) + (size_t)(a.dn + j0)) * (size_t)a.kvl;
    uint4 w[MV_ROWS][MV_CH];
    if (a.early) ma_v_load(w, wr, a.kvl, lane, live);
    cu_pdl_wait();
    cu_pdl_trigger();
    if (!a.early) ma_v_load(w, wr, a.kvl, lane, live);
    if (!live) return;
    const int nch = a.kvl / 8;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const bf16 *xr = a.ol + ((size_t)t * a.nh + h) * (size_t)a.kvl;
        float acc[MV_ROWS];
#pragma unroll
        for (int r = 0; r < MV_ROWS; r++) acc[r] = 0.f;
#pragma unroll
        for (int k = 0; k < MV_CH; k++) {
            const int c = lane + 32 * k;
            if (c >= nch) break;
            const uint4 xv = *(const uint4 *)(xr + (size_t)c * 8);
            const uint32_t xu[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int r = 0; r < MV_ROWS; r++) {
                const uint32_t wu[4] = {w[r][k].x, w[r][k].y, w[r][k].z, w[r][k].w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    acc[r] = fmaf(cu_bf_lo(wu[e]), cu_bf_lo(xu[e]), acc[r]);
                    acc[r] = fmaf(cu_bf_hi(wu[e]), cu_bf_hi(xu[e]), acc[r]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < MV_ROWS; r++)
#pragma unroll
            for (int o = 16; o; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
        if (lane == 0) {
            bf16 *y = a.out + (size_t)t * a.nh * a.dv + (size_t)r0;
#pragma unroll
            for (int r = 0; r < MV_ROWS; r++) y[r] = __float2bfloat16_rn(acc[r]);
        }
    }
}

/* kv_b's weights as plain bf16 that a kernel may read before griddepcontrol.wait (1), else 0. */
static int ma_early(ms_backend *b, const ms_linear *kv_b) {
    cu_wdesc d;
    ms_err e = {0};
    if (cu_wdesc_of(kv_b, &d, &e) != MS_OK) return 0;
    return d.fmt == MS_WFMT_PLAIN && d.dtype == MS_BF16 && cu_of(b)->weights_quiet && cu_knob(CU_KNOB_BF16_STREAM_EARLY);
}

/* Contract in cuda_internal.cuh. */
int cu_mla_absorb_small(ms_backend *b, const ms_linear *kv_b, const bf16 *W, const bf16 *q, int T, int nh, int dn,
                        int dr, int dv, int kvl, const int32_t *pos_d, const ms_rope_cfg *rc, bf16 *out, int *done,
                        ms_err *err) {
    *done = 0;
    if (T < 1 || T > MA_MAX_T || !cu_knob(CU_KNOB_MLA_ABSORB) || nh < 1 || dn < 1 || dn > MA_MAX_DN || kvl < 8 || kvl % 8 ||
        ((uintptr_t)W & 15))
        return MS_OK;
    ma_q_args a = {W, q, out, nh, dn, dr, dv, kvl, pos_d, NULL, 0, 0, 0, ma_early(b, kv_b)};
    if (rc && rc->rot_dim > 0) {
        a.rot_off = rc->rot_off - dn;
        a.rot_dim = rc->rot_dim;
        a.interleaved = rc->interleaved;
        if (a.rot_off < 0 || a.rot_dim % 2 || a.rot_off + a.rot_dim > dr)
            return ms_errf(err, MS_ERR_INVALID, "mla_absorb_q: rotary columns %d..%d lie outside the rope part %d..%d of q",
                           rc->rot_off, rc->rot_off + rc->rot_dim, dn, dn + dr);
        MS_TRY(cu_rope_table(b, rc, &a.inv, err));
    }
    const dim3 grid((unsigned)nh, (unsigned)((kvl + MA_COLS - 1) / MA_COLS));
    static void (*const kern[MA_MAX_T])(ma_q_args) = {k_absorb_q<1>, k_absorb_q<2>, k_absorb_q<3>, k_absorb_q<4>};
    CK(cu_launch(kern[T - 1], grid, 256, 0, cu_of(b)->stream, a));
    *done = 1;
    return MS_OK;
}

/* Contract in cuda_internal.cuh. */
int cu_mla_v_up_small(ms_backend *b, const ms_linear *kv_b, const bf16 *W, const bf16 *ol, int T, int nh, int dn,
                      int dv, int kvl, bf16 *out, int *done, ms_err *err) {
    *done = 0;
    if (T < 1 || T > MA_MAX_T || !cu_knob(CU_KNOB_MLA_ABSORB) || nh < 1 || dv < MV_ROWS || kvl < 8 || kvl % 8 ||
        kvl > 32 * 8 * MV_CH || dv % MV_ROWS ||
        ((uintptr_t)W & 15) || ((uintptr_t)ol & 15))
        return MS_OK;
    const ma_v_args a = {W, ol, out, nh, dn, dv, kvl, ma_early(b, kv_b)};
    const int64_t warps = ((int64_t)nh * dv) / MV_ROWS;
    const dim3 grid((unsigned)((warps + 7) / 8));
    static void (*const kern[MA_MAX_T])(ma_v_args) = {k_v_up<1>, k_v_up<2>, k_v_up<3>, k_v_up<4>};
    CK(cu_launch(kern[T - 1], grid, 256, 0, cu_of(b)->stream, a));
    *done = 1;
    return MS_OK;
}
