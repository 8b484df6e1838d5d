/* hub.h - model paths as users give them: a Hugging Face repo id ("org/name") is found in the
 * standard Hugging Face cache (the layout huggingface-cli and transformers write:
 * HUB_CACHE/models--org--name/{refs/REV, snapshots/COMMIT/FILE -> ../../blobs/BLOB}), so a model
 * fetched with `huggingface-cli download` is served by its id; where the cache lacks it, it is
 * downloaded from the hub API with libcurl into that same layout: parallel files with a progress
 * line, resumed .incomplete blobs, every blob checked against the hub's sha256 (LFS) or git blob
 * id, and refs/REV written last, so a snapshot that a ref names is complete.
 *
 * Environment, as huggingface_hub reads it: HF_HUB_CACHE, HF_HOME (cache = HF_HOME/hub),
 * HF_ENDPOINT (default https://huggingface.co), HF_TOKEN (else the file HF_HOME/token that
 * `huggingface-cli login` writes), HF_HUB_OFFLINE=1 (cache only, no network at all). */
#ifndef MS_HUB_HUB_H
#define MS_HUB_HUB_H

#include "core/status.h"

#include <stddef.h>

typedef struct ms_hub_opts {
    char cache[4096];    /* the hub cache directory */
    char endpoint[1024]; /* no trailing '/' */
    char token[512];     /* "" when none */
    int offline;         /* HF_HUB_OFFLINE: never touch the network */
    int parallel;        /* files downloaded at once (default 8) */
    int progress;        /* 1: a redrawn progress line on stderr; 0: one line per finished file */
    int retries;         /* resumed attempts per file after a broken transfer (default 5) */
} ms_hub_opts;

/* Fills o from the environment (see above); progress = whether stderr is a terminal. */
void ms_hub_opts_from_env(ms_hub_opts *o);

/* 1 when s has the shape of a hub repo id ("org/name": one '/', letters, digits, '-', '_', '.'),
 * 0 otherwise. It says nothing about whether such a repo exists. */
int ms_hub_is_repo_id(const char *s);

/* Looks repo at revision (NULL = "main"; a branch, tag or 40-hex commit) up in the cache only.
 * Writes the snapshot directory into out and returns MS_OK, or MS_ERR_NOT_FOUND (err says which
 * part is missing). */
int ms_hub_cache_lookup(const ms_hub_opts *o, const char *repo, const char *revision, char *out, size_t cap, ms_err *err);

/* Downloads the files a model needs (*.json, *.safetensors, *.jinja, *.txt, *.model, *.tiktoken at
 * the repo's top level) of repo at revision into the cache and writes the snapshot directory into
 * out. Files already in the cache are not fetched again; partial ones resume. Errors name the repo,
 * the file and the cause (no such repo, gated/private without HF_TOKEN, checksum, network). */
int ms_hub_download(const ms_hub_opts *o, const char *repo, const char *revision, char *out, size_t cap, ms_err *err);

/* The cache lookup, then (unless o->offline) the download. */
int ms_hub_resolve(const ms_hub_opts *o, const char *repo, const char *revision, char *out, size_t cap, ms_err *err);

#endif
