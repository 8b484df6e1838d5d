/* serve_deps.c - see serve_deps.h. */
#include "server/serve_deps.h"

#include "core/fileutil.h"
#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


int ms_serve_deps_linked(char *why, size_t cap) {
    (void)why;
    (void)cap;
    return 1; /* every dependency is linked strongly; kept so callers need no #ifdef */
}

int ms_serve_model_open(const ms_exec_opts *o, ms_serve_model *out, ms_err *err) {
    memset(out, 0, sizeof *out);
    MS_TRY(ms_model_executor_open(o, &out->exec, &out->model, err));
    if (out->model) {
        const ms_config *c = &out->model->cfg;
        out->context_length = c->max_position_embeddings;
        for (int i = 0; i < c->n_eos && i < 16; i++) out->eos[out->n_eos++] = c->eos_token_ids[i];
    }
    return MS_OK;
}

void ms_serve_model_close(ms_serve_model *m) {
    ms_model_executor_close(&m->exec);
    memset(m, 0, sizeof *m);
}

/* ---- ops over the real tokenizer / template / engine ---- */

static int r_encode(void *ctx, const char *text, size_t len, int add_special, int32_t **ids, int *n, ms_err *err) {
    ms_real_ops *c = ctx;
    return ms_tokenizer_encode(c->tok, text, len, add_special, ids, n, err);
}

static int r_render(void *ctx, json_t *messages, json_t *tools, json_t *kwargs, char **out, size_t *len, ms_err *err) {
    ms_real_ops *c = ctx;
    if (!c->tmpl)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "the model has no chat template (pass --chat-template FILE)");
    return ms_chat_render(c->tmpl, messages, tools, 1, kwargs, ms_tokenizer_bos_token(c->tok),
                          ms_tokenizer_eos_token(c->tok), out, len, err);
}

static int r_decode(void *ctx, const int32_t *ids, int n, char **out, size_t *len, ms_err *err) {
    ms_real_ops *c = ctx;
    return ms_tokenizer_decode(c->tok, ids, n, 0, out, len, err);
}

static int r_is_special(void *ctx, int32_t id) { return ms_tokenizer_is_special(((ms_real_ops *)ctx)->tok, id); }
static const char *r_content(void *ctx, int32_t id) { return ms_tokenizer_id_to_token(((ms_real_ops *)ctx)->tok, id); }
static void *r_detok_new(void *ctx) { return ms_detok_new(((ms_real_ops *)ctx)->tok, 0); }
static void r_detok_free(void *d) { ms_detok_free(d); }
static int r_detok_push(void *d, int32_t id, char **buf, size_t *len, size_t *cap, ms_err *err) {
    return ms_detok_push(d, id, buf, len, cap, err);
}
static int r_detok_flush(void *d, char **buf, size_t *len, size_t *cap, ms_err *err) {
    return ms_detok_flush(d, buf, len, cap, err);
}

static int r_submit(void *ctx, const int32_t *prompt, int n, const ms_sampling *sp, ms_token_cb cb, void *user,
                    uint64_t *id, ms_err *err) {
    return ms_engine_submit(((ms_real_ops *)ctx)->eng, prompt, n, sp, cb, user, id, err);
}
static void r_abort(void *ctx, uint64_t id) { ms_engine_abort(((ms_real_ops *)ctx)->eng, id); }
static void r_stats(void *ctx, ms_engine_stats *out) { ms_engine_get_stats(((ms_real_ops *)ctx)->eng, out); }

/* Builds the grammar vocabulary (the token trie over the tokenizer's byte strings; 0.3-1.5 s on a
 * 150k vocabulary) once, under gmu. */
static int grammar_vocab(ms_real_ops *o, ms_err *err) {
    pthread_mutex_lock(&o->gmu);
    int rc = MS_OK;
    if (!o->gvocab) {
        double t0 = ms_now();
        rc = ms_grammar_vocab_from_tokenizer(o->tok, &o->gvocab, err);
        if (rc == MS_OK) MS_LOGI("grammar: vocabulary trie of %d tokens built in %.0f ms", ms_grammar_vocab_size(o->gvocab), (ms_now() - t0) * 1e3);
    }
    if (rc == MS_OK && !o->gcache && !(o->gcache = ms_grammar_cache_new(16)))
        rc = ms_errf(err, MS_ERR_NOMEM, "grammar cache: out of memory");
    pthread_mutex_unlock(&o->gmu);
    return rc;
}

int ms_real_ops_prepare_grammar(ms_real_ops *ctx, ms_err *err) { return grammar_vocab(ctx, err); }

/* Runs on the HTTP worker that admits the request: compiles a grammar new to the cache and
 * precomputes its token cache there (ms_grammar_precompute), so the engine thread's masks are cache
 * hits. Compilations are serialized (gcmu): requests arriving together with one new schema wait for
 * the first one's work instead of repeating it. */
static int r_grammar_compile(void *ctx, const char *gbnf, ms_grammar **out, ms_err *err) {
    ms_real_ops *o = ctx;
    *out = NULL;
    MS_TRY(grammar_vocab(o, err));
    if ((*out = ms_grammar_cache_get(o->gcache, gbnf))) return MS_OK;
    pthread_mutex_lock(&o->gcmu);
    int rc = MS_OK;
    if (!(*out = ms_grammar_cache_get(o->gcache, gbnf))) {
        rc = ms_grammar_compile_gbnf(gbnf, o->gvocab, out, err);
        if (rc == MS_OK) {
            ms_grammar_precompute_stats st;
            if (ms_grammar_precompute(*out, MS_GRAMMAR_PRECOMPUTE_STACKS, MS_GRAMMAR_PRECOMPUTE_SECONDS, &st) == 0)
                MS_LOGD("grammar: precomputed %d contexts from %d stacks in %.1f ms%s", st.contexts, st.stacks, st.seconds * 1e3,
                        st.truncated ? " (stopped by a limit; the rest on first use)" : "");
            ms_grammar_cache_put(o->gcache, gbnf, *out);
        }
    }
    pthread_mutex_unlock(&o->gcmu);
    return rc;
}

static int32_t r_token_id(void *ctx, const char *content) { return ms_tokenizer_token_to_id(((ms_real_ops *)ctx)->tok, content); }

void ms_real_ops_release(ms_real_ops *ctx) {
    ms_grammar_cache_free(ctx->gcache);
    ms_grammar_vocab_free(ctx->gvocab);
    ctx->gcache = NULL;
    ctx->gvocab = NULL;
}

ms_server_ops ms_server_ops_real(ms_real_ops *ctx) {
    ms_server_ops o;
    memset(&o, 0, sizeof o);
    o.ctx = ctx;
    o.encode = r_encode;
    o.render_chat = r_render;
    o.decode = r_decode;
    o.is_special = r_is_special;
    o.token_content = r_content;
    o.detok_new = r_detok_new;
    o.detok_push = r_detok_push;
    o.detok_flush = r_detok_flush;
    o.detok_free = r_detok_free;
    o.submit = r_submit;
    o.abort = r_abort;
    o.stats = r_stats;
    o.grammar_compile = r_grammar_compile;
    o.token_id = r_token_id;
    pthread_mutex_init(&ctx->gmu, NULL);
    pthread_mutex_init(&ctx->gcmu, NULL);
    return o;
}

/* ---- the whole stack ---- */

int ms_serve_stack_open(const ms_serve_stack_opts *o, ms_serve_stack *s, ms_err *err) {
    memset(s, 0, sizeof *s);
    char why[160];
    if (!ms_serve_deps_linked(why, sizeof why)) return ms_errf(err, MS_ERR_UNSUPPORTED, "%s", why);
    const char *tp = o->tokenizer_path ? o->tokenizer_path : o->exec.model_path;
    int rc = ms_tokenizer_load(tp, &s->tok, err);
    if (rc != MS_OK) return ms_err_prefix(err, "loading the tokenizer from %s", tp);
    s->vocab_size = ms_tokenizer_vocab_size(s->tok);
    char *src = NULL;
    size_t len = 0;
    if (o->chat_template_file) {
        rc = ms_read_file(o->chat_template_file, 4u << 20, &src, &len, err);
        if (rc != MS_OK) goto fail;
    } else if (ms_tokenizer_chat_template(s->tok)) {
        src = strdup(ms_tokenizer_chat_template(s->tok));
        len = strlen(src);
    }
    if (src) {
        rc = ms_template_compile(src, len, &s->tmpl, err);
        free(src);
        if (rc != MS_OK) {
            ms_err_prefix(err, "flag --chat-template %s", o->chat_template_file ? o->chat_template_file : "(tokenizer's)");
            goto fail;
        }
    }
    rc = ms_serve_model_open(&o->exec, &s->model, err);
    if (rc != MS_OK) goto fail;
    s->context_length = o->context_length > 0 ? o->context_length : s->model.context_length;
    if (s->context_length <= 0) s->context_length = 4096;
    if (o->context_length > 0 && s->model.context_length > 0 && o->context_length > s->model.context_length)
        MS_LOGW("--context-length %d exceeds the model's max_position_embeddings %d", o->context_length,
                s->model.context_length);
    s->n_eos = s->model.n_eos;
    memcpy(s->eos, s->model.eos, sizeof s->eos);
    ms_engine_config ec;
    ms_engine_config_default(&ec);
    ec.page_size = s->model.exec.page_size > 0 ? s->model.exec.page_size : ec.page_size;
    if (o->max_running_requests > 0) ec.max_running_requests = o->max_running_requests;
    if (o->max_queued_requests > 0) ec.max_waiting_requests = o->max_queued_requests;
    if (o->chunked_prefill_size > 0) ec.chunked_prefill_size = o->chunked_prefill_size;
    if (o->max_prefill_tokens > 0) ec.max_prefill_tokens = o->max_prefill_tokens;
    ec.max_queue_wait_s = o->max_queue_wait_s;
    int pool = s->model.exec.n_pages * s->model.exec.page_size;
    ec.max_total_tokens = o->max_total_tokens > 0 && o->max_total_tokens < pool ? o->max_total_tokens : pool;
    ec.context_length = s->context_length;
    ec.enable_prefix_cache = o->enable_prefix_cache;
    ec.speculative_num_steps = o->exec.speculative_num_steps; /* the executor loaded the MTP layer for it */
    if (ec.max_total_tokens > 0 && s->context_length > ec.max_total_tokens) {
        MS_LOGW("context length %d limited to the KV cache capacity of %d tokens", s->context_length, ec.max_total_tokens);
        s->context_length = ec.max_total_tokens;
        ec.context_length = s->context_length;
    }
    s->page_size = ec.page_size;
    s->kv_tokens = ec.max_total_tokens;
    rc = ms_engine_create(&ec, &s->model.exec, &s->eng, err);
    if (rc != MS_OK) goto fail;
    s->rops.tok = s->tok;
    s->rops.tmpl = s->tmpl;
    s->rops.eng = s->eng;
    s->ops = ms_server_ops_real(&s->rops);
    {
        /* the structured-output index now, not on the first structured request; a failure here is
         * retried on that request (and reported there) */
        ms_err gerr = {0};
        if (ms_real_ops_prepare_grammar(&s->rops, &gerr) != MS_OK) MS_LOGW("grammar: %s (retried on first use)", gerr.msg);
    }
    return MS_OK;
fail:
    ms_serve_stack_close(s);
    return err->code ? err->code : MS_ERR_RUNTIME;
}

void ms_serve_stack_close(ms_serve_stack *s) {
    if (s->eng) ms_engine_destroy(s->eng);
    ms_real_ops_release(&s->rops);
    if (s->model.exec.forward || s->model.model) ms_serve_model_close(&s->model);
    if (s->tmpl) ms_template_free(s->tmpl);
    if (s->tok) ms_tokenizer_free(s->tok);
    memset(s, 0, sizeof *s);
}
