/* fuzz_util.h - what the libFuzzer targets share: a private scratch directory for the parsers that
 * read files from a model directory, and a byte-driven splitter that cuts one input into the
 * pieces a streaming parser receives (so chunk boundaries are fuzzed too). Header-only. */
#ifndef MS_TESTS_FUZZ_UTIL_H
#define MS_TESTS_FUZZ_UTIL_H

#include "core/fileutil.h"
#include "core/log.h"
#include "core/status.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A directory of this process ($MS_FUZZ_DIR, else made once under /dev/shm or /tmp); parsers load
 * files from it. */
static inline const char *fz_dir(void) {
    static char dir[256];
    if (!dir[0]) {
        ms_log_set_level(MS_LOG_ERROR);
        const char *env = getenv("MS_FUZZ_DIR"); /* scripts/fuzz.sh: one it removes afterwards */
        if (env && env[0]) {
            snprintf(dir, sizeof dir, "%s", env);
            return dir;
        }
        snprintf(dir, sizeof dir, "%s/ms-fuzz-XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        if (!mkdtemp(dir)) abort();
    }
    return dir;
}

/* Writes data into fz_dir()/name. */
static inline void fz_write(const char *name, const uint8_t *data, size_t n) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", fz_dir(), name);
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    if (n && fwrite(data, 1, n, f) != n) abort();
    fclose(f);
}

static inline void fz_unlink(const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", fz_dir(), name);
    unlink(p);
}

/* Splits [data, data+n) at the first occurrence of the byte sep: *a, *na before it; *b, *nb after
 * (b empty when sep is absent). */
static inline void fz_split(const uint8_t *data, size_t n, uint8_t sep, const uint8_t **a, size_t *na,
                            const uint8_t **b, size_t *nb) {
    const uint8_t *p = memchr(data, sep, n);
    *a = data;
    *na = p ? (size_t)(p - data) : n;
    *b = p ? p + 1 : data + n;
    *nb = p ? n - *na - 1 : 0;
}

/* Chunk lengths for streaming: the i-th chunk is 1 + (seed_i % 17) bytes, seeds from the first
 * byte of the input (the same input always splits the same way). */
static inline size_t fz_chunk(uint32_t *state) {
    *state = *state * 1103515245u + 12345u;
    return 1 + (*state >> 16) % 17;
}

#endif
