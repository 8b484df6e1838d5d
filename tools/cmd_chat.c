/* cmd_chat.c - `moeserve chat`: a terminal chat with a model, through the same OpenAI API a client
 * uses. With --url it talks to a running server; otherwise it starts `moeserve serve` on a free
 * loopback port as a child process (every other flag is passed on, e.g. --model-path, --device)
 * and stops it on exit. Replies stream; the reasoning is shown dimmed before the answer. Lines
 * starting with '/' are commands: /think on|off, /reset, /quit.
 *
 * Going through HTTP instead of calling the engine directly keeps one code path for templates,
 * parsers and sampling, so what the chat shows is exactly what an API client gets. */
#include "bench/sse.h"
#include "common/args.h"
#include "core/fileutil.h"

#include <curl/curl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    ms_bench_sse sse;
    int in_reasoning, tty;
    char *content, *reasoning; /* accumulated, malloc'd */
    size_t clen, rlen;
} chat_stream;

static void append(char **buf, size_t *len, const char *s) {
    size_t n = strlen(s);
    char *p = realloc(*buf, *len + n + 1);
    if (!p) return;
    memcpy(p + *len, s, n + 1);
    *buf = p;
    *len += n;
}

static int on_event(void *ud, const char *data, size_t len) {
    chat_stream *cs = ud;
    (void)len;
    if (!strcmp(data, "[DONE]")) return MS_OK;
    json_t *j = json_loads(data, 0, NULL);
    if (!j) return MS_OK;
    json_t *err = json_object_get(j, "error");
    if (err) fprintf(stderr, "\nerror: %s\n", json_string_value(json_object_get(err, "message")));
    json_t *delta = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
    const char *r = json_string_value(json_object_get(delta, "reasoning_content"));
    const char *c = json_string_value(json_object_get(delta, "content"));
    if (r && *r) {
        if (!cs->in_reasoning) fputs(cs->tty ? "\033[2m" : "[reasoning] ", stdout), cs->in_reasoning = 1;
        fputs(r, stdout);
        append(&cs->reasoning, &cs->rlen, r);
    }
    if (c && *c) {
        if (cs->in_reasoning) fputs(cs->tty ? "\033[0m\n" : "\n[answer] ", stdout), cs->in_reasoning = 0;
        fputs(c, stdout);
        append(&cs->content, &cs->clen, c);
    }
    json_t *tcs = json_object_get(delta, "tool_calls");
    if (json_array_size(tcs)) fputs(" [tool call]", stdout);
    fflush(stdout);
    json_decref(j);
    return MS_OK;
}

static size_t on_body(char *p, size_t sz, size_t n, void *ud) {
    chat_stream *cs = ud;
    return ms_bench_sse_feed(&cs->sse, p, sz * n, on_event, cs, NULL) == MS_OK ? sz * n : 0;
}

/* Starts `moeserve serve --port 0 ARGS...` and reads its "serving ... on URL" line. */
static pid_t start_server(int argc, char **argv, const char **skip, char *url, size_t cap) {
    int fds[2];
    if (pipe(fds)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        char **av = calloc((size_t)argc + 8, sizeof *av);
        int k = 0;
        av[k++] = "moeserve", av[k++] = "serve", av[k++] = "--port", av[k++] = "0";
        for (int i = 1; i < argc; i++) {
            if (!strcmp(argv[i], "--no-think")) continue; /* chat's own flag without a value */
            int drop = 0;
            for (const char **s = skip; *s; s++)
                if (!strcmp(argv[i], *s)) drop = 1;
            if (drop) { i++; continue; }
            av[k++] = argv[i];
        }
        execv("/proc/self/exe", av);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    char line[1024];
    url[0] = 0;
    while (f && fgets(line, sizeof line, f)) {
        char *u = strstr(line, " on http://");
        if (u) {
            snprintf(url, cap, "%s", u + 4);
            url[strcspn(url, " \n")] = 0;
            break;
        }
    }
    /* keep the pipe open (the server prints nothing more to stdout) */
    return url[0] ? pid : -1;
}

int cmd_chat(int argc, char **argv) {
    ms_args a;
    if (ms_args_init(&a, argc, argv)) return 1;
    if (ms_args_flag(&a, "help")) {
        fprintf(stderr, "usage: moeserve chat [--url http://HOST:PORT] [--system TEXT] [--max-tokens N] [--no-think]\n"
                        "                     [serve flags, e.g. --model-path DIR --device cuda]\n"
                        "  without --url a server is started on a free loopback port for the session\n"
                        "  commands: /think on|off  /reset  /quit\n");
        return 0;
    }
    int bad = 0;
    const char *url_flag = ms_args_str(&a, "url", NULL), *system = ms_args_str(&a, "system", NULL);
    long long max_tokens = ms_args_int(&a, "max-tokens", 1024, &bad);
    int think = !ms_args_flag(&a, "no-think");
    if (bad) return 2;
    char url[512];
    pid_t child = -1;
    if (url_flag) snprintf(url, sizeof url, "%s", url_flag);
    else {
        static const char *skip[] = {"--url", "--system", "--max-tokens", NULL};
        signal(SIGPIPE, SIG_IGN);
        child = start_server(argc, argv, skip, url, sizeof url);
        if (child < 0) { fprintf(stderr, "moeserve chat: the server did not start (see its messages above)\n"); return 1; }
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    json_t *history = json_array();
    if (system) json_array_append_new(history, json_pack("{s:s, s:s}", "role", "system", "content", system));
    const int tty = isatty(1);
    fprintf(stderr, "moeserve chat on %s (thinking %s; /think on|off, /reset, /quit)\n", url, think ? "on" : "off");
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
        if (tty) fputs("\n> ", stdout), fflush(stdout);
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (!n) continue;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) { json_array_clear(history); continue; }
        if (!strncmp(line, "/think", 6)) { think = strstr(line, "off") == NULL; continue; }
        json_array_append_new(history, json_pack("{s:s, s:s}", "role", "user", "content", line));
        json_t *req = json_pack("{s:s, s:O, s:b, s:I, s:{s:b}}", "model", "", "messages", history, "stream", 1,
                                "max_tokens", (json_int_t)max_tokens, "chat_template_kwargs", "enable_thinking", think);
        json_object_del(req, "model"); /* the server's only model */
        char *body = json_dumps(req, JSON_COMPACT);
        json_decref(req);
        chat_stream cs = {.tty = tty};
        ms_bench_sse_init(&cs.sse, 1 << 20);
        char ep[600];
        snprintf(ep, sizeof ep, "%s/v1/chat/completions", url);
        CURL *c = curl_easy_init();
        struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_URL, ep);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &cs);
        CURLcode rc = curl_easy_perform(c);
        ms_bench_sse_finish(&cs.sse, on_event, &cs, NULL);
        if (cs.in_reasoning && tty) fputs("\033[0m", stdout);
        fputs("\n", stdout);
        if (rc != CURLE_OK) fprintf(stderr, "moeserve chat: %s: %s\n", ep, curl_easy_strerror(rc));
        json_t *msg = json_pack("{s:s, s:s}", "role", "assistant", "content", cs.content ? cs.content : "");
        if (cs.reasoning) json_object_set_new(msg, "reasoning_content", json_string(cs.reasoning));
        json_array_append_new(history, msg);
        free(cs.content), free(cs.reasoning), free(body);
        ms_bench_sse_free(&cs.sse);
        curl_slist_free_all(h);
        curl_easy_cleanup(c);
    }
    free(line);
    json_decref(history);
    curl_global_cleanup();
    if (child > 0) {
        kill(child, SIGTERM);
        waitpid(child, NULL, 0);
    }
    ms_args_free(&a);
    return 0;
}
