/* engine.h - the serving engine: requests in, tokens out, on its own thread.
 *
 * The server submits tokenized requests with sampling parameters and a callback; the engine thread
 * runs schedule -> forward -> sample -> callback in a loop (continuous batching). Callbacks run on
 * the engine thread and must not block: copy the event and return. The model is reached only
 * through ms_executor, so the engine and scheduler are testable with a fake model. */
#ifndef MS_ENGINE_ENGINE_H
#define MS_ENGINE_ENGINE_H

#include "core/status.h"
#include "core/batch.h"
#include "grammar/grammar.h"

#include <stdint.h>

#define MS_MAX_TOP_LOGPROBS 20
#define MS_MAX_STOP_IDS 64
#define MS_MAX_LOGIT_BIAS 300 /* entries of a request's logit_bias (OpenAI's documented limit) */

/* How the model is run. `forward` fills logits [batch->n_logits, vocab] (float32, host). The
 * executor owns the KV memory (n_pages pages of page_size tokens per layer). A forward that fails
 * returns non-zero with err set: the requests of that batch finish with MS_FINISH_ERROR and the
 * message; the engine then asks `healthy` (when set) whether it can go on, and if not marks itself
 * unhealthy, fails every pending request and refuses new ones. */
typedef struct ms_executor {
    void *ctx;
    int vocab;
    int n_pages;
    int page_size;
    int max_batch_tokens; /* most tokens one forward accepts */
    int (*forward)(void *ctx, const ms_batch *batch, float *logits, ms_err *err);
    /* optional: the same step, but ids [batch->n_logits] get each logit row's greedy choice (sampler.h's
     * rule: the first index of the largest logit, NaN never, +inf as FLT_MAX, 0 when none is above
     * -inf) instead of the rows being copied out. The engine takes it for steps whose every row would
     * be sampled greedily with nothing else read from the logits (ms_sampler_plain_greedy). */
    int (*forward_argmax)(void *ctx, const ms_batch *batch, int32_t *ids, ms_err *err);
    /* optional: 1 when the executor can run another forward after a failure (NULL = always) */
    int (*healthy)(void *ctx);
    /* optional: page-lock the host buffer [p, p+n) that receives logits, so downloads into it run at
     * full link speed (0 = done, or nothing to do); unpin before freeing or moving it */
    int (*pin)(void *ctx, void *p, size_t n);
    void (*unpin)(void *ctx, void *p);
    /* end-of-sequence ids (generation_config eos_token_id); they stop a request unless its
     * ignore_eos is set (optional: the server may instead put eos into each request's stop_ids) */
    int n_eos;
    int32_t eos_ids[MS_MAX_STOP_IDS];
    /* optional, speculative decoding (NEXTN): one step of the model's MTP draft layer (model.h
     * ms_forward_mtp_run): batch laid out like a main step whose token t is the next token after
     * position positions[t], paired with hidden row hid_idx[t] of the last main step (hid_src 0) or
     * of the last draft step's logit rows (hid_src 1); fills logits [n_logits, vocab] (host float32). */
    int (*draft)(void *ctx, const ms_batch *batch, int hid_src, const int32_t *hid_idx, float *logits, ms_err *err);
    /* optional, with draft: the same step, but ids [n_logits] get each logit row's greedy choice (drafts
     * are greedy; forward_argmax's rule) instead of the rows being copied out */
    int (*draft_argmax)(void *ctx, const ms_batch *batch, int hid_src, const int32_t *hid_idx, int32_t *ids, ms_err *err);
} ms_executor;

typedef struct ms_sampling {
    float temperature;        /* 0 = greedy */
    float top_p;              /* (0,1], 1 = off */
    int top_k;                /* <= 0 = off */
    float min_p;              /* 0 = off */
    float presence_penalty;   /* OpenAI semantics, over generated tokens */
    float frequency_penalty;
    float repetition_penalty; /* 1 = off; HF semantics over prompt + generated */
    int has_seed;
    uint64_t seed;
    int max_tokens;           /* new tokens at most */
    int ignore_eos;
    int n_stop_ids;           /* stop token ids: the request's stop_token_ids, always honoured (the
                               * server adds eos here unless ignore_eos). The executor's eos_ids also
                               * stop the request unless ignore_eos (vLLM semantics). */
    int32_t stop_ids[MS_MAX_STOP_IDS];
    int logprobs;             /* 1 = report the sampled token's logprob */
    int top_logprobs;         /* 0..MS_MAX_TOP_LOGPROBS */
    int min_tokens;           /* stop ids (and the executor's eos) neither sampled nor stopping before
                               * this many new tokens (vLLM semantics); 0 = off */
    int n_logit_bias;         /* OpenAI logit_bias: added to the logits of bias_ids before sampling */
    int32_t bias_ids[MS_MAX_LOGIT_BIAS];
    float bias_vals[MS_MAX_LOGIT_BIAS];
    ms_grammar_matcher *grammar; /* structured output (NULL = none): while it is active, each step
                               * samples only tokens it allows (plus the stop ids once it may end)
                               * and advances it with the sampled token. A successful submit hands
                               * it to the engine, which frees it with the request; a failed
                               * submit leaves it with the caller. */
} ms_sampling;

/* Fills the neutral defaults (greedy off: temperature 1, top_p 1, no penalties, max_tokens 16).
 * max_tokens <= 0 means "until the context length". Sampling semantics (order of penalties and
 * filters, what logprobs are) are documented in engine/sampler.h. */
void ms_sampling_default(ms_sampling *s);

/* GRAMMAR_END: the grammar's sentence is complete and nothing can extend it (the token is part of
 * the output, unlike a stop id's); GRAMMAR_DEAD: no token of the vocabulary can continue the
 * grammar (the event carries no token). */
enum ms_finish { MS_FINISH_NONE = 0, MS_FINISH_STOP, MS_FINISH_LENGTH, MS_FINISH_ABORT, MS_FINISH_ERROR,
                 MS_FINISH_GRAMMAR_END, MS_FINISH_GRAMMAR_DEAD };

typedef struct ms_token_event {
    uint64_t req_id;
    int32_t token;             /* -1 when the event only reports finish/error; a stop token that
                                * ends the request (finish STOP) is reported like any other */
    float logprob;
    int n_top;
    int32_t top_ids[MS_MAX_TOP_LOGPROBS];
    float top_logprobs[MS_MAX_TOP_LOGPROBS];
    int finish;                /* enum ms_finish; != NONE on the request's last event */
    int n_prompt;              /* prompt tokens (usage) */
    int n_cached;              /* prompt tokens served from the prefix cache */
    int n_generated;           /* tokens generated so far, this one included */
    const char *error;         /* message when finish == MS_FINISH_ERROR, else NULL */
    double t_submit, t_admit;  /* ms_now() seconds: when ms_engine_submit queued the request, when a
                                * step first scheduled it (0 = never); the difference is its queue time */
} ms_token_event;

/* Called on the engine thread for every token and once at the end (finish != NONE). Exactly one
 * event per request has finish != NONE, after which the engine never calls back for it again. */
typedef void (*ms_token_cb)(void *user, const ms_token_event *ev);

typedef struct ms_engine_config {
    int page_size;              /* tokens per KV page (default 16); must equal the executor's (0 = take it) */
    int max_running_requests;   /* default 256 (capped to the executor's max_batch_tokens) */
    int max_waiting_requests;   /* bounded queue; submit returns MS_ERR_BUSY beyond it (default 1024) */
    int max_total_tokens;       /* KV tokens usable (<= executor n_pages * page_size; 0 = all) */
    int chunked_prefill_size;   /* prompt tokens per sequence per step (default 2048) */
    int max_prefill_tokens;     /* prefill token budget of one step (default 8192); decode tokens
                                 * and prefill together never exceed the executor's max_batch_tokens */
    int context_length;         /* prompt + output limit per request (0 = max_total_tokens) */
    double max_queue_wait_s;    /* > 0: submit fails with MS_ERR_BUSY when the estimated wait in the queue
                                 * (ms_engine_queue_wait) exceeds this many seconds; 0 = off (default) */
    int enable_prefix_cache;    /* radix prefix cache (default 1) */
    int check_integrity;        /* run the KV / cache / scheduler checkers whenever the engine goes
                                 * idle (default 0, or 1 when the environment sets MS_CHECK_INTEGRITY=1);
                                 * failures are logged and counted in stats */
    /* Speculative decoding (SGLang's --speculative-num-steps; 0 = off): after every step each decoding
     * request gets up to this many draft tokens, chained greedy steps of the executor's draft layer
     * (or of draft_fn); the next step verifies them all at once (the target model's logits on the last
     * real token and every draft), keeps the longest run the target's own sampling agrees with plus the
     * token it sampled where they part, and rolls the rest of the KV back. Each emitted token is drawn
     * exactly as without speculation (same logits rows, same per-request random stream), so greedy and
     * seeded outputs are the same with and without it; with a one-hot draft this is exactly rejection
     * sampling (accept x with min(1, p(x)/q(x)), else sample norm(max(0, p - q))). */
    int speculative_num_steps;
    /* Test hook (or another draft source): proposes up to max drafts following tokens[0..n_tokens)
     * (the first n_prompt are the prompt) into out; returns how many (0..max). Called on the engine
     * thread. When set, the executor's draft layer is not used. */
    int (*draft_fn)(void *user, const int32_t *tokens, int n_tokens, int n_prompt, int32_t *out, int max);
    void *draft_user;
    /* Test aid: with draft_fn and an executor draft layer, run the draft layer's steps anyway (its KV
     * cache, hidden rows and chained steps are exercised) and let draft_fn replace their tokens. */
    int draft_fn_after_layer;
} ms_engine_config;

void ms_engine_config_default(ms_engine_config *c);

typedef struct ms_engine ms_engine;

typedef struct ms_engine_stats {
    int running, waiting;
    uint64_t prompt_tokens_total, generated_tokens_total, cached_tokens_total;
    uint64_t requests_finished, requests_aborted, preemptions;
    int kv_pages_total, kv_pages_used, kv_pages_cached; /* cached = held only by the prefix cache */
    uint64_t prefix_hit_tokens, prefix_query_tokens;
    int healthy;                /* 0 after a forward failure the engine could not recover from */
    uint64_t requests_failed;   /* finished with MS_FINISH_ERROR */
    uint64_t forward_errors, steps;
    uint64_t decode_steps;          /* steps with one token per sequence (the ones graphs can run) */
    uint64_t argmax_steps;          /* steps whose rows were all greedy and came back as ids (forward_argmax) */
    double forward_seconds;         /* engine thread time in the executor's forward (logits included) */
    double sample_seconds;          /* ... sampling, stop checks and token callbacks after it */
    double schedule_seconds;        /* ... choosing the step's batch and sizing the logits buffer before it */
    double busy_seconds;            /* engine thread time not waiting for work: the three above plus taking
                                     * new requests and aborts and publishing these stats; what a step
                                     * costs besides its forward is busy - forward per step */
    uint64_t integrity_failures; /* checker failures seen when idle (check_integrity) */
    double admit_rate;          /* requests admitted per second in steps that began with requests waiting
                                 * (decayed over ~5 s); -1 = not measured yet */
    /* speculative decoding: verifications (a request's drafts checked in one step), draft tokens
     * proposed and accepted, draft steps run, KV pages returned after rejections. Mean accept length
     * (tokens per verification, the target's own token included, as SGLang reports it) =
     * (spec_accepted_tokens + spec_verifications) / spec_verifications. */
    uint64_t spec_verifications, spec_draft_tokens, spec_accepted_tokens, spec_draft_steps, spec_pages_freed;
} ms_engine_stats;

/* Estimated seconds before a request that arrives now leaves the queue: waiting / admit_rate (0 when
 * nobody waits or the rate is not measured yet; 1e9 when requests wait and the rate is ~0). */
double ms_engine_queue_wait(int waiting, double admit_rate);

/* Starts the engine thread. exec is borrowed and must outlive the engine. */
int ms_engine_create(const ms_engine_config *cfg, const ms_executor *exec, ms_engine **out, ms_err *err);
/* Stops the thread, aborts pending requests (their callbacks get MS_FINISH_ABORT), frees all. */
void ms_engine_destroy(ms_engine *e);

/* Queues a request (prompt and sampling copied). On success *req_id identifies it. Fails with
 * MS_ERR_BUSY when the waiting queue is full, MS_ERR_INVALID when prompt + max_tokens exceed the
 * context length or the KV capacity, the prompt is empty or holds ids outside the vocabulary, or a
 * sampling field is out of range (the message names the field), MS_ERR_RUNTIME when the engine is
 * unhealthy. The callback may be called before this returns. */
int ms_engine_submit(ms_engine *e, const int32_t *prompt, int n_prompt, const ms_sampling *sp,
                     ms_token_cb cb, void *user, uint64_t *req_id, ms_err *err);
/* Aborts a request (client went away); its pages are released by the engine thread; a final
 * MS_FINISH_ABORT event follows unless it already finished. Safe to call for finished ids. */
void ms_engine_abort(ms_engine *e, uint64_t req_id);
/* Snapshot of counters (thread-safe). */
void ms_engine_get_stats(ms_engine *e, ms_engine_stats *out);

#endif
