/* model_path.c - see model_path.h. */
#include "common/model_path.h"

#include "core/status.h"
#include "hub/hub.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

static int ends_with_ci(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcasecmp(s + a - b, suf);
}

static int has(const char *dir, const char *name) {
    char p[4400];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

/* The first *.gguf in dir (into out), for a sentence about a llama.cpp folder. */
static int find_gguf(const char *dir, char *out, size_t cap) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d)))
        if (ends_with_ci(e->d_name, ".gguf")) snprintf(out, cap, "%s", e->d_name), found = 1;
    if (d) closedir(d);
    return found;
}

#define FAIL(...) (fprintf(stderr, "moeserve %s: flag --%s: ", cmd, flag), fprintf(stderr, __VA_ARGS__), fputc('\n', stderr), -1)

static const char *const k_gguf =
    "moeserve loads Hugging Face checkpoints (a directory with config.json, *.safetensors and tokenizer.json), not "
    "GGUF; pass the original model's directory or its repo id (e.g. zai-org/GLM-4.5-Air)";

int ms_model_path_resolve(const char *cmd, const char *flag, const char *given, const char *revision, int need, char *out,
                          size_t cap) {
    if (!given || !*given) return FAIL("missing value");
    if (ends_with_ci(given, ".gguf")) return FAIL("%s is a GGUF file: %s", given, k_gguf);
    struct stat st;
    if (stat(given, &st) == 0) {
        if (S_ISREG(st.st_mode)) {
            if ((need & MS_ALLOW_CONFIG_FILE) && ends_with_ci(given, ".json")) {
                snprintf(out, cap, "%s", given);
                return 0;
            }
            if (ends_with_ci(given, ".safetensors"))
                return FAIL("%s is a weights file: pass the directory that holds it with config.json and tokenizer.json", given);
            return FAIL("%s is a file: pass the checkpoint directory (config.json, *.safetensors, tokenizer.json)%s", given,
                        need & MS_ALLOW_CONFIG_FILE ? " or a config.json" : "");
        }
        if (!S_ISDIR(st.st_mode)) return FAIL("%s is not a directory", given);
        if ((size_t)snprintf(out, cap, "%s", given) >= cap) return FAIL("%s: path too long", given);
    } else if (given[0] != '.' && given[0] != '/' && given[0] != '~' && ms_hub_is_repo_id(given)) {
        ms_hub_opts ho;
        ms_hub_opts_from_env(&ho);
        ms_err err = {0};
        if (ms_hub_resolve(&ho, given, revision, out, cap, &err) != MS_OK) return FAIL("%s", err.msg);
    } else {
        return FAIL("%s does not exist: pass a checkpoint directory (config.json, *.safetensors, tokenizer.json) or a "
                    "Hugging Face repo id as ORG/NAME", given);
    }
    char g[512];
    int gguf = find_gguf(out, g, sizeof g);
    if ((need & MS_NEED_CONFIG) && !has(out, "config.json")) {
        if (gguf) return FAIL("%s holds a GGUF file (%s) and no config.json: %s", out, g, k_gguf);
        return FAIL("%s has no config.json: it is not a Hugging Face checkpoint directory (pass the folder that holds "
                    "config.json, *.safetensors and tokenizer.json)", out);
    }
    if ((need & MS_NEED_WEIGHTS) && !has(out, "model.safetensors") && !has(out, "model.safetensors.index.json")) {
        if (gguf) return FAIL("%s holds a GGUF file (%s) and no safetensors: %s", out, g, k_gguf);
        return FAIL("%s has config.json but no model.safetensors or model.safetensors.index.json (the weights); "
                    "download them too, or %s", out, !strcmp(cmd, "inspect") ? "pass its config.json for a memory estimate alone"
                    : "pass --load-format dummy for random weights of its shapes");
    }
    if ((need & MS_NEED_TOKENIZER) && !has(out, "tokenizer.json")) {
        if (gguf) return FAIL("%s holds a GGUF file (%s) and no tokenizer.json: %s", out, g, k_gguf);
        return FAIL("%s has no tokenizer.json: moeserve needs the Hugging Face fast tokenizer; copy tokenizer.json and "
                    "tokenizer_config.json from the original repo into it%s", out,
                    !strcmp(cmd, "serve") || !strcmp(cmd, "chat") ? ", or pass --tokenizer-path DIR" : "");
    }
    return 0;
}
