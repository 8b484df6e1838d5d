/* server.h - the OpenAI-compatible HTTP server (libmicrohttpd).
 *
 * The server reaches the tokenizer, chat template and engine only through ms_server_ops, a table
 * of function pointers: server_ops_real.c adapts the real ms_tokenizer / ms_template / ms_engine,
 * and tests drive the whole HTTP layer with fakes.
 *
 * Threads: libmicrohttpd's internal pool (epoll where available) runs all HTTP work, including
 * detokenization and the reasoning/tool parsers. Engine callbacks only queue the event and wake
 * the (suspended) connection, so they never block the engine thread. */
#ifndef MS_SERVER_SERVER_H
#define MS_SERVER_SERVER_H

#include "core/status.h"
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "server/api.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ms_server_ops {
    void *ctx;
    /* Tokenizer. encode: *ids malloc'd (caller frees). */
    int (*encode)(void *ctx, const char *text, size_t len, int add_special, int32_t **ids, int *n,
                  ms_err *err);
    /* Renders the chat template with add_generation_prompt; *out malloc'd. tools/kwargs may be NULL. */
    int (*render_chat)(void *ctx, json_t *messages, json_t *tools, json_t *kwargs, char **out,
                       size_t *len, ms_err *err);
    /* Decodes ids with special tokens kept (logprob token strings); *out malloc'd. */
    int (*decode)(void *ctx, const int32_t *ids, int n, char **out, size_t *len, ms_err *err);
    int (*is_special)(void *ctx, int32_t id);
    const char *(*token_content)(void *ctx, int32_t id); /* vocab/added-token string or NULL */
    /* Incremental detokenizer that keeps special tokens (the server filters ids before pushing). */
    void *(*detok_new)(void *ctx);
    int (*detok_push)(void *detok, int32_t id, char **buf, size_t *len, size_t *cap, ms_err *err);
    int (*detok_flush)(void *detok, char **buf, size_t *len, size_t *cap, ms_err *err);
    void (*detok_free)(void *detok);
    /* Structured outputs (optional: NULL = not available, requests asking for them get a 400).
     * grammar_compile: the compiled grammar of GBNF text over this tokenizer's vocabulary, shared
     * through a cache (*out is a new reference). token_id: the id of a token by its content, or -1. */
    int (*grammar_compile)(void *ctx, const char *gbnf, ms_grammar **out, ms_err *err);
    int32_t (*token_id)(void *ctx, const char *content);
    /* Engine (same contracts as ms_engine_submit / abort / get_stats). */
    int (*submit)(void *ctx, const int32_t *prompt, int n_prompt, const ms_sampling *sp,
                  ms_token_cb cb, void *user, uint64_t *req_id, ms_err *err);
    void (*abort)(void *ctx, uint64_t req_id);
    void (*stats)(void *ctx, ms_engine_stats *out);
} ms_server_ops;

enum { MS_REASONING_NONE = 0, MS_REASONING_GLM45 = 1 };

typedef struct ms_server_config {
    const char *host;          /* default "127.0.0.1" */
    int port;                  /* 0 = pick a free port (see ms_server_port) */
    const char *api_key;       /* NULL/"" = no authentication */
    ms_api_limits lim;         /* model names, context length, vocab, sampling defaults */
    const char *model_path;    /* for /v1/models and /get_server_info */
    int reasoning_parser;      /* MS_REASONING_* */
    int tool_parser;           /* MS_TOOL_* or -1 = none */
    size_t max_request_bytes;  /* request body limit (default 10 MB) */
    int n_threads;             /* HTTP worker threads (default 4) */
    int n_eos;                 /* default stop ids (generation_config eos) */
    int32_t eos_ids[16];
    /* Limits on connections and slow or vanished clients (0 = the default shown; see guard.c). */
    int max_connections;       /* open TCP connections (default 4096) */
    size_t max_header_bytes;   /* per-connection memory for the request line + headers (libmicrohttpd's
                                * connection memory limit; beyond: 431) (default 32 KiB) */
    double idle_timeout_s;     /* no byte moved in either direction (default 600) */
    double header_timeout_s;   /* request headers complete, also the keep-alive idle time (default 60) */
    double body_timeout_s;     /* request body complete after its headers (default 120) */
    double min_upload_bps;     /* average body rate below this after 5 s ends the upload (default 1024; <0 off) */
    size_t body_budget_bytes;  /* request bodies buffered by all connections together (default 256 MiB) */
    double stream_stall_timeout_s; /* a stream whose reader takes nothing for this long is aborted (default 60; <0 off) */
    double request_timeout_s;  /* a generation running longer is aborted (finish_reason "abort"); 0 = none */
    double shutdown_timeout_s; /* ms_server_stop lets running requests finish this long (default 30; 0 = abort at once) */
    int max_choices;           /* n x prompts of one request (default 64) */
    int max_queued;            /* the engine's waiting-queue bound: at it, 503 before parsing (0 = no early check) */
    double max_queue_wait_s;   /* the engine's queue-wait bound: an estimate beyond it, 503 before parsing (0 = off) */
    const char *info_json;     /* JSON object text shown under "flags" in /get_server_info */
    const char *version;       /* moeserve version string */
} ms_server_config;

/* Fills defaults (host 127.0.0.1, port 8000, 10 MB body limit, 4 threads, no parsers). */
void ms_server_config_default(ms_server_config *c);

typedef struct ms_server ms_server;

/* Starts listening. cfg strings and ops (and what they point to) are borrowed and must outlive
 * the server; the engine behind ops must outlive it too (destroy the engine after the server). */
int ms_server_start(const ms_server_config *cfg, const ms_server_ops *ops, ms_server **out,
                    ms_err *err);
/* The bound TCP port. */
int ms_server_port(const ms_server *s);
/* Graceful stop: stops accepting connections, answers new requests on open ones with 503, lets
 * running requests finish for up to cfg.shutdown_timeout_s, then aborts the rest (finish_reason
 * "abort"), waits briefly for their responses to end, stops and frees. */
void ms_server_stop(ms_server *s);

/* The chat page served at GET / (chat_page.c). */
extern const char ms_chat_page_html[];

#endif
