/* tuned.c - per-GPU tuned values for the MoE `auto` policy, written by `moeserve tune` into
 * configs/tuned/<gpu-name>.json. The decode-vs-grouped crossover depends on the GPU (bandwidth,
 * SM count, launch latency), so a measured value replaces the default heuristic only when the file
 * names the very GPU the backend runs on; anything else (no file, other GPU, bad JSON) leaves the
 * heuristic in place. The fused one-token MoE kernel's fastest launch form per expert shape is kept
 * here for the same reason: it is a property of the GPU that its cost model does not predict. */
#include "moe/moe.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

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
    const char *gpu = json_string_value(json_object_get(root, "gpu"));
    if (!gpu || strcmp(gpu, b->gpu.name)) {
        json_decref(root);
        return 0;
    }
    json_t *th = json_object_get(root, "moe_decode_max_tokens");
    if (json_is_integer(th)) {
        json_int_t v = json_integer_value(th);
        if (v >= 0 && v <= 1 << 20) {
            ms_moe_set_auto_threshold((int)v);
            applied = 1;
        }
    }
    json_t *forms = json_object_get(root, "moe_fused_forms");
    for (size_t i = 0; json_is_array(forms) && i < json_array_size(forms) && i < 4 * MS_MOE_MAX_FORMS; i++) {
        json_t *e = json_array_get(forms, i);
        static const char *const key[5] = {"hidden", "inter", "slots", "groups", "depth"};
        json_int_t v[5];
        int ok = json_is_object(e);
        for (int k = 0; ok && k < 5; k++) {
            json_t *x = json_object_get(e, key[k]);
            ok = json_is_integer(x) && (v[k] = json_integer_value(x)) >= 1 && v[k] <= 1 << 20;
        }
        if (!ok) continue; /* ms_moe_set_fused_form checks the ranges of the rest */
        const ms_moe_form f = {(int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4]};
        applied |= ms_moe_set_fused_form(&f);
    }
    json_decref(root);
    return applied;
}
