/* comm.c - choosing a communicator by capability, so callers never name an implementation they
 * cannot have (a CPU-only build, a machine without a GPU), plus the NCCL entry points of builds
 * without CUDA (they say why they cannot work). */
#include "dist/comm.h"
#include "dist/dist_internal.h"

#include <stdio.h>
#include <string.h>

void ms_comm_destroy(ms_comm *c) {
    if (c) c->ops->destroy(c);
}

const char *ms_comm_kind_for_backend(const char *backend_name, int nnodes) {
    if (backend_name && strcmp(backend_name, "cuda") == 0) return "nccl";
    return nnodes > 1 ? "tcp" : "local";
}

#ifndef MS_HAVE_CUDA
int ms_comm_nccl_available(char *why, size_t why_size) {
    if (why) snprintf(why, why_size, "this build has no CUDA/NCCL (built with CUDA=0 or without nvcc)");
    return 0;
}

int ms_comm_nccl_unique_id(unsigned char id[MS_COMM_NCCL_ID_BYTES], ms_err *err) {
    return ms_errf(err, MS_ERR_UNSUPPORTED, "nccl comm: this build has no CUDA/NCCL (built with CUDA=0 or without nvcc)");
}

int ms_comm_nccl_create(ms_backend *b, const unsigned char id[MS_COMM_NCCL_ID_BYTES], int rank, int size,
                        double timeout_s, ms_comm **out, ms_err *err) {
    *out = NULL;
    return ms_errf(err, MS_ERR_UNSUPPORTED, "nccl comm: this build has no CUDA/NCCL (built with CUDA=0 or without nvcc)");
}
#endif

int ms_dist_available(const char *kind, char *why, size_t why_size) {
    if (kind && (strcmp(kind, "local") == 0 || strcmp(kind, "tcp") == 0)) return 1;
    if (kind && strcmp(kind, "nccl") == 0) return ms_comm_nccl_available(why, why_size);
    if (why) snprintf(why, why_size, "unknown communicator kind \"%s\" (local, tcp or nccl)", kind ? kind : "(null)");
    return 0;
}
