/* tok_text.c - UTF-8 handling and Unicode tables for the tokenizer.
 *
 * Input text may hold invalid UTF-8; the reference tokenizers only ever see valid strings (their
 * bindings replace bad bytes with U+FFFD by "maximal subparts", as WHATWG TextDecoder and Rust's
 * from_utf8_lossy do), so we replace the same way. Normalization (utf8proc) is only run on the
 * short segments that can change: most text is already in NFC and is copied as is, which keeps
 * memory linear and throughput high. */
#include "tokenizer/tok_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t tk_hash(const void *p, size_t n) { return XXH3_64bits(p, n); }

int tk_buf_reserve(tk_buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int tk_buf_put(tk_buf *b, const void *data, size_t n) {
    if (tk_buf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
    return 0;
}

void tk_buf_free(tk_buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* Length of the valid sequence at s[i..n), or -(bytes to replace by one U+FFFD). WHATWG: the
 * bytes of a valid-so-far prefix are replaced together, the offending byte is looked at again. */
static int utf8_step(const unsigned char *s, size_t n, size_t i) {
    unsigned b = s[i];
    if (b < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b >= 0xE0 && b <= 0xEF) { need = 2; if (b == 0xE0) lo = 0xA0; if (b == 0xED) hi = 0x9F; }
    else if (b >= 0xF0 && b <= 0xF4) { need = 3; if (b == 0xF0) lo = 0x90; if (b == 0xF4) hi = 0x8F; }
    else return -1;
    size_t j = i + 1;
    for (int k = 0; k < need; k++, j++) {
        if (j >= n || s[j] < lo || s[j] > hi) return -(int)(j - i);
        lo = 0x80; hi = 0xBF;
    }
    return need + 1;
}

size_t tk_utf8_valid_prefix(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        int k = utf8_step(s, n, i);
        if (k < 0) break;
        i += (size_t)k;
    }
    return i;
}

int tk_utf8_lossy_append(tk_buf *b, const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t v = tk_utf8_valid_prefix(s + i, n - i);
        if (tk_buf_put(b, s + i, v)) return -1;
        i += v;
        if (i >= n) break;
        int k = utf8_step(s, n, i);
        if (tk_buf_put(b, "\xEF\xBF\xBD", 3)) return -1;
        i += (size_t)(-k);
    }
    return 0;
}

int tk_utf8_sanitize(const char *s, size_t n, char **out, size_t *out_len) {
    size_t v = tk_utf8_valid_prefix((const unsigned char *)s, n);
    if (v == n) return 0;
    tk_buf b = {0};
    if (tk_buf_reserve(&b, n + n / 2 + 4)) return -1;
    if (tk_utf8_lossy_append(&b, (const unsigned char *)s, n)) { tk_buf_free(&b); return -1; }
    *out = b.p;
    *out_len = b.len;
    return 1;
}

/* ---- Unicode categories ---- */
uint32_t tk_cat_bmp[65536];
/* Normalization "boundary before and unchanged" flags per BMP code point, bit per form. */
static uint8_t g_norm_safe[65536];
static pthread_once_t g_uni_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_norm_once = PTHREAD_ONCE_INIT;

static int is_white_space(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

uint32_t tk_cat_slow(uint32_t cp) {
    if (cp > 0x10FFFF) return 1u; /* Cn */
    uint32_t m = 1u << utf8proc_category((utf8proc_int32_t)cp);
    if (is_white_space(cp)) m |= TK_WS;
    return m;
}

static void uni_init(void) {
    for (uint32_t c = 0; c < 65536; c++) tk_cat_bmp[c] = tk_cat_slow(c);
}

void tk_unicode_init(void) { pthread_once(&g_uni_once, uni_init); }

static const utf8proc_option_t g_form_opts[4] = {
    UTF8PROC_STABLE | UTF8PROC_COMPOSE,
    UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
    UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
    UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
};

static int is_hangul_vt(uint32_t c) { return (c >= 0x1161 && c <= 0x1175) || (c >= 0x11A8 && c <= 0x11C2); }
static int is_hangul_syllable(uint32_t c) { return c >= 0xAC00 && c <= 0xD7A3; }

/* Safe code point for a form: a starter that no normalization changes and nothing before it
 * can combine with, so a segment boundary may sit right before it. */
static int norm_safe_slow(uint32_t c, int form) {
    const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)c);
    if (p->combining_class != 0) return 0;
    if (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000) return 0; /* second of a pair */
    if (is_hangul_vt(c)) return 0;
    if ((form == TK_NORM_NFD || form == TK_NORM_NFKD) && is_hangul_syllable(c)) return 0;
    if (p->decomp_seqindex == UINT16_MAX) return 1;
    /* Has a decomposition: safe only if the form maps the character to itself. */
    utf8proc_int32_t buf[32];
    utf8proc_int32_t in = (utf8proc_int32_t)c;
    (void)in;
    int lbc = 0;
    utf8proc_ssize_t k = utf8proc_decompose_char((utf8proc_int32_t)c, buf, 32, g_form_opts[form], &lbc);
    if (k < 0 || k > 32) return 0;
    k = utf8proc_normalize_utf32(buf, k, g_form_opts[form]);
    return k == 1 && (uint32_t)buf[0] == c;
}

static void norm_init(void) {
    for (uint32_t c = 0; c < 65536; c++) {
        uint8_t m = 0;
        if (c >= 0xD800 && c <= 0xDFFF) continue;
        for (int f = 0; f < 4; f++)
            if (norm_safe_slow(c, f)) m |= (uint8_t)(1u << f);
        g_norm_safe[c] = m;
    }
}

static int norm_safe(uint32_t c, int form) {
    if (c < 65536) return (g_norm_safe[c] >> form) & 1;
    return norm_safe_slow(c, form);
}

static int normalize_segment(int form, const char *s, size_t n, tk_buf *out) {
    utf8proc_int32_t stackbuf[256];
    utf8proc_int32_t *buf = stackbuf;
    utf8proc_ssize_t cap = 256;
    utf8proc_ssize_t k = utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, buf, cap,
                                            g_form_opts[form]);
    if (k < 0) return -1;
    if (k > cap) {
        cap = k;
        buf = malloc((size_t)cap * sizeof *buf);
        if (!buf) return -1;
        k = utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, buf, cap, g_form_opts[form]);
        if (k < 0 || k > cap) { free(buf); return -1; }
    }
    k = utf8proc_normalize_utf32(buf, k, g_form_opts[form]);
    int rc = 0;
    if (k < 0 || tk_buf_reserve(out, (size_t)k * 4)) rc = -1;
    else
        for (utf8proc_ssize_t i = 0; i < k; i++) out->len += (size_t)ms_utf8_enc((uint32_t)buf[i], out->p + out->len);
    if (buf != stackbuf) free(buf);
    return rc;
}

int tk_unicode_normalize(int form, const char *s, size_t n, tk_buf *out) {
    pthread_once(&g_norm_once, norm_init);
    const unsigned char *u = (const unsigned char *)s;
    size_t flushed = 0, seg = 0, i = 0;
    int dirty = 0;
    while (i <= n) {
        uint32_t cp = 0;
        int l = 1, safe = 1;
        if (i < n) {
            if (u[i] < 0x80) { cp = u[i]; l = 1; }
            else l = ms_utf8_dec_valid(u + i, n - i, &cp);
            safe = cp < 0x80 || norm_safe(cp, form);
        }
        if (safe) {
            if (dirty) {
                if (tk_buf_put(out, s + flushed, seg - flushed)) return -1;
                if (normalize_segment(form, s + seg, i - seg, out)) return -1;
                flushed = i;
                dirty = 0;
            }
            seg = i;
        } else {
            dirty = 1;
        }
        if (i == n) break;
        i += (size_t)l;
    }
    return tk_buf_put(out, s + flushed, n - flushed);
}

/* Lowercase as Rust's str::to_lowercase: full mappings for U+0130, final sigma in context. */
int tk_lowercase(const char *s, size_t n, tk_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    if (tk_buf_reserve(out, n + 8)) return -1;
    uint32_t prev_cased = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = ms_utf8_dec_valid(u + i, n - i, &cp);
        char enc[8];
        int k;
        if (cp == 0x130) {
            k = ms_utf8_enc('i', enc);
            k += ms_utf8_enc(0x307, enc + k);
        } else if (cp == 0x3A3) {
            /* Final sigma: preceded by a cased letter and not followed by one. */
            uint32_t next = 0;
            size_t j = i + (size_t)l;
            while (j < n) {
                int l2 = ms_utf8_dec_valid(u + j, n - j, &next);
                if (!(tk_cat(next) & (TK_C_MN | TK_C_ME | TK_C_LM))) break;
                next = 0;
                j += (size_t)l2;
            }
            int next_cased = next && (tk_cat(next) & (TK_C_LU | TK_C_LL | TK_C_LT));
            k = ms_utf8_enc(prev_cased && !next_cased ? 0x3C2 : 0x3C3, enc);
        } else {
            k = ms_utf8_enc((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), enc);
        }
        uint32_t c = tk_cat(cp);
        if (c & (TK_C_LU | TK_C_LL | TK_C_LT)) prev_cased = 1;
        else if (!(c & (TK_C_MN | TK_C_ME | TK_C_LM))) prev_cased = 0;
        if (tk_buf_put(out, enc, (size_t)k)) return -1;
        i += (size_t)l;
    }
    return 0;
}

int tk_strip_accents(const char *s, size_t n, tk_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = ms_utf8_dec_valid(u + i, n - i, &cp);
        if (!(tk_cat(cp) & TK_C_MN) && tk_buf_put(out, s + i, (size_t)l)) return -1;
        i += (size_t)l;
    }
    return 0;
}

/* Appends s[0..n) to out with every match of re (regex, when non-NULL) or of the literal pat[0..pl)
 * replaced by rep[0..rl): the Replace normalizer/decoder semantics of the tokenizers library (empty
 * regex matches advance one character). Returns 0, or -1 on allocation or regex failure. */
int tk_replace_all(const char *s, size_t n, const char *pat, size_t pl, const tk_regex *re, const char *rep,
                       size_t rl, tk_buf *out) {
    if (re) {
        size_t prev = 0, last_end = 0;
        long last_match_end = -1;
        while (last_end <= n) {
            size_t ms, me;
            int f = tk_regex_find(re, s, n, last_end, &ms, &me);
            if (f < 0) return -1;
            if (!f) break;
            if (ms == me && last_match_end == (long)me) {
                last_end += last_end < n ? (size_t)ms_utf8_len((unsigned char)s[last_end]) : 1;
                continue;
            }
            last_end = me;
            last_match_end = (long)me;
            if (tk_buf_put(out, s + prev, ms - prev) || tk_buf_put(out, rep, rl)) return -1;
            prev = me;
        }
        return tk_buf_put(out, s + prev, n - prev);
    }
    size_t i = 0;
    while (i < n) {
        const char *q = pl <= n - i ? memmem(s + i, n - i, pat, pl) : NULL;
        if (!q) break;
        size_t at = (size_t)(q - s);
        if (tk_buf_put(out, s + i, at - i) || tk_buf_put(out, rep, rl)) return -1;
        i = at + pl;
    }
    return tk_buf_put(out, s + i, n - i);
}

