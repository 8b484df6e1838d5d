/* fuzz_tokenizer.c - libFuzzer target: tokenizer.json and tokenizer_config.json (ms_tokenizer_load),
 * then encode/decode round trips on what loads. The input is split at the first NUL byte:
 * tokenizer.json before it, tokenizer_config.json after (absent when there is no NUL). */
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    const uint8_t *a, *b;
    size_t na, nb;
    fz_split(data, n, 0, &a, &na, &b, &nb);
    fz_write("tokenizer.json", a, na);
    if (nb) fz_write("tokenizer_config.json", b, nb);
    else fz_unlink("tokenizer_config.json");
    ms_tokenizer *t = NULL;
    ms_err err = {0};
    if (ms_tokenizer_load(fz_dir(), &t, &err) != MS_OK) {
        if (!err.msg[0]) abort();
        return 0;
    }
    static const char *const texts[] = {"Hello, world! 123 <think>x</think>", "\xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80\n\n  tabs\t",
                                        ""};
    for (size_t i = 0; i < sizeof texts / sizeof *texts + 1; i++) {
        const char *s = i < 3 ? texts[i] : (const char *)b; /* also the config bytes as text */
        size_t len = i < 3 ? strlen(s) : (nb > 256 ? 256 : nb);
        int32_t *ids = NULL;
        int nid = 0;
        if (ms_tokenizer_encode(t, s, len, (int)(i & 1), &ids, &nid, &err) == MS_OK) {
            char *out = NULL;
            size_t olen = 0;
            if (ms_tokenizer_decode(t, ids, nid, 0, &out, &olen, &err) == MS_OK) free(out);
            ms_detok *d = ms_detok_new(t, 1);
            char *buf = NULL;
            size_t bl = 0, bc = 0;
            for (int k = 0; d && k < nid; k++) ms_detok_push(d, ids[k], &buf, &bl, &bc, &err);
            if (d) ms_detok_flush(d, &buf, &bl, &bc, &err);
            free(buf);
            ms_detok_free(d);
        }
        free(ids);
    }
    int V = ms_tokenizer_vocab_size(t);
    for (int32_t id = 0; id < V && id < 64; id++) ms_tokenizer_id_to_token(t, id);
    ms_tokenizer_free(t);
    return 0;
}
