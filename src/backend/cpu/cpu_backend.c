/* cpu_backend.c - the CPU backend: host memory, float32 activations, every op of backend.h split
 * over the process thread pool. Weights stay in their checkpoint format (mmap views) and are
 * dequantized on the fly by cpu_linear.c. Tiny ops run inline on the caller (ms_cpu_grain) so a
 * small model's decode step is not dominated by thread wakeups. Attention and caches live in
 * cpu_attn.c. */
#include "backend/cpu/cpu_impl.h"

#include "core/dtype.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MS_MAX_EXPERTS 4096 /* routing scratch on the stack up to this many experts (heap beyond) */

/* ---------------------------------------------------------------- helpers */

int cpu_grow(float **buf, size_t *cap, size_t floats, ms_err *err) {
    if (floats <= *cap) return MS_OK;
    size_t n = floats + floats / 4 + 64;
    float *p = aligned_alloc(64, ((n * sizeof(float)) + 63) / 64 * 64);
    if (!p) return ms_errf(err, MS_ERR_NOMEM, "cpu backend: out of memory allocating %zu bytes of scratch", n * 4);
    free(*buf);
    *buf = p;
    *cap = n;
    return MS_OK;
}

int cpu_scratch(cpu_impl *c, size_t floats, ms_err *err) {
    if (floats <= c->scr_per) return MS_OK;
    size_t per = (floats + 15) / 16 * 16 + 64; /* keep slices on separate cache lines */
    float *p = aligned_alloc(64, per * (size_t)c->nth * sizeof(float));
    if (!p)
        return ms_errf(err, MS_ERR_NOMEM, "cpu backend: out of memory allocating %zu bytes of per-thread scratch",
                       per * (size_t)c->nth * sizeof(float));
    free(c->scr);
    c->scr = p;
    c->scr_per = per;
    return MS_OK;
}

static void check_f32(const ms_tensor *t) { MS_ASSERT(t->dtype == MS_F32 && t->data != NULL); }

static int64_t rows_of(const ms_tensor *t, int64_t *cols) {
    MS_ASSERT(t->ndim >= 1);
    int64_t c = t->shape[t->ndim - 1];
    *cols = c;
    return c ? ms_tensor_numel(t) / c : 0;
}

/* Weight vector as float32: the data itself when F32, else converted into buf. */
static const float *vec_f32(const ms_tensor *v, float **buf, size_t *cap, size_t off, ms_err *err) {
    int64_t n = ms_tensor_numel(v);
    if (v->dtype == MS_F32) return (const float *)v->data;
    if (cpu_grow(buf, cap, off + (size_t)n, err) != MS_OK) return NULL;
    ms_convert_to_f32(v->dtype, v->data, *buf + off, (size_t)n);
    return *buf + off;
}

/* ---------------------------------------------------------------- memory */

static void cpu_destroy(ms_backend *b) {
    cpu_impl *c = cpu_of(b);
    free(c->scr);
    free(c->wbuf);
    free(c->aux);
    free(c);
    free(b);
}

static int cpu_alloc(ms_backend *b, ms_tensor *t, ms_err *err) {
    size_t n = ms_tensor_nbytes(t);
    size_t sz = (n + 63) / 64 * 64;
    if (sz == 0) sz = 64;
    t->data = aligned_alloc(64, sz);
    if (!t->data) return ms_errf(err, MS_ERR_NOMEM, "cpu backend: out of memory allocating %zu bytes", n);
    return MS_OK;
}

static void cpu_free(ms_backend *b, ms_tensor *t) {
    free(t->data);
    t->data = NULL;
}

static int cpu_copy(ms_backend *b, void *dst, const void *src, size_t n, ms_err *err) {
    if (n) memcpy(dst, src, n);
    return MS_OK;
}

static int cpu_sync(ms_backend *b, ms_err *err) { return MS_OK; }

static int cpu_place_tensor(ms_backend *b, ms_tensor *t, ms_err *err) { return MS_OK; }

static int cpu_place_linear(ms_backend *b, ms_linear *W, ms_err *err) {
    const char *nm = W->name ? W->name : "(linear)";
    switch (W->fmt) {
    case MS_WFMT_PLAIN:
        if (W->w.dtype != MS_F32 && W->w.dtype != MS_BF16 && W->w.dtype != MS_F16)
            return ms_errf(err, MS_ERR_UNSUPPORTED, "tensor %s: plain weight dtype %s is not supported by the cpu backend",
                           nm, ms_dtype_name(W->w.dtype));
        break;
    case MS_WFMT_FP8:
        if (!W->scale.data || W->scale.dtype != MS_F32)
            return ms_errf(err, MS_ERR_FORMAT, "tensor %s: fp8 weight needs a float32 block scale", nm);
        break;
    case MS_WFMT_NVFP4:
        if (W->n_in % 16 || !W->scale.data || W->scale.dtype != MS_F8E4M3)
            return ms_errf(err, MS_ERR_FORMAT, "tensor %s: nvfp4 weight needs K %% 16 == 0 and an e4m3 block scale", nm);
        break;
    }
    return MS_OK;
}

static void cpu_unplace_tensor(ms_backend *b, ms_tensor *t) {}
static void cpu_unplace_linear(ms_backend *b, ms_linear *W) {}

/* ---------------------------------------------------------------- elementwise */

typedef struct {
    const void *src;
    ms_dtype sdt;
    const int32_t *idx;
    float *dst;
    int64_t cols;
} rows_ctx;

static void embed_fn(void *p, int64_t b, int64_t e, int w) {
    rows_ctx *c = p;
    size_t es = ms_dtype_size(c->sdt);
    for (int64_t r = b; r < e; r++)
        ms_convert_to_f32(c->sdt, (const char *)c->src + (size_t)c->idx[r] * (size_t)c->cols * es, c->dst + r * c->cols,
                          (size_t)c->cols);
}

static int cpu_embed(ms_backend *b, const ms_tensor *table, const int32_t *ids, int n, ms_tensor *out, ms_err *err) {
    check_f32(out);
    int64_t V = table->shape[0], H = table->shape[1];
    MS_ASSERT(out->shape[out->ndim - 1] == H && ms_tensor_numel(out) >= (int64_t)n * H);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return ms_errf(err, MS_ERR_INVALID, "token id %d at index %d is out of range (vocab size %lld)", ids[i], i,
                           (long long)V);
    rows_ctx c = {table->data, table->dtype, ids, out->data, H};
    ms_pool_run(cpu_of(b)->pool, n, ms_cpu_grain((double)H), embed_fn, &c);
    return MS_OK;
}

static int cpu_embed_part(ms_backend *b, const ms_tensor *table, const int32_t *ids, int n, int64_t v0, ms_tensor *out,
                          ms_err *err) {
    check_f32(out);
    const int64_t rows = table->shape[0], H = table->shape[1];
    const size_t es = ms_dtype_size(table->dtype);
    MS_ASSERT(out->shape[out->ndim - 1] == H && ms_tensor_numel(out) >= (int64_t)n * H);
    float *o = out->data;
    for (int i = 0; i < n; i++) {
        const int64_t r = (int64_t)ids[i] - v0;
        if (r >= 0 && r < rows) ms_convert_to_f32(table->dtype, (const char *)table->data + r * H * (int64_t)es, o + (int64_t)i * H, (size_t)H);
        else memset(o + (int64_t)i * H, 0, sizeof(float) * (size_t)H);
    }
    return MS_OK;
}

static int cpu_remap_ids(ms_backend *b, int32_t *ids, int64_t n, int lo, int count, ms_err *err) {
    for (int64_t i = 0; i < n; i++) ids[i] = ids[i] >= lo && ids[i] < lo + count ? ids[i] - lo : -1;
    return MS_OK;
}

static int cpu_moe_append(ms_backend *b, const int32_t *ids, const float *w, int T, int k, int32_t id, float weight,
                          int32_t *ids_out, float *w_out, ms_err *err) {
    for (int t = 0; t < T; t++) {
        memcpy(ids_out + (size_t)t * (k + 1), ids + (size_t)t * k, sizeof(int32_t) * (size_t)k);
        memcpy(w_out + (size_t)t * (k + 1), w + (size_t)t * k, sizeof(float) * (size_t)k);
        ids_out[(size_t)t * (k + 1) + k] = id;
        w_out[(size_t)t * (k + 1) + k] = weight;
    }
    return MS_OK;
}

typedef struct {
    float *resid;
    const float *delta;
    const float *x;
    float *out;
    const float *w, *bias;
    int64_t D;
    float eps;
} norm_ctx;

static void rms_row(const float *x, const float *w, int64_t D, float eps, float *out) {
    double ss = 0;
    for (int64_t i = 0; i < D; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / (double)D) + eps);
    for (int64_t i = 0; i < D; i++) out[i] = w[i] * (x[i] * r);
}

static void rmsnorm_fn(void *p, int64_t b, int64_t e, int wk) {
    norm_ctx *c = p;
    for (int64_t r = b; r < e; r++) {
        if (c->resid) {
            float *x = c->resid + r * c->D;
            if (c->delta) {
                const float *d = c->delta + r * c->D;
                for (int64_t i = 0; i < c->D; i++) x[i] += d[i];
            }
            rms_row(x, c->w, c->D, c->eps, c->out + r * c->D);
        } else {
            rms_row(c->x + r * c->D, c->w, c->D, c->eps, c->out + r * c->D);
        }
    }
}

static int cpu_rmsnorm(ms_backend *b, const ms_tensor *x, const ms_tensor *w, float eps, ms_tensor *out, ms_err *err) {
    check_f32(x);
    check_f32(out);
    cpu_impl *c = cpu_of(b);
    int64_t D, R = rows_of(x, &D);
    MS_ASSERT(ms_tensor_numel(w) == D && ms_tensor_numel(out) == ms_tensor_numel(x));
    const float *wf = vec_f32(w, &c->wbuf, &c->wbuf_cap, 0, err);
    if (!wf) return err->code;
    norm_ctx nc = {NULL, NULL, x->data, out->data, wf, NULL, D, eps};
    ms_pool_run(c->pool, R, ms_cpu_grain(3.0 * D), rmsnorm_fn, &nc);
    return MS_OK;
}

static int cpu_add_rmsnorm(ms_backend *b, ms_tensor *resid, const ms_tensor *delta, const ms_tensor *w, float eps,
                           ms_tensor *out, ms_err *err) {
    check_f32(resid);
    check_f32(out);
    if (delta) check_f32(delta);
    cpu_impl *c = cpu_of(b);
    int64_t D, R = rows_of(resid, &D);
    MS_ASSERT(ms_tensor_numel(w) == D && ms_tensor_numel(out) == ms_tensor_numel(resid));
    MS_ASSERT(!delta || ms_tensor_numel(delta) == ms_tensor_numel(resid));
    const float *wf = vec_f32(w, &c->wbuf, &c->wbuf_cap, 0, err);
    if (!wf) return err->code;
    norm_ctx nc = {resid->data, delta ? delta->data : NULL, NULL, out->data, wf, NULL, D, eps};
    ms_pool_run(c->pool, R, ms_cpu_grain(4.0 * D), rmsnorm_fn, &nc);
    return MS_OK;
}

static void layernorm_fn(void *p, int64_t b, int64_t e, int wk) {
    norm_ctx *c = p;
    const int64_t D = c->D;
    for (int64_t r = b; r < e; r++) {
        const float *x = c->x + r * D;
        float *o = c->out + r * D;
        double s = 0;
        for (int64_t i = 0; i < D; i++) s += x[i];
        float mean = (float)(s / (double)D);
        double v = 0;
        for (int64_t i = 0; i < D; i++) v += (double)(x[i] - mean) * (x[i] - mean);
        float rs = 1.0f / sqrtf((float)(v / (double)D) + c->eps);
        for (int64_t i = 0; i < D; i++) o[i] = (x[i] - mean) * rs * c->w[i] + (c->bias ? c->bias[i] : 0.0f);
    }
}

static int cpu_layernorm(ms_backend *b, const ms_tensor *x, const ms_tensor *w, const ms_tensor *bias, float eps,
                         ms_tensor *out, ms_err *err) {
    check_f32(x);
    check_f32(out);
    cpu_impl *c = cpu_of(b);
    int64_t D, R = rows_of(x, &D);
    MS_ASSERT(ms_tensor_numel(w) == D && ms_tensor_numel(out) == ms_tensor_numel(x));
    /* weight converted into wbuf[0,D), bias into wbuf[D,2D) when not already float32 */
    MS_TRY(cpu_grow(&c->wbuf, &c->wbuf_cap, 2 * (size_t)D, err));
    const float *wf = (const float *)w->data, *bf = NULL;
    if (w->dtype != MS_F32) ms_convert_to_f32(w->dtype, w->data, c->wbuf, (size_t)D), wf = c->wbuf;
    if (bias && bias->data) {
        MS_ASSERT(ms_tensor_numel(bias) == D);
        bf = (const float *)bias->data;
        if (bias->dtype != MS_F32) ms_convert_to_f32(bias->dtype, bias->data, c->wbuf + D, (size_t)D), bf = c->wbuf + D;
    }
    norm_ctx nc = {NULL, NULL, x->data, out->data, wf, bf, D, eps};
    ms_pool_run(c->pool, R, ms_cpu_grain(5.0 * D), layernorm_fn, &nc);
    return MS_OK;
}

typedef struct {
    float *y;
    const float *x, *g, *u;
    float alpha;
} ew_ctx;

static void add_fn(void *p, int64_t b, int64_t e, int w) {
    ew_ctx *c = p;
    for (int64_t i = b; i < e; i++) c->y[i] += c->x[i];
}

static int cpu_add(ms_backend *b, ms_tensor *y, const ms_tensor *x, ms_err *err) {
    check_f32(y);
    check_f32(x);
    MS_ASSERT(ms_tensor_numel(y) == ms_tensor_numel(x));
    ew_ctx c = {y->data, x->data, NULL, NULL, 0};
    ms_pool_run(cpu_of(b)->pool, ms_tensor_numel(y), 65536, add_fn, &c);
    return MS_OK;
}

static void scale_fn(void *p, int64_t b, int64_t e, int w) {
    ew_ctx *c = p;
    for (int64_t i = b; i < e; i++) c->y[i] *= c->alpha;
}

static int cpu_scale(ms_backend *b, ms_tensor *x, float alpha, ms_err *err) {
    check_f32(x);
    ew_ctx c = {x->data, NULL, NULL, NULL, alpha};
    ms_pool_run(cpu_of(b)->pool, ms_tensor_numel(x), 65536, scale_fn, &c);
    return MS_OK;
}

static void silu_fn(void *p, int64_t b, int64_t e, int w) {
    ew_ctx *c = p;
    for (int64_t i = b; i < e; i++) {
        float g = c->g[i];
        c->y[i] = g / (1.0f + expf(-g)) * c->u[i];
    }
}

static int cpu_silu_mul(ms_backend *b, const ms_tensor *g, const ms_tensor *u, ms_tensor *out, ms_err *err) {
    check_f32(g);
    check_f32(u);
    check_f32(out);
    MS_ASSERT(ms_tensor_numel(g) == ms_tensor_numel(u) && ms_tensor_numel(out) == ms_tensor_numel(g));
    ew_ctx c = {out->data, NULL, g->data, u->data, 0};
    ms_pool_run(cpu_of(b)->pool, ms_tensor_numel(g), 16384, silu_fn, &c);
    return MS_OK;
}

typedef struct {
    const float *src;
    float *dst;
    int64_t sc, dc, c0, nc;
    const int32_t *idx;
} cols_ctx;

static void copy_cols_fn(void *p, int64_t b, int64_t e, int w) {
    cols_ctx *c = p;
    for (int64_t r = b; r < e; r++) memcpy(c->dst + r * c->dc, c->src + r * c->sc + c->c0, (size_t)c->nc * 4);
}

static int cpu_copy_cols(ms_backend *b, const ms_tensor *src, int c0, int nc, ms_tensor *dst, ms_err *err) {
    check_f32(src);
    check_f32(dst);
    int64_t C, T = rows_of(src, &C), dc, Td = rows_of(dst, &dc);
    MS_ASSERT(c0 >= 0 && c0 + nc <= C && dc == nc && Td == T);
    cols_ctx c = {src->data, dst->data, C, dc, c0, nc, NULL};
    ms_pool_run(cpu_of(b)->pool, T, ms_cpu_grain((double)nc), copy_cols_fn, &c);
    return MS_OK;
}

static void set_cols_fn(void *p, int64_t b, int64_t e, int w) {
    cols_ctx *c = p;
    for (int64_t r = b; r < e; r++) memcpy(c->dst + r * c->dc + c->c0, c->src + r * c->sc, (size_t)c->nc * 4);
}

static int cpu_set_cols(ms_backend *b, const ms_tensor *src, int c0, ms_tensor *dst, ms_err *err) {
    check_f32(src);
    check_f32(dst);
    int64_t nc, T = rows_of(src, &nc), C, Td = rows_of(dst, &C);
    MS_ASSERT(c0 >= 0 && c0 + nc <= C && Td == T);
    cols_ctx c = {src->data, dst->data, nc, C, c0, nc, NULL};
    ms_pool_run(cpu_of(b)->pool, T, ms_cpu_grain((double)nc), set_cols_fn, &c);
    return MS_OK;
}

static void gather_fn(void *p, int64_t b, int64_t e, int w) {
    cols_ctx *c = p;
    for (int64_t r = b; r < e; r++) memcpy(c->dst + r * c->dc, c->src + (int64_t)c->idx[r] * c->sc, (size_t)c->dc * 4);
}

static int cpu_gather_rows(ms_backend *b, const ms_tensor *src, const int32_t *idx, int n, ms_tensor *dst,
                           ms_err *err) {
    check_f32(src);
    check_f32(dst);
    int64_t C, R = rows_of(src, &C), dc;
    (void)rows_of(dst, &dc);
    MS_ASSERT(dc == C && ms_tensor_numel(dst) >= (int64_t)n * C);
    for (int i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= R)
            return ms_errf(err, MS_ERR_INVALID, "gather_rows: row index %d at %d is out of range (%lld rows)", idx[i], i,
                           (long long)R);
    cols_ctx c = {src->data, dst->data, C, C, 0, C, idx};
    ms_pool_run(cpu_of(b)->pool, n, ms_cpu_grain((double)C), gather_fn, &c);
    return MS_OK;
}

typedef struct {
    float *x;
    const int32_t *pos;
    int64_t nh, d;
    int rot_off, half, interleaved;
    const float *inv_freq;
} rope_ctx;

#define ROPE_CHUNK 512 /* rotary pairs whose cos/sin sit on the stack at a time (any rotary dim works) */

static void rope_fn(void *p, int64_t b, int64_t e, int w) {
    rope_ctx *c = p;
    float cs[ROPE_CHUNK], sn[ROPE_CHUNK];
    for (int64_t t = b; t < e; t++) {
        float pos = (float)c->pos[t];
        for (int i0 = 0; i0 < c->half; i0 += ROPE_CHUNK) {
            int n = c->half - i0 < ROPE_CHUNK ? c->half - i0 : ROPE_CHUNK;
            for (int i = 0; i < n; i++) {
                float ang = c->inv_freq[i0 + i] * pos; /* float32 angle as transformers computes it */
                cs[i] = (float)cos((double)ang);
                sn[i] = (float)sin((double)ang);
            }
            for (int64_t h = 0; h < c->nh; h++) {
                float *v = c->x + (t * c->nh + h) * c->d + c->rot_off;
                if (c->interleaved) {
                    for (int i = 0; i < n; i++) {
                        float a = v[2 * (i0 + i)], bb = v[2 * (i0 + i) + 1];
                        v[2 * (i0 + i)] = a * cs[i] - bb * sn[i];
                        v[2 * (i0 + i) + 1] = bb * cs[i] + a * sn[i];
                    }
                } else {
                    for (int i = 0; i < n; i++) {
                        float a = v[i0 + i], bb = v[i0 + i + c->half];
                        v[i0 + i] = a * cs[i] - bb * sn[i];
                        v[i0 + i + c->half] = bb * cs[i] + a * sn[i];
                    }
                }
            }
        }
    }
}

int cpu_rope(ms_backend *b, ms_tensor *x, const int32_t *pos, const ms_rope_cfg *rc, ms_err *err) {
    check_f32(x);
    MS_ASSERT(x->ndim == 3 && rc->rot_dim % 2 == 0 && rc->rot_off >= 0 && rc->rot_off + rc->rot_dim <= x->shape[2]);
    float inv_small[ROPE_CHUNK];
    int half = rc->rot_dim / 2;
    float *inv = inv_small;
    if (half > ROPE_CHUNK) { /* a rotary dim above 1024: legal, rare; one small allocation per call */
        inv = malloc(sizeof(float) * (size_t)half);
        if (!inv) return ms_errf(err, MS_ERR_NOMEM, "rope: out of memory for %d inverse frequencies", half);
    }
    for (int i = 0; i < half; i++) {
        /* transformers: 1 / base ** (arange(0, dim, 2).float() / dim), all float32 */
        float ex = (float)(2 * i) / (float)rc->rot_dim;
        inv[i] = 1.0f / powf((float)rc->theta, ex);
    }
    rope_ctx c = {x->data, pos, x->shape[1], x->shape[2], rc->rot_off, half, rc->interleaved, inv};
    ms_pool_run(cpu_of(b)->pool, x->shape[0], ms_cpu_grain(8.0 * x->shape[1] * half + 40.0 * half), rope_fn, &c);
    if (inv != inv_small) free(inv);
    return MS_OK;
}

/* The fused indexer-key op is the three ops it replaces, called in order on the same buffers, so the
 * CPU result is theirs bit for bit; only the forward's op count changes. */
static int cpu_idx_k_prep(ms_backend *b, ms_tensor *x, const ms_tensor *w, const ms_tensor *bias, float eps,
                          const int32_t *pos, const ms_rope_cfg *rc, ms_tensor *cache, const int32_t *slot, ms_err *err) {
    const int64_t d = x->ndim ? x->shape[x->ndim - 1] : 0, T = d ? ms_tensor_numel(x) / d : 0;
    if (d < 1 || !rc || rc->rot_dim % 2 || rc->rot_off < 0 || rc->rot_dim < 0 || rc->rot_off + rc->rot_dim > d)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "idx_k_prep: the rotary dims must lie inside the %lld-wide key row",
                       (long long)d);
    MS_TRY(cpu_layernorm(b, x, w, bias, eps, x, err));
    ms_tensor x3 = ms_tensor_reshape(x, 3, (int64_t[]){T, 1, d});
    MS_TRY(cpu_rope(b, &x3, pos, rc, err));
    return cpu_kv_store(b, cache, x, slot, err);
}

/* ---------------------------------------------------------------- GEMM */

#define FUSED_RB 8   /* rows per work item on the fused path */
#define GEMM_RB 64   /* rows per dequantized tile */
#define GEMM_TB 256  /* tokens per sgemm call */

typedef struct {
    const ms_linear *W;
    const float *x;
    float *y;
    int T, nTB;
    int64_t N, K;
    float *scr;
    size_t scr_per;
    int64_t last_rb[256];
} lin_ctx;

static void lin_fused_fn(void *p, int64_t b, int64_t e, int w) {
    lin_ctx *c = p;
    int64_t r0 = b * FUSED_RB, r1 = e * FUSED_RB < c->N ? e * FUSED_RB : c->N;
    ms_cpu_linear_rows(c->W, r0, r1, c->x, c->K, c->T, c->y + r0, c->N, NULL);
}

static void lin_gemm_fn(void *p, int64_t b, int64_t e, int w) {
    lin_ctx *c = p;
    const ms_linear *W = c->W;
    const int64_t K = c->K;
    const int direct = W->fmt == MS_WFMT_PLAIN && W->w.dtype == MS_F32;
    float *tile = c->scr + (size_t)w * c->scr_per;
    for (int64_t it = b; it < e; it++) {
        int64_t rb = it / c->nTB, tb = it % c->nTB;
        int64_t r0 = rb * GEMM_RB, r1 = r0 + GEMM_RB < c->N ? r0 + GEMM_RB : c->N;
        int t0 = (int)(tb * GEMM_TB), nt = c->T - t0 < GEMM_TB ? c->T - t0 : GEMM_TB;
        const float *wt;
        if (direct) {
            wt = (const float *)W->w.data + r0 * K;
        } else {
            if (c->last_rb[w] != rb) {
                for (int64_t n = r0; n < r1; n++) ms_cpu_dequant(W, n, 0, K, tile + (n - r0) * K);
                c->last_rb[w] = rb;
            }
            wt = tile;
        }
        float *y = c->y + (int64_t)t0 * c->N + r0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nt, (int)(r1 - r0), (int)K, 1.0f, c->x + (int64_t)t0 * K,
                    (int)K, wt, (int)K, 0.0f, y, (int)c->N);
        if (W->bias.data) {
            for (int64_t n = r0; n < r1; n++) {
                float bv;
                ms_convert_to_f32(W->bias.dtype, (const char *)W->bias.data + n * ms_dtype_size(W->bias.dtype), &bv, 1);
                for (int t = 0; t < nt; t++) y[(int64_t)t * c->N + (n - r0)] += bv;
            }
        }
    }
}

/* y [T,N] = x [T,K] W^T on the pool (callers: linear op, router). */
static int cpu_linear_f32(cpu_impl *c, const ms_linear *W, const float *x, int T, float *y, ms_err *err) {
    const int64_t N = W->n_out, K = W->n_in;
    if (T <= 0 || N <= 0) return MS_OK;
    if (T <= MS_CPU_FUSED_MAX_T) {
        lin_ctx lc = {.W = W, .x = x, .y = y, .T = T, .N = N, .K = K};
        int64_t items = (N + FUSED_RB - 1) / FUSED_RB;
        ms_pool_run(c->pool, items, ms_cpu_grain((double)FUSED_RB * K * T), lin_fused_fn, &lc);
        return MS_OK;
    }
    lin_ctx *lc = calloc(1, sizeof *lc);
    if (!lc) return ms_errf(err, MS_ERR_NOMEM, "linear %s: out of memory", W->name ? W->name : "");
    *lc = (lin_ctx){.W = W, .x = x, .y = y, .T = T, .N = N, .K = K};
    lc->nTB = (T + GEMM_TB - 1) / GEMM_TB;
    for (int i = 0; i < 256; i++) lc->last_rb[i] = -1;
    int rc = cpu_scratch(c, (size_t)GEMM_RB * (size_t)K, err);
    if (rc == MS_OK) {
        lc->scr = c->scr;
        lc->scr_per = c->scr_per;
        int64_t items = (N + GEMM_RB - 1) / GEMM_RB * lc->nTB;
        ms_pool_run(c->pool, items, 1, lin_gemm_fn, lc);
    }
    free(lc);
    return rc;
}

static int cpu_linear(ms_backend *b, const ms_linear *W, const ms_tensor *x, ms_tensor *y, ms_err *err) {
    check_f32(x);
    check_f32(y);
    int64_t K, T = rows_of(x, &K), N;
    MS_ASSERT(K == W->n_in);
    MS_ASSERT(rows_of(y, &N) == T && N == W->n_out);
    return cpu_linear_f32(cpu_of(b), W, x->data, (int)T, y->data, err);
}

/* ---------------------------------------------------------------- routing */

typedef struct {
    const float *logits;
    const float *bias;
    const ms_route_cfg *rc;
    int32_t *ids;
    float *wts;
    int nomem; /* set by a worker whose scratch for more than MS_MAX_EXPERTS experts was not allocated */
} route_ctx;

static void route_fn(void *p, int64_t b, int64_t e, int wk) {
    route_ctx *c = p;
    const ms_route_cfg *rc = c->rc;
    const int E = rc->n_experts, k = rc->topk;
    /* per-expert scratch: on the stack up to MS_MAX_EXPERTS, else on the heap (any expert count) */
    float s_st[MS_MAX_EXPERTS], ch_st[MS_MAX_EXPERTS], gsc_st[MS_MAX_EXPERTS];
    unsigned char taken_st[MS_MAX_EXPERTS], keep_st[MS_MAX_EXPERTS];
    float *s = s_st, *ch = ch_st, *gsc = gsc_st;
    unsigned char *taken = taken_st, *keep = keep_st;
    void *heap = NULL;
    (void)wk;
    if (E > MS_MAX_EXPERTS) {
        heap = malloc((size_t)E * (3 * sizeof(float) + 2));
        if (!heap) { __atomic_store_n(&c->nomem, 1, __ATOMIC_RELAXED); return; }
        s = heap;
        ch = s + E;
        gsc = ch + E;
        taken = (unsigned char *)(gsc + E);
        keep = taken + E;
    }
    for (int64_t t = b; t < e; t++) {
        const float *l = c->logits + t * E;
        for (int i = 0; i < E; i++) {
            s[i] = 1.0f / (1.0f + expf(-l[i]));
            ch[i] = s[i] + (c->bias ? c->bias[i] : 0.0f);
            taken[i] = 0;
        }
        if (rc->n_group > 1) {
            /* group score = sum of its two largest biased scores; keep the topk_group best groups */
            const int gs = E / rc->n_group;
            for (int g = 0; g < rc->n_group; g++) {
                float m1 = -INFINITY, m2 = -INFINITY;
                for (int i = g * gs; i < (g + 1) * gs; i++) {
                    if (ch[i] > m1) { m2 = m1; m1 = ch[i]; }
                    else if (ch[i] > m2) m2 = ch[i];
                }
                gsc[g] = m1 + m2;
                keep[g] = 0;
            }
            for (int j = 0; j < rc->topk_group; j++) {
                int best = -1;
                for (int g = 0; g < rc->n_group; g++)
                    if (!keep[g] && (best < 0 || gsc[g] > gsc[best])) best = g;
                keep[best] = 1;
            }
            /* experts of dropped groups score 0, not -inf: transformers' masked_fill(~mask, 0.0), which
             * the CUDA router follows too (a kept expert whose biased score is negative loses to them) */
            for (int g = 0; g < rc->n_group; g++)
                if (!keep[g])
                    for (int i = g * gs; i < (g + 1) * gs; i++) ch[i] = 0.0f;
        }
        int32_t *ids = c->ids + t * k;
        float *w = c->wts + t * k;
        float sum = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int i = 0; i < E; i++)
                if (!taken[i] && (best < 0 || ch[i] > ch[best])) best = i;
            taken[best] = 1;
            ids[j] = best;
            w[j] = s[best];
            sum += s[best];
        }
        if (rc->norm_topk_prob) {
            float den = sum + 1e-20f;
            for (int j = 0; j < k; j++) w[j] /= den;
        }
        for (int j = 0; j < k; j++) w[j] *= rc->routed_scaling_factor;
    }
    free(heap);
}

/* 1 when cpu_router can route with rc */
static int cpu_route_ok(const ms_route_cfg *rc) {
    const int E = rc->n_experts;
    return !(rc->topk < 1 || rc->topk > E || rc->n_group < 1 || E % rc->n_group || rc->topk_group < 1 ||
             rc->topk_group > rc->n_group || (rc->n_group > 1 && E / rc->n_group < 2) ||
             (int64_t)rc->topk_group * (E / rc->n_group) < rc->topk);
}

static int cpu_router(ms_backend *b, const ms_tensor *x, const ms_linear *gate, const ms_tensor *bias,
                      const ms_route_cfg *rc, int32_t *ids, float *w, ms_err *err) {
    check_f32(x);
    cpu_impl *c = cpu_of(b);
    int64_t H, T = rows_of(x, &H);
    const int E = rc->n_experts;
    MS_ASSERT(gate->n_out == E && gate->n_in == H);
    if (!cpu_route_ok(rc))
        return ms_errf(err, MS_ERR_UNSUPPORTED,
                       "router %s: unsupported routing (experts %d, top-k %d, n_group %d, topk_group %d)",
                       gate->name ? gate->name : "", E, rc->topk, rc->n_group, rc->topk_group);
    MS_TRY(cpu_grow(&c->aux, &c->aux_cap, (size_t)T * E, err));
    MS_TRY(cpu_linear_f32(c, gate, x->data, (int)T, c->aux, err));
    const float *bf = NULL;
    if (bias && bias->data) {
        MS_ASSERT(ms_tensor_numel(bias) == E);
        bf = vec_f32(bias, &c->wbuf, &c->wbuf_cap, 0, err);
        if (!bf) return err->code;
    }
    route_ctx rcx = {c->aux, bf, rc, ids, w, 0};
    ms_pool_run(c->pool, T, ms_cpu_grain(4.0 * E * (rc->topk + 4)), route_fn, &rcx);
    if (rcx.nomem)
        return ms_errf(err, MS_ERR_NOMEM, "router %s: out of memory for the scores of %d experts", gate->name ? gate->name : "", E);
    return MS_OK;
}

/* ---------------------------------------------------------------- checks */

static int cpu_find_nonfinite(ms_backend *b, const ms_tensor *x, int64_t *bad_row, ms_err *err) {
    check_f32(x);
    int64_t C, R = rows_of(x, &C);
    const float *p = x->data;
    *bad_row = -1;
    for (int64_t r = 0; r < R; r++)
        for (int64_t i = 0; i < C; i++)
            if (!isfinite(p[r * C + i])) { *bad_row = r; return MS_OK; }
    return MS_OK;
}

static int cpu_nonfinite_flag(ms_backend *b, const ms_tensor *x, int32_t code, int32_t *flag, ms_err *err) {
    (void)b;
    (void)err;
    if (!x) {
        *flag = INT32_MAX;
        return MS_OK;
    }
    check_f32(x);
    const uint32_t *u = x->data; /* all-ones exponent = NaN or Inf: integer ops, so the loop vectorises */
    const int64_t n = ms_tensor_numel(x);
    uint32_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad |= (u[i] & 0x7f800000u) == 0x7f800000u;
    if (bad && code < *flag) *flag = code;
    return MS_OK;
}

typedef struct argmax_ctx {
    const float *x;
    int64_t V;
    int32_t *out;
} argmax_ctx;

/* rows [b, e): backend.h's rule (ms_greedy_argmax) */
static void argmax_fn(void *ctx, int64_t b, int64_t e, int worker) {
    (void)worker;
    const argmax_ctx *c = ctx;
    for (int64_t r = b; r < e; r++) c->out[r] = (int32_t)ms_greedy_argmax(c->x + r * c->V, c->V);
}

static int cpu_argmax(ms_backend *b, const ms_tensor *logits, int32_t *out, ms_err *err) {
    check_f32(logits);
    int64_t V, R = rows_of(logits, &V);
    argmax_ctx c = {logits->data, V, out};
    ms_pool_run(cpu_of(b)->pool, R, ms_cpu_grain(2.0 * (double)V), argmax_fn, &c);
    return MS_OK;
}

/* backend.h norm_linear / norm_router: add_rmsnorm, then the op (a CPU has no launch to save; having
 * them runs the forward's pending-norm path, fw_linear_a and the router's, in the exact CPU tests) */
static int cpu_norm_linear(ms_backend *b, const ms_norm_in *n, const ms_linear *W, ms_tensor *y, ms_err *err) {
    MS_TRY(cpu_add_rmsnorm(b, n->resid, n->delta, n->w, n->eps, n->out, err));
    return cpu_linear(b, W, n->out, y, err);
}
static int cpu_norm_router(ms_backend *b, const ms_norm_in *n, const ms_linear *gate, const ms_tensor *bias,
                           const ms_route_cfg *rc, int32_t *ids, float *w, ms_err *err) {
    if (!cpu_route_ok(rc)) return ms_errf(err, MS_ERR_UNSUPPORTED, "norm_router: routing the router refuses");
    MS_TRY(cpu_add_rmsnorm(b, n->resid, n->delta, n->w, n->eps, n->out, err));
    return cpu_router(b, n->out, gate, bias, rc, ids, w, err);
}

static const ms_backend_ops cpu_ops = {
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .sync = cpu_sync,
    .place_tensor = cpu_place_tensor,
    .place_linear = cpu_place_linear,
    .unplace_tensor = cpu_unplace_tensor,
    .unplace_linear = cpu_unplace_linear,
    .embed = cpu_embed,
    .embed_part = cpu_embed_part,
    .remap_ids = cpu_remap_ids,
    .moe_append = cpu_moe_append,
    .rmsnorm = cpu_rmsnorm,
    .add_rmsnorm = cpu_add_rmsnorm,
    .layernorm = cpu_layernorm,
    .add = cpu_add,
    .silu_mul = cpu_silu_mul,
    .copy_cols = cpu_copy_cols,
    .gather_rows = cpu_gather_rows,
    .set_cols = cpu_set_cols,
    .scale = cpu_scale,
    .rope = cpu_rope,
    .linear = cpu_linear,
    .kv_store = cpu_kv_store,
    .idx_k_prep = cpu_idx_k_prep,
    .attn_gqa = cpu_attn_gqa,
    .mla_attn = cpu_mla_attn,
    .mla_absorb_q = cpu_mla_absorb_q,
    .mla_v_up = cpu_mla_v_up,
    .indexer_topk = cpu_indexer_topk,
    .router = cpu_router,
    .norm_linear = cpu_norm_linear,
    .norm_router = cpu_norm_router,
    .find_nonfinite = cpu_find_nonfinite,
    .nonfinite_flag = cpu_nonfinite_flag,
    .argmax = cpu_argmax,
};

/* Creates the CPU backend (declared in backend.c). Uses the process default pool; OpenBLAS is
 * pinned to one thread because we parallelise over tiles ourselves. */
int ms_backend_cpu_create(ms_backend **out, ms_err *err) {
    ms_dtype_init();
    openblas_set_num_threads(1);
    ms_backend *b = calloc(1, sizeof *b);
    cpu_impl *c = calloc(1, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        return ms_errf(err, MS_ERR_NOMEM, "cpu backend: out of memory");
    }
    c->pool = ms_cpu_pool();
    c->nth = ms_pool_size(c->pool);
    b->ops = &cpu_ops;
    b->name = "cpu";
    b->act_dtype = MS_F32;
    b->device = -1;
    b->impl = c;
    *out = b;
    return MS_OK;
}
