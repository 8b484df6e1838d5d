/* moe.c - the MoE runner registry: which runners this build has, resolving a forced name with an
 * explanation that tells the user what would work instead, and the `auto` policy per call.
 *
 * CUDA runners live in moe/cuda/ and are listed only when the build has CUDA. The auto policy
 * prefers the decode-specialised runner for few tokens and the grouped GEMM runner otherwise; the
 * token threshold can be replaced by a tuned value (moeserve tune). */
#include "moe/moe.h"

#include <stdio.h>
#include <string.h>

extern const ms_moe_runner ms_moe_runner_cpu;
#ifdef MS_HAVE_CUDA
extern const ms_moe_runner ms_moe_runner_naive, ms_moe_runner_grouped, ms_moe_runner_decode;
#endif

static const ms_moe_runner *const g_runners[] = {
    &ms_moe_runner_cpu,
#ifdef MS_HAVE_CUDA
    &ms_moe_runner_decode,
    &ms_moe_runner_grouped,
    &ms_moe_runner_naive,
#endif
    NULL,
};

static int g_decode_max_tokens = 16;

const ms_moe_runner *const *ms_moe_runners(void) { return g_runners; }

void ms_moe_set_auto_threshold(int decode_max_tokens) {
    if (decode_max_tokens >= 0) g_decode_max_tokens = decode_max_tokens;
}

int ms_moe_auto_threshold(void) { return g_decode_max_tokens; }

static ms_moe_form g_forms[MS_MOE_MAX_FORMS];
static int g_n_forms;

int ms_moe_set_fused_form(const ms_moe_form *f) {
    if (f->hidden < 1 || f->hidden > 1 << 20 || f->inter < 1 || f->inter > 1 << 20 || f->slots < 1 || f->slots > 64 ||
        f->groups < 0 || f->groups > 8 || (f->groups && (f->depth < 1 || f->depth > 64)))
        return 0;
    int i = 0;
    while (i < g_n_forms && (g_forms[i].hidden != f->hidden || g_forms[i].inter != f->inter || g_forms[i].slots != f->slots))
        i++;
    if (!f->groups) { /* drop the shape's record: the last one takes its place */
        if (i < g_n_forms) g_forms[i] = g_forms[--g_n_forms];
        return 1;
    }
    if (i == MS_MOE_MAX_FORMS) return 0;
    g_forms[i] = *f;
    if (i == g_n_forms) g_n_forms++;
    return 1;
}

int ms_moe_fused_form(int hidden, int inter, int slots, int *groups, int *depth) {
    for (int i = 0; i < g_n_forms; i++)
        if (g_forms[i].hidden == hidden && g_forms[i].inter == inter && g_forms[i].slots == slots) {
            *groups = g_forms[i].groups, *depth = g_forms[i].depth;
            return 1;
        }
    return 0;
}

static void where(const ms_backend *b, char *buf, size_t cap) {
    if (b->device >= 0 && b->gpu.name[0])
        snprintf(buf, cap, "%s (compute capability %d.%d)", b->gpu.name, b->gpu.cc_major, b->gpu.cc_minor);
    else
        snprintf(buf, cap, "the %s backend", b->name);
}

/* 1 when r runs s on b with the capabilities s needs; otherwise 0 and the reason in why. */
static int runner_ok(const ms_moe_runner *r, const ms_backend *b, const ms_moe_shape *s, char *why, size_t cap) {
    if (strcmp(r->backend, b->name) != 0) return snprintf(why, cap, "it is a %s runner", r->backend), 0;
    unsigned missing = s->need_caps & ~r->caps;
    if (missing & MS_MOE_CAP_PARTIAL)
        return snprintf(why, cap, "it does not take expert-parallel routing (experts held by other ranks)"), 0;
    if (missing) return snprintf(why, cap, "it lacks a capability the caller needs (flags 0x%x)", missing), 0;
    return r->supports(b, s, why, cap);
}

/* Comma-separated names of the runners that can run s on b (or "none"). */
static void capable(const ms_backend *b, const ms_moe_shape *s, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; g_runners[i]; i++) {
        const ms_moe_runner *r = g_runners[i];
        char why[128];
        if (!runner_ok(r, b, s, why, sizeof why)) continue;
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", n ? ", " : "", r->name);
    }
    if (!buf[0]) snprintf(buf, cap, "none");
}

int ms_moe_resolve(const ms_backend *b, const char *name, const ms_moe_shape *s, const ms_moe_runner **out,
                   ms_err *err) {
    *out = NULL;
    if (!name || !name[0] || !strcmp(name, "auto")) return MS_OK;
    char loc[192], can[256];
    where(b, loc, sizeof loc);
    capable(b, s, can, sizeof can);
    const ms_moe_runner *r = NULL;
    for (int i = 0; g_runners[i]; i++)
        if (!strcmp(g_runners[i]->name, name)) r = g_runners[i];
    if (!r) {
        char all[256];
        size_t n = 0;
        for (int i = 0; g_runners[i]; i++)
            n += (size_t)snprintf(all + n, n < sizeof all ? sizeof all - n : 0, "%s%s", i ? ", " : "", g_runners[i]->name);
        return ms_errf(err, MS_ERR_INVALID,
                       "flag --moe-runner-backend: unknown MoE runner '%s' (this build has: auto, %s; runners that can run on %s: %s)",
                       name, all, loc, can);
    }
    if (strcmp(r->backend, b->name) != 0)
        return ms_errf(err, MS_ERR_UNSUPPORTED,
                       "flag --moe-runner-backend: runner '%s' cannot run on %s: it is a %s runner; runners that can: %s",
                       name, loc, r->backend, can);
    char why[256] = "";
    if (!runner_ok(r, b, s, why, sizeof why))
        return ms_errf(err, MS_ERR_UNSUPPORTED, "flag --moe-runner-backend: runner '%s' cannot run on %s: %s; runners that can: %s",
                       name, loc, why[0] ? why : "unsupported shape", can);
    *out = r;
    return MS_OK;
}

/* The first runner (in registry order) with all of `caps` that runs s on b, or NULL. */
static const ms_moe_runner *find_ok(const ms_backend *b, const ms_moe_shape *s, unsigned caps) {
    for (int i = 0; g_runners[i]; i++) {
        const ms_moe_runner *r = g_runners[i];
        char why[128];
        if ((r->caps & caps) != caps) continue;
        if (runner_ok(r, b, s, why, sizeof why)) return r;
    }
    return NULL;
}

const ms_moe_runner *ms_moe_pick(const ms_backend *b, const ms_moe_runner *forced, const ms_moe_shape *s) {
    if (forced) return forced;
    const ms_moe_runner *r = NULL;
    if (s->n_tokens <= g_decode_max_tokens) r = find_ok(b, s, MS_MOE_CAP_FEW_TOKENS);
    if (!r) r = find_ok(b, s, MS_MOE_CAP_MANY_TOKENS);
    if (!r) r = find_ok(b, s, 0);
    if (!r) /* nothing claims support: fall back to any runner of this backend (run() reports why) */
        for (int i = 0; g_runners[i] && !r; i++)
            if (!strcmp(g_runners[i]->backend, b->name)) r = g_runners[i];
    MS_ASSERT(r != NULL);
    return r;
}
