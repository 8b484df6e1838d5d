/* backend.cu - the CUDA backend's core: device selection, stream, cuBLASLt handle and workspace,
 * memory and weight placement, GEMM dispatch (cuBLASLt for bf16 beyond a few rows, the tensor-core
 * GEMV of gemv_mma.cu for few rows, fused dequantizing kernels for FP8/NVFP4), the router and the
 * absorbed-MLA projections, and the ops table. Elementwise ops live in elementwise.cu, attention in
 * attention.cu, quantized kernels in quant.cu and gemv_mma.cu. */
#include "backend/cuda/cuda_internal.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Contract in cuda_internal.cuh. */
thread_local int cu_prev_early;

/* ---- device helpers exported to the C side ---- */

extern "C" void *ms_cuda_stream(ms_backend *b) { return (void *)cu_of(b)->stream; }

extern "C" int ms_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" void ms_cuda_versions(int *driver, int *runtime) {
    int d = 0, r = 0;
    if (cudaDriverGetVersion(&d) != cudaSuccess) d = 0;
    if (cudaRuntimeGetVersion(&r) != cudaSuccess) r = 0;
    if (driver) *driver = d;
    if (runtime) *runtime = r;
}

extern "C" int ms_cuda_device_info(int device, ms_gpu_info *info, ms_err *err) {
    memset(info, 0, sizeof *info);
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, device));
    size_t nl = strnlen(p.name, sizeof p.name);
    if (nl >= sizeof info->name) nl = sizeof info->name - 1;
    memcpy(info->name, p.name, nl);
    info->name[nl] = 0;
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->n_sm = p.multiProcessorCount;
    int cur = 0;
    CK(cudaGetDevice(&cur));
    CK(cudaSetDevice(device));
    size_t fr = 0, tot = 0;
    cudaError_t e = cudaMemGetInfo(&fr, &tot);
    cudaSetDevice(cur);
    if (e != cudaSuccess) return ms_errf(err, MS_ERR_RUNTIME, "cudaMemGetInfo failed at %s:%d: %s", __FILE__, __LINE__,
                                         cudaGetErrorString(e));
    info->mem_total = tot;
    info->mem_free = fr;
    return MS_OK;
}

int cu_pdl_enabled(void) {
    enum { MAXDEV = 64 };
    /* per device: 0 not asked yet, 1 no, 2 sm_90 (racy writes store one value). Only compute capability 9:
     * this build's code for later GPUs is the compute_80 PTX, JIT-compiled, whose kernels have no
     * griddepcontrol.wait (compiled out below sm_90), so a launch allowed to start early there would read
     * what the previous kernel is still writing. */
    static int cc_ok[MAXDEV];
    if (!cu_knob(CU_KNOB_PDL)) return 0;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (dev < 0 || dev >= MAXDEV) return 0;
    int v = __atomic_load_n(&cc_ok[dev], __ATOMIC_RELAXED);
    if (!v) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            major = 0;
        }
        v = major == 9 ? 2 : 1;
        __atomic_store_n(&cc_ok[dev], v, __ATOMIC_RELAXED);
    }
    return v == 2;
}

/* Contract in cuda_internal.cuh. */
int cu_occupancy(ms_backend *b, const void *kern, int threads, size_t smem, int *bps, ms_err *err) {
    cu_impl *ci = cu_of(b);
    for (int i = 0; i < ci->n_occ_memo; i++)
        if (ci->occ_memo[i].k == kern && ci->occ_memo[i].threads == threads && ci->occ_memo[i].smem == smem)
            return *bps = ci->occ_memo[i].bps, MS_OK;
    *bps = 0;
    /* the kernel's static shared memory counts against the same per-block limit */
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, kern));
    const size_t dyn_max = (size_t)ci->max_smem_optin > fa.sharedSizeBytes ? ci->max_smem_optin - fa.sharedSizeBytes : 0;
    if (smem > dyn_max) return MS_OK;
    /* the limit goes to the device maximum, not to smem: a later call of the same kernel with less shared
     * memory must not lower it under what an earlier (remembered) size launches with */
    if (smem + fa.sharedSizeBytes > 48 * 1024)
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn_max));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(bps, kern, threads, smem));
    if (ci->n_occ_memo < (int)(sizeof ci->occ_memo / sizeof ci->occ_memo[0])) {
        ci->occ_memo[ci->n_occ_memo].k = kern, ci->occ_memo[ci->n_occ_memo].threads = threads;
        ci->occ_memo[ci->n_occ_memo].smem = smem, ci->occ_memo[ci->n_occ_memo++].bps = *bps;
    }
    return MS_OK;
}

/* Makes the backend's GPU current on the calling thread (ops may run on any host thread). */
#define CU_ENTER(b)                                                                               \
    do {                                                                                          \
        int cu_cur_ = -1;                                                                         \
        if (cudaGetDevice(&cu_cur_) != cudaSuccess || cu_cur_ != (b)->device) CK(cudaSetDevice((b)->device)); \
    } while (0)

int cu_scratch(ms_backend *b, int slot, size_t n, void **out, ms_err *err) {
    cu_impl *c = cu_of(b);
    if (n == 0) n = 256;
    if (c->scratch_bytes[slot] < n) {
        if (c->scratch[slot]) {
            CK(cudaStreamSynchronize(c->stream));
            CK(cudaFree(c->scratch[slot]));
            c->scratch[slot] = NULL;
            c->scratch_bytes[slot] = 0;
        }
        size_t want = n + n / 4 + 4096;
        c->epoch++;
        CK(cudaMalloc(&c->scratch[slot], want));
        c->scratch_bytes[slot] = want;
    }
    *out = c->scratch[slot];
    return MS_OK;
}

int cu_own(ms_backend *b, void *p_d, ms_err *err) {
    cu_alloc_node *nd = (cu_alloc_node *)malloc(sizeof *nd);
    if (!nd) return ms_errf(err, MS_ERR_NOMEM, "cuda backend: out of host memory recording an allocation");
    nd->p = p_d;
    nd->next = cu_of(b)->owned;
    cu_of(b)->owned = nd;
    return MS_OK;
}

/* ---- lifecycle ---- */

static void cu_destroy(ms_backend *b) {
    if (!b) return;
    cu_impl *c = cu_of(b);
    if (c) {
        cudaSetDevice(c->device);
        if (c->stream) cudaStreamSynchronize(c->stream);
        cu_trace_dump(b); /* a trace build's ring (trace.cu), if this backend owns it */
        for (int i = 0; i < MS_CU_N_SCRATCH; i++)
            if (c->scratch[i]) cudaFree(c->scratch[i]);
        for (int i = 0; i < c->n_rope; i++) cudaFree(c->rope[i].inv_freq_d);
        while (c->owned) {
            cu_alloc_node *nx = c->owned->next;
            cudaFree(c->owned->p);
            free(c->owned);
            c->owned = nx;
        }
        if (c->lt_ws) cudaFree(c->lt_ws);
        if (c->lt) cublasLtDestroy(c->lt);
        if (c->blas) cublasDestroy(c->blas);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
    }
    free(b);
}

static int cu_alloc(ms_backend *b, ms_tensor *t, ms_err *err) {
    CU_ENTER(b);
    size_t n = ms_tensor_nbytes(t);
    t->data = NULL;
    cudaError_t e = cudaMalloc(&t->data, n ? n : 16);
    if (e != cudaSuccess) {
        cudaGetLastError();
        t->data = NULL;
        return ms_errf(err, MS_ERR_NOMEM, "cudaMalloc of %zu bytes failed on GPU %d: %s", n, b->device,
                       cudaGetErrorString(e));
    }
    return MS_OK;
}

static void cu_free(ms_backend *b, ms_tensor *t) {
    if (t && t->data) {
        cudaSetDevice(b->device);
        cudaFree(t->data);
        t->data = NULL;
    }
}

static int cu_upload(ms_backend *b, void *dst_d, const void *src, size_t n, ms_err *err) {
    CU_ENTER(b);
    if (!n) return MS_OK;
    CK(cudaMemcpyAsync(dst_d, src, n, cudaMemcpyHostToDevice, cu_of(b)->stream));
    CK(cudaStreamSynchronize(cu_of(b)->stream)); /* src may be pageable and reused by the caller */
    cu_of(b)->weights_quiet = 1;
    return MS_OK;
}

static int cu_download(ms_backend *b, void *dst, const void *src_d, size_t n, ms_err *err) {
    CU_ENTER(b);
    if (!n) return MS_OK;
    CK(cudaMemcpyAsync(dst, src_d, n, cudaMemcpyDeviceToHost, cu_of(b)->stream));
    CK(cudaStreamSynchronize(cu_of(b)->stream));
    cu_of(b)->weights_quiet = 1;
    return MS_OK;
}

static int cu_sync(ms_backend *b, ms_err *err) {
    CU_ENTER(b);
    CK(cudaStreamSynchronize(cu_of(b)->stream));
    cu_of(b)->weights_quiet = 1;
    return MS_OK;
}

/* ---- graphs ---- */

/* Failed runtime calls leave CUDA's last-error slot set, and the next CK_LAUNCH would report it as
 * its own: the optional calls below clear it before returning their error. */
#define CK_CLEAR(call)                                                                            \
    do {                                                                                          \
        cudaError_t ck_e_ = (call);                                                               \
        if (ck_e_ != cudaSuccess) {                                                               \
            cudaGetLastError();                                                                   \
            return ms_errf(err, MS_ERR_RUNTIME, "%s failed at %s:%d: %s", #call, __FILE__, __LINE__, \
                           cudaGetErrorString(ck_e_));                                            \
        }                                                                                         \
    } while (0)

static int cu_graph_begin(ms_backend *b, ms_err *err) {
    CU_ENTER(b);
    /* thread-local mode: a host-synchronising call from this thread invalidates the capture instead of
     * racing it, so a step that cannot be recorded fails cleanly and runs eagerly */
    CK_CLEAR(cudaStreamBeginCapture(cu_of(b)->stream, cudaStreamCaptureModeThreadLocal));
    return MS_OK;
}

static int cu_graph_end(ms_backend *b, void **exec, ms_err *err) {
    CU_ENTER(b);
    *exec = NULL;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(cu_of(b)->stream, &g);
    if (e != cudaSuccess || !g) {
        cudaGetLastError(); /* capture errors are not sticky; clear the last-error slot */
        if (g) cudaGraphDestroy(g);
        return ms_errf(err, MS_ERR_RUNTIME, "recording a CUDA graph failed: %s",
                       cudaGetErrorString(e != cudaSuccess ? e : cudaErrorStreamCaptureInvalidated));
    }
    cudaGraphExec_t x = NULL;
    e = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return ms_errf(err, MS_ERR_RUNTIME, "instantiating a CUDA graph failed: %s", cudaGetErrorString(e));
    }
    *exec = (void *)x;
    return MS_OK;
}

static int cu_graph_launch(ms_backend *b, void *exec, ms_err *err) {
    CU_ENTER(b);
    CK_CLEAR(cudaGraphLaunch((cudaGraphExec_t)exec, cu_of(b)->stream));
    return MS_OK;
}

static void cu_graph_free(ms_backend *b, void *exec) {
    if (!exec) return;
    cudaSetDevice(b->device);
    cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

static uint64_t cu_mem_epoch(const ms_backend *b) { return cu_of(b)->epoch; }

static int cu_host_pin(ms_backend *b, void *p, size_t n, ms_err *err) {
    CU_ENTER(b);
    if (!p || !n) return MS_OK;
    CK_CLEAR(cudaHostRegister(p, n, cudaHostRegisterDefault));
    return MS_OK;
}

static void cu_host_unpin(ms_backend *b, void *p) {
    if (!p) return;
    cudaSetDevice(b->device);
    if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

/* Copies n host bytes into a new device buffer. */
static int cu_dup(ms_backend *b, const void *src, size_t n, void **out, ms_err *err) {
    *out = NULL;
    CK(cudaMalloc(out, n ? n : 16));
    if (n) {
        cudaError_t e = cudaMemcpy(*out, src, n, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            cudaFree(*out);
            *out = NULL;
            return ms_errf(err, MS_ERR_RUNTIME, "cudaMemcpy of %zu weight bytes failed at %s:%d: %s", n, __FILE__,
                           __LINE__, cudaGetErrorString(e));
        }
    }
    return MS_OK;
}

static int cu_place_tensor(ms_backend *b, ms_tensor *t, ms_err *err) {
    CU_ENTER(b);
    if (!t->data) return MS_OK;
    void *d = NULL;
    MS_TRY(cu_dup(b, t->data, ms_tensor_nbytes(t), &d, err));
    t->data = d;
    return MS_OK;
}

static void cu_unplace_tensor(ms_backend *b, ms_tensor *t) { cu_free(b, t); }

static int cu_place_linear(ms_backend *b, ms_linear *W, ms_err *err) {
    CU_ENTER(b);
    if (!W->w.data) return MS_OK;
    const char *nm = W->name ? W->name : "(linear)";
    if (W->n_out <= 0 || W->n_in <= 0 || W->n_out > INT32_MAX || W->n_in > INT32_MAX)
        return ms_errf(err, MS_ERR_INVALID, "%s: shape [%lld, %lld] out of range for the CUDA backend", nm,
                       (long long)W->n_out, (long long)W->n_in);
    cu_linear_prep *p = (cu_linear_prep *)calloc(1, sizeof *p);
    if (!p) return ms_errf(err, MS_ERR_NOMEM, "%s: out of host memory", nm);
    int rc = MS_OK;
    void *wd = NULL, *sd = NULL, *bd = NULL;
    size_t wn = ms_tensor_nbytes(&W->w);
    if (W->fmt == MS_WFMT_PLAIN && W->w.dtype == MS_F16) {
        /* f16 -> f32 on the host (exact), so kernels see BF16 or F32 only. */
        size_t n = (size_t)ms_tensor_numel(&W->w);
        float *tmp = (float *)malloc(n * 4);
        if (!tmp) { free(p); return ms_errf(err, MS_ERR_NOMEM, "%s: out of host memory converting f16", nm); }
        ms_convert_to_f32(MS_F16, W->w.data, tmp, n);
        rc = cu_dup(b, tmp, n * 4, &wd, err);
        free(tmp);
        W->w.dtype = MS_F32;
    } else {
        if (W->fmt == MS_WFMT_PLAIN && W->w.dtype != MS_BF16 && W->w.dtype != MS_F32) {
            free(p);
            return ms_errf(err, MS_ERR_UNSUPPORTED, "%s: weight dtype %s not supported by the CUDA backend", nm,
                           ms_dtype_name(W->w.dtype));
        }
        rc = cu_dup(b, W->w.data, wn, &wd, err);
    }
    if (rc == MS_OK && W->fmt != MS_WFMT_PLAIN) {
        if (!W->scale.data) rc = ms_errf(err, MS_ERR_FORMAT, "%s: quantized weight without a scale tensor", nm);
        else rc = cu_dup(b, W->scale.data, ms_tensor_nbytes(&W->scale), &sd, err);
    }
    if (rc == MS_OK && W->bias.data) {
        size_t n = (size_t)ms_tensor_numel(&W->bias);
        float *tmp = (float *)malloc(n * 4);
        if (!tmp) rc = ms_errf(err, MS_ERR_NOMEM, "%s: out of host memory converting the bias", nm);
        else {
            ms_convert_to_f32(W->bias.dtype, W->bias.data, tmp, n);
            rc = cu_dup(b, tmp, n * 4, &bd, err);
            free(tmp);
        }
    }
    if (rc != MS_OK) {
        if (wd) cudaFree(wd);
        if (sd) cudaFree(sd);
        if (bd) cudaFree(bd);
        free(p);
        return rc;
    }
    W->w.data = wd;
    if (sd) W->scale.data = sd;
    if (bd) { W->bias.data = bd; W->bias.dtype = MS_F32; }
    p->d.w = wd;
    p->d.scale = sd;
    p->d.scale2 = W->scale2;
    p->d.fmt = W->fmt;
    p->d.dtype = W->w.dtype;
    p->d.n = (int)W->n_out;
    p->d.k = (int)W->n_in;
    p->d.scale_ld = W->fmt == MS_WFMT_FP8 ? (int)((W->n_in + 127) / 128) : W->fmt == MS_WFMT_NVFP4 ? (int)(W->n_in / 16) : 0;
    p->bias_f32 = (float *)bd;
    W->prepared = p;
    return MS_OK;
}

static void cu_unplace_linear(ms_backend *b, ms_linear *W) {
    cudaSetDevice(b->device);
    cu_linear_prep *p = (cu_linear_prep *)W->prepared;
    if (!p) return;
    if (!p->view) {
        cudaFree((void *)p->d.w);
        if (p->d.scale) cudaFree((void *)p->d.scale);
        if (p->bias_f32) cudaFree(p->bias_f32);
    }
    if (p->deq) cudaFree(p->deq);
    free(p);
    W->prepared = NULL;
    W->w.data = NULL;
    W->scale.data = NULL;
    W->bias.data = NULL;
}

/* Contract in backend.h. Plain (bf16/f32) and FP8 parts stack by rows as they are (an FP8 part's
 * 128-row scale blocks must not straddle two parts, so every part but the last has a multiple of 128
 * rows); NVFP4 parts carry a per-tensor scale2 each and are refused. */
static int cu_stack_linears(ms_backend *b, ms_linear *const *parts, int n, const char *name, ms_linear *out, ms_err *err) {
    CU_ENTER(b);
    memset(out, 0, sizeof *out);
    if (n < 1) return ms_errf(err, MS_ERR_UNSUPPORTED, "%s: nothing to stack", name);
    const ms_linear *p0 = parts[0];
    int64_t N = 0, wbytes = 0, sbytes = 0;
    int any_bias = 0;
    for (int i = 0; i < n; i++) {
        const ms_linear *W = parts[i];
        const cu_linear_prep *p = (const cu_linear_prep *)W->prepared;
        if (!p || p->view || W->fmt != p0->fmt || W->w.dtype != p0->w.dtype || W->n_in != p0->n_in ||
            (W->fmt != MS_WFMT_PLAIN && W->fmt != MS_WFMT_FP8) || (W->fmt == MS_WFMT_FP8 && i < n - 1 && W->n_out % 128))
            return ms_errf(err, MS_ERR_UNSUPPORTED, "%s: %s cannot be stacked with %s", name, W->name ? W->name : "?",
                           p0->name ? p0->name : "?");
        N += W->n_out;
        wbytes += (int64_t)ms_tensor_nbytes(&W->w);
        if (W->fmt == MS_WFMT_FP8) sbytes += (int64_t)ms_tensor_nbytes(&W->scale);
        any_bias |= p->bias_f32 != NULL;
    }
    if (N > INT32_MAX) return ms_errf(err, MS_ERR_UNSUPPORTED, "%s: %lld stacked rows", name, (long long)N);
    char *wd = NULL, *sd = NULL;
    float *bd = NULL;
    cudaError_t e = cudaMalloc((void **)&wd, (size_t)wbytes);
    if (e == cudaSuccess && sbytes) e = cudaMalloc((void **)&sd, (size_t)sbytes);
    if (e == cudaSuccess && any_bias) e = cudaMalloc((void **)&bd, (size_t)N * sizeof(float));
    if (e == cudaSuccess && any_bias) e = cudaMemset(bd, 0, (size_t)N * sizeof(float));
    int64_t wo = 0, so = 0, row = 0;
    for (int i = 0; i < n && e == cudaSuccess; i++) {
        const ms_linear *W = parts[i];
        const cu_linear_prep *p = (const cu_linear_prep *)W->prepared;
        const size_t wb = ms_tensor_nbytes(&W->w), sb = sd ? ms_tensor_nbytes(&W->scale) : 0;
        e = cudaMemcpy(wd + wo, p->d.w, wb, cudaMemcpyDeviceToDevice);
        if (e == cudaSuccess && sb) e = cudaMemcpy(sd + so, p->d.scale, sb, cudaMemcpyDeviceToDevice);
        if (e == cudaSuccess && p->bias_f32)
            e = cudaMemcpy(bd + row, p->bias_f32, (size_t)W->n_out * sizeof(float), cudaMemcpyDeviceToDevice);
        wo += (int64_t)wb, so += (int64_t)sb, row += W->n_out;
    }
    cu_linear_prep *sp = e == cudaSuccess ? (cu_linear_prep *)calloc(1, sizeof *sp) : NULL;
    if (!sp) {
        cudaFree(wd), cudaFree(sd), cudaFree(bd);
        if (e != cudaSuccess)
            return ms_errf(err, MS_ERR_RUNTIME, "%s: stacking %d linears (%lld bytes) failed: %s", name, n, (long long)wbytes,
                           cudaGetErrorString(e));
        return ms_errf(err, MS_ERR_NOMEM, "%s: out of host memory", name);
    }
    /* the stacked linear */
    out->name = name;
    out->fmt = p0->fmt;
    out->n_out = N;
    out->n_in = p0->n_in;
    out->w = ms_tensor_2d(p0->w.dtype, N, p0->w.shape[1]);
    out->w.data = wd;
    if (sd) {
        out->scale = ms_tensor_2d(p0->scale.dtype, (N + 127) / 128, p0->scale.shape[1]);
        out->scale.data = sd;
    }
    if (bd) {
        out->bias = ms_tensor_make(MS_F32, 1, &N);
        out->bias.data = bd;
    }
    const cu_linear_prep *pp0 = (const cu_linear_prep *)p0->prepared;
    sp->d = pp0->d;
    sp->d.w = wd;
    sp->d.scale = sd;
    sp->d.n = (int)N;
    sp->bias_f32 = bd;
    out->prepared = sp;
    /* the parts: their prepared forms become views into it, their own memory released */
    wo = so = row = 0;
    for (int i = 0; i < n; i++) {
        ms_linear *W = parts[i];
        cu_linear_prep *p = (cu_linear_prep *)W->prepared;
        const size_t wb = ms_tensor_nbytes(&W->w), sb = sd ? ms_tensor_nbytes(&W->scale) : 0;
        cudaFree((void *)p->d.w);
        if (p->d.scale) cudaFree((void *)p->d.scale);
        if (p->bias_f32) cudaFree(p->bias_f32);
        p->view = 1;
        p->d.w = wd + wo;
        p->d.scale = sd ? sd + so : NULL;
        p->bias_f32 = p->bias_f32 ? bd + row : NULL;
        W->w.data = (void *)p->d.w;
        W->scale.data = (void *)p->d.scale;
        W->bias.data = p->bias_f32;
        wo += (int64_t)wb, so += (int64_t)sb, row += W->n_out;
    }
    return MS_OK;
}

int cu_wdesc_of(const ms_linear *W, cu_wdesc *d, ms_err *err) {
    const cu_linear_prep *p = (const cu_linear_prep *)W->prepared;
    if (p) {
        *d = p->d;
        return MS_OK;
    }
    /* a plain view of placed memory that never went through place_linear (a tied lm_head is the
     * placed embedding) */
    if (W->fmt == MS_WFMT_PLAIN && W->w.data && (W->w.dtype == MS_BF16 || W->w.dtype == MS_F32) &&
        W->n_out > 0 && W->n_in > 0 && W->n_out <= INT32_MAX && W->n_in <= INT32_MAX && !W->bias.data) {
        memset(d, 0, sizeof *d);
        d->w = W->w.data;
        d->fmt = MS_WFMT_PLAIN;
        d->dtype = W->w.dtype;
        d->n = (int)W->n_out;
        d->k = (int)W->n_in;
        return MS_OK;
    }
    return ms_errf(err, MS_ERR_INVALID, "%s: weight was not placed on the CUDA backend (or is a %s view it cannot use)",
                   W->name ? W->name : "(linear)", ms_dtype_name(W->w.dtype));
}

int cu_weight_bf16(ms_backend *b, const ms_linear *W, int keep, const bf16 **out, ms_err *err) {
    cu_wdesc d;
    MS_TRY(cu_wdesc_of(W, &d, err));
    if (d.fmt == MS_WFMT_PLAIN && d.dtype == MS_BF16) {
        *out = (const bf16 *)d.w;
        return MS_OK;
    }
    cu_linear_prep *p = (cu_linear_prep *)W->prepared;
    if (!p) keep = 0;
    if (keep && p->deq) {
        *out = p->deq;
        return MS_OK;
    }
    size_t n = (size_t)d.n * d.k * sizeof(bf16);
    void *buf = NULL;
    if (keep) CK(cudaMalloc(&buf, n));
    else MS_TRY(cu_scratch(b, SCR_DEQ, n, &buf, err));
    MS_TRY(cu_dequant_bf16(b, &d, (bf16 *)buf, err));
    if (keep) p->deq = (bf16 *)buf;
    *out = (const bf16 *)buf;
    return MS_OK;
}

/* ---- GEMM ---- */

static cudaDataType_t cu_dt(int t) { return t == MS_F32 ? CUDA_R_32F : t == MS_F16 ? CUDA_R_16F : CUDA_R_16BF; }

/* cuBLASLt's first heuristic choice for a one-row (decode) GEMM streamed the GLM-4.5-Air q/o
 * projections at ~3.5 TB/s where a copy reaches 4.27, and its split-K choices add a reduce launch.
 * So the first call of a shape times up to MS_CU_LT_TUNE (default 8) of its candidates on the real
 * operands and keeps the fastest (MS_CU_LT_TUNE=0 or 1: the first choice, as before). Only when C is a pure output
 * (beta 0: running it several times gives the same C) and the stream is not being captured into a
 * graph (the forward runs every shape eagerly before recording). */
#define LT_TUNE_MAX 32 /* candidates at most (MS_CU_LT_TUNE says how many, default 8) */
#define LT_TUNE_REPS 3
/* How many candidates the first call of a shape times (1: cuBLASLt's first choice, untimed). */
static int lt_candidates(cu_impl *c, float beta) {
    const int n = cu_knob(CU_KNOB_LT_TUNE);
    if (beta != 0.f || n <= 1) return 1;
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c->stream, &st) != cudaSuccess) {
        cudaGetLastError();
        return 1;
    }
    return st == cudaStreamCaptureStatusNone ? (n < LT_TUNE_MAX ? n : LT_TUNE_MAX) : 1;
}

static int lt_time_algos(cu_impl *c, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                         cublasLtMatrixLayout_t lc, const void *B, const void *A, void *C,
                         const cublasLtMatmulHeuristicResult_t *res, int nres, int *best, ms_err *err) {
    const float alpha = 1.f, beta = 0.f;
    cudaEvent_t e0 = NULL, e1 = NULL;
    CK(cudaEventCreate(&e0));
    if (cudaEventCreate(&e1) != cudaSuccess) {
        cudaEventDestroy(e0);
        return ms_errf(err, MS_ERR_RUNTIME, "cudaEventCreate failed (cuBLASLt algorithm timing)");
    }
    float best_ms = 0.f;
    *best = 0;
    for (int i = 0; i < nres; i++) {
        int ok = res[i].state == CUBLAS_STATUS_SUCCESS;
        for (int r = 0; ok && r <= LT_TUNE_REPS; r++) {
            if (r == 1) ok = cudaEventRecord(e0, c->stream) == cudaSuccess;
            ok = ok && cublasLtMatmul(c->lt, op, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &res[i].algo, c->lt_ws,
                                      c->lt_ws_bytes, c->stream) == CUBLAS_STATUS_SUCCESS;
        }
        float ms = 0.f;
        ok = ok && cudaEventRecord(e1, c->stream) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess &&
             cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess;
        if (!ok) {
            cudaGetLastError(); /* a candidate that cannot run is skipped, not an error */
            continue;
        }
        if (i == 0 || ms < best_ms) best_ms = ms, *best = i;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return MS_OK;
}

int cu_gemm(ms_backend *b, int M, int N, int K, const void *A, int64_t lda, int ab_type, const void *B, int64_t ldb,
            int b_trans, void *C, int64_t ldc, int c_type, float beta, ms_err *err) {
    cu_impl *c = cu_of(b);
    if (M <= 0 || N <= 0) return MS_OK;
    if (ab_type == MS_F32 && c_type != MS_F32)
        return ms_errf(err, MS_ERR_UNSUPPORTED, "cu_gemm: f32 inputs need an f32 output");
    float alpha = 1.f;
    if (K <= 0) {
        /* empty reduction: C = beta*C */
        if (beta == 0.f) CK(cudaMemsetAsync(C, 0, (size_t)M * ldc * ms_dtype_size((ms_dtype)c_type), c->stream));
        return MS_OK;
    }
    /* cublas (column-major): C^T[N,M] = op(B)^T[N,K] · A^T[K,M] */
    int ta = b_trans ? 1 : 0;
    int at = ab_type, ct = c_type;
    cu_gemm_cache_ent *hit = NULL;
    for (int i = 0; i < CU_GCACHE; i++) {
        cu_gemm_cache_ent *g = &c->gcache[i];
        if (g->used && g->m == N && g->n == M && g->k == K && g->ta == ta && g->atype == at && g->ctype == ct &&
            g->lda == ldb && g->ldb == lda && g->ldc == ldc) {
            hit = g;
            break;
        }
    }
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = CUBLAS_OP_N;
    int rc = MS_OK;
    cublasComputeType_t comp = at == MS_F32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
#define LTK(call)                                                                                 \
    do {                                                                                          \
        cublasStatus_t s_ = (call);                                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                        \
            rc = ms_errf(err, MS_ERR_RUNTIME, "%s failed at %s:%d: cublas status %d", #call, __FILE__, __LINE__, \
                         (int)s_);                                                                \
            goto done;                                                                            \
        }                                                                                         \
    } while (0)
    LTK(cublasLtMatmulDescCreate(&op, comp, CUDA_R_32F));
    LTK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LTK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (ta) LTK(cublasLtMatrixLayoutCreate(&la, cu_dt(at), K, N, ldb));
    else LTK(cublasLtMatrixLayoutCreate(&la, cu_dt(at), N, K, ldb));
    LTK(cublasLtMatrixLayoutCreate(&lb, cu_dt(at), K, M, lda));
    LTK(cublasLtMatrixLayoutCreate(&lc, cu_dt(ct), N, M, ldc));
    if (!hit) {
        cublasLtMatmulPreference_t pref = NULL;
        cublasLtMatmulHeuristicResult_t res[LT_TUNE_MAX];
        int nres = 0;
        LTK(cublasLtMatmulPreferenceCreate(&pref));
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &c->lt_ws_bytes,
                                             sizeof c->lt_ws_bytes);
        const int want = lt_candidates(c, beta);
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(c->lt, op, la, lb, lc, lc, pref, want, res, &nres);
        cublasLtMatmulPreferenceDestroy(pref);
        if (hs == CUBLAS_STATUS_SUCCESS && nres > 0) {
            int best = 0;
            if (nres > 1) MS_TRY(lt_time_algos(c, op, la, lb, lc, B, A, C, res, nres, &best, err));
            hit = &c->gcache[c->gcache_next];
            c->gcache_next = (c->gcache_next + 1) % CU_GCACHE;
            hit->used = 1;
            hit->m = N; hit->n = M; hit->k = K; hit->ta = ta; hit->atype = at; hit->ctype = ct;
            hit->lda = ldb; hit->ldb = lda; hit->ldc = ldc;
            hit->algo = res[best].algo;
        }
    }
    if (hit) {
        LTK(cublasLtMatmul(c->lt, op, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &hit->algo, c->lt_ws, c->lt_ws_bytes,
                           c->stream));
    } else {
        /* no cuBLASLt algorithm for this shape: plain cuBLAS picks one */
        LTK(cublasGemmEx(c->blas, opa, opb, N, M, K, &alpha, B, cu_dt(at), (int)ldb, A, cu_dt(at), (int)lda, &beta, C,
                         cu_dt(ct), (int)ldc, at == MS_F32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT));
    }
done:
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
#undef LTK
    return rc;
}

/* Row count up to which quantized linears use the fused GEMV (which reads the weights once per 16-32
 * rows) instead of a bf16 copy of the weights through cuBLASLt (MS_CU_GEMV_MAX_T, knobs.c; default 16). */
static int cu_gemv_max_t(void) { return cu_knob(CU_KNOB_GEMV_MAX_T); }
#define CU_GEMV_MAX_T cu_gemv_max_t()

/* Rows up to which plain bf16 linears use the tensor-core GEMV instead of cuBLASLt:
 * MS_CU_BF16_GEMV_MAX_T (knobs.c; default 0 = always cuBLASLt, which measured 10-15% faster than
 * gemv_mma for the GLM-4.5-Air projections and lm_head at one row on the H200: bench/NOTES.md). */
static int cu_bf16_gemv_max_t(void) { return cu_knob(CU_KNOB_BF16_GEMV_MAX_T); }

static int64_t rows_of(const ms_tensor *t, int64_t cols) { return cols ? ms_tensor_numel(t) / cols : 0; }

/* y [T,N] = x [T,K] · Wᵀ (+ bias). */
static int cu_linear(ms_backend *b, const ms_linear *W, const ms_tensor *x, ms_tensor *y, ms_err *err) {
    CU_ENTER(b);
    cu_wdesc d;
    MS_TRY(cu_wdesc_of(W, &d, err));
    const int K = d.k, N = d.n;
    int64_t T = rows_of(x, K);
    MS_ASSERT(ms_tensor_numel(x) == T * K);
    MS_ASSERT(ms_tensor_numel(y) == T * N);
    MS_ASSERT(y->dtype == MS_BF16 || y->dtype == MS_F32);
    if (T == 0) return MS_OK;
    if (T > INT32_MAX) return ms_errf(err, MS_ERR_INVALID, "%s: too many rows", W->name ? W->name : "linear");
    const bf16 *xb = (const bf16 *)x->data;
    if (x->dtype != MS_BF16 && !(d.fmt == MS_WFMT_PLAIN && d.dtype == MS_F32)) {
        void *tmp;
        MS_TRY(cu_scratch(b, SCR_TMP, (size_t)T * K * 2, &tmp, err));
        MS_TRY(cu_convert(b, x->data, x->dtype, tmp, MS_BF16, (size_t)T * K, err));
        xb = (const bf16 *)tmp;
    }
    if (d.fmt == MS_WFMT_PLAIN && d.dtype == MS_F32) {
        const float *xf = (const float *)x->data;
        size_t need = (x->dtype != MS_F32 ? (size_t)T * K * 4 : 0) + (y->dtype != MS_F32 ? (size_t)T * N * 4 : 0);
        char *tmp = NULL;
        if (need) MS_TRY(cu_scratch(b, SCR_TMP, need, (void **)&tmp, err));
        char *p = tmp;
        if (x->dtype != MS_F32) {
            MS_TRY(cu_convert(b, x->data, x->dtype, p, MS_F32, (size_t)T * K, err));
            xf = (const float *)p;
            p += (size_t)T * K * 4;
        }
        float *yf = y->dtype == MS_F32 ? (float *)y->data : (float *)p;
        MS_TRY(cu_gemm(b, (int)T, N, K, xf, K, MS_F32, d.w, K, 1, yf, N, MS_F32, 0.f, err));
        if (W->bias.data) MS_TRY(cu_add_bias(b, yf, MS_F32, (const float *)W->bias.data, T, N, err));
        if (y->dtype != MS_F32) MS_TRY(cu_convert(b, yf, MS_F32, y->data, y->dtype, (size_t)T * N, err));
        return MS_OK;
    }
    const float *bias = W->bias.data ? (const float *)W->bias.data : NULL;
    if (d.fmt == MS_WFMT_PLAIN && d.dtype == MS_BF16) { /* 1..4 rows: the streaming GEMV where it applies */
        const cu_gvb_call g = {.mode = 0, .T = (int)T, .N = N, .K = K, .weights_quiet = cu_of(b)->weights_quiet,
                               .w0 = (const bf16 *)d.w, .bias = bias,
                               .x = xb, .y = y->data, .y_type = y->dtype, .ldy = N};
        int done = 0;
        MS_TRY(cu_gemv_bf16(b, &g, &done, err));
        if (done) return MS_OK;
    }
    const int plain_gemv = T <= cu_bf16_gemv_max_t() || (T <= 16 && N <= cu_knob(CU_KNOB_BF16_GEMV_MAX_N));
    if ((d.fmt == MS_WFMT_PLAIN ? plain_gemv : T <= CU_GEMV_MAX_T) && cu_gemv_mma_usable(b, &d, xb, 1)) {
        /* tensor-core GEMV, bias added in its epilogue */
        const cu_gemv_call c = {.mode = 0, .n_groups = 1, .w0 = d, .bias = bias, .rows_total = (int)T, .x = xb,
                                .y = y->data, .y_type = y->dtype, .ldy = N};
        return cu_gemv_mma(b, &c, err);
    }
    if (d.fmt == MS_WFMT_PLAIN) {
        MS_TRY(cu_gemm(b, (int)T, N, K, xb, K, MS_BF16, d.w, K, 1, y->data, N, y->dtype, 0.f, err));
    } else if (T <= CU_GEMV_MAX_T) {
        const cu_gemv_call c = {.mode = 0, .n_groups = 1, .w0 = d, .rows_total = (int)T, .x = xb, .y = y->data,
                                .y_type = y->dtype, .ldy = N};
        MS_TRY(cu_gemv_grouped(b, &c, err));
    } else {
        const bf16 *wb;
        MS_TRY(cu_weight_bf16(b, W, 0, &wb, err));
        MS_TRY(cu_gemm(b, (int)T, N, K, xb, K, MS_BF16, wb, K, 1, y->data, N, y->dtype, 0.f, err));
    }
    if (W->bias.data) MS_TRY(cu_add_bias(b, y->data, y->dtype, (const float *)W->bias.data, T, N, err));
    return MS_OK;
}

/* out [T,I] = silu(x·gateᵀ) * (x·upᵀ) in one pass over both weights (tensor-core GEMV, few rows);
 * MS_ERR_UNSUPPORTED (the caller runs two linears and silu_mul) for other shapes or formats. */
static int cu_linear_swiglu(ms_backend *b, const ms_linear *gate, const ms_linear *up, const ms_tensor *x,
                            ms_tensor *out, ms_err *err) {
    CU_ENTER(b);
    cu_wdesc dg, du;
    MS_TRY(cu_wdesc_of(gate, &dg, err));
    MS_TRY(cu_wdesc_of(up, &du, err));
    const int64_t T = rows_of(x, dg.k);
    if (x->dtype == MS_BF16 && out->dtype == MS_BF16 && T >= 1 && T <= 16 && !gate->bias.data && !up->bias.data &&
        dg.fmt == MS_WFMT_PLAIN && du.fmt == MS_WFMT_PLAIN && dg.dtype == MS_BF16 && du.dtype == MS_BF16 &&
        dg.n == du.n && dg.k == du.k) { /* 1..4 rows: the streaming GEMV where it applies */
        MS_ASSERT(ms_tensor_numel(out) == T * dg.n);
        const cu_gvb_call g = {.mode = 1, .T = (int)T, .N = dg.n, .K = dg.k, .weights_quiet = cu_of(b)->weights_quiet,
                               .w0 = (const bf16 *)dg.w,
                               .w1 = (const bf16 *)du.w, .x = (const bf16 *)x->data, .y = out->data,
                               .y_type = MS_BF16, .ldy = dg.n};
        int done = 0;
        MS_TRY(cu_gemv_bf16(b, &g, &done, err));
        if (done) return MS_OK;
    }
    if (x->dtype != MS_BF16 || out->dtype != MS_BF16 || T < 1 || T > 16 || gate->bias.data || up->bias.data ||
        dg.fmt != du.fmt || dg.dtype != du.dtype || dg.n != du.n || dg.k != du.k ||
        (dg.fmt == MS_WFMT_PLAIN && T > cu_bf16_gemv_max_t()) || !cu_gemv_mma_usable(b, &dg, x->data, 1) ||
        !cu_gemv_mma_usable(b, &du, x->data, 1))
        return ms_errf(err, MS_ERR_UNSUPPORTED, "linear_swiglu: not for this shape");
    MS_ASSERT(ms_tensor_numel(out) == T * dg.n);
    const cu_gemv_call c = {.mode = 1, .n_groups = 1, .w0 = dg, .w1 = du, .rows_total = (int)T,
                            .x = (const bf16 *)x->data, .y = out->data, .y_type = MS_BF16, .ldy = dg.n};
    return cu_gemv_mma(b, &c, err);
}

/* Internal linear used by the router and runners: same as the op. */
int cu_linear_op(ms_backend *b, const ms_linear *W, const ms_tensor *x, ms_tensor *y, ms_err *err) {
    return cu_linear(b, W, x, y, err);
}

/* ---- router ---- */

static int cu_router(ms_backend *b, const ms_tensor *x, const ms_linear *gate, const ms_tensor *bias,
                     const ms_route_cfg *rc, int32_t *ids_d, float *w_d, ms_err *err) {
    CU_ENTER(b);
    int E = rc->n_experts;
    MS_ASSERT(gate->n_out == E);
    int64_t T = rows_of(x, gate->n_in);
    if (T == 0) return MS_OK;
    if (rc->topk <= 0 || rc->topk > E || rc->n_group <= 0 || E % rc->n_group || rc->topk_group <= 0 ||
        rc->topk_group > rc->n_group)
        return ms_errf(err, MS_ERR_INVALID, "router: unsupported routing (experts %d, top-k %d, groups %d/%d)", E,
                       rc->topk, rc->topk_group, rc->n_group);
    void *lg;
    MS_TRY(cu_scratch(b, SCR_TMP2, (size_t)T * E * 4, &lg, err));
    if (!cu_knob(CU_KNOB_ROUTER_UNFUSED)) {
        int done = 0;
        MS_TRY(cu_router_fused(b, x, gate, bias ? bias->data : NULL, bias ? bias->dtype : 0, rc, (int)T, (float *)lg,
                               ids_d, w_d, NULL, &done, err));
        if (done) return MS_OK;
    }
    ms_tensor y = ms_tensor_2d(MS_F32, T, E);
    y.data = lg;
    /* logits in fp32: bf16 x and bf16 weights multiply exactly in fp32, accumulate fp32 */
    MS_TRY(cu_linear(b, gate, x, &y, err));
    return cu_route(b, (const float *)lg, bias ? bias->data : NULL, bias ? bias->dtype : 0, rc, (int)T, ids_d, w_d,
                    err);
}

/* ---- norms folded into the op that reads them (norm_linear, norm_router) ---- */

/* Contract in cuda_internal.cuh. */
int cu_norm_of(ms_backend *b, const ms_norm_in *n, int64_t K, int router, cu_norm_in *o) {
    const ms_tensor *r = n->resid, *d = n->delta;
    const int fold = cu_knob(CU_KNOB_NORM_FOLD); /* 1 both, 2 the router only, 3 projections only */
    if (!fold || fold == (router ? 3 : 2) || !cu_of(b)->norm_sync || r->dtype != MS_F32 || n->w->dtype != MS_BF16 || n->out->dtype != MS_BF16 ||
        (d && d->dtype != MS_F32) || K % 8 || K / 8 > CU_NORM_U * CU_NORM_T ||
        ms_tensor_numel(r) != K || ms_tensor_numel(n->w) != K || ms_tensor_numel(n->out) != K ||
        (d && ms_tensor_numel(d) != K))
        return 0;
    if (((uintptr_t)r->data | (uintptr_t)n->w->data | (uintptr_t)n->out->data | (uintptr_t)(d ? d->data : NULL)) & 15)
        return 0;
    o->resid = (float *)r->data;
    o->delta = d ? (const float *)d->data : NULL;
    o->w = (const bf16 *)n->w->data;
    o->out = (bf16 *)n->out->data;
    o->eps = n->eps;
    o->H = (int)K;
    o->done = cu_of(b)->norm_sync;
    return 1;
}

/* backend.h norm_linear: the streaming bf16 GEMV at one row computes the norm in its blocks
 * (gemv_bf16.cu); other weights and shapes refuse. */
static int cu_norm_linear(ms_backend *b, const ms_norm_in *n, const ms_linear *W, ms_tensor *y, ms_err *err) {
    CU_ENTER(b);
    cu_wdesc d;
    MS_TRY(cu_wdesc_of(W, &d, err));
    cu_norm_in nin;
    if (d.fmt == MS_WFMT_PLAIN && d.dtype == MS_BF16 && ms_tensor_numel(y) == d.n &&
        (y->dtype == MS_BF16 || y->dtype == MS_F32) && cu_norm_of(b, n, d.k, 0, &nin)) {
        const cu_gvb_call g = {.mode = 0, .T = 1, .N = d.n, .K = d.k, .norm = &nin,
                               .weights_quiet = cu_of(b)->weights_quiet, .w0 = (const bf16 *)d.w,
                               .bias = W->bias.data ? (const float *)W->bias.data : NULL, .x = nin.out,
                               .y = y->data, .y_type = y->dtype, .ldy = d.n};
        int done = 0;
        MS_TRY(cu_gemv_bf16(b, &g, &done, err));
        if (done) return MS_OK;
    }
    return ms_errf(err, MS_ERR_UNSUPPORTED, "norm_linear: not for %s", W->name ? W->name : "this linear");
}

/* backend.h norm_router: the K-split router at one row computes the norm in its blocks (elementwise.cu). */
static int cu_norm_router(ms_backend *b, const ms_norm_in *n, const ms_linear *gate, const ms_tensor *bias,
                          const ms_route_cfg *rc, int32_t *ids_d, float *w_d, ms_err *err) {
    CU_ENTER(b);
    cu_norm_in nin;
    const int E = rc->n_experts;
    if (gate->n_out == E && rc->topk > 0 && rc->topk <= E && rc->n_group > 0 && E % rc->n_group == 0 &&
        rc->topk_group > 0 && rc->topk_group <= rc->n_group && !cu_knob(CU_KNOB_ROUTER_UNFUSED) &&
        cu_norm_of(b, n, gate->n_in, 1, &nin)) {
        void *lg;
        MS_TRY(cu_scratch(b, SCR_TMP2, (size_t)E * 4, &lg, err));
        int done = 0;
        MS_TRY(cu_router_fused(b, n->out, gate, bias ? bias->data : NULL, bias ? bias->dtype : 0, rc, 1, (float *)lg, ids_d,
                               w_d, &nin, &done, err));
        if (done) return MS_OK;
    }
    return ms_errf(err, MS_ERR_UNSUPPORTED, "norm_router: not for this router");
}

/* ---- absorbed MLA projections ---- */

static int cu_mla_absorb_q(ms_backend *b, const ms_linear *kv_b, const ms_tensor *q, int nh, int dn, int dr, int dv,
                           const int32_t *pos_d, const ms_rope_cfg *rc, ms_tensor *out, ms_err *err) {
    CU_ENTER(b);
    int kvl = (int)kv_b->n_in;
    MS_ASSERT(kv_b->n_out == (int64_t)nh * (dn + dv));
    MS_ASSERT(q->dtype == MS_BF16 && out->dtype == MS_BF16);
    int64_t T = rows_of(q, (int64_t)nh * (dn + dr));
    MS_ASSERT(ms_tensor_numel(out) == T * nh * (kvl + dr));
    if (rc && (rc->rot_dim < 0 || rc->rot_dim % 2 || rc->rot_off < dn || rc->rot_off + rc->rot_dim > dn + dr))
        return ms_errf(err, MS_ERR_INVALID, "mla_absorb_q: rotary columns %d..%d lie outside the rope part %d..%d of q",
                       rc->rot_off, rc->rot_off + rc->rot_dim, dn, dn + dr);
    if (T == 0) return MS_OK;
    const bf16 *W;
    MS_TRY(cu_weight_bf16(b, kv_b, 1, &W, err));
    int done = 0;
    MS_TRY(cu_mla_absorb_small(b, kv_b, W, (const bf16 *)q->data, (int)T, nh, dn, dr, dv, kvl, pos_d, rc,
                               (bf16 *)out->data, &done, err));
    if (done) return MS_OK;
    cu_impl *c = cu_of(b);
    float alpha = 1.f, beta = 0.f;
    CKB(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, kvl, (int)T, dn, &alpha, W, CUDA_R_16BF, kvl,
                                   (long long)(dn + dv) * kvl, q->data, CUDA_R_16BF, nh * (dn + dr), dn + dr, &beta,
                                   out->data, CUDA_R_16BF, nh * (kvl + dr), kvl + dr, nh, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    if (dr > 0)
        MS_TRY(cu_copy_rope_part(b, (const bf16 *)q->data, (bf16 *)out->data, (int)T, nh, dn, dr, kvl, pos_d, rc, err));
    return MS_OK;
}

static int cu_mla_v_up(ms_backend *b, const ms_linear *kv_b, const ms_tensor *o_lat, int nh, int dn, int dv,
                       ms_tensor *out, ms_err *err) {
    CU_ENTER(b);
    int kvl = (int)kv_b->n_in;
    MS_ASSERT(kv_b->n_out == (int64_t)nh * (dn + dv));
    MS_ASSERT(o_lat->dtype == MS_BF16 && out->dtype == MS_BF16);
    int64_t T = rows_of(o_lat, (int64_t)nh * kvl);
    MS_ASSERT(ms_tensor_numel(out) == T * nh * dv);
    if (T == 0) return MS_OK;
    const bf16 *W;
    MS_TRY(cu_weight_bf16(b, kv_b, 1, &W, err));
    int done = 0;
    MS_TRY(cu_mla_v_up_small(b, kv_b, W, (const bf16 *)o_lat->data, (int)T, nh, dn, dv, kvl, (bf16 *)out->data, &done,
                             err));
    if (done) return MS_OK;
    cu_impl *c = cu_of(b);
    float alpha = 1.f, beta = 0.f;
    CKB(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, dv, (int)T, kvl, &alpha, W + (size_t)dn * kvl,
                                   CUDA_R_16BF, kvl, (long long)(dn + dv) * kvl, o_lat->data, CUDA_R_16BF, nh * kvl,
                                   kvl, &beta, out->data, CUDA_R_16BF, nh * dv, dv, nh, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    return MS_OK;
}

/* b->gpu refreshed (memory free changes as the model and caches are placed). */
static int cu_device_info(ms_backend *b, ms_err *err) { return ms_cuda_device_info(b->device, &b->gpu, err); }

/* ---- ops table and constructor ---- */

/* Filled by name at first use so the table follows backend.h whatever its field order. */
static ms_backend_ops cu_ops;

static void cu_ops_init(void) {
    if (cu_ops.destroy) return;
    cu_ops.destroy = cu_destroy;
    cu_ops.alloc = cu_alloc;
    cu_ops.free = cu_free;
    cu_ops.upload = cu_upload;
    cu_ops.download = cu_download;
    cu_ops.sync = cu_sync;
    cu_ops.place_tensor = cu_place_tensor;
    cu_ops.place_linear = cu_place_linear;
    cu_ops.unplace_tensor = cu_unplace_tensor;
    cu_ops.unplace_linear = cu_unplace_linear;
    cu_ops.stack_linears = cu_stack_linears;
    cu_ops.embed = cu_op_embed;
    cu_ops.embed_part = cu_op_embed_part;
    cu_ops.remap_ids = cu_op_remap_ids;
    cu_ops.moe_append = cu_op_moe_append;
    cu_ops.rmsnorm = cu_op_rmsnorm;
    cu_ops.add_rmsnorm = cu_op_add_rmsnorm;
    cu_ops.layernorm = cu_op_layernorm;
    cu_ops.add = cu_op_add;
    cu_ops.silu_mul = cu_op_silu_mul;
    cu_ops.copy_cols = cu_op_copy_cols;
    cu_ops.gather_rows = cu_op_gather_rows;
    cu_ops.rope = cu_op_rope;
    cu_ops.linear = cu_linear;
    cu_ops.kv_store = cu_op_kv_store;
    cu_ops.attn_gqa = cu_op_attn_gqa;
    cu_ops.mla_attn = cu_op_mla_attn;
    cu_ops.mla_absorb_q = cu_mla_absorb_q;
    cu_ops.mla_v_up = cu_mla_v_up;
    cu_ops.indexer_topk = cu_op_indexer_topk;
    cu_ops.router = cu_router;
    cu_ops.find_nonfinite = cu_op_find_nonfinite;
    cu_ops.nonfinite_flag = cu_op_nonfinite_flag;
    cu_ops.argmax = cu_op_argmax;
    cu_ops.set_cols = cu_op_set_cols;
    cu_ops.scale = cu_op_scale;
    cu_ops.graph_begin = cu_graph_begin;
    cu_ops.graph_end = cu_graph_end;
    cu_ops.graph_launch = cu_graph_launch;
    cu_ops.graph_free = cu_graph_free;
    cu_ops.mem_epoch = cu_mem_epoch;
    cu_ops.host_pin = cu_host_pin;
    cu_ops.linear_swiglu = cu_linear_swiglu;
    cu_ops.norm_linear = cu_norm_linear;
    cu_ops.norm_router = cu_norm_router;
    cu_ops.gqa_prep = cu_op_gqa_prep;
    cu_ops.mla_kv_prep = cu_op_mla_kv_prep;
    cu_ops.idx_k_prep = cu_op_idx_k_prep;
    cu_ops.mla_prep = cu_op_mla_prep;
    cu_ops.host_unpin = cu_host_unpin;
    cu_ops.dummy_tensor = ms_cuda_dummy_tensor;
    cu_ops.dummy_linear = ms_cuda_dummy_linear;
    cu_ops.device_info = cu_device_info;
}


extern "C" int ms_backend_cuda_create(int device, ms_backend **out, ms_err *err) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return ms_errf(err, MS_ERR_UNSUPPORTED, "flag --device cuda: no usable NVIDIA GPU found (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    if (device < 0 || device >= n)
        return ms_errf(err, MS_ERR_INVALID, "flag --device cuda: GPU ordinal %d out of range (this machine has %d)",
                       device, n);
    ms_backend *b = (ms_backend *)calloc(1, sizeof *b);
    cu_impl *c = (cu_impl *)calloc(1, sizeof *c);
    if (c) c->weights_quiet = 1; /* nothing written yet */
    if (!b || !c) {
        free(b);
        free(c);
        return ms_errf(err, MS_ERR_NOMEM, "cuda backend: out of host memory");
    }
    cu_ops_init();
    b->ops = &cu_ops;
    b->name = "cuda";
    b->act_dtype = MS_BF16;
    b->device = device;
    b->impl = c;
    c->device = device;
    int rc = MS_OK;
    if ((rc = ms_cuda_device_info(device, &b->gpu, err)) != MS_OK) goto fail;
    {
        cudaError_t e2 = cudaSetDevice(device);
        if (e2 == cudaSuccess) e2 = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
        if (e2 == cudaSuccess) e2 = cudaDeviceGetAttribute(&c->max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
        if (e2 == cudaSuccess) e2 = cudaDeviceGetAttribute(&c->smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
        c->lt_ws_bytes = 32u << 20;
        if (e2 == cudaSuccess) e2 = cudaMalloc(&c->lt_ws, c->lt_ws_bytes);
        if (e2 != cudaSuccess) {
            rc = ms_errf(err, MS_ERR_RUNTIME, "cuda backend setup on GPU %d failed: %s", device, cudaGetErrorString(e2));
            goto fail;
        }
        if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS || cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS ||
            cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS ||
            cublasSetWorkspace(c->blas, c->lt_ws, c->lt_ws_bytes) != CUBLAS_STATUS_SUCCESS) {
            rc = ms_errf(err, MS_ERR_RUNTIME, "cuda backend: creating the cuBLAS/cuBLASLt handles failed on GPU %d",
                         device);
            goto fail;
        }
    }
    if ((rc = cu_gw_probe(b, &c->have_wgmma, err)) != MS_OK) goto fail;
    {
        void *sync = NULL;
        /* 64 bytes of counters, then the routed MoE kernel's partial logits at byte 256 */
        cudaError_t e3 = cudaMalloc(&sync, 256 + sizeof(float) * CU_MOE_PART_MAX);
        if (e3 == cudaSuccess) e3 = cudaMemsetAsync(sync, 0, 64, c->stream);
        if (e3 == cudaSuccess) e3 = cudaStreamSynchronize(c->stream);
        if (e3 != cudaSuccess) {
            if (sync) cudaFree(sync);
            rc = ms_errf(err, MS_ERR_RUNTIME, "cuda backend: allocating the MoE counters failed on GPU %d: %s", device,
                         cudaGetErrorString(e3));
            goto fail;
        }
        if ((rc = cu_own(b, sync, err)) != MS_OK) {
            cudaFree(sync);
            goto fail;
        }
        c->moe_sync = (unsigned *)sync;
        c->norm_sync = (unsigned *)sync + 8; /* its own 32 bytes of the 64 */
        c->moe_part = (float *)((char *)sync + 256);
    }
    if ((rc = cu_trace_attach(b, err)) != MS_OK) goto fail;
    *out = b;
    return MS_OK;
fail:
    cu_destroy(b);
    return rc;
}
