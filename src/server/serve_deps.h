/* serve_deps.h - the two adapters `moeserve serve` needs around the server core:
 *   - ms_serve_model_open: "create an ms_executor for model dir X on device Y" (one call into the
 *     model layer, ms_model_executor_open), plus the model facts the server validates against;
 *   - ms_server_ops_real: the ms_server_ops table over the real tokenizer, chat template and engine.
 * Keeping them here leaves the HTTP core free of model/tokenizer/engine symbols (tests use fakes). */
#ifndef MS_SERVER_SERVE_DEPS_H
#define MS_SERVER_SERVE_DEPS_H

#include "core/status.h"
#include "engine/engine.h"
#include "engine/model_executor.h"
#include "grammar/grammar.h"

#include <pthread.h>
#include "server/server.h"
#include "tokenizer/chat_template.h"
/* tokenizer.h has a nested comment opener in a contract comment (until its owner fixes it) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wcomment"
#include "tokenizer/tokenizer.h"
#pragma GCC diagnostic pop

typedef struct ms_serve_model {
    ms_executor exec;         /* ready for ms_engine_create */
    ms_model *model;          /* owned by the executor */
    int context_length;       /* max_position_embeddings */
    int n_eos;
    int32_t eos[16];
} ms_serve_model;

/* Opens the model (weights, backend, KV memory) described by o. */
int ms_serve_model_open(const ms_exec_opts *o, ms_serve_model *out, ms_err *err);
void ms_serve_model_close(ms_serve_model *m);

/* Context of the real ops: all borrowed, must outlive the server. tmpl may be NULL (no chat). */
typedef struct ms_real_ops {
    ms_tokenizer *tok;
    ms_template *tmpl;
    ms_engine *eng;
    /* structured outputs: built at start (ms_real_ops_prepare_grammar) or on first use under gmu,
     * freed by ms_real_ops_release; gcmu serializes compilations */
    pthread_mutex_t gmu, gcmu;
    ms_grammar_vocab *gvocab;
    ms_grammar_cache *gcache;
} ms_real_ops;

/* Frees what the ops built lazily (grammar vocabulary and cache). */
void ms_real_ops_release(ms_real_ops *ctx);

ms_server_ops ms_server_ops_real(ms_real_ops *ctx);
/* Builds the structured-output vocabulary index now (serve calls it at start, so the first
 * structured request does not wait for it). Call after ms_server_ops_real. */
int ms_real_ops_prepare_grammar(ms_real_ops *ctx, ms_err *err);

/* Everything `serve` runs: tokenizer, chat template, model/executor, engine, and the ops table. */
typedef struct ms_serve_stack_opts {
    ms_exec_opts exec;               /* model dir, device, runner, load format, memory */
    const char *tokenizer_path;      /* default: exec.model_path */
    const char *chat_template_file;  /* overrides the tokenizer's template; NULL = tokenizer's */
    int context_length;              /* 0 = the model's max_position_embeddings */
    int max_running_requests;        /* 0 = engine default */
    int max_queued_requests;         /* 0 = engine default */
    int chunked_prefill_size;        /* 0 = engine default */
    int max_prefill_tokens;          /* prompt tokens of one step, all requests together; 0 = engine default */
    double max_queue_wait_s;         /* refuse when the estimated queue wait exceeds this; 0 = off */
    int max_total_tokens;            /* 0 = what the executor's KV memory holds */
    int enable_prefix_cache;         /* 1 = on */
} ms_serve_stack_opts;

typedef struct ms_serve_stack {
    ms_serve_model model;
    ms_tokenizer *tok;
    ms_template *tmpl;
    ms_engine *eng;
    ms_real_ops rops;
    ms_server_ops ops;
    int context_length, vocab_size, page_size, kv_tokens;
    int n_eos;
    int32_t eos[16];
} ms_serve_stack;

/* Opens the whole stack; on failure everything opened so far is closed. */
int ms_serve_stack_open(const ms_serve_stack_opts *o, ms_serve_stack *s, ms_err *err);
/* Destroys the engine (aborting what is left), the executor, template and tokenizer. Call after
 * ms_server_stop. */
void ms_serve_stack_close(ms_serve_stack *s);

/* 1 when this build links the tokenizer, chat template, engine and model executor (they are
 * written in parallel; until all are merged `serve` reports which one is missing). Fills what is
 * missing into why. */
int ms_serve_deps_linked(char *why, size_t cap);

#endif
