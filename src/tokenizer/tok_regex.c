/* tok_regex.c - the Split pre-tokenizer's regular expressions.
 *
 * The reference evaluates tokenizer.json patterns with Oniguruma. Oniguruma alone runs at about
 * 20 MB/s on the GPT-4-style patterns, which would make it the whole encode budget, so patterns
 * written in the small subset tokenizers use (alternation, (?:) (?i:) groups, (?!) (?=)
 * lookahead, classes with \p{..} \s \d, greedy quantifiers on single characters) are run by the
 * backtracking matcher below, which follows Oniguruma's leftmost-first, greedy-with-backtracking
 * semantics. Any other construct makes us hand the pattern to Oniguruma itself. Tests compare
 * the two engines on generated text. */
#include "tokenizer/tok_internal.h"

#include <oniguruma.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RX_INF 0x7fffffff
#define RX_MAX_NEG 4

typedef struct {
    uint32_t lo, hi;
} rx_range;

typedef struct {
    uint64_t ascii[2]; /* final membership of code points < 128 (negation applied) */
    int neg;
    uint32_t cat;                /* category bits that are members */
    uint32_t ncat[RX_MAX_NEG];   /* \P{X} / \S items: member when none of these bits is set */
    int n_ncat;
    int rfirst, rcount;          /* ranges in rx->ranges */
} rx_class;

enum { N_CLASS, N_GROUP, N_LOOK };
typedef struct {
    uint8_t kind, neg;
    int min, max;
    int arg; /* class index (N_CLASS) or alternation index (N_GROUP, N_LOOK) */
} rx_node;

typedef struct {
    int first, count;
} rx_span;

/* What can start a match of a sequence: ASCII bytes, any non-ASCII char, or nothing (empty). */
typedef struct {
    uint64_t ascii[2];
    int nonascii, empty;
} rx_first;

struct tk_regex {
    int native;
    rx_first *top_first; /* per top-level alternative */
    regex_t *onig;
    rx_node *nodes;
    int n_nodes, cap_nodes;
    rx_span *seqs; /* node spans */
    int n_seqs, cap_seqs;
    int *altseq; /* seq indices, alternations are spans of this array */
    int n_altseq, cap_altseq;
    rx_span *alts;
    int n_alts, cap_alts;
    rx_class *classes;
    int n_classes, cap_classes;
    rx_range *ranges;
    int n_ranges, cap_ranges;
    int top;
};

#define GROW(arr, n, cap)                                                                         \
    do {                                                                                          \
        if ((n) >= (cap)) {                                                                       \
            int nc_ = (cap) ? (cap) * 2 : 16;                                                     \
            void *np_ = realloc((arr), (size_t)nc_ * sizeof *(arr));                              \
            if (!np_) return -1;                                                                  \
            (arr) = np_;                                                                          \
            (cap) = nc_;                                                                          \
        }                                                                                         \
    } while (0)

/* ---------------- parser ---------------- */

typedef struct {
    tk_regex *r;
    const char *p, *end;
    char *why;
    size_t why_cap;
    int unsupported; /* 1: valid maybe, but not our subset -> Oniguruma */
    int depth;
} rx_parser;

static int unsup(rx_parser *P, const char *fmt, ...) {
    if (!P->unsupported) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(P->why, P->why_cap, fmt, ap);
        va_end(ap);
    }
    P->unsupported = 1;
    return -1;
}

static int new_class(tk_regex *r) {
    GROW(r->classes, r->n_classes, r->cap_classes);
    rx_class *c = &r->classes[r->n_classes];
    memset(c, 0, sizeof *c);
    c->rfirst = r->n_ranges;
    return r->n_classes++;
}

/* Ranges of a class must be contiguous: classes are built one at a time. */
static int class_add_range(tk_regex *r, int ci, uint32_t lo, uint32_t hi) {
    GROW(r->ranges, r->n_ranges, r->cap_ranges);
    r->ranges[r->n_ranges++] = (rx_range){lo, hi};
    r->classes[ci].rcount++;
    return 0;
}

static int class_raw_has(const tk_regex *r, const rx_class *c, uint32_t cp) {
    for (int i = 0; i < c->rcount; i++) {
        const rx_range *g = &r->ranges[c->rfirst + i];
        if (cp >= g->lo && cp <= g->hi) return 1;
    }
    if (c->cat || c->n_ncat) {
        uint32_t m = tk_cat(cp);
        if (m & c->cat) return 1;
        for (int i = 0; i < c->n_ncat; i++)
            if (!(m & c->ncat[i])) return 1;
    }
    return 0;
}

/* Unicode simple case folds that land on ASCII letters (Oniguruma's (?i) honours them). */
static int class_add_fold(tk_regex *r, int ci, uint32_t c) {
    uint32_t lo = c | 0x20;
    if (lo < 'a' || lo > 'z') return class_add_range(r, ci, c, c);
    if (class_add_range(r, ci, lo, lo) || class_add_range(r, ci, lo - 32, lo - 32)) return -1;
    if (lo == 's') return class_add_range(r, ci, 0x17F, 0x17F);
    if (lo == 'k') return class_add_range(r, ci, 0x212A, 0x212A);
    return 0;
}

static void class_finish(tk_regex *r, int ci) {
    rx_class *c = &r->classes[ci];
    c->ascii[0] = c->ascii[1] = 0;
    for (uint32_t cp = 0; cp < 128; cp++)
        if (class_raw_has(r, c, cp) ^ c->neg) c->ascii[cp >> 6] |= 1ull << (cp & 63);
}

static int prop_bits(const char *name, size_t n, uint32_t *bits) {
    static const struct {
        const char *n;
        uint32_t b;
    } T[] = {
        {"L", TK_C_L}, {"Letter", TK_C_L}, {"Lu", TK_C_LU}, {"Ll", TK_C_LL}, {"Lt", TK_C_LT},
        {"Lm", TK_C_LM}, {"Lo", TK_C_LO}, {"M", TK_C_M}, {"Mark", TK_C_M}, {"Mn", TK_C_MN},
        {"Mc", TK_C_MC}, {"Me", TK_C_ME}, {"N", TK_C_N}, {"Number", TK_C_N}, {"Nd", TK_C_ND},
        {"Nl", TK_C_NL}, {"No", TK_C_NO}, {"P", TK_C_P}, {"Punctuation", TK_C_P},
        {"Pc", 1u << 12}, {"Pd", 1u << 13}, {"Ps", 1u << 14}, {"Pe", 1u << 15}, {"Pi", 1u << 16},
        {"Pf", 1u << 17}, {"Po", 1u << 18}, {"S", TK_C_S}, {"Symbol", TK_C_S}, {"Sm", 1u << 19},
        {"Sc", 1u << 20}, {"Sk", 1u << 21}, {"So", 1u << 22}, {"Z", TK_C_Z}, {"Separator", TK_C_Z},
        {"Zs", 1u << 23}, {"Zl", 1u << 24}, {"Zp", 1u << 25}, {"C", TK_C_C}, {"Other", TK_C_C},
        {"Cc", 1u << 26}, {"Cf", 1u << 27}, {"Cs", 1u << 28}, {"Co", 1u << 29}, {"Cn", 1u},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (strlen(T[i].n) == n && !strncmp(T[i].n, name, n)) { *bits = T[i].b; return 0; }
    return -1;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Escape kinds returned by parse_escape. */
enum { E_LIT, E_CAT, E_NCAT };

/* Parses the escape after '\' (P->p points past the backslash). Sets *cp for literals or *bits
 * for category classes. */
static int parse_escape(rx_parser *P, int *kind, uint32_t *cp, uint32_t *bits) {
    if (P->p >= P->end) return unsup(P, "pattern ends with a backslash");
    int c = (unsigned char)*P->p++;
    *kind = E_LIT;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case 'a': *cp = 7; return 0;
    case 'e': *cp = 27; return 0;
    case 's': *kind = E_CAT; *bits = TK_WS; return 0;
    case 'S': *kind = E_NCAT; *bits = TK_WS; return 0;
    case 'd': *kind = E_CAT; *bits = TK_C_ND; return 0;
    case 'D': *kind = E_NCAT; *bits = TK_C_ND; return 0;
    case 'x': case 'u': {
        uint32_t v = 0;
        int nd = 0;
        if (c == 'x' && P->p < P->end && *P->p == '{') {
            P->p++;
            while (P->p < P->end && *P->p != '}') {
                int h = hexval((unsigned char)*P->p++);
                if (h < 0 || ++nd > 8) return unsup(P, "malformed \\x{...} escape");
                v = v * 16 + (uint32_t)h;
            }
            if (P->p >= P->end || nd == 0) return unsup(P, "malformed \\x{...} escape");
            P->p++;
        } else {
            int want = c == 'x' ? 2 : 4;
            while (nd < want && P->p < P->end && hexval((unsigned char)*P->p) >= 0) {
                v = v * 16 + (uint32_t)hexval((unsigned char)*P->p++);
                nd++;
            }
            if (nd == 0 || (c == 'u' && nd != 4)) return unsup(P, "malformed \\%c escape", c);
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return unsup(P, "escape out of Unicode range");
        *cp = v;
        return 0;
    }
    case 'p': case 'P': {
        if (P->p >= P->end || *P->p != '{') return unsup(P, "\\%c without {name}", c);
        const char *s = ++P->p;
        while (P->p < P->end && *P->p != '}') P->p++;
        if (P->p >= P->end) return unsup(P, "unterminated \\%c{", c);
        const char *e = P->p++;
        int neg = c == 'P';
        if (s < e && *s == '^') { neg = !neg; s++; }
        if (prop_bits(s, (size_t)(e - s), bits)) return unsup(P, "property \\p{%.*s}", (int)(e - s), s);
        *kind = neg ? E_NCAT : E_CAT;
        return 0;
    }
    default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
            return unsup(P, "escape \\%c", c);
        if (c >= 0x80) {
            P->p--;
            int l = ms_utf8_dec_valid((const unsigned char *)P->p, (size_t)(P->end - P->p), cp);
            P->p += l;
            return 0;
        }
        *cp = (uint32_t)c;
        return 0;
    }
}

static int next_cp(rx_parser *P, uint32_t *cp) {
    int l = ms_utf8_dec_valid((const unsigned char *)P->p, (size_t)(P->end - P->p), cp);
    P->p += l;
    return 0;
}

static int parse_class(rx_parser *P, int icase) {
    tk_regex *r = P->r;
    int ci = new_class(r);
    if (ci < 0) return -1;
    P->p++; /* '[' */
    if (P->p < P->end && *P->p == '^') { r->classes[ci].neg = 1; P->p++; }
    int first = 1;
    while (1) {
        if (P->p >= P->end) return unsup(P, "unterminated character class");
        char ch = *P->p;
        if (ch == ']' && !first) { P->p++; break; }
        first = 0;
        if (ch == '[') return unsup(P, "nested or POSIX class");
        if (ch == '&' && P->p + 1 < P->end && P->p[1] == '&') return unsup(P, "class intersection");
        uint32_t lo;
        int kind = E_LIT;
        uint32_t bits = 0;
        if (ch == '\\') {
            P->p++;
            if (parse_escape(P, &kind, &lo, &bits)) return -1;
        } else {
            next_cp(P, &lo);
        }
        rx_class *c = &r->classes[ci];
        if (kind == E_CAT) { c->cat |= bits; continue; }
        if (kind == E_NCAT) {
            if (c->n_ncat >= RX_MAX_NEG) return unsup(P, "too many negated classes");
            c->ncat[c->n_ncat++] = bits;
            continue;
        }
        uint32_t hi = lo;
        if (P->p + 1 < P->end && *P->p == '-' && P->p[1] != ']') {
            P->p++;
            if (*P->p == '\\') {
                P->p++;
                if (parse_escape(P, &kind, &hi, &bits)) return -1;
                if (kind != E_LIT) return unsup(P, "range ending in a class escape");
            } else {
                next_cp(P, &hi);
            }
            if (hi < lo) return unsup(P, "empty range in class");
        }
        if (icase) {
            for (uint32_t x = lo; x <= hi && x < 128; x++)
                if (class_add_fold(r, ci, x)) return -1;
            if (hi >= 128 && class_add_range(r, ci, lo < 128 ? 128 : lo, hi)) return -1;
        } else if (class_add_range(r, ci, lo, hi)) {
            return -1;
        }
    }
    class_finish(r, ci);
    return ci;
}

static int parse_alt(rx_parser *P, int icase);

static int push_node(tk_regex *r, rx_node **tmp, int *n, int *cap, rx_node nd) {
    (void)r;
    GROW(*tmp, *n, *cap);
    (*tmp)[(*n)++] = nd;
    return 0;
}

static int parse_quant(rx_parser *P, rx_node *nd) {
    if (P->p >= P->end) return 0;
    char c = *P->p;
    int mn = -1, mx = -1;
    if (c == '?') { mn = 0; mx = 1; P->p++; }
    else if (c == '*') { mn = 0; mx = RX_INF; P->p++; }
    else if (c == '+') { mn = 1; mx = RX_INF; P->p++; }
    else if (c == '{') {
        const char *q = P->p + 1;
        long a = -1, b = -1;
        /* digits saturate at 1000001 (over the 100000 limit below) instead of overflowing */
        if (q < P->end && *q >= '0' && *q <= '9') { a = 0; while (q < P->end && *q >= '0' && *q <= '9') { a = a * 10 + (*q++ - '0'); if (a > 1000000) a = 1000001; } }
        if (q < P->end && *q == '}' && a >= 0) { b = a; q++; }
        else if (q < P->end && *q == ',') {
            q++;
            if (q < P->end && *q >= '0' && *q <= '9') { b = 0; while (q < P->end && *q >= '0' && *q <= '9') { b = b * 10 + (*q++ - '0'); if (b > 1000000) b = 1000001; } }
            else b = RX_INF;
            if (q >= P->end || *q != '}') return 0; /* literal '{' */
            q++;
            if (a < 0) a = 0;
        } else {
            return 0;
        }
        if (a > 100000 || (b != RX_INF && (b > 100000 || b < a))) return unsup(P, "interval out of range");
        mn = (int)a; mx = (int)b;
        P->p = q;
    } else {
        return 0;
    }
    if (P->p < P->end && (*P->p == '?' || *P->p == '+')) return unsup(P, "lazy or possessive quantifier");
    if (nd->min != 1 || nd->max != 1) return unsup(P, "nested quantifier");
    nd->min = mn;
    nd->max = mx;
    return 0;
}

static int parse_seq(rx_parser *P, int icase) {
    tk_regex *r = P->r;
    rx_node *tmp = NULL;
    int n = 0, cap = 0, rc = -1;
    while (P->p < P->end && *P->p != '|' && *P->p != ')') {
        rx_node nd = {N_CLASS, 0, 1, 1, -1};
        char c = *P->p;
        if (c == '(') {
            P->p++;
            int gi = icase;
            nd.kind = N_GROUP;
            if (P->p < P->end && *P->p == '?') {
                if (P->end - P->p >= 2 && P->p[1] == ':') P->p += 2;
                else if (P->end - P->p >= 3 && P->p[1] == 'i' && P->p[2] == ':') { P->p += 3; gi = 1; }
                else if (P->end - P->p >= 4 && !strncmp(P->p, "?-i:", 4)) { P->p += 4; gi = 0; }
                else if (P->end - P->p >= 2 && (P->p[1] == '!' || P->p[1] == '=')) {
                    nd.kind = N_LOOK;
                    nd.neg = P->p[1] == '!';
                    P->p += 2;
                } else {
                    unsup(P, "group syntax (?%c", P->end - P->p >= 2 ? P->p[1] : ' ');
                    goto out;
                }
            }
            if (++P->depth > 64) { unsup(P, "groups nested too deeply"); goto out; }
            int a = parse_alt(P, gi);
            P->depth--;
            if (a < 0) goto out;
            if (P->p >= P->end || *P->p != ')') { unsup(P, "unbalanced parenthesis"); goto out; }
            P->p++;
            nd.arg = a;
        } else if (c == '[') {
            nd.arg = parse_class(P, icase);
            if (nd.arg < 0) goto out;
        } else if (c == '.') {
            P->p++;
            nd.arg = new_class(r);
            if (nd.arg < 0) goto out;
            r->classes[nd.arg].neg = 1;
            if (class_add_range(r, nd.arg, '\n', '\n')) goto out;
            class_finish(r, nd.arg);
        } else if (c == '^' || c == '$') {
            unsup(P, "anchor %c", c);
            goto out;
        } else if (c == '*' || c == '+' || c == '?') {
            unsup(P, "quantifier %c without a target", c);
            goto out;
        } else if (c == '{' && P->p + 1 < P->end && (P->p[1] == ',' || (P->p[1] >= '0' && P->p[1] <= '9'))) {
            unsup(P, "interval without a target");
            goto out;
        } else {
            uint32_t cp, bits = 0;
            int kind = E_LIT;
            if (c == '\\') {
                P->p++;
                if (parse_escape(P, &kind, &cp, &bits)) goto out;
            } else {
                next_cp(P, &cp);
            }
            nd.arg = new_class(r);
            if (nd.arg < 0) goto out;
            rx_class *cl = &r->classes[nd.arg];
            if (kind == E_CAT) cl->cat = bits;
            else if (kind == E_NCAT) { cl->ncat[0] = bits; cl->n_ncat = 1; }
            else if (icase ? class_add_fold(r, nd.arg, cp) : class_add_range(r, nd.arg, cp, cp)) goto out;
            class_finish(r, nd.arg);
        }
        if (parse_quant(P, &nd)) goto out;
        if (nd.kind == N_LOOK && (nd.min != 1 || nd.max != 1)) { unsup(P, "quantified lookahead"); goto out; }
        if (nd.kind == N_GROUP && nd.max > 1) { unsup(P, "repeated group"); goto out; }
        if (push_node(r, &tmp, &n, &cap, nd)) goto out;
    }
    if (r->n_nodes + n > r->cap_nodes) {
        int nc = r->cap_nodes ? r->cap_nodes : 16;
        while (nc < r->n_nodes + n) nc *= 2;
        void *np = realloc(r->nodes, (size_t)nc * sizeof *r->nodes);
        if (!np) goto out;
        r->nodes = np;
        r->cap_nodes = nc;
    }
    if (n) memcpy(r->nodes + r->n_nodes, tmp, (size_t)n * sizeof *tmp);
    if (r->n_seqs >= r->cap_seqs) {
        int nc = r->cap_seqs ? r->cap_seqs * 2 : 16;
        void *np = realloc(r->seqs, (size_t)nc * sizeof *r->seqs);
        if (!np) goto out;
        r->seqs = np;
        r->cap_seqs = nc;
    }
    r->seqs[r->n_seqs] = (rx_span){r->n_nodes, n};
    r->n_nodes += n;
    rc = r->n_seqs++;
out:
    free(tmp);
    return rc;
}

static int parse_alt(rx_parser *P, int icase) {
    tk_regex *r = P->r;
    int *tmp = NULL, n = 0, cap = 0, rc = -1;
    while (1) {
        int s = parse_seq(P, icase);
        if (s < 0) goto out;
        if (n >= cap) {
            cap = cap ? cap * 2 : 8;
            int *nt = realloc(tmp, (size_t)cap * sizeof *tmp);
            if (!nt) goto out;
            tmp = nt;
        }
        tmp[n++] = s;
        if (P->p < P->end && *P->p == '|') { P->p++; continue; }
        break;
    }
    if (r->n_altseq + n > r->cap_altseq) {
        int nc = r->cap_altseq ? r->cap_altseq : 16;
        while (nc < r->n_altseq + n) nc *= 2;
        void *np = realloc(r->altseq, (size_t)nc * sizeof *r->altseq);
        if (!np) goto out;
        r->altseq = np;
        r->cap_altseq = nc;
    }
    memcpy(r->altseq + r->n_altseq, tmp, (size_t)n * sizeof *tmp);
    if (r->n_alts >= r->cap_alts) {
        int nc = r->cap_alts ? r->cap_alts * 2 : 8;
        void *np = realloc(r->alts, (size_t)nc * sizeof *r->alts);
        if (!np) goto out;
        r->alts = np;
        r->cap_alts = nc;
    }
    r->alts[r->n_alts] = (rx_span){r->n_altseq, n};
    r->n_altseq += n;
    rc = r->n_alts++;
out:
    free(tmp);
    return rc;
}

/* ---------------- matcher ---------------- */

typedef struct rx_k {
    int type; /* 0: continue a sequence; 1: after one iteration of a group */
    int seq, idx;
    const rx_node *rep;
    int count;
    size_t start;
    const struct rx_k *next;
} rx_k;

typedef struct {
    const tk_regex *r;
    const unsigned char *s;
    size_t n;
} rx_m;

static inline int cls_has(const tk_regex *r, const rx_class *c, uint32_t cp) {
    if (cp < 128) return (int)((c->ascii[cp >> 6] >> (cp & 63)) & 1);
    return class_raw_has(r, c, cp) ^ c->neg;
}

static long m_seq(const rx_m *m, int seq, int idx, size_t pos, const rx_k *k);
static long m_rep(const rx_m *m, const rx_node *nd, int count, size_t pos, size_t last, const rx_k *k);

static long m_cont(const rx_m *m, size_t pos, const rx_k *k) {
    if (!k) return (long)pos;
    if (k->type == 0) return m_seq(m, k->seq, k->idx, pos, k->next);
    return m_rep(m, k->rep, k->count, pos, k->start, k->next);
}

static long m_alt(const rx_m *m, int alt, size_t pos, const rx_k *k) {
    const rx_span *a = &m->r->alts[alt];
    for (int i = 0; i < a->count; i++) {
        long r = m_seq(m, m->r->altseq[a->first + i], 0, pos, k);
        if (r >= 0) return r;
    }
    return -1;
}

static long m_rep(const rx_m *m, const rx_node *nd, int count, size_t pos, size_t last, const rx_k *k) {
    if (count < nd->max && !(count > 0 && pos == last)) {
        rx_k kk = {1, 0, 0, nd, count + 1, pos, k};
        long r = m_alt(m, nd->arg, pos, &kk);
        if (r >= 0) return r;
    }
    if (count >= nd->min) return m_cont(m, pos, k);
    return -1;
}

static long m_seq(const rx_m *m, int seq, int idx, size_t pos, const rx_k *k) {
    const tk_regex *r = m->r;
    const rx_span *sp = &r->seqs[seq];
    const unsigned char *s = m->s;
    size_t n = m->n;
    for (; idx < sp->count; idx++) {
        const rx_node *nd = &r->nodes[sp->first + idx];
        if (nd->kind == N_CLASS) {
            const rx_class *c = &r->classes[nd->arg];
            if (nd->min == 1 && nd->max == 1) {
                if (pos >= n) return -1;
                uint32_t cp;
                int l = s[pos] < 0x80 ? (cp = s[pos], 1) : ms_utf8_dec_valid(s + pos, n - pos, &cp);
                if (!cls_has(r, c, cp)) return -1;
                pos += (size_t)l;
                continue;
            }
            size_t p = pos;
            int cnt = 0;
            while (cnt < nd->max && p < n) {
                uint32_t cp;
                int l = s[p] < 0x80 ? (cp = s[p], 1) : ms_utf8_dec_valid(s + p, n - p, &cp);
                if (!cls_has(r, c, cp)) break;
                p += (size_t)l;
                cnt++;
            }
            if (cnt < nd->min) return -1;
            if (idx + 1 == sp->count && !k) return (long)p;
            while (1) {
                long res = m_seq(m, seq, idx + 1, p, k);
                if (res >= 0) return res;
                if (cnt == nd->min) return -1;
                do p--; while (p > pos && (s[p] & 0xC0) == 0x80);
                cnt--;
            }
        } else if (nd->kind == N_GROUP) {
            rx_k kk = {0, seq, idx + 1, NULL, 0, 0, k};
            return m_rep(m, nd, 0, pos, pos, &kk);
        } else {
            long res = m_alt(m, nd->arg, pos, NULL);
            if ((res >= 0) == nd->neg) return -1;
        }
    }
    return m_cont(m, pos, k);
}

/* ---------------- first-character sets ---------------- */

static void first_of_seq(const tk_regex *r, int seq, int idx, rx_first *f, int depth) {
    const rx_span *sp = &r->seqs[seq];
    for (; idx < sp->count; idx++) {
        const rx_node *nd = &r->nodes[sp->first + idx];
        if (nd->kind == N_CLASS) {
            const rx_class *c = &r->classes[nd->arg];
            f->ascii[0] |= c->ascii[0];
            f->ascii[1] |= c->ascii[1];
            int na = c->neg || c->cat || c->n_ncat;
            for (int i = 0; i < c->rcount && !na; i++) na = r->ranges[c->rfirst + i].hi >= 128;
            f->nonascii |= na;
            if (nd->min >= 1) return;
        } else if (nd->kind == N_GROUP) {
            const rx_span *a = &r->alts[nd->arg];
            int any_empty = nd->min == 0;
            for (int i = 0; i < a->count; i++) {
                rx_first g = {{0, 0}, 0, 0};
                if (depth > 32) { g.ascii[0] = g.ascii[1] = ~0ull; g.nonascii = 1; g.empty = 1; }
                else first_of_seq(r, r->altseq[a->first + i], 0, &g, depth + 1);
                f->ascii[0] |= g.ascii[0];
                f->ascii[1] |= g.ascii[1];
                f->nonascii |= g.nonascii;
                any_empty |= g.empty;
            }
            if (!any_empty) return;
        }
        /* lookahead consumes nothing: look past it */
    }
    f->empty = 1;
}

static int build_first(tk_regex *r) {
    const rx_span *a = &r->alts[r->top];
    r->top_first = calloc((size_t)a->count + 1, sizeof *r->top_first);
    if (!r->top_first) return -1;
    for (int i = 0; i < a->count; i++) first_of_seq(r, r->altseq[a->first + i], 0, &r->top_first[i], 0);
    return 0;
}

/* ---------------- Oniguruma ---------------- */

static pthread_once_t g_onig_once = PTHREAD_ONCE_INIT;
static void onig_init_once(void) {
    OnigEncoding use[] = {ONIG_ENCODING_UTF8};
    onig_initialize(use, 1);
}

int tk_regex_new_onig(const char *pat, size_t len, tk_regex **out, char *why, size_t why_cap) {
    pthread_once(&g_onig_once, onig_init_once);
    tk_regex *r = calloc(1, sizeof *r);
    if (!r) { snprintf(why, why_cap, "out of memory"); return -1; }
    OnigErrorInfo ei;
    int rc = onig_new(&r->onig, (const UChar *)pat, (const UChar *)pat + len, ONIG_OPTION_NONE,
                      ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &ei);
    if (rc != ONIG_NORMAL) {
        UChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
        onig_error_code_to_str(msg, rc, &ei);
        snprintf(why, why_cap, "%s", (const char *)msg);
        free(r);
        return -1;
    }
    *out = r;
    return 0;
}

int tk_regex_new(const char *pat, size_t len, tk_regex **out, char *why, size_t why_cap) {
    tk_unicode_init();
    tk_regex *r = calloc(1, sizeof *r);
    if (!r) { snprintf(why, why_cap, "out of memory"); return -1; }
    rx_parser P = {r, pat, pat + len, why, why_cap, 0, 0};
    int top = parse_alt(&P, 0);
    if (top >= 0 && P.p != P.end) { unsup(&P, "unbalanced parenthesis"); top = -1; }
    if (top >= 0) {
        r->native = 1;
        r->top = top;
        if (build_first(r)) { tk_regex_free(r); snprintf(why, why_cap, "out of memory"); return -1; }
        *out = r;
        return 0;
    }
    int was_unsupported = P.unsupported;
    tk_regex_free(r);
    if (!was_unsupported) { snprintf(why, why_cap, "out of memory"); return -1; }
    /* Not our subset (or malformed): Oniguruma decides, and reports real syntax errors. */
    return tk_regex_new_onig(pat, len, out, why, why_cap);
}

void tk_regex_free(tk_regex *r) {
    if (!r) return;
    if (r->onig) onig_free(r->onig);
    free(r->nodes);
    free(r->seqs);
    free(r->altseq);
    free(r->alts);
    free(r->classes);
    free(r->ranges);
    free(r->top_first);
    free(r);
}

int tk_regex_is_native(const tk_regex *r) { return r->native; }

int tk_regex_find(const tk_regex *r, const char *s, size_t n, size_t from, size_t *ms, size_t *me) {
    if (r->native) {
        rx_m m = {r, (const unsigned char *)s, n};
        const rx_span *a = &r->alts[r->top];
        for (size_t p = from; p <= n;) {
            unsigned c = p < n ? (unsigned char)s[p] : 0;
            for (int i = 0; i < a->count; i++) {
                const rx_first *f = &r->top_first[i];
                if (!f->empty) {
                    if (p == n) continue;
                    if (c < 128 ? !((f->ascii[c >> 6] >> (c & 63)) & 1) : !f->nonascii) continue;
                }
                long e = m_seq(&m, r->altseq[a->first + i], 0, p, NULL);
                if (e >= 0) { *ms = p; *me = (size_t)e; return 1; }
            }
            if (p == n) break;
            p += (size_t)ms_utf8_len((unsigned char)s[p]);
        }
        return 0;
    }
    OnigRegion *reg = onig_region_new();
    if (!reg) return -1;
    const UChar *b = (const UChar *)s, *e = b + n;
    int rc = onig_search(r->onig, b, e, b + from, e, reg, ONIG_OPTION_NONE);
    int ret;
    if (rc >= 0) {
        *ms = (size_t)reg->beg[0];
        *me = (size_t)reg->end[0];
        ret = 1;
    } else {
        ret = rc == ONIG_MISMATCH ? 0 : -1;
    }
    onig_region_free(reg, 1);
    return ret;
}
