/* dataset.c - see dataset.h. */
#include "bench/dataset.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void ms_bench_rng_seed(ms_bench_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t ms_bench_rng_next(ms_bench_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double ms_bench_rng_uniform(ms_bench_rng *r) { return (double)(ms_bench_rng_next(r) >> 11) * 0x1.0p-53; }

int64_t ms_bench_rng_int(ms_bench_rng *r, int64_t lo, int64_t hi) {
    uint64_t range = (uint64_t)(hi - lo);
    if (range == 0) return lo;
    /* Rejection of the short last block: the loop ends with probability >= 1/2 per draw. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % range;
    uint64_t x;
    do x = ms_bench_rng_next(r);
    while (x >= limit);
    return lo + (int64_t)(x % range);
}

double ms_bench_rng_exponential(ms_bench_rng *r, double mean) {
    return -mean * log1p(-ms_bench_rng_uniform(r));
}

int ms_bench_sample_len(ms_bench_rng *r, int len, double ratio) {
    long lo = (long)floor((double)len * ratio);
    if (lo < 1) lo = 1;
    if (lo > len) lo = len;
    return (int)ms_bench_rng_int(r, lo, (int64_t)len + 1);
}

void ms_bench_arrivals(ms_bench_rng *r, int n, double rate, double *out) {
    double t = 0;
    int poisson = rate > 0 && isfinite(rate);
    for (int i = 0; i < n; i++) {
        out[i] = poisson ? t : 0.0;
        if (poisson) t += ms_bench_rng_exponential(r, 1.0 / rate);
    }
}

/* Common English words: text prompts without a tokenizer come out near one token per word. */
static const char *const k_words[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on",
    "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had",
    "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if",
    "more", "when", "will", "would", "who", "so", "no", "time", "people", "year", "way", "day",
    "man", "thing", "woman", "life", "child", "world", "school", "state", "family", "student",
    "group", "country", "problem", "hand", "part", "place", "case", "week", "company", "system",
    "program", "question", "work", "government", "number", "night", "point", "home", "water",
    "room", "mother", "area", "money", "story", "fact", "month", "lot", "right", "study", "book",
    "eye", "job", "word", "business", "issue", "side", "kind", "head", "house", "service", "friend",
    "father", "power", "hour", "game", "line", "end", "member", "law", "car", "city", "name",
    "team", "minute", "idea", "kid", "body", "information", "back", "parent", "face", "level",
    "office", "door", "health", "person", "art", "war", "history", "party", "result", "change",
    "morning", "reason", "research", "girl", "guy", "moment", "air", "teacher", "force", "education",
};
#define N_WORDS ((int)(sizeof k_words / sizeof k_words[0]))

static int words_text(ms_bench_rng *r, int n, char **out, ms_err *err) {
    size_t cap = (size_t)n * 12 + 1, len = 0;
    char *s = malloc(cap);
    if (!s) return ms_errf(err, MS_ERR_NOMEM, "bench dataset: cannot allocate a %d-word prompt", n);
    for (int i = 0; i < n; i++) {
        const char *w = k_words[ms_bench_rng_int(r, 0, N_WORDS)];
        size_t wl = strlen(w);
        if (i) s[len++] = ' ';
        memcpy(s + len, w, wl); /* words are <= 11 bytes: 12 per word with the space fits */
        len += wl;
    }
    s[len] = 0;
    *out = s;
    return MS_OK;
}

static int32_t random_plain_id(const ms_bench_tok *t, ms_bench_rng *r) {
    int32_t id = 0;
    for (int tries = 0; tries < 64; tries++) {
        id = (int32_t)ms_bench_rng_int(r, 0, t->vocab_size);
        if (!t->is_special || !t->is_special(t->ctx, id)) break;
    }
    return id;
}

/* Text that the tokenizer encodes to exactly `want` tokens where a few rounds can reach it; the
 * closest text found otherwise (random ids rarely fail to converge in practice). */
static int tok_text(const ms_bench_tok *t, ms_bench_rng *r, int want, char **out, ms_err *err) {
    int32_t *ids = malloc((size_t)want * sizeof *ids);
    if (!ids) return ms_errf(err, MS_ERR_NOMEM, "bench dataset: cannot allocate %d ids", want);
    for (int j = 0; j < want; j++) ids[j] = random_plain_id(t, r);
    int n = want, rc = MS_OK;
    char *text = NULL;
    for (int round = 0; round < 8; round++) {
        free(text);
        text = NULL;
        if ((rc = t->decode(t->ctx, ids, n, &text, err)) != MS_OK) break;
        int32_t *re = NULL;
        int nre = 0;
        if ((rc = t->encode(t->ctx, text, strlen(text), &re, &nre, err)) != MS_OK) break;
        if (nre == want) { free(re); break; }
        /* Keep the re-encoded ids (they decode stably), then trim or top up to the target. */
        int keep = nre < want ? nre : want;
        memcpy(ids, re, (size_t)keep * sizeof *ids);
        free(re);
        for (int j = keep; j < want; j++) ids[j] = random_plain_id(t, r);
        n = want;
    }
    free(ids);
    if (rc != MS_OK) { free(text); return rc; }
    *out = text;
    return MS_OK;
}

void ms_bench_dataset_free(ms_bench_prompt *p, int n) {
    if (!p) return;
    for (int i = 0; i < n; i++) {
        free(p[i].text);
        free(p[i].ids);
    }
    free(p);
}

int ms_bench_dataset_make(const ms_bench_dataset_opts *o, ms_bench_rng *r, ms_bench_prompt **out,
                          ms_err *err) {
    *out = NULL;
    if (o->num_prompts < 1 || o->input_len < 1 || o->output_len < 1)
        return ms_errf(err, MS_ERR_INVALID, "bench dataset: --num-prompts, --random-input-len and "
                                            "--random-output-len must be >= 1");
    if (!(o->range_ratio >= 0 && o->range_ratio <= 1))
        return ms_errf(err, MS_ERR_INVALID, "bench dataset: --random-range-ratio must be in [0, 1]");
    int vocab = o->tok ? o->tok->vocab_size : o->vocab_size;
    if (o->kind == MS_BENCH_DS_RANDOM_IDS && vocab < 1)
        return ms_errf(err, MS_ERR_INVALID, "bench dataset: random-ids needs --tokenizer DIR or --vocab-size N");
    if (o->kind == MS_BENCH_DS_RANDOM_IDS && o->need_text && !o->tok)
        return ms_errf(err, MS_ERR_INVALID, "bench dataset: random-ids on a chat backend needs --tokenizer DIR "
                                            "to turn ids into text");
    if (o->tok && o->tok->vocab_size < 1)
        return ms_errf(err, MS_ERR_INVALID, "bench dataset: the tokenizer has an empty vocabulary");
    int n = o->num_prompts;
    ms_bench_prompt *p = calloc((size_t)n, sizeof *p);
    if (!p) return ms_errf(err, MS_ERR_NOMEM, "bench dataset: cannot allocate %d prompts", n);
    for (int i = 0; i < n; i++) p[i].prompt_len = ms_bench_sample_len(r, o->input_len, o->range_ratio);
    for (int i = 0; i < n; i++) p[i].output_len = ms_bench_sample_len(r, o->output_len, o->range_ratio);
    int rc = MS_OK;
    for (int i = 0; i < n && rc == MS_OK; i++) {
        int L = p[i].prompt_len;
        if (o->kind == MS_BENCH_DS_RANDOM_IDS) {
            int64_t off = ms_bench_rng_int(r, 0, vocab);
            int32_t *ids = malloc((size_t)L * sizeof *ids);
            if (!ids) { rc = ms_errf(err, MS_ERR_NOMEM, "bench dataset: cannot allocate %d ids", L); break; }
            for (int j = 0; j < L; j++) ids[j] = (int32_t)((off + i + j) % vocab);
            if (o->need_text) {
                rc = o->tok->decode(o->tok->ctx, ids, L, &p[i].text, err);
                free(ids);
            } else {
                p[i].ids = ids;
                p[i].n_ids = L;
            }
        } else if (o->tok) {
            int want = L - o->tok->n_special_added;
            if (want < 1) want = 1;
            rc = tok_text(o->tok, r, want, &p[i].text, err);
        } else {
            rc = words_text(r, L, &p[i].text, err);
        }
    }
    if (rc != MS_OK) {
        ms_bench_dataset_free(p, n);
        return rc;
    }
    *out = p;
    return MS_OK;
}
