/* test_tokenizer.c - the tokenizer's behaviour on bad input and its internal invariants.
 *
 * Conformance with Hugging Face is tested by test_conformance.mjs; this file covers what an
 * oracle cannot: corrupt or unsupported tokenizer.json files fail with one sentence naming the
 * field (and never crash, also under random corruption), invalid UTF-8 is replaced exactly as
 * WHATWG/Rust do, the streaming detokenizer never emits a broken character and adds up to the
 * full decode, our regex matcher agrees with Oniguruma, and encoding is thread-safe. Runs from
 * the repository root (models/demo holds a real byte-level GLM-style tokenizer). */
#include "test.h"

#include "core/fileutil.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *DEMO = "models/demo";
static char g_tmp[256];

static uint64_t g_rng = 0x1234567;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* A small byte-level tokenizer.json; {PRE}, {MERGES}, ... are replaced by the cases below. */
static const char *BASE =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
    "\"added_tokens\":[{\"id\":6,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true}],"
    "\"normalizer\":@NORM@,"
    "\"pre_tokenizer\":@PRE@,"
    "\"post_processor\":@POST@,"
    "\"decoder\":@DEC@,"
    "\"model\":{\"type\":@TYPE@,\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
    "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,"
    "\"vocab\":@VOCAB@,\"merges\":@MERGES@}}";

static char *subst(const char *tpl, const char *key, const char *val) {
    const char *p = strstr(tpl, key);
    if (!p) return strdup(tpl);
    size_t a = (size_t)(p - tpl), kl = strlen(key), vl = strlen(val), rest = strlen(p + kl);
    char *o = malloc(a + vl + rest + 1);
    memcpy(o, tpl, a);
    memcpy(o + a, val, vl);
    memcpy(o + a + vl, p + kl, rest + 1);
    return o;
}

typedef struct {
    const char *norm, *pre, *post, *dec, *type, *vocab, *merges;
} parts;

static const parts GOOD = {"null", "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}", "null",
                           "{\"type\":\"ByteLevel\"}", "\"BPE\"",
                           "{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"\\u0120\":4,\"\\u0120a\":5}", "[\"a b\",\"\\u0120 a\"]"};

static char *make_json(parts p) {
    const char *keys[] = {"@NORM@", "@PRE@", "@POST@", "@DEC@", "@TYPE@", "@VOCAB@", "@MERGES@"};
    const char *vals[] = {p.norm, p.pre, p.post, p.dec, p.type, p.vocab, p.merges};
    char *cur = strdup(BASE);
    for (int i = 0; i < 7; i++) {
        char *n = subst(cur, keys[i], vals[i]);
        free(cur);
        cur = n;
    }
    return cur;
}

static void write_tok(const char *json, size_t len) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_tmp);
    ms_err err = {0};
    if (ms_write_file(path, json, len, &err)) fprintf(stderr, "write %s: %s\n", path, err.msg);
}

/* Loads `json` from the temp dir; returns the status and fills err. */
static int load_json(const char *json, ms_tokenizer **t, ms_err *err) {
    write_tok(json, strlen(json));
    memset(err, 0, sizeof *err);
    *t = NULL;
    return ms_tokenizer_load(g_tmp, t, err);
}

static int valid_utf8(const char *s, size_t n) { return tk_utf8_valid_prefix((const unsigned char *)s, n) == n; }

static void test_small_tokenizer_works(void) {
    char *j = make_json(GOOD);
    ms_tokenizer *t;
    ms_err err;
    int rc = load_json(j, &t, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (!rc) {
        int32_t *ids;
        int n;
        CHECK(ms_tokenizer_encode(t, "ab a<s>c", 8, 0, &ids, &n, &err) == 0);
        int32_t want[] = {3, 5, 6, 2};
        CHECK_EQ_INT(n, 4);
        for (int i = 0; i < n && i < 4; i++) CHECK_EQ_INT(ids[i], want[i]);
        char *txt;
        size_t tl;
        CHECK(ms_tokenizer_decode(t, ids, n, 0, &txt, &tl, &err) == 0);
        CHECK_STR(txt, "ab a<s>c");
        free(txt);
        CHECK(ms_tokenizer_decode(t, ids, n, 1, &txt, &tl, &err) == 0);
        CHECK_STR(txt, "ab ac");
        free(txt);
        free(ids);
        CHECK_EQ_INT(ms_tokenizer_vocab_size(t), 7);
        CHECK_EQ_INT(ms_tokenizer_token_to_id(t, "<s>"), 6);
        CHECK_EQ_INT(ms_tokenizer_token_to_id(t, "\xC4\xA0" "a"), 5);
        CHECK_EQ_INT(ms_tokenizer_token_to_id(t, "zz"), -1);
        CHECK_STR(ms_tokenizer_id_to_token(t, 3), "ab");
        CHECK(ms_tokenizer_id_to_token(t, 99) == NULL);
        CHECK(ms_tokenizer_is_special(t, 6) && !ms_tokenizer_is_special(t, 3));
        int32_t bad = 99;
        CHECK(ms_tokenizer_decode(t, &bad, 1, 0, &txt, &tl, &err) != 0);
        CHECK_MSG(strstr(err.msg, "99") != NULL, "%s", err.msg);
        ms_tokenizer_free(t);
    }
    free(j);
}

/* Each corrupt or unsupported file fails with a message that names the field. */
static void test_bad_files_name_the_field(void) {
    struct {
        parts p;
        const char *raw; /* whole file instead of parts */
        const char *want;
    } C[] = {
        {GOOD, "hello", "(top level)"},
        {GOOD, "{\"model\": ", "(top level)"},
        {GOOD, "{\"version\":\"1.0\"}", "model"},
        {GOOD, "{\"model\":{\"type\":\"BPE\",\"merges\":[]}}", "model.vocab"},
        {GOOD, "{\"model\":{\"type\":\"BPE\",\"vocab\":{}}}", "model.merges"},
        {GOOD, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}} trailing", "(top level)"},
        {GOOD, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"zero\"},\"merges\":[]}}", "model.vocab"},
        {GOOD, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", "model.vocab"},
        {GOOD, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1.5},\"merges\":[]}}", "model.vocab"},
        {GOOD, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\\ud800\":1},\"merges\":[]}}", "model.vocab"},
        {GOOD, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1},\"merges\":[\"a\"]}}", "model.merges[0]"},
        {GOOD, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1},\"merges\":[\"a a\"]}}", "model.merges[0]"},
        {GOOD, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1,\"aa\":2},\"merges\":[\"a a\",[\"a\"]]}}", "model.merges[1]"},
        {GOOD, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1},\"merges\":[\"a x\"]}}", "model.merges[0]"},
        {GOOD, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1},\"merges\":[], \"fuse_unk\": 3}}", "model.fuse_unk"},
        {GOOD, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1},\"merges\":[], \"dropout\": 0.1}}", "model.dropout"},
        {GOOD, "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", "model.type \"WordPiece\" is not supported (supported: BPE)"},
        {GOOD, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"added_tokens\":[{\"id\":-4,\"content\":\"x\"}]}", "added_tokens[0]"},
        {GOOD, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"added_tokens\":[{\"id\":4}]}", "added_tokens[0]"},
        {{"{\"type\":\"Precompiled\"}", GOOD.pre, GOOD.post, GOOD.dec, GOOD.type, GOOD.vocab, GOOD.merges}, NULL,
         "normalizer.type \"Precompiled\" is not supported"},
        {{"{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"Bogus\"}]}", GOOD.pre, GOOD.post, GOOD.dec, GOOD.type, GOOD.vocab, GOOD.merges}, NULL,
         "normalizer.normalizers[1].type \"Bogus\""},
        {{"{\"type\":\"Replace\",\"pattern\":{\"String\":\"a\"}}", GOOD.pre, GOOD.post, GOOD.dec, GOOD.type, GOOD.vocab, GOOD.merges}, NULL,
         "normalizer.content"},
        {{GOOD.norm, "{\"type\":\"BertPreTokenizer\"}", GOOD.post, GOOD.dec, GOOD.type, GOOD.vocab, GOOD.merges}, NULL,
         "pre_tokenizer.type \"BertPreTokenizer\" is not supported"},
        {{GOOD.norm, "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},\"behavior\":\"Isolated\"}]}", GOOD.post, GOOD.dec, GOOD.type, GOOD.vocab, GOOD.merges}, NULL,
         "pre_tokenizer.pretokenizers[0].pattern: invalid regex"},
        {{GOOD.norm, "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Sideways\"}", GOOD.post, GOOD.dec, GOOD.type, GOOD.vocab, GOOD.merges}, NULL,
         "pre_tokenizer.behavior \"Sideways\""},
        {{GOOD.norm, "{\"type\":\"Split\",\"pattern\":{\"Glob\":\"a\"},\"behavior\":\"Isolated\"}", GOOD.post, GOOD.dec, GOOD.type, GOOD.vocab, GOOD.merges}, NULL,
         "pre_tokenizer.pattern"},
        {{GOOD.norm, "{\"type\":\"Metaspace\",\"replacement\":\"ab\"}", GOOD.post, GOOD.dec, GOOD.type, GOOD.vocab, GOOD.merges}, NULL,
         "pre_tokenizer.replacement"},
        {{GOOD.norm, "[1,2]", GOOD.post, GOOD.dec, GOOD.type, GOOD.vocab, GOOD.merges}, NULL, "pre_tokenizer"},
        {{GOOD.norm, GOOD.pre, "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<x>\",\"type_id\":0}}],\"special_tokens\":{}}", GOOD.dec, GOOD.type, GOOD.vocab, GOOD.merges}, NULL,
         "post_processor.special_tokens[\"<x>\"].ids"},
        {{GOOD.norm, GOOD.pre, "{\"type\":\"Mystery\"}", GOOD.dec, GOOD.type, GOOD.vocab, GOOD.merges}, NULL,
         "post_processor.type \"Mystery\" is not supported"},
        {{GOOD.norm, GOOD.pre, GOOD.post, "{\"type\":\"CTC\"}", GOOD.type, GOOD.vocab, GOOD.merges}, NULL,
         "decoder.type \"CTC\" is not supported"},
        {{GOOD.norm, GOOD.pre, GOOD.post, "{\"type\":\"Strip\",\"content\":\" \",\"start\":-1,\"stop\":0}", GOOD.type, GOOD.vocab, GOOD.merges}, NULL,
         "decoder"},
        {{GOOD.norm, GOOD.pre, GOOD.post, GOOD.dec, "\"Unigram\"", GOOD.vocab, GOOD.merges}, NULL,
         "model.type \"Unigram\" is not supported"},
        {{GOOD.norm, GOOD.pre, GOOD.post, GOOD.dec, "7", GOOD.vocab, GOOD.merges}, NULL, "model.type"},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        char *j = C[i].raw ? strdup(C[i].raw) : make_json(C[i].p);
        ms_tokenizer *t;
        ms_err err;
        int rc = load_json(j, &t, &err);
        CHECK_MSG(rc != 0, "case %zu loaded", i);
        CHECK_MSG(strstr(err.msg, C[i].want) != NULL, "case %zu: message \"%s\" lacks \"%s\"", i, err.msg, C[i].want);
        CHECK_MSG(strstr(err.msg, "tokenizer.json") != NULL, "case %zu: message \"%s\" lacks the file", i, err.msg);
        CHECK_MSG(!strchr(err.msg, '\n'), "case %zu: multi-line message", i);
        ms_tokenizer_free(t);
        free(j);
    }
}

/* Truncations and random byte changes of a real tokenizer.json never crash. */
static void test_corruption_never_crashes(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", DEMO);
    char *buf;
    size_t len;
    ms_err err = {0};
    CHECK(ms_read_file(path, 1 << 26, &buf, &len, &err) == 0);
    if (!buf) return;
    int loaded = 0, failed = 0;
    for (int it = 0; it < 120; it++) {
        char *c = malloc(len + 1);
        memcpy(c, buf, len + 1);
        size_t n = len;
        if (it < 40) n = rnd() % len; /* truncation */
        else {
            int flips = 1 + (int)(rnd() % 4);
            for (int k = 0; k < flips; k++) c[rnd() % len] = "{}[]\",:\\0a \xff\x80"[rnd() % 14];
        }
        write_tok(c, n);
        ms_tokenizer *t = NULL;
        memset(&err, 0, sizeof err);
        if (ms_tokenizer_load(g_tmp, &t, &err) == 0) {
            loaded++;
            int32_t *ids = NULL;
            int ni;
            if (ms_tokenizer_encode(t, "Hello 123 world <|user|>", 24, 1, &ids, &ni, &err) == 0) free(ids);
            ms_tokenizer_free(t);
        } else {
            failed++;
            CHECK_MSG(err.msg[0] && strstr(err.msg, "tokenizer.json"), "iteration %d: empty or unnamed error \"%s\"", it, err.msg);
        }
        free(c);
    }
    CHECK(failed >= 40);
    fprintf(stderr, "  corruption: %d loaded, %d rejected\n", loaded, failed);
    free(buf);
}

static ms_tokenizer *load_demo(void) {
    ms_tokenizer *t = NULL;
    ms_err err = {0};
    if (ms_tokenizer_load(DEMO, &t, &err)) fprintf(stderr, "load %s: %s\n", DEMO, err.msg);
    return t;
}

static int encode_eq(const ms_tokenizer *t, const char *a, size_t al, const char *b, size_t bl) {
    int32_t *x = NULL, *y = NULL;
    int nx = 0, ny = 0;
    ms_err err = {0};
    int ok = !ms_tokenizer_encode(t, a, al, 0, &x, &nx, &err) && !ms_tokenizer_encode(t, b, bl, 0, &y, &ny, &err) &&
             nx == ny && !memcmp(x, y, (size_t)nx * sizeof *x);
    free(x);
    free(y);
    return ok;
}

/* Invalid bytes become U+FFFD by maximal subparts (WHATWG TextDecoder, Rust from_utf8_lossy). */
static void test_invalid_utf8(void) {
    struct {
        const char *in;
        size_t n;
        const char *want;
    } C[] = {
        {"a\xff" "b", 3, "a\xEF\xBF\xBD" "b"},
        {"\xe2\x82", 2, "\xEF\xBF\xBD"},
        {"\xe2\x82" "x", 3, "\xEF\xBF\xBD" "x"},
        {"\xed\xa0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xf0\x9f\x98" "x", 4, "\xEF\xBF\xBD" "x"},
        {"\xc0\x80", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xf4\x90\x80\x80", 4, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xe0\xa0", 2, "\xEF\xBF\xBD"},
        {"\xc2\xc2\xa9", 3, "\xEF\xBF\xBD\xC2\xA9"},
        {"ok \xF0\x9F\x98\x80", 7, "ok \xF0\x9F\x98\x80"},
    };
    ms_tokenizer *t = load_demo();
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        char *out = NULL;
        size_t ol = 0;
        int r = tk_utf8_sanitize(C[i].in, C[i].n, &out, &ol);
        const char *got = r == 1 ? out : C[i].in;
        size_t gl = r == 1 ? ol : C[i].n;
        CHECK_MSG(gl == strlen(C[i].want) && !memcmp(got, C[i].want, gl), "case %zu", i);
        if (t) CHECK_MSG(encode_eq(t, C[i].in, C[i].n, C[i].want, strlen(C[i].want)), "encode case %zu", i);
        free(out);
    }
    /* random bytes: encoding never fails and decodes to valid UTF-8 */
    for (int it = 0; t && it < 200; it++) {
        char b[64];
        size_t n = rnd() % sizeof b;
        for (size_t k = 0; k < n; k++) b[k] = (char)rnd();
        int32_t *ids = NULL;
        int ni = 0;
        ms_err err = {0};
        CHECK(ms_tokenizer_encode(t, b, n, 1, &ids, &ni, &err) == 0);
        char *txt = NULL;
        size_t tl = 0;
        CHECK(ms_tokenizer_decode(t, ids, ni, 0, &txt, &tl, &err) == 0);
        CHECK(txt && valid_utf8(txt, tl));
        free(txt);
        free(ids);
    }
    ms_tokenizer_free(t);
}

/* Streaming: every chunk is whole UTF-8 and the chunks add up to the full decode. */
static void check_stream(const ms_tokenizer *t, const int32_t *ids, int n, int skip, int *bad) {
    ms_err err = {0};
    char *full = NULL;
    size_t fl = 0;
    if (ms_tokenizer_decode(t, ids, n, skip, &full, &fl, &err)) { (*bad)++; return; }
    ms_detok *d = ms_detok_new(t, skip);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
        size_t before = len;
        if (ms_detok_push(d, ids[i], &buf, &len, &cap, &err)) ok = 0;
        else if (!valid_utf8(buf + before, len - before)) ok = 0;
        else if (len > fl || memcmp(buf, full, len)) ok = 0; /* always a prefix of the final text */
    }
    size_t before = len;
    if (ok && ms_detok_flush(d, &buf, &len, &cap, &err)) ok = 0;
    if (ok && !valid_utf8(buf + before, len - before)) ok = 0;
    if (ok && (len != fl || memcmp(buf, full, fl))) ok = 0;
    if (!ok && (*bad)++ < 3) {
        fprintf(stderr, "  stream mismatch (skip=%d) ids:", skip);
        for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n    full [%.*s]\n    got  [%.*s]\n", (int)fl, full, (int)len, buf ? buf : "");
    }
    free(buf);
    free(full);
    ms_detok_free(d);
}

static void test_detok_chunk_boundaries(void) {
    ms_tokenizer *t = load_demo();
    if (!t) { CHECK(t != NULL); return; }
    const char *texts[] = {"héllo wörld 😀👍🏽 中文字符 🇫🇷 end", "👨‍👩‍👧‍👦👨‍👩‍👧‍👦", "a \xF0\x9F\x98\x80 b \xE4\xB8\xAD",
                           "<|user|>hi<think>x</think><|assistant|>", "   \n\n\t  ", "résumé ١٢٣ ²"};
    int bad = 0;
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *ids;
        int n;
        ms_err err = {0};
        CHECK(ms_tokenizer_encode(t, texts[i], strlen(texts[i]), 1, &ids, &n, &err) == 0);
        char *back;
        size_t bl;
        CHECK(ms_tokenizer_decode(t, ids, n, 0, &back, &bl, &err) == 0);
        CHECK_STR(back, texts[i]);
        free(back);
        check_stream(t, ids, n, 0, &bad);
        check_stream(t, ids, n, 1, &bad);
        free(ids);
    }
    int vs = ms_tokenizer_vocab_size(t);
    for (int it = 0; it < 400; it++) {
        int32_t ids[40];
        int n = 1 + (int)(rnd() % 40);
        for (int k = 0; k < n; k++) {
            do ids[k] = (int32_t)(rnd() % (uint64_t)vs); while (!ms_tokenizer_id_to_token(t, ids[k]));
        }
        check_stream(t, ids, n, (int)(it & 1), &bad);
    }
    CHECK_EQ_INT(bad, 0);
    ms_tokenizer_free(t);
}

/* Streaming through the clean-up and byte-fallback paths: a tokenizer with both. */
static void test_detok_cleanup_and_bytefallback(void) {
    parts p = GOOD;
    p.pre = "{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"always\",\"split\":true}";
    p.dec = "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},\"content\":\" \"},"
            "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}";
    /* vocab: letters, apostrophe, dot, ▁, byte tokens for a few bytes */
    char vocab[4096];
    int k = snprintf(vocab, sizeof vocab, "{\"a\":0,\"n\":1,\"'\":2,\".\":3,\"\\u2581\":4,\"t\":5");
    static const int bytes[] = {0x41, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80, 0xFF};
    for (int i = 0; i < 9; i++) k += snprintf(vocab + k, sizeof vocab - (size_t)k, ",\"<0x%02X>\":%d", bytes[i], 7 + i);
    snprintf(vocab + k, sizeof vocab - (size_t)k, "}");
    p.vocab = vocab;
    p.merges = "[]";
    char *j = make_json(p);
    char *j2 = subst(j, "\"byte_fallback\":false", "\"byte_fallback\":true");
    ms_tokenizer *t;
    ms_err err;
    int rc = load_json(j2, &t, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    free(j);
    free(j2);
    if (rc) return;
    /* tokenizer_config.json absent: clean_up_tokenization_spaces defaults to on */
    int bad = 0;
    for (int it = 0; it < 600; it++) {
        int32_t ids[24];
        int n = 1 + (int)(rnd() % 24);
        for (int q = 0; q < n; q++) ids[q] = (int32_t)(rnd() % 16);
        check_stream(t, ids, n, (int)(it & 1), &bad);
    }
    CHECK_EQ_INT(bad, 0);
    /* clean-up is applied: " ." -> "." and " n't" -> "n't" */
    int32_t ids[] = {4, 0, 4, 3, 4, 1, 2, 5};
    char *txt;
    size_t tl;
    CHECK(ms_tokenizer_decode(t, ids, 8, 0, &txt, &tl, &err) == 0);
    CHECK_STR(txt, "a.n't");
    free(txt);
    /* invalid byte group: one U+FFFD per byte, as the Rust ByteFallback decoder */
    int32_t b2[] = {7, 15};
    CHECK(ms_tokenizer_decode(t, b2, 2, 0, &txt, &tl, &err) == 0);
    CHECK_STR(txt, "\xEF\xBF\xBD\xEF\xBF\xBD");
    free(txt);
    ms_tokenizer_free(t);
}

/* Our regex matcher against Oniguruma on the patterns real tokenizers use. */
static void test_regex_matches_oniguruma(void) {
    static const char *pats[] = {
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
        "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        "\\p{N}{1,3}",
        "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
        "a|(?:b|c)?d*|x{2,}|\\d\\D\\S.\\x41\\u00e9",
    };
    /* characters from long-assigned blocks, where every Unicode version agrees */
    static const uint32_t pool[] = {'a', 'Z', 's', 'S', 'k', 'K', '\'', ' ', ' ', '\t', '\n', '\r', '0', '7', '.', ',', '!',
                                    '-', '/', '_', '(', 0xE9, 0xDF, 0x17F, 0x212A, 0x300, 0x301, 0x3A3, 0x3C3, 0x416,
                                    0x5D0, 0x627, 0x661, 0x905, 0x93F, 0xE01, 0xE31, 0x4E2D, 0x3042, 0x30A2, 0xAC00,
                                    0xFF10, 0x2460, 0xB2, 0xA0, 0x3000, 0x2003, 0x85, 0x2028, 0xFEFF, 0x200B, 0x1F600,
                                    0x1F3FD, 0x200D, 0xFE0F, 0x20AC, 0x2014, 0xFFFD, 0x1D400, 0x10400, 0x16A0, 0x2160};
    int bad = 0, native = 0;
    for (size_t pi = 0; pi < sizeof pats / sizeof pats[0]; pi++) {
        tk_regex *a = NULL, *b = NULL;
        char why[200];
        size_t pl = strlen(pats[pi]);
        if (tk_regex_new(pats[pi], pl, &a, why, sizeof why) || tk_regex_new_onig(pats[pi], pl, &b, why, sizeof why)) {
            CHECK_MSG(0, "pattern %zu: %s", pi, why);
            tk_regex_free(a);
            continue;
        }
        native += tk_regex_is_native(a);
        for (int it = 0; it < 300; it++) {
            char s[400];
            size_t n = 0;
            int chars = (int)(rnd() % 60);
            for (int c = 0; c < chars; c++) n += (size_t)ms_utf8_enc(pool[rnd() % (sizeof pool / sizeof pool[0])], s + n);
            size_t pa = 0;
            while (pa <= n) {
                size_t s1, e1, s2, e2;
                int f1 = tk_regex_find(a, s, n, pa, &s1, &e1), f2 = tk_regex_find(b, s, n, pa, &s2, &e2);
                if (f1 != f2 || (f1 == 1 && (s1 != s2 || e1 != e2))) {
                    if (bad++ < 5) fprintf(stderr, "  pattern %zu differs at %zu on \"%.*s\": %d [%zu,%zu) vs %d [%zu,%zu)\n", pi, pa, (int)n, s, f1, s1, e1, f2, s2, e2);
                    break;
                }
                if (f1 != 1) break;
                pa = e1 > s1 ? e1 : s1 + (s1 < n ? (size_t)ms_utf8_len((unsigned char)s[s1]) : 1);
            }
        }
        tk_regex_free(a);
        tk_regex_free(b);
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(native, (int)(sizeof pats / sizeof pats[0])); /* all of them run natively */
}

typedef struct {
    const ms_tokenizer *t;
    int ok;
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = p;
    const char *s = "The quick brown fox 12345 jumps; <|user|> 你好 😀 over the lazy dog.\n";
    char big[8192];
    size_t n = 0;
    while (n + strlen(s) < sizeof big) { memcpy(big + n, s, strlen(s)); n += strlen(s); }
    int32_t *first = NULL;
    int nf = 0;
    a->ok = 1;
    for (int r = 0; r < 20; r++) {
        int32_t *ids;
        int ni;
        ms_err err = {0};
        if (ms_tokenizer_encode(a->t, big, n, 0, &ids, &ni, &err)) { a->ok = 0; break; }
        if (!first) { first = ids; nf = ni; continue; }
        if (ni != nf || memcmp(ids, first, (size_t)ni * sizeof *ids)) a->ok = 0;
        free(ids);
    }
    free(first);
    return NULL;
}

static void test_threads(void) {
    ms_tokenizer *t = load_demo();
    if (!t) { CHECK(t != NULL); return; }
    pthread_t th[3];
    thr_arg args[3];
    for (int i = 0; i < 3; i++) { args[i] = (thr_arg){t, 0}; pthread_create(&th[i], NULL, thr_main, &args[i]); }
    for (int i = 0; i < 3; i++) { pthread_join(th[i], NULL); CHECK(args[i].ok); }
    ms_tokenizer_free(t);
}

static void test_empty_and_config(void) {
    ms_tokenizer *t = load_demo();
    if (!t) { CHECK(t != NULL); return; }
    int32_t *ids;
    int n;
    ms_err err = {0};
    CHECK(ms_tokenizer_encode(t, "", 0, 1, &ids, &n, &err) == 0);
    CHECK_EQ_INT(n, 0);
    free(ids);
    char *txt;
    size_t tl;
    CHECK(ms_tokenizer_decode(t, NULL, 0, 0, &txt, &tl, &err) == 0);
    CHECK_STR(txt, "");
    free(txt);
    CHECK_STR(ms_tokenizer_eos_token(t), "<|endoftext|>");
    CHECK(ms_tokenizer_chat_template(t) != NULL); /* models/demo has chat_template.jinja */
    CHECK(ms_tokenizer_bos_token(t) == NULL);
    ms_tokenizer_free(t);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/ms_tok_test_%d", (int)getpid());
    mkdir(g_tmp, 0700);
    RUN(test_small_tokenizer_works);
    RUN(test_bad_files_name_the_field);
    RUN(test_corruption_never_crashes);
    RUN(test_invalid_utf8);
    RUN(test_detok_chunk_boundaries);
    RUN(test_detok_cleanup_and_bytefallback);
    RUN(test_regex_matches_oniguruma);
    RUN(test_threads);
    RUN(test_empty_and_config);
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer.json", g_tmp);
    unlink(p);
    rmdir(g_tmp);
    return TEST_SUMMARY();
}
