/* test_bench_client.c - per-request measurement rules of `moeserve bench` on synthetic event
 * times (no network): TTFT at the first chunk with text in any channel, one ITL per later non-empty
 * chunk, latency at the last event ([DONE] included), usage over chunk counts, errors in streams;
 * the request body fields; the loopback-only URL policy. */
#include "bench/client.h"
#include "test.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static ms_bench_config chat_cfg = {.chat = 1, .model = "m", .stream = 1, .ignore_eos = 1, .max_reply_bytes = 1 << 20};
static ms_bench_config comp_cfg = {.chat = 0, .model = "m", .stream = 1, .ignore_eos = 1, .max_reply_bytes = 1 << 20};

static int ev(ms_bench_result *r, const ms_bench_config *c, const char *data, double t) {
    ms_err err = {0};
    return ms_bench_apply_event(r, c, data, strlen(data), t, &err);
}

static void test_chat_timings(void) {
    ms_bench_result r = {0};
    ms_bench_result_reset(&r, 100, 50);
    r.start = 10.0;
    CHECK(ev(&r, &chat_cfg, "{\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}", 10.05) == MS_OK);
    CHECK(r.ttft < 0); /* empty content is not a token */
    CHECK(ev(&r, &chat_cfg, "{\"choices\":[{\"delta\":{\"reasoning_content\":\"think\",\"content\":null}}]}", 10.1) == MS_OK);
    CHECK_CLOSE(r.ttft, 0.1, 1e-9);
    CHECK(ev(&r, &chat_cfg, "{\"choices\":[{\"delta\":{\"content\":\"\"}}]}", 10.12) == MS_OK); /* no ITL */
    CHECK(ev(&r, &chat_cfg, "{\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}", 10.15) == MS_OK);
    CHECK(ev(&r, &chat_cfg, "{\"choices\":[{\"delta\":{\"content\":\" there\"},\"finish_reason\":\"stop\"}]}", 10.3) == MS_OK);
    CHECK(ev(&r, &chat_cfg, "{\"choices\":[],\"usage\":{\"prompt_tokens\":97,\"completion_tokens\":4}}", 10.31) == MS_OK);
    CHECK(ev(&r, &chat_cfg, "[DONE]", 10.4) == MS_OK);
    CHECK_EQ_INT(r.n_itl, 2);
    if (r.n_itl == 2) {
        CHECK_CLOSE(r.itl[0], 0.05, 1e-9);
        CHECK_CLOSE(r.itl[1], 0.15, 1e-9);
    }
    CHECK_CLOSE(r.latency, 0.4, 1e-9);
    CHECK_EQ_INT(r.n_chunks, 3);
    CHECK_EQ_INT(r.output_len, 4);
    CHECK_EQ_INT(r.prompt_len, 97);
    CHECK(r.usage_seen);
    CHECK_STR(r.content, "Hi there");
    CHECK_STR(r.reasoning, "think");
    CHECK_STR(r.finish_reason, "stop");
    ms_bench_result_free(&r);
}

static void test_completions_and_errors(void) {
    ms_bench_result r = {0};
    ms_bench_result_reset(&r, 8, 3);
    r.start = 0;
    CHECK(ev(&r, &comp_cfg, "{\"choices\":[{\"text\":\"a\"}]}", 0.2) == MS_OK);
    /* chat fields in a completions stream are not text */
    CHECK(ev(&r, &comp_cfg, "{\"choices\":[{\"delta\":{\"content\":\"zz\"}}]}", 0.25) == MS_OK);
    CHECK(ev(&r, &comp_cfg, "{\"choices\":[{\"text\":\"b\"}]}", 0.3) == MS_OK);
    CHECK_CLOSE(r.ttft, 0.2, 1e-9);
    CHECK_EQ_INT(r.n_itl, 1);
    CHECK_STR(r.content, "ab");
    CHECK(!r.usage_seen);
    ms_err err = {0};
    const char *bad = "{not json";
    CHECK(ms_bench_apply_event(&r, &comp_cfg, bad, strlen(bad), 0.4, &err) == MS_ERR_FORMAT);
    CHECK(strstr(err.msg, "not JSON") != NULL);
    const char *eo = "{\"error\":{\"message\":\"context too long\"}}";
    CHECK(ms_bench_apply_event(&r, &comp_cfg, eo, strlen(eo), 0.5, &err) != MS_OK);
    CHECK(strstr(err.msg, "context too long") != NULL);
    ms_bench_result_free(&r);
}

static void test_non_stream_body(void) {
    ms_bench_result r = {0};
    ms_bench_result_reset(&r, 8, 16);
    r.start = 1.0;
    ms_err err = {0};
    const char *b = "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"hmm\"}}]}";
    CHECK(ms_bench_apply_body(&r, &chat_cfg, b, strlen(b), 1.5, &err) == MS_OK);
    CHECK_CLOSE(r.ttft, 0.5, 1e-9);
    CHECK_CLOSE(r.latency, 0.5, 1e-9);
    CHECK_EQ_INT(r.output_len, 16); /* no usage: the requested length, as bench_serving */
    CHECK(!r.content_seen && r.reasoning_seen);
    ms_bench_result_free(&r);
}

static void test_truncation_keeps_utf8(void) {
    ms_bench_config c = comp_cfg;
    c.max_reply_bytes = 4;
    ms_bench_result r = {0};
    ms_bench_result_reset(&r, 1, 1);
    /* "aé€": 1 + 2 + 3 bytes; 4 bytes would cut the euro sign: keep "aé" (3 bytes) */
    CHECK(ev(&r, &c, "{\"choices\":[{\"text\":\"a\\u00e9\\u20ac\"}]}", 0.1) == MS_OK);
    CHECK(r.truncated);
    CHECK_EQ_INT(r.content_len, 3);
    CHECK_STR(r.content, "a\xc3\xa9");
    ms_bench_result_free(&r);
}

static void test_request_body(void) {
    int32_t ids[] = {5, 6, 7};
    ms_bench_prompt p = {.ids = ids, .n_ids = 3, .prompt_len = 3, .output_len = 12};
    char *s = ms_bench_request_body(&comp_cfg, &p);
    json_t *j = json_loads(s, 0, NULL);
    CHECK(j != NULL);
    CHECK_STR(json_string_value(json_object_get(j, "model")), "m");
    CHECK_EQ_INT(json_array_size(json_object_get(j, "prompt")), 3);
    CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(j, "prompt"), 2)), 7);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "max_tokens")), 12);
    CHECK(json_is_true(json_object_get(j, "ignore_eos")));
    CHECK(json_is_true(json_object_get(j, "stream")));
    CHECK(json_is_true(json_object_get(json_object_get(j, "stream_options"), "include_usage")));
    CHECK(json_real_value(json_object_get(j, "temperature")) == 0.0);
    json_decref(j);
    free(s);
    ms_bench_prompt q = {.text = "hello \"world\"", .prompt_len = 2, .output_len = 4};
    ms_bench_config c = chat_cfg;
    c.stream = 0;
    c.ignore_eos = 0;
    s = ms_bench_request_body(&c, &q);
    j = json_loads(s, 0, NULL);
    json_t *m0 = json_array_get(json_object_get(j, "messages"), 0);
    CHECK_STR(json_string_value(json_object_get(m0, "role")), "user");
    CHECK_STR(json_string_value(json_object_get(m0, "content")), "hello \"world\"");
    CHECK(json_is_false(json_object_get(j, "stream")));
    CHECK(json_is_false(json_object_get(j, "ignore_eos")));
    CHECK(json_object_get(j, "stream_options") == NULL);
    json_decref(j);
    free(s);
}

static void test_url_policy(void) {
    ms_err err = {0};
    CHECK(ms_bench_check_url("http://127.0.0.1:8000", 0, &err) == MS_OK);
    CHECK(ms_bench_check_url("http://127.8.9.10:1", 0, &err) == MS_OK);
    CHECK(ms_bench_check_url("http://localhost:30000", 0, &err) == MS_OK);
    CHECK(ms_bench_check_url("https://[::1]:8443", 0, &err) == MS_OK);
    CHECK(ms_bench_check_url("http://10.0.0.1:8000", 0, &err) == MS_ERR_INVALID);
    CHECK(strstr(err.msg, "--allow-remote") != NULL);
    CHECK(ms_bench_check_url("http://128.0.0.1", 0, &err) == MS_ERR_INVALID);
    CHECK(ms_bench_check_url("http://localhost.example.com", 0, &err) == MS_ERR_INVALID);
    CHECK(ms_bench_check_url("http://10.0.0.1:8000", 1, &err) == MS_OK);
    CHECK(ms_bench_check_url("file:///etc/passwd", 1, &err) == MS_ERR_INVALID);
    CHECK(ms_bench_check_url("not a url", 1, &err) == MS_ERR_INVALID);
}

int main(void) {
    RUN(test_chat_timings);
    RUN(test_completions_and_errors);
    RUN(test_non_stream_body);
    RUN(test_truncation_keeps_utf8);
    RUN(test_request_body);
    RUN(test_url_policy);
    return TEST_SUMMARY();
}
