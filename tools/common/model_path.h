/* model_path.h - what a user passes as a model (a checkpoint directory, a config.json, a Hugging
 * Face repo id, or by mistake a .gguf file or a folder without a tokenizer) turned into a local
 * path every command can load, or one sentence saying what to pass instead. Every command that
 * takes --model / --model-path goes through it, so the sentences are the same everywhere. */
#ifndef MS_TOOLS_MODEL_PATH_H
#define MS_TOOLS_MODEL_PATH_H

#include <stddef.h>

enum {
    MS_NEED_CONFIG = 1,       /* config.json */
    MS_NEED_TOKENIZER = 2,    /* tokenizer.json */
    MS_NEED_WEIGHTS = 4,      /* model.safetensors or model.safetensors.index.json */
    MS_ALLOW_CONFIG_FILE = 8, /* a config.json file itself is fine (dummy weights, inspect estimates) */
};

/* Resolves given (the value of --flag of command cmd; revision: --revision or NULL) into out: the
 * path itself when it exists locally, else a repo id's snapshot directory from the Hugging Face
 * cache or a download (src/hub). Then checks what need asks for. Returns 0, or -1 after printing
 * one line "moeserve CMD: flag --FLAG: ..." to stderr. */
int ms_model_path_resolve(const char *cmd, const char *flag, const char *given, const char *revision, int need, char *out,
                          size_t cap);

#endif
