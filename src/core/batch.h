/* batch.h - the one flat struct through which the scheduler hands work to the model.
 *
 * A step mixes prefill chunks and decode tokens of several sequences. Tokens are grouped by
 * sequence: sequence i owns tokens [seq_start[i], seq_start[i+1]). Every token has an absolute
 * position and a KV slot (page * page_size + offset) where its keys/values are written before
 * attention reads them. After the step, sequence i's context holds ctx_len[i] tokens, i.e. its
 * new tokens are positions ctx_len[i]-n_new .. ctx_len[i]-1 and the earlier ones come from the
 * cache (prefix cache hits and previous steps). block_table row i lists the pages of sequence i
 * in position order; entries past its used pages are unspecified.
 *
 * All arrays are host memory owned by the caller (the scheduler) and valid during the forward. */
#ifndef MS_CORE_BATCH_H
#define MS_CORE_BATCH_H

#include <stdint.h>

typedef struct ms_batch {
    int n_tokens;              /* total new tokens in this step */
    int n_seqs;                /* sequences in this step */
    const int32_t *token_ids;  /* [n_tokens] */
    const int32_t *positions;  /* [n_tokens] absolute positions (0-based) */
    const int32_t *seq_start;  /* [n_seqs + 1] token ranges per sequence */
    const int32_t *ctx_len;    /* [n_seqs] context length after this step (cached + new) */
    const int32_t *slot_mapping; /* [n_tokens] KV slot of each new token */
    const int32_t *block_table;  /* [n_seqs * max_blocks] page ids, row-major */
    int max_blocks;            /* row length of block_table */
    int page_size;             /* tokens per KV page */
    /* Which tokens need logits: logits row r belongs to token logit_idx[r]. Usually the last
     * token of each sequence that finished its prompt or is decoding. */
    int n_logits;
    const int32_t *logit_idx;  /* [n_logits] indices into the token arrays */
} ms_batch;

#endif
