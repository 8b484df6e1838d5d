/* vocab.c - the vocabulary a grammar masks: each token's bytes and a byte trie over them.
 *
 * Built once per tokenizer and shared by every grammar. Tokens are sorted by bytes so a trie node's
 * subtree is a contiguous range of the sorted order: pruning a node rejects (or marks) the whole
 * range at once. */
#include "grammar/grammar_internal.h"

#include <stdlib.h>
#include <string.h>

void ms_grammar_vocab_free(ms_grammar_vocab *v) {
    if (!v) return;
    if (v->bytes)
        for (int i = 0; i < v->n; i++) free(v->bytes[i]);
    free(v->bytes);
    free(v->len);
    free(v->excluded);
    free(v->sorted);
    free(v->nodes);
    free(v);
}

int ms_grammar_vocab_size(const ms_grammar_vocab *v) { return v->n; }

const char *ms_grammar_vocab_token(const ms_grammar_vocab *v, int32_t id, size_t *len) {
    if (id < 0 || id >= v->n || v->excluded[id]) { *len = 0; return NULL; }
    *len = v->len[id];
    return v->bytes[id];
}

static const ms_grammar_vocab *sort_v;
static int cmp_tok(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = sort_v->len[x], ly = sort_v->len[y];
    int c = memcmp(sort_v->bytes[x], sort_v->bytes[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

int ms_grammar_vocab_new(int n, const char *const *bytes, const size_t *lens, const uint8_t *excluded,
                         ms_grammar_vocab **out, ms_err *err) {
    *out = NULL;
    if (n < 1) return ms_errf(err, MS_ERR_INVALID, "grammar vocabulary: %d tokens", n);
    ms_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return ms_errf(err, MS_ERR_NOMEM, "grammar vocabulary: out of memory");
    v->n = n;
    v->bytes = calloc((size_t)n, sizeof *v->bytes);
    v->len = calloc((size_t)n, sizeof *v->len);
    v->excluded = calloc((size_t)n, 1);
    v->sorted = malloc((size_t)n * sizeof *v->sorted);
    size_t total = 0;
    if (!v->bytes || !v->len || !v->excluded || !v->sorted) goto nomem;
    for (int i = 0; i < n; i++) {
        size_t l = bytes[i] ? lens[i] : 0;
        v->excluded[i] = (excluded && excluded[i]) || l == 0;
        if (v->excluded[i]) continue;
        v->bytes[i] = malloc(l + 1);
        if (!v->bytes[i]) goto nomem;
        memcpy(v->bytes[i], bytes[i], l);
        v->bytes[i][l] = 0;
        v->len[i] = (uint32_t)l;
        if ((int)l > v->max_len) v->max_len = (int)l;
        v->sorted[v->n_sorted++] = i;
        total += l;
    }
    { /* qsort has no context argument in C11; building is rare, so a lock serializes it */
        static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
        pthread_mutex_lock(&mu);
        sort_v = v;
        qsort(v->sorted, (size_t)v->n_sorted, sizeof *v->sorted, cmp_tok);
        pthread_mutex_unlock(&mu);
    }
    /* trie: at most one node per byte plus the root */
    v->nodes = malloc((total + 1) * sizeof *v->nodes);
    if (!v->nodes) goto nomem;
    v->nodes[0] = (vtrie_node){-1, -1, 0, 0, 0, 0};
    v->n_nodes = 1;
    {
        int32_t *path = malloc(((size_t)v->max_len + 1) * sizeof *path);
        if (!path) goto nomem;
        path[0] = 0;
        int depth = 0; /* path[0..depth] is the previous token's node chain */
        int32_t *last_child = malloc((total + 1) * sizeof *last_child);
        if (!last_child) { free(path); goto nomem; }
        last_child[0] = -1;
        for (int k = 0; k < v->n_sorted; k++) {
            int32_t id = v->sorted[k];
            const unsigned char *s = (const unsigned char *)v->bytes[id];
            int l = (int)v->len[id];
            /* longest prefix shared with the path */
            int d = 0;
            while (d < depth && d < l && v->nodes[path[d + 1]].byte == s[d]) d++;
            for (int j = d; j < l; j++) {
                int32_t parent = path[j], nn = v->n_nodes++;
                v->nodes[nn] = (vtrie_node){-1, -1, k, k, k, s[j]};
                last_child[nn] = -1;
                if (last_child[parent] < 0) v->nodes[parent].first_child = nn;
                else v->nodes[last_child[parent]].next_sibling = nn;
                last_child[parent] = nn;
                path[j + 1] = nn;
            }
            depth = l;
            v->nodes[path[l]].end_hi = k + 1;
            for (int j = 0; j <= l; j++) v->nodes[path[j]].hi = k + 1;
        }
        free(path);
        free(last_child);
    }
    *out = v;
    return MS_OK;
nomem:
    ms_grammar_vocab_free(v);
    return ms_errf(err, MS_ERR_NOMEM, "grammar vocabulary: out of memory for %d tokens", n);
}
