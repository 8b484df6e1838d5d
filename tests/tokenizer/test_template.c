/* test_template.c - unit tests of the chat-template engine that need no oracle: the GLM-5 template
 * against expected strings derived from the spec (tests/fixtures/templates/glm5_spec_cases.json),
 * hostile templates (runaway recursion, huge loops, exploding output) that must fail with a clear
 * error, syntax errors that must name the line, the context-building API, model-directory loading
 * and concurrent rendering of one compiled template. */
#include "test.h"

#include "core/fileutil.h"
#include "tokenizer/chat_template.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* Renders src with a JSON context; returns the malloc'd text or NULL (error in *err). */
static char *render(const char *src, const char *ctx_json, ms_err *err) {
    ms_template *t = NULL;
    memset(err, 0, sizeof *err);
    if (ms_template_compile(src, strlen(src), &t, err)) return NULL;
    json_t *ctx = json_loads(ctx_json ? ctx_json : "{}", 0, NULL);
    char *out = NULL;
    size_t len = 0;
    ms_template_render(t, ctx, &out, &len, err);
    json_decref(ctx);
    ms_template_free(t);
    return out;
}

static int contains(const char *s, const char *sub) { return s && strstr(s, sub) != NULL; }

static void check_render(const char *src, const char *ctx, const char *want) {
    ms_err err;
    char *got = render(src, ctx, &err);
    CHECK_MSG(got && !strcmp(got, want), "template %s: got %s (error: %s), want %s", src, got ? got : "NULL", err.msg, want);
    free(got);
}

static void check_fails(const char *src, const char *ctx, const char *msg_part) {
    ms_err err;
    char *got = render(src, ctx, &err);
    CHECK_MSG(!got, "template %s should fail but rendered %.80s", src, got ? got : "");
    CHECK_MSG(contains(err.msg, msg_part), "template %.60s: error '%s' lacks '%s'", src, err.msg, msg_part);
    free(got);
}

static void test_glm5_spec_examples(void) {
    char *src = NULL;
    size_t len = 0;
    ms_err err = {0};
    CHECK(ms_read_file("configs/templates/glm5.jinja", 1 << 20, &src, &len, &err) == 0);
    json_t *cases = json_load_file("tests/fixtures/templates/glm5_spec_cases.json", 0, NULL);
    CHECK(json_is_array(cases) && json_array_size(cases) >= 10);
    ms_template *t = NULL;
    CHECK(src && ms_template_compile(src, len, &t, &err) == 0);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        if (!t) break;
        char *out = NULL;
        size_t n = 0;
        json_t *kw = json_object_get(c, "kwargs");
        int rc = ms_chat_render(t, json_object_get(c, "messages"), json_object_get(c, "tools"),
                                json_is_true(json_object_get(c, "add_generation_prompt")), kw, NULL, NULL, &out, &n, &err);
        const char *want = json_string_value(json_object_get(c, "expected"));
        CHECK_MSG(rc == 0 && out && want && n == strlen(want) && !memcmp(out, want, n), "%s:\n got  %s\n want %s (%s)",
                  json_string_value(json_object_get(c, "name")), out ? out : "NULL", want, err.msg);
        free(out);
    }
    ms_template_free(t);
    json_decref(cases);
    free(src);
}

static void test_glm5_string_arguments_fail_clearly(void) {
    char *src = NULL;
    size_t len = 0;
    ms_err err = {0};
    CHECK(ms_read_file("configs/templates/glm5.jinja", 1 << 20, &src, &len, &err) == 0);
    ms_template *t = NULL;
    CHECK(src && ms_template_compile(src, len, &t, &err) == 0);
    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
                              "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": [1, 2]}\"}}]}]",
                              0, NULL);
    char *out = NULL;
    size_t n;
    CHECK(ms_chat_render(t, msgs, NULL, 0, NULL, NULL, NULL, &out, &n, &err) != 0);
    CHECK(contains(err.msg, "raise_exception") && contains(err.msg, "arguments"));
    free(out);
    out = NULL;
    /* after the server-side parse the same conversation renders */
    CHECK(ms_chat_parse_tool_arguments(msgs) == 1);
    CHECK(ms_chat_render(t, msgs, NULL, 0, NULL, NULL, NULL, &out, &n, &err) == 0);
    CHECK(contains(out, "<tool_call>f<arg_key>a</arg_key><arg_value>[1, 2]</arg_value></tool_call>"));
    free(out);
    json_decref(msgs);
    ms_template_free(t);
    free(src);
}

static void test_hostile_recursion(void) {
    check_fails("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, "nested deeper");
    /* exponential fan-out at bounded depth: the step budget (or the memory cap) stops it */
    check_fails("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}", NULL,
                "exceeded the");
    ms_template *t = NULL;
    ms_err err = {0};
    const char *src = "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}";
    CHECK(ms_template_compile(src, strlen(src), &t, &err) == 0);
    ms_template_limits lim = ms_template_default_limits();
    lim.max_steps = 10000;
    char *out = NULL;
    size_t n = 0;
    CHECK(ms_template_render_ex(t, NULL, &lim, &out, &n, &err) != 0);
    CHECK(contains(err.msg, "limit of 10000 loop iterations and macro calls"));
    free(out);
    ms_template_free(t);
}

static void test_hostile_loops(void) {
    check_fails("{% for i in range(100000000000) %}x{% endfor %}", NULL, "loop iterations");
    check_fails("{% for a in range(1500) %}{% for b in range(1500) %}{% endfor %}{% endfor %}", NULL, "loop iterations");
    check_fails("{% set ns = namespace(i=0) %}{% for a in range(1000000) %}{% for b in range(1000000) %}{% set ns.i = ns.i + 1 %}{% endfor %}{% endfor %}", NULL, "loop iterations");
    check_fails("{% set ns = namespace(l=[0]) %}{% for i in range(30) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}",
                NULL, "limit");
}

static void test_hostile_output(void) {
    check_fails("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
                NULL, "limit");
    /* tight explicit limits */
    ms_template *t = NULL;
    ms_err err = {0};
    const char *src = "{% for i in range(1000) %}0123456789{% endfor %}";
    CHECK(ms_template_compile(src, strlen(src), &t, &err) == 0);
    ms_template_limits lim = ms_template_default_limits();
    lim.max_output = 5000;
    char *out = NULL;
    size_t n = 0;
    CHECK(ms_template_render_ex(t, NULL, &lim, &out, &n, &err) != 0);
    CHECK(contains(err.msg, "output limit of 5000 bytes"));
    free(out);
    out = NULL;
    lim.max_output = 10000;
    CHECK(ms_template_render_ex(t, NULL, &lim, &out, &n, &err) == 0 && n == 10000);
    free(out);
    out = NULL;
    lim.max_steps = 999;
    CHECK(ms_template_render_ex(t, NULL, &lim, &out, &n, &err) != 0);
    free(out);
    ms_template_free(t);
}

static void test_hostile_parse(void) {
    size_t depth = 20000;
    char *src = malloc(depth * 2 + 16);
    size_t k = 0;
    k += (size_t)sprintf(src, "{{ ");
    for (size_t i = 0; i < depth; i++) src[k++] = '(';
    src[k++] = '1';
    for (size_t i = 0; i < depth; i++) src[k++] = ')';
    strcpy(src + k, " }}");
    check_fails(src, NULL, "nested too deeply");
    k = 0;
    for (size_t i = 0; i < 2000; i++) k += (size_t)sprintf(src + k, "{%% if 1 %%}");
    check_fails(src, NULL, "nested too deeply");
    free(src);
}

/* Hostile nesting must fail cleanly even on a small thread stack (1 MiB; sanitizers need more). */
#if defined(__SANITIZE_ADDRESS__)
#define SMALL_STACK (6u << 20)
#else
#define SMALL_STACK (1u << 20)
#endif
static void *render_on_small_stack(void *arg) {
    const char *src = arg;
    ms_err err;
    char *out = render(src, NULL, &err);
    int ok = out == NULL && strstr(err.msg, "nested") != NULL;
    free(out);
    return ok ? (void *)1 : NULL;
}

static void test_hostile_nesting_small_stack(void) {
    /* deep block nesting inside deep macro recursion */
    size_t cap = 1 << 16;
    char *src = malloc(cap);
    size_t k = (size_t)snprintf(src, cap, "{%% macro f(n) %%}");
    for (int i = 0; i < 150; i++) k += (size_t)snprintf(src + k, cap - k, "{%% if true %%}");
    k += (size_t)snprintf(src + k, cap - k, "{{ f(n + 1) }}");
    for (int i = 0; i < 150; i++) k += (size_t)snprintf(src + k, cap - k, "{%% endif %%}");
    snprintf(src + k, cap - k, "{%% endmacro %%}{{ f(0) }}");
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, SMALL_STACK);
    pthread_t th;
    void *res = NULL;
    CHECK(pthread_create(&th, &at, render_on_small_stack, src) == 0);
    pthread_join(th, &res);
    CHECK(res == (void *)1);
    /* a 5000-term expression chain is refused by the parser */
    k = (size_t)snprintf(src, cap, "{{ 1");
    for (int i = 0; i < 5000; i++) k += (size_t)snprintf(src + k, cap - k, " ~ 1");
    snprintf(src + k, cap - k, " }}");
    check_fails(src, NULL, "chained");
    k = (size_t)snprintf(src, cap, "{{ x");
    for (int i = 0; i < 5000; i++) k += (size_t)snprintf(src + k, cap - k, "()");
    snprintf(src + k, cap - k, " }}");
    check_fails(src, NULL, "chained");
    pthread_attr_destroy(&at);
    free(src);
}

static void test_syntax_errors_name_the_line(void) {
    check_fails("line one\n{% if x %}\n{{ 1 + }}\n{% endif %}", NULL, "line 3");
    check_fails("a\nb\n{% frobnicate %}", NULL, "line 3");
    check_fails("a\n{% if x %}\nnever closed", NULL, "line 2");
    check_fails("{{ 'ok' }}\n\n\n{{ 'unterminated }}", NULL, "line 4");
    check_fails("{# fine #}\n{{ x @ y }}", NULL, "line 2");
    check_fails("{% for x in y %}\n{% endif %}", NULL, "line 2");
    check_fails("x\n{# never closed", NULL, "comment");
}

static void test_runtime_errors(void) {
    check_fails("\n\n{{ raise_exception('Conversation roles must alternate') }}", NULL, "Conversation roles must alternate");
    check_fails("{{ raise_exception('x') }}", NULL, "line 1");
    check_fails("{{ messages[0] }}", NULL, "non-string"); /* undefined[0] */
    check_fails("{{ 'a' + none }}", NULL, "null");
    check_fails("{% break %}", NULL, "outside");
}

static void test_semantics_basics(void) {
    check_render("{{ x }}|{{ none }}|{{ true }}|{{ 1.0 }}|{{ 'a' ~ 1.0 }}|{{ [1, 'b'] }}", NULL, "|None|True|1.0|a1.0|[1, 'b']");
    check_render("{%- for m in messages -%}\n  {{ m.role }}:{{ m.content | trim }};\n{%- endfor %}",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\" hi \"},{\"role\":\"assistant\",\"content\":\"yo\"}]}",
                 "user:hi;assistant:yo;");
    check_render("{% set ns = namespace(n=0) %}{% for x in xs if x is odd %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}",
                 "{\"xs\":[1,2,3,4,5]}", "9");
    check_render("{{ xs[::-1] | join(',') }} {{ xs | length }} {{ 'Ünï'.upper() }} {{ d | tojson }}",
                 "{\"xs\":[1,2,3],\"d\":{\"b\":\"é\",\"a\":[true,null,1.5]}}", "3,2,1 3 ÜNÏ {\"b\": \"é\", \"a\": [true, null, 1.5]}");
    check_render("a\n  {% if true %}\n  b\n  {% endif %}\nc\n", NULL, "a\n  b\nc");
    check_render("{% macro m(a, b='d') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}", NULL, "1d23");
    check_render("x{% generation %}y{% endgeneration %}z", NULL, "xyz");
}

static void test_chat_render_context(void) {
    const char *src = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ tools is none }}"
                      "{{ add_generation_prompt }}{{ eos_token }}{{ extra }}";
    ms_template *t = NULL;
    ms_err err = {0};
    CHECK(ms_template_compile(src, strlen(src), &t, &err) == 0);
    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"hi\"}]", 0, NULL);
    json_t *kw = json_loads("{\"extra\":\"!\",\"eos_token\":\"<E2>\"}", 0, NULL);
    char *out = NULL;
    size_t n = 0;
    CHECK(ms_chat_render(t, msgs, NULL, 1, kw, "<B>", "<E>", &out, &n, &err) == 0);
    CHECK_STR(out, "<B>hiTrueTrue<E2>!"); /* Python prints True; kwargs override the special tokens, as in transformers */
    free(out);
    out = NULL;
    CHECK(ms_chat_render(t, msgs, NULL, 0, NULL, NULL, NULL, &out, &n, &err) == 0);
    CHECK_STR(out, "hiTrueFalse");
    free(out);
    out = NULL;
    json_t *bad = json_string("x");
    CHECK(ms_chat_render(t, msgs, NULL, 0, bad, NULL, NULL, &out, &n, &err) != 0);
    CHECK(contains(err.msg, "chat_template_kwargs"));
    json_decref(bad);
    json_t *arr = json_array();
    CHECK(ms_template_render(t, arr, &out, &n, &err) != 0);
    json_decref(arr);
    json_decref(msgs);
    json_decref(kw);
    ms_template_free(t);
}

static void write_text(const char *path, const char *text) {
    ms_err err = {0};
    CHECK(ms_write_file(path, text, strlen(text), &err) == 0);
}

static void test_load_from_model_dir(void) {
    char dir[] = "/tmp/ms_tmpl_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char p1[256], p2[256];
    snprintf(p1, sizeof p1, "%s/tokenizer_config.json", dir);
    snprintf(p2, sizeof p2, "%s/chat_template.jinja", dir);
    write_text(p1, "{\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<s>\"}, \"eos_token\": \"</s>\","
                   " \"model_max_length\": 1000000000000000019884624838656,"
                   " \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\", \"template\": \"D\"}]}");
    char *src = NULL, *bos = NULL, *eos = NULL;
    ms_err err = {0};
    CHECK(ms_chat_template_load(dir, &src, &bos, &eos, &err) == 0);
    CHECK_STR(src, "D");
    CHECK_STR(bos, "<s>");
    CHECK_STR(eos, "</s>");
    free(src), free(bos), free(eos);
    write_text(p2, "J{{ bos_token }}");
    CHECK(ms_chat_template_load(dir, &src, &bos, &eos, &err) == 0);
    CHECK_STR(src, "J{{ bos_token }}"); /* chat_template.jinja takes precedence */
    CHECK_STR(bos, "<s>");
    free(src), free(bos), free(eos);
    unlink(p1);
    CHECK(ms_chat_template_load(dir, &src, &bos, &eos, &err) == 0 && bos == NULL && eos == NULL);
    free(src);
    unlink(p2);
    CHECK(ms_chat_template_load(dir, &src, &bos, &eos, &err) != 0);
    CHECK(contains(err.msg, dir));
    rmdir(dir);
}

typedef struct {
    const ms_template *t;
    json_t *ctx;
    const char *want;
    int bad;
} thr_arg;

static void *render_many(void *p) {
    thr_arg *a = p;
    for (int i = 0; i < 200; i++) {
        char *out = NULL;
        size_t n;
        ms_err err = {0};
        if (ms_template_render(a->t, a->ctx, &out, &n, &err) || strcmp(out, a->want)) a->bad++;
        free(out);
    }
    return NULL;
}

static void test_concurrent_rendering(void) {
    const char *src = "{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s = ns.s ~ m.role[0] %}"
                      "{{ m.content | upper }}{% endfor %}{{ ns.s }}";
    ms_template *t = NULL;
    ms_err err = {0};
    CHECK(ms_template_compile(src, strlen(src), &t, &err) == 0);
    json_t *ctx = json_loads("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"}]}",
                             0, NULL);
    thr_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg){t, ctx, "ABua", 0};
        pthread_create(&th[i], NULL, render_many, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(args[i].bad, 0);
    }
    json_decref(ctx);
    ms_template_free(t);
}

int main(void) {
    RUN(test_glm5_spec_examples);
    RUN(test_glm5_string_arguments_fail_clearly);
    RUN(test_hostile_recursion);
    RUN(test_hostile_loops);
    RUN(test_hostile_output);
    RUN(test_hostile_parse);
    RUN(test_hostile_nesting_small_stack);
    RUN(test_syntax_errors_name_the_line);
    RUN(test_runtime_errors);
    RUN(test_semantics_basics);
    RUN(test_chat_render_context);
    RUN(test_load_from_model_dir);
    RUN(test_concurrent_rendering);
    return TEST_SUMMARY();
}
