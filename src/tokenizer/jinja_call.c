/* jinja_call.c - everything a template can call: Python str/dict methods (x.strip(), x.split(),
 * d.items(), ...), the global functions transformers provides (raise_exception, range,
 * strftime_now, namespace), and macro and call-block invocation with jinja2's argument binding.
 * Kept apart from the evaluator because these follow Python's semantics case by case while the
 * evaluator follows the language's structure. */
#include "tokenizer/jinja_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- methods and built-in functions --------------------------------------------------------- */

long long jj_str_find_ll(jv hay, size_t from, jv needle) {
    if (needle.n == 0) return (long long)from;
    if (hay.n < needle.n) return -1;
    const char *p = memmem(hay.u.s + from, hay.n - from, needle.u.s, needle.n);
    return p ? (long long)(p - hay.u.s) : -1;
}

static int prefix_test(R *r, const jj_node *at, jv self, jv *args, size_t n, int ends, jv *out) {
    if (n == 0) return jv_err(r, at, "%s() requires at least one argument", ends ? "endswith" : "startswith");
    jv p = args[0];
    if (p.t == V_STR) {
        int ok = p.n <= self.n && !memcmp(ends ? self.u.s + self.n - p.n : self.u.s, p.u.s, p.n);
        return *out = jv_bool(ok), RC_OK;
    }
    if (p.t == V_ARR || p.t == V_TUPLE) {
        for (size_t i = 0; i < p.u.a->n; i++) {
            jv x = p.u.a->v[i];
            if (x.t != V_STR) return jv_err(r, at, "%s() tuple elements must be strings", ends ? "endswith" : "startswith");
            if (x.n <= self.n && !memcmp(ends ? self.u.s + self.n - x.n : self.u.s, x.u.s, x.n)) return *out = jv_bool(1), RC_OK;
        }
        return *out = jv_bool(0), RC_OK;
    }
    return jv_err(r, at, "%s() argument must be a string or tuple of strings", ends ? "endswith" : "startswith");
}

static int split_str(R *r, const jj_node *at, jv self, jv *args, size_t n, jv *out) {
    jv sep = n > 0 ? args[0] : jv_make(V_NULL);
    if (sep.t != V_STR && sep.t != V_NULL) return jv_err(r, at, "split() sep argument must be a string or null");
    jv maxs = n > 1 ? args[1] : jv_num(V_INT, -1);
    if (maxs.t != V_INT) return jv_err(r, at, "split() maxsplit argument must be a number");
    double maxsplit = maxs.u.d;
    size_t cap = 16, cnt = 0;
    jv *parts = malloc(cap * sizeof *parts);
    if (!parts) return jv_oom(r, at);
#define PUSH(val)                                                                                  \
    do {                                                                                          \
        if (cnt == cap) {                                                                         \
            cap *= 2;                                                                             \
            jv *np_ = realloc(parts, cap * sizeof *parts);                                        \
            if (!np_) {                                                                           \
                free(parts);                                                                      \
                return jv_oom(r, at);                                                                \
            }                                                                                     \
            parts = np_;                                                                          \
        }                                                                                         \
        parts[cnt++] = (val);                                                                     \
    } while (0)
    if (sep.t == V_NULL) {
        jv text = jv_py_strip(self, 1, jv_make(V_UNDEF));
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
                PUSH(jv_str(text.u.s + st, text.n - st));
                break;
            }
            PUSH(jv_str(text.u.s + st, i - st));
        }
    } else {
        if (sep.n == 0) {
            free(parts);
            return jv_err(r, at, "split(): empty separator");
        }
        size_t st = 0;
        while (1) {
            long long p = jj_str_find_ll(self, st, sep);
            if (p < 0) {
                PUSH(jv_str(self.u.s + st, self.n - st));
                break;
            }
            PUSH(jv_str(self.u.s + st, (size_t)p - st));
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
            PUSH(jv_str(start, (size_t)(end - start)));
        }
    }
#undef PUSH
    jarr *a = jv_new_arr(r, cnt);
    if (!a) {
        free(parts);
        return jv_oom(r, at);
    }
    if (cnt) memcpy(a->v, parts, cnt * sizeof(jv));
    free(parts);
    return *out = jv_arr(a, V_ARR), RC_OK;
}

static int replace_str(R *r, const jj_node *at, jv self, jv *args, size_t n, jv *out) {
    if (n < 2) return jv_err(r, at, "replace() requires at least two arguments");
    jv o = args[0], nw = args[1];
    if (o.t != V_STR || nw.t != V_STR) return jv_err(r, at, "replace() arguments must be strings");
    jv count = jv_make(V_NULL);
    if (n > 2) {
        if (args[2].t == V_KWARGS) {
            jv *c = jv_obj_get(args[2].u.o, "count", 5);
            count = c ? *c : jv_make(V_NULL);
        } else {
            count = args[2];
        }
    }
    if (count.t != V_INT && count.t != V_NULL) return jv_err(r, at, "replace() count argument must be a number or null");
    if (count.t == V_INT && count.u.d == 0) return *out = self, RC_OK;
    double remaining = count.t == V_NULL || count.u.d < 0 ? INFINITY : count.u.d;
    jj_buf b = jv_new_buf(r);
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
            long long p = remaining > 0 ? jj_str_find_ll(self, st, o) : -1;
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
    if (jv_buf_check(r, at, &b)) {
        jj_buf_free(&b);
        return RC_ERR;
    }
    return jv_buf_to_str(r, at, &b, out);
}

int jj_call_method(R *r, const jj_node *at, int id, jv self, jv *args, size_t n, jv *out) {
    switch (id) {
    case M_UPPER: return jv_map_case(r, at, self, 1, out);
    case M_LOWER: return jv_map_case(r, at, self, 0, out);
    case M_STRIP: case M_LSTRIP: case M_RSTRIP: {
        jv chars = n > 0 ? args[0] : jv_make(V_UNDEF);
        if (chars.t != V_STR && chars.t != V_NULL && chars.t != V_UNDEF) return jv_err(r, at, "strip arg must be None or str");
        return *out = jv_py_strip(self, id == M_STRIP ? 3 : id == M_LSTRIP ? 1 : 2, chars), RC_OK;
    }
    case M_TITLE: return jv_title_case(r, at, self, out);
    case M_CAPITALIZE: return jv_capitalize(r, at, self, out);
    case M_STARTSWITH: return prefix_test(r, at, self, args, n, 0, out);
    case M_ENDSWITH: return prefix_test(r, at, self, args, n, 1, out);
    case M_SPLIT: return split_str(r, at, self, args, n, out);
    case M_REPLACE: return replace_str(r, at, self, args, n, out);
    case M_GET: {
        if (n < 1 || args[0].t != V_STR) return jv_err(r, at, "object key must be a string");
        jv *p = jv_obj_get(self.u.o, args[0].u.s, args[0].n);
        *out = p ? *p : n > 1 ? args[1] : jv_make(V_NULL);
        return RC_OK;
    }
    case M_ITEMS: return jj_obj_items(r, at, self, out);
    case M_KEYS: case M_VALUES: {
        jarr *a = jv_new_arr(r, self.u.o->n);
        if (!a) return jv_oom(r, at);
        for (size_t i = 0; i < self.u.o->n; i++)
            a->v[i] = id == M_KEYS ? jv_str(self.u.o->k[i].s, self.u.o->k[i].n) : self.u.o->v[i];
        return *out = jv_arr(a, V_ARR), RC_OK;
    }
    case M_FIND: case M_COUNT: case M_RSPLIT: case M_JOIN: return jj_py_str_method(r, at, id, self, args, n, out);
    case M_DICTSORT: {
        jobj *kw = NULL;
        jv pos[3];
        size_t np = 0;
        for (size_t i = 0; i < n; i++) {
            if (args[i].t == V_KWARGS) kw = args[i].u.o;
            else if (np < 3) pos[np++] = args[i];
        }
        jv cs = jj_arg_or(pos, np, 0, kw, "case_sensitive", jv_bool(0));
        jv by = jj_arg_or(pos, np, 1, kw, "by", jv_cstr("key"));
        jv rev = jj_arg_or(pos, np, 2, kw, "reverse", jv_bool(0));
        if (cs.t != V_BOOL) return jv_err(r, at, "case_sensitive must be a boolean");
        if (by.t != V_STR) return jv_err(r, at, "by must be a string");
        int byval;
        if (jv_str_eq(by, jv_cstr("key"))) byval = 0;
        else if (jv_str_eq(by, jv_cstr("value"))) byval = 1;
        else return jv_err(r, at, "by must be either 'key' or 'value'");
        if (rev.t != V_BOOL) return jv_err(r, at, "reverse must be a boolean");
        jv items;
        MS_TRY(jj_obj_items(r, at, self, &items));
        jv *keys = jv_ralloc(r, (items.u.a->n + 1) * sizeof(jv));
        if (!keys) return jv_oom(r, at);
        for (size_t i = 0; i < items.u.a->n; i++) keys[i] = items.u.a->v[i].u.a->v[byval];
        return jv_sort_values(r, at, items.u.a->v, keys, items.u.a->n, cs.u.b, rev.u.b, out);
    }
    default:
        return jv_err(r, at, "internal error: unknown method");
    }
}

static const char *const k_months[] = {"January", "February", "March", "April", "May", "June", "July",
                                       "August", "September", "October", "November", "December"};

static int strftime_now(R *r, const jj_node *at, jv fmt, jv *out) {
    if (fmt.t != V_STR) return jv_err(r, at, "strftime_now() needs a format string");
    time_t now = time(NULL);
    struct tm tmv;
    localtime_r(&now, &tmv);
    jj_buf b = jv_new_buf(r);
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
    if (jv_buf_check(r, at, &b)) {
        jj_buf_free(&b);
        return RC_ERR;
    }
    return jv_buf_to_str(r, at, &b, out);
}

static int call_builtin(R *r, const jj_node *at, int id, jv *args, size_t n, jv *out) {
    switch (id) {
    case B_RAISE: {
        jv msg = jv_make(V_UNDEF);
        if (n > 0) msg = args[0];
        jj_buf b = jv_new_buf(r);
        if (msg.t != V_UNDEF) {
            if (jv_to_print(r, at, msg, &b)) jj_buf_puts(&b, "?");
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
            else return jv_err(r, at, "range() arguments must be numbers, got %s", jv_type_name(args[i].t));
        }
        if (np == 0) return jv_err(r, at, "range() needs at least one argument");
        double start = v[0], stop = v[1], stp = v[2];
        if (np == 1) stop = start, start = 0;
        if (stp == 0) return jv_err(r, at, "range() step must not be zero");
        double cntd = stp > 0 ? ceil((stop - start) / stp) : ceil((start - stop) / -stp);
        if (!(cntd > 0)) cntd = 0;
        if (cntd > (double)r->lim->max_steps) cntd = (double)r->lim->max_steps + 1;
        MS_TRY(jv_step(r, at, (long long)cntd));
        jarr *a = jv_new_arr(r, (size_t)cntd + 2); /* float steps may add one element (0.1 sums) */
        if (!a) return jv_oom(r, at);
        size_t k = 0;
        for (double i = start; (stp > 0 ? i < stop : i > stop) && k < a->n; i += stp)
            a->v[k++] = jv_num(i == floor(i) ? V_INT : V_FLOAT, i);
        a->n = k;
        return *out = jv_arr(a, V_ARR), RC_OK;
    }
    case B_STRFTIME: return strftime_now(r, at, n > 0 ? args[0] : jv_make(V_UNDEF), out);
    case B_NAMESPACE: {
        size_t np = n;
        jobj *kw = NULL;
        if (np > 0 && args[np - 1].t == V_KWARGS) kw = args[--np].u.o;
        if (np > 1) return jv_err(r, at, "namespace expected at most 1 argument, got %zu", np);
        jobj *o = jv_new_obj(r, 0);
        if (!o) return jv_oom(r, at);
        if (np == 1) {
            jv src = args[0];
            if (src.t == V_OBJ || src.t == V_KWARGS) {
                for (size_t i = 0; i < src.u.o->n; i++)
                    if (jv_obj_set(r, o, src.u.o->k[i].s, src.u.o->k[i].n, src.u.o->v[i])) return jv_oom(r, at);
            } else if (src.t == V_ARR || src.t == V_TUPLE) {
                for (size_t i = 0; i < src.u.a->n; i++) {
                    jv pair = src.u.a->v[i];
                    if ((pair.t != V_ARR && pair.t != V_TUPLE) || pair.u.a->n != 2 || pair.u.a->v[0].t != V_STR)
                        return jv_err(r, at, "namespace expected an object or an iterable of [key, value] pairs");
                    if (jv_obj_set(r, o, pair.u.a->v[0].u.s, pair.u.a->v[0].n, pair.u.a->v[1])) return jv_oom(r, at);
                }
            } else {
                return jv_err(r, at, "'%s' object is not iterable", jv_type_name(src.t));
            }
        }
        if (kw)
            for (size_t i = 0; i < kw->n; i++)
                if (jv_obj_set(r, o, kw->k[i].s, kw->k[i].n, kw->v[i])) return jv_oom(r, at);
        return *out = jv_obj(o, V_NS), RC_OK;
    }
    default:
        return jv_err(r, at, "internal error: unknown builtin");
    }
}

/* Binds macro (or call-block) parameters in scope, as the oracle does: all names first, then
 * defaults evaluated in order inside the new scope. */
static int bind_params(R *r, const jj_node *at, jj_node *const *params, int np, int special, jv *args, size_t n,
                       jenv *scope, const char *what) {
    jobj *kw = jv_new_obj(r, 0);
    if (!kw) return jv_oom(r, at);
    size_t npos = n;
    if (npos > 0 && args[npos - 1].t == V_KWARGS) {
        jobj *src = args[--npos].u.o;
        for (size_t i = 0; i < src->n; i++)
            if (jv_obj_set(r, kw, src->k[i].s, src->k[i].n, src->v[i])) return jv_oom(r, at);
    }
    unsigned char pend[256] = {0};
    if (np > 256) return jv_err(r, at, "too many parameters");
    for (int i = 0; i < np; i++) {
        const jj_node *p = params[i];
        jv val = jv_make(V_UNDEF);
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
        if (jj_env_set(r, scope, p->s, p->slen, val)) return jv_oom(r, at);
    }
    if (special & 1) {
        if (jj_env_set(r, scope, "kwargs", 6, jv_obj(kw, V_OBJ))) return jv_oom(r, at);
    } else if (kw->n) {
        return jv_err(r, at, "macro %s takes no keyword argument '%.*s'", what, (int)kw->k[0].n, kw->k[0].s);
    }
    if (special & 2) {
        size_t extra = npos > (size_t)np ? npos - (size_t)np : 0;
        jarr *a = jv_new_arr(r, extra);
        if (!a) return jv_oom(r, at);
        for (size_t i = 0; i < extra; i++) a->v[i] = args[(size_t)np + i];
        if (jj_env_set(r, scope, "varargs", 7, jv_arr(a, V_ARR))) return jv_oom(r, at);
    } else if (npos > (size_t)np) {
        return jv_err(r, at, "macro %s takes not more than %d argument(s)", what, np);
    }
    for (int i = 0; i < np; i++) {
        if (!pend[i]) continue;
        jv val;
        MS_TRY(jj_eval(r, scope, params[i]->a, &val));
        if (jj_env_set(r, scope, params[i]->s, params[i]->slen, val)) return jv_oom(r, at);
    }
    return RC_OK;
}

int jj_call_fn(R *r, const jj_node *at, jv fn, jv *args, size_t nargs, jenv *callenv, jv *out) {
    if (fn.t != V_FUNC) return jv_err(r, at, "cannot call something that is not a function: got %s", jv_type_name(fn.t));
    const jfn *f = fn.u.f;
    if (f->kind == F_BUILTIN) return call_builtin(r, at, f->id, args, nargs, out);
    if (f->kind == F_METHOD) return jj_call_method(r, at, f->id, f->self, args, nargs, out);
    /* macro or call-block body */
    const jj_node *m = f->node;
    if (r->depth >= r->lim->max_depth) {
        jv_err(r, at, "macro calls nested deeper than %d (runaway recursion?)", r->lim->max_depth);
        r->err->code = MS_ERR_NOMEM;
        return RC_ERR;
    }
    MS_TRY(jv_step(r, at, 1));
    jenv *scope = jj_new_env(r, f->kind == F_MACRO ? callenv : f->env);
    if (!scope) return jv_oom(r, at);
    char what[80];
    if (f->kind == F_MACRO) snprintf(what, sizeof what, "'%.*s'", (int)(m->slen < 60 ? m->slen : 60), m->s);
    else snprintf(what, sizeof what, "None");
    MS_TRY(bind_params(r, at, m->list2, m->n2, m->flag2, args, nargs, scope, what));
    r->depth++;
    jj_buf b = jv_new_buf(r);
    int rc = jj_exec_block(r, scope, m->list, m->n, &b);
    r->depth--;
    if (!rc) rc = jv_buf_check(r, at, &b);
    if (rc) {
        jj_buf_free(&b);
        return rc;
    }
    return jv_buf_to_str(r, at, &b, out);
}
