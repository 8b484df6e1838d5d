/* fuzz_template.c - libFuzzer target: chat templates (the Jinja subset) and the messages they
 * render. The input is split at the first NUL byte: template text before it, the messages JSON
 * after (a default conversation when absent or not an array). Rendering runs under small limits,
 * so a hostile template must fail with a message, never hang, crash or leak. */
#include "fuzz_util.h"
#include "tokenizer/chat_template.h"

#include <jansson.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    const uint8_t *a, *b;
    size_t na, nb;
    fz_split(data, n, 0, &a, &na, &b, &nb);
    ms_template *t = NULL;
    ms_err err = {0};
    if (ms_template_compile((const char *)a, na, &t, &err) != MS_OK) {
        if (!err.msg[0]) abort();
        return 0;
    }
    json_t *msgs = nb ? json_loadb((const char *)b, nb, 0, NULL) : NULL;
    if (!json_is_array(msgs)) {
        json_decref(msgs);
        msgs = json_loads("[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"hi\"},"
                          "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
                          "\"arguments\":\"{\\\"x\\\": [1, 2]}\"}}]},{\"role\":\"tool\",\"content\":\"3\"}]",
                          0, NULL);
    }
    ms_chat_parse_tool_arguments(msgs);
    json_t *ctx = json_pack("{s:O,s:b,s:s,s:s,s:[{s:s,s:{s:s}}]}", "messages", msgs, "add_generation_prompt", 1,
                            "bos_token", "<s>", "eos_token", "</s>", "tools", "type", "function", "function", "name", "f");
    ms_template_limits lim = ms_template_default_limits();
    lim.max_output = 1 << 20;
    lim.max_memory = 64 << 20;
    lim.max_steps = 100000;
    lim.max_depth = 50;
    char *out = NULL;
    size_t len = 0;
    if (ms_template_render_ex(t, ctx, &lim, &out, &len, &err) == MS_OK) {
        if (len > lim.max_output || out[len] != 0) abort();
        free(out);
    } else if (!err.msg[0]) {
        abort();
    }
    json_decref(ctx);
    json_decref(msgs);
    ms_template_free(t);
    return 0;
}
