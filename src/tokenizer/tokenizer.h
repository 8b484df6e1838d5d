/* tokenizer.h - Hugging Face tokenizer.json (BPE) encode/decode, identical to the `tokenizers`
 * library, plus an incremental detokenizer for streaming.
 *
 * A tokenizer is immutable after loading and safe to use from many threads at once. */
#ifndef MS_TOKENIZER_TOKENIZER_H
#define MS_TOKENIZER_TOKENIZER_H

#include "core/status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ms_tokenizer ms_tokenizer;

/* Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json and DIR/chat_template.jinja
 * (template source, bos/eos strings, added-token flags). Unsupported components fail with a
 * sentence naming the component and field. */
int ms_tokenizer_load(const char *dir, ms_tokenizer **out, ms_err *err);
void ms_tokenizer_free(ms_tokenizer *t);

/* Encodes UTF-8 text (invalid bytes handled as the reference does). *ids is malloc'd (caller
 * frees). add_special: apply the post-processor (e.g. prepend BOS). Memory is O(len). */
int ms_tokenizer_encode(const ms_tokenizer *t, const char *text, size_t len, int add_special,
                        int32_t **ids, int *n_ids, ms_err *err);

/* Decodes ids to text exactly as the reference `decode` (skip_special drops special added tokens).
 * *out is malloc'd and NUL-terminated; *len excludes the NUL. Out-of-range ids are an error. */
int ms_tokenizer_decode(const ms_tokenizer *t, const int32_t *ids, int n_ids, int skip_special,
                        char **out, size_t *len, ms_err *err);

/* The bytes token id contributes in the middle of a sequence (the decoder's per-token output with
 * no text before or after it: a byte-level token ending inside a UTF-8 character yields the raw
 * partial bytes). *out is malloc'd (caller frees); *len set. For grammar token masks. */
int ms_tokenizer_token_bytes(const ms_tokenizer *t, int32_t id, char **out, size_t *len, ms_err *err);

int ms_tokenizer_vocab_size(const ms_tokenizer *t); /* highest id + 1, added tokens included */
int32_t ms_tokenizer_token_to_id(const ms_tokenizer *t, const char *token); /* -1 when absent */
const char *ms_tokenizer_id_to_token(const ms_tokenizer *t, int32_t id);    /* NULL when absent */
int ms_tokenizer_is_special(const ms_tokenizer *t, int32_t id);             /* special added token */

/* From tokenizer_config.json / chat_template.jinja; NULL when the files have none. Strings are
 * owned by the tokenizer. */
const char *ms_tokenizer_chat_template(const ms_tokenizer *t);
const char *ms_tokenizer_bos_token(const ms_tokenizer *t);
const char *ms_tokenizer_eos_token(const ms_tokenizer *t);

/* Incremental detokenizer: push ids one by one, get back only complete, valid UTF-8 text that the
 * full decode of all ids so far would have produced beyond what was already returned. Never emits
 * half a character; flush() returns what is left at the end (replacement chars for a dangling
 * partial sequence, as decode would). */
typedef struct ms_detok ms_detok;
ms_detok *ms_detok_new(const ms_tokenizer *t, int skip_special);
void ms_detok_free(ms_detok *d);
/* Appends the new text to *buf (malloc'd, grown as needed; *cap and *len track it). Returns MS_OK. */
int ms_detok_push(ms_detok *d, int32_t id, char **buf, size_t *len, size_t *cap, ms_err *err);
int ms_detok_flush(ms_detok *d, char **buf, size_t *len, size_t *cap, ms_err *err);

#endif
