/* tok_internal.h - pieces shared by the tokenizer's files (not a public interface).
 *
 * The tokenizer follows the Rust `tokenizers` library (what transformers and the serving stacks
 * run): text -> added-token split -> normalizer -> added-token split on normalized text ->
 * pre-tokenizer stages -> BPE per word -> post-processor. Everything here is internal to
 * src/tokenizer/. */
#ifndef MS_TOKENIZER_TOK_INTERNAL_H
#define MS_TOKENIZER_TOK_INTERNAL_H

#include "core/status.h"
#include "core/utf8.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* ---- growable byte buffer ---- */
typedef struct tk_buf {
    char *p;
    size_t len, cap;
} tk_buf;
int tk_buf_reserve(tk_buf *b, size_t extra); /* 0, or -1 on allocation failure */
int tk_buf_put(tk_buf *b, const void *data, size_t n);
void tk_buf_free(tk_buf *b);

/* ---- UTF-8 and Unicode properties ---- */
/* Decoding/encoding single code points: core/utf8.h (ms_utf8_dec_valid, ms_utf8_len, ms_utf8_enc). */
/* Byte length of the WHATWG-style replacement of s[0..n): invalid sequences become U+FFFD
 * (maximal subparts, as TextDecoder and Rust's from_utf8_lossy do). Returns 1 and a malloc'd
 * valid copy in *out when s was invalid, 0 when s is already valid (*out untouched), -1 on OOM. */
int tk_utf8_sanitize(const char *s, size_t n, char **out, size_t *out_len);
/* Appends the lossy decoding of bytes to b (same replacement policy). */
int tk_utf8_lossy_append(tk_buf *b, const unsigned char *s, size_t n);
/* Length of the longest prefix of s[0..n) that is valid UTF-8. */
size_t tk_utf8_valid_prefix(const unsigned char *s, size_t n);

/* Category bits: bit (utf8proc category) for the 30 general categories, plus TK_WS for the
 * Unicode White_Space property. */
#define TK_WS (1u << 30)
#define TK_C_LU (1u << 1)
#define TK_C_LL (1u << 2)
#define TK_C_LT (1u << 3)
#define TK_C_LM (1u << 4)
#define TK_C_LO (1u << 5)
#define TK_C_MN (1u << 6)
#define TK_C_MC (1u << 7)
#define TK_C_ME (1u << 8)
#define TK_C_ND (1u << 9)
#define TK_C_NL (1u << 10)
#define TK_C_NO (1u << 11)
#define TK_C_L (TK_C_LU | TK_C_LL | TK_C_LT | TK_C_LM | TK_C_LO)
#define TK_C_M (TK_C_MN | TK_C_MC | TK_C_ME)
#define TK_C_N (TK_C_ND | TK_C_NL | TK_C_NO)
#define TK_C_P (0x7Fu << 12)
#define TK_C_S (0xFu << 19)
#define TK_C_Z (0x7u << 23)
#define TK_C_C ((0xFu << 26) | 1u)
extern uint32_t tk_cat_bmp[65536];
void tk_unicode_init(void); /* idempotent, thread-safe */
uint32_t tk_cat_slow(uint32_t cp);
static inline uint32_t tk_cat(uint32_t cp) { return cp < 65536 ? tk_cat_bmp[cp] : tk_cat_slow(cp); }
static inline int tk_is_ws(uint32_t cp) { return (tk_cat(cp) & TK_WS) != 0; }

/* ---- normalizers ---- */
enum { TK_NORM_NFC, TK_NORM_NFD, TK_NORM_NFKC, TK_NORM_NFKD };
/* Appends the normalization `form` of s[0..n) (valid UTF-8) to out. */
int tk_unicode_normalize(int form, const char *s, size_t n, tk_buf *out);
int tk_lowercase(const char *s, size_t n, tk_buf *out);
int tk_strip_accents(const char *s, size_t n, tk_buf *out); /* drops nonspacing marks (Mn) */

/* ---- regular expressions (Split patterns) ----
 * A pattern from tokenizer.json is compiled by our own backtracking matcher when it uses only
 * the subset tokenizers need (alternation, groups, (?i:), lookahead, classes with \p{..}, greedy
 * quantifiers); anything else is handed to Oniguruma, the engine the reference uses. */
typedef struct tk_regex tk_regex;
int tk_regex_new(const char *pat, size_t len, tk_regex **out, char *why, size_t why_cap);
void tk_regex_free(tk_regex *r);
int tk_regex_is_native(const tk_regex *r);
/* Finds the leftmost match in s[0..n) starting at or after `from`. Returns 1 with [*ms,*me),
 * 0 when none, -1 on an engine failure. */
int tk_regex_find(const tk_regex *r, const char *s, size_t n, size_t from, size_t *ms, size_t *me);
/* Appends s with every match of re (or of the literal pat when re is NULL) replaced by rep (see
 * tok_text.c). Returns 0, or -1 on allocation or regex failure. */
int tk_replace_all(const char *s, size_t n, const char *pat, size_t pl, const tk_regex *re, const char *rep, size_t rl,
                   tk_buf *out);
/* Test hook: force the Oniguruma path for a pattern the native matcher supports. */
int tk_regex_new_onig(const char *pat, size_t len, tk_regex **out, char *why, size_t why_cap);

/* ---- small hash helpers ---- */
uint64_t tk_hash(const void *p, size_t n);

/* ---- the loaded tokenizer ---- */
#include "tokenizer/tokenizer.h"

typedef struct tk_added {
    int32_t id;
    uint32_t off, len;           /* content in t->arena (normalized when `normalized`, as the reference stores it) */
    uint32_t orig_off, orig_len; /* content as written in tokenizer.json */
    uint8_t special, normalized, lstrip, rstrip, single_word;
} tk_added;

/* Byte trie over added-token contents: leftmost-longest matching as the reference's
 * Aho-Corasick (MatchKind::LeftmostLongest). */
typedef struct tk_trie {
    int32_t root[256];  /* root child per byte, -1 none */
    int32_t *node_tok;  /* per node: index into t->added or -1 */
    int32_t *edge_first, *edge_count;
    uint8_t *edge_byte;
    int32_t *edge_node;
    int n_nodes, n_edges;
    int empty;
} tk_trie;

enum { TK_SPLIT_REMOVED, TK_SPLIT_ISOLATED, TK_SPLIT_PREV, TK_SPLIT_NEXT, TK_SPLIT_CONTIG };
enum { TK_PT_SPLIT, TK_PT_BYTELEVEL, TK_PT_DIGITS, TK_PT_METASPACE, TK_PT_WSSPLIT, TK_PT_PUNCT,
       TK_PT_CHARDELIM, TK_PT_WHITESPACE };
enum { TK_PREPEND_ALWAYS, TK_PREPEND_FIRST, TK_PREPEND_NEVER };

typedef struct tk_pretok {
    int kind;
    int behavior, invert;
    tk_regex *re;       /* Split with Regex, ByteLevel use_regex, Whitespace */
    char *lit;          /* Split with String pattern / Metaspace replacement / CharDelimiter */
    size_t lit_len;
    int add_prefix_space, use_regex; /* ByteLevel */
    int individual;     /* Digits */
    int prepend, msplit; /* Metaspace */
} tk_pretok;

enum { TK_N_NFC, TK_N_NFD, TK_N_NFKC, TK_N_NFKD, TK_N_LOWER, TK_N_STRIP, TK_N_STRIPACC, TK_N_REPLACE,
       TK_N_PREPEND };
typedef struct tk_norm {
    int kind;
    int left, right;     /* Strip */
    tk_regex *re;        /* Replace with Regex */
    char *pat, *content; /* Replace String pattern / Prepend text */
    size_t pat_len, content_len;
} tk_norm;

enum { TK_D_BYTELEVEL, TK_D_METASPACE, TK_D_BYTEFALLBACK, TK_D_FUSE, TK_D_STRIP, TK_D_REPLACE,
       TK_D_BPE, TK_D_WORDPIECE };
typedef struct tk_dec {
    int kind;
    char *pat, *content; /* Replace (String pattern), Metaspace replacement, Strip content, suffix */
    size_t pat_len, content_len;
    tk_regex *re;
    int start, stop;   /* Strip */
    int prepend;       /* Metaspace: prepend scheme (strip the first space unless never) */
    int cleanup;       /* WordPiece */
} tk_dec;

enum { TK_PP_TEMPLATE, TK_PP_BYTELEVEL, TK_PP_ROBERTA, TK_PP_BERT };
typedef struct tk_post {
    int kind;
    int32_t *pre, *post; /* ids added before / after the sequence */
    int n_pre, n_post;
} tk_post;

struct ms_tokenizer {
    /* token strings by id (model vocab and added tokens); len UINT32_MAX = no such id */
    char *arena;
    size_t arena_len;
    uint32_t *tok_off, *tok_len;
    int n_ids;
    /* model vocab lookup: open addressing, slot = hash32 << 32 | (id + 1) */
    uint64_t *vslots;
    uint32_t vmask;
    /* merges, interleaved pairs: key (a << 32 | b), value (rank << 32 | new id) */
    uint64_t *mkeys;
    uint64_t mmask;
    int32_t byte_id[256];  /* byte-level: id of the token for a byte's mapped char */
    int32_t bfb_id[256];   /* byte fallback: id of "<0xXX>" */
    int byte_direct;       /* byte_id complete and no subword prefix/suffix */
    int32_t *char_id;      /* char mode without prefix/suffix: vocab id of each BMP char, -1 none */
    int byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;
    char *cont_prefix, *eow_suffix;
    size_t cont_prefix_len, eow_suffix_len;

    tk_added *added;
    int n_added;
    tk_trie trie_raw, trie_norm;
    uint8_t *special; /* per id: 1 when skip_special_tokens drops it */

    tk_norm *norms;
    int n_norms;
    tk_pretok *pretoks;
    int n_pretoks;
    tk_post *posts;
    int n_posts;
    tk_dec *decs;
    int n_decs;
    int has_decoder;

    char *chat_template, *bos, *eos;
    int clean_up;
};

/* Model vocab lookup (not added tokens): id or -1. */
int32_t tk_vocab_find(const ms_tokenizer *t, const char *s, size_t n);
/* Token text for id (NULL when absent) and its length. */
static inline const char *tk_tok(const ms_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || t->tok_len[id] == UINT32_MAX) return NULL;
    *len = t->tok_len[id];
    return t->arena + t->tok_off[id];
}
/* Byte of a byte-level char (U+0021.. as GPT-2 maps them) or -1. */
int tk_bytelevel_byte(uint32_t cp);
uint32_t tk_bytelevel_char(unsigned byte);
/* Decodes ids (whole pipeline minus clean-up) appending raw text to out; first: the list starts
 * at the beginning of the sequence (Metaspace/WordPiece first-token rules); more: tokens will
 * follow (BPEDecoder's last-token rule does not apply). */
int tk_decode_raw(const ms_tokenizer *t, const int32_t *ids, int n, int skip_special, int first,
                  int more, tk_buf *out, ms_err *err);
/* Streaming clean_up_tokenization_spaces (transformers' replacements), see tok_decode.c. */
typedef struct tk_cleanup {
    char pend[10][8];
    int pend_len[10];
} tk_cleanup;
int tk_cleanup_feed(tk_cleanup *c, const char *s, size_t n, tk_buf *out);
int tk_cleanup_flush(tk_cleanup *c, tk_buf *out);
int tk_load_json(ms_tokenizer *t, const char *path, const char *buf, size_t len, ms_err *err);

/* ---- tokenizer.json loading (tok_json.c, tok_json_vocab.c, tok_json_sections.c) ---- */

#define TK_MAX_ID (1 << 26) /* token ids are below this */

/* Scanner cursor: p moves through [p, e) of the file that starts at b (for byte offsets in errors). */
typedef struct {
    const char *b, *p, *e;
    const char *path;
    ms_err *err;
} tk_js;

/* Byte span of one JSON value in the file. */
typedef struct {
    const char *s, *e; /* value span; s == NULL when absent */
} tk_span;

/* One model.vocab entry: its id and where its text lies in the loading arena. */
typedef struct {
    int32_t id;
    uint32_t off, len;
} tk_vent;

/* The tokenizer being filled and where the jansson section parsers report errors. */
typedef struct {
    ms_tokenizer *t;
    const char *path;
    ms_err *err;
} tk_ctx;

/* Skips JSON whitespace. */
static inline void tk_js_ws(tk_js *j) {
    while (j->p < j->e && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) j->p++;
}
/* Hash of a token's text for the vocab table. */
static inline uint32_t tk_slot_hash(const char *s, size_t n) { return (uint32_t)tk_hash(s, n); }

/* Sets j->err to "<path>: <field>: <what> at byte N" (with the element index while one is being
 * read); returns the error code. */
int tk_js_fail(tk_js *j, const char *field, const char *what);
/* Scans an object at j->p, recording the spans of the wanted keys (others skipped); 0, or
 * nonzero with j->err set. */
int tk_js_object_spans(tk_js *j, const char *field, const char *const *keys, tk_span *spans, int nkeys);
/* Reads model.vocab at j->p: token texts NUL-terminated into arena, (id, offset, length) entries
 * into a malloc'd *ents_out (*n_out of them); 0, or -1 with j->err set. */
int tk_parse_vocab(ms_tokenizer *t, tk_js *j, tk_buf *arena, tk_vent **ents_out, int *n_out);
/* Reads model.merges at j->p (either "a b" strings or [a, b] pairs) into t's merge table;
 * 0, or nonzero with j->err set. */
int tk_parse_merges(ms_tokenizer *t, tk_js *j);
/* Parses the byte span sp with jansson; NULL with j->err set (naming field) on a syntax error. */
json_t *tk_load_span(tk_js *j, tk_span sp, const char *field);
/* Sets c->err to "<path>: <field>: <what>" (MS_ERR_FORMAT); returns the error code. */
int tk_bad(tk_ctx *c, const char *field, const char *what);
/* o[key] as a boolean into *out (def when absent or null); an error when it is another type. */
int tk_get_bool(tk_ctx *c, json_t *o, const char *key, int def, int *out, const char *field);
/* malloc'd NUL-terminated copy of JSON string v (and its length); an error when v is not a string. */
int tk_dup_str(tk_ctx *c, json_t *v, char **out, size_t *len, const char *field);
/* Append the normalizer / pre-tokenizer / decoder / post-processor described by o (Sequences
 * flattened, nesting bounded by depth) to c->t; errors name field. */
int tk_add_norm(tk_ctx *c, json_t *o, const char *field, int depth);
int tk_add_pretok(tk_ctx *c, json_t *o, const char *field, int depth);
int tk_add_dec(tk_ctx *c, json_t *o, const char *field, int depth);
int tk_add_post(tk_ctx *c, json_t *o, const char *field, int depth);

#endif
