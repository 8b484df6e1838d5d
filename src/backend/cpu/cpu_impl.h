/* cpu_impl.h - private state of the CPU backend shared by its source files (ops split by theme:
 * cpu_backend.c memory/elementwise/GEMM/routing, cpu_attn.c caches and attention). */
#ifndef MS_BACKEND_CPU_IMPL_H
#define MS_BACKEND_CPU_IMPL_H

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"

typedef struct cpu_impl {
    ms_pool *pool;
    int nth;
    /* per-thread scratch: nth slices of scr_per floats, grown on demand (rarely: sizes depend only on
     * model dims and the longest context seen) */
    float *scr;
    size_t scr_per;
    /* caller-thread buffers: converted norm weights, router logits */
    float *wbuf;
    size_t wbuf_cap;
    float *aux;
    size_t aux_cap;
} cpu_impl;

static inline cpu_impl *cpu_of(ms_backend *b) { return (cpu_impl *)b->impl; }

/* Makes sure every worker has `floats` floats of scratch; worker w uses scr + w*scr_per. */
int cpu_scratch(cpu_impl *c, size_t floats, ms_err *err);
/* Grows a caller-thread buffer to `floats` floats. */
int cpu_grow(float **buf, size_t *cap, size_t floats, ms_err *err);

/* Slot (row of a cache) holding position p of sequence s. */
static inline int64_t cpu_slot(const ms_attn_meta *m, int s, int p) {
    const ms_batch *h = m->host;
    int32_t page = m->block_table_d[(int64_t)s * h->max_blocks + p / h->page_size];
    return (int64_t)page * h->page_size + p % h->page_size;
}

/* The rope op (cpu_backend.c), shared with the absorbed-query op, which rotates its copy of q's rope part. */
int cpu_rope(ms_backend *b, ms_tensor *x, const int32_t *pos, const ms_rope_cfg *rc, ms_err *err);
int cpu_kv_store(ms_backend *b, ms_tensor *cache, const ms_tensor *x, const int32_t *slot_d, ms_err *err);
int cpu_attn_gqa(ms_backend *b, const ms_tensor *q, const ms_tensor *kcache, const ms_tensor *vcache,
                 const ms_attn_meta *m, float scale, ms_tensor *out, ms_err *err);
int cpu_mla_attn(ms_backend *b, const ms_tensor *q, const ms_tensor *latent, const ms_attn_meta *m,
                 const int32_t *topk_d, int topk, int kvl, float scale, ms_tensor *out, ms_err *err);
int cpu_mla_absorb_q(ms_backend *b, const ms_linear *kv_b, const ms_tensor *q, int nh, int dn, int dr, int dv,
                     const int32_t *pos_d, const ms_rope_cfg *rc, ms_tensor *out, ms_err *err);
int cpu_mla_v_up(ms_backend *b, const ms_linear *kv_b, const ms_tensor *o_lat, int nh, int dn, int dv,
                 ms_tensor *out, ms_err *err);
int cpu_indexer_topk(ms_backend *b, const ms_tensor *qI, const ms_tensor *w, const ms_tensor *idx_cache,
                     const ms_attn_meta *m, int topk, int32_t *out_d, ms_err *err);

#endif
