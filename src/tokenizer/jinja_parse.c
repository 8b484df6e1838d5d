/* jinja_parse.c - tokens to syntax tree. The grammar and its precedence ladder are those of
 * @huggingface/jinja (lowest first): ternary/`x if c`, or, and, not, comparison and membership
 * (left-associative, no chaining), + - ~, * / // %, **, `is` tests, `|` filters, unary +/-, member
 * access and calls. Statements: if/elif/else, for (with else and an `if` condition), set (including
 * block set, tuple targets and namespace attributes), macro, call, filter, break, continue.
 * Nesting is bounded so a hostile template cannot exhaust the C stack. */
#include "tokenizer/jinja.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NEST 200   /* parentheses, brackets and blocks inside each other */
#define MAX_CHAIN 1000 /* operators, filters, tests and member accesses along one path of the tree */

typedef struct {
    jj_arena *ar;
    jj_tok *t;
    int n, cur;
    int depth;
    int chain;
    ms_err *err;
} parser;

static int perr(parser *P, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int perr(parser *P, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = P->cur < P->n ? P->t[P->cur].line : (P->n ? P->t[P->n - 1].line : 1);
    return ms_errf(P->err, MS_ERR_FORMAT, "chat template line %d: %s", line, msg);
}

static const char *tok_name(int type) {
    static const char *names[] = {"text", "number", "string", "identifier", "'='", "'('", "')'", "'{%'", "'%}'",
                                  "'{{'", "'}}'", "'['", "']'", "'{'", "'}'", "','", "'.'", "':'", "'|'",
                                  "additive operator", "multiplicative operator", "'**'", "comparison",
                                  "unary operator", "comment"};
    return type >= 0 && type < (int)(sizeof names / sizeof names[0]) ? names[type] : "token";
}

static jj_node *mk(parser *P, int kind, int line) {
    jj_node *x = jj_alloc(P->ar, sizeof *x);
    if (x) {
        x->kind = (uint8_t)kind;
        x->line = line;
    }
    return x;
}

/* Counts one more link of an operator/filter/member chain; fails when the tree gets too deep. */
static int chain_link(parser *P) {
    if (++P->chain > MAX_CHAIN) return perr(P, "expression nested too deeply (more than %d chained operations)", MAX_CHAIN);
    return 0;
}

static int oom(parser *P) { return ms_errf(P->err, MS_ERR_NOMEM, "chat template: out of memory while parsing"); }

/* growable node list built with realloc, then copied into the arena */
typedef struct {
    jj_node **v;
    int n, cap;
} nlist;

static int nl_push(nlist *l, jj_node *x) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 8;
        jj_node **v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
    return 0;
}

static int nl_finish(parser *P, nlist *l, jj_node ***out, int *n) {
    *out = NULL;
    *n = l->n;
    if (l->n) {
        *out = jj_alloc(P->ar, (size_t)l->n * sizeof(jj_node *));
        if (!*out) {
            free(l->v);
            return oom(P);
        }
        memcpy(*out, l->v, (size_t)l->n * sizeof(jj_node *));
    }
    free(l->v);
    l->v = NULL;
    return 0;
}

static int is(parser *P, int type) { return P->cur < P->n && P->t[P->cur].type == type; }
static int tok_is_ident(parser *P, int at, const char *name) {
    if (at >= P->n || P->t[at].type != T_IDENT) return 0;
    size_t l = strlen(name);
    return P->t[at].n == l && !memcmp(P->t[at].s, name, l);
}
static int is_ident(parser *P, const char *name) { return tok_is_ident(P, P->cur, name); }
static int is_stmt(parser *P, const char *name) {
    return is(P, T_OPEN_STMT) && tok_is_ident(P, P->cur + 1, name);
}

static int expect(parser *P, int type, const char *what) {
    if (P->cur >= P->n) return perr(P, "expected %s but the template ended", what);
    if (P->t[P->cur].type != type) return perr(P, "expected %s, got %s", what, tok_name(P->t[P->cur].type));
    P->cur++;
    return 0;
}

static int expect_ident(parser *P, const char *name) {
    if (!is_ident(P, name)) {
        if (P->cur >= P->n) return perr(P, "expected '%s' but the template ended", name);
        return perr(P, "expected '%s'", name);
    }
    P->cur++;
    return 0;
}

static int parse_expr(parser *P, jj_node **out);
static int parse_primary(parser *P, jj_node **out);
static int parse_any(parser *P, jj_node **out);

/* Parses statements until one of the named block tags ({% name %}) is next. */
static int parse_until(parser *P, const char *const *names, jj_node ***body, int *n, const char *opener, int line) {
    nlist l = {0};
    while (1) {
        if (P->cur >= P->n) {
            free(l.v);
            return ms_errf(P->err, MS_ERR_FORMAT, "chat template line %d: unclosed {%% %s %%} (expected {%% %s %%} before the end)",
                           line, opener, names[0]);
        }
        int stop = 0;
        for (int i = 0; names[i]; i++)
            if (is_stmt(P, names[i])) stop = 1;
        if (stop) break;
        jj_node *x;
        int rc = parse_any(P, &x);
        if (rc) {
            free(l.v);
            return rc;
        }
        if (nl_push(&l, x)) {
            free(l.v);
            return oom(P);
        }
    }
    return nl_finish(P, &l, body, n);
}

static int parse_seq(parser *P, int primary, jj_node **out) {
    jj_node *first;
    int line = P->cur < P->n ? P->t[P->cur].line : 0;
    MS_TRY(primary ? parse_primary(P, &first) : parse_expr(P, &first));
    if (!is(P, T_COMMA)) {
        *out = first;
        return 0;
    }
    nlist l = {0};
    if (nl_push(&l, first)) return oom(P);
    while (is(P, T_COMMA)) {
        P->cur++;
        jj_node *x;
        int rc = primary ? parse_primary(P, &x) : parse_expr(P, &x);
        if (rc) {
            free(l.v);
            return rc;
        }
        if (nl_push(&l, x)) {
            free(l.v);
            return oom(P);
        }
    }
    jj_node *t = mk(P, E_TUPLE, line);
    if (!t) {
        free(l.v);
        return oom(P);
    }
    MS_TRY(nl_finish(P, &l, &t->list, &t->n));
    *out = t;
    return 0;
}

/* Argument lists: mode 0 = call (positional, k=v, *x, **x), 1 = macro parameters (name, name=default). */
static int parse_args(parser *P, int params, jj_node ***list, int *n) {
    MS_TRY(expect(P, T_LPAREN, "'(' to open the argument list"));
    nlist l = {0};
    int saw_kw = 0, saw_spread = 0, rc = 0;
    while (!is(P, T_RPAREN)) {
        if (P->cur >= P->n) {
            rc = perr(P, "unclosed argument list");
            goto fail;
        }
        int line = P->t[P->cur].line;
        int kwspread = is(P, T_POW);
        int spread = is(P, T_MUL) && P->t[P->cur].n == 1 && P->t[P->cur].s[0] == '*';
        if (params && (kwspread || spread)) {
            rc = perr(P, "argument unpacking is not allowed in parameter declarations");
            goto fail;
        }
        jj_node *arg;
        if (kwspread) {
            P->cur++;
            jj_node *x;
            if ((rc = parse_expr(P, &x))) goto fail;
            if (!(arg = mk(P, E_KWSPREAD, line))) goto nomem;
            arg->a = x;
            if (nl_push(&l, arg)) goto nomem;
            if (is(P, T_COMMA)) P->cur++;
            if (!is(P, T_RPAREN)) {
                rc = perr(P, "'**' must be applied to the final argument");
                goto fail;
            }
            break;
        }
        if (spread) {
            if (saw_spread) {
                rc = perr(P, "only one '*' argument unpacking is allowed");
                goto fail;
            }
            saw_spread = 1;
            P->cur++;
            jj_node *x;
            if ((rc = parse_expr(P, &x))) goto fail;
            if (!(arg = mk(P, E_SPREAD, line))) goto nomem;
            arg->a = x;
        } else {
            if ((rc = parse_expr(P, &arg))) goto fail;
            if (is(P, T_EQUALS)) {
                P->cur++;
                if (arg->kind != E_IDENT) {
                    rc = perr(P, params ? "expected an identifier for a parameter declaration"
                                        : "expected an identifier for a keyword argument");
                    goto fail;
                }
                jj_node *v;
                if ((rc = parse_expr(P, &v))) goto fail;
                jj_node *kw = mk(P, E_KWARG, line);
                if (!kw) goto nomem;
                kw->s = arg->s;
                kw->slen = arg->slen;
                kw->a = v;
                arg = kw;
            }
            if (params) {
                if (arg->kind != E_IDENT && arg->kind != E_KWARG) {
                    rc = perr(P, "expected an identifier for a parameter declaration");
                    goto fail;
                }
                for (int i = 0; i < l.n; i++)
                    if (l.v[i]->slen == arg->slen && !memcmp(l.v[i]->s, arg->s, arg->slen)) {
                        rc = perr(P, "duplicate parameter name '%.*s'", (int)arg->slen, arg->s);
                        goto fail;
                    }
            }
            if (arg->kind == E_KWARG) saw_kw = 1;
            else if (saw_kw) {
                rc = perr(P, params ? "non-default argument follows default argument"
                                    : "positional arguments must come before keyword arguments");
                goto fail;
            } else if (saw_spread) {
                rc = perr(P, "positional arguments must not follow '*' argument unpacking");
                goto fail;
            }
        }
        if (nl_push(&l, arg)) goto nomem;
        if (is(P, T_COMMA)) P->cur++;
    }
    P->cur++; /* ')' */
    return nl_finish(P, &l, list, n);
nomem:
    rc = oom(P);
fail:
    free(l.v);
    return rc;
}

/* obj[ ... ]: an index expression or a slice start:stop:step (any part may be empty). */
static int parse_subscript(parser *P, jj_node **out) {
    jj_node *parts[8] = {0};
    int np = 0, slice = 0;
    int line = P->t[P->cur - 1].line;
    while (!is(P, T_RBRACKET)) {
        if (P->cur >= P->n) return perr(P, "unclosed '['");
        if (np >= 4) return perr(P, "expected 0-3 arguments for a slice expression");
        if (is(P, T_COLON)) {
            parts[np++] = NULL;
            P->cur++;
            slice = 1;
        } else {
            MS_TRY(parse_expr(P, &parts[np]));
            np++;
            if (is(P, T_COLON)) {
                P->cur++;
                slice = 1;
            }
        }
    }
    if (np == 0) return perr(P, "expected at least one argument for a member/slice expression");
    if (slice) {
        if (np > 3) return perr(P, "expected 0-3 arguments for a slice expression");
        jj_node *s = mk(P, E_SLICE, line);
        if (!s) return oom(P);
        s->a = parts[0];
        s->b = np > 1 ? parts[1] : NULL;
        s->c = np > 2 ? parts[2] : NULL;
        *out = s;
    } else {
        *out = parts[0];
    }
    return 0;
}

static int parse_member(parser *P, jj_node *obj, jj_node **out) {
    int saved_chain = P->chain;
    while (is(P, T_DOT) || is(P, T_LBRACKET)) {
        MS_TRY(chain_link(P));
        int computed = is(P, T_LBRACKET);
        int line = P->t[P->cur].line;
        P->cur++;
        jj_node *prop;
        if (computed) {
            MS_TRY(parse_subscript(P, &prop));
            MS_TRY(expect(P, T_RBRACKET, "']'"));
        } else {
            MS_TRY(parse_primary(P, &prop));
            if (prop->kind != E_IDENT && prop->kind != E_INT)
                return perr(P, "expected an identifier or integer after '.'");
        }
        jj_node *m = mk(P, E_MEMBER, line);
        if (!m) return oom(P);
        m->a = obj;
        m->b = prop;
        m->flag = (uint8_t)computed;
        obj = m;
    }
    P->chain = saved_chain;
    *out = obj;
    return 0;
}

static int parse_call(parser *P, jj_node *callee, jj_node **out) {
    MS_TRY(chain_link(P));
    jj_node *c = mk(P, E_CALL, callee->line);
    if (!c) return oom(P);
    c->a = callee;
    MS_TRY(parse_args(P, 0, &c->list, &c->n));
    jj_node *e;
    MS_TRY(parse_member(P, c, &e));
    if (is(P, T_LPAREN)) return parse_call(P, e, out);
    *out = e;
    return 0;
}

static int parse_call_member(parser *P, jj_node **out) {
    jj_node *p, *m;
    MS_TRY(parse_primary(P, &p));
    MS_TRY(parse_member(P, p, &m));
    if (is(P, T_LPAREN)) return parse_call(P, m, out);
    *out = m;
    return 0;
}

static int parse_unary_sign(parser *P, jj_node **out) {
    if (P->cur < P->n && (P->t[P->cur].type == T_UNARY || P->t[P->cur].type == T_ADD) && P->t[P->cur].n == 1 &&
        (P->t[P->cur].s[0] == '-' || P->t[P->cur].s[0] == '+')) {
        jj_node *u = mk(P, E_UNARY, P->t[P->cur].line);
        if (!u) return oom(P);
        u->op = P->t[P->cur].s[0] == '-' ? OP_NEG : OP_POS;
        P->cur++;
        if (++P->depth > MAX_NEST) return perr(P, "expression nested too deeply");
        MS_TRY(parse_unary_sign(P, &u->a));
        P->depth--;
        *out = u;
        return 0;
    }
    return parse_call_member(P, out);
}

/* A filter after '|': name or name(args). The oracle only knows filters given by name. */
static int parse_filter_ref(parser *P, jj_node *target, int line) {
    jj_node *name;
    MS_TRY(parse_primary(P, &name));
    if (name->kind != E_IDENT) return perr(P, "expected an identifier for the filter");
    target->s = name->s;
    target->slen = name->slen;
    if (is(P, T_LPAREN)) {
        target->flag = 1; /* call form */
        MS_TRY(parse_args(P, 0, &target->list, &target->n));
        if (is(P, T_DOT) || is(P, T_LBRACKET) || is(P, T_LPAREN))
            return perr(P, "unsupported expression after filter '%.*s(...)'", (int)name->slen, name->s);
    }
    (void)line;
    return 0;
}

static int parse_filter(parser *P, jj_node **out) {
    int saved_chain = P->chain;
    jj_node *x = NULL;
    MS_TRY(parse_unary_sign(P, &x));
    while (is(P, T_PIPE)) {
        MS_TRY(chain_link(P));
        int line = P->t[P->cur].line;
        P->cur++;
        jj_node *f = mk(P, E_FILTER, line);
        if (!f) return oom(P);
        f->a = x;
        MS_TRY(parse_filter_ref(P, f, line));
        x = f;
    }
    P->chain = saved_chain;
    *out = x;
    return 0;
}

static int parse_test(parser *P, jj_node **out) {
    int saved_chain = P->chain;
    jj_node *x = NULL;
    MS_TRY(parse_filter(P, &x));
    while (is_ident(P, "is")) {
        MS_TRY(chain_link(P));
        int line = P->t[P->cur].line;
        P->cur++;
        int neg = 0;
        if (is_ident(P, "not")) {
            P->cur++;
            neg = 1;
        }
        jj_node *name;
        MS_TRY(parse_primary(P, &name));
        if (name->kind != E_IDENT) return perr(P, "expected an identifier for the test");
        jj_node *t = mk(P, E_TEST, line);
        if (!t) return oom(P);
        t->a = x;
        t->flag = (uint8_t)neg;
        t->s = name->s;
        t->slen = name->slen;
        x = t;
    }
    P->chain = saved_chain;
    *out = x;
    return 0;
}

static int binop_of(const jj_tok *t) {
    const char *s = t->s;
    size_t n = t->n;
    if (n == 1) {
        switch (s[0]) {
        case '+': return OP_ADD;
        case '-': return OP_SUB;
        case '~': return OP_CONCAT;
        case '*': return OP_MUL;
        case '/': return OP_DIV;
        case '%': return OP_MOD;
        case '<': return OP_LT;
        case '>': return OP_GT;
        }
    } else if (n == 2) {
        if (!memcmp(s, "//", 2)) return OP_FLOORDIV;
        if (!memcmp(s, "**", 2)) return OP_POW;
        if (!memcmp(s, "<=", 2)) return OP_LE;
        if (!memcmp(s, ">=", 2)) return OP_GE;
        if (!memcmp(s, "==", 2)) return OP_EQ;
        if (!memcmp(s, "!=", 2)) return OP_NE;
    }
    return -1;
}

static int mk_bin(parser *P, int op, jj_node *l, jj_node *r, int line, jj_node **out) {
    jj_node *b = mk(P, E_BINARY, line);
    if (!b) return oom(P);
    b->op = (uint8_t)op;
    b->a = l;
    b->b = r;
    *out = b;
    return 0;
}

/* One left-associative binary precedence level: operands from `next`, operators where at(P) holds;
 * the node's op is `op`, or the token's own (binop_of) when op < 0. The chain depth bookkeeping is
 * the same for every level, so all of them share this loop. */
typedef int (*level_fn)(parser *P, jj_node **out);
static int parse_level(parser *P, jj_node **out, level_fn next, int (*at)(parser *P), int op) {
    int saved_chain = P->chain;
    jj_node *l = NULL, *r = NULL;
    MS_TRY(next(P, &l));
    while (at(P)) {
        MS_TRY(chain_link(P));
        int o = op >= 0 ? op : binop_of(&P->t[P->cur]);
        int line = P->t[P->cur++].line;
        MS_TRY(next(P, &r));
        MS_TRY(mk_bin(P, o, l, r, line, &l));
    }
    P->chain = saved_chain;
    *out = l;
    return 0;
}

static int at_pow(parser *P) { return is(P, T_POW); }
static int at_mul(parser *P) { return is(P, T_MUL); }
static int at_add(parser *P) { return is(P, T_ADD); }
static int at_and(parser *P) { return is_ident(P, "and"); }
static int at_or(parser *P) { return is_ident(P, "or"); }

static int parse_pow(parser *P, jj_node **out) { return parse_level(P, out, parse_test, at_pow, OP_POW); }
static int parse_mul(parser *P, jj_node **out) { return parse_level(P, out, parse_pow, at_mul, -1); }
static int parse_add(parser *P, jj_node **out) { return parse_level(P, out, parse_mul, at_add, -1); }

static int parse_cmp(parser *P, jj_node **out) {
    int saved_chain = P->chain;
    jj_node *l = NULL, *r = NULL;
    MS_TRY(parse_add(P, &l));
    while (1) {
        MS_TRY(chain_link(P));
        int op, line = P->cur < P->n ? P->t[P->cur].line : 0;
        if (is_ident(P, "not") && tok_is_ident(P, P->cur + 1, "in")) {
            op = OP_NOTIN;
            P->cur += 2;
        } else if (is_ident(P, "in")) {
            op = OP_IN;
            P->cur++;
        } else if (is(P, T_CMP)) {
            op = binop_of(&P->t[P->cur]);
            P->cur++;
        } else {
            break;
        }
        MS_TRY(parse_add(P, &r));
        MS_TRY(mk_bin(P, op, l, r, line, &l));
    }
    P->chain = saved_chain;
    *out = l;
    return 0;
}

static int parse_not(parser *P, jj_node **out) {
    if (is_ident(P, "not")) {
        jj_node *u = mk(P, E_UNARY, P->t[P->cur].line);
        if (!u) return oom(P);
        u->op = OP_NOT;
        P->cur++;
        if (++P->depth > MAX_NEST) return perr(P, "expression nested too deeply");
        MS_TRY(parse_not(P, &u->a));
        P->depth--;
        *out = u;
        return 0;
    }
    return parse_cmp(P, out);
}

static int parse_and(parser *P, jj_node **out) { return parse_level(P, out, parse_not, at_and, OP_AND); }
static int parse_or(parser *P, jj_node **out) { return parse_level(P, out, parse_and, at_or, OP_OR); }

static int parse_expr(parser *P, jj_node **out) {
    if (++P->depth > MAX_NEST) return perr(P, "expression nested too deeply");
    jj_node *a;
    MS_TRY(parse_or(P, &a));
    if (is_ident(P, "if")) {
        int line = P->t[P->cur++].line;
        jj_node *test;
        MS_TRY(parse_or(P, &test));
        if (is_ident(P, "else")) {
            P->cur++;
            jj_node *f;
            MS_TRY(parse_expr(P, &f));
            jj_node *t = mk(P, E_TERNARY, line);
            if (!t) return oom(P);
            t->a = test;
            t->b = a;
            t->c = f;
            a = t;
        } else {
            jj_node *s = mk(P, E_SELECT, line);
            if (!s) return oom(P);
            s->a = a;
            s->b = test;
            a = s;
        }
    }
    P->depth--;
    *out = a;
    return 0;
}

static int parse_primary(parser *P, jj_node **out) {
    if (P->cur >= P->n) return perr(P, "unexpected end of template in an expression");
    jj_tok *t = &P->t[P->cur++];
    jj_node *x;
    switch (t->type) {
    case T_NUM: {
        int is_float = memchr(t->s, '.', t->n) != NULL;
        if (!(x = mk(P, is_float ? E_FLOAT : E_INT, t->line))) return oom(P);
        char tmp[64];
        size_t l = t->n < sizeof tmp - 1 ? t->n : sizeof tmp - 1;
        memcpy(tmp, t->s, l);
        tmp[l] = 0;
        x->num = strtod(tmp, NULL);
        if (t->n >= sizeof tmp - 1) {
            /* very long digit strings: strtod on a copy of the whole literal */
            char *big = jj_strdup(P->ar, t->s, t->n);
            if (!big) return oom(P);
            x->num = strtod(big, NULL);
        }
        *out = x;
        return 0;
    }
    case T_STR: {
        size_t total = t->n;
        int k = P->cur;
        while (k < P->n && P->t[k].type == T_STR) total += P->t[k++].n;
        if (!(x = mk(P, E_STR, t->line))) return oom(P);
        if (k == P->cur) {
            x->s = t->s;
            x->slen = t->n;
        } else {
            char *s = jj_alloc(P->ar, total + 1);
            if (!s) return oom(P);
            size_t o = 0;
            memcpy(s, t->s, t->n);
            o = t->n;
            for (int i = P->cur; i < k; i++) {
                memcpy(s + o, P->t[i].s, P->t[i].n);
                o += P->t[i].n;
            }
            x->s = s;
            x->slen = total;
            P->cur = k;
        }
        *out = x;
        return 0;
    }
    case T_IDENT:
        if (!(x = mk(P, E_IDENT, t->line))) return oom(P);
        x->s = t->s;
        x->slen = t->n;
        *out = x;
        return 0;
    case T_LPAREN: {
        if (++P->depth > MAX_NEST) return perr(P, "expression nested too deeply");
        MS_TRY(parse_seq(P, 0, &x));
        P->depth--;
        MS_TRY(expect(P, T_RPAREN, "')'"));
        *out = x;
        return 0;
    }
    case T_LBRACKET: {
        if (++P->depth > MAX_NEST) return perr(P, "expression nested too deeply");
        nlist l = {0};
        while (!is(P, T_RBRACKET)) {
            if (P->cur >= P->n) {
                free(l.v);
                return perr(P, "unclosed '['");
            }
            jj_node *v;
            int rc = parse_expr(P, &v);
            if (rc) {
                free(l.v);
                return rc;
            }
            if (nl_push(&l, v)) {
                free(l.v);
                return oom(P);
            }
            if (is(P, T_COMMA)) P->cur++;
        }
        P->cur++;
        P->depth--;
        if (!(x = mk(P, E_ARRAY, t->line))) {
            free(l.v);
            return oom(P);
        }
        MS_TRY(nl_finish(P, &l, &x->list, &x->n));
        *out = x;
        return 0;
    }
    case T_LBRACE: {
        if (++P->depth > MAX_NEST) return perr(P, "expression nested too deeply");
        nlist keys = {0}, vals = {0};
        int rc = 0;
        while (!is(P, T_RBRACE)) {
            if (P->cur >= P->n) {
                rc = perr(P, "unclosed '{'");
                break;
            }
            jj_node *k, *v;
            if ((rc = parse_expr(P, &k))) break;
            if ((rc = expect(P, T_COLON, "':' between key and value in a dict literal"))) break;
            if ((rc = parse_expr(P, &v))) break;
            if (nl_push(&keys, k) || nl_push(&vals, v)) {
                rc = oom(P);
                break;
            }
            if (is(P, T_COMMA)) P->cur++;
        }
        if (rc || !(x = mk(P, E_OBJECT, t->line))) {
            free(keys.v);
            free(vals.v);
            return rc ? rc : oom(P);
        }
        P->cur++;
        P->depth--;
        rc = nl_finish(P, &keys, &x->list, &x->n);
        if (rc) {
            free(vals.v);
            return rc;
        }
        MS_TRY(nl_finish(P, &vals, &x->list2, &x->n2));
        *out = x;
        return 0;
    }
    default:
        P->cur--;
        return perr(P, "unexpected %s in an expression", tok_name(t->type));
    }
}

/* Marks macros whose bodies mention `kwargs` / `varargs` (those accept extra arguments). */
static void scan_special(const jj_node *x, int *flags, int depth) {
    if (!x || depth > 4 * MAX_NEST) return;
    if (x->kind == E_IDENT) {
        if (x->slen == 6 && !memcmp(x->s, "kwargs", 6)) *flags |= 1;
        if (x->slen == 7 && !memcmp(x->s, "varargs", 7)) *flags |= 2;
    }
    scan_special(x->a, flags, depth + 1);
    scan_special(x->b, flags, depth + 1);
    scan_special(x->c, flags, depth + 1);
    for (int i = 0; i < x->n; i++) scan_special(x->list[i], flags, depth + 1);
    for (int i = 0; i < x->n2; i++) scan_special(x->list2[i], flags, depth + 1);
}

static int parse_if_rest(parser *P, int line, jj_node **out) {
    jj_node *x = mk(P, N_IF, line);
    if (!x) return oom(P);
    MS_TRY(parse_expr(P, &x->a));
    MS_TRY(expect(P, T_CLOSE_STMT, "'%}' after the if condition"));
    static const char *const stops[] = {"endif", "elif", "else", NULL};
    MS_TRY(parse_until(P, stops, &x->list, &x->n, "if", line));
    if (is_stmt(P, "elif")) {
        int l2 = P->t[P->cur].line;
        P->cur += 2;
        jj_node *nested;
        MS_TRY(parse_if_rest(P, l2, &nested));
        x->list2 = jj_alloc(P->ar, sizeof(jj_node *));
        if (!x->list2) return oom(P);
        x->list2[0] = nested;
        x->n2 = 1;
    } else if (is_stmt(P, "else")) {
        P->cur += 2;
        MS_TRY(expect(P, T_CLOSE_STMT, "'%}' after else"));
        static const char *const stops2[] = {"endif", NULL};
        MS_TRY(parse_until(P, stops2, &x->list2, &x->n2, "if", line));
    }
    *out = x;
    return 0;
}

/* Body of a macro or call block up to its end tag, with the body's special-variable flags
 * (caller/varargs/kwargs use) recorded in x->flag2. */
static int parse_callable_body(parser *P, jj_node *x, const char *opener, const char *end, int line) {
    const char *const stops[] = {end, NULL};
    MS_TRY(parse_until(P, stops, &x->list, &x->n, opener, line));
    P->cur++;
    MS_TRY(expect_ident(P, end));
    MS_TRY(expect(P, T_CLOSE_STMT, "'%}'"));
    int fl = 0;
    for (int i = 0; i < x->n; i++) scan_special(x->list[i], &fl, 0);
    x->flag2 = (uint8_t)fl;
    return 0;
}

static int parse_stmt(parser *P, jj_node **out) {
    int line = P->t[P->cur].line;
    MS_TRY(expect(P, T_OPEN_STMT, "'{%'"));
    if (!is(P, T_IDENT)) return perr(P, "expected a statement name after '{%%'");
    jj_tok *name = &P->t[P->cur];
    char nm[32];
    snprintf(nm, sizeof nm, "%.*s", (int)(name->n < 31 ? name->n : 31), name->s);
    if (++P->depth > MAX_NEST) return perr(P, "blocks nested too deeply");
    jj_node *x = NULL;
    if (!strcmp(nm, "set")) {
        P->cur++;
        if (!(x = mk(P, N_SET, line))) return oom(P);
        MS_TRY(parse_seq(P, 0, &x->a));
        if (is(P, T_EQUALS)) {
            P->cur++;
            MS_TRY(parse_seq(P, 0, &x->b));
        } else {
            MS_TRY(expect(P, T_CLOSE_STMT, "'%}' or '=' in set"));
            static const char *const stops[] = {"endset", NULL};
            MS_TRY(parse_until(P, stops, &x->list, &x->n, "set", line));
            P->cur++;
            MS_TRY(expect_ident(P, "endset"));
        }
        MS_TRY(expect(P, T_CLOSE_STMT, "'%}' to close set"));
    } else if (!strcmp(nm, "if")) {
        P->cur++;
        MS_TRY(parse_if_rest(P, line, &x));
        MS_TRY(expect(P, T_OPEN_STMT, "'{%'"));
        MS_TRY(expect_ident(P, "endif"));
        MS_TRY(expect(P, T_CLOSE_STMT, "'%}'"));
    } else if (!strcmp(nm, "macro")) {
        P->cur++;
        if (!(x = mk(P, N_MACRO, line))) return oom(P);
        jj_node *id;
        MS_TRY(parse_primary(P, &id));
        if (id->kind != E_IDENT) return perr(P, "expected an identifier after macro");
        x->s = id->s;
        x->slen = id->slen;
        MS_TRY(parse_args(P, 1, &x->list2, &x->n2));
        MS_TRY(expect(P, T_CLOSE_STMT, "'%}' after the macro signature"));
        MS_TRY(parse_callable_body(P, x, "macro", "endmacro", line));
    } else if (!strcmp(nm, "for")) {
        P->cur++;
        if (!(x = mk(P, N_FOR, line))) return oom(P);
        MS_TRY(parse_seq(P, 1, &x->a));
        if (x->a->kind != E_IDENT && x->a->kind != E_TUPLE)
            return perr(P, "expected an identifier or tuple for the loop variable");
        if (!is_ident(P, "in")) return perr(P, "expected 'in' after the loop variable");
        P->cur++;
        MS_TRY(parse_expr(P, &x->b));
        MS_TRY(expect(P, T_CLOSE_STMT, "'%}' after the for header"));
        static const char *const stops[] = {"endfor", "else", NULL};
        MS_TRY(parse_until(P, stops, &x->list, &x->n, "for", line));
        if (is_stmt(P, "else")) {
            P->cur += 2;
            MS_TRY(expect(P, T_CLOSE_STMT, "'%}' after else"));
            static const char *const stops2[] = {"endfor", NULL};
            MS_TRY(parse_until(P, stops2, &x->list2, &x->n2, "for", line));
        }
        MS_TRY(expect(P, T_OPEN_STMT, "'{%'"));
        MS_TRY(expect_ident(P, "endfor"));
        MS_TRY(expect(P, T_CLOSE_STMT, "'%}'"));
    } else if (!strcmp(nm, "call")) {
        P->cur++;
        if (!(x = mk(P, N_CALLBLOCK, line))) return oom(P);
        if (is(P, T_LPAREN)) MS_TRY(parse_args(P, 1, &x->list2, &x->n2));
        jj_node *callee;
        MS_TRY(parse_primary(P, &callee));
        if (callee->kind != E_IDENT) return perr(P, "expected an identifier after call");
        jj_node *c = mk(P, E_CALL, line);
        if (!c) return oom(P);
        c->a = callee;
        MS_TRY(parse_args(P, 0, &c->list, &c->n));
        x->a = c;
        MS_TRY(expect(P, T_CLOSE_STMT, "'%}'"));
        MS_TRY(parse_callable_body(P, x, "call", "endcall", line));
    } else if (!strcmp(nm, "filter")) {
        P->cur++;
        if (!(x = mk(P, N_FILTERBLOCK, line))) return oom(P);
        MS_TRY(parse_filter_ref(P, x, line));
        MS_TRY(expect(P, T_CLOSE_STMT, "'%}'"));
        static const char *const stops[] = {"endfilter", NULL};
        MS_TRY(parse_until(P, stops, &x->list2, &x->n2, "filter", line));
        P->cur++;
        MS_TRY(expect_ident(P, "endfilter"));
        MS_TRY(expect(P, T_CLOSE_STMT, "'%}'"));
    } else if (!strcmp(nm, "break") || !strcmp(nm, "continue")) {
        P->cur++;
        if (!(x = mk(P, nm[0] == 'b' ? N_BREAK : N_CONTINUE, line))) return oom(P);
        MS_TRY(expect(P, T_CLOSE_STMT, "'%}'"));
    } else {
        return perr(P, "unknown or unsupported statement '{%% %s %%}'", nm);
    }
    P->depth--;
    *out = x;
    return 0;
}

static int parse_any(parser *P, jj_node **out) {
    jj_tok *t = &P->t[P->cur];
    switch (t->type) {
    case T_COMMENT: {
        P->cur++;
        jj_node *x = mk(P, N_COMMENT, t->line);
        if (!x) return oom(P);
        *out = x;
        return 0;
    }
    case T_TEXT: {
        P->cur++;
        jj_node *x = mk(P, E_STR, t->line);
        if (!x) return oom(P);
        x->s = t->s;
        x->slen = t->n;
        *out = x;
        return 0;
    }
    case T_OPEN_STMT:
        return parse_stmt(P, out);
    case T_OPEN_EXPR:
        P->cur++;
        MS_TRY(parse_expr(P, out));
        return expect(P, T_CLOSE_EXPR, "'}}' to close the expression");
    default:
        return perr(P, "unexpected %s", tok_name(t->type));
    }
}

int jj_parse(jj_arena *arena, jj_tok *toks, int ntok, jj_node ***body, int *n, ms_err *err) {
    parser P = {arena, toks, ntok, 0, 0, 0, err};
    nlist l = {0};
    while (P.cur < P.n) {
        jj_node *x;
        int rc = parse_any(&P, &x);
        if (rc) {
            free(l.v);
            return rc;
        }
        if (nl_push(&l, x)) {
            free(l.v);
            return oom(&P);
        }
    }
    return nl_finish(&P, &l, body, n);
}
