/* test_moe_tuned.c - the per-GPU tuned file (configs/tuned/<gpu>.json from `moeserve tune`) changes
 * the MoE auto threshold and the fused kernel's forms only for the GPU it names; missing/other-GPU/bad
 * files and entries keep the defaults; the form table's replace, drop and capacity rules. */
#include "moe/moe.h"
#include "test.h"

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

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ms_tuned_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    RUN(test_file_name);
    RUN(test_apply);
    RUN(test_forms);
    char p[256];
    snprintf(p, sizeof p, "%s/nvidia-h200.json", g_dir);
    unlink(p);
    rmdir(g_dir);
    return TEST_SUMMARY();
}
