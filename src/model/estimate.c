/* estimate.c - see estimate.h. Counts follow the loader: embedding and lm_head split by vocabulary,
 * attention per the architecture table (attn_params), dense MLP and shared experts split by width,
 * routed experts split across ranks (tensor or expert parallel hold the same total), router, norms
 * and the DSA indexer replicated and never quantized. Formats follow `quantize`'s policy: FP8 block
 * 128x128 quantizes attention projections, dense MLP and experts; NVFP4 (group 16, FP8 scales) the
 * dense MLP and experts only; embeddings and lm_head stay BF16 in every format. */
#include "model/estimate.h"

#include "model/arch.h"

#include <string.h>

int ms_est_format_parse(const char *s, ms_est_format *f) {
    if (!strcmp(s, "bf16")) *f = MS_EST_BF16;
    else if (!strcmp(s, "fp8")) *f = MS_EST_FP8;
    else if (!strcmp(s, "nvfp4")) *f = MS_EST_NVFP4;
    else return -1;
    return 0;
}

/* bytes per element of a quantized linear (scales included) */
static double qbytes(ms_est_format f) {
    switch (f) {
    case MS_EST_FP8: return 1.0 + 4.0 / (128.0 * 128.0);
    case MS_EST_NVFP4: return 0.5 + 1.0 / 16.0;
    default: return 2.0;
    }
}

int ms_estimate_memory(const ms_config *c, ms_est_format f, int tp, int batch_tokens, ms_estimate *e, ms_err *err) {
    memset(e, 0, sizeof *e);
    if (tp < 1) return ms_errf(err, MS_ERR_INVALID, "tensor-parallel degree %d is not positive", tp);
    MS_TRY(c->arch->check_tp(c, tp, err));
    const double H = c->hidden_size, V = c->vocab_size, qb = qbytes(f), attn_b = f == MS_EST_FP8 ? qb : 2.0;
    double total = 0, active = 0, bytes = 0, bytes_rank = 0;
#define ADD(n, b, per_rank, act) (total += (n), bytes += (n) * (b), bytes_rank += (n) * (b) * (per_rank), active += (act) ? (n) : 0)
    ADD(V * H, 2.0, 1.0 / tp, 0);                                  /* embedding (a lookup reads one row) */
    if (!c->tie_word_embeddings) ADD(V * H, 2.0, 1.0 / tp, 1);     /* lm_head */
    ADD(H, 2.0, 1.0, 1);                                           /* final norm */
    for (int L = 0; L < c->num_layers; L++) {
        double split = 0, repl = 0, plain = 0;
        c->arch->attn_params(c, L, &split, &repl, &plain);
        ADD(split, attn_b, 1.0 / tp, 1);
        ADD(repl, attn_b, 1.0, 1);
        ADD(plain + 2 * H, 2.0, 1.0, 1); /* + the two layer norms */
        if (!c->layer_is_moe[L]) {
            ADD(3 * H * c->intermediate_size, qb, 1.0 / tp, 1);
            continue;
        }
        const double E = c->n_routed_experts, I = c->moe_intermediate_size;
        ADD(E * H + E, 4.0, 1.0, 1); /* router (+ correction bias), kept in high precision */
        ADD(3 * H * I * c->n_shared_experts, qb, 1.0 / tp, 1);
        double experts = 3 * H * I * E;
        total += experts, bytes += experts * qb, bytes_rank += experts * qb / tp;
        active += 3 * H * I * c->num_experts_per_tok;
    }
#undef ADD
    double kv = 0;
    for (int L = 0; L < c->num_layers; L++) kv += (double)c->arch->kv_bytes_per_token(c, L, 2, tp);
    /* workspace: the step's activations in f32 (hidden, attention, the widest MLP of the step's routed
     * tokens), the logits of every sequence, and ~1 GiB of CUDA context and cuBLAS/NCCL buffers */
    double widest = c->intermediate_size > c->moe_intermediate_size * c->num_experts_per_tok
                        ? c->intermediate_size : (double)c->moe_intermediate_size * c->num_experts_per_tok;
    double act = (double)batch_tokens * (8.0 * H + 3.0 * widest / tp) * 4.0;
    double logits = (double)(batch_tokens < 1024 ? batch_tokens : 1024) * V * 4.0;
    e->params_total = total;
    e->params_active = active;
    e->weight_bytes = bytes;
    e->weight_bytes_rank = bytes_rank;
    e->kv_bytes_token = kv;
    e->workspace_rank = act + logits + 1073741824.0;
    return MS_OK;
}

int ms_estimate_min_tp(const ms_config *c, ms_est_format f, double kv_tokens, int batch_tokens, double gpu_bytes,
                       double usable, int max_tp) {
    for (int tp = 1; tp <= max_tp; tp *= 2) {
        ms_estimate e;
        ms_err err = {0};
        if (ms_estimate_memory(c, f, tp, batch_tokens, &e, &err) != MS_OK) continue;
        if (e.weight_bytes_rank + kv_tokens * e.kv_bytes_token + e.workspace_rank <= gpu_bytes * usable) return tp;
    }
    return 0;
}
