/* cmd_tokenize.c - `moeserve tokenize --model DIR [--add-special-tokens]`: stdin text -> ids.
 *
 * Prints the ids comma-separated on one line. The hidden `--jsonl` mode serves the conformance
 * tests: one JSON object per input line, {"text": s} or {"b64": raw bytes} to encode (answers ids
 * without and with special tokens plus both decodes of the latter), or {"decode": [ids]} to
 * decode (answers the full decodes and the streaming detokenizer's output), so one process
 * handles thousands of cases. */
#include "common/args.h"
#include "common/model_path.h"
#include "core/status.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STDIN (1ull << 31)

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    if (!b) return NULL;
    while (1) {
        if (n == cap) {
            if (cap >= MAX_STDIN) { free(b); return NULL; }
            cap *= 2;
            char *nb = realloc(b, cap + 1);
            if (!nb) { free(b); return NULL; }
            b = nb;
        }
        size_t got = fread(b + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    b[n] = 0;
    *len = n;
    return b;
}

static json_t *ids_json(const int32_t *ids, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static int b64val(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

static char *b64dec(const char *s, size_t *out_len) {
    size_t n = strlen(s), o = 0;
    *out_len = 0;
    char *r = malloc(n + 1);
    if (!r) return NULL;
    unsigned acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64val((unsigned char)s[i]);
        if (v < 0) continue;
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) { bits -= 8; r[o++] = (char)((acc >> bits) & 0xFF); }
    }
    *out_len = o;
    return r;
}

static json_t *decode_obj(const ms_tokenizer *t, const int32_t *ids, int n, ms_err *err) {
    json_t *o = json_object();
    for (int skip = 0; skip < 2; skip++) {
        char *txt = NULL;
        size_t tl = 0;
        if (ms_tokenizer_decode(t, ids, n, skip, &txt, &tl, err)) { json_decref(o); return NULL; }
        json_object_set_new(o, skip ? "dec_skip" : "dec", json_stringn(txt, tl));
        free(txt);
        /* streaming, one id at a time */
        ms_detok *d = ms_detok_new(t, skip);
        char *buf = NULL;
        size_t len = 0, cap = 0;
        int rc = d ? 0 : ms_errf(err, MS_ERR_NOMEM, "out of memory");
        for (int i = 0; i < n && !rc; i++) rc = ms_detok_push(d, ids[i], &buf, &len, &cap, err);
        if (!rc) rc = ms_detok_flush(d, &buf, &len, &cap, err);
        ms_detok_free(d);
        if (rc) { free(buf); json_decref(o); return NULL; }
        json_object_set_new(o, skip ? "stream_skip" : "stream", json_stringn(buf ? buf : "", len));
        free(buf);
    }
    return o;
}

static int run_jsonl(const ms_tokenizer *t) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        lineno++;
        if (n == 1 && line[0] == '\n') continue;
        json_error_t je;
        json_t *in = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &je);
        if (!in) {
            fprintf(stderr, "tokenize --jsonl: stdin line %ld: %s\n", lineno, je.text);
            free(line);
            return 1;
        }
        ms_err err = {0};
        json_t *out = NULL;
        json_t *txt = json_object_get(in, "text"), *b64 = json_object_get(in, "b64"), *dec = json_object_get(in, "decode");
        if (json_is_array(dec)) {
            size_t m = json_array_size(dec);
            int32_t *ids = malloc((m + 1) * sizeof *ids);
            for (size_t i = 0; ids && i < m; i++) ids[i] = (int32_t)json_integer_value(json_array_get(dec, i));
            out = ids ? decode_obj(t, ids, (int)m, &err) : NULL;
            free(ids);
        } else if (json_is_string(txt) || json_is_string(b64)) {
            char *raw = NULL;
            const char *s;
            size_t sl = 0;
            if (json_is_string(txt)) { s = json_string_value(txt); sl = json_string_length(txt); }
            else { raw = b64dec(json_string_value(b64), &sl); s = raw ? raw : ""; }
            int32_t *a = NULL, *b = NULL;
            int na = 0, nb = 0;
            if (!ms_tokenizer_encode(t, s, sl, 0, &a, &na, &err) && !ms_tokenizer_encode(t, s, sl, 1, &b, &nb, &err)) {
                out = decode_obj(t, b, nb, &err);
                if (out) {
                    json_object_set_new(out, "ids", ids_json(a, na));
                    json_object_set_new(out, "ids_sp", ids_json(b, nb));
                }
            }
            free(a);
            free(b);
            free(raw);
        } else {
            ms_errf(&err, MS_ERR_INVALID, "expected \"text\", \"b64\" or \"decode\"");
        }
        json_decref(in);
        if (!out) {
            out = json_object();
            json_object_set_new(out, "error", json_string(err.msg));
        }
        char *s = json_dumps(out, JSON_COMPACT | JSON_ENSURE_ASCII);
        json_decref(out);
        if (!s) { free(line); return 1; }
        fputs(s, stdout);
        fputc('\n', stdout);
        fflush(stdout);
        free(s);
    }
    free(line);
    return 0;
}

static const ms_opt tokenize_opts[] = {
    {"model", "model-path", MS_OPT_VALUE, "DIR|ORG/NAME", "tokenizer directory (tokenizer.json) or Hugging Face repo id"},
    {"revision", NULL, MS_OPT_VALUE, "REV", "Hugging Face branch, tag or commit of a repo id [main]"},
    {"add-special-tokens", NULL, MS_OPT_BOOL, NULL, "add the tokenizer's special tokens (bos)"},
    {"jsonl", NULL, MS_OPT_BOOL, NULL, "one JSON string per stdin line in, one id list per line out"},
    MS_OPT_END,
};

static const ms_cmd tokenize_cmd = {
    "tokenize", "--model DIR [--add-special-tokens] < text",
    "Reads UTF-8 text from stdin and prints its token ids, comma-separated.",
    {tokenize_opts, NULL},
};

int cmd_tokenize(int argc, char **argv) {
    ms_args a;
    int prc = ms_args_parse(&a, &tokenize_cmd, argc, argv);
    if (prc) return ms_args_exit(prc);
    const char *model = ms_args_str(&a, "model", NULL), *revision = ms_args_str(&a, "revision", NULL);
    int add_special = ms_args_flag(&a, "add-special-tokens");
    int jsonl = ms_args_flag(&a, "jsonl");
    ms_args_free(&a);
    if (!model) {
        fprintf(stderr, "moeserve tokenize: flag --model DIR is required (moeserve tokenize --model DIR [--add-special-tokens] < text)\n");
        return 2;
    }
    char dir[4096];
    if (ms_model_path_resolve("tokenize", "model", model, revision, MS_NEED_TOKENIZER, dir, sizeof dir)) return 2;
    model = dir;
    ms_err err = {0};
    ms_tokenizer *t = NULL;
    if (ms_tokenizer_load(model, &t, &err)) { fprintf(stderr, "tokenize: %s\n", err.msg); return 1; }
    int rc = 0;
    if (jsonl) {
        rc = run_jsonl(t);
    } else {
        size_t len = 0;
        char *text = read_all(stdin, &len);
        if (!text) { fprintf(stderr, "tokenize: stdin: cannot read (out of memory or over 2 GiB)\n"); ms_tokenizer_free(t); return 1; }
        int32_t *ids = NULL;
        int n = 0;
        if (ms_tokenizer_encode(t, text, len, add_special, &ids, &n, &err)) {
            fprintf(stderr, "tokenize: %s\n", err.msg);
            rc = 1;
        } else {
            for (int i = 0; i < n; i++) fprintf(stdout, i ? ",%d" : "%d", ids[i]);
            fputc('\n', stdout);
        }
        free(ids);
        free(text);
    }
    ms_tokenizer_free(t);
    return rc;
}
