/* attn.c - the attention implementation registry: which implementations this build has, resolving
 * a flag's value (auto or a forced name) with the sentence that tells the user what would work
 * instead, and the CPU implementation (the backend's own ops, the float32 reference).
 *
 * CUDA implementations live in backend/cuda/attn_impl.cu and are listed only when the build has
 * CUDA. Registry order is the auto preference: tensor cores first, the straightforward reference
 * kernel last. */
#include "backend/attn.h"

#include <stdio.h>
#include <string.h>

/* ---- CPU: the backend's ops (float32 reference) ---- */

static int cpu_supports(const ms_backend *b, const ms_attn_shape *s, char *why, size_t cap) {
    (void)b;
    (void)s;
    (void)why;
    (void)cap;
    return 1;
}

static size_t cpu_ws(const ms_backend *b, const ms_attn_shape *s) {
    (void)b;
    (void)s;
    return 0;
}

static int cpu_run(ms_backend *b, const ms_attn_call *c, ms_err *err) {
    if (c->kind == MS_ATTN_GQA) return b->ops->attn_gqa(b, c->q, c->k, c->v, c->m, c->scale, c->out, err);
    return b->ops->mla_attn(b, c->q, c->k, c->m, c->kind == MS_ATTN_DSA ? c->topk_d : NULL, c->topk, c->kvl, c->scale,
                            c->out, err);
}

static const ms_attn_impl ms_attn_impl_cpu = {
    "cpu", "cpu", "float32 reference: one pass per query head over its keys (gathered top-k for DSA)",
    cpu_supports, cpu_ws, cpu_run, MS_ATTN_CAP_GQA | MS_ATTN_CAP_MLA | MS_ATTN_CAP_DSA,
};

#ifdef MS_HAVE_CUDA
extern const ms_attn_impl ms_attn_impl_mma, ms_attn_impl_flash, ms_attn_impl_flash_nosplit, ms_attn_impl_ref;
#endif

static const ms_attn_impl *const g_impls[] = {
#ifdef MS_HAVE_CUDA
    &ms_attn_impl_mma,
    &ms_attn_impl_flash,
    &ms_attn_impl_flash_nosplit,
    &ms_attn_impl_ref,
#endif
    &ms_attn_impl_cpu,
    NULL,
};

static const char *const g_kind_name[MS_ATTN_KINDS] = {"GQA attention", "MLA attention", "DSA sparse attention"};

const ms_attn_impl *const *ms_attn_impls(void) { return g_impls; }

const char *ms_attn_flag(ms_attn_kind k, int decode) {
    if (k != MS_ATTN_DSA) return "--attention-backend";
    return decode ? "--nsa-decode-backend" : "--nsa-prefill-backend";
}

static void where(const ms_backend *b, char *buf, size_t cap) {
    if (b->device >= 0 && b->gpu.name[0])
        snprintf(buf, cap, "%s (compute capability %d.%d)", b->gpu.name, b->gpu.cc_major, b->gpu.cc_minor);
    else
        snprintf(buf, cap, "the %s backend", b->name);
}

int ms_attn_ok(const ms_attn_impl *r, const ms_backend *b, const ms_attn_shape *s, char *why, size_t cap) {
    if (strcmp(r->backend, b->name) != 0) return snprintf(why, cap, "it is a %s implementation", r->backend), 0;
    if (!(r->caps & (1u << s->kind))) return snprintf(why, cap, "it does not implement %s", g_kind_name[s->kind]), 0;
    unsigned missing = s->need_caps & ~r->caps;
    if (missing & MS_ATTN_CAP_GRAPHS) return snprintf(why, cap, "it cannot be recorded into a CUDA graph"), 0;
    if (missing) return snprintf(why, cap, "it lacks a capability the caller needs (flags 0x%x)", missing), 0;
    return r->supports(b, s, why, cap);
}

/* Comma-separated names of the implementations that can run s on b (or "none"). */
static void capable(const ms_backend *b, const ms_attn_shape *s, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; g_impls[i]; i++) {
        char why[160];
        if (!ms_attn_ok(g_impls[i], b, s, why, sizeof why)) continue;
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", n ? ", " : "", g_impls[i]->name);
    }
    if (!buf[0]) snprintf(buf, cap, "none");
}

int ms_attn_resolve(const ms_backend *b, const char *flag, const char *name, const ms_attn_shape *s,
                    const ms_attn_impl **out, ms_err *err) {
    *out = NULL;
    char loc[192], can[256], why[256] = "";
    where(b, loc, sizeof loc);
    capable(b, s, can, sizeof can);
    if (!name || !name[0] || !strcmp(name, "auto")) {
        for (int i = 0; g_impls[i] && !*out; i++)
            if (ms_attn_ok(g_impls[i], b, s, why, sizeof why)) *out = g_impls[i];
        if (*out) return MS_OK;
        return ms_errf(err, MS_ERR_UNSUPPORTED, "flag %s auto: no attention implementation runs %s (%d heads, dims %d/%d) on %s",
                       flag, g_kind_name[s->kind], s->n_heads, s->dk, s->dv, loc);
    }
    const ms_attn_impl *r = NULL;
    for (int i = 0; g_impls[i]; i++)
        if (!strcmp(g_impls[i]->name, name)) r = g_impls[i];
    if (!r) {
        char all[256];
        size_t n = 0;
        for (int i = 0; g_impls[i]; i++)
            n += (size_t)snprintf(all + n, n < sizeof all ? sizeof all - n : 0, "%s%s", i ? ", " : "", g_impls[i]->name);
        return ms_errf(err, MS_ERR_INVALID,
                       "flag %s: unknown attention implementation '%s' (this build has: auto, %s; those that can run %s on %s: %s)",
                       flag, name, all, g_kind_name[s->kind], loc, can);
    }
    if (!ms_attn_ok(r, b, s, why, sizeof why))
        return ms_errf(err, MS_ERR_UNSUPPORTED, "flag %s: attention implementation '%s' cannot run %s on %s: %s; those that can: %s",
                       flag, name, g_kind_name[s->kind], loc, why[0] ? why : "unsupported shape", can);
    *out = r;
    return MS_OK;
}

int ms_attn_run(const ms_attn_impl *impl, ms_backend *b, const ms_attn_call *c, ms_err *err) {
    if (!(impl->caps & (1u << c->kind)))
        return ms_errf(err, MS_ERR_UNSUPPORTED, "attention implementation '%s' does not implement %s", impl->name,
                       g_kind_name[c->kind]);
    if (c->prep && (c->kind != MS_ATTN_GQA || !(impl->caps & MS_ATTN_CAP_GQA_PREP)))
        return ms_errf(err, MS_ERR_UNSUPPORTED, "attention implementation '%s' does not take raw q/k/v (gqa_prep) for %s",
                       impl->name, g_kind_name[c->kind]);
    return impl->run(b, c, err);
}
