/* sampler.h - next-token choice from one logits row, with OpenAI/HF sampling semantics.
 *
 * Order of processing (documented contract; tests compare it with a brute-force computation):
 *   1. repetition_penalty (HF): for each distinct token in prompt + generated, a positive logit is
 *      divided by the penalty, a negative one multiplied;
 *   2. frequency/presence penalties (OpenAI): logit -= frequency * count + presence * (count > 0),
 *      counting generated tokens only;
 *   2b. logit_bias (OpenAI): bias_vals[i] added to the logit of bias_ids[i]; then, while fewer than
 *      min_tokens new tokens exist, every stop id gets -inf (it can be drawn only if nothing else can);
 *   3. temperature 0 (or top_k == 1): greedy argmax, lowest id on ties; otherwise logits / T;
 *   4. top_k, then top_p, then min_p, each on the distribution left by the previous one
 *      (renormalized): top_k keeps the k largest; top_p keeps the shortest run of largest
 *      probabilities whose sum reaches top_p; min_p keeps probabilities >= min_p * max;
 *   5. one uniform draw from the request's own RNG stream picks from what is left.
 * Ties in ordering are broken by the lower token id, so results never depend on sort stability.
 * Reported logprobs are the log-softmax of the raw logits (before penalties and temperature), as
 * vLLM reports by default; top_logprobs are the largest of those.
 *
 * A sampler owns vocab-sized scratch and is used by one thread; nothing is allocated per token. */
#ifndef MS_ENGINE_SAMPLER_H
#define MS_ENGINE_SAMPLER_H

#include "core/status.h"
#include "engine/engine.h"

#include <stdint.h>

typedef struct ms_sampler {
    int vocab;
    float *work;      /* [vocab] processed logits */
    int32_t *cand;    /* [vocab] candidate ids */
    float *prob;      /* [vocab] candidate probabilities */
    int32_t *count;   /* [vocab] occurrence counts, all zero between calls */
    int32_t *touched; /* [vocab] ids with a non-zero count */
    float *ex;        /* [vocab] exp((logit - max) / T) */
    double *bucket_mass; /* [MS_SAMPLER_BUCKETS] top_p histogram */
    uint32_t *gmask;  /* grammar mask words, grown on first use */
    int gmask_words;
} ms_sampler;

#define MS_SAMPLER_BUCKETS 4096

int ms_sampler_init(ms_sampler *s, int vocab, ms_err *err);
void ms_sampler_destroy(ms_sampler *s);

/* Seeds a xoshiro256** state (4 words) from one 64-bit seed through splitmix64. */
void ms_rng_seed(uint64_t st[4], uint64_t seed);
uint64_t ms_rng_next(uint64_t st[4]);
/* Uniform double in [0, 1) with 53 random bits. */
double ms_rng_uniform(uint64_t st[4]);

/* The final sampling distribution for one logits row [vocab]: tokens[0..n_tokens) is the
 * sequence so far (the first n_prompt are the prompt). Returns the number of candidates n and
 * sets *ids / *probs to sampler-owned arrays [n] (probabilities summing to 1, in no particular order). Valid until the next call. */
int ms_sampler_dist(ms_sampler *s, const ms_sampling *sp, const float *logits, const int32_t *tokens, int n_prompt,
                    int n_tokens, const int32_t **ids, const float **probs);

/* 1 when ms_sampler_sample at n_tokens (and after) would return the plain argmax of the logits and
 * read nothing else from them: greedy, no penalty, logit_bias, min_tokens mask (n_tokens - n_prompt >=
 * min_tokens), logprobs or grammar. Such a row's token can be taken on the device (backend.h argmax,
 * the same rule) without its logits. */
int ms_sampler_plain_greedy(const ms_sampling *sp, int n_prompt, int n_tokens);

/* Picks the next token (drawing from rng when temperature > 0) and fills ev->token, and when
 * asked for, ev->logprob and ev->n_top / top_ids / top_logprobs (largest first). Returns the token. */
int32_t ms_sampler_sample(ms_sampler *s, const ms_sampling *sp, const float *logits, const int32_t *tokens, int n_prompt,
                          int n_tokens, uint64_t rng[4], ms_token_event *ev);

/* Structured output: sets logits[i] (row of [vocab]) to -inf for every token the grammar matcher
 * does not allow now; stop_ids[0..n_stop) stay allowed when the grammar may end here. Returns the
 * number of tokens left allowed (0: the grammar cannot continue). The matcher must be active. */
int ms_sampler_apply_grammar(ms_sampler *s, ms_grammar_matcher *m, const int32_t *stop_ids, int n_stop, float *logits);

#endif
