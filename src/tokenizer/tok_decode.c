/* tok_decode.c - ids back to text, whole (ms_tokenizer_decode) and streamed (ms_detok_*).
 *
 * Decoding follows the Rust library: ids -> token strings (special tokens dropped on request) ->
 * decoder chain -> joined text; then transformers' clean_up_tokenization_spaces when the
 * tokenizer_config asks for it. The streaming detokenizer must never emit text that a later token
 * could change, so it decodes only the ids since the last point where the text was complete,
 * holds back a trailing U+FFFD (maybe half a character), the output of trailing byte-fallback
 * tokens (their group may still grow) and whatever the clean-up could still rewrite. Its
 * concatenated output equals the full decode by construction; tests check it on random ids. */
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---------------- clean-up (streaming) ---------------- */

static const struct {
    const char *pat, *rep;
} CLEAN[10] = {{" .", "."},   {" ?", "?"},    {" !", "!"},    {" ,", ","},    {" ' ", "'"},
               {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};

/* One replaceAll pass over a stream: text that might start a match is kept in pend. */
static int clean_pass(int k, char *pend, int *pend_len, const char *s, size_t n, tk_buf *out, int final) {
    const char *pat = CLEAN[k].pat, *rep = CLEAN[k].rep;
    size_t pl = strlen(pat), rl = strlen(rep);
    char small[16];
    const char *b = s;
    size_t bn = n;
    char *heap = NULL;
    if (*pend_len) {
        if (*pend_len + n <= sizeof small) {
            memcpy(small, pend, (size_t)*pend_len);
            if (n) memcpy(small + *pend_len, s, n);
            b = small;
        } else {
            heap = malloc((size_t)*pend_len + n);
            if (!heap) return -1;
            memcpy(heap, pend, (size_t)*pend_len);
            if (n) memcpy(heap + *pend_len, s, n);
            b = heap;
        }
        bn = (size_t)*pend_len + n;
        *pend_len = 0;
    }
    size_t i = 0, flushed = 0;
    int rc = 0;
    while (i < bn) {
        const char *q = memchr(b + i, ' ', bn - i);
        if (!q) { i = bn; break; }
        i = (size_t)(q - b);
        size_t avail = bn - i;
        if (avail >= pl && !memcmp(b + i, pat, pl)) {
            if (tk_buf_put(out, b + flushed, i - flushed) || tk_buf_put(out, rep, rl)) { rc = -1; goto done; }
            i += pl;
            flushed = i;
            continue;
        }
        if (avail < pl && !final && !memcmp(b + i, pat, avail)) {
            if (tk_buf_put(out, b + flushed, i - flushed)) { rc = -1; goto done; }
            memcpy(pend, b + i, avail);
            *pend_len = (int)avail;
            flushed = bn;
            i = bn;
            break;
        }
        i++;
    }
    if (tk_buf_put(out, b + flushed, bn - flushed)) rc = -1;
done:
    free(heap);
    return rc;
}

static int clean_run(tk_cleanup *c, const char *s, size_t n, tk_buf *out, int final) {
    tk_buf a = {0}, b = {0};
    const char *cur = s;
    size_t cl = n;
    int rc = 0;
    for (int k = 0; k < 10 && !rc; k++) {
        tk_buf *dst = (k & 1) ? &b : &a;
        dst->len = 0;
        tk_buf *o = k == 9 ? out : dst;
        rc = clean_pass(k, c->pend[k], &c->pend_len[k], cur, cl, o, final);
        cur = dst->p ? dst->p : "";
        cl = dst->len;
    }
    tk_buf_free(&a);
    tk_buf_free(&b);
    return rc;
}

int tk_cleanup_feed(tk_cleanup *c, const char *s, size_t n, tk_buf *out) { return clean_run(c, s, n, out, 0); }
int tk_cleanup_flush(tk_cleanup *c, tk_buf *out) { return clean_run(c, "", 0, out, 1); }

/* ---------------- decoder chain ---------------- */

typedef struct {
    uint32_t off, len; /* into a buffer */
} piece;

typedef struct {
    tk_buf text;
    piece *p;
    int n, cap;
} plist;

static int pl_add(plist *l, const char *s, size_t n) {
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 16;
        piece *np = realloc(l->p, (size_t)nc * sizeof *np);
        if (!np) return -1;
        l->p = np;
        l->cap = nc;
    }
    uint32_t off = (uint32_t)l->text.len;
    if (tk_buf_put(&l->text, s, n)) return -1;
    l->p[l->n++] = (piece){off, (uint32_t)n};
    return 0;
}

static void pl_free(plist *l) {
    tk_buf_free(&l->text);
    free(l->p);
    memset(l, 0, sizeof *l);
}

/* Start of piece i ("" while the text buffer is still unallocated: only empty pieces; NULL + 0 is UB) */
#define PS(l, i) ((l)->text.p ? (l)->text.p + (l)->p[i].off : "")

static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        int c = s[i], h;
        if (c >= '0' && c <= '9') h = c - '0';
        else if (c >= 'a' && c <= 'f') h = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') h = c - 'A' + 10;
        else return -1;
        v = v * 16 + h;
    }
    return v;
}

static int wp_cleanup(const char *s, size_t n, tk_buf *out) {
    static const char *P[11][2] = {{" .", "."},     {" ?", "?"},     {" !", "!"},   {" ,", ","},
                                   {" ' ", "'"},    {" n't", "n't"}, {" 'm", "'m"}, {" do not", " don't"},
                                   {" 's", "'s"},   {" 've", "'ve"}, {" 're", "'re"}};
    tk_buf a = {0}, b = {0};
    if (tk_buf_put(&a, s, n)) return -1;
    for (int k = 0; k < 11; k++) {
        b.len = 0;
        if (tk_replace_all(a.p ? a.p : "", a.len, P[k][0], strlen(P[k][0]), NULL, P[k][1], strlen(P[k][1]), &b)) {
            tk_buf_free(&a);
            tk_buf_free(&b);
            return -1;
        }
        tk_buf t = a;
        a = b;
        b = t;
    }
    int rc = tk_buf_put(out, a.p ? a.p : "", a.len);
    tk_buf_free(&a);
    tk_buf_free(&b);
    return rc;
}

/* Applies one decoder to in, producing out. */
/* joined: an earlier step (Fuse, ByteLevel) made the list one string, so Strip's start and stop
 * apply to the whole text: only at the true start (first) and end (!more) of the sequence. */
static int dec_step(const tk_dec *d, plist *in, plist *out, int first, int more, int *joined) {
    tk_buf tmp = {0};
    int rc = 0;
    switch (d->kind) {
    case TK_D_BYTELEVEL: {
        tk_buf bytes = {0};
        for (int i = 0; i < in->n && !rc; i++) {
            const unsigned char *s = (const unsigned char *)PS(in, i);
            size_t n = in->p[i].len;
            size_t mark = bytes.len;
            int ok = 1;
            for (size_t j = 0; j < n && ok;) {
                uint32_t cp;
                int l = ms_utf8_dec_valid(s + j, n - j, &cp);
                int b = tk_bytelevel_byte(cp);
                if (b < 0) ok = 0;
                else {
                    unsigned char c = (unsigned char)b;
                    if (tk_buf_put(&bytes, &c, 1)) rc = -1;
                }
                j += (size_t)l;
            }
            if (!ok) {
                bytes.len = mark;
                if (tk_buf_put(&bytes, s, n)) rc = -1;
            }
        }
        if (!rc) rc = tk_utf8_lossy_append(&tmp, (const unsigned char *)(bytes.p ? bytes.p : ""), bytes.len);
        tk_buf_free(&bytes);
        if (!rc) rc = pl_add(out, tmp.p ? tmp.p : "", tmp.len);
        *joined = 1;
        break;
    }
    case TK_D_BYTEFALLBACK: {
        tk_buf bytes = {0};
        for (int i = 0; i <= in->n && !rc; i++) {
            int b = i < in->n ? byte_token(PS(in, i), in->p[i].len) : -1;
            if (b >= 0) {
                unsigned char c = (unsigned char)b;
                rc = tk_buf_put(&bytes, &c, 1);
                continue;
            }
            if (bytes.len) {
                if (tk_utf8_valid_prefix((const unsigned char *)bytes.p, bytes.len) == bytes.len) rc = pl_add(out, bytes.p, bytes.len);
                else
                    for (size_t k = 0; k < bytes.len && !rc; k++) rc = pl_add(out, "\xEF\xBF\xBD", 3);
                bytes.len = 0;
            }
            if (i < in->n && !rc) rc = pl_add(out, PS(in, i), in->p[i].len);
        }
        tk_buf_free(&bytes);
        break;
    }
    case TK_D_FUSE:
        for (int i = 0; i < in->n && !rc; i++) rc = tk_buf_put(&tmp, PS(in, i), in->p[i].len);
        if (!rc) rc = pl_add(out, tmp.p ? tmp.p : "", tmp.len);
        *joined = 1;
        break;
    case TK_D_STRIP:
        for (int i = 0; i < in->n && !rc; i++) {
            const char *s = PS(in, i);
            size_t n = in->p[i].len, a = 0, z = n, cl = d->content_len;
            int start = !*joined || first ? d->start : 0, stop = !*joined || !more ? d->stop : 0;
            for (int k = 0; k < start && a + cl <= n && !memcmp(s + a, d->content, cl); k++) a += cl;
            for (int k = 0; k < stop && z >= a + cl && !memcmp(s + z - cl, d->content, cl); k++) z -= cl;
            rc = pl_add(out, s + a, z - a);
        }
        break;
    case TK_D_REPLACE:
        for (int i = 0; i < in->n && !rc; i++) {
            tmp.len = 0;
            rc = tk_replace_all(PS(in, i), in->p[i].len, d->pat, d->pat_len, d->re, d->content, d->content_len, &tmp);
            if (!rc) rc = pl_add(out, tmp.p ? tmp.p : "", tmp.len);
        }
        break;
    case TK_D_METASPACE:
        for (int i = 0; i < in->n && !rc; i++) {
            tmp.len = 0;
            int drop = i == 0 && first && d->prepend;
            rc = tk_replace_all(PS(in, i), in->p[i].len, d->pat, d->pat_len, NULL, " ", drop ? 0 : 1, &tmp);
            if (!rc) rc = pl_add(out, tmp.p ? tmp.p : "", tmp.len);
        }
        break;
    case TK_D_BPE:
        for (int i = 0; i < in->n && !rc; i++) {
            tmp.len = 0;
            int last = i == in->n - 1 && !more;
            rc = tk_replace_all(PS(in, i), in->p[i].len, d->pat, d->pat_len, NULL, " ", last ? 0 : 1, &tmp);
            if (!rc) rc = pl_add(out, tmp.p ? tmp.p : "", tmp.len);
        }
        break;
    case TK_D_WORDPIECE:
        for (int i = 0; i < in->n && !rc; i++) {
            tmp.len = 0;
            const char *s = PS(in, i);
            size_t n = in->p[i].len;
            if (!(i == 0 && first)) {
                if (n >= d->pat_len && !memcmp(s, d->pat, d->pat_len)) { s += d->pat_len; n -= d->pat_len; }
                else rc = tk_buf_put(&tmp, " ", 1);
            }
            if (!rc) rc = d->cleanup ? wp_cleanup(s, n, &tmp) : tk_buf_put(&tmp, s, n);
            if (!rc) rc = pl_add(out, tmp.p ? tmp.p : "", tmp.len);
        }
        break;
    }
    tk_buf_free(&tmp);
    return rc;
}

int tk_decode_raw(const ms_tokenizer *t, const int32_t *ids, int n, int skip_special, int first, int more,
                  tk_buf *out, ms_err *err) {
    plist a = {0}, b = {0};
    int rc = 0;
    for (int i = 0; i < n; i++) {
        size_t l;
        const char *s = tk_tok(t, ids[i], &l);
        if (!s) { rc = ms_errf(err, MS_ERR_INVALID, "tokenizer: token id %d is out of range (vocabulary has %d ids)", ids[i], t->n_ids); goto out; }
        if (skip_special && t->special[ids[i]]) continue;
        if (pl_add(&a, s, l)) goto oom;
    }
    if (!t->has_decoder) {
        for (int i = 0; i < a.n; i++)
            if ((i && tk_buf_put(out, " ", 1)) || tk_buf_put(out, PS(&a, i), a.p[i].len)) goto oom;
        goto out;
    }
    int joined = 0;
    for (int k = 0; k < t->n_decs; k++) {
        b.n = 0;
        b.text.len = 0;
        if (dec_step(&t->decs[k], &a, &b, first, more, &joined)) goto oom;
        plist x = a;
        a = b;
        b = x;
    }
    for (int i = 0; i < a.n; i++)
        if (tk_buf_put(out, PS(&a, i), a.p[i].len)) goto oom;
    goto out;
oom:
    rc = ms_errf(err, MS_ERR_NOMEM, "tokenizer: out of memory while decoding");
out:
    pl_free(&a);
    pl_free(&b);
    return rc;
}

int ms_tokenizer_decode(const ms_tokenizer *t, const int32_t *ids, int n_ids, int skip_special, char **out,
                        size_t *len, ms_err *err) {
    *out = NULL;
    *len = 0;
    if (n_ids < 0 || (n_ids && !ids)) return ms_errf(err, MS_ERR_INVALID, "tokenizer: bad id list");
    tk_buf raw = {0}, res = {0};
    int rc = tk_decode_raw(t, ids, n_ids, skip_special, 1, 0, &raw, err);
    if (!rc) {
        if (t->clean_up) {
            tk_cleanup c = {0};
            if (tk_cleanup_feed(&c, raw.p ? raw.p : "", raw.len, &res) || tk_cleanup_flush(&c, &res))
                rc = ms_errf(err, MS_ERR_NOMEM, "tokenizer: out of memory");
        } else {
            res = raw;
            raw = (tk_buf){0};
        }
    }
    if (!rc && tk_buf_put(&res, "", 1)) rc = ms_errf(err, MS_ERR_NOMEM, "tokenizer: out of memory");
    tk_buf_free(&raw);
    if (rc) { tk_buf_free(&res); return rc; }
    *out = res.p;
    *len = res.len - 1;
    return MS_OK;
}

int ms_tokenizer_token_bytes(const ms_tokenizer *t, int32_t id, char **out, size_t *len, ms_err *err) {
    *out = NULL;
    *len = 0;
    tk_buf raw = {0};
    int rc = tk_decode_raw(t, &id, 1, 0, 0, 1, &raw, err);
    if (!rc && tk_buf_put(&raw, "", 1)) rc = ms_errf(err, MS_ERR_NOMEM, "tokenizer: out of memory");
    if (rc) { tk_buf_free(&raw); return rc; }
    *out = raw.p;
    *len = raw.len - 1;
    return MS_OK;
}

/* ---------------- streaming ---------------- */

struct ms_detok {
    const ms_tokenizer *t;
    int skip_special;
    int32_t *win;
    int nwin, capwin;
    int started;    /* a kept token exists before the window */
    size_t emitted; /* bytes of the window's raw decode already passed on */
    int has_bytefb, has_bpe, last_sensitive;
    tk_cleanup cl;
    tk_buf full, hold;
};

ms_detok *ms_detok_new(const ms_tokenizer *t, int skip_special) {
    ms_detok *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->t = t;
    d->skip_special = skip_special;
    for (int i = 0; i < t->n_decs; i++) {
        if (t->decs[i].kind == TK_D_BYTEFALLBACK) d->has_bytefb = 1;
        if (t->decs[i].kind == TK_D_BPE) d->has_bpe = 1;
        if (t->decs[i].kind == TK_D_BPE || (t->decs[i].kind == TK_D_STRIP && t->decs[i].stop > 0)) d->last_sensitive = 1;
    }
    return d;
}

void ms_detok_free(ms_detok *d) {
    if (!d) return;
    free(d->win);
    tk_buf_free(&d->full);
    tk_buf_free(&d->hold);
    free(d);
}

static int out_append(ms_detok *d, const char *s, size_t n, char **buf, size_t *len, size_t *cap, ms_err *err) {
    tk_buf o = {*buf, *len, *cap};
    int rc;
    if (d->t->clean_up) rc = tk_cleanup_feed(&d->cl, s, n, &o);
    else rc = tk_buf_put(&o, s, n);
    if (!rc) rc = tk_buf_reserve(&o, 1);
    if (!rc) o.p[o.len] = 0;
    *buf = o.p;
    *len = o.len;
    *cap = o.cap;
    return rc ? ms_errf(err, MS_ERR_NOMEM, "tokenizer: out of memory") : 0;
}

static int is_kept(const ms_detok *d, int32_t id) { return !(d->skip_special && d->t->special[id]); }

int ms_detok_push(ms_detok *d, int32_t id, char **buf, size_t *len, size_t *cap, ms_err *err) {
    const ms_tokenizer *t = d->t;
    size_t tl;
    if (!tk_tok(t, id, &tl)) return ms_errf(err, MS_ERR_INVALID, "tokenizer: token id %d is out of range (vocabulary has %d ids)", id, t->n_ids);
    if (d->nwin == d->capwin) {
        int nc = d->capwin ? d->capwin * 2 : 16;
        int32_t *nw = realloc(d->win, (size_t)nc * sizeof *nw);
        if (!nw) return ms_errf(err, MS_ERR_NOMEM, "tokenizer: out of memory");
        d->win = nw;
        d->capwin = nc;
    }
    d->win[d->nwin++] = id;
    d->full.len = 0;
    MS_TRY(tk_decode_raw(t, d->win, d->nwin, d->skip_special, !d->started, 0, &d->full, err));
    /* Trailing tokens whose output may still change: a byte-fallback group, BPEDecoder's last. */
    int unstable = 0;
    for (int i = d->nwin - 1; i >= 0; i--) {
        if (!is_kept(d, d->win[i])) { unstable++; continue; }
        const char *s = tk_tok(t, d->win[i], &tl);
        if ((d->has_bytefb && byte_token(s, tl) >= 0) || (d->has_bpe && unstable == 0)) { unstable++; continue; }
        break;
    }
    /* (skipped tokens at the very end are harmless but counting them keeps the window simple) */
    size_t stable = d->full.len;
    int same = 1;
    if (unstable || d->last_sensitive) {
        /* what is certain: the text without the unstable tail, decoded as if more followed */
        d->hold.len = 0;
        MS_TRY(tk_decode_raw(t, d->win, d->nwin - unstable, d->skip_special, !d->started, 1, &d->hold, err));
        size_t k = 0;
        while (k < d->hold.len && k < d->full.len && d->hold.p[k] == d->full.p[k]) k++;
        stable = k;
        same = d->hold.len == d->full.len && k == d->full.len;
    }
    while (stable >= 3 && !memcmp(d->full.p + stable - 3, "\xEF\xBF\xBD", 3)) stable -= 3;
    while (stable > d->emitted && ((unsigned char)d->full.p[stable - 1] & 0xC0) == 0x80) {
        /* never cut inside a character (the common prefix may end mid-way) */
        size_t j = stable - 1;
        while (j > 0 && ((unsigned char)d->full.p[j] & 0xC0) == 0x80) j--;
        if (j + (size_t)ms_utf8_len((unsigned char)d->full.p[j]) <= stable) break;
        stable = j;
    }
    if (stable > d->emitted) {
        MS_TRY(out_append(d, d->full.p + d->emitted, stable - d->emitted, buf, len, cap, err));
        d->emitted = stable;
    } else if (!*buf) {
        MS_TRY(out_append(d, "", 0, buf, len, cap, err));
    }
    if (stable == d->full.len && !unstable && same) {
        for (int i = 0; i < d->nwin; i++) d->started |= is_kept(d, d->win[i]);
        d->nwin = 0;
        d->emitted = 0;
    }
    return MS_OK;
}

int ms_detok_flush(ms_detok *d, char **buf, size_t *len, size_t *cap, ms_err *err) {
    d->full.len = 0;
    MS_TRY(tk_decode_raw(d->t, d->win, d->nwin, d->skip_special, !d->started, 0, &d->full, err));
    if (d->full.len > d->emitted) MS_TRY(out_append(d, d->full.p + d->emitted, d->full.len - d->emitted, buf, len, cap, err));
    tk_buf o = {*buf, *len, *cap};
    int rc = 0;
    if (d->t->clean_up) rc = tk_cleanup_flush(&d->cl, &o);
    if (!rc) rc = tk_buf_reserve(&o, 1);
    if (!rc) o.p[o.len] = 0;
    *buf = o.p;
    *len = o.len;
    *cap = o.cap;
    if (rc) return ms_errf(err, MS_ERR_NOMEM, "tokenizer: out of memory");
    for (int i = 0; i < d->nwin; i++) d->started |= is_kept(d, d->win[i]);
    d->nwin = 0;
    d->emitted = 0;
    memset(&d->cl, 0, sizeof d->cl);
    return MS_OK;
}
