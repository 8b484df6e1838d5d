/* fuzz_api.c - libFuzzer target: the OpenAI request JSON (ms_api_parse), chat and completions.
 * First byte: bit 0 chooses chat; the rest is the body. Any input must give 0 or an error status
 * with a message, never a crash, leak or undefined behaviour. */
#include "fuzz_util.h"
#include "server/api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    ms_api_limits lim;
    memset(&lim, 0, sizeof lim);
    lim.model_names[0] = "glm";
    lim.context_length = 4096;
    lim.vocab_size = 1000;
    lim.default_temperature = 1.0f;
    lim.default_top_p = 1.0f;
    ms_api_req r;
    ms_api_error e;
    int st = ms_api_parse(&lim, data[0] & 1, (const char *)data + 1, n - 1, &r, &e);
    if (st != 0 && (st < 400 || !e.message[0])) abort(); /* an error always has a status and a message */
    ms_api_req_free(&r);
    return 0;
}
