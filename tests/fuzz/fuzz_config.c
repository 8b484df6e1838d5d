/* fuzz_config.c - libFuzzer target: config.json (ms_config_parse) and the quantization configs
 * (hf_quant_config.json, config.json's quantization_config: ms_quant_decl_load). The input is
 * used as each file in turn; every failure must come with a message. */
#include "fuzz_util.h"
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    char *text = malloc(n + 1);
    memcpy(text, data, n);
    text[n] = 0;
    ms_config cfg;
    ms_err err = {0};
    if (ms_config_parse(text, "config.json", &cfg, &err) != MS_OK && !err.msg[0]) abort();
    free(text);
    ms_quant_decl q;
    fz_unlink("config.json");
    fz_write("hf_quant_config.json", data, n);
    memset(&err, 0, sizeof err);
    if (ms_quant_decl_load(fz_dir(), &q, &err) == MS_OK) {
        ms_quant_excluded(&q, "model.layers.0.mlp.experts.0.gate_proj", NULL);
        ms_quant_decl_free(&q);
    } else if (!err.msg[0]) {
        abort();
    }
    fz_unlink("hf_quant_config.json");
    fz_write("config.json", data, n);
    memset(&err, 0, sizeof err);
    if (ms_quant_decl_load(fz_dir(), &q, &err) == MS_OK) ms_quant_decl_free(&q);
    else if (!err.msg[0]) abort();
    return 0;
}
