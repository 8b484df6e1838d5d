/* chat_template.h - renders Hugging Face chat templates (a bounded Jinja subset) exactly as
 * transformers' apply_chat_template / @huggingface/jinja do.
 *
 * Templates are compiled once and rendered many times from many threads (a compiled template is
 * immutable). The context is a JSON object (jansson): messages, tools, add_generation_prompt,
 * bos_token, eos_token and any chat_template_kwargs merged at top level. */
#ifndef MS_TOKENIZER_CHAT_TEMPLATE_H
#define MS_TOKENIZER_CHAT_TEMPLATE_H

#include "core/status.h"

#include <jansson.h>
#include <stddef.h>

typedef struct ms_template ms_template;

/* Compiles template source; syntax errors name the line and construct. */
int ms_template_compile(const char *src, size_t len, ms_template **out, ms_err *err);
void ms_template_free(ms_template *t);

/* Renders with the given context object (borrowed). *out is malloc'd, NUL-terminated. Rendering is
 * bounded: output size, loop iterations and recursion depth have limits that fail with a clear
 * error; raise_exception() fails with the template's message. */
int ms_template_render(const ms_template *t, json_t *context, char **out, size_t *len, ms_err *err);

/* Convenience for the server: builds the context from its parts (any may be NULL) and renders. */
int ms_chat_render(const ms_template *t, json_t *messages, json_t *tools, int add_generation_prompt,
                   json_t *kwargs, const char *bos_token, const char *eos_token, char **out,
                   size_t *len, ms_err *err);

#endif
