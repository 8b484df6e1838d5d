/* permute.cu - shared stages of the CUDA MoE runners: device weight tables, routing statistics,
 * permutation of (token, k) pairs grouped by expert and the weighted fp32 combine. */
#include "moe/cuda/moe_cuda.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int moe_cu_supports(const ms_backend *b, const ms_moe_shape *shape, char *why, size_t why_cap) {
    (void)shape; /* every shape the interface allows runs on sm_80+ */
    if (!b || !b->name || strcmp(b->name, "cuda") != 0) {
        if (why) snprintf(why, why_cap, "runs only on the cuda backend");
        return 0;
    }
    if (b->gpu.cc_major < 8) {
        if (why)
            snprintf(why, why_cap, "needs compute capability 8.0 or newer (%s is %d.%d)", b->gpu.name, b->gpu.cc_major,
                     b->gpu.cc_minor);
        return 0;
    }
    return 1;
}

int moe_cu_prepare(ms_backend *b, ms_experts *e, ms_err *err) {
    if (e->prepared) return MS_OK;
    if (e->n <= 0) return ms_errf(err, MS_ERR_INVALID, "moe: layer has no experts");
    moe_cu_prep *p = (moe_cu_prep *)calloc(1, sizeof *p);
    cu_wdesc *h = (cu_wdesc *)malloc(sizeof(cu_wdesc) * 3 * (size_t)e->n);
    if (!p || !h) {
        free(p);
        free(h);
        return ms_errf(err, MS_ERR_NOMEM, "moe: out of host memory preparing %d experts", e->n);
    }
    int rc = MS_OK;
    for (int i = 0; i < e->n && rc == MS_OK; i++) {
        rc = cu_wdesc_of(&e->gate[i], &h[i], err);
        if (rc == MS_OK) rc = cu_wdesc_of(&e->up[i], &h[e->n + i], err);
        if (rc == MS_OK) rc = cu_wdesc_of(&e->down[i], &h[2 * e->n + i], err);
        if (rc == MS_OK && (h[i].fmt != h[0].fmt || h[i].n != h[0].n || h[i].k != h[0].k ||
                            h[e->n + i].n != h[0].n || h[2 * e->n + i].k != h[0].n || h[i].dtype != h[0].dtype ||
                            h[2 * e->n + i].fmt != h[2 * e->n].fmt || h[e->n + i].fmt != h[e->n].fmt))
            rc = ms_errf(err, MS_ERR_FORMAT, "%s: expert shapes or formats differ within the layer",
                         e->gate[i].name ? e->gate[i].name : "expert");
    }
    void *d = NULL;
    if (rc == MS_OK) {
        cudaError_t ce = cudaMalloc(&d, sizeof(cu_wdesc) * 3 * (size_t)e->n);
        if (ce == cudaSuccess) ce = cudaMemcpy(d, h, sizeof(cu_wdesc) * 3 * (size_t)e->n, cudaMemcpyHostToDevice);
        if (ce != cudaSuccess)
            rc = ms_errf(err, MS_ERR_RUNTIME, "moe: uploading expert tables failed at %s:%d: %s", __FILE__, __LINE__,
                         cudaGetErrorString(ce));
        else rc = cu_own(b, d, err);
    }
    if (rc != MS_OK) {
        if (d) cudaFree(d);
        free(p);
        free(h);
        return rc;
    }
    p->n = e->n;
    p->gate_d = (cu_wdesc *)d;
    p->up_d = p->gate_d + e->n;
    p->down_d = p->gate_d + 2 * e->n;
    p->gate_h = h[0];
    p->up_h = h[e->n];
    p->down_h = h[2 * e->n];
    free(h);
    e->prepared = p;
    /* the host struct is small; it lives as long as the experts (freed with the process) */
    return MS_OK;
}

static size_t al(size_t n) { return (n + 255) & ~(size_t)255; }

size_t moe_cu_ws_size(const ms_moe_shape *s, int naive) {
    size_t P = (size_t)s->n_tokens * s->topk, E = (size_t)s->n_experts;
    size_t n = al(E * 4) * 3 + al((E + 1) * 4) * 2 + al(4) + al(P * 4) * 2;
    n += al(P * s->hidden * 2) + al(P * s->inter * 2) + al(P * s->hidden * 4);
    if (naive) n += 2 * al(P * s->inter * 2);
    return n + 256;
}

int moe_cu_ws_carve(const ms_moe_shape *s, int naive, void *ws, size_t ws_bytes, moe_cu_ws *w, ms_err *err) {
    size_t need = moe_cu_ws_size(s, naive);
    if (!ws || ws_bytes < need)
        return ms_errf(err, MS_ERR_NOMEM, "moe: workspace of %zu bytes is smaller than the %zu needed for %d tokens",
                       ws_bytes, need, s->n_tokens);
    memset(w, 0, sizeof *w);
    w->T = s->n_tokens;
    w->topk = s->topk;
    w->E = s->n_experts;
    w->H = s->hidden;
    w->I = s->inter;
    w->P = s->n_tokens * s->topk;
    size_t P = (size_t)w->P, E = (size_t)w->E;
    char *p = (char *)(((uintptr_t)ws + 255) & ~(uintptr_t)255);
#define TAKE(ptr, type, bytes) do { ptr = (type)p; p += al(bytes); } while (0)
    TAKE(w->counts, int32_t *, E * 4);
    TAKE(w->offsets, int32_t *, (E + 1) * 4);
    TAKE(w->cursor, int32_t *, E * 4);
    TAKE(w->tile_off, int32_t *, (E + 1) * 4);
    TAKE(w->active, int32_t *, E * 4);
    TAKE(w->n_active, int32_t *, 4);
    TAKE(w->sorted_tok, int32_t *, P * 4);
    TAKE(w->pair_pos, int32_t *, P * 4);
    TAKE(w->xs, bf16 *, P * w->H * 2);
    TAKE(w->h, bf16 *, P * w->I * 2);
    TAKE(w->ys, float *, P * w->H * 4);
    if (naive) {
        TAKE(w->g, bf16 *, P * w->I * 2);
        TAKE(w->u, bf16 *, P * w->I * 2);
    }
#undef TAKE
    return MS_OK;
}

__global__ void k_moe_count(const int32_t *ids, int P, int E, int32_t *counts) {
    cu_pdl_wait();
    cu_pdl_trigger();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < P; i += gridDim.x * blockDim.x) {
        int e = ids[i];
        if (e >= 0 && e < E) atomicAdd(&counts[e], 1);
    }
}

/* One thread: prefix sums, tile offsets and the active list (E is at most a few thousand). */
__global__ void k_moe_scan(const int32_t *counts, int E, int32_t *offsets, int32_t *tile_off, int32_t *active,
                           int32_t *n_active, int32_t *cursor) {
    cu_pdl_wait();
    cu_pdl_trigger();
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int off = 0, toff = 0, na = 0;
    for (int e = 0; e < E; e++) {
        int c = counts[e];
        offsets[e] = off;
        tile_off[e] = toff;
        cursor[e] = 0;
        off += c;
        toff += (c + CU_GG_BM - 1) / CU_GG_BM;
        if (c > 0) active[na++] = e;
    }
    offsets[E] = off;
    tile_off[E] = toff;
    *n_active = na;
}

__global__ void k_moe_scatter(const int32_t *ids, int P, int topk, int E, const int32_t *offsets, int32_t *cursor,
                              int32_t *sorted_tok, int32_t *pair_pos) {
    cu_pdl_wait();
    cu_pdl_trigger();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < P; i += gridDim.x * blockDim.x) {
        int e = ids[i];
        if (e < 0 || e >= E) { pair_pos[i] = -1; continue; }
        int pos = offsets[e] + atomicAdd(&cursor[e], 1);
        sorted_tok[pos] = i / topk;
        pair_pos[i] = pos;
    }
}

__global__ void k_moe_gather(const bf16 *x, int H, const int32_t *sorted_tok, const int32_t *offsets, int E, bf16 *xs) {
    cu_pdl_wait();
    cu_pdl_trigger();
    int pos = blockIdx.x;
    if (pos >= offsets[E]) return;
    const bf16 *src = x + (size_t)sorted_tok[pos] * H;
    bf16 *dst = xs + (size_t)pos * H;
    if (H % 8 == 0) {
        for (int c = threadIdx.x; c < H / 8; c += blockDim.x) ((uint4 *)dst)[c] = ((const uint4 *)src)[c];
    } else {
        for (int c = threadIdx.x; c < H; c += blockDim.x) dst[c] = src[c];
    }
}

/* Small calls (decode): count, scan and scatter in one single-block launch (256 threads: the scan
 * assumes 8 warps) with the counters in shared
 * memory; the outputs are those of the three kernels above (cursor ends at the counts, as there). */
#define MOE_SMALL_E 4096
#define MOE_SMALL_P 4096
__global__ __launch_bounds__(256) void k_moe_route_small(const int32_t *ids, int P, int topk, int E, int32_t *counts,
                                                         int32_t *offsets, int32_t *tile_off, int32_t *active,
                                                         int32_t *n_active, int32_t *cursor, int32_t *sorted_tok,
                                                         int32_t *pair_pos) {
    cu_pdl_wait();
    cu_pdl_trigger();
    __shared__ int s_cnt[MOE_SMALL_E];
    __shared__ int s_cur[MOE_SMALL_E];
    const int tid = threadIdx.x;
    for (int e = tid; e < E; e += blockDim.x) s_cnt[e] = 0;
    __syncthreads();
    for (int i = tid; i < P; i += blockDim.x) {
        int e = ids[i];
        if (e >= 0 && e < E) atomicAdd(&s_cnt[e], 1);
    }
    __syncthreads();
    /* exclusive scans of (pairs, 64-row tiles, active flag) over the experts, 256 at a time: shuffle
     * scans per warp, warp totals through shared memory (one thread walking E = 256 experts with two
     * global stores each took ~4 us of a 7.5 us batch-1 launch) */
    __shared__ int s_w[8][3];
    const int lane = tid & 31, warp = tid >> 5;
    int carry[3] = {0, 0, 0};
    for (int base = 0; base < E; base += 256) {
        const int e = base + tid, c = e < E ? s_cnt[e] : 0;
        const int v[3] = {c, (c + CU_GG_BM - 1) / CU_GG_BM, c > 0};
        int inc[3] = {v[0], v[1], v[2]};
#pragma unroll
        for (int o = 1; o < 32; o <<= 1)
#pragma unroll
            for (int k = 0; k < 3; k++) {
                const int n = __shfl_up_sync(0xffffffffu, inc[k], o);
                if (lane >= o) inc[k] += n;
            }
        if (lane == 31)
            for (int k = 0; k < 3; k++) s_w[warp][k] = inc[k];
        __syncthreads();
        int ex[3], tot[3];
        for (int k = 0; k < 3; k++) {
            int before = 0, all = 0;
            for (int w2 = 0; w2 < 8; w2++) {
                before += w2 < warp ? s_w[w2][k] : 0;
                all += s_w[w2][k];
            }
            ex[k] = carry[k] + before + inc[k] - v[k];
            tot[k] = all;
        }
        if (e < E) {
            offsets[e] = ex[0];
            tile_off[e] = ex[1];
            s_cur[e] = ex[0];
            if (v[2]) active[ex[2]] = e;
        }
        for (int k = 0; k < 3; k++) carry[k] += tot[k];
        __syncthreads(); /* s_w is rewritten by the next 256 experts */
    }
    if (tid == 0) {
        offsets[E] = carry[0];
        tile_off[E] = carry[1];
        *n_active = carry[2];
    }
    __syncthreads();
    for (int e = tid; e < E; e += blockDim.x) counts[e] = cursor[e] = s_cnt[e];
    for (int i = tid; i < P; i += blockDim.x) {
        int e = ids[i];
        if (e < 0 || e >= E) { pair_pos[i] = -1; continue; }
        int pos = atomicAdd(&s_cur[e], 1);
        sorted_tok[pos] = i / topk;
        pair_pos[i] = pos;
    }
}

int moe_cu_route_permute(ms_backend *b, moe_cu_ws *w, const int32_t *ids_d, const bf16 *x, int gather, ms_err *err) {
    cudaStream_t st = cu_of(b)->stream;
    int P = w->P;
    if (P <= MOE_SMALL_P && w->E <= MOE_SMALL_E) {
        CK(cu_launch(k_moe_route_small, 1, 256, 0, st, ids_d, P, w->topk, w->E, w->counts, w->offsets, w->tile_off, w->active,
                     w->n_active, w->cursor, w->sorted_tok, w->pair_pos));
    } else {
        CK(cudaMemsetAsync(w->counts, 0, sizeof(int32_t) * (size_t)w->E, st));
        int g = (P + 255) / 256;
        if (g < 1) g = 1;
        CK(cu_launch(k_moe_count, g, 256, 0, st, ids_d, P, w->E, w->counts));
        CK(cu_launch(k_moe_scan, 1, 32, 0, st, w->counts, w->E, w->offsets, w->tile_off, w->active, w->n_active, w->cursor));
        CK(cu_launch(k_moe_scatter, g, 256, 0, st, ids_d, P, w->topk, w->E, w->offsets, w->cursor, w->sorted_tok, w->pair_pos));
    }
    if (gather && P > 0) {
        CK(cu_launch(k_moe_gather, P, 128, 0, st, x, w->H, w->sorted_tok, w->offsets, w->E, w->xs));
    }
    return MS_OK;
}

__global__ void k_moe_combine(const float *ys, int H, const int32_t *pair_pos, const float *wt, int topk, void *out,
                              int ot) {
    cu_pdl_wait();
    cu_pdl_trigger();
    int t = blockIdx.x;
    for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < H; c += gridDim.y * blockDim.x) {
        float acc = 0.f;
        for (int k = 0; k < topk; k++) {
            int pos = pair_pos[(size_t)t * topk + k];
            if (pos >= 0) acc = fmaf(wt[(size_t)t * topk + k], ys[(size_t)pos * H + c], acc);
        }
        cu_st(out, ot, (size_t)t * H + c, acc);
    }
}

int moe_cu_combine(ms_backend *b, const moe_cu_ws *w, const float *w_d, ms_tensor *out, ms_err *err) {
    if (w->T == 0) return MS_OK;
    /* few tokens (decode): spread each row over several blocks so the step does not wait on one SM */
    const int per_row = w->T >= 64 ? 1 : (w->H + 511) / 512 < 16 ? (w->H + 511) / 512 : 16;
    CK(cu_launch(k_moe_combine, dim3(w->T, per_row), 256, 0, cu_of(b)->stream, w->ys, w->H, w->pair_pos, w_d, w->topk,
                 out->data, out->dtype));
    return MS_OK;
}

int moe_cu_check(ms_backend *b, const ms_experts *e, const ms_tensor *x, int topk, const ms_tensor *out,
                 ms_moe_shape *s, const moe_cu_prep **prep, ms_err *err) {
    MS_TRY(moe_cu_prepare(b, (ms_experts *)e, err)); /* lazily, if the forward did not call prepare() */
    const moe_cu_prep *p = (const moe_cu_prep *)e->prepared;
    int H = p->gate_h.k, I = p->gate_h.n;
    if (x->dtype != MS_BF16)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "moe: CUDA runners take bf16 activations, got %s",
                       ms_dtype_name(x->dtype));
    if (out->dtype != MS_BF16 && out->dtype != MS_F32)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "moe: output dtype %s not supported", ms_dtype_name(out->dtype));
    int64_t T = ms_tensor_numel(x) / H;
    MS_ASSERT(T * H == ms_tensor_numel(x) && ms_tensor_numel(out) == T * H);
    MS_ASSERT(topk > 0 && topk <= e->n);
    memset(s, 0, sizeof *s);
    s->n_tokens = (int)T;
    s->hidden = H;
    s->inter = I;
    s->n_experts = e->n;
    s->topk = topk;
    s->fmt = (ms_wfmt)p->gate_h.fmt;
    s->plain_dtype = (ms_dtype)p->gate_h.dtype;
    *prep = p;
    return MS_OK;
}
