/* json_schema.c - JSON Schema -> GBNF text (then compiled like any GBNF grammar).
 *
 * Handled: type (one or a list), enum, const, properties, required, additionalProperties (a map
 * when there are no properties), items, prefixItems, minItems/maxItems, anyOf/oneOf (oneOf is not
 * made exclusive), a one-element allOf, $ref into the document (#, #/$defs/..., #/definitions/...;
 * recursion allowed), nullable, minLength/maxLength, pattern, format (date, time, date-time, uuid,
 * email, ipv4), integer bounds (exact), number bounds (generated as integers in the range).
 * Validation keywords that cannot be enforced here (not, if/then/else, uniqueItems, multipleOf,
 * patternProperties, ...) are refused with a message naming the keyword and where it sits.
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

/* Appends a GBNF expression for the decimal numbers of exactly the digits of a..b (same length). */
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
    gs_adds(e, "(");
    gs_printf(e, "(\"%c\" ", a[0]);
    range_same_len(e, a + 1, nines, n - 1);
    gs_adds(e, ")");
    if (b[0] - a[0] > 1) gs_printf(e, " | ([%c-%c] [0-9]{%d})", a[0] + 1, b[0] - 1, n - 1);
    gs_printf(e, " | (\"%c\" ", b[0]);
    range_same_len(e, zeros, b + 1, n - 1);
    gs_adds(e, "))");
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

static void gen_integer(js *j, json_t *s, const char *path, gstr *e, int is_number) {
    double lo = -(double)MAX_INT, hi = (double)MAX_INT, v;
    int bounded = 0;
    if (get_bound(j, s, path, "minimum", &v)) lo = fmax(lo, ceil(v)), bounded = 1;
    if (get_bound(j, s, path, "exclusiveMinimum", &v)) lo = fmax(lo, floor(v) + 1), bounded = 1;
    if (get_bound(j, s, path, "maximum", &v)) hi = fmin(hi, floor(v)), bounded = 1;
    if (get_bound(j, s, path, "exclusiveMaximum", &v)) hi = fmin(hi, ceil(v) - 1), bounded = 1;
    if (j->rc) return;
    if (!bounded) { gs_adds(e, is_number ? "jnumber" : "jint"); return; }
    if (lo > hi) { jfail(j, path, "no integer lies between minimum and maximum"); return; }
    range_int(e, (long long)lo, (long long)hi);
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
    if (!any) any = json_object_get(s, "oneOf");
    json_t *all = json_object_get(s, "allOf");
    json_t *ty = json_object_get(s, "type");
    char p2[400];
    if (cst) {
        lit_json(j, cst, e);
    } else if (en) {
        if (!json_is_array(en) || !json_array_size(en)) { jfail(j, path, "'enum' must be a non-empty array"); return; }
        size_t k;
        json_t *v;
        gs_adds(e, "(");
        json_array_foreach(en, k, v) {
            if (k) gs_adds(e, " | ");
            lit_json(j, v, e);
        }
        gs_adds(e, ")");
    } else if (any) {
        if (!json_is_array(any) || !json_array_size(any)) { jfail(j, path, "'anyOf'/'oneOf' must be a non-empty array"); return; }
        size_t k;
        json_t *v;
        gs_adds(e, "(");
        json_array_foreach(any, k, v) {
            if (k) gs_adds(e, " | ");
            snprintf(p2, sizeof p2, "%s/anyOf/%zu", path, k);
            gen(j, v, p2, e);
        }
        gs_adds(e, ")");
    } else if (all) {
        if (!json_is_array(all) || json_array_size(all) != 1) { jfail(j, path, "keyword 'allOf' is supported with one schema only"); return; }
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
        gs_adds(&all, BASE);
        if (j.out.s) gs_adds(&all, j.out.s);
        if (all.oom || j.out.oom || root.oom) j.rc = ms_errf(err, MS_ERR_NOMEM, "json schema: out of memory");
    }
    free(root.s);
    free(j.out.s);
    for (int i = 0; i < j.n_refs; i++) free(j.ref_keys[i]);
    free(j.ref_keys);
    free(j.ref_rule);
    if (j.rc) { free(all.s); return j.rc; }
    *out = all.s;
    return MS_OK;
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
    if (!j.rc) {
        gs_printf(&all, "root ::= tcall%s\ntcall ::= %s\n", only ? "" : " (\"\\n\" tcall)*", calls.s);
        gs_adds(&all, BASE);
        if (j.out.s) gs_adds(&all, j.out.s);
        if (all.oom || j.out.oom || calls.oom) j.rc = ms_errf(err, MS_ERR_NOMEM, "tool call grammar: out of memory");
    }
    free(calls.s);
    free(j.out.s);
    for (int i = 0; i < j.n_refs; i++) free(j.ref_keys[i]);
    free(j.ref_keys);
    free(j.ref_rule);
    if (j.rc) { free(all.s); return j.rc; }
    *out = all.s;
    return MS_OK;
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
