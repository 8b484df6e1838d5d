/* test_safetensors.c - reader/writer round trip, on-disk layout (checked byte by byte against the
 * safetensors format definition, not through our reader), many-tensor lookup, shards, prefetch. */
#include "model/safetensors.h"
#include "test.h"
#include "tiny_ckpt.h"

static char *g_root;

static int fill_iota(void *ctx, const char *name, void *buf, size_t n, ms_err *err) {
    (void)name; (void)err;
    for (size_t i = 0; i < n; i++) ((uint8_t *)buf)[i] = (uint8_t)(i * 7 + (uintptr_t)ctx);
    return 0;
}

static void test_round_trip(void) {
    char p[1024];
    snprintf(p, sizeof p, "%s/rt.safetensors", g_root);
    float f[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
    uint16_t h[3] = {0x3f80, 0xc000, 0x0001};
    uint8_t u[5] = {1, 2, 3, 4, 5};
    int64_t i64 = -42;
    int64_t s23[2] = {2, 3}, s3[1] = {3}, s5[1] = {5}, s0[1] = {0}, s7[1] = {77};
    ms_st_writer *w = ms_st_writer_new();
    ms_err err = {0};
    CHECK(ms_st_writer_add(w, "b.u8", MS_U8, 1, s5, u, 5, &err) == 0); /* odd size first by name */
    CHECK(ms_st_writer_add(w, "a.f32", MS_F32, 2, s23, f, sizeof f, &err) == 0);
    CHECK(ms_st_writer_add(w, "c.bf16", MS_BF16, 1, s3, h, sizeof h, &err) == 0);
    CHECK(ms_st_writer_add(w, "d.scalar", MS_I64, 0, NULL, &i64, 8, &err) == 0);
    CHECK(ms_st_writer_add(w, "e.empty", MS_F32, 1, s0, NULL, 0, &err) == 0);
    CHECK(ms_st_writer_add_fill(w, "f.fill", MS_U8, 1, s7, 77, fill_iota, (void *)3, &err) == 0);
    CHECK(ms_st_writer_add(w, "bad", MS_F32, 1, s3, f, 8, &err) != 0); /* size disagrees */
    CHECK(ms_st_writer_meta(w, "format", "pt", &err) == 0);
    CHECK_MSG(ms_st_writer_finish(w, p, &err) == 0, "%s", err.msg);
    ms_st_writer_free(w);

    /* layout per the format: u64 LE header length, JSON header, data; header padded so data is 8-aligned */
    char *buf;
    size_t len;
    CHECK(ms_read_file(p, 1 << 20, &buf, &len, &err) == 0);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | (uint8_t)buf[i];
    CHECK((8 + hl) % 8 == 0);
    json_t *root = json_loadb(buf + 8, hl, 0, NULL);
    CHECK(root != NULL);
    CHECK_STR(json_string_value(json_object_get(json_object_get(root, "__metadata__"), "format")), "pt");
    json_t *a = json_object_get(root, "a.f32");
    CHECK_STR(json_string_value(json_object_get(a, "dtype")), "F32");
    json_int_t ab = json_integer_value(json_array_get(json_object_get(a, "data_offsets"), 0));
    CHECK(memcmp(buf + 8 + hl + ab, f, sizeof f) == 0);
    /* keys appear sorted in the header text */
    const char *pa = strstr(buf + 8, "\"a.f32\""), *pb = strstr(buf + 8, "\"b.u8\""), *pc = strstr(buf + 8, "\"c.bf16\"");
    CHECK(pa && pb && pc && pa < pb && pb < pc);
    /* data section fully covered, no holes (what the reference implementation requires) */
    uint64_t total = 0;
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (strcmp(k, "__metadata__")) {
            json_t *o = json_object_get(v, "data_offsets");
            total += (uint64_t)(json_integer_value(json_array_get(o, 1)) - json_integer_value(json_array_get(o, 0)));
        }
    }
    CHECK_EQ_INT(total, len - 8 - hl);
    json_decref(root);
    free(buf);

    ms_st_set *s = NULL;
    CHECK_MSG(ms_st_open(p, &s, &err) == 0, "%s", err.msg);
    if (!s) return;
    CHECK_EQ_INT(ms_st_count(s), 6);
    const ms_st_tensor *t = ms_st_find(s, "a.f32");
    CHECK(t && t->dtype == MS_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3);
    CHECK(t && memcmp(t->data, f, sizeof f) == 0 && (uintptr_t)t->data % 4 == 0);
    t = ms_st_find(s, "c.bf16");
    CHECK(t && memcmp(t->data, h, sizeof h) == 0 && (uintptr_t)t->data % 2 == 0);
    t = ms_st_find(s, "d.scalar");
    CHECK(t && t->ndim == 0 && t->nbytes == 8 && *(const int64_t *)t->data == -42);
    t = ms_st_find(s, "e.empty");
    CHECK(t && t->nbytes == 0);
    t = ms_st_find(s, "f.fill");
    CHECK(t && t->nbytes == 77 && ((const uint8_t *)t->data)[10] == (uint8_t)(70 + 3));
    CHECK(ms_st_find(s, "nope") == NULL);
    CHECK_EQ_INT(ms_st_total_bytes(s), sizeof f + sizeof h + 5 + 8 + 77);
    CHECK(ms_st_prefetch(s, 2, &err) == 0);
    ms_st_close(s);
}

static void test_many_tensors(void) {
    enum { N = 20000 };
    char p[1024];
    snprintf(p, sizeof p, "%s/many.safetensors", g_root);
    static float vals[N];
    ms_st_writer *w = ms_st_writer_new();
    ms_err err = {0};
    int64_t one = 1;
    for (int i = 0; i < N; i++) {
        char nm[64];
        vals[i] = (float)i;
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.w", i / 256, i % 256);
        ms_st_writer_add(w, nm, MS_F32, 1, &one, &vals[i], 4, &err);
    }
    CHECK(ms_st_writer_finish(w, p, &err) == 0);
    ms_st_writer_free(w);
    ms_st_set *s = NULL;
    double t0 = ms_now();
    CHECK(ms_st_open(p, &s, &err) == 0);
    double t_open = ms_now() - t0;
    if (!s) return;
    int ok = 1;
    t0 = ms_now();
    for (int i = 0; i < N; i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.w", i / 256, i % 256);
        const ms_st_tensor *t = ms_st_find(s, nm);
        ok &= t && *(const float *)t->data == (float)i;
    }
    double t_find = ms_now() - t0;
    CHECK(ok);
    fprintf(stderr, "  %d tensors: open %.1f ms, %d lookups %.1f ms\n", N, t_open * 1e3, N, t_find * 1e3);
    CHECK(t_find < 1.0); /* hash table, not a scan */
    ms_st_close(s);
}

static void test_shards(void) {
    char d[1024];
    snprintf(d, sizeof d, "%s/sharded", g_root);
    tiny_opts o = {.sharded = 1, .dtype = MS_BF16};
    CHECK(tiny_write(d, &o) == 0);
    char d1[1024];
    snprintf(d1, sizeof d1, "%s/single", g_root);
    tiny_opts o1 = {.dtype = MS_BF16};
    CHECK(tiny_write(d1, &o1) == 0);
    ms_st_set *s = NULL, *s1 = NULL;
    ms_err err = {0};
    CHECK_MSG(ms_st_open(d, &s, &err) == 0, "%s", err.msg);
    CHECK(ms_st_open(d1, &s1, &err) == 0);
    if (!s || !s1) { ms_st_close(s); ms_st_close(s1); return; }
    CHECK_EQ_INT(ms_st_count(s), ms_st_count(s1));
    CHECK_EQ_INT(ms_st_total_bytes(s), ms_st_total_bytes(s1));
    int files_seen[2] = {0, 0}, same = 1;
    for (int i = 0; i < ms_st_count(s); i++) {
        const ms_st_tensor *t = ms_st_at(s, i), *u = ms_st_find(s1, t->name);
        if (t->file >= 0 && t->file < 2) files_seen[t->file]++;
        same &= u && u->nbytes == t->nbytes && memcmp(u->data, t->data, t->nbytes) == 0;
    }
    CHECK(same);
    CHECK(files_seen[0] > 0 && files_seen[1] > 0);
    CHECK(strstr(ms_st_file_name(s, 1), "model-00002-of-00002.safetensors") != NULL);
    CHECK(ms_st_prefetch(s, 0, &err) == 0);
    int n1 = ms_st_count(s1);
    ms_st_close(s);
    ms_st_close(s1);
    /* a directory without index or model.safetensors: all *.safetensors files */
    char p[1024], q[1024];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    snprintf(q, sizeof q, "%s/index.bak", d);
    CHECK(rename(p, q) == 0);
    CHECK(ms_st_open(d, &s, &err) == 0);
    if (s) CHECK_EQ_INT(ms_st_count(s), n1);
    ms_st_close(s);
    /* the same tensor in two files is an error naming both */
    char dup[1024];
    snprintf(dup, sizeof dup, "%s/model-00003.safetensors", d);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", d);
    char *buf;
    size_t len;
    CHECK(ms_read_file(p, 1 << 24, &buf, &len, &err) == 0);
    CHECK(ms_write_file(dup, buf, len, &err) == 0);
    free(buf);
    s = NULL;
    CHECK(ms_st_open(d, &s, &err) != 0);
    CHECK_MSG(strstr(err.msg, "model-00003.safetensors") && strstr(err.msg, "unique"), "%s", err.msg);
}

static void test_errors(void) {
    ms_err err = {0};
    ms_st_set *s = NULL;
    char p[1024];
    snprintf(p, sizeof p, "%s/does-not-exist", g_root);
    CHECK(ms_st_open(p, &s, &err) == MS_ERR_NOT_FOUND && strstr(err.msg, p));
    /* header entry shapes the reader must refuse */
    struct { const char *hdr; const char *needle; } cases[] = {
        {"{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, \"y\": 3}", "'y'"},
        {"{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0]}}", "data_offsets"},
        {"{\"x\": {\"dtype\": 7, \"shape\": [2], \"data_offsets\": [0, 8]}}", "dtype"},
        {"{\"x\": {\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 8]}}", "shape"},
        {"{\"x\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,2], \"data_offsets\": [0, 8]}}", "dims"},
        {"{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, \"x\": {}}", "JSON"},
        {"{\"__metadata__\": 5}", "__metadata__"},
        {"[1, 2]", "not a JSON object"},
        {"{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [-8, 0]}}", "data_offsets"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(p, sizeof p, "%s/bad%zu.safetensors", g_root, i);
        size_t hl = strlen(cases[i].hdr);
        char *buf = calloc(1, 8 + hl + 8);
        for (int k = 0; k < 8; k++) buf[k] = (char)((uint64_t)hl >> (8 * k));
        memcpy(buf + 8, cases[i].hdr, hl);
        CHECK(ms_write_file(p, buf, 8 + hl + 8, &err) == 0);
        free(buf);
        s = NULL;
        int rc = ms_st_open(p, &s, &err);
        CHECK_MSG(rc != 0 && s == NULL, "case %zu opened", i);
        CHECK_MSG(strstr(err.msg, p) && strstr(err.msg, cases[i].needle), "case %zu: %s", i, err.msg);
    }
}

int main(void) {
    g_root = tiny_tmpdir("st");
    if (!g_root) return 1;
    RUN(test_round_trip);
    RUN(test_many_tensors);
    RUN(test_shards);
    RUN(test_errors);
    tiny_rmrf(g_root);
    free(g_root);
    return TEST_SUMMARY();
}
