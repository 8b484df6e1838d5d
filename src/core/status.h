/* status.h - error reporting shared by every layer.
 *
 * Recoverable failures return an int status (MS_OK == 0) and fill a caller-owned ms_err with one
 * sentence that names the file, tensor, field or flag at fault. Invariants (programming errors)
 * use MS_ASSERT, which aborts with the location. No library code calls exit(). */
#ifndef MS_CORE_STATUS_H
#define MS_CORE_STATUS_H

#include <stddef.h>

typedef enum ms_code {
    MS_OK = 0,
    MS_ERR_IO,          /* open/read/mmap/write failed */
    MS_ERR_FORMAT,      /* a file or message is malformed (bad header, bad JSON, bad shape) */
    MS_ERR_INVALID,     /* a caller-supplied value is out of range (flag, request field) */
    MS_ERR_NOMEM,       /* allocation failed or a configured limit was hit */
    MS_ERR_UNSUPPORTED, /* valid input we do not implement (dtype, model_type, GPU) */
    MS_ERR_NOT_FOUND,   /* a named tensor/file/model is missing */
    MS_ERR_RUNTIME,     /* device/library failure (CUDA, cuBLAS, NCCL, threads) */
    MS_ERR_NUMERICS,    /* NaN/Inf detected by --check-numerics */
    MS_ERR_BUSY,        /* queue full: retry later */
    MS_ERR_ABORTED,     /* request cancelled */
} ms_code;

#define MS_ERR_MSG_MAX 512

/* Caller-owned error slot: code plus one human sentence. Zero-initialise before use. */
typedef struct ms_err {
    int code;
    char msg[MS_ERR_MSG_MAX];
} ms_err;

/* Sets err (may be NULL) to code and a printf-formatted message; returns code so callers can
 * write `return ms_errf(err, MS_ERR_FORMAT, "%s: ...", path);`. */
int ms_errf(ms_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Prefixes an existing message with context ("loading X: <old message>"); returns err->code. */
int ms_err_prefix(ms_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Short name of a status code ("format", "io", ...), never NULL. */
const char *ms_code_name(int code);

/* Invariant check: a false condition is a bug in moeserve, not bad input. Always on. */
#define MS_ASSERT(cond)                                                                           \
    do {                                                                                          \
        if (!(cond)) ms_assert_fail(#cond, __FILE__, __LINE__);                                   \
    } while (0)

_Noreturn void ms_assert_fail(const char *expr, const char *file, int line);

#define MS_TRY(expr)                                                                              \
    do {                                                                                          \
        int ms_try_rc_ = (expr);                                                                  \
        if (ms_try_rc_ != MS_OK) return ms_try_rc_;                                               \
    } while (0)

#endif
