/* jinja_value.c - the template's runtime values and how they turn into text and compare, kept
 * apart from evaluation because this is where rendering must match Python byte for byte: str() and
 * repr() printing (None, True, 1.0, 1e-05, quoting), json.dumps for tojson, Python's == and sort
 * order. A template that prints a value differently from jinja2 gives the model a prompt it was
 * not trained on, so changes here are checked against the conformance tests, not by eye. Also the
 * render-arena allocators and the error/limit reporting every other interpreter file uses. */
#include "tokenizer/jinja_internal.h"

#include "core/fmt.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

const char *jv_type_name(int t) {
    static const char *n[] = {"UndefinedValue", "NullValue", "BooleanValue", "IntegerValue",
                              "FloatValue", "StringValue", "ArrayValue", "TupleValue", "ObjectValue",
                              "KeywordArgumentsValue", "NamespaceValue", "FunctionValue", "ObjectValue"};
    return n[t];
}

int jv_err(R *r, const jj_node *at, const char *fmt, ...) {
    char msg[420];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at) ms_errf(r->err, MS_ERR_INVALID, "chat template line %d: %s", at->line, msg);
    else ms_errf(r->err, MS_ERR_INVALID, "chat template: %s", msg);
    return RC_ERR;
}

int jv_oom(R *r, const jj_node *at) {
    jv_err(r, at, "rendering exceeded the memory limit of %zu bytes", r->lim->max_memory);
    r->err->code = MS_ERR_NOMEM;
    return RC_ERR;
}

int jv_step(R *r, const jj_node *at, long long k) {
    r->steps += k;
    if (r->steps > r->lim->max_steps) {
        jv_err(r, at, "rendering exceeded the limit of %lld loop iterations and macro calls", r->lim->max_steps);
        r->err->code = MS_ERR_NOMEM;
        return RC_ERR;
    }
    return RC_OK;
}

jarr *jv_new_arr(R *r, size_t n) {
    jarr *a = jv_ralloc(r, sizeof *a);
    if (!a) return NULL;
    a->n = n;
    if (n) {
        a->v = jv_ralloc(r, n * sizeof(jv));
        if (!a->v) return NULL;
    }
    return a;
}

jobj *jv_new_obj(R *r, size_t cap) {
    jobj *o = jv_ralloc(r, sizeof *o);
    if (!o) return NULL;
    if (cap) {
        o->k = jv_ralloc(r, cap * sizeof(jkey));
        o->v = jv_ralloc(r, cap * sizeof(jv));
        if (!o->k || !o->v) return NULL;
    }
    o->cap = cap;
    return o;
}

jv *jv_obj_get(const jobj *o, const char *k, size_t kn) {
    for (size_t i = 0; i < o->n; i++)
        if (o->k[i].n == kn && !memcmp(o->k[i].s, k, kn)) return &o->v[i];
    return NULL;
}

/* Map.set: replaces in place or appends (insertion order kept). */
int jv_obj_set(R *r, jobj *o, const char *k, size_t kn, jv v) {
    jv *p = jv_obj_get(o, k, kn);
    if (p) {
        *p = v;
        return 0;
    }
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 8;
        jkey *nk = jv_ralloc(r, cap * sizeof(jkey));
        jv *nv = jv_ralloc(r, cap * sizeof(jv));
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

jv jv_fn(R *r, int kind, int id, jv self) {
    jfn *f = jv_ralloc(r, sizeof *f);
    jv v = jv_make(V_FUNC);
    if (!f) return jv_make(V_UNDEF); /* caller checks r->ar.over */
    f->kind = kind;
    f->id = id;
    f->self = self;
    v.u.f = f;
    return v;
}

/* ---- strings -------------------------------------------------------------------------------- */

int jv_truthy(jv v) {
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
int jv_buf_to_str(R *r, const jj_node *at, jj_buf *b, jv *out) {
    char *s = jj_strdup(&r->ar, b->p ? b->p : "", b->n);
    size_t n = b->n;
    jj_buf_free(b);
    if (!s) return jv_oom(r, at);
    *out = jv_str(s, n);
    return RC_OK;
}

int jv_buf_check(R *r, const jj_node *at, jj_buf *b) {
    if (!b->over) return RC_OK;
    jv_err(r, at, "rendered text exceeds the output limit of %zu bytes", r->lim->max_output);
    r->err->code = MS_ERR_NOMEM;
    return RC_ERR;
}

jj_buf jv_new_buf(R *r) {
    jj_buf b = {0};
    b.limit = r->lim->max_output;
    return b;
}

/* Case mapping as JavaScript's toUpperCase/toLowerCase (full mapping only for the common ß). */
int jv_map_case(R *r, const jj_node *at, jv s, int upper, jv *out) {
    jj_buf b = jv_new_buf(r);
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
    if (jv_buf_check(r, at, &b)) {
        jj_buf_free(&b);
        return RC_ERR;
    }
    return jv_buf_to_str(r, at, &b, out);
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
jv jv_py_strip(jv s, int which, jv chars) {
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
    return jv_str(s.u.s + a, e - a);
}

static int is_ascii_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* value.replace(/\b\w/g, upper): ASCII word starts upper-cased, nothing else touched. */
int jv_title_case(R *r, const jj_node *at, jv s, jv *out) {
    char *p = jj_alloc(&r->ar, s.n + 1);
    if (!p) return jv_oom(r, at);
    memcpy(p, s.u.s, s.n);
    for (size_t i = 0; i < s.n; i++)
        if (is_ascii_word(p[i]) && (i == 0 || !is_ascii_word(s.u.s[i - 1])) && p[i] >= 'a' && p[i] <= 'z')
            p[i] = (char)(p[i] - 32);
    *out = jv_str(p, s.n);
    return RC_OK;
}

/* charAt(0).toUpperCase() + slice(1) (astral first characters stay as they are). */
int jv_capitalize(R *r, const jj_node *at, jv s, jv *out) {
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
    first = jv_str(s.u.s, (size_t)l);
    MS_TRY(jv_map_case(r, at, first, 1, &up));
    char *p = jj_alloc(&r->ar, up.n + s.n - (size_t)l + 1);
    if (!p) return jv_oom(r, at);
    memcpy(p, up.u.s, up.n);
    memcpy(p + up.n, s.u.s + l, s.n - (size_t)l);
    *out = jv_str(p, up.n + s.n - (size_t)l);
    return RC_OK;
}

/* ---- conversions to text -------------------------------------------------------------------- */

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

int jv_to_print(R *r, const jj_node *at, jv v, jj_buf *b) { return to_str_d(r, at, v, b, 0); }

static int to_repr(R *r, const jj_node *at, jv v, jj_buf *b, int depth) {
    if (depth > 512) return jv_err(r, at, "value nested too deeply to print");
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
        return b->over ? jv_buf_check(r, at, b) : RC_OK;
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
        return b->over ? jv_buf_check(r, at, b) : RC_OK;
    }
    default:
        return jv_err(r, at, "cannot convert a %s to a string", jv_type_name(v.t));
    }
}

int jv_to_json(R *r, const jj_node *at, jv v, const jopts *o, int depth, int undef_null, jj_buf *b) {
    if (depth > 512) return jv_err(r, at, "value nested too deeply for tojson");
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
    default: return jv_err(r, at, "cannot convert %s to JSON", jv_type_name(v.t));
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
            MS_TRY(jv_to_json(r, at, v.u.a->v[i], o, depth + 1, undef_null, b));
        }
        if (ind && nitems) PAD(depth);
        jj_buf_putc(b, ']');
        return b->over ? jv_buf_check(r, at, b) : RC_OK;
    }
    size_t *order = NULL;
    if (o->sort_keys && nitems > 1) {
        order = malloc(nitems * sizeof *order);
        if (!order) return jv_oom(r, at);
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
        int rc = jv_to_json(r, at, v.u.o->v[i], o, depth + 1, undef_null, b);
        if (rc) {
            free(order);
            return rc;
        }
    }
    free(order);
    if (ind && nitems) PAD(depth);
    jj_buf_putc(b, '}');
    #undef PAD
    return b->over ? jv_buf_check(r, at, b) : RC_OK;
}

int jv_print_to_str(R *r, const jj_node *at, jv v, jv *out) {
    if (v.t == V_STR) {
        *out = v;
        return RC_OK;
    }
    jj_buf b = jv_new_buf(r);
    int rc = jv_to_print(r, at, v, &b);
    if (!rc) rc = jv_buf_check(r, at, &b);
    if (rc) {
        jj_buf_free(&b);
        return rc;
    }
    return jv_buf_to_str(r, at, &b, out);
}

/* ---- JSON context -> values ----------------------------------------------------------------- */

int jv_from_json(R *r, json_t *j, jv *out, int depth) {
    if (depth > 1000) return jv_err(r, NULL, "context JSON nested too deeply");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jobj *o = jv_new_obj(r, json_object_size(j));
        if (!o) return jv_oom(r, NULL);
        const char *k;
        json_t *val;
        json_object_foreach(j, k, val) {
            jv x;
            MS_TRY(jv_from_json(r, val, &x, depth + 1));
            o->k[o->n] = (jkey){k, strlen(k)};
            o->v[o->n++] = x;
        }
        *out = jv_make(V_OBJ);
        out->u.o = o;
        return RC_OK;
    }
    case JSON_ARRAY: {
        jarr *a = jv_new_arr(r, json_array_size(j));
        if (!a) return jv_oom(r, NULL);
        for (size_t i = 0; i < a->n; i++) MS_TRY(jv_from_json(r, json_array_get(j, i), &a->v[i], depth + 1));
        *out = jv_make(V_ARR);
        out->u.a = a;
        return RC_OK;
    }
    case JSON_STRING: *out = jv_str(json_string_value(j), json_string_length(j)); return RC_OK;
    case JSON_INTEGER:
        *out = jv_num(V_INT, (double)json_integer_value(j));
        out->iv = (long long)json_integer_value(j);
        return RC_OK;
    case JSON_REAL: *out = jv_num(V_FLOAT, json_real_value(j)); return RC_OK; /* 1.0 stays a float, as in json.loads */
    case JSON_TRUE: *out = jv_bool(1); return RC_OK;
    case JSON_FALSE: *out = jv_bool(0); return RC_OK;
    default: *out = jv_make(V_NULL); return RC_OK;
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

/* a.value === b.value (zero: SameValueZero, NaN equals NaN). */
int jv_strict_eq(jv a, jv b, int zero) {
    int ka = js_kind(a.t), kb = js_kind(b.t);
    if (ka != kb) return 0;
    switch (ka) {
    case K_UNDEF: case K_NULL: return 1;
    case K_BOOL: return a.u.b == b.u.b;
    case K_NUM: return a.u.d == b.u.d || (zero && isnan(a.u.d) && isnan(b.u.d));
    case K_STR: return jv_str_eq(a, b);
    default: return obj_identity(a) == obj_identity(b);
    }
}

/* Python's a == b: numbers (booleans included) by value, strings by bytes, lists and tuples
 * element-wise (a list never equals a tuple), dicts by key set and values, undefined only equals
 * undefined, anything else by identity. */
int jv_py_eq(jv a, jv b, int depth) {
    int na = a.t == V_INT || a.t == V_FLOAT || a.t == V_BOOL, nb = b.t == V_INT || b.t == V_FLOAT || b.t == V_BOOL;
    if (na || nb) return na && nb && (a.t == V_BOOL ? a.u.b : a.u.d) == (b.t == V_BOOL ? b.u.b : b.u.d);
    if (a.t == V_KWARGS) a.t = V_OBJ;
    if (b.t == V_KWARGS) b.t = V_OBJ;
    if (a.t != b.t) return 0;
    switch (a.t) {
    case V_UNDEF: case V_NULL: return 1;
    case V_STR: return jv_str_eq(a, b);
    case V_ARR: case V_TUPLE:
        if (a.u.a == b.u.a) return 1;
        if (a.u.a->n != b.u.a->n || depth > 512) return 0;
        for (size_t i = 0; i < a.u.a->n; i++)
            if (!jv_py_eq(a.u.a->v[i], b.u.a->v[i], depth + 1)) return 0;
        return 1;
    case V_OBJ:
        if (a.u.o == b.u.o) return 1;
        if (a.u.o->n != b.u.o->n || depth > 512) return 0;
        for (size_t i = 0; i < a.u.o->n; i++) {
            const jv *w = jv_obj_get(b.u.o, a.u.o->k[i].s, a.u.o->k[i].n);
            if (!w || !jv_py_eq(a.u.o->v[i], *w, depth + 1)) return 0;
        }
        return 1;
    default: return obj_identity(a) == obj_identity(b);
    }
}

/* compareRuntimeValues: numbers (and booleans) with each other, strings with strings. */
static int compare_values(R *r, const jj_node *at, jv a, jv b, int case_sensitive, int *res) {
    if (a.t == V_NULL && b.t == V_NULL) return *res = 0, RC_OK;
    if (a.t == V_NULL || b.t == V_NULL) return jv_err(r, at, "cannot compare %s with %s", jv_type_name(a.t), jv_type_name(b.t));
    if (a.t == V_UNDEF && b.t == V_UNDEF) return *res = 0, RC_OK;
    if (a.t == V_UNDEF || b.t == V_UNDEF)
        return jv_err(r, at, "cannot compare %s with %s", jv_type_name(a.t), jv_type_name(b.t));
    int na = a.t == V_INT || a.t == V_FLOAT || a.t == V_BOOL, nb = b.t == V_INT || b.t == V_FLOAT || b.t == V_BOOL;
    if (na && nb) {
        double x = a.t == V_BOOL ? a.u.b : a.u.d, y = b.t == V_BOOL ? b.u.b : b.u.d;
        *res = x < y ? -1 : x > y ? 1 : 0;
        return RC_OK;
    }
    if (a.t != b.t) return jv_err(r, at, "cannot compare different types: %s and %s", jv_type_name(a.t), jv_type_name(b.t));
    if (a.t != V_STR) return jv_err(r, at, "cannot compare type %s", jv_type_name(a.t));
    if (!case_sensitive) {
        MS_TRY(jv_map_case(r, at, a, 0, &a));
        MS_TRY(jv_map_case(r, at, b, 0, &b));
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

int jv_sort_values(R *r, const jj_node *at, const jv *items, const jv *keys, size_t n, int cs, int rev, jv *out) {
    jarr *a = jv_new_arr(r, n);
    if (!a) return jv_oom(r, at);
    size_t *idx = malloc((n + 1) * sizeof *idx), *tmp = malloc((n + 1) * sizeof *tmp);
    if (!idx || !tmp) {
        free(idx);
        free(tmp);
        return jv_oom(r, at);
    }
    for (size_t i = 0; i < n; i++) idx[i] = i;
    sortctx c = {r, at, cs, rev, 0};
    msort(&c, idx, tmp, n, keys);
    for (size_t i = 0; i < n; i++) a->v[i] = items[idx[i]];
    free(idx);
    free(tmp);
    if (c.rc) return c.rc;
    *out = jv_make(V_ARR);
    out->u.a = a;
    return RC_OK;
}
