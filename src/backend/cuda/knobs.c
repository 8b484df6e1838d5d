/* knobs.c - the table of the CUDA backend's environment knobs (contract in knobs.h): name, kind,
 * default, range or value names, when it is read and its one-line meaning; the one reader, cu_knob,
 * and the table's printout for `moeserve doctor`. Plain C: compiled in every CUDA build and usable
 * without a GPU. */
#include "backend/cuda/knobs.h"

#include "backend/cuda/backend_cuda.h"
#include "core/log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { KN_INT, KN_CHOICE, KN_FLAG } kn_kind;

typedef struct kn_def {
    const char *name;           /* environment variable */
    kn_kind kind;
    int def;                    /* KN_INT: default value; KN_CHOICE: index of the default name; KN_FLAG: 0 */
    int lo, hi;                 /* KN_INT: accepted range (inclusive) */
    const char *const *choices; /* KN_CHOICE: value names, NULL-terminated (value = index) */
    int once;                   /* 1: read at first use and kept; 0: read at every call */
    const char *meaning;        /* one line for doctor */
} kn_def;

static const char *const gemv_choices[] = {"mma", "gv2", NULL};
static const char *const gg_choices[] = {"mma", "old", "sync", NULL};
static const char *const fp4_choices[] = {"v2", "v1", "v2o", "v3", "auto", "w8", NULL};
static const char *const router_choices[] = {"split", "warp", NULL};
static const char *const gw_n_choices[] = {"128", "256", NULL};
static const char *const mla_heads_choices[] = {"auto", "64", "16", NULL};

static const kn_def knobs[CU_KNOB_COUNT] = {
    [CU_KNOB_GEMV] = {"MS_CU_GEMV", KN_CHOICE, CU_GEMV_MMA, 0, 0, gemv_choices, 1,
                      "grouped GEMV: mma = tensor cores (gemv_mma.cu); gv2 = CUDA-core kernels (quant.cu), "
                      "cuBLASLt for bf16 linears"},
    [CU_KNOB_GEMV_WARPS_PER_SM] = {"MS_CU_GEMV_WARPS_PER_SM", KN_INT, 48, 1, 256, NULL, 1,
                                   "tensor-core GEMV splits K until the grid has this many warps per SM"},
    [CU_KNOB_GEMV_MAX_T] = {"MS_CU_GEMV_MAX_T", KN_INT, 16, 0, 4096, NULL, 1,
                            "FP8/NVFP4 linears with at most this many rows use the fused GEMV, more a bf16 "
                            "copy through cuBLASLt"},
    [CU_KNOB_BF16_GEMV_MAX_T] = {"MS_CU_BF16_GEMV_MAX_T", KN_INT, 0, 0, 1 << 20, NULL, 1,
                                 "bf16 linears with at most this many rows use the tensor-core GEMV "
                                 "(0: always cuBLASLt)"},
    [CU_KNOB_GG] = {"MS_CU_GG", KN_CHOICE, CU_GG_MMA, 0, 0, gg_choices, 0,
                    "grouped GEMM (prefill MoE): mma = tensor-core kernels of gemm_mma.cu (FP8/NVFP4 on sm_90: "
                    "wgmma, else mma.sync); sync = the mma.sync kernel everywhere; old = wmma kernel (quant.cu)"},
    [CU_KNOB_ATTN_NO_SPLIT] = {"MS_ATTN_NO_SPLIT", KN_FLAG, 0, 0, 1, NULL, 0,
                               "legacy, backend op default only (the forward uses --attention-backend flash_nosplit): no split-K"},
    [CU_KNOB_ATTN_NO_MMA] = {"MS_ATTN_NO_MMA", KN_FLAG, 0, 0, 1, NULL, 0,
                             "legacy, backend op default only (the forward uses --attention-backend flash): no tensor-core GQA"},
    [CU_KNOB_ROUTER_UNFUSED] = {"MS_CU_ROUTER_UNFUSED", KN_FLAG, 0, 0, 1, NULL, 0,
                                "router as cuBLASLt GEMV + routing kernel even at decode (default: one fused "
                                "kernel for up to 8 tokens)"},
    [CU_KNOB_GEMV_FP4] = {"MS_CU_GEMV_FP4", KN_CHOICE, CU_GEMV_FP4_AUTO, 0, 0, fp4_choices, 0,
                          "NVFP4 decode GEMV: auto = v3 for <= 16 groups, v2 above; w8 = FP8 wgmma for "
                          "one-token calls on sm_90a (gemv_w8.cu), else auto; v2 = fewer ALU ops; v1 = the "
                          "first form; v2o = v2 at <= 85 registers; v3 = v2 streamed through shared memory "
                          "(v1..v3 never take w8)"},
    [CU_KNOB_ROUTER] = {"MS_CU_ROUTER", KN_CHOICE, CU_ROUTER_SPLIT, 0, 0, router_choices, 0,
                        "fused decode router: split = logits over many blocks (K split, 4 experts a block) "
                        "then selection by the last block; warp = one warp per expert row (the first form)"},
    [CU_KNOB_LT_TUNE] = {"MS_CU_LT_TUNE", KN_INT, 8, 0, 32, NULL, 1,
                         "the first call of a cuBLASLt GEMM shape times up to this many of its candidate "
                         "algorithms and keeps the fastest; 0 or 1: cuBLASLt's first choice"},
    [CU_KNOB_PDL] = {"MS_CU_PDL", KN_INT, 1, 0, 1, NULL, 1,
                     "Programmatic Dependent Launch on sm_90+: each of our kernels may start while the previous "
                     "one drains and waits in griddepcontrol.wait (hides the launch gap); 0 = plain launches"},
    [CU_KNOB_BF16_GEMV_MAX_N] = {"MS_CU_BF16_GEMV_MAX_N", KN_INT, 0, 0, 1 << 30, NULL, 1,
                                 "bf16 linears with at most this many output features use the tensor-core GEMV "
                                 "at up to 16 rows (0: by MS_CU_BF16_GEMV_MAX_T only; for narrow stacked "
                                 "projections where cuBLASLt streams ~2 TB/s)"},
    [CU_KNOB_GW_N] = {"MS_CU_GW_N", KN_CHOICE, CU_GW_N_128, 0, 0, gw_n_choices, 0,
                      "FP8/NVFP4 wgmma grouped GEMM (sm_90): weight rows per block, 128 (two blocks an SM) or 256 "
                      "(one block, as the mma.sync kernel)"},
    [CU_KNOB_MLA_HEADS] = {"MS_CU_MLA_HEADS", KN_CHOICE, CU_MLA_HEADS_AUTO, 0, 0, mla_heads_choices, 0,
                           "heads per block of the tensor-core MLA kernel (attn_mla_mma.cu): auto = 16 for models of "
                           "at most 16 heads, else 64 (16 at batch-1 GLM-5 decode measured no gain); 64 or 16 "
                           "force one form"},
    [CU_KNOB_BF16_STREAM_MAX_T] = {"MS_CU_BF16_STREAM_MAX_T", KN_INT, 4, 0, 4, NULL, 0,
                                   "bf16 linears and fused gate/up with at most this many rows stream their weights "
                                   "through gemv_bf16.cu (CUDA cores, whole-row runs); 0: the other forms "
                                   "(cuBLASLt, MS_CU_BF16_GEMV_MAX_T)"},
    [CU_KNOB_BF16_STREAM_EARLY] = {"MS_CU_BF16_STREAM_EARLY", KN_INT, 1, 0, 1, NULL, 1,
                                   "1: the streaming bf16 GEMV copies its first weights before waiting for the previous "
                                   "kernel (PDL), when no device work in flight writes weights; 0: after"},
    [CU_KNOB_MOE_FUSED] = {"MS_CU_MOE_FUSED", KN_INT, 1, 0, 8, NULL, 0,
                           "1: a one-token MoE call with NVFP4 experts (hidden and intermediate multiples of 128) "
                           "runs as one persistent kernel (moe_fused.cu: gate/up, down and the weighted sum), in the "
                           "form `moeserve tune` measured fastest for the shape, else the one a cost model picks; "
                           "2..8: form 0..6 forced (when it fits); 0: the decode runner's two grouped GEMVs and "
                           "combine"},
    [CU_KNOB_NORM_FOLD] = {"MS_CU_NORM_FOLD", KN_INT, 2, 0, 3, NULL, 0,
                           "at one row, the residual add + RMSNorm before the router (2, the default; a router of at "
                           "most one block an SM), before a bf16 projection (3) or both (1) is computed by that "
                           "kernel's blocks (norm_linear / norm_router); 0: its own kernel. Folding into a projection "
                           "measured slower on the H200 (its 4 blocks an SM each read the 40 KB row from L2)"},
    [CU_KNOB_MLA_ABSORB] = {"MS_CU_MLA_ABSORB", KN_INT, 1, 0, 1, NULL, 0,
                            "1: the absorbed MLA products (q_nope W_UK with the rope part, o_lat W_UV^T) of at most 4 "
                            "tokens run as streaming kernels of ours (mla_absorb.cu, PDL); 0: cuBLAS's batched GEMM"},
    [CU_KNOB_MLA_PREP] = {"MS_CU_MLA_PREP", KN_INT, 1, 0, 1, NULL, 0,
                          "1: an MLA layer's q_a norm, latent preparation and indexer-key preparation run as one "
                          "launch (mla_prep); 0: three"},
    [CU_KNOB_ATTN_PREP] = {"MS_CU_ATTN_PREP", KN_INT, 2, 0, 2, NULL, 0,
                           "1: in a decode step (one new token a sequence) the GQA tensor-core attention kernel adds "
                           "the q/k/v biases, rotates and stores the cache rows itself (attn_mma.cu); 2: the same, "
                           "with the batch meta, the first key tile and the biases read before its PDL wait when "
                           "the weights are quiet; 0: the gqa_prep kernel first"},
    [CU_KNOB_ATTN_SPLIT_TILES] = {"MS_CU_ATTN_SPLIT_TILES", KN_INT, 0, 0, 1 << 20, NULL, 0,
                                  "the GQA tensor-core attention kernel splits keys across blocks (then merges the "
                                  "partials in a second kernel) only when the step's context spans more than this "
                                  "many 64-key tiles and the grid is small; 0: whenever the grid is small"},
    [CU_KNOB_MOE_ROUTE] = {"MS_CU_MOE_ROUTE", KN_INT, 1, 0, 1, NULL, 0,
                           "1: at one token the fused MoE kernel (MS_CU_MOE_FUSED) also computes the residual add + "
                           "RMSNorm before it and the router (each block routes for itself after a grid barrier), "
                           "one launch instead of two; 0: the router kernel first"},
    [CU_KNOB_BF16_STREAM_DYN] = {"MS_CU_BF16_STREAM_DYN", KN_INT, 0, 0, 95, NULL, 0,
                                 "1..95: the streaming bf16 GEMV (modes without a folded norm) gives each warp about "
                                 "this percent of its work up front and lets the warps claim the rest in small ranges, "
                                 "so they finish together (k_gvd, same bits as k_gvb at the same K split; where weights "
                                 "are copied before the PDL wait, only shapes with enough work for every warp to hold "
                                 "those copies); 0: every warp's rows fixed at launch (k_gvb)"},
    [CU_KNOB_BF16_STREAM_KS] = {"MS_CU_BF16_STREAM_KS", KN_INT, 0, 0, 8, NULL, 0,
                                "1, 2, 4, 8: the streaming bf16 GEMV cuts each row's K into this many shares when the "
                                "shape allows it (and, in the fixed form, at most 64 rows a warp; tests and tuning); 0 "
                                "(or another value): its own choice"},
    [CU_KNOB_BF16_STREAM_MMA] = {"MS_CU_BF16_STREAM_MMA", KN_INT, 0, 0, 1, NULL, 0,
                                 "1: the streaming bf16 GEMV's fixed form (k_gvb) computes each 512-byte step on tensor "
                                 "cores (two mma.sync a lane's 16 bytes, gemv_tc.cuh) instead of 24 CUDA-core "
                                 "instructions; results within fp32 summation order of the CUDA-core form, not the "
                                 "same bits; 0: CUDA cores"},
    [CU_KNOB_BF16_STREAM_L2PF] = {"MS_CU_BF16_STREAM_L2PF", KN_INT, 0, 0, 256, NULL, 0,
                                  "n > 0: where the streaming bf16 GEMV (fixed form) copies its first weights before the PDL "
                                  "wait and K >= MS_CU_BF16_STREAM_L2PF_MINK, each warp also asks the L2 for its next n "
                                  "512-byte steps there (bulk prefetch), to use the idle memory of the latency-bound "
                                  "kernels before it (attention); 0: none"},
    [CU_KNOB_BF16_STREAM_L2PF_MINK] = {"MS_CU_BF16_STREAM_L2PF_MINK", KN_INT, 8192, 0, 1 << 20, NULL, 0,
                                       "the smallest K at which MS_CU_BF16_STREAM_L2PF and _DEEPK apply (8192: at decode "
                                       "the output projections after attention and dense down projections, not q|k|v, "
                                       "gate/up or the lm_head)"},
    [CU_KNOB_BF16_STREAM_DEEPK] = {"MS_CU_BF16_STREAM_DEEPK", KN_INT, 0, 0, 12, NULL, 0,
                                   "12: one-row launches of the streaming bf16 GEMV at K >= MS_CU_BF16_STREAM_L2PF_MINK "
                                   "(CUDA-core step, no folded norm, early copies on) stream through rings of 12 stages, "
                                   "so that 11 steps a warp are copied before the PDL wait; 0 (or another value): 8 stages"},
    [CU_KNOB_ATTN_MERGE_EARLY] = {"MS_CU_ATTN_MERGE_EARLY", KN_INT, 0, 0, 1, NULL, 0,
                                  "1: the split-K attention merge (k_attn_combine) lets the next kernel launch before its "
                                  "own wait, so that the projection after it starts its early weight copies beside the "
                                  "attention; 0: after its wait"},
    [CU_KNOB_NORM_EARLY] = {"MS_CU_NORM_EARLY", KN_INT, 0, 0, 1, NULL, 0,
                            "1: the one-pass residual add + RMSNorm (k_rmsnorm_f32<1>: a layer's input norm, the final "
                            "norm, a norm the router or MoE kernel does not fold) lets the next kernel launch before its "
                            "own wait, so that the projection's early weight copies start while the kernel before the "
                            "norm (the MoE) drains; 0: after its wait"},
};

static atomic_int kn_cache[CU_KNOB_COUNT];  /* read-once knobs: value + 1; 0 = not read yet */
static atomic_int kn_warned[CU_KNOB_COUNT]; /* a choice knob's bad value was reported */

/* The knob's value from the environment now (no caching). */
static int kn_read(cu_knob_id id) {
    const kn_def *k = &knobs[id];
    const char *e = getenv(k->name);
    if (k->kind == KN_FLAG) return e != NULL;
    if (!e || !*e) return k->def;
    if (k->kind == KN_INT) {
        char *end = NULL;
        long v = strtol(e, &end, 10);
        return (*end || v < k->lo || v > k->hi) ? k->def : (int)v;
    }
    for (int i = 0; k->choices[i]; i++)
        if (!strcmp(e, k->choices[i])) return i;
    if (!atomic_exchange(&kn_warned[id], 1)) {
        char names[96] = "";
        for (int i = 0; k->choices[i]; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", k->choices[i]);
        MS_LOGW("%s=%s is not one of %s: using %s", k->name, e, names, k->choices[k->def]);
    }
    return k->def;
}

int cu_knob(cu_knob_id id) {
    if (!knobs[id].once) return kn_read(id);
    int c = atomic_load(&kn_cache[id]);
    if (c) return c - 1;
    int v = kn_read(id);
    atomic_store(&kn_cache[id], v + 1);
    return v;
}

void cu_knob_forget(cu_knob_id id) { atomic_store(&kn_cache[id], 0); }

/* A knob value as text: integers in decimal, choices by name, flags as set/unset. */
static void kn_format(const kn_def *k, int v, char *buf, size_t cap) {
    if (k->kind == KN_INT) snprintf(buf, cap, "%d", v);
    else if (k->kind == KN_CHOICE) snprintf(buf, cap, "%s", k->choices[v]);
    else snprintf(buf, cap, "%s", v ? "set" : "unset");
}

void ms_cuda_knobs_print(FILE *out) {
    fprintf(out, "  %-24s %-7s %-7s %-5s %s\n", "name", "value", "default", "read", "meaning");
    for (int i = 0; i < CU_KNOB_COUNT; i++) {
        const kn_def *k = &knobs[i];
        char val[24], def[24];
        kn_format(k, cu_knob((cu_knob_id)i), val, sizeof val);
        kn_format(k, k->def, def, sizeof def);
        fprintf(out, "  %-24s %-7s %-7s %-5s %s\n", k->name, val, def, k->once ? "once" : "each", k->meaning);
    }
}
