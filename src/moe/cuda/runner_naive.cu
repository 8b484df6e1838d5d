/* runner_naive.cu - the GPU reference MoE runner: tokens permuted by expert, then per expert a
 * dequantize-to-bf16 of its three weights and cuBLAS GEMMs. Slow (a host sync to read the
 * per-expert counts, one weight expansion per expert) but built from the simplest parts, so the
 * other runners are checked against it and against the CPU runner. */
#include "moe/cuda/moe_cuda.cuh"

#include <stdlib.h>
#include <string.h>

static size_t naive_ws(const ms_backend *b, const ms_moe_shape *s) {
    (void)b;
    return moe_cu_ws_size(s, 1);
}

/* Linear through the dequantized bf16 form: y [M, N] = x [M, K] · Wᵀ. */
static int deq_gemm(ms_backend *b, const ms_linear *W, const bf16 *x, int M, void *y, int yt, ms_err *err) {
    const bf16 *wb;
    MS_TRY(cu_weight_bf16(b, W, 0, &wb, err));
    return cu_gemm(b, M, (int)W->n_out, (int)W->n_in, x, W->n_in, MS_BF16, wb, W->n_in, 1, y, W->n_out, yt, 0.f, err);
}

static int naive_run(ms_backend *b, const ms_experts *e, const ms_tensor *x, const int32_t *ids_d, const float *w_d,
                     int topk, ms_tensor *out, void *workspace, size_t ws_bytes, ms_err *err) {
    ms_moe_shape s;
    const moe_cu_prep *p;
    MS_TRY(moe_cu_check(b, e, x, topk, out, &s, &p, err));
    if (s.n_tokens == 0) return MS_OK;
    moe_cu_ws w;
    MS_TRY(moe_cu_ws_carve(&s, 1, workspace, ws_bytes, &w, err));
    MS_TRY(moe_cu_route_permute(b, &w, ids_d, (const bf16 *)x->data, 1, err));
    int32_t *off = (int32_t *)malloc(sizeof(int32_t) * (size_t)(w.E + 1));
    if (!off) return ms_errf(err, MS_ERR_NOMEM, "moe naive: out of host memory");
    int rc = b->ops->download(b, off, w.offsets, sizeof(int32_t) * (size_t)(w.E + 1), err);
    for (int ex = 0; ex < w.E && rc == MS_OK; ex++) {
        int r0 = off[ex], cnt = off[ex + 1] - off[ex];
        if (cnt <= 0) continue;
        bf16 *xs = w.xs + (size_t)r0 * w.H;
        bf16 *g = w.g + (size_t)r0 * w.I, *u = w.u + (size_t)r0 * w.I, *h = w.h + (size_t)r0 * w.I;
        rc = deq_gemm(b, &e->gate[ex], xs, cnt, g, MS_BF16, err);
        if (rc == MS_OK) rc = deq_gemm(b, &e->up[ex], xs, cnt, u, MS_BF16, err);
        if (rc == MS_OK) {
            ms_tensor tg = ms_tensor_2d(MS_BF16, cnt, w.I), tu = tg, th = tg;
            tg.data = g;
            tu.data = u;
            th.data = h;
            rc = cu_op_silu_mul(b, &tg, &tu, &th, err);
        }
        if (rc == MS_OK) rc = deq_gemm(b, &e->down[ex], h, cnt, w.ys + (size_t)r0 * w.H, MS_F32, err);
    }
    free(off);
    MS_TRY(rc);
    return moe_cu_combine(b, &w, w_d, out, err);
}

extern "C" const ms_moe_runner ms_moe_runner_naive = {
    "naive", "cuda", moe_cu_supports, naive_ws, moe_cu_prepare, naive_run, MS_MOE_CAP_PARTIAL /* host waits inside: no graphs */,
};
