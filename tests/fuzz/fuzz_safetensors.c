/* fuzz_safetensors.c - libFuzzer target: the safetensors reader. First byte: bit 0 set = the rest
 * is model.safetensors.index.json next to one small valid shard; else the rest is
 * model.safetensors itself. Every tensor of an opened set must lie inside its mapping. */
#include "fuzz_util.h"
#include "model/safetensors.h"

static void make_shard(void) {
    static int done;
    if (done) return;
    done = 1;
    ms_st_writer *w = ms_st_writer_new();
    ms_err err = {0};
    int64_t s2[2] = {2, 3}, s1[1] = {4};
    float v[6] = {1, 2, 3, 4, 5, 6};
    ms_st_writer_add(w, "a.weight", MS_F32, 2, s2, v, sizeof v, &err);
    ms_st_writer_add(w, "b.bias", MS_F32, 1, s1, v, 16, &err);
    char p[512];
    snprintf(p, sizeof p, "%s/model-00001-of-00001.safetensors", fz_dir());
    if (ms_st_writer_finish(w, p, &err) != MS_OK) abort();
    ms_st_writer_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    make_shard();
    if (data[0] & 1) {
        fz_unlink("model.safetensors");
        fz_write("model.safetensors.index.json", data + 1, n - 1);
    } else {
        fz_unlink("model.safetensors.index.json");
        fz_write("model.safetensors", data + 1, n - 1);
    }
    ms_st_set *s = NULL;
    ms_err err = {0};
    if (ms_st_open(fz_dir(), &s, &err) == MS_OK) {
        volatile uint8_t sink = 0;
        for (int i = 0; i < ms_st_count(s); i++) {
            const ms_st_tensor *t = ms_st_at(s, i);
            if (ms_st_find(s, t->name) == NULL) abort();
            if (t->nbytes) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
        }
        (void)sink;
        ms_st_close(s);
    } else if (!err.msg[0]) {
        abort();
    }
    return 0;
}
