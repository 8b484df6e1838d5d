/* tokenizer.c - loading and encoding (see tokenizer.h).
 *
 * Encoding streams: the text is cut at added tokens, each piece is normalized, cut again at
 * normalized added tokens, then every pre-tokenizer stage hands its sub-pieces straight to the
 * next stage (a recursion over stages, no lists of pieces), and the last stage feeds BPE. So
 * memory is the input, at most one normalized copy of it, and the output ids; time is linear.
 * BPE merges one word at a time with a heap ordered by (merge rank, position), the reference's
 * order, and a per-call word cache makes repeated words cost one hash lookup. */
#include "tokenizer/tokenizer.h"

#include "core/fileutil.h"
#include "tokenizer/tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKENIZER_JSON (512u << 20)
#define MAX_CONFIG_JSON (64u << 20)

/* ---------------- normalizer ---------------- */

static size_t ws_prefix(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int l = ms_utf8_dec_valid((const unsigned char *)s + i, n - i, &cp);
        if (!tk_is_ws(cp)) break;
        i += (size_t)l;
    }
    return i;
}

static size_t ws_suffix_start(const char *s, size_t n) {
    size_t i = n;
    while (i > 0) {
        size_t j = i - 1;
        while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
        uint32_t cp;
        ms_utf8_dec_valid((const unsigned char *)s + j, i - j, &cp);
        if (!tk_is_ws(cp)) break;
        i = j;
    }
    return i;
}

/* Runs the normalizer chain on s[0..n) into out (replacing its contents). */
int tk_normalize_text(const ms_tokenizer *t, const char *s, size_t n, tk_buf *out, ms_err *err) {
    tk_buf a = {0}, b = {0};
    const char *cur = s;
    size_t cl = n;
    int rc = 0;
    tk_buf *dst = &a;
    for (int i = 0; i < t->n_norms; i++) {
        const tk_norm *nm = &t->norms[i];
        dst->len = 0;
        int r = 0;
        switch (nm->kind) {
        case TK_N_NFC: r = tk_unicode_normalize(TK_NORM_NFC, cur, cl, dst); break;
        case TK_N_NFD: r = tk_unicode_normalize(TK_NORM_NFD, cur, cl, dst); break;
        case TK_N_NFKC: r = tk_unicode_normalize(TK_NORM_NFKC, cur, cl, dst); break;
        case TK_N_NFKD: r = tk_unicode_normalize(TK_NORM_NFKD, cur, cl, dst); break;
        case TK_N_LOWER: r = tk_lowercase(cur, cl, dst); break;
        case TK_N_STRIPACC: r = tk_strip_accents(cur, cl, dst); break;
        case TK_N_STRIP: {
            size_t st = nm->left ? ws_prefix(cur, cl) : 0;
            size_t en = nm->right ? ws_suffix_start(cur, cl) : cl;
            if (en < st) en = st;
            r = tk_buf_put(dst, cur + st, en - st);
            break;
        }
        case TK_N_REPLACE:
            r = tk_replace_all(cur, cl, nm->pat, nm->pat_len, nm->re, nm->content, nm->content_len, dst);
            break;
        case TK_N_PREPEND:
            if (cl) r = tk_buf_put(dst, nm->content, nm->content_len);
            if (!r) r = tk_buf_put(dst, cur, cl);
            break;
        }
        if (r) { rc = ms_errf(err, MS_ERR_NOMEM, "tokenizer: normalizer failed (out of memory or regex error)"); break; }
        cur = dst->p ? dst->p : "";
        cl = dst->len;
        dst = dst == &a ? &b : &a;
    }
    if (!rc) {
        out->len = 0;
        if (tk_buf_put(out, cur, cl)) rc = ms_errf(err, MS_ERR_NOMEM, "tokenizer: out of memory");
    }
    tk_buf_free(&a);
    tk_buf_free(&b);
    return rc;
}

/* ---------------- encoder state ---------------- */

typedef struct {
    int32_t id, prev, next;
} sym;

typedef struct {
    uint32_t h, off; /* hash tag; arena offset of key bytes then ids (4-aligned) */
    uint16_t klen, vlen; /* klen 0: empty slot */
} centry;

typedef struct {
    centry *tab;
    uint32_t cap, n;
    tk_buf arena;
} wcache;

typedef struct {
    const ms_tokenizer *t;
    int32_t *ids;
    size_t n, cap;
    ms_err *err;
    tk_buf *scratch; /* one per pre-tokenizer stage */
    tk_buf word, norm;
    sym *syms;
    size_t syms_cap;
    uint64_t *heap;
    size_t heap_n, heap_cap;
    wcache cache;
    int use_cache;
} enc;

static int emit(enc *e, int32_t id) {
    if (e->n == e->cap) {
        size_t nc = e->cap ? e->cap * 2 : 256;
        int32_t *ni = realloc(e->ids, nc * sizeof *ni);
        if (!ni) return ms_errf(e->err, MS_ERR_NOMEM, "tokenizer: out of memory for ids");
        e->ids = ni;
        e->cap = nc;
    }
    e->ids[e->n++] = id;
    return 0;
}

static inline int merge_get(const ms_tokenizer *t, int32_t a, int32_t b, uint64_t *val) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = ((k * 0x9E3779B97F4A7C15ull) >> 20) & t->mmask;
    while (1) {
        uint64_t kk = t->mkeys[2 * h];
        if (kk == k) { *val = t->mkeys[2 * h + 1]; return 1; }
        if (kk == UINT64_MAX) return 0;
        h = (h + 1) & t->mmask;
    }
}

static int heap_push(enc *e, uint64_t v) {
    if (e->heap_n == e->heap_cap) {
        size_t nc = e->heap_cap ? e->heap_cap * 2 : 64;
        uint64_t *nh = realloc(e->heap, nc * sizeof *nh);
        if (!nh) return -1;
        e->heap = nh;
        e->heap_cap = nc;
    }
    size_t i = e->heap_n++;
    uint64_t *h = e->heap;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
    return 0;
}

static uint64_t heap_pop(enc *e) {
    uint64_t *h = e->heap;
    uint64_t top = h[0], v = h[--e->heap_n];
    size_t n = e->heap_n, i = 0;
    while (1) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = v;
    return top;
}

/* ---- word cache (per encode call: no locks, bounded) ---- */
#define CACHE_MAX_KEY 96
#define CACHE_MAX_ENTRIES (1u << 16)
#define CACHE_MAX_ARENA (16u << 20)

static int cache_get(enc *e, uint64_t h, const char *k, size_t kl) {
    wcache *c = &e->cache;
    if (!c->cap) return 0;
    uint32_t i = (uint32_t)(h >> 32) & (c->cap - 1);
    while (c->tab[i].klen) {
        centry *ce = &c->tab[i];
        if (ce->h == (uint32_t)h && ce->klen == kl && !memcmp(c->arena.p + ce->off, k, kl)) {
            const char *v = c->arena.p + ce->off + ((kl + 3) & ~(size_t)3);
            if (!ce->vlen) return 1;
            if (e->n + ce->vlen > e->cap) {
                for (uint32_t j = 0; j < ce->vlen; j++) {
                    int32_t id;
                    memcpy(&id, v + 4 * j, 4);
                    if (emit(e, id)) return -1;
                }
            } else {
                memcpy(e->ids + e->n, v, 4 * (size_t)ce->vlen);
                e->n += ce->vlen;
            }
            return 1;
        }
        i = (i + 1) & (c->cap - 1);
    }
    return 0;
}

static void cache_put(enc *e, uint64_t h, const char *k, size_t kl, const int32_t *ids, size_t n) {
    wcache *c = &e->cache;
    if (n == 0 || n > 0xFFFF || kl == 0) return;
    if (c->n * 2 >= c->cap || c->arena.len > CACHE_MAX_ARENA) {
        uint32_t nc = c->cap ? c->cap : 1024;
        if (c->n * 2 >= c->cap && nc < CACHE_MAX_ENTRIES) nc *= 2;
        else if (c->cap) { /* full: start over */
            memset(c->tab, 0, c->cap * sizeof *c->tab);
            c->n = 0;
            c->arena.len = 0;
            nc = c->cap;
        }
        if (nc != c->cap) {
            centry *nt = calloc(nc, sizeof *nt);
            if (!nt) return;
            for (uint32_t i = 0; i < c->cap; i++) {
                if (!c->tab[i].klen) continue;
                const centry *o = &c->tab[i];
                uint32_t j = (uint32_t)(tk_hash(c->arena.p + o->off, o->klen) >> 32) & (nc - 1);
                while (nt[j].klen) j = (j + 1) & (nc - 1);
                nt[j] = *o;
            }
            free(c->tab);
            c->tab = nt;
            c->cap = nc;
        }
    }
    size_t ka = (kl + 3) & ~(size_t)3;
    if (tk_buf_reserve(&c->arena, ka + 4 * n + 4)) return;
    c->arena.len = (c->arena.len + 3) & ~(size_t)3;
    uint32_t off = (uint32_t)c->arena.len;
    memcpy(c->arena.p + off, k, kl);
    memcpy(c->arena.p + off + ka, ids, 4 * n);
    c->arena.len = off + ka + 4 * n;
    uint32_t i = (uint32_t)(h >> 32) & (c->cap - 1);
    while (c->tab[i].klen) i = (i + 1) & (c->cap - 1);
    c->tab[i] = (centry){(uint32_t)h, off, (uint16_t)kl, (uint16_t)n};
    c->n++;
}

/* ---------------- BPE ---------------- */

static int syms_reserve(enc *e, size_t n) {
    if (n <= e->syms_cap) return 0;
    size_t nc = e->syms_cap ? e->syms_cap : 64;
    while (nc < n) nc *= 2;
    sym *ns = realloc(e->syms, nc * sizeof *ns);
    if (!ns) return ms_errf(e->err, MS_ERR_NOMEM, "tokenizer: out of memory");
    e->syms = ns;
    e->syms_cap = nc;
    return 0;
}

static int map_bytelevel(tk_buf *out, const char *s, size_t n) {
    out->len = 0;
    if (tk_buf_reserve(out, 2 * n + 1)) return -1;
    for (size_t i = 0; i < n; i++) out->len += (size_t)ms_utf8_enc(tk_bytelevel_char((unsigned char)s[i]), out->p + out->len);
    return 0;
}

/* Initial symbols of a word in character mode (reference: BPE::merge_word). */
static int char_symbols(enc *e, const char *s, size_t n, size_t *nsym) {
    const ms_tokenizer *t = e->t;
    size_t k = 0;
    int32_t unk = -1;
    tk_buf *key = &e->scratch[t->n_pretoks];
    MS_TRY(syms_reserve(e, 4 * n + 2));
    for (size_t i = 0; i < n;) {
        size_t l = (size_t)ms_utf8_len((unsigned char)s[i]);
        if (l > n - i) l = n - i;
        const char *ks = s + i;
        size_t kl = l;
        int last = i + l >= n;
        if (t->char_id && l <= 3) {
            uint32_t cp;
            ms_utf8_dec_valid((const unsigned char *)s + i, l, &cp);
            int32_t cid = t->char_id[cp];
            if (cid >= 0) {
                if (unk >= 0) { e->syms[k++].id = unk; unk = -1; }
                e->syms[k++].id = cid;
                i += l;
                continue;
            }
        }
        if ((i > 0 && t->cont_prefix_len) || (last && t->eow_suffix_len)) {
            key->len = 0;
            if ((i > 0 && tk_buf_put(key, t->cont_prefix, t->cont_prefix_len)) || tk_buf_put(key, s + i, l) ||
                (last && tk_buf_put(key, t->eow_suffix, t->eow_suffix_len)))
                return ms_errf(e->err, MS_ERR_NOMEM, "tokenizer: out of memory");
            ks = key->p;
            kl = key->len;
        }
        int32_t id = tk_vocab_find(t, ks, kl);
        if (id >= 0) {
            if (unk >= 0) { e->syms[k++].id = unk; unk = -1; }
            e->syms[k++].id = id;
        } else {
            int done = 0;
            if (t->byte_fallback) {
                int all = 1;
                for (size_t j = 0; j < kl; j++) all &= t->bfb_id[(unsigned char)ks[j]] >= 0;
                if (all) {
                    MS_TRY(syms_reserve(e, k + kl + 2 + 4 * (n - i)));
                    if (unk >= 0) { e->syms[k++].id = unk; unk = -1; }
                    for (size_t j = 0; j < kl; j++) e->syms[k++].id = t->bfb_id[(unsigned char)ks[j]];
                    done = 1;
                }
            }
            if (!done && t->unk_id != -1) {
                if (t->unk_id == -3)
                    return ms_errf(e->err, MS_ERR_FORMAT, "tokenizer: model.unk_token is not in model.vocab but the text needs it");
                if (unk >= 0 && !t->fuse_unk) e->syms[k++].id = unk;
                unk = t->unk_id;
            }
        }
        i += l;
    }
    if (unk >= 0) e->syms[k++].id = unk;
    *nsym = k;
    return 0;
}

static int model_word(enc *e, const char *s, size_t n, int bl) {
    const ms_tokenizer *t = e->t;
    if (bl && !t->byte_direct) {
        if (map_bytelevel(&e->word, s, n)) return ms_errf(e->err, MS_ERR_NOMEM, "tokenizer: out of memory");
        s = e->word.p;
        n = e->word.len;
        bl = 0;
    }
    uint64_t h = 0;
    int cacheable = e->use_cache && n <= CACHE_MAX_KEY;
    if (cacheable) {
        h = tk_hash(s, n) ^ (uint64_t)bl;
        int r = cache_get(e, h, s, n);
        if (r) return r < 0 ? ms_errf(e->err, MS_ERR_NOMEM, "tokenizer: out of memory") : 0;
    }
    size_t first_out = e->n;
    if (t->ignore_merges) {
        const char *ws = s;
        size_t wl = n;
        if (bl) {
            if (map_bytelevel(&e->word, s, n)) return ms_errf(e->err, MS_ERR_NOMEM, "tokenizer: out of memory");
            ws = e->word.p;
            wl = e->word.len;
        }
        int32_t id = tk_vocab_find(t, ws, wl);
        if (id >= 0) {
            MS_TRY(emit(e, id));
            if (cacheable) cache_put(e, h, s, n, e->ids + first_out, 1);
            return 0;
        }
    }
    size_t ns = 0;
    if (bl) {
        MS_TRY(syms_reserve(e, n + 1));
        for (size_t i = 0; i < n; i++) e->syms[i].id = t->byte_id[(unsigned char)s[i]];
        ns = n;
    } else {
        MS_TRY(char_symbols(e, s, n, &ns));
    }
    if (ns == 0) return 0;
    sym *y = e->syms;
    for (size_t i = 0; i < ns; i++) {
        y[i].prev = (int32_t)i - 1;
        y[i].next = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    e->heap_n = 0;
    uint64_t v;
    for (size_t i = 0; i + 1 < ns; i++)
        if (merge_get(t, y[i].id, y[i + 1].id, &v) && heap_push(e, (v & 0xFFFFFFFF00000000ull) | i))
            return ms_errf(e->err, MS_ERR_NOMEM, "tokenizer: out of memory");
    while (e->heap_n) {
        uint64_t top = heap_pop(e);
        uint32_t pos = (uint32_t)top, rank = (uint32_t)(top >> 32);
        if (y[pos].id < 0 || y[pos].next < 0) continue;
        int32_t nx = y[pos].next;
        if (!merge_get(t, y[pos].id, y[nx].id, &v) || (uint32_t)(v >> 32) != rank) continue;
        y[pos].id = (int32_t)(uint32_t)v;
        y[nx].id = -1;
        y[pos].next = y[nx].next;
        if (y[nx].next >= 0) y[y[nx].next].prev = (int32_t)pos;
        int32_t pv = y[pos].prev, nn = y[pos].next;
        if (pv >= 0 && merge_get(t, y[pv].id, y[pos].id, &v) && heap_push(e, (v & 0xFFFFFFFF00000000ull) | (uint32_t)pv))
            return ms_errf(e->err, MS_ERR_NOMEM, "tokenizer: out of memory");
        if (nn >= 0 && merge_get(t, y[pos].id, y[nn].id, &v) && heap_push(e, (v & 0xFFFFFFFF00000000ull) | pos))
            return ms_errf(e->err, MS_ERR_NOMEM, "tokenizer: out of memory");
    }
    for (int32_t i = 0; i >= 0; i = y[i].next) MS_TRY(emit(e, y[i].id));
    if (cacheable && e->n > first_out) cache_put(e, h, s, n, e->ids + first_out, e->n - first_out);
    return 0;
}

/* ---------------- pre-tokenizers ---------------- */

static int pt_run(enc *e, int st, const char *s, size_t n, int first, int bl);

typedef struct {
    enc *e;
    int st, first, bl;
    const char *s;
    int behavior, invert;
    int has_pend;
    size_t ps, pe;
    int pm; /* pending entry is a match (MergedWithNext) / previous entry kind */
    int prev_match;
} splitter;

static int sp_emit(splitter *p, size_t a, size_t b) {
    if (b <= a) return 0;
    return pt_run(p->e, p->st + 1, p->s + a, b - a, p->first && a == 0, p->bl);
}

/* One entry of the reference's find_matches list, after invert. */
static int sp_entry(splitter *p, size_t a, size_t b, int m) {
    if (p->invert) m = !m;
    switch (p->behavior) {
    case TK_SPLIT_ISOLATED: return sp_emit(p, a, b);
    case TK_SPLIT_REMOVED: return m ? 0 : sp_emit(p, a, b);
    case TK_SPLIT_PREV:
        if (m && !p->prev_match && p->has_pend) p->pe = b;
        else {
            if (p->has_pend) MS_TRY(sp_emit(p, p->ps, p->pe));
            p->ps = a; p->pe = b; p->has_pend = 1;
        }
        p->prev_match = m;
        return 0;
    case TK_SPLIT_NEXT:
        if (p->has_pend) {
            if (!m) { int r = sp_emit(p, p->ps, b); p->has_pend = 0; return r; }
            MS_TRY(sp_emit(p, p->ps, p->pe));
            p->ps = a; p->pe = b;
            return 0;
        }
        if (m) { p->ps = a; p->pe = b; p->has_pend = 1; return 0; }
        return sp_emit(p, a, b);
    case TK_SPLIT_CONTIG:
        if (p->has_pend && m == p->prev_match) p->pe = b;
        else {
            if (p->has_pend) MS_TRY(sp_emit(p, p->ps, p->pe));
            p->ps = a; p->pe = b; p->has_pend = 1;
        }
        p->prev_match = m;
        return 0;
    }
    return 0;
}

static int sp_finish(splitter *p) {
    if (p->has_pend) { p->has_pend = 0; return sp_emit(p, p->ps, p->pe); }
    return 0;
}

enum { PRED_NUMERIC, PRED_WS, PRED_PUNCT, PRED_CHAR };

static int pred_ok(int pred, uint32_t cp, uint32_t ch) {
    switch (pred) {
    case PRED_NUMERIC: return (tk_cat(cp) & TK_C_N) != 0;
    case PRED_WS: return tk_is_ws(cp);
    case PRED_PUNCT:
        return (cp < 128 && ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
                             (cp >= 123 && cp <= 126))) || (tk_cat(cp) & TK_C_P);
    default: return cp == ch;
    }
}

/* Splits s by a regex / literal / predicate and feeds the behaviour state machine. */
static int split_run(enc *e, int st, const char *s, size_t n, int first, int bl, const tk_regex *re,
                     const char *lit, size_t ll, int pred, uint32_t ch, int behavior, int invert) {
    splitter p = {e, st, first, bl, s, behavior, invert, 0, 0, 0, 0, 0};
    size_t prev = 0;
    if (re) {
        size_t last_end = 0;
        long last_match_end = -1;
        while (last_end <= n) {
            size_t ms, me;
            int f = tk_regex_find(re, s, n, last_end, &ms, &me);
            if (f < 0) return ms_errf(e->err, MS_ERR_RUNTIME, "tokenizer: regex engine failed in pre_tokenizer");
            if (!f) break;
            if (ms == me && last_match_end == (long)me) {
                last_end += last_end < n ? (size_t)ms_utf8_len((unsigned char)s[last_end]) : 1;
                continue;
            }
            last_end = me;
            last_match_end = (long)me;
            if (prev != ms) MS_TRY(sp_entry(&p, prev, ms, 0));
            MS_TRY(sp_entry(&p, ms, me, 1));
            prev = me;
        }
    } else if (lit) {
        size_t i = 0;
        while (i < n) {
            const char *q = ll <= n - i ? memmem(s + i, n - i, lit, ll) : NULL;
            if (!q) break;
            size_t at = (size_t)(q - s);
            if (prev != at) MS_TRY(sp_entry(&p, prev, at, 0));
            MS_TRY(sp_entry(&p, at, at + ll, 1));
            prev = i = at + ll;
        }
    } else {
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            int l = ms_utf8_dec_valid((const unsigned char *)s + i, n - i, &cp);
            if (pred_ok(pred, cp, ch)) {
                if (prev != i) MS_TRY(sp_entry(&p, prev, i, 0));
                MS_TRY(sp_entry(&p, i, i + (size_t)l, 1));
                prev = i + (size_t)l;
            }
            i += (size_t)l;
        }
    }
    if (prev != n) MS_TRY(sp_entry(&p, prev, n, 0));
    return sp_finish(&p);
}

static int pt_run(enc *e, int st, const char *s, size_t n, int first, int bl) {
    const ms_tokenizer *t = e->t;
    if (n == 0) return 0;
    if (st == t->n_pretoks) return model_word(e, s, n, bl);
    const tk_pretok *p = &t->pretoks[st];
    tk_buf *sc = &e->scratch[st];
    if (bl && p->kind != TK_PT_BYTELEVEL) {
        if (map_bytelevel(sc, s, n)) return ms_errf(e->err, MS_ERR_NOMEM, "tokenizer: out of memory");
        s = sc->p;
        n = sc->len;
        bl = 0;
    }
    switch (p->kind) {
    case TK_PT_BYTELEVEL:
        if (p->add_prefix_space && s[0] != ' ' && !bl) {
            sc->len = 0;
            if (tk_buf_put(sc, " ", 1) || tk_buf_put(sc, s, n)) return ms_errf(e->err, MS_ERR_NOMEM, "tokenizer: out of memory");
            s = sc->p;
            n = sc->len;
        }
        if (p->use_regex && !bl) return split_run(e, st, s, n, first, 1, p->re, NULL, 0, 0, 0, TK_SPLIT_ISOLATED, 0);
        return pt_run(e, st + 1, s, n, first, 1);
    case TK_PT_SPLIT:
        return split_run(e, st, s, n, first, 0, p->re, p->lit, p->lit_len, 0, 0, p->behavior, p->invert);
    case TK_PT_DIGITS:
        return split_run(e, st, s, n, first, 0, NULL, NULL, 0, PRED_NUMERIC, 0,
                         p->individual ? TK_SPLIT_ISOLATED : TK_SPLIT_CONTIG, 0);
    case TK_PT_WSSPLIT:
        return split_run(e, st, s, n, first, 0, NULL, NULL, 0, PRED_WS, 0, TK_SPLIT_REMOVED, 0);
    case TK_PT_PUNCT:
        return split_run(e, st, s, n, first, 0, NULL, NULL, 0, PRED_PUNCT, 0, p->behavior, 0);
    case TK_PT_CHARDELIM: {
        uint32_t ch;
        ms_utf8_dec_valid((const unsigned char *)p->lit, p->lit_len, &ch);
        return split_run(e, st, s, n, first, 0, NULL, NULL, 0, PRED_CHAR, ch, TK_SPLIT_REMOVED, 0);
    }
    case TK_PT_WHITESPACE:
        return split_run(e, st, s, n, first, 0, p->re, NULL, 0, 0, 0, TK_SPLIT_REMOVED, 1);
    case TK_PT_METASPACE: {
        tk_buf tmp = {0};
        if (tk_replace_all(s, n, " ", 1, NULL, p->lit, p->lit_len, &tmp)) { tk_buf_free(&tmp); return ms_errf(e->err, MS_ERR_NOMEM, "tokenizer: out of memory"); }
        sc->len = 0;
        int pre = !(tmp.len >= p->lit_len && !memcmp(tmp.p, p->lit, p->lit_len)) &&
                  (p->prepend == TK_PREPEND_ALWAYS || (p->prepend == TK_PREPEND_FIRST && first));
        if ((pre && tk_buf_put(sc, p->lit, p->lit_len)) || tk_buf_put(sc, tmp.p ? tmp.p : "", tmp.len)) {
            tk_buf_free(&tmp);
            return ms_errf(e->err, MS_ERR_NOMEM, "tokenizer: out of memory");
        }
        tk_buf_free(&tmp);
        if (p->msplit) return split_run(e, st, sc->p, sc->len, first, 0, NULL, p->lit, p->lit_len, 0, 0, TK_SPLIT_NEXT, 0);
        return pt_run(e, st + 1, sc->p, sc->len, first, 0);
    }
    }
    return 0;
}

/* ---------------- added tokens ---------------- */

static int ends_with_word(const char *s, size_t n) {
    if (!n) return 0;
    size_t j = n - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
    uint32_t cp;
    ms_utf8_dec_valid((const unsigned char *)s + j, n - j, &cp);
    return (tk_cat(cp) & (TK_C_L | TK_C_N | TK_C_MN | TK_C_MC)) != 0;
}

static int starts_with_word(const char *s, size_t n) {
    if (!n) return 0;
    uint32_t cp;
    ms_utf8_dec_valid((const unsigned char *)s, n, &cp);
    return (tk_cat(cp) & (TK_C_L | TK_C_N | TK_C_MN | TK_C_MC)) != 0;
}

static int enc_section(enc *e, const char *s, size_t n, int first);

/* Cuts s at the trie's tokens (leftmost-longest), emitting token ids and passing the text between
 * them on: pass 0 to normalization, pass 1 to the pre-tokenizer. */
static int added_split(enc *e, const tk_trie *tr, const char *s, size_t n, int first, int pass) {
    const ms_tokenizer *t = e->t;
    size_t done = 0, i = 0;
    if (!tr->empty) {
        while (i < n) {
            int node = tr->root[(unsigned char)s[i]];
            if (node < 0) { i++; continue; }
            int best = -1;
            size_t best_end = 0, j = i + 1;
            while (1) {
                if (tr->node_tok[node] >= 0) { best = tr->node_tok[node]; best_end = j; }
                if (j >= n) break;
                int next = -1;
                unsigned char c = (unsigned char)s[j];
                int ef = tr->edge_first[node], ec = tr->edge_count[node];
                int lo = 0, hi = ec;
                while (lo < hi) {
                    int mid = (lo + hi) / 2;
                    if (tr->edge_byte[ef + mid] < c) lo = mid + 1;
                    else hi = mid;
                }
                if (lo < ec && tr->edge_byte[ef + lo] == c) next = tr->edge_node[ef + lo];
                if (next < 0) break;
                node = next;
                j++;
            }
            if (best < 0) { i++; continue; }
            const tk_added *a = &t->added[best];
            size_t ms = i, me = best_end;
            if (a->single_word && ((ms > 0 && ends_with_word(s, ms)) || (me < n && starts_with_word(s + me, n - me)))) {
                i = me;
                continue;
            }
            if (a->lstrip) {
                size_t k = ws_suffix_start(s + done, ms - done);
                ms = done + k;
            }
            if (a->rstrip) me += ws_prefix(s + me, n - me);
            if (done < ms) {
                int r = pass == 0 ? enc_section(e, s + done, ms - done, first && done == 0)
                                  : pt_run(e, 0, s + done, ms - done, first && done == 0, 0);
                if (r) return r;
            }
            MS_TRY(emit(e, a->id));
            done = i = me;
        }
    }
    if (done < n)
        return pass == 0 ? enc_section(e, s + done, n - done, first && done == 0)
                         : pt_run(e, 0, s + done, n - done, first && done == 0, 0);
    return 0;
}

static int enc_section(enc *e, const char *s, size_t n, int first) {
    const ms_tokenizer *t = e->t;
    if (t->n_norms) {
        tk_buf nb = {0};
        int rc = tk_normalize_text(t, s, n, &nb, e->err);
        if (!rc) rc = added_split(e, &t->trie_norm, nb.p ? nb.p : "", nb.len, first, 1);
        tk_buf_free(&nb);
        return rc;
    }
    return added_split(e, &t->trie_norm, s, n, first, 1);
}

/* ---------------- public API ---------------- */

int ms_tokenizer_encode(const ms_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids,
                        int *n_ids, ms_err *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len) return ms_errf(err, MS_ERR_INVALID, "tokenizer: NULL text");
    if (len > (size_t)INT32_MAX) return ms_errf(err, MS_ERR_INVALID, "tokenizer: text of %zu bytes is too long", len);
    char *clean = NULL;
    size_t clean_len = 0;
    int sr = tk_utf8_sanitize(text ? text : "", len, &clean, &clean_len);
    if (sr < 0) return ms_errf(err, MS_ERR_NOMEM, "tokenizer: out of memory");
    if (sr == 1) { text = clean; len = clean_len; }
    enc e = {0};
    e.t = t;
    e.err = err;
    e.use_cache = len >= 4096;
    e.scratch = calloc((size_t)t->n_pretoks + 1, sizeof *e.scratch);
    int rc = e.scratch ? 0 : ms_errf(err, MS_ERR_NOMEM, "tokenizer: out of memory");
    if (!rc && len) rc = added_split(&e, &t->trie_raw, text, len, 1, 0);
    if (!rc && add_special) {
        for (int p = 0; p < t->n_posts && !rc; p++) {
            const tk_post *pp = &t->posts[p];
            if (pp->kind == TK_PP_BYTELEVEL) continue;
            size_t add = (size_t)pp->n_pre + (size_t)pp->n_post;
            if (!add) continue;
            int32_t *ni = malloc((e.n + add + 1) * sizeof *ni);
            if (!ni) { rc = ms_errf(err, MS_ERR_NOMEM, "tokenizer: out of memory"); break; }
            if (pp->n_pre) memcpy(ni, pp->pre, (size_t)pp->n_pre * sizeof *ni);
            if (e.n) memcpy(ni + pp->n_pre, e.ids, e.n * sizeof *ni);
            if (pp->n_post) memcpy(ni + pp->n_pre + e.n, pp->post, (size_t)pp->n_post * sizeof *ni);
            free(e.ids);
            e.ids = ni;
            e.n += add;
            e.cap = e.n + 1;
        }
    }
    if (!rc && e.n > (size_t)INT32_MAX) rc = ms_errf(err, MS_ERR_INVALID, "tokenizer: too many tokens");
    if (!rc && !e.ids) {
        e.ids = malloc(sizeof *e.ids);
        if (!e.ids) rc = ms_errf(err, MS_ERR_NOMEM, "tokenizer: out of memory");
    }
    if (e.scratch)
        for (int i = 0; i <= t->n_pretoks; i++) tk_buf_free(&e.scratch[i]);
    free(e.scratch);
    tk_buf_free(&e.word);
    tk_buf_free(&e.norm);
    free(e.syms);
    free(e.heap);
    free(e.cache.tab);
    tk_buf_free(&e.cache.arena);
    free(clean);
    if (rc) { free(e.ids); return rc; }
    *ids = e.ids;
    *n_ids = (int)e.n;
    return MS_OK;
}

static void free_parts(ms_tokenizer *t) {
    for (int i = 0; i < t->n_norms; i++) {
        tk_regex_free(t->norms[i].re);
        free(t->norms[i].pat);
        free(t->norms[i].content);
    }
    for (int i = 0; i < t->n_pretoks; i++) {
        tk_regex_free(t->pretoks[i].re);
        free(t->pretoks[i].lit);
    }
    for (int i = 0; i < t->n_decs; i++) {
        tk_regex_free(t->decs[i].re);
        free(t->decs[i].pat);
        free(t->decs[i].content);
    }
    for (int i = 0; i < t->n_posts; i++) {
        free(t->posts[i].pre);
        free(t->posts[i].post);
    }
    tk_trie *tr[2] = {&t->trie_raw, &t->trie_norm};
    for (int i = 0; i < 2; i++) {
        free(tr[i]->node_tok);
        free(tr[i]->edge_first);
        free(tr[i]->edge_count);
        free(tr[i]->edge_byte);
        free(tr[i]->edge_node);
    }
}

void ms_tokenizer_free(ms_tokenizer *t) {
    if (!t) return;
    free_parts(t);
    free(t->norms);
    free(t->pretoks);
    free(t->decs);
    free(t->posts);
    free(t->arena);
    free(t->tok_off);
    free(t->tok_len);
    free(t->vslots);
    free(t->mkeys);
    free(t->char_id);
    free(t->cont_prefix);
    free(t->eow_suffix);
    free(t->added);
    free(t->special);
    free(t->chat_template);
    free(t->bos);
    free(t->eos);
    free(t);
}

/* "x" or {"content": "x"} -> malloc'd copy, NULL otherwise. */
static char *token_string(json_t *v) {
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return NULL;
    return strdup(json_string_value(v));
}

static int load_config(ms_tokenizer *t, const char *dir, ms_err *err) {
    char path[4096];
    if (ms_path_join(path, sizeof path, dir, "tokenizer_config.json")) return ms_errf(err, MS_ERR_INVALID, "%s: path too long", dir);
    t->clean_up = 1; /* transformers' historical default, as @huggingface/tokenizers */
    if (ms_path_exists(path)) {
        char *buf = NULL;
        size_t len = 0;
        MS_TRY(ms_read_file(path, MAX_CONFIG_JSON, &buf, &len, err));
        json_error_t je;
        json_t *c = json_loadb(buf, len, JSON_DECODE_INT_AS_REAL, &je);
        free(buf);
        if (!c) return ms_errf(err, MS_ERR_FORMAT, "%s: line %d: %s", path, je.line, je.text);
        int rc = 0;
        json_t *v = json_object_get(c, "clean_up_tokenization_spaces");
        if (json_is_boolean(v)) t->clean_up = json_is_true(v);
        else if (v && !json_is_null(v)) rc = ms_errf(err, MS_ERR_FORMAT, "%s: clean_up_tokenization_spaces: expected true or false", path);
        t->bos = token_string(json_object_get(c, "bos_token"));
        t->eos = token_string(json_object_get(c, "eos_token"));
        v = json_object_get(c, "chat_template");
        if (json_is_string(v)) t->chat_template = strdup(json_string_value(v));
        else if (json_is_array(v)) {
            /* [{"name": "default", "template": ...}, ...] */
            size_t i;
            json_t *it;
            json_array_foreach(v, i, it) {
                json_t *nm = json_object_get(it, "name"), *tp = json_object_get(it, "template");
                if (json_is_string(nm) && !strcmp(json_string_value(nm), "default") && json_is_string(tp)) {
                    t->chat_template = strdup(json_string_value(tp));
                    break;
                }
            }
        }
        v = json_object_get(c, "additional_special_tokens");
        if (json_is_array(v)) {
            size_t i;
            json_t *it;
            json_array_foreach(v, i, it) {
                char *s = token_string(it);
                if (!s) continue;
                int32_t id = ms_tokenizer_token_to_id(t, s);
                if (id >= 0) t->special[id] = 1;
                free(s);
            }
        }
        json_decref(c);
        if (rc) return rc;
    }
    if (ms_path_join(path, sizeof path, dir, "chat_template.jinja")) return ms_errf(err, MS_ERR_INVALID, "%s: path too long", dir);
    if (ms_path_exists(path)) {
        char *buf = NULL;
        MS_TRY(ms_read_file(path, MAX_CONFIG_JSON, &buf, NULL, err));
        free(t->chat_template);
        t->chat_template = buf;
    }
    return 0;
}

int ms_tokenizer_load(const char *dir, ms_tokenizer **out, ms_err *err) {
    *out = NULL;
    char path[4096];
    if (ms_path_join(path, sizeof path, dir, "tokenizer.json")) return ms_errf(err, MS_ERR_INVALID, "%s: path too long", dir);
    char *buf = NULL;
    size_t len = 0;
    MS_TRY(ms_read_file(path, MAX_TOKENIZER_JSON, &buf, &len, err));
    ms_tokenizer *t = calloc(1, sizeof *t);
    if (!t) { free(buf); return ms_errf(err, MS_ERR_NOMEM, "out of memory"); }
    int rc = tk_load_json(t, path, buf, len, err);
    free(buf);
    if (!rc) rc = load_config(t, dir, err);
    if (rc) { ms_tokenizer_free(t); return rc; }
    *out = t;
    return MS_OK;
}

int ms_tokenizer_vocab_size(const ms_tokenizer *t) { return t->n_ids; }

int32_t ms_tokenizer_token_to_id(const ms_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (int i = 0; i < t->n_added; i++) {
        const tk_added *a = &t->added[i];
        if (a->orig_len == n && !memcmp(t->arena + a->orig_off, token, n)) return a->id;
    }
    return tk_vocab_find(t, token, n);
}

const char *ms_tokenizer_id_to_token(const ms_tokenizer *t, int32_t id) {
    size_t n;
    const char *s = tk_tok(t, id, &n);
    /* Token text is stored without NULs between entries; hand out a stable NUL-terminated view. */
    (void)n;
    return s;
}

int ms_tokenizer_is_special(const ms_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->special[id];
}

const char *ms_tokenizer_chat_template(const ms_tokenizer *t) { return t->chat_template; }
const char *ms_tokenizer_bos_token(const ms_tokenizer *t) { return t->bos; }
const char *ms_tokenizer_eos_token(const ms_tokenizer *t) { return t->eos; }
