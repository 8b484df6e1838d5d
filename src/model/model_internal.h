/* model_internal.h - what loader.c and dummy.c share: the model's owned-memory arena and the
 * host-side random weight generators. Not for use outside src/model. */
#ifndef MS_MODEL_MODEL_INTERNAL_H
#define MS_MODEL_MODEL_INTERNAL_H

#include "model/model.h"

/* Allocates n bytes (64-byte aligned, zeroed) owned by the model; freed by ms_model_free. NULL on
 * out-of-memory. */
void *ms_model_alloc(ms_model *m, size_t n);
/* Copies s into model-owned memory (NULL on out-of-memory). */
char *ms_model_strdup(ms_model *m, const char *s);

/* What a dummy tensor stands for, which decides its value range. */
typedef enum ms_dummy_kind {
    MS_DUMMY_NORM,   /* around 1 (RMSNorm/LayerNorm weights) */
    MS_DUMMY_BIAS,   /* small, around 0 (biases, router correction bias) */
    MS_DUMMY_EMBED,  /* unit variance (embedding rows) */
} ms_dummy_kind;

/* Fills t (host memory already allocated, dtype BF16/F16/F32) with seeded random values of the kind. */
void ms_dummy_fill_tensor(ms_tensor *t, ms_dummy_kind kind, uint64_t seed);
/* Allocates W's w/scale in model memory for W->fmt and fills them with seeded random values such
 * that the dequantized weight has variance about 1/n_in (so activations stay O(1)). Plain is BF16.
 * W->n_out, n_in, fmt, name must be set. */
int ms_dummy_linear(ms_model *m, ms_linear *W, uint64_t seed, ms_err *err);

#endif
