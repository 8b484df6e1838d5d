/* cmd_serve.c - `moeserve serve`: loads a model and serves the OpenAI-compatible HTTP API.
 * Flag names follow SGLang's where SGLang has the same knob. With no --model-path it serves the
 * built-in demo model (models/demo next to the binary's ../, or under the current directory),
 * with the GLM reasoning and tool-call parsers on. */
#include "common/args.h"
#include "common/model_args.h"
#include "core/fileutil.h"
#include "core/log.h"
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

#define MS_VERSION "0.1.0"

static void usage(void) {
    fprintf(stderr,
            "usage: moeserve serve [--model-path DIR] [flags]\n"
            "  --model-path DIR            checkpoint directory (default: the built-in demo model)\n"
            "  --tokenizer-path DIR        tokenizer directory (default: --model-path)\n"
            "  --host ADDR                 bind address (default 127.0.0.1)\n"
            "  --port N                    TCP port (default 8000; 0 = any free port)\n"
            "  --api-key KEY               require 'Authorization: Bearer KEY' on /v1/* routes\n"
            "  --served-model-name NAME    model name in the API (default: the directory name)\n"
            "  --reasoning-parser glm45|none      split <think> reasoning into reasoning_content\n"
            "  --tool-call-parser glm45|glm47|none  parse GLM tool calls into tool_calls\n"
            "  --chat-template FILE        Jinja chat template overriding the tokenizer's\n"
            "  --enable-thinking-default true|false  enable_thinking when a request does not say\n"
            "  --device cpu|cuda           (default cpu)\n"
            "  --tp N, --ep N              tensor-parallel ranks (one per GPU, or CPU threads); expert groups dividing tp\n"
            "  --nnodes N --node-rank R --dist-init-addr HOST:PORT [--dist-timeout S]\n"
            "                              several processes (nodes): node 0 serves HTTP, the others follow it\n"
            "  --moe-runner-backend auto|NAME   --load-format auto|dummy   --dummy-quant bf16|fp8|nvfp4\n"
            "  --override KEY=VALUE        config override with dummy weights, e.g. num_hidden_layers=12\n"
            "  --mem-fraction-static F     --max-total-tokens N   --context-length N\n"
            "  --max-running-requests N    --max-queued-requests N   --chunked-prefill-size N\n"
            "  --max-request-bytes N       request body limit (default 10485760)\n"
            "  --http-threads N            HTTP worker threads (default 4)\n"
            "  --disable-radix-cache       turn the prefix cache off\n"
            "  --disable-cuda-graph        run decode steps op by op (no CUDA graphs)\n"
            "  --log-level error|warn|info|debug\n");
}

/* models/demo next to the binary (../models/demo from build/moeserve), else under the cwd. */
static int find_demo_model(char *out, size_t cap) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *dir = dirname(exe);
        snprintf(out, cap, "%s/../models/demo", dir);
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
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) { usage(); return 0; }
    ms_args a;
    if (ms_args_init(&a, argc, argv) != 0) return 1;
    int bad = 0;
    const char *model_path = ms_args_str(&a, "model-path", NULL);
    if (!model_path) model_path = ms_args_str(&a, "model", NULL); /* alias, as other commands spell it */
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
    const char *runner = ms_args_str(&a, "moe-runner-backend", "auto");
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
    int no_radix = ms_args_flag(&a, "disable-radix-cache");
    int no_graphs = ms_args_flag(&a, "disable-cuda-graph");
    const char *log_level = ms_args_str(&a, "log-level", NULL);
    if (bad || ms_args_check_unknown(&a, "serve") != 0) { ms_args_free(&a); return 2; }
    ms_args_free(&a);

    if (log_level) {
        int lv = !strcmp(log_level, "error") ? MS_LOG_ERROR : !strcmp(log_level, "warn") ? MS_LOG_WARN
               : !strcmp(log_level, "debug") ? MS_LOG_DEBUG : !strcmp(log_level, "info") ? MS_LOG_INFO : -1;
        if (lv < 0) { fprintf(stderr, "flag --log-level: '%s' is not error, warn, info or debug\n", log_level); return 2; }
        ms_log_set_level(lv);
    }
    if (port < 0 || port > 65535) { fprintf(stderr, "flag --port: %lld is not in [0, 65535]\n", port); return 2; }
    if (strcmp(device, "cpu") && strcmp(device, "cuda")) {
        fprintf(stderr, "flag --device: '%s' is not cpu or cuda\n", device);
        return 2;
    }
    if (strcmp(load_format, "auto") && strcmp(load_format, "dummy")) {
        fprintf(stderr, "flag --load-format: '%s' is not auto or dummy\n", load_format);
        return 2;
    }
    if (mem_frac < 0 || mem_frac >= 1) { fprintf(stderr, "flag --mem-fraction-static: %g is not in (0, 1)\n", mem_frac); return 2; }
    if (max_bytes < 1024 || max_bytes > (1LL << 32)) {
        fprintf(stderr, "flag --max-request-bytes: %lld is not in [1024, 4294967296]\n", max_bytes);
        return 2;
    }
    if (http_threads < 1 || http_threads > 256) { fprintf(stderr, "flag --http-threads: %lld is not in [1, 256]\n", http_threads); return 2; }
    if (max_total < 0 || ctx_len < 0 || max_running < 0 || max_queued < 0 || chunked < 0) {
        fprintf(stderr, "serve: --max-total-tokens, --context-length, --max-running-requests, --max-queued-requests and --chunked-prefill-size must not be negative\n");
        return 2;
    }
    int think = 1;
    if (parse_bool(think_def, &think) != 0) {
        fprintf(stderr, "flag --enable-thinking-default: '%s' is not true or false\n", think_def);
        return 2;
    }
    int demo = model_path == NULL;
    char demo_dir[PATH_MAX];
    if (demo) {
        if (find_demo_model(demo_dir, sizeof demo_dir) != 0) {
            fprintf(stderr, "serve: no --model-path given and the built-in demo model was not found (looked for "
                            "models/demo next to the binary and in the current directory)\n");
            return 1;
        }
        model_path = demo_dir;
    }
    int reasoning = -2; /* auto: decided from the tokenizer once it is loaded */
    if (rparser) {
        if (!strcmp(rparser, "glm45")) reasoning = MS_REASONING_GLM45;
        else if (!strcmp(rparser, "none")) reasoning = MS_REASONING_NONE;
        else { fprintf(stderr, "flag --reasoning-parser: '%s' is not glm45 or none\n", rparser); return 2; }
    }
    int tools = -2; /* auto */
    if (tparser) {
        if (!strcmp(tparser, "none")) tools = -1;
        else if ((tools = ms_tool_format_parse(tparser)) < 0) {
            fprintf(stderr, "flag --tool-call-parser: '%s' is not glm45, glm47 or none\n", tparser);
            return 2;
        }
    }
    if (tmpl && !ms_path_exists(tmpl)) { fprintf(stderr, "flag --chat-template: %s does not exist\n", tmpl); return 2; }

    double t0 = ms_now();
    ms_serve_stack_opts so;
    memset(&so, 0, sizeof so);
    so.exec = par; /* --tp, --ep, --nnodes, --node-rank, --dist-init-addr, --dist-timeout */
    so.exec.model_path = model_path;
    so.exec.device = device;
    so.exec.moe_runner = runner;
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
    snprintf(base_buf, sizeof base_buf, "%s", model_path);
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
    cfg.lim.model_names[nn++] = model_path;
    cfg.lim.context_length = st.context_length;
    cfg.lim.vocab_size = st.vocab_size;
    cfg.lim.enable_thinking_default = think;
    generation_defaults(model_path, &cfg.lim);
    cfg.model_path = model_path;
    cfg.reasoning_parser = reasoning;
    cfg.tool_parser = tools;
    cfg.max_request_bytes = (size_t)max_bytes;
    cfg.n_threads = (int)http_threads;
    for (int i = 0; i < st.n_eos && i < 16; i++) cfg.eos_ids[cfg.n_eos++] = st.eos[i];
    cfg.version = MS_VERSION;
    json_t *flags = json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:b, s:b}",
                              "device", device, "moe_runner_backend", runner, "load_format", load_format,
                              "chat_template", tmpl ? tmpl : "", "tp", par.tp, "context_length", st.context_length,
                              "max_total_tokens", st.kv_tokens, "page_size", st.page_size,
                              "max_running_requests", (int)max_running, "max_queued_requests", (int)max_queued,
                              "mem_fraction_static", mem_frac, "enable_thinking_default", think, "radix_cache", !no_radix);
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
