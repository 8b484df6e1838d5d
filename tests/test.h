/* test.h - the tiny test harness every C test uses (no framework).
 *
 * A test file defines `static void test_x(void)` functions and a main() that calls RUN(test_x)
 * for each and returns TEST_SUMMARY(). A case passes when none of its CHECKs failed. The summary
 * line "## <file>: N passed, M failed" is what tests/run.sh adds up. */
#ifndef MS_TESTS_TEST_H
#define MS_TESTS_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int t_cases_pass, t_cases_fail, t_case_failed;
static const char *t_case_name = "";

#define CHECK(cond)                                                                               \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            t_case_failed = 1;                                                                    \
            fprintf(stderr, "  FAIL %s:%d (%s): %s\n", __FILE__, __LINE__, t_case_name, #cond);  \
        }                                                                                         \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                      \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            t_case_failed = 1;                                                                    \
            fprintf(stderr, "  FAIL %s:%d (%s): %s: ", __FILE__, __LINE__, t_case_name, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fputc('\n', stderr);                                                                  \
        }                                                                                         \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                        \
    do {                                                                                          \
        long long t_a_ = (long long)(a), t_b_ = (long long)(b);                                   \
        CHECK_MSG(t_a_ == t_b_, "%lld != %lld", t_a_, t_b_);                                      \
    } while (0)

#define CHECK_STR(a, b)                                                                           \
    do {                                                                                          \
        const char *t_a_ = (a), *t_b_ = (b);                                                      \
        CHECK_MSG(t_a_ && t_b_ && strcmp(t_a_, t_b_) == 0, "\"%s\" != \"%s\"", t_a_ ? t_a_ : "(null)", \
                  t_b_ ? t_b_ : "(null)");                                                        \
    } while (0)

#define CHECK_CLOSE(a, b, tol)                                                                    \
    do {                                                                                          \
        double t_a_ = (double)(a), t_b_ = (double)(b);                                            \
        CHECK_MSG(fabs(t_a_ - t_b_) <= (tol), "%.9g vs %.9g (tol %g)", t_a_, t_b_, (double)(tol)); \
    } while (0)

/* MS_TEST_ONLY=a,b (environment): run only the cases whose function name contains a or b (a GPU
 * script's time budget); unset = all. */
static inline int t_wanted(const char *name) {
    const char *f = getenv("MS_TEST_ONLY");
    if (!f || !*f) return 1;
    while (*f) {
        size_t n = strcspn(f, ",");
        for (const char *p = name; n && *p; p++)
            if (!strncmp(p, f, n)) return 1;
        f += n + (f[n] == ',');
    }
    return 0;
}

#define RUN(fn)                                                                                   \
    do {                                                                                          \
        if (!t_wanted(#fn)) break;                                                                \
        t_case_name = #fn;                                                                        \
        t_case_failed = 0;                                                                        \
        fn();                                                                                     \
        if (t_case_failed) { t_cases_fail++; fprintf(stderr, "FAIL %s\n", #fn); }                 \
        else { t_cases_pass++; fprintf(stderr, "ok   %s\n", #fn); }                               \
    } while (0)

#define TEST_SUMMARY()                                                                            \
    (printf("## %s: %d passed, %d failed\n", __FILE__, t_cases_pass, t_cases_fail),               \
     t_cases_fail ? 1 : 0)

/* Seconds on a monotonic clock (for hang guards only: tests never assert on elapsed time). */
static inline double t_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sleeps about ms milliseconds. */
static inline void t_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Evaluates cond every 2 ms until it holds (1) or T_HANG_S seconds pass (0). For waiting on an
 * event another thread publishes (stats after a step, a request ending): the limit is only a
 * guard against a hang, generous enough for a loaded machine, never a performance claim. */
#define T_HANG_S 60.0
#define T_WAIT_UNTIL(cond)                                                                        \
    ({                                                                                            \
        double t_dl_ = t_now() + T_HANG_S;                                                        \
        int t_ok_;                                                                                \
        while (!(t_ok_ = !!(cond)) && t_now() < t_dl_) t_sleep_ms(2);                             \
        t_ok_;                                                                                    \
    })

/* Cut points 1..n-1 of an n-byte text (every split into two non-empty parts), malloc'd; *n_cuts
 * gets their count. For feeding streaming parsers a byte at a time. */
static inline size_t *t_cuts_every_byte(size_t n, int *n_cuts) {
    size_t *cuts = malloc((n + 1) * sizeof *cuts);
    for (size_t k = 0; k + 1 < n; k++) cuts[k] = k + 1;
    *n_cuts = n > 0 ? (int)n - 1 : 0;
    return cuts;
}

#endif
