/* jinja_eval.c - renders a parsed template the way Python's jinja2 does under transformers, so a
 * prompt carries the bytes the model was trained on: undefined prints as "", none as "None",
 * booleans as True/False, floats as Python's repr (1.0, 1e-05), containers as Python reprs, `~` is
 * str() concatenation, `+` on a string needs a string, == and `in` are Python's, string lengths and
 * indexes count code points, and tojson is json.dumps (ensure_ascii=False). Filters and methods
 * jinja2 has but @huggingface/jinja lacks (count, d, select, reject, round, wordcount, escape,
 * find, rsplit, ...) are included. What still follows @huggingface/jinja is listed in
 * docs/templates.md. Rendering is bounded by jj_limits (output bytes, arena bytes, steps = loop
 * iterations + macro calls + range() elements, macro nesting) and by a cap on evaluation nesting. */
#include "tokenizer/jinja.h"

#include "core/fmt.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

/* ---- values --------------------------------------------------------------------------------- */

/* V_LOOP is the `loop` variable of a for loop, kept unmaterialized (u.a = the items, n = the index)
 * so iterations allocate nothing; it turns into a V_OBJ when used as a whole value. */
enum { V_UNDEF, V_NULL, V_BOOL, V_INT, V_FLOAT, V_STR, V_ARR, V_TUPLE, V_OBJ, V_KWARGS, V_NS, V_FUNC, V_LOOP };

typedef struct jarr jarr;
typedef struct jobj jobj;
typedef struct jfn jfn;

typedef struct jv {
    int t;
    size_t n;     /* string length in bytes */
    long long iv; /* V_INT from JSON: the exact value (u.d may have rounded it past 2^53) */
    union {
        double d;
        int b;
        const char *s;
        jarr *a;
        jobj *o;
        const jfn *f;
    } u;
} jv;

struct jarr {
    size_t n;
    jv *v;
};

typedef struct jkey {
    const char *s;
    size_t n;
} jkey;

struct jobj {
    size_t n, cap;
    jkey *k;
    jv *v;
};

/* keys of the `loop` object; shared by every loop object and never written */
static jkey k_loop_keys[9] = {{"index", 5}, {"index0", 6}, {"revindex", 8}, {"revindex0", 9}, {"first", 5},
                              {"last", 4},  {"length", 6}, {"previtem", 8}, {"nextitem", 8}};

typedef struct jenv jenv;

enum { F_MACRO, F_CALLER, F_BUILTIN, F_METHOD };
enum { B_RAISE, B_RANGE, B_STRFTIME, B_NAMESPACE };
enum {
    M_UPPER, M_LOWER, M_STRIP, M_TITLE, M_CAPITALIZE, M_RSTRIP, M_LSTRIP, M_STARTSWITH, M_ENDSWITH,
    M_SPLIT, M_REPLACE, M_GET, M_ITEMS, M_KEYS, M_VALUES, M_DICTSORT, M_FIND, M_COUNT, M_RSPLIT, M_JOIN
};

struct jfn {
    int kind;
    int id;
    const jj_node *node; /* macro or call block */
    jenv *env;           /* call block: where it was defined */
    jv self;             /* method receiver */
};

typedef struct jvar {
    const char *k;
    size_t kn;
    jv v;
    struct jvar *next;
} jvar;

struct jenv {
    jenv *parent;
    jvar *vars;
};

static const jfn k_raise = {F_BUILTIN, B_RAISE, NULL, NULL, {0}};
static const jfn k_range = {F_BUILTIN, B_RANGE, NULL, NULL, {0}};
static const jfn k_strftime = {F_BUILTIN, B_STRFTIME, NULL, NULL, {0}};
static const jfn k_namespace = {F_BUILTIN, B_NAMESPACE, NULL, NULL, {0}};

enum { RC_OK = 0, RC_ERR = 1, RC_BREAK = 2, RC_CONT = 3 };

typedef struct R {
    jj_arena ar;
    const jj_limits *lim;
    long long steps;
    int depth; /* nested macro calls */
    int nest;  /* nested evaluations (expressions and blocks): bounds C stack use */
    ms_err *err;
} R;

#define MAX_EVAL_NEST 1000

static jv V(int t) {
    jv v;
    memset(&v, 0, sizeof v);
    v.t = t;
    return v;
}
static jv vnum(int t, double d) {
    jv v = V(t);
    v.u.d = d;
    return v;
}
static jv vbool(int b) {
    jv v = V(V_BOOL);
    v.u.b = !!b;
    return v;
}
static jv vstr(const char *s, size_t n) {
    jv v = V(V_STR);
    v.u.s = s;
    v.n = n;
    return v;
}
static jv vcstr(const char *s) { return vstr(s, strlen(s)); }

static const char *type_name(int t) {
    static const char *n[] = {"UndefinedValue", "NullValue", "BooleanValue", "IntegerValue",
                              "FloatValue", "StringValue", "ArrayValue", "TupleValue", "ObjectValue",
                              "KeywordArgumentsValue", "NamespaceValue", "FunctionValue", "ObjectValue"};
    return n[t];
}

static int rerr(R *r, const jj_node *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int rerr(R *r, const jj_node *at, const char *fmt, ...) {
    char msg[420];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at) ms_errf(r->err, MS_ERR_INVALID, "chat template line %d: %s", at->line, msg);
    else ms_errf(r->err, MS_ERR_INVALID, "chat template: %s", msg);
    return RC_ERR;
}

static int oom(R *r, const jj_node *at) {
    rerr(r, at, "rendering exceeded the memory limit of %zu bytes", r->lim->max_memory);
    r->err->code = MS_ERR_NOMEM;
    return RC_ERR;
}

static int step(R *r, const jj_node *at, long long k) {
    r->steps += k;
    if (r->steps > r->lim->max_steps) {
        rerr(r, at, "rendering exceeded the limit of %lld loop iterations and macro calls", r->lim->max_steps);
        r->err->code = MS_ERR_NOMEM;
        return RC_ERR;
    }
    return RC_OK;
}

static void *ralloc(R *r, size_t n) { return jj_alloc(&r->ar, n); }

static jarr *new_arr(R *r, size_t n) {
    jarr *a = ralloc(r, sizeof *a);
    if (!a) return NULL;
    a->n = n;
    if (n) {
        a->v = ralloc(r, n * sizeof(jv));
        if (!a->v) return NULL;
    }
    return a;
}

static jobj *new_obj(R *r, size_t cap) {
    jobj *o = ralloc(r, sizeof *o);
    if (!o) return NULL;
    if (cap) {
        o->k = ralloc(r, cap * sizeof(jkey));
        o->v = ralloc(r, cap * sizeof(jv));
        if (!o->k || !o->v) return NULL;
    }
    o->cap = cap;
    return o;
}

static jv *obj_get(const jobj *o, const char *k, size_t kn) {
    for (size_t i = 0; i < o->n; i++)
        if (o->k[i].n == kn && !memcmp(o->k[i].s, k, kn)) return &o->v[i];
    return NULL;
}

/* Map.set: replaces in place or appends (insertion order kept). */
static int obj_set(R *r, jobj *o, const char *k, size_t kn, jv v) {
    jv *p = obj_get(o, k, kn);
    if (p) {
        *p = v;
        return 0;
    }
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 8;
        jkey *nk = ralloc(r, cap * sizeof(jkey));
        jv *nv = ralloc(r, cap * sizeof(jv));
        if (!nk || !nv) return -1;
        if (o->n) {
            memcpy(nk, o->k, o->n * sizeof(jkey));
            memcpy(nv, o->v, o->n * sizeof(jv));
        }
        o->k = nk;
        o->v = nv;
        o->cap = cap;
    }
    o->k[o->n] = (jkey){k, kn};
    o->v[o->n] = v;
    o->n++;
    return 0;
}

static jv vfn(R *r, int kind, int id, jv self) {
    jfn *f = ralloc(r, sizeof *f);
    jv v = V(V_FUNC);
    if (!f) return V(V_UNDEF); /* caller checks r->ar.over */
    f->kind = kind;
    f->id = id;
    f->self = self;
    v.u.f = f;
    return v;
}

/* ---- environments --------------------------------------------------------------------------- */

static jenv *new_env(R *r, jenv *parent) {
    jenv *e = ralloc(r, sizeof *e);
    if (e) e->parent = parent;
    return e;
}

static int env_set(R *r, jenv *e, const char *k, size_t kn, jv v) {
    for (jvar *x = e->vars; x; x = x->next)
        if (x->kn == kn && !memcmp(x->k, k, kn)) {
            x->v = v;
            return 0;
        }
    jvar *x = ralloc(r, sizeof *x);
    if (!x) return -1;
    x->k = k;
    x->kn = kn;
    x->v = v;
    x->next = e->vars;
    e->vars = x;
    return 0;
}

static jv env_get(jenv *e, const char *k, size_t kn) {
    for (; e; e = e->parent)
        for (jvar *x = e->vars; x; x = x->next)
            if (x->kn == kn && !memcmp(x->k, k, kn)) return x->v;
    if (kn == 9 && !memcmp(k, "namespace", 9)) {
        jv v = V(V_FUNC);
        v.u.f = &k_namespace;
        return v;
    }
    return V(V_UNDEF);
}

/* ---- strings -------------------------------------------------------------------------------- */

static int is_truthy(jv v) {
    switch (v.t) {
    case V_UNDEF: case V_NULL: return 0;
    case V_BOOL: return v.u.b;
    case V_INT: case V_FLOAT: return v.u.d != 0 && !isnan(v.u.d);
    case V_STR: return v.n > 0;
    case V_ARR: case V_TUPLE: return v.u.a->n > 0;
    case V_OBJ: case V_KWARGS: return v.u.o->n > 0;
    default: return 1;
    }
}

/* Copies a finished buffer into the arena as a string value. */
static int buf_to_str(R *r, const jj_node *at, jj_buf *b, jv *out) {
    char *s = jj_strdup(&r->ar, b->p ? b->p : "", b->n);
    size_t n = b->n;
    jj_buf_free(b);
    if (!s) return oom(r, at);
    *out = vstr(s, n);
    return RC_OK;
}

static int buf_check(R *r, const jj_node *at, jj_buf *b) {
    if (!b->over) return RC_OK;
    rerr(r, at, "rendered text exceeds the output limit of %zu bytes", r->lim->max_output);
    r->err->code = MS_ERR_NOMEM;
    return RC_ERR;
}

static jj_buf new_buf(R *r) {
    jj_buf b = {0};
    b.limit = r->lim->max_output;
    return b;
}

/* Case mapping as JavaScript's toUpperCase/toLowerCase (full mapping only for the common ß). */
static int map_case(R *r, const jj_node *at, jv s, int upper, jv *out) {
    jj_buf b = new_buf(r);
    for (size_t i = 0; i < s.n;) {
        uint32_t cp;
        int l = ms_utf8_dec(s.u.s + i, s.n - i, &cp);
        if (cp == 0xFFFD) {
            jj_buf_put(&b, s.u.s + i, (size_t)l); /* keep malformed bytes as they are */
            i += (size_t)l;
            continue;
        }
        i += (size_t)l;
        if (upper && cp == 0xDF) {
            jj_buf_put(&b, "SS", 2);
            continue;
        }
        uint32_t m = (uint32_t)(upper ? utf8proc_toupper((utf8proc_int32_t)cp) : utf8proc_tolower((utf8proc_int32_t)cp));
        char enc[4];
        jj_buf_put(&b, enc, (size_t)ms_utf8_enc(m, enc));
    }
    if (buf_check(r, at, &b)) {
        jj_buf_free(&b);
        return RC_ERR;
    }
    return buf_to_str(r, at, &b, out);
}

/* Whether code point cp is in the UTF-8 set chars (str.strip(chars)), or Python whitespace when
 * chars is not a string. */
static int strip_member(uint32_t cp, jv chars) {
    if (chars.t != V_STR) return jj_is_py_space(cp);
    for (size_t i = 0; i < chars.n;) {
        uint32_t c;
        i += (size_t)ms_utf8_dec(chars.u.s + i, chars.n - i, &c);
        if (c == cp) return 1;
    }
    return 0;
}

/* Python's str.lstrip/rstrip/strip([chars]) (which: 1 start, 2 end, 3 both). */
static jv py_strip(jv s, int which, jv chars) {
    size_t a = 0, e = s.n;
    if (which & 1) {
        while (a < e) {
            uint32_t cp;
            int l = ms_utf8_dec(s.u.s + a, e - a, &cp);
            if (!strip_member(cp, chars)) break;
            a += (size_t)l;
        }
    }
    if (which & 2) {
        while (e > a) {
            size_t st = e - 1;
            while (st > a && ((unsigned char)s.u.s[st] & 0xC0) == 0x80 && e - st < 4) st--;
            uint32_t cp;
            int l = ms_utf8_dec(s.u.s + st, e - st, &cp);
            if ((size_t)l != e - st || !strip_member(cp, chars)) break;
            e = st;
        }
    }
    return vstr(s.u.s + a, e - a);
}

static int is_ascii_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* value.replace(/\b\w/g, upper): ASCII word starts upper-cased, nothing else touched. */
static int title_case(R *r, const jj_node *at, jv s, jv *out) {
    char *p = jj_alloc(&r->ar, s.n + 1);
    if (!p) return oom(r, at);
    memcpy(p, s.u.s, s.n);
    for (size_t i = 0; i < s.n; i++)
        if (is_ascii_word(p[i]) && (i == 0 || !is_ascii_word(s.u.s[i - 1])) && p[i] >= 'a' && p[i] <= 'z')
            p[i] = (char)(p[i] - 32);
    *out = vstr(p, s.n);
    return RC_OK;
}

/* charAt(0).toUpperCase() + slice(1) (astral first characters stay as they are). */
static int capitalize(R *r, const jj_node *at, jv s, jv *out) {
    if (s.n == 0) {
        *out = s;
        return RC_OK;
    }
    uint32_t cp;
    int l = ms_utf8_dec(s.u.s, s.n, &cp);
    if (cp >= 0x10000 || cp == 0xFFFD) {
        *out = s;
        return RC_OK;
    }
    jv first, up;
    first = vstr(s.u.s, (size_t)l);
    MS_TRY(map_case(r, at, first, 1, &up));
    char *p = jj_alloc(&r->ar, up.n + s.n - (size_t)l + 1);
    if (!p) return oom(r, at);
    memcpy(p, up.u.s, up.n);
    memcpy(p + up.n, s.u.s + l, s.n - (size_t)l);
    *out = vstr(p, up.n + s.n - (size_t)l);
    return RC_OK;
}

/* ---- conversions to text -------------------------------------------------------------------- */

typedef struct jopts {
    int indent; /* <0 none */
    int ascii;
    int sort_keys;
    const char *item_sep, *key_sep;
    size_t item_sep_n, key_sep_n;
} jopts;

static int to_json(R *r, const jj_node *at, jv v, const jopts *o, int depth, int undef_null, jj_buf *b);

/* Python's str(int): exact for integers that came from JSON (iv), else the double's integer digits. */
static void put_int(jj_buf *b, jv v) {
    char tmp[400];
    if ((double)v.iv == v.u.d) snprintf(tmp, sizeof tmp, "%lld", v.iv);
    else if (isfinite(v.u.d)) snprintf(tmp, sizeof tmp, "%.0f", v.u.d);
    else ms_fmt_pyfloat(v.u.d, tmp);
    jj_buf_puts(b, tmp);
}

static void put_float(jj_buf *b, double d) {
    char tmp[40];
    ms_fmt_pyfloat(d, tmp);
    jj_buf_puts(b, tmp);
}

/* Python's repr(str): single quotes unless the text has ' and no ", backslash escapes for the
 * quote, \\, \t \n \r, and \xNN / \uNNNN / \UNNNNNNNN for characters str.isprintable() rejects. */
static void put_str_repr(jj_buf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jj_buf_putc(b, q);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = ms_utf8_dec(s + i, n - i, &cp);
        char esc[16];
        if (cp == (uint32_t)q || cp == '\\') {
            jj_buf_putc(b, '\\');
            jj_buf_putc(b, (char)cp);
        } else if (cp == '\t') jj_buf_puts(b, "\\t");
        else if (cp == '\n') jj_buf_puts(b, "\\n");
        else if (cp == '\r') jj_buf_puts(b, "\\r");
        else if (cp < 0x20 || cp == 0x7F) {
            snprintf(esc, sizeof esc, "\\x%02x", cp);
            jj_buf_puts(b, esc);
        } else if (cp >= 0x80 && !jj_py_printable(cp)) {
            if (cp < 0x100) snprintf(esc, sizeof esc, "\\x%02x", cp);
            else if (cp < 0x10000) snprintf(esc, sizeof esc, "\\u%04x", cp);
            else snprintf(esc, sizeof esc, "\\U%08x", cp);
            jj_buf_puts(b, esc);
        } else jj_buf_put(b, s + i, (size_t)l);
        i += (size_t)l;
    }
    jj_buf_putc(b, q);
}

static int to_repr(R *r, const jj_node *at, jv v, jj_buf *b, int depth);

/* Python's str() of a value: what {{ }}, `~`, join and |string print. Undefined is "", none is
 * "None", booleans "True"/"False", floats their repr, containers their Python repr. */
static int to_str_d(R *r, const jj_node *at, jv v, jj_buf *b, int depth) {
    switch (v.t) {
    case V_UNDEF: return RC_OK;
    case V_STR: jj_buf_put(b, v.u.s, v.n); return RC_OK;
    default: return to_repr(r, at, v, b, depth);
    }
}

static int to_print(R *r, const jj_node *at, jv v, jj_buf *b) { return to_str_d(r, at, v, b, 0); }

static int to_repr(R *r, const jj_node *at, jv v, jj_buf *b, int depth) {
    if (depth > 512) return rerr(r, at, "value nested too deeply to print");
    switch (v.t) {
    case V_UNDEF: jj_buf_puts(b, "Undefined"); return RC_OK;
    case V_NULL: jj_buf_puts(b, "None"); return RC_OK;
    case V_BOOL: jj_buf_puts(b, v.u.b ? "True" : "False"); return RC_OK;
    case V_INT: put_int(b, v); return RC_OK;
    case V_FLOAT: put_float(b, v.u.d); return RC_OK;
    case V_STR: put_str_repr(b, v.u.s, v.n); return RC_OK;
    case V_ARR: case V_TUPLE: {
        jj_buf_putc(b, v.t == V_ARR ? '[' : '(');
        for (size_t i = 0; i < v.u.a->n; i++) {
            if (i) jj_buf_puts(b, ", ");
            MS_TRY(to_repr(r, at, v.u.a->v[i], b, depth + 1));
        }
        if (v.t == V_TUPLE && v.u.a->n == 1) jj_buf_putc(b, ',');
        jj_buf_putc(b, v.t == V_ARR ? ']' : ')');
        return b->over ? buf_check(r, at, b) : RC_OK;
    }
    case V_OBJ: case V_KWARGS: case V_NS: {
        if (v.t == V_NS) jj_buf_puts(b, "<Namespace ");
        jj_buf_putc(b, '{');
        for (size_t i = 0; i < v.u.o->n; i++) {
            if (i) jj_buf_puts(b, ", ");
            put_str_repr(b, v.u.o->k[i].s, v.u.o->k[i].n);
            jj_buf_puts(b, ": ");
            MS_TRY(to_repr(r, at, v.u.o->v[i], b, depth + 1));
        }
        jj_buf_putc(b, '}');
        if (v.t == V_NS) jj_buf_putc(b, '>');
        return b->over ? buf_check(r, at, b) : RC_OK;
    }
    default:
        return rerr(r, at, "cannot convert a %s to a string", type_name(v.t));
    }
}

static int to_json(R *r, const jj_node *at, jv v, const jopts *o, int depth, int undef_null, jj_buf *b) {
    if (depth > 512) return rerr(r, at, "value nested too deeply for tojson");
    switch (v.t) {
    case V_NULL: jj_buf_puts(b, "null"); return RC_OK;
    case V_BOOL: jj_buf_puts(b, v.u.b ? "true" : "false"); return RC_OK;
    case V_INT: put_int(b, v); return RC_OK;
    case V_FLOAT: {
        char tmp[40];
        ms_fmt_pyjson_float(v.u.d, tmp);
        jj_buf_puts(b, tmp);
        return RC_OK;
    }
    case V_STR: jj_json_quote(b, v.u.s, v.n, o->ascii); return RC_OK;
    case V_ARR: case V_TUPLE: case V_OBJ: case V_KWARGS: break;
    default: return rerr(r, at, "cannot convert %s to JSON", type_name(v.t));
    }
    int ind = o->indent >= 0; /* json.dumps: indent=0 still breaks lines */
    int arr = v.t == V_ARR || v.t == V_TUPLE;
    size_t nitems = arr ? v.u.a->n : v.u.o->n;
    /* padding strings: "\n" + indent*(depth) and one level deeper */
    #define PAD(lvl)                                                                               \
        do {                                                                                      \
            jj_buf_putc(b, '\n');                                                                 \
            for (long q = 0; q < (long)o->indent * (lvl); q++) jj_buf_putc(b, ' ');                \
        } while (0)
    if (arr) {
        jj_buf_putc(b, '[');
        for (size_t i = 0; i < nitems; i++) {
            if (i) jj_buf_put(b, o->item_sep, o->item_sep_n);
            if (ind) PAD(depth + 1);
            MS_TRY(to_json(r, at, v.u.a->v[i], o, depth + 1, undef_null, b));
        }
        if (ind && nitems) PAD(depth);
        jj_buf_putc(b, ']');
        return b->over ? buf_check(r, at, b) : RC_OK;
    }
    size_t *order = NULL;
    if (o->sort_keys && nitems > 1) {
        order = malloc(nitems * sizeof *order);
        if (!order) return oom(r, at);
        for (size_t i = 0; i < nitems; i++) order[i] = i;
        for (size_t i = 1; i < nitems; i++) { /* insertion sort: stable, small objects */
            size_t x = order[i], j = i;
            while (j > 0) {
                jkey *ka = &v.u.o->k[order[j - 1]], *kb = &v.u.o->k[x];
                int c = memcmp(ka->s, kb->s, ka->n < kb->n ? ka->n : kb->n); /* code point order */
                if (c < 0 || (c == 0 && ka->n <= kb->n)) break;
                order[j] = order[j - 1];
                j--;
            }
            order[j] = x;
        }
    }
    jj_buf_putc(b, '{');
    for (size_t q = 0; q < nitems; q++) {
        size_t i = order ? order[q] : q;
        if (q) jj_buf_put(b, o->item_sep, o->item_sep_n);
        if (ind) PAD(depth + 1);
        jj_json_quote(b, v.u.o->k[i].s, v.u.o->k[i].n, o->ascii);
        jj_buf_put(b, o->key_sep, o->key_sep_n);
        int rc = to_json(r, at, v.u.o->v[i], o, depth + 1, undef_null, b);
        if (rc) {
            free(order);
            return rc;
        }
    }
    free(order);
    if (ind && nitems) PAD(depth);
    jj_buf_putc(b, '}');
    #undef PAD
    return b->over ? buf_check(r, at, b) : RC_OK;
}

static int print_to_str(R *r, const jj_node *at, jv v, jv *out) {
    if (v.t == V_STR) {
        *out = v;
        return RC_OK;
    }
    jj_buf b = new_buf(r);
    int rc = to_print(r, at, v, &b);
    if (!rc) rc = buf_check(r, at, &b);
    if (rc) {
        jj_buf_free(&b);
        return rc;
    }
    return buf_to_str(r, at, &b, out);
}

/* ---- JSON context -> values ----------------------------------------------------------------- */

static int from_json(R *r, json_t *j, jv *out, int depth) {
    if (depth > 1000) return rerr(r, NULL, "context JSON nested too deeply");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jobj *o = new_obj(r, json_object_size(j));
        if (!o) return oom(r, NULL);
        const char *k;
        json_t *val;
        json_object_foreach(j, k, val) {
            jv x;
            MS_TRY(from_json(r, val, &x, depth + 1));
            o->k[o->n] = (jkey){k, strlen(k)};
            o->v[o->n++] = x;
        }
        *out = V(V_OBJ);
        out->u.o = o;
        return RC_OK;
    }
    case JSON_ARRAY: {
        jarr *a = new_arr(r, json_array_size(j));
        if (!a) return oom(r, NULL);
        for (size_t i = 0; i < a->n; i++) MS_TRY(from_json(r, json_array_get(j, i), &a->v[i], depth + 1));
        *out = V(V_ARR);
        out->u.a = a;
        return RC_OK;
    }
    case JSON_STRING: *out = vstr(json_string_value(j), json_string_length(j)); return RC_OK;
    case JSON_INTEGER:
        *out = vnum(V_INT, (double)json_integer_value(j));
        out->iv = (long long)json_integer_value(j);
        return RC_OK;
    case JSON_REAL: *out = vnum(V_FLOAT, json_real_value(j)); return RC_OK; /* 1.0 stays a float, as in json.loads */
    case JSON_TRUE: *out = vbool(1); return RC_OK;
    case JSON_FALSE: *out = vbool(0); return RC_OK;
    default: *out = V(V_NULL); return RC_OK;
    }
}

/* ---- comparisons ---------------------------------------------------------------------------- */

enum { K_UNDEF, K_NULL, K_BOOL, K_NUM, K_STR, K_OBJ };
static int js_kind(int t) {
    switch (t) {
    case V_UNDEF: return K_UNDEF;
    case V_NULL: return K_NULL;
    case V_BOOL: return K_BOOL;
    case V_INT: case V_FLOAT: return K_NUM;
    case V_STR: return K_STR;
    default: return K_OBJ;
    }
}

static const void *obj_identity(jv v) {
    switch (v.t) {
    case V_ARR: case V_TUPLE: return v.u.a;
    case V_OBJ: case V_KWARGS: case V_NS: return v.u.o;
    default: return v.u.f;
    }
}

static int str_eq(jv a, jv b) { return a.n == b.n && (a.n == 0 || !memcmp(a.u.s, b.u.s, a.n)); }

/* a.value === b.value (zero: SameValueZero, NaN equals NaN). */
static int strict_eq(jv a, jv b, int zero) {
    int ka = js_kind(a.t), kb = js_kind(b.t);
    if (ka != kb) return 0;
    switch (ka) {
    case K_UNDEF: case K_NULL: return 1;
    case K_BOOL: return a.u.b == b.u.b;
    case K_NUM: return a.u.d == b.u.d || (zero && isnan(a.u.d) && isnan(b.u.d));
    case K_STR: return str_eq(a, b);
    default: return obj_identity(a) == obj_identity(b);
    }
}

/* Python's a == b: numbers (booleans included) by value, strings by bytes, lists and tuples
 * element-wise (a list never equals a tuple), dicts by key set and values, undefined only equals
 * undefined, anything else by identity. */
static int py_eq(jv a, jv b, int depth) {
    int na = a.t == V_INT || a.t == V_FLOAT || a.t == V_BOOL, nb = b.t == V_INT || b.t == V_FLOAT || b.t == V_BOOL;
    if (na || nb) return na && nb && (a.t == V_BOOL ? a.u.b : a.u.d) == (b.t == V_BOOL ? b.u.b : b.u.d);
    if (a.t == V_KWARGS) a.t = V_OBJ;
    if (b.t == V_KWARGS) b.t = V_OBJ;
    if (a.t != b.t) return 0;
    switch (a.t) {
    case V_UNDEF: case V_NULL: return 1;
    case V_STR: return str_eq(a, b);
    case V_ARR: case V_TUPLE:
        if (a.u.a == b.u.a) return 1;
        if (a.u.a->n != b.u.a->n || depth > 512) return 0;
        for (size_t i = 0; i < a.u.a->n; i++)
            if (!py_eq(a.u.a->v[i], b.u.a->v[i], depth + 1)) return 0;
        return 1;
    case V_OBJ:
        if (a.u.o == b.u.o) return 1;
        if (a.u.o->n != b.u.o->n || depth > 512) return 0;
        for (size_t i = 0; i < a.u.o->n; i++) {
            const jv *w = obj_get(b.u.o, a.u.o->k[i].s, a.u.o->k[i].n);
            if (!w || !py_eq(a.u.o->v[i], *w, depth + 1)) return 0;
        }
        return 1;
    default: return obj_identity(a) == obj_identity(b);
    }
}

/* compareRuntimeValues: numbers (and booleans) with each other, strings with strings. */
static int compare_values(R *r, const jj_node *at, jv a, jv b, int case_sensitive, int *res) {
    if (a.t == V_NULL && b.t == V_NULL) return *res = 0, RC_OK;
    if (a.t == V_NULL || b.t == V_NULL) return rerr(r, at, "cannot compare %s with %s", type_name(a.t), type_name(b.t));
    if (a.t == V_UNDEF && b.t == V_UNDEF) return *res = 0, RC_OK;
    if (a.t == V_UNDEF || b.t == V_UNDEF)
        return rerr(r, at, "cannot compare %s with %s", type_name(a.t), type_name(b.t));
    int na = a.t == V_INT || a.t == V_FLOAT || a.t == V_BOOL, nb = b.t == V_INT || b.t == V_FLOAT || b.t == V_BOOL;
    if (na && nb) {
        double x = a.t == V_BOOL ? a.u.b : a.u.d, y = b.t == V_BOOL ? b.u.b : b.u.d;
        *res = x < y ? -1 : x > y ? 1 : 0;
        return RC_OK;
    }
    if (a.t != b.t) return rerr(r, at, "cannot compare different types: %s and %s", type_name(a.t), type_name(b.t));
    if (a.t != V_STR) return rerr(r, at, "cannot compare type %s", type_name(a.t));
    if (!case_sensitive) {
        MS_TRY(map_case(r, at, a, 0, &a));
        MS_TRY(map_case(r, at, b, 0, &b));
    }
    int c = memcmp(a.u.s, b.u.s, a.n < b.n ? a.n : b.n); /* code point order, as Python */
    *res = c ? (c < 0 ? -1 : 1) : a.n < b.n ? -1 : a.n > b.n ? 1 : 0;
    return RC_OK;
}

/* Stable merge sort whose comparator can fail. keys[i] is what item i is compared by. */
typedef struct {
    R *r;
    const jj_node *at;
    int cs, rev, rc;
} sortctx;

static void msort(sortctx *c, size_t *idx, size_t *tmp, size_t n, const jv *keys) {
    if (n < 2 || c->rc) return;
    size_t h = n / 2;
    msort(c, idx, tmp, h, keys);
    msort(c, idx + h, tmp, n - h, keys);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int res = 0;
        if (!c->rc) c->rc = compare_values(c->r, c->at, keys[idx[j]], keys[idx[i]], c->cs, &res);
        if (c->rev) res = -res;
        if (res < 0) tmp[k++] = idx[j++];
        else tmp[k++] = idx[i++];
    }
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
}

static int sort_values(R *r, const jj_node *at, const jv *items, const jv *keys, size_t n, int cs, int rev, jv *out) {
    jarr *a = new_arr(r, n);
    if (!a) return oom(r, at);
    size_t *idx = malloc((n + 1) * sizeof *idx), *tmp = malloc((n + 1) * sizeof *tmp);
    if (!idx || !tmp) {
        free(idx);
        free(tmp);
        return oom(r, at);
    }
    for (size_t i = 0; i < n; i++) idx[i] = i;
    sortctx c = {r, at, cs, rev, 0};
    msort(&c, idx, tmp, n, keys);
    for (size_t i = 0; i < n; i++) a->v[i] = items[idx[i]];
    free(idx);
    free(tmp);
    if (c.rc) return c.rc;
    *out = V(V_ARR);
    out->u.a = a;
    return RC_OK;
}

/* ---- evaluation ----------------------------------------------------------------------------- */

static int eval(R *r, jenv *e, const jj_node *x, jv *out);
static int exec_block(R *r, jenv *e, jj_node *const *list, int n, jj_buf *out);
static int call_fn(R *r, const jj_node *at, jv fn, jv *args, size_t nargs, jenv *callenv, jv *out);

static jv varr(jarr *a, int t) {
    jv v = V(t);
    v.u.a = a;
    return v;
}
static jv vobj(jobj *o, int t) {
    jv v = V(t);
    v.u.o = o;
    return v;
}

/* Evaluates call arguments: positional values (with *spread) then a keyword object. */
static int eval_args(R *r, jenv *e, jj_node *const *list, int n, jv **pos, size_t *npos, jobj **kw) {
    size_t cap = (size_t)n + 1;
    for (int i = 0; i < n; i++)
        if (list[i]->kind == E_SPREAD) cap += 0; /* grown below */
    jv *p = ralloc(r, cap * sizeof(jv));
    jobj *k = new_obj(r, 0);
    if (!p || !k) return oom(r, list && n ? list[0] : NULL);
    size_t np = 0;
    for (int i = 0; i < n; i++) {
        const jj_node *a = list[i];
        if (a->kind == E_SPREAD) {
            jv v;
            MS_TRY(eval(r, e, a->a, &v));
            if (v.t != V_ARR && v.t != V_TUPLE) return rerr(r, a, "cannot unpack non-iterable type %s", type_name(v.t));
            jv *np2 = ralloc(r, (cap + v.u.a->n) * sizeof(jv));
            if (!np2) return oom(r, a);
            memcpy(np2, p, np * sizeof(jv));
            p = np2;
            cap += v.u.a->n;
            for (size_t j = 0; j < v.u.a->n; j++) p[np++] = v.u.a->v[j];
        } else if (a->kind != E_KWARG && a->kind != E_KWSPREAD) {
            MS_TRY(eval(r, e, a, &p[np]));
            np++;
        }
    }
    for (int i = 0; i < n; i++) {
        const jj_node *a = list[i];
        if (a->kind == E_KWARG) {
            if (obj_get(k, a->s, a->slen)) return rerr(r, a, "got multiple values for keyword argument '%.*s'", (int)a->slen, a->s);
            jv v;
            MS_TRY(eval(r, e, a->a, &v));
            if (obj_set(r, k, a->s, a->slen, v)) return oom(r, a);
        } else if (a->kind == E_KWSPREAD) {
            jv v;
            MS_TRY(eval(r, e, a->a, &v));
            if (v.t != V_OBJ && v.t != V_KWARGS) return rerr(r, a, "argument after ** must be a mapping, not %s", type_name(v.t));
            for (size_t j = 0; j < v.u.o->n; j++) {
                if (obj_get(k, v.u.o->k[j].s, v.u.o->k[j].n))
                    return rerr(r, a, "got multiple values for keyword argument '%.*s'", (int)v.u.o->k[j].n, v.u.o->k[j].s);
                if (obj_set(r, k, v.u.o->k[j].s, v.u.o->k[j].n, v.u.o->v[j])) return oom(r, a);
            }
        }
    }
    *pos = p;
    *npos = np;
    *kw = k;
    return RC_OK;
}

static jv kw_get(const jobj *kw, const char *name) {
    jv *p = kw ? obj_get(kw, name, strlen(name)) : NULL;
    return p ? *p : V(V_UNDEF);
}

/* `args.at(i) ?? kwargs.get(name) ?? def` where "absent" is a missing slot, not an undefined value. */
static jv arg_or(jv *args, size_t n, size_t i, const jobj *kw, const char *name, jv def) {
    if (i < n) return args[i];
    jv *p = kw && name ? obj_get(kw, name, strlen(name)) : NULL;
    return p ? *p : def;
}

static int js_slice(long long len, int has_start, long long start, int has_stop, long long stop, long long stepv,
                    long long *o_start, long long *o_stop) {
    if (stepv >= 0) {
        if (!has_start) start = 0;
        start = start < 0 ? (len + start > 0 ? len + start : 0) : (start < len ? start : len);
        if (!has_stop) stop = len;
        stop = stop < 0 ? (len + stop > 0 ? len + stop : 0) : (stop < len ? stop : len);
    } else {
        if (!has_start) start = len - 1;
        start = start < 0 ? (len + start > -1 ? len + start : -1) : (start < len - 1 ? start : len - 1);
        if (!has_stop) stop = -1;
        stop = stop < -1 ? (len + stop > -1 ? len + stop : -1) : (stop < len - 1 ? stop : len - 1);
    }
    *o_start = start;
    *o_stop = stop;
    return 0;
}

static int eval_slice(R *r, jenv *e, jv obj, const jj_node *sl, jv *out) {
    if (obj.t != V_ARR && obj.t != V_TUPLE && obj.t != V_STR) return rerr(r, sl, "slice object must be an array or string");
    jv part[3];
    const jj_node *nodes[3] = {sl->a, sl->b, sl->c};
    for (int i = 0; i < 3; i++) {
        part[i] = V(V_UNDEF);
        if (nodes[i]) MS_TRY(eval(r, e, nodes[i], &part[i]));
        if (part[i].t != V_INT && part[i].t != V_UNDEF)
            return rerr(r, sl, "slice %s must be numeric or undefined", i == 0 ? "start" : i == 1 ? "stop" : "step");
    }
    long long stepv = part[2].t == V_INT ? (long long)part[2].u.d : 1;
    long long len;
    size_t *offs = NULL; /* string: byte offset of each code point */
    if (obj.t == V_STR) {
        offs = malloc((obj.n + 1) * sizeof *offs);
        if (!offs) return oom(r, sl);
        len = 0;
        for (size_t i = 0; i < obj.n;) {
            uint32_t cp;
            offs[len++] = i;
            i += (size_t)ms_utf8_dec(obj.u.s + i, obj.n - i, &cp);
        }
        offs[len] = obj.n;
    } else {
        len = (long long)obj.u.a->n;
    }
    long long st, sp;
    js_slice(len, part[0].t == V_INT, (long long)part[0].u.d, part[1].t == V_INT, (long long)part[1].u.d, stepv, &st, &sp);
    int dir = stepv > 0 ? 1 : stepv < 0 ? -1 : 0;
    size_t cnt = 0;
    if (dir != 0)
        for (long long i = st; dir * i < dir * sp; i += stepv) cnt++;
    if (obj.t == V_STR) {
        jj_buf b = new_buf(r);
        if (dir != 0)
            for (long long i = st; dir * i < dir * sp; i += stepv)
                jj_buf_put(&b, obj.u.s + offs[i], offs[i + 1] - offs[i]);
        free(offs);
        if (buf_check(r, sl, &b)) {
            jj_buf_free(&b);
            return RC_ERR;
        }
        return buf_to_str(r, sl, &b, out);
    }
    jarr *a = new_arr(r, cnt);
    if (!a) return oom(r, sl);
    size_t k = 0;
    if (dir != 0)
        for (long long i = st; dir * i < dir * sp; i += stepv) a->v[k++] = obj.u.a->v[i];
    *out = varr(a, V_ARR);
    return RC_OK;
}

static int method(R *r, const jj_node *at, jv self, int id, jv *out) {
    *out = vfn(r, F_METHOD, id, self);
    if (out->t == V_UNDEF) return oom(r, at);
    return RC_OK;
}

/* `x.name` / `x[key]` for the built-in members of strings, arrays and dicts. */
static int builtin_member(R *r, const jj_node *at, jv obj, jv key, jv *out) {
    *out = V(V_UNDEF);
    const char *k = key.u.s;
    size_t n = key.n;
#define IS(lit) (n == sizeof(lit) - 1 && !memcmp(k, lit, n))
    if (obj.t == V_STR) {
        if (IS("length")) *out = V(V_UNDEF); /* a Python str has no .length */
        else if (IS("upper")) return method(r, at, obj, M_UPPER, out);
        else if (IS("lower")) return method(r, at, obj, M_LOWER, out);
        else if (IS("strip")) return method(r, at, obj, M_STRIP, out);
        else if (IS("title")) return method(r, at, obj, M_TITLE, out);
        else if (IS("capitalize")) return method(r, at, obj, M_CAPITALIZE, out);
        else if (IS("rstrip")) return method(r, at, obj, M_RSTRIP, out);
        else if (IS("lstrip")) return method(r, at, obj, M_LSTRIP, out);
        else if (IS("startswith")) return method(r, at, obj, M_STARTSWITH, out);
        else if (IS("endswith")) return method(r, at, obj, M_ENDSWITH, out);
        else if (IS("split")) return method(r, at, obj, M_SPLIT, out);
        else if (IS("replace")) return method(r, at, obj, M_REPLACE, out);
        /* Python str methods the oracle lacks (it fails on them): extensions with Python semantics */
        else if (IS("find")) return method(r, at, obj, M_FIND, out);
        else if (IS("count")) return method(r, at, obj, M_COUNT, out);
        else if (IS("rsplit")) return method(r, at, obj, M_RSPLIT, out);
        else if (IS("join")) return method(r, at, obj, M_JOIN, out);
    } else if (obj.t == V_ARR || obj.t == V_TUPLE) {
        if (IS("length")) *out = vnum(V_INT, (double)obj.u.a->n);
    } else if (obj.t == V_OBJ || obj.t == V_KWARGS) {
        if (IS("get")) return method(r, at, obj, M_GET, out);
        if (IS("items")) return method(r, at, obj, M_ITEMS, out);
        if (IS("keys")) return method(r, at, obj, M_KEYS, out);
        if (IS("values")) return method(r, at, obj, M_VALUES, out);
        if (IS("dictsort")) return method(r, at, obj, M_DICTSORT, out);
    }
#undef IS
    return RC_OK;
}

/* Field k of the loop object at index lv.n over lv.u.a; 0 when k is not a loop field. */
static int loop_field(jv lv, const char *k, size_t kn, jv *out) {
    size_t i = lv.n, n = lv.u.a->n;
    for (int q = 0; q < 9; q++) {
        if (k_loop_keys[q].n != kn || memcmp(k_loop_keys[q].s, k, kn)) continue;
        switch (q) {
        case 0: *out = vnum(V_INT, (double)i + 1); break;
        case 1: *out = vnum(V_INT, (double)i); break;
        case 2: *out = vnum(V_INT, (double)(n - i)); break;
        case 3: *out = vnum(V_INT, (double)(n - i - 1)); break;
        case 4: *out = vbool(i == 0); break;
        case 5: *out = vbool(i == n - 1); break;
        case 6: *out = vnum(V_INT, (double)n); break;
        case 7: *out = i > 0 ? lv.u.a->v[i - 1] : V(V_UNDEF); break;
        default: *out = i + 1 < n ? lv.u.a->v[i + 1] : V(V_UNDEF); break;
        }
        return 1;
    }
    return 0;
}

static int materialize_loop(R *r, const jj_node *at, jv lv, jv *out) {
    jobj *o = new_obj(r, 9);
    if (!o) return oom(r, at);
    for (int q = 0; q < 9; q++) {
        o->k[q] = k_loop_keys[q];
        loop_field(lv, k_loop_keys[q].s, k_loop_keys[q].n, &o->v[q]);
    }
    o->n = 9;
    *out = vobj(o, V_OBJ);
    return RC_OK;
}

static int eval_member(R *r, jenv *e, const jj_node *x, jv *out) {
    jv obj, prop;
    if (x->a->kind == E_IDENT) obj = env_get(e, x->a->s, x->a->slen); /* may be an unmaterialized loop */
    else MS_TRY(eval(r, e, x->a, &obj));
    if (obj.t == V_LOOP) {
        if (!x->flag && x->b->kind == E_IDENT && loop_field(obj, x->b->s, x->b->slen, out)) return RC_OK;
        MS_TRY(materialize_loop(r, x, obj, &obj));
    }
    if (x->flag) {
        if (x->b->kind == E_SLICE) return eval_slice(r, e, obj, x->b, out);
        MS_TRY(eval(r, e, x->b, &prop));
    } else if (x->b->kind == E_INT) {
        prop = vnum(V_INT, x->b->num);
    } else {
        prop = vstr(x->b->s, x->b->slen);
    }
    *out = V(V_UNDEF);
    if (obj.t == V_OBJ || obj.t == V_KWARGS || obj.t == V_NS) {
        if (prop.t != V_STR) return rerr(r, x, "cannot access property with non-string: got %s", type_name(prop.t));
        jv *p = obj_get(obj.u.o, prop.u.s, prop.n);
        if (p) {
            *out = *p;
            return RC_OK;
        }
        if (obj.t != V_NS) return builtin_member(r, x, obj, prop, out);
        return RC_OK;
    }
    if (obj.t == V_ARR || obj.t == V_TUPLE || obj.t == V_STR) {
        if (prop.t == V_INT) {
            double idx = trunc(prop.u.d);
            if (obj.t == V_STR) {
                double len = (double)jj_cp_len(obj.u.s, obj.n);
                if (idx < 0) idx += len;
                if (idx < 0 || idx >= len) return RC_OK;
                /* walk UTF-16 units; an index inside a surrogate pair yields U+FFFD */
                size_t unit = 0, target = (size_t)idx;
                for (size_t i = 0; i < obj.n;) {
                    uint32_t cp;
                    int l = ms_utf8_dec(obj.u.s + i, obj.n - i, &cp);
                    size_t w = 1; /* Python indexes code points */
                    if (target < unit + w) {
                        if (w == 2) {
                            *out = vcstr("\xEF\xBF\xBD");
                        } else {
                            *out = vstr(obj.u.s + i, (size_t)l);
                        }
                        return RC_OK;
                    }
                    unit += w;
                    i += (size_t)l;
                }
                return RC_OK;
            }
            double len = (double)obj.u.a->n;
            if (idx < 0) idx += len;
            if (idx >= 0 && idx < len) *out = obj.u.a->v[(size_t)idx];
            return RC_OK;
        }
        if (prop.t == V_STR) return builtin_member(r, x, obj, prop, out);
        return rerr(r, x, "cannot access property with non-string/non-number: got %s", type_name(prop.t));
    }
    if (prop.t != V_STR) return rerr(r, x, "cannot access property with non-string: got %s", type_name(prop.t));
    return RC_OK; /* numbers, booleans, none, undefined and functions have no members */
}

/* ---- tests ---------------------------------------------------------------------------------- */

static int run_test(R *r, const jj_node *at, const char *name, size_t n, jv a, jv *b, int *res) {
#define IS(lit) (n == sizeof(lit) - 1 && !memcmp(name, lit, n))
    if (IS("boolean")) *res = a.t == V_BOOL;
    else if (IS("callable")) *res = a.t == V_FUNC;
    else if (IS("odd") || IS("even")) {
        if (a.t != V_INT) return rerr(r, at, "cannot %.*s on %s", (int)n, name, type_name(a.t));
        int odd = fmod(a.u.d, 2) != 0;
        *res = IS("odd") ? odd : !odd;
    } else if (IS("false")) *res = a.t == V_BOOL && !a.u.b;
    else if (IS("true")) *res = a.t == V_BOOL && a.u.b;
    else if (IS("none")) *res = a.t == V_NULL;
    else if (IS("string")) *res = a.t == V_STR;
    else if (IS("number")) *res = a.t == V_INT || a.t == V_FLOAT;
    else if (IS("integer")) *res = a.t == V_INT;
    else if (IS("iterable")) /* Python: anything with __iter__, undefined included */
        *res = a.t == V_ARR || a.t == V_TUPLE || a.t == V_STR || a.t == V_OBJ || a.t == V_KWARGS || a.t == V_UNDEF;
    else if (IS("mapping")) *res = a.t == V_OBJ || a.t == V_KWARGS;
    else if (IS("sequence")) *res = a.t == V_ARR || a.t == V_TUPLE || a.t == V_OBJ || a.t == V_KWARGS || a.t == V_STR;
    else if (IS("lower") || IS("upper")) {
        *res = 0;
        if (a.t == V_STR) {
            jv m;
            MS_TRY(map_case(r, at, a, IS("upper"), &m));
            *res = str_eq(a, m);
        }
    } else if (IS("defined")) *res = a.t != V_UNDEF;
    else if (IS("undefined")) *res = a.t == V_UNDEF;
    else if (IS("equalto") || IS("eq")) {
        if (!b) return rerr(r, at, "test '%.*s' needs a value to compare with", (int)n, name);
        *res = py_eq(a, *b, 0);
    } else return rerr(r, at, "unknown test '%.*s'", (int)n, name);
#undef IS
    return RC_OK;
}

/* ---- filters -------------------------------------------------------------------------------- */

/* Python's int(s) then int(float(s)) as jinja2's int filter tries them; NaN when neither parses. */
static double py_parse_int(jv s) {
    jv t = py_strip(s, 3, V(V_UNDEF));
    char buf[128], *end;
    if (t.n == 0 || t.n >= sizeof buf) return NAN;
    memcpy(buf, t.u.s, t.n);
    buf[t.n] = 0;
    double d = strtod(buf, &end);
    if (*end || !strpbrk(buf, "0123456789") || strpbrk(buf, "xXpP")) return NAN;
    return trunc(d);
}

/* JavaScript parseInt(s, 10) / parseFloat(s); NaN when nothing parses. */
static double js_parse_int(jv s) {
    jv t = py_strip(s, 1, V(V_UNDEF));
    size_t i = 0;
    int neg = 0;
    if (i < t.n && (t.u.s[i] == '+' || t.u.s[i] == '-')) neg = t.u.s[i++] == '-';
    double v = 0;
    size_t d0 = i;
    while (i < t.n && t.u.s[i] >= '0' && t.u.s[i] <= '9') v = v * 10 + (t.u.s[i++] - '0');
    if (i == d0) return NAN;
    return neg ? -v : v;
}

static double js_parse_float(jv s) {
    jv t = py_strip(s, 1, V(V_UNDEF));
    char buf[128];
    size_t n = t.n < sizeof buf - 1 ? t.n : sizeof buf - 1;
    memcpy(buf, t.u.s, n);
    buf[n] = 0;
    size_t i = 0;
    if (buf[i] == '+' || buf[i] == '-') i++;
    if (!strncmp(buf + i, "Infinity", 8)) return buf[0] == '-' ? -INFINITY : INFINITY;
    size_t d0 = i, nd = 0;
    while (buf[i] >= '0' && buf[i] <= '9') i++;
    nd = i - d0;
    if (buf[i] == '.') {
        size_t f0 = ++i;
        while (buf[i] >= '0' && buf[i] <= '9') i++;
        nd += i - f0;
    }
    if (nd == 0) return NAN;
    if (buf[i] == 'e' || buf[i] == 'E') {
        size_t save = i++;
        if (buf[i] == '+' || buf[i] == '-') i++;
        size_t e0 = i;
        while (buf[i] >= '0' && buf[i] <= '9') i++;
        if (i == e0) i = save;
    }
    buf[i] = 0;
    return strtod(buf, NULL);
}

static int indent_lines(R *r, const jj_node *at, jv s, long width, int first, int blank, jv *out) {
    if (width < 0) width = 0;
    jj_buf b = new_buf(r);
    size_t ls = 0;
    for (size_t line = 0;; line++) {
        size_t le = ls;
        while (le < s.n && s.u.s[le] != '\n') le++;
        int skip = (!first && line == 0) || (!blank && le == ls);
        if (!skip)
            for (long q = 0; q < width; q++) jj_buf_putc(&b, ' ');
        jj_buf_put(&b, s.u.s + ls, le - ls);
        if (le >= s.n) break;
        jj_buf_putc(&b, '\n');
        ls = le + 1;
    }
    if (buf_check(r, at, &b)) {
        jj_buf_free(&b);
        return RC_ERR;
    }
    return buf_to_str(r, at, &b, out);
}

/* Value of item at a dotted attribute path ("a.b", "items.0"), or undefined. */
static jv attr_path(jv item, const char *path, size_t n) {
    size_t s = 0;
    while (1) {
        size_t e = s;
        while (e < n && path[e] != '.') e++;
        if (item.t == V_OBJ || item.t == V_KWARGS || item.t == V_NS) {
            jv *p = obj_get(item.u.o, path + s, e - s);
            item = p ? *p : V(V_UNDEF);
        } else if (item.t == V_ARR || item.t == V_TUPLE) {
            /* parseInt(part, 10) */
            jv part = vstr(path + s, e - s);
            double idx = js_parse_int(part);
            if (isnan(idx) || idx < 0 || idx >= (double)item.u.a->n) return V(V_UNDEF);
            item = item.u.a->v[(size_t)idx];
        } else {
            return V(V_UNDEF);
        }
        if (e >= n) return item;
        s = e + 1;
    }
}

static int join_values(R *r, const jj_node *at, jv operand, jv sep, jv *out) {
    jj_buf b = new_buf(r);
    int rc = RC_OK;
    if (operand.t == V_STR) {
        for (size_t i = 0; i < operand.n;) {
            uint32_t cp;
            int l = ms_utf8_dec(operand.u.s + i, operand.n - i, &cp);
            if (i) jj_buf_put(&b, sep.u.s, sep.n);
            jj_buf_put(&b, operand.u.s + i, (size_t)l);
            i += (size_t)l;
        }
    } else {
        for (size_t i = 0; i < operand.u.a->n && !rc; i++) {
            if (i) jj_buf_put(&b, sep.u.s, sep.n);
            jv x = operand.u.a->v[i];
            rc = to_print(r, at, x, &b);
        }
    }
    if (!rc) rc = buf_check(r, at, &b);
    if (rc) {
        jj_buf_free(&b);
        return rc;
    }
    return buf_to_str(r, at, &b, out);
}

static int tojson_value(R *r, const jj_node *at, jv v, const jopts *o, jv *out) {
    jj_buf b = new_buf(r);
    int rc = to_json(r, at, v, o, 0, 1, &b);
    if (!rc) rc = buf_check(r, at, &b);
    if (rc) {
        jj_buf_free(&b);
        return rc;
    }
    return buf_to_str(r, at, &b, out);
}

static int obj_items(R *r, const jj_node *at, jv o, jv *out) {
    jarr *a = new_arr(r, o.u.o->n);
    if (!a) return oom(r, at);
    for (size_t i = 0; i < o.u.o->n; i++) {
        jarr *pair = new_arr(r, 2);
        if (!pair) return oom(r, at);
        pair->v[0] = vstr(o.u.o->k[i].s, o.u.o->k[i].n);
        pair->v[1] = o.u.o->v[i];
        a->v[i] = varr(pair, V_ARR);
    }
    *out = varr(a, V_ARR);
    return RC_OK;
}

static int call_method(R *r, const jj_node *at, int id, jv self, jv *args, size_t n, jv *out);


static long long str_find_ll(jv hay, size_t from, jv needle);

/* ---- extensions: Python jinja2 filters the oracle does not have (it fails on them) ----------- */

static int ext_filter(R *r, jenv *e, const jj_node *f, jv v, jv *out) {
    const char *name = f->s;
    size_t nl = f->slen;
    const jj_node *at = f;
#define IS(lit) (nl == sizeof(lit) - 1 && !memcmp(name, lit, nl))
    jv *args = NULL;
    size_t na = 0;
    jobj *kw = NULL;
    if (f->flag) MS_TRY(eval_args(r, e, f->list, f->n, &args, &na, &kw));
    if (IS("count")) { /* = length */
        if (v.t == V_STR) return *out = vnum(V_INT, (double)jj_cp_len(v.u.s, v.n)), RC_OK;
        if (v.t == V_ARR || v.t == V_TUPLE) return *out = vnum(V_INT, (double)v.u.a->n), RC_OK;
        if (v.t == V_OBJ || v.t == V_KWARGS || v.t == V_NS) return *out = vnum(V_INT, (double)v.u.o->n), RC_OK;
        return rerr(r, at, "cannot apply filter \"count\" to type %s", type_name(v.t));
    }
    if (IS("d")) { /* = default(value='', boolean=false) */
        jv def = na > 0 ? args[0] : vcstr("");
        jv boolean = arg_or(args, na, 1, kw, "boolean", vbool(0));
        if (v.t == V_UNDEF || (is_truthy(boolean) && !is_truthy(v))) return *out = def, RC_OK;
        return *out = v, RC_OK;
    }
    if (IS("select") || IS("reject")) {
        if (v.t != V_ARR && v.t != V_TUPLE) return rerr(r, at, "cannot apply filter \"%.*s\" to type %s", (int)nl, name, type_name(v.t));
        if (na > 0 && args[0].t != V_STR) return rerr(r, at, "the test name of \"%.*s\" must be a string", (int)nl, name);
        int sel = IS("select");
        jarr *b = new_arr(r, v.u.a->n);
        if (!b) return oom(r, at);
        size_t k = 0;
        for (size_t i = 0; i < v.u.a->n; i++) {
            int res;
            if (na == 0) res = is_truthy(v.u.a->v[i]);
            else MS_TRY(run_test(r, at, args[0].u.s, args[0].n, v.u.a->v[i], na > 1 ? &args[1] : NULL, &res));
            if (sel ? res : !res) b->v[k++] = v.u.a->v[i];
        }
        b->n = k;
        return *out = varr(b, V_ARR), RC_OK;
    }
    if (IS("round")) {
        if (v.t != V_INT && v.t != V_FLOAT) return rerr(r, at, "cannot apply filter \"round\" to type %s", type_name(v.t));
        jv prec = arg_or(args, na, 0, kw, "precision", vnum(V_INT, 0));
        jv meth = arg_or(args, na, 1, kw, "method", vcstr("common"));
        if (prec.t != V_INT || meth.t != V_STR) return rerr(r, at, "round(precision, method): bad arguments");
        double p = pow(10, prec.u.d), x = v.u.d * p, y;
        if (str_eq(meth, vcstr("common"))) { /* Python's round(): ties to even; ints stay ints */
            if (v.t == V_INT && prec.u.d >= 0) return *out = v, RC_OK;
            y = nearbyint(x);
        }
        else if (str_eq(meth, vcstr("ceil"))) y = ceil(x);
        else if (str_eq(meth, vcstr("floor"))) y = floor(x);
        else return rerr(r, at, "round method must be 'common', 'ceil' or 'floor'");
        return *out = vnum(V_FLOAT, y / p), RC_OK;
    }
    if (IS("wordcount")) { /* len(re.findall(r"\w+", s)) */
        if (v.t != V_STR) return rerr(r, at, "cannot apply filter \"wordcount\" to type %s", type_name(v.t));
        double words = 0;
        int in = 0;
        for (size_t i = 0; i < v.n;) {
            uint32_t cp;
            i += (size_t)ms_utf8_dec(v.u.s + i, v.n - i, &cp);
            utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
            int w = cp == '_' || (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
                    (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
            if (w && !in) words++;
            in = w;
        }
        return *out = vnum(V_INT, words), RC_OK;
    }
    /* escape / e: HTML-escape the text */
    jv sv;
    MS_TRY(print_to_str(r, at, v, &sv));
    jj_buf b = new_buf(r);
    for (size_t i = 0; i < sv.n; i++) {
        char c = sv.u.s[i];
        if (c == '&') jj_buf_puts(&b, "&amp;");
        else if (c == '<') jj_buf_puts(&b, "&lt;");
        else if (c == '>') jj_buf_puts(&b, "&gt;");
        else if (c == '"') jj_buf_puts(&b, "&#34;");
        else if (c == '\'') jj_buf_puts(&b, "&#39;");
        else jj_buf_putc(&b, c);
    }
    if (buf_check(r, at, &b)) {
        jj_buf_free(&b);
        return RC_ERR;
    }
    return buf_to_str(r, at, &b, out);
#undef IS
}

/* Code-point index of byte offset off in s. */
static double cp_index(jv s, size_t off) {
    double n = 0;
    for (size_t i = 0; i < off && i < s.n;) {
        uint32_t cp;
        i += (size_t)ms_utf8_dec(s.u.s + i, s.n - i, &cp);
        n++;
    }
    return n;
}

/* Python str.find / str.count / str.rsplit / str.join (extensions: the oracle has none of them). */
static int py_str_method(R *r, const jj_node *at, int id, jv self, jv *args, size_t n, jv *out) {
    if (n > 0 && args[n - 1].t == V_KWARGS) n--;
    if (id == M_FIND || id == M_COUNT) {
        if (n < 1 || args[0].t != V_STR) return rerr(r, at, "%s() needs a string argument", id == M_FIND ? "find" : "count");
        jv sub = args[0];
        if (id == M_FIND) {
            long long p = str_find_ll(self, 0, sub);
            return *out = vnum(V_INT, p < 0 ? -1 : cp_index(self, (size_t)p)), RC_OK;
        }
        double c = 0;
        if (sub.n == 0) c = cp_index(self, self.n) + 1;
        else
            for (long long p = str_find_ll(self, 0, sub); p >= 0; p = str_find_ll(self, (size_t)p + sub.n, sub)) c++;
        return *out = vnum(V_INT, c), RC_OK;
    }
    if (id == M_JOIN) {
        if (n < 1 || (args[0].t != V_ARR && args[0].t != V_TUPLE)) return rerr(r, at, "join() needs a list");
        jj_buf b = new_buf(r);
        for (size_t i = 0; i < args[0].u.a->n; i++) {
            jv x = args[0].u.a->v[i];
            if (x.t != V_STR) {
                jj_buf_free(&b);
                return rerr(r, at, "join(): sequence item %zu is %s, not a string", i, type_name(x.t));
            }
            if (i) jj_buf_put(&b, self.u.s, self.n);
            jj_buf_put(&b, x.u.s, x.n);
        }
        if (buf_check(r, at, &b)) {
            jj_buf_free(&b);
            return RC_ERR;
        }
        return buf_to_str(r, at, &b, out);
    }
    /* rsplit(sep=None, maxsplit=-1) */
    jv sep = n > 0 ? args[0] : V(V_NULL);
    double maxsplit = n > 1 && args[1].t == V_INT ? args[1].u.d : -1;
    if (sep.t != V_STR && sep.t != V_NULL) return rerr(r, at, "rsplit() sep must be a string or none");
    if (sep.t == V_STR && sep.n == 0) return rerr(r, at, "rsplit(): empty separator");
    size_t cap = 16, cnt = 0;
    jv *parts = malloc(cap * sizeof *parts);
    if (!parts) return oom(r, at);
    size_t end = self.n;
    while (1) {
        if (cnt == cap) {
            jv *np = realloc(parts, 2 * cap * sizeof *parts);
            if (!np) {
                free(parts);
                return oom(r, at);
            }
            parts = np;
            cap *= 2;
        }
        if (sep.t == V_NULL) {
            jv rest = py_strip(vstr(self.u.s, end), 2, V(V_UNDEF));
            end = rest.n;
            if (end == 0) break;
            if (maxsplit >= 0 && (double)cnt >= maxsplit) {
                parts[cnt++] = vstr(self.u.s, end);
                break;
            }
            size_t st = end;
            while (st > 0) {
                size_t q = st - 1;
                while (q > 0 && ((unsigned char)self.u.s[q] & 0xC0) == 0x80) q--;
                uint32_t cp;
                ms_utf8_dec(self.u.s + q, st - q, &cp);
                if (jj_is_py_space(cp)) break;
                st = q;
            }
            parts[cnt++] = vstr(self.u.s + st, end - st);
            end = st;
        } else {
            long long found = -1;
            if (!(maxsplit >= 0 && (double)cnt >= maxsplit))
                for (size_t q = end >= sep.n ? end - sep.n + 1 : 0; q-- > 0;)
                    if (!memcmp(self.u.s + q, sep.u.s, sep.n)) {
                        found = (long long)q;
                        break;
                    }
            if (found < 0) {
                parts[cnt++] = vstr(self.u.s, end);
                break;
            }
            parts[cnt++] = vstr(self.u.s + found + sep.n, end - (size_t)found - sep.n);
            end = (size_t)found;
        }
    }
    jarr *a = new_arr(r, cnt);
    if (!a) {
        free(parts);
        return oom(r, at);
    }
    for (size_t i = 0; i < cnt; i++) a->v[i] = parts[cnt - 1 - i];
    free(parts);
    return *out = varr(a, V_ARR), RC_OK;
}

static int apply_filter(R *r, jenv *e, const jj_node *f, jv v, jv *out) {
    const char *name = f->s;
    size_t nl = f->slen;
    const jj_node *at = f;
#define IS(lit) (nl == sizeof(lit) - 1 && !memcmp(name, lit, nl))
    if (IS("count") || IS("d") || IS("select") || IS("reject") || IS("round") || IS("wordcount") || IS("escape") ||
        IS("e"))
        return ext_filter(r, e, f, v, out);
    if (!f->flag) { /* bare name */
        if (IS("safe")) return *out = v, RC_OK;
        if (v.t != V_STR && (IS("upper") || IS("lower") || IS("title") || IS("capitalize") || IS("trim")))
            MS_TRY(print_to_str(r, at, v, &v)); /* jinja2 converts with str() first (undefined -> "") */
        if (v.t == V_UNDEF && IS("length")) return *out = vnum(V_INT, 0), RC_OK;
        if (IS("tojson")) {
            jopts o = {-1, 0, 0, ", ", ": ", 2, 2};
            return tojson_value(r, at, v, &o, out);
        }
        if (v.t == V_ARR || v.t == V_TUPLE) {
            jarr *a = v.u.a;
            if (IS("list")) return *out = v, RC_OK;
            if (IS("first") || IS("last")) {
                if (a->n == 0) return rerr(r, at, "filter '%.*s' applied to an empty list", (int)nl, name);
                *out = IS("first") ? a->v[0] : a->v[a->n - 1];
                return RC_OK;
            }
            if (IS("length")) return *out = vnum(V_INT, (double)a->n), RC_OK;
            if (IS("reverse")) {
                jarr *b = new_arr(r, a->n);
                if (!b) return oom(r, at);
                for (size_t i = 0; i < a->n; i++) b->v[i] = a->v[a->n - 1 - i];
                return *out = varr(b, V_ARR), RC_OK;
            }
            if (IS("sort")) return sort_values(r, at, a->v, a->v, a->n, 0, 0, out);
            if (IS("join")) return join_values(r, at, v, vcstr(""), out);
            if (IS("string")) {
                jj_buf b = new_buf(r);
                int rc = to_print(r, at, v, &b);
                if (!rc) rc = buf_check(r, at, &b);
                if (rc) {
                    jj_buf_free(&b);
                    return rc;
                }
                return buf_to_str(r, at, &b, out);
            }
            if (IS("unique")) {
                MS_TRY(step(r, at, (long long)(a->n * (a->n / 64 + 1))));
                jarr *b = new_arr(r, a->n);
                if (!b) return oom(r, at);
                size_t k = 0;
                for (size_t i = 0; i < a->n; i++) {
                    int seen = 0;
                    for (size_t j = 0; j < k && !seen; j++) seen = strict_eq(b->v[j], a->v[i], 1);
                    if (!seen) b->v[k++] = a->v[i];
                }
                b->n = k;
                return *out = varr(b, V_ARR), RC_OK;
            }
            return rerr(r, at, "unknown ArrayValue filter: %.*s", (int)nl, name);
        }
        if (v.t == V_STR) {
            if (IS("length")) return *out = vnum(V_INT, (double)jj_cp_len(v.u.s, v.n)), RC_OK;
            if (IS("upper")) return map_case(r, at, v, 1, out);
            if (IS("lower")) return map_case(r, at, v, 0, out);
            if (IS("title")) return title_case(r, at, v, out);
            if (IS("capitalize")) return capitalize(r, at, v, out);
            if (IS("trim")) return *out = py_strip(v, 3, V(V_UNDEF)), RC_OK;
            if (IS("indent")) return indent_lines(r, at, v, 4, 0, 0, out);
            if (IS("join") || IS("string")) return *out = v, RC_OK;
            if (IS("int")) {
                double d = py_parse_int(v);
                return *out = vnum(V_INT, isnan(d) ? 0 : d), RC_OK;
            }
            if (IS("float")) {
                double d = js_parse_float(v);
                return *out = vnum(V_FLOAT, isnan(d) ? 0 : d), RC_OK;
            }
            return rerr(r, at, "unknown StringValue filter: %.*s", (int)nl, name);
        }
        if (v.t == V_INT || v.t == V_FLOAT) {
            if (IS("abs")) return *out = vnum(v.t, fabs(v.u.d)), RC_OK;
            if (IS("int")) return *out = vnum(V_INT, trunc(v.u.d)), RC_OK;
            if (IS("float")) return *out = vnum(V_FLOAT, v.u.d), RC_OK;
            if (IS("string")) return print_to_str(r, at, v, out);
            return rerr(r, at, "unknown NumericValue filter: %.*s", (int)nl, name);
        }
        if (v.t == V_OBJ || v.t == V_KWARGS) {
            if (IS("items")) return obj_items(r, at, v, out);
            if (IS("length")) return *out = vnum(V_INT, (double)v.u.o->n), RC_OK;
            jv m;
            MS_TRY(builtin_member(r, at, v, vstr(name, nl), &m));
            if (m.t == V_FUNC) return call_method(r, at, m.u.f->id, v, NULL, 0, out);
            if (m.t != V_UNDEF) return *out = m, RC_OK;
            return rerr(r, at, "unknown ObjectValue filter: %.*s", (int)nl, name);
        }
        if (v.t == V_BOOL) {
            if (IS("bool")) return *out = v, RC_OK;
            if (IS("int")) return *out = vnum(V_INT, v.u.b), RC_OK;
            if (IS("float")) return *out = vnum(V_FLOAT, v.u.b), RC_OK;
            if (IS("string")) return *out = vcstr(v.u.b ? "True" : "False"), RC_OK;
            return rerr(r, at, "unknown BooleanValue filter: %.*s", (int)nl, name);
        }
        return rerr(r, at, "cannot apply filter \"%.*s\" to type %s", (int)nl, name, type_name(v.t));
    }
    /* name(args) */
    jv *args;
    size_t na;
    jobj *kw;
    if (IS("selectattr") || IS("rejectattr")) {
        if (v.t == V_ARR || v.t == V_TUPLE) {
            int sel = IS("selectattr");
            for (size_t i = 0; i < v.u.a->n; i++) {
                int t = v.u.a->v[i].t;
                if (t != V_OBJ && t != V_KWARGS && t != V_NS)
                    return rerr(r, at, "`%.*s` can only be applied to an array of objects", (int)nl, name);
            }
            for (int i = 0; i < f->n; i++)
                if (f->list[i]->kind != E_STR) return rerr(r, at, "arguments of `%.*s` must be strings", (int)nl, name);
            if (f->n < 1) return rerr(r, at, "`%.*s` needs an attribute name", (int)nl, name);
            jv attr = vstr(f->list[0]->s, f->list[0]->slen);
            jarr *b = new_arr(r, v.u.a->n);
            if (!b) return oom(r, at);
            size_t k = 0;
            for (size_t i = 0; i < v.u.a->n; i++) {
                jv *a = obj_get(v.u.a->v[i].u.o, attr.u.s, attr.n);
                int res = 0;
                if (a) {
                    if (f->n >= 2) {
                        jv cmpv = f->n >= 3 ? vstr(f->list[2]->s, f->list[2]->slen) : V(V_UNDEF);
                        MS_TRY(run_test(r, at, f->list[1]->s, f->list[1]->slen, *a, f->n >= 3 ? &cmpv : NULL, &res));
                    } else {
                        res = is_truthy(*a);
                    }
                }
                if (sel ? res : !res) b->v[k++] = v.u.a->v[i];
            }
            b->n = k;
            return *out = varr(b, V_ARR), RC_OK;
        }
    }
    MS_TRY(eval_args(r, e, f->list, f->n, &args, &na, &kw));
    if (IS("tojson")) {
        jv ind = kw_get(kw, "indent"), asc = kw_get(kw, "ensure_ascii"), sk = kw_get(kw, "sort_keys"),
           seps = kw_get(kw, "separators");
        if (ind.t != V_INT && ind.t != V_UNDEF && ind.t != V_NULL) return rerr(r, at, "if set, indent must be a number");
        if (asc.t != V_BOOL && asc.t != V_UNDEF) return rerr(r, at, "if set, ensure_ascii must be a boolean");
        if (sk.t != V_BOOL && sk.t != V_UNDEF) return rerr(r, at, "if set, sort_keys must be a boolean");
        jopts o = {-1, asc.t == V_BOOL && asc.u.b, sk.t == V_BOOL && sk.u.b, NULL, NULL, 0, 0};
        if (ind.t == V_INT) {
            if (ind.u.d < 0) return rerr(r, at, "tojson indent must not be negative");
            if (ind.u.d > 64) return rerr(r, at, "tojson indent %g is too large", ind.u.d);
            o.indent = (int)ind.u.d;
        }
        if (seps.t == V_ARR || seps.t == V_TUPLE) {
            if (seps.u.a->n != 2 || seps.u.a->v[0].t != V_STR || seps.u.a->v[1].t != V_STR)
                return rerr(r, at, "separators must be a tuple of two strings");
            o.item_sep = seps.u.a->v[0].u.s;
            o.item_sep_n = seps.u.a->v[0].n;
            o.key_sep = seps.u.a->v[1].u.s;
            o.key_sep_n = seps.u.a->v[1].n;
        } else if (seps.t != V_UNDEF && seps.t != V_NULL) {
            return rerr(r, at, "if set, separators must be a tuple of two strings");
        } else if (o.indent > 0) {
            o.item_sep = ",", o.item_sep_n = 1, o.key_sep = ": ", o.key_sep_n = 2;
        } else {
            o.item_sep = ", ", o.item_sep_n = 2, o.key_sep = ": ", o.key_sep_n = 2;
        }
        return tojson_value(r, at, v, &o, out);
    }
    if (IS("join")) {
        if (v.t != V_STR && v.t != V_ARR && v.t != V_TUPLE)
            return rerr(r, at, "cannot apply filter \"join\" to type %s", type_name(v.t));
        jv sep = arg_or(args, na, 0, kw, "separator", vcstr(""));
        if (sep.t != V_STR) return rerr(r, at, "join separator must be a string");
        return join_values(r, at, v, sep, out);
    }
    if (IS("int") || IS("float")) {
        int isint = IS("int");
        jv def = arg_or(args, na, 0, kw, "default", vnum(isint ? V_INT : V_FLOAT, 0));
        if (v.t == V_STR) {
            double d = isint ? py_parse_int(v) : js_parse_float(v);
            return *out = isnan(d) ? def : vnum(isint ? V_INT : V_FLOAT, d), RC_OK;
        }
        if (v.t == V_INT || v.t == V_FLOAT) return *out = vnum(isint ? V_INT : V_FLOAT, isint ? trunc(v.u.d) : v.u.d), RC_OK;
        if (v.t == V_BOOL) return *out = vnum(isint ? V_INT : V_FLOAT, v.u.b), RC_OK;
        return rerr(r, at, "cannot apply filter \"%.*s\" to type %s", (int)nl, name, type_name(v.t));
    }
    if (IS("default")) {
        jv def = na > 0 ? args[0] : vcstr("");
        jv boolean = arg_or(args, na, 1, kw, "boolean", vbool(0));
        if (boolean.t != V_BOOL) return rerr(r, at, "`default` filter flag must be a boolean");
        if (v.t == V_UNDEF || (boolean.u.b && !is_truthy(v))) return *out = def, RC_OK;
        return *out = v, RC_OK;
    }
    if (v.t == V_ARR || v.t == V_TUPLE) {
        jarr *a = v.u.a;
        if (IS("sort")) {
            jv rev = arg_or(args, na, 0, kw, "reverse", vbool(0));
            jv cs = arg_or(args, na, 1, kw, "case_sensitive", vbool(0));
            jv attr = arg_or(args, na, 2, kw, "attribute", V(V_NULL));
            if (rev.t != V_BOOL) return rerr(r, at, "reverse must be a boolean");
            if (cs.t != V_BOOL) return rerr(r, at, "case_sensitive must be a boolean");
            if (attr.t != V_STR && attr.t != V_INT && attr.t != V_NULL)
                return rerr(r, at, "attribute must be a string, integer, or null");
            jv *keys = ralloc(r, (a->n + 1) * sizeof(jv));
            if (!keys) return oom(r, at);
            char tmp[40];
            jv path = attr;
            if (attr.t == V_INT) {
                snprintf(tmp, sizeof tmp, "%.0f", attr.u.d);
                path = vcstr(tmp);
            }
            for (size_t i = 0; i < a->n; i++) keys[i] = attr.t == V_NULL ? a->v[i] : attr_path(a->v[i], path.u.s, path.n);
            return sort_values(r, at, a->v, keys, a->n, cs.u.b, rev.u.b, out);
        }
        if (IS("map")) {
            jv *attrp = kw ? obj_get(kw, "attribute", 9) : NULL;
            if (!attrp) return rerr(r, at, "`map` expressions without `attribute` set are not supported");
            if (attrp->t != V_STR) return rerr(r, at, "attribute must be a string");
            jv *defp = obj_get(kw, "default", 7);
            jarr *b = new_arr(r, a->n);
            if (!b) return oom(r, at);
            for (size_t i = 0; i < a->n; i++) {
                jv it = a->v[i];
                if (it.t != V_OBJ && it.t != V_KWARGS && it.t != V_NS) return rerr(r, at, "items in map must be objects");
                jv x = attr_path(it, attrp->u.s, attrp->n);
                b->v[i] = x.t == V_UNDEF ? (defp ? *defp : V(V_UNDEF)) : x;
            }
            return *out = varr(b, V_ARR), RC_OK;
        }
        return rerr(r, at, "unknown ArrayValue filter: %.*s", (int)nl, name);
    }
    if (v.t == V_STR) {
        if (IS("indent")) {
            jv w = arg_or(args, na, 0, kw, "width", vnum(V_INT, 4));
            if (w.t != V_INT) return rerr(r, at, "width must be a number");
            if (w.u.d > 4096) return rerr(r, at, "indent width %g is too large", w.u.d);
            jv first = arg_or(args, na, 1, kw, "first", vbool(0));
            jv blank = arg_or(args, na, 2, kw, "blank", vbool(0));
            return indent_lines(r, at, v, (long)w.u.d, is_truthy(first), is_truthy(blank), out);
        }
        if (IS("replace")) {
            jv *all = ralloc(r, (na + 1) * sizeof(jv));
            if (!all) return oom(r, at);
            if (na) memcpy(all, args, na * sizeof(jv));
            all[na] = vobj(kw, V_KWARGS);
            return call_method(r, at, M_REPLACE, v, all, na + 1, out);
        }
        return rerr(r, at, "unknown StringValue filter: %.*s", (int)nl, name);
    }
    if (v.t == V_OBJ || v.t == V_KWARGS) {
        jv m;
        MS_TRY(builtin_member(r, at, v, vstr(name, nl), &m));
        if (m.t == V_FUNC) {
            jv *all = ralloc(r, (na + 1) * sizeof(jv));
            if (!all) return oom(r, at);
            if (na) memcpy(all, args, na * sizeof(jv));
            size_t nall = na;
            if (kw->n) all[nall++] = vobj(kw, V_KWARGS);
            return call_method(r, at, m.u.f->id, v, all, nall, out);
        }
        return rerr(r, at, "unknown ObjectValue filter: %.*s", (int)nl, name);
    }
    return rerr(r, at, "cannot apply filter \"%.*s\" to type %s", (int)nl, name, type_name(v.t));
#undef IS
}

/* ---- methods and built-in functions --------------------------------------------------------- */

static long long str_find_ll(jv hay, size_t from, jv needle) {
    if (needle.n == 0) return (long long)from;
    if (hay.n < needle.n) return -1;
    const char *p = memmem(hay.u.s + from, hay.n - from, needle.u.s, needle.n);
    return p ? (long long)(p - hay.u.s) : -1;
}

static int prefix_test(R *r, const jj_node *at, jv self, jv *args, size_t n, int ends, jv *out) {
    if (n == 0) return rerr(r, at, "%s() requires at least one argument", ends ? "endswith" : "startswith");
    jv p = args[0];
    if (p.t == V_STR) {
        int ok = p.n <= self.n && !memcmp(ends ? self.u.s + self.n - p.n : self.u.s, p.u.s, p.n);
        return *out = vbool(ok), RC_OK;
    }
    if (p.t == V_ARR || p.t == V_TUPLE) {
        for (size_t i = 0; i < p.u.a->n; i++) {
            jv x = p.u.a->v[i];
            if (x.t != V_STR) return rerr(r, at, "%s() tuple elements must be strings", ends ? "endswith" : "startswith");
            if (x.n <= self.n && !memcmp(ends ? self.u.s + self.n - x.n : self.u.s, x.u.s, x.n)) return *out = vbool(1), RC_OK;
        }
        return *out = vbool(0), RC_OK;
    }
    return rerr(r, at, "%s() argument must be a string or tuple of strings", ends ? "endswith" : "startswith");
}

static int split_str(R *r, const jj_node *at, jv self, jv *args, size_t n, jv *out) {
    jv sep = n > 0 ? args[0] : V(V_NULL);
    if (sep.t != V_STR && sep.t != V_NULL) return rerr(r, at, "split() sep argument must be a string or null");
    jv maxs = n > 1 ? args[1] : vnum(V_INT, -1);
    if (maxs.t != V_INT) return rerr(r, at, "split() maxsplit argument must be a number");
    double maxsplit = maxs.u.d;
    size_t cap = 16, cnt = 0;
    jv *parts = malloc(cap * sizeof *parts);
    if (!parts) return oom(r, at);
#define PUSH(val)                                                                                  \
    do {                                                                                          \
        if (cnt == cap) {                                                                         \
            cap *= 2;                                                                             \
            jv *np_ = realloc(parts, cap * sizeof *parts);                                        \
            if (!np_) {                                                                           \
                free(parts);                                                                      \
                return oom(r, at);                                                                \
            }                                                                                     \
            parts = np_;                                                                          \
        }                                                                                         \
        parts[cnt++] = (val);                                                                     \
    } while (0)
    if (sep.t == V_NULL) {
        jv text = py_strip(self, 1, V(V_UNDEF));
        size_t i = 0;
        while (i < text.n) {
            uint32_t cp;
            int l = ms_utf8_dec(text.u.s + i, text.n - i, &cp);
            if (jj_is_py_space(cp)) {
                i += (size_t)l;
                continue;
            }
            size_t st = i;
            while (i < text.n) {
                l = ms_utf8_dec(text.u.s + i, text.n - i, &cp);
                if (jj_is_py_space(cp)) break;
                i += (size_t)l;
            }
            if (maxsplit != -1 && (double)cnt >= maxsplit) {
                PUSH(vstr(text.u.s + st, text.n - st));
                break;
            }
            PUSH(vstr(text.u.s + st, i - st));
        }
    } else {
        if (sep.n == 0) {
            free(parts);
            return rerr(r, at, "split(): empty separator");
        }
        size_t st = 0;
        while (1) {
            long long p = str_find_ll(self, st, sep);
            if (p < 0) {
                PUSH(vstr(self.u.s + st, self.n - st));
                break;
            }
            PUSH(vstr(self.u.s + st, (size_t)p - st));
            st = (size_t)p + sep.n;
        }
        if (maxsplit != -1 && (double)cnt > maxsplit) {
            /* result.push(result.splice(maxsplit).join(sep)) */
            long long k = (long long)maxsplit;
            if (k < 0) k = (long long)cnt + k > 0 ? (long long)cnt + k : 0;
            size_t from = (size_t)k;
            const char *start = parts[from].u.s;
            const char *end = parts[cnt - 1].u.s + parts[cnt - 1].n;
            cnt = from;
            PUSH(vstr(start, (size_t)(end - start)));
        }
    }
#undef PUSH
    jarr *a = new_arr(r, cnt);
    if (!a) {
        free(parts);
        return oom(r, at);
    }
    if (cnt) memcpy(a->v, parts, cnt * sizeof(jv));
    free(parts);
    return *out = varr(a, V_ARR), RC_OK;
}

static int replace_str(R *r, const jj_node *at, jv self, jv *args, size_t n, jv *out) {
    if (n < 2) return rerr(r, at, "replace() requires at least two arguments");
    jv o = args[0], nw = args[1];
    if (o.t != V_STR || nw.t != V_STR) return rerr(r, at, "replace() arguments must be strings");
    jv count = V(V_NULL);
    if (n > 2) {
        if (args[2].t == V_KWARGS) {
            jv *c = obj_get(args[2].u.o, "count", 5);
            count = c ? *c : V(V_NULL);
        } else {
            count = args[2];
        }
    }
    if (count.t != V_INT && count.t != V_NULL) return rerr(r, at, "replace() count argument must be a number or null");
    if (count.t == V_INT && count.u.d == 0) return *out = self, RC_OK;
    double remaining = count.t == V_NULL || count.u.d < 0 ? INFINITY : count.u.d;
    jj_buf b = new_buf(r);
    if (o.n == 0) {
        /* (?=) with the u flag: every code point boundary, start and end included */
        size_t i = 0;
        while (1) {
            if (remaining > 0) {
                jj_buf_put(&b, nw.u.s, nw.n);
                remaining--;
            }
            if (i >= self.n) break;
            uint32_t cp;
            int l = ms_utf8_dec(self.u.s + i, self.n - i, &cp);
            jj_buf_put(&b, self.u.s + i, (size_t)l);
            i += (size_t)l;
        }
    } else {
        size_t st = 0;
        while (1) {
            long long p = remaining > 0 ? str_find_ll(self, st, o) : -1;
            if (p < 0) {
                jj_buf_put(&b, self.u.s + st, self.n - st);
                break;
            }
            jj_buf_put(&b, self.u.s + st, (size_t)p - st);
            jj_buf_put(&b, nw.u.s, nw.n);
            remaining--;
            st = (size_t)p + o.n;
        }
    }
    if (buf_check(r, at, &b)) {
        jj_buf_free(&b);
        return RC_ERR;
    }
    return buf_to_str(r, at, &b, out);
}

static int call_method(R *r, const jj_node *at, int id, jv self, jv *args, size_t n, jv *out) {
    switch (id) {
    case M_UPPER: return map_case(r, at, self, 1, out);
    case M_LOWER: return map_case(r, at, self, 0, out);
    case M_STRIP: case M_LSTRIP: case M_RSTRIP: {
        jv chars = n > 0 ? args[0] : V(V_UNDEF);
        if (chars.t != V_STR && chars.t != V_NULL && chars.t != V_UNDEF) return rerr(r, at, "strip arg must be None or str");
        return *out = py_strip(self, id == M_STRIP ? 3 : id == M_LSTRIP ? 1 : 2, chars), RC_OK;
    }
    case M_TITLE: return title_case(r, at, self, out);
    case M_CAPITALIZE: return capitalize(r, at, self, out);
    case M_STARTSWITH: return prefix_test(r, at, self, args, n, 0, out);
    case M_ENDSWITH: return prefix_test(r, at, self, args, n, 1, out);
    case M_SPLIT: return split_str(r, at, self, args, n, out);
    case M_REPLACE: return replace_str(r, at, self, args, n, out);
    case M_GET: {
        if (n < 1 || args[0].t != V_STR) return rerr(r, at, "object key must be a string");
        jv *p = obj_get(self.u.o, args[0].u.s, args[0].n);
        *out = p ? *p : n > 1 ? args[1] : V(V_NULL);
        return RC_OK;
    }
    case M_ITEMS: return obj_items(r, at, self, out);
    case M_KEYS: case M_VALUES: {
        jarr *a = new_arr(r, self.u.o->n);
        if (!a) return oom(r, at);
        for (size_t i = 0; i < self.u.o->n; i++)
            a->v[i] = id == M_KEYS ? vstr(self.u.o->k[i].s, self.u.o->k[i].n) : self.u.o->v[i];
        return *out = varr(a, V_ARR), RC_OK;
    }
    case M_FIND: case M_COUNT: case M_RSPLIT: case M_JOIN: return py_str_method(r, at, id, self, args, n, out);
    case M_DICTSORT: {
        jobj *kw = NULL;
        jv pos[3];
        size_t np = 0;
        for (size_t i = 0; i < n; i++) {
            if (args[i].t == V_KWARGS) kw = args[i].u.o;
            else if (np < 3) pos[np++] = args[i];
        }
        jv cs = arg_or(pos, np, 0, kw, "case_sensitive", vbool(0));
        jv by = arg_or(pos, np, 1, kw, "by", vcstr("key"));
        jv rev = arg_or(pos, np, 2, kw, "reverse", vbool(0));
        if (cs.t != V_BOOL) return rerr(r, at, "case_sensitive must be a boolean");
        if (by.t != V_STR) return rerr(r, at, "by must be a string");
        int byval;
        if (str_eq(by, vcstr("key"))) byval = 0;
        else if (str_eq(by, vcstr("value"))) byval = 1;
        else return rerr(r, at, "by must be either 'key' or 'value'");
        if (rev.t != V_BOOL) return rerr(r, at, "reverse must be a boolean");
        jv items;
        MS_TRY(obj_items(r, at, self, &items));
        jv *keys = ralloc(r, (items.u.a->n + 1) * sizeof(jv));
        if (!keys) return oom(r, at);
        for (size_t i = 0; i < items.u.a->n; i++) keys[i] = items.u.a->v[i].u.a->v[byval];
        return sort_values(r, at, items.u.a->v, keys, items.u.a->n, cs.u.b, rev.u.b, out);
    }
    default:
        return rerr(r, at, "internal error: unknown method");
    }
}

static const char *const k_months[] = {"January", "February", "March", "April", "May", "June", "July",
                                       "August", "September", "October", "November", "December"};

static int strftime_now(R *r, const jj_node *at, jv fmt, jv *out) {
    if (fmt.t != V_STR) return rerr(r, at, "strftime_now() needs a format string");
    time_t now = time(NULL);
    struct tm tmv;
    localtime_r(&now, &tmv);
    jj_buf b = new_buf(r);
    for (size_t i = 0; i < fmt.n; i++) {
        char c = fmt.u.s[i];
        if (c == '%' && i + 1 < fmt.n && strchr("YmdbBHM%", fmt.u.s[i + 1])) {
            char tmp[32];
            switch (fmt.u.s[++i]) {
            case 'Y': snprintf(tmp, sizeof tmp, "%d", tmv.tm_year + 1900); break;
            case 'm': snprintf(tmp, sizeof tmp, "%02d", tmv.tm_mon + 1); break;
            case 'd': snprintf(tmp, sizeof tmp, "%02d", tmv.tm_mday); break;
            case 'b': snprintf(tmp, sizeof tmp, "%.3s", k_months[tmv.tm_mon]); break;
            case 'B': snprintf(tmp, sizeof tmp, "%s", k_months[tmv.tm_mon]); break;
            case 'H': snprintf(tmp, sizeof tmp, "%02d", tmv.tm_hour); break;
            case 'M': snprintf(tmp, sizeof tmp, "%02d", tmv.tm_min); break;
            default: snprintf(tmp, sizeof tmp, "%%"); break;
            }
            jj_buf_puts(&b, tmp);
        } else {
            jj_buf_putc(&b, c);
        }
    }
    if (buf_check(r, at, &b)) {
        jj_buf_free(&b);
        return RC_ERR;
    }
    return buf_to_str(r, at, &b, out);
}

static int call_builtin(R *r, const jj_node *at, int id, jv *args, size_t n, jv *out) {
    switch (id) {
    case B_RAISE: {
        jv msg = V(V_UNDEF);
        if (n > 0) msg = args[0];
        jj_buf b = new_buf(r);
        if (msg.t != V_UNDEF) {
            if (to_print(r, at, msg, &b)) jj_buf_puts(&b, "?");
        }
        ms_errf(r->err, MS_ERR_INVALID, "chat template line %d: raise_exception: %s", at ? at->line : 0, b.p ? b.p : "");
        jj_buf_free(&b);
        return RC_ERR;
    }
    case B_RANGE: {
        double v[3] = {0, 0, 1};
        size_t np = n;
        for (size_t i = 0; i < n && i < 3; i++) {
            if (args[i].t == V_BOOL) v[i] = args[i].u.b;
            else if (args[i].t == V_INT || args[i].t == V_FLOAT) v[i] = args[i].u.d;
            else return rerr(r, at, "range() arguments must be numbers, got %s", type_name(args[i].t));
        }
        if (np == 0) return rerr(r, at, "range() needs at least one argument");
        double start = v[0], stop = v[1], stp = v[2];
        if (np == 1) stop = start, start = 0;
        if (stp == 0) return rerr(r, at, "range() step must not be zero");
        double cntd = stp > 0 ? ceil((stop - start) / stp) : ceil((start - stop) / -stp);
        if (!(cntd > 0)) cntd = 0;
        if (cntd > (double)r->lim->max_steps) cntd = (double)r->lim->max_steps + 1;
        MS_TRY(step(r, at, (long long)cntd));
        jarr *a = new_arr(r, (size_t)cntd + 2); /* float steps may add one element (0.1 sums) */
        if (!a) return oom(r, at);
        size_t k = 0;
        for (double i = start; (stp > 0 ? i < stop : i > stop) && k < a->n; i += stp)
            a->v[k++] = vnum(i == floor(i) ? V_INT : V_FLOAT, i);
        a->n = k;
        return *out = varr(a, V_ARR), RC_OK;
    }
    case B_STRFTIME: return strftime_now(r, at, n > 0 ? args[0] : V(V_UNDEF), out);
    case B_NAMESPACE: {
        size_t np = n;
        jobj *kw = NULL;
        if (np > 0 && args[np - 1].t == V_KWARGS) kw = args[--np].u.o;
        if (np > 1) return rerr(r, at, "namespace expected at most 1 argument, got %zu", np);
        jobj *o = new_obj(r, 0);
        if (!o) return oom(r, at);
        if (np == 1) {
            jv src = args[0];
            if (src.t == V_OBJ || src.t == V_KWARGS) {
                for (size_t i = 0; i < src.u.o->n; i++)
                    if (obj_set(r, o, src.u.o->k[i].s, src.u.o->k[i].n, src.u.o->v[i])) return oom(r, at);
            } else if (src.t == V_ARR || src.t == V_TUPLE) {
                for (size_t i = 0; i < src.u.a->n; i++) {
                    jv pair = src.u.a->v[i];
                    if ((pair.t != V_ARR && pair.t != V_TUPLE) || pair.u.a->n != 2 || pair.u.a->v[0].t != V_STR)
                        return rerr(r, at, "namespace expected an object or an iterable of [key, value] pairs");
                    if (obj_set(r, o, pair.u.a->v[0].u.s, pair.u.a->v[0].n, pair.u.a->v[1])) return oom(r, at);
                }
            } else {
                return rerr(r, at, "'%s' object is not iterable", type_name(src.t));
            }
        }
        if (kw)
            for (size_t i = 0; i < kw->n; i++)
                if (obj_set(r, o, kw->k[i].s, kw->k[i].n, kw->v[i])) return oom(r, at);
        return *out = vobj(o, V_NS), RC_OK;
    }
    default:
        return rerr(r, at, "internal error: unknown builtin");
    }
}

/* Binds macro (or call-block) parameters in scope, as the oracle does: all names first, then
 * defaults evaluated in order inside the new scope. */
static int bind_params(R *r, const jj_node *at, jj_node *const *params, int np, int special, jv *args, size_t n,
                       jenv *scope, const char *what) {
    jobj *kw = new_obj(r, 0);
    if (!kw) return oom(r, at);
    size_t npos = n;
    if (npos > 0 && args[npos - 1].t == V_KWARGS) {
        jobj *src = args[--npos].u.o;
        for (size_t i = 0; i < src->n; i++)
            if (obj_set(r, kw, src->k[i].s, src->k[i].n, src->v[i])) return oom(r, at);
    }
    unsigned char pend[256] = {0};
    if (np > 256) return rerr(r, at, "too many parameters");
    for (int i = 0; i < np; i++) {
        const jj_node *p = params[i];
        jv val = V(V_UNDEF);
        int have = 0;
        if ((size_t)i < npos) {
            val = args[i];
            have = 1;
        } else {
            for (size_t j = 0; j < kw->n; j++)
                if (kw->k[j].n == p->slen && !memcmp(kw->k[j].s, p->s, p->slen)) {
                    val = kw->v[j];
                    have = 1;
                    memmove(&kw->k[j], &kw->k[j + 1], (kw->n - j - 1) * sizeof(jkey));
                    memmove(&kw->v[j], &kw->v[j + 1], (kw->n - j - 1) * sizeof(jv));
                    kw->n--;
                    break;
                }
        }
        if (!have && p->kind == E_KWARG) pend[i] = 1;
        if (env_set(r, scope, p->s, p->slen, val)) return oom(r, at);
    }
    if (special & 1) {
        if (env_set(r, scope, "kwargs", 6, vobj(kw, V_OBJ))) return oom(r, at);
    } else if (kw->n) {
        return rerr(r, at, "macro %s takes no keyword argument '%.*s'", what, (int)kw->k[0].n, kw->k[0].s);
    }
    if (special & 2) {
        size_t extra = npos > (size_t)np ? npos - (size_t)np : 0;
        jarr *a = new_arr(r, extra);
        if (!a) return oom(r, at);
        for (size_t i = 0; i < extra; i++) a->v[i] = args[(size_t)np + i];
        if (env_set(r, scope, "varargs", 7, varr(a, V_ARR))) return oom(r, at);
    } else if (npos > (size_t)np) {
        return rerr(r, at, "macro %s takes not more than %d argument(s)", what, np);
    }
    for (int i = 0; i < np; i++) {
        if (!pend[i]) continue;
        jv val;
        MS_TRY(eval(r, scope, params[i]->a, &val));
        if (env_set(r, scope, params[i]->s, params[i]->slen, val)) return oom(r, at);
    }
    return RC_OK;
}

static int call_fn(R *r, const jj_node *at, jv fn, jv *args, size_t nargs, jenv *callenv, jv *out) {
    if (fn.t != V_FUNC) return rerr(r, at, "cannot call something that is not a function: got %s", type_name(fn.t));
    const jfn *f = fn.u.f;
    if (f->kind == F_BUILTIN) return call_builtin(r, at, f->id, args, nargs, out);
    if (f->kind == F_METHOD) return call_method(r, at, f->id, f->self, args, nargs, out);
    /* macro or call-block body */
    const jj_node *m = f->node;
    if (r->depth >= r->lim->max_depth) {
        rerr(r, at, "macro calls nested deeper than %d (runaway recursion?)", r->lim->max_depth);
        r->err->code = MS_ERR_NOMEM;
        return RC_ERR;
    }
    MS_TRY(step(r, at, 1));
    jenv *scope = new_env(r, f->kind == F_MACRO ? callenv : f->env);
    if (!scope) return oom(r, at);
    char what[80];
    if (f->kind == F_MACRO) snprintf(what, sizeof what, "'%.*s'", (int)(m->slen < 60 ? m->slen : 60), m->s);
    else snprintf(what, sizeof what, "None");
    MS_TRY(bind_params(r, at, m->list2, m->n2, m->flag2, args, nargs, scope, what));
    r->depth++;
    jj_buf b = new_buf(r);
    int rc = exec_block(r, scope, m->list, m->n, &b);
    r->depth--;
    if (!rc) rc = buf_check(r, at, &b);
    if (rc) {
        jj_buf_free(&b);
        return rc;
    }
    return buf_to_str(r, at, &b, out);
}

static int eval_binary(R *r, jenv *e, const jj_node *x, jv *out) {
    jv a, b;
    MS_TRY(eval(r, e, x->a, &a));
    int op = x->op;
    if (op == OP_AND) return is_truthy(a) ? eval(r, e, x->b, out) : (*out = a, RC_OK);
    if (op == OP_OR) return is_truthy(a) ? (*out = a, RC_OK) : eval(r, e, x->b, out);
    MS_TRY(eval(r, e, x->b, &b));
    if (op == OP_EQ || op == OP_NE) {
        int eq = py_eq(a, b, 0);
        *out = vbool(op == OP_EQ ? eq : !eq);
        return RC_OK;
    }
    static const char *opn[] = {"or", "and", "not", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "+", "-",
                                "~", "*", "/", "//", "%", "**", "-", "+"};
    if (op == OP_IN || op == OP_NOTIN) {
        /* Python's `in`: undefined is an empty iterable; lists compare with ==; dict keys are strings */
        int found = 0;
        if (b.t == V_UNDEF) found = 0;
        else if (b.t == V_ARR || b.t == V_TUPLE) {
            for (size_t i = 0; i < b.u.a->n && !found; i++) found = py_eq(b.u.a->v[i], a, 0);
        } else if (b.t == V_STR) {
            if (a.t != V_STR) return rerr(r, x, "'in <string>' requires a string as left operand, not %s", type_name(a.t));
            found = str_find_ll(b, 0, a) >= 0;
        } else if (b.t == V_OBJ || b.t == V_KWARGS || b.t == V_NS) {
            found = a.t == V_STR && obj_get(b.u.o, a.u.s, a.n) != NULL;
        } else return rerr(r, x, "argument of type %s is not iterable", type_name(b.t));
        return *out = vbool(op == OP_IN ? found : !found), RC_OK;
    }
    if (op == OP_CONCAT) { /* str(a) + str(b): undefined is "", none is "None" */
        jj_buf t = new_buf(r);
        int rc = to_print(r, x, a, &t);
        if (!rc) rc = to_print(r, x, b, &t);
        if (!rc) rc = buf_check(r, x, &t);
        if (rc) {
            jj_buf_free(&t);
            return rc;
        }
        return buf_to_str(r, x, &t, out);
    }
    if (a.t == V_UNDEF || b.t == V_UNDEF) return rerr(r, x, "cannot perform operation %s on undefined values", opn[op]);
    if (a.t == V_NULL || b.t == V_NULL) return rerr(r, x, "cannot perform operation %s on null values", opn[op]);
    int na = a.t == V_INT || a.t == V_FLOAT, nb = b.t == V_INT || b.t == V_FLOAT;
    if (op == OP_POW && (na || a.t == V_BOOL) && (nb || b.t == V_BOOL)) {
        double p = a.t == V_BOOL ? a.u.b : a.u.d, q = b.t == V_BOOL ? b.u.b : b.u.d;
        if (p == 0 && q < 0) return rerr(r, x, "0.0 cannot be raised to a negative power");
        double res = pow(p, q);
        if (!isfinite(res)) return rerr(r, x, "exponentiation result is not a finite real number");
        *out = vnum(a.t == V_FLOAT || b.t == V_FLOAT || q < 0 ? V_FLOAT : V_INT, res);
        return RC_OK;
    }
    if (na && nb) {
        double p = a.u.d, q = b.u.d;
        int fl = a.t == V_FLOAT || b.t == V_FLOAT;
        switch (op) {
        case OP_ADD: return *out = vnum(fl ? V_FLOAT : V_INT, p + q), RC_OK;
        case OP_SUB: return *out = vnum(fl ? V_FLOAT : V_INT, p - q), RC_OK;
        case OP_MUL: return *out = vnum(fl ? V_FLOAT : V_INT, p * q), RC_OK;
        case OP_DIV: case OP_FLOORDIV: case OP_MOD: {
            if (q == 0) return rerr(r, x, "division by zero");
            if (op == OP_DIV) return *out = vnum(V_FLOAT, p / q), RC_OK;
            if (op == OP_FLOORDIV) return *out = vnum(fl ? V_FLOAT : V_INT, floor(p / q)), RC_OK;
            double m = fmod(p, q); /* Python: the result takes the divisor's sign */
            if (m != 0 && (m < 0) != (q < 0)) m += q;
            return *out = vnum(fl ? V_FLOAT : V_INT, m), RC_OK;
        }
        case OP_LT: return *out = vbool(p < q), RC_OK;
        case OP_GT: return *out = vbool(p > q), RC_OK;
        case OP_GE: return *out = vbool(p >= q), RC_OK;
        case OP_LE: return *out = vbool(p <= q), RC_OK;
        default: break;
        }
    } else if ((a.t == V_ARR || a.t == V_TUPLE) && (b.t == V_ARR || b.t == V_TUPLE)) {
        if (op == OP_ADD) {
            jarr *c = new_arr(r, a.u.a->n + b.u.a->n);
            if (!c) return oom(r, x);
            if (a.u.a->n) memcpy(c->v, a.u.a->v, a.u.a->n * sizeof(jv));
            if (b.u.a->n) memcpy(c->v + a.u.a->n, b.u.a->v, b.u.a->n * sizeof(jv));
            return *out = varr(c, V_ARR), RC_OK;
        }
    }
    if (a.t == V_STR && b.t == V_STR && op == OP_ADD) {
        jj_buf t = new_buf(r);
        int rc = to_print(r, x, a, &t);
        if (!rc) rc = to_print(r, x, b, &t);
        if (!rc) rc = buf_check(r, x, &t);
        if (rc) {
            jj_buf_free(&t);
            return rc;
        }
        return buf_to_str(r, x, &t, out);
    }
    return rerr(r, x, "unknown operator \"%s\" between %s and %s", opn[op], type_name(a.t), type_name(b.t));
}

static int eval_inner(R *r, jenv *e, const jj_node *x, jv *out);

static int eval(R *r, jenv *e, const jj_node *x, jv *out) {
    if (++r->nest > MAX_EVAL_NEST) {
        r->nest--;
        rerr(r, x, "template evaluation nested deeper than %d levels", MAX_EVAL_NEST);
        r->err->code = MS_ERR_NOMEM;
        return RC_ERR;
    }
    int rc = eval_inner(r, e, x, out);
    r->nest--;
    return rc;
}

static int eval_inner(R *r, jenv *e, const jj_node *x, jv *out) {
    switch (x->kind) {
    case E_INT: return *out = vnum(V_INT, x->num), RC_OK;
    case E_FLOAT: return *out = vnum(V_FLOAT, x->num), RC_OK;
    case E_STR: return *out = vstr(x->s, x->slen), RC_OK;
    case E_IDENT:
        *out = env_get(e, x->s, x->slen);
        return out->t == V_LOOP ? materialize_loop(r, x, *out, out) : RC_OK;
    case E_ARRAY: case E_TUPLE: {
        jarr *a = new_arr(r, (size_t)x->n);
        if (!a) return oom(r, x);
        for (int i = 0; i < x->n; i++) MS_TRY(eval(r, e, x->list[i], &a->v[i]));
        return *out = varr(a, x->kind == E_TUPLE ? V_TUPLE : V_ARR), RC_OK;
    }
    case E_OBJECT: {
        jobj *o = new_obj(r, (size_t)x->n);
        if (!o) return oom(r, x);
        for (int i = 0; i < x->n; i++) {
            jv k, v;
            MS_TRY(eval(r, e, x->list[i], &k));
            if (k.t != V_STR) return rerr(r, x, "object keys must be strings: got %s", type_name(k.t));
            MS_TRY(eval(r, e, x->list2[i], &v));
            if (obj_set(r, o, k.u.s, k.n, v)) return oom(r, x);
        }
        return *out = vobj(o, V_OBJ), RC_OK;
    }
    case E_MEMBER: return eval_member(r, e, x, out);
    case E_CALL: {
        jv *args, fn;
        size_t n;
        jobj *kw;
        MS_TRY(eval_args(r, e, x->list, x->n, &args, &n, &kw));
        if (kw->n) args[n++] = vobj(kw, V_KWARGS); /* eval_args leaves one spare slot */
        MS_TRY(eval(r, e, x->a, &fn));
        return call_fn(r, x, fn, args, n, e, out);
    }
    case E_BINARY: return eval_binary(r, e, x, out);
    case E_UNARY: {
        jv a;
        MS_TRY(eval(r, e, x->a, &a));
        if (x->op == OP_NOT) return *out = vbool(!is_truthy(a)), RC_OK;
        double sign = x->op == OP_NEG ? -1 : 1;
        if (a.t == V_INT || a.t == V_FLOAT) return *out = vnum(a.t, sign * a.u.d), RC_OK;
        if (a.t == V_BOOL) return *out = vnum(V_INT, sign * a.u.b), RC_OK;
        return rerr(r, x, "unknown operator \"%c\" for %s", x->op == OP_NEG ? '-' : '+', type_name(a.t));
    }
    case E_FILTER: {
        jv a;
        MS_TRY(eval(r, e, x->a, &a));
        return apply_filter(r, e, x, a, out);
    }
    case E_TEST: {
        jv a;
        int res;
        MS_TRY(eval(r, e, x->a, &a));
        MS_TRY(run_test(r, x, x->s, x->slen, a, NULL, &res));
        return *out = vbool(x->flag ? !res : res), RC_OK;
    }
    case E_SELECT: {
        jv t;
        MS_TRY(eval(r, e, x->b, &t));
        if (!is_truthy(t)) return *out = V(V_UNDEF), RC_OK;
        return eval(r, e, x->a, out);
    }
    case E_TERNARY: {
        jv t;
        MS_TRY(eval(r, e, x->a, &t));
        return eval(r, e, is_truthy(t) ? x->b : x->c, out);
    }
    default:
        return rerr(r, x, "unsupported expression here");
    }
}

/* ---- statements ----------------------------------------------------------------------------- */

static int bind_target(R *r, const jj_node *at, jenv *e, const jj_node *target, jv v, int in_for) {
    if (target->kind == E_IDENT) return env_set(r, e, target->s, target->slen, v) ? oom(r, at) : RC_OK;
    /* tuple */
    if (in_for ? v.t != V_ARR : (v.t != V_ARR && v.t != V_TUPLE))
        return rerr(r, at, "cannot unpack non-iterable type %s", type_name(v.t));
    if ((size_t)target->n != v.u.a->n)
        return rerr(r, at, "too %s items to unpack", (size_t)target->n > v.u.a->n ? "few" : "many");
    for (int i = 0; i < target->n; i++) {
        const jj_node *t = target->list[i];
        if (t->kind != E_IDENT) return rerr(r, at, "cannot unpack to a non-identifier");
        if (env_set(r, e, t->s, t->slen, v.u.a->v[i])) return oom(r, at);
    }
    return RC_OK;
}


static int exec_for(R *r, jenv *env, const jj_node *x, jj_buf *out) {
    jenv *scope = new_env(r, env);
    if (!scope) return oom(r, x);
    const jj_node *it = x->b, *test = NULL;
    if (it->kind == E_SELECT) {
        test = it->b;
        it = it->a;
    }
    jv iter;
    MS_TRY(eval(r, scope, it, &iter));
    if (iter.t == V_OBJ || iter.t == V_KWARGS) {
        jarr *k = new_arr(r, iter.u.o->n);
        if (!k) return oom(r, x);
        for (size_t i = 0; i < iter.u.o->n; i++) k->v[i] = vstr(iter.u.o->k[i].s, iter.u.o->k[i].n);
        iter = varr(k, V_ARR);
    } else if (iter.t == V_UNDEF) { /* jinja2's Undefined iterates as empty */
        jarr *k = new_arr(r, 0);
        if (!k) return oom(r, x);
        iter = varr(k, V_ARR);
    } else if (iter.t == V_STR) { /* a str iterates over its characters */
        jarr *k = new_arr(r, jj_cp_len(iter.u.s, iter.n));
        if (!k) return oom(r, x);
        for (size_t i = 0, q = 0; i < iter.n; q++) {
            uint32_t cp;
            int l = ms_utf8_dec(iter.u.s + i, iter.n - i, &cp);
            k->v[q] = vstr(iter.u.s + i, (size_t)l);
            i += (size_t)l;
        }
        iter = varr(k, V_ARR);
    } else if (iter.t != V_ARR && iter.t != V_TUPLE) {
        return rerr(r, x, "expected an iterable or object in the for loop, got %s", type_name(iter.t));
    }
    jarr *items = iter.u.a;
    if (test) {
        jarr *kept = new_arr(r, items->n);
        if (!kept) return oom(r, x);
        size_t k = 0;
        for (size_t i = 0; i < items->n; i++) {
            MS_TRY(step(r, x, 1));
            jenv *ls = new_env(r, scope);
            if (!ls) return oom(r, x);
            MS_TRY(bind_target(r, x, ls, x->a, items->v[i], 1));
            jv t;
            MS_TRY(eval(r, ls, test, &t));
            if (is_truthy(t)) kept->v[k++] = items->v[i];
        }
        kept->n = k;
        items = kept;
    } else if (x->a->kind == E_TUPLE) {
        for (size_t i = 0; i < items->n; i++) /* the oracle checks every item before the first iteration */
            if (items->v[i].t != V_ARR || items->v[i].u.a->n != (size_t)x->a->n)
                return bind_target(r, x, scope, x->a, items->v[i], 1);
    }
    int none = 1;
    size_t n = items->n;
    for (size_t i = 0; i < n; i++) {
        MS_TRY(step(r, x, 1));
        jv lv = V(V_LOOP);
        lv.u.a = items;
        lv.n = i;
        if (env_set(r, scope, "loop", 4, lv)) return oom(r, x);
        MS_TRY(bind_target(r, x, scope, x->a, items->v[i], 1));
        size_t mark = out->n;
        int rc = exec_block(r, scope, x->list, x->n, out);
        if (rc == RC_CONT || rc == RC_BREAK) {
            out->n = mark; /* the oracle drops the interrupted iteration's output */
            if (out->p) out->p[mark] = 0;
            if (rc == RC_BREAK) break;
            continue;
        }
        if (rc) return rc;
        none = 0;
    }
    if (none) return exec_block(r, scope, x->list2, x->n2, out);
    return RC_OK;
}

static int exec_set(R *r, jenv *e, const jj_node *x) {
    jv rhs;
    if (x->b) {
        MS_TRY(eval(r, e, x->b, &rhs));
    } else {
        jj_buf b = new_buf(r);
        int rc = exec_block(r, e, x->list, x->n, &b);
        if (!rc) rc = buf_check(r, x, &b);
        if (rc) {
            jj_buf_free(&b);
            return rc;
        }
        MS_TRY(buf_to_str(r, x, &b, &rhs));
    }
    const jj_node *t = x->a;
    if (t->kind == E_IDENT || t->kind == E_TUPLE) return bind_target(r, x, e, t, rhs, 0);
    if (t->kind == E_MEMBER) {
        jv obj;
        MS_TRY(eval(r, e, t->a, &obj));
        if (obj.t != V_NS) return rerr(r, x, "cannot assign attribute on non-namespace object");
        if (t->flag || t->b->kind != E_IDENT) return rerr(r, x, "cannot assign to a member with a non-identifier property");
        if (obj_set(r, obj.u.o, t->b->s, t->b->slen, rhs)) return oom(r, x);
        return RC_OK;
    }
    return rerr(r, x, "invalid left-hand side in set");
}

static int exec_node(R *r, jenv *e, const jj_node *x, jj_buf *out) {
    switch (x->kind) {
    case N_COMMENT: return RC_OK;
    case N_BREAK: return RC_BREAK;
    case N_CONTINUE: return RC_CONT;
    case N_SET: return exec_set(r, e, x);
    case N_IF: {
        jv t;
        MS_TRY(eval(r, e, x->a, &t));
        return is_truthy(t) ? exec_block(r, e, x->list, x->n, out) : exec_block(r, e, x->list2, x->n2, out);
    }
    case N_FOR: return exec_for(r, e, x, out);
    case N_MACRO: {
        jfn *f = ralloc(r, sizeof *f);
        if (!f) return oom(r, x);
        f->kind = F_MACRO;
        f->node = x;
        jv v = V(V_FUNC);
        v.u.f = f;
        return env_set(r, e, x->s, x->slen, v) ? oom(r, x) : RC_OK;
    }
    case N_CALLBLOCK: {
        jfn *cf = ralloc(r, sizeof *cf);
        if (!cf) return oom(r, x);
        cf->kind = F_CALLER;
        cf->node = x;
        cf->env = e;
        const jj_node *c = x->a;
        jv *args, fn, res;
        size_t n;
        jobj *kw;
        MS_TRY(eval_args(r, e, c->list, c->n, &args, &n, &kw));
        args[n++] = vobj(kw, V_KWARGS);
        MS_TRY(eval(r, e, c->a, &fn));
        if (fn.t != V_FUNC) return rerr(r, x, "cannot call something that is not a function: got %s", type_name(fn.t));
        jenv *ne = new_env(r, e);
        if (!ne) return oom(r, x);
        jv cv = V(V_FUNC);
        cv.u.f = cf;
        if (env_set(r, ne, "caller", 6, cv)) return oom(r, x);
        MS_TRY(call_fn(r, x, fn, args, n, ne, &res));
        return to_print(r, x, res, out);
    }
    case N_FILTERBLOCK: {
        jj_buf b = new_buf(r);
        int rc = exec_block(r, e, x->list2, x->n2, &b);
        if (!rc) rc = buf_check(r, x, &b);
        if (rc) {
            jj_buf_free(&b);
            return rc;
        }
        jv body, res;
        MS_TRY(buf_to_str(r, x, &b, &body));
        MS_TRY(apply_filter(r, e, x, body, &res));
        if (res.t == V_UNDEF) return RC_OK;
        return to_print(r, x, res, out);
    }
    default: {
        jv v;
        MS_TRY(eval(r, e, x, &v));
        if (v.t == V_UNDEF) return RC_OK;
        return to_print(r, x, v, out);
    }
    }
}

static int exec_block(R *r, jenv *e, jj_node *const *list, int n, jj_buf *out) {
    if (++r->nest > MAX_EVAL_NEST) {
        r->nest--;
        rerr(r, n ? list[0] : NULL, "template evaluation nested deeper than %d levels", MAX_EVAL_NEST);
        r->err->code = MS_ERR_NOMEM;
        return RC_ERR;
    }
    int rc = RC_OK;
    for (int i = 0; i < n && !rc; i++) {
        rc = exec_node(r, e, list[i], out);
        if (!rc && out->over) rc = buf_check(r, list[i], out);
        if (!rc && r->ar.over) rc = oom(r, list[i]);
    }
    r->nest--;
    return rc;
}

int jj_render(const jj_program *prog, json_t *ctx, const jj_limits *lim, char **out, size_t *len, ms_err *err) {
    *out = NULL;
    if (len) *len = 0;
    ms_err local = {0};
    if (!err) err = &local;
    R r;
    memset(&r, 0, sizeof r);
    r.lim = lim;
    r.err = err;
    r.ar.limit = lim->max_memory;
    int rc = RC_OK;
    jenv *g = new_env(&r, NULL);
    if (!g) {
        jj_arena_free(&r.ar);
        return ms_errf(err, MS_ERR_NOMEM, "chat template: out of memory");
    }
    static const struct {
        const char *k;
        int t, b;
    } consts[] = {{"false", V_BOOL, 0}, {"true", V_BOOL, 1}, {"none", V_NULL, 0},
                  {"True", V_BOOL, 1},  {"False", V_BOOL, 0}, {"None", V_NULL, 0}};
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++) {
        jv v = V(consts[i].t);
        v.u.b = consts[i].b;
        env_set(&r, g, consts[i].k, strlen(consts[i].k), v);
    }
    jv f = V(V_FUNC);
    f.u.f = &k_raise;
    env_set(&r, g, "raise_exception", 15, f);
    f.u.f = &k_range;
    env_set(&r, g, "range", 5, f);
    f.u.f = &k_strftime;
    env_set(&r, g, "strftime_now", 12, f);
    if (ctx && json_is_object(ctx)) {
        const char *k;
        json_t *val;
        json_object_foreach(ctx, k, val) {
            jv v;
            rc = from_json(&r, val, &v, 0);
            if (rc) break;
            if (env_set(&r, g, k, strlen(k), v)) {
                rc = oom(&r, NULL);
                break;
            }
        }
    }
    jj_buf b = new_buf(&r);
    if (!rc && !r.ar.over) {
        rc = exec_block(&r, g, prog->body, prog->n, &b);
        if (rc == RC_BREAK || rc == RC_CONT)
            rc = rerr(&r, NULL, "{%% %s %%} outside of a for loop", rc == RC_BREAK ? "break" : "continue");
        if (!rc) rc = buf_check(&r, NULL, &b);
    } else if (!rc) {
        rc = oom(&r, NULL);
    }
    jj_arena_free(&r.ar);
    if (rc) {
        jj_buf_free(&b);
        if (!err->code) ms_errf(err, MS_ERR_INVALID, "chat template: rendering failed");
        return err->code;
    }
    if (!b.p) {
        b.p = malloc(1);
        if (!b.p) return ms_errf(err, MS_ERR_NOMEM, "chat template: out of memory");
        b.p[0] = 0;
    }
    *out = b.p;
    if (len) *len = b.n;
    return MS_OK;
}
