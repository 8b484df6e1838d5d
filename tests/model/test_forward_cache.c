/* test_forward_cache.c - the forward's cache logic on tiny random models built in memory, both
 * architectures: incremental decode through the paged KV cache equals a full recompute, chunked
 * prefill equals one-shot prefill, two sequences batched together equal each run alone, and
 * --check-numerics names the layer, op and position of a NaN. The DSA model has index_topk smaller
 * than the sequence, "shared" indexer layers and grouped routing; the glm4_moe model has qk-norm,
 * q/k/v bias, partial NeoX RoPE, a dense first layer, and variants with NVFP4 experts and FP8
 * attention. (Agreement with transformers is the fixture conformance test's job.)
 *
 * `test_forward_cache cuda` runs the same checks on the GPU (bf16 activations, so the tolerance is
 * TOL_GPU; skipped with a message when there is none): decode-vs-recompute and chunked-vs-one-shot
 * replay the one-shot run's expert and index choices (so they run op by op: a replaying forward takes
 * no graphs), the batched checks run with decode graphs, and graph steps (decode, and speculative
 * verification of 4 tokens per sequence) are checked against the same steps run op by op, and graph
 * decode with Programmatic Dependent Launch on against off (bitwise). */
#include "backend/backend.h"
#include "core/dtype.h"
#include "model/arch.h"
#include "model/model.h"
#include "test.h"
#include "test_linear.h"
#ifdef MS_HAVE_CUDA
#include "backend/cuda/backend_cuda.h" /* the routed MoE kernel's launch counter */
#include "backend/cuda/knobs.h" /* MS_CU_PDL A/B */
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 0xdeadbeefcafef00dull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}
static float frand(void) { return (float)((rnd() & 0xffffff) / (double)0x1000000 * 2.0 - 1.0); }

static ms_backend *B;
static ms_err E;
static int g_gpu;      /* running on the cuda backend */
static double g_tol;   /* tolerance of cache/batching equivalences: 1e-4 on the CPU (float32) */
#define TOL_GPU 5e-2   /* bf16 activations: two GPU runs taking different kernels (GEMV or GEMM, by token
                       * count) are each within 2-3e-2 of float32 on these O(1)-weight models */

/* ------------------------------------------------------------------ model builder */

static void *g_mem[8192];
static int g_nmem;
static void *amalloc(size_t n) {
    MS_ASSERT(g_nmem < 8192);
    return g_mem[g_nmem++] = calloc(1, n ? n : 1);
}
static void afree_all(void) {
    while (g_nmem) free(g_mem[--g_nmem]);
}

static ms_tensor vec_bf16(int64_t n, float base, float sc) {
    ms_tensor t = ms_tensor_make(MS_BF16, 1, &n);
    uint16_t *p = amalloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) p[i] = ms_f32_to_bf16(base + sc * frand());
    t.data = p;
    return t;
}

static ms_linear lin(int fmt, int64_t N, int64_t K, int bias) {
    ms_linear W;
    test_linear_init(&W, "test", fmt, N, K);
    float sc = 1.7f / sqrtf((float)K);
    if (fmt == MS_WFMT_PLAIN) {
        W.w = ms_tensor_2d(MS_BF16, N, K);
        uint16_t *p = amalloc((size_t)(N * K) * 2);
        for (int64_t i = 0; i < N * K; i++) p[i] = ms_f32_to_bf16(sc * frand());
        W.w.data = p;
    } else if (fmt == MS_WFMT_FP8) {
        W.w = ms_tensor_2d(MS_F8E4M3, N, K);
        uint8_t *p = amalloc((size_t)(N * K));
        for (int64_t i = 0; i < N * K; i++) p[i] = ms_f32_to_e4m3(400.0f * frand());
        W.w.data = p;
        W.scale = ms_tensor_2d(MS_F32, (N + 127) / 128, (K + 127) / 128);
        float *s = amalloc(ms_tensor_nbytes(&W.scale));
        for (int64_t i = 0; i < ms_tensor_numel(&W.scale); i++) s[i] = sc / 400.0f;
        W.scale.data = s;
    } else {
        W.w = ms_tensor_2d(MS_U8, N, K / 2);
        uint8_t *p = amalloc((size_t)(N * K / 2));
        for (int64_t i = 0; i < N * K / 2; i++) p[i] = (uint8_t)rnd();
        W.w.data = p;
        W.scale = ms_tensor_2d(MS_F8E4M3, N, K / 16);
        uint8_t *s = amalloc((size_t)(N * K / 16));
        for (int64_t i = 0; i < N * K / 16; i++) s[i] = ms_f32_to_e4m3(1.0f + (rnd() % 4) * 0.25f);
        W.scale.data = s;
        W.scale2 = sc / 4.0f;
    }
    if (bias) W.bias = vec_bf16(N, 0, 0.3f);
    return W;
}

enum { V = 97 };
/* Dims the odd-dims test changes (legal configs the fast paths do not cover: kv_lora_rank not a
 * multiple of 16, num_experts_per_tok above 64, a rotary dim above 1024, hidden / intermediate /
 * head sizes that are multiples of 8 or 16 but not of 32); the defaults otherwise. */
static int H = 64, INTER = 96, MI = 32;
static int NEXP = 8, TOPK = 3, KVL = 32, HD = 16, ROT = 8, NH = 4, NKV = 2, QKN = 1;
static int QL = 48, DN = 16, DR = 8, DV = 16, IH = 16, DSA_AFMT = MS_WFMT_PLAIN;

static void common_cfg(ms_config *c, int layers, int grouped) {
    c->vocab_size = V;
    c->hidden_size = H;
    c->num_layers = layers;
    c->rope_theta = 10000.0;
    c->rms_norm_eps = 1e-6f;
    c->intermediate_size = INTER;
    c->moe_intermediate_size = MI;
    c->n_routed_experts = NEXP;
    c->n_shared_experts = 1;
    c->num_experts_per_tok = TOPK;
    c->first_k_dense_replace = 1;
    for (int L = 0; L < layers; L++) c->layer_is_moe[L] = L >= 1;
    c->n_group = grouped ? 4 : 1;
    c->topk_group = grouped ? 2 : 1;
    c->norm_topk_prob = 1;
    c->routed_scaling_factor = 2.5f;
}

static void build_mlp(ms_model *m, ms_layer *l, int L, int efmt) {
    const ms_config *c = &m->cfg;
    l->attn_norm = vec_bf16(H, 1.0f, 0.2f);
    l->ffn_norm = vec_bf16(H, 1.0f, 0.2f);
    l->is_moe = c->layer_is_moe[L];
    if (!l->is_moe) {
        l->gate_proj = lin(MS_WFMT_PLAIN, INTER, H, 0);
        l->up_proj = lin(MS_WFMT_PLAIN, INTER, H, 0);
        l->down_proj = lin(MS_WFMT_PLAIN, H, INTER, 0);
        return;
    }
    l->router = lin(MS_WFMT_PLAIN, NEXP, H, 0);
    l->router_bias = ms_tensor_make(MS_F32, 1, (int64_t[]){NEXP});
    float *bias = amalloc(NEXP * 4);
    for (int i = 0; i < NEXP; i++) bias[i] = 0.3f * frand();
    l->router_bias.data = bias;
    l->experts.n = NEXP;
    l->experts.gate = amalloc(sizeof(ms_linear) * NEXP);
    l->experts.up = amalloc(sizeof(ms_linear) * NEXP);
    l->experts.down = amalloc(sizeof(ms_linear) * NEXP);
    for (int e = 0; e < NEXP; e++) {
        l->experts.gate[e] = lin(efmt, MI, H, 0);
        l->experts.up[e] = lin(efmt, MI, H, 0);
        l->experts.down[e] = lin(efmt, H, MI, 0);
    }
    l->has_shared = 1;
    l->sh_gate = lin(MS_WFMT_PLAIN, MI, H, 0);
    l->sh_up = lin(MS_WFMT_PLAIN, MI, H, 0);
    l->sh_down = lin(MS_WFMT_PLAIN, H, MI, 0);
}

static void build_top(ms_model *m) {
    m->embed = ms_tensor_2d(MS_BF16, V, H);
    uint16_t *e = amalloc((size_t)(V * H) * 2);
    for (int i = 0; i < V * H; i++) e[i] = ms_f32_to_bf16(frand());
    m->embed.data = e;
    m->final_norm = vec_bf16(H, 1.0f, 0.2f);
    m->lm_head = lin(MS_WFMT_PLAIN, V, H, 0);
}

/* glm4_moe: 3 layers (first dense), NH heads / NKV kv heads (4 / 2), head_dim HD (16), rotary ROT (8) */
static ms_model *build_glm4(int efmt, int afmt, int grouped) {
    ms_model *m = amalloc(sizeof *m);
    ms_config *c = &m->cfg;
    c->arch = &ms_arch_glm4_moe;
    strcpy(c->model_type, "glm4_moe");
    common_cfg(c, 3, grouped);
    c->num_heads = NH;
    c->num_kv_heads = NKV;
    c->head_dim = HD;
    c->rotary_dim = ROT;
    c->use_qk_norm = QKN;
    c->attention_bias = 1;
    m->layers = amalloc(sizeof(ms_layer) * 3);
    for (int L = 0; L < 3; L++) {
        ms_layer *l = &m->layers[L];
        l->q_proj = lin(afmt, NH * HD, H, 1);
        l->k_proj = lin(afmt, NKV * HD, H, 1);
        l->v_proj = lin(afmt, NKV * HD, H, 1);
        l->o_proj = lin(afmt, H, NH * HD, 0);
        if (QKN) {
            l->q_norm = vec_bf16(HD, 1.0f, 0.2f);
            l->k_norm = vec_bf16(HD, 1.0f, 0.2f);
        }
        build_mlp(m, l, L, efmt);
    }
    build_top(m);
    return m;
}

/* glm_moe_dsa: 4 layers (first dense), 4 heads, q_lora QL (48), kv_lora KVL (32), nope DN (16), rope
 * DR (8), v DV (16), indexer 8 heads x IH (16), attention projections in DSA_AFMT (bf16), index_topk
 * as given, layers 1 and 3 share the previous full layer's top-k */
static ms_model *build_dsa(int index_topk, int grouped) {
    ms_model *m = amalloc(sizeof *m);
    ms_config *c = &m->cfg;
    c->arch = &ms_arch_glm_moe_dsa;
    strcpy(c->model_type, "glm_moe_dsa");
    common_cfg(c, 4, grouped);
    c->num_heads = 4;
    c->num_kv_heads = 4;
    c->q_lora_rank = QL;
    c->kv_lora_rank = KVL;
    c->qk_nope_head_dim = DN;
    c->qk_rope_head_dim = DR;
    c->v_head_dim = DV;
    c->rope_interleave = 1;
    c->indexer_rope_interleave = 1;
    c->index_topk = index_topk;
    c->index_n_heads = 8;
    c->index_head_dim = IH;
    const uint8_t full[4] = {1, 0, 1, 0};
    const int af = DSA_AFMT;
    m->layers = amalloc(sizeof(ms_layer) * 4);
    for (int L = 0; L < 4; L++) {
        ms_layer *l = &m->layers[L];
        c->indexer_full[L] = full[L];
        l->q_a_proj = lin(af, QL, H, 0);
        l->q_a_norm = vec_bf16(QL, 1.0f, 0.2f);
        l->q_b_proj = lin(af, 4 * (DN + DR), QL, 0);
        l->kv_a_proj = lin(af, KVL + DR, H, 0);
        l->kv_a_norm = vec_bf16(KVL, 1.0f, 0.2f);
        l->kv_b_proj = lin(af, 4 * (DN + DV), KVL, 0);
        l->o_proj = lin(af, H, 4 * DV, 0);
        if (full[L]) {
            l->has_indexer = 1;
            l->idx_wq_b = lin(MS_WFMT_PLAIN, 8 * IH, QL, 0);
            l->idx_wk = lin(MS_WFMT_PLAIN, IH, H, 0);
            l->idx_wproj = lin(MS_WFMT_PLAIN, 8, H, 0);
            l->idx_k_norm_w = vec_bf16(IH, 1.0f, 0.2f);
            l->idx_k_norm_b = vec_bf16(IH, 0.0f, 0.2f);
        }
        build_mlp(m, l, L, MS_WFMT_PLAIN);
    }
    build_top(m);
    return m;
}

/* ------------------------------------------------------------------ batches */

enum { PS = 4, NPAGES = 16, SEQ = 13 };

/* Places a built model's tensors on the test backend (the GPU copies them; the CPU keeps views). */
static ms_model *placed(ms_model *m) {
    int rc = ms_model_place(m, B, &E);
    if (rc) fprintf(stderr, "    place: %s\n", E.msg);
    CHECK(rc == MS_OK);
    return m;
}

typedef struct {
    const int32_t *ids; /* whole sequence */
    const int32_t *pages;
    int start, n_new;   /* new tokens [start, start+n_new) */
} seq_part;

/* Runs one step over parts; logits for every new token, in order. */
static int step(ms_forward *f, const seq_part *parts, int n_parts, float *logits) {
    int32_t tok[64], pos[64], slot[64], lidx[64], start[9], ctx[8], bt[8 * 8];
    int T = 0;
    for (int s = 0; s < n_parts; s++) {
        start[s] = T;
        ctx[s] = parts[s].start + parts[s].n_new;
        for (int j = 0; j < 8; j++) bt[s * 8 + j] = parts[s].pages[j];
        for (int i = 0; i < parts[s].n_new; i++, T++) {
            int p = parts[s].start + i;
            tok[T] = parts[s].ids[p];
            pos[T] = p;
            slot[T] = parts[s].pages[p / PS] * PS + p % PS;
            lidx[T] = T;
        }
    }
    start[n_parts] = T;
    ms_batch b = {T, n_parts, tok, pos, start, ctx, slot, bt, 8, PS, T, lidx};
    int rc = ms_forward_run(f, &b, logits, &E);
    if (rc) fprintf(stderr, "    forward: %s\n", E.msg);
    return rc;
}

static ms_forward *mkfwd_g(ms_model *m, int max_tokens, int graphs) {
    ms_forward_opts o = {.max_tokens = max_tokens, .n_pages = NPAGES, .page_size = PS, .moe_runner = "auto",
                         .graphs = graphs};
    ms_forward *f = NULL;
    if (ms_forward_create(m, B, &o, &f, &E) != MS_OK) fprintf(stderr, "    create: %s\n", E.msg);
    return f;
}

static ms_forward *mkfwd(ms_model *m, int max_tokens) { return mkfwd_g(m, max_tokens, 1); }

/* A forward that records its steps' discrete choices into rec, or replays rep's (model.h, ms_decisions;
 * either may be NULL). Such a forward runs every step op by op (no graphs). */
static ms_forward *mkfwd_d(ms_model *m, int max_tokens, ms_decisions *rec, const ms_decisions *rep) {
    ms_forward_opts o = {.max_tokens = max_tokens, .n_pages = NPAGES, .page_size = PS, .moe_runner = "auto",
                         .record = rec, .replay = rep};
    ms_forward *f = NULL;
    if (ms_forward_create(m, B, &o, &f, &E) != MS_OK) fprintf(stderr, "    create: %s\n", E.msg);
    return f;
}

/* Decisions of a model for n tokens (allocated; ms_decisions_free releases them). */
static int dec_alloc(const ms_model *m, int n, ms_decisions *d) {
    const int k = m->cfg.num_experts_per_tok > 0 ? m->cfg.num_experts_per_tok : 1;
    const int it = m->cfg.index_topk > 0 ? m->cfg.index_topk : 1;
    return ms_decisions_alloc(d, m->cfg.num_layers, n, k, it, &E);
}

/* *out (re)made as tokens [t0, t0 + n) of all. */
static void dec_slice(const ms_model *m, const ms_decisions *all, int t0, int n, ms_decisions *out) {
    ms_decisions_free(out);
    const int rc = dec_alloc(m, n, out);
    CHECK(rc == MS_OK);
    if (rc != MS_OK) return;
    for (int L = 0; L < all->n_layers; L++) {
        memcpy(out->expert_ids + (size_t)L * n * all->topk, all->expert_ids + ((size_t)L * all->n_tokens + t0) * all->topk,
               sizeof(int32_t) * (size_t)n * all->topk);
        memcpy(out->expert_margin + (size_t)L * n, all->expert_margin + (size_t)L * all->n_tokens + t0,
               sizeof(float) * (size_t)n);
        memcpy(out->index_sel + (size_t)L * n * all->index_topk,
               all->index_sel + ((size_t)L * all->n_tokens + t0) * all->index_topk,
               sizeof(int32_t) * (size_t)n * all->index_topk);
    }
}

static double row_err(const float *a, const float *b, int n) {
    double mx = 1e-12, md = 0;
    for (int i = 0; i < n; i++) {
        mx = fmax(mx, fabs(b[i]));
        double d = fabs(a[i] - b[i]);
        md = isnan(d) ? INFINITY : fmax(md, d);
    }
    return md / mx;
}

static int all_close(const float *a, const float *b, int rows, double tol, const char *what) {
    double worst = 0;
    for (int r = 0; r < rows; r++) worst = fmax(worst, row_err(a + r * V, b + r * V, V));
    if (!(worst <= tol)) fprintf(stderr, "    %s: worst row relative error %g\n", what, worst);
    return worst <= tol;
}

static const int32_t PAGES_A[8] = {7, 3, 12, 1, 0, 0, 0, 0};
static const int32_t PAGES_B[8] = {2, 9, 15, 4, 0, 0, 0, 0};

static void check_model(ms_model *m, const char *name) {
    int32_t ids[SEQ], ids2[SEQ];
    for (int i = 0; i < SEQ; i++) ids[i] = (int32_t)(3 + rnd() % (V - 3)), ids2[i] = (int32_t)(3 + rnd() % (V - 3));
    float *full = malloc(sizeof(float) * SEQ * V), *inc = malloc(sizeof(float) * SEQ * V),
          *chk = malloc(sizeof(float) * SEQ * V), *full2 = malloc(sizeof(float) * SEQ * V),
          *both = malloc(sizeof(float) * 2 * SEQ * V);
    /* one-shot prefill of the whole sequence, its expert and index choices recorded: the decode and
     * chunked runs below replay them, because on the GPU they take other kernels (a one-row GEMV, a
     * smaller GEMM) whose last-bit differences may turn a router or indexer near-tie the other way, a
     * legitimate difference that says nothing about the cache these checks are about */
    ms_decisions all = {0}, cur = {0};
    CHECK(dec_alloc(m, SEQ, &all) == MS_OK);
    ms_forward *f = mkfwd_d(m, 32, &all, NULL);
    CHECK(f != NULL);
    if (!f) {
        ms_decisions_free(&all);
        free(full), free(inc), free(chk), free(full2), free(both);
        return;
    }
    seq_part p = {ids, PAGES_A, 0, SEQ};
    CHECK(step(f, &p, 1, full) == MS_OK);
    ms_forward_free(f);
    /* prefill 5, then decode one token per step through the cache */
    f = mkfwd_d(m, 32, NULL, &cur);
    dec_slice(m, &all, 0, 5, &cur);
    p = (seq_part){ids, PAGES_A, 0, 5};
    CHECK(step(f, &p, 1, inc) == MS_OK);
    for (int t = 5; t < SEQ; t++) {
        dec_slice(m, &all, t, 1, &cur);
        p = (seq_part){ids, PAGES_A, t, 1};
        CHECK(step(f, &p, 1, inc + t * V) == MS_OK);
    }
    ms_forward_free(f);
    CHECK_MSG(all_close(inc, full, SEQ, g_tol, "decode vs recompute"), "%s", name);
    /* chunked prefill 4 + 4 + 5 with a smaller workspace */
    f = mkfwd_d(m, 5, NULL, &cur);
    for (int t0 = 0, n; t0 < SEQ; t0 += n) {
        n = t0 == 8 ? 5 : 4;
        dec_slice(m, &all, t0, n, &cur);
        p = (seq_part){ids, PAGES_A, t0, n};
        CHECK(step(f, &p, 1, chk + t0 * V) == MS_OK);
    }
    ms_forward_free(f);
    ms_decisions_free(&cur);
    ms_decisions_free(&all);
    CHECK_MSG(all_close(chk, full, SEQ, g_tol, "chunked vs one-shot"), "%s", name);
    /* two sequences in one step == each alone */
    f = mkfwd(m, 32);
    p = (seq_part){ids2, PAGES_B, 0, SEQ};
    CHECK(step(f, &p, 1, full2) == MS_OK);
    ms_forward_free(f);
    f = mkfwd(m, 32);
    seq_part two[2] = {{ids, PAGES_A, 0, 6}, {ids2, PAGES_B, 0, SEQ}};
    CHECK(step(f, two, 2, both) == MS_OK);
    CHECK_MSG(all_close(both, full, 6, g_tol, "batched seq A"), "%s", name);
    CHECK_MSG(all_close(both + 6 * V, full2, SEQ, g_tol, "batched seq B"), "%s", name);
    /* continue A's prefill while B decodes a token past its prompt (mixed step) */
    int32_t ids2x[SEQ + 1];
    memcpy(ids2x, ids2, sizeof ids2);
    ids2x[SEQ] = 5;
    seq_part mix[2] = {{ids, PAGES_A, 6, 7}, {ids2x, PAGES_B, SEQ, 1}};
    CHECK(step(f, mix, 2, both) == MS_OK);
    CHECK_MSG(all_close(both, full + 6 * V, 7, g_tol, "mixed step seq A"), "%s", name);
    ms_forward_free(f);
    free(full);
    free(inc);
    free(chk);
    free(full2);
    free(both);
}

static void test_glm4_cache(void) {
    check_model(placed(build_glm4(MS_WFMT_PLAIN, MS_WFMT_PLAIN, 1)), "glm4_moe bf16 grouped");
    check_model(placed(build_glm4(MS_WFMT_NVFP4, MS_WFMT_FP8, 0)), "glm4_moe nvfp4 experts, fp8 attention");
    /* without q/k norm the GPU takes the fused bias + RoPE + cache-store kernel */
    ms_model *m3 = build_glm4(MS_WFMT_NVFP4, MS_WFMT_PLAIN, 0);
    m3->cfg.use_qk_norm = 0;
    check_model(placed(m3), "glm4_moe without qk-norm");
    afree_all();
}

static void test_dsa_cache(void) {
    check_model(placed(build_dsa(4, 1)), "glm_moe_dsa topk 4 grouped");
    check_model(placed(build_dsa(64, 0)), "glm_moe_dsa dense");
    afree_all();
}

/* Legal configs off the fast paths (issue 17): they used to abort on an assertion. */
static void test_odd_dims(void) {
    KVL = 24;
    check_model(placed(build_dsa(4, 0)), "glm_moe_dsa kv_lora_rank 24");
    KVL = 32;
    NEXP = 72, TOPK = 66;
    check_model(placed(build_glm4(MS_WFMT_PLAIN, MS_WFMT_PLAIN, 0)), "glm4_moe 66 of 72 experts");
    NEXP = 8, TOPK = 3;
    HD = 1040, ROT = 1040;
    check_model(placed(build_glm4(MS_WFMT_PLAIN, MS_WFMT_PLAIN, 0)), "glm4_moe rotary dim 1040");
    HD = 16, ROT = 8;
    afree_all();
    /* the odd-dimension fixtures' shapes (tools/make_fixtures.py --only odd): multiples of 8, not of 16
     * (bf16 experts, fp8 attention: fp8 weights with partial 128x128 blocks and K % 16 == 8) ... */
    H = 136, INTER = 200, MI = 40, HD = 24, ROT = 12, NH = 5, NKV = 1;
    check_model(placed(build_glm4(MS_WFMT_PLAIN, MS_WFMT_FP8, 1)), "glm4_moe odd8 (hidden 136, head dim 24, 5:1 heads)");
    QKN = 0; /* no qk-norm, as GLM-4.5: CUDA fuses bias, RoPE and the cache stores (gqa_prep) */
    check_model(placed(build_glm4(MS_WFMT_PLAIN, MS_WFMT_PLAIN, 0)), "glm4_moe odd8 without qk-norm");
    QKN = 1;
    check_model(placed(build_glm4(MS_WFMT_FP8, MS_WFMT_PLAIN, 0)), "glm4_moe odd8 fp8 experts");
    QL = 40, KVL = 24, DN = 24, DR = 8, DV = 40, IH = 24;
    check_model(placed(build_dsa(4, 0)), "glm_moe_dsa odd8 (kv_lora 24, q_lora 40, index dim 24)");
    DSA_AFMT = MS_WFMT_FP8;
    check_model(placed(build_dsa(4, 0)), "glm_moe_dsa odd8 fp8 attention");
    DSA_AFMT = MS_WFMT_PLAIN;
    afree_all();
    /* ... and multiples of 16, not of 32 (nvfp4 experts: K % 32 == 16) */
    H = 112, INTER = 208, MI = 80, HD = 48, ROT = 24, NH = 3, NKV = 1;
    check_model(placed(build_glm4(MS_WFMT_NVFP4, MS_WFMT_FP8, 0)), "glm4_moe odd16 nvfp4 experts (hidden 112, head dim 48)");
    QL = 48, KVL = 80, DN = 48, DR = 16, DV = 48, IH = 48;
    check_model(placed(build_dsa(4, 1)), "glm_moe_dsa odd16 (kv_lora 80, rope 16, index dim 48)");
    afree_all();
    H = 64, INTER = 96, MI = 32, HD = 16, ROT = 8, NH = 4, NKV = 2;
    QL = 48, KVL = 32, DN = 16, DR = 8, DV = 16, IH = 16;
}

/* The sparse path must actually change the result (otherwise the test above proves little). */
static void test_dsa_sparse_differs(void) {
    uint64_t seed = g_rng;
    ms_model *sp = placed(build_dsa(4, 0));
    g_rng = seed;
    ms_model *de = placed(build_dsa(64, 0));
    int32_t ids[SEQ];
    for (int i = 0; i < SEQ; i++) ids[i] = (int32_t)(3 + rnd() % (V - 3));
    float *a = malloc(sizeof(float) * SEQ * V), *b = malloc(sizeof(float) * SEQ * V);
    seq_part p = {ids, PAGES_A, 0, SEQ};
    ms_forward *f = mkfwd(sp, 32);
    CHECK(step(f, &p, 1, a) == MS_OK);
    ms_forward_free(f);
    f = mkfwd(de, 32);
    CHECK(step(f, &p, 1, b) == MS_OK);
    ms_forward_free(f);
    /* positions 0..3 see <= 4 keys: identical; later positions differ */
    CHECK(all_close(a, b, 4, 1e-6, "first 4 positions"));
    CHECK(row_err(a + 12 * V, b + 12 * V, V) > 1e-3);
    free(a);
    free(b);
    afree_all();
}

static void test_check_numerics(void) {
    ms_model *m = build_glm4(MS_WFMT_PLAIN, MS_WFMT_PLAIN, 0);
    ((uint16_t *)m->layers[1].v_proj.w.data)[5] = 0x7fc0; /* bf16 NaN */
    placed(m);
    ms_forward_opts o = {.max_tokens = 8, .n_pages = NPAGES, .page_size = PS, .moe_runner = "auto", .check_numerics = 1};
    ms_forward *f = NULL;
    CHECK(ms_forward_create(m, B, &o, &f, &E) == MS_OK);
    int32_t ids[3] = {4, 5, 6};
    float lg[3 * V];
    seq_part p = {ids, PAGES_A, 0, 3};
    int rc = step(f, &p, 1, lg);
    CHECK(rc == MS_ERR_NUMERICS);
    CHECK_MSG(strstr(E.msg, "layer 1 op v_proj token position 0") != NULL, "%s", E.msg);
    ms_forward_free(f);
    /* step mode: the cheap per-layer check finds layer 1; the op-by-op re-run names the op, and the
     * sentence names the backend, attention implementation and MoE runner */
    o.check_numerics = 2;
    CHECK(ms_forward_create(m, B, &o, &f, &E) == MS_OK);
    rc = step(f, &p, 1, lg);
    CHECK(rc == MS_ERR_NUMERICS);
    CHECK_MSG(strstr(E.msg, "residual stream after layer 1") && strstr(E.msg, "layer 1 op v_proj token position 0") &&
                  strstr(E.msg, "attention ") && strstr(E.msg, "MoE runner auto"),
              "%s", E.msg);
    ms_forward_free(f);
    o.check_numerics = 0;
    /* a forced attention implementation that does not exist, or cannot run here, fails at creation */
    o.attn_backend = "flash_turbo";
    CHECK(ms_forward_create(m, B, &o, &f, &E) == MS_ERR_INVALID && strstr(E.msg, "--attention-backend"));
    if (!g_gpu) {
        o.attn_backend = "ref"; /* a CUDA implementation on the CPU backend */
        int want = ms_backend_cuda_compiled() ? MS_ERR_UNSUPPORTED : MS_ERR_INVALID; /* else unknown in this build */
        CHECK_MSG(ms_forward_create(m, B, &o, &f, &E) == want && strstr(E.msg, "cpu backend") && strstr(E.msg, ": cpu"),
                  "%s", E.msg);
    }
    o.attn_backend = NULL;
    /* a forced runner that does not exist fails at creation with the flag named */
    o.moe_runner = "grouped_turbo";
    CHECK(ms_forward_create(m, B, &o, &f, &E) == MS_ERR_INVALID && strstr(E.msg, "--moe-runner-backend"));
    afree_all();
}

static const int32_t PAGES_C[8] = {5, 6, 8, 10, 0, 0, 0, 0};

enum { GD_NS = 3, GD_P0 = 5, GD_STEPS = 8 };

/* Three sequences (a graph bucket of 4: one padding sequence) prefill GD_P0 tokens together, then
 * decode GD_STEPS steps of one token each (sequence 1 sits out step 3: a batch of 2, another bucket),
 * on a fresh forward with graphs on or off (recorded on the second decode step, replayed after).
 * out [GD_STEPS][GD_NS][V]: each step's logits, zeros for the sequence that sat out. */
static void graph_decode_run(ms_model *m, const int32_t ids[GD_NS][SEQ], int graphs, float *out) {
    enum { NS = GD_NS, P0 = GD_P0, STEPS = GD_STEPS };
    const int32_t *pages[NS] = {PAGES_A, PAGES_B, PAGES_C};
    memset(out, 0, sizeof(float) * STEPS * NS * V);
    ms_forward *f = mkfwd_g(m, 32, graphs);
    CHECK(f != NULL);
    if (!f) return;
    float pre[NS * P0 * V];
    seq_part p[NS];
    for (int s = 0; s < NS; s++) p[s] = (seq_part){ids[s], pages[s], 0, P0};
    CHECK(step(f, p, NS, pre) == MS_OK);
    for (int t = 0; t < STEPS; t++) {
        int n = 0;
        seq_part d[NS];
        for (int s = 0; s < NS; s++)
            if (!(s == 1 && t == 3)) d[n++] = (seq_part){ids[s], pages[s], P0 + t - (s == 1 && t > 3), 1};
        float lg[NS * V];
        CHECK(step(f, d, n, lg) == MS_OK);
        for (int s = 0, r = 0; s < NS; s++) {
            float *dst = out + ((size_t)t * NS + s) * V;
            if (!(s == 1 && t == 3)) memcpy(dst, lg + (size_t)r++ * V, sizeof(float) * V);
        }
    }
    ms_forward_free(f);
}

/* graph_decode_run with graphs equals the same steps run op by op. On the CPU both run op by op. */
static void check_graph_decode(ms_model *m, const char *name) {
    int32_t ids[GD_NS][SEQ];
    for (int s = 0; s < GD_NS; s++)
        for (int i = 0; i < SEQ; i++) ids[s][i] = (int32_t)(3 + rnd() % (V - 3));
    float *out[2];
    for (int g = 0; g < 2; g++) {
        out[g] = malloc(sizeof(float) * GD_STEPS * GD_NS * V);
        graph_decode_run(m, (const int32_t(*)[SEQ])ids, g, out[g]);
    }
    CHECK_MSG(all_close(out[1], out[0], GD_STEPS * GD_NS, g_gpu ? 1e-2 : 0, "graph vs op-by-op decode"), "%s", name);
    free(out[0]);
    free(out[1]);
}

/* Speculative verification shapes: three sequences (padded to 4) prefill 5 tokens each, then five
 * steps of 4 tokens per sequence with logits on all (a verification; each step after the first starts
 * one position later, rewriting the K/V of the last one's rejected drafts). With graph_verify_tokens
 * the 4-token steps run as one recorded graph (the first eagerly, the second records it) and equal
 * the same steps run op by op within the decode check's bound; on the CPU both run op by op. */
static void check_graph_verify(ms_model *m, const char *name) {
    enum { NS = 3, P0 = 5, Q = 4, STEPS = 5 };
    int32_t ids[NS][SEQ];
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < SEQ; i++) ids[s][i] = (int32_t)(3 + rnd() % (V - 3));
    const int32_t *pages[NS] = {PAGES_A, PAGES_B, PAGES_C};
    float *out[2];
    ms_graph_counts gc[2];
    for (int g = 0; g < 2; g++) {
        out[g] = malloc(sizeof(float) * STEPS * NS * Q * V);
        ms_forward_opts o = {.max_tokens = 32, .n_pages = NPAGES, .page_size = PS, .moe_runner = "auto", .graphs = g,
                             .graph_verify_tokens = g ? Q : 0};
        ms_forward *f = NULL;
        CHECK(ms_forward_create(m, B, &o, &f, &E) == MS_OK);
        if (!f) return;
        float pre[NS * P0 * V];
        seq_part p[NS];
        for (int s = 0; s < NS; s++) p[s] = (seq_part){ids[s], pages[s], 0, P0};
        CHECK(step(f, p, NS, pre) == MS_OK);
        for (int t = 0; t < STEPS; t++) {
            for (int s = 0; s < NS; s++) p[s] = (seq_part){ids[s], pages[s], P0 + t, Q};
            CHECK(step(f, p, NS, out[g] + (size_t)t * NS * Q * V) == MS_OK);
        }
        ms_forward_graph_counts(f, &gc[g]);
        ms_forward_free(f);
    }
    CHECK_MSG(all_close(out[1], out[0], STEPS * NS * Q, g_gpu ? 1e-2 : 0, "graph vs op-by-op verification"), "%s", name);
    printf("  %s: verification steps as graphs: %llu launched\n", name, (unsigned long long)gc[1].launches[MS_GRAPH_VERIFY]);
    for (int k = 0; k < MS_GRAPH_KINDS; k++) CHECK_EQ_INT((int)gc[0].launches[k], 0);
    CHECK_EQ_INT((int)gc[1].launches[MS_GRAPH_VERIFY], g_gpu ? STEPS - 1 : 0);
    CHECK_EQ_INT((int)gc[1].launches[MS_GRAPH_DECODE], 0);
    free(out[0]);
    free(out[1]);
}

/* ms_forward_run_argmax: each logit row's id is the greedy choice (backend.h's rule) of the logits
 * ms_forward_run gives for the same step: an eager prefill of NS x P0 = 78 rows (two chunks of 64
 * logit rows) and decode steps, with graphs (recorded on the second decode step, the ids then taken from
 * the graph's logits) and without. Each step runs twice (logits, then ids; the second rewrites the same
 * K/V). The two runs of a step may take different paths on the GPU (a shape's first step runs op by op,
 * its second records), so there the chosen id's logit must be within the graph check's 1e-2 of the
 * row's largest; on the CPU the id is exactly the first largest. A plain step after each argmax step
 * returns the same logits (nothing of the argmax path stays behind). */
static void check_argmax_steps(ms_model *m, const char *name) {
    enum { NS = 6, P0 = 13, STEPS = 4, LEN = P0 + STEPS, PPS = (LEN + PS - 1) / PS, MAXT = 80 };
    int32_t ids[NS][LEN];
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < LEN; i++) ids[s][i] = (int32_t)(3 + rnd() % (V - 3));
    for (int g = 0; g < 2; g++) {
        ms_forward_opts o = {.max_tokens = MAXT, .n_pages = NS * PPS, .page_size = PS, .moe_runner = "auto", .graphs = g};
        ms_forward *f = NULL;
        CHECK(ms_forward_create(m, B, &o, &f, &E) == MS_OK);
        if (!f) return;
        CHECK_MSG(ms_forward_can_argmax(f), "%s: the backend has no argmax", name);
        float *lg = malloc(sizeof(float) * MAXT * V), *lg2 = malloc(sizeof(float) * MAXT * V);
        int32_t tok[MAXT], pos[MAXT], slot[MAXT], lidx[MAXT], start[NS + 1], ctx[NS], bt[NS * PPS], am[MAXT];
        for (int s = 0; s < NS; s++)
            for (int j = 0; j < PPS; j++) bt[s * PPS + j] = s * PPS + j;
        int near = 0;
        for (int t = 0; t <= STEPS; t++) {
            const int p0 = t ? P0 + t - 1 : 0, n = t ? 1 : P0; /* step 0: the prefill; then one token each */
            int T = 0;
            for (int s = 0; s < NS; s++) {
                start[s] = T;
                ctx[s] = p0 + n;
                for (int i = 0; i < n; i++, T++) {
                    tok[T] = ids[s][p0 + i], pos[T] = p0 + i, lidx[T] = T;
                    slot[T] = bt[s * PPS + (p0 + i) / PS] * PS + (p0 + i) % PS;
                }
            }
            start[NS] = T;
            ms_batch b = {T, NS, tok, pos, start, ctx, slot, bt, PPS, PS, T, lidx};
            CHECK(ms_forward_run(f, &b, lg, &E) == MS_OK);
            for (int r = 0; r < T; r++) am[r] = -1;
            int rc = ms_forward_run_argmax(f, &b, am, &E);
            CHECK_MSG(rc == MS_OK, "%s: %s", name, E.msg);
            for (int r = 0; r < T; r++) {
                const float *row = lg + (size_t)r * V;
                int best = 0;
                for (int v = 1; v < V; v++) if (row[v] > row[best]) best = v;
                if (am[r] == best) continue;
                const int ok = g_gpu && am[r] >= 0 && am[r] < V && row[am[r]] >= row[best] - 1e-2f;
                near += ok;
                CHECK_MSG(ok, "%s, graphs %d, step %d row %d: id %d, the logits' first largest is %d", name, g, t, r, am[r], best);
            }
            CHECK(ms_forward_run(f, &b, lg2, &E) == MS_OK);
            CHECK_MSG(all_close(lg2, lg, T, g_gpu ? 1e-2 : 0, "a plain step after an argmax step"), "%s", name);
        }
        ms_graph_counts gc;
        ms_forward_graph_counts(f, &gc);
        printf("  %s, graphs %d: %llu decode graph launches, %d near-tie ids\n", name, g,
               (unsigned long long)gc.launches[MS_GRAPH_DECODE], near);
        if (g && g_gpu) CHECK(gc.launches[MS_GRAPH_DECODE] > 0);
        free(lg), free(lg2);
        ms_forward_free(f);
    }
}

static void test_argmax_steps(void) {
    check_argmax_steps(placed(build_glm4(MS_WFMT_NVFP4, MS_WFMT_PLAIN, 1)), "glm4_moe nvfp4 experts");
    check_argmax_steps(placed(build_dsa(4, 1)), "glm_moe_dsa topk 4");
    afree_all();
}

static void test_graph_decode(void) {
    check_graph_decode(placed(build_glm4(MS_WFMT_NVFP4, MS_WFMT_PLAIN, 1)), "glm4_moe nvfp4 experts");
    check_graph_decode(placed(build_dsa(4, 1)), "glm_moe_dsa topk 4");
    afree_all();
}

static void test_graph_verify(void) {
    check_graph_verify(placed(build_glm4(MS_WFMT_NVFP4, MS_WFMT_PLAIN, 1)), "glm4_moe nvfp4 experts");
    check_graph_verify(placed(build_dsa(4, 1)), "glm_moe_dsa topk 4");
    afree_all();
}

/* Programmatic Dependent Launch (MS_CU_PDL, read once; cu_knob_forget makes the next use read it
 * again): the decode steps of graph_decode_run (eager prefill, graph-recorded decode) give the same
 * logits with PDL off, on, and off again. PDL changes only when a kernel starts, never what it computes,
 * so when the two PDL-off runs agree bitwise (the model's kernels are deterministic) the PDL-on run must
 * agree bitwise too; otherwise (some kernel's order of equal-work atomics varies run to run) within
 * the graph check's bound. On a GPU below sm_90 all three runs are plain launches. GPU only. */
static void check_pdl_ab(ms_model *m, const char *name) {
#ifdef MS_HAVE_CUDA
    int32_t ids[GD_NS][SEQ];
    for (int s = 0; s < GD_NS; s++)
        for (int i = 0; i < SEQ; i++) ids[s][i] = (int32_t)(3 + rnd() % (V - 3));
    const size_t n = (size_t)GD_STEPS * GD_NS * V;
    const char *pdl[3] = {"0", "1", "0"};
    char *saved = getenv("MS_CU_PDL") ? strdup(getenv("MS_CU_PDL")) : NULL;
    float *out[3];
    for (int r = 0; r < 3; r++) {
        setenv("MS_CU_PDL", pdl[r], 1);
        cu_knob_forget(CU_KNOB_PDL);
        CHECK_EQ_INT(cu_knob(CU_KNOB_PDL), pdl[r][0] - '0');
        out[r] = malloc(sizeof(float) * n);
        graph_decode_run(m, (const int32_t(*)[SEQ])ids, 1, out[r]);
    }
    if (saved) setenv("MS_CU_PDL", saved, 1);
    else unsetenv("MS_CU_PDL");
    free(saved);
    cu_knob_forget(CU_KNOB_PDL);
    const int det = !memcmp(out[0], out[2], sizeof(float) * n);
    const int same = !memcmp(out[1], out[0], sizeof(float) * n);
    printf("  %s: PDL %s (sm_%d%d); PDL-off runs %s; PDL on vs off: %s\n", name,
           B->gpu.cc_major >= 9 ? "active" : "not available", B->gpu.cc_major, B->gpu.cc_minor,
           det ? "bitwise equal" : "differ (nondeterministic model)", same ? "bitwise equal" : "differ");
    if (det) CHECK_MSG(same, "%s: logits with PDL on differ bitwise from PDL off", name);
    else
        CHECK_MSG(all_close(out[1], out[0], GD_STEPS * GD_NS, 1e-2, "PDL on vs off decode"), "%s", name);
    for (int r = 0; r < 3; r++) free(out[r]);
#else
    (void)m;
    (void)name;
#endif
}

static void test_pdl_ab(void) {
    if (!g_gpu) {
        printf("  (GPU only: PDL is a CUDA launch attribute)\n");
        return;
    }
    check_pdl_ab(placed(build_glm4(MS_WFMT_NVFP4, MS_WFMT_PLAIN, 1)), "glm4_moe nvfp4 experts");
    check_pdl_ab(placed(build_dsa(4, 1)), "glm_moe_dsa topk 4");
    afree_all();
}

/* The one-token MoE layers of a model whose NVFP4 expert shapes the fused MoE kernel covers (hidden and
 * moe intermediate multiples of 128): check_model's replayed decode takes the router kernel and the plain
 * fused kernel (a replay needs the choice between them); without a replay the forward hands norm, router
 * and experts to the runner's routed form (MS_CU_MOE_ROUTE=1, the default), and its logits over a 5-token
 * prefill and 8 decode steps must equal those with MS_CU_MOE_ROUTE=0 bit for bit, with graphs and op by
 * op (the routed kernel computes the split router's logits in its order; graphs against op by op agree
 * within the graph check's bound, as elsewhere). On the GPU the routed kernel must have run in every
 * decode step's MoE layers, and never with the knob at 0. */
static void test_moe_routed(void) {
    const int h0 = H, mi0 = MI;
    H = 128, MI = 128;
    ms_model *m = placed(build_glm4(MS_WFMT_NVFP4, MS_WFMT_PLAIN, 1));
    check_model(m, "glm4_moe nvfp4 experts, hidden 128, moe intermediate 128");
    int n_moe = 0;
    for (int L = 0; L < m->cfg.num_layers; L++) n_moe += m->cfg.layer_is_moe[L];
    int32_t ids[SEQ];
    for (int i = 0; i < SEQ; i++) ids[i] = (int32_t)(3 + rnd() % (V - 3));
    /* runs: knob 0 and 1 with graphs, then 0 and 1 op by op (a recorded graph's replays launch nothing
     * through the host, so the op-by-op run gives the count) */
    const char *knob[4] = {"0", "1", "0", "1"};
    float *out[4];
    long long routed[4] = {0, 0, 0, 0};
    char *saved = getenv("MS_CU_MOE_ROUTE") ? strdup(getenv("MS_CU_MOE_ROUTE")) : NULL;
    for (int r = 0; r < 4; r++) {
        setenv("MS_CU_MOE_ROUTE", knob[r], 1);
        out[r] = calloc((size_t)SEQ * V, sizeof(float));
#ifdef MS_HAVE_CUDA
        const long long c0 = ms_cuda_moe_fused_routed_launches();
#endif
        ms_forward *f = mkfwd_g(m, 32, r < 2);
        CHECK(f != NULL);
        if (!f) continue;
        seq_part p = {ids, PAGES_A, 0, 5};
        CHECK(step(f, &p, 1, out[r]) == MS_OK);
        for (int t = 5; t < SEQ; t++) {
            p = (seq_part){ids, PAGES_A, t, 1};
            CHECK(step(f, &p, 1, out[r] + (size_t)t * V) == MS_OK);
        }
        ms_forward_free(f);
#ifdef MS_HAVE_CUDA
        routed[r] = ms_cuda_moe_fused_routed_launches() - c0;
#endif
    }
    if (saved) setenv("MS_CU_MOE_ROUTE", saved, 1);
    else unsetenv("MS_CU_MOE_ROUTE");
    free(saved);
    CHECK_MSG(!memcmp(out[0], out[1], sizeof(float) * SEQ * V), "routed form (graphs): logits differ from the router kernel's path");
    CHECK_MSG(!memcmp(out[2], out[3], sizeof(float) * SEQ * V), "routed form (op by op): logits differ from the router kernel's path");
    /* graphs against op by op: within the graph check's bound, as check_graph_decode */
    CHECK_MSG(all_close(out[1], out[3], SEQ, g_gpu ? 1e-2 : 0, "routed form, graphs vs op by op"), "glm4_moe hidden 128");
    printf("  routed MoE kernel launches: %lld op by op, %lld with graphs, %lld / %lld with MS_CU_MOE_ROUTE=0 (%d MoE "
           "layers x %d decode steps)\n", routed[3], routed[1], routed[0], routed[2], n_moe, SEQ - 5);
    if (g_gpu && B->gpu.cc_major >= 8) {
        CHECK_MSG(routed[3] == (long long)n_moe * (SEQ - 5), "routed MoE kernel ran %lld times op by op, want %d",
                  routed[3], n_moe * (SEQ - 5));
        CHECK_MSG(routed[1] > 0, "no routed MoE kernel in the graph run");
        CHECK_EQ_INT((int)(routed[0] + routed[2]), 0);
    }
    free(out[2]);
    free(out[3]);
    free(out[0]);
    free(out[1]);
    H = h0, MI = mi0;
    afree_all();
}

static void test_bad_batch(void) {
    ms_model *m = placed(build_glm4(MS_WFMT_PLAIN, MS_WFMT_PLAIN, 0));
    ms_forward *f = mkfwd(m, 4);
    int32_t ids[5] = {4, 5, 6, 7, 8};
    float lg[5 * V];
    seq_part p = {ids, PAGES_A, 0, 5};
    CHECK(step(f, &p, 1, lg) == MS_ERR_INVALID); /* more tokens than max_tokens */
    int32_t badp[8] = {99, 0, 0, 0, 0, 0, 0, 0};
    p = (seq_part){ids, badp, 0, 2};
    CHECK(step(f, &p, 1, lg) == MS_ERR_INVALID);
    ids[1] = V;
    p = (seq_part){ids, PAGES_A, 0, 2};
    CHECK(step(f, &p, 1, lg) == MS_ERR_INVALID && strstr(E.msg, "token id"));
    ms_forward_free(f);
    afree_all();
}

int main(int argc, char **argv) {
    ms_dtype_init();
    g_gpu = argc > 1 && !strcmp(argv[1], "cuda");
    g_tol = g_gpu ? TOL_GPU : 1e-4;
    if (ms_backend_create(g_gpu ? "cuda" : "cpu", g_gpu ? 0 : -1, &B, &E) != MS_OK) {
        fprintf(stderr, "%s\n", E.msg);
        if (g_gpu) printf("## tests/model/test_forward_cache.c: skipped, no GPU (%s)\n", E.msg);
        return g_gpu ? 0 : 1;
    }
    RUN(test_glm4_cache);
    RUN(test_dsa_cache);
    RUN(test_dsa_sparse_differs);
    RUN(test_odd_dims);
    RUN(test_graph_decode);
    RUN(test_graph_verify);
    RUN(test_argmax_steps);
    RUN(test_pdl_ab);
    RUN(test_check_numerics);
    RUN(test_moe_routed);
    RUN(test_bad_batch);
    ms_backend_destroy(B);
    return TEST_SUMMARY();
}
