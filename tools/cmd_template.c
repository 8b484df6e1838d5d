/* cmd_template.c - `moeserve template`: renders a model's chat template for a conversation, exactly
 * as the server would build its prompt, so templates can be checked byte for byte against
 * transformers / @huggingface/jinja. Independent of the tokenizer: it reads tokenizer_config.json
 * and chat_template.jinja directly.
 *
 *   moeserve template --model DIR --messages FILE [--add-generation-prompt] [--kwargs JSON]
 *
 * FILE holds a JSON array of messages or {"messages": [...], "tools": [...]}. The rendering goes to
 * stdout with no added newline. Hidden flags for tests: --template FILE (use this template source
 * instead of DIR's), --jsonl (read JSON lines {"messages","tools","add_generation_prompt","kwargs"}
 * from stdin, write one line {"text": ...} or {"error": ...} per input; a line may carry its own
 * "template" source, and then --model/--template are optional). */
#include "common/args.h"
#include "common/model_path.h"
#include "core/fileutil.h"
#include "tokenizer/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MESSAGES_BYTES (256u << 20)

static const ms_opt template_opts[] = {
    {"model", "model-path", MS_OPT_VALUE, "DIR|ORG/NAME", "tokenizer directory (tokenizer_config.json / chat_template.jinja)\nor Hugging Face repo id"},
    {"revision", NULL, MS_OPT_VALUE, "REV", "Hugging Face branch, tag or commit of a repo id [main]"},
    {"template", NULL, MS_OPT_VALUE, "FILE", "Jinja template file instead of the model's"},
    {"messages", NULL, MS_OPT_VALUE, "FILE", "JSON: a list of messages, or {messages, tools, ...}"},
    {"kwargs", NULL, MS_OPT_VALUE, "JSON", "extra template variables, e.g. '{\"enable_thinking\":false}'"},
    {"add-generation-prompt", NULL, MS_OPT_BOOL, NULL, "end with the assistant turn's opening"},
    {"jsonl", NULL, MS_OPT_BOOL, NULL, "read one JSON request per stdin line, print one rendering per line"},
    MS_OPT_END,
};

static const ms_cmd template_cmd = {
    "template", "--model DIR --messages FILE [--add-generation-prompt] [--kwargs JSON]",
    "Prints the chat template's rendering exactly, with no added newline.",
    {template_opts, NULL},
};

/* Splits a messages document into messages and tools (borrowed references into doc). */
static int split_doc(json_t *doc, json_t **messages, json_t **tools, const char *what, ms_err *err) {
    *tools = NULL;
    if (json_is_array(doc)) {
        *messages = doc;
        return 0;
    }
    if (!json_is_object(doc))
        return ms_errf(err, MS_ERR_FORMAT, "%s: expected a JSON array of messages or an object with \"messages\"", what);
    *messages = json_object_get(doc, "messages");
    if (!json_is_array(*messages)) return ms_errf(err, MS_ERR_FORMAT, "%s: field \"messages\" must be an array", what);
    json_t *t = json_object_get(doc, "tools");
    if (t && !json_is_null(t)) {
        if (!json_is_array(t)) return ms_errf(err, MS_ERR_FORMAT, "%s: field \"tools\" must be an array", what);
        *tools = t;
    }
    return 0;
}

/* Parses messages/kwargs JSON keeping 1 and 1.0 apart (templates print them differently, as
 * Python's json.loads does); only a document with an integer beyond 64 bits reads every integer
 * as a double. */
static json_t *load_json(const char *text, size_t len, json_error_t *je) {
    json_t *j = json_loadb(text, len, JSON_ALLOW_NUL, je);
    if (!j) j = json_loadb(text, len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, je);
    return j;
}

static int run_jsonl(const ms_template *t, const char *bos, const char *eos) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        lineno++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (n == 0) continue;
        ms_err err = {0};
        json_error_t je;
        json_t *res = NULL;
        json_t *in = load_json(line, (size_t)n, &je);
        if (!in) {
            ms_errf(&err, MS_ERR_FORMAT, "stdin line %ld: %s", lineno, je.text);
        } else {
            json_t *messages, *tools, *kwargs = json_object_get(in, "kwargs");
            char what[64];
            snprintf(what, sizeof what, "stdin line %ld", lineno);
            json_t *tsrc = json_object_get(in, "template");
            ms_template *own = NULL;
            const ms_template *use = t;
            if (json_is_string(tsrc)) {
                if (ms_template_compile(json_string_value(tsrc), json_string_length(tsrc), &own, &err)) use = NULL;
                else use = own;
            } else if (!t) {
                ms_errf(&err, MS_ERR_INVALID, "%s: no template (give --model/--template or a \"template\" field)", what);
                use = NULL;
            }
            if (use && !split_doc(in, &messages, &tools, what, &err)) {
                int agp = json_is_true(json_object_get(in, "add_generation_prompt"));
                if (kwargs && json_is_null(kwargs)) kwargs = NULL;
                char *out = NULL;
                size_t len = 0;
                if (!ms_chat_render(use, messages, tools, agp, kwargs, bos, eos, &out, &len, &err)) {
                    json_t *s = json_stringn(out, len);
                    if (s) res = json_pack("{s:o}", "text", s);
                    else ms_errf(&err, MS_ERR_FORMAT, "%s: rendering is not valid UTF-8", what);
                }
                free(out);
            }
            ms_template_free(own);
            json_decref(in);
        }
        if (!res) res = json_pack("{s:s}", "error", err.msg[0] ? err.msg : "unknown error");
        char *s = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII);
        json_decref(res);
        if (!s) {
            fprintf(stderr, "moeserve template: out of memory\n");
            free(line);
            return 1;
        }
        fputs(s, stdout);
        fputc('\n', stdout);
        free(s);
    }
    free(line);
    fflush(stdout);
    return 0;
}

int cmd_template(int argc, char **argv) {
    ms_args a;
    int prc = ms_args_parse(&a, &template_cmd, argc, argv);
    if (prc) return ms_args_exit(prc);
    const char *model = ms_args_str(&a, "model", NULL);
    const char *tpath = ms_args_str(&a, "template", NULL);
    const char *mpath = ms_args_str(&a, "messages", NULL);
    const char *kwjson = ms_args_str(&a, "kwargs", NULL);
    int agp = ms_args_flag(&a, "add-generation-prompt");
    int jsonl = ms_args_flag(&a, "jsonl");
    int rc = 2; /* a flag at fault until the template loads */
    char *src = NULL, *bos = NULL, *eos = NULL;
    ms_template *t = NULL;
    json_t *doc = NULL, *kwargs = NULL;
    ms_err err = {0};
    if (!model && !tpath && !jsonl) {
        fprintf(stderr, "moeserve template: flag --model is required (see --help)\n");
        goto out;
    }
    if (!jsonl && !mpath) {
        fprintf(stderr, "moeserve template: flag --messages is required (see --help)\n");
        goto out;
    }
    char dir[4096];
    if (model && ms_model_path_resolve("template", "model", model, ms_args_str(&a, "revision", NULL), 0, dir, sizeof dir))
        goto out;
    if (model) model = dir;
    rc = 1;
    if (model && ms_chat_template_load(model, &src, &bos, &eos, &err) && !tpath) {
        fprintf(stderr, "moeserve template: --model %s: %s\n", model, err.msg);
        goto out;
    }
    if (tpath) {
        free(src);
        src = NULL;
        if (ms_read_file(tpath, 16u << 20, &src, NULL, &err)) {
            fprintf(stderr, "moeserve template: --template: %s\n", err.msg);
            goto out;
        }
    }
    if (src && ms_template_compile(src, strlen(src), &t, &err)) {
        fprintf(stderr, "moeserve template: %s: %s\n", tpath ? tpath : model, err.msg);
        goto out;
    }
    if (jsonl) {
        rc = run_jsonl(t, bos, eos);
        goto out;
    }
    if (kwjson) {
        json_error_t je;
        kwargs = json_loads(kwjson, 0, &je);
        if (!json_is_object(kwargs)) {
            fprintf(stderr, "moeserve template: flag --kwargs: not a JSON object (%s)\n", kwargs ? "wrong type" : je.text);
            goto out;
        }
    }
    char *text = NULL;
    size_t len = 0;
    if (ms_read_file(mpath, MAX_MESSAGES_BYTES, &text, &len, &err)) {
        fprintf(stderr, "moeserve template: --messages: %s\n", err.msg);
        goto out;
    }
    json_error_t je;
    doc = load_json(text, len, &je);
    free(text);
    if (!doc) {
        fprintf(stderr, "moeserve template: %s:%d: %s\n", mpath, je.line, je.text);
        goto out;
    }
    json_t *messages, *tools;
    if (split_doc(doc, &messages, &tools, mpath, &err)) {
        fprintf(stderr, "moeserve template: %s\n", err.msg);
        goto out;
    }
    char *res = NULL;
    if (ms_chat_render(t, messages, tools, agp, kwargs, bos, eos, &res, &len, &err)) {
        fprintf(stderr, "moeserve template: %s\n", err.msg);
        goto out;
    }
    fwrite(res, 1, len, stdout);
    fflush(stdout);
    free(res);
    rc = 0;
out:
    ms_template_free(t);
    json_decref(doc);
    json_decref(kwargs);
    free(src);
    free(bos);
    free(eos);
    ms_args_free(&a);
    return rc;
}
