/* moe_cuda.cuh - the stages every CUDA MoE runner shares: the device form of a layer's expert
 * weights, routing statistics (tokens per expert, prefix sums, 64-row tile offsets, the list of
 * experts in use), the permutation of (token, k) pairs grouped by expert, and the weighted fp32
 * combine back to token order. Runners differ only in how they compute the expert products. */
#ifndef MS_MOE_CUDA_MOE_CUDA_CUH
#define MS_MOE_CUDA_MOE_CUDA_CUH

#include "backend/cuda/cuda_internal.cuh"

#define _Noreturn [[noreturn]]
extern "C" {
#include "moe/moe.h"
}
#undef _Noreturn

/* What ms_experts.prepared points at (device tables live until the backend is destroyed). */
typedef struct moe_cu_prep {
    int n;
    cu_wdesc *gate_d, *up_d, *down_d; /* [n] device */
    cu_wdesc gate_h, up_h, down_h;    /* expert 0's (format, shapes) */
} moe_cu_prep;

/* Workspace carve-up for one call. */
typedef struct moe_cu_ws {
    int T, topk, E, H, I, P;
    int32_t *counts, *offsets, *cursor, *tile_off, *active, *n_active; /* [E], [E+1], [E], [E+1], [E], [1] */
    int32_t *sorted_tok, *pair_pos;                                    /* [P] */
    bf16 *xs;    /* [P, H] permuted token rows (grouped/naive) */
    bf16 *h;     /* [P, I] silu(gate)*up */
    bf16 *g, *u; /* [P, I] naive only */
    float *ys;   /* [P, H] expert outputs, fp32 */
} moe_cu_ws;

/* Builds (once) the device weight tables of e; all expert linears must be placed on b. */
int moe_cu_prepare(ms_backend *b, ms_experts *e, ms_err *err);
/* Bytes of workspace for shape s; naive adds its separate gate/up buffers. */
size_t moe_cu_ws_size(const ms_moe_shape *s, int naive);
/* Carves ws into w (fails if too small). */
int moe_cu_ws_carve(const ms_moe_shape *s, int naive, void *ws, size_t ws_bytes, moe_cu_ws *w, ms_err *err);
/* counts, offsets, tile offsets, active list, sorted_tok/pair_pos; gathers xs when gather != 0. */
int moe_cu_route_permute(ms_backend *b, moe_cu_ws *w, const int32_t *ids_d, const bf16 *x, int gather, ms_err *err);
/* out[t,:] = sum_k w[t,k] * ys[pair_pos[t,k],:] accumulated in fp32, written in out's dtype. */
int moe_cu_combine(ms_backend *b, const moe_cu_ws *w, const float *w_d, ms_tensor *out, ms_err *err);
/* Common checks of run(): shapes, dtypes, preparation. Fills s from the call. */
int moe_cu_check(ms_backend *b, const ms_experts *e, const ms_tensor *x, int topk, const ms_tensor *out,
                 ms_moe_shape *s, const moe_cu_prep **prep, ms_err *err);
/* supports() of every CUDA runner (they differ in speed, not in what they can run): a CUDA backend
 * with compute capability >= 8.0, any shape. */
int moe_cu_supports(const ms_backend *b, const ms_moe_shape *shape, char *why, size_t why_cap);

#endif
