/* grammar.h - structured outputs: JSON Schema, regular expressions and GBNF compiled to one
 * pushdown automaton over bytes, and the per-step token mask it allows.
 *
 * Why a byte-level pushdown automaton: the three input languages all reduce to a context-free
 * grammar, and tokens are byte strings (a token may end inside a UTF-8 character), so the automaton
 * steps on bytes and a token is allowed when all of its bytes can be consumed in sequence.
 *
 * Speed comes from two things, as in xgrammar: the vocabulary is a byte trie walked depth-first
 * with pruning, and for every stack context (the top few positions of a parse stack) the tokens
 * whose fate does not depend on what lies below are computed once and cached in the compiled
 * grammar; only the few "context-dependent" tokens are checked against the real stack each step.
 *
 * Objects: a vocabulary (token bytes + trie; immutable, shared), a compiled grammar (immutable rules
 * plus a thread-safe lazy cache; reference counted so requests can share it) and a matcher (the
 * parse state of one request; one thread at a time). */
#ifndef MS_GRAMMAR_GRAMMAR_H
#define MS_GRAMMAR_GRAMMAR_H

#include "core/status.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ms_grammar_vocab ms_grammar_vocab;
typedef struct ms_grammar ms_grammar;
typedef struct ms_grammar_matcher ms_grammar_matcher;

/* ---- vocabulary ---- */

/* Builds the vocabulary from n token byte strings (bytes[i] of lens[i] bytes, copied). A token with
 * excluded[i] != 0 (special tokens) or no bytes is never allowed by a grammar. */
int ms_grammar_vocab_new(int n, const char *const *bytes, const size_t *lens, const uint8_t *excluded,
                         ms_grammar_vocab **out, ms_err *err);
/* The vocabulary of a loaded tokenizer (vocab_tokenizer.c). */
struct ms_tokenizer;
int ms_grammar_vocab_from_tokenizer(const struct ms_tokenizer *t, ms_grammar_vocab **out, ms_err *err);
void ms_grammar_vocab_free(ms_grammar_vocab *v);
int ms_grammar_vocab_size(const ms_grammar_vocab *v);
/* Bytes of token id (NULL when excluded); *len set. Owned by the vocabulary. */
const char *ms_grammar_vocab_token(const ms_grammar_vocab *v, int32_t id, size_t *len);

/* ---- compilation (the grammar borrows v, which must outlive it) ---- */

/* GBNF as llama.cpp writes it: `name ::= alternatives`, "literals", [classes], [^negated], ., ( ),
 * |, *, +, ?, {m}, {m,}, {m,n}, # comments; the start rule is `root`. Errors name the rule and the
 * byte offset. Left recursion is refused. */
int ms_grammar_compile_gbnf(const char *src, const ms_grammar_vocab *v, ms_grammar **out, ms_err *err);
/* A regular expression (ECMAScript syntax subset: | ( ) (?: ) * + ? {m,n} [classes] . \d \w \s
 * \D \W \S escapes; ^ and $ only at the ends) that the whole output must match. */
int ms_grammar_compile_regex(const char *re, const ms_grammar_vocab *v, ms_grammar **out, ms_err *err);
/* A JSON Schema (see json_schema.c for the keywords handled); schema NULL = any JSON object
 * (response_format json_object). Errors are MS_ERR_UNSUPPORTED naming the keyword and its path. */
int ms_grammar_compile_json_schema(json_t *schema, const ms_grammar_vocab *v, ms_grammar **out, ms_err *err);

/* The GBNF text the compilers above produce (malloc'd; for tests and debugging). schema NULL = any
 * JSON object. *out is NULL on error. */
int ms_grammar_json_schema_to_gbnf(json_t *schema, char **out, ms_err *err);
int ms_grammar_regex_to_gbnf(const char *re, char **out, ms_err *err);
/* The regex as a GBNF expression only (malloc'd), for embedding in a larger grammar. json_string:
 * the text sits raw inside a JSON string, so '"', '\' and control characters are never produced
 * (literal ones in the pattern become their JSON escapes). */
int ms_grammar_regex_to_gbnf_body(const char *re, int json_string, char **out, ms_err *err);

/* GBNF for calls in GLM's format (`<tool_call>NAME` then `<arg_key>K</arg_key><arg_value>V</arg_value>`
 * per argument, `</tool_call>`; compact = GLM-4.7's, else GLM-4.5's newline after the name and each
 * tag pair) of the OpenAI `tools` array: one call of `only` when given, else one or more calls of
 * any tool. String arguments are raw text, others JSON following their schema. */
int ms_grammar_tool_call_gbnf(json_t *tools, const char *only, int compact, char **out, ms_err *err);
/* GBNF for any text that never contains pat (2..64 bytes whose first byte occurs only there):
 * tool_choice "none" keeps "<tool_call>" out of the content. */
int ms_grammar_no_substring_gbnf(const char *pat, char **out, ms_err *err);

void ms_grammar_ref(ms_grammar *g);
void ms_grammar_unref(ms_grammar *g); /* frees on the last reference */

/* A thread-safe cache of compiled grammars by key (the caller's source text), at most cap of them,
 * least recently used dropped first. get returns a new reference or NULL; put keeps its own. */
typedef struct ms_grammar_cache ms_grammar_cache;
ms_grammar_cache *ms_grammar_cache_new(int cap);
void ms_grammar_cache_free(ms_grammar_cache *c);
ms_grammar *ms_grammar_cache_get(ms_grammar_cache *c, const char *key);
void ms_grammar_cache_put(ms_grammar_cache *c, const char *key, ms_grammar *g);

/* Fills g's context cache ahead of decoding (call it where the grammar is compiled, off the engine
 * thread): walks the parse stacks reachable from the start, nearest first, and computes each one's
 * context entry, so that the engine's first masks are cache hits. Stops after max_stacks stacks,
 * max_seconds, or when the cache budget is spent (a grammar with recursion has unboundedly many);
 * contexts left are computed on first use as before. Only the first call on a grammar works (later
 * ones return at once), so concurrent requests never repeat it. Masks are the same with or without
 * it. Returns 0, or -1 when out of memory (the cache stays valid). st may be NULL. */
typedef struct ms_grammar_precompute_stats {
    int stacks;     /* parse stacks visited */
    int contexts;   /* cache entries added */
    int truncated;  /* stopped by a limit before every reachable stack was visited */
    double seconds;
} ms_grammar_precompute_stats;
int ms_grammar_precompute(ms_grammar *g, int max_stacks, double max_seconds, ms_grammar_precompute_stats *st);
/* The limits the server uses at admission (a bound on the latency one new schema adds). */
#define MS_GRAMMAR_PRECOMPUTE_STACKS 100000
#define MS_GRAMMAR_PRECOMPUTE_SECONDS 2.0

/* ---- matching ---- */

/* A matcher at the start of g (takes a reference on g). NULL when out of memory. */
ms_grammar_matcher *ms_grammar_matcher_new(ms_grammar *g);
void ms_grammar_matcher_free(ms_grammar_matcher *m);
/* Size of the vocabulary the matcher's masks cover. */
int ms_grammar_matcher_vocab_size(const ms_grammar_matcher *m);

/* Unconstrained until token `id` has been accepted (a reasoning model's </think>); -1 = never
 * (constrained from the first token). Call before the first accept. */
void ms_grammar_matcher_set_free_until(ms_grammar_matcher *m, int32_t id);
/* 1 while the grammar applies to the next token (0 in the free prefix). */
int ms_grammar_matcher_active(const ms_grammar_matcher *m);

/* Fills mask [(vocab + 31) / 32] words: bit i of word i/32 set when token i keeps the output a
 * prefix of a sentence of the grammar. Returns the number of allowed tokens. Not valid when not
 * active. */
int ms_grammar_matcher_fill_mask(ms_grammar_matcher *m, uint32_t *mask);
/* Advances by token id: 1 when it was allowed (state advanced), 0 when not (state unchanged).
 * In the free prefix every token is accepted. */
int ms_grammar_matcher_accept(ms_grammar_matcher *m, int32_t id);
/* 1 when the bytes so far form a complete sentence (an end-of-sequence token may come now). */
int ms_grammar_matcher_can_end(const ms_grammar_matcher *m);
/* 1 when the sentence is complete and no further byte can extend it. */
int ms_grammar_matcher_done(const ms_grammar_matcher *m);

#endif
