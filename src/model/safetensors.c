/* safetensors.c - the checkpoint reader and writer.
 *
 * Checkpoints come from anywhere, so nothing in a header is trusted: the header length, every
 * offset, shape and dtype is checked against the mapped file before a pointer into the mapping is
 * handed out, and every failure names the file and the tensor or field. Data is never copied: views
 * point into a read-only mmap that lives until ms_st_close. Big checkpoints have tens of thousands
 * of tensors in dozens of shards, hence the hash table and the parallel open/prefetch. */
#include "model/safetensors.h"

#include "core/fileutil.h"
#include "core/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define ST_MAX_HEADER (256u << 20) /* real headers are a few MB; refuse absurd ones */
#define ST_MAX_SHARDS 4096
#define ST_MAX_TENSORS (1 << 24)

typedef struct st_file {
    char *path;
    int fd;
    const uint8_t *map;
    size_t size;
    size_t data_off; /* 8 + header length */
    /* filled by the parallel open */
    ms_st_tensor *t;
    int n;
    ms_err err;
    int rc;
} st_file;

struct ms_st_set {
    st_file *files;
    int n_files;
    ms_st_tensor *t;
    int n;
    uint32_t *slots; /* open addressing: tensor index + 1, 0 = empty */
    uint32_t mask;
    uint64_t total_bytes;
};

/* ---- hash table ---- */

static uint64_t hash_name(const char *s) { return XXH3_64bits(s, strlen(s)); }

static int build_index(ms_st_set *s, ms_err *err) {
    uint32_t cap = 16;
    while (cap < (uint32_t)s->n * 2u) cap <<= 1;
    s->slots = calloc(cap, sizeof *s->slots);
    if (!s->slots) return ms_errf(err, MS_ERR_NOMEM, "safetensors: out of memory for the tensor index");
    s->mask = cap - 1;
    for (int i = 0; i < s->n; i++) {
        uint32_t h = (uint32_t)hash_name(s->t[i].name) & s->mask;
        while (s->slots[h]) {
            const ms_st_tensor *o = &s->t[s->slots[h] - 1];
            if (!strcmp(o->name, s->t[i].name))
                return ms_errf(err, MS_ERR_FORMAT, "%s: tensor '%s' is also in %s (tensor names must be unique)",
                               s->files[s->t[i].file].path, s->t[i].name, s->files[o->file].path);
            h = (h + 1) & s->mask;
        }
        s->slots[h] = (uint32_t)i + 1;
    }
    return MS_OK;
}

const ms_st_tensor *ms_st_find(const ms_st_set *s, const char *name) {
    if (!s || !s->slots) return NULL;
    uint32_t h = (uint32_t)hash_name(name) & s->mask;
    while (s->slots[h]) {
        const ms_st_tensor *t = &s->t[s->slots[h] - 1];
        if (!strcmp(t->name, name)) return t;
        h = (h + 1) & s->mask;
    }
    return NULL;
}

int ms_st_count(const ms_st_set *s) { return s ? s->n : 0; }
const ms_st_tensor *ms_st_at(const ms_st_set *s, int i) { return (s && i >= 0 && i < s->n) ? &s->t[i] : NULL; }
const char *ms_st_file_name(const ms_st_set *s, int file) {
    return (s && file >= 0 && file < s->n_files) ? s->files[file].path : "?";
}
uint64_t ms_st_total_bytes(const ms_st_set *s) { return s ? s->total_bytes : 0; }

/* ---- one file ---- */

typedef struct range { uint64_t b, e; int idx; } range;
static int cmp_range(const void *a, const void *b) {
    const range *x = a, *y = b;
    return x->b < y->b ? -1 : x->b > y->b ? 1 : (x->e < y->e ? -1 : x->e > y->e);
}

/* Reads a JSON integer that must be a non-negative int64. */
static int json_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return 0;
    json_int_t x = json_integer_value(v);
    if (x < 0) return 0;
    *out = (uint64_t)x;
    return 1;
}

static int parse_entry(st_file *f, const char *name, json_t *v, ms_st_tensor *t, uint64_t data_size, ms_err *err) {
    const char *p = f->path;
    if (!json_is_object(v)) return ms_errf(err, MS_ERR_FORMAT, "%s: tensor '%s': header entry is not an object", p, name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"), *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd)) return ms_errf(err, MS_ERR_FORMAT, "%s: tensor '%s': field 'dtype' missing or not a string", p, name);
    ms_dtype dt = ms_dtype_parse(json_string_value(jd));
    if (dt == MS_DTYPE_INVALID)
        return ms_errf(err, MS_ERR_UNSUPPORTED,
                       "%s: tensor '%s': unknown dtype '%s' (supported: BF16, F16, F32, F8_E4M3, U8, I8, I32, I64, F64, BOOL)",
                       p, name, json_string_value(jd));
    if (!json_is_array(js)) return ms_errf(err, MS_ERR_FORMAT, "%s: tensor '%s': field 'shape' missing or not an array", p, name);
    size_t nd = json_array_size(js);
    if (nd > MS_MAX_DIMS) return ms_errf(err, MS_ERR_FORMAT, "%s: tensor '%s': shape has %zu dims (at most %d)", p, name, nd, MS_MAX_DIMS);
    uint64_t numel = 1;
    int overflow = 0;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (!json_u64(json_array_get(js, i), &d) || d > (uint64_t)INT64_MAX)
            return ms_errf(err, MS_ERR_FORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer", p, name, i);
        t->shape[i] = (int64_t)d;
        if (d && numel > UINT64_MAX / d) overflow = 1;
        else numel *= d;
    }
    size_t es = ms_dtype_size(dt);
    if (overflow || (numel && numel > UINT64_MAX / es))
        return ms_errf(err, MS_ERR_FORMAT, "%s: tensor '%s': shape product overflows", p, name);
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return ms_errf(err, MS_ERR_FORMAT, "%s: tensor '%s': field 'data_offsets' must be [begin, end]", p, name);
    uint64_t b, e;
    if (!json_u64(json_array_get(jo, 0), &b) || !json_u64(json_array_get(jo, 1), &e))
        return ms_errf(err, MS_ERR_FORMAT, "%s: tensor '%s': data_offsets are not non-negative integers", p, name);
    if (b > e) return ms_errf(err, MS_ERR_FORMAT, "%s: tensor '%s': data_offsets begin %llu > end %llu", p, name,
                              (unsigned long long)b, (unsigned long long)e);
    if (e > data_size)
        return ms_errf(err, MS_ERR_FORMAT, "%s: tensor '%s': data_offsets end %llu is past the data section (%llu bytes)",
                       p, name, (unsigned long long)e, (unsigned long long)data_size);
    if (e - b != numel * es)
        return ms_errf(err, MS_ERR_FORMAT, "%s: tensor '%s': %llu data bytes but dtype %s x shape needs %llu", p, name,
                       (unsigned long long)(e - b), ms_dtype_name(dt), (unsigned long long)(numel * es));
    t->dtype = dt;
    t->ndim = (int)nd;
    t->data = f->map + f->data_off + b;
    t->nbytes = (size_t)(e - b);
    return MS_OK;
}

static void file_close(st_file *f) {
    if (f->map) munmap((void *)f->map, f->size);
    if (f->fd >= 0) close(f->fd);
    f->map = NULL;
    f->fd = -1;
}

/* Maps one file and parses its header into f->t (names malloc'd). */
static int file_open(st_file *f, int file_idx, ms_err *err) {
    const char *p = f->path;
    f->fd = open(p, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) return ms_errf(err, errno == ENOENT ? MS_ERR_NOT_FOUND : MS_ERR_IO, "%s: %s", p, strerror(errno));
    struct stat st;
    if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode)) return ms_errf(err, MS_ERR_IO, "%s: not a regular file", p);
    f->size = (size_t)st.st_size;
    if (f->size < 8)
        return ms_errf(err, MS_ERR_FORMAT, "%s: truncated: %zu bytes, shorter than the 8-byte header length", p, f->size);
    void *m = mmap(NULL, f->size, PROT_READ, MAP_SHARED, f->fd, 0);
    if (m == MAP_FAILED) return ms_errf(err, MS_ERR_IO, "%s: mmap failed: %s", p, strerror(errno));
    f->map = m;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | f->map[i];
    if (hl > f->size - 8)
        return ms_errf(err, MS_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)", p,
                       (unsigned long long)hl, f->size);
    if (hl > ST_MAX_HEADER)
        return ms_errf(err, MS_ERR_FORMAT, "%s: header length %llu exceeds the %u-byte limit", p, (unsigned long long)hl,
                       ST_MAX_HEADER);
    if (hl < 2) return ms_errf(err, MS_ERR_FORMAT, "%s: header length %llu is too short for a JSON object", p, (unsigned long long)hl);
    f->data_off = 8 + (size_t)hl;
    json_error_t je;
    json_t *root = json_loadb((const char *)f->map + 8, (size_t)hl, JSON_REJECT_DUPLICATES, &je);
    if (!root) return ms_errf(err, MS_ERR_FORMAT, "%s: header is not valid JSON: %s (offset %d)", p, je.text, je.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return ms_errf(err, MS_ERR_FORMAT, "%s: header is not a JSON object", p);
    }
    size_t n = json_object_size(root);
    if (n > ST_MAX_TENSORS) {
        json_decref(root);
        return ms_errf(err, MS_ERR_FORMAT, "%s: header lists %zu entries (limit %d)", p, n, ST_MAX_TENSORS);
    }
    f->t = calloc(n ? n : 1, sizeof *f->t);
    range *r = calloc(n ? n : 1, sizeof *r);
    if (!f->t || !r) {
        free(r);
        json_decref(root);
        return ms_errf(err, MS_ERR_NOMEM, "%s: out of memory for %zu header entries", p, n);
    }
    uint64_t data_size = f->size - f->data_off;
    int rc = MS_OK, nr = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v)) { rc = ms_errf(err, MS_ERR_FORMAT, "%s: __metadata__ is not an object", p); break; }
            continue;
        }
        ms_st_tensor *t = &f->t[f->n];
        if (!*key) { rc = ms_errf(err, MS_ERR_FORMAT, "%s: a tensor has an empty name", p); break; }
        t->name = strdup(key);
        if (!t->name) { rc = ms_errf(err, MS_ERR_NOMEM, "%s: out of memory", p); break; }
        t->file = file_idx;
        f->n++;
        rc = parse_entry(f, key, v, t, data_size, err);
        if (rc) break;
        uint64_t b = (uint64_t)((const uint8_t *)t->data - f->map - f->data_off);
        if (t->nbytes) r[nr++] = (range){b, b + t->nbytes, f->n - 1};
    }
    if (!rc && nr > 1) {
        qsort(r, (size_t)nr, sizeof *r, cmp_range);
        for (int i = 1; i < nr; i++)
            if (r[i].b < r[i - 1].e) {
                rc = ms_errf(err, MS_ERR_FORMAT, "%s: tensor '%s' (bytes %llu..%llu) overlaps tensor '%s' (bytes %llu..%llu)",
                             p, f->t[r[i].idx].name, (unsigned long long)r[i].b, (unsigned long long)r[i].e,
                             f->t[r[i - 1].idx].name, (unsigned long long)r[i - 1].b, (unsigned long long)r[i - 1].e);
                break;
            }
    }
    free(r);
    json_decref(root);
    return rc;
}

/* ---- parallel helper (pthreads; shard opening is I/O bound, not worth the compute pool) ---- */

typedef struct par_job {
    void (*fn)(void *ctx, int i);
    void *ctx;
    int n;
    atomic_int next;
} par_job;

static void *par_worker(void *arg) {
    par_job *j = arg;
    for (;;) {
        int i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n) break;
        j->fn(j->ctx, i);
    }
    return NULL;
}

static void par_for(int n, int n_threads, void (*fn)(void *, int), void *ctx) {
    par_job j = {fn, ctx, n, 0};
    if (n_threads > n) n_threads = n;
    if (n_threads > 64) n_threads = 64;
    pthread_t th[64];
    int started = 0;
    for (int i = 1; i < n_threads; i++)
        if (pthread_create(&th[started], NULL, par_worker, &j) == 0) started++;
    par_worker(&j);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
}

static void open_one(void *ctx, int i) {
    st_file *f = &((st_file *)ctx)[i];
    f->rc = file_open(f, i, &f->err);
}

/* ---- open ---- */

void ms_st_close(ms_st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n_files; i++) {
        st_file *f = &s->files[i];
        for (int k = 0; k < f->n; k++) free((char *)f->t[k].name);
        free(f->t);
        file_close(f);
        free(f->path);
    }
    if (s->t) /* names are owned by the per-file arrays freed above */
        free(s->t);
    free(s->files);
    free(s->slots);
    free(s);
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int add_file(ms_st_set *s, const char *path, ms_err *err) {
    if (s->n_files >= ST_MAX_SHARDS) return ms_errf(err, MS_ERR_FORMAT, "%s: more than %d shards", path, ST_MAX_SHARDS);
    st_file *nf = realloc(s->files, (size_t)(s->n_files + 1) * sizeof *nf);
    if (!nf) return ms_errf(err, MS_ERR_NOMEM, "safetensors: out of memory");
    s->files = nf;
    st_file *f = &s->files[s->n_files];
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path) return ms_errf(err, MS_ERR_NOMEM, "safetensors: out of memory");
    s->n_files++;
    return MS_OK;
}

/* Reads model.safetensors.index.json: the set of shard files plus the name -> shard map, which is
 * cross-checked after the shards are open. */
static int read_index(ms_st_set *s, const char *dir, const char *index_path, json_t **wmap_out, ms_err *err) {
    char *text;
    size_t len;
    MS_TRY(ms_read_file(index_path, 1u << 30, &text, &len, err));
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root) return ms_errf(err, MS_ERR_FORMAT, "%s: malformed JSON: %s (line %d)", index_path, je.text, je.line);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(root);
        return ms_errf(err, MS_ERR_FORMAT, "%s: field 'weight_map' missing or not an object", index_path);
    }
    /* unique shard names, sorted for a stable order */
    size_t n = json_object_size(wm), nu = 0;
    const char **names = calloc(n ? n : 1, sizeof *names);
    if (!names) { json_decref(root); return ms_errf(err, MS_ERR_NOMEM, "%s: out of memory", index_path); }
    const char *key;
    json_t *v;
    int rc = MS_OK;
    json_object_foreach(wm, key, v) {
        if (!json_is_string(v)) { rc = ms_errf(err, MS_ERR_FORMAT, "%s: weight_map['%s'] is not a string", index_path, key); break; }
        const char *fn = json_string_value(v);
        if (!*fn || fn[0] == '/' || strstr(fn, "..")) {
            rc = ms_errf(err, MS_ERR_FORMAT, "%s: weight_map['%s']: shard name '%s' must be a file inside the model directory",
                         index_path, key, fn);
            break;
        }
        names[nu++] = fn;
    }
    if (!rc) {
        qsort(names, nu, sizeof *names, cmp_str);
        for (size_t i = 0; i < nu && !rc; i++) {
            if (i && !strcmp(names[i], names[i - 1])) continue;
            char path[4096];
            if (ms_path_join(path, sizeof path, dir, names[i])) rc = ms_errf(err, MS_ERR_INVALID, "%s: path too long", dir);
            else rc = add_file(s, path, err);
        }
    }
    free(names);
    if (rc) { json_decref(root); return rc; }
    *wmap_out = root;
    return MS_OK;
}

static int list_dir_safetensors(ms_st_set *s, const char *dir, ms_err *err) {
    DIR *d = opendir(dir);
    if (!d) return ms_errf(err, errno == ENOENT ? MS_ERR_NOT_FOUND : MS_ERR_IO, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    int n = 0, rc = MS_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!ends_with(e->d_name, ".safetensors") || e->d_name[0] == '.') continue;
        char **nn = realloc(names, (size_t)(n + 1) * sizeof *nn);
        if (!nn || !(nn[n] = strdup(e->d_name))) { names = nn ? nn : names; rc = ms_errf(err, MS_ERR_NOMEM, "%s: out of memory", dir); break; }
        names = nn;
        n++;
        if (n > ST_MAX_SHARDS) { rc = ms_errf(err, MS_ERR_FORMAT, "%s: more than %d .safetensors files", dir, ST_MAX_SHARDS); break; }
    }
    closedir(d);
    if (!rc && n == 0)
        rc = ms_errf(err, MS_ERR_NOT_FOUND, "%s: no model.safetensors, model.safetensors.index.json or *.safetensors file", dir);
    if (!rc) qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 0; i < n; i++) {
        char path[4096];
        if (!rc) {
            if (ms_path_join(path, sizeof path, dir, names[i])) rc = ms_errf(err, MS_ERR_INVALID, "%s: path too long", dir);
            else rc = add_file(s, path, err);
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int ms_st_open(const char *path, ms_st_set **out, ms_err *err) {
    *out = NULL;
    ms_st_set *s = calloc(1, sizeof *s);
    if (!s) return ms_errf(err, MS_ERR_NOMEM, "safetensors: out of memory");
    json_t *index = NULL;
    char index_path[4096] = "";
    int rc = MS_OK;
    struct stat st;
    if (stat(path, &st) != 0) {
        rc = ms_errf(err, errno == ENOENT ? MS_ERR_NOT_FOUND : MS_ERR_IO, "%s: %s", path, strerror(errno));
    } else if (S_ISDIR(st.st_mode)) {
        char single[4096];
        if (ms_path_join(index_path, sizeof index_path, path, "model.safetensors.index.json") ||
            ms_path_join(single, sizeof single, path, "model.safetensors"))
            rc = ms_errf(err, MS_ERR_INVALID, "%s: path too long", path);
        else if (ms_path_exists(index_path)) rc = read_index(s, path, index_path, &index, err);
        else if (ms_path_exists(single)) rc = add_file(s, single, err);
        else rc = list_dir_safetensors(s, path, err);
    } else {
        rc = add_file(s, path, err);
    }
    if (!rc) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        int nt = s->n_files < 16 ? s->n_files : 16;
        if (ncpu > 0 && nt > 2 * ncpu) nt = (int)(2 * ncpu);
        par_for(s->n_files, nt < 1 ? 1 : nt, open_one, s->files);
        for (int i = 0; i < s->n_files && !rc; i++)
            if (s->files[i].rc) {
                rc = s->files[i].rc;
                if (err) *err = s->files[i].err;
            }
    }
    if (!rc) {
        size_t total = 0;
        for (int i = 0; i < s->n_files; i++) total += (size_t)s->files[i].n;
        if (total > ST_MAX_TENSORS) rc = ms_errf(err, MS_ERR_FORMAT, "%s: more than %d tensors", path, ST_MAX_TENSORS);
        else if (!(s->t = calloc(total ? total : 1, sizeof *s->t))) rc = ms_errf(err, MS_ERR_NOMEM, "%s: out of memory", path);
        for (int i = 0; i < s->n_files && !rc; i++) {
            memcpy(s->t + s->n, s->files[i].t, (size_t)s->files[i].n * sizeof *s->t);
            s->n += s->files[i].n;
            for (int k = 0; k < s->files[i].n; k++) s->total_bytes += s->files[i].t[k].nbytes;
        }
    }
    if (!rc) rc = build_index(s, err);
    if (!rc && index) {
        json_t *wm = json_object_get(index, "weight_map");
        const char *key;
        json_t *v;
        json_object_foreach(wm, key, v) {
            const ms_st_tensor *t = ms_st_find(s, key);
            const char *fn = json_string_value(v);
            const char *actual = t ? strrchr(s->files[t->file].path, '/') : NULL;
            actual = actual ? actual + 1 : (t ? s->files[t->file].path : NULL);
            if (!t) { rc = ms_errf(err, MS_ERR_FORMAT, "%s: tensor '%s' is listed in weight_map under %s but that shard does not contain it", index_path, key, fn); break; }
            if (strcmp(actual, fn)) { rc = ms_errf(err, MS_ERR_FORMAT, "%s: tensor '%s' is listed in weight_map under %s but is stored in %s", index_path, key, fn, actual); break; }
        }
    }
    json_decref(index);
    if (rc) {
        ms_st_close(s);
        return rc;
    }
    *out = s;
    return MS_OK;
}

/* ---- prefetch ---- */

typedef struct pf_chunk { int file; size_t b, e; int tensors_done; } pf_chunk;
typedef struct pf_ctx {
    ms_st_set *s;
    pf_chunk *c;
    int n;
    atomic_int next;
    _Atomic uint64_t bytes;
    atomic_int tensors;
    atomic_int failed;
    atomic_int workers_done;
    size_t bufsz;
} pf_ctx;

static int cmp_tensor_pos(const void *a, const void *b) {
    const ms_st_tensor *x = *(const ms_st_tensor *const *)a, *y = *(const ms_st_tensor *const *)b;
    if (x->file != y->file) return x->file - y->file;
    return (uintptr_t)x->data < (uintptr_t)y->data ? -1 : (uintptr_t)x->data > (uintptr_t)y->data;
}

static void *pf_worker(void *arg) {
    pf_ctx *p = arg;
    char *buf = malloc(p->bufsz);
    if (!buf) {
        atomic_store(&p->failed, 1);
        atomic_fetch_add(&p->workers_done, 1);
        return NULL;
    }
    for (;;) {
        int i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n) break;
        pf_chunk *c = &p->c[i];
        st_file *f = &p->s->files[c->file];
        size_t off = c->b;
        while (off < c->e) {
            size_t want = c->e - off < p->bufsz ? c->e - off : p->bufsz;
            ssize_t got = pread(f->fd, buf, want, (off_t)off);
            if (got <= 0) break; /* the mapping still works; prefetch is best effort */
            off += (size_t)got;
            atomic_fetch_add(&p->bytes, (uint64_t)got);
        }
        atomic_fetch_add(&p->tensors, c->tensors_done);
    }
    free(buf);
    atomic_fetch_add(&p->workers_done, 1);
    return NULL;
}

int ms_st_prefetch(ms_st_set *s, int n_threads, ms_err *err) { return ms_st_prefetch_ex(s, n_threads, 1, err); }

int ms_st_prefetch_ex(ms_st_set *s, int n_threads, int progress, ms_err *err) {
    if (!s || s->n == 0) return MS_OK;
    const size_t CH = 32u << 20;
    const ms_st_tensor **ord = malloc((size_t)s->n * sizeof *ord);
    size_t maxc = (size_t)s->n + s->total_bytes / CH + 2;
    pf_chunk *c = calloc(maxc, sizeof *c);
    if (!ord || !c) { free(ord); free(c); return ms_errf(err, MS_ERR_NOMEM, "safetensors prefetch: out of memory"); }
    for (int i = 0; i < s->n; i++) ord[i] = &s->t[i];
    qsort(ord, (size_t)s->n, sizeof *ord, cmp_tensor_pos);
    /* chunks of consecutive tensors of ~CH bytes; a tensor bigger than CH is split, counted when its last piece is done */
    int n = 0;
    for (int i = 0; i < s->n;) {
        const ms_st_tensor *t = ord[i];
        st_file *f = &s->files[t->file];
        size_t b = (size_t)((const uint8_t *)t->data - f->map);
        if (t->nbytes > CH) {
            for (size_t o = 0; o < t->nbytes; o += CH) {
                size_t e = o + CH < t->nbytes ? o + CH : t->nbytes;
                c[n++] = (pf_chunk){t->file, b + o, b + e, e == t->nbytes};
            }
            i++;
            continue;
        }
        size_t e = b + t->nbytes;
        int k = 1;
        while (i + k < s->n && ord[i + k]->file == t->file && ord[i + k]->nbytes <= CH) {
            size_t b2 = (size_t)((const uint8_t *)ord[i + k]->data - f->map);
            if (b2 + ord[i + k]->nbytes - b > CH) break;
            if (b2 + ord[i + k]->nbytes > e) e = b2 + ord[i + k]->nbytes;
            k++;
        }
        c[n++] = (pf_chunk){t->file, b, e, k};
        i += k;
    }
    free(ord);
    if (n_threads <= 0) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = ncpu > 0 ? (int)(ncpu < 16 ? ncpu : 16) : 4;
        if (s->n_files > n_threads && s->n_files <= 32) n_threads = s->n_files;
    }
    if (n_threads > 64) n_threads = 64;
    pf_ctx p = {.s = s, .c = c, .n = n, .bufsz = 4u << 20};
    for (int i = 0; i < s->n_files; i++) posix_madvise((void *)s->files[i].map, s->files[i].size, POSIX_MADV_WILLNEED);
    pthread_t th[64];
    int started = 0;
    for (int i = 0; i < n_threads; i++)
        if (pthread_create(&th[started], NULL, pf_worker, &p) == 0) started++;
    if (!started) pf_worker(&p);
    int tty = progress && isatty(2);
    double t0 = ms_now();
    if (tty) {
        /* progress until the workers have taken every chunk and finished */
        while (atomic_load(&p.workers_done) < started) {
            uint64_t by = atomic_load(&p.bytes);
            double dt = ms_now() - t0;
            fprintf(stderr, "\rloading weights: %d/%d tensors, %.2f/%.2f GB, %.0f MB/s   ", atomic_load(&p.tensors), s->n,
                    by / 1e9, s->total_bytes / 1e9, dt > 0 ? by / 1e6 / dt : 0.0);
            usleep(200000);
        }
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (tty) {
        double dt = ms_now() - t0;
        uint64_t by = atomic_load(&p.bytes);
        fprintf(stderr, "\rloading weights: %d/%d tensors, %.2f GB in %.1f s, %.0f MB/s          \n", atomic_load(&p.tensors),
                s->n, by / 1e9, dt, dt > 0 ? by / 1e6 / dt : 0.0);
    }
    free(c);
    if (atomic_load(&p.failed)) return ms_errf(err, MS_ERR_NOMEM, "safetensors prefetch: out of memory for read buffers");
    return MS_OK;
}

/* ---- writer ---- */

typedef struct wr_entry {
    char *name;
    ms_dtype dtype;
    int ndim;
    int64_t shape[MS_MAX_DIMS];
    const void *data;
    size_t nbytes;
    ms_st_fill_fn fill;
    void *fill_ctx;
} wr_entry;

struct ms_st_writer {
    wr_entry *e;
    int n, cap;
    json_t *meta;
};

ms_st_writer *ms_st_writer_new(void) { return calloc(1, sizeof(ms_st_writer)); }

void ms_st_writer_free(ms_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->e[i].name);
    free(w->e);
    json_decref(w->meta);
    free(w);
}

static int writer_push(ms_st_writer *w, const char *name, ms_dtype dtype, int ndim, const int64_t *shape, size_t nbytes,
                       ms_err *err) {
    if (!name || !*name || !strcmp(name, "__metadata__"))
        return ms_errf(err, MS_ERR_INVALID, "safetensors writer: invalid tensor name '%s'", name ? name : "(null)");
    if (ndim < 0 || ndim > MS_MAX_DIMS) return ms_errf(err, MS_ERR_INVALID, "safetensors writer: tensor '%s': %d dims", name, ndim);
    if (ms_dtype_size(dtype) == 0) return ms_errf(err, MS_ERR_INVALID, "safetensors writer: tensor '%s': invalid dtype", name);
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return ms_errf(err, MS_ERR_INVALID, "safetensors writer: tensor '%s': negative dim", name);
        numel *= (uint64_t)shape[i];
    }
    if (numel * ms_dtype_size(dtype) != nbytes)
        return ms_errf(err, MS_ERR_INVALID, "safetensors writer: tensor '%s': %zu bytes but dtype x shape needs %llu", name,
                       nbytes, (unsigned long long)(numel * ms_dtype_size(dtype)));
    if (w->n == w->cap) {
        int nc = w->cap ? w->cap * 2 : 64;
        wr_entry *ne = realloc(w->e, (size_t)nc * sizeof *ne);
        if (!ne) return ms_errf(err, MS_ERR_NOMEM, "safetensors writer: out of memory");
        w->e = ne;
        w->cap = nc;
    }
    wr_entry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name))) return ms_errf(err, MS_ERR_NOMEM, "safetensors writer: out of memory");
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = nbytes;
    w->n++;
    return MS_OK;
}

int ms_st_writer_add(ms_st_writer *w, const char *name, ms_dtype dtype, int ndim, const int64_t *shape,
                     const void *data, size_t nbytes, ms_err *err) {
    MS_TRY(writer_push(w, name, dtype, ndim, shape, nbytes, err));
    w->e[w->n - 1].data = data;
    return MS_OK;
}

int ms_st_writer_add_fill(ms_st_writer *w, const char *name, ms_dtype dtype, int ndim, const int64_t *shape,
                          size_t nbytes, ms_st_fill_fn fill, void *ctx, ms_err *err) {
    MS_TRY(writer_push(w, name, dtype, ndim, shape, nbytes, err));
    w->e[w->n - 1].fill = fill;
    w->e[w->n - 1].fill_ctx = ctx;
    return MS_OK;
}

int ms_st_writer_meta(ms_st_writer *w, const char *key, const char *value, ms_err *err) {
    if (!w->meta && !(w->meta = json_object())) return ms_errf(err, MS_ERR_NOMEM, "safetensors writer: out of memory");
    if (json_object_set_new(w->meta, key, json_string(value)))
        return ms_errf(err, MS_ERR_INVALID, "safetensors writer: bad metadata entry '%s'", key);
    return MS_OK;
}

/* Larger elements first (keeps every tensor aligned to its element size when the data section
 * starts 8-aligned), then by name. */
static int cmp_entry(const void *a, const void *b) {
    const wr_entry *x = a, *y = b;
    size_t sx = ms_dtype_size(x->dtype), sy = ms_dtype_size(y->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

int ms_st_writer_finish(ms_st_writer *w, const char *path, ms_err *err) {
    qsort(w->e, (size_t)w->n, sizeof *w->e, cmp_entry);
    json_t *root = json_object();
    if (!root) return ms_errf(err, MS_ERR_NOMEM, "safetensors writer: out of memory");
    if (w->meta) json_object_set(root, "__metadata__", w->meta);
    uint64_t off = 0;
    int rc = MS_OK;
    for (int i = 0; i < w->n && !rc; i++) {
        wr_entry *e = &w->e[i];
        json_t *o = json_object(), *sh = json_array(), *of = json_array();
        json_object_set_new(o, "dtype", json_string(ms_dtype_name(e->dtype)));
        for (int d = 0; d < e->ndim; d++) json_array_append_new(sh, json_integer(e->shape[d]));
        json_object_set_new(o, "shape", sh);
        json_array_append_new(of, json_integer((json_int_t)off));
        json_array_append_new(of, json_integer((json_int_t)(off + e->nbytes)));
        json_object_set_new(o, "data_offsets", of);
        if (json_object_get(root, e->name)) rc = ms_errf(err, MS_ERR_INVALID, "safetensors writer: tensor '%s' added twice", e->name);
        json_object_set_new(root, e->name, o);
        off += e->nbytes;
    }
    char *hdr = rc ? NULL : json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(root);
    if (rc) return rc;
    if (!hdr) return ms_errf(err, MS_ERR_NOMEM, "safetensors writer: out of memory");
    size_t hl = strlen(hdr), pad = (8 - (8 + hl) % 8) % 8;
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid()) >= (int)sizeof tmp) {
        free(hdr);
        return ms_errf(err, MS_ERR_INVALID, "%s: path too long", path);
    }
    FILE *fp = fopen(tmp, "wb");
    if (!fp) { free(hdr); return ms_errf(err, MS_ERR_IO, "%s: %s", tmp, strerror(errno)); }
    setvbuf(fp, NULL, _IOFBF, 1 << 20);
    uint8_t len8[8];
    uint64_t L = hl + pad;
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(L >> (8 * i));
    int bad = fwrite(len8, 1, 8, fp) != 8 || fwrite(hdr, 1, hl, fp) != hl;
    for (size_t i = 0; i < pad && !bad; i++) bad = fputc(' ', fp) == EOF;
    free(hdr);
    for (int i = 0; i < w->n && !bad && !rc; i++) {
        wr_entry *e = &w->e[i];
        if (!e->nbytes) continue;
        if (e->fill) {
            void *buf = malloc(e->nbytes);
            if (!buf) { rc = ms_errf(err, MS_ERR_NOMEM, "%s: out of memory for tensor '%s' (%zu bytes)", path, e->name, e->nbytes); break; }
            rc = e->fill(e->fill_ctx, e->name, buf, e->nbytes, err);
            if (!rc) bad = fwrite(buf, 1, e->nbytes, fp) != e->nbytes;
            free(buf);
        } else {
            bad = fwrite(e->data, 1, e->nbytes, fp) != e->nbytes;
        }
    }
    bad |= fclose(fp) != 0;
    if (rc || bad || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        if (rc) return rc;
        return ms_errf(err, MS_ERR_IO, "%s: write failed: %s", path, strerror(e));
    }
    return MS_OK;
}
