/* cmd_detokenize.c - `moeserve detokenize --model DIR --ids 3,1,4 [--skip-special-tokens]`.
 *
 * Prints the decoded text exactly: special tokens kept unless asked otherwise, no newline added,
 * so scripts can compare the bytes. */
#include "common/args.h"
#include "common/model_path.h"
#include "core/status.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>

static const ms_opt detok_opts[] = {
    {"model", "model-path", MS_OPT_VALUE, "DIR|ORG/NAME", "tokenizer directory (tokenizer.json) or Hugging Face repo id"},
    {"revision", NULL, MS_OPT_VALUE, "REV", "Hugging Face branch, tag or commit of a repo id [main]"},
    {"ids", NULL, MS_OPT_VALUE, "3,1,4", "token ids to decode"},
    {"skip-special-tokens", NULL, MS_OPT_BOOL, NULL, "leave special tokens out"},
    MS_OPT_END,
};

static const ms_cmd detok_cmd = {
    "detokenize", "--model DIR --ids 3,1,4 [--skip-special-tokens]",
    "Prints the decoded text exactly (special tokens kept, no newline added).",
    {detok_opts, NULL},
};

int cmd_detokenize(int argc, char **argv) {
    ms_args a;
    int prc = ms_args_parse(&a, &detok_cmd, argc, argv);
    if (prc) return ms_args_exit(prc);
    const char *model = ms_args_str(&a, "model", NULL), *revision = ms_args_str(&a, "revision", NULL);
    const char *ids_s = ms_args_str(&a, "ids", NULL);
    int skip = ms_args_flag(&a, "skip-special-tokens");
    ms_args_free(&a);
    if (!model || !ids_s) {
        fprintf(stderr, "detokenize: flag --%s: missing (usage: moeserve detokenize --model DIR --ids 3,1,4)\n",
                model ? "ids" : "model");
        return 2;
    }
    char dir[4096];
    if (ms_model_path_resolve("detokenize", "model", model, revision, MS_NEED_TOKENIZER, dir, sizeof dir)) return 2;
    model = dir;
    int32_t *ids = NULL;
    int n = 0;
    if (ms_parse_ids(ids_s, &ids, &n)) {
        fprintf(stderr, "detokenize: flag --ids: '%s' is not a comma-separated list of token ids\n", ids_s);
        return 2;
    }
    ms_err err = {0};
    ms_tokenizer *t = NULL;
    if (ms_tokenizer_load(model, &t, &err)) { fprintf(stderr, "detokenize: %s\n", err.msg); free(ids); return 1; }
    char *text = NULL;
    size_t len = 0;
    int rc = 0;
    if (ms_tokenizer_decode(t, ids, n, skip, &text, &len, &err)) {
        fprintf(stderr, "detokenize: flag --ids: %s\n", err.msg);
        rc = 1;
    } else {
        fwrite(text, 1, len, stdout);
    }
    free(text);
    free(ids);
    ms_tokenizer_free(t);
    return rc;
}
