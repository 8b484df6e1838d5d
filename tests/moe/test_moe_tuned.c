/* test_moe_tuned.c - the per-GPU tuned file (configs/tuned/<gpu>.json from `moeserve tune`) changes
 * the MoE auto threshold only for the GPU it names; missing/other-GPU/bad files keep the default. */
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

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ms_tuned_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    RUN(test_file_name);
    RUN(test_apply);
    char p[256];
    snprintf(p, sizeof p, "%s/nvidia-h200.json", g_dir);
    unlink(p);
    rmdir(g_dir);
    return TEST_SUMMARY();
}
