/* log.h - leveled logging to stderr, thread-safe, with a process-wide level.
 * Level from MS_LOG (error|warn|info|debug) or ms_log_set_level(). */
#ifndef MS_CORE_LOG_H
#define MS_CORE_LOG_H

enum { MS_LOG_ERROR = 0, MS_LOG_WARN = 1, MS_LOG_INFO = 2, MS_LOG_DEBUG = 3 };

/* Sets the global level; messages above it are dropped. */
void ms_log_set_level(int level);
int ms_log_level(void);
/* Writes one line "[moeserve] LEVEL message" to stderr (newline added). */
void ms_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define MS_LOGE(...) ms_log(MS_LOG_ERROR, __VA_ARGS__)
#define MS_LOGW(...) ms_log(MS_LOG_WARN, __VA_ARGS__)
#define MS_LOGI(...) ms_log(MS_LOG_INFO, __VA_ARGS__)
#define MS_LOGD(...) ms_log(MS_LOG_DEBUG, __VA_ARGS__)

#endif
