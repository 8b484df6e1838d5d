/* api.c - see api.h. Field rules follow the OpenAI API reference; the bounds on n, stop and
 * top_logprobs are this server's limits. */
#include "server/api.h"

#include "server/toolcall.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD "invalid_request_error"

int ms_api_fail(ms_api_error *e, int status, const char *type, const char *param, const char *code,
                const char *fmt, ...) {
    memset(e, 0, sizeof *e);
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type ? type : BAD);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return status;
}

void ms_api_error_json(const ms_api_error *e, ms_sbuf *out) {
    ms_sbuf_adds(out, "{\"error\":{\"message\":");
    ms_sbuf_add_json_str(out, e->message, strlen(e->message));
    ms_sbuf_adds(out, ",\"type\":");
    ms_sbuf_add_json_str(out, e->type, strlen(e->type));
    ms_sbuf_adds(out, ",\"param\":");
    if (e->param[0]) ms_sbuf_add_json_str(out, e->param, strlen(e->param));
    else ms_sbuf_adds(out, "null");
    ms_sbuf_adds(out, ",\"code\":");
    if (e->code[0]) ms_sbuf_add_json_str(out, e->code, strlen(e->code));
    else ms_sbuf_adds(out, "null");
    ms_sbuf_adds(out, "}}");
}

void ms_api_make_id(char *out, size_t cap, const char *prefix) {
    char id[32];
    ms_tool_call_id(id); /* "call_" + 24 hex */
    snprintf(out, cap, "%s%s", prefix, id + 5);
}

static const char *type_name(json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

#define WRONG_TYPE(e, field, v, want) \
    ms_api_fail(e, 400, BAD, field, NULL, "'%s' must be %s, not %s.", field, want, type_name(v))

/* Optional number field: returns 0 (absent/null: *out untouched) or an error status. */
static int get_num(json_t *o, const char *field, double lo, double hi, int lo_open, double *out,
                   ms_api_error *e) {
    json_t *v = json_object_get(o, field);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return WRONG_TYPE(e, field, v, "a number");
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi || (lo_open && d == lo))
        return ms_api_fail(e, 400, BAD, field, NULL, "'%s' is %g; it must be in %c%g, %g].", field, d,
                           lo_open ? '(' : '[', lo, hi);
    *out = d;
    return 0;
}

static int get_int(json_t *o, const char *field, long long lo, long long hi, long long *out,
                   ms_api_error *e) {
    json_t *v = json_object_get(o, field);
    if (!v || json_is_null(v)) return 0;
    long long x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
             fabs(json_real_value(v)) < 9e15)
        x = (long long)json_real_value(v);
    else return WRONG_TYPE(e, field, v, "an integer");
    if (x < lo || x > hi)
        return ms_api_fail(e, 400, BAD, field, NULL, "'%s' is %lld; it must be in [%lld, %lld].", field,
                           x, lo, hi);
    *out = x;
    return 0;
}

static int get_bool(json_t *o, const char *field, int *out, ms_api_error *e) {
    json_t *v = json_object_get(o, field);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return WRONG_TYPE(e, field, v, "a boolean");
    *out = json_is_true(v);
    return 0;
}

static int check_model(const ms_api_limits *lim, json_t *body, ms_api_error *e) {
    json_t *m = json_object_get(body, "model");
    if (!m || json_is_null(m)) return 0;
    if (!json_is_string(m)) return WRONG_TYPE(e, "model", m, "a string");
    const char *name = json_string_value(m);
    for (int i = 0; i < 8 && lim->model_names[i]; i++)
        if (!strcmp(name, lim->model_names[i])) return 0;
    return ms_api_fail(e, 404, BAD, "model", "model_not_found",
                       "The model '%s' does not exist; this server serves '%s'.", name,
                       lim->model_names[0] ? lim->model_names[0] : "");
}

static int valid_role(const char *r) {
    static const char *roles[] = {"system", "user", "assistant", "tool", "developer"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(r, roles[i])) return 1;
    return 0;
}

/* The limit in force: v, or def when v is 0 (unset), never above cap. */
static int limit_of(int v, int def, int cap) {
    int x = v > 0 ? v : def;
    return x > cap ? cap : x;
}

/* Validates messages and returns a deep copy in *out with tool-call arguments parsed. */
static int check_messages(const ms_api_limits *lim, json_t *msgs, json_t **out, ms_api_error *e) {
    char p[96];
    if (!msgs) return ms_api_fail(e, 400, BAD, "messages", NULL, "'messages' is required.");
    if (!json_is_array(msgs)) return WRONG_TYPE(e, "messages", msgs, "an array");
    if (json_array_size(msgs) == 0)
        return ms_api_fail(e, 400, BAD, "messages", NULL, "'messages' must not be empty.");
    int max_msgs = limit_of(lim->max_messages, MS_API_MAX_MESSAGES, 1 << 30);
    if (json_array_size(msgs) > (size_t)max_msgs)
        return ms_api_fail(e, 400, BAD, "messages", NULL,
                           "'messages' has %zu entries; this server allows at most %d (--max-messages).",
                           json_array_size(msgs), max_msgs);
    json_t *copy = json_deep_copy(msgs);
    size_t i;
    json_t *m;
    json_array_foreach(copy, i, m) {
        snprintf(p, sizeof p, "messages[%zu]", i);
        if (!json_is_object(m)) { WRONG_TYPE(e, p, m, "an object"); goto fail; }
        json_t *role = json_object_get(m, "role");
        snprintf(p, sizeof p, "messages[%zu].role", i);
        if (!json_is_string(role)) {
            if (!role) ms_api_fail(e, 400, BAD, p, NULL, "'%s' is required.", p);
            else WRONG_TYPE(e, p, role, "a string");
            goto fail;
        }
        const char *r = json_string_value(role);
        if (!valid_role(r)) {
            ms_api_fail(e, 400, BAD, p, NULL,
                        "'%s' is '%s'; it must be one of system, user, assistant, tool, developer.", p, r);
            goto fail;
        }
        int is_asst = !strcmp(r, "assistant");
        json_t *tcs = json_object_get(m, "tool_calls");
        json_t *content = json_object_get(m, "content");
        snprintf(p, sizeof p, "messages[%zu].content", i);
        if (!content || json_is_null(content)) {
            if (!is_asst) { ms_api_fail(e, 400, BAD, p, NULL, "'%s' is required for role '%s'.", p, r); goto fail; }
        } else if (json_is_array(content)) {
            size_t k;
            json_t *part;
            json_array_foreach(content, k, part) {
                snprintf(p, sizeof p, "messages[%zu].content[%zu]", i, k);
                json_t *ty = json_object_get(part, "type");
                if (!json_is_object(part) || !json_is_string(ty)) {
                    ms_api_fail(e, 400, BAD, p, NULL, "'%s' must be an object with a 'type'.", p);
                    goto fail;
                }
                if (strcmp(json_string_value(ty), "text") != 0) {
                    ms_api_fail(e, 400, BAD, p, NULL, "'%s' has type '%s'; only 'text' parts are supported.",
                                p, json_string_value(ty));
                    goto fail;
                }
                if (!json_is_string(json_object_get(part, "text"))) {
                    snprintf(p, sizeof p, "messages[%zu].content[%zu].text", i, k);
                    ms_api_fail(e, 400, BAD, p, NULL, "'%s' must be a string.", p);
                    goto fail;
                }
            }
        } else if (!json_is_string(content)) {
            WRONG_TYPE(e, p, content, "a string, an array of text parts or null");
            goto fail;
        }
        if (tcs && !json_is_null(tcs)) {
            snprintf(p, sizeof p, "messages[%zu].tool_calls", i);
            if (!is_asst || !json_is_array(tcs)) {
                ms_api_fail(e, 400, BAD, p, NULL, "'%s' must be an array on an assistant message.", p);
                goto fail;
            }
            size_t k;
            json_t *tc;
            json_array_foreach(tcs, k, tc) {
                json_t *fn = json_object_get(tc, "function");
                snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].function", i, k);
                if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name"))) {
                    ms_api_fail(e, 400, BAD, p, NULL, "'%s' must be an object with a string 'name'.", p);
                    goto fail;
                }
                json_t *args = json_object_get(fn, "arguments");
                if (json_is_string(args)) {
                    json_error_t je;
                    json_t *obj = json_loads(json_string_value(args), JSON_DECODE_ANY, &je);
                    if (!json_is_object(obj)) {
                        json_decref(obj);
                        snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].function.arguments", i, k);
                        ms_api_fail(e, 400, BAD, p, NULL, "'%s' must be a JSON object string.", p);
                        goto fail;
                    }
                    json_object_set_new(fn, "arguments", obj);
                }
            }
        }
    }
    *out = copy;
    return 0;
fail:
    json_decref(copy);
    return e->status;
}

static int check_tools(const ms_api_limits *lim, json_t *tools, ms_api_error *e) {
    if (!json_is_array(tools)) return WRONG_TYPE(e, "tools", tools, "an array");
    int max_tools = limit_of(lim->max_tools, MS_API_MAX_TOOLS, 1 << 30);
    if (json_array_size(tools) > (size_t)max_tools)
        return ms_api_fail(e, 400, BAD, "tools", NULL,
                           "'tools' has %zu entries; this server allows at most %d (--max-tools).",
                           json_array_size(tools), max_tools);
    size_t i;
    json_t *t;
    char p[64];
    json_array_foreach(tools, i, t) {
        snprintf(p, sizeof p, "tools[%zu]", i);
        json_t *fn = json_object_get(t, "function");
        const char *ty = json_string_value(json_object_get(t, "type"));
        if (!json_is_object(t) || !ty || strcmp(ty, "function") || !json_is_object(fn))
            return ms_api_fail(e, 400, BAD, p, NULL, "'%s' must be {\"type\": \"function\", \"function\": {...}}.", p);
        snprintf(p, sizeof p, "tools[%zu].function.name", i);
        const char *nm = json_string_value(json_object_get(fn, "name"));
        if (!nm || !nm[0]) return ms_api_fail(e, 400, BAD, p, NULL, "'%s' must be a non-empty string.", p);
        json_t *params = json_object_get(fn, "parameters");
        snprintf(p, sizeof p, "tools[%zu].function.parameters", i);
        if (params && !json_is_null(params) && !json_is_object(params))
            return WRONG_TYPE(e, p, params, "an object");
    }
    return 0;
}

static int tool_exists(json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *nm = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (nm && !strcmp(nm, name)) return 1;
    }
    return 0;
}

/* One stop string: longer than the limit is refused (param = its path, "stop" or "stop[i]"). */
static int add_stop(json_t *x, const char *param, int max_len, ms_api_req *r, ms_api_error *e) {
    size_t len = json_string_length(x);
    if (len > (size_t)max_len)
        return ms_api_fail(e, 400, BAD, param, NULL,
                           "'%s' is %zu bytes long; this server allows at most %d (--max-stop-length).", param,
                           len, max_len);
    if (len) r->stop[r->n_stop++] = json_string_value(x);
    return 0;
}

static int parse_stop(const ms_api_limits *lim, json_t *body, ms_api_req *r, ms_api_error *e) {
    json_t *s = json_object_get(body, "stop");
    int max_stop = limit_of(lim->max_stop, MS_MAX_STOP_STRINGS, MS_MAX_STOP_STRINGS);
    int max_len = limit_of(lim->max_stop_len, MS_API_MAX_STOP_LEN, 1 << 30);
    if (!s || json_is_null(s)) return 0;
    if (json_is_string(s)) return add_stop(s, "stop", max_len, r, e);
    if (!json_is_array(s)) return WRONG_TYPE(e, "stop", s, "a string or an array of strings");
    if (json_array_size(s) > (size_t)max_stop)
        return ms_api_fail(e, 400, BAD, "stop", NULL,
                           "'stop' has %zu entries; this server allows at most %d (--max-stop-strings).",
                           json_array_size(s), max_stop);
    size_t i;
    json_t *x;
    json_array_foreach(s, i, x) {
        char p[32];
        snprintf(p, sizeof p, "stop[%zu]", i);
        if (!json_is_string(x)) return WRONG_TYPE(e, p, x, "a string");
        MS_TRY(add_stop(x, p, max_len, r, e));
    }
    return 0;
}

static int parse_ids(json_t *arr, const char *param, int vocab, int32_t **ids, int *n, ms_api_error *e) {
    size_t k = json_array_size(arr);
    *ids = malloc((k ? k : 1) * sizeof **ids);
    *n = 0;
    size_t i;
    json_t *x;
    json_array_foreach(arr, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || (vocab > 0 && json_integer_value(x) >= vocab)) {
            free(*ids);
            *ids = NULL;
            return ms_api_fail(e, 400, BAD, param, NULL, "'%s[%zu]' must be a token id in [0, %d).", param, i,
                               vocab);
        }
        (*ids)[(*n)++] = (int32_t)json_integer_value(x);
    }
    return 0;
}

static int parse_prompt(const ms_api_limits *lim, json_t *body, ms_api_req *r, ms_api_error *e) {
    json_t *p = json_object_get(body, "prompt");
    if (!p || json_is_null(p)) return ms_api_fail(e, 400, BAD, "prompt", NULL, "'prompt' is required.");
    if (json_is_string(p)) {
        r->prompts[0].text = strdup(json_string_value(p));
        r->n_prompts = 1;
        return 0;
    }
    if (!json_is_array(p) || json_array_size(p) == 0)
        return ms_api_fail(e, 400, BAD, "prompt", NULL,
                           "'prompt' must be a string, a non-empty array of strings, or token ids.");
    json_t *first = json_array_get(p, 0);
    if (json_is_integer(first)) {
        r->n_prompts = 1;
        return parse_ids(p, "prompt", lim->vocab_size, &r->prompts[0].ids, &r->prompts[0].n_ids, e);
    }
    if (json_array_size(p) > MS_API_MAX_PROMPTS)
        return ms_api_fail(e, 400, BAD, "prompt", NULL, "'prompt' has more than %d entries.", MS_API_MAX_PROMPTS);
    size_t i;
    json_t *x;
    json_array_foreach(p, i, x) {
        char pp[32];
        snprintf(pp, sizeof pp, "prompt[%zu]", i);
        if (json_is_string(x)) {
            r->prompts[r->n_prompts++].text = strdup(json_string_value(x));
        } else if (json_is_array(x) && json_array_size(x) > 0) {
            ms_api_prompt *q = &r->prompts[r->n_prompts++];
            MS_TRY(parse_ids(x, pp, lim->vocab_size, &q->ids, &q->n_ids, e));
        } else {
            return WRONG_TYPE(e, pp, x, "a string or a non-empty array of token ids");
        }
    }
    return 0;
}

/* logit_bias: {"token id": bias in [-100, 100], ...}, at most MS_MAX_LOGIT_BIAS entries. */
static int parse_logit_bias(json_t *b, int vocab, ms_sampling *sp, ms_api_error *e) {
    json_t *lb = json_object_get(b, "logit_bias");
    if (!lb || json_is_null(lb)) return 0;
    if (!json_is_object(lb)) return WRONG_TYPE(e, "logit_bias", lb, "an object mapping token ids to numbers");
    if (json_object_size(lb) > MS_MAX_LOGIT_BIAS)
        return ms_api_fail(e, 400, BAD, "logit_bias", NULL, "'logit_bias' has %zu entries; at most %d are allowed.",
                           json_object_size(lb), MS_MAX_LOGIT_BIAS);
    const char *k;
    json_t *v;
    json_object_foreach(lb, k, v) {
        char *end;
        long long id = strtoll(k, &end, 10);
        if (!*k || *end || id < 0 || (vocab > 0 && id >= vocab))
            return ms_api_fail(e, 400, BAD, "logit_bias", NULL, "'logit_bias' key '%.40s' is not a token id in [0, %d).", k,
                               vocab);
        if (!json_is_number(v)) return WRONG_TYPE(e, "logit_bias", v, "a number for each token id");
        double d = json_number_value(v);
        if (!isfinite(d) || d < -100 || d > 100)
            return ms_api_fail(e, 400, BAD, "logit_bias", NULL, "'logit_bias' of token %lld is %g; it must be in [-100, 100].",
                               id, d);
        sp->bias_ids[sp->n_logit_bias] = (int32_t)id;
        sp->bias_vals[sp->n_logit_bias++] = (float)d;
    }
    return 0;
}

/* Fields of the OpenAI API this server does not implement: refused with a 400 naming them rather
 * than accepted and ignored (a client relying on them would get silently different output). */
static int refuse_unimplemented(json_t *b, ms_api_error *e) {
    static const char *const never[] = {"suffix", "functions", "function_call", "prediction", "audio"};
    for (size_t i = 0; i < sizeof never / sizeof *never; i++) {
        json_t *v = json_object_get(b, never[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && !json_string_length(v)))
            return ms_api_fail(e, 400, BAD, never[i], NULL, "'%s' is not supported by this server.", never[i]);
    }
    json_t *bo = json_object_get(b, "best_of");
    if (bo && !json_is_null(bo) && !(json_is_integer(bo) && json_integer_value(bo) == 1))
        return ms_api_fail(e, 400, BAD, "best_of", NULL, "'best_of' other than 1 is not supported by this server.");
    json_t *mo = json_object_get(b, "modalities");
    if (mo && !json_is_null(mo)) {
        size_t i;
        json_t *m;
        if (!json_is_array(mo)) return WRONG_TYPE(e, "modalities", mo, "an array");
        json_array_foreach(mo, i, m) {
            if (!json_is_string(m) || strcmp(json_string_value(m), "text"))
                return ms_api_fail(e, 400, BAD, "modalities", NULL, "'modalities' other than [\"text\"] is not supported by this server.");
        }
    }
    return 0;
}

/* response_format, and SGLang's regex / ebnf: at most one of them constrains the output. */
static int parse_structured(json_t *b, ms_api_req *r, ms_api_error *e) {
    r->rf_type = MS_RF_TEXT;
    json_t *rf = json_object_get(b, "response_format");
    if (rf && !json_is_null(rf)) {
        if (!json_is_object(rf)) return WRONG_TYPE(e, "response_format", rf, "an object");
        const char *t = json_string_value(json_object_get(rf, "type"));
        if (!t) return ms_api_fail(e, 400, BAD, "response_format.type", NULL, "'response_format.type' is required.");
        if (!strcmp(t, "json_object")) {
            r->rf_type = MS_RF_JSON_OBJECT;
        } else if (!strcmp(t, "json_schema")) {
            json_t *js = json_object_get(rf, "json_schema");
            if (!json_is_object(js))
                return ms_api_fail(e, 400, BAD, "response_format.json_schema", NULL,
                                   "'response_format.json_schema' must be an object with 'name' and 'schema'.");
            json_t *nm = json_object_get(js, "name");
            if (nm && !json_is_string(nm)) return WRONG_TYPE(e, "response_format.json_schema.name", nm, "a string");
            json_t *sc = json_object_get(js, "schema");
            if (!sc) sc = json_object_get(js, "schema_"); /* some clients */
            if (sc && !json_is_object(sc) && !json_is_boolean(sc))
                return WRONG_TYPE(e, "response_format.json_schema.schema", sc, "an object");
            r->rf_type = MS_RF_JSON_SCHEMA;
            r->rf_schema = sc; /* NULL: any JSON object */
        } else if (strcmp(t, "text")) {
            return ms_api_fail(e, 400, BAD, "response_format.type", NULL,
                               "'response_format.type' is '%s'; it must be text, json_object or json_schema.", t);
        }
    }
    int n = r->rf_type != MS_RF_TEXT;
    const char *names[2] = {"regex", "ebnf"};
    const char **dst[2] = {&r->regex, &r->ebnf};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(b, names[i]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_string(v)) return WRONG_TYPE(e, names[i], v, "a string");
        *dst[i] = json_string_value(v);
        n++;
    }
    if (n > 1)
        return ms_api_fail(e, 400, BAD, r->ebnf ? "ebnf" : "regex", NULL,
                           "Only one of 'response_format' (json), 'regex' and 'ebnf' may be given.");
    return 0;
}

int ms_api_parse(const ms_api_limits *lim, int is_chat, const char *body, size_t len, ms_api_req *r,
                 ms_api_error *e) {
    memset(r, 0, sizeof *r);
    r->is_chat = is_chat;
    json_error_t je;
    json_t *b = json_loadb(body, len, 0, &je);
    if (!b)
        return ms_api_fail(e, 400, BAD, NULL, NULL,
                           "The request body is not valid JSON (or not valid UTF-8): %s at line %d column %d.",
                           je.text, je.line, je.column);
    r->body = b;
    if (!json_is_object(b)) return ms_api_fail(e, 400, BAD, NULL, NULL, "The request body must be a JSON object.");
    MS_TRY(check_model(lim, b, e));

    ms_sampling *sp = &r->sp;
    memset(sp, 0, sizeof *sp);
    sp->temperature = lim->default_temperature;
    sp->top_p = lim->default_top_p;
    sp->top_k = lim->default_top_k;
    sp->repetition_penalty = 1.0f;
    sp->max_tokens = -1;

    double d;
    long long x;
    int bv;
    d = sp->temperature;
    MS_TRY(get_num(b, "temperature", 0, 2, 0, &d, e));
    sp->temperature = (float)d;
    d = sp->top_p;
    MS_TRY(get_num(b, "top_p", 0, 1, 1, &d, e));
    sp->top_p = (float)d;
    x = sp->top_k;
    MS_TRY(get_int(b, "top_k", -1, 1 << 30, &x, e));
    sp->top_k = x <= 0 ? 0 : (int)x;
    d = 0;
    MS_TRY(get_num(b, "min_p", 0, 1, 0, &d, e));
    sp->min_p = (float)d;
    d = 0;
    MS_TRY(get_num(b, "presence_penalty", -2, 2, 0, &d, e));
    sp->presence_penalty = (float)d;
    d = 0;
    MS_TRY(get_num(b, "frequency_penalty", -2, 2, 0, &d, e));
    sp->frequency_penalty = (float)d;
    d = 1;
    MS_TRY(get_num(b, "repetition_penalty", 0, 2, 1, &d, e));
    sp->repetition_penalty = (float)d;
    json_t *seed = json_object_get(b, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) return WRONG_TYPE(e, "seed", seed, "an integer");
        sp->has_seed = 1;
        sp->seed = (uint64_t)json_integer_value(seed);
    }
    int ctx = lim->context_length > 0 ? lim->context_length : 1 << 30;
    x = -1;
    MS_TRY(get_int(b, "max_tokens", 1, ctx, &x, e));
    MS_TRY(get_int(b, "max_completion_tokens", 1, ctx, &x, e));
    sp->max_tokens = (int)x;
    x = 1;
    int max_n = limit_of(lim->max_n, MS_API_MAX_N, 512);
    MS_TRY(get_int(b, "n", 1, 1 << 30, &x, e));
    if (x > max_n)
        return ms_api_fail(e, 400, BAD, "n", NULL, "'n' is %lld; this server allows at most %d (--max-n).", x, max_n);
    r->n = (int)x;
    bv = 0;
    MS_TRY(get_bool(b, "ignore_eos", &bv, e));
    sp->ignore_eos = bv;
    MS_TRY(get_bool(b, "stream", &r->stream, e));
    json_t *so = json_object_get(b, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return WRONG_TYPE(e, "stream_options", so, "an object");
        json_t *iu = json_object_get(so, "include_usage");
        if (iu && !json_is_null(iu)) {
            if (!json_is_boolean(iu)) return WRONG_TYPE(e, "stream_options.include_usage", iu, "a boolean");
            r->include_usage = json_is_true(iu);
        }
    }
    MS_TRY(parse_stop(lim, b, r, e));
    json_t *sti = json_object_get(b, "stop_token_ids");
    if (sti && !json_is_null(sti)) {
        if (!json_is_array(sti)) return WRONG_TYPE(e, "stop_token_ids", sti, "an array of integers");
        if (json_array_size(sti) > MS_MAX_STOP_IDS / 2)
            return ms_api_fail(e, 400, BAD, "stop_token_ids", NULL, "'stop_token_ids' has more than %d entries.",
                               MS_MAX_STOP_IDS / 2);
        int32_t *ids;
        int n;
        MS_TRY(parse_ids(sti, "stop_token_ids", lim->vocab_size, &ids, &n, e));
        for (int i = 0; i < n; i++) sp->stop_ids[sp->n_stop_ids++] = ids[i];
        free(ids);
    }
    x = 0;
    MS_TRY(get_int(b, "min_tokens", 0, ctx, &x, e));
    sp->min_tokens = (int)x;
    if (sp->max_tokens > 0 && sp->min_tokens > sp->max_tokens)
        return ms_api_fail(e, 400, BAD, "min_tokens", NULL, "'min_tokens' (%d) must not exceed 'max_tokens' (%d).",
                           sp->min_tokens, sp->max_tokens);
    MS_TRY(parse_logit_bias(b, lim->vocab_size, sp, e));
    MS_TRY(refuse_unimplemented(b, e));
    /* logprobs: chat = boolean + top_logprobs; completions = integer count */
    json_t *lp = json_object_get(b, "logprobs");
    if (is_chat) {
        MS_TRY(get_bool(b, "logprobs", &r->logprobs, e));
        x = 0;
        MS_TRY(get_int(b, "top_logprobs", 0, MS_MAX_TOP_LOGPROBS, &x, e));
        r->top_logprobs = (int)x;
        if (r->top_logprobs > 0 && !r->logprobs)
            return ms_api_fail(e, 400, BAD, "top_logprobs", NULL, "'top_logprobs' requires 'logprobs': true.");
    } else if (lp && !json_is_null(lp)) {
        x = 0;
        MS_TRY(get_int(b, "logprobs", 0, MS_MAX_TOP_LOGPROBS, &x, e));
        r->logprobs = 1;
        r->top_logprobs = (int)x;
    }
    sp->logprobs = r->logprobs;
    sp->top_logprobs = r->top_logprobs;
    MS_TRY(parse_structured(b, r, e));
    int echo = 0;
    MS_TRY(get_bool(b, "echo", &echo, e));
    if (echo) return ms_api_fail(e, 400, BAD, "echo", NULL, "'echo' is not supported by this server.");
    r->separate_reasoning = 1;
    r->skip_special_tokens = 1;
    MS_TRY(get_bool(b, "separate_reasoning", &r->separate_reasoning, e));
    MS_TRY(get_bool(b, "skip_special_tokens", &r->skip_special_tokens, e));

    if (!is_chat) return parse_prompt(lim, b, r, e);

    MS_TRY(check_messages(lim, json_object_get(b, "messages"), &r->messages, e));
    json_t *kw = json_object_get(b, "chat_template_kwargs");
    if (kw && !json_is_null(kw) && !json_is_object(kw))
        return WRONG_TYPE(e, "chat_template_kwargs", kw, "an object");
    r->kwargs = json_is_object(kw) ? json_deep_copy(kw) : json_object();
    r->enable_thinking = lim->enable_thinking_default;
    json_t *et = json_object_get(r->kwargs, "enable_thinking");
    if (et && !json_is_null(et)) {
        if (!json_is_boolean(et)) return WRONG_TYPE(e, "chat_template_kwargs.enable_thinking", et, "a boolean");
        r->enable_thinking = json_is_true(et);
    } else if (!lim->enable_thinking_default) {
        json_object_set_new(r->kwargs, "enable_thinking", json_false());
    }
    json_t *tools = json_object_get(b, "tools");
    if (tools && !json_is_null(tools)) {
        MS_TRY(check_tools(lim, tools, e));
        if (json_array_size(tools)) r->tools = tools;
    }
    json_t *tc = json_object_get(b, "tool_choice");
    r->tool_choice = MS_TOOLCHOICE_AUTO;
    if (tc && !json_is_null(tc)) {
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (!strcmp(s, "none")) r->tool_choice = MS_TOOLCHOICE_NONE;
            else if (!strcmp(s, "auto")) r->tool_choice = MS_TOOLCHOICE_AUTO;
            else if (!strcmp(s, "required")) r->tool_choice = MS_TOOLCHOICE_REQUIRED;
            else return ms_api_fail(e, 400, BAD, "tool_choice", NULL,
                                    "'tool_choice' is '%s'; it must be none, auto, required or {\"type\": \"function\", ...}.", s);
        } else if (json_is_object(tc)) {
            const char *nm = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
            if (!nm) return ms_api_fail(e, 400, BAD, "tool_choice", NULL, "'tool_choice.function.name' is required.");
            if (!r->tools || !tool_exists(r->tools, nm))
                return ms_api_fail(e, 400, BAD, "tool_choice", NULL, "'tool_choice' names '%s', which is not in 'tools'.", nm);
            r->tool_choice = MS_TOOLCHOICE_NAMED;
            r->tool_choice_name = nm;
        } else {
            return WRONG_TYPE(e, "tool_choice", tc, "a string or an object");
        }
        if (r->tool_choice == MS_TOOLCHOICE_REQUIRED && !r->tools)
            return ms_api_fail(e, 400, BAD, "tool_choice", NULL, "'tool_choice' is 'required' but no 'tools' were given.");
    }
    if (r->tool_choice == MS_TOOLCHOICE_NONE) r->tools = NULL;
    return 0;
}

void ms_api_req_free(ms_api_req *r) {
    for (int i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    json_decref(r->messages);
    json_decref(r->kwargs);
    json_decref(r->body);
    memset(r, 0, sizeof *r);
}
