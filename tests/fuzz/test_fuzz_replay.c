/* test_fuzz_replay.c - every fuzz target's seed corpus and every input that once crashed a target
 * (tests/fuzz/regress/TARGET/), replayed through the target in the ordinary test build (and under
 * ASan/UBSan by `make asan`), so a parser regression is caught without running libFuzzer. The
 * targets are compiled in here with their entry points renamed. */
#include "test.h"

#include <dirent.h>

#define LLVMFuzzerTestOneInput fz_api
#include "fuzz_api.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_parsers
#include "fuzz_parsers.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_sse
#include "fuzz_sse.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_config
#include "fuzz_config.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_safetensors
#include "fuzz_safetensors.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_tokenizer
#include "fuzz_tokenizer.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_template
#include "fuzz_template.c"
#undef LLVMFuzzerTestOneInput

typedef int (*fz_fn)(const uint8_t *, size_t);

/* Runs every file of dir through fn; returns how many. */
static int replay_dir(const char *dir, fz_fn fn) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        char *buf = NULL;
        size_t len = 0;
        ms_err err = {0};
        if (ms_read_file(p, 1 << 24, &buf, &len, &err) != MS_OK) continue;
        fn((const uint8_t *)buf, len);
        free(buf);
        n++;
    }
    closedir(d);
    return n;
}

static void replay(const char *name, fz_fn fn) {
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fuzz/corpus/%s", name);
    int n = replay_dir(dir, fn);
    CHECK_MSG(n > 0, "no seed corpus in %s", dir);
    snprintf(dir, sizeof dir, "tests/fuzz/regress/%s", name);
    replay_dir(dir, fn);
}

static void test_api(void) { replay("fuzz_api", fz_api); }
static void test_parsers(void) { replay("fuzz_parsers", fz_parsers); }
static void test_sse(void) { replay("fuzz_sse", fz_sse); }
static void test_config(void) { replay("fuzz_config", fz_config); }
static void test_safetensors(void) { replay("fuzz_safetensors", fz_safetensors); }
static void test_tokenizer(void) { replay("fuzz_tokenizer", fz_tokenizer); }
static void test_template(void) { replay("fuzz_template", fz_template); }

int main(void) {
    RUN(test_api);
    RUN(test_parsers);
    RUN(test_sse);
    RUN(test_config);
    RUN(test_safetensors);
    RUN(test_tokenizer);
    RUN(test_template);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fz_dir());
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", fz_dir());
    return TEST_SUMMARY();
}
