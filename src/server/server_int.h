/* server_int.h - what the parts of the HTTP server share (private to src/server).
 *
 * server.c is split by concern (daemon and dispatch, request objects and the token -> text
 * pipeline, SSE, non-streaming responses, generation routes, simple routes); they all work on the
 * same request object, so its layout and the few cross-file helpers live here. Nothing outside
 * src/server includes this header. */
#ifndef MS_SERVER_SERVER_INT_H
#define MS_SERVER_SERVER_INT_H

#include "server/server.h"

#include "server/metrics.h"
#include "server/reasoning.h"
#include "server/sbuf.h"
#include "server/stopstr.h"
#include "server/toolcall.h"

#include <microhttpd.h>
#include <pthread.h>
#include <sys/types.h>

struct ms_server {
    ms_server_config cfg;
    ms_server_ops ops;
    struct MHD_Daemon *d;
    int port;
    ms_metrics metrics;
    pthread_mutex_t live_mu;
    struct req *live; /* requests whose connection is still open */
    _Atomic int stopping;
    double t_start;           /* wall clock (Unix seconds): "created" fields */
    double t_start_mono;      /* ms_now() at start: uptime */
    char fingerprint[64];
    /* guard.c: open connections (for the header timeout), buffered bodies, the watchdog thread */
    pthread_mutex_t conns_mu;
    struct conn_rec *conns;
    _Atomic long long body_bytes; /* request bytes buffered by all connections */
    pthread_t guard_th;
    int guard_started;
    _Atomic int guard_stop;
};

/* One open TCP connection (MHD_OPTION_NOTIFY_CONNECTION): when it began waiting for a request's
 * headers, and whether a request is in progress on it. */
typedef struct conn_rec {
    int fd;
    _Atomic int in_req;       /* headers of a request received, its response not yet complete */
    _Atomic long long t_wait_ms; /* ms_now() * 1000 when it began waiting for headers */
    struct conn_rec *next, *prev;
} conn_rec;

/* Why the watchdog ended a request (req.kill). */
enum { KILL_NONE = 0, KILL_GONE, KILL_STALL, KILL_BODY };

typedef struct ev_item {
    ms_token_event ev;
    double t;
    int choice;
} ev_item;

typedef struct choice {
    struct req *r;
    int index;
    int n_prompt_tokens;
    uint64_t eid;
    int submitted, engine_done, done;
    int fr;                   /* MS_FR_* */
    void *detok;
    ms_sbuf dt;               /* detokenizer output scratch */
    ms_stopstr stop;
    int use_reasoning, use_tools;
    ms_reasoning rp;
    ms_tool_stream *ts;
    ms_tool_out to;
    ms_sbuf text;             /* whole output text (after stop strings) */
    ms_sbuf lp;               /* logprob items not yet sent (stream) or all (non-stream) */
    ms_sbuf lp_tok, lp_val, lp_top, lp_off; /* completions-format logprob arrays */
    int lp_count;
    size_t text_off;
    int n_gen, n_prompt, n_cached;
    double t_last;
    char *error;
} choice;

enum { PH_BODY, PH_WAIT, PH_STREAM, PH_DONE };

typedef struct req {
    ms_server *srv;
    ms_server_ops ops;        /* copy: a req may outlive the server struct (engine callbacks) */
    pthread_mutex_t mu;
    int refs;
    struct MHD_Connection *conn;
    int suspended, mhd_done;
    int shutdown, force_end;  /* set by ms_server_stop (under mu) */
    int kill;                 /* KILL_*: set by the watchdog (under mu); the HTTP thread ends the request */
    int fd;                   /* the connection's socket (the watchdog polls it) */
    conn_rec *cr;
    _Atomic int wd_state;     /* 0 receiving the body, 1 generating (watched), 2 answered */
    _Atomic long long body_rx; /* body bytes received so far */
    long long body_acct;      /* of them, counted in srv->body_bytes (HTTP thread) */
    _Atomic long long t_progress_ms; /* streaming: last time the content reader handed out bytes */
    int streaming;
    int timed_out;            /* the watchdog aborted it for --request-timeout (watchdog thread only) */
    ev_item *q;
    int qn, qcap;
    /* fields below are used by the HTTP thread only */
    int phase;
    ms_sbuf body;
    int too_large, too_busy;
    int is_post;
    char method[8];      /* for the access log line */
    char url[128];
    ms_api_req api;
    choice *ch;
    int n_ch;
    json_t *parser_tools;     /* tools the parser accepts (only the named one for a named tool_choice) */
    char id[64];
    long created;
    double t0;
    double t_submitted;       /* ms_now() when the first choice was submitted to the engine */
    ms_sbuf out;
    size_t out_pos;
    int stream_closed;
    int first_token_seen;
    int shutdown_seen;
    struct req *live_next, *live_prev;
} req;

/* ---- server.c: responses ------------------------------------------------------------------- */

/* Queues a response with the given body (copied) and records its status in the metrics. */
enum MHD_Result ms_srv_send_buf(ms_server *s, struct MHD_Connection *c, int status, const char *ctype,
                                const char *data, size_t len, const char *retry_after);
/* Queues b as an application/json response. */
enum MHD_Result ms_srv_send_json(ms_server *s, struct MHD_Connection *c, int status, const ms_sbuf *b);
/* Queues the OpenAI error object of e (Retry-After on 503; 5xx are logged). */
enum MHD_Result ms_srv_send_error(ms_server *s, struct MHD_Connection *c, const ms_api_error *e);
/* Builds and queues an error response from its fields. */
enum MHD_Result ms_srv_fail(ms_server *s, struct MHD_Connection *c, int status, const char *type,
                            const char *param, const char *code, const char *msg);

/* ---- request.c: request objects and the token -> text pipeline ----------------------------- */

/* Engine callback (engine thread; user is a choice): queues the event and resumes the connection. */
void ms_srv_on_token(void *user, const ms_token_event *ev);
/* Drops one reference (r->mu not held); frees r on the last. */
void ms_srv_req_unref(req *r);
/* 1 when every choice of r has finished. */
int ms_srv_all_done(req *r);
/* Aborts every submitted engine request of r that has not finished (HTTP thread). */
void ms_srv_abort_all(req *r);
/* HTTP thread: handles server shutdown, then every queued engine event of r. */
void ms_srv_process_events(req *r);

/* ---- sse.c: streaming responses ------------------------------------------------------------ */

/* Appends one SSE chunk for choice c: delta_json (chat) or text[0..tlen) (completions); finish is
 * the finish_reason or NULL. Consumes the choice's pending logprobs. */
void ms_srv_emit_chunk(req *r, choice *c, const char *delta_json, const char *text, size_t tlen,
                       const char *finish);
/* Routes released text through the reasoning and tool parsers into chunks; final flushes them. */
void ms_srv_stream_text(req *r, choice *c, const char *s, size_t n, int final);
/* libmicrohttpd content reader of a streaming response (cls is the req). */
ssize_t ms_srv_stream_reader(void *cls, uint64_t pos, char *buf, size_t max);

/* ---- response.c: non-streaming responses and shared response fields ------------------------- */

/* The OpenAI finish_reason string of an MS_FR_* value. */
const char *ms_srv_fr_name(int fr);
/* Appends the usage object (the prompt of each distinct input counted once). */
void ms_srv_usage_json(req *r, ms_sbuf *o);
/* Appends the logprobs of choice c ("null" when not asked for) and consumes them. */
void ms_srv_add_logprobs(req *r, choice *c, ms_sbuf *o);
/* A non-streaming request resumed by an engine event: answers once all choices are done,
 * otherwise suspends the connection again. */
enum MHD_Result ms_srv_continue_wait(req *r, struct MHD_Connection *conn);

/* ---- guard.c: clients that go away or stall, slow uploads, idle connections --------------- */

/* Starts the watchdog thread (polls every live request and connection a few times a second). */
int ms_srv_guard_start(ms_server *s, ms_err *err);
/* Stops and joins the watchdog (idempotent). */
void ms_srv_guard_stop(ms_server *s);
/* MHD_OPTION_NOTIFY_CONNECTION callback: tracks connections for the header/keep-alive timeout. */
void ms_srv_notify_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                              enum MHD_ConnectionNotificationCode toe);
/* Returns bytes a request may no longer hold to the global body budget (HTTP thread). */
void ms_srv_body_release(req *r);

/* ---- generate.c: POST /v1/chat/completions and /v1/completions ----------------------------- */

/* Parses r->body, tokenizes the prompt(s), submits one engine request per choice and either
 * queues the streaming response or suspends the connection until the engine answers. */
enum MHD_Result ms_srv_start_generation(req *r, struct MHD_Connection *conn);

/* ---- structured.c: the grammar of a request ------------------------------------------------ */

/* The compiled grammar constraining r's output (a new reference, NULL when free) from
 * response_format / regex / ebnf / tool_choice; returns 0 or an HTTP status with e filled. */
int ms_srv_build_grammar(req *r, ms_grammar **out, ms_api_error *e);

/* ---- routes.c: the routes that do not generate --------------------------------------------- */

/* Answers a request for url that is not a generation route: the chat page, /health, /metrics,
 * /v1/models[/NAME], /get_server_info, or 404. get: the method was GET or HEAD. */
enum MHD_Result ms_srv_route_other(ms_server *s, struct MHD_Connection *c, const char *url, int get);

#endif
