/* test_grammar.c - the grammar engine: token masks against a brute-force reference (every token
 * tried one by one on a fresh matcher that replays the history, no trie and no cache) on random
 * states of JSON-schema, regex and GBNF grammars; finished outputs checked by oracles we did not
 * write (jansson parses the JSON, Oniguruma - the regex engine Hugging Face tokenizers use - matches
 * the regex outputs in full); and
 * compile errors naming the keyword. */
#include "grammar/grammar.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <oniguruma.h>
#include <stdint.h>

static uint64_t rs = 12345;
static uint32_t rnd(void) {
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return (uint32_t)(rs >> 11);
}

/* A small vocabulary: every printable ASCII byte, newline, a split multi-byte character, JSON-ish
 * fragments and random short strings. Token 0 is excluded (a "special" token). */
static ms_grammar_vocab *make_vocab(int *V) {
    static const char *frag[] = {"{\"", "\":", "\": ", ", \"", "\"}", "\"]", "}]", "]}", "true", "false", "null", "[\"",
                                 "\", \"", ", ", "12", "-3", ".5", "e1", "abc", "\\\"", "\\n", "\\u00", "é", "\xc3", "\xa9",
                                 "日本", "\"\"", "{}", "[]", "0.", "00", "\"a\"", "id", "name", "\": \"", "\"name\": \""};
    int nf = (int)(sizeof frag / sizeof frag[0]);
    int n = 1 + 96 + nf + 200;
    char **b = calloc((size_t)n, sizeof *b);
    size_t *l = calloc((size_t)n, sizeof *l);
    uint8_t *ex = calloc((size_t)n, 1);
    int k = 0;
    b[k] = strdup("<|endoftext|>"); l[k] = strlen(b[k]); ex[k++] = 1;
    for (int c = 0x20; c < 0x7f; c++) { b[k] = malloc(2); b[k][0] = (char)c; b[k][1] = 0; l[k++] = 1; }
    b[k] = strdup("\n"); l[k++] = 1;
    for (int i = 0; i < nf; i++) { b[k] = strdup(frag[i]); l[k] = strlen(frag[i]); k++; }
    static const char alpha[] = "ab\"{}[],: 01-.e\\xyzT@";
    while (k < n) {
        int len = 2 + (int)(rnd() % 5);
        b[k] = malloc((size_t)len + 1);
        for (int i = 0; i < len; i++) b[k][i] = alpha[rnd() % (sizeof alpha - 1)];
        b[k][len] = 0;
        l[k++] = (size_t)len;
    }
    ms_grammar_vocab *v = NULL;
    ms_err err = {0};
    int rc = ms_grammar_vocab_new(n, (const char *const *)b, l, ex, &v, &err);
    CHECK_MSG(rc == MS_OK, "%s", err.msg);
    for (int i = 0; i < n; i++) free(b[i]);
    free(b); free(l); free(ex);
    *V = n;
    return v;
}

/* Token allowed after history? (brute force: replay on a fresh matcher) */
static int ref_allowed(ms_grammar *g, const int32_t *hist, int nh, int32_t tok) {
    ms_grammar_matcher *m = ms_grammar_matcher_new(g);
    for (int i = 0; i < nh; i++) ms_grammar_matcher_accept(m, hist[i]);
    int ok = ms_grammar_matcher_accept(m, tok);
    ms_grammar_matcher_free(m);
    return ok;
}

typedef int (*check_fn)(const char *text, const void *arg);

/* Random walks over g: at every step the mask equals the reference; a finished output passes chk. */
static void walk(ms_grammar *g, const ms_grammar_vocab *v, int V, int walks, int max_steps, check_fn chk, const void *arg,
                 const char *what) {
    uint32_t *mask = calloc((size_t)(V + 31) / 32, sizeof *mask);
    int32_t hist[512];
    int finished = 0, mismatches = 0;
    for (int w = 0; w < walks; w++) {
        ms_grammar_matcher *m = ms_grammar_matcher_new(g);
        CHECK(m != NULL);
        if (!m) break;
        char text[8192];
        size_t tl = 0;
        int nh = 0;
        for (int s = 0; s < max_steps; s++) {
            int n = ms_grammar_matcher_fill_mask(m, mask);
            int cnt = 0;
            for (int t = 0; t < V; t++) {
                int got = (mask[t >> 5] >> (t & 31)) & 1, want = ref_allowed(g, hist, nh, t);
                if (got != want && mismatches++ < 5)
                    fprintf(stderr, "  %s: mask mismatch at step %d token %d '%s': got %d want %d (text '%.*s')\n", what, s, t,
                            ms_grammar_vocab_token(v, t, &(size_t){0}) ? ms_grammar_vocab_token(v, t, &(size_t){0}) : "",
                            got, want, (int)tl, text);
                cnt += got;
            }
            CHECK_EQ_INT(cnt, n);
            int can_end = ms_grammar_matcher_can_end(m);
            if (ms_grammar_matcher_done(m) || (can_end && rnd() % 4 == 0) || n == 0) break;
            int pick = (int)(rnd() % (uint32_t)n), t = 0;
            for (t = 0; t < V; t++)
                if (((mask[t >> 5] >> (t & 31)) & 1) && pick-- == 0) break;
            size_t len;
            const char *b = ms_grammar_vocab_token(v, t, &len);
            CHECK(ms_grammar_matcher_accept(m, t) == 1);
            if (tl + len < sizeof text) { memcpy(text + tl, b, len); tl += len; }
            hist[nh++] = t;
        }
        text[tl] = 0;
        if (ms_grammar_matcher_can_end(m)) {
            finished++;
            int ok = chk ? chk(text, arg) : 1;
            CHECK_MSG(ok, "%s: finished output rejected by the oracle: '%s'", what, text);
        }
        ms_grammar_matcher_free(m);
    }
    CHECK_MSG(mismatches == 0, "%s: %d mask mismatches", what, mismatches);
    CHECK_MSG(finished > 0, "%s: no walk finished", what);
    free(mask);
}

/* ---- oracles ---- */

static int is_json(const char *text, const void *arg) {
    json_error_t e;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &e);
    int ok = j != NULL;
    const char *const *req = arg;
    for (int i = 0; ok && req && req[i]; i++) ok = json_object_get(j, req[i]) != NULL;
    json_decref(j);
    return ok;
}

static int posix_match(const char *text, const void *arg) {
    const char *pat = arg;
    regex_t *re = NULL;
    OnigErrorInfo ei;
    OnigEncoding enc = ONIG_ENCODING_UTF8;
    onig_initialize(&enc, 1);
    if (onig_new(&re, (const UChar *)pat, (const UChar *)pat + strlen(pat), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                 ONIG_SYNTAX_PERL, &ei) != ONIG_NORMAL) return 0;
    const UChar *s = (const UChar *)text, *e = s + strlen(text);
    int n = onig_match(re, s, e, s, NULL, ONIG_OPTION_NONE);
    onig_free(re);
    return n == (int)(e - s);
}

static ms_grammar_vocab *VOC;
static int NV;
static void expect_error(const char *schema, const char *needle);
#define expect_error_fwd expect_error

static ms_grammar *schema_grammar(const char *schema) {
    json_error_t je;
    json_t *s = json_loads(schema, 0, &je);
    CHECK_MSG(s != NULL, "bad test schema: %s", je.text);
    ms_grammar *g = NULL;
    ms_err err = {0};
    int rc = ms_grammar_compile_json_schema(s, VOC, &g, &err);
    CHECK_MSG(rc == MS_OK, "%s", err.msg);
    json_decref(s);
    return g;
}

static void test_json_schemas(void) {
    static const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},\"required\":[\"name\",\"age\"]}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"},\"c\":{\"enum\":[\"x\",1,null]}},\"required\":[\"c\"]}",
        "{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":1,\"maxItems\":3}",
        "{\"anyOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":\"integer\",\"minimum\":-5,\"maximum\":120}]}",
        "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},\"maxItems\":2}},\"required\":[\"id\"]}},\"$ref\":\"#/$defs/n\"}",
        "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}",
        "{\"type\":\"string\",\"pattern\":\"^[a-c]{2}-[0-9]+$\"}",
        "{\"const\":{\"k\":[1,2]}}",
    };
    static const char *req0[] = {"name", "age", NULL}, *req1[] = {"c", NULL}, *req4[] = {"id", NULL};
    const void *reqs[] = {req0, req1, NULL, NULL, req4, NULL, NULL, NULL};
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        /* twice: contexts computed on first use, then precomputed as the server does at admission
         * (the masks must not depend on which) */
        for (int pre = 0; pre < 2; pre++) {
            ms_grammar *g = schema_grammar(schemas[i]);
            if (!g) continue;
            if (pre) {
                ms_grammar_precompute_stats st;
                CHECK(ms_grammar_precompute(g, 5000, 60.0, &st) == 0);
                CHECK(st.contexts > 0 && st.stacks >= st.contexts);
                CHECK(ms_grammar_precompute(g, 5000, 60.0, &st) == 0 && st.stacks == 0); /* once per grammar */
            }
            walk(g, VOC, NV, 12, 40, is_json, reqs[i], schemas[i]);
            ms_grammar_unref(g);
        }
    }
    /* json_object: any object */
    ms_grammar *g = NULL;
    ms_err err = {0};
    CHECK(ms_grammar_compile_json_schema(NULL, VOC, &g, &err) == MS_OK);
    if (g) { walk(g, VOC, NV, 12, 40, is_json, NULL, "json_object"); ms_grammar_unref(g); }
}

static void test_integer_ranges(void) {
    /* every integer in a range, and nothing else, is a full sentence */
    static const long long rg[][2] = {{-5, 120}, {0, 0}, {7, 7}, {-30, -4}, {95, 1003}};
    for (size_t r = 0; r < sizeof rg / sizeof rg[0]; r++) {
        char sch[200];
        snprintf(sch, sizeof sch, "{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}", rg[r][0], rg[r][1]);
        ms_grammar *g = schema_grammar(sch);
        if (!g) continue;
        int bad = 0;
        for (long long x = -1100; x <= 1100; x++) {
            char s[32];
            snprintf(s, sizeof s, "%lld", x);
            ms_grammar_matcher *m = ms_grammar_matcher_new(g);
            int ok = 1;
            for (char *p = s; *p && ok; p++) ok = ms_grammar_matcher_accept(m, (unsigned char)*p - 0x20 + 1);
            int in = ok && ms_grammar_matcher_can_end(m);
            if (in != (x >= rg[r][0] && x <= rg[r][1])) bad++;
            ms_grammar_matcher_free(m);
        }
        CHECK_MSG(bad == 0, "%s: %d integers misclassified", sch, bad);
        ms_grammar_unref(g);
    }
}

static int accepts_text(ms_grammar *g, const char *s) {
    ms_grammar_matcher *m = ms_grammar_matcher_new(g);
    int ok = 1;
    for (const char *p = s; *p && ok; p++) ok = ms_grammar_matcher_accept(m, (unsigned char)*p - 0x20 + 1);
    ok = ok && ms_grammar_matcher_can_end(m);
    ms_grammar_matcher_free(m);
    return ok;
}

/* type number with bounds: every accepted text (integers and one- and two-decimal fractions over
 * [-13, 13], plus 15-decimal ones next to each bound) parses to a double inside the bounds, and
 * fractions strictly inside are offered where the interval has room for them */
static void test_number_bounds(void) {
    static const struct { const char *kw; double lo, hi; int lox, hix; } rg[] = {
        {"\"minimum\":0.5,\"maximum\":3", 0.5, 3, 0, 0},
        {"\"exclusiveMinimum\":0,\"exclusiveMaximum\":1", 0, 1, 1, 1},
        {"\"minimum\":-2.5,\"exclusiveMaximum\":-1", -2.5, -1, 0, 1},
        {"\"exclusiveMinimum\":-3,\"maximum\":0", -3, 0, 1, 0},
        {"\"minimum\":-10,\"maximum\":10", -10, 10, 0, 0},
        {"\"exclusiveMinimum\":-1,\"exclusiveMaximum\":0", -1, 0, 1, 1},
        {"\"minimum\":0,\"maximum\":1", 0, 1, 0, 0},
        {"\"exclusiveMinimum\":2", 2, INFINITY, 1, 0},
    };
    for (size_t r = 0; r < sizeof rg / sizeof rg[0]; r++) {
        char sch[200];
        snprintf(sch, sizeof sch, "{\"type\":\"number\",%s}", rg[r].kw);
        ms_grammar *g = schema_grammar(sch);
        if (!g) continue;
        int bad = 0, frac_in = 0;
        char s[64];
        for (int x = -1300; x <= 1300; x++) {
            for (int form = 0; form < 4; form++) {
                if (form == 0 && x % 100) continue;
                if (form == 0) snprintf(s, sizeof s, "%d", x / 100);
                else if (form == 1) { if (x % 10) continue; snprintf(s, sizeof s, "%s%d.%d", x < 0 ? "-" : "", abs(x) / 100, abs(x) / 10 % 10); }
                else if (form == 2) snprintf(s, sizeof s, "%s%d.%02d", x < 0 ? "-" : "", abs(x) / 100, abs(x) % 100);
                else { if (x % 100) continue; snprintf(s, sizeof s, "%s%d.000000001", x < 0 ? "-" : "", abs(x) / 100); }
                double d = strtod(s, NULL);
                int in = (rg[r].lox ? d > rg[r].lo : d >= rg[r].lo) && (rg[r].hix ? d < rg[r].hi : d <= rg[r].hi);
                int ok = accepts_text(g, s);
                if (ok && !in) { if (bad++ < 3) fprintf(stderr, "  %s accepts %s\n", sch, s); }
                if (ok && form && d != floor(d)) frac_in++;
            }
        }
        /* a near-bound literal with 9 decimals, both signs */
        CHECK_MSG(bad == 0, "%s: %d out-of-range numbers accepted", sch, bad);
        CHECK_MSG(frac_in > 0, "%s: no fraction accepted", sch);
        ms_grammar_unref(g);
    }
    /* an interval holding no integer and no whole unit interval is refused, naming the bounds */
    expect_error_fwd("{\"type\":\"number\",\"minimum\":0.2,\"maximum\":0.8}", "minimum");
}

static void test_regex(void) {
    static const char *res[] = {"[a-z]+@[a-z]+\\.(com|org)", "(ab|c)*d?", "x{2,4}[0-9]", "[^ab\\n]{1,3}z", "-?[0-9]+(\\.[0-9]+)?"};
    static const char *posix[] = {"[a-z]+@[a-z]+\\.(com|org)", "(ab|c)*d?", "x{2,4}[0-9]", "[^ab\n]{1,3}z", "-?[0-9]+(\\.[0-9]+)?"};
    /* (onig_match is anchored at the start; a full match consumes the whole text) */
    for (size_t i = 0; i < sizeof res / sizeof res[0]; i++) {
        ms_grammar *g = NULL;
        ms_err err = {0};
        int rc = ms_grammar_compile_regex(res[i], VOC, &g, &err);
        CHECK_MSG(rc == MS_OK, "%s: %s", res[i], err.msg);
        if (!g) continue;
        walk(g, VOC, NV, 12, 30, posix_match, posix[i], res[i]);
        ms_grammar_unref(g);
    }
}

static void test_gbnf(void) {
    const char *src =
        "root ::= greeting (\", \" greeting)* \"!\"\n"
        "greeting ::= (\"hi\" | \"hello\") \" \" name  # comment\n"
        "name ::= [A-Z] [a-z]{1,5}\n";
    ms_grammar *g = NULL;
    ms_err err = {0};
    int rc = ms_grammar_compile_gbnf(src, VOC, &g, &err);
    CHECK_MSG(rc == MS_OK, "%s", err.msg);
    if (g) {
        walk(g, VOC, NV, 12, 30, posix_match, "(hi|hello) [A-Z][a-z]{1,5}(, (hi|hello) [A-Z][a-z]{1,5})*!", "gbnf");
        ms_grammar_unref(g);
    }
    /* non-ASCII: a negated class takes whole UTF-8 characters, split tokens included */
    rc = ms_grammar_compile_gbnf("root ::= \"<\" [^>]{0,3} \">\"\n", VOC, &g, &err);
    CHECK_MSG(rc == MS_OK, "%s", err.msg);
    if (g) { walk(g, VOC, NV, 10, 20, NULL, NULL, "gbnf-negated"); ms_grammar_unref(g); }
}

static void test_free_prefix(void) {
    ms_grammar *g = NULL;
    ms_err err = {0};
    CHECK(ms_grammar_compile_regex("ab", VOC, &g, &err) == MS_OK);
    if (!g) return;
    ms_grammar_matcher *m = ms_grammar_matcher_new(g);
    int32_t think_end = 5; /* any id */
    ms_grammar_matcher_set_free_until(m, think_end);
    CHECK(!ms_grammar_matcher_active(m));
    CHECK(ms_grammar_matcher_accept(m, 40));
    CHECK(ms_grammar_matcher_accept(m, think_end));
    CHECK(ms_grammar_matcher_active(m));
    CHECK(!ms_grammar_matcher_accept(m, 'x' - 0x20 + 1));
    CHECK(ms_grammar_matcher_accept(m, 'a' - 0x20 + 1));
    CHECK(ms_grammar_matcher_accept(m, 'b' - 0x20 + 1));
    CHECK(ms_grammar_matcher_done(m));
    ms_grammar_matcher_free(m);
    ms_grammar_unref(g);
}

static void expect_error(const char *schema, const char *needle) {
    json_error_t je;
    json_t *s = json_loads(schema, 0, &je);
    ms_grammar *g = NULL;
    ms_err err = {0};
    int rc = ms_grammar_compile_json_schema(s, VOC, &g, &err);
    CHECK_MSG(rc != MS_OK && strstr(err.msg, needle), "%s: rc %d, message '%s' lacks '%s'", schema, rc, err.msg, needle);
    ms_grammar_unref(g);
    json_decref(s);
}

static void test_errors(void) {
    expect_error("{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems");
    expect_error("{\"not\":{\"type\":\"string\"}}", "'not'");
    expect_error("{\"type\":\"number\",\"multipleOf\":3}", "multipleOf");
    expect_error("{\"type\":\"string\",\"format\":\"hostname\"}", "format");
    expect_error("{\"$ref\":\"#/$defs/missing\"}", "$ref");
    expect_error("{\"type\":\"string\",\"pattern\":\"(?=a)b\"}", "pattern");
    expect_error("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"whatever\"}}}", "#/properties/a");
    ms_grammar *g = NULL;
    ms_err err = {0};
    CHECK(ms_grammar_compile_gbnf("root ::= root \"a\" | \"b\"\n", VOC, &g, &err) != MS_OK && strstr(err.msg, "left-recursive"));
    CHECK(ms_grammar_compile_gbnf("root ::= foo\n", VOC, &g, &err) != MS_OK && strstr(err.msg, "foo"));
    CHECK(ms_grammar_compile_gbnf("start ::= \"a\"\n", VOC, &g, &err) != MS_OK && strstr(err.msg, "root"));
    CHECK(ms_grammar_compile_regex("(a", VOC, &g, &err) != MS_OK);
}

/* oneOf: compiled when the branches are provably exclusive (walked against the reference, outputs
 * parsed), refused naming 'oneOf' when not; sibling keywords beside const/enum/anyOf checked */
static void test_oneof(void) {
    static const char *ok[] = {
        "{\"oneOf\":[{\"type\":\"string\",\"maxLength\":4},{\"type\":\"integer\"},{\"type\":\"null\"}]}",
        "{\"oneOf\":[{\"const\":\"a\"},{\"enum\":[\"b\",\"c\"]}]}",
        "{\"oneOf\":[{\"type\":\"integer\",\"maximum\":0},{\"type\":\"integer\",\"minimum\":1}]}",
        "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"x\"},\"a\":{\"type\":\"integer\"}},\"required\":[\"k\"]},"
        "{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"y\"},\"b\":{\"type\":\"string\"}},\"required\":[\"k\",\"b\"]}]}",
        "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"],\"additionalProperties\":false},"
        "{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"integer\"}},\"required\":[\"b\"],\"additionalProperties\":false}]}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        ms_grammar *g = schema_grammar(ok[i]);
        if (g) { walk(g, VOC, NV, 8, 30, is_json, NULL, ok[i]); ms_grammar_unref(g); }
    }
    expect_error("{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "oneOf");
    expect_error("{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"string\",\"maxLength\":3}]}", "oneOf");
    expect_error("{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}},"
                 "{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"integer\"}}}]}", "oneOf");
    expect_error("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"anyOf\":[{\"required\":[\"a\"]}]}", "properties");
    expect_error("{\"type\":\"string\",\"enum\":[\"x\"],\"pattern\":\"y\"}", "pattern");
    expect_error("{\"type\":\"string\",\"enum\":[1,2]}", "enum");
    expect_error("{\"$ref\":\"#/$defs/a\",\"minimum\":3,\"$defs\":{\"a\":{\"type\":\"integer\"}}}", "minimum");
}

/* The demo model's real byte-level BPE vocabulary (tokens ending inside UTF-8 characters, added
 * tags): masks against the reference and finished outputs parsed by jansson. */
static void test_real_vocab(void) {
    ms_tokenizer *tok = NULL;
    ms_err err = {0};
    if (ms_tokenizer_load("models/demo", &tok, &err) != MS_OK) { fprintf(stderr, "  (models/demo absent: %s)\n", err.msg); return; }
    ms_grammar_vocab *v = NULL;
    CHECK_MSG(ms_grammar_vocab_from_tokenizer(tok, &v, &err) == MS_OK, "%s", err.msg);
    if (v) {
        int V = ms_grammar_vocab_size(v);
        json_t *s = json_loads("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
                               "\"n\":{\"type\":\"integer\",\"minimum\":-20,\"maximum\":300},\"ok\":{\"type\":\"boolean\"},"
                               "\"xs\":{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"maxItems\":3}},\"required\":[\"name\",\"n\"]}", 0, NULL);
        ms_grammar *g = NULL;
        CHECK_MSG(ms_grammar_compile_json_schema(s, v, &g, &err) == MS_OK, "%s", err.msg);
        static const char *req[] = {"name", "n", NULL};
        if (g) { walk(g, v, V, 8, 40, is_json, req, "demo vocabulary"); ms_grammar_unref(g); }
        g = NULL;
        CHECK_MSG(ms_grammar_compile_json_schema(s, v, &g, &err) == MS_OK, "%s", err.msg);
        if (g) {
            ms_grammar_precompute_stats st;
            CHECK(ms_grammar_precompute(g, 20000, 60.0, &st) == 0 && !st.truncated && st.contexts > 0);
            walk(g, v, V, 8, 40, is_json, req, "demo vocabulary, precomputed");
            ms_grammar_unref(g);
        }
        json_decref(s);
        ms_grammar_vocab_free(v);
    }
    ms_tokenizer_free(tok);
}

int main(void) {
    VOC = make_vocab(&NV);
    RUN(test_json_schemas);
    RUN(test_integer_ranges);
    RUN(test_number_bounds);
    RUN(test_oneof);
    RUN(test_regex);
    RUN(test_gbnf);
    RUN(test_free_prefix);
    RUN(test_errors);
    RUN(test_real_vocab);
    ms_grammar_vocab_free(VOC);
    return TEST_SUMMARY();
}
