/* tok_json_sections.c - the small, configurable sections of tokenizer.json: normalizer,
 * pre_tokenizer, decoder and post_processor, each a component or a Sequence of them. They are
 * parsed with jansson because they are tiny and varied; what matters here is accepting exactly
 * the component types and options the Rust `tokenizers` library does, and failing with the
 * field's name and the supported list for anything else rather than tokenizing differently. */
#include "tokenizer/tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------- small sections (jansson) ---------------- */

json_t *tk_load_span(tk_js *j, tk_span sp, const char *field) {
    json_error_t je;
    json_t *v = json_loadb(sp.s, (size_t)(sp.e - sp.s), JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v) ms_errf(j->err, MS_ERR_FORMAT, "%s: %s: %s", j->path, field, je.text);
    return v;
}

int tk_bad(tk_ctx *c, const char *field, const char *what) {
    return ms_errf(c->err, MS_ERR_FORMAT, "%s: %s: %s", c->path, field, what);
}

static const char *get_type(tk_ctx *c, json_t *o, const char *field, int *rc) {
    *rc = 0;
    json_t *ty = json_object_get(o, "type");
    if (!json_is_string(ty)) { *rc = tk_bad(c, field, "expected an object with a string \"type\""); return NULL; }
    return json_string_value(ty);
}

static int unsupported(tk_ctx *c, const char *field, const char *type, const char *supported) {
    return ms_errf(c->err, MS_ERR_UNSUPPORTED, "%s: %s.type \"%s\" is not supported (supported: %s)", c->path,
                   field, type, supported);
}

int tk_get_bool(tk_ctx *c, json_t *o, const char *key, int def, int *out, const char *field) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) { *out = def; return 0; }
    if (!json_is_boolean(v)) {
        char f[160];
        snprintf(f, sizeof f, "%s.%s", field, key);
        return tk_bad(c, f, "expected true or false");
    }
    *out = json_is_true(v);
    return 0;
}

int tk_dup_str(tk_ctx *c, json_t *v, char **out, size_t *len, const char *field) {
    if (!json_is_string(v)) return tk_bad(c, field, "expected a string");
    *len = json_string_length(v);
    *out = malloc(*len + 1);
    if (!*out) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
    memcpy(*out, json_string_value(v), *len + 1);
    return 0;
}

static int compile_re(tk_ctx *c, const char *pat, size_t len, tk_regex **out, const char *field) {
    char why[200];
    if (tk_regex_new(pat, len, out, why, sizeof why)) {
        return ms_errf(c->err, MS_ERR_FORMAT, "%s: %s: invalid regex: %s", c->path, field, why);
    }
    return 0;
}

/* pattern: {"String": s} or {"Regex": r}. */
static int parse_pattern(tk_ctx *c, json_t *o, const char *field, char **lit, size_t *lit_len, tk_regex **re) {
    char f[160];
    snprintf(f, sizeof f, "%s.pattern", field);
    json_t *p = json_object_get(o, "pattern");
    if (!json_is_object(p)) return tk_bad(c, f, "expected {\"String\": ...} or {\"Regex\": ...}");
    json_t *s = json_object_get(p, "String"), *r = json_object_get(p, "Regex");
    if (json_is_string(s)) {
        if (json_string_length(s) == 0) return tk_bad(c, f, "empty String pattern");
        return tk_dup_str(c, s, lit, lit_len, f);
    }
    if (json_is_string(r)) return compile_re(c, json_string_value(r), json_string_length(r), re, f);
    return tk_bad(c, f, "expected {\"String\": ...} or {\"Regex\": ...}");
}

/* A "Sequence" component: applies add() to each element of o[key] (depth-limited, errors name
 * "<field>.<key>[i]"). Shared by normalizers, pre-tokenizers, decoders and post-processors. */
typedef int (*add_fn)(tk_ctx *c, json_t *o, const char *field, int depth);
static int each_in_sequence(tk_ctx *c, json_t *o, const char *field, const char *key, int depth, add_fn add) {
    char f[160];
    json_t *arr = json_object_get(o, key);
    snprintf(f, sizeof f, "%s.%s", field, key);
    if (!json_is_array(arr)) return tk_bad(c, f, "expected an array");
    if (depth > 8) return tk_bad(c, field, "sequences nested too deeply");
    for (size_t i = 0; i < json_array_size(arr); i++) {
        snprintf(f, sizeof f, "%s.%s[%zu]", field, key, i);
        MS_TRY(add(c, json_array_get(arr, i), f, depth + 1));
    }
    return 0;
}

int tk_add_norm(tk_ctx *c, json_t *o, const char *field, int depth) {
    ms_tokenizer *t = c->t;
    int rc;
    const char *ty = get_type(c, o, field, &rc);
    if (!ty) return rc;
    if (!strcmp(ty, "Sequence")) return each_in_sequence(c, o, field, "normalizers", depth, tk_add_norm);
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
        MS_TRY(tk_get_bool(c, o, "strip_left", 0, &n->left, field));
        MS_TRY(tk_get_bool(c, o, "strip_right", 0, &n->right, field));
    } else if (!strcmp(ty, "Replace")) {
        n->kind = TK_N_REPLACE;
        t->n_norms++; /* owned from here on, freed with the tokenizer */
        MS_TRY(parse_pattern(c, o, field, &n->pat, &n->pat_len, &n->re));
        char f[160];
        snprintf(f, sizeof f, "%s.content", field);
        return tk_dup_str(c, json_object_get(o, "content"), &n->content, &n->content_len, f);
    } else if (!strcmp(ty, "Prepend")) {
        n->kind = TK_N_PREPEND;
        t->n_norms++;
        char f[160];
        snprintf(f, sizeof f, "%s.prepend", field);
        return tk_dup_str(c, json_object_get(o, "prepend"), &n->content, &n->content_len, f);
    } else {
        return unsupported(c, field, ty, "NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Replace, Prepend, Sequence");
    }
    t->n_norms++;
    return 0;
}

static int parse_behavior(tk_ctx *c, json_t *o, const char *field, int def, int *out) {
    json_t *b = json_object_get(o, "behavior");
    if (!b || json_is_null(b)) { *out = def; return 0; }
    const char *s = json_string_value(b);
    char f[160];
    snprintf(f, sizeof f, "%s.behavior", field);
    if (!s) return tk_bad(c, f, "expected a string");
    if (!strcmp(s, "Removed")) *out = TK_SPLIT_REMOVED;
    else if (!strcmp(s, "Isolated")) *out = TK_SPLIT_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious")) *out = TK_SPLIT_PREV;
    else if (!strcmp(s, "MergedWithNext")) *out = TK_SPLIT_NEXT;
    else if (!strcmp(s, "Contiguous")) *out = TK_SPLIT_CONTIG;
    else return ms_errf(c->err, MS_ERR_UNSUPPORTED, "%s: %s \"%s\" is not supported (supported: Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)", c->path, f, s);
    return 0;
}

static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

int tk_add_pretok(tk_ctx *c, json_t *o, const char *field, int depth) {
    ms_tokenizer *t = c->t;
    int rc;
    const char *ty = get_type(c, o, field, &rc);
    if (!ty) return rc;
    if (!strcmp(ty, "Sequence")) return each_in_sequence(c, o, field, "pretokenizers", depth, tk_add_pretok);
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
        if (p->behavior < 0) { snprintf(f, sizeof f, "%s.behavior", field); return tk_bad(c, f, "missing"); }
        MS_TRY(tk_get_bool(c, o, "invert", 0, &p->invert, field));
        return parse_pattern(c, o, field, &p->lit, &p->lit_len, &p->re);
    }
    if (!strcmp(ty, "ByteLevel")) {
        p->kind = TK_PT_BYTELEVEL;
        t->n_pretoks++;
        MS_TRY(tk_get_bool(c, o, "add_prefix_space", 1, &p->add_prefix_space, field));
        MS_TRY(tk_get_bool(c, o, "use_regex", 1, &p->use_regex, field));
        if (p->use_regex) return compile_re(c, GPT2_RE, sizeof GPT2_RE - 1, &p->re, field);
        return 0;
    }
    if (!strcmp(ty, "Digits")) {
        p->kind = TK_PT_DIGITS;
        t->n_pretoks++;
        return tk_get_bool(c, o, "individual_digits", 0, &p->individual, field);
    }
    if (!strcmp(ty, "Metaspace")) {
        p->kind = TK_PT_METASPACE;
        t->n_pretoks++;
        json_t *r = json_object_get(o, "replacement");
        snprintf(f, sizeof f, "%s.replacement", field);
        if (r && !json_is_null(r)) {
            MS_TRY(tk_dup_str(c, r, &p->lit, &p->lit_len, f));
            uint32_t cp;
            if (p->lit_len == 0 || (size_t)ms_utf8_len((unsigned char)p->lit[0]) != p->lit_len ||
                tk_utf8_valid_prefix((const unsigned char *)p->lit, p->lit_len) != p->lit_len)
                return tk_bad(c, f, "expected one character");
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
            else { snprintf(f, sizeof f, "%s.prepend_scheme", field); return tk_bad(c, f, "expected always, first or never"); }
        } else {
            int aps;
            MS_TRY(tk_get_bool(c, o, "add_prefix_space", 1, &aps, field));
            p->prepend = aps ? TK_PREPEND_ALWAYS : TK_PREPEND_NEVER;
        }
        return tk_get_bool(c, o, "split", 1, &p->msplit, field);
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
        MS_TRY(tk_dup_str(c, json_object_get(o, "delimiter"), &p->lit, &p->lit_len, f));
        if (p->lit_len == 0 || (size_t)ms_utf8_len((unsigned char)p->lit[0]) != p->lit_len) return tk_bad(c, f, "expected one character");
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

int tk_add_dec(tk_ctx *c, json_t *o, const char *field, int depth) {
    ms_tokenizer *t = c->t;
    int rc;
    const char *ty = get_type(c, o, field, &rc);
    if (!ty) return rc;
    char f[160];
    if (!strcmp(ty, "Sequence")) return each_in_sequence(c, o, field, "decoders", depth, tk_add_dec);
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
        if (r && !json_is_null(r)) MS_TRY(tk_dup_str(c, r, &d->pat, &d->pat_len, f));
        else {
            d->pat = strdup("\xE2\x96\x81");
            if (!d->pat) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
            d->pat_len = 3;
        }
        if (d->pat_len == 0) return tk_bad(c, f, "expected one character");
        json_t *ps = json_object_get(o, "prepend_scheme");
        d->prepend = 1;
        if (json_is_string(ps)) d->prepend = strcmp(json_string_value(ps), "never") != 0;
        else {
            int aps;
            MS_TRY(tk_get_bool(c, o, "add_prefix_space", 1, &aps, field));
            d->prepend = aps;
        }
        return 0;
    }
    if (!strcmp(ty, "Strip")) {
        d->kind = TK_D_STRIP;
        snprintf(f, sizeof f, "%s.content", field);
        MS_TRY(tk_dup_str(c, json_object_get(o, "content"), &d->content, &d->content_len, f));
        if (d->content_len == 0 || (size_t)ms_utf8_len((unsigned char)d->content[0]) != d->content_len)
            return tk_bad(c, f, "expected one character");
        json_t *a = json_object_get(o, "start"), *b = json_object_get(o, "stop");
        if (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 || json_integer_value(b) < 0 ||
            json_integer_value(a) > 1000000 || json_integer_value(b) > 1000000)
            return tk_bad(c, field, "start and stop must be non-negative integers");
        d->start = (int)json_integer_value(a);
        d->stop = (int)json_integer_value(b);
        return 0;
    }
    if (!strcmp(ty, "Replace")) {
        d->kind = TK_D_REPLACE;
        MS_TRY(parse_pattern(c, o, field, &d->pat, &d->pat_len, &d->re));
        snprintf(f, sizeof f, "%s.content", field);
        return tk_dup_str(c, json_object_get(o, "content"), &d->content, &d->content_len, f);
    }
    if (!strcmp(ty, "BPEDecoder")) {
        d->kind = TK_D_BPE;
        json_t *s = json_object_get(o, "suffix");
        snprintf(f, sizeof f, "%s.suffix", field);
        if (s && !json_is_null(s)) return tk_dup_str(c, s, &d->pat, &d->pat_len, f);
        d->pat = strdup("</w>");
        d->pat_len = 4;
        return d->pat ? 0 : ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
    }
    if (!strcmp(ty, "WordPiece")) {
        d->kind = TK_D_WORDPIECE;
        json_t *s = json_object_get(o, "prefix");
        snprintf(f, sizeof f, "%s.prefix", field);
        if (s && !json_is_null(s)) MS_TRY(tk_dup_str(c, s, &d->pat, &d->pat_len, f));
        else {
            d->pat = strdup("##");
            d->pat_len = 2;
            if (!d->pat) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
        }
        return tk_get_bool(c, o, "cleanup", 1, &d->cleanup, field);
    }
    t->n_decs--;
    return unsupported(c, field, ty, "ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, BPEDecoder, WordPiece, Sequence");
}

static int ids_of(tk_ctx *c, json_t *v, const char *field, int32_t **ids, int *n) {
    /* [string, id] as Roberta/Bert write cls and sep */
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(json_array_get(v, 1)))
        return tk_bad(c, field, "expected [token, id]");
    json_int_t id = json_integer_value(json_array_get(v, 1));
    if (id < 0 || id >= TK_MAX_ID) return tk_bad(c, field, "id out of range");
    int32_t *ni = realloc(*ids, (size_t)(*n + 1) * sizeof **ids);
    if (!ni) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
    *ids = ni;
    (*ids)[(*n)++] = (int32_t)id;
    return 0;
}

int tk_add_post(tk_ctx *c, json_t *o, const char *field, int depth) {
    ms_tokenizer *t = c->t;
    int rc;
    const char *ty = get_type(c, o, field, &rc);
    if (!ty) return rc;
    char f[160];
    if (!strcmp(ty, "Sequence")) return each_in_sequence(c, o, field, "processors", depth, tk_add_post);
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
        if (!json_is_array(single)) return tk_bad(c, f, "expected an array");
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
            if (!json_is_string(idv)) return tk_bad(c, f, "expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}");
            json_t *entry = json_object_get(sp, json_string_value(idv));
            json_t *ids = json_object_get(entry, "ids");
            if (!json_is_array(ids)) {
                snprintf(f, sizeof f, "%s.special_tokens[\"%s\"].ids", field, json_string_value(idv));
                return tk_bad(c, f, "missing or not an array");
            }
            for (size_t k = 0; k < json_array_size(ids); k++) {
                json_t *x = json_array_get(ids, k);
                if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= TK_MAX_ID) {
                    snprintf(f, sizeof f, "%s.special_tokens[\"%s\"].ids[%zu]", field, json_string_value(idv), k);
                    return tk_bad(c, f, "expected a token id");
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
