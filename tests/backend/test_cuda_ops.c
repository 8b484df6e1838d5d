/* test_cuda_ops.c - every CUDA backend op against the CPU backend (the float32 reference) on random
 * inputs, including shapes that are not multiples of any tile size. Inputs are rounded to bf16 first
 * so both backends see the same numbers; CUDA outputs are poisoned with NaN bytes before each op so
 * an element the kernel forgot to write fails. Without a GPU the program reports 0 cases and says
 * so (scripts/gpu-check.sh runs it for real). */
#include "backend/attn.h"
#include "backend/backend.h"
#include "core/dtype.h"
#include "test.h"
#include "test_linear.h"
#ifdef MS_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/knobs.h"
#endif

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static ms_backend *CPU, *GPU;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float rnd_f(void) { return ((float)(rnd_u32() & 0xffffff) / 16777216.0f) * 2.f - 1.f; }
static float bfr(float v) { return ms_bf16_to_f32(ms_f32_to_bf16(v)); }

static float *rand_vec(size_t n, float amp) {
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = bfr(rnd_f() * amp);
    return v;
}

/* Backend tensor of dtype (0 = the backend's act dtype) filled from host floats. */
static ms_tensor mk(ms_backend *b, ms_dtype dt, int ndim, const int64_t *shape, const float *host) {
    ms_err err = {0};
    ms_tensor t;
    if (!dt) dt = b->act_dtype;
    if (ms_backend_alloc(b, &t, dt, ndim, shape, &err) != MS_OK) {
        fprintf(stderr, "alloc: %s\n", err.msg);
        abort();
    }
    size_t n = (size_t)ms_tensor_numel(&t), es = ms_dtype_size(dt);
    void *buf = malloc(n * es + 16);
    if (host) {
        for (size_t i = 0; i < n; i++) {
            if (dt == MS_F32) ((float *)buf)[i] = host[i];
            else if (dt == MS_BF16) ((uint16_t *)buf)[i] = ms_f32_to_bf16(host[i]);
            else if (dt == MS_I32) ((int32_t *)buf)[i] = (int32_t)host[i];
        }
    } else {
        memset(buf, 0xff, n * es); /* NaN in every float dtype */
    }
    if (b->ops->upload(b, t.data, buf, n * es, &err) != MS_OK) {
        fprintf(stderr, "upload: %s\n", err.msg);
        abort();
    }
    free(buf);
    return t;
}

static ms_tensor mk_i32(ms_backend *b, int64_t n, const int32_t *v) {
    ms_err err = {0};
    ms_tensor t;
    int64_t s[1] = {n > 0 ? n : 1};
    if (ms_backend_alloc(b, &t, MS_I32, 1, s, &err) != MS_OK) abort();
    if (n > 0 && b->ops->upload(b, t.data, v, (size_t)n * 4, &err) != MS_OK) abort();
    return t;
}

static float *get(ms_backend *b, const ms_tensor *t) {
    ms_err err = {0};
    size_t n = (size_t)ms_tensor_numel(t), es = ms_dtype_size(t->dtype);
    void *buf = malloc(n * es + 16);
    float *out = malloc(n * sizeof(float) + 16);
    if (b->ops->sync(b, &err) != MS_OK || b->ops->download(b, buf, t->data, n * es, &err) != MS_OK) {
        fprintf(stderr, "download: %s\n", err.msg);
        abort();
    }
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == MS_F32) out[i] = ((float *)buf)[i];
        else if (t->dtype == MS_BF16) out[i] = ms_bf16_to_f32(((uint16_t *)buf)[i]);
        else if (t->dtype == MS_I32) out[i] = (float)((int32_t *)buf)[i];
        else out[i] = NAN;
    }
    free(buf);
    return out;
}

/* max |a-r| / max(max|r|, floor); NaN anywhere counts as failure (returns +inf). */
static double rel_err(const float *a, const float *r, size_t n) {
    double md = 0, mr = 1e-6;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(r[i])) return INFINITY;
        double d = fabs((double)a[i] - r[i]);
        if (d > md) md = d;
        if (fabs(r[i]) > mr) mr = fabs(r[i]);
    }
    return md / mr;
}

/* Compares tensor tg (GPU) with tc (CPU). */
#define CMP(tg, tc, tol)                                                                          \
    do {                                                                                          \
        float *a_ = get(GPU, &(tg)), *r_ = get(CPU, &(tc));                                       \
        double e_ = rel_err(a_, r_, (size_t)ms_tensor_numel(&(tc)));                              \
        CHECK_MSG(e_ <= (tol), "%s: rel err %.3g > %.3g", #tg, e_, (double)(tol));                \
        free(a_);                                                                                 \
        free(r_);                                                                                 \
    } while (0)

/* the ops take &err: a small wrapper keeps call sites short */
static ms_err E;
#define R(call) CHECK_MSG((call) == MS_OK, "%s: %s", #call, E.msg)

static void fr(ms_backend *b, ms_tensor *t) { b->ops->free(b, t); }

/* Sets environment variable name to v (NULL: unsets it); returns its previous value (NULL: was unset),
 * to hand to env_pop. */
static char *env_push(const char *name, const char *v) {
    const char *cur = getenv(name);
    char *prev = cur ? strdup(cur) : NULL;
    if (v) setenv(name, v, 1);
    else unsetenv(name);
    return prev;
}
/* Puts back what env_push returned for name (and frees it). */
static void env_pop(const char *name, char *prev) {
    if (prev) setenv(name, prev, 1);
    else unsetenv(name);
    free(prev);
}

/* Pairs of tensors (gpu, cpu) made from the same host data. */
typedef struct { ms_tensor g, c; } pair;
static pair P2(ms_dtype gdt, ms_dtype cdt, int nd, const int64_t *s, const float *h) {
    pair p = {mk(GPU, gdt, nd, s, h), mk(CPU, cdt, nd, s, h)};
    return p;
}
static pair act(int nd, const int64_t *s, const float *h) { return P2(0, 0, nd, s, h); }
static pair out_act(int nd, const int64_t *s) {
    pair p = {mk(GPU, 0, nd, s, NULL), mk(CPU, 0, nd, s, NULL)};
    return p;
}
static void pfree(pair *p) { fr(GPU, &p->g); fr(CPU, &p->c); }

/* A weight tensor placed on both backends (host copy kept for the CPU view). */
typedef struct { ms_tensor g, c; void *host; } wpair;
static wpair wten(ms_dtype dt, int nd, const int64_t *s, const float *h) {
    wpair w;
    ms_tensor t = ms_tensor_make(dt, nd, s);
    size_t n = (size_t)ms_tensor_numel(&t);
    w.host = malloc(n * ms_dtype_size(dt) + 16);
    for (size_t i = 0; i < n; i++) {
        if (dt == MS_BF16) ((uint16_t *)w.host)[i] = ms_f32_to_bf16(h[i]);
        else ((float *)w.host)[i] = h[i];
    }
    t.data = w.host;
    w.g = t;
    w.c = t;
    R(GPU->ops->place_tensor(GPU, &w.g, &E));
    R(CPU->ops->place_tensor(CPU, &w.c, &E));
    return w;
}
static void wfree(wpair *w) {
    GPU->ops->unplace_tensor(GPU, &w->g);
    CPU->ops->unplace_tensor(CPU, &w->c);
    free(w->host);
}

static void test_embed(void) {
    int64_t V = 37, H = 70;
    float *tab = rand_vec((size_t)(V * H), 1.f);
    int64_t ts[2] = {V, H};
    wpair w = wten(MS_BF16, 2, ts, tab);
    int32_t ids[5] = {3, 0, 36, 3, 17};
    ms_tensor ig = mk_i32(GPU, 5, ids), ic = mk_i32(CPU, 5, ids);
    int64_t os[2] = {5, H};
    pair o = out_act(2, os);
    R(GPU->ops->embed(GPU, &w.g, ig.data, 5, &o.g, &E));
    R(CPU->ops->embed(CPU, &w.c, ic.data, 5, &o.c, &E));
    CMP(o.g, o.c, 1e-6);
    pfree(&o);
    fr(GPU, &ig);
    fr(CPU, &ic);
    wfree(&w);
    free(tab);
}

static void test_norms(void) {
    int64_t R_ = 7, D = 130;
    int64_t s[2] = {R_, D}, ws[1] = {D};
    float *x = rand_vec((size_t)(R_ * D), 3.f), *d = rand_vec((size_t)(R_ * D), 1.f), *w = rand_vec((size_t)D, 1.f);
    float *bias = rand_vec((size_t)D, 0.5f);
    wpair W = wten(MS_BF16, 1, ws, w), B = wten(MS_F32, 1, ws, bias);
    pair X = act(2, s, x), O = out_act(2, s);
    R(GPU->ops->rmsnorm(GPU, &X.g, &W.g, 1e-5f, &O.g, &E));
    R(CPU->ops->rmsnorm(CPU, &X.c, &W.c, 1e-5f, &O.c, &E));
    CMP(O.g, O.c, 1e-2);
    /* in place, per-head view [R, 2, 65] with a [65] weight */
    int64_t s3[3] = {R_, 2, 65}, w3[1] = {65};
    wpair W3 = wten(MS_BF16, 1, w3, w);
    ms_tensor xg = ms_tensor_reshape(&X.g, 3, s3), xc = ms_tensor_reshape(&X.c, 3, s3);
    R(GPU->ops->rmsnorm(GPU, &xg, &W3.g, 1e-6f, &xg, &E));
    R(CPU->ops->rmsnorm(CPU, &xc, &W3.c, 1e-6f, &xc, &E));
    CMP(xg, xc, 1e-2);
    /* add + rmsnorm */
    pair X2 = act(2, s, x), Dl = act(2, s, d), O2 = out_act(2, s);
    R(GPU->ops->add_rmsnorm(GPU, &X2.g, &Dl.g, &W.g, 1e-5f, &O2.g, &E));
    R(CPU->ops->add_rmsnorm(CPU, &X2.c, &Dl.c, &W.c, 1e-5f, &O2.c, &E));
    CMP(X2.g, X2.c, 1e-2);
    CMP(O2.g, O2.c, 2e-2);
    /* layernorm */
    pair O3 = out_act(2, s);
    R(GPU->ops->layernorm(GPU, &X.g, &W.g, &B.g, 1e-6f, &O3.g, &E));
    R(CPU->ops->layernorm(CPU, &X.c, &W.c, &B.c, 1e-6f, &O3.c, &E));
    CMP(O3.g, O3.c, 2e-2);
    pfree(&X); pfree(&O); pfree(&X2); pfree(&Dl); pfree(&O2); pfree(&O3);
    wfree(&W); wfree(&W3); wfree(&B);
    free(x); free(d); free(w); free(bias);
}


static void test_elementwise(void) {
    int64_t T = 5, C = 203;
    int64_t s[2] = {T, C};
    float *a = rand_vec((size_t)(T * C), 4.f), *bb = rand_vec((size_t)(T * C), 2.f);
    pair A = act(2, s, a), B = act(2, s, bb), O = out_act(2, s);
    R(GPU->ops->add(GPU, &A.g, &B.g, &E));
    R(CPU->ops->add(CPU, &A.c, &B.c, &E));
    CMP(A.g, A.c, 1e-2);
    R(GPU->ops->silu_mul(GPU, &A.g, &B.g, &O.g, &E));
    R(CPU->ops->silu_mul(CPU, &A.c, &B.c, &O.c, &E));
    CMP(O.g, O.c, 2e-2);
    int64_t cs[2] = {T, 37};
    pair Cc = out_act(2, cs);
    R(GPU->ops->copy_cols(GPU, &B.g, 101, 37, &Cc.g, &E));
    R(CPU->ops->copy_cols(CPU, &B.c, 101, 37, &Cc.c, &E));
    CMP(Cc.g, Cc.c, 0);
    R(GPU->ops->set_cols(GPU, &Cc.g, 3, &B.g, &E));
    R(CPU->ops->set_cols(CPU, &Cc.c, 3, &B.c, &E));
    CMP(B.g, B.c, 0);
    R(GPU->ops->scale(GPU, &A.g, -0.37f, &E));
    R(CPU->ops->scale(CPU, &A.c, -0.37f, &E));
    CMP(A.g, A.c, 1e-2);
    int32_t idx[4] = {4, 0, 4, 2};
    ms_tensor ig = mk_i32(GPU, 4, idx), ic = mk_i32(CPU, 4, idx);
    int64_t gs[2] = {4, C};
    pair G = out_act(2, gs);
    R(GPU->ops->gather_rows(GPU, &B.g, ig.data, 4, &G.g, &E));
    R(CPU->ops->gather_rows(CPU, &B.c, ic.data, 4, &G.c, &E));
    CMP(G.g, G.c, 0);
    pfree(&A); pfree(&B); pfree(&O); pfree(&Cc); pfree(&G);
    fr(GPU, &ig); fr(CPU, &ic);
    free(a); free(bb);
}

static void rope_case(int nh, int d, int rot_off, int rot_dim, int inter, double theta) {
    int T = 6;
    int64_t s[3] = {T, nh, d};
    float *x = rand_vec((size_t)T * nh * d, 2.f);
    int32_t pos[6] = {0, 1, 7, 100, 5000, 33333};
    ms_tensor pg = mk_i32(GPU, T, pos), pc = mk_i32(CPU, T, pos);
    pair X = act(3, s, x);
    ms_rope_cfg rc = {rot_off, rot_dim, inter, theta};
    R(GPU->ops->rope(GPU, &X.g, pg.data, &rc, &E));
    R(CPU->ops->rope(CPU, &X.c, pc.data, &rc, &E));
    CMP(X.g, X.c, 2e-2);
    pfree(&X);
    fr(GPU, &pg); fr(CPU, &pc);
    free(x);
}

/* The fused bias + RoPE + cache-store op against the CPU's add, rope and kv_store on the same
 * values: q in place, the k/v cache rows of the slots written, the other rows untouched. */
/* with_bias: a mask of the q (1), k (2) and v (4) biases present (7: all, as GLM-4.5's attention) */
static void gqa_prep_case(int nh, int nkv, int d, int rot_dim, int with_bias, int stacked) {
    enum { T = 5, S = 12 };
    int64_t sq[3] = {T, nh, d}, skv[3] = {T, nkv, d}, sc[3] = {S, nkv, d};
    float *q = rand_vec((size_t)T * nh * d, 2.f), *k = rand_vec((size_t)T * nkv * d, 2.f),
          *v = rand_vec((size_t)T * nkv * d, 2.f), *bq = rand_vec((size_t)nh * d, 1.f),
          *bk = rand_vec((size_t)nkv * d, 1.f), *bv = rand_vec((size_t)nkv * d, 1.f),
          *c0 = rand_vec((size_t)S * nkv * d, 1.f);
    /* the CPU reference adds the biases on the host first (its linear would) */
    float *qb = malloc(sizeof(float) * (size_t)T * nh * d), *kb = malloc(sizeof(float) * (size_t)T * nkv * d),
          *vb = malloc(sizeof(float) * (size_t)T * nkv * d);
    for (int i = 0; i < T * nh * d; i++) qb[i] = ms_bf16_to_f32(ms_f32_to_bf16(q[i])) + (with_bias & 1 ? bq[i % (nh * d)] : 0);
    for (int i = 0; i < T * nkv * d; i++) {
        kb[i] = ms_bf16_to_f32(ms_f32_to_bf16(k[i])) + (with_bias & 2 ? bk[i % (nkv * d)] : 0);
        vb[i] = ms_bf16_to_f32(ms_f32_to_bf16(v[i])) + (with_bias & 4 ? bv[i % (nkv * d)] : 0);
    }
    int32_t pos[T] = {0, 3, 17, 250, 4099}, slot[T] = {7, 0, 9, 11, 4};
    ms_tensor pg = mk_i32(GPU, T, pos), pc = mk_i32(CPU, T, pos), slg = mk_i32(GPU, T, slot), slc = mk_i32(CPU, T, slot);
    int64_t nq = (int64_t)nh * d, nk = (int64_t)nkv * d, sw[2] = {T, nq + 2 * nk};
    /* stacked: q, k and v come from the rows of one [T, nq + 2 nk] projection output; the separate
     * buffers then hold other values (reading them would fail the comparison) and q is output only */
    float *qkv = malloc(sizeof(float) * (size_t)T * (size_t)sw[1]), *junk = rand_vec((size_t)T * nh * d, 3.f);
    for (int t = 0; t < T; t++) {
        memcpy(qkv + t * sw[1], q + (size_t)t * nq, sizeof(float) * (size_t)nq);
        memcpy(qkv + t * sw[1] + nq, k + (size_t)t * nk, sizeof(float) * (size_t)nk);
        memcpy(qkv + t * sw[1] + nq + nk, v + (size_t)t * nk, sizeof(float) * (size_t)nk);
    }
    ms_tensor Qg = mk(GPU, 0, 3, sq, stacked ? junk : q), Kg = mk(GPU, 0, 3, skv, stacked ? junk : k),
              Vg = mk(GPU, 0, 3, skv, stacked ? junk : v), QKVg = mk(GPU, 0, 2, sw, qkv);
    ms_tensor Bq = mk(GPU, MS_F32, 1, &nq, bq), Bk = mk(GPU, MS_F32, 1, &nk, bk), Bv = mk(GPU, MS_F32, 1, &nk, bv);
    pair KC = act(3, sc, c0), VC = act(3, sc, c0);
    ms_tensor Qc = mk(CPU, 0, 3, sq, qb), Kc = mk(CPU, 0, 3, skv, kb), Vc = mk(CPU, 0, 3, skv, vb);
    ms_rope_cfg rc = {0, rot_dim, 0, 1e6};
    R(GPU->ops->gqa_prep(GPU, &Qg, &Kg, &Vg, with_bias & 1 ? &Bq : NULL, with_bias & 2 ? &Bk : NULL, with_bias & 4 ? &Bv : NULL,
                         pg.data, rot_dim ? &rc : NULL, &KC.g, &VC.g, slg.data, stacked ? &QKVg : NULL, &E));
    if (rot_dim) {
        R(CPU->ops->rope(CPU, &Qc, pc.data, &rc, &E));
        R(CPU->ops->rope(CPU, &Kc, pc.data, &rc, &E));
    }
    R(CPU->ops->kv_store(CPU, &KC.c, &Kc, slc.data, &E));
    R(CPU->ops->kv_store(CPU, &VC.c, &Vc, slc.data, &E));
    CMP(Qg, Qc, 2e-2);
    CMP(KC.g, KC.c, 2e-2);
    CMP(VC.g, VC.c, 2e-2);
    fr(GPU, &Qg); fr(GPU, &Kg); fr(GPU, &Vg); fr(GPU, &QKVg); fr(GPU, &Bq); fr(GPU, &Bk); fr(GPU, &Bv);
    free(qkv); free(junk);
    fr(CPU, &Qc); fr(CPU, &Kc); fr(CPU, &Vc);
    pfree(&KC); pfree(&VC);
    fr(GPU, &pg); fr(CPU, &pc); fr(GPU, &slg); fr(CPU, &slc);
    free(q); free(k); free(v); free(bq); free(bk); free(bv); free(c0); free(qb); free(kb); free(vb);
}

static void test_gqa_prep(void) {
    for (int st = 0; st < 2; st++) { /* separate q/k/v buffers, then one stacked projection output */
        gqa_prep_case(12, 2, 128, 64, 7, st); /* GLM-4.5 style: partial NeoX rotary, q/k/v bias */
        gqa_prep_case(4, 4, 64, 64, 0, st);   /* full rotary, no bias */
        gqa_prep_case(6, 3, 32, 0, 7, st);    /* no rotary dims */
        gqa_prep_case(96, 8, 128, 64, 7, st); /* GLM-4.5-Air heads: 14 blocks of 8 heads per token */
        gqa_prep_case(12, 2, 128, 64, 1, st); /* a q bias only */
        gqa_prep_case(12, 2, 128, 64, 6, st); /* k and v biases, none on q */
    }
    /* a bias that is not F32 of the heads' width (checkpoint data, not an invariant) is refused with a
     * sentence, nothing launched */
    int64_t sq[3] = {1, 4, 64}, skv[3] = {1, 2, 64}, sc[3] = {4, 2, 64}, nq = 4 * 64, nk = 2 * 64, nk1 = nk - 1;
    ms_tensor Q = mk(GPU, 0, 3, sq, NULL), K = mk(GPU, 0, 3, skv, NULL), V = mk(GPU, 0, 3, skv, NULL);
    ms_tensor KC = mk(GPU, 0, 3, sc, NULL), VC = mk(GPU, 0, 3, sc, NULL);
    ms_tensor Bq16 = mk(GPU, MS_BF16, 1, &nq, NULL), Bk = mk(GPU, MS_F32, 1, &nk, NULL), Bshort = mk(GPU, MS_F32, 1, &nk1, NULL);
    int32_t zero = 0;
    ms_tensor pg = mk_i32(GPU, 1, &zero), sl = mk_i32(GPU, 1, &zero);
    const ms_tensor *bad[2][3] = {{&Bq16, &Bk, &Bk}, {NULL, &Bk, &Bshort}};
    for (int i = 0; i < 2; i++) {
        const int rc = GPU->ops->gqa_prep(GPU, &Q, &K, &V, bad[i][0], bad[i][1], bad[i][2], pg.data, NULL, &KC, &VC, sl.data,
                                          NULL, &E);
        CHECK_MSG(rc == MS_ERR_UNSUPPORTED && strstr(E.msg, "bias"), "gqa_prep with a malformed bias (case %d): %d %s", i,
                  rc, E.msg);
    }
    fr(GPU, &Q); fr(GPU, &K); fr(GPU, &V); fr(GPU, &KC); fr(GPU, &VC);
    fr(GPU, &Bq16); fr(GPU, &Bk); fr(GPU, &Bshort); fr(GPU, &pg); fr(GPU, &sl);
}

/* The fused MLA latent preparation against the CPU's five ops (copy out, RMSNorm, copy back, RoPE
 * on the last dr columns, cache store). */
static void mla_kv_prep_case(int kvl, int dr, int interleaved) {
    enum { T = 5, S = 12 };
    const int W = kvl + dr;
    int64_t sr[2] = {T, W}, sn[2] = {T, kvl}, sc[2] = {S, W}, sw[1] = {kvl};
    float *x = rand_vec((size_t)T * W, 3.f), *w = rand_vec((size_t)kvl, 1.f), *c0 = rand_vec((size_t)S * W, 1.f);
    int32_t pos[T] = {0, 5, 77, 1000, 4097}, slot[T] = {3, 11, 0, 7, 5};
    ms_tensor pg = mk_i32(GPU, T, pos), pc = mk_i32(CPU, T, pos), slg = mk_i32(GPU, T, slot), slc = mk_i32(CPU, T, slot);
    pair X = act(2, sr, x), C = act(2, sc, c0), Wn = act(1, sw, w), N = act(2, sn, x);
    ms_rope_cfg rc = {kvl, dr, interleaved, 10000.0};
    R(GPU->ops->mla_kv_prep(GPU, &X.g, kvl, &Wn.g, 1e-6f, pg.data, &rc, &C.g, slg.data, &E));
    ms_tensor x3 = ms_tensor_reshape(&X.c, 3, (int64_t[]){T, 1, W});
    R(CPU->ops->copy_cols(CPU, &X.c, 0, kvl, &N.c, &E));
    R(CPU->ops->rmsnorm(CPU, &N.c, &Wn.c, 1e-6f, &N.c, &E));
    R(CPU->ops->set_cols(CPU, &N.c, 0, &X.c, &E));
    R(CPU->ops->rope(CPU, &x3, pc.data, &rc, &E));
    R(CPU->ops->kv_store(CPU, &C.c, &X.c, slc.data, &E));
    CMP(X.g, X.c, 2e-2);
    CMP(C.g, C.c, 2e-2);
    pfree(&X); pfree(&C); pfree(&Wn); pfree(&N);
    fr(GPU, &pg); fr(CPU, &pc); fr(GPU, &slg); fr(CPU, &slc);
    free(x); free(w); free(c0);
}

/* mla_prep (the q_a norm, the latent and the indexer key of T tokens in one launch) against the CPU's
 * separate ops: rmsnorm; copy_cols, rmsnorm, set_cols, rope, kv_store; layernorm, rope, kv_store. A part
 * its op would refuse makes the whole call refused with nothing done. */
/* with_idx: 0 no indexer part, 1 with its LayerNorm bias, 2 without one. */
static void mla_prep_case(int T, int ql, int kvl, int dr, int di, int with_idx) {
    const int W = kvl + dr, S = 2 * T + 3;
    int64_t sq[2] = {T, ql}, skv[2] = {T, W}, sn[2] = {T, kvl}, sc[2] = {S, W}, sx[2] = {T, di}, sxc[2] = {S, di},
            swq[1] = {ql}, swk[1] = {kvl}, swi[1] = {di};
    float *q = rand_vec((size_t)T * ql, 3.f), *kv = rand_vec((size_t)T * W, 3.f), *ki = rand_vec((size_t)T * di, 3.f),
          *wq = rand_vec((size_t)ql, 1.f), *wk = rand_vec((size_t)kvl, 1.f), *wi = rand_vec((size_t)di, 1.f),
          *bi = rand_vec((size_t)di, 0.5f), *c0 = rand_vec((size_t)S * W, 1.f), *c1 = rand_vec((size_t)S * di, 1.f);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T), *slot = malloc(sizeof(int32_t) * (size_t)T);
    for (int t = 0; t < T; t++) pos[t] = 3 + 41 * t, slot[t] = S - 1 - 2 * t;
    ms_tensor pg = mk_i32(GPU, T, pos), pc = mk_i32(CPU, T, pos), slg = mk_i32(GPU, T, slot), slc = mk_i32(CPU, T, slot);
    pair Q = act(2, sq, q), KV = act(2, skv, kv), N = act(2, sn, kv), KC = act(2, sc, c0), KI = act(2, sx, ki),
         IC = act(2, sxc, c1), WQ = act(1, swq, wq), WK = act(1, swk, wk), WI = act(1, swi, wi), BI = act(1, swi, bi);
    ms_rope_cfg rk = {kvl, dr, 0, 1e6}, ri = {0, dr < di ? dr : di, 1, 1e6};
    ms_mla_prep p = {.cq = &Q.g, .q_norm = &WQ.g, .q_eps = 1e-5f, .kva = &KV.g, .kvl = kvl, .kv_norm = &WK.g,
                     .kv_eps = 1e-6f, .kv_rope = &rk, .kv_cache = &KC.g, .kI = with_idx ? &KI.g : NULL, .kI_w = &WI.g,
                     .kI_b = with_idx == 2 ? NULL : &BI.g, .kI_eps = 1e-6f, .kI_rope = &ri, .kI_cache = &IC.g, .pos_d = pg.data,
                     .slot_d = slg.data};
    /* refused: the latent's rotation not on its last dr columns (nothing written) */
    ms_rope_cfg bad = {kvl - 2, dr, 0, 1e6};
    p.kv_rope = &bad;
    CHECK(GPU->ops->mla_prep(GPU, &p, &E) == MS_ERR_UNSUPPORTED);
    CMP(Q.g, Q.c, 0);
    p.kv_rope = &rk;
    R(GPU->ops->mla_prep(GPU, &p, &E));
    R(CPU->ops->rmsnorm(CPU, &Q.c, &WQ.c, 1e-5f, &Q.c, &E));
    ms_tensor x3 = ms_tensor_reshape(&KV.c, 3, (int64_t[]){T, 1, W});
    R(CPU->ops->copy_cols(CPU, &KV.c, 0, kvl, &N.c, &E));
    R(CPU->ops->rmsnorm(CPU, &N.c, &WK.c, 1e-6f, &N.c, &E));
    R(CPU->ops->set_cols(CPU, &N.c, 0, &KV.c, &E));
    R(CPU->ops->rope(CPU, &x3, pc.data, &rk, &E));
    R(CPU->ops->kv_store(CPU, &KC.c, &KV.c, slc.data, &E));
    CMP(Q.g, Q.c, 2e-2);
    CMP(KV.g, KV.c, 2e-2);
    CMP(KC.g, KC.c, 2e-2);
    if (with_idx) {
        ms_tensor i3 = ms_tensor_reshape(&KI.c, 3, (int64_t[]){T, 1, di});
        R(CPU->ops->layernorm(CPU, &KI.c, &WI.c, with_idx == 2 ? NULL : &BI.c, 1e-6f, &KI.c, &E));
        R(CPU->ops->rope(CPU, &i3, pc.data, &ri, &E));
        R(CPU->ops->kv_store(CPU, &IC.c, &KI.c, slc.data, &E));
    }
    CMP(KI.g, KI.c, 2e-2); /* untouched without the indexer part */
    CMP(IC.g, IC.c, 2e-2);
    pfree(&Q); pfree(&KV); pfree(&N); pfree(&KC); pfree(&KI); pfree(&IC); pfree(&WQ); pfree(&WK); pfree(&WI); pfree(&BI);
    fr(GPU, &pg); fr(CPU, &pc); fr(GPU, &slg); fr(CPU, &slc);
    free(q); free(kv); free(ki); free(wq); free(wk); free(wi); free(bi); free(c0); free(c1); free(pos); free(slot);
}

static void test_mla_prep(void) {
    mla_prep_case(1, 2048, 512, 64, 128, 1); /* GLM-5's decode step */
    mla_prep_case(1, 2048, 512, 64, 128, 0); /* a layer without its own indexer */
    mla_prep_case(3, 64, 64, 16, 32, 1);     /* the fixtures' dims, several tokens */
    mla_prep_case(2, 40, 24, 8, 20, 1);      /* widths of no tile size */
    mla_prep_case(2, 64, 64, 16, 32, 2);     /* an indexer key norm without a bias */
}

static void test_mla_kv_prep(void) {
    mla_kv_prep_case(512, 64, 0); /* GLM-5 */
    mla_kv_prep_case(512, 64, 1); /* interleaved pairs (DeepSeek-style checkpoints) */
    mla_kv_prep_case(64, 16, 0);  /* the fixtures */
    mla_kv_prep_case(24, 8, 1);   /* a kv_lora_rank that is no multiple of 16 */
}

/* Elements where two GPU tensors of one shape differ (downloaded to float; NaN counts as different). */
static long n_differ(const ms_tensor *a, const ms_tensor *b, double *maxd) {
    float *x = get(GPU, a), *y = get(GPU, b);
    long n = 0;
    *maxd = 0;
    for (int64_t i = 0; i < ms_tensor_numel(a); i++) {
        if (!(x[i] == y[i])) n++;
        double d = fabs((double)x[i] - y[i]);
        if (!(d <= *maxd)) *maxd = d;
    }
    free(x);
    free(y);
    return n;
}

/* The fused indexer-key op (LayerNorm + RoPE + cache store, one launch) against the GPU's own three
 * ops on the same input, bit for bit (key rows and the whole cache, untouched rows included), and
 * against the CPU's three ops. T tokens at positions from 37 on, slots with gaps; then once more with
 * a padding slot (-1) that both GPU paths must skip. */
static void idx_k_prep_case(int T, int d, int rot_off, int rot_dim, int il, int with_bias, ms_dtype wdt) {
    const int S = 3 * T + 5;
    int64_t sx[2] = {T, d}, sc[2] = {S, d}, sw[1] = {d};
    float *x = rand_vec((size_t)T * d, 3.f), *w = rand_vec((size_t)d, 1.f), *bi = rand_vec((size_t)d, 0.5f),
          *c0 = rand_vec((size_t)S * d, 1.f);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T), *slot = malloc(sizeof(int32_t) * (size_t)T);
    for (int t = 0; t < T; t++) pos[t] = 37 + 5 * t, slot[t] = S - 1 - 3 * t;
    wpair W = wten(wdt, 1, sw, w), Bs = wten(wdt, 1, sw, bi);
    const ms_tensor *bg = with_bias ? &Bs.g : NULL, *bc = with_bias ? &Bs.c : NULL;
    ms_rope_cfg rc = {rot_off, rot_dim, il, 1e6};
    for (int pad = 0; pad < 2; pad++) {
        if (pad) slot[T / 2] = -1; /* a padding token: no cache row */
        ms_tensor pg = mk_i32(GPU, T, pos), pc = mk_i32(CPU, T, pos), slg = mk_i32(GPU, T, slot), slc = mk_i32(CPU, T, slot);
        pair X = act(2, sx, x), C = act(2, sc, c0);
        ms_tensor X2 = mk(GPU, 0, 2, sx, x), C2 = mk(GPU, 0, 2, sc, c0);
        R(GPU->ops->idx_k_prep(GPU, &X.g, &W.g, bg, 1e-6f, pg.data, &rc, &C.g, slg.data, &E));
        ms_tensor x3 = ms_tensor_reshape(&X2, 3, (int64_t[]){T, 1, d});
        R(GPU->ops->layernorm(GPU, &X2, &W.g, bg, 1e-6f, &X2, &E));
        R(GPU->ops->rope(GPU, &x3, pg.data, &rc, &E));
        R(GPU->ops->kv_store(GPU, &C2, &X2, slg.data, &E));
        double md;
        long nd = n_differ(&X.g, &X2, &md);
        CHECK_MSG(nd == 0, "T %d d %d pad %d: %ld key values differ from layernorm+rope (max %g)", T, d, pad, nd, md);
        nd = n_differ(&C.g, &C2, &md);
        CHECK_MSG(nd == 0, "T %d d %d pad %d: %ld cache values differ from kv_store (max %g)", T, d, pad, nd, md);
        if (!pad) { /* the CPU's kv_store refuses a padding slot: compared without one */
            ms_tensor xc3 = ms_tensor_reshape(&X.c, 3, (int64_t[]){T, 1, d});
            R(CPU->ops->layernorm(CPU, &X.c, &W.c, bc, 1e-6f, &X.c, &E));
            R(CPU->ops->rope(CPU, &xc3, pc.data, &rc, &E));
            R(CPU->ops->kv_store(CPU, &C.c, &X.c, slc.data, &E));
            CMP(X.g, X.c, 2e-2);
            CMP(C.g, C.c, 2e-2);
        }
        pfree(&X); pfree(&C); fr(GPU, &X2); fr(GPU, &C2);
        fr(GPU, &pg); fr(CPU, &pc); fr(GPU, &slg); fr(CPU, &slc);
    }
    /* a rotation outside the row is refused with a status */
    ms_rope_cfg bad = {d - 2, 4, il, 1e6};
    pair X = act(2, sx, x), C = act(2, sc, c0);
    ms_tensor pg = mk_i32(GPU, T, pos), slg = mk_i32(GPU, T, slot);
    CHECK(GPU->ops->idx_k_prep(GPU, &X.g, &W.g, bg, 1e-6f, pg.data, &bad, &C.g, slg.data, &E) == MS_ERR_UNSUPPORTED);
    pfree(&X); pfree(&C); fr(GPU, &pg); fr(GPU, &slg);
    wfree(&W); wfree(&Bs);
    free(x); free(w); free(bi); free(c0); free(pos); free(slot);
}

static void test_idx_k_prep(void) {
    const int Ts[3] = {1, 3, 17};
    for (int i = 0; i < 3; i++) {
        idx_k_prep_case(Ts[i], 128, 0, 64, 0, 1, MS_BF16); /* GLM-5: 128-wide keys, NeoX rotation of the first 64 */
        idx_k_prep_case(Ts[i], 128, 0, 64, 1, 1, MS_F32);  /* interleaved pairs, float32 norm weight and bias */
        idx_k_prep_case(Ts[i], 24, 8, 8, 1, 0, MS_BF16);   /* odd: rotation in the middle of a 24-wide row, no bias */
        idx_k_prep_case(Ts[i], 300, 36, 128, 0, 1, MS_BF16); /* a width past one block's threads (256 per row) */
    }
}

static void test_rope(void) {
    rope_case(3, 64, 0, 64, 0, 10000.0);      /* NeoX full */
    rope_case(2, 128, 0, 64, 0, 1e6);         /* NeoX partial (GLM-4.5) */
    rope_case(4, 80, 16, 64, 1, 1e6);         /* interleaved, offset (MLA rope part) */
    rope_case(1, 24, 0, 24, 1, 500.0);
}

/* ---- quantized weights ---- */

typedef struct {
    ms_linear g, c;
    void *w, *s, *bias;
} lpair;

static uint8_t rnd_e4m3_scale(void) { return (uint8_t)(0x28 + rnd_u32() % 0x20); } /* ~0.03 .. 0.9 positive */

static lpair mk_linear(ms_wfmt fmt, ms_dtype pdt, int64_t N, int64_t K, int with_bias) {
    lpair L;
    memset(&L, 0, sizeof L);
    ms_linear W;
    test_linear_init(&W, "test.linear", fmt, N, K);
    if (fmt == MS_WFMT_PLAIN) {
        size_t n = (size_t)(N * K);
        W.w = ms_tensor_2d(pdt, N, K);
        L.w = malloc(n * ms_dtype_size(pdt));
        for (size_t i = 0; i < n; i++) {
            float v = rnd_f() * 0.2f;
            if (pdt == MS_BF16) ((uint16_t *)L.w)[i] = ms_f32_to_bf16(v);
            else ((float *)L.w)[i] = v;
        }
    } else if (fmt == MS_WFMT_FP8) {
        W.w = ms_tensor_2d(MS_F8E4M3, N, K);
        L.w = malloc((size_t)(N * K));
        for (size_t i = 0; i < (size_t)(N * K); i++) {
            uint8_t q = (uint8_t)rnd_u32();
            if ((q & 0x7f) == 0x7f) q ^= 1;
            ((uint8_t *)L.w)[i] = q;
        }
        int64_t sn = (N + 127) / 128, sk = (K + 127) / 128;
        W.scale = ms_tensor_2d(MS_F32, sn, sk);
        L.s = malloc((size_t)(sn * sk) * 4);
        for (int64_t i = 0; i < sn * sk; i++) ((float *)L.s)[i] = 0.001f + 0.004f * (float)(rnd_u32() % 100) / 100.f;
    } else {
        W.w = ms_tensor_2d(MS_U8, N, K / 2);
        L.w = malloc((size_t)(N * K / 2));
        for (size_t i = 0; i < (size_t)(N * K / 2); i++) ((uint8_t *)L.w)[i] = (uint8_t)rnd_u32();
        W.scale = ms_tensor_2d(MS_F8E4M3, N, K / 16);
        L.s = malloc((size_t)(N * K / 16));
        for (size_t i = 0; i < (size_t)(N * K / 16); i++) ((uint8_t *)L.s)[i] = rnd_e4m3_scale();
        W.scale2 = 0.05f;
    }
    W.w.data = L.w;
    W.scale.data = L.s;
    if (with_bias) {
        W.bias = ms_tensor_make(MS_F32, 1, &N);
        L.bias = rand_vec((size_t)N, 0.5f);
        W.bias.data = L.bias;
    }
    L.g = W;
    L.c = W;
    R(GPU->ops->place_linear(GPU, &L.g, &E));
    R(CPU->ops->place_linear(CPU, &L.c, &E));
    return L;
}

static void free_linear(lpair *L) {
    GPU->ops->unplace_linear(GPU, &L->g);
    CPU->ops->unplace_linear(CPU, &L->c);
    free(L->w);
    free(L->s);
    free(L->bias);
}

#ifdef MS_HAVE_CUDA
/* MS_CU_NORM_EARLY: the one-pass residual RMSNorm (f32 rows, bf16 weights and output) triggers the next kernel
 * before its wait. The chain the forward runs between two layers: a projection writes the delta (the MoE's
 * place), add + RMSNorm, then the bf16 projection that reads the normed row (streaming GEMV, early copies on:
 * the weights are quiet), all three in flight together with no sync between them. The same bits with the
 * knob as without it, in the residual written back, the normed row and the projection, at one row and at
 * three (where the norm's row count is not the GEMV's one-row form); and the CPU's result. */
static void test_norm_early(void) {
    for (int64_t R_ = 1; R_ <= 3; R_ += 2) {
        const int64_t D = 4096, N = 2048, Kd = 1024;
        int64_t s[2] = {R_, D}, ws[1] = {D}, ys[2] = {R_, N}, hs[2] = {R_, Kd};
        float *x = rand_vec((size_t)(R_ * D), 3.f), *h = rand_vec((size_t)(R_ * Kd), 1.f), *w = rand_vec((size_t)D, 1.f);
        wpair W = wten(MS_BF16, 1, ws, w);
        lpair L = mk_linear(MS_WFMT_PLAIN, MS_BF16, N, D, 0), Ld = mk_linear(MS_WFMT_PLAIN, MS_BF16, D, Kd, 0);
        float *got[2][3];
        for (int k = 0; k < 2; k++) {
            char *saved = env_push("MS_CU_NORM_EARLY", k ? "1" : "0");
            ms_tensor X = mk(GPU, MS_F32, 2, s, x), H = mk(GPU, 0, 2, hs, h), Dl = mk(GPU, MS_F32, 2, s, NULL);
            ms_tensor O = mk(GPU, MS_BF16, 2, s, NULL), Y = mk(GPU, MS_F32, 2, ys, NULL);
            R(GPU->ops->sync(GPU, &E));
            const long long g0 = ms_cuda_gvb_launches();
            R(GPU->ops->linear(GPU, &Ld.g, &H, &Dl, &E)); /* the delta, written by the kernel before the norm */
            R(GPU->ops->add_rmsnorm(GPU, &X, &Dl, &W.g, 1e-5f, &O, &E));
            R(GPU->ops->linear(GPU, &L.g, &O, &Y, &E));
            CHECK_MSG(ms_cuda_gvb_launches() - g0 == 2, "norm early, %lld rows: %lld of 2 projections streamed",
                      (long long)R_, ms_cuda_gvb_launches() - g0);
            got[k][0] = get(GPU, &X), got[k][1] = get(GPU, &O), got[k][2] = get(GPU, &Y);
            fr(GPU, &X); fr(GPU, &H); fr(GPU, &Dl); fr(GPU, &O); fr(GPU, &Y);
            env_pop("MS_CU_NORM_EARLY", saved);
        }
        const int64_t n[3] = {R_ * D, R_ * D, R_ * N};
        static const char *const what[3] = {"residual", "normed row", "projection"};
        for (int i = 0; i < 3; i++)
            CHECK_MSG(!memcmp(got[0][i], got[1][i], sizeof(float) * (size_t)n[i]),
                      "norm early, %lld rows: the %s differs from the knob-off chain's bits", (long long)R_, what[i]);
        /* and the CPU's chain */
        pair Xc = act(2, s, x), Hc = act(2, hs, h), Dc = out_act(2, s), Oc = out_act(2, s), Yc = out_act(2, ys);
        R(CPU->ops->linear(CPU, &Ld.c, &Hc.c, &Dc.c, &E));
        R(CPU->ops->add_rmsnorm(CPU, &Xc.c, &Dc.c, &W.c, 1e-5f, &Oc.c, &E));
        R(CPU->ops->linear(CPU, &L.c, &Oc.c, &Yc.c, &E));
        float *ref = get(CPU, &Yc.c);
        const double e = rel_err(got[1][2], ref, (size_t)(R_ * N));
        CHECK_MSG(e <= 2e-2, "norm early, %lld rows: projection rel err %.3g against the CPU", (long long)R_, e);
        free(ref);
        pfree(&Xc); pfree(&Hc); pfree(&Dc); pfree(&Oc); pfree(&Yc);
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < 3; i++) free(got[k][i]);
        free_linear(&L);
        free_linear(&Ld);
        wfree(&W);
        free(x); free(h); free(w);
    }
}
#endif

static void linear_case(ms_wfmt fmt, ms_dtype pdt, int64_t T, int64_t N, int64_t K, int bias, ms_dtype ydt) {
    lpair L = mk_linear(fmt, pdt, N, K, bias);
    int64_t xs[2] = {T, K}, ys[2] = {T, N};
    float *x = rand_vec((size_t)(T * K), 1.f);
    pair X = act(2, xs, x);
    pair Y = {mk(GPU, ydt == MS_F32 ? MS_F32 : 0, 2, ys, NULL), mk(CPU, 0, 2, ys, NULL)};
    R(GPU->ops->linear(GPU, &L.g, &X.g, &Y.g, &E));
    R(CPU->ops->linear(CPU, &L.c, &X.c, &Y.c, &E));
    float *a = get(GPU, &Y.g), *r = get(CPU, &Y.c);
    double e = rel_err(a, r, (size_t)(T * N));
    CHECK_MSG(e <= 2e-2, "linear %s T=%lld N=%lld K=%lld bias=%d y=%s: rel err %.3g", ms_wfmt_name(fmt, pdt),
              (long long)T, (long long)N, (long long)K, bias, ms_dtype_name(ydt), e);
    free(a);
    free(r);
    pfree(&X);
    pfree(&Y);
    free(x);
    free_linear(&L);
}

static void test_linear(void) {
    const int64_t Ts[4] = {1, 3, 17, 70};
    for (int i = 0; i < 4; i++) {
        linear_case(MS_WFMT_PLAIN, MS_BF16, Ts[i], 70, 96, i & 1, MS_BF16);
        linear_case(MS_WFMT_PLAIN, MS_F32, Ts[i], 33, 40, 1, MS_F32);
        linear_case(MS_WFMT_FP8, 0, Ts[i], 200, 256, 0, i & 1 ? MS_F32 : MS_BF16); /* vector path, 2 scale rows */
        linear_case(MS_WFMT_FP8, 0, Ts[i], 70, 90, 1, MS_BF16);                   /* scalar path */
        linear_case(MS_WFMT_NVFP4, 0, Ts[i], 130, 256, 0, MS_BF16);               /* vector path */
        linear_case(MS_WFMT_NVFP4, 0, Ts[i], 66, 48, 1, MS_F32);                  /* scalar path */
    }
}

/* stack_linears: the stacked linear's output columns equal the CPU outputs of the parts (biases
 * where a part has one), the parts keep working as views, and what cannot be stacked (NVFP4, an FP8
 * part whose rows split a 128-row scale block) is refused with the parts untouched. */
static void stack_case(ms_wfmt fmt, const int64_t *Ns, const int *bias, int64_t K, int expect_ok) {
    enum { NP = 3 };
    lpair P[NP];
    int64_t Nt = 0;
    for (int i = 0; i < NP; i++) P[i] = mk_linear(fmt, MS_BF16, Ns[i], K, bias[i]), Nt += Ns[i];
    ms_linear *parts[NP] = {&P[0].g, &P[1].g, &P[2].g}, S;
    const int64_t Ts[3] = {1, 5, 300};
    int rc = GPU->ops->stack_linears(GPU, parts, NP, "stacked", &S, &E);
    CHECK_MSG(rc == (expect_ok ? MS_OK : MS_ERR_UNSUPPORTED), "stack_linears %s rc %d (%s)", ms_wfmt_name(fmt, MS_BF16), rc, E.msg);
    for (int ti = 0; ti < 3; ti++) {
        const int64_t T = Ts[ti], xs[2] = {T, K}, ys[2] = {T, Nt};
        float *x = rand_vec((size_t)(T * K), 1.f);
        pair X = act(2, xs, x);
        float *ys_all = NULL;
        if (rc == MS_OK) {
            ms_tensor Yg = mk(GPU, 0, 2, ys, NULL);
            R(GPU->ops->linear(GPU, &S, &X.g, &Yg, &E));
            ys_all = get(GPU, &Yg);
            fr(GPU, &Yg);
        }
        int64_t c0 = 0;
        for (int i = 0; i < NP; i++) {
            const int64_t yp[2] = {T, Ns[i]};
            pair Y = {mk(GPU, 0, 2, yp, NULL), mk(CPU, 0, 2, yp, NULL)};
            R(GPU->ops->linear(GPU, &P[i].g, &X.g, &Y.g, &E)); /* a view after stacking */
            R(CPU->ops->linear(CPU, &P[i].c, &X.c, &Y.c, &E));
            float *a = get(GPU, &Y.g), *r = get(CPU, &Y.c);
            double e = rel_err(a, r, (size_t)(T * Ns[i]));
            CHECK_MSG(e <= 2e-2, "stack %s part %d T=%lld: rel err %.3g", ms_wfmt_name(fmt, MS_BF16), i, (long long)T, e);
            if (ys_all) {
                float *cols = malloc(sizeof(float) * (size_t)(T * Ns[i]));
                for (int64_t t = 0; t < T; t++) memcpy(cols + t * Ns[i], ys_all + t * Nt + c0, sizeof(float) * (size_t)Ns[i]);
                e = rel_err(cols, r, (size_t)(T * Ns[i]));
                CHECK_MSG(e <= 2e-2, "stacked %s columns of part %d T=%lld: rel err %.3g", ms_wfmt_name(fmt, MS_BF16), i,
                          (long long)T, e);
                free(cols);
            }
            free(a), free(r);
            pfree(&Y);
            c0 += Ns[i];
        }
        free(ys_all);
        pfree(&X);
        free(x);
    }
    for (int i = 0; i < NP; i++) free_linear(&P[i]);
    if (rc == MS_OK) GPU->ops->unplace_linear(GPU, &S);
}

static void test_stack_linears(void) {
    const int64_t n1[3] = {256, 128, 64}, n2[3] = {256, 128, 128}, n3[3] = {200, 128, 128};
    const int b1[3] = {1, 0, 1}, b0[3] = {0, 0, 0}, b2[3] = {1, 1, 1};
    stack_case(MS_WFMT_PLAIN, n1, b1, 96, 1);  /* q|k|v with biases on two parts */
    stack_case(MS_WFMT_PLAIN, n1, b0, 3112, 1);
    stack_case(MS_WFMT_FP8, n2, b2, 256, 1);   /* 128-row scale blocks stack whole */
    stack_case(MS_WFMT_FP8, n3, b0, 256, 0);   /* 200 rows: a scale block would straddle two parts */
    stack_case(MS_WFMT_NVFP4, n2, b0, 256, 0); /* a global scale per part */
}

/* Shapes for the tensor-core GEMV (gemv_mma.cu): T = 1..16, N not a multiple of 16 and K not a
 * multiple of the 64-byte super-step (a partial last step), plus K large enough that 16 tokens of x
 * do not fit the kernel's shared memory at once (K sliced, double-buffered) and, for fp8, two
 * 128-row scale blocks. Formats outside its alignment still take the CUDA-core kernels above. */
static void test_linear_mma(void) {
    const int64_t Ts[5] = {1, 3, 8, 9, 16};
    for (int i = 0; i < 5; i++) {
        const int64_t T = Ts[i];
        linear_case(MS_WFMT_PLAIN, MS_BF16, T, 70, 88, i & 1, i & 1 ? MS_F32 : MS_BF16);
        linear_case(MS_WFMT_PLAIN, MS_BF16, T, 40, 3112, 0, MS_BF16);
        linear_case(MS_WFMT_FP8, 0, T, 200, 208, i & 1, i & 1 ? MS_BF16 : MS_F32);
        linear_case(MS_WFMT_FP8, 0, T, 200, 1552, 0, MS_BF16);
        linear_case(MS_WFMT_NVFP4, 0, T, 130, 160, i & 1, i & 1 ? MS_F32 : MS_BF16);
        linear_case(MS_WFMT_NVFP4, 0, T, 66, 2080, 0, MS_BF16);
    }
}

#ifdef MS_HAVE_CUDA
/* The one-token NVFP4 product on FP8 wgmma (gemv_w8.cu), which batch-1 decode takes on sm_90 builds
 * with sm_90a code: against the CPU, and against the mma.sync form (MS_CU_GEMV_FP4=v2) on the same
 * inputs, with F32 outputs held to 2e-3 of the largest output (bf16 ones to 1e-2); the launch counter
 * says which kernel ran. Shapes: K a multiple of 128 with odd and even super-step counts (1, 2, 11) and
 * K = 6144 (B tiles past 48 KB of shared memory), N not a multiple of 64, bias, fused gate/up.
 * wide: every x element scaled by 2^-20 .. 2^10, so each 16-k block spans the range where the hi/lo
 * split is exact and where it is not (the file comment's bound). nan: one NaN in x must make every
 * output NaN (never a silent finite value). */
static void swiglu_case(ms_wfmt fmt, ms_dtype pdt, int64_t T, int64_t N, int64_t K);
/* The FP8 wgmma form runs where the GPU is sm_90 (this project's CUDA builds carry sm_90a code), as a
 * form of the tensor-core GEMV: not when MS_CU_GEMV picks the CUDA-core kernels (gpu-check's gv2 pass). */
static int w8_expected(void) {
    const char *g = getenv("MS_CU_GEMV");
    return GPU->gpu.cc_major == 9 && (!g || !strcmp(g, "mma"));
}

/* Sets MS_CU_GEMV_FP4 to v; returns its previous value (NULL: was unset) for fp4_pop. */
static char *fp4_push(const char *v) { return env_push("MS_CU_GEMV_FP4", v); }
/* Puts back what fp4_push returned (and frees it). */
static void fp4_pop(char *prev) { env_pop("MS_CU_GEMV_FP4", prev); }

/* One linear through a form the knob `var` selects: with var = on the form's launch counter must move
 * exactly when `want` (either way when want < 0), with var = off it must not, and the first result is
 * held to the CPU (and, finite, to the second) within tol of the largest output. x: random, every
 * element scaled by 2^-20 .. 2^10 with wide, a NaN in its last row with nan (at its first element when
 * nan is 2, else a third in; that row's outputs must all be NaN, the others right). */
typedef struct {
    const char *var, *on, *off, *name; /* the knob, its two values, the form's name in messages */
    long long (*launches)(void);       /* the form's launch counter */
} form_knob;

static void form_linear_case(const form_knob *fk, ms_wfmt fmt, int64_t T, int64_t N, int64_t K, int bias, ms_dtype ydt,
                             int wide, int nan, int want, double tol) {
    lpair L = mk_linear(fmt, fmt == MS_WFMT_PLAIN ? MS_BF16 : 0, N, K, bias);
    int64_t xs[2] = {T, K}, ys[2] = {T, N};
    float *x = rand_vec((size_t)(T * K), 1.f);
    if (wide)
        for (int64_t i = 0; i < T * K; i++) x[i] = ldexpf(x[i], (int)(rnd_u32() % 31u) - 20);
    if (nan) x[(T - 1) * K + (nan == 2 ? 0 : K / 3)] = NAN;
    pair X = act(2, xs, x);
    const ms_dtype gdt = ydt == MS_F32 ? MS_F32 : 0;
    pair Y = {mk(GPU, gdt, 2, ys, NULL), mk(CPU, 0, 2, ys, NULL)};
    ms_tensor Y2 = mk(GPU, gdt, 2, ys, NULL);
    char *saved = env_push(fk->var, fk->on);
    const long long n0 = fk->launches();
    R(GPU->ops->linear(GPU, &L.g, &X.g, &Y.g, &E));
    const int ran = fk->launches() > n0;
    CHECK_MSG(want < 0 || ran == want, "%s linear T=%lld N=%lld K=%lld: %s %s", ms_wfmt_name(fmt, MS_BF16), (long long)T,
              (long long)N, (long long)K, fk->name, want ? "did not run" : "ran where it should not");
    setenv(fk->var, fk->off, 1); /* the caller's value comes back with env_pop below */
    const long long n1 = fk->launches();
    R(GPU->ops->linear(GPU, &L.g, &X.g, &Y2, &E));
    CHECK_MSG(fk->launches() == n1, "%s=%s still launched the %s", fk->var, fk->off, fk->name);
    env_pop(fk->var, saved);
    R(CPU->ops->linear(CPU, &L.c, &X.c, &Y.c, &E));
    float *a = get(GPU, &Y.g), *b = get(GPU, &Y2), *r = get(CPU, &Y.c);
    const int64_t good = nan ? (T - 1) * N : T * N; /* outputs from rows without a NaN */
    if (nan) {
        int bad = 0;
        for (int64_t i = good; i < T * N; i++) bad += !isnan(a[i]);
        CHECK_MSG(bad == 0, "%s linear with a NaN in x row %lld: %d of %lld outputs not NaN", ms_wfmt_name(fmt, MS_BF16),
                  (long long)(T - 1), bad, (long long)N);
    }
    if (good > 0) {
        const double e1 = rel_err(a, r, (size_t)good), e2 = nan ? 0 : rel_err(a, b, (size_t)good);
        CHECK_MSG(e1 <= tol && e2 <= tol,
                  "%s linear T=%lld N=%lld K=%lld bias=%d y=%s wide=%d: rel err %.3g vs CPU, %.3g with %s=%s",
                  ms_wfmt_name(fmt, MS_BF16), (long long)T, (long long)N, (long long)K, bias, ms_dtype_name(ydt), wide, e1,
                  e2, fk->var, fk->off);
    }
    free(a);
    free(b);
    free(r);
    fr(GPU, &Y2);
    pfree(&X);
    pfree(&Y);
    free(x);
    free_linear(&L);
}

static const form_knob W8_FORM = {"MS_CU_GEMV_FP4", "w8", "v2", "FP8 wgmma form", ms_cuda_w8_launches};

static void w8_linear_case(int64_t N, int64_t K, int bias, ms_dtype ydt, int wide, int nan) {
    form_linear_case(&W8_FORM, MS_WFMT_NVFP4, 1, N, K, bias, ydt, wide, nan, w8_expected(), ydt == MS_F32 ? 2e-3 : 1e-2);
}

static void test_linear_w8(void) {
    w8_linear_case(130, 256, 0, MS_F32, 0, 0);
    w8_linear_case(64, 128, 1, MS_F32, 0, 0);   /* one super-step */
    w8_linear_case(200, 1408, 0, MS_F32, 1, 0); /* eleven (GLM-4.5-Air's expert down projection) */
    w8_linear_case(70, 6144, 1, MS_BF16, 0, 0); /* 50 KB of shared memory */
    w8_linear_case(96, 4096, 0, MS_F32, 1, 0);
    w8_linear_case(130, 512, 0, MS_F32, 0, 1);
    /* fused gate/up at one token (the shared expert's path): swiglu_case's checks, plus the counter */
    char *saved = fp4_push("w8");
    const long long n0 = ms_cuda_w8_launches();
    swiglu_case(MS_WFMT_NVFP4, 0, 1, 136, 512);
    swiglu_case(MS_WFMT_NVFP4, 0, 1, 72, 1408);
    fp4_pop(saved);
    CHECK_MSG((ms_cuda_w8_launches() - n0 == 2) == w8_expected(), "fused gate/up at one token: FP8 wgmma form ran %lld times",
              ms_cuda_w8_launches() - n0);
}
#endif

#ifdef MS_HAVE_CUDA
/* The streaming bf16 GEMV (gemv_bf16.cu), which bf16 linears and fused gate/up at 1..4 rows take by
 * default: against the CPU and against cuBLASLt / the tensor-core GEMV (MS_CU_BF16_STREAM_MAX_T=0) on the
 * same inputs, F32 outputs within 1e-4 of the largest output (only the summation order differs), bf16
 * ones within 1e-2; the launch counter says which form ran. Shapes cover each launch choice: one row,
 * N of one and N not a multiple of anything, K of one 16-byte chunk, K not a multiple of the 512-byte
 * run (3112), K split over 2..8 warps (few rows, long K: 40 x 12288, 33 x 40000), several rows a warp
 * (20000 x 512), GLM-4.5-Air's o_proj (4096 x 12288); T = 5 and the knob at 0 must not take it. A NaN
 * in one row of x makes that row's outputs NaN and leaves the other row's right. */
static const form_knob GVB_FORM = {"MS_CU_BF16_STREAM_MAX_T", "4", "0", "streaming bf16 GEMV", ms_cuda_gvb_launches};

static void bf16_stream_case(int64_t T, int64_t N, int64_t K, int bias, ms_dtype ydt, int nan) {
    form_linear_case(&GVB_FORM, MS_WFMT_PLAIN, T, N, K, bias, ydt, 0, nan, T <= 4, ydt == MS_F32 ? 1e-4 : 1e-2);
}

static void test_linear_bf16_stream(void) {
    for (int64_t T = 1; T <= 4; T++) {
        bf16_stream_case(T, 1, 8, 1, MS_F32, 0);
        bf16_stream_case(T, 7, 24, 0, MS_BF16, 0);
        bf16_stream_case(T, 70, 3112, T & 1, MS_F32, 0);
        bf16_stream_case(T, 40, 12288, 0, MS_F32, 0);
        bf16_stream_case(T, 1000, 4096, 1, T & 1 ? MS_BF16 : MS_F32, 0);
    }
    /* the test models' odd shapes (tests/model/test_forward_cache.c): hidden 136 / 112, shared experts
     * of 40 / 80 rows, MLA projections of 48 / 80 / 192 columns, 8 index heads */
    static const int64_t odd[][2] = {{168, 136}, {136, 120}, {40, 136}, {136, 40}, {97, 136}, {200, 136}, {136, 200},
                                     {192, 112}, {256, 48}, {384, 80}, {112, 192}, {384, 48}, {8, 112}, {80, 112},
                                     {112, 80}, {97, 112}};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++)
        for (int64_t T = 1; T <= 4; T++) bf16_stream_case(T, odd[i][0], odd[i][1], (int)(i & 1), i & 2 ? MS_BF16 : MS_F32, 0);
    bf16_stream_case(1, 33, 40000, 1, MS_F32, 0);
    bf16_stream_case(1, 20000, 512, 0, MS_F32, 0);
    bf16_stream_case(1, 4096, 12288, 0, MS_BF16, 0);
    bf16_stream_case(5, 70, 256, 0, MS_F32, 0); /* beyond the form: another one, same results */
    bf16_stream_case(1, 300, 1024, 0, MS_F32, 1);
    bf16_stream_case(3, 300, 4104, 1, MS_F32, 1);
    bf16_stream_case(1, 14336, 4096, 1, MS_BF16, 0); /* Air's q|k|v */
    /* fused gate/up (dense MLP at decode): swiglu_case's checks, plus the counter */
    char *saved = env_push("MS_CU_BF16_STREAM_MAX_T", "4");
    const long long n0 = ms_cuda_gvb_launches();
    for (int64_t T = 1; T <= 4; T++) swiglu_case(MS_WFMT_PLAIN, MS_BF16, T, 72, 3112);
    swiglu_case(MS_WFMT_PLAIN, MS_BF16, 1, 1500, 6144);
    for (int64_t T = 1; T <= 4; T++) {
        swiglu_case(MS_WFMT_PLAIN, MS_BF16, T, 40, 136);
        swiglu_case(MS_WFMT_PLAIN, MS_BF16, T, 80, 112);
        swiglu_case(MS_WFMT_PLAIN, MS_BF16, T, 208, 112);
    }
    env_pop("MS_CU_BF16_STREAM_MAX_T", saved);
    CHECK_MSG(ms_cuda_gvb_launches() - n0 == 17, "fused gate/up at 1..4 rows: streaming form ran %lld of 17 times",
              ms_cuda_gvb_launches() - n0);
}
#endif

#ifdef MS_HAVE_CUDA
/* The streaming GEMV's tensor-core step (k_gvb's TC form, MS_CU_BF16_STREAM_MMA=1; gemv_tc.cuh): the same
 * shapes as test_linear_bf16_stream against the CPU and against the CUDA-core step (the knob at 0), F32
 * within 1e-4 of the largest output, bf16 within 1e-2. It runs at 1..3 rows of x in a linear and 1..2 in
 * fused gate/up (more would spill its accumulators: the CUDA-core step takes those), and with the norm
 * folded in. x spanning 2^-20 .. 2^10 (the tensor core's fp32 sums of products of mixed magnitudes)
 * within 1e-3; a NaN in one row of x makes that row NaN and leaves the others right; with the NaN first
 * in the last row and K / 8 not a multiple of 32, the lanes past the end of the row before it would
 * meet it were there no zero padding after each row of x in shared memory. The host emulation (test_gemv_tc_emu) checks the
 * placement of the operands on the fragments against a float64 reference. */
static const form_knob GVB_TC_FORM = {"MS_CU_BF16_STREAM_MMA", "1", "0", "tensor-core streaming bf16 GEMV",
                                      ms_cuda_gvb_tc_launches};

static void bf16_mma_case(int64_t T, int64_t N, int64_t K, int bias, ms_dtype ydt, int wide, int nan) {
    form_linear_case(&GVB_TC_FORM, MS_WFMT_PLAIN, T, N, K, bias, ydt, wide, nan, T <= 3,
                     wide ? 1e-3 : ydt == MS_F32 ? 1e-4 : 1e-2);
}

static void norm_linear_case(int64_t N, int64_t K, int bias, ms_dtype ydt, int want);

static void test_linear_bf16_mma(void) {
    char *smax = env_push("MS_CU_BF16_STREAM_MAX_T", "4");
    for (int64_t T = 1; T <= 4; T++) {
        bf16_mma_case(T, 1, 8, 1, MS_F32, 0, 0);
        bf16_mma_case(T, 7, 24, 0, MS_BF16, 0, 0);
        bf16_mma_case(T, 70, 3112, T & 1, MS_F32, 0, 0);
        bf16_mma_case(T, 40, 12288, 0, MS_F32, 0, 0);
        bf16_mma_case(T, 1000, 4096, 1, T & 1 ? MS_BF16 : MS_F32, 0, 0);
        bf16_mma_case(T, 300, 4104, 0, MS_F32, 1, 0);
        bf16_mma_case(T, 300, 1000, 1, MS_F32, 0, T > 1);
        if (T > 1) bf16_mma_case(T, 300, 808, 0, MS_F32, 0, 2);
    }
    static const int64_t odd[][2] = {{168, 136}, {136, 120}, {40, 136}, {97, 136}, {192, 112}, {256, 48}, {384, 80},
                                     {112, 192}, {8, 112}, {97, 112}};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++)
        for (int64_t T = 1; T <= 3; T++) bf16_mma_case(T, odd[i][0], odd[i][1], (int)(i & 1), i & 2 ? MS_BF16 : MS_F32, 0, 0);
    bf16_mma_case(1, 33, 40000, 1, MS_F32, 0, 0);
    bf16_mma_case(1, 20000, 512, 0, MS_F32, 0, 0);
    bf16_mma_case(1, 14336, 4096, 1, MS_BF16, 0, 0); /* GLM-4.5-Air's q|k|v and o_proj */
    bf16_mma_case(1, 4096, 12288, 0, MS_BF16, 0, 0);
    /* fused gate/up: swiglu_case's checks, counted */
    char *tc = env_push("MS_CU_BF16_STREAM_MMA", "1");
    const long long n0 = ms_cuda_gvb_tc_launches();
    for (int64_t T = 1; T <= 4; T++) swiglu_case(MS_WFMT_PLAIN, MS_BF16, T, 72, 3112);
    swiglu_case(MS_WFMT_PLAIN, MS_BF16, 1, 1500, 6144);
    swiglu_case(MS_WFMT_PLAIN, MS_BF16, 2, 80, 112);
    CHECK_MSG(ms_cuda_gvb_tc_launches() - n0 == 4, "fused gate/up at 1..2 rows: tensor-core step ran %lld of 4 times",
              ms_cuda_gvb_tc_launches() - n0);
    /* the folded norm's instance (norm_linear_case: two calls each) */
    char *fold = env_push("MS_CU_NORM_FOLD", "1");
    const long long n1 = ms_cuda_gvb_tc_launches();
    norm_linear_case(14336, 4096, 1, MS_BF16, 1);
    norm_linear_case(97, 112, 0, MS_F32, 1);
    norm_linear_case(300, 8192, 0, MS_F32, 1);
    CHECK_MSG(ms_cuda_gvb_tc_launches() - n1 == 6, "norm_linear: tensor-core step ran %lld of 6 times",
              ms_cuda_gvb_tc_launches() - n1);
    env_pop("MS_CU_NORM_FOLD", fold);
    env_pop("MS_CU_BF16_STREAM_MMA", tc);
    env_pop("MS_CU_BF16_STREAM_MAX_T", smax);
}

#endif

#ifdef MS_HAVE_CUDA
/* The streaming GEMV's claiming form (k_gvd, MS_CU_BF16_STREAM_DYN): the same bits as the fixed form at
 * the same K split, whatever share of the work is static (1, 50, 95 percent) and however the claims
 * fall, launch after launch: every claiming launch writes into a fresh NaN-filled output, and the inputs
 * alternate between two rows sets, so a row left unwritten (a count not back at zero) or a stale partial
 * shows. Every split the shape allows is forced in both (MS_CU_BF16_STREAM_KS); mode 0 (linear) and
 * mode 1 (fused gate/up). Then the usual cases (form_linear_case: against the CPU and the fixed form
 * within tolerance) and swiglu_case, each counted as the claiming form. */
static int gvd_split_ok(int64_t K, int ks) { /* gemv_walk.cuh gd_split_ok */
    const int64_t K8 = K / 8, kc = ((K8 + ks - 1) / ks + 31) / 32 * 32;
    return ks == 1 || (kc >= 64 && kc * (ks - 1) < K8);
}

/* mode 0: y = linear(L0, x), ydt; mode 1: linear_swiglu(L0, L1, x) (bf16) */
static void gvd_run(int mode, lpair *L0, lpair *L1, pair *X, ms_tensor *Y) {
    if (mode == 0) R(GPU->ops->linear(GPU, &L0->g, &X->g, Y, &E));
    else R(GPU->ops->linear_swiglu(GPU, &L0->g, &L1->g, &X->g, Y, &E));
}

static void gvd_exact_case(int mode, int64_t T, int64_t N, int64_t K, int bias, ms_dtype ydt) {
    lpair L0 = mk_linear(MS_WFMT_PLAIN, MS_BF16, N, K, mode == 0 && bias), L1 = {0};
    if (mode == 1) L1 = mk_linear(MS_WFMT_PLAIN, MS_BF16, N, K, 0);
    int64_t xs[2] = {T, K}, ys[2] = {T, N};
    float *xh[2] = {rand_vec((size_t)(T * K), 1.f), rand_vec((size_t)(T * K), 1.f)};
    pair X[2] = {act(2, xs, xh[0]), act(2, xs, xh[1])};
    const ms_dtype gdt = mode == 0 && ydt == MS_F32 ? MS_F32 : 0;
    char *smax = env_push("MS_CU_BF16_STREAM_MAX_T", "4"), *sks = env_push("MS_CU_BF16_STREAM_KS", NULL),
         *sdyn = env_push("MS_CU_BF16_STREAM_DYN", NULL);
    static const char *const pcts[] = {"1", "50", "95", "50"};
    for (int ks = 1; ks <= 8; ks *= 2) {
        if (!gvd_split_ok(K, ks)) continue;
        char kv[8];
        snprintf(kv, sizeof kv, "%d", ks);
        setenv("MS_CU_BF16_STREAM_KS", kv, 1);
        float *ref[2];
        for (int i = 0; i < 2; i++) {
            setenv("MS_CU_BF16_STREAM_DYN", "0", 1);
            ms_tensor Y0 = mk(GPU, gdt, 2, ys, NULL);
            const long long f0 = ms_cuda_gvb_launches();
            gvd_run(mode, &L0, &L1, &X[i], &Y0);
            CHECK_MSG(ms_cuda_gvb_launches() - f0 == 1, "bf16 GEMV mode %d T=%lld N=%lld K=%lld ks=%d: the fixed form did not run",
                      mode, (long long)T, (long long)N, (long long)K, ks);
            ref[i] = get(GPU, &Y0);
            fr(GPU, &Y0);
        }
        for (size_t p = 0; p < sizeof pcts / sizeof pcts[0]; p++) {
            const int xi = (int)(p & 1);
            setenv("MS_CU_BF16_STREAM_DYN", pcts[p], 1);
            ms_tensor Y1 = mk(GPU, gdt, 2, ys, NULL); /* NaN until written */
            const long long d0 = ms_cuda_gvd_launches();
            gvd_run(mode, &L0, &L1, &X[xi], &Y1);
            CHECK_MSG(ms_cuda_gvd_launches() - d0 == 1, "bf16 GEMV mode %d T=%lld N=%lld K=%lld ks=%d dyn=%s: the claiming form did not run",
                      mode, (long long)T, (long long)N, (long long)K, ks, pcts[p]);
            float *got = get(GPU, &Y1);
            int64_t diff = 0, first = -1;
            for (int64_t i = 0; i < T * N; i++)
                if (memcmp(&got[i], &ref[xi][i], sizeof(float))) diff++, first = first < 0 ? i : first;
            CHECK_MSG(diff == 0, "bf16 GEMV mode %d T=%lld N=%lld K=%lld ks=%d dyn=%s: %lld of %lld outputs differ from the fixed "
                      "form's bits (first %lld: %g vs %g)", mode, (long long)T, (long long)N, (long long)K, ks, pcts[p],
                      (long long)diff, (long long)(T * N), (long long)first, first >= 0 ? got[first] : 0.0,
                      first >= 0 ? ref[xi][first] : 0.0);
            free(got);
            fr(GPU, &Y1);
        }
        free(ref[0]);
        free(ref[1]);
    }
    env_pop("MS_CU_BF16_STREAM_DYN", sdyn);
    env_pop("MS_CU_BF16_STREAM_KS", sks);
    env_pop("MS_CU_BF16_STREAM_MAX_T", smax);
    for (int i = 0; i < 2; i++) pfree(&X[i]), free(xh[i]);
    free_linear(&L0);
    if (mode == 1) free_linear(&L1);
}

static const form_knob GVD_FORM = {"MS_CU_BF16_STREAM_DYN", "80", "0", "claiming bf16 GEMV", ms_cuda_gvd_launches};


/* MS_CU_BF16_STREAM_EARLY (read once: forgotten around each change) */
static char *gvd_early_push(const char *v) {
    char *saved = env_push("MS_CU_BF16_STREAM_EARLY", v);
    cu_knob_forget(CU_KNOB_BF16_STREAM_EARLY);
    return saved;
}
static void gvd_early_pop(char *saved) {
    env_pop("MS_CU_BF16_STREAM_EARLY", saved);
    cu_knob_forget(CU_KNOB_BF16_STREAM_EARLY);
}

/* The fixed form's L2 prefetch before the PDL wait (MS_CU_BF16_STREAM_L2PF, at K >= _MINK): a hint, so
 * the same bits as without it, for any step count (past a warp's last step, across its rows' ends, with K
 * shares whose last run is partial) and launch after launch (the inputs alternate between two rows of x,
 * each output fresh and NaN-filled); so do the rings of 12 stages (MS_CU_BF16_STREAM_DEEPK, one row of x, mode
 * 0). Each prefetching and each deep launch is counted; at K below _MINK there are none. */
static void gvb_l2pf_case(int mode, int64_t T, int64_t N, int64_t K, int64_t mink, int want) {
    lpair L0 = mk_linear(MS_WFMT_PLAIN, MS_BF16, N, K, mode == 0), L1 = {0};
    if (mode == 1) L1 = mk_linear(MS_WFMT_PLAIN, MS_BF16, N, K, 0);
    int64_t xs[2] = {T, K}, ys[2] = {T, N};
    float *xh[2] = {rand_vec((size_t)(T * K), 1.f), rand_vec((size_t)(T * K), 1.f)};
    pair X[2] = {act(2, xs, xh[0]), act(2, xs, xh[1])};
    const ms_dtype gdt = mode == 0 ? MS_F32 : 0;
    char mink_s[24];
    snprintf(mink_s, sizeof mink_s, "%lld", (long long)mink);
    char *smax = env_push("MS_CU_BF16_STREAM_MAX_T", "4"), *spf = env_push("MS_CU_BF16_STREAM_L2PF", "0"),
         *smk = env_push("MS_CU_BF16_STREAM_L2PF_MINK", mink_s), *sdeep = env_push("MS_CU_BF16_STREAM_DEEPK", "0");
    float *ref[2];
    for (int i = 0; i < 2; i++) {
        ms_tensor Y0 = mk(GPU, gdt, 2, ys, NULL);
        gvd_run(mode, &L0, &L1, &X[i], &Y0);
        ref[i] = get(GPU, &Y0);
        fr(GPU, &Y0);
    }
    static const char *const steps[] = {"1", "7", "64", "256", "30", "0", "16"};
    for (size_t p = 0; p < sizeof steps / sizeof steps[0]; p++) {
        const int xi = (int)(p & 1), deep = p >= 5; /* the last two through rings of 12 stages where they apply */
        setenv("MS_CU_BF16_STREAM_L2PF", steps[p], 1);
        setenv("MS_CU_BF16_STREAM_DEEPK", deep ? "12" : "0", 1);
        const int want_pf = strcmp(steps[p], "0") ? want : 0, want_deep = deep && want && mode == 0 && T == 1;
        const long long q0 = ms_cuda_gvb_deep_launches();
        R(GPU->ops->sync(GPU, &E)); /* the weights are quiet: the early copies (and the prefetch) are on */
        ms_tensor Y1 = mk(GPU, gdt, 2, ys, NULL);
        const long long f0 = ms_cuda_gvb_launches(), p0 = ms_cuda_gvb_l2pf_launches();
        gvd_run(mode, &L0, &L1, &X[xi], &Y1);
        CHECK_MSG(ms_cuda_gvb_launches() - f0 == 1 && ms_cuda_gvb_l2pf_launches() - p0 == want_pf &&
                      ms_cuda_gvb_deep_launches() - q0 == want_deep,
                  "bf16 GEMV L2 prefetch mode %d T=%lld N=%lld K=%lld steps %s deep %d: %lld fixed-form launches, %lld "
                  "prefetching, %lld deep (want 1, %d, %d)", mode, (long long)T, (long long)N, (long long)K, steps[p], deep,
                  ms_cuda_gvb_launches() - f0, ms_cuda_gvb_l2pf_launches() - p0, ms_cuda_gvb_deep_launches() - q0,
                  want_pf, want_deep);
        float *got = get(GPU, &Y1);
        int64_t diff = 0;
        for (int64_t i = 0; i < T * N; i++) diff += memcmp(&got[i], &ref[xi][i], sizeof(float)) != 0;
        CHECK_MSG(diff == 0, "bf16 GEMV L2 prefetch mode %d T=%lld N=%lld K=%lld steps %s: %lld of %lld outputs differ",
                  mode, (long long)T, (long long)N, (long long)K, steps[p], (long long)diff, (long long)(T * N));
        free(got);
        fr(GPU, &Y1);
    }
    env_pop("MS_CU_BF16_STREAM_DEEPK", sdeep);
    env_pop("MS_CU_BF16_STREAM_L2PF_MINK", smk);
    env_pop("MS_CU_BF16_STREAM_L2PF", spf);
    env_pop("MS_CU_BF16_STREAM_MAX_T", smax);
    for (int i = 0; i < 2; i++) free(ref[i]), pfree(&X[i]), free(xh[i]);
    free_linear(&L0);
    if (mode == 1) free_linear(&L1);
}

static void test_linear_bf16_l2pf(void) {
    char *early = gvd_early_push("1");
    gvb_l2pf_case(0, 1, 4096, 12288, 8192, 1); /* Air's o_proj */
    gvb_l2pf_case(0, 1, 6144, 16384, 8192, 1); /* GLM-5's */
    gvb_l2pf_case(0, 1, 14336, 4096, 8192, 0); /* Air's q|k|v: below the threshold */
    gvb_l2pf_case(0, 2, 97, 8200, 0, 1);       /* K / 8 = 1025: a partial last run in every share */
    gvb_l2pf_case(0, 1, 40, 12288, 0, 1);      /* few rows: warps with none */
    gvb_l2pf_case(0, 3, 300, 1000, 0, 1);
    gvb_l2pf_case(0, 1, 7, 24, 0, 1);          /* one run a row: the prefetch crosses rows at every step */
    gvb_l2pf_case(1, 1, 1500, 8192, 0, 1);     /* fused gate/up: both streams */
    gvb_l2pf_case(1, 2, 80, 112, 0, 1);
    gvd_early_pop(early);
}

static void test_linear_bf16_dyn(void) {
    /* shapes with different row counts and splits one after another: each leaves the counters for the
     * next. With copies before the wait (the test's weights are placed), only shapes with enough work
     * for every warp to hold them take the claiming form */
    char *early = gvd_early_push("1");
    gvd_exact_case(0, 1, 14336, 4096, 0, MS_BF16); /* GLM-4.5-Air's q|k|v: 1, 2, 4, 8 shares */
    gvd_exact_case(0, 1, 4096, 12288, 0, MS_F32);  /* its o_proj: static ranges inside rows */
    gvd_exact_case(0, 2, 20000, 512, 1, MS_F32);   /* short rows: a static range of several */
    gvd_exact_case(1, 2, 4000, 2048, 0, MS_BF16);  /* fused gate/up, static rows of 2 and 4 shares */
    gvd_exact_case(0, 4, 9000, 2048, 1, MS_F32);
    gvd_early_pop(early);
    /* nothing copied before the wait: every shape, the fully claimed ones too */
    early = gvd_early_push("0");
    gvd_exact_case(0, 1, 14336, 4096, 0, MS_BF16);
    gvd_exact_case(0, 3, 1000, 3112, 1, MS_F32); /* the last of 4 shares is 5 chunks (one short step) */
    gvd_exact_case(0, 2, 70, 256, 1, MS_BF16);   /* fewer units than warps: everything claimed */
    gvd_exact_case(0, 1, 33, 40000, 1, MS_F32);
    gvd_exact_case(0, 4, 300, 4104, 0, MS_F32);
    gvd_exact_case(1, 1, 1500, 6144, 0, MS_BF16); /* fused gate/up (a dense MLP at decode) */
    gvd_exact_case(1, 3, 208, 3112, 0, MS_BF16);
    gvd_early_pop(early);
    /* with copies before the wait, a shape too small for every warp to hold them stays with the fixed form */
    early = gvd_early_push("1");
    {
        char *smax = env_push("MS_CU_BF16_STREAM_MAX_T", "4"), *dyn = env_push("MS_CU_BF16_STREAM_DYN", "80");
        const long long d0 = ms_cuda_gvd_launches(), f0 = ms_cuda_gvb_launches();
        bf16_stream_case(1, 300, 4104, 0, MS_F32, 0);
        CHECK_MSG(ms_cuda_gvd_launches() == d0 && ms_cuda_gvb_launches() > f0,
                  "300 rows with early copies: claiming form ran %lld times, fixed form %lld", ms_cuda_gvd_launches() - d0,
                  ms_cuda_gvb_launches() - f0);
        env_pop("MS_CU_BF16_STREAM_DYN", dyn);
        env_pop("MS_CU_BF16_STREAM_MAX_T", smax);
    }
    gvd_early_pop(early);
    early = gvd_early_push("0");
    char *smax = env_push("MS_CU_BF16_STREAM_MAX_T", "4");
    for (int64_t T = 1; T <= 4; T++) {
        form_linear_case(&GVD_FORM, MS_WFMT_PLAIN, T, 1, 8, 1, MS_F32, 0, 0, 1, 1e-4);
        form_linear_case(&GVD_FORM, MS_WFMT_PLAIN, T, 1000, 4096, 1, T & 1 ? MS_BF16 : MS_F32, 0, 0, 1,
                         T & 1 ? 1e-2 : 1e-4);
        form_linear_case(&GVD_FORM, MS_WFMT_PLAIN, T, 300, 4104, T & 1, MS_F32, 0, T == 3, 1, 1e-4);
    }
    form_linear_case(&GVD_FORM, MS_WFMT_PLAIN, 5, 70, 256, 0, MS_F32, 0, 0, 0, 1e-4); /* beyond the form */
    char *dyn = env_push("MS_CU_BF16_STREAM_DYN", "80");
    const long long n0 = ms_cuda_gvd_launches();
    for (int64_t T = 1; T <= 4; T++) swiglu_case(MS_WFMT_PLAIN, MS_BF16, T, 72, 3112);
    swiglu_case(MS_WFMT_PLAIN, MS_BF16, 1, 1500, 6144);
    env_pop("MS_CU_BF16_STREAM_DYN", dyn);
    env_pop("MS_CU_BF16_STREAM_MAX_T", smax);
    gvd_early_pop(early);
    CHECK_MSG(ms_cuda_gvd_launches() - n0 == 5, "fused gate/up at 1..4 rows: claiming form ran %lld of 5 times",
              ms_cuda_gvd_launches() - n0);
}
#endif

/* The fused gate/up op (shared experts, dense MLP at decode) against the CPU's two linears and
 * silu_mul; shapes it refuses must say MS_ERR_UNSUPPORTED (the forward then runs the three ops). */
static void swiglu_case(ms_wfmt fmt, ms_dtype pdt, int64_t T, int64_t N, int64_t K) {
    lpair G = mk_linear(fmt, pdt, N, K, 0), U = mk_linear(fmt, pdt, N, K, 0);
    int64_t xs[2] = {T, K}, ys[2] = {T, N};
    float *x = rand_vec((size_t)(T * K), 1.f);
    pair X = act(2, xs, x);
    pair Y = {mk(GPU, 0, 2, ys, NULL), mk(CPU, 0, 2, ys, NULL)};
    pair Y2 = {mk(GPU, 0, 2, ys, NULL), mk(CPU, 0, 2, ys, NULL)};
    int rc = GPU->ops->linear_swiglu(GPU, &G.g, &U.g, &X.g, &Y.g, &E);
    CHECK_MSG(rc == MS_OK || rc == MS_ERR_UNSUPPORTED, "linear_swiglu rc %d: %s", rc, E.msg);
    if (rc == MS_OK) {
        R(CPU->ops->linear(CPU, &G.c, &X.c, &Y.c, &E));
        R(CPU->ops->linear(CPU, &U.c, &X.c, &Y2.c, &E));
        R(CPU->ops->silu_mul(CPU, &Y.c, &Y2.c, &Y.c, &E));
        float *a = get(GPU, &Y.g), *r = get(CPU, &Y.c);
        double e = rel_err(a, r, (size_t)(T * N));
        CHECK_MSG(e <= 2e-2, "linear_swiglu %s T=%lld N=%lld K=%lld: rel err %.3g", ms_wfmt_name(fmt, pdt), (long long)T,
                  (long long)N, (long long)K, e);
        free(a);
        free(r);
    }
    pfree(&X);
    pfree(&Y);
    pfree(&Y2);
    free(x);
    free_linear(&G);
    free_linear(&U);
}

static void test_linear_swiglu(void) {
    const int64_t Ts[4] = {1, 3, 9, 16};
    int ran = 0;
    for (int i = 0; i < 4; i++) {
        swiglu_case(MS_WFMT_NVFP4, 0, Ts[i], 136, 512);
        swiglu_case(MS_WFMT_FP8, 0, Ts[i], 200, 1552);
        swiglu_case(MS_WFMT_PLAIN, MS_BF16, Ts[i], 72, 3112);
        ran++;
    }
    swiglu_case(MS_WFMT_NVFP4, 0, 40, 64, 256); /* beyond 16 rows: refused, not wrong */
    CHECK(ran == 4);
}

/* ---- attention ---- */

/* Two sequences: seq 0 has 5 cached tokens and 4 new (prefill chunk); seq 1 decodes its 14th token. */
typedef struct {
    ms_batch bt;
    int32_t tok[5], pos[5], seq_start[3], ctx[2], slot[5], table[2 * 4], tseq[5];
    ms_tensor g_arr[6], c_arr[6];
    ms_attn_meta mg, mc;
} abatch;

static void make_batch(abatch *A, int page) {
    memset(A, 0, sizeof *A);
    /* pages: seq0 -> 5, 2, 7 ; seq1 -> 1, 6, 0, 3 */
    int32_t tbl[8] = {5, 2, 7, 4, 1, 6, 0, 3};
    memcpy(A->table, tbl, sizeof tbl);
    A->pos[0] = 5; A->pos[1] = 6; A->pos[2] = 7; A->pos[3] = 8; A->pos[4] = 13;
    A->seq_start[0] = 0; A->seq_start[1] = 4; A->seq_start[2] = 5;
    A->ctx[0] = 9; A->ctx[1] = 14;
    for (int t = 0; t < 5; t++) {
        int s = t < 4 ? 0 : 1;
        A->tseq[t] = s;
        A->slot[t] = A->table[s * 4 + A->pos[t] / page] * page + A->pos[t] % page;
        A->tok[t] = t;
    }
    A->bt.n_tokens = 5;
    A->bt.n_seqs = 2;
    A->bt.token_ids = A->tok;
    A->bt.positions = A->pos;
    A->bt.seq_start = A->seq_start;
    A->bt.ctx_len = A->ctx;
    A->bt.slot_mapping = A->slot;
    A->bt.block_table = A->table;
    A->bt.max_blocks = 4;
    A->bt.page_size = page;
    const int32_t *src[6] = {A->pos, A->seq_start, A->ctx, A->slot, A->table, A->tseq};
    int64_t n[6] = {5, 3, 2, 5, 8, 5};
    for (int i = 0; i < 6; i++) {
        A->g_arr[i] = mk_i32(GPU, n[i], src[i]);
        A->c_arr[i] = mk_i32(CPU, n[i], src[i]);
    }
    ms_attn_meta *ms[2] = {&A->mg, &A->mc};
    ms_tensor *arr[2] = {A->g_arr, A->c_arr};
    for (int k = 0; k < 2; k++) {
        ms[k]->host = &A->bt;
        ms[k]->max_ctx = 14;
        ms[k]->positions_d = arr[k][0].data;
        ms[k]->seq_start_d = arr[k][1].data;
        ms[k]->ctx_len_d = arr[k][2].data;
        ms[k]->slot_mapping_d = arr[k][3].data;
        ms[k]->block_table_d = arr[k][4].data;
        ms[k]->token_seq_d = arr[k][5].data;
    }
}

static void free_batch(abatch *A) {
    for (int i = 0; i < 6; i++) { fr(GPU, &A->g_arr[i]); fr(CPU, &A->c_arr[i]); }
}

static void gqa_case(int nh, int nkv, int d) {
    abatch A;
    int page = 4, S = 8 * page;
    make_batch(&A, page);
    int64_t cs[3] = {S, nkv, d}, qs[3] = {5, nh, d}, ks[2] = {5, (int64_t)nkv * d};
    float *kc = rand_vec((size_t)S * nkv * d, 1.f), *vc = rand_vec((size_t)S * nkv * d, 1.f);
    float *q = rand_vec((size_t)5 * nh * d, 1.f), *kn = rand_vec((size_t)5 * nkv * d, 1.f),
          *vn = rand_vec((size_t)5 * nkv * d, 1.f);
    pair K = act(3, cs, kc), V = act(3, cs, vc), Q = act(3, qs, q), KN = act(2, ks, kn), VN = act(2, ks, vn);
    pair O = out_act(3, qs);
    R(GPU->ops->kv_store(GPU, &K.g, &KN.g, A.mg.slot_mapping_d, &E));
    R(GPU->ops->kv_store(GPU, &V.g, &VN.g, A.mg.slot_mapping_d, &E));
    R(CPU->ops->kv_store(CPU, &K.c, &KN.c, A.mc.slot_mapping_d, &E));
    R(CPU->ops->kv_store(CPU, &V.c, &VN.c, A.mc.slot_mapping_d, &E));
    CMP(K.g, K.c, 1e-6);
    float sc = 1.f / sqrtf((float)d);
    R(GPU->ops->attn_gqa(GPU, &Q.g, &K.g, &V.g, &A.mg, sc, &O.g, &E));
    R(CPU->ops->attn_gqa(CPU, &Q.c, &K.c, &V.c, &A.mc, sc, &O.c, &E));
    CMP(O.g, O.c, 2e-2);
    pfree(&K); pfree(&V); pfree(&Q); pfree(&KN); pfree(&VN); pfree(&O);
    free(kc); free(vc); free(q); free(kn); free(vn);
    free_batch(&A);
}

static void test_attn_gqa(void) {
    gqa_case(4, 2, 64);
    gqa_case(6, 1, 40);
    gqa_case(12, 2, 128);
    gqa_case(3, 3, 16);
}

/* A batch of any shape for the larger attention cases: sequence i has nnew[i] new tokens at the end
 * of a context of ctx[i] tokens. Pages come from a shuffled list of all pages, so neighbouring
 * pages of a sequence lie far apart in the cache; each block-table row has one spare entry of -1
 * (a kernel that read it would fault). */
typedef struct {
    ms_batch bt;
    int32_t *tok, *pos, *seq_start, *ctx, *slot, *table, *tseq;
    int n_slots;
    ms_tensor g_arr[6], c_arr[6];
    ms_attn_meta mg, mc;
} gbatch;

static void make_gbatch(gbatch *B, int n_seqs, const int *nnew, const int *ctx, int page) {
    memset(B, 0, sizeof *B);
    int T = 0, n_pages = 0, mb = 0, max_ctx = 1;
    for (int s = 0; s < n_seqs; s++) {
        int np = (ctx[s] + page - 1) / page;
        T += nnew[s];
        n_pages += np;
        if (np > mb) mb = np;
        if (ctx[s] > max_ctx) max_ctx = ctx[s];
    }
    mb += 1;
    int32_t *perm = malloc((size_t)n_pages * 4);
    for (int i = 0; i < n_pages; i++) perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        int j = (int)(rnd_u32() % (uint32_t)(i + 1)), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    B->tok = malloc((size_t)T * 4);
    B->pos = malloc((size_t)T * 4);
    B->slot = malloc((size_t)T * 4);
    B->tseq = malloc((size_t)T * 4);
    B->seq_start = malloc((size_t)(n_seqs + 1) * 4);
    B->ctx = malloc((size_t)n_seqs * 4);
    B->table = malloc((size_t)n_seqs * mb * 4);
    int t = 0, pg = 0;
    for (int s = 0; s < n_seqs; s++) {
        int np = (ctx[s] + page - 1) / page;
        B->seq_start[s] = t;
        B->ctx[s] = ctx[s];
        for (int k = 0; k < mb; k++) B->table[s * mb + k] = k < np ? perm[pg++] : -1;
        for (int j = 0; j < nnew[s]; j++, t++) {
            int p = ctx[s] - nnew[s] + j;
            B->tok[t] = t;
            B->pos[t] = p;
            B->tseq[t] = s;
            B->slot[t] = B->table[s * mb + p / page] * page + p % page;
        }
    }
    B->seq_start[n_seqs] = T;
    free(perm);
    B->n_slots = n_pages * page;
    B->bt.n_tokens = T;
    B->bt.n_seqs = n_seqs;
    B->bt.token_ids = B->tok;
    B->bt.positions = B->pos;
    B->bt.seq_start = B->seq_start;
    B->bt.ctx_len = B->ctx;
    B->bt.slot_mapping = B->slot;
    B->bt.block_table = B->table;
    B->bt.max_blocks = mb;
    B->bt.page_size = page;
    const int32_t *src[6] = {B->pos, B->seq_start, B->ctx, B->slot, B->table, B->tseq};
    int64_t n[6] = {T, n_seqs + 1, n_seqs, T, (int64_t)n_seqs * mb, T};
    for (int i = 0; i < 6; i++) {
        B->g_arr[i] = mk_i32(GPU, n[i], src[i]);
        B->c_arr[i] = mk_i32(CPU, n[i], src[i]);
    }
    ms_attn_meta *ms[2] = {&B->mg, &B->mc};
    ms_tensor *arr[2] = {B->g_arr, B->c_arr};
    for (int k = 0; k < 2; k++) {
        ms[k]->host = &B->bt;
        ms[k]->max_ctx = max_ctx;
        ms[k]->positions_d = arr[k][0].data;
        ms[k]->seq_start_d = arr[k][1].data;
        ms[k]->ctx_len_d = arr[k][2].data;
        ms[k]->slot_mapping_d = arr[k][3].data;
        ms[k]->block_table_d = arr[k][4].data;
        ms[k]->token_seq_d = arr[k][5].data;
    }
}

static void free_gbatch(gbatch *B) {
    for (int i = 0; i < 6; i++) { fr(GPU, &B->g_arr[i]); fr(CPU, &B->c_arr[i]); }
    free(B->tok); free(B->pos); free(B->slot); free(B->tseq); free(B->seq_start); free(B->ctx); free(B->table);
}

/* Attention outputs compared row by row (a row = one token's head): max |a-r| over the row divided
 * by the row's max |r| (at least 0.1), so one row with a wrong mask is not hidden among thousands. */
static double row_err(const float *a, const float *r, size_t rows, int d) {
    double worst = 0;
    for (size_t i = 0; i < rows; i++) {
        double md = 0, mr = 0.1;
        for (int c = 0; c < d; c++) {
            double x = a[i * d + c], y = r[i * d + c];
            if (!isfinite(x) || !isfinite(y)) return INFINITY;
            if (fabs(x - y) > md) md = fabs(x - y);
            if (fabs(y) > mr) mr = fabs(y);
        }
        if (md / mr > worst) worst = md / mr;
    }
    return worst;
}

/* GQA over a gbatch, GPU against the CPU, in three modes: default (tensor-core kernel with split-K
 * where the grid is small), split-K off, and the generic kernel (MS_ATTN_NO_MMA). Queries are scaled
 * so scores spread over several units: softmax is peaked, and a key let through (or masked) by
 * mistake moves its row well past the tolerance. */
static void gqa_batch_case(const char *name, int nh, int nkv, int d, int page, int n_seqs, const int *nnew,
                           const int *ctx) {
    gbatch B;
    make_gbatch(&B, n_seqs, nnew, ctx, page);
    const int T = B.bt.n_tokens, S = B.n_slots;
    int64_t cs[3] = {S, nkv, d}, qs[3] = {T, nh, d};
    float *kc = rand_vec((size_t)S * nkv * d, 1.f), *vc = rand_vec((size_t)S * nkv * d, 1.f);
    float *q = rand_vec((size_t)T * nh * d, 8.f);
    pair K = act(3, cs, kc), V = act(3, cs, vc), Q = act(3, qs, q);
    ms_tensor oc = mk(CPU, 0, 3, qs, NULL);
    const float sc = 1.f / sqrtf((float)d);
    R(CPU->ops->attn_gqa(CPU, &Q.c, &K.c, &V.c, &B.mc, sc, &oc, &E));
    float *ref = get(CPU, &oc);
    static const char *modes[3] = {NULL, "MS_ATTN_NO_SPLIT", "MS_ATTN_NO_MMA"};
    for (int mo = 0; mo < 3; mo++) {
        if (modes[mo]) setenv(modes[mo], "1", 1);
        ms_tensor og = mk(GPU, 0, 3, qs, NULL); /* NaN-poisoned */
        R(GPU->ops->attn_gqa(GPU, &Q.g, &K.g, &V.g, &B.mg, sc, &og, &E));
        if (modes[mo]) unsetenv(modes[mo]);
        float *a = get(GPU, &og);
        double e = row_err(a, ref, (size_t)T * nh, d);
        CHECK_MSG(e <= 2e-2, "%s nh=%d nkv=%d d=%d page=%d (%s): row rel err %.3g", name, nh, nkv, d, page,
                  modes[mo] ? modes[mo] : "default", e);
        free(a);
        fr(GPU, &og);
    }
    free(ref);
    fr(CPU, &oc);
    pfree(&K); pfree(&V); pfree(&Q);
    free(kc); free(vc); free(q);
    free_gbatch(&B);
}

/* Runs implementation r on call c into a fresh NaN-poisoned output and checks it row by row against the
 * CPU reference ref [rows, dv] (what: a label for the failure message). */
static void run_vs_ref(const ms_attn_impl *r, const ms_attn_call *c, const float *ref, size_t rows, int dv,
                       const char *name, const char *what) {
    ms_tensor og = mk(GPU, 0, c->out->ndim, c->out->shape, NULL); /* NaN-poisoned */
    ms_attn_call cg = *c;
    cg.out = &og;
    R(ms_attn_run(r, GPU, &cg, &E));
    float *a = get(GPU, &og);
    double e = row_err(a, ref, rows, dv);
    CHECK_MSG(e <= 2e-2, "%s (%s): row rel err %.3g", name, what, e);
    free(a);
    fr(GPU, &og);
}

/* Every CUDA attention implementation (backend/attn.h) that supports the call's shape, run through
 * the registry and compared row by row with the CPU reference ref [rows, dv]; an implementation that
 * refuses must say why. Returns how many ran. */
static int impls_case(const char *name, const ms_attn_call *c, const ms_attn_shape *sh, const float *ref, size_t rows,
                      int dv) {
    int ran = 0;
    for (const ms_attn_impl *const *ip = ms_attn_impls(); *ip; ip++) {
        const ms_attn_impl *r = *ip;
        if (strcmp(r->backend, "cuda")) continue;
        char why[256] = "";
        if (!ms_attn_ok(r, GPU, sh, why, sizeof why)) {
            CHECK_MSG(why[0] != 0, "%s: %s refused without a reason", name, r->name);
            continue;
        }
        char label[128];
        snprintf(label, sizeof label, "attention implementation %s", r->name);
        run_vs_ref(r, c, ref, rows, dv, name, label);
        ran++;
    }
    return ran;
}

/* The tensor-core MLA kernel (implementation mma) forced to each block form, MS_CU_MLA_HEADS=64 and
 * =16 (by default cu_attn_mla_mma picks one by head count, so a case exercises only that one), against
 * the CPU reference ref [rows, dv]. Restores the caller's MS_CU_MLA_HEADS. Returns how many forms ran
 * (0 when mma does not cover the shape). */
static int mla_forms_case(const char *name, const ms_attn_call *c, const ms_attn_shape *sh, const float *ref,
                          size_t rows, int dv) {
    const ms_attn_impl *mma = NULL;
    for (const ms_attn_impl *const *ip = ms_attn_impls(); *ip; ip++)
        if (!strcmp((*ip)->backend, "cuda") && !strcmp((*ip)->name, "mma")) mma = *ip;
    char why[256] = "";
    if (!mma || !ms_attn_ok(mma, GPU, sh, why, sizeof why)) return 0;
    char *saved = env_push("MS_CU_MLA_HEADS", getenv("MS_CU_MLA_HEADS"));
    static const char *forms[2] = {"64", "16"};
    int ran = 0;
    for (int f = 0; f < 2; f++) {
        setenv("MS_CU_MLA_HEADS", forms[f], 1);
        char label[64];
        snprintf(label, sizeof label, "mma, MS_CU_MLA_HEADS=%s", forms[f]);
        run_vs_ref(mma, c, ref, rows, dv, name, label);
        ran++;
    }
    env_pop("MS_CU_MLA_HEADS", saved);
    return ran;
}

/* Absorbed MLA over a gbatch (long contexts, several sequences, mixed prefill and decode), dense or
 * restricted to random top-k lists (DSA), every CUDA implementation against the CPU, and the mma
 * kernel in both block forms (64 and 16 heads a block). */
static void mla_batch_case(const char *name, int nh, int kvl, int dr, int topk, int n_seqs, const int *nnew,
                           const int *ctx) {
    gbatch B;
    make_gbatch(&B, n_seqs, nnew, ctx, 16);
    const int T = B.bt.n_tokens, S = B.n_slots, D = kvl + dr;
    int64_t ls[2] = {S, D}, qs[3] = {T, nh, D}, os[3] = {T, nh, kvl};
    float *lat = rand_vec((size_t)S * D, 1.f), *q = rand_vec((size_t)T * nh * D, 0.25f);
    pair L = act(2, ls, lat), Q = act(3, qs, q);
    int32_t *tk = malloc(sizeof(int32_t) * (size_t)T * (topk > 0 ? topk : 1));
    for (int t = 0; t < T && topk > 0; t++) { /* distinct causal keys, then -1 */
        int n = B.pos[t] + 1, c = 0;
        for (int j = 0; j < n && c < topk; j++)
            if ((int)(rnd_u32() % (uint32_t)n) < topk || n - j <= topk - c) tk[t * topk + c++] = j;
        while (c < topk) tk[t * topk + c++] = -1;
    }
    ms_tensor tg = mk_i32(GPU, (int64_t)T * (topk > 0 ? topk : 1), tk), tc = mk_i32(CPU, (int64_t)T * (topk > 0 ? topk : 1), tk);
    ms_tensor oc = mk(CPU, 0, 3, os, NULL);
    const float sc = 1.f / sqrtf((float)D);
    R(CPU->ops->mla_attn(CPU, &Q.c, &L.c, &B.mc, topk > 0 ? tc.data : NULL, topk, kvl, sc, &oc, &E));
    float *ref = get(CPU, &oc);
    ms_attn_kind k = topk > 0 ? MS_ATTN_DSA : MS_ATTN_MLA;
    ms_attn_shape sh = {k, nh, 1, D, kvl, topk, T, B.mg.max_ctx, MS_BF16, 0};
    ms_tensor og0 = mk(GPU, 0, 3, os, NULL);
    ms_attn_call c = {k, &Q.g, &L.g, NULL, &B.mg, topk > 0 ? tg.data : NULL, topk, kvl, sc, &og0};
    int ran = impls_case(name, &c, &sh, ref, (size_t)T * nh, kvl);
    /* mma covers latent widths 64/128/512 (all the cases below but the odd one), flash, flash_nosplit
     * and ref every width */
    const int want = kvl == 64 || kvl == 128 || kvl == 512 ? 4 : 3;
    CHECK_MSG(ran >= want, "%s: only %d CUDA implementations ran (%d expected)", name, ran, want);
    const int forms = mla_forms_case(name, &c, &sh, ref, (size_t)T * nh, kvl);
    CHECK_MSG(forms == (want == 4 ? 2 : 0), "%s: the mma kernel ran in %d block forms", name, forms);
    fr(GPU, &og0);
    free(ref);
    fr(CPU, &oc);
    fr(GPU, &tg);
    fr(CPU, &tc);
    pfree(&L);
    pfree(&Q);
    free(lat);
    free(q);
    free(tk);
    free_gbatch(&B);
}

static void test_attn_impls(void) {
    { /* GQA through the registry: every implementation on the mixed batch, head dims 128, 64 and 96
       * (mma refuses 96 with a reason) */
        int nn[7] = {1, 37, 1, 1, 70, 1, 1}, cx[7] = {1, 250, 64, 65, 70, 129, 1000};
        const int dims[3] = {128, 64, 96};
        for (int i = 0; i < 3; i++) {
            gbatch B;
            make_gbatch(&B, 7, nn, cx, 16);
            const int T = B.bt.n_tokens, S = B.n_slots, nh = 32, nkv = 4, d = dims[i];
            int64_t cs[3] = {S, nkv, d}, qs[3] = {T, nh, d};
            float *kc = rand_vec((size_t)S * nkv * d, 1.f), *vc = rand_vec((size_t)S * nkv * d, 1.f);
            float *q = rand_vec((size_t)T * nh * d, 8.f);
            pair K = act(3, cs, kc), V = act(3, cs, vc), Q = act(3, qs, q);
            ms_tensor oc = mk(CPU, 0, 3, qs, NULL), og0 = mk(GPU, 0, 3, qs, NULL);
            const float sc = 1.f / sqrtf((float)d);
            R(CPU->ops->attn_gqa(CPU, &Q.c, &K.c, &V.c, &B.mc, sc, &oc, &E));
            float *ref = get(CPU, &oc);
            ms_attn_shape sh = {MS_ATTN_GQA, nh, nkv, d, d, 0, T, B.mg.max_ctx, MS_BF16, 0};
            ms_attn_call c = {MS_ATTN_GQA, &Q.g, &K.g, &V.g, &B.mg, NULL, 0, 0, sc, &og0};
            char nm[32];
            snprintf(nm, sizeof nm, "gqa d=%d", d);
            int ran = impls_case(nm, &c, &sh, ref, (size_t)T * nh, d);
            CHECK_MSG(ran >= (d == 96 ? 3 : 4), "%s: %d CUDA implementations ran", nm, ran);
            free(ref);
            fr(CPU, &oc);
            fr(GPU, &og0);
            pfree(&K); pfree(&V); pfree(&Q);
            free(kc); free(vc); free(q);
            free_gbatch(&B);
        }
    }
    { /* MLA dense and DSA (top-64 and top-300 of contexts up to 1000) */
        int nn[5] = {1, 40, 1, 1, 1}, cx[5] = {1000, 300, 64, 65, 7};
        mla_batch_case("mla dense", 16, 128, 32, 0, 5, nn, cx);
        mla_batch_case("dsa top-64", 16, 128, 32, 64, 5, nn, cx);
        mla_batch_case("dsa top-300", 8, 512, 64, 300, 5, nn, cx);
        int dn[4] = {1, 1, 1, 1}, dc[4] = {2000, 17, 513, 300};
        mla_batch_case("dsa decode top-256", 64, 512, 64, 256, 4, dn, dc);
        /* GLM-5 decode shapes, where the default takes 16-head blocks: batch 1 at ctx 1100 (35 one-tile
         * ranges, the last partial), batch 2 dense (ctx 1 and 1100) and DSA top-2048 at ctx 3000 / 700 */
        int d1[1] = {1}, c1[1] = {1100}, d2[2] = {1, 1}, c2[2] = {1, 1100}, c3[2] = {3000, 700};
        mla_batch_case("mla decode b1 ctx 1100", 64, 512, 64, 0, 1, d1, c1);
        mla_batch_case("mla decode b2", 64, 512, 64, 0, 2, d2, c2);
        mla_batch_case("dsa decode b2 top-2048", 64, 512, 64, 2048, 2, d2, c3);
        /* more than 64 heads (two head groups, the second partial), a latent width mma refuses, and
         * long prefill chunks with top-k below the context (tokens below index_topk walk 0..pos) */
        mla_batch_case("mla dense 80 heads", 80, 64, 16, 0, 5, nn, cx);
        mla_batch_case("dsa width 96 (mma refuses)", 8, 96, 32, 64, 5, nn, cx);
        int pn[2] = {200, 130}, pc[2] = {700, 130};
        mla_batch_case("dsa prefill top-128", 64, 512, 64, 128, 2, pn, pc);
        /* the mma kernel splits Q·Kᵀ's k-steps between a head tile's two warps: without split-K (330
         * tokens fill the grid) at latent width 80 (5 k-steps, split 3 + 2) with a partial second head
         * group (warps of idle head tiles), and at width 160 with 20 heads (a head tile of 4 real heads) */
        mla_batch_case("mla prefill 80 heads (odd k-steps)", 80, 64, 16, 0, 2, pn, pc);
        mla_batch_case("dsa prefill 20 heads top-128", 20, 128, 32, 128, 2, pn, pc);
    }
    /* a forced implementation that cannot run is refused with the flag, the GPU and the alternatives */
    ms_attn_shape odd = {MS_ATTN_GQA, 32, 4, 96, 96, 0, 16, 256, MS_BF16, 0};
    const ms_attn_impl *r = NULL;
    CHECK(ms_attn_resolve(GPU, "--attention-backend", "mma", &odd, &r, &E) == MS_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(E.msg, "--attention-backend") && strstr(E.msg, GPU->gpu.name) && strstr(E.msg, "compute capability") &&
                  strstr(E.msg, "head dim") && strstr(E.msg, "flash"),
              "%s", E.msg);
    ms_attn_shape dsa = {MS_ATTN_DSA, 64, 1, 160, 96, 2048, 16, 4096, MS_BF16, 0};
    CHECK(ms_attn_resolve(GPU, "--nsa-decode-backend", "mma", &dsa, &r, &E) == MS_ERR_UNSUPPORTED &&
          strstr(E.msg, "DSA sparse attention") && strstr(E.msg, "latent width"));
    ms_attn_shape dsa5 = {MS_ATTN_DSA, 64, 1, 576, 512, 2048, 16, 4096, MS_BF16, 0};
    CHECK(ms_attn_resolve(GPU, "--nsa-decode-backend", "auto", &dsa5, &r, &E) == MS_OK && r && !strcmp(r->name, "mma"));
    CHECK(ms_attn_resolve(GPU, "--nsa-decode-backend", "auto", &dsa, &r, &E) == MS_OK && r && !strcmp(r->name, "flash"));
}

#ifdef MS_HAVE_CUDA
/* 1 when the n floats of a and b are the same bits and all finite (a NaN would be a row nobody wrote). */
static int same_finite(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i]) || memcmp(&a[i], &b[i], sizeof(float))) return 0;
    return 1;
}

/* The attention implementation that takes raw q/k/v rows (MS_ATTN_CAP_GQA_PREP, ms_attn_call.prep)
 * against gqa_prep's kernel followed by the same implementation on the prepared rows: the output, the
 * rotated q and both caches must be the same bits (the fused kernel does gqa_prep's arithmetic through
 * the same device function and the same attention math). q starts NaN-poisoned in both, so a head the
 * fused kernel forgot fails. slots: the step's cache slots (NULL: the batch's own; an out-of-range or
 * -1 slot stores nothing, and attention then reads the cache's old row, in both forms). want_fused: the
 * number of fused launches the call must make in each mode (0 for a batch it must decline). Modes: the
 * default split-K decision (the meta, first tile and biases read before the PDL wait), no split at all
 * (MS_CU_ATTN_SPLIT_TILES), the fused form with everything after the wait (MS_CU_ATTN_PREP=1), and the
 * fusion switched off (MS_CU_ATTN_PREP=0, never fused). Every fused launch reads before its wait in the
 * first two modes (the test's weights are quiet: uploads synchronise) and none in the third; want_split
 * (1, or -1 for either) says whether the default mode's launches split the keys (then a merge follows),
 * and the no-split mode never does. */
static int g_merge_early; /* test_attn_merge_early: MS_CU_ATTN_MERGE_EARLY is on for gqa_prep_attn_case */

/* with_bias: a mask of the q (1), k (2) and v (4) biases present */
static void gqa_prep_attn_case(const char *name, int nh, int nkv, int d, const ms_rope_cfg *rc, int with_bias, int page,
                               int n_seqs, const int *nnew, const int *ctx, const int32_t *slots, int want_fused,
                               int want_split) {
    gbatch B;
    make_gbatch(&B, n_seqs, nnew, ctx, page);
    const int T = B.bt.n_tokens, S = B.n_slots;
    const ms_attn_impl *impl = NULL;
    for (const ms_attn_impl *const *ip = ms_attn_impls(); *ip; ip++)
        if (!strcmp((*ip)->backend, "cuda") && ((*ip)->caps & MS_ATTN_CAP_GQA_PREP)) impl = *ip;
    CHECK_MSG(impl != NULL, "%s: no CUDA attention implementation takes raw q/k/v", name);
    if (!impl) {
        free_gbatch(&B);
        return;
    }
    const int64_t nq = (int64_t)nh * d, nk = (int64_t)nkv * d;
    int64_t cs[3] = {S, nkv, d}, qs[3] = {T, nh, d}, ks[3] = {T, nkv, d}, ws[2] = {T, nq + 2 * nk};
    float *kc = rand_vec((size_t)S * nk, 1.f), *vc = rand_vec((size_t)S * nk, 1.f),
          *qkv = rand_vec((size_t)T * (size_t)ws[1], 4.f), *bq = rand_vec((size_t)nq, 1.f),
          *bk = rand_vec((size_t)nk, 1.f), *bv = rand_vec((size_t)nk, 1.f), *junk = rand_vec((size_t)T * nk, 1.f);
    ms_tensor QKV = mk(GPU, 0, 2, ws, qkv), Kr = mk(GPU, 0, 3, ks, junk), Vr = mk(GPU, 0, 3, ks, junk);
    ms_tensor Bq = mk(GPU, MS_F32, 1, &nq, bq), Bk = mk(GPU, MS_F32, 1, &nk, bk), Bv = mk(GPU, MS_F32, 1, &nk, bv);
    ms_tensor SL = mk_i32(GPU, T, slots ? slots : B.slot);
    const ms_attn_gqa_prep pp = {&Kr, &Vr, with_bias & 1 ? &Bq : NULL, with_bias & 2 ? &Bk : NULL, with_bias & 4 ? &Bv : NULL,
                                 B.mg.positions_d, SL.data, rc, &QKV};
    const float sc = 1.f / sqrtf((float)d);
    static const char *const mode_var[4] = {NULL, "MS_CU_ATTN_SPLIT_TILES", "MS_CU_ATTN_PREP", "MS_CU_ATTN_PREP"};
    static const char *const mode_val[4] = {NULL, "1048576", "1", "0"};
    for (int mo = 0; mo < 4; mo++) {
        ms_tensor Q[2], K[2], V[2], O[2];
        for (int f = 0; f < 2; f++) {
            Q[f] = mk(GPU, 0, 3, qs, NULL);
            K[f] = mk(GPU, 0, 3, cs, kc);
            V[f] = mk(GPU, 0, 3, cs, vc);
            O[f] = mk(GPU, 0, 3, qs, NULL);
        }
        char *saved = mode_var[mo] ? env_push(mode_var[mo], mode_val[mo]) : NULL;
        /* the two-kernel form */
        R(GPU->ops->gqa_prep(GPU, &Q[0], &Kr, &Vr, pp.bq, pp.bk, pp.bv, pp.pos_d, rc, &K[0], &V[0], pp.slot_d, &QKV, &E));
        const ms_attn_call c0 = {MS_ATTN_GQA, &Q[0], &K[0], &V[0], &B.mg, NULL, 0, 0, sc, &O[0], NULL};
        R(ms_attn_run(impl, GPU, &c0, &E));
        /* the call with the raw rows */
        const long long n0 = ms_cuda_attn_prep_launches(), e0 = ms_cuda_attn_prep_form_launches(0),
                        s0 = ms_cuda_attn_prep_form_launches(1);
        const ms_attn_call c1 = {MS_ATTN_GQA, &Q[1], &K[1], &V[1], &B.mg, NULL, 0, 0, sc, &O[1], &pp};
        R(ms_attn_run(impl, GPU, &c1, &E));
        const long long fused = ms_cuda_attn_prep_launches() - n0, early = ms_cuda_attn_prep_form_launches(0) - e0,
                        split = ms_cuda_attn_prep_form_launches(1) - s0;
        if (mode_var[mo]) env_pop(mode_var[mo], saved);
        char mname[64];
        if (mode_var[mo]) snprintf(mname, sizeof mname, "%s=%s", mode_var[mo], mode_val[mo]);
        else snprintf(mname, sizeof mname, "default");
        CHECK_MSG(fused == (mo == 3 ? 0 : want_fused), "%s (%s): %lld fused launches, %d expected", name, mname, fused,
                  mo == 3 ? 0 : want_fused);
        /* right after an early-triggering merge (the two-kernel form's, when it splits) the fused form must read
         * nothing before its wait (cuda_internal.cuh, cu_prev_early) */
        const long long want_early = mo >= 2 ? 0 : (g_merge_early && split) ? 0 : fused;
        CHECK_MSG(early == want_early, "%s (%s): %lld of %lld fused launches read before the wait (%lld expected)", name,
                  mname, early, fused, want_early);
        if (mo == 1 || (mo == 0 && want_split >= 0))
            CHECK_MSG(split == (mo == 1 ? 0 : want_split * fused), "%s (%s): %lld of %lld fused launches split the keys",
                      name, mname, split, fused);
        const ms_tensor *pairs[4][2] = {{&O[0], &O[1]}, {&Q[0], &Q[1]}, {&K[0], &K[1]}, {&V[0], &V[1]}};
        static const char *const what[4] = {"output", "rotated q", "k cache", "v cache"};
        for (int i = 0; i < 4; i++) {
            float *a = get(GPU, pairs[i][0]), *b = get(GPU, pairs[i][1]);
            CHECK_MSG(same_finite(a, b, (size_t)ms_tensor_numel(pairs[i][0])), "%s (%s): %s differs from gqa_prep + attention",
                      name, mname, what[i]);
            free(a);
            free(b);
        }
        for (int f = 0; f < 2; f++) {
            fr(GPU, &Q[f]); fr(GPU, &K[f]); fr(GPU, &V[f]); fr(GPU, &O[f]);
        }
    }
    /* an implementation without the capability refuses the raw rows with a sentence */
    for (const ms_attn_impl *const *ip = ms_attn_impls(); *ip; ip++) {
        if (strcmp((*ip)->backend, "cuda") || ((*ip)->caps & MS_ATTN_CAP_GQA_PREP)) continue;
        ms_tensor O1 = mk(GPU, 0, 3, qs, NULL), Q1 = mk(GPU, 0, 3, qs, NULL);
        const ms_attn_call c = {MS_ATTN_GQA, &Q1, &Kr, &Vr, &B.mg, NULL, 0, 0, sc, &O1, &pp};
        CHECK_MSG(ms_attn_run(*ip, GPU, &c, &E) == MS_ERR_UNSUPPORTED && strstr(E.msg, "gqa_prep"),
                  "%s: %s took raw rows: %s", name, (*ip)->name, E.msg);
        fr(GPU, &O1); fr(GPU, &Q1);
        break;
    }
    fr(GPU, &QKV); fr(GPU, &Kr); fr(GPU, &Vr); fr(GPU, &Bq); fr(GPU, &Bk); fr(GPU, &Bv); fr(GPU, &SL);
    free(kc); free(vc); free(qkv); free(bq); free(bk); free(bv); free(junk);
    free_gbatch(&B);
}

static void test_attn_gqa_prep(void) {
    const ms_rope_cfg neox = {0, 64, 0, 1e6}, full64 = {0, 64, 0, 1e4}, inter = {32, 64, 1, 1e4};
    /* GLM-4.5-Air heads (96 / 8, head dim 128, half rotary, q/k/v bias) at batch 1: contexts of one key,
     * one whole tile, one key past it, 256 (the benchmark's), 1000 and 4097 (split-K, the last range
     * holding the new key alone in its tile) */
    const int one[1] = {1}, ctx1[6] = {1, 64, 65, 256, 1000, 4097};
    for (int i = 0; i < 6; i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "air b1 ctx %d", ctx1[i]);
        gqa_prep_attn_case(nm, 96, 8, 128, &neox, 7, 16, 1, one, &ctx1[i], NULL, 1, ctx1[i] >= 1000 ? 1 : -1);
    }
    /* a decode batch of 5 at uneven contexts, then the same with a slot of -1 and one past the cache */
    const int n5[5] = {1, 1, 1, 1, 1}, c5[5] = {1, 63, 64, 130, 700};
    gqa_prep_attn_case("air b5", 96, 8, 128, &neox, 7, 16, 5, n5, c5, NULL, 1, -1);
    {
        const uint64_t seed = rng; /* the case builds its batch first, from the same seed: the same pages */
        gbatch B;
        make_gbatch(&B, 5, n5, c5, 16);
        int32_t sl[5];
        memcpy(sl, B.slot, sizeof sl);
        sl[1] = -1;
        sl[3] = B.n_slots + 3;
        free_gbatch(&B);
        rng = seed;
        gqa_prep_attn_case("air b5 bad slots", 96, 8, 128, &neox, 7, 16, 5, n5, c5, sl, 1, -1);
    }
    /* head dim 64 with full rotary and no bias, page 7; no rotary dims; interleaved pairs at an offset */
    const int n3[3] = {1, 1, 1}, c3[3] = {200, 7, 64};
    gqa_prep_attn_case("d64 full rotary", 32, 4, 64, &full64, 0, 7, 3, n3, c3, NULL, 1, -1);
    gqa_prep_attn_case("no rotary", 16, 2, 128, NULL, 7, 16, 3, n3, c3, NULL, 1, -1);
    gqa_prep_attn_case("interleaved at 32", 16, 2, 128, &inter, 7, 16, 3, n3, c3, NULL, 1, -1);
    /* some biases absent: the kernel adds each one present and nothing for the others */
    gqa_prep_attn_case("q bias only", 16, 2, 128, &neox, 1, 16, 3, n3, c3, NULL, 1, -1);
    gqa_prep_attn_case("k and v biases only", 16, 2, 128, &neox, 6, 16, 3, n3, c3, NULL, 1, -1);
    /* the largest head groups the kernel stages (hc q rows and 2 bias rows of fp32 fill a K buffer of 64
     * padded bf16 rows: 34 at head dim 64, 32 at 128), and one more, which it declines */
    gqa_prep_attn_case("34 heads a kv head, d 64", 68, 2, 64, &full64, 7, 16, 3, n3, c3, NULL, 1, -1);
    gqa_prep_attn_case("32 heads a kv head, d 128", 64, 2, 128, &neox, 7, 16, 3, n3, c3, NULL, 1, -1);
    gqa_prep_attn_case("35 heads a kv head, d 64 (declined)", 70, 2, 64, &full64, 7, 16, 3, n3, c3, NULL, 0, -1);
    gqa_prep_attn_case("33 heads a kv head, d 128 (declined)", 66, 2, 128, &neox, 7, 16, 3, n3, c3, NULL, 0, -1);
    /* declined: a sequence with several new tokens (prefill chunk, verify), and a head group larger than a
     * block's 64 rows (the separate kernel then runs first) */
    const int nm3[3] = {1, 37, 1}, cm3[3] = {1, 250, 129};
    gqa_prep_attn_case("mixed batch (declined)", 96, 8, 128, &neox, 7, 16, 3, nm3, cm3, NULL, 0, -1);
    gqa_prep_attn_case("128 heads a kv head (declined)", 128, 1, 64, &full64, 7, 16, 3, n3, c3, NULL, 0, -1);
}
#endif

#ifdef MS_HAVE_CUDA
/* MS_CU_ATTN_MERGE_EARLY: the split-K merge triggers the next kernel before its own wait.
 * 1. The chain the forward runs at one token: attention over Air's heads (split, so a merge), then the output
 *    projection reading the merged rows (streaming GEMV with its early copies, which now start beside the
 *    attention), with the L2 prefetch and the deep rings on or off: the same bits as with the knob off, in the
 *    attention's output and the projection's; each early merge counted.
 * 2. The fused decode form right after an early merge reads nothing before its wait (gqa_prep_attn_case counts
 *    it), and its results are still gqa_prep + attention's bit for bit. */
static void merge_chain_case(int ctx) {
    const int one[1] = {1};
    gbatch B;
    make_gbatch(&B, 1, one, &ctx, 16);
    const int T = B.bt.n_tokens, S = B.n_slots, nh = 96, nkv = 8, d = 128;
    const ms_attn_impl *impl = NULL;
    for (const ms_attn_impl *const *ip = ms_attn_impls(); *ip; ip++)
        if (!strcmp((*ip)->backend, "cuda") && ((*ip)->caps & MS_ATTN_CAP_GQA_PREP)) impl = *ip;
    CHECK_MSG(impl != NULL, "merge chain: no CUDA tensor-core attention");
    int64_t cs[3] = {S, nkv, d}, qs[3] = {T, nh, d}, os2[2] = {T, (int64_t)nh * d}, ys[2] = {T, 4096};
    float *kc = rand_vec((size_t)S * nkv * d, 1.f), *vc = rand_vec((size_t)S * nkv * d, 1.f),
          *q = rand_vec((size_t)T * nh * d, 4.f);
    ms_tensor Q = mk(GPU, 0, 3, qs, q), K = mk(GPU, 0, 3, cs, kc), V = mk(GPU, 0, 3, cs, vc);
    lpair L = mk_linear(MS_WFMT_PLAIN, MS_BF16, 4096, (int64_t)nh * d, 0);
    static const char *const cfg[3][4] = {{"0", "0", "0", "knob off"}, {"1", "0", "0", "merge early"},
                                          {"1", "16", "12", "merge early, L2 prefetch, deep rings"}};
    float *ref[2] = {NULL, NULL};
    for (int k = 0; impl && k < 3; k++) {
        char *s1 = env_push("MS_CU_ATTN_MERGE_EARLY", cfg[k][0]), *s2 = env_push("MS_CU_BF16_STREAM_L2PF", cfg[k][1]),
             *s3 = env_push("MS_CU_BF16_STREAM_DEEPK", cfg[k][2]);
        ms_tensor O = mk(GPU, 0, 3, qs, NULL), Y = mk(GPU, MS_F32, 2, ys, NULL);
        ms_tensor O2 = ms_tensor_reshape(&O, 2, os2);
        const ms_attn_call c = {MS_ATTN_GQA, &Q, &K, &V, &B.mg, NULL, 0, 0, 1.f / sqrtf((float)d), &O, NULL};
        R(GPU->ops->sync(GPU, &E)); /* the weights are quiet: the projection copies before its wait */
        const long long m0 = ms_cuda_attn_merge_launches(1), m1 = ms_cuda_attn_merge_launches(0),
                        g0 = ms_cuda_gvb_launches();
        R(ms_attn_run(impl, GPU, &c, &E));
        R(GPU->ops->linear(GPU, &L.g, &O2, &Y, &E));
        /* one merge, early where the knob says (at 256 keys the split is the grid's choice: none is allowed) */
        const long long em = ms_cuda_attn_merge_launches(1) - m0, pm = ms_cuda_attn_merge_launches(0) - m1;
        const int merged = (int)(em + pm) == 1, want_em = k && merged;
        CHECK_MSG((merged || (ctx < 1000 && em + pm == 0)) && em == want_em && ms_cuda_gvb_launches() - g0 == 1,
                  "merge chain ctx %d (%s): %lld early and %lld plain merges, %lld streaming GEMVs (want %d early of one, "
                  "1 GEMV)", ctx, cfg[k][3], em, pm, ms_cuda_gvb_launches() - g0, want_em);
        float *o = get(GPU, &O), *y = get(GPU, &Y);
        if (!k) {
            ref[0] = o, ref[1] = y;
        } else {
            CHECK_MSG(!memcmp(o, ref[0], sizeof(float) * (size_t)(T * nh * d)) &&
                          !memcmp(y, ref[1], sizeof(float) * (size_t)(T * 4096)),
                      "merge chain ctx %d (%s): the attention or the projection differs from the knob-off bits", ctx,
                      cfg[k][3]);
            free(o), free(y);
        }
        fr(GPU, &O); fr(GPU, &Y);
        env_pop("MS_CU_BF16_STREAM_DEEPK", s3);
        env_pop("MS_CU_BF16_STREAM_L2PF", s2);
        env_pop("MS_CU_ATTN_MERGE_EARLY", s1);
    }
    free(ref[0]); free(ref[1]);
    free_linear(&L);
    fr(GPU, &Q); fr(GPU, &K); fr(GPU, &V);
    free(kc); free(vc); free(q);
    free_gbatch(&B);
}

static void test_attn_merge_early(void) {
    merge_chain_case(256); /* the benchmark's context: 4-5 key ranges */
    merge_chain_case(4097);
    char *saved = env_push("MS_CU_ATTN_MERGE_EARLY", "1");
    g_merge_early = 1;
    const ms_rope_cfg neox = {0, 64, 0, 1e6};
    const int one[1] = {1}, ctx[2] = {1000, 4097};
    for (int i = 0; i < 2; i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "air b1 ctx %d, early merge", ctx[i]);
        gqa_prep_attn_case(nm, 96, 8, 128, &neox, 7, 16, 1, one, &ctx[i], NULL, 1, 1);
    }
    g_merge_early = 0;
    int nn[3] = {1, 1, 1}, cx[3] = {2000, 1, 333};
    gqa_batch_case("decode3, early merge", 96, 8, 128, 16, 3, nn, cx);
    env_pop("MS_CU_ATTN_MERGE_EARLY", saved);
}
#endif

static void test_attn_gqa_batches(void) {
    { /* a prefill chunk of 300 tokens after a cached prefix of 200 */
        int nn[1] = {300}, cx[1] = {500};
        gqa_batch_case("prefill", 96, 8, 128, 16, 1, nn, cx);
        gqa_batch_case("prefill", 32, 4, 64, 7, 1, nn, cx);
    }
    { /* decodes at contexts 1, 64, 65, 129 and 1000, a chunk of 37 after 213 cached, a fresh prompt of 70 */
        int nn[7] = {1, 37, 1, 1, 70, 1, 1}, cx[7] = {1, 250, 64, 65, 70, 129, 1000};
        gqa_batch_case("mixed", 96, 8, 128, 16, 7, nn, cx);
        gqa_batch_case("mixed", 32, 4, 64, 12, 7, nn, cx);
    }
    { /* a decode batch of 64 sequences, contexts 1 .. 600, mostly not multiples of the 64-key tile */
        int nn[64], cx[64];
        for (int i = 0; i < 64; i++) {
            nn[i] = 1;
            cx[i] = 1 + (i * 137) % 600;
        }
        cx[1] = 64;
        cx[2] = 65;
        gqa_batch_case("decode64", 96, 8, 128, 16, 64, nn, cx);
        gqa_batch_case("decode64", 32, 4, 64, 12, 64, nn, cx);
    }
    { /* a small decode batch with a long context: many key ranges per block (split-K) */
        int nn[3] = {1, 1, 1}, cx[3] = {2000, 1, 333};
        gqa_batch_case("decode3", 96, 8, 128, 16, 3, nn, cx);
    }
    { /* 80 query heads on one KV head: two head chunks per token */
        int nn[3] = {20, 1, 1}, cx[3] = {100, 77, 1};
        gqa_batch_case("wide-group", 80, 1, 64, 16, 3, nn, cx);
    }
}

static void mla_case(int nh, int kvl, int dr, int sparse) {
    abatch A;
    int page = 4, S = 8 * page, D = kvl + dr;
    make_batch(&A, page);
    int64_t ls[2] = {S, D}, qs[3] = {5, nh, D}, os[3] = {5, nh, kvl};
    float *lat = rand_vec((size_t)S * D, 1.f), *q = rand_vec((size_t)5 * nh * D, 0.5f);
    pair L = act(2, ls, lat), Q = act(3, qs, q), O = out_act(3, os);
    int topk = 6;
    int32_t tk[5 * 6];
    for (int t = 0; t < 5; t++) {
        int n = A.pos[t] + 1, c = 0;
        for (int j = 0; j < n && c < topk; j++)
            if ((rnd_u32() % 3) != 0 || n - j <= topk - c) tk[t * topk + c++] = j;
        while (c < topk) tk[t * topk + c++] = -1;
    }
    ms_tensor tg = mk_i32(GPU, 5 * topk, tk), tc = mk_i32(CPU, 5 * topk, tk);
    float sc = 0.0625f;
    R(GPU->ops->mla_attn(GPU, &Q.g, &L.g, &A.mg, sparse ? tg.data : NULL, topk, kvl, sc, &O.g, &E));
    R(CPU->ops->mla_attn(CPU, &Q.c, &L.c, &A.mc, sparse ? tc.data : NULL, topk, kvl, sc, &O.c, &E));
    CMP(O.g, O.c, 2e-2);
    pfree(&L); pfree(&Q); pfree(&O);
    fr(GPU, &tg); fr(CPU, &tc);
    free(lat); free(q);
    free_batch(&A);
}

static void test_mla_attn(void) {
    mla_case(4, 64, 16, 0);
    mla_case(4, 64, 16, 1);
    mla_case(20, 32, 8, 1);
    mla_case(3, 48, 6, 0);
}

/* The absorbed products against the CPU's: at 1..4 tokens through mla_absorb.cu's kernels (or, for shapes
 * they refuse, cuBLAS), and with MS_CU_MLA_ABSORB=0 through cuBLAS, for plain and FP8 kv_b. */
static void mla_proj_case(int T, int nh, int dn, int dr, int dv, int kvl) {
    for (int f = 0; f < 2; f++) {
        lpair L = mk_linear(f ? MS_WFMT_FP8 : MS_WFMT_PLAIN, MS_BF16, nh * (dn + dv), kvl, 0);
        int64_t qs[3] = {T, nh, dn + dr}, os[3] = {T, nh, kvl + dr}, ls[3] = {T, nh, kvl}, vs[2] = {T, nh * dv};
        float *q = rand_vec((size_t)T * nh * (dn + dr), 1.f), *ol = rand_vec((size_t)T * nh * kvl, 1.f);
        pair Q = act(3, qs, q), O = out_act(3, os), OL = act(3, ls, ol), V = out_act(2, vs);
        R(CPU->ops->mla_absorb_q(CPU, &L.c, &Q.c, nh, dn, dr, dv, NULL, NULL, &O.c, &E));
        R(CPU->ops->mla_v_up(CPU, &L.c, &OL.c, nh, dn, dv, &V.c, &E));
        char *saved = env_push("MS_CU_MLA_ABSORB", NULL);
        for (int k = 0; k < 2; k++) {
            setenv("MS_CU_MLA_ABSORB", k ? "1" : "0", 1);
            ms_tensor Og = mk(GPU, 0, 3, os, NULL), Vg = mk(GPU, 0, 2, vs, NULL);
            R(GPU->ops->mla_absorb_q(GPU, &L.g, &Q.g, nh, dn, dr, dv, NULL, NULL, &Og, &E));
            CMP(Og, O.c, 2e-2);
            R(GPU->ops->mla_v_up(GPU, &L.g, &OL.g, nh, dn, dv, &Vg, &E));
            CMP(Vg, V.c, 2e-2);
            fr(GPU, &Og);
            fr(GPU, &Vg);
        }
        env_pop("MS_CU_MLA_ABSORB", saved);
        pfree(&Q); pfree(&O); pfree(&OL); pfree(&V);
        free(q); free(ol);
        free_linear(&L);
    }
}

static void test_mla_proj(void) {
    for (int T = 1; T <= 5; T++) {
        mla_proj_case(T, 3, 24, 8, 20, 64);    /* small; T = 5 is past the kernels (cuBLAS) */
        mla_proj_case(T, 8, 192, 64, 256, 512); /* GLM-5's head dims, 8 of its 64 heads */
        mla_proj_case(T, 2, 20, 8, 12, 136);   /* kvl a multiple of 8 but not of 128: a partly used column block */
    }
    mla_proj_case(1, 3, 300, 8, 20, 64);  /* dn past the absorb kernel's 256 rows: cuBLAS absorb, own v_up */
    mla_proj_case(1, 3, 24, 8, 10, 64);   /* dv not a multiple of 4: cuBLAS v_up */
    mla_proj_case(1, 3, 24, 8, 20, 36);   /* kvl not a multiple of 8: cuBLAS both */
    mla_proj_case(1, 2, 24, 8, 20, 1032); /* kvl past v_up's 1024 */
}

/* The absorbed query with its rope part rotated by the op against the GPU's rope op on q followed by the
 * plain absorb (bit for bit), and against the CPU's pair; q itself must stay unrotated. T tokens at
 * positions from 11 on. */
static void absorb_rope_case(int T, int nh, int dn, int dr, int dv, int kvl, ms_rope_cfg rc) {
    lpair L = mk_linear(MS_WFMT_FP8, MS_BF16, nh * (dn + dv), kvl, 0);
    int64_t qs[3] = {T, nh, dn + dr}, os[3] = {T, nh, kvl + dr};
    float *q = rand_vec((size_t)T * nh * (dn + dr), 1.f);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    for (int t = 0; t < T; t++) pos[t] = 11 + 7 * t;
    ms_tensor pg = mk_i32(GPU, T, pos), pc = mk_i32(CPU, T, pos);
    pair Q = act(3, qs, q), O = out_act(3, os);
    ms_tensor Qr = mk(GPU, 0, 3, qs, q), Q0 = mk(GPU, 0, 3, qs, q), Or = mk(GPU, 0, 3, os, NULL);
    R(GPU->ops->mla_absorb_q(GPU, &L.g, &Q.g, nh, dn, dr, dv, pg.data, &rc, &O.g, &E));
    R(GPU->ops->rope(GPU, &Qr, pg.data, &rc, &E));
    R(GPU->ops->mla_absorb_q(GPU, &L.g, &Qr, nh, dn, dr, dv, NULL, NULL, &Or, &E));
    double md;
    long nd = n_differ(&O.g, &Or, &md);
    CHECK_MSG(nd == 0, "T %d dn %d dr %d: %ld values differ from rope + absorb (max %g)", T, dn, dr, nd, md);
    nd = n_differ(&Q.g, &Q0, &md);
    CHECK_MSG(nd == 0, "T %d: q changed in %ld places", T, nd);
    R(CPU->ops->rope(CPU, &Q.c, pc.data, &rc, &E));
    R(CPU->ops->mla_absorb_q(CPU, &L.c, &Q.c, nh, dn, dr, dv, NULL, NULL, &O.c, &E));
    CMP(O.g, O.c, 2e-2);
    ms_rope_cfg bad = rc;
    bad.rot_off = dn - 2;
    CHECK(GPU->ops->mla_absorb_q(GPU, &L.g, &Q.g, nh, dn, dr, dv, pg.data, &bad, &O.g, &E) == MS_ERR_INVALID);
    pfree(&Q); pfree(&O); fr(GPU, &Qr); fr(GPU, &Q0); fr(GPU, &Or);
    fr(GPU, &pg); fr(CPU, &pc);
    free_linear(&L);
    free(q); free(pos);
}

static void test_absorb_rope(void) {
    const int Ts[3] = {1, 3, 17};
    for (int i = 0; i < 3; i++) {
        absorb_rope_case(Ts[i], 8, 192, 64, 256, 512, (ms_rope_cfg){192, 64, 0, 1e6}); /* GLM-5 dims, 8 of its heads */
        absorb_rope_case(Ts[i], 4, 32, 64, 24, 64, (ms_rope_cfg){32, 64, 1, 1e4});  /* interleaved */
        absorb_rope_case(Ts[i], 3, 24, 8, 20, 40, (ms_rope_cfg){24, 8, 1, 1e4});    /* odd fixture dims */
        absorb_rope_case(Ts[i], 3, 12, 16, 10, 48, (ms_rope_cfg){16, 8, 0, 1e4});   /* rotation inside the part */
    }
}

static int cmp_i32(const void *a, const void *b) { return *(const int32_t *)a - *(const int32_t *)b; }

static int IX_NIH = 5, IX_D = 32; /* indexer heads and head dim of indexer_case */

static void indexer_case(int topk) {
    abatch A;
    int page = 4, S = 8 * page, nih = IX_NIH, d = IX_D;
    make_batch(&A, page);
    int64_t cs[2] = {S, d}, qs[3] = {5, nih, d}, wsh[2] = {5, nih};
    float *kc = rand_vec((size_t)S * d, 1.f), *q = rand_vec((size_t)5 * nih * d, 1.f), *w = rand_vec((size_t)5 * nih, 1.f);
    pair K = act(2, cs, kc), Q = act(3, qs, q), W = act(2, wsh, w);
    int32_t *og = calloc((size_t)5 * topk, 4), *oc = calloc((size_t)5 * topk, 4);
    ms_tensor tg = mk_i32(GPU, 5 * topk, og), tc = mk_i32(CPU, 5 * topk, oc);
    R(GPU->ops->indexer_topk(GPU, &Q.g, &W.g, &K.g, &A.mg, topk, tg.data, &E));
    R(CPU->ops->indexer_topk(CPU, &Q.c, &W.c, &K.c, &A.mc, topk, tc.data, &E));
    R(GPU->ops->download(GPU, og, tg.data, (size_t)5 * topk * 4, &E));
    R(CPU->ops->download(CPU, oc, tc.data, (size_t)5 * topk * 4, &E));
    /* host scores (float64) to judge near-ties */
    for (int t = 0; t < 5; t++) {
        int s = A.tseq[t], n = A.pos[t] + 1;
        double sc[64];
        for (int j = 0; j < n; j++) {
            int slot = A.table[s * 4 + j / page] * page + j % page;
            double tot = 0;
            for (int h = 0; h < nih; h++) {
                double dot = 0;
                for (int c = 0; c < d; c++) dot += (double)q[(t * nih + h) * d + c] * kc[slot * d + c];
                dot /= sqrt((double)d);
                tot += w[t * nih + h] * (dot > 0 ? dot : 0);
            }
            sc[j] = tot;
        }
        qsort(og + t * topk, (size_t)topk, 4, cmp_i32);
        qsort(oc + t * topk, (size_t)topk, 4, cmp_i32);
        int same = !memcmp(og + t * topk, oc + t * topk, (size_t)topk * 4);
        if (!same) {
            /* accept only if both are valid top-k sets up to a tiny tie tolerance */
            double minsel = 1e30, maxrest = -1e30;
            int sel[64] = {0}, bad = 0;
            for (int k = 0; k < topk; k++) {
                int j = og[t * topk + k];
                if (j < 0) continue;
                if (j >= n) bad = 1; else { sel[j] = 1; if (sc[j] < minsel) minsel = sc[j]; }
            }
            for (int j = 0; j < n; j++) if (!sel[j] && sc[j] > maxrest) maxrest = sc[j];
            CHECK_MSG(!bad && maxrest <= minsel + 1e-3 * (fabs(minsel) + 1), "indexer topk=%d token %d differs", topk, t);
        }
        int exp_valid = n < topk ? n : topk, nv = 0;
        for (int k = 0; k < topk; k++) nv += og[t * topk + k] >= 0;
        CHECK_EQ_INT(nv, exp_valid);
    }
    pfree(&K); pfree(&Q); pfree(&W);
    fr(GPU, &tg); fr(CPU, &tc);
    free(og); free(oc); free(kc); free(q); free(w);
    free_batch(&A);
}

/* The indexer over a gbatch (long contexts, several sequences, mixed prefill and decode) at a model's
 * head count and dim: the GPU's top-k set must be a valid top-k of float64 host scores (ties within
 * 1e-3 relative), the CPU's too, and their valid counts min(n, topk). */
static void indexer_batch_case(const char *name, int nih, int d, int topk, int n_seqs, const int *nnew, const int *ctx) {
    gbatch B;
    make_gbatch(&B, n_seqs, nnew, ctx, 16);
    const int T = B.bt.n_tokens, S = B.n_slots;
    int64_t cs[2] = {S, d}, qs[3] = {T, nih, d}, wsh[2] = {T, nih};
    float *kc = rand_vec((size_t)S * d, 1.f), *q = rand_vec((size_t)T * nih * d, 1.f), *w = rand_vec((size_t)T * nih, 1.f);
    pair K = act(2, cs, kc), Q = act(3, qs, q), W = act(2, wsh, w);
    int32_t *og = calloc((size_t)T * topk, 4), *oc = calloc((size_t)T * topk, 4);
    ms_tensor tg = mk_i32(GPU, (int64_t)T * topk, og), tc = mk_i32(CPU, (int64_t)T * topk, oc);
    R(GPU->ops->indexer_topk(GPU, &Q.g, &W.g, &K.g, &B.mg, topk, tg.data, &E));
    R(CPU->ops->indexer_topk(CPU, &Q.c, &W.c, &K.c, &B.mc, topk, tc.data, &E));
    R(GPU->ops->download(GPU, og, tg.data, (size_t)T * topk * 4, &E));
    R(CPU->ops->download(CPU, oc, tc.data, (size_t)T * topk * 4, &E));
    /* the inputs as the kernels see them (bf16) */
    float *kb = get(CPU, &K.c), *qb = get(CPU, &Q.c), *wb = get(CPU, &W.c);
    int bad_tokens = 0;
    for (int t = 0; t < T; t++) {
        const int s = B.tseq[t], n = B.pos[t] + 1;
        double *sc = malloc(sizeof(double) * (size_t)n);
        char *sel = calloc((size_t)n, 1);
        for (int j = 0; j < n; j++) {
            const int slot = B.table[s * B.bt.max_blocks + j / 16] * 16 + j % 16;
            double tot = 0;
            for (int h = 0; h < nih; h++) {
                double dot = 0;
                for (int c = 0; c < d; c++) dot += (double)qb[((size_t)t * nih + h) * d + c] * kb[(size_t)slot * d + c];
                dot /= sqrt((double)d);
                tot += wb[(size_t)t * nih + h] * (dot > 0 ? dot : 0);
            }
            sc[j] = tot;
        }
        for (int side = 0; side < 2; side++) {
            const int32_t *o = (side ? oc : og) + (size_t)t * topk;
            double minsel = 1e300, maxrest = -1e300;
            int bad = 0, nv = 0;
            memset(sel, 0, (size_t)n);
            for (int k = 0; k < topk; k++) {
                if (o[k] < 0) continue;
                if (o[k] >= n || sel[o[k]]) { bad = 1; continue; }
                sel[o[k]] = 1;
                nv++;
                if (sc[o[k]] < minsel) minsel = sc[o[k]];
            }
            for (int j = 0; j < n; j++) if (!sel[j] && sc[j] > maxrest) maxrest = sc[j];
            if (bad || nv != (n < topk ? n : topk) || maxrest > minsel + 1e-3 * (fabs(minsel) + 1)) bad_tokens++;
        }
        free(sc);
        free(sel);
    }
    CHECK_MSG(bad_tokens == 0, "%s: %d token rows are not a valid top-%d", name, bad_tokens, topk);
    free(kb); free(qb); free(wb);
    pfree(&K); pfree(&Q); pfree(&W);
    fr(GPU, &tg); fr(CPU, &tc);
    free(og); free(oc); free(kc); free(q); free(w);
    free_gbatch(&B);
}

static void test_indexer(void) {
    indexer_case(3);
    indexer_case(7);  /* token 0 of seq 0 has 6 keys < 7: padding */
    indexer_case(20); /* all keys for every token */
    /* GLM-5's indexer (32 heads of 128) and an odd head count, long decode contexts and a prefill chunk */
    int dn[4] = {1, 1, 1, 1}, dc[4] = {3000, 17, 513, 300};
    indexer_batch_case("indexer glm-5 decode", 32, 128, 256, 4, dn, dc);
    int pn[3] = {120, 1, 40}, pc[3] = {700, 90, 40};
    indexer_batch_case("indexer glm-5 prefill", 32, 128, 64, 3, pn, pc);
    indexer_batch_case("indexer 20 heads of 48", 20, 48, 32, 3, pn, pc);
}

/* A bf16 router gate [E, H] whose rows repeat when tie is set: row e copies row src(e) (tie 1: the
 * first of its triple, 3 * (e / 3); tie 2: the same place in group 0, e % (E / ng)), so those experts
 * get bit-identical logits on either backend and only the tie-breaking rule (lowest index, for experts
 * and for groups) decides between them. The bias repeats the same way (rt_src applied by the caller). */
static int rt_src(int e, int E_, int ng, int tie) { return tie == 1 ? 3 * (e / 3) : tie == 2 ? e % (E_ / ng) : e; }
static lpair mk_router_gate(int E_, int H, int ng, int tie) {
    lpair L;
    memset(&L, 0, sizeof L);
    uint16_t *w = malloc((size_t)E_ * H * 2);
    const float amp = 0.2f * sqrtf(64.f / (float)H); /* logits of the same spread at any H: no saturated sigmoids */
    for (int e = 0; e < E_; e++)
        for (int k = 0; k < H; k++)
            w[(size_t)e * H + k] = rt_src(e, E_, ng, tie) == e ? ms_f32_to_bf16(rnd_f() * amp)
                                                                : w[(size_t)rt_src(e, E_, ng, tie) * H + k];
    L.w = w;
    const ms_linear W = test_plain_linear("test.router", MS_BF16, E_, H, w);
    L.g = W;
    L.c = W;
    R(GPU->ops->place_linear(GPU, &L.g, &E));
    R(CPU->ops->place_linear(CPU, &L.c, &E));
    return L;
}

/* Router of T tokens over E_ experts (hidden H) on the GPU against the CPU reference: the same expert
 * set per token, and the same weight per expert. tie: see mk_router_gate. */
static void router_case_h(int T, int E_, int topk, int ng, int tg, int norm, int with_bias, int H, int tie) {
    lpair G = mk_router_gate(E_, H, ng, tie);
    int64_t xs[2] = {T, H}, bs[1] = {E_};
    float *x = rand_vec((size_t)T * H, 2.f), *bias = rand_vec((size_t)E_, 0.3f);
    for (int e = 0; e < E_; e++) bias[e] = bias[rt_src(e, E_, ng, tie)];
    /* x in bf16 on both sides (the GPU router reads bf16 rows): the logits then differ only by the
     * fp32 summation order, far below the gaps between experts' scores */
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] = ms_bf16_to_f32(ms_f32_to_bf16(x[i]));
    pair X = act(2, xs, x);
    wpair B = wten(MS_F32, 1, bs, bias);
    ms_route_cfg rc = {E_, topk, ng, tg, norm, 2.5f};
    int32_t z[64 * 8] = {0};
    CHECK(T * topk <= 128);
    ms_tensor ig = mk_i32(GPU, T * topk, z), ic = mk_i32(CPU, T * topk, z);
    ms_tensor wg = mk_i32(GPU, T * topk, z), wc = mk_i32(CPU, T * topk, z);
    R(GPU->ops->router(GPU, &X.g, &G.g, with_bias ? &B.g : NULL, &rc, ig.data, wg.data, &E));
    R(CPU->ops->router(CPU, &X.c, &G.c, with_bias ? &B.c : NULL, &rc, ic.data, wc.data, &E));
    int32_t idg[128], idc[128];
    float wgh[128], wch[128];
    R(GPU->ops->download(GPU, idg, ig.data, (size_t)T * topk * 4, &E));
    R(CPU->ops->download(CPU, idc, ic.data, (size_t)T * topk * 4, &E));
    R(GPU->ops->download(GPU, wgh, wg.data, (size_t)T * topk * 4, &E));
    R(CPU->ops->download(CPU, wch, wc.data, (size_t)T * topk * 4, &E));
    for (int t = 0; t < T; t++)
        for (int k = 0; k < topk; k++) {
            int found = -1;
            for (int k2 = 0; k2 < topk; k2++)
                if (idc[t * topk + k2] == idg[t * topk + k]) found = k2;
            CHECK_MSG(found >= 0, "router T=%d E=%d topk=%d groups %d/%d H=%d tie=%d token %d: expert %d not chosen by cpu",
                      T, E_, topk, tg, ng, H, tie, t, idg[t * topk + k]);
            if (found >= 0) CHECK_CLOSE(wgh[t * topk + k], wch[t * topk + found], 1e-4 * 2.5);
        }
    pfree(&X);
    wfree(&B);
    fr(GPU, &ig); fr(CPU, &ic); fr(GPU, &wg); fr(CPU, &wc);
    free(x); free(bias);
    free_linear(&G);
}

static void router_case(int T, int E_, int topk, int ng, int tg, int norm, int with_bias) {
    router_case_h(T, E_, topk, ng, tg, norm, with_bias, 64, 0);
}

/* The decode router's shapes (fused kernels, T <= 8) with both fused forms (MS_CU_ROUTER split and
 * warp): GLM-4.5-Air (128 experts, top 8, one group, hidden 4096) for T = 1..8, DeepSeek-V3 / GLM-5
 * style 256 experts in 8 groups keeping 4, 160 experts in 8 groups keeping 3 (top 6), a hidden size
 * that is no multiple of the split kernel's 512-k slice, and exact ties between experts and groups. */
static void test_router_decode(void) {
    const char *forms[2] = {"split", "warp"};
    char *saved = env_push("MS_CU_ROUTER", getenv("MS_CU_ROUTER"));
    for (int f = 0; f < 2; f++) {
        setenv("MS_CU_ROUTER", forms[f], 1);
        for (int T = 1; T <= 8; T++) router_case_h(T, 128, 8, 1, 1, 1, 1, 4096, 0);
        router_case_h(1, 256, 8, 8, 4, 1, 1, 4096, 0);
        router_case_h(8, 256, 8, 8, 4, 1, 1, 7168, 0);
        router_case_h(3, 256, 8, 1, 1, 0, 0, 1000, 0);
        router_case_h(5, 160, 6, 8, 3, 1, 1, 5120, 0);
        router_case_h(2, 160, 6, 1, 1, 1, 1, 520, 0);
        router_case_h(8, 128, 8, 1, 1, 1, 0, 2048, 0);
        /* ties: triples of identical experts (the 8th pick splits a triple), identical groups */
        router_case_h(2, 128, 8, 1, 1, 1, 1, 4096, 1);
        router_case_h(8, 160, 8, 1, 1, 1, 1, 1000, 1);
        router_case_h(2, 256, 8, 8, 4, 1, 1, 4096, 2);
        router_case_h(7, 160, 6, 8, 3, 1, 1, 520, 2);
        router_case_h(1, 128, 8, 8, 4, 1, 0, 4096, 2);
    }
    env_pop("MS_CU_ROUTER", saved);
}

#ifdef MS_HAVE_CUDA
/* The residual add + RMSNorm folded into the op that reads it (backend.h norm_linear / norm_router) on
 * one row, against the CPU's add_rmsnorm and linear / router on the same inputs: resid exactly (one
 * fp32 add), the normed row a (the GPU's fp32 sum of squares runs in another order, so an element may
 * round 1 bf16 ulp the other way: within 1e-2 of the largest), y within 1e-2. Every case runs twice on
 * the same tensors: the second call must find the blocks' counter back at 0 (resid then holds
 * resid + 2 delta, which only the last block of each launch writes). A refused case (MS_CU_NORM_FOLD=0,
 * 2 for a projection, 3 for the router, a row past the fold's limit, the streaming GEMV off, a router of
 * more blocks than SMs) must say MS_ERR_UNSUPPORTED and change nothing. */
typedef struct {
    pair R, D, A; /* resid, delta (F32 on both), the normed row (bf16 on the GPU) */
    wpair W;
    float *r, *d, *w;
} nf_in;

static nf_in nf_make(int64_t K) {
    nf_in n;
    int64_t xs[2] = {1, K}, ws[1] = {K};
    n.r = rand_vec((size_t)K, 3.f), n.d = rand_vec((size_t)K, 1.f), n.w = rand_vec((size_t)K, 1.f);
    n.R = P2(MS_F32, MS_F32, 2, xs, n.r), n.D = P2(MS_F32, MS_F32, 2, xs, n.d), n.A = out_act(2, xs);
    n.W = wten(MS_BF16, 1, ws, n.w);
    return n;
}
static void nf_free(nf_in *n) {
    pfree(&n->R); pfree(&n->D); pfree(&n->A); wfree(&n->W);
    free(n->r); free(n->d); free(n->w);
}
/* the GPU's and the CPU's norm inputs of n */
static ms_norm_in nf_gpu(nf_in *n) { ms_norm_in v = {&n->R.g, &n->D.g, &n->W.g, 1e-5f, &n->A.g}; return v; }
static ms_norm_in nf_cpu(nf_in *n) { ms_norm_in v = {&n->R.c, &n->D.c, &n->W.c, 1e-5f, &n->A.c}; return v; }

static void norm_linear_case(int64_t N, int64_t K, int bias, ms_dtype ydt, int want) {
    lpair L = mk_linear(MS_WFMT_PLAIN, MS_BF16, N, K, bias);
    nf_in n = nf_make(K);
    int64_t ys[2] = {1, N};
    pair Y = {mk(GPU, ydt == MS_F32 ? MS_F32 : 0, 2, ys, NULL), mk(CPU, 0, 2, ys, NULL)};
    const ms_norm_in ng = nf_gpu(&n), nc = nf_cpu(&n);
    const long long n0 = ms_cuda_gvb_launches();
    for (int rep = 0; rep < 2; rep++) {
        ms_err fe = {0};
        const int rc = GPU->ops->norm_linear(GPU, &ng, &L.g, &Y.g, &fe);
        CHECK_MSG(rc == (want ? MS_OK : MS_ERR_UNSUPPORTED), "norm_linear N=%lld K=%lld: rc %d (%s)", (long long)N,
                  (long long)K, rc, fe.msg);
        if (want) {
            R(CPU->ops->add_rmsnorm(CPU, &n.R.c, &n.D.c, &n.W.c, nc.eps, &n.A.c, &E));
            R(CPU->ops->linear(CPU, &L.c, &n.A.c, &Y.c, &E));
            CMP(n.A.g, n.A.c, 1e-2);
            CMP(Y.g, Y.c, 1e-2);
        }
        CMP(n.R.g, n.R.c, 0); /* refused: both untouched */
    }
    CHECK_MSG(ms_cuda_gvb_launches() - n0 == (want ? 2 : 0), "norm_linear N=%lld K=%lld: %lld launches",
              (long long)N, (long long)K, ms_cuda_gvb_launches() - n0);
    pfree(&Y);
    nf_free(&n);
    free_linear(&L);
}

/* The router's picks from the GPU's normed row are held to the CPU router's on that same row (bf16,
 * as the router reads it), so that only the logits' summation order differs, as in router_case_h. */
static void norm_router_case(int E_, int topk, int ng, int tg, int H, int want) {
    /* the folded form runs only where its (E / 8) x (H / 512) blocks are at most one an SM */
    if ((int64_t)((E_ + 7) / 8) * ((H + 511) / 512) > GPU->gpu.n_sm) want = 0;
    lpair G = mk_router_gate(E_, H, ng, 0);
    nf_in n = nf_make(H);
    int64_t xs[2] = {1, H}, bs[1] = {E_};
    float *bias = rand_vec((size_t)E_, 0.3f);
    wpair B = wten(MS_F32, 1, bs, bias);
    ms_route_cfg rc = {E_, topk, ng, tg, 1, 2.5f};
    int32_t z[32] = {0};
    ms_tensor ig = mk_i32(GPU, topk, z), ic = mk_i32(CPU, topk, z), wg = mk_i32(GPU, topk, z), wc = mk_i32(CPU, topk, z);
    const ms_norm_in nrg = nf_gpu(&n);
    for (int rep = 0; rep < 2; rep++) {
        ms_err fe = {0};
        const int rc2 = GPU->ops->norm_router(GPU, &nrg, &G.g, &B.g, &rc, ig.data, wg.data, &fe);
        CHECK_MSG(rc2 == (want ? MS_OK : MS_ERR_UNSUPPORTED), "norm_router E=%d H=%d: rc %d (%s)", E_, H, rc2, fe.msg);
        if (!want) {
            CMP(n.R.g, n.R.c, 0);
            continue;
        }
        R(CPU->ops->add_rmsnorm(CPU, &n.R.c, &n.D.c, &n.W.c, 1e-5f, &n.A.c, &E));
        CMP(n.R.g, n.R.c, 0);
        CMP(n.A.g, n.A.c, 1e-2);
        float *ag = get(GPU, &n.A.g);
        ms_tensor X = mk(CPU, 0, 2, xs, ag);
        R(CPU->ops->router(CPU, &X, &G.c, &B.c, &rc, ic.data, wc.data, &E));
        int32_t idg[32], idc[32];
        float wgh[32], wch[32];
        R(GPU->ops->download(GPU, idg, ig.data, (size_t)topk * 4, &E));
        R(CPU->ops->download(CPU, idc, ic.data, (size_t)topk * 4, &E));
        R(GPU->ops->download(GPU, wgh, wg.data, (size_t)topk * 4, &E));
        R(CPU->ops->download(CPU, wch, wc.data, (size_t)topk * 4, &E));
        for (int k = 0; k < topk; k++) {
            int found = -1;
            for (int k2 = 0; k2 < topk; k2++)
                if (idc[k2] == idg[k]) found = k2;
            CHECK_MSG(found >= 0, "norm_router E=%d H=%d rep %d: expert %d not chosen by cpu", E_, H, rep, idg[k]);
            if (found >= 0) CHECK_CLOSE(wgh[k], wch[found], 1e-4 * 2.5);
        }
        fr(CPU, &X);
        free(ag);
    }
    fr(GPU, &ig); fr(CPU, &ic); fr(GPU, &wg); fr(CPU, &wc);
    wfree(&B);
    free(bias);
    nf_free(&n);
    free_linear(&G);
}

static void test_norm_fold(void) {
    char *saved = env_push("MS_CU_BF16_STREAM_MAX_T", "4"), *fold = env_push("MS_CU_NORM_FOLD", "1");
    norm_linear_case(14336, 4096, 1, MS_BF16, 1); /* GLM-4.5-Air's q|k|v */
    norm_linear_case(2752, 6144, 0, MS_BF16, 1);  /* GLM-5's q_a|idx_k|kv_a */
    norm_linear_case(168, 136, 1, MS_BF16, 1);    /* the test models' hidden sizes */
    norm_linear_case(97, 112, 0, MS_F32, 1);
    norm_linear_case(5, 8, 1, MS_F32, 1);         /* one 16-byte unit */
    norm_linear_case(300, 8192, 0, MS_F32, 1);    /* the longest row the fold takes (4 units a thread) */
    norm_linear_case(300, 8200, 0, MS_F32, 0);    /* one unit past it */
    setenv("MS_CU_NORM_FOLD", "0", 1);
    norm_linear_case(168, 136, 1, MS_BF16, 0);
    norm_router_case(128, 8, 1, 1, 136, 0);
    setenv("MS_CU_NORM_FOLD", "2", 1); /* the router only */
    norm_linear_case(168, 136, 1, MS_BF16, 0);
    norm_router_case(128, 8, 1, 1, 136, 1);
    setenv("MS_CU_NORM_FOLD", "3", 1); /* projections only */
    norm_linear_case(168, 136, 1, MS_BF16, 1);
    norm_router_case(128, 8, 1, 1, 136, 0);
    unsetenv("MS_CU_NORM_FOLD"); /* the default: the router only */
    norm_linear_case(168, 136, 1, MS_BF16, 0);
    norm_router_case(128, 8, 1, 1, 136, 1);
    setenv("MS_CU_NORM_FOLD", "1", 1);
    setenv("MS_CU_BF16_STREAM_MAX_T", "0", 1);
    norm_linear_case(168, 136, 1, MS_BF16, 0);
    env_pop("MS_CU_BF16_STREAM_MAX_T", saved);
    norm_router_case(128, 8, 1, 1, 4096, 1); /* GLM-4.5-Air: 16 x 8 blocks */
    norm_router_case(256, 8, 8, 4, 6144, 1); /* GLM-5: 32 x 12 blocks, refused where they outnumber the SMs */
    norm_router_case(256, 8, 8, 4, 1024, 1); /* 32 x 2 */
    norm_router_case(160, 6, 8, 3, 520, 1);  /* a hidden size no multiple of the router's 512-k slice */
    norm_router_case(64, 4, 1, 1, 136, 1);
    norm_router_case(16, 4, 1, 1, 8200, 0); /* 2 x 17 blocks: refused by the row limit alone */
    env_pop("MS_CU_NORM_FOLD", fold);
}
#endif

static void test_router(void) {
    /* 9 tokens: GEMV + routing kernel; up to 8: the fused kernel (experts not a multiple of its 8
     * warps included, 256 experts as GLM-5) */
    router_case(9, 16, 4, 4, 2, 1, 1);
    router_case(9, 16, 4, 1, 1, 1, 1);
    router_case(9, 24, 6, 1, 1, 0, 0);
    router_case(9, 64, 8, 8, 4, 1, 1);
    router_case(1, 20, 4, 1, 1, 1, 1);
    router_case(1, 128, 8, 1, 1, 1, 1);
    router_case(3, 64, 8, 8, 4, 1, 1);
    router_case(8, 256, 8, 1, 1, 1, 1);
    router_case(2, 256, 8, 8, 4, 0, 0);
}

/* The shapes of the odd-dimension fixtures (tools/make_fixtures.py --only odd; sizes that are
 * multiples of 8 or 16 but not of 32): every op those models run, GPU against the CPU, so a fast path
 * that assumes alignment shows here before it shows in the conformance run. odd8: hidden 136,
 * intermediate 200, moe 40, GQA 5:1 heads of 24 (rotary 12), MLA kv_lora 24 / rope 8 / nope 24 / v 40,
 * q_lora 40, indexer 4 x 24. odd16: hidden 112, intermediate 208, moe 80, GQA 3:1 heads of 48
 * (rotary 24), kv_lora 80 / rope 16 / nope 48 / v 48, q_lora 48, indexer 4 x 48, nvfp4 experts. */
static void test_odd_fixture_shapes(void) {
    const int64_t Ts[3] = {1, 5, 37};
    for (int i = 0; i < 3; i++) {
        const int64_t T = Ts[i];
        /* bf16 (every linear of odd8/odd16), fp8 with partial 128 blocks, K % 16 == 8 (odd8) */
        linear_case(MS_WFMT_PLAIN, MS_BF16, T, 200, 136, 0, MS_BF16);
        linear_case(MS_WFMT_PLAIN, MS_BF16, T, 136, 40, 0, MS_F32);
        linear_case(MS_WFMT_PLAIN, MS_BF16, T, 5 * 24, 136, 1, MS_BF16);
        linear_case(MS_WFMT_FP8, 0, T, 200, 136, 0, MS_BF16);
        linear_case(MS_WFMT_FP8, 0, T, 136, 200, 0, MS_F32);
        linear_case(MS_WFMT_FP8, 0, T, 40, 136, 1, MS_BF16);
        linear_case(MS_WFMT_FP8, 0, T, 136, 40, 0, MS_BF16);
        linear_case(MS_WFMT_FP8, 0, T, 3 * (24 + 40), 24, 0, MS_BF16); /* kv_b_proj of odd8 */
        linear_case(MS_WFMT_FP8, 0, T, 208, 112, 0, MS_BF16);
        linear_case(MS_WFMT_FP8, 0, T, 112, 208, 0, MS_BF16);
        /* nvfp4 with K % 32 == 16 (odd16: hidden 112, moe 80, intermediate 208) */
        linear_case(MS_WFMT_NVFP4, 0, T, 208, 112, 0, MS_BF16);
        linear_case(MS_WFMT_NVFP4, 0, T, 112, 208, 0, MS_F32);
        linear_case(MS_WFMT_NVFP4, 0, T, 80, 112, 0, MS_BF16);
        linear_case(MS_WFMT_NVFP4, 0, T, 112, 80, 0, MS_BF16);
    }
    for (int i = 0; i < 2; i++) {
        swiglu_case(MS_WFMT_PLAIN, MS_BF16, Ts[i], 200, 136);
        swiglu_case(MS_WFMT_FP8, 0, Ts[i], 40, 136);
        swiglu_case(MS_WFMT_NVFP4, 0, Ts[i], 80, 112);
    }
    rope_case(5, 24, 0, 12, 0, 10000.0); /* glm4 odd8: partial NeoX rotary 12 of 24 */
    rope_case(3, 48, 0, 24, 0, 10000.0); /* glm4 odd16 */
    rope_case(3, 32, 24, 8, 1, 10000.0); /* MLA odd8: rope 8 after nope 24 */
    rope_case(4, 24, 0, 8, 1, 10000.0);  /* indexer odd8: rope on the first 8 of 24 */
    gqa_case(5, 1, 24);
    gqa_case(3, 1, 48);
    { /* GQA through every implementation on a mixed batch */
        int nn[4] = {1, 37, 1, 20}, cx[4] = {1, 250, 129, 20};
        const int shapes[2][3] = {{5, 1, 24}, {3, 1, 48}};
        for (int i = 0; i < 2; i++) {
            gqa_batch_case("odd", shapes[i][0], shapes[i][1], shapes[i][2], 16, 4, nn, cx);
            gbatch B;
            make_gbatch(&B, 4, nn, cx, 16);
            const int T = B.bt.n_tokens, S = B.n_slots, nh = shapes[i][0], nkv = shapes[i][1], d = shapes[i][2];
            int64_t cs[3] = {S, nkv, d}, qs[3] = {T, nh, d};
            float *kc = rand_vec((size_t)S * nkv * d, 1.f), *vc = rand_vec((size_t)S * nkv * d, 1.f);
            float *q = rand_vec((size_t)T * nh * d, 8.f);
            pair K = act(3, cs, kc), V = act(3, cs, vc), Q = act(3, qs, q);
            ms_tensor oc = mk(CPU, 0, 3, qs, NULL), og0 = mk(GPU, 0, 3, qs, NULL);
            const float sc = 1.f / sqrtf((float)d);
            R(CPU->ops->attn_gqa(CPU, &Q.c, &K.c, &V.c, &B.mc, sc, &oc, &E));
            float *ref = get(CPU, &oc);
            ms_attn_shape sh = {MS_ATTN_GQA, nh, nkv, d, d, 0, T, B.mg.max_ctx, MS_BF16, 0};
            ms_attn_call c = {MS_ATTN_GQA, &Q.g, &K.g, &V.g, &B.mg, NULL, 0, 0, sc, &og0};
            char nm[40];
            snprintf(nm, sizeof nm, "odd gqa %d:%d d=%d", nh, nkv, d);
            int ran = impls_case(nm, &c, &sh, ref, (size_t)T * nh, d);
            CHECK_MSG(ran >= 3, "%s: %d CUDA implementations ran (flash, flash_nosplit, ref expected)", nm, ran);
            free(ref);
            fr(CPU, &oc);
            fr(GPU, &og0);
            pfree(&K); pfree(&V); pfree(&Q);
            free(kc); free(vc); free(q);
            free_gbatch(&B);
        }
    }
    /* absorbed MLA and DSA: kv_lora 24 + rope 8, kv_lora 80 + rope 16, 3 heads */
    mla_case(3, 24, 8, 0);
    mla_case(3, 24, 8, 1);
    mla_case(3, 80, 16, 1);
    {
        int nn[4] = {1, 40, 1, 1}, cx[4] = {300, 40, 65, 7};
        mla_batch_case("odd8 mla dense", 3, 24, 8, 0, 4, nn, cx);
        mla_batch_case("odd8 dsa top-5", 3, 24, 8, 5, 4, nn, cx);
        mla_batch_case("odd16 dsa top-5", 3, 80, 16, 5, 4, nn, cx);
    }
    /* the absorbed projections with kv_b [nh*(nope+v), kv_lora] in bf16 and fp8 */
    const int mp[2][5] = {{3, 24, 8, 40, 24}, {3, 48, 16, 48, 80}}; /* nh, dn, dr, dv, kvl */
    for (int i = 0; i < 2; i++)
        for (int f = 0; f < 2; f++) {
            const int nh = mp[i][0], dn = mp[i][1], dr = mp[i][2], dv = mp[i][3], kvl = mp[i][4], T = 5;
            lpair L = mk_linear(f ? MS_WFMT_FP8 : MS_WFMT_PLAIN, MS_BF16, nh * (dn + dv), kvl, 0);
            int64_t qs[3] = {T, nh, dn + dr}, os[3] = {T, nh, kvl + dr}, ls[3] = {T, nh, kvl}, vs[2] = {T, nh * dv};
            float *q = rand_vec((size_t)T * nh * (dn + dr), 1.f), *ol = rand_vec((size_t)T * nh * kvl, 1.f);
            pair Q = act(3, qs, q), O = out_act(3, os), OL = act(3, ls, ol), V = out_act(2, vs);
            R(GPU->ops->mla_absorb_q(GPU, &L.g, &Q.g, nh, dn, dr, dv, NULL, NULL, &O.g, &E));
            R(CPU->ops->mla_absorb_q(CPU, &L.c, &Q.c, nh, dn, dr, dv, NULL, NULL, &O.c, &E));
            CMP(O.g, O.c, 2e-2);
            R(GPU->ops->mla_v_up(GPU, &L.g, &OL.g, nh, dn, dv, &V.g, &E));
            R(CPU->ops->mla_v_up(CPU, &L.c, &OL.c, nh, dn, dv, &V.c, &E));
            CMP(V.g, V.c, 2e-2);
            pfree(&Q); pfree(&O); pfree(&OL); pfree(&V);
            free(q); free(ol);
            free_linear(&L);
        }
    /* the indexer: 4 heads of 24 and of 48 */
    IX_NIH = 4, IX_D = 24;
    indexer_case(5);
    IX_D = 48;
    indexer_case(5);
    IX_NIH = 5, IX_D = 32;
    /* routing of 6 experts, top 3, in 2 groups keeping 1; and more experts than 48 KiB of shared
     * memory holds (the router asks for the opt-in size) */
    router_case(9, 6, 3, 2, 1, 1, 1);
    router_case(1, 6, 2, 2, 1, 1, 1); /* the fused decode router */
    router_case(9, 6, 3, 1, 1, 1, 0);
    router_case(9, 7000, 8, 1, 1, 1, 1);
    router_case(2, 7000, 8, 1, 1, 1, 1); /* beyond the fused router's shared memory: the unfused one */
}

static void test_checks(void) {
    int64_t s[2] = {6, 50};
    float *x = rand_vec(300, 1.f);
    pair X = act(2, s, x);
    int64_t bg = 0, bc = 0;
    R(GPU->ops->find_nonfinite(GPU, &X.g, &bg, &E));
    CHECK_EQ_INT(bg, -1);
    x[3 * 50 + 7] = NAN;
    x[5 * 50 + 1] = INFINITY;
    pair Y = act(2, s, x);
    R(GPU->ops->find_nonfinite(GPU, &Y.g, &bg, &E));
    R(CPU->ops->find_nonfinite(CPU, &Y.c, &bc, &E));
    CHECK_EQ_INT(bg, 3);
    CHECK_EQ_INT(bc, 3);
    int64_t ls[2] = {3, 1000};
    float *lg = rand_vec(3000, 5.f);
    lg[1000 + 999] = 50.f;
    pair L = P2(MS_F32, MS_F32, 2, ls, lg);
    int32_t z[3] = {0};
    ms_tensor ag = mk_i32(GPU, 3, z), ac = mk_i32(CPU, 3, z);
    R(GPU->ops->argmax(GPU, &L.g, ag.data, &E));
    R(CPU->ops->argmax(CPU, &L.c, ac.data, &E));
    int32_t rg[3], rc[3];
    R(GPU->ops->download(GPU, rg, ag.data, 12, &E));
    R(CPU->ops->download(CPU, rc, ac.data, 12, &E));
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(rg[i], rc[i]);
    CHECK_EQ_INT(rg[1], 999);
    {
        /* backend.h's greedy rule at its edges, on rows wider than the block (ties between threads and
         * warps): the first of equal maxima, NaN never, +inf as FLT_MAX, 0 when nothing is above -inf */
        enum { AR = 7, AV = 5000 };
        const float inf = INFINITY;
        float *e = malloc(sizeof(float) * AR * AV);
        for (int i = 0; i < AR * AV; i++) e[i] = (float)(i % 97) * 0.01f - 2.f;
        e[0 * AV + 4999] = 7.f, e[0 * AV + 1234] = 7.f, e[0 * AV + 3000] = 7.f;  /* the first: 1234 */
        for (int i = 0; i < AV; i += 3) e[1 * AV + i] = NAN;                      /* NaN everywhere else */
        e[1 * AV + 2] = 9.f, e[1 * AV + 4000] = 9.f;                             /* 2 */
        e[2 * AV + 3333] = inf, e[2 * AV + 77] = 3.4028234663852886e38f;       /* FLT_MAX first: 77 */
        e[3 * AV + 4001] = inf, e[3 * AV + 4002] = inf;                          /* 4001 */
        for (int i = 0; i < AV; i++) e[4 * AV + i] = i % 2 ? -inf : NAN;         /* 0 */
        for (int i = 0; i < AV; i++) e[5 * AV + i] = -inf;                       /* 0 */
        e[6 * AV + 3000 + 1024] = 8.f, e[6 * AV + 3000] = 8.f; /* one thread's own tie (1024 apart): 3000 */
        const int want[AR] = {1234, 2, 77, 4001, 0, 0, 3000};
        int64_t es[2] = {AR, AV};
        pair EL = P2(MS_F32, MS_F32, 2, es, e);
        int32_t z6[AR], g6[AR], c6[AR];
        for (int i = 0; i < AR; i++) z6[i] = -1; /* rows whose answer is 0 must be written */
        ms_tensor eg = mk_i32(GPU, AR, z6), ec = mk_i32(CPU, AR, z6);
        R(GPU->ops->argmax(GPU, &EL.g, eg.data, &E));
        R(CPU->ops->argmax(CPU, &EL.c, ec.data, &E));
        R(GPU->ops->download(GPU, g6, eg.data, sizeof g6, &E));
        R(CPU->ops->download(CPU, c6, ec.data, sizeof c6, &E));
        for (int i = 0; i < AR; i++) {
            CHECK_MSG(g6[i] == want[i], "argmax row %d: GPU %d, want %d", i, g6[i], want[i]);
            CHECK_MSG(c6[i] == want[i], "argmax row %d: CPU %d, want %d", i, c6[i], want[i]);
        }
        pfree(&EL);
        fr(GPU, &eg), fr(CPU, &ec);
        free(e);
    }
    /* the per-step flag (--check-numerics): reset, then the smallest code of a tensor with NaN/Inf;
     * bf16 activations (Y.g) and F32 (L.g) alike */
    int32_t big = INT32_MAX, fl = 0;
    ms_tensor fg = mk_i32(GPU, 1, &big);
    R(GPU->ops->nonfinite_flag(GPU, NULL, 0, fg.data, &E));
    R(GPU->ops->nonfinite_flag(GPU, &X.g, 1, fg.data, &E));
    R(GPU->ops->nonfinite_flag(GPU, &L.g, 2, fg.data, &E));
    R(GPU->ops->download(GPU, &fl, fg.data, 4, &E));
    CHECK_EQ_INT(fl, INT32_MAX);
    R(GPU->ops->nonfinite_flag(GPU, &Y.g, 7, fg.data, &E));
    R(GPU->ops->nonfinite_flag(GPU, &Y.g, 5, fg.data, &E));
    R(GPU->ops->nonfinite_flag(GPU, &X.g, 3, fg.data, &E));
    R(GPU->ops->download(GPU, &fl, fg.data, 4, &E));
    CHECK_EQ_INT(fl, 5);
    int32_t fc = 0;
    R(CPU->ops->nonfinite_flag(CPU, NULL, 0, &fc, &E));
    R(CPU->ops->nonfinite_flag(CPU, &Y.c, 4, &fc, &E));
    R(CPU->ops->nonfinite_flag(CPU, &X.c, 2, &fc, &E));
    CHECK_EQ_INT(fc, 4);
    fr(GPU, &fg);
    pfree(&X); pfree(&Y); pfree(&L);
    fr(GPU, &ag); fr(CPU, &ac);
    free(x); free(lg);
}

#ifdef MS_HAVE_CUDA
/* The environment-knob table, GPU or not: knobs read at every call follow setenv/unsetenv (the attention
 * and grouped-GEMM tests rely on it), a read-once knob (MS_CU_PDL) keeps its value until cu_knob_forget,
 * a bad choice or an out-of-range integer falls back to the default, and the doctor printout has a
 * header and one line per knob. Restores the variables it touches. */
static void test_knobs(void) {
    enum { NV = 9 };
    static const char *vars[NV] = {"MS_CU_GG",  "MS_ATTN_NO_MMA",  "MS_ATTN_NO_SPLIT", "MS_CU_GEMV_FP4",         "MS_CU_ROUTER",
                                   "MS_CU_PDL", "MS_CU_MLA_HEADS", "MS_CU_GW_N",       "MS_CU_BF16_STREAM_MAX_T"};
    char *saved[NV];
    for (int i = 0; i < NV; i++) saved[i] = env_push(vars[i], getenv(vars[i]));
    setenv("MS_CU_BF16_STREAM_MAX_T", "2", 1);
    CHECK_EQ_INT(cu_knob(CU_KNOB_BF16_STREAM_MAX_T), 2);
    setenv("MS_CU_BF16_STREAM_MAX_T", "9", 1); /* out of range: the default */
    CHECK_EQ_INT(cu_knob(CU_KNOB_BF16_STREAM_MAX_T), 4);
    unsetenv("MS_CU_BF16_STREAM_MAX_T");
    CHECK_EQ_INT(cu_knob(CU_KNOB_BF16_STREAM_MAX_T), 4);
    setenv("MS_CU_GG", "old", 1);
    CHECK_EQ_INT(cu_knob(CU_KNOB_GG), CU_GG_OLD);
    setenv("MS_CU_GG", "sync", 1);
    CHECK_EQ_INT(cu_knob(CU_KNOB_GG), CU_GG_SYNC);
    setenv("MS_CU_GW_N", "256", 1);
    CHECK_EQ_INT(cu_knob(CU_KNOB_GW_N), CU_GW_N_256);
    unsetenv("MS_CU_GW_N");
    CHECK_EQ_INT(cu_knob(CU_KNOB_GW_N), CU_GW_N_128);
    setenv("MS_CU_GG", "mma", 1);
    CHECK_EQ_INT(cu_knob(CU_KNOB_GG), CU_GG_MMA);
    unsetenv("MS_CU_GG");
    CHECK_EQ_INT(cu_knob(CU_KNOB_GG), CU_GG_MMA);
    setenv("MS_ATTN_NO_MMA", "", 1);
    CHECK_EQ_INT(cu_knob(CU_KNOB_ATTN_NO_MMA), 1);
    unsetenv("MS_ATTN_NO_MMA");
    CHECK_EQ_INT(cu_knob(CU_KNOB_ATTN_NO_MMA), 0);
    unsetenv("MS_ATTN_NO_SPLIT");
    CHECK_EQ_INT(cu_knob(CU_KNOB_ATTN_NO_SPLIT), 0);
    /* the batch-1 decode forms (read at every call, so one process can A/B them) */
    const char *fp4[6] = {"v2", "v1", "v2o", "v3", "auto", "w8"};
    for (int i = 0; i < 6; i++) {
        setenv("MS_CU_GEMV_FP4", fp4[i], 1);
        CHECK_EQ_INT(cu_knob(CU_KNOB_GEMV_FP4), i);
    }
    unsetenv("MS_CU_GEMV_FP4");
    CHECK_EQ_INT(cu_knob(CU_KNOB_GEMV_FP4), CU_GEMV_FP4_AUTO);
    setenv("MS_CU_ROUTER", "warp", 1);
    CHECK_EQ_INT(cu_knob(CU_KNOB_ROUTER), CU_ROUTER_WARP);
    unsetenv("MS_CU_ROUTER");
    CHECK_EQ_INT(cu_knob(CU_KNOB_ROUTER), CU_ROUTER_SPLIT);
    /* the MLA kernel's heads per block (read at every call: test_attn_impls forces both forms) */
    const char *mh[3] = {"auto", "64", "16"};
    for (int i = 0; i < 3; i++) {
        setenv("MS_CU_MLA_HEADS", mh[i], 1);
        CHECK_EQ_INT(cu_knob(CU_KNOB_MLA_HEADS), i);
    }
    setenv("MS_CU_MLA_HEADS", "32", 1); /* not a form: the default */
    CHECK_EQ_INT(cu_knob(CU_KNOB_MLA_HEADS), CU_MLA_HEADS_AUTO);
    unsetenv("MS_CU_MLA_HEADS");
    CHECK_EQ_INT(cu_knob(CU_KNOB_MLA_HEADS), CU_MLA_HEADS_AUTO);
    /* MS_CU_PDL is read once; cu_knob_forget makes the next use read the environment again */
    setenv("MS_CU_PDL", "0", 1);
    cu_knob_forget(CU_KNOB_PDL);
    CHECK_EQ_INT(cu_knob(CU_KNOB_PDL), 0);
    setenv("MS_CU_PDL", "1", 1);
    CHECK_EQ_INT(cu_knob(CU_KNOB_PDL), 0); /* kept until forgotten */
    setenv("MS_CU_PDL", "2", 1);           /* out of range: the default, on */
    cu_knob_forget(CU_KNOB_PDL);
    CHECK_EQ_INT(cu_knob(CU_KNOB_PDL), 1);
    unsetenv("MS_CU_PDL");
    cu_knob_forget(CU_KNOB_PDL);
    CHECK_EQ_INT(cu_knob(CU_KNOB_PDL), 1);
    const char *bt = getenv("MS_CU_BF16_GEMV_MAX_T"); /* read once: set in main before this runs */
    if (bt) CHECK_EQ_INT(cu_knob(CU_KNOB_BF16_GEMV_MAX_T), atoi(bt));
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (f) {
        ms_cuda_knobs_print(f);
        rewind(f);
        char line[512];
        int n = 0, seen = 0;
        while (fgets(line, sizeof line, f)) {
            n++;
            if (strstr(line, "MS_CU_GEMV_MAX_T ")) seen++;
        }
        fclose(f);
        CHECK_EQ_INT(n, CU_KNOB_COUNT + 1);
        CHECK_EQ_INT(seen, 1);
    }
    for (int i = 0; i < NV; i++) env_pop(vars[i], saved[i]);
    cu_knob_forget(CU_KNOB_PDL); /* the ops below run with the caller's MS_CU_PDL */
}
#endif

int main(void) {
    ms_err err = {0};
    /* bf16 linears with few rows take the tensor-core GEMV here (cuBLASLt is the default; the gv2
     * run of gpu-check covers it with MS_CU_BF16_GEMV_MAX_T=0) */
    setenv("MS_CU_BF16_GEMV_MAX_T", "16", 0);
    /* ... and not the streaming form, which test_linear_bf16_stream turns on for its own cases (the
     * model-level CUDA tests run it by default) */
    setenv("MS_CU_BF16_STREAM_MAX_T", "0", 0);
#ifdef MS_HAVE_CUDA
    RUN(test_knobs);
#endif
    if (ms_backend_create("cuda", 0, &GPU, &err) != MS_OK) {
        printf("no GPU: the ops are skipped (%s)\n", err.msg);
        return TEST_SUMMARY();
    }
    if (ms_backend_create("cpu", -1, &CPU, &err) != MS_OK) {
        fprintf(stderr, "cpu backend: %s\n", err.msg);
        return 1;
    }
    RUN(test_embed);
    RUN(test_norms);
    RUN(test_elementwise);
    RUN(test_rope);
    RUN(test_linear);
    RUN(test_linear_mma);
    RUN(test_linear_swiglu);
#ifdef MS_HAVE_CUDA
    RUN(test_linear_w8);
    RUN(test_linear_bf16_stream);
    RUN(test_linear_bf16_dyn);
    RUN(test_linear_bf16_mma);
    RUN(test_linear_bf16_l2pf);
#endif
    RUN(test_gqa_prep);
    RUN(test_stack_linears);
    RUN(test_attn_gqa);
    RUN(test_attn_gqa_batches);
#ifdef MS_HAVE_CUDA
    RUN(test_attn_gqa_prep);
    RUN(test_attn_merge_early);
    RUN(test_norm_early);
#endif
    RUN(test_mla_attn);
    RUN(test_attn_impls);
    RUN(test_mla_proj);
    RUN(test_absorb_rope);
    RUN(test_indexer);
    RUN(test_router);
    RUN(test_router_decode);
#ifdef MS_HAVE_CUDA
    RUN(test_norm_fold);
#endif
    RUN(test_mla_kv_prep);
    RUN(test_idx_k_prep);
    RUN(test_mla_prep);
    RUN(test_odd_fixture_shapes);
    RUN(test_checks);
    ms_backend_destroy(GPU);
    ms_backend_destroy(CPU);
    return TEST_SUMMARY();
}
