/* threads.c - see threads.h.
 *
 * Design: the caller publishes a job (under a mutex, bumping a generation number) and works on it
 * itself; sleeping workers are woken by a broadcast. Chunks are claimed from one 64-bit atomic that
 * packs (generation << 40 | next index) with a compare-and-swap, so a worker that wakes late, after
 * the job it was woken for is over, can never claim an item of a later job. The caller returns as
 * soon as every item is done (an atomic count), never waiting for workers that have not woken yet:
 * on a loaded 2-core machine a wake-up can take milliseconds, and waiting for it made small ops
 * cost more than the work. Rejected: OpenMP (its runtime spins and fights the engine threads and
 * libmicrohttpd's pool for the two cores CI has).
 *
 * The default size counts what the process may use, not what the machine has: the CPUs of the
 * affinity mask (sched_getaffinity), grouped into physical cores with hwloc. */
#include "core/threads.h"

#include "core/status.h"

#include <hwloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define GEN_SHIFT 40
#define IDX_MASK ((1ull << GEN_SHIFT) - 1)

typedef struct job {
    ms_range_fn fn;
    void *ctx;
    int64_t n, chunk;
    uint64_t gen;
} job;

struct ms_pool {
    int n;
    pthread_t *th;
    pthread_mutex_t mu;      /* guards `cur`, `gen`, `stop` */
    pthread_cond_t cv_start; /* workers wait for a new generation */
    pthread_cond_t cv_done;  /* the caller waits for the last item */
    pthread_mutex_t run_mu;  /* serializes ms_pool_run callers */
    uint64_t gen;
    int stop;
    job cur;
    _Atomic uint64_t next;   /* gen << GEN_SHIFT | next item index */
    _Atomic int64_t done;    /* items finished in the current job */
};

/* Claims and runs chunks of job j until none are left or the pool moved to another job. */
static void run_chunks(ms_pool *p, const job *j, int worker) {
    uint64_t g = (j->gen & ((1ull << (64 - GEN_SHIFT)) - 1)) << GEN_SHIFT;
    for (;;) {
        uint64_t v = atomic_load(&p->next);
        int64_t b;
        do {
            if ((v & ~IDX_MASK) != g) return;
            b = (int64_t)(v & IDX_MASK);
            if (b >= j->n) return;
        } while (!atomic_compare_exchange_weak(&p->next, &v, v + (uint64_t)j->chunk));
        int64_t e = b + j->chunk < j->n ? b + j->chunk : j->n;
        j->fn(j->ctx, b, e, worker);
        if (atomic_fetch_add(&p->done, e - b) + (e - b) == j->n) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

typedef struct { ms_pool *p; int id; } worker_arg;

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    ms_pool *p = wa.p;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->stop && p->gen == seen) pthread_cond_wait(&p->cv_start, &p->mu);
        if (p->stop) { pthread_mutex_unlock(&p->mu); return NULL; }
        job j = p->cur; /* a private copy: the caller may publish the next job while we run */
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        run_chunks(p, &j, wa.id);
    }
}

/* The calling thread's affinity mask, allocated with CPU_ALLOC (free with CPU_FREE); *size gets its
 * size in bytes. NULL when it cannot be read. Grows past 1024 CPUs when the kernel asks for it. */
static cpu_set_t *affinity_mask(size_t *size) {
    for (int ncpu = 1024; ncpu <= (1 << 16); ncpu *= 2) {
        cpu_set_t *set = CPU_ALLOC(ncpu);
        if (!set) return NULL;
        size_t sz = CPU_ALLOC_SIZE(ncpu);
        CPU_ZERO_S(sz, set);
        if (sched_getaffinity(0, sz, set) == 0) {
            *size = sz;
            return set;
        }
        CPU_FREE(set);
    }
    return NULL;
}

static int online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 1 ? (int)n : 1;
}

int ms_cpu_count_allowed(void) {
    size_t sz;
    cpu_set_t *set = affinity_mask(&sz);
    if (!set) return online_cpus();
    int n = CPU_COUNT_S(sz, set);
    CPU_FREE(set);
    return n >= 1 ? n : online_cpus();
}

/* Physical cores with at least one hardware thread in `set`; 0 when hwloc cannot tell. */
static int cores_in(const cpu_set_t *set, size_t sz) {
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0) return 0;
    /* only cores and their hardware threads are needed: skip caches, NUMA details, I/O */
    hwloc_topology_set_all_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_NONE);
    hwloc_topology_set_type_filter(topo, HWLOC_OBJ_CORE, HWLOC_TYPE_FILTER_KEEP_ALL);
    int n = 0;
    hwloc_bitmap_t allowed = hwloc_bitmap_alloc();
    if (allowed && hwloc_topology_load(topo) == 0) {
        for (int cpu = 0; cpu < (int)(sz * 8); cpu++)
            if (CPU_ISSET_S(cpu, sz, set)) hwloc_bitmap_set(allowed, (unsigned)cpu);
        int ncore = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
        for (int i = 0; i < ncore; i++) {
            hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, (unsigned)i);
            if (core && core->cpuset && hwloc_bitmap_intersects(core->cpuset, allowed)) n++;
        }
    }
    hwloc_bitmap_free(allowed);
    hwloc_topology_destroy(topo);
    return n;
}

int ms_cpu_count_cores(void) {
    size_t sz;
    cpu_set_t *set = affinity_mask(&sz);
    if (!set) return online_cpus();
    int allowed = CPU_COUNT_S(sz, set);
    int cores = allowed >= 1 ? cores_in(set, sz) : 0;
    CPU_FREE(set);
    if (allowed < 1) return online_cpus();
    return cores >= 1 && cores <= allowed ? cores : allowed;
}

int ms_default_threads(void) {
    const char *env = getenv("MS_THREADS");
    if (env) {
        int n = atoi(env);
        return n >= 1 ? n : 1;
    }
    return ms_cpu_count_cores();
}

ms_pool *ms_pool_create(int n_threads) {
    if (n_threads <= 0) n_threads = ms_default_threads();
    if (n_threads > 256) n_threads = 256;
    ms_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    p->th = calloc((size_t)n_threads, sizeof *p->th);
    if (!p->th) { free(p); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) { p->n = i; break; }
        wa->p = p;
        wa->id = i;
        if (pthread_create(&p->th[i], NULL, worker_main, wa) != 0) { free(wa); p->n = i; break; }
    }
    return p;
}

void ms_pool_destroy(ms_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
    free(p->th);
    free(p);
}

int ms_pool_size(const ms_pool *p) { return p ? p->n : 1; }

void ms_pool_run(ms_pool *p, int64_t n, int64_t grain, ms_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (!p || p->n == 1 || n <= grain) { fn(ctx, 0, n, 0); return; }
    MS_ASSERT((uint64_t)n < IDX_MASK / 2);
    pthread_mutex_lock(&p->run_mu);
    /* ~4 chunks per worker balances uneven items without much counter traffic */
    int64_t chunk = n / ((int64_t)p->n * 4);
    if (chunk < grain) chunk = grain;
    pthread_mutex_lock(&p->mu);
    p->gen++;
    p->cur = (job){.fn = fn, .ctx = ctx, .n = n, .chunk = chunk, .gen = p->gen};
    atomic_store(&p->done, 0);
    atomic_store(&p->next, (p->gen & ((1ull << (64 - GEN_SHIFT)) - 1)) << GEN_SHIFT);
    job j = p->cur;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p, &j, 0);
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->done) < n) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->run_mu);
}

static ms_pool *g_default;
static pthread_once_t g_default_once = PTHREAD_ONCE_INIT;
static void make_default(void) { g_default = ms_pool_create(0); }

ms_pool *ms_pool_default(void) {
    pthread_once(&g_default_once, make_default);
    MS_ASSERT(g_default != NULL);
    return g_default;
}
