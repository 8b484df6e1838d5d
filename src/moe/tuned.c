/* tuned.c - per-GPU tuned values for the MoE `auto` policy, written by `moeserve tune` into
 * configs/tuned/<gpu-name>.json. The decode-vs-grouped crossover depends on the GPU (bandwidth,
 * SM count, launch latency), so a measured value replaces the default heuristic only when the file
 * names the very GPU the backend runs on; anything else (no file, other GPU, bad JSON) leaves the
 * heuristic in place. The fused one-token MoE kernel's fastest launch form per expert shape is kept
 * here for the same reason: it is a property of the GPU that its cost model does not predict. */
#include "moe/moe.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* The file's keys, which the reader and the writer below share: "gpu" must equal the backend's name,
 * the crossover applies the auto threshold, each form entry records FORM_KEYS' five integers. */
#define KEY_GPU "gpu"
#define KEY_CROSS "moe_decode_max_tokens"
#define KEY_FORMS "moe_fused_forms"
static const char *const FORM_KEYS[5] = {"hidden", "inter", "slots", "groups", "depth"};

void ms_moe_tuned_file_name(const char *gpu_name, char *out, size_t cap) {
    size_t n = 0;
    int dash = 0;
    for (const char *p = gpu_name; *p && n + 1 < cap; p++) {
        unsigned char ch = (unsigned char)*p;
        if (isalnum(ch)) {
            out[n++] = (char)tolower(ch);
            dash = 0;
        } else if (!dash && n > 0) {
            out[n++] = '-';
            dash = 1;
        }
    }
    while (n > 0 && out[n - 1] == '-') n--;
    if (n == 0 && cap > 8) n = (size_t)snprintf(out, cap, "unknown");
    out[n < cap ? n : cap - 1] = 0;
}

int ms_moe_apply_tuned(const ms_backend *b, const char *dir) {
    if (!b || b->device < 0 || !b->gpu.name[0] || !dir) return 0;
    char base[160], path[1400];
    ms_moe_tuned_file_name(b->gpu.name, base, sizeof base);
    snprintf(path, sizeof path, "%s/%s.json", dir, base);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return 0;
    int applied = 0;
    const char *gpu = json_string_value(json_object_get(root, KEY_GPU));
    if (!gpu || strcmp(gpu, b->gpu.name)) {
        json_decref(root);
        return 0;
    }
    json_t *th = json_object_get(root, KEY_CROSS);
    if (json_is_integer(th)) {
        json_int_t v = json_integer_value(th);
        if (v >= 0 && v <= 1 << 20) {
            ms_moe_set_auto_threshold((int)v);
            applied = 1;
        }
    }
    json_t *forms = json_object_get(root, KEY_FORMS);
    for (size_t i = 0; json_is_array(forms) && i < json_array_size(forms) && i < 4 * MS_MOE_MAX_FORMS; i++) {
        json_t *e = json_array_get(forms, i);
        json_int_t v[5];
        int ok = json_is_object(e);
        for (int k = 0; ok && k < 5; k++) {
            json_t *x = json_object_get(e, FORM_KEYS[k]);
            ok = json_is_integer(x) && (v[k] = json_integer_value(x)) >= 1 && v[k] <= 1 << 20;
        }
        if (!ok) continue; /* ms_moe_set_fused_form checks the ranges of the rest */
        const ms_moe_form f = {(int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4]};
        applied |= ms_moe_set_fused_form(&f);
    }
    json_decref(root);
    return applied;
}

/* 1 when form entry e is for shape (hidden, inter, slots) of f. */
static int same_shape(json_t *e, const ms_moe_form *f) {
    const int v[3] = {f->hidden, f->inter, f->slots};
    for (int k = 0; k < 3; k++)
        if (json_integer_value(json_object_get(e, FORM_KEYS[k])) != v[k]) return 0;
    return 1;
}

/* Contract in moe.h. */
int ms_moe_tuned_write(const char *dir, const ms_moe_tune_result *r, char *path, size_t cap, ms_err *err) {
    char base[160], tmp[1400];
    ms_moe_tuned_file_name(r->gpu, base, sizeof base);
    const int n = snprintf(path, cap, "%s/%s.json", dir, base);
    if (n < 0 || (size_t)n >= cap || (size_t)n + 4 >= sizeof tmp)
        return ms_errf(err, MS_ERR_INVALID, "tuned file: the directory name %.200s is too long", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    /* an earlier file for this GPU keeps its other shapes' forms (and, with forms_only, its crossover) */
    json_t *old = json_load_file(path, 0, NULL), *root = json_object(), *forms = json_array();
    const char *old_gpu = json_string_value(json_object_get(old, KEY_GPU));
    const int keep = json_is_object(old) && old_gpu && !strcmp(old_gpu, r->gpu);
    char cc[32];
    snprintf(cc, sizeof cc, "%d.%d", r->cc_major, r->cc_minor);
    json_object_set_new(root, KEY_GPU, json_string(r->gpu));
    json_object_set_new(root, "compute_capability", json_string(cc));
    static const char *const kept[3] = {KEY_CROSS, "measured_on", "us_per_call"};
    if (r->forms_only) {
        for (int i = 0; i < 3 && keep; i++)
            if (json_object_get(old, kept[i])) json_object_set(root, kept[i], json_object_get(old, kept[i]));
    } else {
        json_object_set_new(root, KEY_CROSS, json_integer(r->decode_max_tokens));
        json_object_set_new(root, "measured_on",
                            json_pack("{s:s, s:s, s:i, s:i, s:i, s:i}", "model", r->model, "experts", r->quant, "hidden",
                                      r->hidden, "inter", r->inter, "topk", r->topk, "n_experts", r->n_experts));
        json_t *calls = json_array();
        for (int i = 0; i < r->n_tokens; i++)
            json_array_append_new(calls, json_pack("{s:i, s:f, s:f}", "tokens", r->tokens[i], "decode", r->us_decode[i],
                                                   "grouped", r->us_grouped[i]));
        json_object_set_new(root, "us_per_call", calls);
    }
    json_t *of = keep ? json_object_get(old, KEY_FORMS) : NULL;
    for (size_t i = 0; json_is_array(of) && i < json_array_size(of); i++) {
        json_t *e = json_array_get(of, i);
        if (r->best.groups && same_shape(e, &r->best)) continue; /* measured again now */
        json_array_append(forms, e);
    }
    if (r->best.groups) {
        const ms_moe_form *f = &r->best;
        json_t *e = json_object();
        const int v[5] = {f->hidden, f->inter, f->slots, f->groups, f->depth};
        for (int k = 0; k < 5; k++) json_object_set_new(e, FORM_KEYS[k], json_integer(v[k]));
        json_object_set_new(e, "model", json_string(r->model));
        json_object_set_new(e, "experts", json_string(r->quant));
        json_t *all = json_array();
        for (int i = 0; i < r->n_forms; i++)
            if (r->form_us[i] >= 0)
                json_array_append_new(all, json_pack("{s:i, s:i, s:f}", "groups", r->form_groups[i], "depth",
                                                     r->form_depth[i], "us", r->form_us[i]));
        json_object_set_new(e, "us_per_form", all);
        if (r->cost_model_us >= 0) json_object_set_new(e, "cost_model_us", json_real(r->cost_model_us));
        json_array_append_new(forms, e);
    }
    json_object_set_new(root, KEY_FORMS, forms);
    errno = 0;
    const int wrc = json_dump_file(root, tmp, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    int werr = errno; /* before the frees below; 0 when jansson failed without a system error */
    const int mv = wrc ? 0 : rename(tmp, path);
    if (mv) werr = errno;
    json_decref(root);
    json_decref(old);
    if (wrc || mv) {
        remove(tmp);
        return ms_errf(err, MS_ERR_IO, "tuned file: cannot write %s: %s", wrc ? tmp : path,
                       werr ? strerror(werr) : "JSON encoding failed");
    }
    return MS_OK;
}
