/* test_http.c - the whole HTTP layer over real sockets (libcurl client) with a scripted fake
 * tokenizer/engine (fake_ops.h): routes, OpenAI response and SSE shapes, reasoning/tool parsing
 * through the server, stop strings, errors and their statuses, auth, body limit, queue-full 503,
 * client disconnect -> engine abort -> KV pages back to zero, concurrency.
 *
 * `test_http --serve PORT [--api-key K]` instead runs the fake server until killed (used to try
 * the openai-SDK e2e tests without a model: MS_E2E_URL=http://127.0.0.1:PORT). */
#include "fake_ops.h"
#include "server/server.h"
#include "server/toolcall.h"
#include "test.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

static ms_server *g_srv;
static fk_engine *g_eng;
static ms_server_ops g_ops;
static int g_port;

typedef struct {
    int status;
    ms_sbuf body;
    ms_sbuf headers;
    int abort_after; /* >0: abort the transfer after this many body bytes */
} resp;

static size_t on_body(char *p, size_t sz, size_t n, void *u) {
    resp *r = u;
    ms_sbuf_add(&r->body, p, sz * n);
    if (r->abort_after && r->body.len >= (size_t)r->abort_after) return 0;
    return sz * n;
}

static size_t on_header(char *p, size_t sz, size_t n, void *u) {
    resp *r = u;
    ms_sbuf_add(&r->headers, p, sz * n);
    return sz * n;
}

static void resp_free(resp *r) {
    ms_sbuf_free(&r->body);
    ms_sbuf_free(&r->headers);
}

static CURL *make_req(const char *method, const char *path, const char *body, size_t body_len, const char *auth,
                      resp *r, struct curl_slist **hl) {
    CURL *c = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", g_port, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    *hl = curl_slist_append(NULL, "Content-Type: application/json");
    *hl = curl_slist_append(*hl, "Expect:");
    if (auth) *hl = curl_slist_append(*hl, auth);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, *hl);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)body_len);
    }
    return c;
}

static int http_auth(const char *method, const char *path, const char *body, size_t len, const char *auth, resp *r) {
    memset(r, 0, sizeof *r);
    struct curl_slist *hl;
    CURL *c = make_req(method, path, body, len, auth, r, &hl);
    CURLcode rc = curl_easy_perform(c);
    long st = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
    r->status = (int)st;
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    return rc == CURLE_OK ? 0 : -1;
}

static int http(const char *method, const char *path, const char *body, resp *r) {
    return http_auth(method, path, body, body ? strlen(body) : 0, NULL, r);
}

static json_t *jbody(resp *r) {
    json_error_t e;
    return json_loadb(ms_sbuf_str(&r->body), r->body.len, 0, &e);
}

/* Checks the OpenAI error object and the status. */
static int is_error(resp *r, int status, const char *param, const char *code) {
    json_t *j = jbody(r);
    json_t *e = json_object_get(j, "error");
    int ok = r->status == status && json_is_string(json_object_get(e, "message")) &&
             json_is_string(json_object_get(e, "type")) && json_object_get(e, "param") && json_object_get(e, "code");
    if (ok && param) ok = json_is_string(json_object_get(e, "param")) && !strcmp(json_string_value(json_object_get(e, "param")), param);
    if (ok && code) ok = json_is_string(json_object_get(e, "code")) && !strcmp(json_string_value(json_object_get(e, "code")), code);
    if (!ok) fprintf(stderr, "  want %d/%s/%s, got %d: %s\n", status, param ? param : "-", code ? code : "-", r->status, ms_sbuf_str(&r->body));
    json_decref(j);
    return ok;
}

/* SSE: returns the array of parsed data objects; *done = saw [DONE] last; *bad = format problems. */
static json_t *sse_parse(const char *s, int *done, int *bad) {
    json_t *arr = json_array();
    *done = 0;
    *bad = 0;
    while (*s) {
        const char *end = strstr(s, "\n\n");
        if (!end) { *bad = 1; break; }
        if (strncmp(s, "data: ", 6)) { *bad = 1; break; }
        if (*done) *bad = 1; /* nothing after [DONE] */
        if (!strncmp(s + 6, "[DONE]", 6) && end == s + 12) *done = 1;
        else {
            json_error_t e;
            json_t *j = json_loadb(s + 6, (size_t)(end - s - 6), 0, &e);
            if (!j) *bad = 1;
            else json_array_append_new(arr, j);
        }
        s = end + 2;
    }
    return arr;
}

static const char *jstr(json_t *o, const char *path) {
    /* dotted path, numeric parts index arrays */
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = json_is_array(cur) ? json_array_get(cur, (size_t)atoi(tok)) : json_object_get(cur, tok);
    return json_string_value(cur);
}

static json_t *jget(json_t *o, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = json_is_array(cur) ? json_array_get(cur, (size_t)atoi(tok)) : json_object_get(cur, tok);
    return cur;
}

/* 1 once engine e runs nothing and holds no KV page (0 after the hang guard). */
static int engine_idle(fk_engine *e) {
    ms_engine_stats st;
    return T_WAIT_UNTIL((fk_stats(e, &st), st.running == 0 && st.kv_pages_used == 0));
}

static int wait_idle(void) { return engine_idle(g_eng); }

/* Starts a server on a free port over fake engine e with cfg (port forced to 0); 0 on failure. */
static ms_server *start_fake_server(ms_server_config *cfg, const ms_server_ops *ops) {
    ms_server *s = NULL;
    ms_err err = {0};
    cfg->port = 0;
    if (ms_server_start(cfg, ops, &s, &err) != MS_OK) {
        fprintf(stderr, "server start failed: %s\n", err.msg);
        return NULL;
    }
    return s;
}

/* ---- routes ----------------------------------------------------------------------------------- */

static void test_routes(void) {
    resp r;
    CHECK(http("GET", "/health", NULL, &r) == 0 && r.status == 200);
    resp_free(&r);
    fk_set(g_eng, 0, 0);
    http("GET", "/health", NULL, &r);
    CHECK(is_error(&r, 503, NULL, "engine_unhealthy"));
    resp_free(&r);
    fk_set(g_eng, 1, 0);

    http("GET", "/v1/models", NULL, &r);
    json_t *j = jbody(&r);
    CHECK_EQ_INT(r.status, 200);
    CHECK_STR(jstr(j, "object"), "list");
    CHECK_STR(jstr(j, "data.0.id"), "fake-model");
    CHECK_STR(jstr(j, "data.0.object"), "model");
    json_decref(j);
    resp_free(&r);

    http("GET", "/get_server_info", NULL, &r);
    j = jbody(&r);
    CHECK_EQ_INT(r.status, 200);
    CHECK_STR(jstr(j, "served_model_name"), "fake-model");
    CHECK_STR(jstr(j, "reasoning_parser"), "glm45");
    CHECK(json_is_string(jget(j, "versions.libmicrohttpd")));
    CHECK(json_is_object(jget(j, "flags")));
    json_decref(j);
    resp_free(&r);

    http("GET", "/", NULL, &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(strstr(ms_sbuf_str(&r.headers), "text/html") != NULL);
    CHECK(strstr(ms_sbuf_str(&r.body), "<html") || strstr(ms_sbuf_str(&r.body), "<!doctype"));
    resp_free(&r);

    http("GET", "/nope", NULL, &r);
    CHECK(is_error(&r, 404, NULL, "not_found"));
    resp_free(&r);
    http("GET", "/v1/chat/completions", NULL, &r);
    CHECK(is_error(&r, 405, NULL, NULL));
    resp_free(&r);
}

static void test_metrics_route(void) {
    resp r;
    http("POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r);
    CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
    http("GET", "/metrics", NULL, &r);
    const char *m = ms_sbuf_str(&r.body);
    CHECK_EQ_INT(r.status, 200);
    CHECK(strstr(ms_sbuf_str(&r.headers), "text/plain") != NULL);
    const char *want[] = {"# TYPE moeserve:num_requests_running gauge", "# TYPE moeserve:num_requests_waiting gauge",
                          "# TYPE moeserve:prompt_tokens_total counter", "# TYPE moeserve:generation_tokens_total counter",
                          "# TYPE moeserve:time_to_first_token_seconds histogram",
                          "# TYPE moeserve:inter_token_latency_seconds histogram",
                          "# TYPE moeserve:e2e_request_latency_seconds histogram", "moeserve:kv_cache_usage_ratio ",
                          "moeserve:prefix_cache_hit_rate ", "moeserve:num_preemptions_total ",
                          "moeserve:time_to_first_token_seconds_bucket{le=\"+Inf\"} ",
                          "moeserve:e2e_request_latency_seconds_count "};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECK_MSG(strstr(m, want[i]) != NULL, "%s", want[i]);
    /* one finished request observed at least once in TTFT and e2e */
    const char *p = strstr(m, "moeserve:e2e_request_latency_seconds_count ");
    CHECK(p && atoi(p + strlen("moeserve:e2e_request_latency_seconds_count ")) >= 1);
    resp_free(&r);
}

/* ---- chat ------------------------------------------------------------------------------------- */

static void test_chat_reasoning_nonstream(void) {
    resp r;
    http("POST", "/v1/chat/completions",
         "{\"model\":\"fake-model\",\"messages\":[{\"role\":\"user\",\"content\":\"THINK please\"}]}", &r);
    json_t *j = jbody(&r);
    CHECK_EQ_INT(r.status, 200);
    CHECK_STR(jstr(j, "object"), "chat.completion");
    CHECK(jstr(j, "id") && !strncmp(jstr(j, "id"), "chatcmpl-", 9) && strlen(jstr(j, "id")) == 9 + 24);
    CHECK(json_is_integer(jget(j, "created")));
    CHECK_STR(jstr(j, "model"), "fake-model");
    CHECK_STR(jstr(j, "choices.0.message.role"), "assistant");
    CHECK_STR(jstr(j, "choices.0.message.reasoning_content"), "Let me think. 2+2=4.");
    CHECK_STR(jstr(j, "choices.0.message.content"), "The answer is 4.");
    CHECK_STR(jstr(j, "choices.0.finish_reason"), "stop");
    /* usage: completion = script tokens + eos */
    int32_t *ids;
    int n;
    fk_encode_raw("Let me think. 2+2=4.</think>The answer is 4.", 44, &ids, &n);
    free(ids);
    CHECK_EQ_INT(json_integer_value(jget(j, "usage.completion_tokens")), n + 1);
    CHECK(json_integer_value(jget(j, "usage.prompt_tokens")) > 0);
    CHECK_EQ_INT(json_integer_value(jget(j, "usage.total_tokens")),
                 json_integer_value(jget(j, "usage.prompt_tokens")) + n + 1);
    CHECK(json_is_integer(jget(j, "usage.prompt_tokens_details.cached_tokens")));
    json_decref(j);
    resp_free(&r);

    /* thinking off: reasoning_content null, content is the reply */
    http("POST", "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}],\"chat_template_kwargs\":{\"enable_thinking\":false}}", &r);
    j = jbody(&r);
    CHECK(json_is_null(jget(j, "choices.0.message.reasoning_content")));
    CHECK_STR(jstr(j, "choices.0.message.content"), "</think>Hello! You said: hello");
    json_decref(j);
    resp_free(&r);

    /* truncated thinking: content null */
    http("POST", "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"THINK\"}],\"max_tokens\":5}", &r);
    j = jbody(&r);
    CHECK(json_is_null(jget(j, "choices.0.message.content")));
    CHECK_STR(jstr(j, "choices.0.message.reasoning_content"), "Let m");
    CHECK_STR(jstr(j, "choices.0.finish_reason"), "length");
    CHECK_EQ_INT(json_integer_value(jget(j, "usage.completion_tokens")), 5);
    json_decref(j);
    resp_free(&r);

    /* separate_reasoning false: all text in content */
    http("POST", "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"THINK\"}],\"separate_reasoning\":false}", &r);
    j = jbody(&r);
    CHECK_STR(jstr(j, "choices.0.message.content"), "Let me think. 2+2=4.</think>The answer is 4.");
    json_decref(j);
    resp_free(&r);
}

typedef struct {
    ms_sbuf reasoning, content;
    char *names[4];
    ms_sbuf args[4];
    int n_calls;
    const char *finish;
    int role_first, n_chunks, usage_chunk, bad;
    json_t *usage;
} streamed;

static void streamed_free(streamed *s) {
    ms_sbuf_free(&s->reasoning);
    ms_sbuf_free(&s->content);
    for (int i = 0; i < 4; i++) { free(s->names[i]); ms_sbuf_free(&s->args[i]); }
    json_decref(s->usage);
}

static void collect_stream(resp *r, streamed *s, int want_choice) {
    memset(s, 0, sizeof *s);
    int done, bad;
    json_t *chunks = sse_parse(ms_sbuf_str(&r->body), &done, &bad);
    s->bad = bad || !done;
    size_t i;
    json_t *c;
    json_array_foreach(chunks, i, c) {
        json_t *choices = json_object_get(c, "choices");
        if (json_array_size(choices) == 0) {
            s->usage_chunk = 1;
            s->usage = json_incref(json_object_get(c, "usage"));
            continue;
        }
        if (strcmp(jstr(c, "object") ? jstr(c, "object") : "", "chat.completion.chunk")) s->bad = 1;
        json_t *ch = json_array_get(choices, 0);
        if (json_integer_value(json_object_get(ch, "index")) != want_choice) continue;
        json_t *d = json_object_get(ch, "delta");
        s->n_chunks++;
        if (s->n_chunks == 1) s->role_first = !strcmp(jstr(d, "role") ? jstr(d, "role") : "", "assistant") &&
                                              jstr(d, "content") && !jstr(d, "content")[0];
        if (jstr(d, "reasoning_content")) ms_sbuf_adds(&s->reasoning, jstr(d, "reasoning_content"));
        if (jstr(d, "content")) ms_sbuf_adds(&s->content, jstr(d, "content"));
        json_t *tcs = json_object_get(d, "tool_calls");
        size_t k;
        json_t *tc;
        json_array_foreach(tcs, k, tc) {
            int idx = (int)json_integer_value(json_object_get(tc, "index"));
            if (idx < 0 || idx > 3) { s->bad = 1; continue; }
            if (jstr(tc, "id")) {
                if (strncmp(jstr(tc, "id"), "call_", 5) || strlen(jstr(tc, "id")) != 29) s->bad = 1;
                if (strcmp(jstr(tc, "type") ? jstr(tc, "type") : "", "function")) s->bad = 1;
                s->names[idx] = strdup(jstr(tc, "function.name"));
                s->n_calls = idx + 1;
            }
            if (jstr(tc, "function.arguments")) ms_sbuf_adds(&s->args[idx], jstr(tc, "function.arguments"));
        }
        const char *fr = jstr(ch, "finish_reason");
        if (fr) s->finish = fr[0] == 's' ? "stop" : fr[0] == 'l' ? "length" : fr[0] == 't' ? "tool_calls" : "other";
    }
    json_decref(chunks);
}

static void test_chat_reasoning_stream(void) {
    resp r;
    http("POST", "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"THINK\"}],\"stream\":true,\"stream_options\":{\"include_usage\":true}}", &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(strstr(ms_sbuf_str(&r.headers), "text/event-stream") != NULL);
    streamed s;
    collect_stream(&r, &s, 0);
    CHECK(!s.bad);
    CHECK(s.role_first);
    CHECK_STR(ms_sbuf_str(&s.reasoning), "Let me think. 2+2=4.");
    CHECK_STR(ms_sbuf_str(&s.content), "The answer is 4.");
    CHECK_STR(s.finish, "stop");
    CHECK(s.usage_chunk);
    CHECK(json_integer_value(json_object_get(s.usage, "completion_tokens")) > 10);
    CHECK(s.n_chunks > 10); /* really streamed, token by token */
    /* the last two events: usage chunk then [DONE] */
    const char *b = ms_sbuf_str(&r.body);
    size_t L = strlen(b);
    CHECK(L > 14 && !strcmp(b + L - 14, "data: [DONE]\n\n"));
    streamed_free(&s);
    resp_free(&r);
}

static const char *TOOLS =
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}}}}}]";

static void test_tool_calls(void) {
    char body[1024];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"TOOL\"}],%s}", TOOLS);
    resp r;
    http("POST", "/v1/chat/completions", body, &r);
    json_t *j = jbody(&r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(json_is_null(jget(j, "choices.0.message.content")));
    CHECK_STR(jstr(j, "choices.0.message.reasoning_content"), "I should call a tool.");
    CHECK_STR(jstr(j, "choices.0.finish_reason"), "tool_calls");
    CHECK_STR(jstr(j, "choices.0.message.tool_calls.0.type"), "function");
    CHECK_STR(jstr(j, "choices.0.message.tool_calls.0.function.name"), "get_weather");
    CHECK_STR(jstr(j, "choices.0.message.tool_calls.0.function.arguments"), "{\"city\": \"Paris\", \"days\": 3}");
    const char *id = jstr(j, "choices.0.message.tool_calls.0.id");
    CHECK(id && strlen(id) == 29 && !strncmp(id, "call_", 5));
    json_decref(j);
    resp_free(&r);

    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"TOOL\"}],%s,\"stream\":true}", TOOLS);
    http("POST", "/v1/chat/completions", body, &r);
    streamed s;
    collect_stream(&r, &s, 0);
    CHECK(!s.bad);
    CHECK_STR(ms_sbuf_str(&s.reasoning), "I should call a tool.");
    CHECK_STR(ms_sbuf_str(&s.content), "");
    CHECK_EQ_INT(s.n_calls, 1);
    CHECK(s.names[0] && !strcmp(s.names[0], "get_weather"));
    CHECK_STR(ms_sbuf_str(&s.args[0]), "{\"city\": \"Paris\", \"days\": 3}");
    CHECK_STR(s.finish, "tool_calls");
    streamed_free(&s);
    resp_free(&r);

    /* a named tool_choice drops calls to other tools */
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"TOOL\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"other\"}},"
             "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"other\"}}}");
    http("POST", "/v1/chat/completions", body, &r);
    j = jbody(&r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(!jget(j, "choices.0.message.tool_calls"));
    CHECK_STR(jstr(j, "choices.0.finish_reason"), "stop");
    json_decref(j);
    resp_free(&r);

    /* tool_choice none: no parsing, raw text is content */
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"TOOL\"}],%s,\"tool_choice\":\"none\"}", TOOLS);
    http("POST", "/v1/chat/completions", body, &r);
    j = jbody(&r);
    CHECK(jstr(j, "choices.0.message.content") && strstr(jstr(j, "choices.0.message.content"), "<tool_call>get_weather"));
    CHECK(!jget(j, "choices.0.message.tool_calls"));
    CHECK_STR(jstr(j, "choices.0.finish_reason"), "stop");
    json_decref(j);
    resp_free(&r);
}

static void test_stop_strings(void) {
    resp r;
    /* reply "</think>Hello! You said: abc" -> content cut before "said" */
    http("POST", "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"abc\"}],\"stop\":[\"zzz\",\"said\"]}", &r);
    json_t *j = jbody(&r);
    CHECK_STR(jstr(j, "choices.0.message.content"), "Hello! You ");
    CHECK_STR(jstr(j, "choices.0.finish_reason"), "stop");
    json_decref(j);
    resp_free(&r);
    http("POST", "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"abc\"}],\"stop\":\"You s\",\"stream\":true}", &r);
    streamed s;
    collect_stream(&r, &s, 0);
    CHECK(!s.bad);
    CHECK_STR(ms_sbuf_str(&s.content), "Hello! ");
    CHECK_STR(s.finish, "stop");
    streamed_free(&s);
    resp_free(&r);
    /* a stop string on an endless generation ends it and aborts the engine request */
    uint64_t aborts0 = fk_aborts(g_eng);
    http("POST", "/v1/completions", "{\"prompt\":\"LONG\",\"stop\":[\"wwww\"],\"max_tokens\":200}", &r);
    j = jbody(&r);
    CHECK_STR(jstr(j, "choices.0.text"), "word ");
    CHECK_STR(jstr(j, "choices.0.finish_reason"), "stop");
    json_decref(j);
    resp_free(&r);
    CHECK(wait_idle());
    CHECK(fk_aborts(g_eng) > aborts0);
}

static void test_completions(void) {
    resp r;
    http("POST", "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":50}", &r);
    json_t *j = jbody(&r);
    CHECK_EQ_INT(r.status, 200);
    CHECK_STR(jstr(j, "object"), "text_completion");
    CHECK(jstr(j, "id") && !strncmp(jstr(j, "id"), "cmpl-", 5));
    CHECK_STR(jstr(j, "choices.0.text"), " and so on, the end.");
    CHECK_STR(jstr(j, "choices.0.finish_reason"), "stop");
    CHECK_EQ_INT(json_integer_value(jget(j, "usage.prompt_tokens")), 4);
    json_decref(j);
    resp_free(&r);
    /* token ids and several prompts x n */
    http("POST", "/v1/completions", "{\"prompt\":[[79,110,99,101],\"ab\"],\"n\":2,\"max_tokens\":3}", &r);
    j = jbody(&r);
    CHECK_EQ_INT(r.status, 200);
    CHECK_EQ_INT(json_array_size(jget(j, "choices")), 4);
    CHECK_STR(jstr(j, "choices.3.text"), " an");
    CHECK_EQ_INT(json_integer_value(jget(j, "choices.3.index")), 3);
    CHECK_EQ_INT(json_integer_value(jget(j, "usage.prompt_tokens")), 6);
    CHECK_EQ_INT(json_integer_value(jget(j, "usage.completion_tokens")), 12);
    json_decref(j);
    resp_free(&r);
    /* streaming */
    http("POST", "/v1/completions", "{\"prompt\":\"x\",\"stream\":true,\"max_tokens\":4}", &r);
    int done, bad;
    json_t *chunks = sse_parse(ms_sbuf_str(&r.body), &done, &bad);
    CHECK(done && !bad);
    ms_sbuf text = {0};
    size_t i;
    json_t *c;
    const char *fin = NULL;
    json_array_foreach(chunks, i, c) {
        if (jstr(c, "choices.0.text")) ms_sbuf_adds(&text, jstr(c, "choices.0.text"));
        if (jstr(c, "choices.0.finish_reason")) fin = jstr(c, "choices.0.finish_reason");
        CHECK_STR(jstr(c, "object"), "text_completion");
    }
    CHECK_STR(ms_sbuf_str(&text), " and");
    CHECK(fin && !strcmp(fin, "length"));
    ms_sbuf_free(&text);
    json_decref(chunks);
    resp_free(&r);
}

static void test_n_and_logprobs(void) {
    resp r;
    http("POST", "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"hey\"}],\"n\":3,\"logprobs\":true,\"top_logprobs\":2,"
         "\"chat_template_kwargs\":{\"enable_thinking\":false},\"max_tokens\":4}", &r);
    json_t *j = jbody(&r);
    CHECK_EQ_INT(json_array_size(jget(j, "choices")), 3);
    for (int i = 0; i < 3; i++) {
        char p[64];
        snprintf(p, sizeof p, "choices.%d.logprobs.content", i);
        json_t *lp = jget(j, p);
        CHECK_EQ_INT(json_array_size(lp), 4);
        json_t *first = json_array_get(lp, 0);
        CHECK_STR(jstr(first, "token"), "</think>");
        CHECK_CLOSE(json_number_value(json_object_get(first, "logprob")), -0.5, 1e-6);
        CHECK_EQ_INT(json_array_size(json_object_get(first, "bytes")), 8);
        CHECK_EQ_INT(json_array_size(json_object_get(first, "top_logprobs")), 2);
    }
    CHECK_EQ_INT(json_integer_value(jget(j, "usage.completion_tokens")), 12);
    json_decref(j);
    resp_free(&r);
    http("POST", "/v1/completions", "{\"prompt\":\"q\",\"logprobs\":1,\"max_tokens\":3}", &r);
    j = jbody(&r);
    CHECK_EQ_INT(json_array_size(jget(j, "choices.0.logprobs.tokens")), 3);
    CHECK_EQ_INT(json_array_size(jget(j, "choices.0.logprobs.token_logprobs")), 3);
    CHECK_EQ_INT(json_array_size(jget(j, "choices.0.logprobs.top_logprobs")), 3);
    CHECK_EQ_INT(json_integer_value(jget(j, "choices.0.logprobs.text_offset.2")), 2);
    json_decref(j);
    resp_free(&r);
}

static void test_seed(void) {
    resp a, b, c;
    const char *q = "{\"messages\":[{\"role\":\"user\",\"content\":\"RANDOM\"}],\"seed\":%d,\"temperature\":1}";
    char body[256];
    snprintf(body, sizeof body, q, 7);
    http("POST", "/v1/chat/completions", body, &a);
    http("POST", "/v1/chat/completions", body, &b);
    snprintf(body, sizeof body, q, 8);
    http("POST", "/v1/chat/completions", body, &c);
    json_t *ja = jbody(&a), *jb = jbody(&b), *jc = jbody(&c);
    const char *sa = jstr(ja, "choices.0.message.reasoning_content");
    CHECK(sa && strlen(sa) == 40);
    CHECK_STR(sa, jstr(jb, "choices.0.message.reasoning_content"));
    CHECK(strcmp(sa ? sa : "", jstr(jc, "choices.0.message.reasoning_content") ? jstr(jc, "choices.0.message.reasoning_content") : "") != 0);
    json_decref(ja); json_decref(jb); json_decref(jc);
    resp_free(&a); resp_free(&b); resp_free(&c);
}

/* ---- bad input ---------------------------------------------------------------------------------- */

static void test_bad_requests(void) {
    struct { const char *body; int status; const char *param; const char *code; } cases[] = {
        {"{not json", 400, NULL, NULL},
        {"[1,2]", 400, NULL, NULL},
        {"{\"messages\":[]}", 400, "messages", NULL},
        {"{}", 400, "messages", NULL},
        {"{\"messages\":\"hi\"}", 400, "messages", NULL},
        {"{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "messages[0].role", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages[0].content", NULL},
        {"{\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400, "messages[0].content[0]", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}", 400, "temperature", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":-0.1}", 400, "temperature", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":2.5}", 400, "temperature", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":0}", 400, "top_p", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":1.5}", 400, "top_p", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-5}", 400, "max_tokens", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", 400, "max_tokens", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1000000000000}", 400, "max_tokens", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":\"10\"}", 400, "max_tokens", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":4000}", 400, "max_tokens", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":250}", 400, "max_tokens", "context_length_exceeded"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":9}", 400, "n", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[1]}", 400, "stop[0]", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]}", 400, "stop", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":\"yes\"}", 400, "stream", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"seed\":1.5}", 400, "seed", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", 400, "top_logprobs", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}", 400, "tools", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"sometimes\"}", 400, "tool_choice", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}", 400, "tool_choice", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop_token_ids\":[99999]}", 400, "stop_token_ids", NULL},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":[]}", 400, "chat_template_kwargs", NULL},
        {"{\"model\":\"gpt-9\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404, "model", "model_not_found"},
        {"{\"model\":7,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "model", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        resp r;
        http("POST", "/v1/chat/completions", cases[i].body, &r);
        CHECK_MSG(is_error(&r, cases[i].status, cases[i].param, cases[i].code), "case %zu: %s", i, cases[i].body);
        resp_free(&r);
    }
    const char *comp[][2] = {{"{}", "prompt"}, {"{\"prompt\":5}", "prompt"}, {"{\"prompt\":[]}", "prompt"},
                             {"{\"prompt\":[1,-2]}", "prompt"}, {"{\"prompt\":\"\"}", "prompt"},
                             {"{\"prompt\":\"x\",\"echo\":true}", "echo"}, {"{\"prompt\":\"x\",\"logprobs\":50}", "logprobs"}};
    for (size_t i = 0; i < sizeof comp / sizeof comp[0]; i++) {
        resp r;
        http("POST", "/v1/completions", comp[i][0], &r);
        CHECK_MSG(is_error(&r, 400, comp[i][1], NULL), "completions case %zu", i);
        resp_free(&r);
    }
    /* invalid UTF-8 in the body */
    resp r;
    const char bad_utf8[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}";
    http("POST", "/v1/chat/completions", bad_utf8, &r);
    CHECK(is_error(&r, 400, NULL, NULL));
    resp_free(&r);
    /* prompt longer than the context (context 256 in this test) */
    ms_sbuf big = {0};
    ms_sbuf_adds(&big, "{\"prompt\":\"");
    for (int i = 0; i < 300; i++) ms_sbuf_adds(&big, "a");
    ms_sbuf_adds(&big, "\"}");
    http("POST", "/v1/completions", big.s, &r);
    CHECK(is_error(&r, 400, "prompt", "context_length_exceeded"));
    resp_free(&r);
    ms_sbuf_free(&big);
    /* the server still serves */
    http("POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"ok?\"}]}", &r);
    CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
}

static void test_body_limit(void) {
    /* limit is 64 KiB in this test */
    ms_sbuf big = {0};
    ms_sbuf_adds(&big, "{\"prompt\":\"");
    for (int i = 0; i < 70000; i++) ms_sbuf_addc(&big, 'a');
    ms_sbuf_adds(&big, "\"}");
    resp r;
    http("POST", "/v1/completions", big.s, &r);
    CHECK(is_error(&r, 413, NULL, "request_too_large"));
    resp_free(&r);
    ms_sbuf_free(&big);
    http("GET", "/health", NULL, &r);
    CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
}

/* Client disconnects mid-stream: the engine request is aborted and its pages freed. */
static void test_disconnect_aborts(void) {
    uint64_t a0 = fk_aborts(g_eng);
    resp r;
    memset(&r, 0, sizeof r);
    r.abort_after = 600;
    struct curl_slist *hl;
    const char *body = "{\"prompt\":\"LONG\",\"stream\":true,\"max_tokens\":100000}";
    /* max_tokens over the context is refused; use the largest that fits */
    body = "{\"prompt\":\"LONG\",\"stream\":true,\"max_tokens\":250}";
    CURL *c = make_req("POST", "/v1/completions", body, strlen(body), NULL, &r, &hl);
    CURLcode rc = curl_easy_perform(c);
    CHECK(rc == CURLE_WRITE_ERROR);
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    resp_free(&r);
    CHECK(wait_idle());
    CHECK(fk_aborts(g_eng) > a0);
    ms_engine_stats st;
    fk_stats(g_eng, &st);
    CHECK_EQ_INT(st.kv_pages_used, 0);
}

static void test_concurrent_streams(void) {
    enum { N = 48 };
    CURLM *m = curl_multi_init();
    resp rs[N];
    CURL *cs[N];
    struct curl_slist *hls[N];
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"THINK\"}],\"stream\":true}";
    for (int i = 0; i < N; i++) {
        memset(&rs[i], 0, sizeof rs[i]);
        cs[i] = make_req("POST", "/v1/chat/completions", body, strlen(body), NULL, &rs[i], &hls[i]);
        curl_multi_add_handle(m, cs[i]);
    }
    int running = 1;
    for (int spins = 0; running && spins < 20000; spins++) {
        curl_multi_perform(m, &running);
        if (running) curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    int ok = 0;
    for (int i = 0; i < N; i++) {
        streamed s;
        collect_stream(&rs[i], &s, 0);
        if (!s.bad && !strcmp(ms_sbuf_str(&s.content), "The answer is 4.") && s.finish && !strcmp(s.finish, "stop")) ok++;
        streamed_free(&s);
        curl_multi_remove_handle(m, cs[i]);
        curl_easy_cleanup(cs[i]);
        curl_slist_free_all(hls[i]);
        resp_free(&rs[i]);
    }
    curl_multi_cleanup(m);
    CHECK_EQ_INT(ok, N);
    CHECK(wait_idle());
}

/* ---- a second server: auth and queue-full -------------------------------------------------------- */

static void test_auth_and_busy(void) {
    fk_engine *e2 = fk_engine_new(2);
    ms_server_ops o2 = fk_ops(e2);
    ms_server_config cfg;
    ms_server_config_default(&cfg);
    cfg.api_key = "s3cret";
    cfg.lim.model_names[0] = "m2";
    cfg.lim.context_length = 256;
    cfg.lim.vocab_size = FK_VOCAB;
    cfg.eos_ids[0] = FK_EOS;
    cfg.n_eos = 1;
    ms_server *s2 = start_fake_server(&cfg, &o2);
    CHECK(s2 != NULL);
    if (!s2) return;
    int saved = g_port;
    g_port = ms_server_port(s2);
    resp r;
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    http("POST", "/v1/chat/completions", body, &r);
    CHECK(is_error(&r, 401, NULL, "invalid_api_key"));
    resp_free(&r);
    http_auth("POST", "/v1/chat/completions", body, strlen(body), "Authorization: Bearer s3cre", &r);
    CHECK(is_error(&r, 401, NULL, "invalid_api_key"));
    resp_free(&r);
    http_auth("GET", "/v1/models", NULL, 0, "Authorization: Bearer s3cret", &r);
    CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
    http("GET", "/health", NULL, &r); /* health stays open */
    CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
    /* n=3 against a queue of 2: 503 with Retry-After; the two submitted are aborted */
    const char *b3 = "{\"messages\":[{\"role\":\"user\",\"content\":\"LONG\"}],\"n\":3,\"max_tokens\":200}";
    http_auth("POST", "/v1/chat/completions", b3, strlen(b3), "Authorization: Bearer s3cret", &r);
    CHECK(is_error(&r, 503, NULL, "server_busy"));
    CHECK(strstr(ms_sbuf_str(&r.headers), "Retry-After: 1") != NULL);
    resp_free(&r);
    CHECK(engine_idle(e2));
    ms_engine_stats st;
    fk_stats(e2, &st);
    CHECK_EQ_INT(st.running, 0);
    CHECK_EQ_INT(st.kv_pages_used, 0);
    CHECK_EQ_INT((int)st.requests_aborted, 2);
    http_auth("POST", "/v1/chat/completions", body, strlen(body), "Authorization: Bearer s3cret", &r);
    CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
    g_port = saved;
    ms_server_stop(s2);
    fk_engine_free(e2);
}

/* Stopping the server with a request in flight ends it cleanly: with no shutdown time the request
 * is aborted (finish_reason "abort"); with enough, it is drained (runs to its end) and new
 * connections are refused meanwhile. */
static void *slow_client(void *arg) {
    resp *r = arg;
    http("POST", "/v1/completions", "{\"prompt\":\"LONG\",\"max_tokens\":250}", r);
    return NULL;
}

static void stop_with_inflight(double shutdown_timeout, const char *want_fr) {
    fk_engine *e3 = fk_engine_new(8);
    fk_set(e3, -1, 2000);
    ms_server_ops o3 = fk_ops(e3);
    ms_server_config cfg;
    ms_server_config_default(&cfg);
    cfg.lim.model_names[0] = "m3";
    cfg.lim.context_length = 256;
    cfg.lim.vocab_size = FK_VOCAB;
    cfg.shutdown_timeout_s = shutdown_timeout;
    ms_server *s3 = start_fake_server(&cfg, &o3);
    CHECK(s3 != NULL);
    if (!s3) return;
    int saved = g_port;
    g_port = ms_server_port(s3);
    resp r;
    memset(&r, 0, sizeof r);
    pthread_t th;
    pthread_create(&th, NULL, slow_client, &r);
    usleep(100000);
    ms_server_stop(s3);
    pthread_join(th, NULL);
    CHECK(r.status == 200 || (r.status == 0 && shutdown_timeout == 0));
    if (r.status == 200) {
        json_t *j = jbody(&r);
        CHECK_STR(jstr(j, "choices.0.finish_reason"), want_fr);
        json_decref(j);
    }
    resp_free(&r);
    g_port = saved;
    fk_engine_free(e3);
}

static void test_stop_with_inflight(void) {
    stop_with_inflight(0, "abort");
    stop_with_inflight(30, "length");
}

/* ---- clients that go away, stall or trickle (guard.c) ---------------------------------------- */

/* A raw TCP connection to port (optionally with a small receive buffer); -1 on failure. */
static int raw_connect(int port, int rcvbuf) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { close(fd); return -1; }
    return fd;
}

static void raw_send(int fd, const char *s) {
    size_t n = strlen(s), off = 0;
    while (off < n) {
        ssize_t k = send(fd, s + off, n - off, MSG_NOSIGNAL);
        if (k <= 0) return;
        off += (size_t)k;
    }
}

static void raw_post(int fd, const char *path, const char *body) {
    char h[256];
    snprintf(h, sizeof h, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n", path,
             strlen(body));
    raw_send(fd, h);
    raw_send(fd, body);
}

/* Seconds until the server closes fd (reading and dropping what it sends), or -1 after max_s. */
static double wait_closed(int fd, double max_s) {
    double t0 = ms_now();
    char buf[4096];
    while (ms_now() - t0 < max_s) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 50) > 0) {
            ssize_t k = recv(fd, buf, sizeof buf, 0);
            if (k <= 0) return ms_now() - t0;
        }
    }
    return -1;
}

/* The value of a counter in GET /metrics of the server on g_port (-1 when absent). */
static double metric(const char *name) {
    resp r;
    http("GET", "/metrics", NULL, &r);
    double v = -1;
    char pat[128];
    snprintf(pat, sizeof pat, "\n%s ", name);
    const char *at = r.body.s ? strstr(r.body.s, pat) : NULL;
    if (at) v = atof(at + strlen(pat));
    resp_free(&r);
    return v;
}

static int fk_running(fk_engine *e) {
    ms_engine_stats st;
    fk_stats(e, &st);
    return st.running;
}

static void test_guard(void) {
    fk_engine *e4 = fk_engine_new(64);
    fk_set(e4, -1, 20000); /* 50 tokens a second: a 250-token request runs 5 s */
    ms_server_ops o4 = fk_ops(e4);
    ms_server_config cfg;
    ms_server_config_default(&cfg);
    cfg.lim.model_names[0] = "m4";
    cfg.lim.context_length = 4096;
    cfg.lim.vocab_size = FK_VOCAB;
    cfg.max_request_bytes = 64 * 1024;
    cfg.body_budget_bytes = 64 * 1024;
    cfg.header_timeout_s = 1;
    cfg.body_timeout_s = 1.5;
    cfg.stream_stall_timeout_s = 1;
    cfg.max_choices = 16;
    ms_server *s4 = start_fake_server(&cfg, &o4);
    CHECK(s4 != NULL);
    if (!s4) return;
    int port = ms_server_port(s4);

    /* 1. a non-streaming client that disconnects while its request runs: aborted within a second */
    uint64_t a0 = fk_aborts(e4);
    int fd = raw_connect(port, 0);
    CHECK(fd >= 0);
    raw_post(fd, "/v1/completions", "{\"prompt\":\"LONG\",\"max_tokens\":250}");
    CHECK(T_WAIT_UNTIL(fk_running(e4) == 1));
    close(fd);
    double t0 = ms_now();
    CHECK(T_WAIT_UNTIL(fk_aborts(e4) > a0));
    CHECK_MSG(ms_now() - t0 < 2.0, "disconnect noticed after %.2f s", ms_now() - t0);
    CHECK(engine_idle(e4));

    /* 2. the same while streaming, before any token (long prefill: the connection is suspended) */
    a0 = fk_aborts(e4);
    fd = raw_connect(port, 0);
    raw_post(fd, "/v1/completions", "{\"prompt\":\"LONG\",\"max_tokens\":250,\"stream\":true}");
    CHECK(T_WAIT_UNTIL(fk_running(e4) == 1));
    close(fd);
    CHECK(T_WAIT_UNTIL(fk_aborts(e4) > a0));
    CHECK(engine_idle(e4));

    /* 3. a stream whose reader stops reading (without closing): aborted after the stall timeout */
    int save = g_port;
    g_port = port;
    fk_set(e4, -1, 1000);
    fd = raw_connect(port, 4096);
    raw_post(fd, "/v1/completions", "{\"prompt\":\"LONG\",\"max_tokens\":4000,\"stream\":true,\"n\":8,\"logprobs\":20}");
    CHECK(T_WAIT_UNTIL(metric("moeserve:stream_stalls_total") == 1));
    CHECK(engine_idle(e4));
    CHECK(T_WAIT_UNTIL(metric("moeserve:requests_aborted_total") == 10)); /* 1 + 1 + 8 choices */
    close(fd);
    fk_set(e4, -1, 20000);

    /* 4. headers trickled (never completed): the connection is cut after the header timeout */
    fd = raw_connect(port, 0);
    raw_send(fd, "GET /health HTTP/1.1\r\nHost: x\r\n");
    double w = wait_closed(fd, 5);
    CHECK_MSG(w > 0.5 && w < 3, "trickled headers: closed after %.2f s", w);
    close(fd);

    /* 5. a body that does not arrive: cut after the body timeout */
    fd = raw_connect(port, 0);
    raw_send(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\":");
    w = wait_closed(fd, 6);
    CHECK_MSG(w > 0.5 && w < 4, "stalled body: closed after %.2f s", w);
    close(fd);

    /* 6. the global body budget: while one upload holds most of it, another big one gets 503 */
    fd = raw_connect(port, 0);
    char big[50001];
    memset(big, 'a', 50000);
    big[50000] = 0;
    raw_send(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n");
    raw_send(fd, big);
    usleep(200000);
    char body2[20100];
    snprintf(body2, sizeof body2, "{\"prompt\":\"%.*s\"}", 20000, big);
    resp r;
    http("POST", "/v1/completions", body2, &r);
    CHECK(is_error(&r, 503, NULL, "server_busy"));
    resp_free(&r);
    close(fd);

    /* 7. one request cannot claim the batch: prompts x n over the cap is refused naming n */
    http("POST", "/v1/completions", "{\"prompt\":[\"a\",\"b\",\"c\"],\"n\":8}", &r);
    CHECK(is_error(&r, 400, "n", NULL));
    resp_free(&r);

    /* counters say what happened; uptime is sane */
    CHECK_EQ_INT((int)metric("moeserve:client_disconnects_total"), 2);
    CHECK_EQ_INT((int)metric("moeserve:header_timeouts_total"), 1);
    CHECK_EQ_INT((int)metric("moeserve:slow_uploads_total"), 1);
    CHECK_EQ_INT((int)metric("moeserve:body_budget_rejections_total"), 1);
    http("GET", "/get_server_info", NULL, &r);
    json_t *j = jbody(&r);
    json_t *up = jget(j, "uptime_s");
    CHECK(up && json_number_value(up) >= 0 && json_number_value(up) < 60);
    json_decref(j);
    resp_free(&r);
    /* 8. a generation running past --request-timeout ends normally with finish_reason abort */
    ms_server_stop(s4);
    cfg.request_timeout_s = 0.5;
    s4 = start_fake_server(&cfg, &o4);
    CHECK(s4 != NULL);
    if (!s4) return;
    g_port = ms_server_port(s4);
    http("POST", "/v1/completions", "{\"prompt\":\"LONG\",\"max_tokens\":250}", &r);
    CHECK_EQ_INT(r.status, 200);
    json_t *jt = jbody(&r);
    CHECK_STR(jstr(jt, "choices.0.finish_reason"), "abort");
    json_decref(jt);
    resp_free(&r);
    CHECK_EQ_INT((int)metric("moeserve:request_timeouts_total"), 1);

    g_port = save;
    ms_server_stop(s4);
    fk_engine_free(e4);
}

static void start_main_server(int port, const char *key, int ctx) {
    g_eng = fk_engine_new(1024);
    g_ops = fk_ops(g_eng);
    ms_server_config cfg;
    ms_server_config_default(&cfg);
    cfg.port = port;
    cfg.api_key = key;
    cfg.lim.model_names[0] = "fake-model";
    cfg.lim.model_names[1] = "fake-alias";
    cfg.lim.context_length = ctx;
    cfg.lim.vocab_size = FK_VOCAB;
    cfg.reasoning_parser = MS_REASONING_GLM45;
    cfg.tool_parser = MS_TOOL_GLM47;
    cfg.max_request_bytes = 64 * 1024;
    cfg.eos_ids[0] = FK_EOS;
    cfg.n_eos = 1;
    cfg.model_path = "/fake";
    cfg.info_json = "{\"device\":\"fake\"}";
    cfg.version = "test";
    ms_err err = {0};
    if (ms_server_start(&cfg, &g_ops, &g_srv, &err) != MS_OK) {
        fprintf(stderr, "server start failed: %s\n", err.msg);
        exit(1);
    }
    g_port = ms_server_port(g_srv);
}

static volatile sig_atomic_t g_quit;
static void on_sig(int s) { (void)s; g_quit = 1; }

int main(int argc, char **argv) {
    curl_global_init(CURL_GLOBAL_ALL);
    if (argc >= 3 && !strcmp(argv[1], "--serve")) {
        /* standalone fake server for trying the e2e tests */
        start_main_server(atoi(argv[2]), argc >= 5 ? argv[4] : NULL, 4096);
        fk_set(g_eng, -1, 2000);
        printf("fake server on http://127.0.0.1:%d\n", g_port);
        fflush(stdout);
        signal(SIGINT, on_sig);
        signal(SIGTERM, on_sig);
        while (!g_quit) pause();
        ms_server_stop(g_srv);
        fk_engine_free(g_eng);
        return 0;
    }
    start_main_server(0, NULL, 256);
    RUN(test_routes);
    RUN(test_metrics_route);
    RUN(test_chat_reasoning_nonstream);
    RUN(test_chat_reasoning_stream);
    RUN(test_tool_calls);
    RUN(test_stop_strings);
    RUN(test_completions);
    RUN(test_n_and_logprobs);
    RUN(test_seed);
    RUN(test_bad_requests);
    RUN(test_body_limit);
    RUN(test_disconnect_aborts);
    RUN(test_concurrent_streams);
    RUN(test_auth_and_busy);
    RUN(test_stop_with_inflight);
    RUN(test_guard);
    ms_server_stop(g_srv);
    fk_engine_free(g_eng);
    curl_global_cleanup();
    return TEST_SUMMARY();
}
