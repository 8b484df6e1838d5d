/* runner_grouped.cu - the prefill / large-batch MoE runner: token rows permuted by expert, then one
 * grouped tensor-core GEMM launch for gate+up (SwiGLU fused in the epilogue) and one for down, each
 * dequantizing BF16/FP8/NVFP4 weight tiles into shared memory (cu_gemm_grouped: gemm_mma.cu, or
 * quant.cu's wmma kernel for what that does not cover), then the fp32 combine. */
#include "moe/cuda/moe_cuda.cuh"

static size_t grouped_ws(const ms_backend *b, const ms_moe_shape *s) {
    (void)b;
    return moe_cu_ws_size(s, 0);
}

static int grouped_run(ms_backend *b, const ms_experts *e, const ms_tensor *x, const int32_t *ids_d, const float *w_d,
                       int topk, ms_tensor *out, void *workspace, size_t ws_bytes, ms_err *err) {
    ms_moe_shape s;
    const moe_cu_prep *p;
    MS_TRY(moe_cu_check(b, e, x, topk, out, &s, &p, err));
    if (s.n_tokens == 0) return MS_OK;
    moe_cu_ws w;
    MS_TRY(moe_cu_ws_carve(&s, 0, workspace, ws_bytes, &w, err));
    MS_TRY(moe_cu_route_permute(b, &w, ids_d, (const bf16 *)x->data, 1, err));
    int max_tiles = (w.P + CU_GG_BM - 1) / CU_GG_BM + (w.E < w.P ? w.E : w.P);
    const cu_gg_call gate_up = {.mode = 1, .n_groups = w.E, .max_tiles = max_tiles, .W0 = p->gate_d, .W1 = p->up_d,
                                .w0 = p->gate_h, .tile_off = w.tile_off, .row_off = w.offsets, .row_cnt = w.counts,
                                .x = w.xs, .y = w.h, .y_type = MS_BF16, .ldy = w.I};
    MS_TRY(cu_gemm_grouped(b, &gate_up, err));
    const cu_gg_call down = {.mode = 0, .n_groups = w.E, .max_tiles = max_tiles, .W0 = p->down_d, .w0 = p->down_h,
                             .tile_off = w.tile_off, .row_off = w.offsets, .row_cnt = w.counts, .x = w.h, .y = w.ys,
                             .y_type = MS_F32, .ldy = w.H};
    MS_TRY(cu_gemm_grouped(b, &down, err));
    return moe_cu_combine(b, &w, w_d, out, err);
}

extern "C" const ms_moe_runner ms_moe_runner_grouped = {
    "grouped", "cuda", moe_cu_supports, grouped_ws, moe_cu_prepare, grouped_run, MS_MOE_CAP_GRAPHS | MS_MOE_CAP_MANY_TOKENS | MS_MOE_CAP_PARTIAL,
};
