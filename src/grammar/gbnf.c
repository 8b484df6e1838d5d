/* gbnf.c - GBNF text -> the flattened rules of a compiled grammar (grammar_internal.h).
 *
 * GBNF is the common target: JSON Schema and regular expressions are translated to GBNF text and
 * compiled here, so there is one parser and one set of rules to get right. Repetition becomes
 * right-recursive helper rules (the automaton elides tail calls, so stacks stay bounded), a negated
 * class matches one whole UTF-8 character (its ASCII part as a byte class plus the multi-byte
 * lead/continuation forms), and non-ASCII characters in literals become their UTF-8 bytes. */
#include "grammar/grammar_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- growable strings (shared with the translators) ---- */

void gs_add(gstr *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) { b->oom = 1; return; }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

void gs_adds(gstr *b, const char *s) { gs_add(b, s, strlen(s)); }

void gs_printf(gstr *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) { gs_add(b, tmp, (size_t)n); return; }
    char *big = malloc((size_t)n + 1);
    if (!big) { b->oom = 1; return; }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    gs_add(b, big, (size_t)n);
    free(big);
}

void gs_lit(gstr *b, const char *s, size_t n) {
    gs_add(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { char e[2] = {'\\', (char)c}; gs_add(b, e, 2); }
        else if (c < 0x20 || c == 0x7f) gs_printf(b, "\\x%02X", c);
        else gs_add(b, (const char *)&c, 1);
    }
    gs_add(b, "\"", 1);
}

/* ---- rules under construction ---- */

typedef struct balt {
    gelem *e;
    int n, cap;
} balt;

typedef struct brule {
    char *name;
    balt *alts;
    int n, cap;
    int defined;
} brule;

typedef struct bld {
    const char *src, *p;
    brule *rules;
    int n_rules, cap_rules;
    int helper; /* counter for helper rule names */
    int mb_rule; /* the shared "one multi-byte UTF-8 character" rule, -1 until needed */
    ms_err *err;
    int rc;
    int depth;
} bld;

static int fail(bld *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(bld *b, const char *fmt, ...) {
    if (b->rc) return b->rc;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    b->rc = ms_errf(b->err, MS_ERR_INVALID, "grammar: %s at byte %ld", msg, (long)(b->p - b->src));
    return b->rc;
}

static int oom(bld *b) {
    if (!b->rc) b->rc = ms_errf(b->err, MS_ERR_NOMEM, "grammar: out of memory");
    return b->rc;
}

static int rule_get(bld *b, const char *name, size_t n) {
    for (int i = 0; i < b->n_rules; i++)
        if (strlen(b->rules[i].name) == n && !memcmp(b->rules[i].name, name, n)) return i;
    if (b->n_rules == b->cap_rules) {
        int cap = b->cap_rules ? 2 * b->cap_rules : 32;
        brule *r = realloc(b->rules, (size_t)cap * sizeof *r);
        if (!r) return oom(b), -1;
        b->rules = r;
        b->cap_rules = cap;
    }
    brule *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof *r);
    r->name = strndup(name, n);
    if (!r->name) return oom(b), -1;
    return b->n_rules++;
}

static int new_helper(bld *b, const char *base) {
    char nm[160];
    snprintf(nm, sizeof nm, "%s-%d", base, b->helper++);
    int r = rule_get(b, nm, strlen(nm));
    if (r >= 0) b->rules[r].defined = 1;
    return r;
}

/* Appends a new empty alternative to rule r; returns its index or -1. */
static int alt_new(bld *b, int r) {
    brule *ru = &b->rules[r];
    if (ru->n == ru->cap) {
        int cap = ru->cap ? 2 * ru->cap : 4;
        balt *a = realloc(ru->alts, (size_t)cap * sizeof *a);
        if (!a) return oom(b), -1;
        ru->alts = a;
        ru->cap = cap;
    }
    memset(&ru->alts[ru->n], 0, sizeof ru->alts[0]);
    return ru->n++;
}

static void alt_push(bld *b, balt *a, const gelem *e) {
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 8;
        gelem *ne = realloc(a->e, (size_t)cap * sizeof *ne);
        if (!ne) { oom(b); return; }
        a->e = ne;
        a->cap = cap;
    }
    a->e[a->n++] = *e;
}

static void push_ref(bld *b, balt *a, int rule) {
    gelem e;
    memset(&e, 0, sizeof e);
    e.kind = GE_REF;
    e.rule = rule;
    alt_push(b, a, &e);
}

static void push_byte_range(bld *b, balt *a, unsigned lo, unsigned hi) {
    gelem e;
    memset(&e, 0, sizeof e);
    e.kind = GE_CLASS;
    for (unsigned c = lo; c <= hi; c++) e.set[c >> 5] |= 1u << (c & 31);
    alt_push(b, a, &e);
}

/* The rule matching one multi-byte UTF-8 character (lead byte + continuation bytes). */
static int mb_rule(bld *b) {
    if (b->mb_rule >= 0) return b->mb_rule;
    int r = new_helper(b, "utf8-multibyte");
    if (r < 0) return -1;
    static const unsigned lead[3][2] = {{0xC2, 0xDF}, {0xE0, 0xEF}, {0xF0, 0xF4}};
    for (int k = 0; k < 3; k++) {
        int ai = alt_new(b, r);
        if (ai < 0) return -1;
        push_byte_range(b, &b->rules[r].alts[ai], lead[k][0], lead[k][1]);
        for (int j = 0; j <= k; j++) push_byte_range(b, &b->rules[r].alts[ai], 0x80, 0xBF);
    }
    b->mb_rule = r;
    return r;
}

/* ---- lexing ---- */

static void skip_ws(bld *b, int newlines) {
    for (;;) {
        char c = *b->p;
        if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) b->p++;
        else if (c == '#') { while (*b->p && *b->p != '\n') b->p++; }
        else if (c == '\\' && b->p[1] == '\n') b->p += 2; /* line continuation */
        else break;
    }
}

static int is_name_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'; }

static size_t name_len(const char *p) {
    size_t n = 0;
    while (is_name_char(p[n])) n++;
    return n;
}

/* 1 when the text at p (after blanks and newlines) starts a rule definition `name ::=`. */
static int at_rule_start(bld *b) {
    const char *save = b->p;
    skip_ws(b, 1);
    size_t n = name_len(b->p);
    int yes = 0;
    if (n) {
        const char *q = b->p + n;
        while (*q == ' ' || *q == '\t') q++;
        yes = q[0] == ':' && q[1] == ':' && q[2] == '=';
    }
    b->p = save;
    return yes;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Reads one (possibly escaped) character as a code point; -1 on error. */
static long read_char(bld *b) {
    const unsigned char *p = (const unsigned char *)b->p;
    if (!*p) return fail(b, "unexpected end of input"), -1;
    if (*p == '\\') {
        p++;
        char c = (char)*p++;
        int nh = 0;
        switch (c) {
        case 'n': b->p = (const char *)p; return '\n';
        case 't': b->p = (const char *)p; return '\t';
        case 'r': b->p = (const char *)p; return '\r';
        case 'f': b->p = (const char *)p; return '\f';
        case 'v': b->p = (const char *)p; return '\v';
        case '0': b->p = (const char *)p; return 0;
        case 'x': nh = 2; break;
        case 'u': nh = 4; break;
        case 'U': nh = 8; break;
        case '\0': return fail(b, "unexpected end of input after '\\'"), -1;
        default: b->p = (const char *)p; return (unsigned char)c;
        }
        long v = 0;
        for (int i = 0; i < nh; i++) {
            int h = hexval((char)p[i]);
            if (h < 0) { b->p = (const char *)p; return fail(b, "bad \\%c escape", c), -1; }
            v = v * 16 + h;
        }
        b->p = (const char *)p + nh;
        return v;
    }
    /* UTF-8 decode */
    unsigned c = *p;
    int n = c < 0x80 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    if (n < 0) return fail(b, "invalid UTF-8"), -1;
    long v = n == 0 ? c : n == 1 ? (c & 0x1F) : n == 2 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i <= n; i++) {
        if ((p[i] & 0xC0) != 0x80) return fail(b, "invalid UTF-8"), -1;
        v = (v << 6) | (p[i] & 0x3F);
    }
    b->p = (const char *)p + n + 1;
    return v;
}

static int utf8_encode(long cp, unsigned char *o) {
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = (unsigned char)(0xC0 | (cp >> 6)); o[1] = (unsigned char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12)); o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18)); o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- parsing ---- */

static int parse_alternatives(bld *b, int rule, int nested);

/* Parses one primary into a fresh alternative `a` (appending elements). */
static void parse_primary(bld *b, int rule_of_alt, int ai) {
    char c = *b->p;
    if (c == '"') {
        b->p++;
        while (*b->p != '"') {
            if (!*b->p) { fail(b, "unterminated string literal"); return; }
            long cp = read_char(b);
            if (cp < 0) return;
            if (cp > 0x10FFFF) { fail(b, "code point out of range"); return; }
            unsigned char u[4];
            /* \xHH in a literal is a raw byte, as llama.cpp reads it */
            int n = cp < 0x100 && b->p[-4] == '\\' && (b->p[-3] == 'x') ? (u[0] = (unsigned char)cp, 1) : utf8_encode(cp, u);
            for (int i = 0; i < n; i++) push_byte_range(b, &b->rules[rule_of_alt].alts[ai], u[i], u[i]);
        }
        b->p++;
    } else if (c == '[' || c == '.') {
        int neg = 0;
        uint32_t set[8] = {0};
        long *wide = NULL; /* non-ASCII code point ranges, pairs */
        int n_wide = 0;
        if (c == '.') {
            b->p++;
            neg = 1;
            set['\n' >> 5] |= 1u << ('\n' & 31);
        } else {
            b->p++;
            if (*b->p == '^') { neg = 1; b->p++; }
            while (*b->p != ']') {
                if (!*b->p) { fail(b, "unterminated character class"); free(wide); return; }
                long lo = read_char(b), hi = lo;
                if (lo < 0) { free(wide); return; }
                if (b->p[0] == '-' && b->p[1] != ']' && b->p[1]) {
                    b->p++;
                    hi = read_char(b);
                    if (hi < 0) { free(wide); return; }
                    if (hi < lo) { fail(b, "character range is out of order"); free(wide); return; }
                }
                long alo = lo, ahi = hi < 0x80 ? hi : 0x7F;
                for (long x = alo; x <= ahi && x < 0x80; x++) set[x >> 5] |= 1u << (x & 31);
                if (hi >= 0x80) {
                    long wl = lo < 0x80 ? 0x80 : lo;
                    long *nw = realloc(wide, (size_t)(n_wide + 1) * 2 * sizeof *nw);
                    if (!nw) { free(wide); oom(b); return; }
                    wide = nw;
                    wide[2 * n_wide] = wl;
                    wide[2 * n_wide + 1] = hi;
                    n_wide++;
                }
            }
            b->p++;
        }
        balt *a = &b->rules[rule_of_alt].alts[ai];
        if (neg) {
            if (n_wide) { fail(b, "non-ASCII characters in a negated class are not supported"); free(wide); return; }
            /* any ASCII byte not in set, or any multi-byte character */
            gelem e;
            memset(&e, 0, sizeof e);
            e.kind = GE_CLASS;
            for (unsigned x = 0; x < 0x80; x++) if (!gset_has(set, x)) e.set[x >> 5] |= 1u << (x & 31);
            int h = new_helper(b, b->rules[rule_of_alt].name);
            int mb = mb_rule(b);
            if (h < 0 || mb < 0) return;
            int a1 = alt_new(b, h);
            if (a1 < 0) return;
            alt_push(b, &b->rules[h].alts[a1], &e);
            int a2 = alt_new(b, h);
            if (a2 < 0) return;
            push_ref(b, &b->rules[h].alts[a2], mb);
            push_ref(b, &b->rules[rule_of_alt].alts[ai], h);
        } else if (!n_wide) {
            gelem e;
            memset(&e, 0, sizeof e);
            e.kind = GE_CLASS;
            memcpy(e.set, set, sizeof set);
            alt_push(b, a, &e);
        } else {
            long total = 0;
            for (int i = 0; i < n_wide; i++) total += wide[2 * i + 1] - wide[2 * i] + 1;
            if (total > 4096) { fail(b, "a character class with more than 4096 non-ASCII characters is not supported"); free(wide); return; }
            int h = new_helper(b, b->rules[rule_of_alt].name);
            if (h < 0) { free(wide); return; }
            int any_ascii = 0;
            for (int i = 0; i < 8; i++) any_ascii |= set[i] != 0;
            if (any_ascii) {
                int a1 = alt_new(b, h);
                if (a1 < 0) { free(wide); return; }
                gelem e;
                memset(&e, 0, sizeof e);
                e.kind = GE_CLASS;
                memcpy(e.set, set, sizeof set);
                alt_push(b, &b->rules[h].alts[a1], &e);
            }
            for (int i = 0; i < n_wide; i++)
                for (long cp = wide[2 * i]; cp <= wide[2 * i + 1]; cp++) {
                    int a1 = alt_new(b, h);
                    if (a1 < 0) { free(wide); return; }
                    unsigned char u[4];
                    int n = utf8_encode(cp, u);
                    for (int k = 0; k < n; k++) push_byte_range(b, &b->rules[h].alts[a1], u[k], u[k]);
                }
            push_ref(b, &b->rules[rule_of_alt].alts[ai], h);
        }
        free(wide);
    } else if (c == '(') {
        b->p++;
        int h = new_helper(b, b->rules[rule_of_alt].name);
        if (h < 0) return;
        if (parse_alternatives(b, h, 1)) return;
        skip_ws(b, 1);
        if (*b->p != ')') { fail(b, "expected ')'"); return; }
        b->p++;
        push_ref(b, &b->rules[rule_of_alt].alts[ai], h);
    } else if (is_name_char(c)) {
        size_t n = name_len(b->p);
        int r = rule_get(b, b->p, n);
        if (r < 0) return;
        b->p += n;
        push_ref(b, &b->rules[rule_of_alt].alts[ai], r);
    } else {
        fail(b, "unexpected character '%c'", c);
    }
}

/* Copies elements [from, n) of alternative ai of rule r into a fresh helper rule's single alternative
 * and replaces them by a reference to it; returns the helper. */
static int factor_tail(bld *b, int r, int ai, int from) {
    int h = new_helper(b, b->rules[r].name);
    if (h < 0) return -1;
    int ha = alt_new(b, h);
    if (ha < 0) return -1;
    balt *src = &b->rules[r].alts[ai];
    for (int i = from; i < src->n; i++) {
        alt_push(b, &b->rules[h].alts[ha], &src->e[i]);
        src = &b->rules[r].alts[ai];
    }
    src->n = from;
    return h;
}

/* x{min,max} (max < 0 = unbounded) of the item that helper rule `item` matches, appended to alt. */
static void repeat(bld *b, int r, int ai, int item, long min, long max) {
    if (min > 1000 || max > 1000) { fail(b, "repetition bound over 1000"); return; }
    for (long i = 0; i < min; i++) push_ref(b, &b->rules[r].alts[ai], item);
    if (max < 0) { /* star ::= item star | "" */
        int st = new_helper(b, b->rules[r].name);
        if (st < 0) return;
        int a1 = alt_new(b, st), a2 = a1 >= 0 ? alt_new(b, st) : -1;
        if (a2 < 0) return;
        (void)a2;
        push_ref(b, &b->rules[st].alts[a1], item);
        push_ref(b, &b->rules[st].alts[a1], st);
        push_ref(b, &b->rules[r].alts[ai], st);
        return;
    }
    /* opt_k ::= item opt_{k-1} | "" with opt_0 empty: up to max - min more */
    int prev = -1;
    for (long k = 0; k < max - min; k++) {
        int o = new_helper(b, b->rules[r].name);
        if (o < 0) return;
        int a1 = alt_new(b, o), a2 = a1 >= 0 ? alt_new(b, o) : -1;
        if (a2 < 0) return;
        push_ref(b, &b->rules[o].alts[a1], item);
        if (prev >= 0) push_ref(b, &b->rules[o].alts[a1], prev);
        prev = o;
    }
    if (prev >= 0) push_ref(b, &b->rules[r].alts[ai], prev);
}

static long read_int(bld *b) {
    long v = 0;
    int any = 0;
    while (*b->p >= '0' && *b->p <= '9') {
        v = v * 10 + (*b->p++ - '0');
        if (v > 100000) v = 100000;
        any = 1;
    }
    return any ? v : -1;
}

/* sequence: items until '|', ')', end of input or the start of the next rule */
static int parse_sequence(bld *b, int rule, int nested) {
    int ai = alt_new(b, rule);
    if (ai < 0) return b->rc;
    for (;;) {
        skip_ws(b, nested);
        if (!nested && *b->p == '\n') {
            if (at_rule_start(b)) break;
            skip_ws(b, 1);
            continue;
        }
        char c = *b->p;
        if (!c || c == '|' || c == ')') break;
        if (!nested && at_rule_start(b)) break;
        int start = b->rules[rule].alts[ai].n;
        parse_primary(b, rule, ai);
        if (b->rc) return b->rc;
        /* postfix operators apply to the last primary: elements [start, n) */
        skip_ws(b, 0);
        c = *b->p;
        long mn = -2, mx = -2;
        if (c == '*') mn = 0, mx = -1;
        else if (c == '+') mn = 1, mx = -1;
        else if (c == '?') mn = 0, mx = 1;
        else if (c == '{') {
            b->p++;
            skip_ws(b, 0);
            mn = read_int(b);
            if (mn < 0) return fail(b, "expected a number after '{'");
            skip_ws(b, 0);
            if (*b->p == ',') {
                b->p++;
                skip_ws(b, 0);
                mx = read_int(b); /* -1 = unbounded */
            } else {
                mx = mn;
            }
            skip_ws(b, 0);
            if (*b->p != '}') return fail(b, "expected '}'");
            if (mx >= 0 && mx < mn) return fail(b, "repetition {%ld,%ld} has max < min", mn, mx);
        }
        if (mn != -2) {
            b->p++;
            int item = factor_tail(b, rule, ai, start);
            if (item < 0) return b->rc;
            repeat(b, rule, ai, item, mn, mx);
            if (b->rc) return b->rc;
        }
    }
    return b->rc;
}

static int parse_alternatives(bld *b, int rule, int nested) {
    if (++b->depth > 200) return fail(b, "nesting deeper than 200");
    for (;;) {
        if (parse_sequence(b, rule, nested)) return b->rc;
        skip_ws(b, nested);
        if (*b->p == '|') { b->p++; continue; }
        break;
    }
    b->depth--;
    return b->rc;
}

static void builder_free(bld *b) {
    for (int i = 0; i < b->n_rules; i++) {
        for (int j = 0; j < b->rules[i].n; j++) free(b->rules[i].alts[j].e);
        free(b->rules[i].alts);
        free(b->rules[i].name);
    }
    free(b->rules);
}

/* nullable[r]: rule r can match the empty string */
static void compute_nullable(const ms_grammar *g, uint8_t *nullable) {
    memset(nullable, 0, (size_t)g->n_rules);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < g->n_rules; r++) {
            if (nullable[r]) continue;
            for (int a = 0; a < g->rule_nalt[r] && !nullable[r]; a++) {
                int p = g->alt_start[g->rule_alt0[r] + a], ok = 1;
                for (; g->el[p].kind != GE_END; p++)
                    if (g->el[p].kind == GE_CLASS || !nullable[g->el[p].rule]) { ok = 0; break; }
                if (ok) nullable[r] = 1, changed = 1;
            }
        }
    }
}

/* Left recursion (a rule reaching itself through nullable prefixes) would loop the automaton. */
static int check_left_recursion(const ms_grammar *g, ms_err *err) {
    int R = g->n_rules;
    uint8_t *nullable = malloc((size_t)R), *reach = calloc((size_t)R * R, 1);
    if (!nullable || !reach) { free(nullable); free(reach); return ms_errf(err, MS_ERR_NOMEM, "grammar: out of memory"); }
    compute_nullable(g, nullable);
    for (int r = 0; r < R; r++)
        for (int a = 0; a < g->rule_nalt[r]; a++)
            for (int p = g->alt_start[g->rule_alt0[r] + a]; g->el[p].kind == GE_REF; p++) {
                reach[(size_t)r * R + g->el[p].rule] = 1;
                if (!nullable[g->el[p].rule]) break;
            }
    /* transitive closure (Warshall); grammars here have at most a few thousand rules */
    int rc = MS_OK;
    if (R <= 3000) {
        for (int k = 0; k < R; k++)
            for (int i = 0; i < R; i++)
                if (reach[(size_t)i * R + k])
                    for (int j = 0; j < R; j++) reach[(size_t)i * R + j] |= reach[(size_t)k * R + j];
        for (int r = 0; r < R; r++)
            if (reach[(size_t)r * R + r]) {
                rc = ms_errf(err, MS_ERR_INVALID, "grammar: rule '%s' is left-recursive", g->rule_name[r]);
                break;
            }
    }
    free(nullable);
    free(reach);
    return rc;
}

void ms_gbnf_free_rules(ms_grammar *g) {
    free(g->el);
    free(g->alt_start);
    free(g->rule_alt0);
    free(g->rule_nalt);
    if (g->rule_name)
        for (int i = 0; i < g->n_rules; i++) free(g->rule_name[i]);
    free(g->rule_name);
    g->el = NULL;
    g->alt_start = g->rule_alt0 = g->rule_nalt = NULL;
    g->rule_name = NULL;
}

int ms_gbnf_build(const char *src, ms_grammar *g, ms_err *err) {
    bld b;
    memset(&b, 0, sizeof b);
    b.src = b.p = src;
    b.err = err;
    b.mb_rule = -1;
    for (;;) {
        skip_ws(&b, 1);
        if (!*b.p) break;
        size_t n = name_len(b.p);
        if (!n) { fail(&b, "expected a rule name"); break; }
        int r = rule_get(&b, b.p, n);
        if (r < 0) break;
        if (b.rules[r].defined) { fail(&b, "rule '%s' is defined twice", b.rules[r].name); break; }
        b.rules[r].defined = 1;
        b.p += n;
        skip_ws(&b, 0);
        if (strncmp(b.p, "::=", 3)) { fail(&b, "expected '::=' after rule name '%s'", b.rules[r].name); break; }
        b.p += 3;
        if (parse_alternatives(&b, r, 0)) break;
        skip_ws(&b, 1);
        if (*b.p == ')') { fail(&b, "unmatched ')'"); break; }
    }
    int root = -1;
    if (!b.rc) {
        for (int i = 0; i < b.n_rules; i++) {
            if (!b.rules[i].defined) { fail(&b, "rule '%s' is used but not defined", b.rules[i].name); break; }
            if (!strcmp(b.rules[i].name, "root")) root = i;
        }
        if (!b.rc && root < 0) ms_errf(err, MS_ERR_INVALID, "grammar: no 'root' rule"), b.rc = MS_ERR_INVALID;
    }
    if (b.rc) {
        int rc = b.rc;
        builder_free(&b);
        return rc;
    }
    /* flatten */
    int n_el = 0, n_alts = 0;
    for (int i = 0; i < b.n_rules; i++) {
        n_alts += b.rules[i].n;
        for (int j = 0; j < b.rules[i].n; j++) n_el += b.rules[i].alts[j].n + 1;
    }
    g->el = calloc((size_t)n_el + 1, sizeof *g->el);
    g->alt_start = malloc(((size_t)n_alts + 1) * sizeof *g->alt_start);
    g->rule_alt0 = malloc((size_t)b.n_rules * sizeof *g->rule_alt0);
    g->rule_nalt = malloc((size_t)b.n_rules * sizeof *g->rule_nalt);
    g->rule_name = calloc((size_t)b.n_rules, sizeof *g->rule_name);
    if (!g->el || !g->alt_start || !g->rule_alt0 || !g->rule_nalt || !g->rule_name) {
        builder_free(&b);
        ms_gbnf_free_rules(g);
        return ms_errf(err, MS_ERR_NOMEM, "grammar: out of memory");
    }
    g->n_rules = b.n_rules;
    int pe = 0, pa = 0;
    for (int i = 0; i < b.n_rules; i++) {
        g->rule_alt0[i] = pa;
        g->rule_nalt[i] = b.rules[i].n;
        g->rule_name[i] = b.rules[i].name;
        b.rules[i].name = NULL;
        for (int j = 0; j < b.rules[i].n; j++) {
            g->alt_start[pa++] = pe;
            for (int k = 0; k < b.rules[i].alts[j].n; k++) g->el[pe++] = b.rules[i].alts[j].e[k];
            g->el[pe++].kind = GE_END;
        }
    }
    g->n_el = pe;
    g->n_alts = pa;
    g->root = root;
    builder_free(&b);
    int rc = check_left_recursion(g, err);
    if (rc) ms_gbnf_free_rules(g);
    return rc;
}
