/* cpu_attn.c - KV caches and attention of the CPU backend: paged GQA, MLA in absorbed form over
 * the latent cache, the DSA indexer's per-query top-k, and the two kv_b_proj head products of MLA.
 *
 * Every query token reads its own sequence's keys through the block table, causally (positions
 * 0..pos), so prefill chunks, decode tokens and several sequences can share one call. Softmax is
 * float32 with max subtraction, as transformers' eager attention. */
#include "backend/cpu/cpu_impl.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int64_t cols_of(const ms_tensor *t) { return t->shape[t->ndim - 1]; }
static int64_t rows_of(const ms_tensor *t) { return ms_tensor_numel(t) / cols_of(t); }

/* ---------------------------------------------------------------- kv_store */

typedef struct {
    float *cache;
    const float *x;
    const int32_t *slot;
    int64_t W;
} store_ctx;

static void store_fn(void *p, int64_t b, int64_t e, int w) {
    store_ctx *c = p;
    for (int64_t t = b; t < e; t++) memcpy(c->cache + (int64_t)c->slot[t] * c->W, c->x + t * c->W, (size_t)c->W * 4);
}

int cpu_kv_store(ms_backend *b, ms_tensor *cache, const ms_tensor *x, const int32_t *slot, ms_err *err) {
    MS_ASSERT(cache->dtype == MS_F32 && x->dtype == MS_F32);
    int64_t S = cache->shape[0], W = ms_tensor_numel(cache) / S, T = x->shape[0];
    MS_ASSERT(ms_tensor_numel(x) == T * W);
    for (int64_t t = 0; t < T; t++)
        if (slot[t] < 0 || slot[t] >= S)
            return ms_errf(err, MS_ERR_INVALID, "kv_store: slot %d of token %lld is outside the cache (%lld slots)",
                           slot[t], (long long)t, (long long)S);
    store_ctx c = {cache->data, x->data, slot, W};
    ms_pool_run(cpu_of(b)->pool, T, ms_cpu_grain((double)W), store_fn, &c);
    return MS_OK;
}

/* Softmax of n scores in place; returns nothing, leaves probabilities. */
static void softmax(float *s, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = s[i] > mx ? s[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        s[i] = expf(s[i] - mx);
        sum += s[i];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) s[i] *= inv;
}

/* ---------------------------------------------------------------- GQA */

typedef struct {
    const float *q, *kc, *vc;
    float *out;
    const ms_attn_meta *m;
    int64_t nh, nkv, d, G;
    float scale;
    float *scr;
    size_t scr_per;
} gqa_ctx;

/* Scores of query q against 8 keys at k0, k0+stride, ... (d % 8 == 0). AVX2: eight accumulators,
 * then one transpose-add (hadd tree) instead of eight horizontal sums; NEON: eight accumulators
 * and eight across-vector adds; plain C: eight 8-lane accumulators. */
static inline void dot8(const float *q, const float *k0, int64_t stride, int64_t d, float scale, float *out) {
#if defined(MS_CPU_AVX2)
    __m256 a[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; c += 8) {
        __m256 qv = _mm256_loadu_ps(q + c);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i * stride + c), a[i]);
    }
    __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
    __m256 lo = _mm256_permute2f128_ps(s0123, s4567, 0x20), hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_add_ps(lo, hi), _mm256_set1_ps(scale)));
#elif defined(MS_CPU_NEON)
    float32x4_t a[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) a[i] = vdupq_n_f32(0);
    for (int64_t c = 0; c < d; c += 4) {
        float32x4_t qv = vld1q_f32(q + c);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) a[i] = vfmaq_f32(a[i], qv, vld1q_f32(k0 + i * stride + c));
    }
    for (int i = 0; i < 8; i++) out[i] = vaddvq_f32(a[i]) * scale;
#else
    float a[8][8] = {{0}};
    for (int64_t c = 0; c < d; c += 8)
        for (int i = 0; i < 8; i++)
            for (int l = 0; l < 8; l++) a[i][l] += q[c + l] * k0[i * stride + c + l];
    for (int i = 0; i < 8; i++) {
        const float *v = a[i];
        out[i] = (((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]))) * scale;
    }
#endif
}

/* One (token, kv head) item: scores of the G query heads sharing the kv head against every causal
 * key, softmax, weighted sum of values. Keys are walked page by page (one block-table read per
 * page, no per-key division), scored 8 at a time, and the output is accumulated in registers 32
 * floats at a time: at serving batch sizes this loop is most of the CPU's step. */
static void gqa_fn(void *p, int64_t b, int64_t e, int wk) {
    gqa_ctx *c = p;
    float *sc = c->scr + (size_t)wk * c->scr_per;
    const int64_t d = c->d, G = c->G, nkv = c->nkv, row = nkv * d;
    const ms_batch *hb = c->m->host;
    const int64_t ps = hb->page_size;
    const int vec = d % 8 == 0;
    for (int64_t it = b; it < e; it++) {
        int64_t t = it / nkv, g = it % nkv;
        int s = c->m->token_seq_d[t];
        int64_t n = (int64_t)c->m->positions_d[t] + 1;
        const int32_t *bt = c->m->block_table_d + (int64_t)s * hb->max_blocks;
        const float *q = c->q + (t * c->nh + g * G) * d;
        for (int64_t p0 = 0; p0 < n; p0 += ps) {
            const float *k = c->kc + ((int64_t)bt[p0 / ps] * ps * nkv + g) * d;
            int64_t cnt = n - p0 < ps ? n - p0 : ps, j = 0;
            if (vec)
                for (; j + 8 <= cnt; j += 8)
                    for (int64_t h = 0; h < G; h++) dot8(q + h * d, k + j * row, row, d, c->scale, sc + h * n + p0 + j);
            for (; j < cnt; j++)
                for (int64_t h = 0; h < G; h++) sc[h * n + p0 + j] = ms_cpu_dot(q + h * d, k + j * row, d) * c->scale;
        }
        for (int64_t h = 0; h < G; h++) softmax(sc + h * n, n);
        float *o = c->out + (t * c->nh + g * G) * d;
#if defined(MS_CPU_AVX2) || defined(MS_CPU_NEON)
        if (d % 32 == 0) {
            /* 32 output floats per pass kept in named registers (an indexed array with a run-time
             * bound was spilled to the stack on every key) */
            for (int64_t h = 0; h < G; h++)
                for (int64_t c0 = 0; c0 < d; c0 += 32) {
                    const float *w = sc + h * n;
                    float *oo = o + h * d + c0;
#if defined(MS_CPU_AVX2)
                    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
                           a3 = _mm256_setzero_ps();
                    for (int64_t p0 = 0; p0 < n; p0 += ps) {
                        const float *v = c->vc + ((int64_t)bt[p0 / ps] * ps * nkv + g) * d + c0;
                        int64_t cnt = n - p0 < ps ? n - p0 : ps;
                        for (int64_t j = 0; j < cnt; j++, v += row) {
                            __m256 pw = _mm256_set1_ps(w[p0 + j]);
                            a0 = _mm256_fmadd_ps(pw, _mm256_loadu_ps(v), a0);
                            a1 = _mm256_fmadd_ps(pw, _mm256_loadu_ps(v + 8), a1);
                            a2 = _mm256_fmadd_ps(pw, _mm256_loadu_ps(v + 16), a2);
                            a3 = _mm256_fmadd_ps(pw, _mm256_loadu_ps(v + 24), a3);
                        }
                    }
                    _mm256_storeu_ps(oo, a0), _mm256_storeu_ps(oo + 8, a1), _mm256_storeu_ps(oo + 16, a2),
                        _mm256_storeu_ps(oo + 24, a3);
#else
                    float32x4_t a[8];
                    for (int i = 0; i < 8; i++) a[i] = vdupq_n_f32(0);
                    for (int64_t p0 = 0; p0 < n; p0 += ps) {
                        const float *v = c->vc + ((int64_t)bt[p0 / ps] * ps * nkv + g) * d + c0;
                        int64_t cnt = n - p0 < ps ? n - p0 : ps;
                        for (int64_t j = 0; j < cnt; j++, v += row) {
                            float pw = w[p0 + j];
#pragma GCC unroll 8
                            for (int i = 0; i < 8; i++) a[i] = vfmaq_n_f32(a[i], vld1q_f32(v + 4 * i), pw);
                        }
                    }
                    for (int i = 0; i < 8; i++) vst1q_f32(oo + 4 * i, a[i]);
#endif
                }
            continue;
        }
#endif
        memset(o, 0, (size_t)(G * d) * 4);
        for (int64_t p0 = 0; p0 < n; p0 += ps) {
            const float *v = c->vc + ((int64_t)bt[p0 / ps] * ps * nkv + g) * d;
            int64_t cnt = n - p0 < ps ? n - p0 : ps;
            for (int64_t j = 0; j < cnt; j++, v += row)
                for (int64_t h = 0; h < G; h++) ms_cpu_axpy(sc[h * n + p0 + j], v, o + h * d, d);
        }
    }
}

int cpu_attn_gqa(ms_backend *b, const ms_tensor *q, const ms_tensor *kcache, const ms_tensor *vcache,
                 const ms_attn_meta *m, float scale, ms_tensor *out, ms_err *err) {
    MS_ASSERT(q->dtype == MS_F32 && out->dtype == MS_F32 && kcache->dtype == MS_F32 && vcache->dtype == MS_F32);
    MS_ASSERT(q->ndim == 3 && kcache->ndim == 3);
    cpu_impl *c = cpu_of(b);
    int64_t T = q->shape[0], nh = q->shape[1], d = q->shape[2], nkv = kcache->shape[1];
    MS_ASSERT(kcache->shape[2] == d && nh % nkv == 0 && ms_tensor_numel(out) == T * nh * d);
    int64_t G = nh / nkv;
    MS_TRY(cpu_scratch(c, (size_t)(G * (m->max_ctx + 1)), err));
    gqa_ctx gc = {q->data, kcache->data, vcache->data, out->data, m, nh, nkv, d, G, scale, c->scr, c->scr_per};
    ms_pool_run(c->pool, T * nkv, ms_cpu_grain(4.0 * G * d * (m->max_ctx + 1)), gqa_fn, &gc);
    return MS_OK;
}

/* ---------------------------------------------------------------- MLA attention */

#define MLA_HB 4 /* heads per work item: each latent row read serves this many heads */

typedef struct {
    const float *q, *lat;
    float *out;
    const ms_attn_meta *m;
    const int32_t *topk;
    int ntopk;
    int64_t nh, W, kvl, nhb, maxk;
    float scale;
    float *scr;
    size_t scr_per;
} mla_ctx;

static void mla_fn(void *p, int64_t b, int64_t e, int wk) {
    mla_ctx *c = p;
    float *sc = c->scr + (size_t)wk * c->scr_per;
    const int64_t W = c->W, kvl = c->kvl;
    for (int64_t it = b; it < e; it++) {
        int64_t t = it / c->nhb, h0 = (it % c->nhb) * MLA_HB;
        int64_t nhh = c->nh - h0 < MLA_HB ? c->nh - h0 : MLA_HB;
        int s = c->m->token_seq_d[t];
        int pos = c->m->positions_d[t];
        /* key positions: the indexer's list (restricted to the causal prefix) or all of 0..pos */
        int32_t *keys = (int32_t *)(sc + MLA_HB * c->maxk);
        int64_t n = 0;
        if (c->topk) {
            const int32_t *tk = c->topk + t * c->ntopk;
            for (int j = 0; j < c->ntopk; j++)
                if (tk[j] >= 0 && tk[j] <= pos) keys[n++] = tk[j];
        } else {
            for (int j = 0; j <= pos; j++) keys[n++] = j;
        }
        const float *q = c->q + (t * c->nh + h0) * W;
        for (int64_t j = 0; j < n; j++) {
            const float *row = c->lat + cpu_slot(c->m, s, keys[j]) * W;
            for (int64_t h = 0; h < nhh; h++) sc[h * n + j] = ms_cpu_dot(q + h * W, row, W) * c->scale;
        }
        for (int64_t h = 0; h < nhh; h++) softmax(sc + h * n, n);
        float *o = c->out + (t * c->nh + h0) * kvl;
        memset(o, 0, (size_t)(nhh * kvl) * 4);
        for (int64_t j = 0; j < n; j++) {
            const float *row = c->lat + cpu_slot(c->m, s, keys[j]) * W;
            for (int64_t h = 0; h < nhh; h++) ms_cpu_axpy(sc[h * n + j], row, o + h * kvl, kvl);
        }
    }
}

int cpu_mla_attn(ms_backend *b, const ms_tensor *q, const ms_tensor *latent, const ms_attn_meta *m,
                 const int32_t *topk, int ntopk, int kvl, float scale, ms_tensor *out, ms_err *err) {
    MS_ASSERT(q->dtype == MS_F32 && out->dtype == MS_F32 && latent->dtype == MS_F32 && q->ndim == 3);
    cpu_impl *c = cpu_of(b);
    int64_t T = q->shape[0], nh = q->shape[1], W = q->shape[2];
    MS_ASSERT(cols_of(latent) == W && kvl < W && ms_tensor_numel(out) == T * nh * kvl);
    int64_t maxk = m->max_ctx + 1;
    if (topk && ntopk < maxk) maxk = ntopk;
    /* per worker: MLA_HB score rows plus one int row of key positions */
    MS_TRY(cpu_scratch(c, (size_t)((MLA_HB + 1) * maxk), err));
    int64_t nhb = (nh + MLA_HB - 1) / MLA_HB;
    mla_ctx mc = {q->data, latent->data, out->data, m, topk, ntopk, nh, W, kvl, nhb, maxk, scale, c->scr, c->scr_per};
    ms_pool_run(c->pool, T * nhb, ms_cpu_grain(4.0 * MLA_HB * W * maxk), mla_fn, &mc);
    return MS_OK;
}

/* ---------------------------------------------------------------- MLA head products */

typedef struct {
    const ms_linear *W;
    const float *x;
    float *out;
    int64_t T, nh, dn, dr, dv, kvl;
    float *scr;
    size_t scr_per;
} absorb_ctx;

static void absorb_fn(void *p, int64_t b, int64_t e, int wk) {
    absorb_ctx *c = p;
    float *buf = c->scr + (size_t)wk * c->scr_per;
    const int64_t kvl = c->kvl, qw = c->dn + c->dr, ow = kvl + c->dr;
    for (int64_t h = b; h < e; h++) {
        int64_t r0 = h * (c->dn + c->dv); /* W_UK_h = kv_b rows [r0, r0+dn), columns = latent channels */
        for (int64_t t = 0; t < c->T; t++) {
            float *o = c->out + (t * c->nh + h) * ow;
            memset(o, 0, (size_t)kvl * 4);
            memcpy(o + kvl, c->x + (t * c->nh + h) * qw + c->dn, (size_t)c->dr * 4);
        }
        if (c->T <= MS_CPU_FUSED_MAX_T) {
            for (int64_t i = 0; i < c->dn; i++) {
                ms_cpu_dequant(c->W, r0 + i, 0, kvl, buf);
                for (int64_t t = 0; t < c->T; t++)
                    ms_cpu_axpy(c->x[(t * c->nh + h) * qw + i], buf, c->out + (t * c->nh + h) * ow, kvl);
            }
        } else {
            for (int64_t i = 0; i < c->dn; i++) ms_cpu_dequant(c->W, r0 + i, 0, kvl, buf + i * kvl);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)c->T, (int)kvl, (int)c->dn, 1.0f,
                        c->x + h * qw, (int)(c->nh * qw), buf, (int)kvl, 0.0f, c->out + h * ow, (int)(c->nh * ow));
        }
    }
}

int cpu_mla_absorb_q(ms_backend *b, const ms_linear *kv_b, const ms_tensor *q, int nh, int dn, int dr, int dv,
                     const int32_t *pos_d, const ms_rope_cfg *rc, ms_tensor *out, ms_err *err) {
    MS_ASSERT(q->dtype == MS_F32 && out->dtype == MS_F32);
    cpu_impl *c = cpu_of(b);
    int64_t kvl = kv_b->n_in, T = ms_tensor_numel(q) / ((int64_t)nh * (dn + dr));
    MS_ASSERT(kv_b->n_out == (int64_t)nh * (dn + dv)); /* any kvl: an NVFP4 kv_b has n_in % 16 == 0 (loader) */
    MS_ASSERT(ms_tensor_numel(q) == T * nh * (dn + dr) && ms_tensor_numel(out) == T * nh * (kvl + dr));
    if (rc && (rc->rot_dim < 0 || rc->rot_dim % 2 || rc->rot_off < dn || rc->rot_off + rc->rot_dim > dn + dr))
        return ms_errf(err, MS_ERR_INVALID, "mla_absorb_q: rotary columns %d..%d lie outside the rope part %d..%d of q",
                       rc->rot_off, rc->rot_off + rc->rot_dim, dn, dn + dr);
    MS_TRY(cpu_scratch(c, (size_t)(T <= MS_CPU_FUSED_MAX_T ? kvl : (int64_t)dn * kvl), err));
    absorb_ctx ac = {kv_b, q->data, out->data, T, nh, dn, dr, dv, kvl, c->scr, c->scr_per};
    ms_pool_run(c->pool, nh, ms_cpu_grain(2.0 * dn * kvl * (T + 1)), absorb_fn, &ac);
    if (!rc || !rc->rot_dim || !T) return MS_OK;
    /* the copy is the rope op's input, unchanged: the rope op on it gives what it gives on q */
    ms_tensor o3 = ms_tensor_reshape(out, 3, (int64_t[]){T, nh, kvl + dr});
    ms_rope_cfg ro = *rc;
    ro.rot_off = (int)kvl + rc->rot_off - dn;
    return cpu_rope(b, &o3, pos_d, &ro, err);
}

static void vup_fn(void *p, int64_t b, int64_t e, int wk) {
    absorb_ctx *c = p;
    float *scr = c->scr + (size_t)wk * c->scr_per;
    for (int64_t h = b; h < e; h++) {
        int64_t r0 = h * (c->dn + c->dv) + c->dn; /* W_UV_h rows */
        ms_cpu_linear_rows(c->W, r0, r0 + c->dv, c->x + h * c->kvl, c->nh * c->kvl, (int)c->T, c->out + h * c->dv,
                           c->nh * c->dv, scr);
    }
}

int cpu_mla_v_up(ms_backend *b, const ms_linear *kv_b, const ms_tensor *o_lat, int nh, int dn, int dv,
                 ms_tensor *out, ms_err *err) {
    MS_ASSERT(o_lat->dtype == MS_F32 && out->dtype == MS_F32);
    cpu_impl *c = cpu_of(b);
    int64_t kvl = kv_b->n_in, T = ms_tensor_numel(o_lat) / ((int64_t)nh * kvl);
    MS_ASSERT(kv_b->n_out == (int64_t)nh * (dn + dv));
    MS_ASSERT(ms_tensor_numel(o_lat) == T * nh * kvl && ms_tensor_numel(out) == T * nh * dv);
    MS_TRY(cpu_scratch(c, ms_cpu_linear_scratch_floats(kv_b, dv, (int)T) + 16, err));
    absorb_ctx ac = {kv_b, o_lat->data, out->data, T, nh, dn, 0, dv, kvl, c->scr, c->scr_per};
    ms_pool_run(c->pool, nh, ms_cpu_grain(2.0 * dv * kvl * T), vup_fn, &ac);
    return MS_OK;
}

/* ---------------------------------------------------------------- DSA indexer */

typedef struct {
    const float *q, *w, *kc;
    const ms_attn_meta *m;
    int32_t *out;
    int topk;
    int64_t nih, d;
    float *scr;
    size_t scr_per;
} idx_ctx;

/* k-th largest (0-based) of a[0..n) by quickselect; reorders a. */
static float kth_largest(float *a, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        float piv = a[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] > piv) i++;
            while (a[j] < piv) j--;
            if (i <= j) {
                float t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++;
                j--;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return a[k];
    }
    return a[k];
}

static void idx_fn(void *p, int64_t b, int64_t e, int wk) {
    idx_ctx *c = p;
    const int64_t d = c->d, nih = c->nih;
    const float inv_sqrt_d = 1.0f / sqrtf((float)d);
    float *sc = c->scr + (size_t)wk * c->scr_per;
    for (int64_t t = b; t < e; t++) {
        int s = c->m->token_seq_d[t];
        int64_t n = (int64_t)c->m->positions_d[t] + 1;
        int32_t *o = c->out + t * c->topk;
        if (n <= c->topk) { /* every causal key is selected */
            for (int j = 0; j < c->topk; j++) o[j] = j < n ? j : -1;
            continue;
        }
        float *tmp = sc + n;
        const float *q = c->q + t * nih * d, *w = c->w + t * nih;
        for (int64_t pp = 0; pp < n; pp++) {
            const float *k = c->kc + cpu_slot(c->m, s, (int)pp) * d;
            float acc = 0;
            for (int64_t j = 0; j < nih; j++) {
                float v = ms_cpu_dot(q + j * d, k, d) * inv_sqrt_d;
                if (v > 0) acc += w[j] * v;
            }
            if (isnan(acc)) acc = -INFINITY;
            sc[pp] = acc;
            tmp[pp] = acc;
        }
        float thr = kth_largest(tmp, n, c->topk - 1);
        /* strictly greater first, then ties at the threshold in position order */
        int m = 0;
        for (int64_t pp = 0; pp < n && m < c->topk; pp++)
            if (sc[pp] > thr) o[m++] = (int32_t)pp;
        for (int64_t pp = 0; pp < n && m < c->topk; pp++)
            if (sc[pp] == thr) o[m++] = (int32_t)pp;
        for (; m < c->topk; m++) o[m] = -1;
    }
}

int cpu_indexer_topk(ms_backend *b, const ms_tensor *qI, const ms_tensor *w, const ms_tensor *idx_cache,
                     const ms_attn_meta *m, int topk, int32_t *out, ms_err *err) {
    MS_ASSERT(qI->dtype == MS_F32 && w->dtype == MS_F32 && idx_cache->dtype == MS_F32 && qI->ndim == 3);
    MS_ASSERT(topk >= 1);
    cpu_impl *c = cpu_of(b);
    int64_t T = qI->shape[0], nih = qI->shape[1], d = qI->shape[2];
    MS_ASSERT(cols_of(idx_cache) == d && ms_tensor_numel(w) == T * nih);
    (void)rows_of;
    MS_TRY(cpu_scratch(c, 2 * (size_t)(m->max_ctx + 1), err));
    idx_ctx ic = {qI->data, w->data, idx_cache->data, m, out, topk, nih, d, c->scr, c->scr_per};
    ms_pool_run(c->pool, T, ms_cpu_grain(2.0 * nih * d * (m->max_ctx + 1)), idx_fn, &ic);
    return MS_OK;
}
