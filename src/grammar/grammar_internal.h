/* grammar_internal.h - the compiled grammar's layout, shared by the GBNF compiler (gbnf.c), the
 * automaton and masks (matcher.c) and the vocabulary trie (vocab.c). Private to src/grammar.
 *
 * Every alternative of every rule is flattened into one element array; an alternative ends with an
 * END element, so a parse position is one int (an element index) and a parse stack is a chain of
 * positions to return to. */
#ifndef MS_GRAMMAR_GRAMMAR_INTERNAL_H
#define MS_GRAMMAR_GRAMMAR_INTERNAL_H

#include "grammar/grammar.h"

#include <pthread.h>
#include <stdint.h>

enum { GE_END = 0, GE_CLASS = 1, GE_REF = 2 };

typedef struct gelem {
    uint8_t kind;
    int32_t rule;    /* GE_REF: rule index */
    uint32_t set[8]; /* GE_CLASS: the bytes it matches (bit b of set[b >> 5]) */
} gelem;

static inline int gset_has(const uint32_t *set, unsigned b) { return (set[b >> 5] >> (b & 31)) & 1u; }

/* Vocabulary: token bytes plus a byte trie over the non-excluded tokens. Tokens are sorted by their
 * bytes, so every trie node's subtree is one contiguous range of `sorted`. */
typedef struct vtrie_node {
    int32_t first_child, next_sibling;
    int32_t lo, end_hi, hi; /* sorted[lo, end_hi): tokens ending here; sorted[lo, hi): the subtree */
    uint8_t byte;
} vtrie_node;

struct ms_grammar_vocab {
    int n;
    char **bytes;
    uint32_t *len;
    uint8_t *excluded;
    int32_t *sorted;    /* non-excluded ids by bytes */
    int n_sorted;
    vtrie_node *nodes;  /* node 0 is the root (no byte) */
    int n_nodes;
    int max_len;
};

/* One cached context (see matcher.c). */
typedef struct gcache_entry {
    uint64_t key_hash;
    int32_t key[8];
    int klen;
    uint32_t *acc;   /* [words] tokens allowed whatever lies below the context (dense form) */
    int acc_shared;  /* acc belongs to the grammar's table of distinct bitmaps (not freed with the entry) */
    int32_t *acc_ids; /* the same as a list of ids (sparse form, when acc is NULL) */
    int n_acc_ids;
    int32_t *unc;    /* tokens to check against the full stack */
    int n_unc;
    int cached;      /* in the grammar's table (else owned by the one fill_mask call) */
    struct gcache_entry *next;
} gcache_entry;

struct ms_grammar {
    int refs; /* atomic */
    const ms_grammar_vocab *vocab;
    gelem *el;
    int n_el;
    int32_t *alt_start; /* [n_alts] element index of each alternative */
    int32_t *rule_alt0, *rule_nalt; /* [n_rules] */
    char **rule_name;
    int n_rules, n_alts;
    int root;
    pthread_mutex_t mu; /* guards the cache */
    gcache_entry **buckets;
    int n_buckets, n_entries;
    size_t cache_bytes; /* token sets held by the cache */
    /* distinct dense bitmaps, shared by the entries whose sets are equal (inside a long string
     * most positions allow the same tokens): open addressing by hash, guarded by mu */
    struct gbitmap { uint64_t h; uint32_t *bits; } *bm;
    int bm_cap, bm_n;
    int precomputed;    /* atomic: ms_grammar_precompute has claimed this grammar */
};

/* Compiles GBNF source into g (fields el .. root); g->vocab is left alone. */
int ms_gbnf_build(const char *src, ms_grammar *g, ms_err *err);
/* Frees the rules of g (not the cache). */
void ms_gbnf_free_rules(ms_grammar *g);

/* A growable NUL-terminated string for the translators; an allocation failure sets oom and later
 * appends do nothing (callers check oom once at the end). */
typedef struct gstr {
    char *s;
    size_t len, cap;
    int oom;
} gstr;
void gs_add(gstr *b, const char *s, size_t n);
void gs_adds(gstr *b, const char *s);
void gs_printf(gstr *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as a GBNF string literal ("..." with escapes). */
void gs_lit(gstr *b, const char *s, size_t n);

#endif
