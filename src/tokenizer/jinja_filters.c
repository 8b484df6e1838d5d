/* jinja_filters.c - the `|filter` and `is test` vocabulary of chat templates. Kept in one place
 * because it is the part that grows: each new model's template tends to reach for another jinja2
 * filter, and each one must behave as jinja2's does (or, where marked, as @huggingface/jinja's, the
 * first oracle) so that rendering stays faithful. The extensions section holds the Python jinja2
 * filters and str methods the first oracle lacks. */
#include "tokenizer/jinja_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- tests ---------------------------------------------------------------------------------- */

int jj_run_test(R *r, const jj_node *at, const char *name, size_t n, jv a, jv *b, int *res) {
#define IS(lit) (n == sizeof(lit) - 1 && !memcmp(name, lit, n))
    if (IS("boolean")) *res = a.t == V_BOOL;
    else if (IS("callable")) *res = a.t == V_FUNC;
    else if (IS("odd") || IS("even")) {
        if (a.t != V_INT) return jv_err(r, at, "cannot %.*s on %s", (int)n, name, jv_type_name(a.t));
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
            MS_TRY(jv_map_case(r, at, a, IS("upper"), &m));
            *res = jv_str_eq(a, m);
        }
    } else if (IS("defined")) *res = a.t != V_UNDEF;
    else if (IS("undefined")) *res = a.t == V_UNDEF;
    else if (IS("equalto") || IS("eq")) {
        if (!b) return jv_err(r, at, "test '%.*s' needs a value to compare with", (int)n, name);
        *res = jv_py_eq(a, *b, 0);
    } else return jv_err(r, at, "unknown test '%.*s'", (int)n, name);
#undef IS
    return RC_OK;
}

/* ---- filters -------------------------------------------------------------------------------- */

/* Python's int(s) then int(float(s)) as jinja2's int filter tries them; NaN when neither parses. */
static double py_parse_int(jv s) {
    jv t = jv_py_strip(s, 3, jv_make(V_UNDEF));
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
    jv t = jv_py_strip(s, 1, jv_make(V_UNDEF));
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
    jv t = jv_py_strip(s, 1, jv_make(V_UNDEF));
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
    jj_buf b = jv_new_buf(r);
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
    if (jv_buf_check(r, at, &b)) {
        jj_buf_free(&b);
        return RC_ERR;
    }
    return jv_buf_to_str(r, at, &b, out);
}

/* Value of item at a dotted attribute path ("a.b", "items.0"), or undefined. */
static jv attr_path(jv item, const char *path, size_t n) {
    size_t s = 0;
    while (1) {
        size_t e = s;
        while (e < n && path[e] != '.') e++;
        if (item.t == V_OBJ || item.t == V_KWARGS || item.t == V_NS) {
            jv *p = jv_obj_get(item.u.o, path + s, e - s);
            item = p ? *p : jv_make(V_UNDEF);
        } else if (item.t == V_ARR || item.t == V_TUPLE) {
            /* parseInt(part, 10) */
            jv part = jv_str(path + s, e - s);
            double idx = js_parse_int(part);
            if (isnan(idx) || idx < 0 || idx >= (double)item.u.a->n) return jv_make(V_UNDEF);
            item = item.u.a->v[(size_t)idx];
        } else {
            return jv_make(V_UNDEF);
        }
        if (e >= n) return item;
        s = e + 1;
    }
}

static int join_values(R *r, const jj_node *at, jv operand, jv sep, jv *out) {
    jj_buf b = jv_new_buf(r);
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
            rc = jv_to_print(r, at, x, &b);
        }
    }
    if (!rc) rc = jv_buf_check(r, at, &b);
    if (rc) {
        jj_buf_free(&b);
        return rc;
    }
    return jv_buf_to_str(r, at, &b, out);
}

static int tojson_value(R *r, const jj_node *at, jv v, const jopts *o, jv *out) {
    jj_buf b = jv_new_buf(r);
    int rc = jv_to_json(r, at, v, o, 0, 1, &b);
    if (!rc) rc = jv_buf_check(r, at, &b);
    if (rc) {
        jj_buf_free(&b);
        return rc;
    }
    return jv_buf_to_str(r, at, &b, out);
}

int jj_obj_items(R *r, const jj_node *at, jv o, jv *out) {
    jarr *a = jv_new_arr(r, o.u.o->n);
    if (!a) return jv_oom(r, at);
    for (size_t i = 0; i < o.u.o->n; i++) {
        jarr *pair = jv_new_arr(r, 2);
        if (!pair) return jv_oom(r, at);
        pair->v[0] = jv_str(o.u.o->k[i].s, o.u.o->k[i].n);
        pair->v[1] = o.u.o->v[i];
        a->v[i] = jv_arr(pair, V_ARR);
    }
    *out = jv_arr(a, V_ARR);
    return RC_OK;
}

/* ---- extensions: Python jinja2 filters the oracle does not have (it fails on them) ----------- */

static int ext_filter(R *r, jenv *e, const jj_node *f, jv v, jv *out) {
    const char *name = f->s;
    size_t nl = f->slen;
    const jj_node *at = f;
#define IS(lit) (nl == sizeof(lit) - 1 && !memcmp(name, lit, nl))
    jv *args = NULL;
    size_t na = 0;
    jobj *kw = NULL;
    if (f->flag) MS_TRY(jj_eval_args(r, e, f->list, f->n, &args, &na, &kw));
    if (IS("count")) { /* = length */
        if (v.t == V_STR) return *out = jv_num(V_INT, (double)jj_cp_len(v.u.s, v.n)), RC_OK;
        if (v.t == V_ARR || v.t == V_TUPLE) return *out = jv_num(V_INT, (double)v.u.a->n), RC_OK;
        if (v.t == V_OBJ || v.t == V_KWARGS || v.t == V_NS) return *out = jv_num(V_INT, (double)v.u.o->n), RC_OK;
        return jv_err(r, at, "cannot apply filter \"count\" to type %s", jv_type_name(v.t));
    }
    if (IS("d")) { /* = default(value='', boolean=false) */
        jv def = na > 0 ? args[0] : jv_cstr("");
        jv boolean = jj_arg_or(args, na, 1, kw, "boolean", jv_bool(0));
        if (v.t == V_UNDEF || (jv_truthy(boolean) && !jv_truthy(v))) return *out = def, RC_OK;
        return *out = v, RC_OK;
    }
    if (IS("select") || IS("reject")) {
        if (v.t != V_ARR && v.t != V_TUPLE) return jv_err(r, at, "cannot apply filter \"%.*s\" to type %s", (int)nl, name, jv_type_name(v.t));
        if (na > 0 && args[0].t != V_STR) return jv_err(r, at, "the test name of \"%.*s\" must be a string", (int)nl, name);
        int sel = IS("select");
        jarr *b = jv_new_arr(r, v.u.a->n);
        if (!b) return jv_oom(r, at);
        size_t k = 0;
        for (size_t i = 0; i < v.u.a->n; i++) {
            int res;
            if (na == 0) res = jv_truthy(v.u.a->v[i]);
            else MS_TRY(jj_run_test(r, at, args[0].u.s, args[0].n, v.u.a->v[i], na > 1 ? &args[1] : NULL, &res));
            if (sel ? res : !res) b->v[k++] = v.u.a->v[i];
        }
        b->n = k;
        return *out = jv_arr(b, V_ARR), RC_OK;
    }
    if (IS("round")) {
        if (v.t != V_INT && v.t != V_FLOAT) return jv_err(r, at, "cannot apply filter \"round\" to type %s", jv_type_name(v.t));
        jv prec = jj_arg_or(args, na, 0, kw, "precision", jv_num(V_INT, 0));
        jv meth = jj_arg_or(args, na, 1, kw, "method", jv_cstr("common"));
        if (prec.t != V_INT || meth.t != V_STR) return jv_err(r, at, "round(precision, method): bad arguments");
        double p = pow(10, prec.u.d), x = v.u.d * p, y;
        if (jv_str_eq(meth, jv_cstr("common"))) { /* Python's round(): ties to even; ints stay ints */
            if (v.t == V_INT && prec.u.d >= 0) return *out = v, RC_OK;
            y = nearbyint(x);
        }
        else if (jv_str_eq(meth, jv_cstr("ceil"))) y = ceil(x);
        else if (jv_str_eq(meth, jv_cstr("floor"))) y = floor(x);
        else return jv_err(r, at, "round method must be 'common', 'ceil' or 'floor'");
        return *out = jv_num(V_FLOAT, y / p), RC_OK;
    }
    if (IS("wordcount")) { /* len(re.findall(r"\w+", s)) */
        if (v.t != V_STR) return jv_err(r, at, "cannot apply filter \"wordcount\" to type %s", jv_type_name(v.t));
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
        return *out = jv_num(V_INT, words), RC_OK;
    }
    /* escape / e: HTML-escape the text */
    jv sv;
    MS_TRY(jv_print_to_str(r, at, v, &sv));
    jj_buf b = jv_new_buf(r);
    for (size_t i = 0; i < sv.n; i++) {
        char c = sv.u.s[i];
        if (c == '&') jj_buf_puts(&b, "&amp;");
        else if (c == '<') jj_buf_puts(&b, "&lt;");
        else if (c == '>') jj_buf_puts(&b, "&gt;");
        else if (c == '"') jj_buf_puts(&b, "&#34;");
        else if (c == '\'') jj_buf_puts(&b, "&#39;");
        else jj_buf_putc(&b, c);
    }
    if (jv_buf_check(r, at, &b)) {
        jj_buf_free(&b);
        return RC_ERR;
    }
    return jv_buf_to_str(r, at, &b, out);
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
int jj_py_str_method(R *r, const jj_node *at, int id, jv self, jv *args, size_t n, jv *out) {
    if (n > 0 && args[n - 1].t == V_KWARGS) n--;
    if (id == M_FIND || id == M_COUNT) {
        if (n < 1 || args[0].t != V_STR) return jv_err(r, at, "%s() needs a string argument", id == M_FIND ? "find" : "count");
        jv sub = args[0];
        if (id == M_FIND) {
            long long p = jj_str_find_ll(self, 0, sub);
            return *out = jv_num(V_INT, p < 0 ? -1 : cp_index(self, (size_t)p)), RC_OK;
        }
        double c = 0;
        if (sub.n == 0) c = cp_index(self, self.n) + 1;
        else
            for (long long p = jj_str_find_ll(self, 0, sub); p >= 0; p = jj_str_find_ll(self, (size_t)p + sub.n, sub)) c++;
        return *out = jv_num(V_INT, c), RC_OK;
    }
    if (id == M_JOIN) {
        if (n < 1 || (args[0].t != V_ARR && args[0].t != V_TUPLE)) return jv_err(r, at, "join() needs a list");
        jj_buf b = jv_new_buf(r);
        for (size_t i = 0; i < args[0].u.a->n; i++) {
            jv x = args[0].u.a->v[i];
            if (x.t != V_STR) {
                jj_buf_free(&b);
                return jv_err(r, at, "join(): sequence item %zu is %s, not a string", i, jv_type_name(x.t));
            }
            if (i) jj_buf_put(&b, self.u.s, self.n);
            jj_buf_put(&b, x.u.s, x.n);
        }
        if (jv_buf_check(r, at, &b)) {
            jj_buf_free(&b);
            return RC_ERR;
        }
        return jv_buf_to_str(r, at, &b, out);
    }
    /* rsplit(sep=None, maxsplit=-1) */
    jv sep = n > 0 ? args[0] : jv_make(V_NULL);
    double maxsplit = n > 1 && args[1].t == V_INT ? args[1].u.d : -1;
    if (sep.t != V_STR && sep.t != V_NULL) return jv_err(r, at, "rsplit() sep must be a string or none");
    if (sep.t == V_STR && sep.n == 0) return jv_err(r, at, "rsplit(): empty separator");
    size_t cap = 16, cnt = 0;
    jv *parts = malloc(cap * sizeof *parts);
    if (!parts) return jv_oom(r, at);
    size_t end = self.n;
    while (1) {
        if (cnt == cap) {
            jv *np = realloc(parts, 2 * cap * sizeof *parts);
            if (!np) {
                free(parts);
                return jv_oom(r, at);
            }
            parts = np;
            cap *= 2;
        }
        if (sep.t == V_NULL) {
            jv rest = jv_py_strip(jv_str(self.u.s, end), 2, jv_make(V_UNDEF));
            end = rest.n;
            if (end == 0) break;
            if (maxsplit >= 0 && (double)cnt >= maxsplit) {
                parts[cnt++] = jv_str(self.u.s, end);
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
            parts[cnt++] = jv_str(self.u.s + st, end - st);
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
                parts[cnt++] = jv_str(self.u.s, end);
                break;
            }
            parts[cnt++] = jv_str(self.u.s + found + sep.n, end - (size_t)found - sep.n);
            end = (size_t)found;
        }
    }
    jarr *a = jv_new_arr(r, cnt);
    if (!a) {
        free(parts);
        return jv_oom(r, at);
    }
    for (size_t i = 0; i < cnt; i++) a->v[i] = parts[cnt - 1 - i];
    free(parts);
    return *out = jv_arr(a, V_ARR), RC_OK;
}

int jj_apply_filter(R *r, jenv *e, const jj_node *f, jv v, jv *out) {
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
            MS_TRY(jv_print_to_str(r, at, v, &v)); /* jinja2 converts with str() first (undefined -> "") */
        if (v.t == V_UNDEF && IS("length")) return *out = jv_num(V_INT, 0), RC_OK;
        if (IS("tojson")) {
            jopts o = {-1, 0, 0, ", ", ": ", 2, 2};
            return tojson_value(r, at, v, &o, out);
        }
        if (v.t == V_ARR || v.t == V_TUPLE) {
            jarr *a = v.u.a;
            if (IS("list")) return *out = v, RC_OK;
            if (IS("first") || IS("last")) {
                if (a->n == 0) return jv_err(r, at, "filter '%.*s' applied to an empty list", (int)nl, name);
                *out = IS("first") ? a->v[0] : a->v[a->n - 1];
                return RC_OK;
            }
            if (IS("length")) return *out = jv_num(V_INT, (double)a->n), RC_OK;
            if (IS("reverse")) {
                jarr *b = jv_new_arr(r, a->n);
                if (!b) return jv_oom(r, at);
                for (size_t i = 0; i < a->n; i++) b->v[i] = a->v[a->n - 1 - i];
                return *out = jv_arr(b, V_ARR), RC_OK;
            }
            if (IS("sort")) return jv_sort_values(r, at, a->v, a->v, a->n, 0, 0, out);
            if (IS("join")) return join_values(r, at, v, jv_cstr(""), out);
            if (IS("string")) {
                jj_buf b = jv_new_buf(r);
                int rc = jv_to_print(r, at, v, &b);
                if (!rc) rc = jv_buf_check(r, at, &b);
                if (rc) {
                    jj_buf_free(&b);
                    return rc;
                }
                return jv_buf_to_str(r, at, &b, out);
            }
            if (IS("unique")) {
                MS_TRY(jv_step(r, at, (long long)(a->n * (a->n / 64 + 1))));
                jarr *b = jv_new_arr(r, a->n);
                if (!b) return jv_oom(r, at);
                size_t k = 0;
                for (size_t i = 0; i < a->n; i++) {
                    int seen = 0;
                    for (size_t j = 0; j < k && !seen; j++) seen = jv_strict_eq(b->v[j], a->v[i], 1);
                    if (!seen) b->v[k++] = a->v[i];
                }
                b->n = k;
                return *out = jv_arr(b, V_ARR), RC_OK;
            }
            return jv_err(r, at, "unknown ArrayValue filter: %.*s", (int)nl, name);
        }
        if (v.t == V_STR) {
            if (IS("length")) return *out = jv_num(V_INT, (double)jj_cp_len(v.u.s, v.n)), RC_OK;
            if (IS("upper")) return jv_map_case(r, at, v, 1, out);
            if (IS("lower")) return jv_map_case(r, at, v, 0, out);
            if (IS("title")) return jv_title_case(r, at, v, out);
            if (IS("capitalize")) return jv_capitalize(r, at, v, out);
            if (IS("trim")) return *out = jv_py_strip(v, 3, jv_make(V_UNDEF)), RC_OK;
            if (IS("indent")) return indent_lines(r, at, v, 4, 0, 0, out);
            if (IS("join") || IS("string")) return *out = v, RC_OK;
            if (IS("int")) {
                double d = py_parse_int(v);
                return *out = jv_num(V_INT, isnan(d) ? 0 : d), RC_OK;
            }
            if (IS("float")) {
                double d = js_parse_float(v);
                return *out = jv_num(V_FLOAT, isnan(d) ? 0 : d), RC_OK;
            }
            return jv_err(r, at, "unknown StringValue filter: %.*s", (int)nl, name);
        }
        if (v.t == V_INT || v.t == V_FLOAT) {
            if (IS("abs")) return *out = jv_num(v.t, fabs(v.u.d)), RC_OK;
            if (IS("int")) return *out = jv_num(V_INT, trunc(v.u.d)), RC_OK;
            if (IS("float")) return *out = jv_num(V_FLOAT, v.u.d), RC_OK;
            if (IS("string")) return jv_print_to_str(r, at, v, out);
            return jv_err(r, at, "unknown NumericValue filter: %.*s", (int)nl, name);
        }
        if (v.t == V_OBJ || v.t == V_KWARGS) {
            if (IS("items")) return jj_obj_items(r, at, v, out);
            if (IS("length")) return *out = jv_num(V_INT, (double)v.u.o->n), RC_OK;
            jv m;
            MS_TRY(jj_builtin_member(r, at, v, jv_str(name, nl), &m));
            if (m.t == V_FUNC) return jj_call_method(r, at, m.u.f->id, v, NULL, 0, out);
            if (m.t != V_UNDEF) return *out = m, RC_OK;
            return jv_err(r, at, "unknown ObjectValue filter: %.*s", (int)nl, name);
        }
        if (v.t == V_BOOL) {
            if (IS("bool")) return *out = v, RC_OK;
            if (IS("int")) return *out = jv_num(V_INT, v.u.b), RC_OK;
            if (IS("float")) return *out = jv_num(V_FLOAT, v.u.b), RC_OK;
            if (IS("string")) return *out = jv_cstr(v.u.b ? "True" : "False"), RC_OK;
            return jv_err(r, at, "unknown BooleanValue filter: %.*s", (int)nl, name);
        }
        return jv_err(r, at, "cannot apply filter \"%.*s\" to type %s", (int)nl, name, jv_type_name(v.t));
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
                    return jv_err(r, at, "`%.*s` can only be applied to an array of objects", (int)nl, name);
            }
            for (int i = 0; i < f->n; i++)
                if (f->list[i]->kind != E_STR) return jv_err(r, at, "arguments of `%.*s` must be strings", (int)nl, name);
            if (f->n < 1) return jv_err(r, at, "`%.*s` needs an attribute name", (int)nl, name);
            jv attr = jv_str(f->list[0]->s, f->list[0]->slen);
            jarr *b = jv_new_arr(r, v.u.a->n);
            if (!b) return jv_oom(r, at);
            size_t k = 0;
            for (size_t i = 0; i < v.u.a->n; i++) {
                jv *a = jv_obj_get(v.u.a->v[i].u.o, attr.u.s, attr.n);
                int res = 0;
                if (a) {
                    if (f->n >= 2) {
                        jv cmpv = f->n >= 3 ? jv_str(f->list[2]->s, f->list[2]->slen) : jv_make(V_UNDEF);
                        MS_TRY(jj_run_test(r, at, f->list[1]->s, f->list[1]->slen, *a, f->n >= 3 ? &cmpv : NULL, &res));
                    } else {
                        res = jv_truthy(*a);
                    }
                }
                if (sel ? res : !res) b->v[k++] = v.u.a->v[i];
            }
            b->n = k;
            return *out = jv_arr(b, V_ARR), RC_OK;
        }
    }
    MS_TRY(jj_eval_args(r, e, f->list, f->n, &args, &na, &kw));
    if (IS("tojson")) {
        jv ind = jj_kw_get(kw, "indent"), asc = jj_kw_get(kw, "ensure_ascii"), sk = jj_kw_get(kw, "sort_keys"),
           seps = jj_kw_get(kw, "separators");
        if (ind.t != V_INT && ind.t != V_UNDEF && ind.t != V_NULL) return jv_err(r, at, "if set, indent must be a number");
        if (asc.t != V_BOOL && asc.t != V_UNDEF) return jv_err(r, at, "if set, ensure_ascii must be a boolean");
        if (sk.t != V_BOOL && sk.t != V_UNDEF) return jv_err(r, at, "if set, sort_keys must be a boolean");
        jopts o = {-1, asc.t == V_BOOL && asc.u.b, sk.t == V_BOOL && sk.u.b, NULL, NULL, 0, 0};
        if (ind.t == V_INT) {
            if (ind.u.d < 0) return jv_err(r, at, "tojson indent must not be negative");
            if (ind.u.d > 64) return jv_err(r, at, "tojson indent %g is too large", ind.u.d);
            o.indent = (int)ind.u.d;
        }
        if (seps.t == V_ARR || seps.t == V_TUPLE) {
            if (seps.u.a->n != 2 || seps.u.a->v[0].t != V_STR || seps.u.a->v[1].t != V_STR)
                return jv_err(r, at, "separators must be a tuple of two strings");
            o.item_sep = seps.u.a->v[0].u.s;
            o.item_sep_n = seps.u.a->v[0].n;
            o.key_sep = seps.u.a->v[1].u.s;
            o.key_sep_n = seps.u.a->v[1].n;
        } else if (seps.t != V_UNDEF && seps.t != V_NULL) {
            return jv_err(r, at, "if set, separators must be a tuple of two strings");
        } else if (o.indent > 0) {
            o.item_sep = ",", o.item_sep_n = 1, o.key_sep = ": ", o.key_sep_n = 2;
        } else {
            o.item_sep = ", ", o.item_sep_n = 2, o.key_sep = ": ", o.key_sep_n = 2;
        }
        return tojson_value(r, at, v, &o, out);
    }
    if (IS("join")) {
        if (v.t != V_STR && v.t != V_ARR && v.t != V_TUPLE)
            return jv_err(r, at, "cannot apply filter \"join\" to type %s", jv_type_name(v.t));
        jv sep = jj_arg_or(args, na, 0, kw, "separator", jv_cstr(""));
        if (sep.t != V_STR) return jv_err(r, at, "join separator must be a string");
        return join_values(r, at, v, sep, out);
    }
    if (IS("int") || IS("float")) {
        int isint = IS("int");
        jv def = jj_arg_or(args, na, 0, kw, "default", jv_num(isint ? V_INT : V_FLOAT, 0));
        if (v.t == V_STR) {
            double d = isint ? py_parse_int(v) : js_parse_float(v);
            return *out = isnan(d) ? def : jv_num(isint ? V_INT : V_FLOAT, d), RC_OK;
        }
        if (v.t == V_INT || v.t == V_FLOAT) return *out = jv_num(isint ? V_INT : V_FLOAT, isint ? trunc(v.u.d) : v.u.d), RC_OK;
        if (v.t == V_BOOL) return *out = jv_num(isint ? V_INT : V_FLOAT, v.u.b), RC_OK;
        return jv_err(r, at, "cannot apply filter \"%.*s\" to type %s", (int)nl, name, jv_type_name(v.t));
    }
    if (IS("default")) {
        jv def = na > 0 ? args[0] : jv_cstr("");
        jv boolean = jj_arg_or(args, na, 1, kw, "boolean", jv_bool(0));
        if (boolean.t != V_BOOL) return jv_err(r, at, "`default` filter flag must be a boolean");
        if (v.t == V_UNDEF || (boolean.u.b && !jv_truthy(v))) return *out = def, RC_OK;
        return *out = v, RC_OK;
    }
    if (v.t == V_ARR || v.t == V_TUPLE) {
        jarr *a = v.u.a;
        if (IS("sort")) {
            jv rev = jj_arg_or(args, na, 0, kw, "reverse", jv_bool(0));
            jv cs = jj_arg_or(args, na, 1, kw, "case_sensitive", jv_bool(0));
            jv attr = jj_arg_or(args, na, 2, kw, "attribute", jv_make(V_NULL));
            if (rev.t != V_BOOL) return jv_err(r, at, "reverse must be a boolean");
            if (cs.t != V_BOOL) return jv_err(r, at, "case_sensitive must be a boolean");
            if (attr.t != V_STR && attr.t != V_INT && attr.t != V_NULL)
                return jv_err(r, at, "attribute must be a string, integer, or null");
            jv *keys = jv_ralloc(r, (a->n + 1) * sizeof(jv));
            if (!keys) return jv_oom(r, at);
            char tmp[40];
            jv path = attr;
            if (attr.t == V_INT) {
                snprintf(tmp, sizeof tmp, "%.0f", attr.u.d);
                path = jv_cstr(tmp);
            }
            for (size_t i = 0; i < a->n; i++) keys[i] = attr.t == V_NULL ? a->v[i] : attr_path(a->v[i], path.u.s, path.n);
            return jv_sort_values(r, at, a->v, keys, a->n, cs.u.b, rev.u.b, out);
        }
        if (IS("map")) {
            jv *attrp = kw ? jv_obj_get(kw, "attribute", 9) : NULL;
            if (!attrp) return jv_err(r, at, "`map` expressions without `attribute` set are not supported");
            if (attrp->t != V_STR) return jv_err(r, at, "attribute must be a string");
            jv *defp = jv_obj_get(kw, "default", 7);
            jarr *b = jv_new_arr(r, a->n);
            if (!b) return jv_oom(r, at);
            for (size_t i = 0; i < a->n; i++) {
                jv it = a->v[i];
                if (it.t != V_OBJ && it.t != V_KWARGS && it.t != V_NS) return jv_err(r, at, "items in map must be objects");
                jv x = attr_path(it, attrp->u.s, attrp->n);
                b->v[i] = x.t == V_UNDEF ? (defp ? *defp : jv_make(V_UNDEF)) : x;
            }
            return *out = jv_arr(b, V_ARR), RC_OK;
        }
        return jv_err(r, at, "unknown ArrayValue filter: %.*s", (int)nl, name);
    }
    if (v.t == V_STR) {
        if (IS("indent")) {
            jv w = jj_arg_or(args, na, 0, kw, "width", jv_num(V_INT, 4));
            if (w.t != V_INT) return jv_err(r, at, "width must be a number");
            if (w.u.d > 4096) return jv_err(r, at, "indent width %g is too large", w.u.d);
            jv first = jj_arg_or(args, na, 1, kw, "first", jv_bool(0));
            jv blank = jj_arg_or(args, na, 2, kw, "blank", jv_bool(0));
            return indent_lines(r, at, v, (long)w.u.d, jv_truthy(first), jv_truthy(blank), out);
        }
        if (IS("replace")) {
            jv *all = jv_ralloc(r, (na + 1) * sizeof(jv));
            if (!all) return jv_oom(r, at);
            if (na) memcpy(all, args, na * sizeof(jv));
            all[na] = jv_obj(kw, V_KWARGS);
            return jj_call_method(r, at, M_REPLACE, v, all, na + 1, out);
        }
        return jv_err(r, at, "unknown StringValue filter: %.*s", (int)nl, name);
    }
    if (v.t == V_OBJ || v.t == V_KWARGS) {
        jv m;
        MS_TRY(jj_builtin_member(r, at, v, jv_str(name, nl), &m));
        if (m.t == V_FUNC) {
            jv *all = jv_ralloc(r, (na + 1) * sizeof(jv));
            if (!all) return jv_oom(r, at);
            if (na) memcpy(all, args, na * sizeof(jv));
            size_t nall = na;
            if (kw->n) all[nall++] = jv_obj(kw, V_KWARGS);
            return jj_call_method(r, at, m.u.f->id, v, all, nall, out);
        }
        return jv_err(r, at, "unknown ObjectValue filter: %.*s", (int)nl, name);
    }
    return jv_err(r, at, "cannot apply filter \"%.*s\" to type %s", (int)nl, name, jv_type_name(v.t));
#undef IS
}
