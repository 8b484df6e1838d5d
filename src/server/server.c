/* server.c - HTTP routes, request lifecycle and the token -> text -> SSE pipeline.
 *
 * Lifecycle of a generation request (struct req):
 *   1. libmicrohttpd calls on_request repeatedly while the body arrives (bounded by
 *      max_request_bytes), then once more with no data: the body is parsed, the prompt rendered
 *      and tokenized, and one engine request per choice is submitted.
 *   2. Engine callbacks (engine thread) append events to req->q and resume the connection if it
 *      is suspended. All text work happens on the HTTP thread: streaming responses process events
 *      in the content reader; non-streaming ones in on_request, which libmicrohttpd calls again
 *      after each resume. With nothing to do, the connection is suspended (no busy waiting).
 *   3. A req is freed when both libmicrohttpd (completion callback) and every submitted engine
 *      request (final event) have let go of it (refcount). A client that disconnects gets its
 *      engine requests aborted, which frees their KV pages.
 * Invalid UTF-8 in a request body is rejected with 400 (jansson refuses it). */
#include "server/server.h"

#include "core/fileutil.h"
#include "core/log.h"
#include "server/metrics.h"
#include "server/reasoning.h"
#include "server/sbuf.h"
#include "server/stopstr.h"
#include "server/toolcall.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct ms_server {
    ms_server_config cfg;
    ms_server_ops ops;
    struct MHD_Daemon *d;
    int port;
    ms_metrics metrics;
    pthread_mutex_t live_mu;
    struct req *live; /* requests whose connection is still open */
    _Atomic int stopping;
    double t_start;
    char fingerprint[64];
};

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
    ev_item *q;
    int qn, qcap;
    /* fields below are used by the HTTP thread only */
    int phase;
    ms_sbuf body;
    int too_large;
    int is_post;
    char url[128];
    ms_api_req api;
    choice *ch;
    int n_ch;
    char id[64];
    long created;
    double t0;
    ms_sbuf out;
    size_t out_pos;
    int stream_closed;
    int first_token_seen;
    int shutdown_seen;
    struct req *live_next, *live_prev;
} req;

static const char *const KEEP_TAGS[] = {"<think>", "</think>", "<tool_call>", "</tool_call>",
                                        "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
                                        "<tool_response>", "</tool_response>"};

void ms_server_config_default(ms_server_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8000;
    c->max_request_bytes = 10u << 20;
    c->n_threads = 4;
    c->tool_parser = -1;
    c->lim.default_temperature = 1.0f;
    c->lim.default_top_p = 1.0f;
    c->lim.enable_thinking_default = 1;
    c->version = "0";
}

/* ---- small helpers ------------------------------------------------------------------------- */

static const char *fr_name(int fr) {
    static const char *n[MS_FR_N] = {"stop", "length", "tool_calls", "abort", "error"};
    return fr >= 0 && fr < MS_FR_N ? n[fr] : "stop";
}

static enum MHD_Result send_buf(ms_server *s, struct MHD_Connection *c, int status, const char *ctype,
                                const char *data, size_t len, const char *retry_after) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", ctype);
    if (retry_after) MHD_add_response_header(resp, "Retry-After", retry_after);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    ms_metrics_http(&s->metrics, status);
    return rc;
}

static enum MHD_Result send_json(ms_server *s, struct MHD_Connection *c, int status, const ms_sbuf *b) {
    return send_buf(s, c, status, "application/json", ms_sbuf_str(b), b->len, NULL);
}

static enum MHD_Result send_error(ms_server *s, struct MHD_Connection *c, const ms_api_error *e) {
    ms_sbuf b = {0};
    ms_api_error_json(e, &b);
    const char *retry = e->status == 503 ? "1" : NULL;
    enum MHD_Result rc = send_buf(s, c, e->status, "application/json", ms_sbuf_str(&b), b.len, retry);
    ms_sbuf_free(&b);
    if (e->status >= 500) MS_LOGW("HTTP %d: %s", e->status, e->message);
    return rc;
}

static enum MHD_Result fail(ms_server *s, struct MHD_Connection *c, int status, const char *type,
                            const char *param, const char *code, const char *msg) {
    ms_api_error e;
    ms_api_fail(&e, status, type, param, code, "%s", msg);
    return send_error(s, c, &e);
}

/* Constant-time comparison of the presented bearer token with the key. */
static int auth_ok(const char *key, const char *header) {
    if (!key || !key[0]) return 1;
    if (!header || strncmp(header, "Bearer ", 7) != 0) return 0;
    const char *tok = header + 7;
    size_t kl = strlen(key), tl = strlen(tok);
    unsigned char diff = (unsigned char)(kl != tl);
    for (size_t i = 0; i < kl; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < tl ? tok[i] : 0);
    return diff == 0;
}

/* ---- request objects ----------------------------------------------------------------------- */

static void choice_free(req *r, choice *c) {
    if (c->detok) r->ops.detok_free(c->detok);
    ms_sbuf_free(&c->dt);
    ms_stopstr_free(&c->stop);
    ms_reasoning_free(&c->rp);
    ms_tool_stream_free(c->ts);
    ms_tool_out_free(&c->to);
    ms_sbuf_free(&c->text);
    ms_sbuf_free(&c->lp);
    ms_sbuf_free(&c->lp_tok);
    ms_sbuf_free(&c->lp_val);
    ms_sbuf_free(&c->lp_top);
    ms_sbuf_free(&c->lp_off);
    free(c->error);
}

static void req_free(req *r) {
    for (int i = 0; i < r->n_ch; i++) choice_free(r, &r->ch[i]);
    free(r->ch);
    ms_api_req_free(&r->api);
    ms_sbuf_free(&r->body);
    ms_sbuf_free(&r->out);
    free(r->q);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Drops one reference (lock not held); frees on the last. */
static void req_unref(req *r) {
    pthread_mutex_lock(&r->mu);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last) req_free(r);
}

/* Engine thread: queue the event, wake the connection. Never blocks for long. */
static void on_token(void *user, const ms_token_event *ev) {
    choice *c = user;
    req *r = c->r;
    pthread_mutex_lock(&r->mu);
    if (!r->mhd_done) {
        if (r->qn == r->qcap) {
            int cap = r->qcap ? r->qcap * 2 : 16;
            ev_item *q = realloc(r->q, (size_t)cap * sizeof *q);
            MS_ASSERT(q != NULL);
            r->q = q;
            r->qcap = cap;
        }
        ev_item *it = &r->q[r->qn++];
        it->ev = *ev;
        it->ev.error = NULL; /* the message pointer is only valid during the callback */
        it->t = ms_now();
        it->choice = c->index;
        if (ev->finish == MS_FINISH_ERROR && ev->error && !c->error) c->error = strdup(ev->error);
        if (r->suspended) {
            r->suspended = 0;
            MHD_resume_connection(r->conn);
        }
    }
    int last = 0;
    if (ev->finish != MS_FINISH_NONE) last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last) req_free(r);
}

/* ---- token -> text pipeline ----------------------------------------------------------------- */

static int token_visible(req *r, int32_t id) {
    if (!r->api.skip_special_tokens) return 1;
    if (!r->ops.is_special(r->ops.ctx, id)) return 1;
    const char *s = r->ops.token_content(r->ops.ctx, id);
    if (!s) return 0;
    for (size_t i = 0; i < sizeof KEEP_TAGS / sizeof KEEP_TAGS[0]; i++)
        if (!strcmp(s, KEEP_TAGS[i])) return 1;
    return 0;
}

static void chunk_head(req *r, ms_sbuf *o) {
    ms_sbuf_adds(o, "data: {\"id\":");
    ms_sbuf_add_json_str(o, r->id, strlen(r->id));
    ms_sbuf_printf(o, ",\"object\":\"%s\",\"created\":%ld,\"model\":",
                   r->api.is_chat ? "chat.completion.chunk" : "text_completion", r->created);
    const char *m = r->srv->cfg.lim.model_names[0];
    ms_sbuf_add_json_str(o, m, strlen(m));
    ms_sbuf_adds(o, ",\"system_fingerprint\":");
    ms_sbuf_add_json_str(o, r->srv->fingerprint, strlen(r->srv->fingerprint));
    ms_sbuf_adds(o, ",\"choices\":[");
}

static void chunk_tail(req *r, ms_sbuf *o) {
    ms_sbuf_adds(o, "]");
    if (r->api.include_usage) ms_sbuf_adds(o, ",\"usage\":null");
    ms_sbuf_adds(o, "}\n\n");
}

/* Logprobs of the chunk/choice: consumes c->lp (chat) or the completions arrays. */
static void add_logprobs(req *r, choice *c, ms_sbuf *o) {
    if (!r->api.logprobs) { ms_sbuf_adds(o, "null"); return; }
    if (r->api.is_chat) {
        ms_sbuf_adds(o, "{\"content\":[");
        ms_sbuf_add(o, ms_sbuf_str(&c->lp), c->lp.len);
        ms_sbuf_adds(o, "]}");
        ms_sbuf_clear(&c->lp);
    } else {
        ms_sbuf_printf(o, "{\"tokens\":[%s],\"token_logprobs\":[%s],\"top_logprobs\":[%s],\"text_offset\":[%s]}",
                       ms_sbuf_str(&c->lp_tok), ms_sbuf_str(&c->lp_val), ms_sbuf_str(&c->lp_top),
                       ms_sbuf_str(&c->lp_off));
        ms_sbuf_clear(&c->lp_tok);
        ms_sbuf_clear(&c->lp_val);
        ms_sbuf_clear(&c->lp_top);
        ms_sbuf_clear(&c->lp_off);
    }
    c->lp_count = 0;
}

/* One streaming chunk for choice c with the given delta object body (chat) or text (completions). */
static void emit_chunk(req *r, choice *c, const char *delta_json, const char *text, size_t tlen,
                       const char *finish) {
    ms_sbuf *o = &r->out;
    chunk_head(r, o);
    ms_sbuf_printf(o, "{\"index\":%d,", c->index);
    if (r->api.is_chat) {
        ms_sbuf_printf(o, "\"delta\":%s,", delta_json);
    } else {
        ms_sbuf_adds(o, "\"text\":");
        ms_sbuf_add_json_str(o, text ? text : "", tlen);
        ms_sbuf_addc(o, ',');
    }
    ms_sbuf_adds(o, "\"logprobs\":");
    add_logprobs(r, c, o);
    if (finish) ms_sbuf_printf(o, ",\"finish_reason\":\"%s\"}", finish);
    else ms_sbuf_adds(o, ",\"finish_reason\":null}");
    chunk_tail(r, o);
}

static void emit_delta_text(req *r, choice *c, const char *field, const char *s, size_t n) {
    if (n == 0) return;
    ms_sbuf d = {0};
    ms_sbuf_printf(&d, "{\"%s\":", field);
    ms_sbuf_add_json_str(&d, s, n);
    ms_sbuf_addc(&d, '}');
    emit_chunk(r, c, d.s, NULL, 0, NULL);
    ms_sbuf_free(&d);
}

static void emit_tool_deltas(req *r, choice *c) {
    for (int i = 0; i < c->to.n; i++) {
        ms_tool_delta *t = &c->to.d[i];
        ms_sbuf d = {0};
        ms_sbuf_printf(&d, "{\"tool_calls\":[{\"index\":%d,", t->index);
        if (t->is_start) {
            ms_sbuf_printf(&d, "\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":", t->id);
            ms_sbuf_add_json_str(&d, t->name, strlen(t->name));
            ms_sbuf_adds(&d, ",\"arguments\":\"\"}}]}");
        } else {
            ms_sbuf_adds(&d, "\"function\":{\"arguments\":");
            ms_sbuf_add_json_str(&d, ms_sbuf_str(&t->args), t->args.len);
            ms_sbuf_adds(&d, "}}]}");
        }
        emit_chunk(r, c, d.s, NULL, 0, NULL);
        ms_sbuf_free(&d);
    }
}

/* Streaming: route released text through the reasoning and tool parsers into chunks. */
static void stream_text(req *r, choice *c, const char *s, size_t n, int final) {
    if (!r->api.is_chat) {
        if (n) emit_chunk(r, c, NULL, s, n, NULL);
        return;
    }
    ms_sbuf reason = {0}, content = {0};
    if (c->use_reasoning) {
        ms_reasoning_push(&c->rp, s, n, &reason, &content);
        if (final) ms_reasoning_finish(&c->rp, &reason, &content);
    } else {
        ms_sbuf_add(&content, s, n);
    }
    emit_delta_text(r, c, "reasoning_content", ms_sbuf_str(&reason), reason.len);
    if (c->use_tools) {
        ms_tool_out_reset(&c->to);
        ms_tool_stream_push(c->ts, ms_sbuf_str(&content), content.len, &c->to);
        if (final) ms_tool_stream_finish(c->ts, &c->to);
        emit_delta_text(r, c, "content", ms_sbuf_str(&c->to.content), c->to.content.len);
        emit_tool_deltas(r, c);
        ms_tool_out_reset(&c->to);
    } else {
        emit_delta_text(r, c, "content", ms_sbuf_str(&content), content.len);
    }
    ms_sbuf_free(&reason);
    ms_sbuf_free(&content);
}

static void release_text(req *r, choice *c, const char *s, size_t n, int final) {
    if (r->phase == PH_STREAM) stream_text(r, c, s, n, final);
    else ms_sbuf_add(&c->text, s, n);
}

static void finish_choice(req *r, choice *c, int fr);

/* New detokenized text: stop strings first, then out. */
static void feed_text(req *r, choice *c, const char *s, size_t n) {
    ms_sbuf rel = {0};
    int matched = ms_stopstr_push(&c->stop, s, n, &rel);
    release_text(r, c, ms_sbuf_str(&rel), rel.len, 0);
    ms_sbuf_free(&rel);
    if (matched && !c->done) {
        if (!c->engine_done) r->ops.abort(r->ops.ctx, c->eid);
        finish_choice(r, c, MS_FR_STOP);
    }
}

static void add_token_logprobs(req *r, choice *c, const ms_token_event *ev) {
    char *tok = NULL;
    size_t tl = 0;
    ms_err err = {0};
    if (r->ops.decode(r->ops.ctx, &ev->token, 1, &tok, &tl, &err) != MS_OK) { tok = strdup(""); tl = 0; }
    if (r->api.is_chat) {
        ms_sbuf *o = &c->lp;
        if (c->lp_count++) ms_sbuf_addc(o, ',');
        ms_sbuf_adds(o, "{\"token\":");
        ms_sbuf_add_json_str(o, tok, tl);
        ms_sbuf_printf(o, ",\"logprob\":%.6g,\"bytes\":[", (double)ev->logprob);
        for (size_t i = 0; i < tl; i++) ms_sbuf_printf(o, i ? ",%u" : "%u", (unsigned char)tok[i]);
        ms_sbuf_adds(o, "],\"top_logprobs\":[");
        for (int k = 0; k < ev->n_top && k < r->api.top_logprobs; k++) {
            char *t2 = NULL;
            size_t l2 = 0;
            if (r->ops.decode(r->ops.ctx, &ev->top_ids[k], 1, &t2, &l2, &err) != MS_OK) { t2 = strdup(""); l2 = 0; }
            if (k) ms_sbuf_addc(o, ',');
            ms_sbuf_adds(o, "{\"token\":");
            ms_sbuf_add_json_str(o, t2, l2);
            ms_sbuf_printf(o, ",\"logprob\":%.6g,\"bytes\":[", (double)ev->top_logprobs[k]);
            for (size_t i = 0; i < l2; i++) ms_sbuf_printf(o, i ? ",%u" : "%u", (unsigned char)t2[i]);
            ms_sbuf_adds(o, "]}");
            free(t2);
        }
        ms_sbuf_adds(o, "]}");
    } else {
        const char *sep = c->lp_count++ ? "," : "";
        ms_sbuf_adds(&c->lp_tok, sep);
        ms_sbuf_add_json_str(&c->lp_tok, tok, tl);
        ms_sbuf_printf(&c->lp_val, "%s%.6g", sep, (double)ev->logprob);
        ms_sbuf_printf(&c->lp_off, "%s%zu", sep, c->text_off);
        ms_sbuf_adds(&c->lp_top, sep);
        ms_sbuf_addc(&c->lp_top, '{');
        for (int k = 0; k < ev->n_top && k < r->api.top_logprobs; k++) {
            char *t2 = NULL;
            size_t l2 = 0;
            if (r->ops.decode(r->ops.ctx, &ev->top_ids[k], 1, &t2, &l2, &err) != MS_OK) { t2 = strdup(""); l2 = 0; }
            if (k) ms_sbuf_addc(&c->lp_top, ',');
            ms_sbuf_add_json_str(&c->lp_top, t2, l2);
            ms_sbuf_printf(&c->lp_top, ":%.6g", (double)ev->top_logprobs[k]);
            free(t2);
        }
        ms_sbuf_addc(&c->lp_top, '}');
        c->text_off += tl;
    }
    free(tok);
}

/* Ends a choice: flushes detokenizer, stop matcher and parsers; records metrics; streams the
 * finish chunk. */
static void finish_choice(req *r, choice *c, int fr) {
    if (c->done) return;
    c->done = 1;
    if (fr != MS_FR_STOP || !c->stop.matched) {
        ms_err err = {0};
        ms_sbuf_clear(&c->dt);
        if (c->detok && r->ops.detok_flush(c->detok, &c->dt.s, &c->dt.len, &c->dt.cap, &err) == MS_OK && c->dt.len) {
            ms_sbuf rel = {0};
            ms_stopstr_push(&c->stop, c->dt.s, c->dt.len, &rel);
            release_text(r, c, ms_sbuf_str(&rel), rel.len, 0);
            ms_sbuf_free(&rel);
        }
    }
    ms_sbuf rel = {0};
    ms_stopstr_flush(&c->stop, &rel);
    release_text(r, c, ms_sbuf_str(&rel), rel.len, 1);
    ms_sbuf_free(&rel);
    if (c->use_tools && fr == MS_FR_STOP && r->phase == PH_STREAM && ms_tool_stream_calls(c->ts) > 0)
        fr = MS_FR_TOOL;
    c->fr = fr;
    if (r->phase == PH_STREAM) {
        if (fr == MS_FR_ERROR) {
            ms_api_error e;
            ms_api_fail(&e, 500, "server_error", NULL, NULL, "%s", c->error ? c->error : "generation failed");
            ms_sbuf_adds(&r->out, "data: ");
            ms_api_error_json(&e, &r->out);
            ms_sbuf_adds(&r->out, "\n\n");
        } else {
            emit_chunk(r, c, "{}", "", 0, fr_name(fr));
        }
    }
    ms_metrics_finish(&r->srv->metrics, ms_now() - r->t0, fr, c->n_prompt, c->n_gen);
}

static void handle_event(req *r, const ev_item *it) {
    choice *c = &r->ch[it->choice];
    const ms_token_event *ev = &it->ev;
    if (ev->finish != MS_FINISH_NONE) c->engine_done = 1;
    if (c->done) return;
    if (ev->n_prompt) c->n_prompt = ev->n_prompt;
    if (ev->n_cached) c->n_cached = ev->n_cached;
    if (ev->token >= 0) {
        c->n_gen++;
        if (!r->first_token_seen) {
            r->first_token_seen = 1;
            ms_metrics_ttft(&r->srv->metrics, it->t - r->t0);
        } else if (c->t_last > 0) {
            ms_metrics_itl(&r->srv->metrics, it->t - c->t_last);
        }
        c->t_last = it->t;
        if (r->api.logprobs) add_token_logprobs(r, c, ev);
        /* the token that ended the request by a stop id / eos is never part of the text */
        int hide = ev->finish == MS_FINISH_STOP;
        if (!hide && token_visible(r, ev->token)) {
            ms_err err = {0};
            ms_sbuf_clear(&c->dt);
            if (r->ops.detok_push(c->detok, ev->token, &c->dt.s, &c->dt.len, &c->dt.cap, &err) != MS_OK) {
                c->error = strdup(err.msg);
                if (!c->engine_done) r->ops.abort(r->ops.ctx, c->eid);
                finish_choice(r, c, MS_FR_ERROR);
                return;
            }
            if (c->dt.len) feed_text(r, c, c->dt.s, c->dt.len);
            if (c->done) return;
        }
    }
    if (ev->finish != MS_FINISH_NONE) {
        int fr = ev->finish == MS_FINISH_LENGTH ? MS_FR_LENGTH
               : ev->finish == MS_FINISH_STOP   ? MS_FR_STOP
               : ev->finish == MS_FINISH_ERROR  ? MS_FR_ERROR
                                                : MS_FR_ABORT;
        finish_choice(r, c, fr);
    }
}

static int all_done(req *r) {
    for (int i = 0; i < r->n_ch; i++)
        if (!r->ch[i].done) return 0;
    return 1;
}

static void abort_all(req *r);

/* Server shutdown, seen from the HTTP thread that owns r: abort the engine requests (their final
 * events end the response), or when forced, end every choice right away. */
static void check_shutdown(req *r) {
    pthread_mutex_lock(&r->mu);
    int sd = r->shutdown, fe = r->force_end;
    pthread_mutex_unlock(&r->mu);
    if (sd && !r->shutdown_seen) {
        r->shutdown_seen = 1;
        abort_all(r);
    }
    if (fe)
        for (int i = 0; i < r->n_ch; i++)
            if (!r->ch[i].done) finish_choice(r, &r->ch[i], MS_FR_ABORT);
}

/* Takes queued events and processes them on the HTTP thread. */
static void process_events(req *r) {
    check_shutdown(r);
    for (;;) {
        pthread_mutex_lock(&r->mu);
        int n = r->qn;
        ev_item *q = r->q;
        r->q = NULL;
        r->qn = r->qcap = 0;
        pthread_mutex_unlock(&r->mu);
        if (n == 0) { free(q); return; }
        for (int i = 0; i < n; i++) handle_event(r, &q[i]);
        free(q);
    }
}

static void usage_json(req *r, ms_sbuf *o) {
    int prompt = 0, gen = 0, cached = 0;
    /* the prompt of each distinct input counts once (n choices share it) */
    for (int i = 0; i < r->n_ch; i++) {
        gen += r->ch[i].n_gen;
        if (i % r->api.n == 0) {
            prompt += r->ch[i].n_prompt ? r->ch[i].n_prompt : r->ch[i].n_prompt_tokens;
            cached += r->ch[i].n_cached;
        }
    }
    ms_sbuf_printf(o, "{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
                      "\"prompt_tokens_details\":{\"cached_tokens\":%d}}",
                   prompt, gen, prompt + gen, cached);
}

/* Streaming end: usage chunk when asked for, then [DONE]. */
static void stream_end(req *r) {
    if (r->api.include_usage) {
        chunk_head(r, &r->out);
        ms_sbuf_adds(&r->out, "],\"usage\":");
        usage_json(r, &r->out);
        ms_sbuf_adds(&r->out, "}\n\n");
    }
    ms_sbuf_adds(&r->out, "data: [DONE]\n\n");
    r->stream_closed = 1;
}

/* Non-streaming: the whole response object. Returns the HTTP status. */
static int build_response(req *r, ms_sbuf *o) {
    for (int i = 0; i < r->n_ch; i++)
        if (r->ch[i].fr == MS_FR_ERROR) {
            ms_api_error e;
            ms_api_fail(&e, 500, "server_error", NULL, NULL, "%s",
                        r->ch[i].error ? r->ch[i].error : "generation failed");
            ms_api_error_json(&e, o);
            return 500;
        }
    const char *m = r->srv->cfg.lim.model_names[0];
    ms_sbuf_adds(o, "{\"id\":");
    ms_sbuf_add_json_str(o, r->id, strlen(r->id));
    ms_sbuf_printf(o, ",\"object\":\"%s\",\"created\":%ld,\"model\":",
                   r->api.is_chat ? "chat.completion" : "text_completion", r->created);
    ms_sbuf_add_json_str(o, m, strlen(m));
    ms_sbuf_adds(o, ",\"system_fingerprint\":");
    ms_sbuf_add_json_str(o, r->srv->fingerprint, strlen(r->srv->fingerprint));
    ms_sbuf_adds(o, ",\"choices\":[");
    for (int i = 0; i < r->n_ch; i++) {
        choice *c = &r->ch[i];
        if (i) ms_sbuf_addc(o, ',');
        ms_sbuf_printf(o, "{\"index\":%d,", c->index);
        int fr = c->fr;
        if (!r->api.is_chat) {
            ms_sbuf_adds(o, "\"text\":");
            ms_sbuf_add_json_str(o, ms_sbuf_str(&c->text), c->text.len);
        } else {
            ms_sbuf reason = {0}, content = {0}, body = {0};
            ms_tool_calls calls = {0};
            if (c->use_reasoning) ms_reasoning_parse(ms_sbuf_str(&c->text), c->text.len, r->api.enable_thinking, &reason, &body);
            else ms_sbuf_add(&body, ms_sbuf_str(&c->text), c->text.len);
            if (c->use_tools) ms_tool_parse(r->srv->cfg.tool_parser, r->api.tools, ms_sbuf_str(&body), body.len, &content, &calls);
            else ms_sbuf_add(&content, ms_sbuf_str(&body), body.len);
            if (calls.n > 0 && fr == MS_FR_STOP) fr = MS_FR_TOOL;
            ms_sbuf_adds(o, "\"message\":{\"role\":\"assistant\",\"content\":");
            if (content.len) ms_sbuf_add_json_str(o, content.s, content.len);
            else ms_sbuf_adds(o, "null");
            ms_sbuf_adds(o, ",\"reasoning_content\":");
            if (reason.len) ms_sbuf_add_json_str(o, reason.s, reason.len);
            else ms_sbuf_adds(o, "null");
            if (calls.n) {
                ms_sbuf_adds(o, ",\"tool_calls\":[");
                for (int k = 0; k < calls.n; k++) {
                    if (k) ms_sbuf_addc(o, ',');
                    ms_sbuf_printf(o, "{\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":", calls.v[k].id);
                    ms_sbuf_add_json_str(o, calls.v[k].name, strlen(calls.v[k].name));
                    ms_sbuf_adds(o, ",\"arguments\":");
                    ms_sbuf_add_json_str(o, calls.v[k].arguments, strlen(calls.v[k].arguments));
                    ms_sbuf_adds(o, "}}");
                }
                ms_sbuf_addc(o, ']');
            }
            ms_sbuf_addc(o, '}');
            ms_tool_calls_free(&calls);
            ms_sbuf_free(&reason);
            ms_sbuf_free(&content);
            ms_sbuf_free(&body);
        }
        ms_sbuf_adds(o, ",\"logprobs\":");
        add_logprobs(r, c, o);
        ms_sbuf_printf(o, ",\"finish_reason\":\"%s\"}", fr_name(fr));
    }
    ms_sbuf_adds(o, "],\"usage\":");
    usage_json(r, o);
    ms_sbuf_addc(o, '}');
    return 200;
}

/* ---- streaming response reader ------------------------------------------------------------- */

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    req *r = cls;
    (void)pos;
    for (int spins = 0; spins < 1000; spins++) {
        if (r->out_pos < r->out.len) {
            size_t n = r->out.len - r->out_pos;
            if (n > max) n = max;
            memcpy(buf, r->out.s + r->out_pos, n);
            r->out_pos += n;
            return (ssize_t)n;
        }
        ms_sbuf_clear(&r->out);
        r->out_pos = 0;
        if (r->stream_closed) return MHD_CONTENT_READER_END_OF_STREAM;
        process_events(r);
        if (all_done(r)) stream_end(r);
        if (r->out.len) continue;
        pthread_mutex_lock(&r->mu);
        if (r->qn == 0) {
            r->suspended = 1;
            MHD_suspend_connection(r->conn);
            pthread_mutex_unlock(&r->mu);
            return 0;
        }
        pthread_mutex_unlock(&r->mu);
    }
    return 0;
}

/* ---- generation requests ------------------------------------------------------------------- */

static void abort_all(req *r) {
    for (int i = 0; i < r->n_ch; i++)
        if (r->ch[i].submitted && !r->ch[i].engine_done) r->ops.abort(r->ops.ctx, r->ch[i].eid);
}

static int tokenize_prompt(req *r, int pi, int32_t **ids, int *n, ms_api_error *e) {
    ms_err err = {0};
    if (r->api.is_chat) {
        char *text = NULL;
        size_t len = 0;
        if (r->ops.render_chat(r->ops.ctx, r->api.messages, r->api.tools, r->api.kwargs, &text, &len, &err) != MS_OK)
            return ms_api_fail(e, 400, "invalid_request_error", "messages", NULL,
                               "The chat template failed on these messages: %s", err.msg);
        int rc = r->ops.encode(r->ops.ctx, text, len, 0, ids, n, &err);
        free(text);
        if (rc != MS_OK) return ms_api_fail(e, 500, "server_error", NULL, NULL, "tokenizing the prompt failed: %s", err.msg);
        return 0;
    }
    ms_api_prompt *p = &r->api.prompts[pi];
    if (p->ids) {
        *ids = malloc((size_t)(p->n_ids ? p->n_ids : 1) * sizeof **ids);
        memcpy(*ids, p->ids, (size_t)p->n_ids * sizeof **ids);
        *n = p->n_ids;
        return 0;
    }
    if (r->ops.encode(r->ops.ctx, p->text, strlen(p->text), 1, ids, n, &err) != MS_OK)
        return ms_api_fail(e, 400, "invalid_request_error", "prompt", NULL, "tokenizing the prompt failed: %s", err.msg);
    return 0;
}

static enum MHD_Result start_generation(req *r, struct MHD_Connection *conn) {
    ms_server *s = r->srv;
    ms_api_error e;
    int is_chat = !strcmp(r->url, "/v1/chat/completions");
    if (ms_api_parse(&s->cfg.lim, is_chat, ms_sbuf_str(&r->body), r->body.len, &r->api, &e) != 0)
        return send_error(s, conn, &e);
    ms_api_req *a = &r->api;
    int n_inputs = is_chat ? 1 : a->n_prompts;
    if (n_inputs * a->n > 256)
        return fail(s, conn, 400, "invalid_request_error", "n", NULL, "prompts x n must be at most 256.");
    r->ch = calloc((size_t)(n_inputs * a->n), sizeof *r->ch);
    MS_ASSERT(r->ch != NULL);
    r->n_ch = n_inputs * a->n;
    ms_api_make_id(r->id, sizeof r->id, is_chat ? "chatcmpl-" : "cmpl-");
    r->created = (long)time(NULL);
    int ctx = s->cfg.lim.context_length;
    int32_t *ids[MS_API_MAX_PROMPTS] = {0};
    int nids[MS_API_MAX_PROMPTS] = {0};
    enum MHD_Result out = MHD_YES;
    int status = 0;
    for (int p = 0; p < n_inputs && !status; p++) {
        status = tokenize_prompt(r, p, &ids[p], &nids[p], &e);
        if (status) break;
        if (nids[p] == 0)
            status = ms_api_fail(&e, 400, "invalid_request_error", is_chat ? "messages" : "prompt", NULL, "The prompt is empty.");
        else if (ctx > 0 && nids[p] >= ctx)
            status = ms_api_fail(&e, 400, "invalid_request_error", is_chat ? "messages" : "prompt", "context_length_exceeded",
                                 "The prompt has %d tokens; this model's context length is %d.", nids[p], ctx);
        else if (ctx > 0 && a->sp.max_tokens > 0 && nids[p] + a->sp.max_tokens > ctx)
            status = ms_api_fail(&e, 400, "invalid_request_error", "max_tokens", "context_length_exceeded",
                                 "The prompt (%d tokens) plus max_tokens (%d) exceeds the context length %d.",
                                 nids[p], a->sp.max_tokens, ctx);
    }
    if (status) {
        out = send_error(s, conn, &e);
        goto done;
    }
    int use_reasoning = is_chat && s->cfg.reasoning_parser == MS_REASONING_GLM45 && a->separate_reasoning;
    int use_tools = is_chat && s->cfg.tool_parser >= 0 && a->tools != NULL;
    for (int i = 0; i < r->n_ch; i++) {
        choice *c = &r->ch[i];
        c->r = r;
        c->index = i;
        c->n_prompt_tokens = nids[i / a->n];
        c->detok = r->ops.detok_new(r->ops.ctx);
        ms_stopstr_init(&c->stop, a->stop, a->n_stop);
        c->use_reasoning = use_reasoning;
        ms_reasoning_init(&c->rp, a->enable_thinking);
        c->use_tools = use_tools;
        if (use_tools) c->ts = ms_tool_stream_new(s->cfg.tool_parser, a->tools);
    }
    r->phase = a->stream ? PH_STREAM : PH_WAIT;
    for (int i = 0; i < r->n_ch; i++) {
        choice *c = &r->ch[i];
        int np = nids[i / a->n];
        ms_sampling sp = a->sp;
        if (sp.max_tokens <= 0) sp.max_tokens = ctx > 0 ? ctx - np : 16;
        if (sp.has_seed) sp.seed += (uint64_t)(i % a->n);
        if (!sp.ignore_eos)
            for (int k = 0; k < s->cfg.n_eos && sp.n_stop_ids < MS_MAX_STOP_IDS; k++)
                sp.stop_ids[sp.n_stop_ids++] = s->cfg.eos_ids[k];
        ms_err err = {0};
        pthread_mutex_lock(&r->mu);
        r->refs++;
        pthread_mutex_unlock(&r->mu);
        int rc = r->ops.submit(r->ops.ctx, ids[i / a->n], np, &sp, on_token, c, &c->eid, &err);
        if (rc != MS_OK) {
            req_unref(r); /* never the last: the HTTP side holds one */
            abort_all(r);
            for (int k = i; k < r->n_ch; k++) r->ch[k].done = 1;
            for (int k = 0; k < i; k++) r->ch[k].done = 1;
            r->phase = PH_DONE;
            if (rc == MS_ERR_BUSY)
                ms_api_fail(&e, 503, "server_error", NULL, "server_busy", "The server is at capacity (%s); retry later.", err.msg);
            else if (rc == MS_ERR_INVALID)
                ms_api_fail(&e, 400, "invalid_request_error", NULL, NULL, "%s", err.msg);
            else
                ms_api_fail(&e, 500, "server_error", NULL, NULL, "submitting the request failed: %s", err.msg);
            out = send_error(s, conn, &e);
            goto done;
        }
        c->submitted = 1;
    }
    if (r->phase == PH_STREAM) {
        /* the role chunk of every choice goes out right away */
        for (int i = 0; i < r->n_ch; i++)
            if (is_chat) emit_chunk(r, &r->ch[i], "{\"role\":\"assistant\",\"content\":\"\"}", NULL, 0, NULL);
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, r, NULL);
        MHD_add_response_header(resp, "Content-Type", "text/event-stream; charset=utf-8");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        out = MHD_queue_response(conn, 200, resp);
        MHD_destroy_response(resp);
        ms_metrics_http(&s->metrics, 200);
        goto done;
    }
    /* non-streaming: wait (suspended) for the engine */
    pthread_mutex_lock(&r->mu);
    if (r->qn == 0) {
        r->suspended = 1;
        MHD_suspend_connection(conn);
    }
    pthread_mutex_unlock(&r->mu);
done:
    for (int p = 0; p < n_inputs; p++) free(ids[p]);
    return out;
}

/* Non-streaming request resumed by an engine event. */
static enum MHD_Result continue_wait(req *r, struct MHD_Connection *conn) {
    for (;;) {
        process_events(r);
        if (all_done(r)) {
            ms_sbuf o = {0};
            int st = build_response(r, &o);
            r->phase = PH_DONE;
            enum MHD_Result rc = send_json(r->srv, conn, st, &o);
            ms_sbuf_free(&o);
            return rc;
        }
        pthread_mutex_lock(&r->mu);
        if (r->qn == 0) {
            r->suspended = 1;
            MHD_suspend_connection(conn);
            pthread_mutex_unlock(&r->mu);
            return MHD_YES;
        }
        pthread_mutex_unlock(&r->mu);
    }
}

/* ---- simple routes --------------------------------------------------------------------------- */

static enum MHD_Result route_models(ms_server *s, struct MHD_Connection *c) {
    ms_sbuf b = {0};
    ms_sbuf_adds(&b, "{\"object\":\"list\",\"data\":[");
    const char *m = s->cfg.lim.model_names[0];
    ms_sbuf_adds(&b, "{\"id\":");
    ms_sbuf_add_json_str(&b, m, strlen(m));
    ms_sbuf_printf(&b, ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"moeserve\",\"root\":", (long)s->t_start);
    const char *root = s->cfg.model_path ? s->cfg.model_path : m;
    ms_sbuf_add_json_str(&b, root, strlen(root));
    ms_sbuf_printf(&b, ",\"max_model_len\":%d}]}", s->cfg.lim.context_length);
    enum MHD_Result rc = send_json(s, c, 200, &b);
    ms_sbuf_free(&b);
    return rc;
}

static enum MHD_Result route_info(ms_server *s, struct MHD_Connection *c) {
    json_t *o = json_object();
    json_object_set_new(o, "model_path", json_string(s->cfg.model_path ? s->cfg.model_path : ""));
    json_object_set_new(o, "served_model_name", json_string(s->cfg.lim.model_names[0]));
    json_t *aliases = json_array();
    for (int i = 1; i < 8 && s->cfg.lim.model_names[i]; i++) json_array_append_new(aliases, json_string(s->cfg.lim.model_names[i]));
    json_object_set_new(o, "model_aliases", aliases);
    json_object_set_new(o, "context_length", json_integer(s->cfg.lim.context_length));
    json_object_set_new(o, "vocab_size", json_integer(s->cfg.lim.vocab_size));
    json_object_set_new(o, "reasoning_parser", s->cfg.reasoning_parser == MS_REASONING_GLM45 ? json_string("glm45") : json_null());
    json_object_set_new(o, "tool_call_parser", s->cfg.tool_parser == MS_TOOL_GLM47 ? json_string("glm47")
                                              : s->cfg.tool_parser == MS_TOOL_GLM45 ? json_string("glm45") : json_null());
    json_object_set_new(o, "max_request_bytes", json_integer((json_int_t)s->cfg.max_request_bytes));
    json_object_set_new(o, "api_key_required", json_boolean(s->cfg.api_key && s->cfg.api_key[0]));
    json_error_t je;
    json_t *flags = s->cfg.info_json ? json_loads(s->cfg.info_json, 0, &je) : NULL;
    json_object_set_new(o, "flags", flags ? flags : json_object());
    json_t *ver = json_object();
    json_object_set_new(ver, "moeserve", json_string(s->cfg.version ? s->cfg.version : ""));
    json_object_set_new(ver, "libmicrohttpd", json_string(MHD_get_version()));
    json_object_set_new(ver, "jansson", json_string(jansson_version_str()));
    json_object_set_new(o, "versions", ver);
    json_object_set_new(o, "uptime_s", json_real(ms_now() - s->t_start));
    char *txt = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    enum MHD_Result rc = send_buf(s, c, 200, "application/json", txt, strlen(txt), NULL);
    free(txt);
    return rc;
}

static enum MHD_Result route_metrics(ms_server *s, struct MHD_Connection *c) {
    ms_engine_stats es;
    memset(&es, 0, sizeof es);
    s->ops.stats(s->ops.ctx, &es);
    ms_sbuf b = {0};
    ms_metrics_write(&s->metrics, &es, s->cfg.lim.model_names[0], &b);
    enum MHD_Result rc = send_buf(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", ms_sbuf_str(&b), b.len, NULL);
    ms_sbuf_free(&b);
    return rc;
}

static enum MHD_Result route_health(ms_server *s, struct MHD_Connection *c) {
    ms_engine_stats es;
    memset(&es, 0, sizeof es);
    s->ops.stats(s->ops.ctx, &es);
    if (!es.healthy)
        return fail(s, c, 503, "server_error", NULL, "engine_unhealthy", "The engine is unhealthy.");
    return send_buf(s, c, 200, "application/json", "{}", 2, NULL);
}

/* ---- libmicrohttpd callbacks ------------------------------------------------------------------- */

static int needs_auth(const char *url) { return !strncmp(url, "/v1/", 4) || !strcmp(url, "/get_server_info"); }

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    ms_server *s = cls;
    (void)version;
    req *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->srv = s;
        r->ops = s->ops;
        pthread_mutex_init(&r->mu, NULL);
        r->refs = 1;
        r->conn = conn;
        r->t0 = ms_now();
        r->is_post = !strcmp(method, "POST");
        snprintf(r->url, sizeof r->url, "%s", url);
        char *q = strchr(r->url, '?');
        if (q) *q = 0;
        pthread_mutex_lock(&s->live_mu);
        r->live_next = s->live;
        if (s->live) s->live->live_prev = r;
        s->live = r;
        pthread_mutex_unlock(&s->live_mu);
        *con_cls = r;
        if (needs_auth(r->url) &&
            !auth_ok(s->cfg.api_key, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization"))) {
            r->phase = PH_DONE;
            return fail(s, conn, 401, "invalid_request_error", NULL, "invalid_api_key",
                        "Incorrect or missing API key: send 'Authorization: Bearer <key>'.");
        }
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_request_bytes) {
            r->phase = PH_DONE;
            char msg[160];
            snprintf(msg, sizeof msg, "The request body is larger than the limit of %zu bytes.", s->cfg.max_request_bytes);
            return fail(s, conn, 413, "invalid_request_error", NULL, "request_too_large", msg);
        }
        return MHD_YES;
    }
    if (r->phase == PH_DONE) { *upload_size = 0; return MHD_YES; }
    if (r->phase == PH_WAIT) return continue_wait(r, conn);
    if (*upload_size) {
        if (!r->too_large && r->body.len + *upload_size <= s->cfg.max_request_bytes) ms_sbuf_add(&r->body, upload, *upload_size);
        else r->too_large = 1;
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->too_large) {
        r->phase = PH_DONE;
        char msg[160];
        snprintf(msg, sizeof msg, "The request body is larger than the limit of %zu bytes.", s->cfg.max_request_bytes);
        return fail(s, conn, 413, "invalid_request_error", NULL, "request_too_large", msg);
    }
    const char *u = r->url;
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (s->stopping) { r->phase = PH_DONE; return fail(s, conn, 503, "server_error", NULL, "shutting_down", "The server is shutting down."); }
    if (!strcmp(u, "/v1/chat/completions") || !strcmp(u, "/v1/completions")) {
        if (!r->is_post) { r->phase = PH_DONE; return fail(s, conn, 405, "invalid_request_error", NULL, "method_not_allowed", "Use POST for this route."); }
        r->phase = PH_DONE;
        return start_generation(r, conn);
    }
    r->phase = PH_DONE;
    if (get && (!strcmp(u, "/") || !strcmp(u, "/index.html")))
        return send_buf(s, conn, 200, "text/html; charset=utf-8", ms_chat_page_html, strlen(ms_chat_page_html), NULL);
    if (get && !strcmp(u, "/health")) return route_health(s, conn);
    if (get && !strcmp(u, "/metrics")) return route_metrics(s, conn);
    if (get && (!strcmp(u, "/v1/models") || !strncmp(u, "/v1/models/", 11))) {
        if (u[10] == '/') {
            int known = 0;
            for (int i = 0; i < 8 && s->cfg.lim.model_names[i]; i++) known |= !strcmp(u + 11, s->cfg.lim.model_names[i]);
            if (!known) return fail(s, conn, 404, "invalid_request_error", "model", "model_not_found", "No such model.");
        }
        return route_models(s, conn);
    }
    if (get && !strcmp(u, "/get_server_info")) return route_info(s, conn);
    return fail(s, conn, 404, "invalid_request_error", NULL, "not_found", "No such route.");
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    if (ms_log_level() < MS_LOG_DEBUG) return;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && buf[n - 1] == '\n') buf[--n] = 0;
    MS_LOGD("libmicrohttpd: %s", buf);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    ms_server *s = cls;
    (void)conn;
    req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    pthread_mutex_lock(&s->live_mu);
    if (r->live_prev) r->live_prev->live_next = r->live_next;
    else s->live = r->live_next;
    if (r->live_next) r->live_next->live_prev = r->live_prev;
    pthread_mutex_unlock(&s->live_mu);
    pthread_mutex_lock(&r->mu);
    r->mhd_done = 1;
    pthread_mutex_unlock(&r->mu);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK || !all_done(r)) {
        /* client went away (or the response ended early): free the engine's work */
        abort_all(r);
        for (int i = 0; i < r->n_ch; i++)
            if (!r->ch[i].done) ms_metrics_finish(&s->metrics, ms_now() - r->t0, MS_FR_ABORT, r->ch[i].n_prompt, r->ch[i].n_gen);
    }
    req_unref(r);
}

int ms_server_start(const ms_server_config *cfg, const ms_server_ops *ops, ms_server **out, ms_err *err) {
    ms_server *s = calloc(1, sizeof *s);
    if (!s) return ms_errf(err, MS_ERR_NOMEM, "server: out of memory");
    s->cfg = *cfg;
    s->ops = *ops;
    if (!s->cfg.host || !s->cfg.host[0]) s->cfg.host = "127.0.0.1";
    if (!s->cfg.max_request_bytes) s->cfg.max_request_bytes = 10u << 20;
    if (s->cfg.n_threads <= 0) s->cfg.n_threads = 4;
    if (!s->cfg.lim.model_names[0]) s->cfg.lim.model_names[0] = "default";
    s->t_start = (double)time(NULL);
    snprintf(s->fingerprint, sizeof s->fingerprint, "moeserve-%s", s->cfg.version ? s->cfg.version : "0");
    ms_metrics_init(&s->metrics);
    pthread_mutex_init(&s->live_mu, NULL);

    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    struct sockaddr *sa;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    memset(&a4, 0, sizeof a4);
    memset(&a6, 0, sizeof a6);
    if (inet_pton(AF_INET, s->cfg.host, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)s->cfg.port);
        sa = (struct sockaddr *)&a4;
    } else if (inet_pton(AF_INET6, s->cfg.host, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)s->cfg.port);
        sa = (struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else {
        ms_metrics_destroy(&s->metrics);
        free(s);
        return ms_errf(err, MS_ERR_INVALID, "flag --host: '%s' is not an IPv4 or IPv6 address", cfg->host);
    }
    s->d = MHD_start_daemon(flags, (uint16_t)s->cfg.port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, sa,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->cfg.n_threads,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)4096,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
                            MHD_OPTION_END);
    if (!s->d) {
        ms_metrics_destroy(&s->metrics);
        free(s);
        return ms_errf(err, MS_ERR_IO, "flag --port: cannot listen on %s:%d (in use or not permitted)", cfg->host, cfg->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->cfg.port;
    *out = s;
    return MS_OK;
}

int ms_server_port(const ms_server *s) { return s->port; }

/* Sets a flag on every live request and wakes it (lock order: live_mu, then r->mu). */
static int flag_live(ms_server *s, int force) {
    int n = 0;
    pthread_mutex_lock(&s->live_mu);
    for (req *r = s->live; r; r = r->live_next) {
        n++;
        pthread_mutex_lock(&r->mu);
        r->shutdown = 1;
        if (force) r->force_end = 1;
        if (r->suspended) {
            r->suspended = 0;
            MHD_resume_connection(r->conn);
        }
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&s->live_mu);
    return n;
}

void ms_server_stop(ms_server *s) {
    if (!s) return;
    s->stopping = 1;
    /* abort everything in flight; the engine's final events end the responses */
    for (int round = 0; round < 300 && flag_live(s, 0) > 0; round++) usleep(10000);
    /* still there after 3 s: end them without waiting for the engine */
    for (int round = 0; round < 100 && flag_live(s, 1) > 0; round++) usleep(10000);
    /* MHD_stop_daemon must not see suspended connections; none is left suspended above */
    MHD_stop_daemon(s->d);
    pthread_mutex_destroy(&s->live_mu);
    ms_metrics_destroy(&s->metrics);
    free(s);
}
