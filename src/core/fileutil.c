/* fileutil.c - see fileutil.h. */
#include "core/fileutil.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int ms_read_file(const char *path, size_t max_bytes, char **out, size_t *len_out, ms_err *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return ms_errf(err, errno == ENOENT ? MS_ERR_NOT_FOUND : MS_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return ms_errf(err, MS_ERR_IO, "%s: not a regular file", path);
    }
    if ((size_t)st.st_size > max_bytes) {
        fclose(f);
        return ms_errf(err, MS_ERR_FORMAT, "%s: file is %lld bytes, limit is %zu", path, (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) { fclose(f); return ms_errf(err, MS_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, n); }
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) { free(buf); return ms_errf(err, MS_ERR_IO, "%s: short read (%zu of %zu bytes)", path, got, n); }
    buf[n] = 0;
    *out = buf;
    if (len_out) *len_out = n;
    return MS_OK;
}

int ms_write_file(const char *path, const void *data, size_t len, ms_err *err) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid()) >= (int)sizeof tmp)
        return ms_errf(err, MS_ERR_INVALID, "%s: path too long", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return ms_errf(err, MS_ERR_IO, "%s: %s", tmp, strerror(errno));
    size_t put = len ? fwrite(data, 1, len, f) : 0;
    int bad = put != len;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return ms_errf(err, MS_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    return MS_OK;
}

int ms_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int ms_path_join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    return (n < 0 || (size_t)n >= cap) ? -1 : 0;
}

double ms_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
