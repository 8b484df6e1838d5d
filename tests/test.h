/* test.h - the tiny test harness every C test uses (no framework).
 *
 * A test file defines `static void test_x(void)` functions and a main() that calls RUN(test_x)
 * for each and returns TEST_SUMMARY(). A case passes when none of its CHECKs failed. The summary
 * line "## <file>: N passed, M failed" is what tests/run.sh adds up. */
#ifndef MS_TESTS_TEST_H
#define MS_TESTS_TEST_H

#include <math.h>
#include <stdio.h>
#include <string.h>

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

#define RUN(fn)                                                                                   \
    do {                                                                                          \
        t_case_name = #fn;                                                                        \
        t_case_failed = 0;                                                                        \
        fn();                                                                                     \
        if (t_case_failed) { t_cases_fail++; fprintf(stderr, "FAIL %s\n", #fn); }                 \
        else { t_cases_pass++; fprintf(stderr, "ok   %s\n", #fn); }                               \
    } while (0)

#define TEST_SUMMARY()                                                                            \
    (printf("## %s: %d passed, %d failed\n", __FILE__, t_cases_pass, t_cases_fail),               \
     t_cases_fail ? 1 : 0)

#endif
