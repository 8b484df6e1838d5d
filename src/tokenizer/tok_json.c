/* tok_json.c - reads tokenizer.json into an ms_tokenizer.
 *
 * A tokenizer.json is 7-35 MB, nearly all of it model.vocab and model.merges. jansson builds a
 * tree of ~300k objects for that, which takes longer than our whole load budget (150 ms for a
 * 150k vocabulary), so a small scanner (tok_json_vocab.c) reads those two fields straight into
 * flat arrays and hash tables; every other section is small and is parsed with jansson from its
 * byte span (tok_json_sections.c). This file holds what ties them together: the entry point that
 * finds the sections and builds the vocab hash, the added-token tries and the byte-level tables.
 * Each error names the field. */
#include "tokenizer/tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int parse_added(tk_ctx *c, json_t *arr, tk_buf *arena) {
    ms_tokenizer *t = c->t;
    if (!arr || json_is_null(arr)) return 0;
    if (!json_is_array(arr)) return tk_bad(c, "added_tokens", "expected an array");
    size_t n = json_array_size(arr);
    t->added = calloc(n + 1, sizeof *t->added);
    if (!t->added) return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(arr, i);
        char f[64];
        snprintf(f, sizeof f, "added_tokens[%zu]", i);
        json_t *id = json_object_get(o, "id"), *content = json_object_get(o, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= TK_MAX_ID)
            return tk_bad(c, f, "\"id\" must be an integer in [0, 67108864)");
        if (!json_is_string(content)) return tk_bad(c, f, "\"content\" must be a string");
        tk_added *a = &t->added[t->n_added];
        a->id = (int32_t)json_integer_value(id);
        a->off = a->orig_off = (uint32_t)arena->len;
        a->len = a->orig_len = (uint32_t)json_string_length(content);
        if (tk_buf_put(arena, json_string_value(content), a->len) || tk_buf_put(arena, "", 1))
            return ms_errf(c->err, MS_ERR_NOMEM, "out of memory");
        int v;
        MS_TRY(tk_get_bool(c, o, "special", 0, &v, f)); a->special = (uint8_t)v;
        MS_TRY(tk_get_bool(c, o, "normalized", !a->special, &v, f)); a->normalized = (uint8_t)v;
        MS_TRY(tk_get_bool(c, o, "lstrip", 0, &v, f)); a->lstrip = (uint8_t)v;
        MS_TRY(tk_get_bool(c, o, "rstrip", 0, &v, f)); a->rstrip = (uint8_t)v;
        MS_TRY(tk_get_bool(c, o, "single_word", 0, &v, f)); a->single_word = (uint8_t)v;
        t->n_added++;
    }
    return 0;
}

/* ---------------- entry ---------------- */

static int parse_model_small(tk_ctx *c, tk_js *j, tk_span *ms) {
    ms_tokenizer *t = c->t;
    /* 0 type, 1 vocab, 2 merges, 3 unk_token, 4 fuse_unk, 5 byte_fallback, 6 ignore_merges,
     * 7 continuing_subword_prefix, 8 end_of_word_suffix, 9 dropout */
    json_t *v = NULL;
    if (!ms[0].s) return tk_bad(c, "model.type", "missing");
    v = tk_load_span(j, ms[0], "model.type");
    if (!v) return -1;
    if (!json_is_string(v)) { json_decref(v); return tk_bad(c, "model.type", "expected a string"); }
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
        v = tk_load_span(j, ms[k], names[k]);
        if (!v) return -1;
        int rc = 0;
        if (json_is_null(v)) {
        } else if (k >= 4 && k <= 6) {
            if (!json_is_boolean(v)) rc = tk_bad(c, names[k], "expected true or false");
            else bools[k - 4] = json_is_true(v);
        } else if (k == 9) {
            if (!json_is_number(v)) rc = tk_bad(c, names[k], "expected a number or null");
            else if (json_number_value(v) != 0.0)
                rc = ms_errf(c->err, MS_ERR_UNSUPPORTED, "%s: model.dropout %g is not supported (only null or 0: encoding must be deterministic)", c->path, json_number_value(v));
        } else {
            char *s = NULL;
            size_t sl = 0;
            rc = tk_dup_str(c, v, &s, &sl, names[k]);
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
    tk_js j = {buf, buf, buf + len, path, err};
    tk_ctx c = {t, path, err};
    static const char *const top_keys[] = {"model", "added_tokens", "normalizer", "pre_tokenizer",
                                           "post_processor", "decoder"};
    tk_span ts[6];
    bytelevel_init();
    tk_unicode_init();
    if (tk_js_object_spans(&j, "(top level)", top_keys, ts, 6)) return err->code ? err->code : MS_ERR_FORMAT;
    tk_js_ws(&j);
    if (j.p != j.e) return tk_js_fail(&j, "(top level)", "trailing characters after the object"), MS_ERR_FORMAT;
    if (!ts[0].s) return tk_bad(&c, "model", "missing");
    static const char *const mkeys[] = {"type", "vocab", "merges", "unk_token", "fuse_unk", "byte_fallback",
                                        "ignore_merges", "continuing_subword_prefix", "end_of_word_suffix",
                                        "dropout"};
    tk_span ms[10];
    tk_js jm = {buf, ts[0].s, ts[0].e, path, err};
    jm.b = buf;
    if (tk_js_object_spans(&jm, "model", mkeys, ms, 10)) return err->code;
    if (!ms[0].s) return tk_bad(&c, "model.type", "missing");
    {
        /* model.type first, so that a WordPiece model says so rather than "vocab malformed" */
        json_t *v = tk_load_span(&j, ms[0], "model.type");
        if (!v) return err->code;
        int rc = 0;
        if (!json_is_string(v)) rc = tk_bad(&c, "model.type", "expected a string");
        else if (strcmp(json_string_value(v), "BPE"))
            rc = ms_errf(err, MS_ERR_UNSUPPORTED, "%s: model.type \"%s\" is not supported (supported: BPE)", path, json_string_value(v));
        json_decref(v);
        if (rc) return rc;
    }
    if (!ms[1].s) return tk_bad(&c, "model.vocab", "missing");
    if (!ms[2].s) return tk_bad(&c, "model.merges", "missing");

    tk_buf arena = {0};
    tk_vent *ents = NULL;
    int n_ents = 0, rc = MS_ERR_FORMAT;
    json_t *jv = NULL;
    if (tk_buf_reserve(&arena, (size_t)(ms[1].e - ms[1].s) + 1024)) { rc = ms_errf(err, MS_ERR_NOMEM, "out of memory"); goto out; }
    tk_js jv_scan = {buf, ms[1].s, ms[1].e, path, err};
    if (tk_parse_vocab(t, &jv_scan, &arena, &ents, &n_ents)) { rc = err->code; goto out; }

    /* added tokens (their text also lives in the arena) */
    if (ts[1].s) {
        jv = tk_load_span(&j, ts[1], "added_tokens");
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
        tk_vent *e = &ents[i];
        t->tok_off[e->id] = e->off;
        t->tok_len[e->id] = e->len;
    }
    for (int i = 0; i < n_ents; i++) {
        tk_vent *e = &ents[i];
        if (t->tok_off[e->id] != e->off) continue; /* two strings with one id: the last one wins */
        const char *s = t->arena + e->off;
        uint32_t hv = tk_slot_hash(s, e->len), h = hv & t->vmask;
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
        tk_js jmg = {buf, ms[2].s, ms[2].e, path, err};
        if (tk_parse_merges(t, &jmg)) { rc = err->code; goto out; }
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
        jv = tk_load_span(&j, ts[k], names[k]);
        if (!jv) { rc = err->code; goto out; }
        if (!json_is_null(jv)) {
            if (k == 2) rc = tk_add_norm(&c, jv, "normalizer", 0);
            else if (k == 3) rc = tk_add_pretok(&c, jv, "pre_tokenizer", 0);
            else if (k == 4) rc = tk_add_post(&c, jv, "post_processor", 0);
            else { rc = tk_add_dec(&c, jv, "decoder", 0); t->has_decoder = 1; }
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
