/* jinja.h - internals of the chat-template engine (a bounded Jinja subset), shared by the lexer,
 * parser and interpreter. Rendering follows Python's jinja2 as transformers' apply_chat_template sets
 * it up (what SGLang and vLLM render with, so what the models were trained on): its value printing
 * (None, True, 1.0, 1e-05, Python reprs), == and `in`, str(), json.dumps-style tojson. Lexing,
 * preprocessing and operator precedence came from @huggingface/jinja, the first oracle; the places
 * that still follow it are listed in docs/templates.md. *
 * Memory: everything made while compiling lives in the template's arena (freed with the template);
 * everything made while rendering lives in a per-render arena whose total size is capped. */
#ifndef MS_TOKENIZER_JINJA_H
#define MS_TOKENIZER_JINJA_H

#include "core/status.h"
#include "core/utf8.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* ---- arena --------------------------------------------------------------------------------- */

typedef struct jj_chunk jj_chunk;
typedef struct jj_arena {
    jj_chunk *head;
    size_t used_total; /* bytes handed out (including alignment), for the memory limit */
    size_t limit;      /* 0 = unlimited */
    int over;          /* set once an allocation failed or hit the limit */
} jj_arena;

/* Returns 16-byte aligned zeroed memory, or NULL (and sets a->over) on failure/limit. */
void *jj_alloc(jj_arena *a, size_t n);
char *jj_strdup(jj_arena *a, const char *s, size_t n); /* copies n bytes, adds a NUL */
void jj_arena_free(jj_arena *a);

/* ---- growable byte buffer (malloc'd) --------------------------------------------------------- */

typedef struct jj_buf {
    char *p;
    size_t n, cap;
    size_t limit; /* 0 = unlimited; exceeding it sets over */
    int over;
} jj_buf;

int jj_buf_put(jj_buf *b, const char *s, size_t n); /* 0 or -1 (over the limit / no memory) */
int jj_buf_putc(jj_buf *b, char c);
int jj_buf_puts(jj_buf *b, const char *s);
void jj_buf_free(jj_buf *b);

/* ---- text helpers (UTF-8 in, JavaScript string semantics where the oracle uses them) ---------- */

/* UTF-8 decoding/encoding: core/utf8.h (ms_utf8_dec, ms_utf8_enc). */
/* JavaScript's \s / String.prototype.trim whitespace set. */
int jj_is_js_space(uint32_t cp);
/* Length in code points (Python's len() of a str). */
size_t jj_cp_len(const char *s, size_t n);
/* Python's str.isprintable() for one code point (what repr() leaves unescaped). */
int jj_py_printable(uint32_t cp);
/* Python's str.isspace() for one code point (the set str.strip() removes). */
int jj_is_py_space(uint32_t cp);
/* Appends JSON.stringify(string) to b; ascii=1 also escapes U+007F and above as \uXXXX (UTF-16). */
int jj_json_quote(jj_buf *b, const char *s, size_t n, int ascii);

/* ---- lexer ----------------------------------------------------------------------------------- */

typedef enum {
    T_TEXT, T_NUM, T_STR, T_IDENT, T_EQUALS, T_LPAREN, T_RPAREN, T_OPEN_STMT, T_CLOSE_STMT,
    T_OPEN_EXPR, T_CLOSE_EXPR, T_LBRACKET, T_RBRACKET, T_LBRACE, T_RBRACE, T_COMMA, T_DOT, T_COLON,
    T_PIPE, T_ADD, T_MUL, T_POW, T_CMP, T_UNARY, T_COMMENT
} jj_tok_type;

typedef struct jj_tok {
    int type;
    int line; /* 1-based line in the original source */
    const char *s;
    size_t n;
} jj_tok;

/* Preprocesses (trailing newline, lstrip_blocks, trim_blocks, generation tags) and tokenizes src.
 * Tokens and their text live in arena. Errors name the line. */
int jj_lex(jj_arena *arena, const char *src, size_t len, jj_tok **toks, int *ntok, ms_err *err);

/* ---- AST ------------------------------------------------------------------------------------- */

typedef enum {
    /* statements */
    N_IF, N_FOR, N_SET, N_MACRO, N_CALLBLOCK, N_FILTERBLOCK, N_BREAK, N_CONTINUE, N_COMMENT,
    /* expressions */
    E_INT, E_FLOAT, E_STR, E_IDENT, E_ARRAY, E_TUPLE, E_OBJECT, E_MEMBER, E_SLICE, E_CALL, E_BINARY,
    E_UNARY, E_FILTER, E_TEST, E_SELECT, E_TERNARY, E_KWARG, E_SPREAD, E_KWSPREAD
} jj_kind;

typedef enum {
    OP_OR, OP_AND, OP_NOT, OP_EQ, OP_NE, OP_LT, OP_GT, OP_LE, OP_GE, OP_IN, OP_NOTIN, OP_ADD, OP_SUB,
    OP_CONCAT, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_NEG, OP_POS
} jj_op;

typedef struct jj_node jj_node;
struct jj_node {
    uint8_t kind, op;
    uint8_t flag;  /* E_MEMBER: computed; E_TEST: negated */
    uint8_t flag2; /* N_MACRO/N_CALLBLOCK: bit0 uses kwargs, bit1 uses varargs */
    int line;
    jj_node *a, *b, *c; /* operands: see parser for the role of each per kind */
    jj_node **list;     /* bodies, items, arguments */
    int n;
    jj_node **list2; /* else bodies, object values, call-block caller parameters */
    int n2;
    const char *s; /* identifier or string literal text (s may contain NUL bytes; use slen) */
    size_t slen;
    double num;
};

typedef struct jj_program {
    jj_arena arena;
    jj_node **body;
    int n;
} jj_program;

int jj_parse(jj_arena *arena, jj_tok *toks, int ntok, jj_node ***body, int *n, ms_err *err);

/* ---- interpreter ------------------------------------------------------------------------------ */

typedef struct jj_limits {
    size_t max_output;  /* bytes of any rendered string (output, macro result, set block) */
    size_t max_memory;  /* bytes of the per-render arena */
    long long max_steps; /* loop iterations + macro calls + list elements built by range() */
    int max_depth;      /* nested macro calls */
} jj_limits;

/* Renders prog with the JSON context object ctx (borrowed). *out is malloc'd and NUL-terminated. */
int jj_render(const jj_program *prog, json_t *ctx, const jj_limits *lim, char **out, size_t *len,
              ms_err *err);

#endif
