/* cache.c - compiled grammars kept by their source text, so that requests with the same schema share
 * one grammar and its token cache (the expensive part: a context's first mask walks the whole
 * vocabulary trie). Least recently used entries go first. */
#include "grammar/grammar_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct gc_entry {
    char *key;
    ms_grammar *g;
    uint64_t used;
} gc_entry;

struct ms_grammar_cache {
    pthread_mutex_t mu;
    gc_entry *e;
    int n, cap;
    uint64_t clock;
};

ms_grammar_cache *ms_grammar_cache_new(int cap) {
    ms_grammar_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->cap = cap > 0 ? cap : 1;
    c->e = calloc((size_t)c->cap, sizeof *c->e);
    if (!c->e) { free(c); return NULL; }
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void ms_grammar_cache_free(ms_grammar_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) { free(c->e[i].key); ms_grammar_unref(c->e[i].g); }
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

ms_grammar *ms_grammar_cache_get(ms_grammar_cache *c, const char *key) {
    ms_grammar *g = NULL;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->e[i].key, key)) {
            g = c->e[i].g;
            ms_grammar_ref(g);
            c->e[i].used = ++c->clock;
            break;
        }
    pthread_mutex_unlock(&c->mu);
    return g;
}

void ms_grammar_cache_put(ms_grammar_cache *c, const char *key, ms_grammar *g) {
    char *k = strdup(key);
    if (!k) return;
    pthread_mutex_lock(&c->mu);
    int slot = c->n < c->cap ? c->n++ : -1;
    if (slot < 0) {
        slot = 0;
        for (int i = 1; i < c->n; i++) if (c->e[i].used < c->e[slot].used) slot = i;
        free(c->e[slot].key);
        ms_grammar_unref(c->e[slot].g);
    }
    ms_grammar_ref(g);
    c->e[slot] = (gc_entry){k, g, ++c->clock};
    pthread_mutex_unlock(&c->mu);
}
