/* log.c - see log.h. One fprintf per line under a mutex so lines from threads never interleave. */
#include "core/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_level = -1;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static int level_from_env(void) {
    const char *s = getenv("MS_LOG");
    if (!s) return MS_LOG_INFO;
    if (!strcmp(s, "error")) return MS_LOG_ERROR;
    if (!strcmp(s, "warn")) return MS_LOG_WARN;
    if (!strcmp(s, "debug")) return MS_LOG_DEBUG;
    return MS_LOG_INFO;
}

void ms_log_set_level(int level) { g_level = level; }

int ms_log_level(void) {
    if (g_level < 0) g_level = level_from_env();
    return g_level;
}

void ms_log(int level, const char *fmt, ...) {
    if (level > ms_log_level()) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&g_mu);
    fprintf(stderr, "[moeserve] %s: %s\n", names[level], buf);
    pthread_mutex_unlock(&g_mu);
}
