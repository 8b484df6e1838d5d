/* cmd_bench_grammar.c - `moeserve bench-grammar --model DIR [--repeat N]`: the time of one token mask
 * per decoding step, on one CPU core, for JSON-schema grammars over the model's vocabulary.
 *
 * Each case replays a valid document for its schema, tokenized by the real tokenizer: per token the
 * mask is computed (timed) and must allow the next token, which is then accepted. The first pass
 * over a fresh grammar also fills its context cache (reported as "cold"); later passes measure the
 * steady state a server sees once a schema has been used ("warm"). Prints median and p99.
 *
 * As the server does, each grammar is precomputed right after compilation (ms_grammar_precompute,
 * timed and reported apart: the server runs it on the HTTP worker at admission, not on the engine
 * thread); --no-precompute measures the lazy path alone. */
#include "common/args.h"
#include "common/model_path.h"
#include "core/fileutil.h"
#include "core/status.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *schema, *doc;
} CASES[] = {
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},\"email\":{\"type\":\"string\"}},"
     "\"required\":[\"name\",\"age\",\"email\"],\"additionalProperties\":false}",
     "{\"name\": \"Ada Lovelace, Countess of Lovelace\", \"age\": 36, \"email\": \"ada@example.com\"}"},
    {"{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\",\"description\":\"City and country\"},"
     "\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14}},"
     "\"required\":[\"location\",\"unit\"]}",
     "{\"location\": \"San Francisco, CA, United States of America\", \"unit\": \"celsius\", \"days\": 7}"},
    {"{\"type\":\"object\",\"properties\":{\"items\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":"
     "{\"sku\":{\"type\":\"string\"},\"qty\":{\"type\":\"integer\"},\"price\":{\"type\":\"number\"},\"tags\":{\"type\":\"array\","
     "\"items\":{\"type\":\"string\"}}},\"required\":[\"sku\",\"qty\",\"price\"]}},\"note\":{\"anyOf\":[{\"type\":\"string\"},"
     "{\"type\":\"null\"}]}},\"required\":[\"items\",\"note\"]}",
     "{\"items\": [{\"sku\": \"A-1001\", \"qty\": 2, \"price\": 19.99, \"tags\": [\"red\", \"sale\"]}, {\"sku\": \"B-2002\", "
     "\"qty\": 10, \"price\": 3.5}], \"note\": \"Leave the parcel at the door; the bell does not work.\"}"},
    {NULL, "{\"answer\": \"The quick brown fox jumps over the lazy dog.\", \"confidence\": 0.93, \"sources\": [\"a\", \"b\"], "
           "\"nested\": {\"ok\": true, \"n\": null}}"},
};

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *t, int n) {
    if (!n) return;
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    int p99 = (int)(0.99 * (n - 1) + 0.5);
    printf("%-5s mask: %d steps, median %.1f us, p99 %.1f us, max %.1f us\n", what, n, t[n / 2] * 1e6, t[p99] * 1e6,
           t[n - 1] * 1e6);
}

static const ms_opt bench_grammar_opts[] = {
    {"model", "model-path", MS_OPT_VALUE, "DIR|ORG/NAME", "tokenizer directory (tokenizer.json) or Hugging Face repo id"},
    {"repeat", NULL, MS_OPT_VALUE, "N", "warm passes over each case [5]"},
    {"cases", NULL, MS_OPT_VALUE, "FILE", "JSON lines {\"schema\": ..., \"doc\": \"...\"} to replay instead of the built-in cases "
                                          "(MS_CORPUS_DUMP of tests/e2e/test_schema_corpus.mjs writes them)"},
    {"no-precompute", NULL, MS_OPT_BOOL, NULL, "skip the admission-time precomputation (every context computed on first use)"},
    MS_OPT_END,
};

static const ms_cmd bench_grammar_cmd = {
    "bench-grammar", "--model DIR [--repeat N]",
    "The time of one structured-output token mask per decoding step, on one CPU core, for JSON-schema\n"
    "grammars over the model's vocabulary (cold and warm; median and p99).",
    {bench_grammar_opts, NULL},
};

int cmd_bench_grammar(int argc, char **argv) {
    ms_args a;
    int prc = ms_args_parse(&a, &bench_grammar_cmd, argc, argv);
    if (prc) return ms_args_exit(prc);
    int bad = 0;
    const char *model = ms_args_str(&a, "model", NULL);
    int reps = (int)ms_args_int(&a, "repeat", 5, &bad);
    int precompute = !ms_args_flag(&a, "no-precompute");
    const char *cf = ms_args_str(&a, "cases", NULL);
    char *cases_file = cf ? strdup(cf) : NULL;
    if (!bad && !model) fprintf(stderr, "moeserve bench-grammar: flag --model DIR is required\n"), bad = 1;
    if (!bad && (reps < 1 || reps > 10000)) fprintf(stderr, "moeserve bench-grammar: flag --repeat: %d is not in [1, 10000]\n", reps), bad = 1;
    char dir[4096];
    if (!bad && ms_model_path_resolve("bench-grammar", "model", model, NULL, MS_NEED_TOKENIZER, dir, sizeof dir)) bad = 1;
    if (bad) {
        ms_args_free(&a);
        return 2;
    }
    model = dir;
    ms_err err = {0};
    ms_tokenizer *tok = NULL;
    if (ms_tokenizer_load(model, &tok, &err) != MS_OK) { fprintf(stderr, "%s\n", err.msg); ms_args_free(&a); return 1; }
    ms_args_free(&a);
    double t0 = ms_now();
    ms_grammar_vocab *v = NULL;
    if (ms_grammar_vocab_from_tokenizer(tok, &v, &err) != MS_OK) { fprintf(stderr, "%s\n", err.msg); return 1; }
    int V = ms_grammar_vocab_size(v);
    printf("vocabulary: %d tokens, trie built in %.0f ms\n", V, (ms_now() - t0) * 1e3);
    uint32_t *mask = malloc((size_t)(V + 31) / 32 * sizeof *mask);
    /* the cases: built in, or JSON lines {"schema", "doc"} */
    size_t ncases = 0, cap = 1 << 23;
    json_t **schemas = NULL;
    char **docs = NULL;
    if (cases_file) {
        FILE *f = fopen(cases_file, "r");
        if (!f) { fprintf(stderr, "moeserve bench-grammar: flag --cases: cannot open %s\n", cases_file); return 1; }
        char *line = NULL;
        size_t lcap = 0, capc = 0;
        for (size_t ln = 1; getline(&line, &lcap, f) > 0; ln++) {
            if (line[0] == '\n') continue;
            json_error_t je;
            json_t *o = json_loads(line, 0, &je);
            const char *doc = json_string_value(json_object_get(o, "doc"));
            if (!o || !doc) { fprintf(stderr, "moeserve bench-grammar: %s line %zu: want {\"schema\", \"doc\"}\n", cases_file, ln); json_decref(o); fclose(f); free(line); return 1; }
            if (ncases == capc) {
                capc = capc ? 2 * capc : 256;
                schemas = realloc(schemas, capc * sizeof *schemas);
                docs = realloc(docs, capc * sizeof *docs);
                if (!schemas || !docs) { fprintf(stderr, "out of memory\n"); return 1; }
            }
            schemas[ncases] = json_incref(json_object_get(o, "schema"));
            docs[ncases++] = strdup(doc);
            json_decref(o);
        }
        free(line);
        fclose(f);
    } else {
        ncases = sizeof CASES / sizeof CASES[0];
        schemas = calloc(ncases, sizeof *schemas);
        docs = calloc(ncases, sizeof *docs);
        for (size_t c = 0; c < ncases; c++) {
            schemas[c] = CASES[c].schema ? json_loads(CASES[c].schema, 0, NULL) : NULL;
            docs[c] = strdup(CASES[c].doc);
        }
    }
    int verbose = !cases_file;
    double *cold = malloc(cap * sizeof *cold), *warm = malloc(cap * sizeof *warm), *pre = calloc(ncases + 1, sizeof *pre);
    int n_cold = 0, n_warm = 0, rc = 0, n_trunc = 0;
    for (size_t c = 0; c < ncases && !rc; c++) {
        json_t *schema = schemas[c];
        ms_grammar *g = NULL;
        t0 = ms_now();
        if (ms_grammar_compile_json_schema(schema, v, &g, &err) != MS_OK) { fprintf(stderr, "case %zu: %s\n", c, err.msg); rc = 1; }
        if (rc) break;
        double tc = ms_now() - t0;
        ms_grammar_precompute_stats ps = {0};
        if (precompute && ms_grammar_precompute(g, MS_GRAMMAR_PRECOMPUTE_STACKS, MS_GRAMMAR_PRECOMPUTE_SECONDS, &ps) != 0) {
            fprintf(stderr, "case %zu: out of memory while precomputing\n", c);
            rc = 1;
            break;
        }
        pre[c] = ps.seconds;
        n_trunc += ps.truncated;
        if (precompute && !verbose && ps.truncated)
            printf("case %zu: precompute stopped by a limit: %d contexts from %d stacks in %.1f ms\n", c, ps.contexts, ps.stacks, ps.seconds * 1e3);
        if (precompute && verbose)
            printf("case %zu: precomputed %d contexts from %d stacks in %.1f ms%s\n", c, ps.contexts, ps.stacks, ps.seconds * 1e3,
                   ps.truncated ? " (stopped by a limit)" : "");
        int32_t *ids = NULL;
        int n = 0;
        if (ms_tokenizer_encode(tok, docs[c], strlen(docs[c]), 0, &ids, &n, &err) != MS_OK) { fprintf(stderr, "%s\n", err.msg); rc = 1; break; }
        double t_first = 0;
        for (int r = 0; r < reps && !rc; r++) {
            ms_grammar_matcher *m = ms_grammar_matcher_new(g);
            for (int i = 0; i < n; i++) {
                double ts = ms_now();
                ms_grammar_matcher_fill_mask(m, mask);
                double dt = ms_now() - ts;
                if (r == 0) { if (n_cold < (int)cap) cold[n_cold++] = dt; t_first += dt; }
                else if (n_warm < (int)cap) warm[n_warm++] = dt;
                if (!((mask[ids[i] >> 5] >> (ids[i] & 31)) & 1) || !ms_grammar_matcher_accept(m, ids[i])) {
                    fprintf(stderr, "case %zu: token %d (step %d) of the document is not allowed by the grammar\n", c, ids[i], i);
                    rc = 1;
                    break;
                }
            }
            if (!rc && !ms_grammar_matcher_can_end(m)) { fprintf(stderr, "case %zu: the document is incomplete for the grammar\n", c); rc = 1; }
            ms_grammar_matcher_free(m);
        }
        if (verbose) printf("case %zu: %d tokens, compile %.1f ms, first pass (fills the cache) %.1f ms\n", c, n, tc * 1e3, t_first * 1e3);
        free(ids);
        ms_grammar_unref(g);
    }
    if (precompute && ncases) {
        qsort(pre, ncases, sizeof *pre, cmp_d);
        printf("%zu cases: precompute median %.1f ms, max %.1f ms, %d stopped by a limit\n", ncases, pre[ncases / 2] * 1e3,
               pre[ncases - 1] * 1e3, n_trunc);
    }
    report("cold", cold, n_cold);
    report("warm", warm, n_warm);
    for (size_t c = 0; c < ncases; c++) { json_decref(schemas[c]); free(docs[c]); }
    free(schemas);
    free(docs);
    free(pre);
    free(cases_file);
    free(cold);
    free(warm);
    free(mask);
    ms_grammar_vocab_free(v);
    ms_tokenizer_free(tok);
    return rc;
}
