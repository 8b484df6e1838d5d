/* response.c - the non-streaming response object and the fields it shares with streaming
 * (finish_reason names, usage, logprobs). */
#include "server/server_int.h"

#include <string.h>

const char *ms_srv_fr_name(int fr) {
    static const char *n[MS_FR_N] = {"stop", "length", "tool_calls", "abort", "error", "grammar_unsatisfiable"};
    return fr >= 0 && fr < MS_FR_N ? n[fr] : "stop";
}

void ms_srv_add_logprobs(req *r, choice *c, ms_sbuf *o) {
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
void ms_srv_usage_json(req *r, ms_sbuf *o) {
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
            if (c->use_tools) ms_tool_parse(r->srv->cfg.tool_parser, r->parser_tools, ms_sbuf_str(&body), body.len, &content, &calls);
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
        ms_srv_add_logprobs(r, c, o);
        ms_sbuf_printf(o, ",\"finish_reason\":\"%s\"}", ms_srv_fr_name(fr));
    }
    ms_sbuf_adds(o, "],\"usage\":");
    ms_srv_usage_json(r, o);
    ms_sbuf_addc(o, '}');
    return 200;
}

/* Non-streaming request resumed by an engine event. */
enum MHD_Result ms_srv_continue_wait(req *r, struct MHD_Connection *conn) {
    for (;;) {
        ms_srv_process_events(r);
        if (ms_srv_all_done(r)) {
            ms_sbuf o = {0};
            int st = build_response(r, &o);
            r->phase = PH_DONE;
            r->wd_state = 2;
            enum MHD_Result rc = ms_srv_send_json(r->srv, conn, st, &o);
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

