/* request.c - request objects, the engine event queue and the token -> text pipeline.
 *
 * Engine callbacks only queue events here; everything that turns tokens into text (detokenizer,
 * stop strings, logprobs, finish) runs on the HTTP thread that owns the request, so the parsers
 * need no locks. Text released by the pipeline goes to sse.c (streaming) or is kept whole for
 * response.c. */
#include "server/server_int.h"

#include "core/fileutil.h"
#include "core/log.h"

#include <stdlib.h>
#include <string.h>

static const char *const KEEP_TAGS[] = {"<think>", "</think>", "<tool_call>", "</tool_call>",
                                        "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
                                        "<tool_response>", "</tool_response>"};

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
    json_decref(r->parser_tools);
    ms_api_req_free(&r->api);
    ms_sbuf_free(&r->body);
    ms_sbuf_free(&r->out);
    free(r->q);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Drops one reference (lock not held); frees on the last. */
void ms_srv_req_unref(req *r) {
    pthread_mutex_lock(&r->mu);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last) req_free(r);
}

/* Engine thread: queue the event, wake the connection. Never blocks for long. */
void ms_srv_on_token(void *user, const ms_token_event *ev) {
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

static void release_text(req *r, choice *c, const char *s, size_t n, int final) {
    if (r->phase == PH_STREAM) ms_srv_stream_text(r, c, s, n, final);
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

/* The text of one token, special tokens kept (malloc'd, never NULL; "" when decoding fails). */
static char *token_text(req *r, int32_t id, size_t *len) {
    char *s = NULL;
    ms_err err = {0};
    *len = 0;
    if (r->ops.decode(r->ops.ctx, &id, 1, &s, len, &err) != MS_OK || !s) {
        free(s);
        *len = 0;
        return strdup("");
    }
    return s;
}

/* A chat logprob entry's fields: "token", "logprob" and "bytes" (no braces). */
static void chat_logprob_fields(ms_sbuf *o, const char *tok, size_t tl, float logprob) {
    ms_sbuf_adds(o, "\"token\":");
    ms_sbuf_add_json_str(o, tok, tl);
    ms_sbuf_adds(o, ",\"logprob\":");
    ms_sbuf_add_float(o, logprob);
    ms_sbuf_adds(o, ",\"bytes\":[");
    for (size_t i = 0; i < tl; i++) ms_sbuf_printf(o, i ? ",%u" : "%u", (unsigned char)tok[i]);
    ms_sbuf_addc(o, ']');
}

static void add_token_logprobs(req *r, choice *c, const ms_token_event *ev) {
    size_t tl = 0;
    char *tok = token_text(r, ev->token, &tl);
    if (r->api.is_chat) {
        ms_sbuf *o = &c->lp;
        if (c->lp_count++) ms_sbuf_addc(o, ',');
        ms_sbuf_addc(o, '{');
        chat_logprob_fields(o, tok, tl, ev->logprob);
        ms_sbuf_adds(o, ",\"top_logprobs\":[");
        for (int k = 0; k < ev->n_top && k < r->api.top_logprobs; k++) {
            size_t l2 = 0;
            char *t2 = token_text(r, ev->top_ids[k], &l2);
            ms_sbuf_adds(o, k ? ",{" : "{");
            chat_logprob_fields(o, t2, l2, ev->top_logprobs[k]);
            ms_sbuf_addc(o, '}');
            free(t2);
        }
        ms_sbuf_adds(o, "]}");
    } else {
        const char *sep = c->lp_count++ ? "," : "";
        ms_sbuf_adds(&c->lp_tok, sep);
        ms_sbuf_add_json_str(&c->lp_tok, tok, tl);
        ms_sbuf_adds(&c->lp_val, sep);
        ms_sbuf_add_float(&c->lp_val, ev->logprob);
        ms_sbuf_printf(&c->lp_off, "%s%zu", sep, c->text_off);
        ms_sbuf_adds(&c->lp_top, sep);
        ms_sbuf_addc(&c->lp_top, '{');
        for (int k = 0; k < ev->n_top && k < r->api.top_logprobs; k++) {
            size_t l2 = 0;
            char *t2 = token_text(r, ev->top_ids[k], &l2);
            if (k) ms_sbuf_addc(&c->lp_top, ',');
            ms_sbuf_add_json_str(&c->lp_top, t2, l2);
            ms_sbuf_addc(&c->lp_top, ':');
            ms_sbuf_add_float(&c->lp_top, ev->top_logprobs[k]);
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
            ms_srv_emit_chunk(r, c, "{}", "", 0, ms_srv_fr_name(fr));
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
            if (ev->t_admit > 0 && ev->t_submit > 0) { /* engines that keep no times (test doubles) report 0 */
                double now = ms_now();
                ms_metrics_ttft_parts(&r->srv->metrics, r->t_submitted - r->t0, ev->t_admit - ev->t_submit,
                                      it->t - ev->t_admit, now - it->t);
                MS_LOGD("%s first token: %.1f ms = pre-engine %.1f + queue %.1f + prefill %.1f (+ delivery %.1f)%s", r->id,
                        (it->t - r->t0) * 1e3, (r->t_submitted - r->t0) * 1e3, (ev->t_admit - ev->t_submit) * 1e3,
                        (it->t - ev->t_admit) * 1e3, (now - it->t) * 1e3, r->api.stream ? " stream" : "");
            }
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
               : ev->finish == MS_FINISH_GRAMMAR_END  ? MS_FR_STOP
               : ev->finish == MS_FINISH_GRAMMAR_DEAD ? MS_FR_GRAMMAR
               : ev->finish == MS_FINISH_ERROR  ? MS_FR_ERROR
                                                : MS_FR_ABORT;
        finish_choice(r, c, fr);
    }
}

int ms_srv_all_done(req *r) {
    for (int i = 0; i < r->n_ch; i++)
        if (!r->ch[i].done) return 0;
    return 1;
}

/* Server shutdown, seen from the HTTP thread that owns r: abort the engine requests (their final
 * events end the response), or when forced, end every choice right away. */
static void check_shutdown(req *r) {
    pthread_mutex_lock(&r->mu);
    int sd = r->shutdown, fe = r->force_end;
    pthread_mutex_unlock(&r->mu);
    if (sd && !r->shutdown_seen) {
        r->shutdown_seen = 1;
        ms_srv_abort_all(r);
    }
    if (fe)
        for (int i = 0; i < r->n_ch; i++)
            if (!r->ch[i].done) finish_choice(r, &r->ch[i], MS_FR_ABORT);
}

/* Takes queued events and processes them on the HTTP thread. */
void ms_srv_process_events(req *r) {
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
void ms_srv_abort_all(req *r) {
    for (int i = 0; i < r->n_ch; i++)
        if (r->ch[i].submitted && !r->ch[i].engine_done) r->ops.abort(r->ops.ctx, r->ch[i].eid);
}

