/* model_args.h - the flags every command that runs a model shares (logits, generate, bench-model,
 * serve), parsed once into ms_exec_opts so their spelling and defaults cannot drift apart. */
#ifndef MS_TOOLS_MODEL_ARGS_H
#define MS_TOOLS_MODEL_ARGS_H

#include "common/args.h"
#include "engine/model_executor.h"

#define MS_MAX_OVERRIDES 64

typedef struct ms_model_args {
    ms_exec_opts ex;
    const char *overrides[MS_MAX_OVERRIDES];
    char model_dir[4096]; /* --model resolved (common/model_path.h): ex.model_path points here */
} ms_model_args;

/* The flag tables of the two groups below (commands put them in their ms_cmd groups). */
extern const ms_opt ms_model_opts[];
extern const ms_opt ms_parallel_opts[];
extern const ms_opt ms_spec_opts[];
/* serve's own flags (tools/cmd_serve.c); chat accepts them too and passes them to its server. */
extern const ms_opt ms_serve_opts[];

/* Reads --model (or --model-path; a directory, a config.json with --load-format dummy, or a Hugging
 * Face repo id with --revision, resolved by ms_model_path_resolve), --device, --device-index, --moe-runner-backend,
 * --attention-backend, --nsa-prefill-backend, --nsa-decode-backend, --load-format, --dummy-quant,
 * --override key=value (repeatable), --check-numerics (per step), --check-numerics-ops (per op), --max-total-tokens,
 * --page-size, --max-batch-tokens, --mem-fraction-static and the parallelism flags
 * (ms_parallel_args_parse). Returns 0, or -1 after printing one
 * error line naming the flag (missing --model, malformed number). */
int ms_model_args_parse(ms_args *a, const char *cmd, ms_model_args *out);

/* Reads the parallelism flags into e (SGLang's names and aliases): --tp/--tp-size/--tensor-parallel-size
 * N, --ep/--ep-size/--expert-parallel-size N (alone it implies --tp N), --nnodes N, --node-rank R,
 * --dist-init-addr HOST:PORT, --dist-timeout SECONDS. Returns 0, or -1 after printing one error line
 * naming the flag. The model-dependent checks (heads, experts, vocab divisible) happen at load. */
int ms_parallel_args_parse(ms_args *a, const char *cmd, ms_exec_opts *e);

/* Reads SGLang's speculative-decoding flags into e->speculative_num_steps (0 = off):
 * --speculative-algorithm NEXTN|EAGLE (EAGLE is an alias: the draft is the checkpoint's own MTP
 * layer), --speculative-num-steps N [3], --speculative-eagle-topk K (only 1: chain drafts; other
 * values are refused), --speculative-num-draft-tokens M (must be N + 1 with topk 1; alone it sets
 * N = M - 1). The other flags without --speculative-algorithm are refused. Returns 0, or -1 after
 * printing one error line naming the flag. */
int ms_spec_args_parse(ms_args *a, const char *cmd, ms_exec_opts *e);

/* Runs one forward step of a single sequence whose pages are 0,1,2,... in order: the new tokens
 * are ids[start, start+n_new) at positions start.. (earlier positions must already be cached).
 * all_logits = 1 writes logits of every new token into logits [n_new, vocab], else only the last
 * token's [1, vocab]. */
int ms_run_single(const ms_executor *ex, const int32_t *ids, int start, int n_new, int all_logits, float *logits,
                  ms_err *err);

#endif
