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

/* Convenience for the server: builds the context as transformers' apply_chat_template does and
 * renders. messages NULL = []; tools NULL = None (as transformers passes it); bos/eos NULL = not set;
 * kwargs (chat_template_kwargs, an object or NULL) are merged last and override. All borrowed. */
int ms_chat_render(const ms_template *t, json_t *messages, json_t *tools, int add_generation_prompt,
                   json_t *kwargs, const char *bos_token, const char *eos_token, char **out,
                   size_t *len, ms_err *err);

/* Rendering bounds. A hostile template fails with a clear error instead of running away. */
typedef struct ms_template_limits {
    size_t max_output;   /* bytes of the result (and of any intermediate string); default 32 MiB */
    size_t max_memory;   /* bytes of per-render scratch memory; default 256 MiB */
    long long max_steps; /* loop iterations + macro calls + range() elements; default 2,000,000 */
    int max_depth;       /* nested macro calls; default 100 */
} ms_template_limits;

/* The defaults used by ms_template_render. */
ms_template_limits ms_template_default_limits(void);

/* ms_template_render with explicit limits (lim may be NULL for the defaults). */
int ms_template_render_ex(const ms_template *t, json_t *context, const ms_template_limits *lim, char **out,
                          size_t *len, ms_err *err);

/* Replaces every assistant tool call's `function.arguments` JSON string with the parsed value, in
 * place (what SGLang/vLLM do before templating, so templates can iterate arguments as a dict).
 * Strings that are not valid JSON objects are left as they are. Returns the number replaced. */
int ms_chat_parse_tool_arguments(json_t *messages);

/* Loads the chat template of a model directory: DIR/chat_template.jinja if present, else the
 * "chat_template" of DIR/tokenizer_config.json (a string, or a list of {name, template} from which
 * "default" is taken). *src is malloc'd. bos/eos (may be NULL) receive malloc'd token strings or
 * NULL when tokenizer_config.json does not set them (plain strings or {"content": ...} objects). */
int ms_chat_template_load(const char *dir, char **src, char **bos, char **eos, ms_err *err);

#endif
