/* fileutil.h - small file helpers with explicit size limits (outside input is never trusted). */
#ifndef MS_CORE_FILEUTIL_H
#define MS_CORE_FILEUTIL_H

#include "core/status.h"

#include <stddef.h>

/* Reads a whole file into a NUL-terminated malloc'd buffer (caller frees). Fails with a message
 * naming the path if it is missing or larger than max_bytes. *len_out (may be NULL) gets the size. */
int ms_read_file(const char *path, size_t max_bytes, char **out, size_t *len_out, ms_err *err);

/* Writes len bytes to path atomically (temp file + rename). */
int ms_write_file(const char *path, const void *data, size_t len, ms_err *err);

/* 1 if path exists (any type), else 0. */
int ms_path_exists(const char *path);

/* Joins dir and name into out (size cap); returns 0 or -1 when it does not fit. */
int ms_path_join(char *out, size_t cap, const char *dir, const char *name);

/* Monotonic clock in seconds. */
double ms_now(void);

#endif
