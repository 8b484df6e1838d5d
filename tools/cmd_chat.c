/* cmd_chat.c - `moeserve chat`: a terminal chat with a model, through the same OpenAI API a client
 * uses. With --url it talks to a running server; otherwise it starts `moeserve serve` on a free
 * loopback port as a child process (every other flag is passed on, e.g. --model-path, --device)
 * and stops it on exit. Replies stream; the reasoning is shown dimmed before the answer. Lines
 * starting with '/' are commands (/help lists them) and are never sent to the model. A refused
 * request shows the server's error message; a reply cut by --max-tokens is marked as such.
 *
 * Going through HTTP instead of calling the engine directly keeps one code path for templates,
 * parsers and sampling, so what the chat shows is exactly what an API client gets. */
#include "bench/sse.h"
#include "common/args.h"
#include "common/model_args.h"
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
    int in_reasoning, tty, cut, failed;
    char *content, *reasoning; /* accumulated, malloc'd */
    size_t clen, rlen;
    void *curl;                /* the transfer, to read its status in the body callback */
    char *errbody;             /* the body of a response with an error status */
    size_t elen;
} chat_stream;

static const ms_opt chat_opts[] = {
    {"url", NULL, MS_OPT_VALUE, "http://HOST:PORT", "a running server (else one is started for the session)"},
    {"system", NULL, MS_OPT_VALUE, "TEXT", "system message"},
    {"max-tokens", NULL, MS_OPT_VALUE, "N", "tokens per reply at most [1024]"},
    {"no-think", NULL, MS_OPT_BOOL, NULL, "start with thinking off (/think on turns it back on)"},
    MS_OPT_END,
};

static const ms_cmd chat_cmd = {
    "chat", "[--url http://HOST:PORT] [--system TEXT] [--max-tokens N] [--no-think] [serve flags]",
    "A terminal chat. Without --url a server is started on a free loopback port (or --port) for the\n"
    "session with the serve flags given (e.g. --model-path DIR --device cuda); --api-key is sent to\n"
    "--url, or required by and sent to the session's server. Commands: /help /think on|off /reset /quit",
    {chat_opts, ms_serve_opts, ms_parallel_opts, ms_spec_opts},
};

static void chat_help(void) {
    fputs("commands:\n"
          "  /help          this list\n"
          "  /think on|off  turn the model's thinking on or off for the next replies\n"
          "  /reset         forget the conversation\n"
          "  /quit, /exit   leave (also Ctrl-D)\n",
          stdout);
    fflush(stdout);
}

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
    if (err) {
        const char *m = json_string_value(json_object_get(err, "message"));
        fprintf(stderr, "\nmoeserve chat: the server stopped the reply: %s\n", m ? m : "(no message)");
        cs->failed = 1;
    }
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    const char *fin = json_string_value(json_object_get(choice, "finish_reason"));
    if (fin && !strcmp(fin, "length")) cs->cut = 1;
    json_t *delta = json_object_get(choice, "delta");
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
    long code = 0;
    curl_easy_getinfo(cs->curl, CURLINFO_RESPONSE_CODE, &code);
    if (code >= 300) { /* an OpenAI error object, not a stream: keep it for the message */
        char *e = realloc(cs->errbody, cs->elen + sz * n + 1);
        if (!e) return 0;
        memcpy(e + cs->elen, p, sz * n);
        cs->elen += sz * n;
        e[cs->elen] = 0;
        cs->errbody = e;
        return sz * n;
    }
    return ms_bench_sse_feed(&cs->sse, p, sz * n, on_event, cs, NULL) == MS_OK ? sz * n : 0;
}

/* Starts `moeserve serve --port 0 FLAGS...` with the serve flags the user gave chat (their own
 * --port instead of 0) and reads its "serving ... on URL" line. */
static pid_t start_server(const ms_args *a, char *url, size_t cap) {
    int fds[2];
    if (pipe(fds)) return -1;
    char **av = calloc((size_t)a->n * 2 + 8, sizeof *av);
    char **own = calloc((size_t)a->n + 1, sizeof *own);
    if (!av || !own) return free(av), free(own), -1;
    int k = 0, port_given = 0;
    av[k++] = "moeserve", av[k++] = "serve";
    for (int i = 0; i < a->n; i++) {
        const ms_opt *o = a->ent[i].opt;
        int is_chat = 0;
        for (const ms_opt *c = chat_opts; c->name; c++) is_chat |= c == o;
        if (is_chat) continue;
        port_given |= !strcmp(o->name, "port");
        if (o->kind == MS_OPT_BOOL) {
            size_t l = strlen(o->name) + (a->ent[i].val ? strlen(a->ent[i].val) : 0) + 4;
            own[i] = malloc(l);
            if (own[i]) snprintf(own[i], l, "--%s%s%s", o->name, a->ent[i].val ? "=" : "", a->ent[i].val ? a->ent[i].val : "");
            av[k++] = own[i];
        } else {
            size_t l = strlen(o->name) + 3;
            own[i] = malloc(l);
            if (own[i]) snprintf(own[i], l, "--%s", o->name);
            av[k++] = own[i], av[k++] = (char *)a->ent[i].val;
        }
    }
    if (!port_given) av[k++] = "--port", av[k++] = "0";
    if (!ms_args_given((ms_args *)a, "log-level")) av[k++] = "--log-level", av[k++] = "warning"; /* no access log in the chat */
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        execv("/proc/self/exe", av);
        _exit(127);
    }
    for (int i = 0; i < a->n; i++) free(own[i]);
    free(own), free(av);
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
    int prc = ms_args_parse(&a, &chat_cmd, argc, argv);
    if (prc) return ms_args_exit(prc);
    int bad = 0;
    const char *url_flag = ms_args_str(&a, "url", NULL), *system = ms_args_str(&a, "system", NULL);
    const char *api_key = ms_args_str(&a, "api-key", getenv("OPENAI_API_KEY"));
    long long max_tokens = ms_args_int(&a, "max-tokens", 1024, &bad);
    int think = !ms_args_flag(&a, "no-think");
    if (!bad && (max_tokens < 1 || max_tokens > 1 << 24)) {
        fprintf(stderr, "moeserve chat: flag --max-tokens: %lld is not in [1, 16777216]\n", max_tokens);
        bad = 1;
    }
    if (bad) { ms_args_free(&a); return 2; }
    char url[512];
    pid_t child = -1;
    if (url_flag) snprintf(url, sizeof url, "%s", url_flag);
    else {
        signal(SIGPIPE, SIG_IGN);
        child = start_server(&a, url, sizeof url);
        if (child < 0) { fprintf(stderr, "moeserve chat: the server did not start (see its messages above)\n"); return 1; }
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    json_t *history = json_array();
    if (system) json_array_append_new(history, json_pack("{s:s, s:s}", "role", "system", "content", system));
    const int tty = isatty(1);
    fprintf(stderr, "moeserve chat on %s (thinking %s; /help lists the commands)\n", url, think ? "on" : "off");
    char auth[600] = "";
    if (api_key) snprintf(auth, sizeof auth, "Authorization: Bearer %s", api_key);
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
        if (!strcmp(line, "/help") || !strcmp(line, "/?")) { chat_help(); continue; }
        if (!strcmp(line, "/think on") || !strcmp(line, "/think off") || !strcmp(line, "/think")) {
            think = strstr(line, "off") == NULL;
            fprintf(stderr, "thinking %s\n", think ? "on" : "off");
            continue;
        }
        if (line[0] == '/' && line[1] != '/') { /* "//text" sends "/text" */
            fprintf(stderr, "moeserve chat: unknown command '%s' (/help lists them; start a message with // to send a '/')\n", line);
            continue;
        }
        const char *msg_text = line[0] == '/' ? line + 1 : line;
        json_array_append_new(history, json_pack("{s:s, s:s}", "role", "user", "content", msg_text));
        json_t *req = json_pack("{s:s, s:O, s:b, s:I, s:{s:b}}", "model", "", "messages", history, "stream", 1,
                                "max_tokens", (json_int_t)max_tokens, "chat_template_kwargs", "enable_thinking", think);
        json_object_del(req, "model"); /* the server's only model */
        char *body = json_dumps(req, JSON_COMPACT);
        json_decref(req);
        CURL *c = curl_easy_init();
        chat_stream cs = {.tty = tty, .curl = c};
        ms_bench_sse_init(&cs.sse, 1 << 20);
        char ep[600];
        snprintf(ep, sizeof ep, "%s/v1/chat/completions", url);
        struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
        if (auth[0]) h = curl_slist_append(h, auth);
        curl_easy_setopt(c, CURLOPT_URL, ep);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &cs);
        CURLcode rc = curl_easy_perform(c);
        ms_bench_sse_finish(&cs.sse, on_event, &cs, NULL);
        if (cs.in_reasoning && tty) fputs("\033[0m", stdout);
        long code = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
        if (cs.cut) fputs(" [cut: --max-tokens reached]", stdout);
        fputs("\n", stdout);
        fflush(stdout);
        if (rc != CURLE_OK) fprintf(stderr, "moeserve chat: %s: %s\n", ep, curl_easy_strerror(rc));
        if (rc == CURLE_OK && code >= 300) {
            json_t *ej = cs.errbody ? json_loads(cs.errbody, 0, NULL) : NULL;
            const char *m = json_string_value(json_object_get(json_object_get(ej, "error"), "message"));
            fprintf(stderr, "moeserve chat: the server refused the request (HTTP %ld): %s\n", code,
                    m ? m : cs.errbody ? cs.errbody : "(no message)");
            json_decref(ej);
        }
        if (rc != CURLE_OK || code >= 300 || cs.failed) { /* not a turn: take the question back */
            json_array_remove(history, json_array_size(history) - 1);
            free(cs.content), free(cs.reasoning), free(body), free(cs.errbody);
            ms_bench_sse_free(&cs.sse);
            curl_slist_free_all(h);
            curl_easy_cleanup(c);
            continue;
        }
        json_t *msg = json_pack("{s:s, s:s}", "role", "assistant", "content", cs.content ? cs.content : "");
        if (cs.reasoning) json_object_set_new(msg, "reasoning_content", json_string(cs.reasoning));
        json_array_append_new(history, msg);
        free(cs.content), free(cs.reasoning), free(body), free(cs.errbody);
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
