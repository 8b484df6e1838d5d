/* runner_decode.cu - the small-batch MoE runner: for each expert in use, one kernel pass reads its
 * gate/up weight rows once (16-byte loads, dequantized in registers) for all tokens routed to it and
 * writes silu(gate)*up; a second pass does the same for down; then the fp32 combine. Memory-bound by
 * design: the bytes read are the selected experts' weights. Tokens are read in place (no permuted
 * copy of x). rows_total = T is passed to the GEMV as a hint for sizing its shared-memory token
 * staging (an expert usually gets at most one row per token; more rows only take more passes).
 * One token with NVFP4 experts takes the fused kernel instead (cu_moe_fused: all of it in one launch,
 * no permutation), when it covers the shapes. A folded shared expert (ms_experts.shared_last) is a
 * slot of the fused kernel, or appended to the ids here (MS_MOE_CAP_SHARED_LAST: the forward's append
 * kernel is not needed). */
#include "moe/cuda/moe_cuda.cuh"

/* Bytes of one of the appended ids / weights arrays of a shared_last call, rounded to 256. */
static size_t shared_col_bytes(const ms_moe_shape *s) { return ((size_t)s->n_tokens * s->topk * 4 + 255) & ~(size_t)255; }
/* Bytes past the shared stages' workspace for both arrays (and the tail's alignment). */
static size_t shared_ids_bytes(const ms_moe_shape *s) { return 2 * shared_col_bytes(s) + 256; }

static size_t decode_ws(const ms_backend *b, const ms_moe_shape *s) {
    (void)b;
    return moe_cu_ws_size(s, 0) + shared_ids_bytes(s);
}

static int decode_run(ms_backend *b, const ms_experts *e, const ms_tensor *x, const int32_t *ids_d, const float *w_d,
                      int topk, ms_tensor *out, void *workspace, size_t ws_bytes, ms_err *err) {
    ms_moe_shape s;
    const moe_cu_prep *p;
    const int shared = e->shared_last ? 1 : 0; /* expert n - 1 for every token, weight 1, not in ids */
    MS_TRY(moe_cu_check(b, e, x, topk + shared, out, &s, &p, err));
    if (s.n_tokens == 0) return MS_OK;
    moe_cu_ws w;
    MS_TRY(moe_cu_ws_carve(&s, 0, workspace, ws_bytes, &w, err));
    if (s.n_tokens == 1) {
        cu_moe_fused_call fc = {.G = p->gate_d, .U = p->up_d, .D = p->down_d, .gate_h = p->gate_h,
                                .up_h = p->up_h, .down_h = p->down_h, .n_experts = e->n, .ids = ids_d, .wts = w_d,
                                .nslot = topk, .extra_slot = shared ? e->n : 0, .x = (const bf16 *)x->data,
                                .h = w.h, .out = out->data, .out_type = out->dtype};
        /* the form `moeserve tune` measured fastest for this shape, if it left one */
        ms_moe_fused_form(s.hidden, s.inter, topk + shared, &fc.form_groups, &fc.form_depth);
        int launched = 0;
        MS_TRY(cu_moe_fused(b, &fc, &launched, err));
        if (launched) return MS_OK;
    }
    if (shared) { /* the shared expert as column topk of every token, in the workspace's tail */
        const size_t base = moe_cu_ws_size(&s, 0), ids_bytes = shared_col_bytes(&s);
        if (ws_bytes < base + shared_ids_bytes(&s))
            return ms_errf(err, MS_ERR_NOMEM, "moe decode: workspace of %zu bytes is smaller than the %zu needed",
                           ws_bytes, base + shared_ids_bytes(&s));
        char *tail = (char *)(((uintptr_t)workspace + base + 255) & ~(uintptr_t)255);
        int32_t *ids2 = (int32_t *)tail;
        float *w2 = (float *)(tail + ids_bytes);
        MS_TRY(b->ops->moe_append(b, ids_d, w_d, s.n_tokens, topk, e->n - 1, 1.0f, ids2, w2, err));
        ids_d = ids2, w_d = w2;
    }
    MS_TRY(moe_cu_route_permute(b, &w, ids_d, (const bf16 *)x->data, 0, err));
    int slots = w.E < w.P ? w.E : w.P;
    const cu_gemv_call gate_up = {.mode = 1, .n_groups = slots, .W0 = p->gate_d, .W1 = p->up_d, .w0 = p->gate_h,
                                  .n_active = w.n_active, .group_w = w.active, .row_off = w.offsets,
                                  .row_cnt = w.counts, .row_idx = w.sorted_tok, .rows_total = w.T,
                                  .x = (const bf16 *)x->data, .y = w.h, .y_type = MS_BF16, .ldy = w.I};
    MS_TRY(cu_gemv_grouped(b, &gate_up, err));
    const cu_gemv_call down = {.mode = 0, .n_groups = slots, .W0 = p->down_d, .w0 = p->down_h, .n_active = w.n_active,
                               .group_w = w.active, .row_off = w.offsets, .row_cnt = w.counts, .rows_total = w.T,
                               .x = w.h, .y = w.ys, .y_type = MS_F32, .ldy = w.H};
    MS_TRY(cu_gemv_grouped(b, &down, err));
    return moe_cu_combine(b, &w, w_d, out, err);
}

/* ms_moe_runner.run_routed: the fused kernel's routed form (cu_moe_fused with cu_moe_route), or refused. */
static int decode_run_routed(ms_backend *b, const ms_experts *e, const ms_norm_in *n, const ms_linear *gate,
                             const ms_tensor *bias, const ms_route_cfg *rc, int32_t *ids_d, float *w_d, ms_tensor *out,
                             void *workspace, size_t ws_bytes, ms_err *err) {
    ms_moe_shape s;
    const moe_cu_prep *p;
    const int shared = e->shared_last ? 1 : 0;
    MS_TRY(moe_cu_check(b, e, n->out, rc->topk + shared, out, &s, &p, err));
    cu_norm_in nin;
    if (s.n_tokens != 1 || gate->fmt != MS_WFMT_PLAIN || gate->w.dtype != MS_BF16 || gate->bias.data ||
        gate->n_out != rc->n_experts || gate->n_in != s.hidden || (bias && ms_tensor_numel(bias) != rc->n_experts) ||
        !cu_norm_of(b, n, s.hidden, 1, &nin))
        return ms_errf(err, MS_ERR_UNSUPPORTED, "moe decode: the routed form does not cover this call");
    moe_cu_ws w;
    MS_TRY(moe_cu_ws_carve(&s, 0, workspace, ws_bytes, &w, err));
    const cu_moe_route rt = {.W = (const bf16 *)gate->w.data, .bias = bias ? bias->data : NULL,
                             .bias_t = bias ? (int)bias->dtype : 0, .rc = rc, .nin = nin, .ids = ids_d, .wts = w_d};
    cu_moe_fused_call fc = {.G = p->gate_d, .U = p->up_d, .D = p->down_d, .gate_h = p->gate_h, .up_h = p->up_h,
                            .down_h = p->down_h, .n_experts = e->n, .nslot = rc->topk,
                            .extra_slot = shared ? e->n : 0, .x = (const bf16 *)n->out->data, .h = w.h,
                            .out = out->data, .out_type = out->dtype, .route = &rt};
    ms_moe_fused_form(s.hidden, s.inter, rc->topk + shared, &fc.form_groups, &fc.form_depth);
    int launched = 0;
    MS_TRY(cu_moe_fused(b, &fc, &launched, err));
    return launched ? MS_OK : ms_errf(err, MS_ERR_UNSUPPORTED, "moe decode: the fused kernel's routed form declined");
}

extern "C" const ms_moe_runner ms_moe_runner_decode = {
    "decode", "cuda", moe_cu_supports, decode_ws, moe_cu_prepare, decode_run,
    MS_MOE_CAP_GRAPHS | MS_MOE_CAP_FEW_TOKENS | MS_MOE_CAP_PARTIAL | MS_MOE_CAP_SHARED_LAST, decode_run_routed,
};
