/* structured.c - which grammar constrains a request's output: response_format (json_object /
 * json_schema), SGLang's regex and ebnf fields, and tool_choice (required / a named function: a
 * valid call in the model's tool-call format; none: no tool-call tag in the content).
 *
 * Each source becomes GBNF text (the grammar layer's translators), compiled through the ops so the
 * compiled grammar and its token cache are shared by every request with the same text. */
#include "server/server_int.h"

#include <stdlib.h>
#include <string.h>

/* The request's grammar source as GBNF (malloc'd) or NULL when the output is free; returns 0 or an
 * HTTP status with e filled (400 naming the field and, for schemas, the keyword). */
static int grammar_source(req *r, char **gbnf, ms_api_error *e) {
    ms_api_req *a = &r->api;
    ms_server *s = r->srv;
    ms_err err = {0};
    *gbnf = NULL;
    if (a->rf_type == MS_RF_JSON_OBJECT || a->rf_type == MS_RF_JSON_SCHEMA) {
        json_t *schema = a->rf_type == MS_RF_JSON_SCHEMA ? a->rf_schema : NULL;
        if (ms_grammar_json_schema_to_gbnf(schema, gbnf, &err) != MS_OK)
            return ms_api_fail(e, 400, "invalid_request_error", "response_format.json_schema.schema", NULL,
                               "The schema cannot be enforced: %s", err.msg);
        return 0;
    }
    if (a->regex) {
        if (ms_grammar_regex_to_gbnf(a->regex, gbnf, &err) != MS_OK)
            return ms_api_fail(e, 400, "invalid_request_error", "regex", NULL, "The regex cannot be enforced: %s", err.msg);
        return 0;
    }
    if (a->ebnf) {
        *gbnf = strdup(a->ebnf);
        return 0;
    }
    if (!a->is_chat) return 0;
    int forced = a->tool_choice == MS_TOOLCHOICE_REQUIRED || a->tool_choice == MS_TOOLCHOICE_NAMED;
    if (forced && a->tools) {
        if (s->cfg.tool_parser < 0)
            return ms_api_fail(e, 400, "invalid_request_error", "tool_choice", NULL,
                               "'tool_choice' %s needs the server to run with --tool-call-parser.",
                               a->tool_choice == MS_TOOLCHOICE_NAMED ? "naming a function" : "'required'");
        const char *only = a->tool_choice == MS_TOOLCHOICE_NAMED ? a->tool_choice_name : NULL;
        if (ms_grammar_tool_call_gbnf(a->tools, only, s->cfg.tool_parser == MS_TOOL_GLM47, gbnf, &err) != MS_OK)
            return ms_api_fail(e, 400, "invalid_request_error", "tools", NULL, "The tool schema cannot be enforced: %s", err.msg);
        return 0;
    }
    if (a->tool_choice == MS_TOOLCHOICE_NONE && json_object_get(a->body, "tools")) {
        if (ms_grammar_no_substring_gbnf("<tool_call>", gbnf, &err) != MS_OK)
            return ms_api_fail(e, 500, "server_error", NULL, NULL, "%s", err.msg);
        return 0;
    }
    return 0;
}

int ms_srv_build_grammar(req *r, ms_grammar **out, ms_api_error *e) {
    *out = NULL;
    char *gbnf = NULL;
    int st = grammar_source(r, &gbnf, e);
    if (st || !gbnf) return st;
    const char *field = r->api.ebnf ? "ebnf" : r->api.regex ? "regex" : r->api.rf_type != MS_RF_TEXT ? "response_format" : "tool_choice";
    if (!r->ops.grammar_compile) {
        /* ops without grammars (test fakes): tool_choice stays a parser-side filter, the explicit
         * output formats are refused */
        free(gbnf);
        if (!strcmp(field, "tool_choice")) return 0;
        return ms_api_fail(e, 400, "invalid_request_error", field, NULL, "Structured outputs are not available on this server.");
    }
    ms_err err = {0};
    int rc = r->ops.grammar_compile(r->ops.ctx, gbnf, out, &err);
    free(gbnf);
    if (rc == MS_ERR_NOMEM) return ms_api_fail(e, 503, "server_error", NULL, NULL, "%s", err.msg);
    if (rc != MS_OK) return ms_api_fail(e, 400, "invalid_request_error", field, NULL, "The grammar cannot be compiled: %s", err.msg);
    return 0;
}
