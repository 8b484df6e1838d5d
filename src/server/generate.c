/* generate.c - the generation routes, POST /v1/chat/completions and /v1/completions.
 *
 * Both routes share one path (they differ in parsing and prompt rendering, which ms_api_parse and
 * tokenize_prompt handle): validate, tokenize, submit one engine request per choice, then hand the
 * connection to sse.c (stream) or suspend it until response.c can answer. */
#include "server/server_int.h"

#include "core/fileutil.h"
#include "core/log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

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

enum MHD_Result ms_srv_start_generation(req *r, struct MHD_Connection *conn) {
    ms_server *s = r->srv;
    ms_api_error e;
    int is_chat = !strcmp(r->url, "/v1/chat/completions");
    if (ms_api_parse(&s->cfg.lim, is_chat, ms_sbuf_str(&r->body), r->body.len, &r->api, &e) != 0)
        return ms_srv_send_error(s, conn, &e);
    ms_api_req *a = &r->api;
    int n_inputs = is_chat ? 1 : a->n_prompts;
    if (n_inputs * a->n > s->cfg.max_choices) { /* one request must not claim the whole batch */
        char msg[160];
        snprintf(msg, sizeof msg, "prompts x n is %d; this server allows at most %d (--max-choices-per-request).",
                 n_inputs * a->n, s->cfg.max_choices);
        return ms_srv_fail(s, conn, 400, "invalid_request_error", "n", NULL, msg);
    }
    r->ch = calloc((size_t)(n_inputs * a->n), sizeof *r->ch);
    if (!r->ch) return ms_srv_fail(s, conn, 500, "server_error", NULL, NULL, "out of memory for the request's choices");
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
    ms_grammar *grammar = NULL;
    if (!status) status = ms_srv_build_grammar(r, &grammar, &e);
    if (status) {
        out = ms_srv_send_error(s, conn, &e);
        goto done;
    }
    /* a reasoning model thinks freely first: the grammar applies after </think> */
    int32_t think_end = -1;
    if (grammar && is_chat && s->cfg.reasoning_parser == MS_REASONING_GLM45 && a->enable_thinking && r->ops.token_id)
        think_end = r->ops.token_id(r->ops.ctx, "</think>");
    int use_reasoning = is_chat && s->cfg.reasoning_parser == MS_REASONING_GLM45 && a->separate_reasoning;
    int use_tools = is_chat && s->cfg.tool_parser >= 0 && a->tools != NULL;
    if (use_tools) {
        /* a named tool_choice is not enforced while decoding (no constrained decoding yet), but
         * calls to any other tool are dropped */
        r->parser_tools = json_incref(a->tools);
        if (a->tool_choice == MS_TOOLCHOICE_NAMED) {
            json_decref(r->parser_tools);
            r->parser_tools = json_array();
            size_t k;
            json_t *t;
            json_array_foreach(a->tools, k, t) {
                const char *nm = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
                if (nm && !strcmp(nm, a->tool_choice_name)) json_array_append(r->parser_tools, t);
            }
        }
    }
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
        if (use_tools) c->ts = ms_tool_stream_new(s->cfg.tool_parser, r->parser_tools);
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
        int rc = MS_OK;
        if (grammar) {
            sp.grammar = ms_grammar_matcher_new(grammar);
            if (!sp.grammar) rc = ms_errf(&err, MS_ERR_NOMEM, "out of memory for the grammar matcher");
            else if (think_end >= 0) ms_grammar_matcher_set_free_until(sp.grammar, think_end);
        }
        pthread_mutex_lock(&r->mu);
        r->refs++;
        pthread_mutex_unlock(&r->mu);
        if (i == 0) r->t_submitted = ms_now();
        if (rc == MS_OK) rc = r->ops.submit(r->ops.ctx, ids[i / a->n], np, &sp, ms_srv_on_token, c, &c->eid, &err);
        if (rc != MS_OK) {
            ms_grammar_matcher_free(sp.grammar); /* a failed submit leaves it with us */
            ms_srv_req_unref(r); /* never the last: the HTTP side holds one */
            ms_srv_abort_all(r);
            for (int k = i; k < r->n_ch; k++) r->ch[k].done = 1;
            for (int k = 0; k < i; k++) r->ch[k].done = 1;
            r->phase = PH_DONE;
            if (rc == MS_ERR_BUSY)
                ms_api_fail(&e, 503, "server_error", NULL, "server_busy", "The server is at capacity (%s); retry later.", err.msg);
            else if (rc == MS_ERR_INVALID)
                ms_api_fail(&e, 400, "invalid_request_error", NULL, NULL, "%s", err.msg);
            else
                ms_api_fail(&e, 500, "server_error", NULL, NULL, "submitting the request failed: %s", err.msg);
            out = ms_srv_send_error(s, conn, &e);
            goto done;
        }
        c->submitted = 1;
    }
    r->streaming = r->phase == PH_STREAM;
    r->t_progress_ms = (long long)(ms_now() * 1000.0);
    r->wd_state = 1; /* submitted: the watchdog looks for a vanished or stalled client */
    if (r->phase == PH_STREAM) {
        /* the role chunk of every choice goes out right away */
        for (int i = 0; i < r->n_ch; i++)
            if (is_chat) ms_srv_emit_chunk(r, &r->ch[i], "{\"role\":\"assistant\",\"content\":\"\"}", NULL, 0, NULL);
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, ms_srv_stream_reader, r, NULL);
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
    ms_grammar_unref(grammar); /* the matchers hold their own references */
    for (int p = 0; p < n_inputs; p++) free(ids[p]);
    return out;
}

