/* loader.c - turns a checkpoint directory (or a config for dummy weights) into ms_model views.
 *
 * Each Linear keeps the format it is stored in; which one is decided per module by the scale
 * tensors present (weight_scale_inv -> FP8 block, weight_scale + weight_scale_2 -> NVFP4), because
 * real exports quantize different subsets (spec 4.1). The quantization declaration is only used to
 * cross-check, so a checkpoint whose files disagree with its own declaration fails loudly instead of
 * running with wrong numerics. Every expected tensor is looked up by name and its shape checked
 * against the config, so a wrong or truncated checkpoint fails at load naming the tensor. */
#include "model/model.h"

#include "core/log.h"
#include "model/arch.h"
#include "model/loader_internal.h"
#include "model/safetensors.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

const char *const ms_group_names[MS_N_GROUPS] = {"embed",  "attention", "indexer", "dense_mlp",
                                                 "router", "experts",   "shared_experts", "lm_head"};

/* ---- owned memory ---- */

typedef struct own_node {
    struct own_node *next;
    size_t cap, used; /* bump region for small allocations (cap 0: a single big allocation) */
} own_node;

#define OWN_HDR 64 /* node header padded so data is 64-aligned */
#define OWN_SMALL (64u << 10)
#define OWN_BLOCK (1u << 20)

typedef struct own_state {
    own_node *big;   /* list of large allocations */
    own_node *small; /* current bump block (list continues via next) */
} own_state;

static own_node *own_new(size_t data_bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, OWN_HDR + data_bytes)) return NULL;
    memset(p, 0, OWN_HDR + data_bytes);
    return p;
}

/* Large blocks come from mmap: zero pages without a memset pass (dummy weights are tens of GB). */
static own_node *own_new_big(size_t data_bytes) {
    void *p = mmap(NULL, OWN_HDR + data_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    own_node *b = p;
    b->cap = OWN_HDR + data_bytes; /* mapping length, for munmap */
    return b;
}

void *ms_model_alloc(ms_model *m, size_t n) {
    own_state *o = m->owned;
    if (!o) {
        o = calloc(1, sizeof *o);
        if (!o) return NULL;
        m->owned = o;
    }
    n = (n + 63) & ~(size_t)63;
    if (n >= OWN_SMALL) {
        own_node *b = own_new_big(n);
        if (!b) return NULL;
        b->next = o->big;
        o->big = b;
        return (char *)b + OWN_HDR;
    }
    if (!o->small || o->small->cap - o->small->used < n) {
        own_node *b = own_new(OWN_BLOCK);
        if (!b) return NULL;
        b->cap = OWN_BLOCK;
        b->next = o->small;
        o->small = b;
    }
    void *p = (char *)o->small + OWN_HDR + o->small->used;
    o->small->used += n;
    return p;
}

char *ms_model_strdup(ms_model *m, const char *s) {
    size_t n = strlen(s) + 1;
    char *d = ms_model_alloc(m, n);
    if (d) memcpy(d, s, n);
    return d;
}

static void own_free(own_state *o) {
    if (!o) return;
    for (own_node *b = o->big, *nx; b; b = nx) { nx = b->next; munmap(b, b->cap); }
    for (own_node *b = o->small, *nx; b; b = nx) { nx = b->next; free(b); }
    free(o);
}

/* ---- load context ---- */

struct ms_load_ctx {
    ms_model *m;
    const ms_config *cfg;
    ms_st_set *st;      /* NULL for dummy */
    const char *dir;
    ms_quant_decl q;
    uint8_t *used;      /* [n tensors]: consumed by a view */
    ms_err *err;
    /* dummy */
    int dummy;
    ms_wfmt dummy_fmt;
    uint64_t seed;
    ms_backend *dev; /* dummy weights generated in this backend's memory (NULL: host) */
    ms_shard sh;     /* this rank's part of the model */
};
typedef struct ms_load_ctx lctx;

enum { DT_FLOAT = (1 << MS_F32) | (1 << MS_F16) | (1 << MS_BF16) };

static const char *file_of(lctx *c, const ms_st_tensor *t) { return t ? ms_st_file_name(c->st, t->file) : c->dir; }

static void fmt_shape(char *buf, size_t cap, int nd, const int64_t *s) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < nd && o < cap; i++) o += (size_t)snprintf(buf + o, cap - o, i ? ", %lld" : "%lld", (long long)s[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static void mark_used(lctx *c, const ms_st_tensor *t) {
    if (t) c->used[t - ms_st_at(c->st, 0)] = 1;
}

static uint64_t seed_of(lctx *c, const char *name) { return XXH64(name, strlen(name), c->seed); }

/* Makes a host view of stored tensor t; copies into model memory if the data is not aligned to its
 * element size (other writers may not align). */
static int view_of(lctx *c, const ms_st_tensor *t, ms_tensor *out) {
    *out = (ms_tensor){0};
    if (t->ndim > 4) return ms_errf(c->err, MS_ERR_FORMAT, "%s: tensor '%s' has %d dims (at most 4 supported)", file_of(c, t), t->name, t->ndim);
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) out->shape[i] = t->shape[i];
    size_t es = ms_dtype_size(t->dtype);
    if ((uintptr_t)t->data % es) {
        void *p = ms_model_alloc(c->m, t->nbytes ? t->nbytes : 1);
        if (!p) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory copying tensor '%s'", t->name);
        memcpy(p, t->data, t->nbytes);
        out->data = p;
    } else {
        out->data = (void *)t->data;
    }
    mark_used(c, t);
    return MS_OK;
}

/* Checks that stored tensor t has the expected shape (ndim dims) and one of the dtypes in mask. */
static int check_tensor(lctx *c, const ms_st_tensor *t, int ndim, const int64_t *shape, unsigned mask) {
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char e[96], a[96];
        fmt_shape(e, sizeof e, ndim, shape);
        fmt_shape(a, sizeof a, t->ndim, t->shape);
        return ms_errf(c->err, MS_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s for this config", file_of(c, t),
                       t->name, a, e);
    }
    if (!(mask & (1u << t->dtype)))
        return ms_errf(c->err, MS_ERR_FORMAT, "%s: tensor '%s' has dtype %s, which is not valid here", file_of(c, t), t->name,
                       ms_dtype_name(t->dtype));
    return MS_OK;
}

static int missing(lctx *c, const char *name) {
    return ms_errf(c->err, MS_ERR_NOT_FOUND, "%s: tensor '%s' is missing (required by the %s config)", c->dir, name,
                   c->cfg->model_type);
}

static void stats_tensor(lctx *c, int group, const ms_tensor *t) {
    if (!t->data) return;
    size_t n = ms_tensor_nbytes(t);
    if (group != MS_GROUP_ROUTER || !c->m->stats.plain_dtype[group]) c->m->stats.plain_dtype[group] = (uint8_t)t->dtype;
    c->m->stats.bytes_by_group[group][0] += n;
    c->m->stats.bytes_total += n;
}

static void stats_linear(lctx *c, int group, const ms_linear *W) {
    size_t n = ms_linear_nbytes(W);
    if (W->fmt == MS_WFMT_PLAIN) c->m->stats.plain_dtype[group] = (uint8_t)W->w.dtype;
    c->m->stats.bytes_by_group[group][W->fmt] += n;
    c->m->stats.linears_by_group[group][W->fmt]++;
    c->m->stats.bytes_total += n;
}

/* A non-linear tensor (norm weight, bias): float dtype, given shape. required=0 leaves data NULL
 * when absent. */
static int load_tensor(lctx *c, const char *name, int ndim, const int64_t *shape, int required, int group,
                       ms_dummy_kind kind, ms_tensor *out) {
    *out = (ms_tensor){0};
    if (c->dummy) {
        if (!required) return MS_OK;
        *out = ms_tensor_make(kind == MS_DUMMY_BIAS && group == MS_GROUP_ROUTER ? MS_F32 : MS_BF16, ndim, shape);
        if (c->dev) {
            /* same value ranges as ms_dummy_fill_tensor */
            float off = kind == MS_DUMMY_NORM ? 1.0f : 0.0f, amp = kind == MS_DUMMY_EMBED ? 1.7320508f : 0.1f;
            MS_TRY(c->dev->ops->dummy_tensor(c->dev, out, off, amp, seed_of(c, name), c->err));
            stats_tensor(c, group, out);
            return MS_OK;
        }
        out->data = ms_model_alloc(c->m, ms_tensor_nbytes(out));
        if (!out->data) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory for dummy tensor '%s'", name);
        ms_dummy_fill_tensor(out, kind, seed_of(c, name));
        stats_tensor(c, group, out);
        return MS_OK;
    }
    const ms_st_tensor *t = ms_st_find(c->st, name);
    if (!t) return required ? missing(c, name) : MS_OK;
    MS_TRY(check_tensor(c, t, ndim, shape, DT_FLOAT));
    MS_TRY(view_of(c, t, out));
    stats_tensor(c, group, out);
    return MS_OK;
}

static int load_tensor1(lctx *c, const char *name, int64_t n, int required, int group, ms_dummy_kind kind, ms_tensor *out) {
    return load_tensor(c, name, 1, &n, required, group, kind, out);
}

/* Reads a scalar (0-dim or [1]) float tensor. */
static int load_scalar(lctx *c, const ms_st_tensor *t, float *out) {
    if (!(t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1)))
        return ms_errf(c->err, MS_ERR_FORMAT, "%s: tensor '%s' must be a scalar (0-dim or [1])", file_of(c, t), t->name);
    if (!(DT_FLOAT & (1u << t->dtype)))
        return ms_errf(c->err, MS_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected F32", file_of(c, t), t->name, ms_dtype_name(t->dtype));
    uint8_t tmp[4];
    memcpy(tmp, t->data, ms_dtype_size(t->dtype)); /* may be unaligned */
    ms_convert_to_f32(t->dtype, tmp, out, 1);
    if (!(*out == *out) || *out < 0 || *out > 3.0e38f)
        return ms_errf(c->err, MS_ERR_FORMAT, "%s: tensor '%s' holds %g, expected a finite non-negative scale", file_of(c, t),
                       t->name, (double)*out);
    mark_used(c, t);
    return MS_OK;
}

static int decl_check(lctx *c, const char *module, const ms_linear *W, int is_expert) {
    const ms_quant_decl *q = &c->q;
    if (c->dummy || q->algo == MS_QUANT_NONE || q->algo == MS_QUANT_MIXED || q->algo == MS_QUANT_OTHER) return MS_OK;
    const char *pat = NULL;
    int excl = ms_quant_excluded(q, module, &pat);
    if (W->fmt != MS_WFMT_PLAIN && excl)
        return ms_errf(c->err, MS_ERR_FORMAT, "%s: module '%s' has %s scale tensors but matches exclude pattern '%s' of %s",
                       c->dir, module, ms_wfmt_name(W->fmt, MS_BF16), pat, q->source);
    ms_wfmt want = q->algo == MS_QUANT_NVFP4 ? MS_WFMT_NVFP4 : MS_WFMT_FP8;
    if (W->fmt != MS_WFMT_PLAIN && W->fmt != want)
        return ms_errf(c->err, MS_ERR_FORMAT, "%s: module '%s' is stored as %s but %s declares %s", c->dir, module,
                       ms_wfmt_name(W->fmt, MS_BF16), q->source, q->algo_name);
    if (W->fmt == MS_WFMT_PLAIN && is_expert && !excl)
        return ms_errf(c->err, MS_ERR_FORMAT,
                       "%s: module '%s' has no scale tensors but %s declares %s and no exclude pattern matches it", c->dir,
                       module, q->source, q->algo_name);
    return MS_OK;
}

/* ---- tensor-parallel slices ---- */

/* The part (index, count) of a linear of `group` this rank holds: routed experts are sliced within
 * their expert group, everything else across the whole tensor-parallel world. */
static void split_part(const lctx *c, int group, int *part, int *parts) {
    if (group == MS_GROUP_EXPERTS) *part = c->sh.moe_tp_rank, *parts = c->sh.moe_tp_size;
    else *part = c->sh.tp_rank, *parts = c->sh.tp_size;
}

/* Checks that W [N, K] in its format can be cut `parts` ways along split without breaking a
 * quantization block; *n is the cut dimension's size per part. */
static int split_check(lctx *c, const ms_linear *W, ms_split split, int parts, int64_t *n) {
    const int64_t dim = split == MS_SPLIT_OUT ? W->n_out : W->n_in;
    const char *what = split == MS_SPLIT_OUT ? "output rows" : "input columns";
    if (dim % parts)
        return ms_errf(c->err, MS_ERR_INVALID, "%s: module '%s' has %lld %s, which do not split into %d tensor-parallel parts",
                       c->dir, W->name, (long long)dim, what, parts);
    *n = dim / parts;
    if (W->fmt == MS_WFMT_FP8 && *n % 128)
        return ms_errf(c->err, MS_ERR_INVALID,
                       "%s: module '%s' is FP8 with 128x128 scale blocks; %d tensor-parallel parts of %lld %s would cut a block",
                       c->dir, W->name, parts, (long long)*n, what);
    if (W->fmt == MS_WFMT_NVFP4 && split == MS_SPLIT_IN && *n % 16)
        return ms_errf(c->err, MS_ERR_INVALID,
                       "%s: module '%s' is NVFP4 with 16-element scale groups; %d tensor-parallel parts of %lld %s would cut a group",
                       c->dir, W->name, parts, (long long)*n, what);
    return MS_OK;
}

/* Copies columns [c0, c0 + nc) of each of the `rows` rows of a row-major [rows, row_bytes] byte
 * matrix (c0, nc in bytes) into model memory: only those bytes of the checkpoint are read. */
static int copy_cols(lctx *c, const ms_linear *W, void **data, int64_t rows, int64_t row_bytes, int64_t c0, int64_t nc) {
    char *dst = ms_model_alloc(c->m, rows * nc > 0 ? (size_t)(rows * nc) : 1);
    if (!dst) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory slicing '%s'", W->name);
    const char *src = *data;
    for (int64_t r = 0; r < rows; r++) memcpy(dst + r * nc, src + r * row_bytes + c0, (size_t)nc);
    *data = dst;
    return MS_OK;
}

/* Cuts the full-shape view W down to this rank's part (a view for output rows; a copy of the
 * columns for input columns). */
static int slice_linear(lctx *c, ms_linear *W, ms_split split, int part, int parts) {
    if (split == MS_SPLIT_NONE || parts <= 1) return MS_OK;
    int64_t n;
    MS_TRY(split_check(c, W, split, parts, &n));
    const int64_t N = W->n_out, K = W->n_in;
    if (split == MS_SPLIT_OUT) {
        const int64_t r0 = (int64_t)part * n;
        if (W->fmt == MS_WFMT_PLAIN) {
            W->w.data = (char *)W->w.data + r0 * K * (int64_t)ms_dtype_size(W->w.dtype);
        } else if (W->fmt == MS_WFMT_FP8) {
            W->w.data = (char *)W->w.data + r0 * K;
            W->scale.data = (float *)W->scale.data + (r0 / 128) * W->scale.shape[1];
            W->scale.shape[0] = n / 128;
        } else {
            W->w.data = (char *)W->w.data + r0 * (K / 2);
            W->scale.data = (char *)W->scale.data + r0 * (K / 16);
            W->scale.shape[0] = n;
        }
        W->w.shape[0] = n;
        if (W->bias.data) {
            W->bias.data = (char *)W->bias.data + r0 * (int64_t)ms_dtype_size(W->bias.dtype);
            W->bias.shape[0] = n;
        }
        W->n_out = n;
        return MS_OK;
    }
    const int64_t c0 = (int64_t)part * n;
    if (W->fmt == MS_WFMT_PLAIN) {
        const int64_t es = (int64_t)ms_dtype_size(W->w.dtype);
        MS_TRY(copy_cols(c, W, &W->w.data, N, K * es, c0 * es, n * es));
    } else if (W->fmt == MS_WFMT_FP8) {
        MS_TRY(copy_cols(c, W, &W->w.data, N, K, c0, n));
        MS_TRY(copy_cols(c, W, &W->scale.data, W->scale.shape[0], W->scale.shape[1] * 4, (c0 / 128) * 4, (n / 128) * 4));
        W->scale.shape[1] = n / 128;
    } else {
        MS_TRY(copy_cols(c, W, &W->w.data, N, K / 2, c0 / 2, n / 2));
        MS_TRY(copy_cols(c, W, &W->scale.data, N, K / 16, c0 / 16, n / 16));
        W->scale.shape[1] = n / 16;
    }
    W->w.shape[1] = W->fmt == MS_WFMT_NVFP4 ? n / 2 : n;
    if (part != 0) W->bias = (ms_tensor){0}; /* added once, by rank 0, before the sum over ranks */
    W->n_in = n;
    return MS_OK;
}

/* One Linear [N, K] named `module` (tensors module.weight, optional scales and bias). bias: 0 none,
 * 1 optional, 2 required. dummy_q: the dummy format applies to this group. */
static int load_linear(lctx *c, const char *module, int64_t N, int64_t K, int group, int bias, int is_expert,
                       ms_split split, ms_linear *W) {
    memset(W, 0, sizeof *W);
    int part, parts;
    split_part(c, group, &part, &parts);
    W->name = ms_model_strdup(c->m, module);
    if (!W->name) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
    W->n_out = N;
    W->n_in = K;
    char nm[512];
    if (c->dummy) {
        W->fmt = (group == MS_GROUP_EXPERTS || group == MS_GROUP_SHARED) ? c->dummy_fmt : MS_WFMT_PLAIN;
        if (W->fmt == MS_WFMT_NVFP4 && K % 16) W->fmt = MS_WFMT_PLAIN;
        if (split != MS_SPLIT_NONE && parts > 1) { /* generate this rank's part only */
            int64_t n;
            MS_TRY(split_check(c, W, split, parts, &n));
            if (split == MS_SPLIT_OUT) W->n_out = N = n;
            else W->n_in = K = n;
            if (split == MS_SPLIT_IN && part != 0 && bias == 2) bias = 0;
            if (W->fmt == MS_WFMT_NVFP4 && K % 16) W->fmt = MS_WFMT_PLAIN;
        }
        if (c->dev) {
            MS_TRY(c->dev->ops->dummy_linear(c->dev, W, bias == 2, seed_of(c, module), c->err));
            stats_linear(c, group, W);
            return MS_OK;
        }
        MS_TRY(ms_dummy_linear(c->m, W, seed_of(c, module), c->err));
        if (bias == 2) {
            snprintf(nm, sizeof nm, "%s.bias", module);
            MS_TRY(load_tensor1(c, nm, N, 1, group, MS_DUMMY_BIAS, &W->bias));
            c->m->stats.bytes_by_group[group][0] -= ms_tensor_nbytes(&W->bias); /* counted with the linear */
            c->m->stats.bytes_total -= ms_tensor_nbytes(&W->bias);
        }
        stats_linear(c, group, W);
        return MS_OK;
    }
    snprintf(nm, sizeof nm, "%s.weight", module);
    const ms_st_tensor *w = ms_st_find(c->st, nm);
    if (!w) return missing(c, nm);
    snprintf(nm, sizeof nm, "%s.weight_scale_inv", module);
    const ms_st_tensor *sinv = ms_st_find(c->st, nm);
    snprintf(nm, sizeof nm, "%s.weight_scale", module);
    const ms_st_tensor *ws = ms_st_find(c->st, nm);
    snprintf(nm, sizeof nm, "%s.weight_scale_2", module);
    const ms_st_tensor *ws2 = ms_st_find(c->st, nm);
    snprintf(nm, sizeof nm, "%s.input_scale", module);
    const ms_st_tensor *is = ms_st_find(c->st, nm);
    if (sinv && (ws || ws2))
        return ms_errf(c->err, MS_ERR_FORMAT, "%s: module '%s' has both FP8 (weight_scale_inv) and NVFP4 (weight_scale) scale tensors",
                       file_of(c, w), module);
    if (sinv) {
        W->fmt = MS_WFMT_FP8;
        int64_t ws_[2] = {N, K}, ss[2] = {(N + 127) / 128, (K + 127) / 128};
        MS_TRY(check_tensor(c, w, 2, ws_, 1u << MS_F8E4M3));
        MS_TRY(check_tensor(c, sinv, 2, ss, DT_FLOAT));
        MS_TRY(view_of(c, w, &W->w));
        ms_tensor s;
        MS_TRY(view_of(c, sinv, &s));
        if (s.dtype != MS_F32) { /* the format's scale is float32; convert once into model memory */
            ms_tensor f = ms_tensor_make(MS_F32, 2, ss);
            f.data = ms_model_alloc(c->m, ms_tensor_nbytes(&f));
            if (!f.data) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
            ms_convert_to_f32(s.dtype, s.data, f.data, (size_t)(ss[0] * ss[1]));
            s = f;
        }
        W->scale = s;
    } else if (ws || ws2) {
        W->fmt = MS_WFMT_NVFP4;
        if (!ws) { snprintf(nm, sizeof nm, "%s.weight_scale", module); return missing(c, nm); }
        if (!ws2) { snprintf(nm, sizeof nm, "%s.weight_scale_2", module); return missing(c, nm); }
        if (K % 16)
            return ms_errf(c->err, MS_ERR_FORMAT, "%s: module '%s' is NVFP4 but its input size %lld is not a multiple of 16",
                           file_of(c, w), module, (long long)K);
        int64_t wsh[2] = {N, K / 2}, ssh[2] = {N, K / 16};
        MS_TRY(check_tensor(c, w, 2, wsh, 1u << MS_U8));
        MS_TRY(check_tensor(c, ws, 2, ssh, 1u << MS_F8E4M3));
        MS_TRY(view_of(c, w, &W->w));
        MS_TRY(view_of(c, ws, &W->scale));
        MS_TRY(load_scalar(c, ws2, &W->scale2));
        if (is) MS_TRY(load_scalar(c, is, &W->input_scale));
    } else {
        W->fmt = MS_WFMT_PLAIN;
        int64_t sh[2] = {N, K};
        MS_TRY(check_tensor(c, w, 2, sh, DT_FLOAT));
        MS_TRY(view_of(c, w, &W->w));
    }
    if (bias) {
        snprintf(nm, sizeof nm, "%s.bias", module);
        const ms_st_tensor *b = ms_st_find(c->st, nm);
        if (!b && bias == 2) return missing(c, nm);
        if (b) {
            MS_TRY(check_tensor(c, b, 1, &N, DT_FLOAT));
            MS_TRY(view_of(c, b, &W->bias));
        }
    }
    MS_TRY(decl_check(c, module, W, is_expert));
    MS_TRY(slice_linear(c, W, split, part, parts));
    stats_linear(c, group, W);
    return MS_OK;
}

const ms_config *ms_ld_config(const ms_load_ctx *c) { return c->cfg; }

int ms_ld_linear(ms_load_ctx *c, const char *module, int64_t N, int64_t K, int group, int bias, ms_split split,
                 ms_linear *W) {
    return load_linear(c, module, N, K, group, bias, 0, split, W);
}

int ms_ld_tensor1(ms_load_ctx *c, const char *name, int64_t n, int required, int group, ms_dummy_kind kind, ms_tensor *out) {
    return load_tensor1(c, name, n, required, group, kind, out);
}

/* ---- experts ---- */

static int alloc_experts(lctx *c, ms_experts *e, int n) {
    e->n = n;
    e->gate = ms_model_alloc(c->m, (size_t)n * sizeof(ms_linear));
    e->up = ms_model_alloc(c->m, (size_t)n * sizeof(ms_linear));
    e->down = ms_model_alloc(c->m, (size_t)n * sizeof(ms_linear));
    if (!e->gate || !e->up || !e->down) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory for %d experts", n);
    return MS_OK;
}

/* transformers-5 fused experts: gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I]. */
static int load_fused_experts(lctx *c, int L, const ms_st_tensor *gu, ms_experts *e) {
    const ms_config *cfg = c->cfg;
    int64_t E = cfg->n_routed_experts, I = cfg->moe_intermediate_size, H = cfg->hidden_size;
    char nm[256];
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.down_proj", L);
    const ms_st_tensor *dn = ms_st_find(c->st, nm);
    if (!dn) {
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.down_proj.weight", L);
        dn = ms_st_find(c->st, nm);
    }
    if (!dn) { snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.down_proj", L); return missing(c, nm); }
    int64_t gsh[3] = {E, 2 * I, H}, dsh[3] = {E, H, I};
    MS_TRY(check_tensor(c, gu, 3, gsh, DT_FLOAT));
    MS_TRY(check_tensor(c, dn, 3, dsh, DT_FLOAT));
    ms_tensor gt, dt;
    MS_TRY(view_of(c, gu, &gt));
    MS_TRY(view_of(c, dn, &dt));
    MS_TRY(alloc_experts(c, e, c->sh.ne));
    size_t es = ms_dtype_size(gt.dtype), ds = ms_dtype_size(dt.dtype);
    for (int64_t x = c->sh.e0; x < c->sh.e0 + c->sh.ne; x++) {
        ms_linear *g = &e->gate[x - c->sh.e0], *u = &e->up[x - c->sh.e0], *d = &e->down[x - c->sh.e0];
        const char *kind[3] = {"gate_proj", "up_proj", "down_proj"};
        ms_linear *ls[3] = {g, u, d};
        for (int k = 0; k < 3; k++) {
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%lld.%s", L, (long long)x, kind[k]);
            ls[k]->name = ms_model_strdup(c->m, nm);
            if (!ls[k]->name) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
            ls[k]->fmt = MS_WFMT_PLAIN;
        }
        g->n_out = u->n_out = I;
        g->n_in = u->n_in = H;
        d->n_out = H;
        d->n_in = I;
        g->w = ms_tensor_2d(gt.dtype, I, H);
        g->w.data = (char *)gt.data + (size_t)(x * 2 * I * H) * es;
        u->w = ms_tensor_2d(gt.dtype, I, H);
        u->w.data = (char *)gt.data + (size_t)((x * 2 + 1) * I * H) * es;
        d->w = ms_tensor_2d(dt.dtype, H, I);
        d->w.data = (char *)dt.data + (size_t)(x * H * I) * ds;
        for (int k = 0; k < 3; k++) {
            MS_TRY(decl_check(c, ls[k]->name, ls[k], 1));
            MS_TRY(slice_linear(c, ls[k], k < 2 ? MS_SPLIT_OUT : MS_SPLIT_IN, c->sh.moe_tp_rank, c->sh.moe_tp_size));
            stats_linear(c, MS_GROUP_EXPERTS, ls[k]);
        }
    }
    return MS_OK;
}

static int load_experts(lctx *c, int L, ms_experts *e) {
    const ms_config *cfg = c->cfg;
    int64_t I = cfg->moe_intermediate_size, H = cfg->hidden_size;
    char nm[256];
    if (!c->dummy) {
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.gate_up_proj", L);
        const ms_st_tensor *gu = ms_st_find(c->st, nm);
        if (!gu) {
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.gate_up_proj.weight", L);
            gu = ms_st_find(c->st, nm);
        }
        if (gu) return load_fused_experts(c, L, gu, e);
    }
    /* this rank's expert group only (all experts without expert parallelism) */
    MS_TRY(alloc_experts(c, e, c->sh.ne));
    for (int i = 0; i < c->sh.ne; i++) {
        const int x = c->sh.e0 + i;
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.gate_proj", L, x);
        MS_TRY(load_linear(c, nm, I, H, MS_GROUP_EXPERTS, 0, 1, MS_SPLIT_OUT, &e->gate[i]));
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.up_proj", L, x);
        MS_TRY(load_linear(c, nm, I, H, MS_GROUP_EXPERTS, 0, 1, MS_SPLIT_OUT, &e->up[i]));
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.down_proj", L, x);
        MS_TRY(load_linear(c, nm, H, I, MS_GROUP_EXPERTS, 0, 1, MS_SPLIT_IN, &e->down[i]));
        const ms_linear *ls[3] = {&e->gate[i], &e->up[i], &e->down[i]};
        for (int k = 0; k < 3; k++)
            if (ls[k]->fmt != e->gate[0].fmt)
                return ms_errf(c->err, MS_ERR_FORMAT,
                               "%s: module '%s' is %s but '%s' is %s; all routed experts of a layer must share one format",
                               c->dir, ls[k]->name, ms_wfmt_name(ls[k]->fmt, ls[k]->w.dtype), e->gate[0].name,
                               ms_wfmt_name(e->gate[0].fmt, e->gate[0].w.dtype));
    }
    return MS_OK;
}

/* ---- layers ---- */

static int load_layer(lctx *c, int L, ms_layer *ly) {
    const ms_config *cfg = c->cfg;
    const int64_t H = cfg->hidden_size;
    char p[128], nm[256];
    snprintf(p, sizeof p, "model.layers.%d.", L);
#define NM(suffix) (snprintf(nm, sizeof nm, "%s%s", p, suffix), nm)
    MS_TRY(load_tensor1(c, NM("input_layernorm.weight"), H, 1, MS_GROUP_ATTN, MS_DUMMY_NORM, &ly->attn_norm));
    ly->is_moe = cfg->layer_is_moe[L];
    MS_TRY(load_tensor1(c, NM("post_attention_layernorm.weight"), H, 1, ly->is_moe ? MS_GROUP_ROUTER : MS_GROUP_DENSE_MLP,
                        MS_DUMMY_NORM, &ly->ffn_norm));
    MS_TRY(cfg->arch->load_layer(c, L, ly));
    if (!ly->is_moe) {
        int64_t I = cfg->intermediate_size;
        MS_TRY(load_linear(c, NM("mlp.gate_proj"), I, H, MS_GROUP_DENSE_MLP, 0, 0, MS_SPLIT_OUT, &ly->gate_proj));
        MS_TRY(load_linear(c, NM("mlp.up_proj"), I, H, MS_GROUP_DENSE_MLP, 0, 0, MS_SPLIT_OUT, &ly->up_proj));
        MS_TRY(load_linear(c, NM("mlp.down_proj"), H, I, MS_GROUP_DENSE_MLP, 0, 0, MS_SPLIT_IN, &ly->down_proj));
    } else {
        int64_t E = cfg->n_routed_experts;
        MS_TRY(load_linear(c, NM("mlp.gate"), E, H, MS_GROUP_ROUTER, 0, 0, MS_SPLIT_NONE, &ly->router));
        if (ly->router.fmt != MS_WFMT_PLAIN)
            return ms_errf(c->err, MS_ERR_UNSUPPORTED, "%s: router '%s' is quantized; routers must be stored as float", c->dir, ly->router.name);
        /* noaux_tc routing (the only topk_method of both architectures; config.c refuses others) selects
         * experts by score + e_score_correction_bias: without the bias the logits would be silently wrong. */
        MS_TRY(load_tensor1(c, NM("mlp.gate.e_score_correction_bias"), E, 1, MS_GROUP_ROUTER, MS_DUMMY_BIAS, &ly->router_bias));
        if (ly->router_bias.data && ly->router_bias.dtype != MS_F32) { /* contract: F32 */
            ms_tensor f = ms_tensor_make(MS_F32, 1, &E);
            f.data = ms_model_alloc(c->m, ms_tensor_nbytes(&f));
            if (!f.data) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
            ms_convert_to_f32(ly->router_bias.dtype, ly->router_bias.data, f.data, (size_t)E);
            ly->router_bias = f;
        }
        MS_TRY(load_experts(c, L, &ly->experts));
        ly->has_shared = cfg->n_shared_experts > 0;
        if (ly->has_shared) {
            int64_t I = (int64_t)cfg->n_shared_experts * cfg->moe_intermediate_size;
            MS_TRY(load_linear(c, NM("mlp.shared_experts.gate_proj"), I, H, MS_GROUP_SHARED, 0, 1, MS_SPLIT_OUT, &ly->sh_gate));
            MS_TRY(load_linear(c, NM("mlp.shared_experts.up_proj"), I, H, MS_GROUP_SHARED, 0, 1, MS_SPLIT_OUT, &ly->sh_up));
            MS_TRY(load_linear(c, NM("mlp.shared_experts.down_proj"), H, I, MS_GROUP_SHARED, 0, 1, MS_SPLIT_IN, &ly->sh_down));
        }
    }
#undef NM
    return MS_OK;
}

static void set_quant_desc(ms_model *m) {
    int n_fmt[3] = {0, 0, 0};
    for (int g = 0; g < MS_N_GROUPS; g++)
        for (int f = 0; f < 3; f++) n_fmt[f] += m->stats.linears_by_group[g][f];
    if (n_fmt[1] && n_fmt[2]) snprintf(m->quant_desc, sizeof m->quant_desc, "mixed");
    else if (n_fmt[2]) snprintf(m->quant_desc, sizeof m->quant_desc, "nvfp4 (group 16)");
    else if (n_fmt[1]) snprintf(m->quant_desc, sizeof m->quant_desc, "fp8 (block 128)");
    else snprintf(m->quant_desc, sizeof m->quant_desc, "%s", ms_wfmt_name(MS_WFMT_PLAIN, m->embed.dtype));
}

/* Tensors no view uses: MTP layers and layers cut by an override are expected; anything else is
 * reported once. */
static void account_unused(lctx *c) {
    int n = ms_st_count(c->st), unexpected = 0;
    const char *first = NULL;
    for (int i = 0; i < n; i++) {
        if (c->used[i]) continue;
        const char *name = ms_st_at(c->st, i)->name;
        int L;
        if (sscanf(name, "model.layers.%d.", &L) == 1 && L >= c->cfg->num_layers) {
            if (L >= c->cfg->num_layers_ckpt) c->m->stats.n_mtp_tensors_skipped++;
            else c->m->stats.n_layer_tensors_skipped++;
            continue;
        }
        if (!first) first = name;
        unexpected++;
    }
    c->m->stats.n_unexpected_tensors = unexpected;
    if (unexpected)
        MS_LOGW("%s: %d tensor%s not used by the %s model were ignored (first: '%s')", c->dir, unexpected,
                unexpected == 1 ? "" : "s", c->cfg->model_type, first);
}

/* The MTP (NEXTN) module (model.h ms_mtp): its decoder layer at checkpoint index num_layers_ckpt goes
 * to m->layers[num_layers] (the two differ when num_hidden_layers is overridden), plus enorm, hnorm,
 * eh_proj and shared_head. Called after the lm_head is loaded (a checkpoint without shared_head.head
 * uses it). */
static int load_mtp(lctx *c) {
    ms_model *m = c->m;
    ms_config *cfg = &m->cfg;
    const int64_t V = cfg->vocab_size, H = cfg->hidden_size;
    const int Lc = cfg->num_layers_ckpt, Lf = cfg->num_layers;
    if (cfg->num_nextn_predict_layers < 1)
        return ms_errf(c->err, MS_ERR_INVALID,
                       "%s: config.json field 'num_nextn_predict_layers' is 0: the checkpoint has no MTP layer for NEXTN "
                       "speculative decoding", c->dir);
    if (Lc >= MS_MAX_LAYERS || Lf >= MS_MAX_LAYERS)
        return ms_errf(c->err, MS_ERR_UNSUPPORTED, "%s: the MTP layer index %d is past the %d layers supported", c->dir, Lc,
                       MS_MAX_LAYERS);
    /* the MTP layer of GLM / DeepSeek checkpoints is a MoE layer when the model has experts */
    const int moe = cfg->n_routed_experts > 0 && Lc >= cfg->first_k_dense_replace;
    cfg->layer_is_moe[Lc] = cfg->layer_is_moe[Lf] = (uint8_t)moe;
    cfg->arch->mtp_layer(cfg, Lc);
    cfg->arch->mtp_layer(cfg, Lf);
    ms_mtp *t = &m->mtp;
    t->ckpt_layer = Lc;
    t->loaded = 1; /* from here on placement and ms_model_free visit whatever got loaded */
    char nm[256];
#define NM(suffix) (snprintf(nm, sizeof nm, "model.layers.%d.%s", Lc, suffix), nm)
    if (!c->dummy && !ms_st_find(c->st, NM("eh_proj.weight")))
        return ms_errf(c->err, MS_ERR_NOT_FOUND,
                       "%s: tensor '%s' is missing: config.json declares num_nextn_predict_layers %d but the checkpoint "
                       "holds no MTP layer (needed for NEXTN speculative decoding)", c->dir, nm, cfg->num_nextn_predict_layers);
    MS_TRY(load_layer(c, Lc, &m->layers[Lf]));
    MS_TRY(load_tensor1(c, NM("enorm.weight"), H, 1, MS_GROUP_LM_HEAD, MS_DUMMY_NORM, &t->enorm));
    MS_TRY(load_tensor1(c, NM("hnorm.weight"), H, 1, MS_GROUP_LM_HEAD, MS_DUMMY_NORM, &t->hnorm));
    MS_TRY(load_linear(c, NM("eh_proj"), H, 2 * H, MS_GROUP_LM_HEAD, 0, 0, MS_SPLIT_NONE, &t->eh_proj));
    MS_TRY(load_tensor1(c, NM("shared_head.norm.weight"), H, 1, MS_GROUP_LM_HEAD, MS_DUMMY_NORM, &t->head_norm));
    /* dummy weights share the lm_head (real checkpoints hold a copy of it) */
    const int have_head = !c->dummy && ms_st_find(c->st, NM("shared_head.head.weight")) != NULL;
    if (have_head) {
        MS_TRY(load_linear(c, NM("shared_head.head"), V, H, MS_GROUP_LM_HEAD, 0, 0, MS_SPLIT_OUT, &t->head));
    } else {
        t->head = m->lm_head;
        t->head_shared = 1;
    }
#undef NM
    return MS_OK;
}

static int build(lctx *c, int with_mtp) {
    ms_model *m = c->m;
    const ms_config *cfg = &m->cfg;
    const int64_t V = cfg->vocab_size, H = cfg->hidden_size;
    m->layers = ms_model_alloc(m, (size_t)(cfg->num_layers + 1) * sizeof(ms_layer));
    if (!m->layers) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
    /* vocab-parallel: this rank's rows of the embedding (and of a tied lm_head) */
    int64_t eshape[2] = {c->dummy ? c->sh.nv : V, H};
    MS_TRY(load_tensor(c, "model.embed_tokens.weight", 2, eshape, 1, MS_GROUP_EMBED, MS_DUMMY_EMBED, &m->embed));
    if (!c->dummy && c->sh.nv != V) {
        m->embed.data = (char *)m->embed.data + c->sh.v0 * H * (int64_t)ms_dtype_size(m->embed.dtype);
        m->embed.shape[0] = c->sh.nv;
    }
    MS_TRY(load_tensor1(c, "model.norm.weight", H, 1, MS_GROUP_LM_HEAD, MS_DUMMY_NORM, &m->final_norm));
    for (int L = 0; L < cfg->num_layers; L++) MS_TRY(load_layer(c, L, &m->layers[L]));
    int have_head = c->dummy ? !cfg->tie_word_embeddings : ms_st_find(c->st, "lm_head.weight") != NULL;
    if (have_head) {
        MS_TRY(load_linear(c, "lm_head", V, H, MS_GROUP_LM_HEAD, 0, 0, MS_SPLIT_OUT, &m->lm_head));
    } else if (cfg->tie_word_embeddings) {
        memset(&m->lm_head, 0, sizeof m->lm_head);
        m->lm_head.name = "lm_head";
        m->lm_head.fmt = MS_WFMT_PLAIN;
        m->lm_head.n_out = c->sh.nv;
        m->lm_head.n_in = H;
        m->lm_head.w = m->embed;
        m->tied_lm_head = 1;
        m->stats.linears_by_group[MS_GROUP_LM_HEAD][0]++; /* bytes counted with embed */
    } else {
        return missing(c, "lm_head.weight");
    }
    if (with_mtp) MS_TRY(load_mtp(c));
    if (!c->dummy) account_unused(c);
    int nt = 0;
    if (c->used)
        for (int i = 0; i < ms_st_count(c->st); i++) nt += c->used[i];
    m->stats.n_tensors = nt;
    set_quant_desc(m);
    return MS_OK;
}

/* Contract in loader_internal.h. */
int ms_ld_stack_layers(ms_model *m, ms_backend *b, const char *label, int (*parts_of)(const ms_model *m, ms_layer *l,
                                                                                    ms_linear **parts),
                       ms_err *err) {
    if (!b->ops->stack_linears) return MS_OK;
    const int nl = m->cfg.num_layers + (m->mtp.loaded ? 1 : 0);
    ms_linear *parts[MS_STACK_MAX_PARTS];
    for (int L = 0; L < nl; L++)
        if (parts_of(m, &m->layers[L], parts) < 2) return MS_OK;
    for (int L = 0; L < nl; L++) {
        ms_layer *l = &m->layers[L];
        const int n = parts_of(m, l, parts);
        char nm[128];
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.%s (stacked)", L, label);
        const char *name = ms_model_strdup(m, nm);
        if (!name) return ms_errf(err, MS_ERR_NOMEM, "out of memory");
        ms_err e2 = {0};
        int rc = b->ops->stack_linears(b, parts, n, name, &l->a_stack, &e2);
        if (rc == MS_ERR_UNSUPPORTED && L == 0) {
            MS_LOGI("%s stay separate: %s", label, e2.msg);
            return MS_OK;
        }
        if (rc) return ms_errf(err, rc, "%s", e2.msg);
    }
    MS_LOGI("%s of %d layers stacked into one linear each (%lld rows)", label, nl, (long long)m->layers[0].a_stack.n_out);
    return MS_OK;
}

/* The architecture's fused weight forms (fuse_placed) are built unless MS_STACK_PROJ=0 (an A/B switch
 * for measuring them). */
static int stack_wanted(void) {
    const char *e = getenv("MS_STACK_PROJ");
    return !(e && !strcmp(e, "0"));
}

int ms_model_load(const char *dir, const ms_load_opts *opts, ms_model **out, ms_err *err) {
    *out = NULL;
    ms_load_opts def = {0};
    if (!opts) opts = &def;
    ms_model *m = calloc(1, sizeof *m);
    if (!m) return ms_errf(err, MS_ERR_NOMEM, "out of memory");
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    lctx c = {.m = m, .cfg = &m->cfg, .dir = dir, .err = err, .seed = opts->seed};
    int rc = ms_config_load_with_overrides(dir, opts->overrides, opts->n_overrides, &m->cfg, err);
    if (!rc)
        rc = ms_shard_make(&m->cfg, opts->tp_size > 0 ? opts->tp_size : 1, opts->ep_size > 0 ? opts->ep_size : 1,
                           opts->tp_rank, &m->shard, err);
    c.sh = m->shard;
    const char *lf = opts->load_format ? opts->load_format : "auto";
    if (!rc) {
        if (!strcmp(lf, "dummy")) {
            c.dummy = 1;
            const char *q = opts->dummy_quant ? opts->dummy_quant : "bf16";
            if (!strcmp(q, "bf16")) c.dummy_fmt = MS_WFMT_PLAIN;
            else if (!strcmp(q, "fp8")) c.dummy_fmt = MS_WFMT_FP8;
            else if (!strcmp(q, "nvfp4")) c.dummy_fmt = MS_WFMT_NVFP4;
            else rc = ms_errf(err, MS_ERR_INVALID, "dummy weight format '%s' is not one of bf16, fp8, nvfp4", q);
            ms_backend *d = opts->dummy_device;
            if (!rc && d && d->ops->dummy_linear && d->ops->dummy_tensor) {
                /* placed while built: ms_model_free unplaces whatever was made, also after an error */
                c.dev = d;
                m->placed = 1;
                m->placed_on = d;
                m->placed_at_load = 1;
            }
        } else if (!strcmp(lf, "auto") || !strcmp(lf, "safetensors")) {
            rc = ms_quant_decl_load(dir, &c.q, err);
            if (!rc) rc = ms_st_open(dir, &m->st, err);
            if (!rc) {
                c.st = m->st;
                c.used = calloc((size_t)ms_st_count(m->st) + 1, 1);
                if (!c.used) rc = ms_errf(err, MS_ERR_NOMEM, "out of memory");
            }
            /* a rank of a split reads only its slices, as pages are touched; prefetch would read all */
            if (!rc && opts->prefetch_threads >= 0 && m->shard.tp_size == 1) {
                /* read ahead only what fits in free memory; a bigger checkpoint pages in on use */
                long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
                double avail = pages > 0 && psz > 0 ? (double)pages * (double)psz : 0;
                if ((double)ms_st_total_bytes(m->st) < 0.8 * avail)
                    rc = ms_st_prefetch_ex(m->st, opts->prefetch_threads, opts->progress, err);
                else
                    MS_LOGI("%s: checkpoint (%.1f GB) exceeds free memory; not prefetching", dir, ms_st_total_bytes(m->st) / 1e9);
            }
        } else {
            rc = ms_errf(err, MS_ERR_INVALID, "load format '%s' is not one of auto, safetensors, dummy", lf);
        }
    }
    if (!rc) rc = build(&c, opts->load_mtp);
    free(c.used);
    ms_quant_decl_free(&c.q);
    if (!rc && c.dev) rc = c.dev->ops->sync(c.dev, err); /* fill kernels finished (and succeeded) */
    if (!rc && c.dev && m->cfg.arch->fuse_placed && stack_wanted()) rc = m->cfg.arch->fuse_placed(m, c.dev, err);
    if (rc) {
        ms_model_free(m);
        return rc;
    }
    *out = m;
    return MS_OK;
}

/* ---- placement ---- */

typedef struct visit {
    int (*tensor)(struct visit *v, ms_tensor *t);
    int (*linear)(struct visit *v, ms_linear *W);
    ms_backend *b;
    ms_err *err;
} visit;

static int visit_all(ms_model *m, visit *v) {
#define VT(t) do { if ((t).data) MS_TRY(v->tensor(v, &(t))); } while (0)
#define VL(W) do { if ((W).w.data) MS_TRY(v->linear(v, &(W))); } while (0)
    VT(m->embed);
    VT(m->final_norm);
    if (!m->tied_lm_head) VL(m->lm_head);
    const int nl = m->cfg.num_layers + (m->mtp.loaded ? 1 : 0);
    if (m->mtp.loaded) {
        VT(m->mtp.enorm); VT(m->mtp.hnorm); VT(m->mtp.head_norm); VL(m->mtp.eh_proj);
        if (!m->mtp.head_shared) VL(m->mtp.head);
    }
    for (int L = 0; L < nl && m->layers; L++) {
        ms_layer *l = &m->layers[L];
        VT(l->attn_norm); VT(l->ffn_norm); VT(l->q_norm); VT(l->k_norm); VT(l->q_a_norm); VT(l->kv_a_norm);
        VT(l->idx_k_norm_w); VT(l->idx_k_norm_b); VT(l->router_bias);
        VL(l->q_proj); VL(l->k_proj); VL(l->v_proj); VL(l->a_stack); VL(l->o_proj);
        VL(l->q_a_proj); VL(l->q_b_proj); VL(l->kv_a_proj); VL(l->kv_b_proj);
        VL(l->idx_wq_b); VL(l->idx_wk); VL(l->idx_wproj);
        VL(l->gate_proj); VL(l->up_proj); VL(l->down_proj); VL(l->router);
        VL(l->sh_gate); VL(l->sh_up); VL(l->sh_down);
        for (int e = 0; e < l->experts.n; e++) { VL(l->experts.gate[e]); VL(l->experts.up[e]); VL(l->experts.down[e]); }
    }
#undef VT
#undef VL
    return MS_OK;
}

static int place_t(visit *v, ms_tensor *t) { return v->b->ops->place_tensor(v->b, t, v->err); }
static int place_l(visit *v, ms_linear *W) { return v->b->ops->place_linear(v->b, W, v->err); }
static int unplace_t(visit *v, ms_tensor *t) { v->b->ops->unplace_tensor(v->b, t); return MS_OK; }
static int unplace_l(visit *v, ms_linear *W) { v->b->ops->unplace_linear(v->b, W); return MS_OK; }

int ms_model_place(ms_model *m, ms_backend *b, ms_err *err) {
    if (m->placed && m->placed_at_load && m->placed_on == b) return MS_OK;
    if (m->placed) return ms_errf(err, MS_ERR_INVALID, "model %s is already placed on backend %s", m->dir, m->placed_on->name);
    visit v = {place_t, place_l, b, err};
    m->placed_on = b;
    m->placed = 1;
    int rc = visit_all(m, &v);
    if (m->tied_lm_head) m->lm_head.w = m->embed; /* shares the embedding's (now placed) memory */
    if (m->mtp.head_shared) m->mtp.head = m->lm_head;
    if (!rc && m->cfg.arch->fuse_placed && stack_wanted()) rc = m->cfg.arch->fuse_placed(m, b, err);
    return rc;
}

void ms_model_free(ms_model *m) {
    if (!m) return;
    if (m->placed && m->placed_on) {
        visit v = {unplace_t, unplace_l, m->placed_on, NULL};
        visit_all(m, &v);
    }
    ms_st_close(m->st);
    own_free(m->owned);
    free(m);
}
