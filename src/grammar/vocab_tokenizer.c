/* vocab_tokenizer.c - a grammar vocabulary from a loaded tokenizer: each token's bytes as the
 * decoder emits them mid-sequence; special tokens are excluded (a grammar never produces them; the
 * engine adds end-of-sequence ids itself when the grammar may end). */
#include "grammar/grammar.h"

#include "tokenizer/tokenizer.h"

#include <stdlib.h>

/* Builds the vocabulary of t (see grammar.h). */
int ms_grammar_vocab_from_tokenizer(const ms_tokenizer *t, ms_grammar_vocab **out, ms_err *err) {
    *out = NULL;
    int n = ms_tokenizer_vocab_size(t);
    char **bytes = calloc((size_t)n, sizeof *bytes);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    uint8_t *ex = calloc((size_t)n, 1);
    int rc = MS_OK;
    if (!bytes || !lens || !ex) rc = ms_errf(err, MS_ERR_NOMEM, "grammar vocabulary: out of memory");
    for (int i = 0; rc == MS_OK && i < n; i++) {
        if (!ms_tokenizer_id_to_token(t, i) || ms_tokenizer_is_special(t, i)) { ex[i] = 1; continue; }
        ms_err e2 = {0};
        if (ms_tokenizer_token_bytes(t, i, &bytes[i], &lens[i], &e2) != MS_OK) ex[i] = 1;
    }
    if (rc == MS_OK) rc = ms_grammar_vocab_new(n, (const char *const *)bytes, lens, ex, out, err);
    if (bytes)
        for (int i = 0; i < n; i++) free(bytes[i]);
    free(bytes);
    free(lens);
    free(ex);
    return rc;
}
