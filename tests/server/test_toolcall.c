/* test_toolcall.c - glm47/glm45 tool-call parsing against expectations written from
 * reference/glm5-spec.md section 5.4; the streaming deltas, split at every boundary and at GLM
 * token boundaries, must concatenate to the non-streaming result. */
#include "server/reasoning.h"
#include "server/toolcall.h"
#include "test.h"

#include <ctype.h>
#include <stdlib.h>

static const char *TOOLS_JSON =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
    "\"units\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"set_flags\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"flags\":{\"type\":\"object\"},\"verbose\":{\"type\":\"boolean\"},"
    "\"ratio\":{\"type\":\"number\"},\"tags\":{\"type\":\"array\"},\"any\":{\"type\":[\"string\",\"null\"]}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"no_args\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]";

typedef struct {
    const char *name;
    int format;
    const char *text;
    const char *content;   /* expected non-streaming content */
    int n_calls;
    const char *calls[3][2]; /* name, arguments */
} tcase;

static const tcase CASES[] = {
    {"single", MS_TOOL_GLM47,
     "<tool_call>get_weather<arg_key>city</arg_key><arg_value>北京</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
     "", 1, {{"get_weather", "{\"city\": \"北京\", \"days\": 3}"}}},
    {"content_before", MS_TOOL_GLM47,
     "Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
     "Let me check.", 1, {{"get_weather", "{\"city\": \"Paris\"}"}}},
    {"two_calls", MS_TOOL_GLM47,
     "<tool_call>get_weather<arg_key>city</arg_key><arg_value>A</arg_value></tool_call><tool_call>get_weather<arg_key>city</arg_key><arg_value>B</arg_value><arg_key>units</arg_key><arg_value>f</arg_value></tool_call>",
     "", 2, {{"get_weather", "{\"city\": \"A\"}"}, {"get_weather", "{\"city\": \"B\", \"units\": \"f\"}"}}},
    {"no_args", MS_TOOL_GLM47, "<tool_call>no_args</tool_call>", "", 1, {{"no_args", "{}"}}},
    {"coercion", MS_TOOL_GLM47,
     "<tool_call>set_flags<arg_key>flags</arg_key><arg_value>{\"a\": [1, 2.5]}</arg_value>"
     "<arg_key> verbose </arg_key>\n<arg_value>True</arg_value><arg_key>ratio</arg_key><arg_value>\"0.5\"</arg_value>"
     "<arg_key>tags</arg_key><arg_value>['x', \"y\", None]</arg_value><arg_key>extra</arg_key><arg_value>hello</arg_value>"
     "<arg_key>n</arg_key><arg_value>42</arg_value></tool_call>",
     "", 1,
     {{"set_flags", "{\"flags\": {\"a\": [1, 2.5]}, \"verbose\": true, \"ratio\": 0.5, \"tags\": [\"x\", \"y\", null], \"extra\": \"hello\", \"n\": 42}"}}},
    {"string_quotes", MS_TOOL_GLM47,
     "<tool_call>get_weather<arg_key>city</arg_key><arg_value>\"Paris\"</arg_value><arg_key>units</arg_key><arg_value>'c'</arg_value><arg_key>days</arg_key><arg_value>\"5\"</arg_value></tool_call>",
     "", 1, {{"get_weather", "{\"city\": \"\\\"Paris\\\"\", \"units\": \"c\", \"days\": 5}"}}},
    {"string_escapes", MS_TOOL_GLM47,
     "<tool_call>get_weather<arg_key>city</arg_key><arg_value>a < b </arg \"q\"\nline\\2\t</arg_value></tool_call>",
     "", 1, {{"get_weather", "{\"city\": \"a < b </arg \\\"q\\\"\\nline\\\\2\\t\"}"}}},
    {"unknown_tool_dropped", MS_TOOL_GLM47,
     "Hi <tool_call>launch_rockets<arg_key>n</arg_key><arg_value>3</arg_value></tool_call> there",
     "Hi  there", 0, {{0}}},
    {"text_between_and_after", MS_TOOL_GLM47,
     "A <tool_call>no_args</tool_call> B <tool_call>no_args</tool_call>\n",
     "A  B", 2, {{"no_args", "{}"}, {"no_args", "{}"}}},
    {"no_call", MS_TOOL_GLM47, "  plain <b>text</b> with <tool_ mention\n", "  plain <b>text</b> with <tool_ mention\n", 0, {{0}}},
    {"ws_before_call", MS_TOOL_GLM47, "\n\n<tool_call>no_args</tool_call>\n", "", 1, {{"no_args", "{}"}}},
    {"union_type", MS_TOOL_GLM47,
     "<tool_call>set_flags<arg_key>any</arg_key><arg_value>[1,2]</arg_value></tool_call>", "", 1,
     {{"set_flags", "{\"any\": [1, 2]}"}}},
    {"name_whitespace", MS_TOOL_GLM47, "<tool_call> no_args \n</tool_call>", "", 1, {{"no_args", "{}"}}},
    {"glm45", MS_TOOL_GLM45,
     "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>\n<tool_call>no_args\n</tool_call>tail",
     "Checking.", 2, {{"get_weather", "{\"city\": \"Beijing\", \"days\": 2}"}, {"no_args", "{}"}}},
    {"glm45_no_newline_dropped", MS_TOOL_GLM45, "<tool_call>no_args</tool_call>", "", 0, {{0}}},
    {"unterminated_name", MS_TOOL_GLM47, "Sure: <tool_call>get_wea", "Sure: <tool_call>get_wea", 0, {{0}}},
};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

static json_t *g_tools;

typedef struct {
    ms_sbuf content;
    int n;
    char *names[8];
    ms_sbuf args[8];
    int bad; /* protocol violations seen */
} collected;

static void collect(collected *c, ms_tool_out *o) {
    ms_sbuf_add(&c->content, ms_sbuf_str(&o->content), o->content.len);
    for (int i = 0; i < o->n; i++) {
        ms_tool_delta *d = &o->d[i];
        if (d->index < 0 || d->index >= 8) { c->bad = 1; continue; }
        if (d->is_start) {
            if (d->index != c->n) c->bad = 1; /* starts come in index order */
            if (strlen(d->id) != 29 || strncmp(d->id, "call_", 5)) c->bad = 1;
            for (int k = 5; k < 29; k++) if (!isxdigit((unsigned char)d->id[k])) c->bad = 1;
            if (d->args.len) c->bad = 1; /* the start delta has arguments "" */
            c->names[c->n++] = strdup(d->name);
        } else {
            if (d->index != c->n - 1) c->bad = 1; /* fragments belong to the open call */
            ms_sbuf_add(&c->args[d->index], ms_sbuf_str(&d->args), d->args.len);
        }
    }
    ms_tool_out_reset(o);
}

static void collected_free(collected *c) {
    ms_sbuf_free(&c->content);
    for (int i = 0; i < 8; i++) { free(c->names[i]); ms_sbuf_free(&c->args[i]); }
}

static int run_stream(const tcase *t, const size_t *cuts, int ncuts, int verbose) {
    ms_tool_stream *s = ms_tool_stream_new(t->format, g_tools);
    ms_tool_out o = {0};
    collected c = {0};
    size_t n = strlen(t->text), prev = 0;
    for (int i = 0; i <= ncuts; i++) {
        size_t at = i < ncuts ? cuts[i] : n;
        ms_tool_stream_push(s, t->text + prev, at - prev, &o);
        collect(&c, &o);
        prev = at;
    }
    ms_tool_stream_finish(s, &o);
    collect(&c, &o);
    int ok = !c.bad && c.n == t->n_calls && c.n == ms_tool_stream_calls(s) &&
             !strcmp(ms_sbuf_str(&c.content), t->content);
    for (int i = 0; ok && i < c.n; i++)
        ok = !strcmp(c.names[i], t->calls[i][0]) && !strcmp(ms_sbuf_str(&c.args[i]), t->calls[i][1]);
    if (!ok && verbose) {
        fprintf(stderr, "  %s (cuts %d): bad=%d n=%d content=[%s]\n", t->name, ncuts, c.bad, c.n,
                ms_sbuf_str(&c.content));
        for (int i = 0; i < c.n; i++) fprintf(stderr, "    %s %s\n", c.names[i], ms_sbuf_str(&c.args[i]));
    }
    collected_free(&c);
    ms_tool_out_free(&o);
    ms_tool_stream_free(s);
    return ok;
}

static void test_nonstreaming(void) {
    for (int i = 0; i < NCASES; i++) {
        const tcase *t = &CASES[i];
        ms_sbuf content = {0};
        ms_tool_calls calls = {0};
        ms_tool_parse(t->format, g_tools, t->text, strlen(t->text), &content, &calls);
        CHECK_MSG(!strcmp(ms_sbuf_str(&content), t->content), "%s content [%s]", t->name, ms_sbuf_str(&content));
        CHECK_MSG(calls.n == t->n_calls, "%s: %d calls", t->name, calls.n);
        for (int k = 0; k < calls.n && k < t->n_calls; k++) {
            CHECK_STR(calls.v[k].name, t->calls[k][0]);
            CHECK_STR(calls.v[k].arguments, t->calls[k][1]);
            json_error_t e;
            json_t *j = json_loads(calls.v[k].arguments, 0, &e);
            CHECK_MSG(json_is_object(j), "%s: arguments not a JSON object", t->name);
            json_decref(j);
            CHECK(strlen(calls.v[k].id) == 29 && !strncmp(calls.v[k].id, "call_", 5));
        }
        ms_tool_calls_free(&calls);
        ms_sbuf_free(&content);
    }
}

static void test_stream_whole_and_bytewise(void) {
    for (int i = 0; i < NCASES; i++) {
        CHECK_MSG(run_stream(&CASES[i], NULL, 0, 1), "%s whole", CASES[i].name);
        size_t n = strlen(CASES[i].text);
        int nc;
        size_t *cuts = t_cuts_every_byte(n, &nc);
        CHECK_MSG(run_stream(&CASES[i], cuts, nc, 1), "%s bytewise", CASES[i].name);
        free(cuts);
    }
}

static void test_stream_every_split_pair(void) {
    for (int i = 0; i < NCASES; i++) {
        size_t n = strlen(CASES[i].text);
        int bad = 0;
        for (size_t a = 0; a <= n && !bad; a++)
            for (size_t b = a; b <= n && !bad; b += 3) {
                size_t cuts[2] = {a, b};
                if (!run_stream(&CASES[i], cuts, 2, 1)) bad = 1;
            }
        CHECK_MSG(!bad, "%s", CASES[i].name);
    }
}

/* GLM tokenization: tags are single tokens; split the text before and after every tag and
 * into 2-byte pieces elsewhere. */
static void test_stream_glm_tokens(void) {
    static const char *tags[] = {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                                 "<arg_value>", "</arg_value>"};
    for (int i = 0; i < NCASES; i++) {
        const char *s = CASES[i].text;
        size_t n = strlen(s), cuts[2048];
        int nc = 0;
        for (size_t p = 0; p < n && nc < 2040;) {
            size_t adv = 2;
            for (int k = 0; k < 6; k++)
                if (!strncmp(s + p, tags[k], strlen(tags[k]))) adv = strlen(tags[k]);
            for (int k = 0; k < 6 && adv == 2; k++)
                if (p + 1 < n && !strncmp(s + p + 1, tags[k], strlen(tags[k]))) adv = 1;
            p += adv;
            if (p < n) cuts[nc++] = p;
        }
        CHECK_MSG(run_stream(&CASES[i], cuts, nc, 1), "%s", CASES[i].name);
    }
}

/* Streaming string values go out as they arrive, before </arg_value>. */
static void test_string_value_streams_early(void) {
    ms_tool_stream *s = ms_tool_stream_new(MS_TOOL_GLM47, g_tools);
    ms_tool_out o = {0};
    ms_tool_stream_push(s, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>San", 59, &o);
    ms_sbuf all = {0};
    for (int i = 0; i < o.n; i++) ms_sbuf_add(&all, ms_sbuf_str(&o.d[i].args), o.d[i].args.len);
    CHECK_STR(ms_sbuf_str(&all), "{\"city\": \"San");
    CHECK(o.n >= 1 && o.d[0].is_start && !strcmp(o.d[0].name, "get_weather"));
    ms_sbuf_free(&all);
    ms_tool_out_free(&o);
    ms_tool_stream_free(s);
}

/* The documented difference: leading whitespace of content before a call. */
static void test_leading_ws_difference(void) {
    const char *text = "\nOK.<tool_call>no_args</tool_call>";
    ms_sbuf content = {0};
    ms_tool_calls calls = {0};
    ms_tool_parse(MS_TOOL_GLM47, g_tools, text, strlen(text), &content, &calls);
    CHECK_STR(ms_sbuf_str(&content), "OK.");
    ms_tool_stream *s = ms_tool_stream_new(MS_TOOL_GLM47, g_tools);
    ms_tool_out o = {0};
    ms_tool_stream_push(s, text, strlen(text), &o);
    ms_tool_stream_finish(s, &o);
    CHECK_STR(ms_sbuf_str(&o.content), "\nOK.");
    ms_tool_out_free(&o);
    ms_tool_stream_free(s);
    ms_tool_calls_free(&calls);
    ms_sbuf_free(&content);
}

static void test_value_conversion(void) {
    struct { const char *type, *v, *want; } c[] = {
        {"integer", "7", "7"}, {"integer", "\"7\"", "7"}, {"integer", "7.5", "7.5"},
        {"integer", "\"7.5\"", "\"7.5\""}, {"number", "\"1e3\"", "1000.0"}, {"number", "0.1", "0.1"},
        {"boolean", "false", "false"}, {"boolean", "True", "true"}, {NULL, "None", "null"},
        {"object", "{'a': (1, 2)}", "{\"a\": [1, 2]}"}, {"object", "{\\\"a\\\": 1}", "{\"a\": 1}"},
        {"array", "not json", "\"not json\""}, {"string", "123", "\"123\""},
        {"string", "\"x\"", "\"\\\"x\\\"\""}, {"string", "\"x", "\"\\\"x\""}, {"string", "'x'", "\"x\""},
        {"number", "1e20", "1e+20"}, {"number", "123456.0", "123456.0"}, {"number", "1e-7", "1e-07"},
        {NULL, "12345678901234567", "12345678901234567"}, {NULL, "3.0", "3.0"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char *got = ms_tool_convert_value(c[i].type, c[i].v, strlen(c[i].v));
        CHECK_MSG(!strcmp(got, c[i].want), "%s %s -> %s (want %s)", c[i].type ? c[i].type : "?", c[i].v, got, c[i].want);
        free(got);
    }
}

/* Reasoning then tools, token by token, as the server chains them. */
static void test_reasoning_then_tools(void) {
    const char *toks[] = {"Need", " weather", ".", "</think>", "<tool_call>", "get", "_weather",
                          "<arg_key>", "city", "</arg_key>", "<arg_value>", "Rome", "</arg_value>",
                          "</tool_call>"};
    ms_reasoning r;
    ms_reasoning_init(&r, 1);
    ms_tool_stream *s = ms_tool_stream_new(MS_TOOL_GLM47, g_tools);
    ms_tool_out o = {0};
    collected c = {0};
    ms_sbuf reason = {0}, content = {0};
    for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) {
        ms_sbuf_clear(&content);
        ms_reasoning_push(&r, toks[i], strlen(toks[i]), &reason, &content);
        ms_tool_stream_push(s, content.s ? content.s : "", content.len, &o);
        collect(&c, &o);
    }
    ms_sbuf_clear(&content);
    ms_reasoning_finish(&r, &reason, &content);
    ms_tool_stream_push(s, ms_sbuf_str(&content), content.len, &o);
    ms_tool_stream_finish(s, &o);
    collect(&c, &o);
    CHECK_STR(ms_sbuf_str(&reason), "Need weather.");
    CHECK_STR(ms_sbuf_str(&c.content), "");
    CHECK_EQ_INT(c.n, 1);
    if (c.n == 1) {
        CHECK_STR(c.names[0], "get_weather");
        CHECK_STR(ms_sbuf_str(&c.args[0]), "{\"city\": \"Rome\"}");
    }
    CHECK(!c.bad);
    collected_free(&c);
    ms_tool_out_free(&o);
    ms_tool_stream_free(s);
    ms_reasoning_free(&r);
    ms_sbuf_free(&reason);
    ms_sbuf_free(&content);
}

static void test_format_names(void) {
    CHECK_EQ_INT(ms_tool_format_parse("glm47"), MS_TOOL_GLM47);
    CHECK_EQ_INT(ms_tool_format_parse("glm45"), MS_TOOL_GLM45);
    CHECK_EQ_INT(ms_tool_format_parse("qwen"), -1);
    char a[32], b[32];
    ms_tool_call_id(a);
    ms_tool_call_id(b);
    CHECK(strcmp(a, b) != 0);
}

int main(void) {
    json_error_t e;
    g_tools = json_loads(TOOLS_JSON, 0, &e);
    if (!g_tools) { fprintf(stderr, "bad TOOLS_JSON: %s\n", e.text); return 1; }
    RUN(test_format_names);
    RUN(test_value_conversion);
    RUN(test_nonstreaming);
    RUN(test_stream_whole_and_bytewise);
    RUN(test_stream_every_split_pair);
    RUN(test_stream_glm_tokens);
    RUN(test_string_value_streams_early);
    RUN(test_leading_ws_difference);
    RUN(test_reasoning_then_tools);
    json_decref(g_tools);
    return TEST_SUMMARY();
}
