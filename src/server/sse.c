/* sse.c - Server-Sent Events: chunk framing, chat deltas, and the streaming content reader.
 *
 * Streaming is where the OpenAI wire format is most particular (role chunk, reasoning and tool-call
 * deltas, usage chunk, [DONE]); keeping it apart from the pipeline keeps both readable. */
#include "server/server_int.h"

#include "core/fileutil.h"

#include <string.h>

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
void ms_srv_emit_chunk(req *r, choice *c, const char *delta_json, const char *text, size_t tlen,
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
    ms_srv_add_logprobs(r, c, o);
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
    ms_srv_emit_chunk(r, c, d.s, NULL, 0, NULL);
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
        ms_srv_emit_chunk(r, c, d.s, NULL, 0, NULL);
        ms_sbuf_free(&d);
    }
}

/* Streaming: route released text through the reasoning and tool parsers into chunks. */
void ms_srv_stream_text(req *r, choice *c, const char *s, size_t n, int final) {
    if (!r->api.is_chat) {
        if (n) ms_srv_emit_chunk(r, c, NULL, s, n, NULL);
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

/* Streaming end: usage chunk when asked for, then [DONE]. */
static void stream_end(req *r) {
    if (r->api.include_usage) {
        chunk_head(r, &r->out);
        ms_sbuf_adds(&r->out, "],\"usage\":");
        ms_srv_usage_json(r, &r->out);
        ms_sbuf_adds(&r->out, "}\n\n");
    }
    ms_sbuf_adds(&r->out, "data: [DONE]\n\n");
    r->stream_closed = 1;
}

/* ---- streaming response reader ------------------------------------------------------------- */

ssize_t ms_srv_stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    req *r = cls;
    (void)pos;
    pthread_mutex_lock(&r->mu);
    int kill = r->kill;
    pthread_mutex_unlock(&r->mu);
    if (kill) { /* the watchdog saw the client go or stop reading: end the stream, free the engine's work */
        ms_srv_abort_all(r);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    for (int spins = 0; spins < 1000; spins++) {
        if (r->out_pos < r->out.len) {
            size_t n = r->out.len - r->out_pos;
            if (n > max) n = max;
            memcpy(buf, r->out.s + r->out_pos, n);
            r->out_pos += n;
            r->t_progress_ms = (long long)(ms_now() * 1000.0);
            return (ssize_t)n;
        }
        ms_sbuf_clear(&r->out);
        r->out_pos = 0;
        if (r->stream_closed) return MHD_CONTENT_READER_END_OF_STREAM;
        ms_srv_process_events(r);
        if (ms_srv_all_done(r)) stream_end(r);
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

