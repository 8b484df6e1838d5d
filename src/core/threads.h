/* threads.h - a persistent worker pool for data-parallel CPU loops.
 *
 * The CPU backend splits every op into index ranges and runs them on all cores. Workers are
 * created once (no per-op thread creation) and pick chunks from an atomic counter, so uneven work
 * (MoE experts with different token counts) balances itself. Calls from several threads at once
 * are serialized by the pool. */
#ifndef MS_CORE_THREADS_H
#define MS_CORE_THREADS_H

#include <stdint.h>

typedef struct ms_pool ms_pool;

/* Work function: processes items [begin, end). `worker` is 0..n_threads-1, stable per call, so
 * it can index per-thread scratch buffers. */
typedef void (*ms_range_fn)(void *ctx, int64_t begin, int64_t end, int worker);

/* CPUs this process may run on: the calling thread's affinity mask (taskset, cgroup cpusets,
 * container limits), not every online CPU. Falls back to the online CPU count when the mask cannot
 * be read. Always >= 1. */
int ms_cpu_count_allowed(void);

/* Physical cores among the CPUs ms_cpu_count_allowed counts (hwloc topology: a core counts once
 * when any of its hardware threads is allowed). Falls back to ms_cpu_count_allowed() when the
 * topology cannot be read or has no cores. Always >= 1. Reads the topology on every call (a few
 * milliseconds): call it once at start-up. */
int ms_cpu_count_cores(void);

/* The default worker count: MS_THREADS when set (values below 1 count as 1), else
 * ms_cpu_count_cores() (one worker per physical core: the kernels are memory- or FMA-bound, and a
 * second hardware thread on a core adds little but contention). */
int ms_default_threads(void);

/* Creates a pool of n_threads (<= 0: ms_default_threads()). Returns NULL on failure. The calling
 * thread also works, as worker 0. */
ms_pool *ms_pool_create(int n_threads);
void ms_pool_destroy(ms_pool *p);
int ms_pool_size(const ms_pool *p);

/* Runs fn over [0, n) in chunks of at least `grain` items on all workers and returns when all
 * are done. n <= grain runs inline on the caller. */
void ms_pool_run(ms_pool *p, int64_t n, int64_t grain, ms_range_fn fn, void *ctx);

/* The process-wide default pool (created on first use, never destroyed). */
ms_pool *ms_pool_default(void);

#endif
