/* fake_exec.h - a deterministic stand-in for the model, shared by the scheduler and engine tests.
 *
 * It keeps its own KV "memory": for every slot, the token and position written there through
 * slot_mapping. Logits for a sequence are computed only from what it reads back through
 * block_table / ctx_len (the whole visible context), hashed into pseudo-random values. So a wrong
 * slot mapping, a wrong block table, a wrong prefix-cache reuse, a page shared by two live
 * sequences, wrong positions or wrong chunking all change the output, and many of them are also
 * caught directly (the position stored in a slot must be the position read from it).
 * The oracle fake_logits(context) is what a model without any KV cache would produce. */
#ifndef MS_TESTS_FAKE_EXEC_H
#define MS_TESTS_FAKE_EXEC_H

#include "engine/engine.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

typedef struct fake_exec {
    int vocab, n_pages, page_size, max_batch_tokens;
    int32_t *kv_tok, *kv_pos;      /* [n_pages * page_size] */
    int calls;
    int rows_calls;                 /* forwards that returned logit rows (fake_forward, n_logits > 0) */
    int argmax_calls;               /* forwards that returned the rows' greedy ids (fake_forward_argmax) */
    int fail_at_call;               /* forward number (1-based) that fails; 0 = never */
    int fail_code;
    int max_tokens_seen, max_seqs_seen, max_chunk_seen, max_prefill_seen;
    int errors;                     /* contract violations seen */
    char first_error[256];
    float logit_scale;              /* spread of the fake logits */
    int any_logit_rows;             /* speculative decoding: logits may be asked for any token of a
                                     * sequence (its context then ends at that token) */
    int hold;                       /* while nonzero (atomic), forward waits: a test submits its whole
                                     * workload before the first step runs, so what the scheduler sees
                                     * (memory pressure, preemption) does not depend on thread timing */
} fake_exec;

static inline uint64_t fake_mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The oracle: logits of the next token after context[0..n). */
static inline void fake_logits(const int32_t *ctx, int n, int vocab, float scale, float *out) {
    uint64_t h = XXH64(ctx, (size_t)n * sizeof *ctx, 7);
    for (int v = 0; v < vocab; v++) {
        uint64_t x = fake_mix(h ^ ((uint64_t)v * 0xD1B54A32D192ED03ull));
        out[v] = scale * ((float)(x >> 40) / (float)(1u << 24) * 2.0f - 1.0f);
    }
}

static inline void fake_err(fake_exec *f, const char *msg, int a, int b) {
    if (f->errors++ == 0) snprintf(f->first_error, sizeof f->first_error, "%s (%d, %d)", msg, a, b);
}

static inline int fake_step(fake_exec *f, const ms_batch *b, float *logits, ms_err *err) {
    for (int w = 0; __atomic_load_n(&f->hold, __ATOMIC_ACQUIRE); w++) {
        if (w >= 100000) { /* ~10 s */
            fake_err(f, "hold was never released", w, 0);
            break;
        }
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    f->calls++;
    if (f->fail_at_call && f->calls == f->fail_at_call)
        return ms_errf(err, f->fail_code ? f->fail_code : MS_ERR_NUMERICS, "fake executor: injected failure at forward %d", f->calls);
    int ps = f->page_size;
    if (b->page_size != ps) fake_err(f, "page size", b->page_size, ps);
    if (b->n_tokens < 1 || b->n_tokens > f->max_batch_tokens) fake_err(f, "n_tokens out of range", b->n_tokens, f->max_batch_tokens);
    if (b->n_tokens > f->max_tokens_seen) f->max_tokens_seen = b->n_tokens;
    if (b->n_seqs > f->max_seqs_seen) f->max_seqs_seen = b->n_seqs;
    if (b->seq_start[0] != 0 || b->seq_start[b->n_seqs] != b->n_tokens) fake_err(f, "seq_start ends", b->seq_start[0], b->seq_start[b->n_seqs]);
    int prefill = 0;
    /* write every new token's KV, checking positions and slots against the block table */
    for (int i = 0; i < b->n_seqs; i++) {
        int s0 = b->seq_start[i], s1 = b->seq_start[i + 1], n_new = s1 - s0, cl = b->ctx_len[i];
        if (n_new < 1 || n_new > cl) { fake_err(f, "sequence token count", n_new, cl); continue; }
        if (n_new > 1 || cl == 1) prefill += n_new;
        if (n_new > f->max_chunk_seen && n_new > 1) f->max_chunk_seen = n_new;
        if ((cl + ps - 1) / ps > b->max_blocks) fake_err(f, "block table row too short", cl, b->max_blocks);
        for (int t = s0; t < s1; t++) {
            int pos = cl - n_new + (t - s0);
            if (b->positions[t] != pos) fake_err(f, "position", b->positions[t], pos);
            int page = b->block_table[(size_t)i * b->max_blocks + pos / ps];
            int slot = page * ps + pos % ps;
            if (b->slot_mapping[t] != slot) fake_err(f, "slot mapping disagrees with block table", b->slot_mapping[t], slot);
            if (b->slot_mapping[t] < 0 || b->slot_mapping[t] >= f->n_pages * ps) { fake_err(f, "slot out of range", b->slot_mapping[t], 0); continue; }
            if (b->token_ids[t] < 0 || b->token_ids[t] >= f->vocab) fake_err(f, "token id", b->token_ids[t], f->vocab);
            f->kv_tok[b->slot_mapping[t]] = b->token_ids[t];
            f->kv_pos[b->slot_mapping[t]] = b->positions[t];
        }
    }
    if (prefill > f->max_prefill_seen) f->max_prefill_seen = prefill;
    /* logits from the whole visible context, read back through the block table */
    int32_t *ctxbuf = NULL;
    size_t ctxcap = 0;
    for (int r = 0; r < b->n_logits; r++) {
        int t = b->logit_idx[r], i = 0;
        while (i < b->n_seqs && b->seq_start[i + 1] <= t) i++;
        if (i >= b->n_seqs || (t != b->seq_start[i + 1] - 1 && !f->any_logit_rows)) { fake_err(f, "logit index is not a sequence's last token", t, i); continue; }
        int cl = b->ctx_len[i] - (b->seq_start[i + 1] - 1 - t);
        if ((size_t)cl > ctxcap) { ctxcap = (size_t)cl * 2; ctxbuf = realloc(ctxbuf, ctxcap * sizeof *ctxbuf); }
        for (int p = 0; p < cl; p++) {
            int slot = b->block_table[(size_t)i * b->max_blocks + p / ps] * ps + p % ps;
            if (slot < 0 || slot >= f->n_pages * ps) { fake_err(f, "context slot out of range", slot, p); ctxbuf[p] = 0; continue; }
            if (f->kv_pos[slot] != p) fake_err(f, "slot read back holds another position", f->kv_pos[slot], p);
            ctxbuf[p] = f->kv_tok[slot];
        }
        fake_logits(ctxbuf, cl, f->vocab, f->logit_scale, logits + (size_t)r * f->vocab);
    }
    free(ctxbuf);
    return MS_OK;
}

static inline int fake_argmax(const float *x, int n);

/* ms_executor.forward: the step, its logit rows into logits [n_logits, vocab]. */
static inline int fake_forward(void *ctx, const ms_batch *b, float *logits, ms_err *err) {
    fake_exec *f = ctx;
    f->rows_calls += b->n_logits > 0;
    return fake_step(f, b, logits, err);
}

/* ms_executor.forward_argmax: the same step, each logit row's greedy id into ids [n_logits] (the
 * fake's logits are finite, so backend.h's rule is the first index of the largest) and no rows. */
static inline int fake_forward_argmax(void *ctx, const ms_batch *b, int32_t *ids, ms_err *err) {
    fake_exec *f = ctx;
    float *lg = malloc(sizeof(float) * (size_t)b->n_logits * (size_t)f->vocab + 1);
    if (!lg) return ms_errf(err, MS_ERR_NOMEM, "fake executor: out of memory");
    f->argmax_calls++;
    int rc = fake_step(f, b, lg, err);
    for (int r = 0; !rc && r < b->n_logits; r++) ids[r] = fake_argmax(lg + (size_t)r * f->vocab, f->vocab);
    free(lg);
    return rc;
}

static inline void fake_init(fake_exec *f, int vocab, int n_pages, int page_size, int max_batch_tokens) {
    memset(f, 0, sizeof *f);
    f->vocab = vocab;
    f->n_pages = n_pages;
    f->page_size = page_size;
    f->max_batch_tokens = max_batch_tokens;
    f->logit_scale = 4.0f;
    f->kv_tok = malloc((size_t)n_pages * page_size * sizeof(int32_t));
    f->kv_pos = malloc((size_t)n_pages * page_size * sizeof(int32_t));
    for (int i = 0; i < n_pages * page_size; i++) f->kv_tok[i] = f->kv_pos[i] = -1;
}

static inline void fake_free(fake_exec *f) {
    free(f->kv_tok);
    free(f->kv_pos);
}

static inline ms_executor fake_executor(fake_exec *f) {
    ms_executor e;
    memset(&e, 0, sizeof e);
    e.ctx = f;
    e.vocab = f->vocab;
    e.n_pages = f->n_pages;
    e.page_size = f->page_size;
    e.max_batch_tokens = f->max_batch_tokens;
    e.forward = fake_forward;
    return e;
}

static inline int fake_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

/* Greedy continuation without any KV cache: out[0..max_new). */
static inline void fake_greedy_ref(const int32_t *prompt, int n_prompt, int max_new, int vocab, float scale, int32_t *out) {
    int32_t *seq = malloc((size_t)(n_prompt + max_new) * sizeof *seq);
    float *lg = malloc((size_t)vocab * sizeof *lg);
    memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    for (int k = 0; k < max_new; k++) {
        fake_logits(seq, n_prompt + k, vocab, scale, lg);
        out[k] = seq[n_prompt + k] = fake_argmax(lg, vocab);
    }
    free(seq);
    free(lg);
}

/* The 32-token vocabulary the grammar tests of the engine share (a digit for ids 0..9, then "," "["
 * "]" and multi-character pieces) and regex compiled over it: *v and *gr owned by the caller
 * (ms_grammar_vocab_free frees both). Returns the grammar layer's status. */
enum { FAKE_GRAMMAR_VOCAB = 32 };
static inline int fake_grammar(const char *regex, ms_grammar_vocab **v, ms_grammar **gr, ms_err *err) {
    static const char *tok[FAKE_GRAMMAR_VOCAB] = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", ",", "[", "]",
                                                 "12", ",3", "]]", "[1", "x", "y", "z", "ab", "9,", "0]", "77",
                                                 "a", "b", "c", "d", "e", "f", "g", "h"};
    size_t lens[FAKE_GRAMMAR_VOCAB];
    for (int i = 0; i < FAKE_GRAMMAR_VOCAB; i++) lens[i] = strlen(tok[i]);
    *v = NULL, *gr = NULL;
    int rc = ms_grammar_vocab_new(FAKE_GRAMMAR_VOCAB, tok, lens, NULL, v, err);
    return rc ? rc : ms_grammar_compile_regex(regex, *v, gr, err);
}

#endif
