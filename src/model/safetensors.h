/* safetensors.h - read-only access to .safetensors checkpoints (single file or sharded with
 * model.safetensors.index.json) through mmap.
 *
 * Every header field is validated against the file size before use: offsets inside the data
 * section, no overlaps, byte size == dtype size x product(shape). Tensor data stays in the page
 * cache (no copy); views are valid until ms_st_close. Shards are opened (and optionally prefetched)
 * in parallel. */
#ifndef MS_MODEL_SAFETENSORS_H
#define MS_MODEL_SAFETENSORS_H

#include "core/dtype.h"
#include "core/status.h"

#include <stddef.h>
#include <stdint.h>

#define MS_MAX_DIMS 8

typedef struct ms_st_tensor {
    const char *name;     /* owned by the set */
    ms_dtype dtype;
    int ndim;
    int64_t shape[MS_MAX_DIMS];
    const void *data;     /* inside the mmap */
    size_t nbytes;
    int file;             /* shard index */
} ms_st_tensor;

typedef struct ms_st_set ms_st_set;

/* Opens DIR/model.safetensors or the shards listed by DIR/model.safetensors.index.json (or a single
 * *.safetensors path). Errors name the file and the tensor or field. */
int ms_st_open(const char *path, ms_st_set **out, ms_err *err);
void ms_st_close(ms_st_set *s);
/* Tensor by exact name, NULL when absent. O(1) average. */
const ms_st_tensor *ms_st_find(const ms_st_set *s, const char *name);
int ms_st_count(const ms_st_set *s);
const ms_st_tensor *ms_st_at(const ms_st_set *s, int i);
/* Path of shard i (for messages). */
const char *ms_st_file_name(const ms_st_set *s, int file);
/* Total bytes of tensor data over all shards. */
uint64_t ms_st_total_bytes(const ms_st_set *s);
/* Touches all pages of all shards with n_threads readers (parallel shard reads), showing progress
 * (tensors, bytes, MB/s) on stderr when it is a terminal. Optional: the mmap works without it. */
int ms_st_prefetch(ms_st_set *s, int n_threads, ms_err *err);
/* Same, with progress shown only when `progress` is set (and stderr is a terminal). */
int ms_st_prefetch_ex(ms_st_set *s, int n_threads, int progress, ms_err *err);

/* Writer: collects tensors then writes one .safetensors file (header sorted by name, 8-byte
 * aligned data). Data pointers are borrowed until ms_st_writer_finish returns. */
typedef struct ms_st_writer ms_st_writer;
ms_st_writer *ms_st_writer_new(void);
int ms_st_writer_add(ms_st_writer *w, const char *name, ms_dtype dtype, int ndim, const int64_t *shape,
                     const void *data, size_t nbytes, ms_err *err);
/* Like ms_st_writer_add, but the data is produced at write time: fill(ctx, name, buf, nbytes, err)
 * writes exactly nbytes into buf (a temporary buffer), so a writer of a big checkpoint holds only
 * one tensor in memory at a time. ctx is borrowed until ms_st_writer_finish returns. */
typedef int (*ms_st_fill_fn)(void *ctx, const char *name, void *buf, size_t nbytes, ms_err *err);
int ms_st_writer_add_fill(ms_st_writer *w, const char *name, ms_dtype dtype, int ndim, const int64_t *shape,
                          size_t nbytes, ms_st_fill_fn fill, void *ctx, ms_err *err);
/* Optional __metadata__ entries (string -> string). */
int ms_st_writer_meta(ms_st_writer *w, const char *key, const char *value, ms_err *err);
int ms_st_writer_finish(ms_st_writer *w, const char *path, ms_err *err);
void ms_st_writer_free(ms_st_writer *w);

#endif
