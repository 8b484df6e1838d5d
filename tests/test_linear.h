/* test_linear.h - the ms_linear header every test program builds its weights on (name, format, shape;
 * everything else zero), so the field list lives in one place: a test that makes a plain bf16 router or
 * an expert's quantized rows starts from test_linear_init and fills the weight tensors itself. */
#ifndef MS_TESTS_TEST_LINEAR_H
#define MS_TESTS_TEST_LINEAR_H

#include "backend/backend.h"

#include <string.h>

/* W zeroed, then named (a static string), of format fmt (ms_wfmt) and shape [n_out, n_in]. */
static inline void test_linear_init(ms_linear *W, const char *name, int fmt, int64_t n_out, int64_t n_in) {
    memset(W, 0, sizeof *W);
    W->name = name;
    W->fmt = fmt;
    W->n_out = n_out;
    W->n_in = n_in;
}

/* A plain linear of dtype dt rows [n_out, n_in] whose weight points at data (the caller's memory). */
static inline ms_linear test_plain_linear(const char *name, ms_dtype dt, int64_t n_out, int64_t n_in, void *data) {
    ms_linear W;
    test_linear_init(&W, name, MS_WFMT_PLAIN, n_out, n_in);
    W.w = ms_tensor_2d(dt, n_out, n_in);
    W.w.data = data;
    return W;
}

#endif
