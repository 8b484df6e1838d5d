/* test_bench_dataset.c - seeded generators of `moeserve bench`: SGLang's length rule, Poisson
 * arrival statistics (mean, coefficient of variation, Kolmogorov-Smirnov distance to the
 * exponential CDF), random-ids' arithmetic sequences, and exact-length text prompts through a
 * tokenizer whose re-encoding merges tokens (so the length adjustment is exercised). */
#include "bench/dataset.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void test_rng_seeded(void) {
    ms_bench_rng a, b, c;
    ms_bench_rng_seed(&a, 1);
    ms_bench_rng_seed(&b, 1);
    ms_bench_rng_seed(&c, 2);
    int same = 1, diff = 0;
    for (int i = 0; i < 100; i++) {
        uint64_t x = ms_bench_rng_next(&a), y = ms_bench_rng_next(&b), z = ms_bench_rng_next(&c);
        same &= x == y;
        diff += x != z;
    }
    CHECK(same);
    CHECK(diff > 95);
    for (int i = 0; i < 10000; i++) {
        double u = ms_bench_rng_uniform(&a);
        int64_t k = ms_bench_rng_int(&a, -3, 4);
        if (!(u >= 0 && u < 1) || k < -3 || k >= 4) { CHECK(0); break; }
    }
}

static void test_sample_len(void) {
    ms_bench_rng r;
    ms_bench_rng_seed(&r, 5);
    /* [max(floor(L*ratio),1), L]: L=10, ratio 0.5 -> [5, 10], each value about 1/6 of the draws */
    int count[12] = {0};
    int n = 60000;
    for (int i = 0; i < n; i++) {
        int v = ms_bench_sample_len(&r, 10, 0.5);
        if (v < 0 || v > 11) v = 11;
        count[v]++;
    }
    for (int v = 0; v < 5; v++) CHECK_EQ_INT(count[v], 0);
    CHECK_EQ_INT(count[11], 0);
    for (int v = 5; v <= 10; v++) CHECK_MSG(fabs(count[v] - n / 6.0) < 0.05 * n / 6.0, "value %d drawn %d times", v, count[v]);
    /* ratio 0: [1, L], never 0; ratio 1: always L; floor(7*0.5)=3 */
    int lo = 1 << 30, hi = 0, lo7 = 1 << 30;
    for (int i = 0; i < 5000; i++) {
        int v = ms_bench_sample_len(&r, 4, 0.0);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        CHECK(ms_bench_sample_len(&r, 9, 1.0) == 9);
        int w = ms_bench_sample_len(&r, 7, 0.5);
        lo7 = w < lo7 ? w : lo7;
    }
    CHECK_EQ_INT(lo, 1);
    CHECK_EQ_INT(hi, 4);
    CHECK_EQ_INT(lo7, 3);
    CHECK_EQ_INT(ms_bench_sample_len(&r, 1, 0.0), 1);
}

static void test_poisson_arrivals(void) {
    ms_bench_rng r;
    ms_bench_rng_seed(&r, 1);
    int n = 20000;
    double rate = 8.0;
    double *t = malloc((size_t)n * sizeof *t), *gap = malloc((size_t)(n - 1) * sizeof *gap);
    ms_bench_arrivals(&r, n, rate, t);
    CHECK_CLOSE(t[0], 0, 0);
    double sum = 0, ss = 0;
    for (int i = 1; i < n; i++) {
        gap[i - 1] = t[i] - t[i - 1];
        CHECK(gap[i - 1] >= 0);
        sum += gap[i - 1];
    }
    double mean = sum / (n - 1);
    for (int i = 0; i < n - 1; i++) ss += (gap[i] - mean) * (gap[i] - mean);
    double cv = sqrt(ss / (n - 1)) / mean;
    CHECK_MSG(fabs(mean - 1 / rate) < 0.03 / rate, "mean gap %g", mean);      /* 4 sigma is 0.028/rate */
    CHECK_MSG(fabs(cv - 1) < 0.04, "coefficient of variation %g", cv);        /* exponential: 1 */
    /* Kolmogorov-Smirnov distance to 1 - exp(-rate x); critical value at 1% is 1.63/sqrt(n). */
    qsort(gap, (size_t)(n - 1), sizeof *gap, cmp_d);
    double d = 0;
    for (int i = 0; i < n - 1; i++) {
        double f = 1 - exp(-rate * gap[i]);
        double a = fabs((i + 1.0) / (n - 1) - f), b = fabs(f - (double)i / (n - 1));
        d = fmax(d, fmax(a, b));
    }
    CHECK_MSG(d < 1.63 / sqrt(n - 1), "KS distance %g", d);
    /* same seed, same schedule, to the bit */
    double t2[10];
    ms_bench_rng_seed(&r, 1);
    ms_bench_arrivals(&r, 10, rate, t2);
    for (int i = 0; i < 10; i++) CHECK(t2[i] == t[i]);
    CHECK(t2[9] > 0);
    /* inf rate: everything at 0 */
    ms_bench_arrivals(&r, 5, INFINITY, t);
    for (int i = 0; i < 5; i++) CHECK_CLOSE(t[i], 0, 0);
    free(t);
    free(gap);
}

static void test_random_ids(void) {
    ms_bench_rng r;
    ms_bench_rng_seed(&r, 3);
    ms_bench_dataset_opts o = {.kind = MS_BENCH_DS_RANDOM_IDS, .num_prompts = 50, .input_len = 64,
                               .output_len = 16, .range_ratio = 0.25, .vocab_size = 100};
    ms_bench_prompt *p = NULL;
    ms_err err = {0};
    CHECK(ms_bench_dataset_make(&o, &r, &p, &err) == MS_OK);
    if (!p) return;
    int distinct_offsets = 0;
    for (int i = 0; i < 50; i++) {
        CHECK(p[i].text == NULL && p[i].ids != NULL);
        CHECK(p[i].prompt_len >= 16 && p[i].prompt_len <= 64 && p[i].n_ids == p[i].prompt_len);
        CHECK(p[i].output_len >= 4 && p[i].output_len <= 16);
        for (int j = 1; j < p[i].n_ids; j++) CHECK(p[i].ids[j] == (p[i].ids[j - 1] + 1) % 100);
        if (i && p[i].ids[0] != (p[i - 1].ids[0] + 1) % 100) distinct_offsets++;
    }
    CHECK(distinct_offsets > 30); /* a random offset per request, not one shared sequence */
    ms_bench_dataset_free(p, 50);
    /* chat needs text: without a tokenizer that is an error naming the flag */
    o.need_text = 1;
    CHECK(ms_bench_dataset_make(&o, &r, &p, &err) == MS_ERR_INVALID);
    CHECK(strstr(err.msg, "--tokenizer") != NULL);
    o.need_text = 0;
    o.vocab_size = 0;
    CHECK(ms_bench_dataset_make(&o, &r, &p, &err) == MS_ERR_INVALID);
    CHECK(strstr(err.msg, "--vocab-size") != NULL);
}

static void test_random_words(void) {
    ms_bench_rng r;
    ms_bench_rng_seed(&r, 9);
    ms_bench_dataset_opts o = {.kind = MS_BENCH_DS_RANDOM, .num_prompts = 20, .input_len = 30, .output_len = 8,
                               .range_ratio = 1.0};
    ms_bench_prompt *p = NULL;
    ms_err err = {0};
    CHECK(ms_bench_dataset_make(&o, &r, &p, &err) == MS_OK);
    if (!p) return;
    for (int i = 0; i < 20; i++) {
        int words = 1;
        for (const char *c = p[i].text; *c; c++) words += *c == ' ';
        CHECK_EQ_INT(words, 30);
        CHECK_EQ_INT(p[i].prompt_len, 30);
        CHECK_EQ_INT(p[i].output_len, 8);
    }
    CHECK(strcmp(p[0].text, p[1].text) != 0);
    ms_bench_dataset_free(p, 20);
}

/* A toy tokenizer: ids 0..25 are the letters a..z, 26 is the merge "ab", 27 is a special token
 * "<s>" that encode adds nothing for. Greedy encode merges "ab", so random ids containing 0 then 1
 * re-encode shorter and the generator must top them up. */
static int toy_encode(void *ctx, const char *text, size_t len, int32_t **ids, int *n, ms_err *err) {
    int32_t *o = malloc((len + 1) * sizeof *o);
    int k = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == 'a' && i + 1 < len && text[i + 1] == 'b') { o[k++] = 26; i++; }
        else if (text[i] == '<') { o[k++] = 27; i += 2; }
        else o[k++] = text[i] - 'a';
    }
    *ids = o;
    *n = k;
    return MS_OK;
}
static int toy_decode(void *ctx, const int32_t *ids, int n, char **out, ms_err *err) {
    char *s = malloc((size_t)n * 3 + 1);
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] == 26) { s[k++] = 'a'; s[k++] = 'b'; }
        else if (ids[i] == 27) { memcpy(s + k, "<s>", 3); k += 3; }
        else s[k++] = (char)('a' + ids[i]);
    }
    s[k] = 0;
    *out = s;
    return MS_OK;
}
static int toy_special(void *ctx, int32_t id) { return id == 27; }

static void test_tokenizer_text_exact_length(void) {
    ms_bench_tok t = {.ctx = NULL, .vocab_size = 28, .n_special_added = 1, .encode = toy_encode,
                      .decode = toy_decode, .is_special = toy_special};
    ms_bench_rng r;
    ms_bench_rng_seed(&r, 11);
    ms_bench_dataset_opts o = {.kind = MS_BENCH_DS_RANDOM, .num_prompts = 40, .input_len = 200, .output_len = 4,
                               .range_ratio = 0.0, .tok = &t};
    ms_bench_prompt *p = NULL;
    ms_err err = {0};
    CHECK(ms_bench_dataset_make(&o, &r, &p, &err) == MS_OK);
    if (!p) return;
    int merged = 0;
    for (int i = 0; i < 40; i++) {
        int32_t *ids;
        int n;
        toy_encode(NULL, p[i].text, strlen(p[i].text), &ids, &n, &err);
        /* the server adds one special token: the text itself is prompt_len - 1 tokens */
        int want = p[i].prompt_len - 1 < 1 ? 1 : p[i].prompt_len - 1;
        CHECK_MSG(n == want, "prompt %d encodes to %d tokens, want %d", i, n, want);
        CHECK(strchr(p[i].text, '<') == NULL); /* no special tokens sampled */
        merged += strstr(p[i].text, "ab") != NULL;
        free(ids);
    }
    CHECK(merged > 0); /* the merge path was exercised */
    ms_bench_dataset_free(p, 40);
    /* random-ids for chat through the tokenizer: decoded text of the arithmetic sequence */
    o.kind = MS_BENCH_DS_RANDOM_IDS;
    o.need_text = 1;
    o.num_prompts = 3;
    CHECK(ms_bench_dataset_make(&o, &r, &p, &err) == MS_OK);
    if (p) {
        CHECK(p[0].text != NULL && p[0].ids == NULL);
        ms_bench_dataset_free(p, 3);
    }
}

int main(void) {
    RUN(test_rng_seeded);
    RUN(test_sample_len);
    RUN(test_poisson_arrivals);
    RUN(test_random_ids);
    RUN(test_random_words);
    RUN(test_tokenizer_text_exact_length);
    return TEST_SUMMARY();
}
