/* fuzz_parsers.c - libFuzzer target: the reasoning parser and both tool-call parsers (glm45,
 * glm47) fed arbitrary text in arbitrary pieces, streaming and whole. Checks the reasoning
 * parser's documented invariant: streaming in any pieces gives the same channels as streaming it
 * in one piece. (Streaming and whole may differ by design, as in SGLang: a <tool_call> before
 * </think> ends reasoning when streaming, while the whole-text parser splits at </think>.) */
#include "core/utf8.h"
#include "fuzz_util.h"
#include "server/reasoning.h"
#include "server/toolcall.h"

#include <jansson.h>

static json_t *g_tools;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    if (!g_tools)
        g_tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                             "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
                             "\"opts\":{\"type\":\"object\"},\"xs\":{\"type\":\"array\"}}}}},"
                             "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", 0, NULL);
    int force = data[0] & 1, fmt = (data[0] >> 1) & 1;
    json_t *tools = (data[0] >> 2) & 1 ? NULL : g_tools;
    uint32_t seed = data[0];
    /* the parsers get detokenizer output, which is valid UTF-8: malformed bytes become U+FFFD */
    char *text = malloc(3 * n + 1);
    size_t len = 0;
    for (size_t i = 1; i < n;) {
        uint32_t cp;
        i += (size_t)ms_utf8_dec((const char *)data + i, n - i, &cp);
        len += (size_t)ms_utf8_enc(cp, text + len);
    }

    /* reasoning: streamed in pieces == streamed in one piece; the whole-text parser must not crash */
    ms_sbuf r0 = {0}, c0 = {0}, r1 = {0}, c1 = {0}, r2 = {0}, c2 = {0};
    ms_reasoning_parse(text, len, force, &r0, &c0);
    ms_sbuf_free(&r0);
    ms_sbuf_free(&c0);
    ms_reasoning rp;
    ms_reasoning_init(&rp, force);
    ms_reasoning_push(&rp, text, len, &r1, &c1);
    ms_reasoning_finish(&rp, &r1, &c1);
    ms_reasoning_free(&rp);
    ms_reasoning_init(&rp, force);
    for (size_t off = 0; off < len;) {
        size_t k = fz_chunk(&seed);
        if (k > len - off) k = len - off;
        ms_reasoning_push(&rp, text + off, k, &r2, &c2);
        off += k;
    }
    ms_reasoning_finish(&rp, &r2, &c2);
    if (r1.len != r2.len || c1.len != c2.len || (r1.len && memcmp(r1.s, r2.s, r1.len)) ||
        (c1.len && memcmp(c1.s, c2.s, c1.len)))
        abort();
    ms_reasoning_free(&rp);

    /* tool calls: whole, then streamed */
    ms_sbuf content = {0};
    ms_tool_calls calls = {0};
    ms_tool_parse(fmt, tools, ms_sbuf_str(&c1), c1.len, &content, &calls);
    for (int i = 0; i < calls.n; i++) {
        json_error_t je;
        json_t *a = json_loads(calls.v[i].arguments, JSON_ALLOW_NUL, &je); /* always a JSON object */
        if (!json_is_object(a)) abort();
        json_decref(a);
    }
    ms_tool_calls_free(&calls);
    ms_tool_stream *ts = ms_tool_stream_new(fmt, tools);
    ms_tool_out out = {0};
    for (size_t off = 0; off < c1.len;) {
        size_t k = fz_chunk(&seed);
        if (k > c1.len - off) k = c1.len - off;
        ms_tool_stream_push(ts, c1.s + off, k, &out);
        ms_tool_out_reset(&out);
        off += k;
    }
    ms_tool_stream_finish(ts, &out);
    ms_tool_out_free(&out);
    ms_tool_stream_free(ts);
    ms_sbuf_free(&content);
    ms_sbuf_free(&r1);
    ms_sbuf_free(&c1);
    ms_sbuf_free(&r2);
    ms_sbuf_free(&c2);
    free(text);
    return 0;
}
