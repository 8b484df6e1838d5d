/* fake_ops.h - a scripted tokenizer + engine behind ms_server_ops, so the HTTP layer can be tested
 * (and the openai SDK e2e tests tried) without a model.
 *
 * Tokenizer: ids 0..255 are bytes; 256.. are added tokens (the GLM tags, marked *special* on
 * purpose so the server's keep-list is exercised, plus control tokens). The chat "template"
 * is GLM-like: <|user|>text ... <|assistant|><think> (or </think> with thinking off).
 * Engine: one thread; every ~1 ms it emits one token for each running request. The reply is
 * chosen by a keyword in the last user message (THINK, TOOL, LONG, RANDOM, else an echo). */
#ifndef MS_TESTS_FAKE_OPS_H
#define MS_TESTS_FAKE_OPS_H

#include "core/fileutil.h"
#include "server/server.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FK_BASE 256
static const char *const FK_ADDED[] = {"<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>",
                                       "</arg_key>", "<arg_value>", "</arg_value>", "<|endoftext|>",
                                       "<|user|>", "<|assistant|>", "<|system|>", "<|observation|>"};
#define FK_N_ADDED (int)(sizeof FK_ADDED / sizeof FK_ADDED[0])
#define FK_EOS (FK_BASE + 8)
#define FK_VOCAB (FK_BASE + FK_N_ADDED)

static int fk_encode_raw(const char *text, size_t len, int32_t **ids, int *n) {
    *ids = malloc((len + 1) * sizeof **ids);
    *n = 0;
    for (size_t i = 0; i < len;) {
        int hit = -1;
        for (int k = 0; k < FK_N_ADDED; k++) {
            size_t l = strlen(FK_ADDED[k]);
            if (l <= len - i && !memcmp(text + i, FK_ADDED[k], l)) { hit = k; break; }
        }
        if (hit >= 0) { (*ids)[(*n)++] = FK_BASE + hit; i += strlen(FK_ADDED[hit]); }
        else (*ids)[(*n)++] = (unsigned char)text[i++];
    }
    return 0;
}

static int fk_encode(void *ctx, const char *text, size_t len, int add_special, int32_t **ids, int *n, ms_err *err) {
    (void)ctx; (void)add_special; (void)err;
    return fk_encode_raw(text, len, ids, n);
}

static void fk_append_token(ms_sbuf *b, int32_t id) {
    if (id < FK_BASE) ms_sbuf_addc(b, (char)id);
    else ms_sbuf_adds(b, FK_ADDED[id - FK_BASE]);
}

static int fk_decode(void *ctx, const int32_t *ids, int n, char **out, size_t *len, ms_err *err) {
    (void)ctx;
    ms_sbuf b = {0};
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= FK_VOCAB) { ms_sbuf_free(&b); return ms_errf(err, MS_ERR_INVALID, "id %d out of range", ids[i]); }
        fk_append_token(&b, ids[i]);
    }
    *len = b.len;
    *out = ms_sbuf_take(&b);
    return MS_OK;
}

static int fk_is_special(void *ctx, int32_t id) { (void)ctx; return id >= FK_BASE; }
static const char *fk_token_content(void *ctx, int32_t id) {
    (void)ctx;
    static char bytes[256][2];
    if (id < 0 || id >= FK_VOCAB) return NULL;
    if (id >= FK_BASE) return FK_ADDED[id - FK_BASE];
    bytes[id][0] = (char)id;
    return bytes[id];
}

static int fk_render(void *ctx, json_t *messages, json_t *tools, json_t *kwargs, char **out, size_t *len, ms_err *err) {
    (void)ctx; (void)err;
    ms_sbuf b = {0};
    ms_sbuf_adds(&b, "[gMASK]");
    if (tools) {
        char *t = json_dumps(tools, JSON_COMPACT);
        ms_sbuf_adds(&b, "<|system|>tools:");
        ms_sbuf_adds(&b, t);
        free(t);
    }
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        ms_sbuf_printf(&b, "<|%s|>", !strcmp(role, "tool") ? "observation" : role);
        json_t *c = json_object_get(m, "content");
        if (json_is_string(c)) ms_sbuf_adds(&b, json_string_value(c));
        else if (json_is_array(c)) {
            size_t k;
            json_t *p;
            json_array_foreach(c, k, p) ms_sbuf_adds(&b, json_string_value(json_object_get(p, "text")));
        }
    }
    json_t *et = kwargs ? json_object_get(kwargs, "enable_thinking") : NULL;
    ms_sbuf_adds(&b, (et && json_is_false(et)) ? "<|assistant|></think>" : "<|assistant|><think>");
    *len = b.len;
    *out = ms_sbuf_take(&b);
    return MS_OK;
}

typedef struct fk_detok { ms_sbuf pend; } fk_detok;
static void *fk_detok_new(void *ctx) { (void)ctx; return calloc(1, sizeof(fk_detok)); }
static void fk_detok_free(void *d) { if (d) { ms_sbuf_free(&((fk_detok *)d)->pend); free(d); } }
static void fk_out(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = (*len + n + 1) * 2;
        *buf = realloc(*buf, c);
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
}
/* Emits the longest prefix of complete UTF-8 characters. */
static int fk_detok_push(void *dv, int32_t id, char **buf, size_t *len, size_t *cap, ms_err *err) {
    fk_detok *d = dv;
    if (id < 0 || id >= FK_VOCAB) return ms_errf(err, MS_ERR_INVALID, "id %d out of range", id);
    fk_append_token(&d->pend, id);
    size_t n = d->pend.len, ok = 0;
    const unsigned char *s = (const unsigned char *)d->pend.s;
    for (size_t i = 0; i < n;) {
        int l = s[i] < 0x80 ? 1 : (s[i] >> 5) == 6 ? 2 : (s[i] >> 4) == 14 ? 3 : (s[i] >> 3) == 30 ? 4 : 1;
        if (i + (size_t)l > n) break;
        i += (size_t)l;
        ok = i;
    }
    fk_out(buf, len, cap, d->pend.s, ok);
    ms_sbuf_consume(&d->pend, ok);
    return MS_OK;
}
static int fk_detok_flush(void *dv, char **buf, size_t *len, size_t *cap, ms_err *err) {
    (void)err;
    fk_detok *d = dv;
    if (d->pend.len) fk_out(buf, len, cap, "\xef\xbf\xbd", 3);
    ms_sbuf_clear(&d->pend);
    return MS_OK;
}

/* ---- engine ----------------------------------------------------------------------------------- */

typedef struct fk_req {
    uint64_t id;
    int32_t *script;
    int n_script, pos, n_gen, n_prompt, endless;
    ms_sampling sp;
    ms_token_cb cb;
    void *user;
    int aborted;
    uint64_t rng;
    struct fk_req *next;
} fk_req;

typedef struct fk_engine {
    pthread_mutex_t mu;
    pthread_t th;
    int quit;
    fk_req *reqs;
    int n_reqs;
    int max_reqs;         /* submit fails with BUSY beyond this */
    uint64_t next_id;
    int healthy;
    int step_us;
    uint64_t aborts, prompt_total, gen_total, finished;
    int pages_used;
} fk_engine;

static int fk_pages(int tokens) { return (tokens + 15) / 16; }

static void fk_last_user(const int32_t *p, int n, ms_sbuf *out) {
    int start = 0, end = n;
    for (int i = 0; i < n; i++) if (p[i] == FK_BASE + 9) start = i + 1;
    for (int i = start; i < n; i++) if (p[i] >= FK_BASE && p[i] != FK_BASE + 9) { end = i; break; }
    for (int i = start; i < end; i++) fk_append_token(out, p[i]);
}

static int fk_submit(void *ctx, const int32_t *prompt, int n_prompt, const ms_sampling *sp, ms_token_cb cb, void *user,
                     uint64_t *req_id, ms_err *err) {
    fk_engine *e = ctx;
    if (n_prompt <= 0) return ms_errf(err, MS_ERR_INVALID, "empty prompt");
    pthread_mutex_lock(&e->mu);
    if (e->n_reqs >= e->max_reqs) {
        pthread_mutex_unlock(&e->mu);
        return ms_errf(err, MS_ERR_BUSY, "queue full (%d requests)", e->max_reqs);
    }
    fk_req *r = calloc(1, sizeof *r);
    r->id = ++e->next_id;
    r->sp = *sp;
    r->cb = cb;
    r->user = user;
    r->n_prompt = n_prompt;
    r->rng = sp->has_seed ? sp->seed * 2654435761u + 1 : r->id * 7919u;
    ms_sbuf user_text = {0}, reply = {0};
    fk_last_user(prompt, n_prompt, &user_text);
    const char *u = ms_sbuf_str(&user_text);
    int has_asst = 0;
    for (int i = 0; i < n_prompt; i++) if (prompt[i] == FK_BASE + 10) has_asst = 1;
    if (strstr(u, "THINK")) ms_sbuf_adds(&reply, "Let me think. 2+2=4.</think>The answer is 4.");
    else if (strstr(u, "TOOL"))
        ms_sbuf_adds(&reply, "I should call a tool.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
                             "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>");
    else if (strstr(u, "LONG")) { ms_sbuf_adds(&reply, "word "); r->endless = 1; }
    else if (strstr(u, "RANDOM")) {
        for (int i = 0; i < 40; i++) {
            r->rng ^= r->rng << 13; r->rng ^= r->rng >> 7; r->rng ^= r->rng << 17;
            ms_sbuf_addc(&reply, (char)('a' + (sp->temperature > 0 ? r->rng % 26 : i % 26)));
        }
    } else if (has_asst) {
        ms_sbuf_printf(&reply, "</think>Hello! You said: %s", u);
    } else {
        ms_sbuf_adds(&reply, " and so on, the end.");
    }
    fk_encode_raw(reply.s, reply.len, &r->script, &r->n_script);
    ms_sbuf_free(&user_text);
    ms_sbuf_free(&reply);
    r->next = e->reqs;
    e->reqs = r;
    e->n_reqs++;
    e->prompt_total += (uint64_t)n_prompt;
    e->pages_used += fk_pages(n_prompt);
    *req_id = r->id;
    pthread_mutex_unlock(&e->mu);
    return MS_OK;
}

static void fk_abort(void *ctx, uint64_t id) {
    fk_engine *e = ctx;
    pthread_mutex_lock(&e->mu);
    for (fk_req *r = e->reqs; r; r = r->next)
        if (r->id == id && !r->aborted) { r->aborted = 1; e->aborts++; }
    pthread_mutex_unlock(&e->mu);
}

static void fk_stats(void *ctx, ms_engine_stats *out) {
    fk_engine *e = ctx;
    pthread_mutex_lock(&e->mu);
    memset(out, 0, sizeof *out);
    out->running = e->n_reqs;
    out->prompt_tokens_total = e->prompt_total;
    out->generated_tokens_total = e->gen_total;
    out->requests_finished = e->finished;
    out->requests_aborted = e->aborts;
    out->kv_pages_total = 4096;
    out->kv_pages_used = e->pages_used;
    out->healthy = e->healthy;
    pthread_mutex_unlock(&e->mu);
}

static int fk_is_stop(const ms_sampling *sp, int32_t t) {
    for (int i = 0; i < sp->n_stop_ids; i++) if (sp->stop_ids[i] == t) return 1;
    return 0;
}

static void *fk_thread(void *arg) {
    fk_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        if (e->quit && !e->reqs) { pthread_mutex_unlock(&e->mu); break; }
        fk_req **pp = &e->reqs;
        while (*pp) {
            fk_req *r = *pp;
            ms_token_event ev;
            memset(&ev, 0, sizeof ev);
            ev.req_id = r->id;
            ev.n_prompt = r->n_prompt;
            ev.token = -1;
            if (r->aborted || e->quit) {
                ev.finish = MS_FINISH_ABORT;
            } else {
                int32_t t;
                if (r->pos < r->n_script) t = r->script[r->pos++];
                else if (r->endless) t = 'w';
                else t = r->sp.ignore_eos ? 'x' : FK_EOS;
                ev.token = t;
                ev.logprob = -0.5f;
                ev.n_top = r->sp.top_logprobs;
                for (int k = 0; k < ev.n_top; k++) { ev.top_ids[k] = (t + k) % FK_VOCAB; ev.top_logprobs[k] = -0.5f - k; }
                r->n_gen++;
                e->gen_total++;
                if ((r->n_prompt + r->n_gen) % 16 == 1) e->pages_used++;
                ev.n_generated = r->n_gen;
                if (fk_is_stop(&r->sp, t)) ev.finish = MS_FINISH_STOP;
                else if (r->n_gen >= r->sp.max_tokens) ev.finish = MS_FINISH_LENGTH;
            }
            r->cb(r->user, &ev);
            if (ev.finish) {
                *pp = r->next;
                e->n_reqs--;
                e->finished++;
                e->pages_used -= fk_pages(r->n_prompt + r->n_gen);
                free(r->script);
                free(r);
            } else {
                pp = &r->next;
            }
        }
        int step = e->step_us;
        pthread_mutex_unlock(&e->mu);
        usleep((useconds_t)step);
    }
    return NULL;
}

static fk_engine *fk_engine_new(int max_reqs) {
    fk_engine *e = calloc(1, sizeof *e);
    pthread_mutex_init(&e->mu, NULL);
    e->max_reqs = max_reqs;
    e->healthy = 1;
    e->step_us = 1000;
    pthread_create(&e->th, NULL, fk_thread, e);
    return e;
}

/* Test knobs, set under the engine lock. */
static void fk_set(fk_engine *e, int healthy, int step_us) {
    pthread_mutex_lock(&e->mu);
    if (healthy >= 0) e->healthy = healthy;
    if (step_us > 0) e->step_us = step_us;
    pthread_mutex_unlock(&e->mu);
}

static uint64_t fk_aborts(fk_engine *e) {
    pthread_mutex_lock(&e->mu);
    uint64_t n = e->aborts;
    pthread_mutex_unlock(&e->mu);
    return n;
}

static void fk_engine_free(fk_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->quit = 1;
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->th, NULL);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

static ms_server_ops fk_ops(fk_engine *e) {
    ms_server_ops o = {0};
    o.ctx = e;
    o.encode = fk_encode;
    o.render_chat = fk_render;
    o.decode = fk_decode;
    o.is_special = fk_is_special;
    o.token_content = fk_token_content;
    o.detok_new = fk_detok_new;
    o.detok_push = fk_detok_push;
    o.detok_flush = fk_detok_flush;
    o.detok_free = fk_detok_free;
    o.submit = fk_submit;
    o.abort = fk_abort;
    o.stats = fk_stats;
    return o;
}

#endif
