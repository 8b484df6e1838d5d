/* status.c - ms_err formatting and the assertion failure path. */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ms_errf(ms_err *err, int code, const char *fmt, ...) {
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

int ms_err_prefix(ms_err *err, const char *fmt, ...) {
    if (!err) return MS_ERR_RUNTIME;
    char head[MS_ERR_MSG_MAX], old[MS_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", head, old);
    return err->code;
}

const char *ms_code_name(int code) {
    static const char *names[] = {"ok",          "io",        "format",  "invalid",
                                  "nomem",       "unsupported", "not_found", "runtime",
                                  "numerics",    "busy",      "aborted"};
    if (code < 0 || code >= (int)(sizeof names / sizeof names[0])) return "unknown";
    return names[code];
}

void ms_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "moeserve: internal error: assertion `%s` failed at %s:%d\n", expr, file, line);
    abort();
}
