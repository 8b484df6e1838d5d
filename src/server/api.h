/* api.h - OpenAI request parsing/validation and the error object, kept apart from HTTP and the
 * engine so it can be tested on its own.
 *
 * Every rejection names the offending field in `param` and uses the status OpenAI would (400 for
 * bad values/types, 404 for an unknown model). The parsed request borrows JSON from the body
 * object it came from (it holds a reference to it). */
#ifndef MS_SERVER_API_H
#define MS_SERVER_API_H

#include "engine/engine.h"
#include "server/sbuf.h"
#include "server/stopstr.h"

#include <jansson.h>
#include <stdint.h>

/* Per-request limits: the defaults of the serve flags named beside them (ms_api_limits holds the
 * values in force; 0 there means the default). MS_API_MAX_PROMPTS and MS_MAX_STOP_STRINGS are also
 * storage bounds, so the flags cannot raise them. */
#define MS_API_MAX_N 8             /* n (--max-n) */
#define MS_API_MAX_PROMPTS 64      /* entries of a completions 'prompt' array (fixed) */
#define MS_API_MAX_MESSAGES 4096   /* entries of 'messages' (--max-messages) */
#define MS_API_MAX_TOOLS 512       /* entries of 'tools' (--max-tools) */
#define MS_API_MAX_STOP_LEN 1024   /* bytes of one stop string (--max-stop-length) */

typedef struct ms_api_error {
    int status;        /* HTTP status */
    char message[512];
    char type[48];     /* "invalid_request_error", ... */
    char param[96];    /* "" = null */
    char code[48];     /* "" = null */
} ms_api_error;

/* Fills e and returns its status (for `return ms_api_fail(...)`). */
int ms_api_fail(ms_api_error *e, int status, const char *type, const char *param, const char *code,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Appends {"error":{"message","type","param","code"}}. */
void ms_api_error_json(const ms_api_error *e, ms_sbuf *out);

enum { MS_RF_TEXT, MS_RF_JSON_OBJECT, MS_RF_JSON_SCHEMA };

enum { MS_TOOLCHOICE_AUTO, MS_TOOLCHOICE_NONE, MS_TOOLCHOICE_REQUIRED, MS_TOOLCHOICE_NAMED };

/* What the server knows about its model, for validation. */
typedef struct ms_api_limits {
    const char *model_names[8]; /* served name first, then aliases; NULL-terminated */
    int context_length;
    int vocab_size;
    float default_temperature, default_top_p; /* generation_config or 1.0 */
    int default_top_k;
    int enable_thinking_default;
    /* request limits, each refused with a 400 naming the field; 0 = the MS_API_* default above */
    int max_n;            /* n, in [1, 512] */
    int max_messages;     /* entries of 'messages' */
    int max_tools;        /* entries of 'tools' */
    int max_stop;         /* entries of 'stop', in [1, MS_MAX_STOP_STRINGS] */
    int max_stop_len;     /* bytes of one stop string */
} ms_api_limits;

typedef struct ms_api_prompt {
    char *text;      /* malloc'd, or NULL when ids given */
    int32_t *ids;    /* malloc'd, or NULL when text given */
    int n_ids;
} ms_api_prompt;

typedef struct ms_api_req {
    int is_chat;
    json_t *body;             /* owned reference */
    int stream, include_usage;
    int n;
    ms_sampling sp;           /* max_tokens = -1 when not given */
    const char *stop[MS_MAX_STOP_STRINGS];
    int n_stop;
    int logprobs;             /* report logprobs */
    int top_logprobs;
    /* chat */
    json_t *messages;         /* owned: a copy with tool-call arguments parsed into objects */
    json_t *tools;            /* borrowed from body; NULL when absent or tool_choice none */
    int tool_choice;
    const char *tool_choice_name;
    json_t *kwargs;           /* owned: chat_template_kwargs (object, maybe empty) */
    int enable_thinking;      /* effective */
    int separate_reasoning;
    int skip_special_tokens;
    /* structured output (borrowed from body) */
    int rf_type;              /* MS_RF_* */
    json_t *rf_schema;        /* json_schema's schema; NULL = any object */
    const char *regex, *ebnf; /* SGLang's extensions; NULL when absent */
    /* completions */
    ms_api_prompt prompts[MS_API_MAX_PROMPTS];
    int n_prompts;
} ms_api_req;

/* Parses and validates a /v1/chat/completions (is_chat) or /v1/completions body. On failure
 * returns the HTTP status (>= 400) with *e filled; on success 0 and *r must be freed. */
int ms_api_parse(const ms_api_limits *lim, int is_chat, const char *body, size_t len, ms_api_req *r,
                 ms_api_error *e);
void ms_api_req_free(ms_api_req *r);

/* Random request id: prefix + 24 hex chars (out >= 64 bytes). */
void ms_api_make_id(char *out, size_t cap, const char *prefix);

#endif
