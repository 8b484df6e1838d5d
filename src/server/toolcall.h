/* toolcall.h - turns GLM's XML-ish tool-call output into OpenAI tool_calls, with the semantics of
 * SGLang's `glm47` and `glm45` tool-call parsers (spec: reference/glm5-spec.md section 5.4).
 *
 *   glm47: <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
 *   glm45: <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n</tool_call>
 *
 * Argument values are typed from the tool's JSON schema (string values kept verbatim, others
 * parsed as JSON / unescaped JSON / Python literal); arguments are serialized like Python's
 * json.dumps(ensure_ascii=False): `{"k": "v", "n": 1}`. Calls naming a function that is not in the
 * request's tools are dropped (as SGLang's base detector does).
 *
 * Streaming and non-streaming give the same calls (ids aside) and the same content, except that
 * non-streaming strips leading whitespace of content that precedes a tool call (streaming has
 * already sent it), and a call cut off before </tool_call> stays a (partial) call when streaming
 * while non-streaming leaves its raw text in the content. */
#ifndef MS_SERVER_TOOLCALL_H
#define MS_SERVER_TOOLCALL_H

#include "server/sbuf.h"

#include <jansson.h>

enum ms_tool_format { MS_TOOL_GLM47 = 0, MS_TOOL_GLM45 = 1 };

/* Parses "glm45" / "glm47"; returns the format or -1. */
int ms_tool_format_parse(const char *name);

/* Writes "call_" + 24 lowercase hex chars (random) into out (>= 30 bytes). */
void ms_tool_call_id(char out[32]);

/* One complete call (non-streaming result). */
typedef struct ms_tool_call {
    char id[32];
    char *name;      /* malloc'd */
    char *arguments; /* malloc'd JSON object text */
} ms_tool_call;

typedef struct ms_tool_calls {
    ms_tool_call *v;
    int n, cap;
} ms_tool_calls;
void ms_tool_calls_free(ms_tool_calls *c);

/* Non-streaming: parses text; appends calls to *calls and the user-visible content to *content.
 * tools is the request's "tools" array (borrowed, may be NULL = no schema, all names accepted). */
void ms_tool_parse(int format, json_t *tools, const char *text, size_t n, ms_sbuf *content,
                   ms_tool_calls *calls);

/* One streaming delta of one call: a start (id + name, arguments "") or an arguments fragment. */
typedef struct ms_tool_delta {
    int index;
    int is_start;
    char id[32];
    char *name;  /* malloc'd when is_start */
    ms_sbuf args;
} ms_tool_delta;

typedef struct ms_tool_out {
    ms_sbuf content;
    ms_tool_delta *d;
    int n, cap;
} ms_tool_out;
/* Empties the output (keeps its memory). */
void ms_tool_out_reset(ms_tool_out *o);
void ms_tool_out_free(ms_tool_out *o);

typedef struct ms_tool_stream ms_tool_stream;
/* tools borrowed (must outlive the stream). */
ms_tool_stream *ms_tool_stream_new(int format, json_t *tools);
void ms_tool_stream_free(ms_tool_stream *s);
/* Feeds the next content delta; appends content and call deltas to *out. */
void ms_tool_stream_push(ms_tool_stream *s, const char *text, size_t n, ms_tool_out *out);
/* End of stream: flushes held text, closes an unterminated call's arguments. */
void ms_tool_stream_finish(ms_tool_stream *s, ms_tool_out *out);
/* Number of calls started so far (finish_reason "tool_calls" when > 0). */
int ms_tool_stream_calls(const ms_tool_stream *s);

/* Exposed for tests: converts one raw argument value V to JSON text for a property of the given
 * schema type (NULL = unknown). Returns malloc'd JSON text. */
char *ms_tool_convert_value(const char *type, const char *v, size_t n);
/* Serializes a JSON value like Python json.dumps(ensure_ascii=False). */
void ms_json_dump_py(ms_sbuf *b, json_t *v);

#endif
