/* hub.c - see hub.h. The metadata comes from one call, GET {endpoint}/api/models/{repo}/revision/
 * {rev}?blobs=true (the commit sha and, per file, its size, git blob id and LFS sha256); the files
 * from {endpoint}/{repo}/resolve/{commit}/{file}, several at once through one curl multi handle.
 * Blobs are named as huggingface_hub names them (LFS sha256, else the git blob id), so both tools
 * share one cache. */
#include "hub/hub.h"

#include "core/fileutil.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HUB_MAX_FILES 4096
#define HUB_META_MAX (64u << 20)

static void env_copy(char *dst, size_t cap, const char *name) {
    const char *v = getenv(name);
    dst[0] = 0;
    if (v && *v) snprintf(dst, cap, "%s", v);
}

void ms_hub_opts_from_env(ms_hub_opts *o) {
    memset(o, 0, sizeof *o);
    char home[4096];
    env_copy(home, sizeof home, "HF_HOME");
    if (!home[0]) {
        char xdg[3000];
        env_copy(xdg, sizeof xdg, "XDG_CACHE_HOME");
        const char *h = getenv("HOME");
        if (xdg[0]) snprintf(home, sizeof home, "%s/huggingface", xdg);
        else snprintf(home, sizeof home, "%s/.cache/huggingface", h && *h ? h : "/tmp");
    }
    env_copy(o->cache, sizeof o->cache, "HF_HUB_CACHE");
    if (!o->cache[0]) snprintf(o->cache, sizeof o->cache, "%.4090s/hub", home);
    env_copy(o->endpoint, sizeof o->endpoint, "HF_ENDPOINT");
    if (!o->endpoint[0]) snprintf(o->endpoint, sizeof o->endpoint, "https://huggingface.co");
    size_t el = strlen(o->endpoint);
    while (el > 0 && o->endpoint[el - 1] == '/') o->endpoint[--el] = 0;
    env_copy(o->token, sizeof o->token, "HF_TOKEN");
    if (!o->token[0]) env_copy(o->token, sizeof o->token, "HUGGING_FACE_HUB_TOKEN");
    if (!o->token[0]) { /* `huggingface-cli login` stores it here */
        char p[4200];
        snprintf(p, sizeof p, "%s/token", home);
        FILE *f = fopen(p, "r");
        if (f) {
            if (!fgets(o->token, sizeof o->token, f)) o->token[0] = 0;
            o->token[strcspn(o->token, "\r\n \t")] = 0;
            fclose(f);
        }
    }
    const char *off = getenv("HF_HUB_OFFLINE");
    o->offline = off && (!strcmp(off, "1") || !strcasecmp(off, "true") || !strcasecmp(off, "yes") || !strcasecmp(off, "on"));
    o->parallel = 8;
    o->retries = 5;
    o->progress = isatty(2);
}

int ms_hub_is_repo_id(const char *s) {
    if (!s || !*s || s[0] == '.' || s[0] == '/' || s[0] == '-') return 0;
    int slash = 0;
    size_t n = strlen(s);
    if (n > 200 || s[n - 1] == '/') return 0;
    for (const char *p = s; *p; p++) {
        if (*p == '/') {
            if (++slash > 1 || p[1] == '.' || p[1] == '-') return 0;
        } else if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '.') {
            return 0;
        }
        if (p[0] == '.' && p[1] == '.') return 0;
    }
    return slash == 1;
}

static int is_commit(const char *r) {
    if (strlen(r) != 40) return 0;
    for (const char *p = r; *p; p++)
        if (!isxdigit((unsigned char)*p)) return 0;
    return 1;
}

/* cache/models--org--name */
static void repo_dir(const ms_hub_opts *o, const char *repo, char *out, size_t cap) {
    char flat[256];
    snprintf(flat, sizeof flat, "%s", repo);
    char *sl = strchr(flat, '/');
    if (sl) *sl = 0;
    snprintf(out, cap, "%s/models--%s--%s", o->cache, flat, sl ? sl + 1 : "");
}

static int mkdirs(const char *path, ms_err *err) {
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) return ms_errf(err, MS_ERR_IO, "%s: %s", p, strerror(errno));
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST) return ms_errf(err, MS_ERR_IO, "%s: %s", p, strerror(errno));
    return MS_OK;
}

int ms_hub_cache_lookup(const ms_hub_opts *o, const char *repo, const char *revision, char *out, size_t cap, ms_err *err) {
    const char *rev = revision && *revision ? revision : "main";
    char rd[4400], commit[128], p[4600];
    repo_dir(o, repo, rd, sizeof rd);
    if (is_commit(rev)) {
        snprintf(commit, sizeof commit, "%s", rev);
    } else {
        snprintf(p, sizeof p, "%s/refs/%s", rd, rev);
        FILE *f = fopen(p, "r");
        if (!f) return ms_errf(err, MS_ERR_NOT_FOUND, "%s (revision %s) is not in the Hugging Face cache %s", repo, rev, o->cache);
        if (!fgets(commit, sizeof commit, f)) commit[0] = 0;
        fclose(f);
        commit[strcspn(commit, "\r\n ")] = 0;
    }
    snprintf(p, sizeof p, "%s/snapshots/%s", rd, commit);
    struct stat st;
    if (!commit[0] || stat(p, &st) != 0 || !S_ISDIR(st.st_mode))
        return ms_errf(err, MS_ERR_NOT_FOUND, "%s (revision %s) is not in the Hugging Face cache %s", repo, rev, o->cache);
    if ((size_t)snprintf(out, cap, "%s", p) >= cap) return ms_errf(err, MS_ERR_INVALID, "%s: path too long", p);
    return MS_OK;
}

/* ---- HTTP ---- */

typedef struct membuf {
    char *p;
    size_t n;
} membuf;

static size_t mem_write(char *d, size_t sz, size_t n, void *ud) {
    membuf *b = ud;
    size_t k = sz * n;
    if (b->n + k > HUB_META_MAX) return 0;
    char *q = realloc(b->p, b->n + k + 1);
    if (!q) return 0;
    memcpy(q + b->n, d, k);
    b->p = q;
    b->n += k;
    q[b->n] = 0;
    return k;
}

static struct curl_slist *auth_headers(const ms_hub_opts *o) {
    struct curl_slist *h = curl_slist_append(NULL, "User-Agent: moeserve");
    if (o->token[0]) {
        char a[600];
        snprintf(a, sizeof a, "Authorization: Bearer %s", o->token);
        h = curl_slist_append(h, a);
    }
    return h;
}

/* Percent-encodes what a path segment cannot hold; keeps '/' (file names in subfolders). */
static void url_path(char *out, size_t cap, const char *s) {
    size_t k = 0;
    for (; *s && k + 4 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (isalnum(c) || strchr("-._~/", c)) out[k++] = (char)c;
        else k += (size_t)snprintf(out + k, cap - k, "%%%02X", c);
    }
    out[k] = 0;
}

static int http_status_error(const ms_hub_opts *o, const char *repo, const char *what, long code, ms_err *err) {
    if (code == 401 || code == 403)
        return ms_errf(err, MS_ERR_NOT_FOUND, "%s: %s: HTTP %ld: the repo is gated or private, or does not exist: %s "
                       "(accept its terms on the hub and set HF_TOKEN)", repo, what, code,
                       o->token[0] ? "the token in HF_TOKEN was refused" : "no HF_TOKEN is set");
    if (code == 404)
        return ms_errf(err, MS_ERR_NOT_FOUND, "%s: %s: no such repo, revision or file on %s (HTTP 404)", repo, what, o->endpoint);
    return ms_errf(err, MS_ERR_IO, "%s: %s: HTTP %ld from %s", repo, what, code, o->endpoint);
}

/* ---- hashes ---- */

/* Hex digest of a file: sha256 of the bytes (LFS), or git's blob sha1 ("blob SIZE\0" + bytes). */
static int file_digest(const char *path, int git_sha1, char *hex, ms_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return ms_errf(err, MS_ERR_IO, "%s: %s", path, strerror(errno));
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c) { fclose(f); return ms_errf(err, MS_ERR_NOMEM, "out of memory"); }
    EVP_DigestInit_ex(c, git_sha1 ? EVP_sha1() : EVP_sha256(), NULL);
    if (git_sha1) {
        struct stat st;
        fstat(fileno(f), &st);
        char hdr[64];
        int hl = snprintf(hdr, sizeof hdr, "blob %lld", (long long)st.st_size);
        EVP_DigestUpdate(c, hdr, (size_t)hl + 1);
    }
    static __thread unsigned char buf[1 << 16];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) EVP_DigestUpdate(c, buf, k);
    int bad = ferror(f);
    fclose(f);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int ml = 0;
    EVP_DigestFinal_ex(c, md, &ml);
    EVP_MD_CTX_free(c);
    if (bad) return ms_errf(err, MS_ERR_IO, "%s: read error", path);
    for (unsigned i = 0; i < ml; i++) sprintf(hex + 2 * i, "%02x", md[i]);
    hex[2 * ml] = 0;
    return MS_OK;
}

/* ---- download ---- */

typedef struct hub_file {
    char name[512];    /* rfilename */
    char blob[80];     /* sha256 (LFS) or git blob id */
    int lfs;           /* blob is a sha256 of the content */
    long long size;
    long long have;    /* bytes on disk (resume point + received) */
    long long resumed_from; /* the Range start of this transfer (0: from the beginning) */
    int tries;
    int done;
    FILE *out;
    CURL *easy;
    struct curl_slist *hdr;
} hub_file;

/* Files a model directory needs, at the repo's top level. */
static int wanted(const char *name) {
    if (strchr(name, '/')) return 0;
    static const char *const ext[] = {".json", ".safetensors", ".jinja", ".txt", ".model", ".tiktoken", NULL};
    size_t n = strlen(name);
    for (int i = 0; ext[i]; i++) {
        size_t e = strlen(ext[i]);
        if (n > e && !strcmp(name + n - e, ext[i])) return 1;
    }
    return 0;
}

static size_t file_write(char *d, size_t sz, size_t n, void *ud) {
    hub_file *f = ud;
    long code = 0;
    curl_easy_getinfo(f->easy, CURLINFO_RESPONSE_CODE, &code);
    if (code != 200 && code != 206) return sz * n; /* an error body: dropped, the status says it */
    if (code == 200 && f->resumed_from) { /* the server ignored Range and sends it all: start over */
        if (ftruncate(fileno(f->out), 0) != 0 || fseek(f->out, 0, SEEK_SET) != 0) return 0;
        f->have = 0, f->resumed_from = 0;
    }
    size_t k = fwrite(d, sz, n, f->out);
    f->have += (long long)(k * sz);
    return k * sz;
}

static void human(char *b, size_t cap, double x) {
    if (x >= 1073741824.0) snprintf(b, cap, "%.2f GiB", x / 1073741824.0);
    else snprintf(b, cap, "%.1f MiB", x / 1048576.0);
}

static void draw(const ms_hub_opts *o, const char *repo, const hub_file *fs, int n, double t0, int final) {
    long long tot = 0, have = 0;
    int left = 0;
    for (int i = 0; i < n; i++) tot += fs[i].size, have += fs[i].have > fs[i].size ? fs[i].size : fs[i].have, left += !fs[i].done;
    char a[32], b[32];
    human(a, sizeof a, (double)have);
    human(b, sizeof b, (double)tot);
    double dt = ms_now() - t0;
    int width = 24, fill = tot ? (int)(width * (double)have / (double)tot) : width;
    char bar[32];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    fprintf(stderr, "\rdownload %s [%s] %s / %s %3.0f%% %.1f MiB/s, %d file%s left   %s", repo, bar, a, b,
            tot ? 100.0 * (double)have / (double)tot : 100.0, dt > 0 ? (double)have / dt / 1048576.0 : 0.0, left,
            left == 1 ? "" : "s", final ? "\n" : "");
    (void)o;
}

/* Opens blob.incomplete for appending and starts (or resumes) one transfer of f. */
static int start_file(const ms_hub_opts *o, CURLM *m, const char *repo, const char *commit, const char *blobs, hub_file *f,
                      ms_err *err) {
    char inc[4800], url[4096], path[1600];
    snprintf(inc, sizeof inc, "%s/%s.incomplete", blobs, f->blob);
    struct stat st;
    f->have = stat(inc, &st) == 0 ? (long long)st.st_size : 0;
    if (f->have > f->size) { unlink(inc); f->have = 0; }
    f->out = fopen(inc, "ab");
    if (!f->out) return ms_errf(err, MS_ERR_IO, "%s: %s", inc, strerror(errno));
    url_path(path, sizeof path, f->name);
    snprintf(url, sizeof url, "%s/%s/resolve/%s/%s", o->endpoint, repo, commit, path);
    f->easy = curl_easy_init();
    f->hdr = auth_headers(o);
    if (!f->easy) return ms_errf(err, MS_ERR_NOMEM, "out of memory");
    curl_easy_setopt(f->easy, CURLOPT_URL, url);
    curl_easy_setopt(f->easy, CURLOPT_HTTPHEADER, f->hdr);
    curl_easy_setopt(f->easy, CURLOPT_FOLLOWLOCATION, 1L); /* LFS files redirect to a CDN (no token sent there) */
    curl_easy_setopt(f->easy, CURLOPT_WRITEFUNCTION, file_write);
    curl_easy_setopt(f->easy, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(f->easy, CURLOPT_PRIVATE, f);
    curl_easy_setopt(f->easy, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(f->easy, CURLOPT_LOW_SPEED_LIMIT, 1L); /* a stalled transfer fails after 60 s and resumes */
    curl_easy_setopt(f->easy, CURLOPT_LOW_SPEED_TIME, 60L);
    f->resumed_from = f->have;
    if (f->have > 0) {
        char r[64];
        snprintf(r, sizeof r, "%lld-", f->have);
        curl_easy_setopt(f->easy, CURLOPT_RANGE, r);
    }
    curl_multi_add_handle(m, f->easy);
    return MS_OK;
}

static void end_transfer(CURLM *m, hub_file *f) {
    if (f->easy) curl_multi_remove_handle(m, f->easy), curl_easy_cleanup(f->easy);
    curl_slist_free_all(f->hdr);
    if (f->out) fclose(f->out);
    f->easy = NULL, f->hdr = NULL, f->out = NULL;
}

/* A finished transfer: verify and move blob.incomplete to blob; or decide on a retry. Returns MS_OK
 * (done, or *retry = 1), or an error. */
static int finish_file(const ms_hub_opts *o, const char *repo, const char *blobs, hub_file *f, CURLcode cc, int *retry,
                       ms_err *err) {
    long code = 0;
    curl_easy_getinfo(f->easy, CURLINFO_RESPONSE_CODE, &code);
    char inc[4800], fin[4800];
    snprintf(inc, sizeof inc, "%s/%s.incomplete", blobs, f->blob);
    snprintf(fin, sizeof fin, "%s/%s", blobs, f->blob);
    *retry = 0;
    if (cc == CURLE_OK && (code == 416 || (code == 200 && f->have != f->size))) { /* range refused / restarted */
        unlink(inc);
        if (++f->tries > o->retries) return ms_errf(err, MS_ERR_IO, "%s: %s: the download does not converge", repo, f->name);
        *retry = 1;
        return MS_OK;
    }
    if (cc == CURLE_OK && code != 200 && code != 206) return http_status_error(o, repo, f->name, code, err);
    if (cc != CURLE_OK || f->have < f->size) {
        if (++f->tries > o->retries)
            return ms_errf(err, MS_ERR_IO, "%s: %s: download failed after %d attempts (%s); run again to resume", repo, f->name,
                           f->tries, cc != CURLE_OK ? curl_easy_strerror(cc) : "transfer cut short");
        *retry = 1;
        return MS_OK;
    }
    fflush(f->out);
    char hex[2 * EVP_MAX_MD_SIZE + 1];
    MS_TRY(file_digest(inc, !f->lfs, hex, err));
    if (strcmp(hex, f->blob)) {
        unlink(inc);
        return ms_errf(err, MS_ERR_FORMAT, "%s: %s: %s mismatch (the hub says %s, the download has %s); removed, run again",
                       repo, f->name, f->lfs ? "sha256" : "git blob id", f->blob, hex);
    }
    if (rename(inc, fin) != 0) return ms_errf(err, MS_ERR_IO, "%s: %s", fin, strerror(errno));
    f->done = 1;
    if (!o->progress) fprintf(stderr, "download %s: %s (%lld bytes, checked)\n", repo, f->name, f->size);
    return MS_OK;
}

static int fetch_meta(const ms_hub_opts *o, const char *repo, const char *rev, json_t **out, ms_err *err) {
    char url[2048], erev[512];
    url_path(erev, sizeof erev, rev);
    snprintf(url, sizeof url, "%s/api/models/%s/revision/%s?blobs=true", o->endpoint, repo, erev);
    CURL *c = curl_easy_init();
    if (!c) return ms_errf(err, MS_ERR_NOMEM, "out of memory");
    membuf b = {0};
    struct curl_slist *h = auth_headers(o);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, mem_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    CURLcode cc = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    int rc = MS_OK;
    if (cc != CURLE_OK)
        rc = ms_errf(err, MS_ERR_IO, "%s: cannot reach %s: %s (set HF_HUB_OFFLINE=1 to use only the cache, or HF_ENDPOINT "
                     "for a mirror)", repo, o->endpoint, curl_easy_strerror(cc));
    else if (code != 200)
        rc = http_status_error(o, repo, "revision metadata", code, err);
    else if (!(*out = json_loads(b.p ? b.p : "", 0, NULL)) || !json_is_object(*out))
        rc = ms_errf(err, MS_ERR_FORMAT, "%s: the hub's metadata (%s) is not a JSON object", repo, url);
    free(b.p);
    return rc;
}

int ms_hub_download(const ms_hub_opts *o, const char *repo, const char *revision, char *out, size_t cap, ms_err *err) {
    const char *rev = revision && *revision ? revision : "main";
    if (o->offline)
        return ms_errf(err, MS_ERR_NOT_FOUND, "%s (revision %s) is not in the Hugging Face cache %s, and HF_HUB_OFFLINE is set "
                       "(unset it to download, or fetch it with huggingface-cli download)", repo, rev, o->cache);
    json_t *meta = NULL;
    MS_TRY(fetch_meta(o, repo, rev, &meta, err));
    int rc = MS_OK;
    hub_file *fs = NULL;
    CURLM *m = NULL;
    int n = 0;
    const char *commit = json_string_value(json_object_get(meta, "sha"));
    json_t *sib = json_object_get(meta, "siblings");
    if (!commit || !is_commit(commit) || !json_is_array(sib)) {
        rc = ms_errf(err, MS_ERR_FORMAT, "%s: the hub's metadata has no commit sha or file list", repo);
        goto done;
    }
    fs = calloc(json_array_size(sib) + 1, sizeof *fs);
    if (!fs) { rc = ms_errf(err, MS_ERR_NOMEM, "out of memory"); goto done; }
    size_t i;
    json_t *s;
    json_array_foreach(sib, i, s) {
        const char *name = json_string_value(json_object_get(s, "rfilename"));
        if (!name || !wanted(name) || n >= HUB_MAX_FILES) continue;
        json_t *lfs = json_object_get(s, "lfs");
        const char *blob = json_string_value(json_object_get(lfs, "sha256"));
        json_t *size = json_object_get(lfs, "size");
        hub_file *f = &fs[n];
        f->lfs = blob != NULL;
        if (!blob) blob = json_string_value(json_object_get(s, "blobId")), size = json_object_get(s, "size");
        if (!blob || strlen(blob) >= sizeof f->blob || strspn(blob, "0123456789abcdef") != strlen(blob) || !json_is_integer(size)) {
            rc = ms_errf(err, MS_ERR_FORMAT, "%s: the hub's metadata lacks the size or checksum of %s", repo, name);
            goto done;
        }
        snprintf(f->name, sizeof f->name, "%s", name);
        snprintf(f->blob, sizeof f->blob, "%s", blob);
        f->size = json_integer_value(size);
        n++;
    }
    if (!n) { rc = ms_errf(err, MS_ERR_NOT_FOUND, "%s: the repo has no model files (*.json, *.safetensors) at its top level", repo); goto done; }
    char rd[4400], blobs[4500], snap[4600];
    repo_dir(o, repo, rd, sizeof rd);
    snprintf(blobs, sizeof blobs, "%s/blobs", rd);
    snprintf(snap, sizeof snap, "%s/snapshots/%s", rd, commit);
    if ((rc = mkdirs(blobs, err)) || (rc = mkdirs(snap, err))) goto done;
    /* blobs already complete are not fetched again */
    int todo = 0;
    for (int k = 0; k < n; k++) {
        char p[4800];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", blobs, fs[k].blob);
        if (stat(p, &st) == 0 && st.st_size == fs[k].size) fs[k].done = 1, fs[k].have = fs[k].size;
        else todo++;
    }
    if (todo) {
        fprintf(stderr, "download %s (revision %s, commit %.12s) from %s into %s: %d file%s\n", repo, rev, commit, o->endpoint,
                o->cache, todo, todo == 1 ? "" : "s");
        m = curl_multi_init();
        if (!m) { rc = ms_errf(err, MS_ERR_NOMEM, "out of memory"); goto done; }
        int next = 0, running = 0;
        double t0 = ms_now(), last = 0;
        for (;;) {
            while (running < o->parallel && next < n) {
                if (fs[next].done) { next++; continue; }
                if ((rc = start_file(o, m, repo, commit, blobs, &fs[next], err))) goto done;
                next++, running++;
            }
            if (!running) break;
            int still = 0;
            curl_multi_perform(m, &still);
            CURLMsg *msg;
            int q;
            while ((msg = curl_multi_info_read(m, &q))) {
                if (msg->msg != CURLMSG_DONE) continue;
                hub_file *f = NULL;
                curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&f);
                CURLcode cc = msg->data.result;
                int retry = 0;
                fflush(f->out);
                rc = finish_file(o, repo, blobs, f, cc, &retry, err);
                end_transfer(m, f);
                running--;
                if (rc) goto done;
                if (retry && (rc = start_file(o, m, repo, commit, blobs, f, err)) == MS_OK) running++;
                if (rc) goto done;
            }
            if (o->progress && ms_now() - last > 0.25) draw(o, repo, fs, n, t0, 0), last = ms_now();
            if (running) curl_multi_poll(m, NULL, 0, 200, NULL);
        }
        if (o->progress) draw(o, repo, fs, n, t0, 1);
    }
    /* the snapshot: symlinks into blobs, as huggingface_hub makes them */
    for (int k = 0; k < n; k++) {
        char link[5200], target[700];
        snprintf(link, sizeof link, "%s/%s", snap, fs[k].name);
        snprintf(target, sizeof target, "../../blobs/%s", fs[k].blob);
        unlink(link);
        if (symlink(target, link) != 0) { rc = ms_errf(err, MS_ERR_IO, "%s: %s", link, strerror(errno)); goto done; }
    }
    if (!is_commit(rev)) { /* last: a ref names only a complete snapshot */
        char refs[4500], ref[5200];
        snprintf(refs, sizeof refs, "%s/refs", rd);
        snprintf(ref, sizeof ref, "%s/%s", refs, rev);
        char *sl = strrchr(ref, '/');
        *sl = 0;
        if ((rc = mkdirs(ref, err))) goto done;
        *sl = '/';
        if ((rc = ms_write_file(ref, commit, strlen(commit), err))) goto done;
    }
    if ((size_t)snprintf(out, cap, "%s", snap) >= cap) rc = ms_errf(err, MS_ERR_INVALID, "%s: path too long", snap);
done:
    for (int k = 0; fs && k < n; k++) end_transfer(m, &fs[k]);
    if (m) curl_multi_cleanup(m);
    free(fs);
    json_decref(meta);
    return rc;
}

int ms_hub_resolve(const ms_hub_opts *o, const char *repo, const char *revision, char *out, size_t cap, ms_err *err) {
    if (ms_hub_cache_lookup(o, repo, revision, out, cap, err) == MS_OK) return MS_OK;
    return ms_hub_download(o, repo, revision, out, cap, err); /* offline: says why it cannot */
}
