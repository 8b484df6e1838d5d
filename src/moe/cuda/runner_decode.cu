/* runner_decode.cu - the small-batch MoE runner: for each expert in use, one kernel pass reads its
 * gate/up weight rows once (16-byte loads, dequantized in registers) for all tokens routed to it and
 * writes silu(gate)*up; a second pass does the same for down; then the fp32 combine. Memory-bound by
 * design: the bytes read are the selected experts' weights. Tokens are read in place (no permuted
 * copy of x). rows_total = T is passed to the GEMV as a hint for sizing its shared-memory token
 * staging (an expert usually gets at most one row per token; more rows only take more passes). */
#include "moe/cuda/moe_cuda.cuh"

static size_t decode_ws(const ms_backend *b, const ms_moe_shape *s) {
    (void)b;
    return moe_cu_ws_size(s, 0);
}

static int decode_run(ms_backend *b, const ms_experts *e, const ms_tensor *x, const int32_t *ids_d, const float *w_d,
                      int topk, ms_tensor *out, void *workspace, size_t ws_bytes, ms_err *err) {
    ms_moe_shape s;
    const moe_cu_prep *p;
    MS_TRY(moe_cu_check(b, e, x, topk, out, &s, &p, err));
    if (s.n_tokens == 0) return MS_OK;
    moe_cu_ws w;
    MS_TRY(moe_cu_ws_carve(&s, 0, workspace, ws_bytes, &w, err));
    MS_TRY(moe_cu_route_permute(b, &w, ids_d, (const bf16 *)x->data, 0, err));
    int slots = w.E < w.P ? w.E : w.P;
    MS_TRY(cu_gemv_grouped(b, 1, p->gate_d, p->up_d, &p->gate_h, slots, w.n_active, w.active, w.offsets, w.counts,
                           w.sorted_tok, w.T, (const bf16 *)x->data, w.h, MS_BF16, w.I, err));
    MS_TRY(cu_gemv_grouped(b, 0, p->down_d, NULL, &p->down_h, slots, w.n_active, w.active, w.offsets, w.counts, NULL, w.T,
                           w.h, w.ys, MS_F32, w.H, err));
    return moe_cu_combine(b, &w, w_d, out, err);
}

extern "C" const ms_moe_runner ms_moe_runner_decode = {
    "decode", "cuda", moe_cu_supports, decode_ws, moe_cu_prepare, decode_run, MS_MOE_CAP_GRAPHS | MS_MOE_CAP_FEW_TOKENS,
};
