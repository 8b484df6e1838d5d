/* tok_json.c - reads tokenizer.json into an ms_tokenizer.
 *
 * A tokenizer.json is 7-35 MB, nearly all of it model.vocab and model.merges. jansson builds a
 * tree of ~300k objects for that, which takes longer than our whole load budget (150 ms for a
 * 150k vocabulary), so a small scanner reads those two fields straight into flat arrays and hash
 * tables; every other section is small and is parsed with jansson from its byte span. Each error
 * names the field. */
#include "tokenizer/tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ID (1 << 26)

/* ---------------- scanner ---------------- */

typedef struct {
    const char *b, *p, *e;
    const char *path;
    ms_err *err;
} js;

/* Index of the array element being read, appended to field names in errors (-1: none). */
static _Thread_local long g_field_idx = -1;

static int js_fail(js *j, const char *field, const char *what) {
    if (g_field_idx >= 0)
        return ms_errf(j->err, MS_ERR_FORMAT, "%s: %s[%ld]: %s at byte %zu", j->path, field, g_field_idx, what,
                       (size_t)(j->p - j->b));
    return ms_errf(j->err, MS_ERR_FORMAT, "%s: %s: %s at byte %zu", j->path, field, what,
                   (size_t)(j->p - j->b));
}

static inline void js_ws(js *j) {
    while (j->p < j->e && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) j->p++;
}

/* Skips a string (j->p at the opening quote): memchr to the next quote, which ends the string
 * unless an odd run of backslashes escapes it. */
static int js_skip_str(js *j, const char *field) {
    const char *q = j->p + 1;
    while (1) {
        q = memchr(q, '"', (size_t)(j->e - q));
        if (!q) { j->p = j->e; return js_fail(j, field, "unterminated string"); }
        const char *b = q;
        while (b > j->p + 1 && b[-1] == '\\') b--;
        if (((q - b) & 1) == 0) { j->p = q + 1; return 0; }
        q++;
    }
}

static int js_skip(js *j, const char *field, int depth) {
    js_ws(j);
    if (j->p >= j->e) return js_fail(j, field, "unexpected end of file");
    if (depth > 200) return js_fail(j, field, "nesting too deep");
    char c = *j->p;
    if (c == '"') return js_skip_str(j, field);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        js_ws(j);
        if (j->p < j->e && *j->p == close) { j->p++; return 0; }
        while (1) {
            if (c == '{') {
                js_ws(j);
                if (j->p >= j->e || *j->p != '"') return js_fail(j, field, "expected a string key");
                if (js_skip_str(j, field)) return -1;
                js_ws(j);
                if (j->p >= j->e || *j->p != ':') return js_fail(j, field, "expected ':'");
                j->p++;
            }
            if (js_skip(j, field, depth + 1)) return -1;
            js_ws(j);
            if (j->p < j->e && *j->p == ',') { j->p++; continue; }
            if (j->p < j->e && *j->p == close) { j->p++; return 0; }
            return js_fail(j, field, "expected ',' or a closing bracket");
        }
    }
    /* number, true, false, null */
    const char *s = j->p;
    while (j->p < j->e && ((*j->p >= '0' && *j->p <= '9') || (*j->p >= 'a' && *j->p <= 'z') || *j->p == '-' ||
                           *j->p == '+' || *j->p == '.' || *j->p == 'E'))
        j->p++;
    if (j->p == s) return js_fail(j, field, "unexpected character");
    return 0;
}

static int hex4(const char *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = p[i], h;
        if (c >= '0' && c <= '9') h = c - '0';
        else if (c >= 'a' && c <= 'f') h = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') h = c - 'A' + 10;
        else return -1;
        v = v * 16 + h;
    }
    return v;
}

/* Decodes the string at j->p (opening quote) appending UTF-8 to out. */
static int js_str(js *j, const char *field, tk_buf *out) {
    if (j->p >= j->e || *j->p != '"') return js_fail(j, field, "expected a string");
    j->p++;
    while (1) {
        const char *q = j->p;
        while (q < j->e && *q != '"' && *q != '\\') q++;
        if (q >= j->e) return js_fail(j, field, "unterminated string");
        if (tk_buf_put(out, j->p, (size_t)(q - j->p))) return ms_errf(j->err, MS_ERR_NOMEM, "%s: out of memory", j->path);
        j->p = q;
        if (*q == '"') { j->p++; return 0; }
        if (q + 1 >= j->e) return js_fail(j, field, "unterminated string");
        char c = q[1], o;
        j->p = q + 2;
        switch (c) {
        case '"': o = '"'; break;
        case '\\': o = '\\'; break;
        case '/': o = '/'; break;
        case 'b': o = '\b'; break;
        case 'f': o = '\f'; break;
        case 'n': o = '\n'; break;
        case 'r': o = '\r'; break;
        case 't': o = '\t'; break;
        case 'u': {
            if (j->e - j->p < 4) return js_fail(j, field, "bad \\u escape");
            int v = hex4(j->p);
            if (v < 0) return js_fail(j, field, "bad \\u escape");
            j->p += 4;
            uint32_t cp = (uint32_t)v;
            if (v >= 0xD800 && v <= 0xDBFF) {
                int lo = (j->e - j->p >= 6 && j->p[0] == '\\' && j->p[1] == 'u') ? hex4(j->p + 2) : -1;
                if (lo < 0xDC00 || lo > 0xDFFF) return js_fail(j, field, "lone surrogate in \\u escape");
                j->p += 6;
                cp = 0x10000 + (((uint32_t)v - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
            } else if (v >= 0xDC00 && v <= 0xDFFF) {
                return js_fail(j, field, "lone surrogate in \\u escape");
            }
            char enc[4];
            int k = ms_utf8_enc(cp, enc);
            if (tk_buf_put(out, enc, (size_t)k)) return ms_errf(j->err, MS_ERR_NOMEM, "%s: out of memory", j->path);
            continue;
        }
        default: return js_fail(j, field, "bad escape in string");
        }
        if (tk_buf_put(out, &o, 1)) return ms_errf(j->err, MS_ERR_NOMEM, "%s: out of memory", j->path);
    }
}

typedef struct {
    const char *s, *e; /* value span; s == NULL when absent */
} span;

/* Scans an object at j->p, recording the spans of the wanted keys (others skipped). */
static int js_object_spans(js *j, const char *field, const char *const *keys, span *spans, int nkeys) {
    for (int i = 0; i < nkeys; i++) spans[i].s = spans[i].e = NULL;
    js_ws(j);
    if (j->p >= j->e || *j->p != '{') return js_fail(j, field, "expected an object");
    j->p++;
    js_ws(j);
    if (j->p < j->e && *j->p == '}') { j->p++; return 0; }
    tk_buf key = {0};
    int rc = -1;
    while (1) {
        js_ws(j);
        key.len = 0;
        if (js_str(j, field, &key)) goto out;
        js_ws(j);
        if (j->p >= j->e || *j->p != ':') { js_fail(j, field, "expected ':'"); goto out; }
        j->p++;
        js_ws(j);
        const char *vs = j->p;
        if (js_skip(j, field, 1)) goto out;
        for (int i = 0; i < nkeys; i++)
            if (strlen(keys[i]) == key.len && !memcmp(keys[i], key.p, key.len)) { spans[i].s = vs; spans[i].e = j->p; }
        js_ws(j);
        if (j->p < j->e && *j->p == ',') { j->p++; continue; }
        if (j->p < j->e && *j->p == '}') { j->p++; break; }
        js_fail(j, field, "expected ',' or '}'");
        goto out;
    }
    rc = 0;
out:
    tk_buf_free(&key);
    return rc;
}

/* ---------------- vocab and merges ---------------- */

static uint32_t slot_hash(const char *s, size_t n) { return (uint32_t)tk_hash(s, n); }

int32_t tk_vocab_find(const ms_tokenizer *t, const char *s, size_t n) {
    if (!t->vslots) return -1;
    uint32_t hv = slot_hash(s, n), h = hv & t->vmask;
    while (1) {
        uint64_t v = t->vslots[h];
        if (!v) return -1;
        uint32_t id = (uint32_t)v - 1;
        if ((uint32_t)(v >> 32) == hv && t->tok_len[id] == n && !memcmp(t->arena + t->tok_off[id], s, n)) return (int32_t)id;
        h = (h + 1) & t->vmask;
    }
}

typedef struct {
    int32_t id;
    uint32_t off, len;
} vent;

static int parse_vocab(ms_tokenizer *t, js *j, tk_buf *arena, vent **ents_out, int *n_out) {
    const char *F = "model.vocab";
    vent *ents = NULL;
    int n = 0, cap = 0;
    js_ws(j);
    if (j->p >= j->e || *j->p != '{') return js_fail(j, F, "expected an object");
    j->p++;
    js_ws(j);
    if (j->p < j->e && *j->p == '}') { j->p++; goto done; }
    while (1) {
        js_ws(j);
        uint32_t off = (uint32_t)arena->len;
        if (js_str(j, F, arena)) goto fail;
        if (arena->len > 0xFFFFFFF0u) { js_fail(j, F, "too large"); goto fail; }
        js_ws(j);
        if (j->p >= j->e || *j->p != ':') { js_fail(j, F, "expected ':'"); goto fail; }
        j->p++;
        js_ws(j);
        long long v = 0;
        const char *s = j->p;
        while (j->p < j->e && *j->p >= '0' && *j->p <= '9' && v <= MAX_ID) v = v * 10 + (*j->p++ - '0');
        if (j->p == s || v >= MAX_ID || (j->p < j->e && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))) {
            js_fail(j, F, "token id must be an integer in [0, 67108864)");
            goto fail;
        }
        if (n >= cap) {
            cap = cap ? cap * 2 : 65536;
            vent *ne = realloc(ents, (size_t)cap * sizeof *ents);
            if (!ne) { ms_errf(j->err, MS_ERR_NOMEM, "%s: out of memory", j->path); goto fail; }
            ents = ne;
        }
        ents[n++] = (vent){(int32_t)v, off, (uint32_t)(arena->len - off)};
        if (tk_buf_put(arena, "", 1)) { ms_errf(j->err, MS_ERR_NOMEM, "%s: out of memory", j->path); goto fail; }
        js_ws(j);
        if (j->p < j->e && *j->p == ',') { j->p++; continue; }
        if (j->p < j->e && *j->p == '}') { j->p++; break; }
        js_fail(j, F, "expected ',' or '}'");
        goto fail;
    }
done:
    (void)t;
    *ents_out = ents;
    *n_out = n;
    return 0;
fail:
    free(ents);
    return -1;
}

static inline uint64_t mhash(uint64_t k) { return (k * 0x9E3779B97F4A7C15ull) >> 20; }

static int merge_put(ms_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = mhash(k) & t->mmask;
    while (t->mkeys[2 * h] != UINT64_MAX && t->mkeys[2 * h] != k) h = (h + 1) & t->mmask;
    t->mkeys[2 * h] = k;
    t->mkeys[2 * h + 1] = ((uint64_t)rank << 32) | (uint32_t)id;
    return 0;
}

static int parse_merges(ms_tokenizer *t, js *j) {
    char F[64] = "model.merges";
    js_ws(j);
    if (j->p >= j->e || *j->p != '[') return js_fail(j, F, "expected an array");
    /* Table size from the commas in the span (an over-count when tokens hold commas: harmless). */
    size_t est = 1;
    for (const char *q = j->p; (q = memchr(q, ',', (size_t)(j->e - q))); q++) est++;
    uint64_t cap = 1024;
    while (cap < est * 2) cap *= 2;
    t->mkeys = malloc(2 * cap * sizeof *t->mkeys);
    if (!t->mkeys) return ms_errf(j->err, MS_ERR_NOMEM, "%s: out of memory for merges", j->path);
    memset(t->mkeys, 0xFF, 2 * cap * sizeof *t->mkeys);
    t->mmask = cap - 1;
    j->p++;
    js_ws(j);
    if (j->p < j->e && *j->p == ']') { j->p++; return 0; }
    tk_buf a = {0}, b = {0}, ab = {0};
    int rc = -1;
#define MF() (snprintf(F, sizeof F, "model.merges[%u]", rank), F)
    g_field_idx = 0;
    for (uint32_t rank = 0;; rank++) {
        g_field_idx = rank;
        js_ws(j);
        a.len = b.len = 0;
        if (j->p < j->e && *j->p == '"') {
            if (js_str(j, "model.merges", &a)) goto out;
            char *sp = memchr(a.p, ' ', a.len);
            if (!sp || memchr(sp + 1, ' ', a.len - (size_t)(sp + 1 - a.p))) {
                js_fail(j, "model.merges", "expected \"left right\" with exactly one space");
                goto out;
            }
            size_t l = (size_t)(sp - a.p);
            if (tk_buf_put(&b, sp + 1, a.len - l - 1)) goto oom;
            a.len = l;
        } else if (j->p < j->e && *j->p == '[') {
            j->p++;
            js_ws(j);
            if (js_str(j, "model.merges", &a)) goto out;
            js_ws(j);
            if (j->p >= j->e || *j->p != ',') { js_fail(j, "model.merges", "expected a pair [left, right]"); goto out; }
            j->p++;
            js_ws(j);
            if (js_str(j, "model.merges", &b)) goto out;
            js_ws(j);
            if (j->p >= j->e || *j->p != ']') { js_fail(j, "model.merges", "expected a pair [left, right]"); goto out; }
            j->p++;
        } else {
            js_fail(j, "model.merges", "expected a string or a [left, right] pair");
            goto out;
        }
        int32_t ia = tk_vocab_find(t, a.p, a.len), ib = tk_vocab_find(t, b.p, b.len);
        ab.len = 0;
        if (tk_buf_put(&ab, a.p, a.len) || tk_buf_put(&ab, b.p, b.len)) goto oom;
        int32_t iab = tk_vocab_find(t, ab.p, ab.len);
        if (ia < 0 || ib < 0) {
            ms_errf(j->err, MS_ERR_FORMAT, "%s: %s: token \"%.*s\" is not in model.vocab", j->path, MF(),
                    ia < 0 ? (int)a.len : (int)b.len, ia < 0 ? a.p : b.p);
            goto out;
        }
        if (iab < 0) {
            ms_errf(j->err, MS_ERR_FORMAT, "%s: %s: merged token \"%.*s\" is not in model.vocab", j->path, MF(),
                    (int)ab.len, ab.p);
            goto out;
        }
        if ((uint64_t)rank * 2 >= cap) { js_fail(j, "model.merges", "too many merges"); goto out; }
        merge_put(t, ia, ib, rank, iab);
        js_ws(j);
        if (j->p < j->e && *j->p == ',') { j->p++; continue; }
        if (j->p < j->e && *j->p == ']') { j->p++; break; }
        g_field_idx = -1;
        js_fail(j, "model.merges", "expected ',' or ']'");
        goto out;
    }
    #undef MF
    rc = 0;
    goto out;
oom:
    ms_errf(j->err, MS_ERR_NOMEM, "%s: out of memory", j->path);
out:
    g_field_idx = -1;
    tk_buf_free(&a);
    tk_buf_free(&b);
    tk_buf_free(&ab);
    return rc;
}

/* ---------------- small sections (jansson) ---------------- */

static json_t *load_span(js *j, span sp, const char *field) {
    json_error_t je;
    json_t *v = json_loadb(sp.s, (size_t)(sp.e - sp.s), JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v) ms_errf(j->err, MS_ERR_FORMAT, "%s: %s: %s", j->path, field, je.text);
    return v;
}

typedef struct {
    ms_tokenizer *t;
    const char *path;
    ms_err *err;
} ctx;

static int bad(ctx *c, const char *field, const char *what) {
    return ms_errf(c->err, MS_ERR_FORMAT, "%s: %s: %s", c->path, field, what);
}

static const char *get_type(ctx *c, json_t *o, const char *field, int *rc) {
    *rc = 0;
    json_t *ty = json_object_get(o, "type");
    if (!json_is_string(ty)) { *rc = bad(c, field, "expected an object with a string \"type\""); return NULL; }
    return json_string_value(ty);
}

static int unsupported(ctx *c, const char *field, const char *type, const char *supported) {
    return ms_errf(c->err, MS_ERR_UNSUPPORTED, "%s: %s.type \"%s\" is not supported (supported: %s)", c->path,
                   field, type, supported);
}

static int get_bool(ctx *c, json_t *o, const char *key, int def, int *out, const char *field) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) { *out = def; return 0; }
    if (!json_is_boolean(v)) {
        char f[160];
        snprintf(f, sizeof f, "%s.%s", field, key);
        return bad(c, f, "expected true or false");
    }
    *out = json_is_true(v);
    return 0;
}

static int dup_str(ctx *c, json_t *v, char **out, size_t *len, const char *field) {
    if (!json_is_string(v)) return bad(c, field, "expected a string");
    *len = json_string_length(v);
    *out = malloc(*len + 1);
    if (!*out) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
    memcpy(*out, json_string_value(v), *len + 1);
    return 0;
}

static int compile_re(ctx *c, const char *pat, size_t len, tk_regex **out, const char *field) {
    char why[200];
    if (tk_regex_new(pat, len, out, why, sizeof why)) {
        return ms_errf(c->err, MS_ERR_FORMAT, "%s: %s: invalid regex: %s", c->path, field, why);
    }
    return 0;
}

/* pattern: {"String": s} or {"Regex": r}. */
static int parse_pattern(ctx *c, json_t *o, const char *field, char **lit, size_t *lit_len, tk_regex **re) {
    char f[160];
    snprintf(f, sizeof f, "%s.pattern", field);
    json_t *p = json_object_get(o, "pattern");
    if (!json_is_object(p)) return bad(c, f, "expected {\"String\": ...} or {\"Regex\": ...}");
    json_t *s = json_object_get(p, "String"), *r = json_object_get(p, "Regex");
    if (json_is_string(s)) {
        if (json_string_length(s) == 0) return bad(c, f, "empty String pattern");
        return dup_str(c, s, lit, lit_len, f);
    }
    if (json_is_string(r)) return compile_re(c, json_string_value(r), json_string_length(r), re, f);
    return bad(c, f, "expected {\"String\": ...} or {\"Regex\": ...}");
}

/* A "Sequence" component: applies add() to each element of o[key] (depth-limited, errors name
 * "<field>.<key>[i]"). Shared by normalizers, pre-tokenizers, decoders and post-processors. */
typedef int (*add_fn)(ctx *c, json_t *o, const char *field, int depth);
static int each_in_sequence(ctx *c, json_t *o, const char *field, const char *key, int depth, add_fn add) {
    char f[160];
    json_t *arr = json_object_get(o, key);
    snprintf(f, sizeof f, "%s.%s", field, key);
    if (!json_is_array(arr)) return bad(c, f, "expected an array");
    if (depth > 8) return bad(c, field, "sequences nested too deeply");
    for (size_t i = 0; i < json_array_size(arr); i++) {
        snprintf(f, sizeof f, "%s.%s[%zu]", field, key, i);
        MS_TRY(add(c, json_array_get(arr, i), f, depth + 1));
    }
    return 0;
}

static int add_norm(ctx *c, json_t *o, const char *field, int depth) {
    ms_tokenizer *t = c->t;
    int rc;
    const char *ty = get_type(c, o, field, &rc);
    if (!ty) return rc;
    if (!strcmp(ty, "Sequence")) return each_in_sequence(c, o, field, "normalizers", depth, add_norm);
    tk_norm *nn = realloc(t->norms, (size_t)(t->n_norms + 1) * sizeof *nn);
    if (!nn) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
    t->norms = nn;
    tk_norm *n = &t->norms[t->n_norms];
    memset(n, 0, sizeof *n);
    if (!strcmp(ty, "NFC")) n->kind = TK_N_NFC;
    else if (!strcmp(ty, "NFD")) n->kind = TK_N_NFD;
    else if (!strcmp(ty, "NFKC")) n->kind = TK_N_NFKC;
    else if (!strcmp(ty, "NFKD")) n->kind = TK_N_NFKD;
    else if (!strcmp(ty, "Lowercase")) n->kind = TK_N_LOWER;
    else if (!strcmp(ty, "StripAccents")) n->kind = TK_N_STRIPACC;
    else if (!strcmp(ty, "Strip")) {
        n->kind = TK_N_STRIP;
        MS_TRY(get_bool(c, o, "strip_left", 0, &n->left, field));
        MS_TRY(get_bool(c, o, "strip_right", 0, &n->right, field));
    } else if (!strcmp(ty, "Replace")) {
        n->kind = TK_N_REPLACE;
        t->n_norms++; /* owned from here on, freed with the tokenizer */
        MS_TRY(parse_pattern(c, o, field, &n->pat, &n->pat_len, &n->re));
        char f[160];
        snprintf(f, sizeof f, "%s.content", field);
        return dup_str(c, json_object_get(o, "content"), &n->content, &n->content_len, f);
    } else if (!strcmp(ty, "Prepend")) {
        n->kind = TK_N_PREPEND;
        t->n_norms++;
        char f[160];
        snprintf(f, sizeof f, "%s.prepend", field);
        return dup_str(c, json_object_get(o, "prepend"), &n->content, &n->content_len, f);
    } else {
        return unsupported(c, field, ty, "NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Replace, Prepend, Sequence");
    }
    t->n_norms++;
    return 0;
}

static int parse_behavior(ctx *c, json_t *o, const char *field, int def, int *out) {
    json_t *b = json_object_get(o, "behavior");
    if (!b || json_is_null(b)) { *out = def; return 0; }
    const char *s = json_string_value(b);
    char f[160];
    snprintf(f, sizeof f, "%s.behavior", field);
    if (!s) return bad(c, f, "expected a string");
    if (!strcmp(s, "Removed")) *out = TK_SPLIT_REMOVED;
    else if (!strcmp(s, "Isolated")) *out = TK_SPLIT_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious")) *out = TK_SPLIT_PREV;
    else if (!strcmp(s, "MergedWithNext")) *out = TK_SPLIT_NEXT;
    else if (!strcmp(s, "Contiguous")) *out = TK_SPLIT_CONTIG;
    else return ms_errf(c->err, MS_ERR_UNSUPPORTED, "%s: %s \"%s\" is not supported (supported: Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)", c->path, f, s);
    return 0;
}

static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int add_pretok(ctx *c, json_t *o, const char *field, int depth) {
    ms_tokenizer *t = c->t;
    int rc;
    const char *ty = get_type(c, o, field, &rc);
    if (!ty) return rc;
    if (!strcmp(ty, "Sequence")) return each_in_sequence(c, o, field, "pretokenizers", depth, add_pretok);
    tk_pretok *np = realloc(t->pretoks, (size_t)(t->n_pretoks + 1) * sizeof *np);
    if (!np) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
    t->pretoks = np;
    tk_pretok *p = &t->pretoks[t->n_pretoks];
    memset(p, 0, sizeof *p);
    char f[160];
    if (!strcmp(ty, "Split")) {
        p->kind = TK_PT_SPLIT;
        t->n_pretoks++;
        MS_TRY(parse_behavior(c, o, field, -1, &p->behavior));
        if (p->behavior < 0) { snprintf(f, sizeof f, "%s.behavior", field); return bad(c, f, "missing"); }
        MS_TRY(get_bool(c, o, "invert", 0, &p->invert, field));
        return parse_pattern(c, o, field, &p->lit, &p->lit_len, &p->re);
    }
    if (!strcmp(ty, "ByteLevel")) {
        p->kind = TK_PT_BYTELEVEL;
        t->n_pretoks++;
        MS_TRY(get_bool(c, o, "add_prefix_space", 1, &p->add_prefix_space, field));
        MS_TRY(get_bool(c, o, "use_regex", 1, &p->use_regex, field));
        if (p->use_regex) return compile_re(c, GPT2_RE, sizeof GPT2_RE - 1, &p->re, field);
        return 0;
    }
    if (!strcmp(ty, "Digits")) {
        p->kind = TK_PT_DIGITS;
        t->n_pretoks++;
        return get_bool(c, o, "individual_digits", 0, &p->individual, field);
    }
    if (!strcmp(ty, "Metaspace")) {
        p->kind = TK_PT_METASPACE;
        t->n_pretoks++;
        json_t *r = json_object_get(o, "replacement");
        snprintf(f, sizeof f, "%s.replacement", field);
        if (r && !json_is_null(r)) {
            MS_TRY(dup_str(c, r, &p->lit, &p->lit_len, f));
            uint32_t cp;
            if (p->lit_len == 0 || (size_t)ms_utf8_len((unsigned char)p->lit[0]) != p->lit_len ||
                tk_utf8_valid_prefix((const unsigned char *)p->lit, p->lit_len) != p->lit_len)
                return bad(c, f, "expected one character");
            (void)cp;
        } else {
            p->lit = strdup("\xE2\x96\x81");
            if (!p->lit) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
            p->lit_len = 3;
        }
        json_t *ps = json_object_get(o, "prepend_scheme");
        p->prepend = TK_PREPEND_ALWAYS;
        if (json_is_string(ps)) {
            const char *s = json_string_value(ps);
            if (!strcmp(s, "always")) p->prepend = TK_PREPEND_ALWAYS;
            else if (!strcmp(s, "first")) p->prepend = TK_PREPEND_FIRST;
            else if (!strcmp(s, "never")) p->prepend = TK_PREPEND_NEVER;
            else { snprintf(f, sizeof f, "%s.prepend_scheme", field); return bad(c, f, "expected always, first or never"); }
        } else {
            int aps;
            MS_TRY(get_bool(c, o, "add_prefix_space", 1, &aps, field));
            p->prepend = aps ? TK_PREPEND_ALWAYS : TK_PREPEND_NEVER;
        }
        return get_bool(c, o, "split", 1, &p->msplit, field);
    }
    if (!strcmp(ty, "WhitespaceSplit")) { p->kind = TK_PT_WSSPLIT; t->n_pretoks++; return 0; }
    if (!strcmp(ty, "Punctuation")) {
        p->kind = TK_PT_PUNCT;
        t->n_pretoks++;
        return parse_behavior(c, o, field, TK_SPLIT_ISOLATED, &p->behavior);
    }
    if (!strcmp(ty, "CharDelimiterSplit")) {
        p->kind = TK_PT_CHARDELIM;
        t->n_pretoks++;
        snprintf(f, sizeof f, "%s.delimiter", field);
        MS_TRY(dup_str(c, json_object_get(o, "delimiter"), &p->lit, &p->lit_len, f));
        if (p->lit_len == 0 || (size_t)ms_utf8_len((unsigned char)p->lit[0]) != p->lit_len) return bad(c, f, "expected one character");
        return 0;
    }
    if (!strcmp(ty, "Whitespace")) {
        p->kind = TK_PT_WHITESPACE;
        t->n_pretoks++;
        static const char WS_RE[] = "\\w+|[^\\w\\s]+";
        return compile_re(c, WS_RE, sizeof WS_RE - 1, &p->re, field);
    }
    return unsupported(c, field, ty, "Split, ByteLevel, Digits, Metaspace, WhitespaceSplit, Whitespace, Punctuation, CharDelimiterSplit, Sequence");
}

static int add_dec(ctx *c, json_t *o, const char *field, int depth) {
    ms_tokenizer *t = c->t;
    int rc;
    const char *ty = get_type(c, o, field, &rc);
    if (!ty) return rc;
    char f[160];
    if (!strcmp(ty, "Sequence")) return each_in_sequence(c, o, field, "decoders", depth, add_dec);
    tk_dec *nd = realloc(t->decs, (size_t)(t->n_decs + 1) * sizeof *nd);
    if (!nd) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
    t->decs = nd;
    tk_dec *d = &t->decs[t->n_decs];
    memset(d, 0, sizeof *d);
    t->n_decs++;
    if (!strcmp(ty, "ByteLevel")) { d->kind = TK_D_BYTELEVEL; return 0; }
    if (!strcmp(ty, "ByteFallback")) { d->kind = TK_D_BYTEFALLBACK; return 0; }
    if (!strcmp(ty, "Fuse")) { d->kind = TK_D_FUSE; return 0; }
    if (!strcmp(ty, "Metaspace")) {
        d->kind = TK_D_METASPACE;
        json_t *r = json_object_get(o, "replacement");
        snprintf(f, sizeof f, "%s.replacement", field);
        if (r && !json_is_null(r)) MS_TRY(dup_str(c, r, &d->pat, &d->pat_len, f));
        else {
            d->pat = strdup("\xE2\x96\x81");
            if (!d->pat) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
            d->pat_len = 3;
        }
        if (d->pat_len == 0) return bad(c, f, "expected one character");
        json_t *ps = json_object_get(o, "prepend_scheme");
        d->prepend = 1;
        if (json_is_string(ps)) d->prepend = strcmp(json_string_value(ps), "never") != 0;
        else {
            int aps;
            MS_TRY(get_bool(c, o, "add_prefix_space", 1, &aps, field));
            d->prepend = aps;
        }
        return 0;
    }
    if (!strcmp(ty, "Strip")) {
        d->kind = TK_D_STRIP;
        snprintf(f, sizeof f, "%s.content", field);
        MS_TRY(dup_str(c, json_object_get(o, "content"), &d->content, &d->content_len, f));
        if (d->content_len == 0 || (size_t)ms_utf8_len((unsigned char)d->content[0]) != d->content_len)
            return bad(c, f, "expected one character");
        json_t *a = json_object_get(o, "start"), *b = json_object_get(o, "stop");
        if (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 || json_integer_value(b) < 0 ||
            json_integer_value(a) > 1000000 || json_integer_value(b) > 1000000)
            return bad(c, field, "start and stop must be non-negative integers");
        d->start = (int)json_integer_value(a);
        d->stop = (int)json_integer_value(b);
        return 0;
    }
    if (!strcmp(ty, "Replace")) {
        d->kind = TK_D_REPLACE;
        MS_TRY(parse_pattern(c, o, field, &d->pat, &d->pat_len, &d->re));
        snprintf(f, sizeof f, "%s.content", field);
        return dup_str(c, json_object_get(o, "content"), &d->content, &d->content_len, f);
    }
    if (!strcmp(ty, "BPEDecoder")) {
        d->kind = TK_D_BPE;
        json_t *s = json_object_get(o, "suffix");
        snprintf(f, sizeof f, "%s.suffix", field);
        if (s && !json_is_null(s)) return dup_str(c, s, &d->pat, &d->pat_len, f);
        d->pat = strdup("</w>");
        d->pat_len = 4;
        return d->pat ? 0 : ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
    }
    if (!strcmp(ty, "WordPiece")) {
        d->kind = TK_D_WORDPIECE;
        json_t *s = json_object_get(o, "prefix");
        snprintf(f, sizeof f, "%s.prefix", field);
        if (s && !json_is_null(s)) MS_TRY(dup_str(c, s, &d->pat, &d->pat_len, f));
        else {
            d->pat = strdup("##");
            d->pat_len = 2;
            if (!d->pat) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
        }
        return get_bool(c, o, "cleanup", 1, &d->cleanup, field);
    }
    t->n_decs--;
    return unsupported(c, field, ty, "ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, BPEDecoder, WordPiece, Sequence");
}

static int ids_of(ctx *c, json_t *v, const char *field, int32_t **ids, int *n) {
    /* [string, id] as Roberta/Bert write cls and sep */
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(json_array_get(v, 1)))
        return bad(c, field, "expected [token, id]");
    json_int_t id = json_integer_value(json_array_get(v, 1));
    if (id < 0 || id >= MAX_ID) return bad(c, field, "id out of range");
    int32_t *ni = realloc(*ids, (size_t)(*n + 1) * sizeof **ids);
    if (!ni) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
    *ids = ni;
    (*ids)[(*n)++] = (int32_t)id;
    return 0;
}

static int add_post(ctx *c, json_t *o, const char *field, int depth) {
    ms_tokenizer *t = c->t;
    int rc;
    const char *ty = get_type(c, o, field, &rc);
    if (!ty) return rc;
    char f[160];
    if (!strcmp(ty, "Sequence")) return each_in_sequence(c, o, field, "processors", depth, add_post);
    tk_post *np = realloc(t->posts, (size_t)(t->n_posts + 1) * sizeof *np);
    if (!np) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
    t->posts = np;
    tk_post *p = &t->posts[t->n_posts];
    memset(p, 0, sizeof *p);
    t->n_posts++;
    if (!strcmp(ty, "ByteLevel")) { p->kind = TK_PP_BYTELEVEL; return 0; }
    if (!strcmp(ty, "RobertaProcessing") || !strcmp(ty, "BertProcessing")) {
        p->kind = !strcmp(ty, "BertProcessing") ? TK_PP_BERT : TK_PP_ROBERTA;
        snprintf(f, sizeof f, "%s.cls", field);
        MS_TRY(ids_of(c, json_object_get(o, "cls"), f, &p->pre, &p->n_pre));
        snprintf(f, sizeof f, "%s.sep", field);
        return ids_of(c, json_object_get(o, "sep"), f, &p->post, &p->n_post);
    }
    if (!strcmp(ty, "TemplateProcessing")) {
        p->kind = TK_PP_TEMPLATE;
        json_t *single = json_object_get(o, "single"), *sp = json_object_get(o, "special_tokens");
        snprintf(f, sizeof f, "%s.single", field);
        if (!json_is_array(single)) return bad(c, f, "expected an array");
        int seen_seq = 0;
        for (size_t i = 0; i < json_array_size(single); i++) {
            json_t *it = json_array_get(single, i);
            snprintf(f, sizeof f, "%s.single[%zu]", field, i);
            json_t *st = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
            if (json_is_object(sq)) {
                if (seen_seq) return ms_errf(c->err, MS_ERR_UNSUPPORTED, "%s: %s: a single template with two sequences is not supported", c->path, f);
                seen_seq = 1;
                continue;
            }
            json_t *idv = json_object_get(st, "id");
            if (!json_is_string(idv)) return bad(c, f, "expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}");
            json_t *entry = json_object_get(sp, json_string_value(idv));
            json_t *ids = json_object_get(entry, "ids");
            if (!json_is_array(ids)) {
                snprintf(f, sizeof f, "%s.special_tokens[\"%s\"].ids", field, json_string_value(idv));
                return bad(c, f, "missing or not an array");
            }
            for (size_t k = 0; k < json_array_size(ids); k++) {
                json_t *x = json_array_get(ids, k);
                if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= MAX_ID) {
                    snprintf(f, sizeof f, "%s.special_tokens[\"%s\"].ids[%zu]", field, json_string_value(idv), k);
                    return bad(c, f, "expected a token id");
                }
                int32_t **dst = seen_seq ? &p->post : &p->pre;
                int *dn = seen_seq ? &p->n_post : &p->n_pre;
                int32_t *ni = realloc(*dst, (size_t)(*dn + 1) * sizeof **dst);
                if (!ni) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
                *dst = ni;
                (*dst)[(*dn)++] = (int32_t)json_integer_value(x);
            }
        }
        return 0;
    }
    t->n_posts--;
    return unsupported(c, field, ty, "TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence");
}

/* ---------------- byte-level tables ---------------- */

static int16_t g_cp_to_byte[324];
static uint16_t g_byte_to_cp[256];
static int g_bl_ready;

static void bytelevel_init(void) {
    if (__atomic_load_n(&g_bl_ready, __ATOMIC_ACQUIRE)) return;
    /* Bytes that are printable keep their code point; the rest map to U+0100 upward in order. */
    uint16_t b2c[256];
    int16_t c2b[324];
    for (int i = 0; i < 324; i++) c2b[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        b2c[b] = (uint16_t)(keep ? b : 256 + n++);
    }
    for (int b = 0; b < 256; b++) c2b[b2c[b]] = (int16_t)b;
    memcpy(g_byte_to_cp, b2c, sizeof b2c);
    memcpy(g_cp_to_byte, c2b, sizeof c2b);
    __atomic_store_n(&g_bl_ready, 1, __ATOMIC_RELEASE);
}

int tk_bytelevel_byte(uint32_t cp) { return cp < 324 ? g_cp_to_byte[cp] : -1; }
uint32_t tk_bytelevel_char(unsigned byte) { return g_byte_to_cp[byte & 255]; }

/* ---------------- added tokens ---------------- */

static int cmp_added(const void *a, const void *b, void *arg) {
    const ms_tokenizer *t = arg;
    const tk_added *x = &t->added[*(const int *)a], *y = &t->added[*(const int *)b];
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(t->arena + x->off, t->arena + y->off, n);
    if (c) return c;
    return x->len < y->len ? -1 : x->len > y->len;
}

static int trie_build_rec(tk_trie *tr, const ms_tokenizer *t, const int *idx, int lo, int hi, size_t depth, int node) {
    /* idx[lo..hi) sorted tokens sharing a prefix of `depth` bytes. */
    if (lo < hi && t->added[idx[lo]].len == depth) { tr->node_tok[node] = idx[lo]; lo++; }
    while (lo < hi && t->added[idx[lo]].len == depth) lo++; /* duplicates: first wins */
    int first_edge = tr->n_edges, count = 0;
    int i = lo;
    while (i < hi) {
        unsigned char byte = (unsigned char)t->arena[t->added[idx[i]].off + depth];
        int j = i;
        while (j < hi && (unsigned char)t->arena[t->added[idx[j]].off + depth] == byte) j++;
        tr->edge_byte[tr->n_edges] = byte;
        tr->edge_node[tr->n_edges] = tr->n_nodes++;
        tr->n_edges++;
        count++;
        i = j;
    }
    tr->edge_first[node] = first_edge;
    tr->edge_count[node] = count;
    i = lo;
    int e = first_edge;
    while (i < hi) {
        unsigned char byte = (unsigned char)t->arena[t->added[idx[i]].off + depth];
        int j = i;
        while (j < hi && (unsigned char)t->arena[t->added[idx[j]].off + depth] == byte) j++;
        int child = tr->edge_node[e++];
        tr->node_tok[child] = -1;
        if (trie_build_rec(tr, t, idx, i, j, depth + 1, child)) return -1;
        i = j;
    }
    return 0;
}

static int trie_build(tk_trie *tr, ms_tokenizer *t, int want_normalized) {
    memset(tr, 0, sizeof *tr);
    for (int i = 0; i < 256; i++) tr->root[i] = -1;
    int *idx = malloc((size_t)(t->n_added + 1) * sizeof *idx);
    if (!idx) return -1;
    int n = 0;
    size_t total = 1;
    for (int i = 0; i < t->n_added; i++) {
        if (!!t->added[i].normalized != want_normalized || t->added[i].len == 0) continue;
        idx[n++] = i;
        total += t->added[i].len;
    }
    tr->empty = n == 0;
    qsort_r(idx, (size_t)n, sizeof *idx, cmp_added, t);
    tr->node_tok = malloc(total * sizeof *tr->node_tok);
    tr->edge_first = malloc(total * sizeof *tr->edge_first);
    tr->edge_count = malloc(total * sizeof *tr->edge_count);
    tr->edge_byte = malloc(total);
    tr->edge_node = malloc(total * sizeof *tr->edge_node);
    if (!tr->node_tok || !tr->edge_first || !tr->edge_count || !tr->edge_byte || !tr->edge_node) { free(idx); return -1; }
    tr->n_nodes = 1;
    tr->node_tok[0] = -1;
    int rc = trie_build_rec(tr, t, idx, 0, n, 0, 0);
    for (int e = 0; e < tr->edge_count[0]; e++) tr->root[tr->edge_byte[tr->edge_first[0] + e]] = tr->edge_node[tr->edge_first[0] + e];
    free(idx);
    return rc;
}

/* Normalizes an added token's content for the normalized trie (declared in tokenizer.c). */
int tk_normalize_text(const ms_tokenizer *t, const char *s, size_t n, tk_buf *out, ms_err *err);

static int parse_added(ctx *c, json_t *arr, tk_buf *arena) {
    ms_tokenizer *t = c->t;
    if (!arr || json_is_null(arr)) return 0;
    if (!json_is_array(arr)) return bad(c, "added_tokens", "expected an array");
    size_t n = json_array_size(arr);
    t->added = calloc(n + 1, sizeof *t->added);
    if (!t->added) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(arr, i);
        char f[64];
        snprintf(f, sizeof f, "added_tokens[%zu]", i);
        json_t *id = json_object_get(o, "id"), *content = json_object_get(o, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MAX_ID)
            return bad(c, f, "\"id\" must be an integer in [0, 67108864)");
        if (!json_is_string(content)) return bad(c, f, "\"content\" must be a string");
        tk_added *a = &t->added[t->n_added];
        a->id = (int32_t)json_integer_value(id);
        a->off = a->orig_off = (uint32_t)arena->len;
        a->len = a->orig_len = (uint32_t)json_string_length(content);
        if (tk_buf_put(arena, json_string_value(content), a->len) || tk_buf_put(arena, "", 1))
            return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
        int v;
        MS_TRY(get_bool(c, o, "special", 0, &v, f)); a->special = (uint8_t)v;
        MS_TRY(get_bool(c, o, "normalized", !a->special, &v, f)); a->normalized = (uint8_t)v;
        MS_TRY(get_bool(c, o, "lstrip", 0, &v, f)); a->lstrip = (uint8_t)v;
        MS_TRY(get_bool(c, o, "rstrip", 0, &v, f)); a->rstrip = (uint8_t)v;
        MS_TRY(get_bool(c, o, "single_word", 0, &v, f)); a->single_word = (uint8_t)v;
        t->n_added++;
    }
    return 0;
}

/* ---------------- entry ---------------- */

static int parse_model_small(ctx *c, js *j, span *ms) {
    ms_tokenizer *t = c->t;
    /* 0 type, 1 vocab, 2 merges, 3 unk_token, 4 fuse_unk, 5 byte_fallback, 6 ignore_merges,
     * 7 continuing_subword_prefix, 8 end_of_word_suffix, 9 dropout */
    json_t *v = NULL;
    if (!ms[0].s) return bad(c, "model.type", "missing");
    v = load_span(j, ms[0], "model.type");
    if (!v) return -1;
    if (!json_is_string(v)) { json_decref(v); return bad(c, "model.type", "expected a string"); }
    if (strcmp(json_string_value(v), "BPE")) {
        int rc = ms_errf(c->err, MS_ERR_UNSUPPORTED, "%s: model.type \"%s\" is not supported (supported: BPE)", c->path, json_string_value(v));
        json_decref(v);
        return rc;
    }
    json_decref(v);
    static const char *names[] = {"", "", "", "model.unk_token", "model.fuse_unk", "model.byte_fallback",
                                  "model.ignore_merges", "model.continuing_subword_prefix",
                                  "model.end_of_word_suffix", "model.dropout"};
    int bools[3] = {0, 0, 0};
    for (int k = 3; k <= 9; k++) {
        if (!ms[k].s) continue;
        v = load_span(j, ms[k], names[k]);
        if (!v) return -1;
        int rc = 0;
        if (json_is_null(v)) {
        } else if (k >= 4 && k <= 6) {
            if (!json_is_boolean(v)) rc = bad(c, names[k], "expected true or false");
            else bools[k - 4] = json_is_true(v);
        } else if (k == 9) {
            if (!json_is_number(v)) rc = bad(c, names[k], "expected a number or null");
            else if (json_number_value(v) != 0.0)
                rc = ms_errf(c->err, MS_ERR_UNSUPPORTED, "%s: model.dropout %g is not supported (only null or 0: encoding must be deterministic)", c->path, json_number_value(v));
        } else {
            char *s = NULL;
            size_t sl = 0;
            rc = dup_str(c, v, &s, &sl, names[k]);
            if (!rc && k == 3) {
                /* An unk token missing from the vocabulary only fails when it is needed (-3). */
                int32_t id = tk_vocab_find(t, s, sl);
                t->unk_id = id < 0 ? -3 : id;
                free(s);
            } else if (!rc && k == 7) {
                t->cont_prefix = s;
                t->cont_prefix_len = sl;
            } else if (!rc && k == 8) {
                t->eow_suffix = s;
                t->eow_suffix_len = sl;
            } else {
                free(s);
            }
        }
        if (v) json_decref(v);
        if (rc) return rc;
    }
    t->fuse_unk = bools[0];
    t->byte_fallback = bools[1];
    t->ignore_merges = bools[2];
    return 0;
}

int tk_load_json(ms_tokenizer *t, const char *path, const char *buf, size_t len, ms_err *err) {
    js j = {buf, buf, buf + len, path, err};
    ctx c = {t, path, err};
    static const char *const top_keys[] = {"model", "added_tokens", "normalizer", "pre_tokenizer",
                                           "post_processor", "decoder"};
    span ts[6];
    bytelevel_init();
    tk_unicode_init();
    if (js_object_spans(&j, "(top level)", top_keys, ts, 6)) return err->code ? err->code : MS_ERR_FORMAT;
    js_ws(&j);
    if (j.p != j.e) return js_fail(&j, "(top level)", "trailing characters after the object"), MS_ERR_FORMAT;
    if (!ts[0].s) return bad(&c, "model", "missing");
    static const char *const mkeys[] = {"type", "vocab", "merges", "unk_token", "fuse_unk", "byte_fallback",
                                        "ignore_merges", "continuing_subword_prefix", "end_of_word_suffix",
                                        "dropout"};
    span ms[10];
    js jm = {buf, ts[0].s, ts[0].e, path, err};
    jm.b = buf;
    if (js_object_spans(&jm, "model", mkeys, ms, 10)) return err->code;
    if (!ms[0].s) return bad(&c, "model.type", "missing");
    {
        /* model.type first, so that a WordPiece model says so rather than "vocab malformed" */
        json_t *v = load_span(&j, ms[0], "model.type");
        if (!v) return err->code;
        int rc = 0;
        if (!json_is_string(v)) rc = bad(&c, "model.type", "expected a string");
        else if (strcmp(json_string_value(v), "BPE"))
            rc = ms_errf(err, MS_ERR_UNSUPPORTED, "%s: model.type \"%s\" is not supported (supported: BPE)", path, json_string_value(v));
        json_decref(v);
        if (rc) return rc;
    }
    if (!ms[1].s) return bad(&c, "model.vocab", "missing");
    if (!ms[2].s) return bad(&c, "model.merges", "missing");

    tk_buf arena = {0};
    vent *ents = NULL;
    int n_ents = 0, rc = MS_ERR_FORMAT;
    json_t *jv = NULL;
    if (tk_buf_reserve(&arena, (size_t)(ms[1].e - ms[1].s) + 1024)) { rc = ms_errf(err, MS_ERR_NOMEM, "out of memory"); goto out; }
    js jv_scan = {buf, ms[1].s, ms[1].e, path, err};
    if (parse_vocab(t, &jv_scan, &arena, &ents, &n_ents)) { rc = err->code; goto out; }

    /* added tokens (their text also lives in the arena) */
    if (ts[1].s) {
        jv = load_span(&j, ts[1], "added_tokens");
        if (!jv) { rc = err->code; goto out; }
        if ((rc = parse_added(&c, jv, &arena))) goto out;
        json_decref(jv);
        jv = NULL;
    }
    int32_t max_id = -1;
    for (int i = 0; i < n_ents; i++) if (ents[i].id > max_id) max_id = ents[i].id;
    for (int i = 0; i < t->n_added; i++) if (t->added[i].id > max_id) max_id = t->added[i].id;
    t->n_ids = max_id + 1;
    t->tok_off = malloc((size_t)(t->n_ids + 1) * sizeof *t->tok_off);
    t->tok_len = malloc((size_t)(t->n_ids + 1) * sizeof *t->tok_len);
    t->special = calloc((size_t)t->n_ids + 1, 1);
    uint32_t vcap = 1024;
    while (vcap < (uint32_t)n_ents * 2u + 2u) vcap *= 2;
    t->vslots = calloc(vcap, sizeof *t->vslots);
    if (!t->tok_off || !t->tok_len || !t->special || !t->vslots) { rc = ms_errf(err, MS_ERR_NOMEM, "out of memory"); goto out; }
    t->vmask = vcap - 1;
    memset(t->tok_len, 0xFF, (size_t)(t->n_ids + 1) * sizeof *t->tok_len);
    t->arena = arena.p;
    t->arena_len = arena.len;
    arena.p = NULL;
    for (int i = 0; i < n_ents; i++) {
        vent *e = &ents[i];
        t->tok_off[e->id] = e->off;
        t->tok_len[e->id] = e->len;
    }
    for (int i = 0; i < n_ents; i++) {
        vent *e = &ents[i];
        if (t->tok_off[e->id] != e->off) continue; /* two strings with one id: the last one wins */
        const char *s = t->arena + e->off;
        uint32_t hv = slot_hash(s, e->len), h = hv & t->vmask;
        while (t->vslots[h]) {
            uint32_t o = (uint32_t)t->vslots[h] - 1;
            if ((uint32_t)(t->vslots[h] >> 32) == hv && t->tok_len[o] == e->len && !memcmp(t->arena + t->tok_off[o], s, e->len)) break;
            h = (h + 1) & t->vmask;
        }
        t->vslots[h] = ((uint64_t)hv << 32) | ((uint32_t)e->id + 1);
    }
    /* Added tokens override id -> text (the reference's added vocabulary comes first). */
    for (int i = 0; i < t->n_added; i++) {
        tk_added *a = &t->added[i];
        t->tok_off[a->id] = a->off;
        t->tok_len[a->id] = a->len;
        if (a->special) t->special[a->id] = 1;
    }
    t->unk_id = -1;
    if ((rc = parse_model_small(&c, &j, ms))) goto out;
    {
        js jmg = {buf, ms[2].s, ms[2].e, path, err};
        if (parse_merges(t, &jmg)) { rc = err->code; goto out; }
    }
    /* byte tables */
    t->byte_direct = !t->cont_prefix_len && !t->eow_suffix_len;
    for (int b = 0; b < 256; b++) {
        char enc[4];
        int k = ms_utf8_enc(tk_bytelevel_char((unsigned)b), enc);
        t->byte_id[b] = tk_vocab_find(t, enc, (size_t)k);
        if (t->byte_id[b] < 0) t->byte_direct = 0;
        char fb[8];
        snprintf(fb, sizeof fb, "<0x%02X>", b);
        t->bfb_id[b] = tk_vocab_find(t, fb, 6);
    }
    /* char mode: a direct table for BMP characters saves a hash lookup per character */
    if (!t->byte_direct && !t->cont_prefix_len && !t->eow_suffix_len) {
        t->char_id = malloc(65536 * sizeof *t->char_id);
        if (!t->char_id) { rc = ms_errf(err, MS_ERR_NOMEM, "out of memory"); goto out; }
        for (uint32_t cp = 0; cp < 65536; cp++) {
            char enc[4];
            int k = ms_utf8_enc(cp, enc);
            t->char_id[cp] = (cp >= 0xD800 && cp <= 0xDFFF) ? -1 : tk_vocab_find(t, enc, (size_t)k);
        }
    }
    /* components */
    static const char *const names[] = {"", "", "normalizer", "pre_tokenizer", "post_processor", "decoder"};
    for (int k = 2; k <= 5; k++) {
        if (!ts[k].s) continue;
        jv = load_span(&j, ts[k], names[k]);
        if (!jv) { rc = err->code; goto out; }
        if (!json_is_null(jv)) {
            if (k == 2) rc = add_norm(&c, jv, "normalizer", 0);
            else if (k == 3) rc = add_pretok(&c, jv, "pre_tokenizer", 0);
            else if (k == 4) rc = add_post(&c, jv, "post_processor", 0);
            else { rc = add_dec(&c, jv, "decoder", 0); t->has_decoder = 1; }
            if (rc) goto out;
        }
        json_decref(jv);
        jv = NULL;
    }
    /* tries: normalized tokens are matched by their normalized text */
    for (int i = 0; i < t->n_added; i++) {
        tk_added *a = &t->added[i];
        if (!a->normalized || !t->n_norms) continue;
        tk_buf nb = {0};
        if (tk_normalize_text(t, t->arena + a->off, a->len, &nb, err)) { tk_buf_free(&nb); rc = err->code; goto out; }
        if (nb.len != a->len || memcmp(nb.p, t->arena + a->off, nb.len)) {
            /* store the normalized form after the arena (append; ids keep the original text) */
            size_t off = t->arena_len;
            char *na = realloc(t->arena, t->arena_len + nb.len + 1);
            if (!na) { tk_buf_free(&nb); rc = ms_errf(err, MS_ERR_NOMEM, "out of memory"); goto out; }
            t->arena = na;
            if (nb.len) memcpy(t->arena + off, nb.p, nb.len);
            t->arena[off + nb.len] = 0;
            t->arena_len += nb.len + 1;
            /* the trie matches the normalized text, and the reference's id -> token gives it too */
            a->off = (uint32_t)off;
            a->len = (uint32_t)nb.len;
            t->tok_off[a->id] = a->off;
            t->tok_len[a->id] = a->len;
        }
        tk_buf_free(&nb);
    }
    if (trie_build(&t->trie_raw, t, 0) || trie_build(&t->trie_norm, t, 1)) { rc = ms_errf(err, MS_ERR_NOMEM, "out of memory"); goto out; }
    rc = 0;
out:
    if (jv) json_decref(jv);
    free(ents);
    tk_buf_free(&arena);
    return rc;
}
