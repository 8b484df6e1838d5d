/* cmd_bench.c - `moeserve bench`: the serving benchmark client, with SGLang bench_serving's flags
 * and metric definitions (reference/perf-anchors.md section 5). The work is in src/bench/; this
 * file parses flags, wires the optional tokenizer and prints the report. */
#include "bench/client.h"
#include "bench/dataset.h"
#include "bench/report.h"
#include "common/args.h"
#include "core/status.h"
/* tokenizer.h has a nested comment opener in a contract comment (-Wcomment); its owner fixes it. */
#include "tokenizer/tokenizer.h"

#include <curl/curl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The tokenizer layer is linked when another command (tokenize, serve) pulls it in; until it is
 * present these resolve to NULL and --tokenizer reports that, instead of failing the link. */

static const ms_opt bench_opts[] = {
    {"backend", NULL, MS_OPT_VALUE, "B", "sglang-oai|vllm|openai (/v1/completions) or sglang-oai-chat|\nvllm-chat|openai-chat (/v1/chat/completions) [sglang-oai]"},
    {"base-url", NULL, MS_OPT_VALUE, "URL", "server root, e.g. http://127.0.0.1:8000 (else --host/--port)"},
    {"host", NULL, MS_OPT_VALUE, "H", "server host [127.0.0.1]"},
    {"port", NULL, MS_OPT_VALUE, "P", "server port [8000, as moeserve serve]"},
    {"model", NULL, MS_OPT_VALUE, "NAME", "model field [the first id of GET /v1/models]"},
    {"dataset-name", NULL, MS_OPT_VALUE, "D", "random|random-ids [random]"},
    {"random-input-len", NULL, MS_OPT_VALUE, "N", "prompt tokens [1024]"},
    {"random-output-len", NULL, MS_OPT_VALUE, "N", "output tokens [1024]"},
    {"random-range-ratio", NULL, MS_OPT_VALUE, "R", "lengths uniform on [max(floor(N*R),1), N] [0.0]"},
    {"num-prompts", NULL, MS_OPT_VALUE, "N", "requests [1000]"},
    {"max-concurrency", NULL, MS_OPT_VALUE, "N", "open requests at most [unlimited]"},
    {"request-rate", NULL, MS_OPT_VALUE, "R", "requests/s, Poisson arrivals; inf sends all at once [inf]"},
    {"warmup-requests", NULL, MS_OPT_VALUE, "N", "copies of the first request (max 32 tokens) before timing [1]"},
    {"seed", NULL, MS_OPT_VALUE, "S", "[1]"},
    {"output-file", NULL, MS_OPT_VALUE, "F", "JSON with all metrics and per-request details"},
    {"disable-stream", NULL, MS_OPT_BOOL, NULL, "non-streamed requests (TTFT = E2E latency)"},
    {"disable-ignore-eos", NULL, MS_OPT_BOOL, NULL, "do not send ignore_eos: true"},
    {"tokenizer", NULL, MS_OPT_VALUE, "DIR", "tokenizer.json dir: exact-length text prompts, ids for random-ids"},
    {"vocab-size", NULL, MS_OPT_VALUE, "N", "id range for random-ids without --tokenizer"},
    {"request-timeout", NULL, MS_OPT_VALUE, "S", "per request [3600]"},
    {"max-duration", NULL, MS_OPT_VALUE, "S", "whole run [21600]"},
    {"allow-remote", NULL, MS_OPT_BOOL, NULL, "allow a non-loopback server"},
    {"disable-tqdm", NULL, MS_OPT_BOOL, NULL, "no progress bar"},
    MS_OPT_END,
};

static const ms_cmd bench_cmd = {
    "bench", "[flags]",
    "The serving benchmark: SGLang bench_serving's flags and metric definitions against a running server.",
    {bench_opts, NULL},
};

typedef struct tok_adapter {
    ms_tokenizer *t;
} tok_adapter;

static int ad_encode(void *ctx, const char *text, size_t len, int32_t **ids, int *n, ms_err *err) {
    return ms_tokenizer_encode(((tok_adapter *)ctx)->t, text, len, 0, ids, n, err);
}
static int ad_decode(void *ctx, const int32_t *ids, int n, char **out, ms_err *err) {
    size_t len;
    return ms_tokenizer_decode(((tok_adapter *)ctx)->t, ids, n, 0, out, &len, err);
}
static int ad_special(void *ctx, int32_t id) { return ms_tokenizer_is_special(((tok_adapter *)ctx)->t, id); }

int cmd_bench(int argc, char **argv) {
    ms_args a;
    int prc = ms_args_parse(&a, &bench_cmd, argc, argv);
    if (prc) return ms_args_exit(prc);
    int bad = 0;
    const char *backend = ms_args_str(&a, "backend", "sglang-oai");
    const char *base_url_flag = ms_args_str(&a, "base-url", NULL);
    const char *host = ms_args_str(&a, "host", "127.0.0.1");
    long long port = ms_args_int(&a, "port", 8000, &bad);
    const char *model_flag = ms_args_str(&a, "model", NULL);
    const char *dataset = ms_args_str(&a, "dataset-name", "random");
    long long in_len = ms_args_int(&a, "random-input-len", 1024, &bad);
    long long out_len = ms_args_int(&a, "random-output-len", 1024, &bad);
    double ratio = ms_args_float(&a, "random-range-ratio", 0.0, &bad);
    long long num = ms_args_int(&a, "num-prompts", 1000, &bad);
    long long maxc = ms_args_int(&a, "max-concurrency", 0, &bad);
    double rate = ms_args_float(&a, "request-rate", INFINITY, &bad);
    long long warm = ms_args_int(&a, "warmup-requests", 1, &bad);
    long long seed = ms_args_int(&a, "seed", 1, &bad);
    const char *out_file = ms_args_str(&a, "output-file", NULL);
    int no_stream = ms_args_flag(&a, "disable-stream");
    int no_ignore_eos = ms_args_flag(&a, "disable-ignore-eos");
    const char *tok_dir = ms_args_str(&a, "tokenizer", NULL);
    long long vocab = ms_args_int(&a, "vocab-size", 0, &bad);
    double req_timeout = ms_args_float(&a, "request-timeout", 3600, &bad);
    double max_dur = ms_args_float(&a, "max-duration", 21600, &bad);
    int allow_remote = ms_args_flag(&a, "allow-remote");
    int no_tqdm = ms_args_flag(&a, "disable-tqdm");
    if (bad) { ms_args_free(&a); return 2; }
    ms_args_free(&a);

    int chat;
    if (!strcmp(backend, "sglang-oai") || !strcmp(backend, "vllm") || !strcmp(backend, "openai")) chat = 0;
    else if (!strcmp(backend, "sglang-oai-chat") || !strcmp(backend, "vllm-chat") || !strcmp(backend, "openai-chat")) chat = 1;
    else { fprintf(stderr, "moeserve bench: flag --backend: '%s' is not one of sglang-oai, vllm, openai, sglang-oai-chat, vllm-chat, openai-chat\n", backend); return 2; }
    int ds_kind;
    if (!strcmp(dataset, "random")) ds_kind = MS_BENCH_DS_RANDOM;
    else if (!strcmp(dataset, "random-ids")) ds_kind = MS_BENCH_DS_RANDOM_IDS;
    else { fprintf(stderr, "moeserve bench: flag --dataset-name: '%s' is not random or random-ids\n", dataset); return 2; }
#define RANGE(v, lo, hi, flag) if ((v) < (lo) || (v) > (hi)) { fprintf(stderr, "moeserve bench: flag --%s: %lld is outside [%lld, %lld]\n", flag, (long long)(v), (long long)(lo), (long long)(hi)); return 2; }
    RANGE(num, 1, 1000000, "num-prompts");
    RANGE(in_len, 1, 10000000, "random-input-len");
    RANGE(out_len, 1, 10000000, "random-output-len");
    RANGE(maxc, 0, 1000000, "max-concurrency");
    RANGE(warm, 0, 10000, "warmup-requests");
    RANGE(vocab, 0, 100000000, "vocab-size");
    RANGE(port, 1, 65535, "port");
#undef RANGE
    if (!(ratio >= 0 && ratio <= 1)) { fprintf(stderr, "moeserve bench: flag --random-range-ratio: must be in [0, 1]\n"); return 2; }
    if (!(rate > 0)) { fprintf(stderr, "moeserve bench: flag --request-rate: must be > 0 (inf for no throttling)\n"); return 2; }
    if (!(req_timeout > 0 && req_timeout <= 86400)) { fprintf(stderr, "moeserve bench: flag --request-timeout: must be in (0, 86400] seconds\n"); return 2; }
    if (!(max_dur > 0 && max_dur <= 7 * 86400)) { fprintf(stderr, "moeserve bench: flag --max-duration: must be in (0, 604800] seconds\n"); return 2; }

    char base_url[1024];
    if (base_url_flag) snprintf(base_url, sizeof base_url, "%s", base_url_flag);
    else {
        int v6 = strchr(host, ':') != NULL && host[0] != '[';
        snprintf(base_url, sizeof base_url, "http://%s%s%s:%lld", v6 ? "[" : "", host, v6 ? "]" : "", port);
    }
    size_t bl = strlen(base_url);
    while (bl > 0 && base_url[bl - 1] == '/') base_url[--bl] = 0;

    int rc = 1;
    ms_err err = {0};
    char *model = NULL;
    ms_tokenizer *tk = NULL;
    ms_bench_prompt *prompts = NULL, *warm_p = NULL;
    ms_bench_result *res = NULL, *warm_r = NULL;
    double *arrivals = NULL, *warm_a = NULL;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) { fprintf(stderr, "bench: curl_global_init failed\n"); return 1; }
    if (ms_bench_check_url(base_url, allow_remote, &err)) goto fail;
    if (model_flag) model = strdup(model_flag);
    else if (ms_bench_fetch_model(base_url, getenv("OPENAI_API_KEY"), &model, &err)) goto fail;

    tok_adapter ad = {0};
    ms_bench_tok btok = {0};
    if (tok_dir) {
        if (ms_tokenizer_load(tok_dir, &tk, &err)) goto fail;
        ad.t = tk;
        btok.ctx = &ad;
        btok.vocab_size = ms_tokenizer_vocab_size(tk);
        /* random-ids uses the base vocabulary, as HF's tokenizer.vocab_size (added specials at the top excluded). */
        while (btok.vocab_size > 1 && ms_tokenizer_is_special(tk, btok.vocab_size - 1)) btok.vocab_size--;
        int32_t *ids = NULL;
        int nids = 0;
        if (ms_tokenizer_encode(tk, "", 0, 1, &ids, &nids, &err)) goto fail;
        free(ids);
        btok.n_special_added = nids;
        btok.encode = ad_encode;
        btok.decode = ad_decode;
        btok.is_special = ad_special;
    }

    ms_bench_rng rng;
    ms_bench_rng_seed(&rng, (uint64_t)seed);
    ms_bench_dataset_opts dso = {.kind = ds_kind, .num_prompts = (int)num, .input_len = (int)in_len,
                                 .output_len = (int)out_len, .range_ratio = ratio, .need_text = chat,
                                 .vocab_size = (int)vocab, .tok = tok_dir ? &btok : NULL};
    if (ms_bench_dataset_make(&dso, &rng, &prompts, &err)) goto fail;
    arrivals = malloc((size_t)num * sizeof *arrivals);
    res = calloc((size_t)num, sizeof *res);
    if (!arrivals || !res) { ms_errf(&err, MS_ERR_NOMEM, "bench: out of memory for %lld requests", num); goto fail; }
    ms_bench_arrivals(&rng, (int)num, rate, arrivals);

    const char *endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
    ms_bench_config cfg = {.base_url = base_url, .endpoint = endpoint, .chat = chat, .model = model,
                           .stream = !no_stream, .ignore_eos = !no_ignore_eos, .max_concurrency = (int)maxc,
                           .request_timeout_s = req_timeout, .max_duration_s = max_dur,
                           .api_key = getenv("OPENAI_API_KEY"), .progress = 0, .max_reply_bytes = (size_t)1 << 20};
    long long sum_in = 0, sum_out = 0;
    for (int i = 0; i < num; i++) { sum_in += prompts[i].prompt_len; sum_out += prompts[i].output_len; }
    char conc[32];
    if (maxc) snprintf(conc, sizeof conc, "%lld", maxc);
    else snprintf(conc, sizeof conc, "unlimited");
    printf("bench: %s %s%s model=%s dataset=%s prompts=%lld mean target in/out=%.1f/%.1f rate=%g max-concurrency=%s\n",
           backend, base_url, endpoint, model, dataset, num, (double)sum_in / num, (double)sum_out / num, rate, conc);
    fflush(stdout);

    double tb, te;
    if (warm > 0) {
        warm_p = calloc((size_t)warm, sizeof *warm_p);
        warm_r = calloc((size_t)warm, sizeof *warm_r);
        warm_a = calloc((size_t)warm, sizeof *warm_a);
        if (!warm_p || !warm_r || !warm_a) { ms_errf(&err, MS_ERR_NOMEM, "bench: out of memory for warmup"); goto fail; }
        for (int i = 0; i < warm; i++) {
            warm_p[i] = prompts[0]; /* shares the first prompt's buffers; not freed separately */
            if (warm_p[i].output_len > 32) warm_p[i].output_len = 32;
        }
        printf("bench: %lld warmup request(s)\n", warm);
        fflush(stdout);
        if (ms_bench_run(&cfg, warm_p, (int)warm, warm_a, warm_r, &tb, &te, &err)) goto fail;
        for (int i = 0; i < warm; i++)
            if (!warm_r[i].success) {
                ms_errf(&err, MS_ERR_RUNTIME, "bench: warmup request failed: %s", warm_r[i].error ? warm_r[i].error : "?");
                goto fail;
            }
        nanosleep(&(struct timespec){.tv_sec = 1}, NULL); /* as bench_serving: 1 s between warmup and the run */
    }
    cfg.progress = !no_tqdm && isatty(STDERR_FILENO);
    if (ms_bench_run(&cfg, prompts, (int)num, arrivals, res, &tb, &te, &err)) goto fail;

    ms_bench_metrics m;
    if (ms_bench_metrics_compute(res, (int)num, te - tb, &m, &err)) goto fail;
    m.accept_length = ms_bench_fetch_accept_length(base_url, getenv("OPENAI_API_KEY"));
    ms_bench_info info = {.backend = backend, .base_url = base_url, .endpoint = endpoint, .model = model,
                          .dataset_name = dataset, .request_rate = rate, .max_concurrency = (int)maxc,
                          .num_prompts = (int)num, .random_input_len = (int)in_len, .random_output_len = (int)out_len,
                          .random_range_ratio = ratio, .seed = (unsigned long long)seed, .stream = !no_stream,
                          .warmup_requests = (int)warm};
    ms_bench_print_table(stdout, &info, &m);
    ms_bench_print_checks(stdout, &info, &m, res, (int)num, chat);
    fflush(stdout);
    if (out_file && ms_bench_write_json(out_file, &info, &m, res, (int)num, &err)) goto fail;
    rc = m.completed > 0 ? 0 : 1;
    if (!m.completed) fprintf(stderr, "moeserve bench: no request succeeded\n");
    goto done;
fail:
    fprintf(stderr, "moeserve bench: %s\n", err.msg);
    rc = 1;
done:
    if (res) for (int i = 0; i < num; i++) ms_bench_result_free(&res[i]);
    if (warm_r) for (int i = 0; i < warm; i++) ms_bench_result_free(&warm_r[i]);
    free(res);
    free(warm_r);
    free(warm_p);
    free(warm_a);
    free(arrivals);
    ms_bench_dataset_free(prompts, (int)num);
    if (tk) ms_tokenizer_free(tk);
    free(model);
    curl_global_cleanup();
    return rc;
}
