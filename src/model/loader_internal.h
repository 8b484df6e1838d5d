/* loader_internal.h - what the architecture tables (arch_*.c) use to load the tensors of their
 * attention block: the load context, and linear / tensor loaders that check each tensor's shape and
 * dtype against the config, decide a linear's format by the scale tensors present, generate dummy
 * weights, and cut this rank's tensor-parallel part. Not for use outside src/model. */
#ifndef MS_MODEL_LOADER_INTERNAL_H
#define MS_MODEL_LOADER_INTERNAL_H

#include "model/model_internal.h"

typedef struct ms_load_ctx ms_load_ctx;

/* How a linear W [n_out, n_in] is cut across the tensor-parallel ranks. */
typedef enum ms_split {
    MS_SPLIT_NONE = 0, /* every rank holds the whole weight (replicated) */
    MS_SPLIT_OUT,      /* rank r holds output rows [r*n_out/tp, (r+1)*n_out/tp) (and that part of the bias) */
    MS_SPLIT_IN,       /* rank r holds input columns [r*n_in/tp, ...); the bias stays on rank 0 only, since
                          the partial outputs are summed across ranks */
} ms_split;

/* The config being loaded. */
const ms_config *ms_ld_config(const ms_load_ctx *c);
/* One Linear of the checkpoint's full shape [N, K] named `module` (tensors module.weight, optional
 * scales and bias), cut by `split` for this rank. group: MS_GROUP_*; bias: 0 none, 1 optional, 2
 * required. A split that does not divide the shape, or cuts an FP8 128x128 block or an NVFP4
 * 16-group, fails naming the module, the parts and the block. */
int ms_ld_linear(ms_load_ctx *c, const char *module, int64_t N, int64_t K, int group, int bias, ms_split split,
                 ms_linear *W);
/* A 1-D float tensor [n] (norm weight, bias), replicated. required = 0 leaves data NULL when absent. */
int ms_ld_tensor1(ms_load_ctx *c, const char *name, int64_t n, int required, int group, ms_dummy_kind kind, ms_tensor *out);
/* For an arch table's fuse_placed: when the backend has stack_linears, stacks each layer's linears
 * that parts_of lists (it fills parts, at most MS_STACK_MAX_PARTS, and returns their count; fewer
 * than 2 in any layer leaves the model as it is) into the layer's a_stack, named
 * "model.layers.L.self_attn.<label> (stacked)". A backend refusal at the first layer is logged and
 * leaves every layer unstacked; only a failing backend call is an error. */
#define MS_STACK_MAX_PARTS 4
int ms_ld_stack_layers(ms_model *m, ms_backend *b, const char *label,
                       int (*parts_of)(const ms_model *m, ms_layer *l, ms_linear **parts), ms_err *err);

#endif
