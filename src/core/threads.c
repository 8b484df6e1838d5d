/* threads.c - see threads.h. A generation counter wakes workers for each job; chunks are claimed
 * with an atomic fetch-add. Rejected: OpenMP (its runtime spins and fights the engine threads and
 * libmicrohttpd's pool for the two cores CI has). */
#include "core/threads.h"

#include "core/status.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct ms_pool {
    int n;
    pthread_t *th;
    pthread_mutex_t mu;      /* guards the job fields and generation */
    pthread_cond_t cv_start; /* workers wait for a new generation */
    pthread_cond_t cv_done;
    pthread_mutex_t run_mu; /* serializes ms_pool_run callers */
    uint64_t gen;
    int stop;
    int active; /* workers still inside the current job */
    /* current job */
    ms_range_fn fn;
    void *ctx;
    int64_t n_items, chunk;
    atomic_llong next;
};

static void run_chunks(ms_pool *p, int worker) {
    for (;;) {
        int64_t b = atomic_fetch_add(&p->next, p->chunk);
        if (b >= p->n_items) break;
        int64_t e = b + p->chunk < p->n_items ? b + p->chunk : p->n_items;
        p->fn(p->ctx, b, e, worker);
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
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        run_chunks(p, wa.id);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->cv_done);
        pthread_mutex_unlock(&p->mu);
    }
}

ms_pool *ms_pool_create(int n_threads) {
    if (n_threads <= 0) {
        const char *env = getenv("MS_THREADS");
        n_threads = env ? atoi(env) : (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (n_threads <= 0) n_threads = 1;
    }
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
    pthread_mutex_lock(&p->run_mu);
    /* ~4 chunks per worker balances uneven items without much counter traffic */
    int64_t chunk = n / ((int64_t)p->n * 4);
    if (chunk < grain) chunk = grain;
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    p->active = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->cv_done, &p->mu);
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
