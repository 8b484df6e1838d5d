/* test_api.c - request parsing/validation (ms_api_parse), the OpenAI error object, stop-string
 * matching across token boundaries, and the Prometheus text of the metrics. */
#include "server/api.h"
#include "server/metrics.h"
#include "server/sbuf.h"
#include "server/stopstr.h"
#include "test.h"

#include <stdlib.h>

static ms_api_limits lim(void) {
    ms_api_limits l;
    memset(&l, 0, sizeof l);
    l.model_names[0] = "glm";
    l.model_names[1] = "/models/glm";
    l.context_length = 1000;
    l.vocab_size = 500;
    l.default_temperature = 0.6f;
    l.default_top_p = 0.95f;
    l.enable_thinking_default = 1;
    return l;
}

static int parse(int chat, const char *body, ms_api_req *r, ms_api_error *e) {
    ms_api_limits l = lim();
    return ms_api_parse(&l, chat, body, strlen(body), r, e);
}

static void test_chat_defaults(void) {
    ms_api_req r;
    ms_api_error e;
    CHECK_EQ_INT(parse(1, "{\"model\":\"glm\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"unknown_field\":{}}", &r, &e), 0);
    CHECK_EQ_INT(r.n, 1);
    CHECK_EQ_INT(r.stream, 0);
    CHECK_CLOSE(r.sp.temperature, 0.6, 1e-6);
    CHECK_CLOSE(r.sp.top_p, 0.95, 1e-6);
    CHECK_EQ_INT(r.sp.max_tokens, -1);
    CHECK_CLOSE(r.sp.repetition_penalty, 1.0, 0);
    CHECK_EQ_INT(r.enable_thinking, 1);
    CHECK_EQ_INT(r.separate_reasoning, 1);
    CHECK_EQ_INT(r.skip_special_tokens, 1);
    CHECK_EQ_INT(r.tool_choice, MS_TOOLCHOICE_AUTO);
    CHECK(r.tools == NULL);
    ms_api_req_free(&r);
}

static void test_chat_fields(void) {
    ms_api_req r;
    ms_api_error e;
    const char *b =
        "{\"model\":\"/models/glm\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\": 1}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"2\"},{\"role\":\"developer\",\"content\":\"d\"}],"
        "\"max_completion_tokens\":77,\"temperature\":0,\"top_p\":0.5,\"top_k\":40,\"min_p\":0.1,"
        "\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,\"repetition_penalty\":1.1,\"seed\":42,"
        "\"stop\":[\"END\",\"\"],\"stop_token_ids\":[7,8],\"n\":3,\"ignore_eos\":true,\"logprobs\":true,"
        "\"top_logprobs\":5,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
        "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
        "\"chat_template_kwargs\":{\"enable_thinking\":false,\"clear_thinking\":false},"
        "\"separate_reasoning\":false,\"skip_special_tokens\":false}";
    CHECK_EQ_INT(parse(1, b, &r, &e), 0);
    CHECK_EQ_INT(r.sp.max_tokens, 77);
    CHECK_CLOSE(r.sp.temperature, 0, 0);
    CHECK_CLOSE(r.sp.top_p, 0.5, 1e-6);
    CHECK_EQ_INT(r.sp.top_k, 40);
    CHECK_CLOSE(r.sp.min_p, 0.1, 1e-6);
    CHECK_CLOSE(r.sp.presence_penalty, 0.5, 1e-6);
    CHECK_CLOSE(r.sp.frequency_penalty, -0.5, 1e-6);
    CHECK_CLOSE(r.sp.repetition_penalty, 1.1, 1e-6);
    CHECK(r.sp.has_seed && r.sp.seed == 42);
    CHECK_EQ_INT(r.n_stop, 1);
    CHECK_STR(r.stop[0], "END");
    CHECK_EQ_INT(r.sp.n_stop_ids, 2);
    CHECK_EQ_INT(r.sp.stop_ids[1], 8);
    CHECK_EQ_INT(r.n, 3);
    CHECK_EQ_INT(r.sp.ignore_eos, 1);
    CHECK_EQ_INT(r.sp.logprobs, 1);
    CHECK_EQ_INT(r.sp.top_logprobs, 5);
    CHECK_EQ_INT(r.stream, 1);
    CHECK_EQ_INT(r.include_usage, 1);
    CHECK(r.tools != NULL);
    CHECK_EQ_INT(r.tool_choice, MS_TOOLCHOICE_NAMED);
    CHECK_STR(r.tool_choice_name, "f");
    CHECK_EQ_INT(r.enable_thinking, 0);
    CHECK_EQ_INT(r.separate_reasoning, 0);
    CHECK_EQ_INT(r.skip_special_tokens, 0);
    /* tool-call arguments string became an object for the template */
    json_t *args = json_object_get(json_object_get(json_array_get(json_object_get(
        json_array_get(r.messages, 2), "tool_calls"), 0), "function"), "arguments");
    CHECK(json_is_object(args) && json_integer_value(json_object_get(args, "x")) == 1);
    /* and the body itself is untouched */
    json_t *orig = json_object_get(json_object_get(json_array_get(json_object_get(
        json_array_get(json_object_get(r.body, "messages"), 2), "tool_calls"), 0), "function"), "arguments");
    CHECK(json_is_string(orig));
    CHECK(json_is_false(json_object_get(r.kwargs, "clear_thinking")));
    ms_api_req_free(&r);
    /* tool_choice none drops the tools */
    CHECK_EQ_INT(parse(1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
                          "\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"none\"}", &r, &e), 0);
    CHECK(r.tools == NULL);
    ms_api_req_free(&r);
}

static void test_completions_prompts(void) {
    ms_api_req r;
    ms_api_error e;
    CHECK_EQ_INT(parse(0, "{\"prompt\":\"abc\",\"logprobs\":2,\"max_tokens\":5}", &r, &e), 0);
    CHECK_EQ_INT(r.n_prompts, 1);
    CHECK_STR(r.prompts[0].text, "abc");
    CHECK_EQ_INT(r.logprobs, 1);
    CHECK_EQ_INT(r.top_logprobs, 2);
    ms_api_req_free(&r);
    CHECK_EQ_INT(parse(0, "{\"prompt\":[1,2,3]}", &r, &e), 0);
    CHECK_EQ_INT(r.n_prompts, 1);
    CHECK_EQ_INT(r.prompts[0].n_ids, 3);
    CHECK_EQ_INT(r.prompts[0].ids[2], 3);
    ms_api_req_free(&r);
    CHECK_EQ_INT(parse(0, "{\"prompt\":[\"a\",[4,5],\"b\"]}", &r, &e), 0);
    CHECK_EQ_INT(r.n_prompts, 3);
    CHECK_EQ_INT(r.prompts[1].n_ids, 2);
    CHECK_STR(r.prompts[2].text, "b");
    ms_api_req_free(&r);
}

static void test_rejections(void) {
    struct { int chat; const char *body; int status; const char *param; } c[] = {
        {1, "", 400, ""},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":null,\"top_p\":null}", 0, ""},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":0}", 400, "n"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_k\":-2}", 400, "top_k"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"min_p\":1.5}", 400, "min_p"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"presence_penalty\":3}", 400, "presence_penalty"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"repetition_penalty\":0}", 400, "repetition_penalty"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1001}", 400, "max_tokens"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1000}", 0, ""},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream_options\":{\"include_usage\":1}}", 400, "stream_options.include_usage"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}", 400, "logprobs"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", 400, "top_logprobs"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":null}]}", 400, "messages[0].content"},
        {1, "{\"messages\":[{\"role\":\"assistant\",\"content\":null}]}", 0, ""},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}", 400, "messages[0].tool_calls"},
        {1, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"[1]\"}}]}]}", 400,
         "messages[0].tool_calls[0].function.arguments"},
        {1, "{\"messages\":[7]}", 400, "messages[0]"},
        {1, "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{}}]}", 400, "tools[0].function.name"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":3}}]}", 400, "tools[0].function.parameters"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}", 400, "tool_choice"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"xml\"}}", 400, "response_format.type"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\"}}", 400, "response_format.json_schema"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":3}}}", 400, "response_format.json_schema.schema"},
        {0, "{\"prompt\":\"x\",\"regex\":5}", 400, "regex"},
        {0, "{\"prompt\":\"x\",\"regex\":\"a\",\"ebnf\":\"root ::= \\\"a\\\"\"}", 400, "ebnf"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}}", 400, "chat_template_kwargs.enable_thinking"},
        {1, "{\"model\":\"other\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404, "model"},
        {0, "{\"prompt\":[[1],[600]]}", 400, "prompt[1]"},
        {0, "{\"prompt\":[true]}", 400, "prompt[0]"},
        {0, "{\"prompt\":\"x\",\"logit_bias\":{\"7\":-100,\"499\":5.5}}", 0, ""},
        {0, "{\"prompt\":\"x\",\"logit_bias\":{\"500\":1}}", 400, "logit_bias"},
        {0, "{\"prompt\":\"x\",\"logit_bias\":{\"abc\":1}}", 400, "logit_bias"},
        {0, "{\"prompt\":\"x\",\"logit_bias\":{\"3\":101}}", 400, "logit_bias"},
        {0, "{\"prompt\":\"x\",\"logit_bias\":[1]}", 400, "logit_bias"},
        {0, "{\"prompt\":\"x\",\"min_tokens\":5,\"max_tokens\":4}", 400, "min_tokens"},
        {0, "{\"prompt\":\"x\",\"min_tokens\":-1}", 400, "min_tokens"},
        {0, "{\"prompt\":\"x\",\"suffix\":\"tail\"}", 400, "suffix"},
        {0, "{\"prompt\":\"x\",\"suffix\":\"\"}", 0, ""},
        {0, "{\"prompt\":\"x\",\"best_of\":2}", 400, "best_of"},
        {0, "{\"prompt\":\"x\",\"best_of\":1}", 0, ""},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"functions\":[{\"name\":\"f\"}]}", 400, "functions"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"modalities\":[\"text\",\"audio\"]}", 400, "modalities"},
        {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"modalities\":[\"text\"]}", 0, ""},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        ms_api_req r;
        ms_api_error e;
        memset(&e, 0, sizeof e);
        int st = parse(c[i].chat, c[i].body, &r, &e);
        CHECK_MSG(st == c[i].status, "case %zu: status %d (%s)", i, st, e.message);
        if (st) {
            CHECK_MSG(!strcmp(e.param, c[i].param), "case %zu: param '%s'", i, e.param);
            CHECK(e.message[0] != 0);
        }
        ms_api_req_free(&r);
    }
}

static void test_logit_bias_min_tokens(void) {
    ms_api_req r;
    ms_api_error e;
    CHECK_EQ_INT(parse(0, "{\"prompt\":\"x\",\"logit_bias\":{\"7\":-100,\"499\":5.5},\"min_tokens\":3}", &r, &e), 0);
    CHECK_EQ_INT(r.sp.n_logit_bias, 2);
    CHECK_EQ_INT(r.sp.min_tokens, 3);
    int seen7 = 0, seen499 = 0;
    for (int i = 0; i < r.sp.n_logit_bias; i++) {
        if (r.sp.bias_ids[i] == 7) seen7 = r.sp.bias_vals[i] == -100.0f;
        if (r.sp.bias_ids[i] == 499) seen499 = r.sp.bias_vals[i] == 5.5f;
    }
    CHECK(seen7 && seen499);
    ms_api_req_free(&r);
}

/* Body of a chat request with n_msgs messages, n_tools tools, n_stop stop strings of stop_len bytes
 * and n. Caller frees. */
static char *limits_body(int n_msgs, int n_tools, int n_stop, int stop_len, int n) {
    ms_sbuf b = {0};
    ms_sbuf_adds(&b, "{\"messages\":[");
    for (int i = 0; i < n_msgs; i++) ms_sbuf_printf(&b, "%s{\"role\":\"user\",\"content\":\"m%d\"}", i ? "," : "", i);
    ms_sbuf_adds(&b, "],\"tools\":[");
    for (int i = 0; i < n_tools; i++)
        ms_sbuf_printf(&b, "%s{\"type\":\"function\",\"function\":{\"name\":\"f%d\"}}", i ? "," : "", i);
    ms_sbuf_adds(&b, "],\"stop\":[");
    for (int i = 0; i < n_stop; i++) {
        ms_sbuf_printf(&b, "%s\"%c", i ? "," : "", 'a' + i % 26);
        for (int k = 1; k < stop_len; k++) ms_sbuf_adds(&b, "x");
        ms_sbuf_adds(&b, "\"");
    }
    ms_sbuf_printf(&b, "],\"n\":%d}", n);
    return ms_sbuf_take(&b);
}

/* Each request limit: the default and a configured value, at the limit (accepted) and one beyond
 * (400 naming the field and the limit, and the flag that sets it). */
static void test_limits(void) {
    struct { int max_msgs, max_tools, max_stop, max_stop_len, max_n; } cfgs[] = {
        {0, 0, 0, 0, 0},      /* defaults: 4096, 512, 16, 1024, 8 */
        {3, 2, 4, 5, 2},
    };
    for (int c = 0; c < 2; c++) {
        ms_api_limits l = lim();
        l.max_messages = cfgs[c].max_msgs;
        l.max_tools = cfgs[c].max_tools;
        l.max_stop = cfgs[c].max_stop;
        l.max_stop_len = cfgs[c].max_stop_len;
        l.max_n = cfgs[c].max_n;
        int M = c ? 3 : MS_API_MAX_MESSAGES, T = c ? 2 : MS_API_MAX_TOOLS, S = c ? 4 : MS_MAX_STOP_STRINGS,
            L = c ? 5 : MS_API_MAX_STOP_LEN, N = c ? 2 : MS_API_MAX_N;
        struct { int m, t, s, len, n; const char *param, *flag; } k[] = {
            {M, T, S, L, N, "", ""},
            {M + 1, T, S, L, N, "messages", "--max-messages"},
            {M, T + 1, S, L, N, "tools", "--max-tools"},
            {M, T, S + 1, L, N, "stop", "--max-stop-strings"},
            {M, T, S, L + 1, N, "stop[0]", "--max-stop-length"},
            {M, T, S, L, N + 1, "n", "--max-n"},
        };
        for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
            char *body = limits_body(k[i].m, k[i].t, k[i].s, k[i].len, k[i].n);
            ms_api_req r;
            ms_api_error e;
            memset(&e, 0, sizeof e);
            int st = ms_api_parse(&l, 1, body, strlen(body), &r, &e);
            if (!k[i].param[0]) {
                CHECK_MSG(st == 0, "config %d: at the limits: %d %s", c, st, e.message);
                if (!st) {
                    CHECK_EQ_INT(r.n_stop, S);
                    CHECK_EQ_INT(r.n, N);
                    CHECK_EQ_INT((int)json_array_size(r.messages), M);
                }
            } else {
                char want[32];
                int lim_v = !strcmp(k[i].param, "messages") ? M : !strcmp(k[i].param, "tools") ? T
                          : !strcmp(k[i].param, "stop") ? S : !strcmp(k[i].param, "n") ? N : L;
                snprintf(want, sizeof want, "at most %d", lim_v);
                CHECK_MSG(st == 400 && !strcmp(e.param, k[i].param), "config %d case %zu: %d param '%s'", c, i, st, e.param);
                CHECK_MSG(strstr(e.message, want) && strstr(e.message, k[i].flag), "config %d case %zu: '%s'", c, i, e.message);
            }
            ms_api_req_free(&r);
            free(body);
        }
    }
    /* a single stop string (not an array) is held to the length limit too */
    ms_api_limits l = lim();
    l.max_stop_len = 3;
    ms_api_req r;
    ms_api_error e;
    const char *b1 = "{\"prompt\":\"x\",\"stop\":\"abcd\"}";
    CHECK_EQ_INT(ms_api_parse(&l, 0, b1, strlen(b1), &r, &e), 400);
    CHECK_STR(e.param, "stop");
    ms_api_req_free(&r);
    /* the configured stop count cannot exceed the storage bound */
    l = lim();
    l.max_stop = 1000;
    char *body = limits_body(1, 0, MS_MAX_STOP_STRINGS + 1, 1, 1);
    CHECK_EQ_INT(ms_api_parse(&l, 1, body, strlen(body), &r, &e), 400);
    CHECK_STR(e.param, "stop");
    ms_api_req_free(&r);
    free(body);
}

static void test_error_json(void) {
    ms_api_error e;
    ms_api_fail(&e, 404, "invalid_request_error", "model", "model_not_found", "No \"%s\".", "x");
    ms_sbuf b = {0};
    ms_api_error_json(&e, &b);
    CHECK_STR(b.s, "{\"error\":{\"message\":\"No \\\"x\\\".\",\"type\":\"invalid_request_error\",\"param\":\"model\",\"code\":\"model_not_found\"}}");
    ms_sbuf_free(&b);
    ms_api_fail(&e, 400, NULL, NULL, NULL, "bad");
    ms_api_error_json(&e, &b);
    CHECK_STR(b.s, "{\"error\":{\"message\":\"bad\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}");
    ms_sbuf_free(&b);
    char id[64];
    ms_api_make_id(id, sizeof id, "chatcmpl-");
    CHECK(strlen(id) == 9 + 24 && !strncmp(id, "chatcmpl-", 9));
}

static void run_stop(const char *const *stops, int ns, const char *const *pieces, int np, const char *want, int want_match) {
    ms_stopstr m;
    ms_stopstr_init(&m, stops, ns);
    ms_sbuf out = {0};
    int matched = 0;
    for (int i = 0; i < np && !matched; i++) matched = ms_stopstr_push(&m, pieces[i], strlen(pieces[i]), &out);
    if (!matched) ms_stopstr_flush(&m, &out);
    CHECK_MSG(!strcmp(ms_sbuf_str(&out), want), "got [%s] want [%s]", ms_sbuf_str(&out), want);
    CHECK_EQ_INT(matched, want_match);
    ms_sbuf_free(&out);
    ms_stopstr_free(&m);
}

static void test_stop_strings(void) {
    const char *s1[] = {"STOP"};
    const char *p1[] = {"hello S", "T", "OP world"};
    run_stop(s1, 1, p1, 3, "hello ", 1);
    const char *p2[] = {"hello ST", "ORM"};
    run_stop(s1, 1, p2, 2, "hello STORM", 0);
    const char *s3[] = {"ab", "xyz", "b"};
    const char *p3[] = {"..x", "a", "b"}; /* earliest match wins: "ab" starts before "b" */
    run_stop(s3, 3, p3, 3, "..x", 1);
    const char *p4[] = {"12", "34"};
    run_stop(NULL, 0, p4, 2, "1234", 0);
    /* held-back text is released as soon as it cannot start a match */
    ms_stopstr m;
    const char *s5[] = {"</end>"};
    ms_stopstr_init(&m, s5, 1);
    ms_sbuf out = {0};
    ms_stopstr_push(&m, "a</e", 4, &out);
    CHECK_STR(ms_sbuf_str(&out), "a");
    ms_stopstr_push(&m, "x", 1, &out);
    CHECK_STR(ms_sbuf_str(&out), "a</ex");
    ms_sbuf_free(&out);
    ms_stopstr_free(&m);
    /* multi-byte stop string split inside a character */
    const char *s6[] = {"。"};
    const char *p6[] = {"好\xe3", "\x80", "\x82后"};
    run_stop(s6, 1, p6, 3, "好", 1);
}

static void test_histogram_text(void) {
    ms_hist h;
    const double le[] = {0.1, 1, 10};
    ms_hist_init(&h, le, 3);
    ms_hist_observe(&h, 0.05);
    ms_hist_observe(&h, 0.1); /* le is inclusive */
    ms_hist_observe(&h, 5);
    ms_hist_observe(&h, 50);
    ms_sbuf b = {0};
    ms_hist_write(&h, &b, "x_seconds", "Help text.");
    CHECK_STR(b.s, "# HELP x_seconds Help text.\n# TYPE x_seconds histogram\n"
                   "x_seconds_bucket{le=\"0.1\"} 2\nx_seconds_bucket{le=\"1\"} 2\nx_seconds_bucket{le=\"10\"} 3\n"
                   "x_seconds_bucket{le=\"+Inf\"} 4\nx_seconds_sum 55.15\nx_seconds_count 4\n");
    ms_sbuf_free(&b);
}

static void test_metrics_text(void) {
    ms_metrics m;
    ms_metrics_init(&m);
    ms_metrics_ttft(&m, 0.2);
    ms_metrics_itl(&m, 0.01);
    ms_metrics_finish(&m, 1.5, MS_FR_LENGTH, 10, 20);
    ms_metrics_http(&m, 200);
    ms_metrics_http(&m, 404);
    ms_engine_stats es;
    memset(&es, 0, sizeof es);
    es.running = 3;
    es.waiting = 2;
    es.kv_pages_total = 100;
    es.kv_pages_used = 25;
    es.prefix_hit_tokens = 30;
    es.prefix_query_tokens = 120;
    es.preemptions = 4;
    es.healthy = 1;
    ms_sbuf b = {0};
    ms_metrics_write(&m, &es, "glm", &b);
    const char *want[] = {"moeserve:num_requests_running 3\n", "moeserve:num_requests_waiting 2\n",
                          "moeserve:kv_cache_usage_ratio 0.25\n", "moeserve:prefix_cache_hit_rate 0.25\n",
                          "moeserve:num_preemptions_total 4\n", "moeserve:engine_healthy 1\n",
                          "moeserve:time_to_first_token_seconds_bucket{le=\"0.25\"} 1\n",
                          "moeserve:time_to_first_token_seconds_bucket{le=\"0.1\"} 0\n",
                          "moeserve:inter_token_latency_seconds_count 1\n",
                          "moeserve:e2e_request_latency_seconds_sum 1.5\n",
                          "moeserve:request_success_total{finished_reason=\"length\"} 1\n",
                          "moeserve:http_responses_total{code=\"4xx\"} 1\n",
                          "moeserve:server_generation_tokens_total 20\n"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECK_MSG(strstr(b.s, want[i]) != NULL, "missing %s", want[i]);
    /* every sample line belongs to a metric declared by a TYPE line before it */
    int ok = 1;
    char *copy = strdup(b.s);
    char types[64][96];
    int nt = 0;
    for (char *line = strtok(copy, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strncmp(line, "# TYPE ", 7)) {
            sscanf(line + 7, "%95s", types[nt < 63 ? nt++ : nt]);
            continue;
        }
        if (line[0] == '#') continue;
        int found = 0;
        for (int k = 0; k < nt; k++) if (!strncmp(line, types[k], strlen(types[k]))) found = 1;
        if (!found) { ok = 0; fprintf(stderr, "  undeclared: %s\n", line); }
    }
    free(copy);
    CHECK(ok);
    ms_sbuf_free(&b);
    ms_metrics_destroy(&m);
}

/* The one number printer of the layer: shortest round-trip text, floats at float precision. */
static void test_number_printers(void) {
    static const struct { double v; int is_float; const char *want; } cases[] = {
        {3, 0, "3"}, {-0.5, 0, "-0.5"}, {0.1, 0, "0.1"}, {0.005, 0, "0.005"}, {1e300, 0, "1e+300"},
        {(float)0.1, 1, "0.1"}, {(float)-0.6931472, 1, "-0.6931472"}, {(float)1e-7, 1, "1e-07"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ms_sbuf b = {0};
        if (cases[i].is_float) ms_sbuf_add_float(&b, (float)cases[i].v);
        else ms_sbuf_add_double(&b, cases[i].v);
        CHECK_STR(ms_sbuf_str(&b), cases[i].want);
        ms_sbuf_free(&b);
    }
    char buf[48];
    ms_fmt_roundtrip(buf, sizeof buf, 0.1, 1, 0);
    CHECK_STR(buf, "1e-01");
}

int main(void) {
    RUN(test_chat_defaults);
    RUN(test_chat_fields);
    RUN(test_completions_prompts);
    RUN(test_rejections);
    RUN(test_logit_bias_min_tokens);
    RUN(test_limits);
    RUN(test_error_json);
    RUN(test_stop_strings);
    RUN(test_histogram_text);
    RUN(test_metrics_text);
    RUN(test_number_printers);
    return TEST_SUMMARY();
}
