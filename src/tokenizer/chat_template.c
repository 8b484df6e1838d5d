/* chat_template.c - the public face of the template engine (see chat_template.h): compile once,
 * render many times from any thread, plus the context assembly transformers' apply_chat_template
 * does (messages, tools=None when absent, add_generation_prompt, special tokens, then kwargs). */
#include "tokenizer/chat_template.h"

#include "core/fileutil.h"
#include "tokenizer/jinja.h"

#include <stdlib.h>
#include <string.h>

#define MAX_TEMPLATE_BYTES (16u << 20)

struct ms_template {
    jj_program prog;
};

int ms_template_compile(const char *src, size_t len, ms_template **out, ms_err *err) {
    *out = NULL;
    if (!src) return ms_errf(err, MS_ERR_INVALID, "chat template: no source given");
    if (len > MAX_TEMPLATE_BYTES)
        return ms_errf(err, MS_ERR_INVALID, "chat template: %zu bytes exceeds the %u byte limit", len, MAX_TEMPLATE_BYTES);
    ms_template *t = calloc(1, sizeof *t);
    if (!t) return ms_errf(err, MS_ERR_NOMEM, "chat template: out of memory");
    jj_tok *toks = NULL;
    int ntok = 0;
    int rc = jj_lex(&t->prog.arena, src, len, &toks, &ntok, err);
    if (!rc) rc = jj_parse(&t->prog.arena, toks, ntok, &t->prog.body, &t->prog.n, err);
    free(toks);
    if (rc) {
        ms_template_free(t);
        return rc;
    }
    *out = t;
    return MS_OK;
}

void ms_template_free(ms_template *t) {
    if (!t) return;
    jj_arena_free(&t->prog.arena);
    free(t);
}

ms_template_limits ms_template_default_limits(void) {
    ms_template_limits l = {32u << 20, 256u << 20, 2000000, 100};
    return l;
}

int ms_template_render_ex(const ms_template *t, json_t *context, const ms_template_limits *lim, char **out,
                          size_t *len, ms_err *err) {
    *out = NULL;
    if (len) *len = 0;
    if (!t) return ms_errf(err, MS_ERR_INVALID, "chat template: no template");
    if (context && !json_is_object(context))
        return ms_errf(err, MS_ERR_INVALID, "chat template: the context must be a JSON object");
    ms_template_limits d = ms_template_default_limits();
    if (!lim) lim = &d;
    jj_limits jl = {lim->max_output, lim->max_memory, lim->max_steps, lim->max_depth};
    return jj_render(&t->prog, context, &jl, out, len, err);
}

int ms_template_render(const ms_template *t, json_t *context, char **out, size_t *len, ms_err *err) {
    return ms_template_render_ex(t, context, NULL, out, len, err);
}

int ms_chat_render(const ms_template *t, json_t *messages, json_t *tools, int add_generation_prompt,
                   json_t *kwargs, const char *bos_token, const char *eos_token, char **out,
                   size_t *len, ms_err *err) {
    *out = NULL;
    if (kwargs && !json_is_object(kwargs))
        return ms_errf(err, MS_ERR_INVALID, "chat_template_kwargs: must be a JSON object");
    json_t *ctx = json_object();
    if (!ctx) return ms_errf(err, MS_ERR_NOMEM, "chat template: out of memory");
    int bad = json_object_set_new(ctx, "messages", messages ? json_incref(messages) : json_array());
    bad |= json_object_set_new(ctx, "tools", tools ? json_incref(tools) : json_null());
    bad |= json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt));
    if (bos_token) bad |= json_object_set_new(ctx, "bos_token", json_string(bos_token));
    if (eos_token) bad |= json_object_set_new(ctx, "eos_token", json_string(eos_token));
    if (kwargs) bad |= json_object_update(ctx, kwargs);
    if (bad) {
        json_decref(ctx);
        return ms_errf(err, MS_ERR_INVALID, "chat template: could not build the context (invalid UTF-8 in a token?)");
    }
    int rc = ms_template_render(t, ctx, out, len, err);
    json_decref(ctx);
    return rc;
}

int ms_chat_parse_tool_arguments(json_t *messages) {
    int n = 0;
    size_t i;
    json_t *m;
    if (!json_is_array(messages)) return 0;
    json_array_foreach(messages, i, m) {
        json_t *calls = json_object_get(m, "tool_calls");
        size_t j;
        json_t *c;
        if (!json_is_array(calls)) continue;
        json_array_foreach(calls, j, c) {
            json_t *fn = json_object_get(c, "function");
            json_t *args = fn ? json_object_get(fn, "arguments") : NULL;
            if (!json_is_string(args)) continue;
            json_t *parsed = json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY, NULL);
            if (json_is_object(parsed)) {
                json_object_set_new(fn, "arguments", parsed);
                n++;
            } else {
                json_decref(parsed);
            }
        }
    }
    return n;
}

/* "tok" or {"content": "tok", ...} -> malloc'd copy; NULL when absent or null. */
static char *token_string(json_t *v) {
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return NULL;
    return strdup(json_string_value(v));
}

int ms_chat_template_load(const char *dir, char **src, char **bos, char **eos, ms_err *err) {
    *src = NULL;
    if (bos) *bos = NULL;
    if (eos) *eos = NULL;
    char path[4096];
    json_t *cfg = NULL;
    if (ms_path_join(path, sizeof path, dir, "tokenizer_config.json"))
        return ms_errf(err, MS_ERR_INVALID, "%s: path too long", dir);
    if (ms_path_exists(path)) {
        json_error_t je;
        cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
        if (!cfg) return ms_errf(err, MS_ERR_FORMAT, "%s:%d: %s", path, je.line, je.text);
        if (!json_is_object(cfg)) {
            json_decref(cfg);
            return ms_errf(err, MS_ERR_FORMAT, "%s: not a JSON object", path);
        }
    }
    char jpath[4096];
    if (ms_path_join(jpath, sizeof jpath, dir, "chat_template.jinja")) {
        json_decref(cfg);
        return ms_errf(err, MS_ERR_INVALID, "%s: path too long", dir);
    }
    int rc = MS_OK;
    if (ms_path_exists(jpath)) {
        rc = ms_read_file(jpath, MAX_TEMPLATE_BYTES, src, NULL, err);
    } else if (!cfg) {
        rc = ms_errf(err, MS_ERR_NOT_FOUND, "%s: neither chat_template.jinja nor tokenizer_config.json exists", dir);
    } else {
        json_t *ct = json_object_get(cfg, "chat_template");
        const char *s = NULL;
        if (json_is_string(ct)) {
            s = json_string_value(ct);
        } else if (json_is_array(ct)) {
            size_t i;
            json_t *e;
            json_array_foreach(ct, i, e) {
                const char *name = json_string_value(json_object_get(e, "name"));
                if (name && !strcmp(name, "default")) s = json_string_value(json_object_get(e, "template"));
            }
            if (!s)
                rc = ms_errf(err, MS_ERR_NOT_FOUND, "%s: field chat_template lists no template named \"default\"", path);
        } else {
            rc = ms_errf(err, MS_ERR_NOT_FOUND, "%s: field chat_template is missing (and no chat_template.jinja)", path);
        }
        if (s) {
            *src = strdup(s);
            if (!*src) rc = ms_errf(err, MS_ERR_NOMEM, "%s: out of memory", path);
        }
    }
    if (!rc && cfg) {
        if (bos) *bos = token_string(json_object_get(cfg, "bos_token"));
        if (eos) *eos = token_string(json_object_get(cfg, "eos_token"));
    }
    json_decref(cfg);
    if (rc) {
        free(*src);
        *src = NULL;
    }
    return rc;
}
