/* json_schema.c - JSON Schema -> GBNF text (then compiled like any GBNF grammar).
 *
 * Handled: type (one or a list), enum, const, properties, required, additionalProperties (a map
 * when there are no properties; never extra keys beside listed properties), items, prefixItems,
 * minItems/maxItems, anyOf, oneOf (exact: branches proven pairwise exclusive, else refused), a
 * one-element allOf, $ref into the document (#, #/$defs/..., #/definitions/...; recursion allowed),
 * nullable, minLength/maxLength, pattern, format (date, time, date-time, uuid, email, ipv4), integer
 * bounds (exact), number bounds (integers and n.ddd forms, never out of range). Validation keywords
 * that cannot be enforced here (not, if/then/else, uniqueItems, multipleOf, patternProperties, ...,
 * or a keyword beside const/enum/anyOf/... that those would ignore) are refused with a message naming
 * the keyword and where it sits. docs/structured-outputs.md states the semantics for users.
 *
 * Output is compact with fixed separators (", " and ": ") and no free whitespace: a model cannot
 * wander into endless blanks, and every output parses. Numbers have at most 16 integer digits. */
#include "grammar/grammar_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct js {
    gstr out; /* rule definitions */
    json_t *root;
    ms_err *err;
    int rc;
    int n_rules;
    char **ref_keys;
    int *ref_rule;
    int n_refs;
    int depth;
    int raw; /* the next string schema is written raw (a tool argument value), not as JSON */
} js;

static int jfail(js *j, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int jfail(js *j, const char *path, const char *fmt, ...) {
    if (j->rc) return j->rc;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    j->rc = ms_errf(j->err, MS_ERR_UNSUPPORTED, "json schema at '%s': %s", path, msg);
    return j->rc;
}

static const char *BASE =
    "jchar ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "jstring ::= \"\\\"\" jchar* \"\\\"\"\n"
    "jint ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
    "jnumber ::= jint (\".\" [0-9]{1,15})? ([eE] [-+]? [0-9]{1,2})?\n"
    "jbool ::= \"true\" | \"false\"\n"
    "jnull ::= \"null\"\n"
    "jvalue ::= jobject | jarray | jstring | jnumber | jbool | jnull\n"
    "jobject ::= \"{\" (jstring \": \" jvalue (\", \" jstring \": \" jvalue)*)? \"}\"\n"
    "jarray ::= \"[\" (jvalue (\", \" jvalue)*)? \"]\"\n"
    "jrawchar ::= [^\"\\\\<\\x00-\\x1F]\n"
    "jrawstring ::= jrawchar*\n";

/* Ends a translation: the caller's root rules in all, then the shared base rules and j's own, into
 * *out (the caller frees it); frees what j holds either way. oom: a caller buffer overflowed. */
static int js_finish(js *j, gstr *all, int oom, const char *what, char **out) {
    if (!j->rc) {
        gs_adds(all, BASE);
        if (j->out.s) gs_adds(all, j->out.s);
        if (all->oom || j->out.oom || oom) j->rc = ms_errf(j->err, MS_ERR_NOMEM, "%s: out of memory", what);
    }
    free(j->out.s);
    for (int i = 0; i < j->n_refs; i++) free(j->ref_keys[i]);
    free(j->ref_keys);
    free(j->ref_rule);
    if (j->rc) {
        free(all->s);
        return j->rc;
    }
    *out = all->s;
    return MS_OK;
}

static int new_rule(js *j) { return j->n_rules++; }

static void gen(js *j, json_t *s, const char *path, gstr *e);

static void lit_json(js *j, json_t *v, gstr *e) {
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) { j->out.oom = 1; return; }
    gs_lit(e, t, strlen(t));
    free(t);
}

static const char *const ANNOTATIONS[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                           "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "strict",
                                           "discriminator", "example", "markdownDescription", "$anchor"};
static const char *const HANDLED[] = {"type", "enum", "const", "properties", "required", "additionalProperties", "items",
                                      "prefixItems", "minItems", "maxItems", "anyOf", "oneOf", "allOf", "$ref", "nullable",
                                      "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
                                      "exclusiveMinimum", "exclusiveMaximum"};
static const char *const REFUSED[] = {"not", "if", "then", "else", "patternProperties", "dependentRequired",
                                      "dependentSchemas", "dependencies", "propertyNames", "unevaluatedProperties",
                                      "unevaluatedItems", "contains", "minContains", "maxContains", "multipleOf",
                                      "minProperties", "maxProperties", "contentEncoding", "contentMediaType",
                                      "$dynamicRef", "$recursiveRef"};

static int in_list(const char *k, const char *const *l, size_t n) {
    for (size_t i = 0; i < n; i++) if (!strcmp(k, l[i])) return 1;
    return 0;
}
#define IN(k, l) in_list(k, l, sizeof l / sizeof l[0])

/* ---- integer ranges as digit patterns ---- */

static int all_digit(const char *s, int n, char d) {
    for (int i = 0; i < n; i++) if (s[i] != d) return 0;
    return 1;
}

/* Appends a GBNF expression for the decimal numbers of exactly the digits of a..b (same length).
 * A side whose remaining digits are all 0 (low) or all 9 (high) is folded into the middle class, so
 * only one side recurses at each level: the expression grows linearly with the length. */
static void range_same_len(gstr *e, const char *a, const char *b, int n) {
    if (n == 0) { gs_adds(e, "\"\""); return; }
    if (a[0] == b[0]) {
        gs_printf(e, "(\"%c\" ", a[0]);
        range_same_len(e, a + 1, b + 1, n - 1);
        gs_adds(e, ")");
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', (size_t)n);
    memset(zeros, '0', (size_t)n);
    int lo_full = all_digit(a + 1, n - 1, '0'), hi_full = all_digit(b + 1, n - 1, '9');
    char m0 = lo_full ? a[0] : (char)(a[0] + 1), m1 = hi_full ? b[0] : (char)(b[0] - 1);
    int first = 1;
    gs_adds(e, "(");
    if (!lo_full) {
        gs_printf(e, "(\"%c\" ", a[0]);
        range_same_len(e, a + 1, nines, n - 1);
        gs_adds(e, ")");
        first = 0;
    }
    if (m0 <= m1) {
        if (!first) gs_adds(e, " | ");
        if (n > 1) gs_printf(e, "([%c-%c] [0-9]{%d})", m0, m1, n - 1);
        else gs_printf(e, "[%c-%c]", m0, m1);
        first = 0;
    }
    if (!hi_full) {
        if (!first) gs_adds(e, " | ");
        gs_printf(e, "(\"%c\" ", b[0]);
        range_same_len(e, zeros, b + 1, n - 1);
        gs_adds(e, ")");
    }
    gs_adds(e, ")");
}

#define MAX_INT 9999999999999999LL /* 16 digits */

/* Non-negative integers in [lo, hi] (hi <= MAX_INT), without leading zeros. */
static void range_nonneg(gstr *e, long long lo, long long hi) {
    gs_adds(e, "(");
    int first = 1;
    long long p = 1;
    for (int len = 1; len <= 16; len++, p *= 10) {
        long long a = len == 1 ? 0 : p, b = p * 10 - 1;
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        if (a > b) continue;
        char sa[24], sb[24];
        snprintf(sa, sizeof sa, "%lld", a);
        snprintf(sb, sizeof sb, "%lld", b);
        if (!first) gs_adds(e, " | ");
        first = 0;
        range_same_len(e, sa, sb, len);
    }
    gs_adds(e, ")");
}

static void range_int(gstr *e, long long lo, long long hi) {
    gs_adds(e, "(");
    int any = 0;
    if (lo < 0) {
        long long nlo = hi < 0 ? -hi : 1, nhi = -lo;
        gs_adds(e, "(\"-\" ");
        range_nonneg(e, nlo, nhi);
        gs_adds(e, ")");
        any = 1;
    }
    if (hi >= 0) {
        if (any) gs_adds(e, " | ");
        range_nonneg(e, lo < 0 ? 0 : lo, hi);
    }
    gs_adds(e, ")");
}

static int get_bound(js *j, json_t *s, const char *path, const char *k, double *v) {
    json_t *x = json_object_get(s, k);
    if (!x) return 0;
    if (!json_is_number(x)) return jfail(j, path, "'%s' must be a number", k), 0;
    *v = json_number_value(x);
    return 1;
}

/* Fractional forms "n.ddd" for n in [a, b] (a >= 0), in two tiers that keep every literal within 15
 * significant digits (n < 1e5 with up to 10 decimals, n < 1e10 with up to 5): such a decimal
 * converts to the nearest double and distinct ones stay distinct and ordered, so a strict
 * inequality between the text and a bound also holds after a parser reads it. nonzero: the
 * decimals must not all be 0 (the number is strictly above n). */
static int frac_forms(gstr *e, const char *sign, long long a, long long b, int nonzero, int any) {
    static const long long tier_lo[] = {0, 100000}, tier_hi[] = {99999, 9999999999LL};
    static const int tier_f[] = {10, 5};
    for (int t = 0; t < 2; t++) {
        long long x = a > tier_lo[t] ? a : tier_lo[t], y = b < tier_hi[t] ? b : tier_hi[t];
        if (x > y) continue;
        if (any++) gs_adds(e, " | ");
        gs_printf(e, "(%s", sign);
        range_nonneg(e, x, y);
        if (nonzero) gs_printf(e, " \".\" [0-9]{0,%d} [1-9])", tier_f[t] - 1);
        else gs_printf(e, " \".\" [0-9]{1,%d})", tier_f[t]);
    }
    return any;
}

/* Integers, or with is_number also fractions "n.ddd" (no exponent under bounds): the fractional
 * forms are those whose whole unit interval [n, n+1) (or (-(m+1), -m] below zero) lies inside the
 * bounds, plus n.ddd with a nonzero decimal just above an exclusive integer bound (and below zero
 * the mirror). A range that holds none of these is refused. Without bounds: any JSON number (with
 * exponent) for "number", 1-16 digit integers for "integer". */
static void gen_integer(js *j, json_t *s, const char *path, gstr *e, int is_number) {
    double lo = -(double)MAX_INT, hi = (double)MAX_INT, v;
    double flo = -INFINITY, fhi = INFINITY; /* the real bounds, for the fractional forms */
    int flo_x = 0, fhi_x = 0;                /* exclusive */
    int bounded = 0;
    if (get_bound(j, s, path, "minimum", &v)) lo = fmax(lo, ceil(v)), bounded = 1, flo = fmax(flo, v);
    if (get_bound(j, s, path, "exclusiveMinimum", &v)) {
        lo = fmax(lo, floor(v) + 1), bounded = 1;
        if (v >= flo) flo = v, flo_x = 1;
    }
    if (get_bound(j, s, path, "maximum", &v)) hi = fmin(hi, floor(v)), bounded = 1, fhi = fmin(fhi, v);
    if (get_bound(j, s, path, "exclusiveMaximum", &v)) {
        hi = fmin(hi, ceil(v) - 1), bounded = 1;
        if (v <= fhi) fhi = v, fhi_x = 1;
    }
    if (j->rc) return;
    if (!bounded) { gs_adds(e, is_number ? "jnumber" : "jint"); return; }
    gstr f = {0};
    int nf = 0;
    if (is_number) {
        const double CAP = 1e11;
        double a = fmax(0, flo_x ? floor(flo) + 1 : ceil(flo)), b = fmin(CAP, floor(fhi) - 1);
        if (a <= b) nf = frac_forms(&f, "", (long long)a, (long long)b, 0, nf);
        /* just above an exclusive integer lower bound L >= 0: L.ddd with a nonzero decimal, < L + 1 <= fhi */
        if (flo_x && flo == floor(flo) && flo >= 0 && flo + 1 <= fhi && flo < CAP)
            nf = frac_forms(&f, "", (long long)flo, (long long)flo, 1, nf);
        a = fmax(0, fhi_x ? floor(-fhi) + 1 : ceil(-fhi));
        b = fmin(CAP, floor(-flo) - 1);
        if (a <= b) nf = frac_forms(&f, "\"-\" ", (long long)a, (long long)b, 0, nf);
        /* just below an exclusive integer upper bound -M <= 0: -M.ddd with a nonzero decimal, > -(M + 1) >= flo */
        if (fhi_x && fhi == floor(fhi) && fhi <= 0 && -fhi - 1 >= flo && -fhi < CAP)
            nf = frac_forms(&f, "\"-\" ", (long long)-fhi, (long long)-fhi, 1, nf);
    }
    int has_int = lo <= hi;
    if (!has_int && !nf) {
        free(f.s);
        jfail(j, path, is_number ? "no number between the bounds ('minimum'/'maximum'/'exclusiveMinimum'/'exclusiveMaximum') "
                                   "can be generated (supported: integers, and n.ddd whose unit interval lies inside)"
                                 : "no integer lies between minimum and maximum");
        return;
    }
    gs_adds(e, "(");
    if (has_int) range_int(e, (long long)lo, (long long)hi);
    if (has_int && nf) gs_adds(e, " | ");
    if (nf) gs_adds(e, f.s ? f.s : "\"\"");
    if (f.oom) e->oom = 1;
    free(f.s);
    gs_adds(e, ")");
}

static void gen_string(js *j, json_t *s, const char *path, gstr *e) {
    /* raw: no quotes around the value, and never a quote, backslash or '<' inside it */
    const char *q = j->raw ? "\"\"" : "\"\\\"\"";
    int raw = j->raw;
    j->raw = 0;
    json_t *fmt = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    if (fmt) {
        const char *f = json_string_value(fmt);
        static const char *const D = "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8])";
        static const char *const T = "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "
                                     "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])";
        if (!f) { jfail(j, path, "'format' must be a string"); return; }
        const char *body = NULL;
        char dt[700];
        if (!strcmp(f, "date")) body = D;
        else if (!strcmp(f, "time")) body = T;
        else if (!strcmp(f, "date-time")) { snprintf(dt, sizeof dt, "%s \"T\" %s", D, T); body = dt; }
        else if (!strcmp(f, "uuid")) body = "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}";
        else if (!strcmp(f, "email")) body = "[a-z0-9]{1,20} (\".\" [a-z0-9]{1,20}){0,2} \"@\" ([a-z0-9]{1,20} \".\"){1,3} [a-z]{2,6}";
        else if (!strcmp(f, "ipv4"))
            body = "((\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9]? [0-9]) \".\"){3} "
                   "(\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9]? [0-9])";
        if (body) gs_printf(e, "(%s %s %s)", q, body, q);
        else { jfail(j, path, "string format '%s' is not supported (keyword 'format')", f); return; }
        if (pat || mn || mx) jfail(j, path, "'format' together with 'pattern', 'minLength' or 'maxLength' is not supported");
        return;
    }
    if (pat) {
        if (!json_is_string(pat)) { jfail(j, path, "'pattern' must be a string"); return; }
        if (mn || mx) { jfail(j, path, "'pattern' together with 'minLength'/'maxLength' is not supported"); return; }
        char *body = NULL;
        ms_err e2 = {0};
        if (ms_grammar_regex_to_gbnf_body(json_string_value(pat), 1, &body, &e2) != MS_OK) {
            jfail(j, path, "keyword 'pattern': %s", e2.msg);
            return;
        }
        gs_printf(e, "(%s %s %s)", q, body, q);
        free(body);
        return;
    }
    if (mn || mx) {
        long long a = mn ? json_integer_value(mn) : 0, b = mx ? json_integer_value(mx) : -1;
        if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)) || a < 0 || (mx && b < a))
            { jfail(j, path, "'minLength'/'maxLength' must be integers with 0 <= minLength <= maxLength"); return; }
        if (a > 1000 || b > 1000) { jfail(j, path, "'minLength'/'maxLength' over 1000 is not supported"); return; }
        const char *ch = raw ? "jrawchar" : "jchar";
        if (b < 0) gs_printf(e, "(%s %s{%lld,} %s)", q, ch, a, q);
        else gs_printf(e, "(%s %s{%lld,%lld} %s)", q, ch, a, b, q);
        return;
    }
    gs_adds(e, raw ? "jrawstring" : "jstring");
}

static void gen_object(js *j, json_t *s, const char *path, gstr *e) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *ap = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) { jfail(j, path, "'properties' must be an object"); return; }
    if (req && !json_is_array(req)) { jfail(j, path, "'required' must be an array"); return; }
    size_t np = props ? json_object_size(props) : 0;
    if (np == 0) {
        if (json_is_false(ap)) { gs_adds(e, "(\"{}\")"); return; }
        if (req && json_array_size(req)) { jfail(j, path, "'required' names properties that 'properties' does not define"); return; }
        gstr v = {0};
        char p2[300];
        snprintf(p2, sizeof p2, "%s/additionalProperties", path);
        if (ap && json_is_object(ap)) gen(j, ap, p2, &v);
        else gs_adds(&v, "jvalue");
        gs_printf(e, "(\"{\" (jstring \": \" %s (\", \" jstring \": \" %s)*)? \"}\")", v.s ? v.s : "jvalue", v.s ? v.s : "jvalue");
        free(v.s);
        return;
    }
    /* required names must exist */
    size_t k;
    json_t *rn;
    json_array_foreach(req, k, rn) {
        if (!json_is_string(rn)) { jfail(j, path, "'required' must hold strings"); return; }
        if (!json_object_get(props, json_string_value(rn)))
            { jfail(j, path, "'required' names '%s', which 'properties' does not define", json_string_value(rn)); return; }
    }
    /* first_i / rest_i rules (see the file comment of the object case in the design notes):
     * first_i: nothing emitted yet from properties i..; rest_i: something was, so commas lead */
    int n = (int)np;
    int base = j->n_rules;
    j->n_rules += 2 * (n + 1);
    char **kv = calloc((size_t)n, sizeof *kv);
    int *required = calloc((size_t)n, sizeof *required);
    if (!kv || !required) { free(kv); free(required); j->out.oom = 1; return; }
    const char *key;
    json_t *sub;
    int i = 0;
    json_object_foreach(props, key, sub) {
        gstr one = {0};
        char p2[400];
        snprintf(p2, sizeof p2, "%s/properties/%s", path, key);
        json_t *kj = json_string(key);
        lit_json(j, kj, &one);
        json_decref(kj);
        gs_adds(&one, " \": \" ");
        gen(j, sub, p2, &one);
        kv[i] = one.s;
        json_array_foreach(req, k, rn) if (!strcmp(json_string_value(rn), key)) required[i] = 1;
        i++;
    }
    for (i = 0; i <= n && !j->rc; i++) {
        int fi = base + 2 * i, ri = base + 2 * i + 1;
        if (i == n) {
            gs_printf(&j->out, "r%d ::= \"\"\nr%d ::= \"\"\n", fi, ri);
            break;
        }
        gs_printf(&j->out, "r%d ::= %s r%d", fi, kv[i] ? kv[i] : "\"\"", ri + 2);
        if (!required[i]) gs_printf(&j->out, " | r%d", fi + 2);
        gs_printf(&j->out, "\nr%d ::= \", \" %s r%d", ri, kv[i] ? kv[i] : "\"\"", ri + 2);
        if (!required[i]) gs_printf(&j->out, " | r%d", ri + 2);
        gs_adds(&j->out, "\n");
    }
    for (i = 0; i < n; i++) free(kv[i]);
    free(kv);
    free(required);
    gs_printf(e, "(\"{\" r%d \"}\")", base);
}

static void gen_array(js *j, json_t *s, const char *path, gstr *e) {
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems"), *uq = json_object_get(s, "uniqueItems");
    if (uq && json_is_true(uq)) { jfail(j, path, "keyword 'uniqueItems' is not supported"); return; }
    long long a = mn ? json_integer_value(mn) : 0, b = mx ? json_integer_value(mx) : -1;
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)) || a < 0 || (mx && b < a))
        { jfail(j, path, "'minItems'/'maxItems' must be integers with 0 <= minItems <= maxItems"); return; }
    if (a > 1000 || b > 1000) { jfail(j, path, "'minItems'/'maxItems' over 1000 is not supported"); return; }
    char p2[400];
    if (prefix) {
        if (!json_is_array(prefix)) { jfail(j, path, "'prefixItems' must be an array"); return; }
        if (mn || mx || (items && !json_is_false(items))) { jfail(j, path, "'prefixItems' with 'items', 'minItems' or 'maxItems' is not supported"); return; }
        gs_adds(e, "(\"[\" ");
        size_t k;
        json_t *it;
        json_array_foreach(prefix, k, it) {
            if (k) gs_adds(e, " \", \" ");
            snprintf(p2, sizeof p2, "%s/prefixItems/%zu", path, k);
            gen(j, it, p2, e);
        }
        gs_adds(e, " \"]\")");
        return;
    }
    gstr it = {0};
    snprintf(p2, sizeof p2, "%s/items", path);
    if (items && (json_is_object(items) || json_is_boolean(items))) gen(j, items, p2, &it);
    else if (items) { jfail(j, path, "'items' must be a schema"); return; }
    else gs_adds(&it, "jvalue");
    const char *I = it.s ? it.s : "jvalue";
    if (b == 0) gs_adds(e, "(\"[]\")");
    else if (a == 0) {
        if (b < 0) gs_printf(e, "(\"[\" (%s (\", \" %s)*)? \"]\")", I, I);
        else gs_printf(e, "(\"[\" (%s (\", \" %s){0,%lld})? \"]\")", I, I, b - 1);
    } else {
        if (b < 0) gs_printf(e, "(\"[\" %s (\", \" %s){%lld,} \"]\")", I, I, a - 1);
        else gs_printf(e, "(\"[\" %s (\", \" %s){%lld,%lld} \"]\")", I, I, a - 1, b - 1);
    }
    free(it.s);
}

static void gen_type(js *j, json_t *s, const char *path, const char *t, gstr *e) {
    if (!strcmp(t, "string")) gen_string(j, s, path, e);
    else if (!strcmp(t, "integer")) gen_integer(j, s, path, e, 0);
    else if (!strcmp(t, "number")) gen_integer(j, s, path, e, 1);
    else if (!strcmp(t, "boolean")) gs_adds(e, "jbool");
    else if (!strcmp(t, "null")) gs_adds(e, "jnull");
    else if (!strcmp(t, "object")) gen_object(j, s, path, e);
    else if (!strcmp(t, "array")) gen_array(j, s, path, e);
    else jfail(j, path, "unknown type '%s' (keyword 'type')", t);
}

static json_t *resolve_ref(js *j, const char *ref, const char *path) {
    if (ref[0] != '#') return jfail(j, path, "only local '$ref's (#...) are supported, not '%s'", ref), NULL;
    json_t *cur = j->root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char seg[256];
        size_t n = 0;
        while (*p && *p != '/' && n < sizeof seg - 1) {
            if (p[0] == '~' && p[1] == '1') { seg[n++] = '/'; p += 2; }
            else if (p[0] == '~' && p[1] == '0') { seg[n++] = '~'; p += 2; }
            else seg[n++] = *p++;
        }
        seg[n] = 0;
        cur = json_is_array(cur) ? json_array_get(cur, (size_t)atol(seg)) : json_object_get(cur, seg);
        if (!cur) return jfail(j, path, "'$ref' '%s' does not resolve", ref), NULL;
    }
    if (*p) return jfail(j, path, "'$ref' '%s' is not a JSON pointer", ref), NULL;
    return cur;
}

/* ---- oneOf: exclusivity ----
 *
 * The grammar of a oneOf is the union of its branches' grammars. That is exact when no value a
 * branch's grammar generates is valid under another branch, which excl(a, b) proves for a pair from
 * facts that need no search: disjoint JSON types (what a generates against what b accepts), disjoint
 * const/enum values, disjoint numeric intervals, or for objects a property required on one side whose
 * values are exclusive, or required by b and absent from a's generated keys, or emitted by a and
 * refused by b (additionalProperties false). Anything unproven is refused. */

enum { T_NULL = 1, T_BOOL = 2, T_OBJ = 4, T_ARR = 8, T_STR = 16, T_INT = 32, T_FRAC = 64, T_ALL = 127 };

static json_t *deref(js *j, json_t *s) {
    for (int hops = 0; hops < 32 && json_is_object(s); hops++) {
        json_t *r = json_object_get(s, "$ref");
        if (!json_is_string(r)) return s;
        ms_err e2 = {0};
        ms_err *saved = j->err;
        int rc = j->rc;
        j->err = &e2;
        json_t *t = resolve_ref(j, json_string_value(r), "#");
        j->err = saved;
        j->rc = rc;
        if (!t) return NULL;
        s = t;
    }
    return s;
}

static int value_type(json_t *v) {
    switch (json_typeof(v)) {
    case JSON_NULL: return T_NULL;
    case JSON_TRUE: case JSON_FALSE: return T_BOOL;
    case JSON_OBJECT: return T_OBJ;
    case JSON_ARRAY: return T_ARR;
    case JSON_STRING: return T_STR;
    case JSON_INTEGER: return T_INT;
    case JSON_REAL: { double d = json_real_value(v); return d == floor(d) ? T_INT : T_FRAC; }
    }
    return T_ALL;
}

static int type_bits(json_t *ty) {
    int t = 0;
    size_t k;
    json_t *x;
    if (json_is_string(ty)) {
        const char *n = json_string_value(ty);
        return !strcmp(n, "null") ? T_NULL : !strcmp(n, "boolean") ? T_BOOL : !strcmp(n, "object") ? T_OBJ : !strcmp(n, "array") ? T_ARR
             : !strcmp(n, "string") ? T_STR : !strcmp(n, "integer") ? T_INT : !strcmp(n, "number") ? T_INT | T_FRAC : T_ALL;
    }
    json_array_foreach(ty, k, x) t |= type_bits(x);
    return t;
}

/* The types a schema's values may have: gen_side = what our grammar generates (a schema without
 * 'type' but with 'properties' generates objects), else what a validator accepts. */
static int types_of(js *j, json_t *s, int gen_side, int depth) {
    s = deref(j, s);
    if (!s || depth > 16) return T_ALL;
    if (json_is_boolean(s)) return json_is_true(s) ? T_ALL : 0;
    if (!json_is_object(s)) return T_ALL;
    int t = T_ALL;
    json_t *x, *v;
    size_t k;
    if ((x = json_object_get(s, "type"))) t &= type_bits(x);
    if ((x = json_object_get(s, "const"))) t &= value_type(x);
    if (json_is_array(x = json_object_get(s, "enum"))) {
        int u = 0;
        json_array_foreach(x, k, v) u |= value_type(v);
        t &= u;
    }
    const char *comb[] = {"anyOf", "oneOf"};
    for (int c = 0; c < 2; c++)
        if (json_is_array(x = json_object_get(s, comb[c]))) {
            int u = 0;
            json_array_foreach(x, k, v) u |= types_of(j, v, gen_side, depth + 1);
            t &= u;
        }
    if (json_is_array(x = json_object_get(s, "allOf")))
        json_array_foreach(x, k, v) t &= types_of(j, v, gen_side, depth + 1);
    if (gen_side && !json_object_get(s, "type") && !json_object_get(s, "const") && !json_object_get(s, "enum") &&
        !json_object_get(s, "anyOf") && !json_object_get(s, "oneOf") && !json_object_get(s, "allOf")) {
        if (json_object_get(s, "properties") || json_object_get(s, "required") || json_object_get(s, "additionalProperties")) t = T_OBJ;
        else if (json_object_get(s, "items") || json_object_get(s, "prefixItems")) t = T_ARR;
    }
    if (json_is_true(json_object_get(s, "nullable"))) t |= T_NULL;
    return t;
}

static int num_equal(json_t *a, json_t *b) {
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    return json_equal(a, b);
}

/* The finite value set of s (const or enum), or NULL. */
static json_t *values_of(json_t *s, json_t **one) {
    json_t *c = json_object_get(s, "const");
    if (c) { *one = c; return (json_t *)1; }
    json_t *e = json_object_get(s, "enum");
    if (json_is_array(e)) { *one = NULL; return e; }
    return NULL;
}

static size_t vals_n(json_t *set, json_t *one) { return set == (json_t *)1 ? 1 : json_array_size(set); }
static json_t *vals_at(json_t *set, json_t *one, size_t i) { return set == (json_t *)1 ? one : json_array_get(set, i); }

/* The interval [lo, hi] a numeric schema allows (exclusive ends treated as closed: coarser, still
 * sound for disjointness when the other side's interval is strictly apart). */
static void interval_of(json_t *s, double *lo, double *hi, int *lox, int *hix) {
    *lo = -INFINITY, *hi = INFINITY, *lox = *hix = 0;
    json_t *x;
    if (json_is_number(x = json_object_get(s, "minimum"))) *lo = json_number_value(x);
    if (json_is_number(x = json_object_get(s, "exclusiveMinimum")) && json_number_value(x) >= *lo) *lo = json_number_value(x), *lox = 1;
    if (json_is_number(x = json_object_get(s, "maximum"))) *hi = json_number_value(x);
    if (json_is_number(x = json_object_get(s, "exclusiveMaximum")) && json_number_value(x) <= *hi) *hi = json_number_value(x), *hix = 1;
}

static int in_required(json_t *s, const char *k) {
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(s, "required"), i, r) if (json_is_string(r) && !strcmp(json_string_value(r), k)) return 1;
    return 0;
}

/* 1 when provably no value that a's grammar generates is valid under b. */
static int excl(js *j, json_t *a, json_t *b, int depth) {
    a = deref(j, a);
    b = deref(j, b);
    if (!a || !b || depth > 16) return 0;
    if (json_is_false(b)) return 1;
    if (!json_is_object(a) || !json_is_object(b)) return 0;
    /* combinators: every branch of a; any valid-under-b value is valid under some branch of b */
    json_t *x, *v;
    size_t k;
    const char *comb[] = {"anyOf", "oneOf"};
    for (int c = 0; c < 2; c++)
        if (json_is_array(x = json_object_get(a, comb[c])) && json_array_size(x)) {
            int all = 1;
            json_array_foreach(x, k, v) if (!excl(j, v, b, depth + 1)) { all = 0; break; }
            if (all) return 1;
            /* a's siblings may still separate it from b: fall through */
        }
    for (int c = 0; c < 2; c++)
        if (json_is_array(x = json_object_get(b, comb[c])) && json_array_size(x)) {
            int all = 1;
            json_array_foreach(x, k, v) if (!excl(j, a, v, depth + 1)) { all = 0; break; }
            if (all) return 1;
        }
    int shared = types_of(j, a, 1, 0) & types_of(j, b, 0, 0);
    if (!shared) return 1;
    json_t *ao = NULL, *bo = NULL, *av = values_of(a, &ao), *bv = values_of(b, &bo);
    if (av && bv) {
        int any = 0;
        for (size_t i = 0; i < vals_n(av, ao) && !any; i++)
            for (size_t m = 0; m < vals_n(bv, bo) && !any; m++) any = num_equal(vals_at(av, ao, i), vals_at(bv, bo, m));
        if (!any) return 1;
    }
    if (av && json_is_true(json_object_get(a, "nullable"))) return 0;
    if (av) return 0; /* a's values against b's other keywords: not attempted */
    if (!(shared & ~(T_INT | T_FRAC))) {
        double alo, ahi, blo, bhi;
        int alx, ahx, blx, bhx;
        interval_of(a, &alo, &ahi, &alx, &ahx);
        interval_of(b, &blo, &bhi, &blx, &bhx);
        if (ahi < blo || (ahi == blo && (ahx || blx)) || bhi < alo || (bhi == alo && (bhx || alx))) return 1;
    }
    if (shared == T_OBJ && !json_is_true(json_object_get(a, "nullable"))) {
        json_t *ap = json_object_get(a, "properties"), *bp = json_object_get(b, "properties");
        json_t *bad = json_object_get(b, "additionalProperties");
        /* the keys a's grammar may emit are exactly its properties (none beyond them, see gen_object)
         * unless it has none (a map) */
        int a_closed = json_is_object(ap) && json_object_size(ap) > 0;
        const char *key;
        json_t *sub;
        json_object_foreach(bp, key, sub) {
            json_t *as = json_object_get(ap, key);
            if (as && (in_required(a, key) || in_required(b, key)) && excl(j, as, sub, depth + 1)) return 1;
        }
        json_array_foreach(json_object_get(b, "required"), k, v) {
            if (json_is_string(v) && a_closed && !json_object_get(ap, json_string_value(v))) return 1;
        }
        json_object_foreach(ap, key, sub) {
            if (!in_required(a, key) || json_object_get(bp, key)) continue;
            if (json_is_false(bad) || (json_is_object(bad) && excl(j, sub, bad, depth + 1))) return 1;
        }
    }
    return 0;
}

/* ---- keywords beside const / enum / anyOf / oneOf / allOf / $ref ----
 *
 * Those keywords generate their own values and ignore the rest of the schema object, so any other
 * validation keyword beside them would go unenforced: a sibling is either checked here (const/enum
 * values are filtered by 'type', numeric bounds and string lengths; the branches of anyOf/oneOf/allOf
 * must generate only types that 'type' allows) or refused with its name. */

static int utf8_len(const char *s) {
    int n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* 1 when value v satisfies the type / bounds / length siblings of s. */
static int value_fits(json_t *s, json_t *v) {
    json_t *ty = json_object_get(s, "type"), *x;
    if (ty && !(type_bits(ty) & value_type(v))) return 0;
    if (json_is_number(v)) {
        double d = json_number_value(v);
        if (json_is_number(x = json_object_get(s, "minimum")) && d < json_number_value(x)) return 0;
        if (json_is_number(x = json_object_get(s, "maximum")) && d > json_number_value(x)) return 0;
        if (json_is_number(x = json_object_get(s, "exclusiveMinimum")) && d <= json_number_value(x)) return 0;
        if (json_is_number(x = json_object_get(s, "exclusiveMaximum")) && d >= json_number_value(x)) return 0;
    }
    if (json_is_string(v)) {
        int n = utf8_len(json_string_value(v));
        if (json_is_integer(x = json_object_get(s, "minLength")) && n < json_integer_value(x)) return 0;
        if (json_is_integer(x = json_object_get(s, "maxLength")) && n > json_integer_value(x)) return 0;
    }
    return 1;
}

/* Refuses a validation keyword beside `main` that is not in ok[] (NULL-terminated). */
static int siblings_ok(js *j, json_t *s, const char *path, const char *main, const char *const *ok) {
    const char *key;
    json_t *val;
    json_object_foreach(s, key, val) {
        if (!strcmp(key, main) || !IN(key, HANDLED)) continue;
        int allowed = 0;
        for (int i = 0; ok[i]; i++) allowed |= !strcmp(ok[i], key);
        if (!allowed) { jfail(j, path, "keyword '%s' beside '%s' is not supported", key, main); return 0; }
    }
    return 1;
}

static void gen(js *j, json_t *s, const char *path, gstr *e) {
    if (j->rc) return;
    if (++j->depth > 64) { jfail(j, path, "schema nested deeper than 64"); return; }
    if (json_is_true(s)) { gs_adds(e, "jvalue"); j->depth--; return; }
    if (!json_is_object(s)) { jfail(j, path, json_is_false(s) ? "schema 'false' matches nothing" : "a schema must be an object"); return; }
    const char *key;
    json_t *val;
    json_object_foreach(s, key, val) {
        if (IN(key, REFUSED)) { jfail(j, path, "keyword '%s' is not supported", key); return; }
        if (!IN(key, HANDLED) && !IN(key, ANNOTATIONS) && strncmp(key, "x-", 2)) { /* unknown: ignored */ }
    }
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        static const char *const ok[] = {"nullable", NULL}; /* (nullable beside $ref: not generated, still valid) */
        if (!siblings_ok(j, s, path, "$ref", ok)) return;
        const char *r = json_string_value(ref);
        if (!r) { jfail(j, path, "'$ref' must be a string"); return; }
        int rule = -1;
        for (int i = 0; i < j->n_refs; i++) if (!strcmp(j->ref_keys[i], r)) rule = j->ref_rule[i];
        if (rule < 0) {
            json_t *target = resolve_ref(j, r, path);
            if (!target) return;
            rule = new_rule(j);
            char **nk = realloc(j->ref_keys, (size_t)(j->n_refs + 1) * sizeof *nk);
            int *nr = nk ? realloc(j->ref_rule, (size_t)(j->n_refs + 1) * sizeof *nr) : NULL;
            if (nk) j->ref_keys = nk;
            if (!nr) { j->out.oom = 1; return; }
            j->ref_rule = nr;
            j->ref_keys[j->n_refs] = strdup(r);
            j->ref_rule[j->n_refs++] = rule;
            gstr body = {0};
            gen(j, target, r, &body);
            gs_printf(&j->out, "r%d ::= %s\n", rule, body.s ? body.s : "\"\"");
            free(body.s);
        }
        gs_printf(e, "r%d", rule);
        j->depth--;
        return;
    }
    int nullable = json_is_true(json_object_get(s, "nullable"));
    if (nullable) gs_adds(e, "(jnull | ");
    json_t *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    json_t *any = json_object_get(s, "anyOf");
    int one_of = 0;
    if (any && json_object_get(s, "oneOf")) { jfail(j, path, "'anyOf' together with 'oneOf' is not supported"); return; }
    if (!any && (any = json_object_get(s, "oneOf"))) one_of = 1;
    json_t *all = json_object_get(s, "allOf");
    json_t *ty = json_object_get(s, "type");
    char p2[400];
    static const char *const val_ok[] = {"type", "nullable", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                         "minLength", "maxLength", NULL};
    static const char *const comb_ok[] = {"type", "nullable", NULL};
    if (cst) {
        if (!siblings_ok(j, s, path, "const", val_ok)) return;
        if (en) { jfail(j, path, "'const' together with 'enum' is not supported"); return; }
        if (!value_fits(s, cst)) { jfail(j, path, "the 'const' value does not satisfy the schema's other keywords"); return; }
        lit_json(j, cst, e);
    } else if (en) {
        if (!json_is_array(en) || !json_array_size(en)) { jfail(j, path, "'enum' must be a non-empty array"); return; }
        if (!siblings_ok(j, s, path, "enum", val_ok)) return;
        size_t k;
        json_t *v;
        int n = 0;
        gs_adds(e, "(");
        json_array_foreach(en, k, v) {
            if (!value_fits(s, v)) continue; /* an enum value the other keywords refuse is never valid */
            if (n++) gs_adds(e, " | ");
            lit_json(j, v, e);
        }
        gs_adds(e, ")");
        if (!n) { jfail(j, path, "no 'enum' value satisfies the schema's other keywords"); return; }
    } else if (any) {
        if (!json_is_array(any) || !json_array_size(any)) { jfail(j, path, "'anyOf'/'oneOf' must be a non-empty array"); return; }
        if (!siblings_ok(j, s, path, one_of ? "oneOf" : "anyOf", comb_ok)) return;
        if (ty) {
            size_t k;
            json_t *v;
            json_array_foreach(any, k, v)
                if (types_of(j, v, 1, 0) & ~type_bits(ty)) {
                    jfail(j, path, "'type' beside '%s' must allow every type branch %zu generates (give each branch its 'type')",
                          one_of ? "oneOf" : "anyOf", k);
                    return;
                }
        }
        size_t k;
        json_t *v;
        gs_adds(e, "(");
        json_array_foreach(any, k, v) {
            if (k) gs_adds(e, " | ");
            snprintf(p2, sizeof p2, "%s/%s/%zu", path, one_of ? "oneOf" : "anyOf", k);
            gen(j, v, p2, e);
        }
        gs_adds(e, ")");
        for (size_t a = 0; one_of && !j->rc && a < json_array_size(any); a++)
            for (size_t b = 0; b < json_array_size(any); b++)
                if (a != b && !excl(j, json_array_get(any, a), json_array_get(any, b), 0)) {
                    jfail(j, path,
                          "keyword 'oneOf': branches %zu and %zu are not provably exclusive (a value may match both); "
                          "supported are branches with different types, different const/enum values, disjoint "
                          "numeric bounds, or a required property that tells them apart; use 'anyOf' when any "
                          "matching branch will do", a, b);
                    break;
                }
    } else if (all) {
        if (!json_is_array(all) || json_array_size(all) != 1) { jfail(j, path, "keyword 'allOf' is supported with one schema only"); return; }
        if (!siblings_ok(j, s, path, "allOf", comb_ok)) return;
        if (ty && (types_of(j, json_array_get(all, 0), 1, 0) & ~type_bits(ty))) {
            jfail(j, path, "'type' beside 'allOf' must allow every type its schema generates");
            return;
        }
        snprintf(p2, sizeof p2, "%s/allOf/0", path);
        gen(j, json_array_get(all, 0), p2, e);
    } else if (json_is_string(ty)) {
        gen_type(j, s, path, json_string_value(ty), e);
    } else if (json_is_array(ty)) {
        size_t k;
        json_t *v;
        gs_adds(e, "(");
        json_array_foreach(ty, k, v) {
            if (!json_is_string(v)) { jfail(j, path, "'type' must hold strings"); return; }
            if (k) gs_adds(e, " | ");
            gen_type(j, s, path, json_string_value(v), e);
        }
        gs_adds(e, ")");
    } else if (ty) {
        jfail(j, path, "'type' must be a string or an array");
    } else if (json_object_get(s, "properties") || json_object_get(s, "required") || json_object_get(s, "additionalProperties")) {
        gen_object(j, s, path, e);
    } else if (json_object_get(s, "items") || json_object_get(s, "prefixItems")) {
        gen_array(j, s, path, e);
    } else {
        gs_adds(e, "jvalue");
    }
    if (nullable) gs_adds(e, ")");
    j->depth--;
}

int ms_grammar_json_schema_to_gbnf(json_t *schema, char **out, ms_err *err) {
    *out = NULL;
    js j;
    memset(&j, 0, sizeof j);
    j.root = schema;
    j.err = err;
    gstr root = {0};
    if (!schema) gs_adds(&root, "jobject");
    else gen(&j, schema, "#", &root);
    gstr all = {0};
    if (!j.rc) {
        gs_adds(&all, "root ::= ");
        gs_adds(&all, root.s ? root.s : "\"\"");
        gs_adds(&all, "\n");
    }
    const int oom = root.oom;
    free(root.s);
    return js_finish(&j, &all, oom, "json schema", out);
}

/* ---- forced tool calls (GLM's <tool_call> format) ---- */

/* The string-ness of a tool argument decides how GLM writes it: raw text for "string", JSON else. */
static int is_string_prop(json_t *p) {
    json_t *t = json_object_get(p, "type");
    if (json_is_string(t)) return !strcmp(json_string_value(t), "string");
    if (json_is_array(t) && json_array_size(t) == 1) return json_is_string(json_array_get(t, 0)) && !strcmp(json_string_value(json_array_get(t, 0)), "string");
    return 0;
}

static void tool_value(js *j, json_t *p, const char *path, gstr *e) {
    if (!is_string_prop(p)) { gen(j, p, path, e); return; }
    json_t *en = json_object_get(p, "enum"), *cst = json_object_get(p, "const");
    if (cst && json_is_string(cst)) { gs_lit(e, json_string_value(cst), json_string_length(cst)); return; }
    if (json_is_array(en) && json_array_size(en)) {
        size_t k;
        json_t *v;
        gs_adds(e, "(");
        json_array_foreach(en, k, v) {
            if (!json_is_string(v)) { jfail(j, path, "'enum' of a string argument must hold strings"); return; }
            if (k) gs_adds(e, " | ");
            gs_lit(e, json_string_value(v), json_string_length(v));
        }
        gs_adds(e, ")");
        return;
    }
    j->raw = 1;
    gen(j, p, path, e);
    j->raw = 0;
}

int ms_grammar_tool_call_gbnf(json_t *tools, const char *only, int compact, char **out, ms_err *err) {
    *out = NULL;
    js j;
    memset(&j, 0, sizeof j);
    j.err = err;
    gstr calls = {0};
    const char *nl = compact ? "" : "\\n";
    size_t k;
    json_t *t;
    int n_calls = 0;
    json_array_foreach(tools, k, t) {
        json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name || (only && strcmp(name, only))) continue;
        json_t *params = json_object_get(fn, "parameters");
        j.root = params;
        char path[300];
        snprintf(path, sizeof path, "tools[%zu].function.parameters", k);
        json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
        if (params && !json_is_object(params)) { jfail(&j, path, "must be an object"); break; }
        gstr c = {0};
        gs_adds(&c, "(\"<tool_call>\" ");
        gs_lit(&c, name, strlen(name));
        gs_printf(&c, " \"%s\"", nl);
        const char *key;
        json_t *p;
        json_object_foreach(props, key, p) {
            int required = 0;
            size_t m;
            json_t *rn;
            json_array_foreach(req, m, rn) if (json_is_string(rn) && !strcmp(json_string_value(rn), key)) required = 1;
            char p2[400];
            snprintf(p2, sizeof p2, "%s/properties/%s", path, key);
            gs_adds(&c, required ? " (" : " (");
            gs_adds(&c, "\"<arg_key>\" ");
            gs_lit(&c, key, strlen(key));
            gs_printf(&c, " \"</arg_key>%s<arg_value>\" ", nl);
            tool_value(&j, p, p2, &c);
            gs_printf(&c, " \"</arg_value>%s\")%s", nl, required ? "" : "?");
        }
        gs_adds(&c, " \"</tool_call>\")");
        if (n_calls++) gs_adds(&calls, " | ");
        gs_adds(&calls, c.s ? c.s : "\"\"");
        free(c.s);
        if (j.rc) break;
    }
    if (!j.rc && !n_calls) jfail(&j, "tools", only ? "no tool named '%s'" : "no tools", only ? only : "");
    gstr all = {0};
    if (!j.rc) gs_printf(&all, "root ::= tcall%s\ntcall ::= %s\n", only ? "" : " (\"\\n\" tcall)*", calls.s);
    const int oom = calls.oom;
    free(calls.s);
    return js_finish(&j, &all, oom, "tool call grammar", out);
}

int ms_grammar_no_substring_gbnf(const char *pat, char **out, ms_err *err) {
    /* states s_i: the text ends with pat[0..i) and nowhere contains pat. pat[0] must not occur
     * again in pat, so a mismatch falls back to s_1 on pat[0] and to s_0 otherwise. */
    *out = NULL;
    size_t n = strlen(pat);
    if (n < 2 || n > 64 || memchr(pat + 1, pat[0], n - 1) || (unsigned char)pat[0] >= 0x80)
        return ms_errf(err, MS_ERR_INVALID, "no-substring grammar: '%s' must be 2..64 bytes with a unique ASCII first byte", pat);
    gstr g = {0};
    gs_adds(&g, "root ::= s0\n");
    for (size_t i = 0; i < n; i++) {
        gs_printf(&g, "s%zu ::= \"\"", i);
        if (i + 1 < n) { gs_adds(&g, " | "); gs_lit(&g, pat + i, 1); gs_printf(&g, " s%zu", i + 1); }
        if (i > 0) { gs_adds(&g, " | "); gs_lit(&g, pat, 1); gs_adds(&g, " s1"); }
        gs_adds(&g, " | [^");
        char cls[16];
        int c0 = (unsigned char)pat[0], ci = (unsigned char)pat[i];
        snprintf(cls, sizeof cls, "\\x%02X", c0);
        gs_adds(&g, cls);
        if (i > 0) { snprintf(cls, sizeof cls, "\\x%02X", ci); gs_adds(&g, cls); }
        gs_adds(&g, "] s0\n");
    }
    if (g.oom) { free(g.s); return ms_errf(err, MS_ERR_NOMEM, "no-substring grammar: out of memory"); }
    *out = g.s;
    return MS_OK;
}
