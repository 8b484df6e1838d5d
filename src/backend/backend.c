/* backend.c - backend registry: creates "cpu" or "cuda" by name. The CUDA backend is linked only
 * when the build has it (MS_HAVE_CUDA); its constructor lives behind a C header. */
#include "backend/backend.h"

#include <stdlib.h>
#include <string.h>

int ms_backend_cpu_create(ms_backend **out, ms_err *err);
#ifdef MS_HAVE_CUDA
int ms_backend_cuda_create(int device, ms_backend **out, ms_err *err);
int ms_bench_gpu_ceilings(ms_backend *b, double *copy_gbs, double *bf16_tflops, ms_err *err);
#endif

int ms_backend_gpu_ceilings(ms_backend *b, double *copy_gbs, double *bf16_tflops, ms_err *err) {
#ifdef MS_HAVE_CUDA
    if (!strcmp(b->name, "cuda")) return ms_bench_gpu_ceilings(b, copy_gbs, bf16_tflops, err);
#endif
    return ms_errf(err, MS_ERR_UNSUPPORTED, "backend %s has no GPU ceiling probe", b->name);
}

int ms_backend_cuda_compiled(void) {
#ifdef MS_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

int ms_backend_create(const char *name, int device, ms_backend **out, ms_err *err) {
    *out = NULL;
    if (!name || !strcmp(name, "cpu")) return ms_backend_cpu_create(out, err);
    if (!strcmp(name, "cuda")) {
#ifdef MS_HAVE_CUDA
        return ms_backend_cuda_create(device, out, err);
#else
        return ms_errf(err, MS_ERR_UNSUPPORTED,
                       "flag --device cuda: this moeserve was built without CUDA (rebuild with nvcc on PATH)");
#endif
    }
    return ms_errf(err, MS_ERR_INVALID, "flag --device: unknown device '%s' (supported: cpu, cuda)", name);
}

void ms_backend_destroy(ms_backend *b) {
    if (b) b->ops->destroy(b);
}

int ms_backend_alloc(ms_backend *b, ms_tensor *t, ms_dtype dtype, int ndim, const int64_t *shape, ms_err *err) {
    *t = ms_tensor_make(dtype, ndim, shape);
    return b->ops->alloc(b, t, err);
}
