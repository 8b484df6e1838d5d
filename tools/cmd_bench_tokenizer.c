/* cmd_bench_tokenizer.c - `moeserve bench-tokenizer --model DIR [--corpus FILE | --mb 20]`.
 *
 * Measures single-threaded encode throughput (MB/s of UTF-8 input) and tokenizer load time.
 * Without --corpus it generates a deterministic mixed corpus (English prose, code with tabs and
 * CRLF, numbers, CJK, Cyrillic, Arabic, Devanagari, Thai, emoji); --write-corpus FILE saves it
 * so the JavaScript reference (tests/tokenizer/bench_ref.mjs) can encode the very same bytes. */
#include "common/args.h"
#include "common/model_path.h"
#include "core/fileutil.h"
#include "core/status.h"
#include "tokenizer/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static const char *const WORDS[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
    "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you",
    "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will",
    "would", "who", "so", "no", "model", "server", "tokenizer", "inference", "expert", "routing", "latency",
    "throughput", "memory", "request", "stream", "batch", "kernel", "matrix", "attention", "cache", "token",
    "language", "compute", "performance", "configuration", "Hello", "World", "Paris", "GPU", "API", "JSON",
    "don't", "it's", "we're", "they've", "I'm", "you'll", "he'd", "naïve", "café", "résumé", "Zürich",
    "déjà", "coöperate", "façade", "Ångström", "São", "Paulo", "El", "Niño",
};
static const char *const SNIPS[] = {
    "int main(int argc, char **argv) {\n\treturn 0;\n}\n",
    "def forward(self, x):\r\n    return self.proj(x) + 1e-6  \r\n",
    "for (size_t i = 0; i < n; i++) sum += a[i] * b[i];\n",
    "    if err != nil {\n        return fmt.Errorf(\"read %s: %w\", path, err)\n    }\n",
    "SELECT id, name FROM users WHERE created_at > '2024-01-01';\n",
    "{\"model\": \"glm-4.5\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n",
    "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
    "東京は日本の首都であり、世界最大の都市圏の一つです。ひらがなとカタカナ。",
    "한국어 텍스트도 포함됩니다. 서울은 대한민국의 수도입니다.",
    "Москва — столица России, крупнейший город страны.",
    "اللغة العربية هي إحدى أكثر اللغات انتشاراً في العالم.",
    "हिन्दी भारत की एक प्रमुख भाषा है और देवनागरी लिपि में लिखी जाती है।",
    "ภาษาไทยเป็นภาษาที่มีวรรณยุกต์และไม่มีการเว้นวรรคระหว่างคำ",
    "Ελληνικά: η γλώσσα των φιλοσόφων.",
    "Emoji 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️‍🔥 ✨",
    "Prices: $1,234.56 — 3.14159 — 2025-11-30T08:52:00Z — 0xDEADBEEF\n",
};

/* Appends about `mb` MB of mixed text to a malloc'd buffer. */
static char *make_corpus(double mb, size_t *len) {
    size_t want = (size_t)(mb * 1e6), cap = want + 4096, n = 0;
    char *b = malloc(cap);
    if (!b) return NULL;
    uint64_t s = 42;
    size_t nw = sizeof WORDS / sizeof WORDS[0], ns = sizeof SNIPS / sizeof SNIPS[0];
    while (n < want) {
        uint64_t r = rng_next(&s);
        char tmp[512];
        int k;
        switch (r % 10) {
        case 0: case 1: case 2: case 3: case 4: { /* a sentence of prose */
            int words = 5 + (int)((r >> 8) % 15);
            k = 0;
            for (int w = 0; w < words && k < 400; w++) {
                uint64_t q = rng_next(&s);
                const char *word = WORDS[q % nw];
                if (q % 7 == 0) k += snprintf(tmp + k, sizeof tmp - (size_t)k, "%s%llu", w ? " " : "", (unsigned long long)(q >> 40) % 100000);
                else if (q % 11 == 0) { /* a made-up word so the cache does not see everything */
                    k += snprintf(tmp + k, sizeof tmp - (size_t)k, "%s", w ? " " : "");
                    for (int c = 0; c < 3 + (int)(q >> 50) % 8; c++) tmp[k++] = (char)('a' + (rng_next(&s) % 26));
                } else k += snprintf(tmp + k, sizeof tmp - (size_t)k, "%s%s", w ? " " : "", word);
            }
            k += snprintf(tmp + k, sizeof tmp - (size_t)k, "%s", (r >> 20) % 3 ? ". " : ".\n\n");
            break;
        }
        default:
            k = snprintf(tmp, sizeof tmp, "%s%s", SNIPS[(r >> 8) % ns], (r >> 30) % 2 ? " " : "\n");
        }
        if (n + (size_t)k > cap) break;
        memcpy(b + n, tmp, (size_t)k);
        n += (size_t)k;
    }
    *len = n;
    return b;
}

static const ms_opt bench_tok_opts[] = {
    {"model", "model-path", MS_OPT_VALUE, "DIR", "tokenizer directory (tokenizer.json)"},
    {"corpus", NULL, MS_OPT_VALUE, "FILE", "text to encode [a generated multilingual corpus]"},
    {"write-corpus", NULL, MS_OPT_VALUE, "FILE", "write the generated corpus (for the JS comparison)"},
    {"mb", NULL, MS_OPT_VALUE, "MB", "size of the generated corpus [20]"},
    {"repeat", NULL, MS_OPT_VALUE, "N", "encode N times, report the best [1]"},
    MS_OPT_END,
};

static const ms_cmd bench_tok_cmd = {
    "bench-tokenizer", "--model DIR [--corpus FILE] [flags]",
    "Tokenizer encode throughput (MB/s) on a corpus.",
    {bench_tok_opts, NULL},
};

int cmd_bench_tokenizer(int argc, char **argv) {
    ms_args a;
    int prc = ms_args_parse(&a, &bench_tok_cmd, argc, argv);
    if (prc) return ms_args_exit(prc);
    int bad = 0;
    const char *model = ms_args_str(&a, "model", NULL);
    const char *corpus = ms_args_str(&a, "corpus", NULL);
    const char *write = ms_args_str(&a, "write-corpus", NULL);
    double mb = ms_args_float(&a, "mb", 20, &bad);
    int reps = (int)ms_args_int(&a, "repeat", 1, &bad);
    if (bad) { ms_args_free(&a); return 2; }
    ms_args_free(&a);
    if (mb <= 0 || mb > 4000) { fprintf(stderr, "bench-tokenizer: flag --mb: must be in (0, 4000]\n"); return 2; }
    if (reps < 1 || reps > 100) { fprintf(stderr, "bench-tokenizer: flag --repeat: must be in [1, 100]\n"); return 2; }
    ms_err err = {0};
    char *text = NULL;
    size_t len = 0;
    if (corpus) {
        if (ms_read_file(corpus, (size_t)4 << 30, &text, &len, &err)) { fprintf(stderr, "bench-tokenizer: flag --corpus: %s\n", err.msg); return 1; }
    } else {
        text = make_corpus(mb, &len);
        if (!text) { fprintf(stderr, "bench-tokenizer: out of memory for a %.0f MB corpus\n", mb); return 1; }
    }
    if (write) {
        int rc = ms_write_file(write, text, len, &err);
        if (rc) fprintf(stderr, "bench-tokenizer: flag --write-corpus: %s\n", err.msg);
        else fprintf(stderr, "bench-tokenizer: wrote %zu bytes to %s\n", len, write);
        if (!model || rc) { free(text); return rc ? 1 : 0; }
    }
    if (!model) { fprintf(stderr, "bench-tokenizer: flag --model: missing\n"); free(text); return 2; }
    char dir[4096];
    if (ms_model_path_resolve("bench-tokenizer", "model", model, NULL, MS_NEED_TOKENIZER, dir, sizeof dir)) { free(text); return 2; }
    model = dir;
    double t0 = ms_now();
    ms_tokenizer *t = NULL;
    if (ms_tokenizer_load(model, &t, &err)) { fprintf(stderr, "bench-tokenizer: %s\n", err.msg); free(text); return 1; }
    double load = ms_now() - t0;
    double best = 1e30;
    int n = 0;
    for (int r = 0; r < reps; r++) {
        int32_t *ids = NULL;
        double t1 = ms_now();
        if (ms_tokenizer_encode(t, text, len, 0, &ids, &n, &err)) {
            fprintf(stderr, "bench-tokenizer: %s\n", err.msg);
            ms_tokenizer_free(t);
            free(text);
            return 1;
        }
        double dt = ms_now() - t1;
        if (dt < best) best = dt;
        free(ids);
    }
    printf("bench-tokenizer: C: %.2f MB, %d tokens, %.3f s, %.1f MB/s (load %.0f ms)\n", len / 1e6, n, best,
           len / 1e6 / best, load * 1e3);
    ms_tokenizer_free(t);
    free(text);
    return 0;
}
