/* tok_json_vocab.c - the fast path of tokenizer.json loading. model.vocab and model.merges are
 * nearly all of a 7-35 MB file, and building a jansson tree for them would take longer than the
 * whole load budget, so a minimal JSON scanner reads them straight into flat arrays and hash
 * tables; the scanner also finds the byte spans of the other, small sections for jansson. */
#include "tokenizer/tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------- scanner ---------------- */

/* Index of the array element being read, appended to field names in errors (-1: none). */
static _Thread_local long g_field_idx = -1;

int tk_js_fail(tk_js *j, const char *field, const char *what) {
    if (g_field_idx >= 0)
        return ms_errf(j->err, MS_ERR_FORMAT, "%s: %s[%ld]: %s at byte %zu", j->path, field, g_field_idx, what,
                       (size_t)(j->p - j->b));
    return ms_errf(j->err, MS_ERR_FORMAT, "%s: %s: %s at byte %zu", j->path, field, what,
                   (size_t)(j->p - j->b));
}

/* Skips a string (j->p at the opening quote): memchr to the next quote, which ends the string
 * unless an odd run of backslashes escapes it. */
static int js_skip_str(tk_js *j, const char *field) {
    const char *q = j->p + 1;
    while (1) {
        q = memchr(q, '"', (size_t)(j->e - q));
        if (!q) { j->p = j->e; return tk_js_fail(j, field, "unterminated string"); }
        const char *b = q;
        while (b > j->p + 1 && b[-1] == '\\') b--;
        if (((q - b) & 1) == 0) { j->p = q + 1; return 0; }
        q++;
    }
}

static int js_skip(tk_js *j, const char *field, int depth) {
    tk_js_ws(j);
    if (j->p >= j->e) return tk_js_fail(j, field, "unexpected end of file");
    if (depth > 200) return tk_js_fail(j, field, "nesting too deep");
    char c = *j->p;
    if (c == '"') return js_skip_str(j, field);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        tk_js_ws(j);
        if (j->p < j->e && *j->p == close) { j->p++; return 0; }
        while (1) {
            if (c == '{') {
                tk_js_ws(j);
                if (j->p >= j->e || *j->p != '"') return tk_js_fail(j, field, "expected a string key");
                if (js_skip_str(j, field)) return -1;
                tk_js_ws(j);
                if (j->p >= j->e || *j->p != ':') return tk_js_fail(j, field, "expected ':'");
                j->p++;
            }
            if (js_skip(j, field, depth + 1)) return -1;
            tk_js_ws(j);
            if (j->p < j->e && *j->p == ',') { j->p++; continue; }
            if (j->p < j->e && *j->p == close) { j->p++; return 0; }
            return tk_js_fail(j, field, "expected ',' or a closing bracket");
        }
    }
    /* number, true, false, null */
    const char *s = j->p;
    while (j->p < j->e && ((*j->p >= '0' && *j->p <= '9') || (*j->p >= 'a' && *j->p <= 'z') || *j->p == '-' ||
                           *j->p == '+' || *j->p == '.' || *j->p == 'E'))
        j->p++;
    if (j->p == s) return tk_js_fail(j, field, "unexpected character");
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
static int js_str(tk_js *j, const char *field, tk_buf *out) {
    if (j->p >= j->e || *j->p != '"') return tk_js_fail(j, field, "expected a string");
    j->p++;
    while (1) {
        const char *q = j->p;
        while (q < j->e && *q != '"' && *q != '\\') q++;
        if (q >= j->e) return tk_js_fail(j, field, "unterminated string");
        if (tk_buf_put(out, j->p, (size_t)(q - j->p))) return ms_errf(j->err, MS_ERR_NOMEM, "%s: out of memory", j->path);
        j->p = q;
        if (*q == '"') { j->p++; return 0; }
        if (q + 1 >= j->e) return tk_js_fail(j, field, "unterminated string");
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
            if (j->e - j->p < 4) return tk_js_fail(j, field, "bad \\u escape");
            int v = hex4(j->p);
            if (v < 0) return tk_js_fail(j, field, "bad \\u escape");
            j->p += 4;
            uint32_t cp = (uint32_t)v;
            if (v >= 0xD800 && v <= 0xDBFF) {
                int lo = (j->e - j->p >= 6 && j->p[0] == '\\' && j->p[1] == 'u') ? hex4(j->p + 2) : -1;
                if (lo < 0xDC00 || lo > 0xDFFF) return tk_js_fail(j, field, "lone surrogate in \\u escape");
                j->p += 6;
                cp = 0x10000 + (((uint32_t)v - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
            } else if (v >= 0xDC00 && v <= 0xDFFF) {
                return tk_js_fail(j, field, "lone surrogate in \\u escape");
            }
            char enc[4];
            int k = ms_utf8_enc(cp, enc);
            if (tk_buf_put(out, enc, (size_t)k)) return ms_errf(j->err, MS_ERR_NOMEM, "%s: out of memory", j->path);
            continue;
        }
        default: return tk_js_fail(j, field, "bad escape in string");
        }
        if (tk_buf_put(out, &o, 1)) return ms_errf(j->err, MS_ERR_NOMEM, "%s: out of memory", j->path);
    }
}

/* Scans an object at j->p, recording the spans of the wanted keys (others skipped). */
int tk_js_object_spans(tk_js *j, const char *field, const char *const *keys, tk_span *spans, int nkeys) {
    for (int i = 0; i < nkeys; i++) spans[i].s = spans[i].e = NULL;
    tk_js_ws(j);
    if (j->p >= j->e || *j->p != '{') return tk_js_fail(j, field, "expected an object");
    j->p++;
    tk_js_ws(j);
    if (j->p < j->e && *j->p == '}') { j->p++; return 0; }
    tk_buf key = {0};
    int rc = -1;
    while (1) {
        tk_js_ws(j);
        key.len = 0;
        if (js_str(j, field, &key)) goto out;
        tk_js_ws(j);
        if (j->p >= j->e || *j->p != ':') { tk_js_fail(j, field, "expected ':'"); goto out; }
        j->p++;
        tk_js_ws(j);
        const char *vs = j->p;
        if (js_skip(j, field, 1)) goto out;
        for (int i = 0; i < nkeys; i++)
            if (strlen(keys[i]) == key.len && !memcmp(keys[i], key.p, key.len)) { spans[i].s = vs; spans[i].e = j->p; }
        tk_js_ws(j);
        if (j->p < j->e && *j->p == ',') { j->p++; continue; }
        if (j->p < j->e && *j->p == '}') { j->p++; break; }
        tk_js_fail(j, field, "expected ',' or '}'");
        goto out;
    }
    rc = 0;
out:
    tk_buf_free(&key);
    return rc;
}

/* ---------------- vocab and merges ---------------- */

int32_t tk_vocab_find(const ms_tokenizer *t, const char *s, size_t n) {
    if (!t->vslots) return -1;
    uint32_t hv = tk_slot_hash(s, n), h = hv & t->vmask;
    while (1) {
        uint64_t v = t->vslots[h];
        if (!v) return -1;
        uint32_t id = (uint32_t)v - 1;
        if ((uint32_t)(v >> 32) == hv && t->tok_len[id] == n && !memcmp(t->arena + t->tok_off[id], s, n)) return (int32_t)id;
        h = (h + 1) & t->vmask;
    }
}

int tk_parse_vocab(ms_tokenizer *t, tk_js *j, tk_buf *arena, tk_vent **ents_out, int *n_out) {
    const char *F = "model.vocab";
    tk_vent *ents = NULL;
    int n = 0, cap = 0;
    tk_js_ws(j);
    if (j->p >= j->e || *j->p != '{') return tk_js_fail(j, F, "expected an object");
    j->p++;
    tk_js_ws(j);
    if (j->p < j->e && *j->p == '}') { j->p++; goto done; }
    while (1) {
        tk_js_ws(j);
        uint32_t off = (uint32_t)arena->len;
        if (js_str(j, F, arena)) goto fail;
        if (arena->len > 0xFFFFFFF0u) { tk_js_fail(j, F, "too large"); goto fail; }
        tk_js_ws(j);
        if (j->p >= j->e || *j->p != ':') { tk_js_fail(j, F, "expected ':'"); goto fail; }
        j->p++;
        tk_js_ws(j);
        long long v = 0;
        const char *s = j->p;
        while (j->p < j->e && *j->p >= '0' && *j->p <= '9' && v <= TK_MAX_ID) v = v * 10 + (*j->p++ - '0');
        if (j->p == s || v >= TK_MAX_ID || (j->p < j->e && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))) {
            tk_js_fail(j, F, "token id must be an integer in [0, 67108864)");
            goto fail;
        }
        if (n >= cap) {
            cap = cap ? cap * 2 : 65536;
            tk_vent *ne = realloc(ents, (size_t)cap * sizeof *ents);
            if (!ne) { ms_errf(j->err, MS_ERR_NOMEM, "%s: out of memory", j->path); goto fail; }
            ents = ne;
        }
        ents[n++] = (tk_vent){(int32_t)v, off, (uint32_t)(arena->len - off)};
        if (tk_buf_put(arena, "", 1)) { ms_errf(j->err, MS_ERR_NOMEM, "%s: out of memory", j->path); goto fail; }
        tk_js_ws(j);
        if (j->p < j->e && *j->p == ',') { j->p++; continue; }
        if (j->p < j->e && *j->p == '}') { j->p++; break; }
        tk_js_fail(j, F, "expected ',' or '}'");
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

int tk_parse_merges(ms_tokenizer *t, tk_js *j) {
    char F[64] = "model.merges";
    tk_js_ws(j);
    if (j->p >= j->e || *j->p != '[') return tk_js_fail(j, F, "expected an array");
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
    tk_js_ws(j);
    if (j->p < j->e && *j->p == ']') { j->p++; return 0; }
    tk_buf a = {0}, b = {0}, ab = {0};
    int rc = -1;
#define MF() (snprintf(F, sizeof F, "model.merges[%u]", rank), F)
    g_field_idx = 0;
    for (uint32_t rank = 0;; rank++) {
        g_field_idx = rank;
        tk_js_ws(j);
        a.len = b.len = 0;
        if (j->p < j->e && *j->p == '"') {
            if (js_str(j, "model.merges", &a)) goto out;
            char *sp = memchr(a.p, ' ', a.len);
            if (!sp || memchr(sp + 1, ' ', a.len - (size_t)(sp + 1 - a.p))) {
                tk_js_fail(j, "model.merges", "expected \"left right\" with exactly one space");
                goto out;
            }
            size_t l = (size_t)(sp - a.p);
            if (tk_buf_put(&b, sp + 1, a.len - l - 1)) goto oom;
            a.len = l;
        } else if (j->p < j->e && *j->p == '[') {
            j->p++;
            tk_js_ws(j);
            if (js_str(j, "model.merges", &a)) goto out;
            tk_js_ws(j);
            if (j->p >= j->e || *j->p != ',') { tk_js_fail(j, "model.merges", "expected a pair [left, right]"); goto out; }
            j->p++;
            tk_js_ws(j);
            if (js_str(j, "model.merges", &b)) goto out;
            tk_js_ws(j);
            if (j->p >= j->e || *j->p != ']') { tk_js_fail(j, "model.merges", "expected a pair [left, right]"); goto out; }
            j->p++;
        } else {
            tk_js_fail(j, "model.merges", "expected a string or a [left, right] pair");
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
        if ((uint64_t)rank * 2 >= cap) { tk_js_fail(j, "model.merges", "too many merges"); goto out; }
        merge_put(t, ia, ib, rank, iab);
        tk_js_ws(j);
        if (j->p < j->e && *j->p == ',') { j->p++; continue; }
        if (j->p < j->e && *j->p == ']') { j->p++; break; }
        g_field_idx = -1;
        tk_js_fail(j, "model.merges", "expected ',' or ']'");
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
