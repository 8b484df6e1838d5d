/* regex.c - regular expressions (SGLang's `regex` field, JSON Schema `pattern`) -> GBNF text.
 *
 * A regular language is a context-free one, so a regex becomes a GBNF rule body by a syntactic
 * translation (groups to parentheses, classes and escapes to GBNF classes, quantifiers kept) and
 * is compiled by the one GBNF compiler. The whole output must match (as with ^...$). What a regular
 * grammar cannot express (backreferences, lookaround, anchors inside the pattern) is refused. */
#include "grammar/grammar_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rx {
    const char *src, *p;
    gstr out;
    ms_err *err;
    int rc;
    int depth;
    int json; /* inside a JSON string: never produce '"', '\\' or control characters */
} rx;

static int rfail(rx *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int rfail(rx *r, const char *fmt, ...) {
    if (r->rc) return r->rc;
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->rc = ms_errf(r->err, MS_ERR_UNSUPPORTED, "regex: %s at offset %ld", msg, (long)(r->p - r->src));
    return r->rc;
}

/* Emits code point cp inside a GBNF class. */
static void class_char(gstr *o, long cp) {
    if (cp < 0x80) {
        if (cp < 0x20 || cp == 0x7f || strchr("]\\-^[\"", (int)cp)) gs_printf(o, "\\x%02lX", cp);
        else { char c = (char)cp; gs_add(o, &c, 1); }
    } else {
        gs_printf(o, cp < 0x10000 ? "\\u%04lX" : "\\U%08lX", cp);
    }
}

static int hexv(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Reads one literal character (after a backslash when esc) as a code point; -1 error, -2 when the
 * escape is a class shorthand (*shorthand set to d, w, s, D, W or S). */
static long read_cp(rx *r, char *shorthand) {
    const unsigned char *p = (const unsigned char *)r->p;
    if (*p == '\\') {
        p++;
        char c = (char)*p++;
        r->p = (const char *)p;
        switch (c) {
        case 'd': case 'w': case 's': case 'D': case 'W': case 'S': *shorthand = c; return -2;
        case 'n': return '\n';
        case 't': return '\t';
        case 'r': return '\r';
        case 'f': return '\f';
        case 'v': return '\v';
        case '0': return 0;
        case 'b': return rfail(r, "\\b (word boundary) is not supported"), -1;
        case 'B': return rfail(r, "\\B is not supported"), -1;
        case 'x': case 'u': {
            int n = c == 'x' ? 2 : 4;
            long v = 0;
            if (c == 'u' && *p == '{') {
                p++;
                while (hexv((char)*p) >= 0) v = v * 16 + hexv((char)*p++);
                if (*p != '}') return rfail(r, "bad \\u{...} escape"), -1;
                r->p = (const char *)p + 1;
                return v;
            }
            for (int i = 0; i < n; i++) {
                int h = hexv((char)p[i]);
                if (h < 0) return rfail(r, "bad \\%c escape", c), -1;
                v = v * 16 + h;
            }
            r->p = (const char *)p + n;
            return v;
        }
        case '\0': return rfail(r, "pattern ends with '\\'"), -1;
        default:
            if (c >= '1' && c <= '9') return rfail(r, "backreferences are not supported"), -1;
            if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return rfail(r, "escape \\%c is not supported", c), -1;
            return (unsigned char)c;
        }
    }
    unsigned c = *p;
    int n = c < 0x80 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    if (n < 0) return rfail(r, "invalid UTF-8"), -1;
    long v = n == 0 ? c : n == 1 ? (c & 0x1F) : n == 2 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i <= n; i++) {
        if ((p[i] & 0xC0) != 0x80) return rfail(r, "invalid UTF-8"), -1;
        v = (v << 6) | (p[i] & 0x3F);
    }
    r->p = (const char *)p + n + 1;
    return v;
}

static const char *shorthand_body(char c) {
    switch (c) {
    case 'd': case 'D': return "0-9";
    case 'w': case 'W': return "a-zA-Z0-9_";
    default: return " \\t\\n\\r\\f\\v";
    }
}

static void rx_alt(rx *r);

/* A class range, minus what a JSON string cannot hold raw when r->json. */
static void class_range(rx *r, long lo, long hi) {
    if (r->json) {
        if (lo < 0x20) lo = 0x20;
        if (lo > hi) return;
        if (lo <= 0x22 && hi >= 0x22) { class_range(r, lo, 0x21); class_range(r, 0x23, hi); return; }
        if (lo <= 0x5C && hi >= 0x5C) { class_range(r, lo, 0x5B); class_range(r, 0x5D, hi); return; }
    }
    class_char(&r->out, lo);
    if (hi > lo) { gs_adds(&r->out, "-"); class_char(&r->out, hi); }
}

static void rx_class(rx *r) {
    r->p++; /* [ */
    gs_adds(&r->out, "[");
    int neg = 0;
    if (*r->p == '^') { gs_adds(&r->out, "^"); r->p++; neg = 1; }
    if (neg && r->json) gs_adds(&r->out, "\\x22\\x5C\\x00-\\x1F");
    int first = 1;
    while (*r->p != ']' || first) {
        first = 0;
        if (!*r->p) { rfail(r, "unterminated character class"); return; }
        char sh = 0;
        long lo = read_cp(r, &sh);
        if (lo == -1) return;
        if (lo == -2) {
            if (sh == 'D' || sh == 'W' || sh == 'S') { rfail(r, "\\%c inside a character class is not supported", sh); return; }
            gs_adds(&r->out, r->json && sh == 's' ? " " : shorthand_body(sh));
            continue;
        }
        long hi = lo;
        if (r->p[0] == '-' && r->p[1] && r->p[1] != ']') {
            r->p++;
            hi = read_cp(r, &sh);
            if (hi == -1) return;
            if (hi == -2) { rfail(r, "a class shorthand cannot end a range"); return; }
            if (hi < lo) { rfail(r, "character range out of order"); return; }
        }
        if (neg) { class_char(&r->out, lo); if (hi > lo) { gs_adds(&r->out, "-"); class_char(&r->out, hi); } }
        else class_range(r, lo, hi);
    }
    r->p++;
    gs_adds(&r->out, "]");
}

static void rx_seq(rx *r) {
    int any = 0;
    gs_adds(&r->out, "(");
    for (;;) {
        char c = *r->p;
        if (!c || c == '|' || c == ')') break;
        if (c == '^') {
            if (r->p != r->src) { rfail(r, "'^' inside the pattern is not supported"); return; }
            r->p++;
            continue;
        }
        if (c == '$') {
            if (r->p[1]) { rfail(r, "'$' inside the pattern is not supported"); return; }
            r->p++;
            continue;
        }
        if (any) gs_adds(&r->out, " ");
        any = 1;
        if (c == '(') {
            r->p++;
            if (r->p[0] == '?') {
                if (r->p[1] == ':') r->p += 2;
                else if (r->p[1] == '<' && r->p[2] != '=' && r->p[2] != '!') {
                    const char *q = strchr(r->p, '>');
                    if (!q) { rfail(r, "bad named group"); return; }
                    r->p = q + 1;
                } else { rfail(r, "lookaround and group flags are not supported"); return; }
            }
            if (++r->depth > 100) { rfail(r, "groups nested deeper than 100"); return; }
            rx_alt(r);
            r->depth--;
            if (r->rc) return;
            if (*r->p != ')') { rfail(r, "missing ')'"); return; }
            r->p++;
        } else if (c == '[') {
            rx_class(r);
        } else if (c == '.') {
            r->p++;
            gs_adds(&r->out, r->json ? "[^\\n\\r\\x22\\x5C\\x00-\\x1F]" : "[^\\n\\r]");
        } else if (c == '*' || c == '+' || c == '?') {
            rfail(r, "quantifier '%c' with nothing to repeat", c);
            return;
        } else {
            char sh = 0;
            long cp = read_cp(r, &sh);
            if (cp == -1) return;
            if (cp == -2) {
                int up = sh >= 'A' && sh <= 'Z';
                gs_printf(&r->out, "[%s%s%s]", up ? "^" : "", r->json && sh == 's' && !up ? " " : shorthand_body(sh),
                          r->json && up ? "\\x22\\x5C\\x00-\\x1F" : "");
            } else if (r->json && (cp < 0x20 || cp == '"' || cp == '\\')) {
                if (cp == '"') gs_lit(&r->out, "\\\"", 2);
                else if (cp == '\\') gs_lit(&r->out, "\\\\", 2);
                else { char e[8]; snprintf(e, sizeof e, "\\u%04lx", cp); gs_lit(&r->out, e, 6); }
            } else {
                unsigned char u[4];
                int n;
                if (cp < 0x80) u[0] = (unsigned char)cp, n = 1;
                else if (cp < 0x800) u[0] = (unsigned char)(0xC0 | (cp >> 6)), u[1] = (unsigned char)(0x80 | (cp & 0x3F)), n = 2;
                else if (cp < 0x10000)
                    u[0] = (unsigned char)(0xE0 | (cp >> 12)), u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)),
                    u[2] = (unsigned char)(0x80 | (cp & 0x3F)), n = 3;
                else
                    u[0] = (unsigned char)(0xF0 | (cp >> 18)), u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F)),
                    u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (unsigned char)(0x80 | (cp & 0x3F)), n = 4;
                gs_lit(&r->out, (const char *)u, (size_t)n);
            }
        }
        if (r->rc) return;
        /* quantifiers */
        for (;;) {
            c = *r->p;
            if (c == '*' || c == '+' || c == '?') {
                char q[2] = {c, 0};
                gs_adds(&r->out, q);
                r->p++;
            } else if (c == '{') {
                const char *q = r->p + 1;
                long mn = 0, mx = -1;
                int dig = 0;
                while (*q >= '0' && *q <= '9') mn = mn * 10 + (*q++ - '0'), dig = 1;
                if (!dig) break; /* a literal '{' */
                if (*q == ',') {
                    q++;
                    if (*q >= '0' && *q <= '9') { mx = 0; while (*q >= '0' && *q <= '9') mx = mx * 10 + (*q++ - '0'); }
                } else {
                    mx = mn;
                }
                if (*q != '}') break;
                if (mn > 1000 || mx > 1000) { rfail(r, "repetition bound over 1000"); return; }
                if (mx >= 0) gs_printf(&r->out, "{%ld,%ld}", mn, mx);
                else gs_printf(&r->out, "{%ld,}", mn);
                r->p = q + 1;
            } else {
                break;
            }
            if (*r->p == '?') r->p++; /* lazy: same language */
            break;
        }
    }
    if (!any) gs_adds(&r->out, "\"\"");
    gs_adds(&r->out, ")");
}

static void rx_alt(rx *r) {
    gs_adds(&r->out, "(");
    for (;;) {
        rx_seq(r);
        if (r->rc) return;
        if (*r->p != '|') break;
        r->p++;
        gs_adds(&r->out, " | ");
    }
    gs_adds(&r->out, ")");
}

int ms_grammar_regex_to_gbnf_body(const char *re, int json_string, char **out, ms_err *err) {
    *out = NULL;
    rx r;
    memset(&r, 0, sizeof r);
    r.json = json_string;
    r.src = r.p = re;
    r.err = err;
    rx_alt(&r);
    if (!r.rc && *r.p) rfail(&r, "unmatched ')'");
    if (!r.rc && r.out.oom) r.rc = ms_errf(err, MS_ERR_NOMEM, "regex: out of memory");
    if (r.rc) { free(r.out.s); return r.rc; }
    *out = r.out.s;
    return MS_OK;
}

int ms_grammar_regex_to_gbnf(const char *re, char **out, ms_err *err) {
    *out = NULL;
    char *body;
    MS_TRY(ms_grammar_regex_to_gbnf_body(re, 0, &body, err));
    gstr g = {0};
    gs_adds(&g, "root ::= ");
    gs_adds(&g, body);
    gs_adds(&g, "\n");
    free(body);
    if (g.oom) { free(g.s); return ms_errf(err, MS_ERR_NOMEM, "regex: out of memory"); }
    *out = g.s;
    return MS_OK;
}
