/* jinja_lex.c - template preprocessing and tokenizing. Chat templates are whitespace-sensitive, so
 * this reproduces @huggingface/jinja's lexer step by step: the same source rewrites (one trailing
 * newline dropped, lstrip_blocks and trim_blocks as transformers configures them, `generation` tags
 * removed), the same `{%- -%}` trimming and the same token rules (a '-' after an operand is binary,
 * otherwise unary and glued to a following number). Every byte keeps its original line number so
 * errors can name the line. */
#include "tokenizer/jinja.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    char *s;
    int *line;
    size_t n;
} ptext;

static int ptext_alloc(ptext *t, size_t n) {
    t->s = malloc(n + 1);
    t->line = malloc((n + 1) * sizeof(int));
    t->n = 0;
    return t->s && t->line ? 0 : -1;
}

static void ptext_free(ptext *t) {
    free(t->s);
    free(t->line);
    t->s = NULL;
    t->line = NULL;
}

static void emit(ptext *o, const ptext *in, size_t i) {
    o->s[o->n] = in->s[i];
    o->line[o->n] = in->line[i];
    o->n++;
}

/* Length of the JavaScript whitespace character at s[i], or 0. */
static int space_at(const char *s, size_t n, size_t i) {
    if (i >= n) return 0;
    uint32_t cp;
    int l = ms_utf8_dec(s + i, n - i, &cp);
    return jj_is_js_space(cp) ? l : 0;
}

/* A JavaScript LineTerminator (what `^` matches after in a /m regex) ending just before i. */
static int after_line_terminator(const char *s, size_t i) {
    if (i == 0) return 1;
    if (s[i - 1] == '\n' || s[i - 1] == '\r') return 1;
    return i >= 3 && (unsigned char)s[i - 3] == 0xE2 && (unsigned char)s[i - 2] == 0x80 &&
           ((unsigned char)s[i - 1] == 0xA8 || (unsigned char)s[i - 1] == 0xA9);
}

/* lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1". */
static void pass_lstrip(const ptext *in, ptext *o) {
    size_t i = 0;
    while (i < in->n) {
        if (after_line_terminator(in->s, i)) {
            size_t j = i;
            while (j < in->n && (in->s[j] == ' ' || in->s[j] == '\t')) j++;
            if (j + 1 < in->n && in->s[j] == '{' &&
                (in->s[j + 1] == '#' || in->s[j + 1] == '%' || in->s[j + 1] == '-')) {
                emit(o, in, j);
                emit(o, in, j + 1);
                i = j + 2;
                continue;
            }
        }
        emit(o, in, i++);
    }
}

/* trim_blocks: /([#%-]})\n/g -> "$1". */
static void pass_trim(const ptext *in, ptext *o) {
    size_t i = 0;
    while (i < in->n) {
        char c = in->s[i];
        if ((c == '#' || c == '%' || c == '-') && i + 2 < in->n && in->s[i + 1] == '}' && in->s[i + 2] == '\n') {
            emit(o, in, i);
            emit(o, in, i + 1);
            i += 3;
            continue;
        }
        emit(o, in, i++);
    }
}

/* Matches `{%-? \s* (end)?generation \s* -?%}` at i; returns the end offset or 0. */
static size_t match_generation(const char *s, size_t n, size_t i, int *lstrip, int *rstrip) {
    if (i + 1 >= n || s[i] != '{' || s[i + 1] != '%') return 0;
    size_t j = i + 2;
    *lstrip = 0;
    *rstrip = 0;
    if (j < n && s[j] == '-') *lstrip = 1, j++;
    int l;
    while ((l = space_at(s, n, j))) j += (size_t)l;
    if (j + 3 <= n && !memcmp(s + j, "end", 3) && j + 13 <= n && !memcmp(s + j + 3, "generation", 10)) j += 3;
    if (j + 10 > n || memcmp(s + j, "generation", 10)) return 0;
    j += 10;
    while ((l = space_at(s, n, j))) j += (size_t)l;
    if (j < n && s[j] == '-' && j + 2 < n && s[j + 1] == '%' && s[j + 2] == '}') *rstrip = 1, j++;
    if (j + 1 >= n || s[j] != '%' || s[j + 1] != '}') return 0;
    return j + 2;
}

/* /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs -> (lstrip ? "" : $1) + (rstrip ? "" : $4). */
static void pass_generation(const ptext *in, ptext *o) {
    size_t i = 0, ws_start = (size_t)-1;
    while (i < in->n) {
        int ls, rs;
        size_t end = match_generation(in->s, in->n, i, &ls, &rs);
        if (end) {
            size_t run = ws_start == (size_t)-1 ? i : ws_start;
            if (ls) o->n -= i - run; /* drop the whitespace already copied */
            size_t k = end;
            int l;
            while ((l = space_at(in->s, in->n, k))) k += (size_t)l;
            if (!rs)
                for (size_t q = end; q < k; q++) emit(o, in, q);
            i = k;
            ws_start = (size_t)-1;
            continue;
        }
        int l = space_at(in->s, in->n, i);
        if (l) {
            if (ws_start == (size_t)-1) ws_start = i;
        } else {
            l = 1;
            ws_start = (size_t)-1;
        }
        for (int q = 0; q < l && i < in->n; q++) emit(o, in, i++);
    }
}

/* ---- tokenizer ------------------------------------------------------------------------------ */

typedef struct {
    jj_arena *ar;
    const char *s;
    const int *line;
    size_t n, pos;
    jj_tok *toks;
    int ntok, cap;
    ms_err *err;
} lexer;

static int lex_line(lexer *L) { return L->line[L->pos < L->n ? L->pos : (L->n ? L->n - 1 : 0)]; }

static int lerr(lexer *L, const char *what) {
    return ms_errf(L->err, MS_ERR_FORMAT, "chat template line %d: %s", L->n ? lex_line(L) : 1, what);
}

static int push(lexer *L, int type, const char *s, size_t n, int line) {
    if (L->ntok == L->cap) {
        int cap = L->cap ? L->cap * 2 : 256;
        jj_tok *t = realloc(L->toks, (size_t)cap * sizeof *t);
        if (!t) return ms_errf(L->err, MS_ERR_NOMEM, "chat template: out of memory while tokenizing");
        L->toks = t;
        L->cap = cap;
    }
    L->toks[L->ntok++] = (jj_tok){type, line, s, n};
    return 0;
}

static jj_tok *last(lexer *L) { return L->ntok ? &L->toks[L->ntok - 1] : NULL; }

static int is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
static int is_digit(char c) { return c >= '0' && c <= '9'; }

static void strip_trailing_ws(lexer *L) {
    jj_tok *t = last(L);
    if (!t || t->type != T_TEXT) return;
    size_t n = t->n;
    /* trimEnd: walk back over whitespace characters (multi-byte ones end in a continuation byte). */
    while (n > 0) {
        size_t st = n - 1;
        while (st > 0 && ((unsigned char)t->s[st] & 0xC0) == 0x80 && n - st < 4) st--;
        uint32_t cp;
        int l = ms_utf8_dec(t->s + st, n - st, &cp);
        if ((size_t)l != n - st || !jj_is_js_space(cp)) break;
        n = st;
    }
    t->n = n;
    if (n == 0) L->ntok--;
}

static void skip_leading_ws(lexer *L) {
    int l;
    while ((l = space_at(L->s, L->n, L->pos))) L->pos += (size_t)l;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* String literal body up to the closing quote, with the oracle's escapes. */
static int lex_string(lexer *L, char quote) {
    int line = lex_line(L);
    L->pos++; /* opening quote */
    jj_buf b = {0};
    uint32_t pending_hi = 0; /* a \uD8xx waiting for its low half */
    while (1) {
        if (L->pos >= L->n) {
            jj_buf_free(&b);
            return lerr(L, "unterminated string literal (unexpected end of input)");
        }
        char c = L->s[L->pos];
        if (c == quote) break;
        if (c == '\\') {
            L->pos++;
            if (L->pos >= L->n) {
                jj_buf_free(&b);
                return lerr(L, "unexpected end of input in string escape");
            }
            char e = L->s[L->pos++];
            if (e == 'x' || e == 'u') {
                int len = e == 'x' ? 2 : 4;
                uint32_t v = 0;
                for (int k = 0; k < len; k++) {
                    int h = L->pos + (size_t)k < L->n ? hexval(L->s[L->pos + k]) : -1;
                    if (h < 0) {
                        jj_buf_free(&b);
                        return lerr(L, "invalid hexadecimal escape sequence in string literal");
                    }
                    v = v * 16 + (uint32_t)h;
                }
                L->pos += (size_t)len;
                char enc[4];
                if (v >= 0xD800 && v <= 0xDBFF) {
                    if (pending_hi) jj_buf_put(&b, enc, (size_t)ms_utf8_enc(0xFFFD, enc));
                    pending_hi = v;
                    continue;
                }
                if (v >= 0xDC00 && v <= 0xDFFF && pending_hi) {
                    v = 0x10000 + ((pending_hi - 0xD800) << 10) + (v - 0xDC00);
                    pending_hi = 0;
                }
                if (pending_hi) {
                    jj_buf_put(&b, enc, (size_t)ms_utf8_enc(0xFFFD, enc));
                    pending_hi = 0;
                }
                jj_buf_put(&b, enc, (size_t)ms_utf8_enc(v, enc));
                continue;
            }
            char u;
            switch (e) {
            case 'n': u = '\n'; break;
            case 't': u = '\t'; break;
            case 'r': u = '\r'; break;
            case 'b': u = '\b'; break;
            case 'f': u = '\f'; break;
            case 'v': u = '\v'; break;
            case '\'': u = '\''; break;
            case '"': u = '"'; break;
            case '\\': u = '\\'; break;
            default: {
                jj_buf_free(&b);
                char msg[64];
                snprintf(msg, sizeof msg, "unexpected escaped character '\\%c' in string literal", e);
                return lerr(L, msg);
            }
            }
            if (pending_hi) {
                char enc[4];
                jj_buf_put(&b, enc, (size_t)ms_utf8_enc(0xFFFD, enc));
                pending_hi = 0;
            }
            jj_buf_putc(&b, u);
            continue;
        }
        if (pending_hi) {
            char enc[4];
            jj_buf_put(&b, enc, (size_t)ms_utf8_enc(0xFFFD, enc));
            pending_hi = 0;
        }
        jj_buf_putc(&b, c);
        L->pos++;
    }
    if (pending_hi) {
        char enc[4];
        jj_buf_put(&b, enc, (size_t)ms_utf8_enc(0xFFFD, enc));
    }
    L->pos++; /* closing quote */
    if (b.over) {
        jj_buf_free(&b);
        return ms_errf(L->err, MS_ERR_NOMEM, "chat template: out of memory in a string literal");
    }
    char *s = jj_strdup(L->ar, b.p ? b.p : "", b.n);
    size_t n = b.n;
    jj_buf_free(&b);
    if (!s) return ms_errf(L->err, MS_ERR_NOMEM, "chat template: out of memory in a string literal");
    return push(L, T_STR, s, n, line);
}

static const struct {
    const char *seq;
    int type;
} k_table[] = {
    {"{%", T_OPEN_STMT}, {"%}", T_CLOSE_STMT}, {"{{", T_OPEN_EXPR}, {"}}", T_CLOSE_EXPR}, {"(", T_LPAREN},
    {")", T_RPAREN}, {"{", T_LBRACE}, {"}", T_RBRACE}, {"[", T_LBRACKET}, {"]", T_RBRACKET}, {",", T_COMMA},
    {".", T_DOT}, {":", T_COLON}, {"|", T_PIPE}, {"<=", T_CMP}, {">=", T_CMP}, {"==", T_CMP}, {"!=", T_CMP},
    {"<", T_CMP}, {">", T_CMP}, {"+", T_ADD}, {"-", T_ADD}, {"~", T_ADD}, {"**", T_POW}, {"*", T_MUL},
    {"//", T_MUL}, {"/", T_MUL}, {"%", T_MUL}, {"=", T_EQUALS},
};

static int tokenize(lexer *L) {
    int curly = 0;
    while (L->pos < L->n) {
        jj_tok *lt = last(L);
        if (!lt || lt->type == T_CLOSE_STMT || lt->type == T_CLOSE_EXPR || lt->type == T_COMMENT) {
            size_t st = L->pos;
            while (L->pos < L->n && !(L->s[L->pos] == '{' && L->pos + 1 < L->n &&
                                      (L->s[L->pos + 1] == '%' || L->s[L->pos + 1] == '{' || L->s[L->pos + 1] == '#')))
                L->pos++;
            if (L->pos > st) {
                MS_TRY(push(L, T_TEXT, L->s + st, L->pos - st, L->line[st]));
                continue;
            }
        }
        const char *s = L->s;
        size_t p = L->pos, n = L->n;
        int line = lex_line(L);
        if (s[p] == '{' && p + 1 < n && s[p + 1] == '#') {
            L->pos += 2;
            int strip_before = L->pos < n && s[L->pos] == '-';
            if (strip_before) L->pos++;
            size_t st = L->pos;
            while (!(L->pos + 1 < n && s[L->pos] == '#' && s[L->pos + 1] == '}')) {
                if (L->pos + 2 >= n) return lerr(L, "missing end of comment tag '#}'");
                L->pos++;
            }
            size_t cn = L->pos - st;
            int strip_after = cn > 0 && s[st + cn - 1] == '-';
            if (strip_after) cn--;
            if (strip_before) strip_trailing_ws(L);
            MS_TRY(push(L, T_COMMENT, s + st, cn, line));
            L->pos += 2;
            if (strip_after) skip_leading_ws(L);
            continue;
        }
        if (p + 2 < n && s[p] == '{' && s[p + 1] == '%' && s[p + 2] == '-') {
            strip_trailing_ws(L);
            MS_TRY(push(L, T_OPEN_STMT, "{%", 2, line));
            L->pos += 3;
            continue;
        }
        if (p + 2 < n && s[p] == '{' && s[p + 1] == '{' && s[p + 2] == '-') {
            strip_trailing_ws(L);
            MS_TRY(push(L, T_OPEN_EXPR, "{{", 2, line));
            curly = 0;
            L->pos += 3;
            continue;
        }
        /* whitespace inside tags (the oracle fails if this reaches the end of input) */
        int l;
        while ((l = space_at(s, n, L->pos))) {
            L->pos += (size_t)l;
            if (L->pos >= n) return lerr(L, "unexpected end of input inside a tag");
        }
        p = L->pos;
        line = lex_line(L);
        if (p + 2 < n && s[p] == '-' && s[p + 1] == '%' && s[p + 2] == '}') {
            MS_TRY(push(L, T_CLOSE_STMT, "%}", 2, line));
            L->pos += 3;
            skip_leading_ws(L);
            continue;
        }
        if (p + 2 < n && s[p] == '-' && s[p + 1] == '}' && s[p + 2] == '}') {
            MS_TRY(push(L, T_CLOSE_EXPR, "}}", 2, line));
            L->pos += 3;
            skip_leading_ws(L);
            continue;
        }
        char c = s[p];
        if (c == '-' || c == '+') {
            lt = last(L);
            if (!lt || lt->type == T_TEXT) {
                char msg[48];
                snprintf(msg, sizeof msg, "unexpected character '%c'", c);
                return lerr(L, msg);
            }
            int t = lt->type;
            if (!(t == T_IDENT || t == T_NUM || t == T_STR || t == T_RPAREN || t == T_RBRACKET)) {
                L->pos++;
                size_t st = L->pos;
                while (L->pos < n && is_digit(s[L->pos])) L->pos++;
                if (L->pos > st && L->pos >= n) return lerr(L, "unexpected end of input");
                if (L->pos > st && L->pos + 1 < n && s[L->pos] == '.' && is_digit(s[L->pos + 1])) {
                    L->pos++;
                    while (L->pos < n && is_digit(s[L->pos])) L->pos++;
                    if (L->pos >= n) return lerr(L, "unexpected end of input");
                }
                if (L->pos > st) MS_TRY(push(L, T_NUM, s + p, L->pos - p, line));
                else MS_TRY(push(L, T_UNARY, s + p, 1, line));
                continue;
            }
        }
        int matched = 0;
        for (size_t k = 0; k < sizeof k_table / sizeof k_table[0]; k++) {
            if (k_table[k].type == T_CLOSE_EXPR && curly > 0) continue;
            size_t ln = strlen(k_table[k].seq);
            if (p + ln <= n && !memcmp(s + p, k_table[k].seq, ln)) {
                MS_TRY(push(L, k_table[k].type, k_table[k].seq, ln, line));
                if (k_table[k].type == T_OPEN_EXPR) curly = 0;
                else if (k_table[k].type == T_LBRACE) curly++;
                else if (k_table[k].type == T_RBRACE) curly--;
                L->pos += ln;
                matched = 1;
                break;
            }
        }
        if (matched) continue;
        if (c == '\'' || c == '"') {
            MS_TRY(lex_string(L, c));
            continue;
        }
        if (is_digit(c)) {
            size_t st = L->pos;
            while (L->pos < n && is_digit(s[L->pos])) L->pos++;
            if (L->pos >= n) return lerr(L, "unexpected end of input");
            lt = last(L);
            if (!(lt && lt->type == T_DOT) && L->pos + 1 < n && s[L->pos] == '.' && is_digit(s[L->pos + 1])) {
                L->pos++;
                while (L->pos < n && is_digit(s[L->pos])) L->pos++;
                if (L->pos >= n) return lerr(L, "unexpected end of input");
            }
            MS_TRY(push(L, T_NUM, s + st, L->pos - st, line));
            continue;
        }
        if (is_word(c)) {
            size_t st = L->pos;
            while (L->pos < n && is_word(s[L->pos])) L->pos++;
            if (L->pos >= n) return lerr(L, "unexpected end of input");
            MS_TRY(push(L, T_IDENT, s + st, L->pos - st, line));
            continue;
        }
        uint32_t cp;
        ms_utf8_dec(s + p, n - p, &cp);
        char msg[64];
        if (cp >= 0x20 && cp < 0x7F) snprintf(msg, sizeof msg, "unexpected character '%c'", (char)cp);
        else snprintf(msg, sizeof msg, "unexpected character U+%04X", cp);
        return lerr(L, msg);
    }
    return 0;
}

int jj_lex(jj_arena *arena, const char *src, size_t len, jj_tok **toks, int *ntok, ms_err *err) {
    *toks = NULL;
    *ntok = 0;
    ptext a = {0}, b = {0};
    if (ptext_alloc(&a, len) || ptext_alloc(&b, len)) {
        ptext_free(&a);
        ptext_free(&b);
        return ms_errf(err, MS_ERR_NOMEM, "chat template: out of memory (%zu bytes)", len);
    }
    int line = 1;
    for (size_t i = 0; i < len; i++) {
        a.s[i] = src[i];
        a.line[i] = line;
        if (src[i] == '\n') line++;
    }
    a.n = len;
    if (a.n && a.s[a.n - 1] == '\n') a.n--;
    pass_lstrip(&a, &b);
    a.n = 0;
    pass_trim(&b, &a);
    b.n = 0;
    pass_generation(&a, &b);
    /* the token texts point into the preprocessed source, which must outlive the tokens */
    char *s = jj_strdup(arena, b.s, b.n);
    if (!s) {
        ptext_free(&a);
        ptext_free(&b);
        return ms_errf(err, MS_ERR_NOMEM, "chat template: out of memory (%zu bytes)", len);
    }
    lexer L = {arena, s, b.line, b.n, 0, NULL, 0, 0, err};
    int rc = tokenize(&L);
    ptext_free(&a);
    ptext_free(&b);
    if (rc) {
        free(L.toks);
        return rc;
    }
    *toks = L.toks;
    *ntok = L.ntok;
    return 0;
}
