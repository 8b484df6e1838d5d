/* test_moe_tuned.c - the per-GPU tuned file (configs/tuned/<gpu>.json from `moeserve tune`) changes
 * the MoE auto threshold and the fused kernel's forms only for the GPU it names; missing/other-GPU/bad
 * files and entries keep the defaults; the form table's replace, drop and capacity rules; what the
 * writer writes, the reader applies, and successive runs merge. */
#include "moe/moe.h"
#include "test.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[64];

static void write_file(const char *name, const char *text) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
}

static ms_backend fake_gpu(const char *name) {
    ms_backend b;
    memset(&b, 0, sizeof b);
    b.name = "cuda";
    b.device = 0;
    snprintf(b.gpu.name, sizeof b.gpu.name, "%s", name);
    return b;
}

static void test_file_name(void) {
    char n[64];
    ms_moe_tuned_file_name("NVIDIA H200", n, sizeof n);
    CHECK_STR(n, "nvidia-h200");
    ms_moe_tuned_file_name("NVIDIA H100 80GB HBM3", n, sizeof n);
    CHECK_STR(n, "nvidia-h100-80gb-hbm3");
    ms_moe_tuned_file_name("  (x) ", n, sizeof n);
    CHECK_STR(n, "x");
}

static void test_apply(void) {
    ms_moe_set_auto_threshold(16);
    write_file("nvidia-h200.json", "{\"gpu\": \"NVIDIA H200\", \"moe_decode_max_tokens\": 48}");
    ms_backend h200 = fake_gpu("NVIDIA H200"), other = fake_gpu("NVIDIA A100-SXM4-80GB");
    CHECK_EQ_INT(ms_moe_apply_tuned(&other, g_dir), 0);
    CHECK_EQ_INT(ms_moe_auto_threshold(), 16);
    CHECK_EQ_INT(ms_moe_apply_tuned(&h200, g_dir), 1);
    CHECK_EQ_INT(ms_moe_auto_threshold(), 48);
    ms_moe_set_auto_threshold(16);
    /* a file under the right name that names another GPU, or is malformed, is ignored */
    write_file("nvidia-h200.json", "{\"gpu\": \"NVIDIA H200 NVL\", \"moe_decode_max_tokens\": 8}");
    CHECK_EQ_INT(ms_moe_apply_tuned(&h200, g_dir), 0);
    write_file("nvidia-h200.json", "{\"gpu\": \"NVIDIA H200\", \"moe_decode_max_tokens\": \"many\"}");
    CHECK_EQ_INT(ms_moe_apply_tuned(&h200, g_dir), 0);
    write_file("nvidia-h200.json", "{not json");
    CHECK_EQ_INT(ms_moe_apply_tuned(&h200, g_dir), 0);
    CHECK_EQ_INT(ms_moe_auto_threshold(), 16);
    ms_backend cpu = fake_gpu("");
    cpu.name = "cpu";
    cpu.device = -1;
    CHECK_EQ_INT(ms_moe_apply_tuned(&cpu, g_dir), 0);
}

/* the forms of "moe_fused_forms": well-formed entries recorded, the rest skipped one by one */
static void test_forms(void) {
    int g = -1, d = -1;
    ms_moe_set_auto_threshold(16);
    write_file("nvidia-h200.json",
               "{\"gpu\": \"NVIDIA H200\", \"moe_fused_forms\": ["
               "{\"hidden\": 4096, \"inter\": 1408, \"slots\": 9, \"groups\": 2, \"depth\": 4, \"us\": 41.5},"
               "{\"hidden\": 6144, \"inter\": 2048, \"slots\": 9, \"groups\": \"3\", \"depth\": 3},"
               "{\"hidden\": 6144, \"inter\": 2048, \"slots\": 9, \"groups\": 3},"
               "{\"hidden\": 6144, \"inter\": 2048, \"slots\": 99, \"groups\": 3, \"depth\": 3},"
               "{\"hidden\": 7168, \"inter\": 2048, \"slots\": 9, \"groups\": 3, \"depth\": 3},"
               "7]}");
    /* "NVIDIA-H200" maps to the same file name, whose "gpu" names another GPU: nothing is recorded */
    ms_backend h200 = fake_gpu("NVIDIA H200"), other = fake_gpu("NVIDIA-H200");
    CHECK_EQ_INT(ms_moe_apply_tuned(&other, g_dir), 0);
    CHECK(!ms_moe_fused_form(4096, 1408, 9, &g, &d));
    CHECK_EQ_INT(ms_moe_apply_tuned(&h200, g_dir), 1);
    CHECK_EQ_INT(ms_moe_auto_threshold(), 16); /* no threshold in the file */
    CHECK(ms_moe_fused_form(4096, 1408, 9, &g, &d));
    CHECK_EQ_INT(g, 2);
    CHECK_EQ_INT(d, 4);
    CHECK(!ms_moe_fused_form(4096, 1408, 8, &g, &d));
    CHECK(!ms_moe_fused_form(6144, 2048, 9, &g, &d)); /* a string, a missing depth */
    CHECK(!ms_moe_fused_form(6144, 2048, 99, &g, &d)); /* 99 slots: out of range */
    CHECK(ms_moe_fused_form(7168, 2048, 9, &g, &d));
    CHECK_EQ_INT(g * 10 + d, 33);
    /* replace, drop, capacity, ranges */
    CHECK(ms_moe_set_fused_form(&(ms_moe_form){4096, 1408, 9, 1, 6}));
    CHECK(ms_moe_fused_form(4096, 1408, 9, &g, &d));
    CHECK_EQ_INT(g * 10 + d, 16);
    CHECK(ms_moe_set_fused_form(&(ms_moe_form){4096, 1408, 9, 0, 0}));
    CHECK(!ms_moe_fused_form(4096, 1408, 9, &g, &d));
    CHECK(ms_moe_fused_form(7168, 2048, 9, &g, &d)); /* the other record survives the drop */
    CHECK(!ms_moe_set_fused_form(&(ms_moe_form){4096, 1408, 0, 1, 6}));
    CHECK(!ms_moe_set_fused_form(&(ms_moe_form){4096, 1408, 9, 9, 6}));
    CHECK(!ms_moe_set_fused_form(&(ms_moe_form){4096, 1408, 9, 1, 0}));
    int n = 1; /* 7168 holds one place */
    for (int i = 0; i < MS_MOE_MAX_FORMS + 2; i++) n += ms_moe_set_fused_form(&(ms_moe_form){128 * (i + 1), 256, 9, 1, 4});
    CHECK_EQ_INT(n, MS_MOE_MAX_FORMS);
    CHECK(ms_moe_set_fused_form(&(ms_moe_form){128, 256, 9, 3, 3})); /* a recorded shape is replaced when full */
    CHECK(ms_moe_fused_form(128, 256, 9, &g, &d));
    CHECK_EQ_INT(g * 10 + d, 33);
    for (int i = 0; i < MS_MOE_MAX_FORMS + 2; i++) ms_moe_set_fused_form(&(ms_moe_form){128 * (i + 1), 256, 9, 0, 0});
    ms_moe_set_fused_form(&(ms_moe_form){7168, 2048, 9, 0, 0});
    CHECK(!ms_moe_fused_form(7168, 2048, 9, &g, &d));
}

/* ms_moe_tuned_write (what `moeserve tune` writes) read back by ms_moe_apply_tuned: the crossover and the
 * best form apply; a second run for another shape keeps the first shape's form and replaces the
 * crossover; a forms-only run keeps the crossover and replaces its own shape's form; a file that names
 * another GPU under the same file name is not merged; an unwritable directory is an error naming it. */
static void test_write_read(void) {
    const int tokens[3] = {1, 8, 64};
    const double ud[3] = {40.5, 90.25, 400}, ug[3] = {60, 95, 300};
    const int fg[3] = {1, 2, 3}, fd[3] = {4, 4, 3};
    const double fu[3] = {44.5, 41.25, -1};
    ms_moe_tune_result r = {.gpu = "NVIDIA H200", .cc_major = 9, .cc_minor = 0, .decode_max_tokens = 8,
                            .model = "configs/glm-4.5-air.json", .quant = "nvfp4", .hidden = 4096, .inter = 1408,
                            .topk = 8, .n_experts = 128, .n_tokens = 3, .tokens = tokens, .us_decode = ud,
                            .us_grouped = ug, .best = {4096, 1408, 9, 2, 4}, .n_forms = 3, .form_groups = fg,
                            .form_depth = fd, .form_us = fu, .cost_model_us = 44.5};
    char path[512], want[512];
    ms_err err = {0};
    snprintf(want, sizeof want, "%s/nvidia-h200.json", g_dir);
    unlink(want);
    CHECK_EQ_INT(ms_moe_tuned_write(g_dir, &r, path, sizeof path, &err), MS_OK);
    CHECK_STR(path, want);
    ms_backend h200 = fake_gpu("NVIDIA H200"), other = fake_gpu("NVIDIA-H200");
    int g = -1, d = -1;
    ms_moe_set_auto_threshold(16);
    CHECK_EQ_INT(ms_moe_apply_tuned(&h200, g_dir), 1);
    CHECK_EQ_INT(ms_moe_auto_threshold(), 8);
    CHECK(ms_moe_fused_form(4096, 1408, 9, &g, &d));
    CHECK_EQ_INT(g * 10 + d, 24);
    /* another shape (GLM-5's), another crossover: both shapes' forms are in the file */
    r.decode_max_tokens = 32, r.best = (ms_moe_form){6144, 2048, 9, 3, 3};
    CHECK_EQ_INT(ms_moe_tuned_write(g_dir, &r, path, sizeof path, &err), MS_OK);
    /* forms only, Air's shape again with another form: the crossover of the last full run stays */
    r.forms_only = 1, r.decode_max_tokens = 999, r.best = (ms_moe_form){4096, 1408, 9, 1, 6};
    CHECK_EQ_INT(ms_moe_tuned_write(g_dir, &r, path, sizeof path, &err), MS_OK);
    /* what the reader does not use: the measured shape and per-call times carried over a forms-only run,
     * each form entry's per-form times (the form that did not fit, -1, left out) and the cost model's */
    json_t *root = json_load_file(path, 0, NULL);
    CHECK(json_is_object(root));
    json_t *mo = json_object_get(root, "measured_on"), *calls = json_object_get(root, "us_per_call");
    CHECK_EQ_INT((int)json_integer_value(json_object_get(mo, "n_experts")), 128);
    CHECK_EQ_INT((int)json_array_size(calls), 3);
    CHECK(json_real_value(json_object_get(json_array_get(calls, 1), "decode")) == 90.25);
    json_t *forms = json_object_get(root, "moe_fused_forms");
    CHECK_EQ_INT((int)json_array_size(forms), 2); /* GLM-5's kept, Air's replaced */
    for (size_t i = 0; i < json_array_size(forms); i++) {
        json_t *e = json_array_get(forms, i);
        CHECK_EQ_INT((int)json_array_size(json_object_get(e, "us_per_form")), 2);
        CHECK(json_real_value(json_object_get(e, "cost_model_us")) == 44.5);
        CHECK_STR(json_string_value(json_object_get(e, "experts")), "nvfp4");
    }
    CHECK_STR(json_string_value(json_object_get(root, "compute_capability")), "9.0");
    json_decref(root);
    ms_moe_set_fused_form(&(ms_moe_form){4096, 1408, 9, 0, 0});
    ms_moe_set_auto_threshold(16);
    CHECK_EQ_INT(ms_moe_apply_tuned(&h200, g_dir), 1);
    CHECK_EQ_INT(ms_moe_auto_threshold(), 32);
    CHECK(ms_moe_fused_form(4096, 1408, 9, &g, &d));
    CHECK_EQ_INT(g * 10 + d, 16);
    CHECK(ms_moe_fused_form(6144, 2048, 9, &g, &d));
    CHECK_EQ_INT(g * 10 + d, 33);
    /* a GPU whose name maps to the same file: the file is rewritten for it, nothing of the other kept */
    ms_moe_set_fused_form(&(ms_moe_form){4096, 1408, 9, 0, 0});
    ms_moe_set_fused_form(&(ms_moe_form){6144, 2048, 9, 0, 0});
    r.gpu = "NVIDIA-H200", r.forms_only = 1, r.best = (ms_moe_form){0, 0, 0, 0, 0};
    CHECK_EQ_INT(ms_moe_tuned_write(g_dir, &r, path, sizeof path, &err), MS_OK);
    ms_moe_set_auto_threshold(16);
    CHECK_EQ_INT(ms_moe_apply_tuned(&h200, g_dir), 0);
    CHECK_EQ_INT(ms_moe_apply_tuned(&other, g_dir), 0); /* no crossover, no form: nothing to apply */
    CHECK_EQ_INT(ms_moe_auto_threshold(), 16);
    CHECK(!ms_moe_fused_form(6144, 2048, 9, &g, &d));
    /* a directory that does not exist */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/missing", g_dir);
    CHECK_EQ_INT(ms_moe_tuned_write(bad, &r, path, sizeof path, &err), MS_ERR_IO);
    CHECK(strstr(err.msg, "missing/nvidia-h200.json") != NULL);
    /* a path longer than the caller's buffer is refused, not cut short */
    CHECK_EQ_INT(ms_moe_tuned_write(g_dir, &r, path, 16, &err), MS_ERR_INVALID);
    CHECK(strstr(err.msg, "too long") != NULL);
    unlink(want);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ms_tuned_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    RUN(test_file_name);
    RUN(test_apply);
    RUN(test_forms);
    RUN(test_write_read);
    char p[256];
    snprintf(p, sizeof p, "%s/nvidia-h200.json", g_dir);
    unlink(p);
    rmdir(g_dir);
    return TEST_SUMMARY();
}
