/* dataset.h - synthetic prompts and arrival times for `moeserve bench`, seeded so that two runs
 * with the same --seed send the same requests at the same offsets.
 *
 * Length sampling and arrival processes follow SGLang's bench_serving (reference/perf-anchors.md
 * 5.3/5.4); the random stream itself is our own (xoshiro256**), not numpy's, so the same seed does
 * not give the same prompts as SGLang. */
#ifndef MS_BENCH_DATASET_H
#define MS_BENCH_DATASET_H

#include "core/status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ms_bench_rng {
    uint64_t s[4];
} ms_bench_rng;

void ms_bench_rng_seed(ms_bench_rng *r, uint64_t seed);
uint64_t ms_bench_rng_next(ms_bench_rng *r);
/* Uniform double in [0, 1). */
double ms_bench_rng_uniform(ms_bench_rng *r);
/* Uniform integer in [lo, hi) without modulo bias; requires lo < hi. */
int64_t ms_bench_rng_int(ms_bench_rng *r, int64_t lo, int64_t hi);
/* Exponential variate with the given mean (> 0). */
double ms_bench_rng_exponential(ms_bench_rng *r, double mean);

/* SGLang's length draw: uniform on [max(floor(len*ratio), 1), len]. len >= 1, ratio in [0, 1]. */
int ms_bench_sample_len(ms_bench_rng *r, int len, double ratio);

/* Arrival offsets in seconds from the start of the run: request 0 at 0, each next one an
 * exponential gap of mean 1/rate later (Poisson process). rate <= 0 or infinite: all 0. */
void ms_bench_arrivals(ms_bench_rng *r, int n, double rate, double *out);

/* A tokenizer as the dataset generator needs it (the bench library does not depend on the
 * tokenizer layer; tools/cmd_bench.c adapts ms_tokenizer to this). */
typedef struct ms_bench_tok {
    void *ctx;
    int vocab_size;      /* ids drawn from [0, vocab_size) */
    int n_special_added; /* tokens the server adds to a text prompt (e.g. BOS), subtracted from L */
    /* No special tokens added. *ids malloc'd, caller frees. */
    int (*encode)(void *ctx, const char *text, size_t len, int32_t **ids, int *n, ms_err *err);
    /* *out malloc'd NUL-terminated, caller frees. */
    int (*decode)(void *ctx, const int32_t *ids, int n, char **out, ms_err *err);
    int (*is_special)(void *ctx, int32_t id); /* may be NULL */
} ms_bench_tok;

enum { MS_BENCH_DS_RANDOM = 0, MS_BENCH_DS_RANDOM_IDS = 1 };

typedef struct ms_bench_dataset_opts {
    int kind;           /* MS_BENCH_DS_* */
    int num_prompts;    /* >= 1 */
    int input_len;      /* --random-input-len, >= 1 */
    int output_len;     /* --random-output-len, >= 1 */
    double range_ratio; /* --random-range-ratio in [0, 1] */
    int need_text;      /* the endpoint takes text only (chat): ids prompts are decoded */
    int vocab_size;     /* for random-ids without a tokenizer (0 = not given) */
    const ms_bench_tok *tok; /* may be NULL */
} ms_bench_dataset_opts;

/* One request of the run. Exactly one of text / ids is set. */
typedef struct ms_bench_prompt {
    char *text;
    int32_t *ids;
    int n_ids;
    int prompt_len; /* target input length in tokens (SGLang's prompt_len) */
    int output_len; /* max_tokens to request */
} ms_bench_prompt;

/* Builds opts->num_prompts prompts into *out (malloc'd array, free with ms_bench_dataset_free).
 * Draws all input lengths, then all output lengths, then the contents, from r.
 * - random, with tok: random non-special ids decoded to text, re-encoded and trimmed/extended until
 *   the text encodes to exactly L - n_special_added tokens (a few rounds at most).
 * - random, no tok: L random common English words; the server's usage gives the real count.
 * - random-ids: ids (offset + i + j) % vocab with a random offset per request (vocab from tok or
 *   opts->vocab_size); decoded to text when need_text (requires tok). */
int ms_bench_dataset_make(const ms_bench_dataset_opts *opts, ms_bench_rng *r, ms_bench_prompt **out,
                          ms_err *err);
void ms_bench_dataset_free(ms_bench_prompt *p, int n);

#endif
