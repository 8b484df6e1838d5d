/* cmd_serve.c - `moeserve serve`: loads a model and serves the OpenAI-compatible HTTP API.
 * Flag names follow SGLang's where SGLang has the same knob. With no --model-path it serves the
 * built-in demo model (models/demo next to the binary's ../, or under the current directory),
 * with the GLM reasoning and tool-call parsers on. */
#include "common/args.h"
#include "common/model_args.h"
#include "common/model_path.h"
#include "common/preflight.h"
#include "core/fileutil.h"
#include "core/log.h"
#include "engine/engine.h"
#include "server/serve_deps.h"
#include "server/server.h"
#include "server/toolcall.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <limits.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/version.h"

const ms_opt ms_serve_opts[] = {
    {"model-path", "model", MS_OPT_VALUE, "DIR|ORG/NAME", "checkpoint directory or Hugging Face repo id (cache, else\ndownload); default: the built-in demo model"},
    {"revision", NULL, MS_OPT_VALUE, "REV", "Hugging Face branch, tag or commit of a repo id [main]"},
    {"tokenizer-path", NULL, MS_OPT_VALUE, "DIR", "tokenizer directory [--model-path]"},
    {"host", NULL, MS_OPT_VALUE, "ADDR", "bind address [127.0.0.1]"},
    {"port", NULL, MS_OPT_VALUE, "N", "TCP port [8000; 0 = any free port]"},
    {"api-key", NULL, MS_OPT_VALUE, "KEY", "require 'Authorization: Bearer KEY' on /v1/* routes"},
    {"served-model-name", NULL, MS_OPT_VALUE, "NAME", "model name in the API [the directory name]"},
    {"reasoning-parser", NULL, MS_OPT_VALUE, "glm45|none", "split <think> reasoning into reasoning_content [auto]"},
    {"tool-call-parser", NULL, MS_OPT_VALUE, "glm45|glm47|none", "parse GLM tool calls into tool_calls [auto]"},
    {"chat-template", NULL, MS_OPT_VALUE, "FILE", "Jinja chat template overriding the tokenizer's"},
    {"enable-thinking-default", NULL, MS_OPT_VALUE, "true|false", "enable_thinking when a request does not say [true]"},
    {"device", NULL, MS_OPT_VALUE, "cpu|cuda", "where the model runs [cpu]"},
    {"moe-runner-backend", NULL, MS_OPT_VALUE, "auto|NAME", "MoE expert runner [auto]"},
    {"attention-backend", NULL, MS_OPT_VALUE, "auto|NAME", "GQA / dense MLA attention implementation [auto]"},
    {"nsa-prefill-backend", NULL, MS_OPT_VALUE, "auto|NAME", "DSA sparse attention for prefill [auto]"},
    {"nsa-decode-backend", NULL, MS_OPT_VALUE, "auto|NAME", "DSA sparse attention for decode [auto]"},
    {"check-numerics", NULL, MS_OPT_BOOL, NULL, "per-step NaN/Inf check of logits and residual stream; a bad\nstep fails its requests naming layer and op"},
    {"load-format", NULL, MS_OPT_VALUE, "auto|dummy", "dummy: random weights of the config's shapes [auto]"},
    {"dummy-quant", NULL, MS_OPT_VALUE, "bf16|fp8|nvfp4", "weight format of --load-format dummy [bf16]"},
    {"override", NULL, MS_OPT_MULTI, "KEY=VALUE", "config override with dummy weights, e.g. num_hidden_layers=12"},
    {"mem-fraction-static", NULL, MS_OPT_VALUE, "F", "share of GPU memory for weights + KV cache"},
    {"max-total-tokens", NULL, MS_OPT_VALUE, "N", "KV cache size in tokens [from memory]"},
    {"context-length", NULL, MS_OPT_VALUE, "N", "longest sequence [the model's]"},
    {"max-running-requests", NULL, MS_OPT_VALUE, "N", "requests decoding at once"},
    {"max-queued-requests", NULL, MS_OPT_VALUE, "N", "requests waiting at most (then 503)"},
    {"chunked-prefill-size", NULL, MS_OPT_VALUE, "N", "prompt tokens per step at most"},
    {"max-request-bytes", NULL, MS_OPT_VALUE, "N", "request body limit [10485760]"},
    {"http-threads", NULL, MS_OPT_VALUE, "N", "HTTP worker threads [4]"},
    {"max-connections", NULL, MS_OPT_VALUE, "N", "open TCP connections at most [4096]"},
    {"connection-timeout", NULL, MS_OPT_VALUE, "S", "close a connection idle this long [600]"},
    {"header-timeout", NULL, MS_OPT_VALUE, "S", "request headers must arrive within S; also the keep-alive idle\nlimit [60]"},
    {"body-timeout", NULL, MS_OPT_VALUE, "S", "a request body must arrive within S after its headers [120]"},
    {"min-upload-rate", NULL, MS_OPT_VALUE, "B", "bytes/s a body upload must average after 5 s [1024; -1 = off]"},
    {"max-body-buffer-bytes", NULL, MS_OPT_VALUE, "N", "request bytes buffered by all connections; beyond: 503 [268435456]"},
    {"stream-stall-timeout", NULL, MS_OPT_VALUE, "S", "abort a stream whose client reads nothing for S [60; -1 = off]"},
    {"request-timeout", NULL, MS_OPT_VALUE, "S", "abort a generation running longer (finish_reason abort) [0 = none]"},
    {"shutdown-timeout", NULL, MS_OPT_VALUE, "S", "on SIGTERM/SIGINT let running requests finish for S, then\nabort them [30]"},
    {"max-choices-per-request", NULL, MS_OPT_VALUE, "N", "prompts x n of one request at most [64]"},
    {"disable-radix-cache", NULL, MS_OPT_BOOL, NULL, "turn the prefix cache off"},
    {"disable-cuda-graph", NULL, MS_OPT_BOOL, NULL, "run decode steps op by op (no CUDA graphs)"},
    {"log-level", NULL, MS_OPT_VALUE, "LEVEL", "error|warning|info|debug (warn, critical accepted) [info]"},
    MS_OPT_END,
};

static const ms_cmd serve_cmd = {
    "serve", "[--model-path DIR|ORG/NAME] [flags]",
    "Serves the OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models, /health,\n"
    "/metrics, /get_server_info, and a chat page at /). Flag names follow SGLang's.",
    {ms_serve_opts, ms_parallel_opts, ms_spec_opts, NULL},
};

/* models/demo next to the binary (../models/demo from build/moeserve; ../share/moeserve/models/demo
 * from an installed PREFIX/bin/moeserve), else under the cwd. */
static int find_demo_model(char *out, size_t cap) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    static const char *const rel[] = {"../models/demo", "../share/moeserve/models/demo"};
    if (n > 0) exe[n] = 0;
    for (int i = 0; n > 0 && i < 2; i++) {
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s", exe); /* dirname writes into its argument */
        char *dir = dirname(tmp);
        snprintf(out, cap, "%s/%s", dir, rel[i]);
        char probe[PATH_MAX + 32];
        snprintf(probe, sizeof probe, "%s/config.json", out);
        if (ms_path_exists(probe)) {
            char *real = realpath(out, NULL);
            if (real) { snprintf(out, cap, "%s", real); free(real); }
            return 0;
        }
    }
    snprintf(out, cap, "models/demo");
    return ms_path_exists("models/demo/config.json") ? 0 : -1;
}

/* Sampling defaults from generation_config.json (temperature, top_p, top_k) when present. */
static void generation_defaults(const char *dir, ms_api_limits *lim) {
    char path[PATH_MAX];
    if (ms_path_join(path, sizeof path, dir, "generation_config.json") != 0 || !ms_path_exists(path)) return;
    json_error_t e;
    json_t *g = json_load_file(path, 0, &e);
    if (!g) { MS_LOGW("%s: %s (ignored)", path, e.text); return; }
    json_t *v;
    if ((v = json_object_get(g, "temperature")) && json_is_number(v)) lim->default_temperature = (float)json_number_value(v);
    if ((v = json_object_get(g, "top_p")) && json_is_number(v)) lim->default_top_p = (float)json_number_value(v);
    if ((v = json_object_get(g, "top_k")) && json_is_integer(v)) lim->default_top_k = (int)json_integer_value(v);
    if (lim->default_temperature < 0 || lim->default_temperature > 2) lim->default_temperature = 1.0f;
    if (lim->default_top_p <= 0 || lim->default_top_p > 1) lim->default_top_p = 1.0f;
    json_decref(g);
}

static int parse_bool(const char *s, int *out) {
    if (!strcmp(s, "true") || !strcmp(s, "1")) { *out = 1; return 0; }
    if (!strcmp(s, "false") || !strcmp(s, "0")) { *out = 0; return 0; }
    return -1;
}

int cmd_serve(int argc, char **argv) {
    ms_args a;
    int prc = ms_args_parse(&a, &serve_cmd, argc, argv);
    if (prc) return ms_args_exit(prc);
    int bad = 0;
    const char *model_path = ms_args_str(&a, "model-path", NULL), *revision = ms_args_str(&a, "revision", NULL);
    const char *overrides[64];
    int n_overrides = ms_args_multi(&a, "override", overrides, 64);
    const char *tokenizer_path = ms_args_str(&a, "tokenizer-path", NULL);
    const char *host = ms_args_str(&a, "host", "127.0.0.1");
    long long port = ms_args_int(&a, "port", 8000, &bad);
    const char *api_key = ms_args_str(&a, "api-key", NULL);
    const char *served = ms_args_str(&a, "served-model-name", NULL);
    const char *rparser = ms_args_str(&a, "reasoning-parser", NULL);
    const char *tparser = ms_args_str(&a, "tool-call-parser", NULL);
    const char *tmpl = ms_args_str(&a, "chat-template", NULL);
    const char *think_def = ms_args_str(&a, "enable-thinking-default", "true");
    const char *device = ms_args_str(&a, "device", "cpu");
    ms_exec_opts par = {0};
    if (ms_parallel_args_parse(&a, "serve", &par)) bad = 1;
    if (ms_spec_args_parse(&a, "serve", &par)) bad = 1;
    const char *runner = ms_args_str(&a, "moe-runner-backend", "auto");
    const char *attn_be = ms_args_str(&a, "attention-backend", "auto");
    const char *nsa_pre = ms_args_str(&a, "nsa-prefill-backend", "auto");
    const char *nsa_dec = ms_args_str(&a, "nsa-decode-backend", "auto");
    int check_numerics = ms_args_flag(&a, "check-numerics");
    const char *load_format = ms_args_str(&a, "load-format", "auto");
    const char *dummy_quant = ms_args_str(&a, "dummy-quant", "bf16");
    double mem_frac = ms_args_float(&a, "mem-fraction-static", 0, &bad);
    long long max_total = ms_args_int(&a, "max-total-tokens", 0, &bad);
    long long ctx_len = ms_args_int(&a, "context-length", 0, &bad);
    long long max_running = ms_args_int(&a, "max-running-requests", 0, &bad);
    long long max_queued = ms_args_int(&a, "max-queued-requests", 0, &bad);
    long long chunked = ms_args_int(&a, "chunked-prefill-size", 0, &bad);
    long long max_bytes = ms_args_int(&a, "max-request-bytes", 10 << 20, &bad);
    long long http_threads = ms_args_int(&a, "http-threads", 4, &bad);
    long long max_conns = ms_args_int(&a, "max-connections", 4096, &bad);
    double idle_to = ms_args_float(&a, "connection-timeout", 600, &bad);
    double header_to = ms_args_float(&a, "header-timeout", 60, &bad);
    double body_to = ms_args_float(&a, "body-timeout", 120, &bad);
    double min_rate = ms_args_float(&a, "min-upload-rate", 1024, &bad);
    long long body_budget = ms_args_int(&a, "max-body-buffer-bytes", 256LL << 20, &bad);
    double stall_to = ms_args_float(&a, "stream-stall-timeout", 60, &bad);
    double shutdown_to = ms_args_float(&a, "shutdown-timeout", 30, &bad);
    double request_to = ms_args_float(&a, "request-timeout", 0, &bad);
    long long max_choices = ms_args_int(&a, "max-choices-per-request", 64, &bad);
    int no_radix = ms_args_flag(&a, "disable-radix-cache");
    int no_graphs = ms_args_flag(&a, "disable-cuda-graph");
    const char *log_level = ms_args_str(&a, "log-level", NULL);
    if (bad) { ms_args_free(&a); return 2; }
    ms_args_free(&a); /* the values point into argv, which outlives this */

    if (log_level) {
        /* SGLang's (Python logging's) names, and ours */
        int lv = !strcmp(log_level, "error") || !strcmp(log_level, "critical") ? MS_LOG_ERROR
               : !strcmp(log_level, "warn") || !strcmp(log_level, "warning") ? MS_LOG_WARN
               : !strcmp(log_level, "debug") ? MS_LOG_DEBUG : !strcmp(log_level, "info") ? MS_LOG_INFO : -1;
        if (lv < 0) { fprintf(stderr, "moeserve serve: flag --log-level: '%s' is not error, warning, info or debug\n", log_level); return 2; }
        ms_log_set_level(lv);
    }
    if (port < 0 || port > 65535) { fprintf(stderr, "moeserve serve: flag --port: %lld is not in [0, 65535]\n", port); return 2; }
    if (strcmp(device, "cpu") && strcmp(device, "cuda")) {
        fprintf(stderr, "moeserve serve: flag --device: '%s' is not cpu or cuda\n", device);
        return 2;
    }
    if (strcmp(load_format, "auto") && strcmp(load_format, "dummy")) {
        fprintf(stderr, "moeserve serve: flag --load-format: '%s' is not auto or dummy\n", load_format);
        return 2;
    }
    if (mem_frac < 0 || mem_frac >= 1) { fprintf(stderr, "moeserve serve: flag --mem-fraction-static: %g is not in (0, 1)\n", mem_frac); return 2; }
    if (max_bytes < 1024 || max_bytes > (1LL << 32)) {
        fprintf(stderr, "moeserve serve: flag --max-request-bytes: %lld is not in [1024, 4294967296]\n", max_bytes);
        return 2;
    }
    if (http_threads < 1 || http_threads > 256) { fprintf(stderr, "moeserve serve: flag --http-threads: %lld is not in [1, 256]\n", http_threads); return 2; }
    if (max_conns < 1 || max_conns > 1000000) { fprintf(stderr, "moeserve serve: flag --max-connections: %lld is not in [1, 1000000]\n", max_conns); return 2; }
    if (!(idle_to >= 1 && idle_to <= 86400)) { fprintf(stderr, "moeserve serve: flag --connection-timeout: %g is not in [1, 86400]\n", idle_to); return 2; }
    if (!(header_to > 0 && header_to <= 3600)) { fprintf(stderr, "moeserve serve: flag --header-timeout: %g is not in (0, 3600]\n", header_to); return 2; }
    if (!(body_to > 0 && body_to <= 86400)) { fprintf(stderr, "moeserve serve: flag --body-timeout: %g is not in (0, 86400]\n", body_to); return 2; }
    if (!(min_rate == -1 || (min_rate > 0 && min_rate <= 1e9))) { fprintf(stderr, "moeserve serve: flag --min-upload-rate: %g is not -1 or in (0, 1e9]\n", min_rate); return 2; }
    if (body_budget < max_bytes || body_budget > (1LL << 40)) {
        fprintf(stderr, "moeserve serve: flag --max-body-buffer-bytes: %lld is not in [--max-request-bytes (%lld), 2^40]\n", body_budget, max_bytes);
        return 2;
    }
    if (!(stall_to == -1 || (stall_to > 0 && stall_to <= 86400))) { fprintf(stderr, "moeserve serve: flag --stream-stall-timeout: %g is not -1 or in (0, 86400]\n", stall_to); return 2; }
    if (!(request_to >= 0 && request_to <= 86400 * 7)) { fprintf(stderr, "moeserve serve: flag --request-timeout: %g is not in [0, 604800]\n", request_to); return 2; }
    if (!(shutdown_to >= 0 && shutdown_to <= 86400)) { fprintf(stderr, "moeserve serve: flag --shutdown-timeout: %g is not in [0, 86400]\n", shutdown_to); return 2; }
    if (max_choices < 1 || max_choices > 512) { fprintf(stderr, "moeserve serve: flag --max-choices-per-request: %lld is not in [1, 512]\n", max_choices); return 2; }
    if (max_total < 0 || ctx_len < 0 || max_running < 0 || max_queued < 0 || chunked < 0) {
        fprintf(stderr, "moeserve serve: --max-total-tokens, --context-length, --max-running-requests, --max-queued-requests and --chunked-prefill-size must not be negative\n");
        return 2;
    }
    int think = 1;
    if (parse_bool(think_def, &think) != 0) {
        fprintf(stderr, "moeserve serve: flag --enable-thinking-default: '%s' is not true or false\n", think_def);
        return 2;
    }
    int demo = model_path == NULL;
    char demo_dir[PATH_MAX];
    if (demo) {
        if (find_demo_model(demo_dir, sizeof demo_dir) != 0) {
            fprintf(stderr, "moeserve serve: no --model-path given and the built-in demo model was not found (looked for "
                            "models/demo next to the binary and in the current directory)\n");
            return 1;
        }
        model_path = demo_dir;
    }
    int reasoning = -2; /* auto: decided from the tokenizer once it is loaded */
    if (rparser) {
        if (!strcmp(rparser, "glm45")) reasoning = MS_REASONING_GLM45;
        else if (!strcmp(rparser, "none")) reasoning = MS_REASONING_NONE;
        else { fprintf(stderr, "moeserve serve: flag --reasoning-parser: '%s' is not glm45 or none\n", rparser); return 2; }
    }
    int tools = -2; /* auto */
    if (tparser) {
        if (!strcmp(tparser, "none")) tools = -1;
        else if ((tools = ms_tool_format_parse(tparser)) < 0) {
            fprintf(stderr, "moeserve serve: flag --tool-call-parser: '%s' is not glm45, glm47 or none\n", tparser);
            return 2;
        }
    }
    if (tmpl && !ms_path_exists(tmpl)) { fprintf(stderr, "moeserve serve: flag --chat-template: %s does not exist\n", tmpl); return 2; }

    /* fail fast, before any weight is read: the device, the port, the model's files */
    if (ms_preflight_device("serve", device, 0)) return 1;
    int leader = !(par.nnodes > 1 && par.node_rank > 0);
    if (leader && ms_preflight_port("serve", host, (int)port)) return 1;
    const char *model_given = model_path; /* what the user wrote: a directory or a repo id (names the model) */
    static char model_dir[PATH_MAX], tok_dir[PATH_MAX];
    if (!demo) {
        int dummy = !strcmp(load_format, "dummy");
        int need = MS_NEED_CONFIG | (dummy ? MS_ALLOW_CONFIG_FILE : MS_NEED_WEIGHTS) | (tokenizer_path || dummy ? 0 : MS_NEED_TOKENIZER);
        if (ms_model_path_resolve("serve", "model-path", model_path, revision, need, model_dir, sizeof model_dir)) return 2;
        model_path = model_dir;
    }
    if (tokenizer_path) {
        if (ms_model_path_resolve("serve", "tokenizer-path", tokenizer_path, revision, MS_NEED_TOKENIZER, tok_dir, sizeof tok_dir))
            return 2;
        tokenizer_path = tok_dir;
    }

    double t0 = ms_now();
    ms_serve_stack_opts so;
    memset(&so, 0, sizeof so);
    so.exec = par; /* --tp, --ep, --nnodes, --node-rank, --dist-init-addr, --dist-timeout */
    so.exec.model_path = model_path;
    so.exec.device = device;
    so.exec.moe_runner = runner;
    so.exec.attn_backend = attn_be;
    so.exec.nsa_prefill = nsa_pre;
    so.exec.nsa_decode = nsa_dec;
    so.exec.check_numerics = check_numerics ? 2 : 0; /* per step: cheap enough to leave on */
    so.exec.disable_graphs = no_graphs;
    so.exec.load_format = load_format;
    so.exec.dummy_quant = dummy_quant;
    so.exec.overrides = overrides;
    so.exec.n_overrides = n_overrides;
    so.exec.mem_fraction_static = mem_frac;
    so.exec.max_total_tokens = (int)max_total;
    so.exec.progress = isatty(2);
    so.tokenizer_path = tokenizer_path;
    so.chat_template_file = tmpl;
    so.context_length = (int)ctx_len;
    so.max_running_requests = (int)max_running;
    so.max_queued_requests = (int)max_queued;
    so.chunked_prefill_size = (int)chunked;
    so.max_total_tokens = (int)max_total;
    so.enable_prefix_cache = !no_radix;
    ms_serve_stack st;
    ms_err err = {0};
    if (ms_serve_stack_open(&so, &st, &err) != MS_OK) {
        fprintf(stderr, "serve: %s\n", err.msg);
        return 1;
    }

    if (par.nnodes > 1 && par.node_rank > 0) {
        /* a follower node: no HTTP; run node 0's step plans until it stops the run or the run breaks */
        printf("moeserve: node %d of %d following node 0 at %s\n", par.node_rank, par.nnodes, par.dist_init_addr);
        fflush(stdout);
        int rc = ms_model_executor_follow(&st.model.exec, &err);
        if (rc) fprintf(stderr, "serve: node %d: %s\n", par.node_rank, err.msg);
        ms_serve_stack_close(&st);
        return rc ? 1 : 0;
    }

    /* Parsers default to what the model speaks: GLM reasoning tags in the vocabulary turn on the glm45
     * reasoning parser; GLM tool-call tags the glm47 parser, or glm45 when the template's tool
     * preamble puts a newline after the function name (GLM-4.5/4.6). Explicit flags win. */
    if (reasoning == -2) {
        reasoning = ms_tokenizer_token_to_id(st.tok, "<think>") >= 0 && ms_tokenizer_token_to_id(st.tok, "</think>") >= 0
                        ? MS_REASONING_GLM45 : MS_REASONING_NONE;
        if (reasoning == MS_REASONING_GLM45) fprintf(stderr, "serve: --reasoning-parser glm45 (auto: <think> tags in the vocabulary)\n");
    }
    if (tools == -2) {
        tools = -1;
        if (ms_tokenizer_token_to_id(st.tok, "<tool_call>") >= 0 && ms_tokenizer_token_to_id(st.tok, "<arg_key>") >= 0) {
            const char *ct = ms_tokenizer_chat_template(st.tok);
            tools = ct && strstr(ct, "{function-name}\n") ? ms_tool_format_parse("glm45") : MS_TOOL_GLM47;
            fprintf(stderr, "serve: --tool-call-parser %s (auto: GLM tool-call tags in the vocabulary)\n",
                    tools == MS_TOOL_GLM47 ? "glm47" : "glm45");
        }
    }

    /* model names: served name, then the directory's base name and the path as given */
    char base_buf[PATH_MAX];
    snprintf(base_buf, sizeof base_buf, "%s", model_given);
    size_t bl = strlen(base_buf);
    while (bl > 1 && base_buf[bl - 1] == '/') base_buf[--bl] = 0;
    const char *base = strrchr(base_buf, '/') ? strrchr(base_buf, '/') + 1 : base_buf;
    ms_server_config cfg;
    ms_server_config_default(&cfg);
    cfg.host = host;
    cfg.port = (int)port;
    cfg.api_key = api_key;
    int nn = 0;
    cfg.lim.model_names[nn++] = served ? served : base;
    if (served && strcmp(served, base)) cfg.lim.model_names[nn++] = base;
    cfg.lim.model_names[nn++] = model_given;
    cfg.lim.context_length = st.context_length;
    cfg.lim.vocab_size = st.vocab_size;
    cfg.lim.enable_thinking_default = think;
    generation_defaults(model_path, &cfg.lim);
    cfg.model_path = model_path;
    cfg.reasoning_parser = reasoning;
    cfg.tool_parser = tools;
    cfg.max_request_bytes = (size_t)max_bytes;
    cfg.n_threads = (int)http_threads;
    cfg.max_connections = (int)max_conns;
    cfg.idle_timeout_s = idle_to;
    cfg.header_timeout_s = header_to;
    cfg.body_timeout_s = body_to;
    cfg.min_upload_bps = min_rate;
    cfg.body_budget_bytes = (size_t)body_budget;
    cfg.stream_stall_timeout_s = stall_to;
    cfg.shutdown_timeout_s = shutdown_to;
    cfg.request_timeout_s = request_to;
    cfg.max_queued = (int)max_queued;
    cfg.max_choices = (int)max_choices;
    for (int i = 0; i < st.n_eos && i < 16; i++) cfg.eos_ids[cfg.n_eos++] = st.eos[i];
    cfg.version = MS_VERSION;
    /* /get_server_info: the values in effect (defaults and limits applied), not the flags as given */
    ms_engine_config ecd;
    ms_engine_config_default(&ecd);
    int eff_running = max_running > 0 ? (int)max_running : ecd.max_running_requests;
    if (eff_running > st.model.exec.max_batch_tokens) eff_running = st.model.exec.max_batch_tokens;
    json_t *flags = json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:b, s:i}",
                              "model_path", model_path, "device", device, "moe_runner_backend", runner,
                              "load_format", load_format, "chat_template", tmpl ? tmpl : "", "tp", par.tp, "ep", par.ep,
                              "nnodes", par.nnodes, "context_length", st.context_length, "max_total_tokens", st.kv_tokens,
                              "page_size", st.page_size, "max_running_requests", eff_running,
                              "max_queued_requests", max_queued > 0 ? (int)max_queued : ecd.max_waiting_requests,
                              "chunked_prefill_size", chunked > 0 ? (int)chunked : ecd.chunked_prefill_size,
                              "max_batch_tokens", st.model.exec.max_batch_tokens, "enable_thinking_default", think,
                              "radix_cache", !no_radix, "http_threads", (int)http_threads);
    if (flags) {
        /* the memory share applies to GPUs only: the default there, null on the CPU backend */
        json_object_set_new(flags, "mem_fraction_static",
                            strcmp(device, "cuda") ? json_null() : json_real(mem_frac > 0 ? mem_frac : 0.88));
        json_object_set_new(flags, "log_level", json_string(log_level ? log_level : "info"));
        if (revision) json_object_set_new(flags, "revision", json_string(revision));
    }
    char *flags_txt = flags ? json_dumps(flags, JSON_COMPACT) : NULL;
    json_decref(flags);
    cfg.info_json = flags_txt;

    /* SIGINT/SIGTERM end the server: block them here, wait for them below */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    ms_server *srv;
    if (ms_server_start(&cfg, &st.ops, &srv, &err) != MS_OK) {
        fprintf(stderr, "serve: %s\n", err.msg);
        ms_serve_stack_close(&st);
        free(flags_txt);
        return 1;
    }
    const char *shown_host = strchr(host, ':') ? NULL : host;
    if (shown_host) printf("moeserve: serving '%s' on http://%s:%d (ready in %.1f s)\n", cfg.lim.model_names[0],
                           shown_host, ms_server_port(srv), ms_now() - t0);
    else printf("moeserve: serving '%s' on http://[%s]:%d (ready in %.1f s)\n", cfg.lim.model_names[0], host,
                ms_server_port(srv), ms_now() - t0);
    fflush(stdout);
    /* wait for a signal; meanwhile a split model's ranks and nodes are checked every second: a rank
     * or node that failed ends the server with the cause instead of leaving it hanging */
    int sig = 0, failed = 0;
    struct timespec tick = {1, 0};
    for (;;) {
        sig = sigtimedwait(&sigs, NULL, &tick);
        if (sig > 0) break;
        if (ms_model_executor_check(&st.model.exec, &err) != MS_OK) {
            fprintf(stderr, "serve: the model's ranks cannot run any more: %s\n", err.msg);
            failed = 1;
            break;
        }
    }
    if (!failed) MS_LOGI("signal %d: shutting down", sig);
    ms_server_stop(srv);
    ms_serve_stack_close(&st);
    free(flags_txt);
    return failed ? 1 : 0;
}
