/* matcher.c - the pushdown automaton over bytes, token masks and the per-context token cache.
 *
 * A parse stack is a chain of nodes (position, parent), interned per arena so equal stacks are
 * equal ids; the parse state is the set of live stacks (a grammar may be ambiguous). Stepping on a
 * byte advances every stack whose top class holds it, then expands: a rule reference pushes the
 * continuation (elided when the reference ends its alternative: a tail call, which keeps
 * right-recursive repetition at constant depth), an alternative's end pops.
 *
 * Masks: for a stack, the tokens accepted or rejected while never popping below its top K nodes
 * are the same wherever those K nodes sit, so they are computed once per K-node context (a
 * depth-first walk of the vocabulary trie that prunes dead prefixes) and cached in the grammar,
 * shared by every matcher. Tokens that pop below the context with bytes left are "uncertain" and
 * are checked against the real stack each step; there are few of them. */
#include "grammar/grammar_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CTX_K 6            /* context depth of the token cache */
#define MAX_EXPAND_DEPTH 4000
#define CACHE_BUDGET_BYTES (16u << 20) /* token bitmaps kept per grammar; beyond it contexts are recomputed */

/* ---- node arena ---- */

typedef struct narena {
    int32_t *pos, *par;
    uint32_t *stamp;
    int n, cap;
    int32_t *ht; /* open addressing, -1 empty */
    int ht_cap;  /* power of two */
    uint32_t gen;
    int overflow; /* an expansion hit MAX_EXPAND_DEPTH */
} narena;

static void arena_free(narena *a) {
    free(a->pos); free(a->par); free(a->stamp); free(a->ht);
    memset(a, 0, sizeof *a);
}

static inline uint32_t nhash(int32_t pos, int32_t par) {
    uint64_t x = ((uint64_t)(uint32_t)pos << 32) | (uint32_t)par;
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return (uint32_t)x;
}

static int arena_rehash(narena *a, int cap) {
    int32_t *ht = malloc((size_t)cap * sizeof *ht);
    if (!ht) return -1;
    memset(ht, 0xff, (size_t)cap * sizeof *ht);
    for (int i = 1; i < a->n; i++) {
        uint32_t h = nhash(a->pos[i], a->par[i]) & (uint32_t)(cap - 1);
        while (ht[h] >= 0) h = (h + 1) & (uint32_t)(cap - 1);
        ht[h] = i;
    }
    free(a->ht);
    a->ht = ht;
    a->ht_cap = cap;
    return 0;
}

/* Empties the arena, keeping node 0 (the empty stack). */
static int arena_reset(narena *a) {
    if (!a->cap) {
        a->cap = 256;
        a->pos = malloc((size_t)a->cap * sizeof *a->pos);
        a->par = malloc((size_t)a->cap * sizeof *a->par);
        a->stamp = calloc((size_t)a->cap, sizeof *a->stamp);
        if (!a->pos || !a->par || !a->stamp) return -1;
    }
    a->n = 1;
    a->pos[0] = -1;
    a->par[0] = -1;
    a->stamp[0] = 0;
    return arena_rehash(a, 512);
}

/* The node (pos, par), created when new; -1 when out of memory. */
static int32_t intern(narena *a, int32_t pos, int32_t par) {
    uint32_t mask = (uint32_t)a->ht_cap - 1, h = nhash(pos, par) & mask;
    for (int32_t id; (id = a->ht[h]) >= 0; h = (h + 1) & mask)
        if (a->pos[id] == pos && a->par[id] == par) return id;
    if (a->n == a->cap) {
        int cap = a->cap * 2;
        int32_t *p1 = realloc(a->pos, (size_t)cap * sizeof *p1);
        if (!p1) return -1;
        a->pos = p1;
        int32_t *p2 = realloc(a->par, (size_t)cap * sizeof *p2);
        if (!p2) return -1;
        a->par = p2;
        uint32_t *p3 = realloc(a->stamp, (size_t)cap * sizeof *p3);
        if (!p3) return -1;
        a->stamp = p3;
        a->cap = cap;
    }
    int32_t id = a->n++;
    a->pos[id] = pos;
    a->par[id] = par;
    a->stamp[id] = 0;
    a->ht[h] = id;
    if ((size_t)a->n * 2 > (size_t)a->ht_cap && arena_rehash(a, a->ht_cap * 2)) return -1;
    return id;
}

/* ---- stack sets ---- */

typedef struct nset {
    int32_t *v;
    int n, cap;
    int popped; /* a stack popped to the bottom (grammar end, or below a cache context) */
} nset;

static int nset_push(nset *s, int32_t id) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        int32_t *v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = id;
    return 0;
}

/* Adds to out every stack reached from "continue at pos with parent par" (see the file comment). */
static void expand(const ms_grammar *g, narena *a, int32_t pos, int32_t par, nset *out, int depth) {
    if (depth > MAX_EXPAND_DEPTH) { a->overflow = 1; return; }
    const gelem *e = &g->el[pos];
    if (e->kind == GE_CLASS) {
        int32_t id = intern(a, pos, par);
        if (id < 0) { a->overflow = 1; return; }
        if (a->stamp[id] != a->gen) {
            a->stamp[id] = a->gen;
            if (nset_push(out, id)) a->overflow = 1;
        }
    } else if (e->kind == GE_END) {
        if (par == 0) out->popped = 1;
        else expand(g, a, a->pos[par], a->par[par], out, depth + 1);
    } else {
        int32_t cont = par;
        if (g->el[pos + 1].kind != GE_END) {
            cont = intern(a, pos + 1, par);
            if (cont < 0) { a->overflow = 1; return; }
        }
        int r = e->rule;
        for (int k = 0; k < g->rule_nalt[r]; k++) expand(g, a, g->alt_start[g->rule_alt0[r] + k], cont, out, depth + 1);
    }
}

/* out = the stacks of `in` after byte b (out->popped: some stack ended exactly there). */
static void step(const ms_grammar *g, narena *a, const nset *in, unsigned b, nset *out) {
    out->n = 0;
    out->popped = 0;
    a->gen++;
    for (int i = 0; i < in->n; i++) {
        int32_t id = in->v[i];
        int32_t pos = a->pos[id];
        if (gset_has(g->el[pos].set, b)) expand(g, a, pos + 1, a->par[id], out, 0);
    }
}

/* ---- grammar objects ---- */

static void entry_free(gcache_entry *e) {
    if (!e->acc_shared) free(e->acc);
    free(e->acc_ids);
    free(e->unc);
    free(e);
}

static int grammar_new(const ms_grammar_vocab *v, ms_grammar **out, ms_err *err) {
    ms_grammar *g = calloc(1, sizeof *g);
    if (!g) return ms_errf(err, MS_ERR_NOMEM, "grammar: out of memory");
    g->refs = 1;
    g->vocab = v;
    pthread_mutex_init(&g->mu, NULL);
    g->n_buckets = 1024;
    g->buckets = calloc((size_t)g->n_buckets, sizeof *g->buckets);
    if (!g->buckets) { free(g); return ms_errf(err, MS_ERR_NOMEM, "grammar: out of memory"); }
    *out = g;
    return MS_OK;
}

int ms_grammar_compile_gbnf(const char *src, const ms_grammar_vocab *v, ms_grammar **out, ms_err *err) {
    *out = NULL;
    ms_grammar *g = NULL;
    MS_TRY(grammar_new(v, &g, err));
    int rc = ms_gbnf_build(src, g, err);
    if (rc) { ms_grammar_unref(g); return rc; }
    *out = g;
    return MS_OK;
}

int ms_grammar_compile_regex(const char *re, const ms_grammar_vocab *v, ms_grammar **out, ms_err *err) {
    *out = NULL;
    char *src = NULL;
    MS_TRY(ms_grammar_regex_to_gbnf(re, &src, err));
    int rc = ms_grammar_compile_gbnf(src, v, out, err);
    free(src);
    return rc;
}

int ms_grammar_compile_json_schema(json_t *schema, const ms_grammar_vocab *v, ms_grammar **out, ms_err *err) {
    *out = NULL;
    char *src = NULL;
    MS_TRY(ms_grammar_json_schema_to_gbnf(schema, &src, err));
    int rc = ms_grammar_compile_gbnf(src, v, out, err);
    if (rc) ms_err_prefix(err, "json schema (internal grammar)");
    free(src);
    return rc;
}

void ms_grammar_ref(ms_grammar *g) { atomic_fetch_add_explicit((_Atomic int *)&g->refs, 1, memory_order_relaxed); }

void ms_grammar_unref(ms_grammar *g) {
    if (!g || atomic_fetch_sub_explicit((_Atomic int *)&g->refs, 1, memory_order_acq_rel) != 1) return;
    for (int i = 0; i < g->n_buckets; i++)
        for (gcache_entry *e = g->buckets[i], *nx; e; e = nx) {
            nx = e->next;
            entry_free(e);
        }
    free(g->buckets);
    for (int i = 0; i < g->bm_cap; i++) free(g->bm[i].bits);
    free(g->bm);
    ms_gbnf_free_rules(g);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* ---- matcher ---- */

struct ms_grammar_matcher {
    ms_grammar *g;
    narena a;        /* the real stacks */
    narena tmp;      /* scratch for cache computations */
    nset cur;        /* live stacks */
    int can_end;
    int32_t free_until;
    int active;
    int words;
    nset *lvl;       /* per trie depth */
    int n_lvl;
    gcache_entry **ents; /* per stack of cur, during fill_mask */
    int cap_ents;
    /* building a cache entry */
    uint32_t *b_acc;
    int32_t *b_unc;
    int b_n_unc, b_cap_unc;
    int b_complete;
    int oom;
    /* step memo of one cache computation: (stack set, byte) -> stack set; inside a string or a
     * number the walk meets the same set again and again */
    struct smemo *memo;
    int memo_cap;   /* power of two */
    int memo_n;
    int32_t *pool;  /* the sets' node ids */
    size_t pool_n, pool_cap;
};

typedef struct smemo {
    uint64_t h;     /* 0 = empty slot */
    int32_t in_off, in_n, out_off, out_n;
    uint8_t popped;
} smemo;

#define MEMO_POOL_MAX ((size_t)1 << 22)

/* The hash of a stack set (its byte mixed in by set_hash_b): the walk hashes a node's set once and
 * mixes in each child's byte. */
static uint64_t set_hash_base(const nset *s) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)s->n << 8);
    for (int i = 0; i < s->n; i++) h = (h ^ (uint32_t)s->v[i]) * 0xff51afd7ed558ccdull;
    return h;
}

static inline uint64_t set_hash_b(uint64_t base, unsigned b) {
    uint64_t h = (base ^ ((uint64_t)b * 0xc4ceb9fe1a85ec53ull)) * 0xff51afd7ed558ccdull;
    h ^= h >> 29;
    return h | 1;
}

static inline int ids_equal(const int32_t *a, const int32_t *b, int n) {
    for (int i = 0; i < n; i++) if (a[i] != b[i]) return 0;
    return 1;
}

static int pool_put(ms_grammar_matcher *m, const int32_t *v, int n, int32_t *off) {
    if (m->pool_n + (size_t)n > m->pool_cap) {
        size_t cap = m->pool_cap ? m->pool_cap * 2 : 4096;
        while (cap < m->pool_n + (size_t)n) cap *= 2;
        if (cap > MEMO_POOL_MAX) return -1;
        int32_t *p = realloc(m->pool, cap * sizeof *p);
        if (!p) return -1;
        m->pool = p;
        m->pool_cap = cap;
    }
    *off = (int32_t)m->pool_n;
    if (n > 0) memcpy(m->pool + m->pool_n, v, (size_t)n * sizeof *v); /* an empty set may come with v == NULL */
    m->pool_n += (size_t)n;
    return 0;
}

/* step() through the memo (tmp arena only: node ids are stable within one cache computation);
 * base = set_hash_base(in). */
static void step_memo(ms_grammar_matcher *m, const nset *in, uint64_t base, unsigned b, nset *out) {
    uint64_t h = set_hash_b(base, b);
    uint32_t mask = (uint32_t)m->memo_cap - 1, i = (uint32_t)h & mask;
    for (; m->memo[i].h; i = (i + 1) & mask) {
        smemo *e = &m->memo[i];
        if (e->h == h && e->out_n >= 0 && e->in_n == in->n && ids_equal(m->pool + e->in_off, in->v, in->n)) {
            out->n = 0;
            out->popped = e->popped;
            if (out->cap < e->out_n) {
                int32_t *v = realloc(out->v, (size_t)e->out_n * sizeof *v);
                if (!v) { m->oom = 1; return; }
                out->v = v;
                out->cap = e->out_n;
            }
            if (e->out_n) memcpy(out->v, m->pool + e->out_off, (size_t)e->out_n * sizeof *out->v);
            out->n = e->out_n;
            return;
        }
    }
    step(m->g, &m->tmp, in, b, out);
    if (m->memo_n * 2 >= m->memo_cap) return; /* full: no more memoizing this time */
    smemo e = {h, 0, in->n, 0, out->n, (uint8_t)out->popped};
    if (pool_put(m, in->v, in->n, &e.in_off) || pool_put(m, out->v, out->n, &e.out_off)) return;
    m->memo[i] = e;
    m->memo_n++;
}

ms_grammar_matcher *ms_grammar_matcher_new(ms_grammar *g) {
    ms_grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->g = g;
    ms_grammar_ref(g);
    m->free_until = -1;
    m->active = 1;
    m->words = (g->vocab->n + 31) / 32;
    m->n_lvl = g->vocab->max_len + 2;
    m->lvl = calloc((size_t)m->n_lvl, sizeof *m->lvl);
    if (!m->lvl || arena_reset(&m->a) || arena_reset(&m->tmp)) { ms_grammar_matcher_free(m); return NULL; }
    /* the start: as if "root" were referenced from an empty stack */
    m->a.gen++;
    for (int k = 0; k < g->rule_nalt[g->root]; k++) expand(g, &m->a, g->alt_start[g->rule_alt0[g->root] + k], 0, &m->cur, 0);
    m->can_end = m->cur.popped;
    if (m->a.overflow) { ms_grammar_matcher_free(m); return NULL; }
    return m;
}

void ms_grammar_matcher_free(ms_grammar_matcher *m) {
    if (!m) return;
    arena_free(&m->a);
    arena_free(&m->tmp);
    free(m->cur.v);
    if (m->lvl)
        for (int i = 0; i < m->n_lvl; i++) free(m->lvl[i].v);
    free(m->lvl);
    free(m->ents);
    free(m->b_acc);
    free(m->b_unc);
    free(m->memo);
    free(m->pool);
    ms_grammar_unref(m->g);
    free(m);
}

void ms_grammar_matcher_set_free_until(ms_grammar_matcher *m, int32_t id) {
    m->free_until = id;
    m->active = id < 0;
}

int ms_grammar_matcher_active(const ms_grammar_matcher *m) { return m->active; }
int ms_grammar_matcher_vocab_size(const ms_grammar_matcher *m) { return m->g->vocab->n; }
int ms_grammar_matcher_can_end(const ms_grammar_matcher *m) { return m->active && m->can_end; }
int ms_grammar_matcher_done(const ms_grammar_matcher *m) { return m->active && m->can_end && m->cur.n == 0; }

/* 1 when the bytes s[0..n) can follow the stacks `from` in arena a (the grammar may end exactly at
 * the last byte but not before it). With res, the resulting stacks are left in *res. */
static int run_bytes(ms_grammar_matcher *m, narena *a, const nset *from, const unsigned char *s, size_t n, nset **res) {
    const nset *in = from;
    nset *out = NULL;
    for (size_t i = 0; i < n; i++) {
        out = &m->lvl[(i & 1) + 1];
        step(m->g, a, in, s[i], out);
        if (out->n == 0 && !(out->popped && i + 1 == n)) return 0;
        in = out;
    }
    if (res) *res = out;
    return 1;
}

int ms_grammar_matcher_accept(ms_grammar_matcher *m, int32_t id) {
    if (!m->active) {
        if (id == m->free_until) m->active = 1;
        return 1;
    }
    size_t len;
    const char *s = ms_grammar_vocab_token(m->g->vocab, id, &len);
    if (!s) return 0;
    nset *res = NULL;
    if (!run_bytes(m, &m->a, &m->cur, (const unsigned char *)s, len, &res)) return 0;
    m->cur.n = 0;
    for (int i = 0; i < res->n; i++) nset_push(&m->cur, res->v[i]);
    m->can_end = res->popped;
    return 1;
}

/* ---- the per-context cache ---- */

static void b_unc_add_range(ms_grammar_matcher *m, int lo, int hi) {
    const int32_t *sorted = m->g->vocab->sorted;
    for (int k = lo; k < hi; k++) {
        if (m->b_n_unc == m->b_cap_unc) {
            int cap = m->b_cap_unc ? 2 * m->b_cap_unc : 1024;
            int32_t *u = realloc(m->b_unc, (size_t)cap * sizeof *u);
            if (!u) { m->oom = 1; return; }
            m->b_unc = u;
            m->b_cap_unc = cap;
        }
        m->b_unc[m->b_n_unc++] = sorted[k];
    }
}

/* Walks trie node t at depth d with stacks S (S->popped: the context was left exactly at depth d);
 * unc: the context was left earlier with bytes to go on some path. */
static int nset_equal(const nset *a, const nset *b) {
    return a->n == b->n && a->popped == b->popped && !memcmp(a->v, b->v, (size_t)a->n * sizeof *a->v);
}

/* The bytes b with step(S, b) == S (S loops on them: the inside of a string, digits of a number),
 * memoized per set; NULL when the memo is full. */
static const uint32_t *loop_class(ms_grammar_matcher *m, const nset *S, nset *scratch) {
    uint64_t base = set_hash_base(S), h = set_hash_b(base, 256) ^ 0xA5A5A5A5ull;
    h |= 1;
    uint32_t mask = (uint32_t)m->memo_cap - 1, i = (uint32_t)h & mask;
    for (; m->memo[i].h; i = (i + 1) & mask) {
        smemo *e = &m->memo[i];
        if (e->h == h && e->out_n == -1 && e->in_n == S->n && !memcmp(m->pool + e->in_off, S->v, (size_t)S->n * sizeof *S->v))
            return (const uint32_t *)(m->pool + e->out_off);
    }
    uint32_t cls[8] = {0};
    for (unsigned b = 0; b < 256; b++) {
        step_memo(m, S, base, b, scratch);
        if (nset_equal(scratch, S)) cls[b >> 5] |= 1u << (b & 31);
    }
    if (m->memo_n * 2 >= m->memo_cap) return NULL;
    for (i = (uint32_t)h & mask; m->memo[i].h; i = (i + 1) & mask) {}
    smemo e = {h, 0, S->n, 0, -1, 0};
    if (pool_put(m, S->v, S->n, &e.in_off) || pool_put(m, (const int32_t *)cls, 8, &e.out_off)) return NULL;
    m->memo[i] = e;
    m->memo_n++;
    return (const uint32_t *)(m->pool + e.out_off);
}

/* Walks trie node t at depth d with stacks S (S->popped: the context was left exactly at depth d);
 * unc: the context was left earlier with bytes to go on some path; loop: S's loop class when known
 * (children on those bytes keep S without stepping). */
static void cache_dfs_l(ms_grammar_matcher *m, int32_t t, int d, nset *S, int unc, const uint32_t *loop);
static void cache_dfs(ms_grammar_matcher *m, int32_t t, int d, nset *S, int unc) { cache_dfs_l(m, t, d, S, unc, NULL); }

static void cache_dfs_l(ms_grammar_matcher *m, int32_t t, int d, nset *S, int unc, const uint32_t *loop) {
    const ms_grammar_vocab *v = m->g->vocab;
    const vtrie_node *tn = &v->nodes[t];
    if (tn->end_hi > tn->lo) {
        if (S->n || S->popped) {
            for (int k = tn->lo; k < tn->end_hi; k++) { int32_t id = v->sorted[k]; m->b_acc[id >> 5] |= 1u << (id & 31); }
        } else if (unc) {
            b_unc_add_range(m, tn->lo, tn->end_hi);
        }
    }
    int unc_next = unc || (S->popped && !m->b_complete);
    nset *out = &m->lvl[d + 1];
    uint64_t base = set_hash_base(S);
    for (int32_t c = tn->first_child; c >= 0; c = v->nodes[c].next_sibling) {
        unsigned byte = v->nodes[c].byte;
        if (loop && gset_has(loop, byte)) { /* same stacks one byte on: S->popped is unchanged too */
            cache_dfs_l(m, c, d + 1, S, unc_next, loop);
            continue;
        }
        step_memo(m, S, base, byte, out);
        if (out->n == 0 && !out->popped) {
            if (unc_next) b_unc_add_range(m, v->nodes[c].lo, v->nodes[c].hi);
            continue;
        }
        if (!loop && nset_equal(out, S) && S->n) {
            loop = loop_class(m, S, out);
            if (loop) { cache_dfs_l(m, c, d + 1, S, unc_next, loop); continue; }
            step_memo(m, S, base, byte, out); /* out was the scratch of loop_class */
        }
        cache_dfs_l(m, c, d + 1, out, unc_next, NULL);
        out = &m->lvl[d + 1]; /* (the recursion used deeper levels only) */
    }
}

static uint64_t key_hash(const int32_t *key, int klen, int complete) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(klen * 2 + complete);
    for (int i = 0; i < klen; i++) h = (h ^ (uint32_t)key[i]) * 1099511628211ull;
    return h;
}

static gcache_entry *cache_find(ms_grammar *g, uint64_t h, const int32_t *key, int klen) {
    for (gcache_entry *e = g->buckets[h & (uint64_t)(g->n_buckets - 1)]; e; e = e->next)
        if (e->key_hash == h && e->klen == klen && !memcmp(e->key, key, (size_t)klen * sizeof *key)) return e;
    return NULL;
}

/* The cache entry of the context of stack `id` (computed and inserted when new); NULL when out of
 * memory. klen counts positions, negative when the whole stack fits (then the bottom is the real
 * end of the grammar). */
static gcache_entry *context_entry(ms_grammar_matcher *m, int32_t id) {
    ms_grammar *g = m->g;
    int32_t key[CTX_K + 1];
    int klen = 0;
    int32_t n = id;
    while (n != 0 && klen < CTX_K) { key[klen++] = m->a.pos[n]; n = m->a.par[n]; }
    int complete = n == 0;
    key[klen] = complete;
    uint64_t h = key_hash(key, klen + 1, complete);
    pthread_mutex_lock(&g->mu);
    gcache_entry *e = cache_find(g, h, key, klen + 1);
    pthread_mutex_unlock(&g->mu);
    if (e) return e;
    /* compute: rebuild the context alone in the scratch arena and walk the trie */
    e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->acc = calloc((size_t)m->words, sizeof *e->acc);
    if (!e->acc) { free(e); return NULL; }
    if (arena_reset(&m->tmp)) { free(e->acc); free(e); return NULL; }
    if (!m->memo) {
        m->memo_cap = 1 << 16;
        m->memo = calloc((size_t)m->memo_cap, sizeof *m->memo);
        if (!m->memo) { free(e->acc); free(e); return NULL; }
    } else {
        memset(m->memo, 0, (size_t)m->memo_cap * sizeof *m->memo);
    }
    m->memo_n = 0;
    m->pool_n = 0;
    int32_t top = 0;
    for (int i = klen - 1; i >= 0; i--) top = intern(&m->tmp, key[i], top);
    m->b_acc = e->acc;
    m->b_n_unc = 0;
    m->b_complete = complete;
    m->oom = 0;
    nset *S = &m->lvl[0];
    S->n = 0;
    S->popped = 0;
    nset_push(S, top);
    cache_dfs(m, 0, 0, S, 0);
    m->b_acc = NULL;
    if (m->oom || m->tmp.overflow) { entry_free(e); m->tmp.overflow = 0; return NULL; }
    e->n_unc = m->b_n_unc;
    if (e->n_unc) {
        e->unc = malloc((size_t)e->n_unc * sizeof *e->unc);
        if (!e->unc) { entry_free(e); return NULL; }
        memcpy(e->unc, m->b_unc, (size_t)e->n_unc * sizeof *e->unc);
    }
    /* a set of fewer tokens than the bitmap has words is kept as a list (most contexts inside a
     * number, a key or a literal allow a handful of tokens): 4 bytes a token instead of V / 8 */
    int n_acc = 0;
    for (int w = 0; w < m->words; w++) n_acc += __builtin_popcount(e->acc[w]);
    if (n_acc < m->words) {
        e->acc_ids = malloc((size_t)(n_acc ? n_acc : 1) * sizeof *e->acc_ids);
        if (!e->acc_ids) { entry_free(e); return NULL; }
        for (int w = 0, k = 0; w < m->words; w++)
            for (uint32_t x = e->acc[w]; x; x &= x - 1) e->acc_ids[k++] = w * 32 + __builtin_ctz(x);
        e->n_acc_ids = n_acc;
        free(e->acc);
        e->acc = NULL;
    }
    size_t bytes = sizeof *e + (e->acc ? (size_t)m->words * sizeof(uint32_t) : (size_t)e->n_acc_ids * sizeof(int32_t)) +
                   (size_t)e->n_unc * sizeof(int32_t);
    e->key_hash = h;
    e->klen = klen + 1;
    memcpy(e->key, key, (size_t)(klen + 1) * sizeof *key);
    pthread_mutex_lock(&g->mu);
    gcache_entry *other = cache_find(g, h, key, klen + 1);
    if (!other && e->acc) {
        /* an equal bitmap already held: share it and count only the entry */
        size_t wb = (size_t)m->words * sizeof(uint32_t);
        uint64_t bh = 1469598103934665603ull;
        for (int w = 0; w < m->words; w++) bh = (bh ^ e->acc[w]) * 1099511628211ull;
        bh |= 1;
        int slot = -1;
        if (g->bm_cap) {
            uint32_t msk = (uint32_t)g->bm_cap - 1;
            for (uint32_t i = (uint32_t)bh & msk;; i = (i + 1) & msk) {
                if (!g->bm[i].h) { slot = (int)i; break; }
                if (g->bm[i].h == bh && !memcmp(g->bm[i].bits, e->acc, wb)) {
                    free(e->acc);
                    e->acc = g->bm[i].bits;
                    e->acc_shared = 1;
                    bytes -= wb;
                    break;
                }
            }
        }
        if (!e->acc_shared && g->cache_bytes + bytes <= CACHE_BUDGET_BYTES) {
            if ((g->bm_n + 1) * 2 > g->bm_cap) { /* grow (and rehash) the table */
                int cap = g->bm_cap ? 2 * g->bm_cap : 64;
                struct gbitmap *nb = calloc((size_t)cap, sizeof *nb);
                if (nb) {
                    for (int i = 0; i < g->bm_cap; i++)
                        if (g->bm[i].h) {
                            uint32_t j = (uint32_t)g->bm[i].h & (uint32_t)(cap - 1);
                            while (nb[j].h) j = (j + 1) & (uint32_t)(cap - 1);
                            nb[j] = g->bm[i];
                        }
                    free(g->bm);
                    g->bm = nb;
                    g->bm_cap = cap;
                    uint32_t j = (uint32_t)bh & (uint32_t)(cap - 1);
                    while (g->bm[j].h) j = (j + 1) & (uint32_t)(cap - 1);
                    slot = (int)j;
                } else {
                    slot = -1;
                }
            }
            if (slot >= 0) {
                g->bm[slot].h = bh;
                g->bm[slot].bits = e->acc;
                g->bm_n++;
                e->acc_shared = 1;
            }
        }
    }
    if (other || g->cache_bytes + bytes > CACHE_BUDGET_BYTES) {
        pthread_mutex_unlock(&g->mu);
        if (other) { entry_free(e); return other; }
        return e; /* not shared: the caller frees it (see fill_mask) */
    }
    size_t b = h & (uint64_t)(g->n_buckets - 1);
    e->cached = 1;
    e->next = g->buckets[b];
    g->buckets[b] = e;
    g->n_entries++;
    g->cache_bytes += bytes;
    pthread_mutex_unlock(&g->mu);
    return e;
}

int ms_grammar_matcher_fill_mask(ms_grammar_matcher *m, uint32_t *mask) {
    int W = m->words;
    memset(mask, 0, (size_t)W * sizeof *mask);
    if (m->cur.n > m->cap_ents) {
        gcache_entry **ne = realloc(m->ents, (size_t)m->cur.n * sizeof *ne);
        if (!ne) return 0;
        m->ents = ne;
        m->cap_ents = m->cur.n;
    }
    for (int i = 0; i < m->cur.n; i++) {
        gcache_entry *e = m->ents[i] = context_entry(m, m->cur.v[i]);
        if (!e) continue;
        if (e->acc) {
            const uint32_t *acc = e->acc;
            for (int w = 0; w < W; w++) mask[w] |= acc[w];
        } else {
            for (int k = 0; k < e->n_acc_ids; k++) { int32_t id = e->acc_ids[k]; mask[id >> 5] |= 1u << (id & 31); }
        }
    }
    /* the uncertain tokens, against the real stack they came from */
    nset one = {0};
    int32_t single;
    one.v = &single;
    one.n = one.cap = 1;
    for (int i = 0; i < m->cur.n; i++) {
        gcache_entry *e = m->ents[i];
        if (!e) continue;
        single = m->cur.v[i];
        for (int k = 0; k < e->n_unc; k++) {
            int32_t id = e->unc[k];
            if ((mask[id >> 5] >> (id & 31)) & 1u) continue;
            size_t len;
            const char *s = ms_grammar_vocab_token(m->g->vocab, id, &len);
            if (run_bytes(m, &m->a, &one, (const unsigned char *)s, len, NULL)) mask[id >> 5] |= 1u << (id & 31);
        }
    }
    for (int i = 0; i < m->cur.n; i++) {
        gcache_entry *e = m->ents[i];
        if (e && !e->cached) entry_free(e);
    }
    int n = 0;
    for (int w = 0; w < W; w++) n += __builtin_popcount(mask[w]);
    return n;
}

/* ---- precomputation ---- */

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The stack id with everything below its top PRE_DEPTH positions cut off (id itself when shallower):
 * the walk's state space becomes finite under recursion, and the top CTX_K positions, all that a
 * cache key holds, are unchanged. Popping below the cut ends the walk there (an early "end" that at
 * worst adds a context no real stack has). -1 when out of memory. */
#define PRE_DEPTH (2 * CTX_K)
static int32_t truncate_stack(ms_grammar_matcher *m, int32_t id) {
    int32_t pos[PRE_DEPTH];
    int d = 0;
    int32_t n = id;
    while (n != 0 && d < PRE_DEPTH) { pos[d++] = m->a.pos[n]; n = m->a.par[n]; }
    if (n == 0) return id;
    int32_t top = 0;
    for (int i = d - 1; i >= 0; i--) {
        top = intern(&m->a, pos[i], top);
        if (top < 0) return -1;
    }
    return top;
}

int ms_grammar_precompute(ms_grammar *g, int max_stacks, double max_seconds, ms_grammar_precompute_stats *st) {
    ms_grammar_precompute_stats local = {0};
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    int expected = 0;
    if (!atomic_compare_exchange_strong((_Atomic int *)&g->precomputed, &expected, 1)) return 0;
    double t0 = mono_now();
    ms_grammar_matcher *m = ms_grammar_matcher_new(g);
    if (!m) return -1;
    /* Breadth first over single parse stacks: every byte a stack's top class holds leads to the same
     * successor set (expand past the class), so the graph has one edge set per stack. Stacks are cut
     * to their top PRE_DEPTH positions (truncate_stack), so that recursion cannot make the walk
     * infinite. It still stops at max_stacks, max_seconds or the cache budget, nearest contexts first;
     * what is left is computed on first use as before. */
    int32_t *queue = NULL;
    uint8_t *seen = NULL;
    size_t qcap = 0, scap = 0, qh = 0, qt = 0;
    int rc = 0;
    nset out = {0};
    for (int i = 0; i < m->cur.n; i++) {
        int32_t id = m->cur.v[i];
        if ((size_t)id >= scap) {
            size_t nc = scap ? scap : 1024;
            while (nc <= (size_t)id) nc *= 2;
            uint8_t *ns = realloc(seen, nc);
            if (!ns) { rc = -1; goto done; }
            memset(ns + scap, 0, nc - scap);
            seen = ns, scap = nc;
        }
        if (seen[id]) continue;
        seen[id] = 1;
        if (qt == qcap) {
            size_t nc = qcap ? 2 * qcap : 1024;
            int32_t *nq = realloc(queue, nc * sizeof *nq);
            if (!nq) { rc = -1; goto done; }
            queue = nq, qcap = nc;
        }
        queue[qt++] = id;
    }
    int before = g->n_entries;
    while (qh < qt && st->stacks < max_stacks) {
        if ((st->stacks & 15) == 0 && mono_now() - t0 > max_seconds) { st->truncated = 1; break; }
        int32_t id = queue[qh++];
        st->stacks++;
        gcache_entry *e = context_entry(m, id);
        if (!e) { rc = -1; break; }
        if (!e->cached) { entry_free(e); st->truncated = 1; break; } /* the cache budget is spent */
        /* half the budget at most: the rest stays for the contexts real requests meet beyond it */
        if (g->cache_bytes > CACHE_BUDGET_BYTES / 2) { st->truncated = 1; break; }
        int32_t pos = m->a.pos[id];
        m->a.gen++;
        out.n = 0;
        out.popped = 0;
        expand(g, &m->a, pos + 1, m->a.par[id], &out, 0);
        if (m->a.overflow) { m->a.overflow = 0; continue; }
        for (int i = 0; i < out.n; i++) {
            int32_t nid = truncate_stack(m, out.v[i]);
            if (nid < 0) { rc = -1; goto done; }
            if ((size_t)nid >= scap) {
                size_t nc = scap;
                while (nc <= (size_t)nid) nc *= 2;
                uint8_t *ns = realloc(seen, nc);
                if (!ns) { rc = -1; goto done; }
                memset(ns + scap, 0, nc - scap);
                seen = ns, scap = nc;
            }
            if (seen[nid]) continue;
            seen[nid] = 1;
            if (qt == qcap) {
                int32_t *nq = realloc(queue, 2 * qcap * sizeof *nq);
                if (!nq) { rc = -1; goto done; }
                queue = nq, qcap *= 2;
            }
            queue[qt++] = nid;
        }
    }
    if (qh < qt) st->truncated = 1;
    st->contexts = g->n_entries - before;
done:
    st->seconds = mono_now() - t0;
    free(out.v);
    free(queue);
    free(seen);
    ms_grammar_matcher_free(m);
    return rc;
}
