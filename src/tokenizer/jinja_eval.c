/* jinja_eval.c - renders a parsed template the way Python's jinja2 does under transformers, so a
 * prompt carries the bytes the model was trained on: undefined prints as "", none as "None",
 * booleans as True/False, floats as Python's repr (1.0, 1e-05), containers as Python reprs, `~` is
 * str() concatenation, `+` on a string needs a string, == and `in` are Python's, string lengths and
 * indexes count code points, and tojson is json.dumps (ensure_ascii=False). Filters and methods
 * jinja2 has but @huggingface/jinja lacks (count, d, select, reject, round, wordcount, escape,
 * find, rsplit, ...) are included. What still follows @huggingface/jinja is listed in
 * docs/templates.md. Rendering is bounded by jj_limits (output bytes, arena bytes, steps = loop
 * iterations + macro calls + range() elements, macro nesting) and by a cap on evaluation nesting.
 * This file is the evaluator core (scopes, expressions, statements, jj_render); values and their
 * printing are in jinja_value.c, filters and tests in jinja_filters.c, methods, built-in functions
 * and calls in jinja_call.c. */
#include "tokenizer/jinja_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* keys of the `loop` object; shared by every loop object and never written */
static jkey k_loop_keys[9] = {{"index", 5}, {"index0", 6}, {"revindex", 8}, {"revindex0", 9}, {"first", 5},
                              {"last", 4},  {"length", 6}, {"previtem", 8}, {"nextitem", 8}};

static const jfn k_raise = {F_BUILTIN, B_RAISE, NULL, NULL, {0}};
static const jfn k_range = {F_BUILTIN, B_RANGE, NULL, NULL, {0}};
static const jfn k_strftime = {F_BUILTIN, B_STRFTIME, NULL, NULL, {0}};
static const jfn k_namespace = {F_BUILTIN, B_NAMESPACE, NULL, NULL, {0}};

#define MAX_EVAL_NEST 1000

/* ---- environments --------------------------------------------------------------------------- */

jenv *jj_new_env(R *r, jenv *parent) {
    jenv *e = jv_ralloc(r, sizeof *e);
    if (e) e->parent = parent;
    return e;
}

int jj_env_set(R *r, jenv *e, const char *k, size_t kn, jv v) {
    for (jvar *x = e->vars; x; x = x->next)
        if (x->kn == kn && !memcmp(x->k, k, kn)) {
            x->v = v;
            return 0;
        }
    jvar *x = jv_ralloc(r, sizeof *x);
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
        jv v = jv_make(V_FUNC);
        v.u.f = &k_namespace;
        return v;
    }
    return jv_make(V_UNDEF);
}

/* ---- evaluation ----------------------------------------------------------------------------- */

/* Evaluates call arguments: positional values (with *spread) then a keyword object. */
int jj_eval_args(R *r, jenv *e, jj_node *const *list, int n, jv **pos, size_t *npos, jobj **kw) {
    size_t cap = (size_t)n + 1;
    for (int i = 0; i < n; i++)
        if (list[i]->kind == E_SPREAD) cap += 0; /* grown below */
    jv *p = jv_ralloc(r, cap * sizeof(jv));
    jobj *k = jv_new_obj(r, 0);
    if (!p || !k) return jv_oom(r, list && n ? list[0] : NULL);
    size_t np = 0;
    for (int i = 0; i < n; i++) {
        const jj_node *a = list[i];
        if (a->kind == E_SPREAD) {
            jv v;
            MS_TRY(jj_eval(r, e, a->a, &v));
            if (v.t != V_ARR && v.t != V_TUPLE) return jv_err(r, a, "cannot unpack non-iterable type %s", jv_type_name(v.t));
            jv *np2 = jv_ralloc(r, (cap + v.u.a->n) * sizeof(jv));
            if (!np2) return jv_oom(r, a);
            memcpy(np2, p, np * sizeof(jv));
            p = np2;
            cap += v.u.a->n;
            for (size_t j = 0; j < v.u.a->n; j++) p[np++] = v.u.a->v[j];
        } else if (a->kind != E_KWARG && a->kind != E_KWSPREAD) {
            MS_TRY(jj_eval(r, e, a, &p[np]));
            np++;
        }
    }
    for (int i = 0; i < n; i++) {
        const jj_node *a = list[i];
        if (a->kind == E_KWARG) {
            if (jv_obj_get(k, a->s, a->slen)) return jv_err(r, a, "got multiple values for keyword argument '%.*s'", (int)a->slen, a->s);
            jv v;
            MS_TRY(jj_eval(r, e, a->a, &v));
            if (jv_obj_set(r, k, a->s, a->slen, v)) return jv_oom(r, a);
        } else if (a->kind == E_KWSPREAD) {
            jv v;
            MS_TRY(jj_eval(r, e, a->a, &v));
            if (v.t != V_OBJ && v.t != V_KWARGS) return jv_err(r, a, "argument after ** must be a mapping, not %s", jv_type_name(v.t));
            for (size_t j = 0; j < v.u.o->n; j++) {
                if (jv_obj_get(k, v.u.o->k[j].s, v.u.o->k[j].n))
                    return jv_err(r, a, "got multiple values for keyword argument '%.*s'", (int)v.u.o->k[j].n, v.u.o->k[j].s);
                if (jv_obj_set(r, k, v.u.o->k[j].s, v.u.o->k[j].n, v.u.o->v[j])) return jv_oom(r, a);
            }
        }
    }
    *pos = p;
    *npos = np;
    *kw = k;
    return RC_OK;
}

jv jj_kw_get(const jobj *kw, const char *name) {
    jv *p = kw ? jv_obj_get(kw, name, strlen(name)) : NULL;
    return p ? *p : jv_make(V_UNDEF);
}

/* `args.at(i) ?? kwargs.get(name) ?? def` where "absent" is a missing slot, not an undefined value. */
jv jj_arg_or(jv *args, size_t n, size_t i, const jobj *kw, const char *name, jv def) {
    if (i < n) return args[i];
    jv *p = kw && name ? jv_obj_get(kw, name, strlen(name)) : NULL;
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
    if (obj.t != V_ARR && obj.t != V_TUPLE && obj.t != V_STR) return jv_err(r, sl, "slice object must be an array or string");
    jv part[3];
    const jj_node *nodes[3] = {sl->a, sl->b, sl->c};
    for (int i = 0; i < 3; i++) {
        part[i] = jv_make(V_UNDEF);
        if (nodes[i]) MS_TRY(jj_eval(r, e, nodes[i], &part[i]));
        if (part[i].t != V_INT && part[i].t != V_UNDEF)
            return jv_err(r, sl, "slice %s must be numeric or undefined", i == 0 ? "start" : i == 1 ? "stop" : "step");
    }
    long long stepv = part[2].t == V_INT ? (long long)part[2].u.d : 1;
    long long len;
    size_t *offs = NULL; /* string: byte offset of each code point */
    if (obj.t == V_STR) {
        offs = malloc((obj.n + 1) * sizeof *offs);
        if (!offs) return jv_oom(r, sl);
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
        jj_buf b = jv_new_buf(r);
        if (dir != 0)
            for (long long i = st; dir * i < dir * sp; i += stepv)
                jj_buf_put(&b, obj.u.s + offs[i], offs[i + 1] - offs[i]);
        free(offs);
        if (jv_buf_check(r, sl, &b)) {
            jj_buf_free(&b);
            return RC_ERR;
        }
        return jv_buf_to_str(r, sl, &b, out);
    }
    jarr *a = jv_new_arr(r, cnt);
    if (!a) return jv_oom(r, sl);
    size_t k = 0;
    if (dir != 0)
        for (long long i = st; dir * i < dir * sp; i += stepv) a->v[k++] = obj.u.a->v[i];
    *out = jv_arr(a, V_ARR);
    return RC_OK;
}

static int method(R *r, const jj_node *at, jv self, int id, jv *out) {
    *out = jv_fn(r, F_METHOD, id, self);
    if (out->t == V_UNDEF) return jv_oom(r, at);
    return RC_OK;
}

/* `x.name` / `x[key]` for the built-in members of strings, arrays and dicts. */
int jj_builtin_member(R *r, const jj_node *at, jv obj, jv key, jv *out) {
    *out = jv_make(V_UNDEF);
    const char *k = key.u.s;
    size_t n = key.n;
#define IS(lit) (n == sizeof(lit) - 1 && !memcmp(k, lit, n))
    if (obj.t == V_STR) {
        if (IS("length")) *out = jv_make(V_UNDEF); /* a Python str has no .length */
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
        if (IS("length")) *out = jv_num(V_INT, (double)obj.u.a->n);
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
        case 0: *out = jv_num(V_INT, (double)i + 1); break;
        case 1: *out = jv_num(V_INT, (double)i); break;
        case 2: *out = jv_num(V_INT, (double)(n - i)); break;
        case 3: *out = jv_num(V_INT, (double)(n - i - 1)); break;
        case 4: *out = jv_bool(i == 0); break;
        case 5: *out = jv_bool(i == n - 1); break;
        case 6: *out = jv_num(V_INT, (double)n); break;
        case 7: *out = i > 0 ? lv.u.a->v[i - 1] : jv_make(V_UNDEF); break;
        default: *out = i + 1 < n ? lv.u.a->v[i + 1] : jv_make(V_UNDEF); break;
        }
        return 1;
    }
    return 0;
}

static int materialize_loop(R *r, const jj_node *at, jv lv, jv *out) {
    jobj *o = jv_new_obj(r, 9);
    if (!o) return jv_oom(r, at);
    for (int q = 0; q < 9; q++) {
        o->k[q] = k_loop_keys[q];
        loop_field(lv, k_loop_keys[q].s, k_loop_keys[q].n, &o->v[q]);
    }
    o->n = 9;
    *out = jv_obj(o, V_OBJ);
    return RC_OK;
}

static int eval_member(R *r, jenv *e, const jj_node *x, jv *out) {
    jv obj, prop;
    if (x->a->kind == E_IDENT) obj = env_get(e, x->a->s, x->a->slen); /* may be an unmaterialized loop */
    else MS_TRY(jj_eval(r, e, x->a, &obj));
    if (obj.t == V_LOOP) {
        if (!x->flag && x->b->kind == E_IDENT && loop_field(obj, x->b->s, x->b->slen, out)) return RC_OK;
        MS_TRY(materialize_loop(r, x, obj, &obj));
    }
    if (x->flag) {
        if (x->b->kind == E_SLICE) return eval_slice(r, e, obj, x->b, out);
        MS_TRY(jj_eval(r, e, x->b, &prop));
    } else if (x->b->kind == E_INT) {
        prop = jv_num(V_INT, x->b->num);
    } else {
        prop = jv_str(x->b->s, x->b->slen);
    }
    *out = jv_make(V_UNDEF);
    if (obj.t == V_OBJ || obj.t == V_KWARGS || obj.t == V_NS) {
        if (prop.t != V_STR) return jv_err(r, x, "cannot access property with non-string: got %s", jv_type_name(prop.t));
        jv *p = jv_obj_get(obj.u.o, prop.u.s, prop.n);
        if (p) {
            *out = *p;
            return RC_OK;
        }
        if (obj.t != V_NS) return jj_builtin_member(r, x, obj, prop, out);
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
                            *out = jv_cstr("\xEF\xBF\xBD");
                        } else {
                            *out = jv_str(obj.u.s + i, (size_t)l);
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
        if (prop.t == V_STR) return jj_builtin_member(r, x, obj, prop, out);
        return jv_err(r, x, "cannot access property with non-string/non-number: got %s", jv_type_name(prop.t));
    }
    if (prop.t != V_STR) return jv_err(r, x, "cannot access property with non-string: got %s", jv_type_name(prop.t));
    return RC_OK; /* numbers, booleans, none, undefined and functions have no members */
}

static int eval_binary(R *r, jenv *e, const jj_node *x, jv *out) {
    jv a, b;
    MS_TRY(jj_eval(r, e, x->a, &a));
    int op = x->op;
    if (op == OP_AND) return jv_truthy(a) ? jj_eval(r, e, x->b, out) : (*out = a, RC_OK);
    if (op == OP_OR) return jv_truthy(a) ? (*out = a, RC_OK) : jj_eval(r, e, x->b, out);
    MS_TRY(jj_eval(r, e, x->b, &b));
    if (op == OP_EQ || op == OP_NE) {
        int eq = jv_py_eq(a, b, 0);
        *out = jv_bool(op == OP_EQ ? eq : !eq);
        return RC_OK;
    }
    static const char *opn[] = {"or", "and", "not", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "+", "-",
                                "~", "*", "/", "//", "%", "**", "-", "+"};
    if (op == OP_IN || op == OP_NOTIN) {
        /* Python's `in`: undefined is an empty iterable; lists compare with ==; dict keys are strings */
        int found = 0;
        if (b.t == V_UNDEF) found = 0;
        else if (b.t == V_ARR || b.t == V_TUPLE) {
            for (size_t i = 0; i < b.u.a->n && !found; i++) found = jv_py_eq(b.u.a->v[i], a, 0);
        } else if (b.t == V_STR) {
            if (a.t != V_STR) return jv_err(r, x, "'in <string>' requires a string as left operand, not %s", jv_type_name(a.t));
            found = jj_str_find_ll(b, 0, a) >= 0;
        } else if (b.t == V_OBJ || b.t == V_KWARGS || b.t == V_NS) {
            found = a.t == V_STR && jv_obj_get(b.u.o, a.u.s, a.n) != NULL;
        } else return jv_err(r, x, "argument of type %s is not iterable", jv_type_name(b.t));
        return *out = jv_bool(op == OP_IN ? found : !found), RC_OK;
    }
    if (op == OP_CONCAT) { /* str(a) + str(b): undefined is "", none is "None" */
        jj_buf t = jv_new_buf(r);
        int rc = jv_to_print(r, x, a, &t);
        if (!rc) rc = jv_to_print(r, x, b, &t);
        if (!rc) rc = jv_buf_check(r, x, &t);
        if (rc) {
            jj_buf_free(&t);
            return rc;
        }
        return jv_buf_to_str(r, x, &t, out);
    }
    if (a.t == V_UNDEF || b.t == V_UNDEF) return jv_err(r, x, "cannot perform operation %s on undefined values", opn[op]);
    if (a.t == V_NULL || b.t == V_NULL) return jv_err(r, x, "cannot perform operation %s on null values", opn[op]);
    int na = a.t == V_INT || a.t == V_FLOAT, nb = b.t == V_INT || b.t == V_FLOAT;
    if (op == OP_POW && (na || a.t == V_BOOL) && (nb || b.t == V_BOOL)) {
        double p = a.t == V_BOOL ? a.u.b : a.u.d, q = b.t == V_BOOL ? b.u.b : b.u.d;
        if (p == 0 && q < 0) return jv_err(r, x, "0.0 cannot be raised to a negative power");
        double res = pow(p, q);
        if (!isfinite(res)) return jv_err(r, x, "exponentiation result is not a finite real number");
        *out = jv_num(a.t == V_FLOAT || b.t == V_FLOAT || q < 0 ? V_FLOAT : V_INT, res);
        return RC_OK;
    }
    if (na && nb) {
        double p = a.u.d, q = b.u.d;
        int fl = a.t == V_FLOAT || b.t == V_FLOAT;
        switch (op) {
        case OP_ADD: return *out = jv_num(fl ? V_FLOAT : V_INT, p + q), RC_OK;
        case OP_SUB: return *out = jv_num(fl ? V_FLOAT : V_INT, p - q), RC_OK;
        case OP_MUL: return *out = jv_num(fl ? V_FLOAT : V_INT, p * q), RC_OK;
        case OP_DIV: case OP_FLOORDIV: case OP_MOD: {
            if (q == 0) return jv_err(r, x, "division by zero");
            if (op == OP_DIV) return *out = jv_num(V_FLOAT, p / q), RC_OK;
            if (op == OP_FLOORDIV) return *out = jv_num(fl ? V_FLOAT : V_INT, floor(p / q)), RC_OK;
            double m = fmod(p, q); /* Python: the result takes the divisor's sign */
            if (m != 0 && (m < 0) != (q < 0)) m += q;
            return *out = jv_num(fl ? V_FLOAT : V_INT, m), RC_OK;
        }
        case OP_LT: return *out = jv_bool(p < q), RC_OK;
        case OP_GT: return *out = jv_bool(p > q), RC_OK;
        case OP_GE: return *out = jv_bool(p >= q), RC_OK;
        case OP_LE: return *out = jv_bool(p <= q), RC_OK;
        default: break;
        }
    } else if ((a.t == V_ARR || a.t == V_TUPLE) && (b.t == V_ARR || b.t == V_TUPLE)) {
        if (op == OP_ADD) {
            jarr *c = jv_new_arr(r, a.u.a->n + b.u.a->n);
            if (!c) return jv_oom(r, x);
            if (a.u.a->n) memcpy(c->v, a.u.a->v, a.u.a->n * sizeof(jv));
            if (b.u.a->n) memcpy(c->v + a.u.a->n, b.u.a->v, b.u.a->n * sizeof(jv));
            return *out = jv_arr(c, V_ARR), RC_OK;
        }
    }
    if (a.t == V_STR && b.t == V_STR && op == OP_ADD) {
        jj_buf t = jv_new_buf(r);
        int rc = jv_to_print(r, x, a, &t);
        if (!rc) rc = jv_to_print(r, x, b, &t);
        if (!rc) rc = jv_buf_check(r, x, &t);
        if (rc) {
            jj_buf_free(&t);
            return rc;
        }
        return jv_buf_to_str(r, x, &t, out);
    }
    return jv_err(r, x, "unknown operator \"%s\" between %s and %s", opn[op], jv_type_name(a.t), jv_type_name(b.t));
}

static int eval_inner(R *r, jenv *e, const jj_node *x, jv *out);

int jj_eval(R *r, jenv *e, const jj_node *x, jv *out) {
    if (++r->nest > MAX_EVAL_NEST) {
        r->nest--;
        jv_err(r, x, "template evaluation nested deeper than %d levels", MAX_EVAL_NEST);
        r->err->code = MS_ERR_NOMEM;
        return RC_ERR;
    }
    int rc = eval_inner(r, e, x, out);
    r->nest--;
    return rc;
}

static int eval_inner(R *r, jenv *e, const jj_node *x, jv *out) {
    switch (x->kind) {
    case E_INT: return *out = jv_num(V_INT, x->num), RC_OK;
    case E_FLOAT: return *out = jv_num(V_FLOAT, x->num), RC_OK;
    case E_STR: return *out = jv_str(x->s, x->slen), RC_OK;
    case E_IDENT:
        *out = env_get(e, x->s, x->slen);
        return out->t == V_LOOP ? materialize_loop(r, x, *out, out) : RC_OK;
    case E_ARRAY: case E_TUPLE: {
        jarr *a = jv_new_arr(r, (size_t)x->n);
        if (!a) return jv_oom(r, x);
        for (int i = 0; i < x->n; i++) MS_TRY(jj_eval(r, e, x->list[i], &a->v[i]));
        return *out = jv_arr(a, x->kind == E_TUPLE ? V_TUPLE : V_ARR), RC_OK;
    }
    case E_OBJECT: {
        jobj *o = jv_new_obj(r, (size_t)x->n);
        if (!o) return jv_oom(r, x);
        for (int i = 0; i < x->n; i++) {
            jv k, v;
            MS_TRY(jj_eval(r, e, x->list[i], &k));
            if (k.t != V_STR) return jv_err(r, x, "object keys must be strings: got %s", jv_type_name(k.t));
            MS_TRY(jj_eval(r, e, x->list2[i], &v));
            if (jv_obj_set(r, o, k.u.s, k.n, v)) return jv_oom(r, x);
        }
        return *out = jv_obj(o, V_OBJ), RC_OK;
    }
    case E_MEMBER: return eval_member(r, e, x, out);
    case E_CALL: {
        jv *args, fn;
        size_t n;
        jobj *kw;
        MS_TRY(jj_eval_args(r, e, x->list, x->n, &args, &n, &kw));
        if (kw->n) args[n++] = jv_obj(kw, V_KWARGS); /* jj_eval_args leaves one spare slot */
        MS_TRY(jj_eval(r, e, x->a, &fn));
        return jj_call_fn(r, x, fn, args, n, e, out);
    }
    case E_BINARY: return eval_binary(r, e, x, out);
    case E_UNARY: {
        jv a;
        MS_TRY(jj_eval(r, e, x->a, &a));
        if (x->op == OP_NOT) return *out = jv_bool(!jv_truthy(a)), RC_OK;
        double sign = x->op == OP_NEG ? -1 : 1;
        if (a.t == V_INT || a.t == V_FLOAT) return *out = jv_num(a.t, sign * a.u.d), RC_OK;
        if (a.t == V_BOOL) return *out = jv_num(V_INT, sign * a.u.b), RC_OK;
        return jv_err(r, x, "unknown operator \"%c\" for %s", x->op == OP_NEG ? '-' : '+', jv_type_name(a.t));
    }
    case E_FILTER: {
        jv a;
        MS_TRY(jj_eval(r, e, x->a, &a));
        return jj_apply_filter(r, e, x, a, out);
    }
    case E_TEST: {
        jv a;
        int res;
        MS_TRY(jj_eval(r, e, x->a, &a));
        MS_TRY(jj_run_test(r, x, x->s, x->slen, a, NULL, &res));
        return *out = jv_bool(x->flag ? !res : res), RC_OK;
    }
    case E_SELECT: {
        jv t;
        MS_TRY(jj_eval(r, e, x->b, &t));
        if (!jv_truthy(t)) return *out = jv_make(V_UNDEF), RC_OK;
        return jj_eval(r, e, x->a, out);
    }
    case E_TERNARY: {
        jv t;
        MS_TRY(jj_eval(r, e, x->a, &t));
        return jj_eval(r, e, jv_truthy(t) ? x->b : x->c, out);
    }
    default:
        return jv_err(r, x, "unsupported expression here");
    }
}

/* ---- statements ----------------------------------------------------------------------------- */

static int bind_target(R *r, const jj_node *at, jenv *e, const jj_node *target, jv v, int in_for) {
    if (target->kind == E_IDENT) return jj_env_set(r, e, target->s, target->slen, v) ? jv_oom(r, at) : RC_OK;
    /* tuple */
    if (in_for ? v.t != V_ARR : (v.t != V_ARR && v.t != V_TUPLE))
        return jv_err(r, at, "cannot unpack non-iterable type %s", jv_type_name(v.t));
    if ((size_t)target->n != v.u.a->n)
        return jv_err(r, at, "too %s items to unpack", (size_t)target->n > v.u.a->n ? "few" : "many");
    for (int i = 0; i < target->n; i++) {
        const jj_node *t = target->list[i];
        if (t->kind != E_IDENT) return jv_err(r, at, "cannot unpack to a non-identifier");
        if (jj_env_set(r, e, t->s, t->slen, v.u.a->v[i])) return jv_oom(r, at);
    }
    return RC_OK;
}

static int exec_for(R *r, jenv *env, const jj_node *x, jj_buf *out) {
    jenv *scope = jj_new_env(r, env);
    if (!scope) return jv_oom(r, x);
    const jj_node *it = x->b, *test = NULL;
    if (it->kind == E_SELECT) {
        test = it->b;
        it = it->a;
    }
    jv iter;
    MS_TRY(jj_eval(r, scope, it, &iter));
    if (iter.t == V_OBJ || iter.t == V_KWARGS) {
        jarr *k = jv_new_arr(r, iter.u.o->n);
        if (!k) return jv_oom(r, x);
        for (size_t i = 0; i < iter.u.o->n; i++) k->v[i] = jv_str(iter.u.o->k[i].s, iter.u.o->k[i].n);
        iter = jv_arr(k, V_ARR);
    } else if (iter.t == V_UNDEF) { /* jinja2's Undefined iterates as empty */
        jarr *k = jv_new_arr(r, 0);
        if (!k) return jv_oom(r, x);
        iter = jv_arr(k, V_ARR);
    } else if (iter.t == V_STR) { /* a str iterates over its characters */
        jarr *k = jv_new_arr(r, jj_cp_len(iter.u.s, iter.n));
        if (!k) return jv_oom(r, x);
        for (size_t i = 0, q = 0; i < iter.n; q++) {
            uint32_t cp;
            int l = ms_utf8_dec(iter.u.s + i, iter.n - i, &cp);
            k->v[q] = jv_str(iter.u.s + i, (size_t)l);
            i += (size_t)l;
        }
        iter = jv_arr(k, V_ARR);
    } else if (iter.t != V_ARR && iter.t != V_TUPLE) {
        return jv_err(r, x, "expected an iterable or object in the for loop, got %s", jv_type_name(iter.t));
    }
    jarr *items = iter.u.a;
    if (test) {
        jarr *kept = jv_new_arr(r, items->n);
        if (!kept) return jv_oom(r, x);
        size_t k = 0;
        for (size_t i = 0; i < items->n; i++) {
            MS_TRY(jv_step(r, x, 1));
            jenv *ls = jj_new_env(r, scope);
            if (!ls) return jv_oom(r, x);
            MS_TRY(bind_target(r, x, ls, x->a, items->v[i], 1));
            jv t;
            MS_TRY(jj_eval(r, ls, test, &t));
            if (jv_truthy(t)) kept->v[k++] = items->v[i];
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
        MS_TRY(jv_step(r, x, 1));
        jv lv = jv_make(V_LOOP);
        lv.u.a = items;
        lv.n = i;
        if (jj_env_set(r, scope, "loop", 4, lv)) return jv_oom(r, x);
        MS_TRY(bind_target(r, x, scope, x->a, items->v[i], 1));
        size_t mark = out->n;
        int rc = jj_exec_block(r, scope, x->list, x->n, out);
        if (rc == RC_CONT || rc == RC_BREAK) {
            out->n = mark; /* the oracle drops the interrupted iteration's output */
            if (out->p) out->p[mark] = 0;
            if (rc == RC_BREAK) break;
            continue;
        }
        if (rc) return rc;
        none = 0;
    }
    if (none) return jj_exec_block(r, scope, x->list2, x->n2, out);
    return RC_OK;
}

static int exec_set(R *r, jenv *e, const jj_node *x) {
    jv rhs;
    if (x->b) {
        MS_TRY(jj_eval(r, e, x->b, &rhs));
    } else {
        jj_buf b = jv_new_buf(r);
        int rc = jj_exec_block(r, e, x->list, x->n, &b);
        if (!rc) rc = jv_buf_check(r, x, &b);
        if (rc) {
            jj_buf_free(&b);
            return rc;
        }
        MS_TRY(jv_buf_to_str(r, x, &b, &rhs));
    }
    const jj_node *t = x->a;
    if (t->kind == E_IDENT || t->kind == E_TUPLE) return bind_target(r, x, e, t, rhs, 0);
    if (t->kind == E_MEMBER) {
        jv obj;
        MS_TRY(jj_eval(r, e, t->a, &obj));
        if (obj.t != V_NS) return jv_err(r, x, "cannot assign attribute on non-namespace object");
        if (t->flag || t->b->kind != E_IDENT) return jv_err(r, x, "cannot assign to a member with a non-identifier property");
        if (jv_obj_set(r, obj.u.o, t->b->s, t->b->slen, rhs)) return jv_oom(r, x);
        return RC_OK;
    }
    return jv_err(r, x, "invalid left-hand side in set");
}

static int exec_node(R *r, jenv *e, const jj_node *x, jj_buf *out) {
    switch (x->kind) {
    case N_COMMENT: return RC_OK;
    case N_BREAK: return RC_BREAK;
    case N_CONTINUE: return RC_CONT;
    case N_SET: return exec_set(r, e, x);
    case N_IF: {
        jv t;
        MS_TRY(jj_eval(r, e, x->a, &t));
        return jv_truthy(t) ? jj_exec_block(r, e, x->list, x->n, out) : jj_exec_block(r, e, x->list2, x->n2, out);
    }
    case N_FOR: return exec_for(r, e, x, out);
    case N_MACRO: {
        jfn *f = jv_ralloc(r, sizeof *f);
        if (!f) return jv_oom(r, x);
        f->kind = F_MACRO;
        f->node = x;
        jv v = jv_make(V_FUNC);
        v.u.f = f;
        return jj_env_set(r, e, x->s, x->slen, v) ? jv_oom(r, x) : RC_OK;
    }
    case N_CALLBLOCK: {
        jfn *cf = jv_ralloc(r, sizeof *cf);
        if (!cf) return jv_oom(r, x);
        cf->kind = F_CALLER;
        cf->node = x;
        cf->env = e;
        const jj_node *c = x->a;
        jv *args, fn, res;
        size_t n;
        jobj *kw;
        MS_TRY(jj_eval_args(r, e, c->list, c->n, &args, &n, &kw));
        args[n++] = jv_obj(kw, V_KWARGS);
        MS_TRY(jj_eval(r, e, c->a, &fn));
        if (fn.t != V_FUNC) return jv_err(r, x, "cannot call something that is not a function: got %s", jv_type_name(fn.t));
        jenv *ne = jj_new_env(r, e);
        if (!ne) return jv_oom(r, x);
        jv cv = jv_make(V_FUNC);
        cv.u.f = cf;
        if (jj_env_set(r, ne, "caller", 6, cv)) return jv_oom(r, x);
        MS_TRY(jj_call_fn(r, x, fn, args, n, ne, &res));
        return jv_to_print(r, x, res, out);
    }
    case N_FILTERBLOCK: {
        jj_buf b = jv_new_buf(r);
        int rc = jj_exec_block(r, e, x->list2, x->n2, &b);
        if (!rc) rc = jv_buf_check(r, x, &b);
        if (rc) {
            jj_buf_free(&b);
            return rc;
        }
        jv body, res;
        MS_TRY(jv_buf_to_str(r, x, &b, &body));
        MS_TRY(jj_apply_filter(r, e, x, body, &res));
        if (res.t == V_UNDEF) return RC_OK;
        return jv_to_print(r, x, res, out);
    }
    default: {
        jv v;
        MS_TRY(jj_eval(r, e, x, &v));
        if (v.t == V_UNDEF) return RC_OK;
        return jv_to_print(r, x, v, out);
    }
    }
}

int jj_exec_block(R *r, jenv *e, jj_node *const *list, int n, jj_buf *out) {
    if (++r->nest > MAX_EVAL_NEST) {
        r->nest--;
        jv_err(r, n ? list[0] : NULL, "template evaluation nested deeper than %d levels", MAX_EVAL_NEST);
        r->err->code = MS_ERR_NOMEM;
        return RC_ERR;
    }
    int rc = RC_OK;
    for (int i = 0; i < n && !rc; i++) {
        rc = exec_node(r, e, list[i], out);
        if (!rc && out->over) rc = jv_buf_check(r, list[i], out);
        if (!rc && r->ar.over) rc = jv_oom(r, list[i]);
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
    jenv *g = jj_new_env(&r, NULL);
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
        jv v = jv_make(consts[i].t);
        v.u.b = consts[i].b;
        jj_env_set(&r, g, consts[i].k, strlen(consts[i].k), v);
    }
    jv f = jv_make(V_FUNC);
    f.u.f = &k_raise;
    jj_env_set(&r, g, "raise_exception", 15, f);
    f.u.f = &k_range;
    jj_env_set(&r, g, "range", 5, f);
    f.u.f = &k_strftime;
    jj_env_set(&r, g, "strftime_now", 12, f);
    if (ctx && json_is_object(ctx)) {
        const char *k;
        json_t *val;
        json_object_foreach(ctx, k, val) {
            jv v;
            rc = jv_from_json(&r, val, &v, 0);
            if (rc) break;
            if (jj_env_set(&r, g, k, strlen(k), v)) {
                rc = jv_oom(&r, NULL);
                break;
            }
        }
    }
    jj_buf b = jv_new_buf(&r);
    if (!rc && !r.ar.over) {
        rc = jj_exec_block(&r, g, prog->body, prog->n, &b);
        if (rc == RC_BREAK || rc == RC_CONT)
            rc = jv_err(&r, NULL, "{%% %s %%} outside of a for loop", rc == RC_BREAK ? "break" : "continue");
        if (!rc) rc = jv_buf_check(&r, NULL, &b);
    } else if (!rc) {
        rc = jv_oom(&r, NULL);
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
