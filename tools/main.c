/* main.c - the single `moeserve <command>` binary. Each command is a thin main in tools/cmd_*.c;
 * commands not compiled into this build are reported as such (weak symbols). `moeserve help CMD`
 * and `moeserve CMD --help` print the same text (the command's own flag table). */
#include "common/args.h"
#include "common/version.h"

#include <stdio.h>
#include <string.h>

#define CMD(name) int cmd_##name(int argc, char **argv) __attribute__((weak));
#define CMDS(X)                                                                                   \
    X(serve) X(chat) X(generate) X(logits) X(tokenize) X(detokenize) X(template) X(inspect)       \
    X(quantize) X(bench) X(bench_model) X(bench_tokenizer) X(bench_grammar) X(tune) X(compare) X(doctor)
CMDS(CMD)
#undef CMD

static const struct {
    const char *name;
    const char *help;
} g_cmds[] = {
    {"serve", "serve a model over the OpenAI-compatible HTTP API (and a chat page)"},
    {"chat", "chat with a model in the terminal (starts a server, or --url)"},
    {"generate", "continue a prompt of token ids, print the new ids"},
    {"logits", "write the logits of every position of a prompt"},
    {"tokenize", "text on stdin -> token ids"},
    {"detokenize", "token ids -> text"},
    {"template", "render the chat template of a model"},
    {"inspect", "a model's shapes, formats and memory estimate (a config alone is enough)"},
    {"quantize", "BF16 checkpoint -> FP8 or NVFP4"},
    {"bench", "serving benchmark against a running server (SGLang bench_serving)"},
    {"bench-model", "forward-pass bandwidth and FLOP/s against the machine's ceilings"},
    {"bench-tokenizer", "tokenizer throughput"},
    {"bench-grammar", "structured-output token-mask time per step (JSON schemas)"},
    {"tune", "tune the MoE kernels for the GPU at hand"},
    {"compare", "diff two backends layer by layer"},
    {"doctor", "check the build, CPU, GPUs and drivers; self-test the kernels"},
};
#define N_CMDS (int)(sizeof g_cmds / sizeof g_cmds[0])

static int (*lookup(const char *name))(int, char **) {
#define L(n) if (!strcmp(name, #n)) return cmd_##n;
    CMDS(L)
#undef L
    if (!strcmp(name, "bench-model")) return cmd_bench_model;
    if (!strcmp(name, "bench-tokenizer")) return cmd_bench_tokenizer;
    if (!strcmp(name, "bench-grammar")) return cmd_bench_grammar;
    return NULL;
}

static void usage(FILE *f) {
    fprintf(f, "usage: moeserve <command> [flags]      (moeserve help <command>, moeserve <command> --help)\n"
               "       moeserve --version\n\ncommands:\n");
    for (int i = 0; i < N_CMDS; i++) fprintf(f, "  %-17s %s\n", g_cmds[i].name, g_cmds[i].help);
}

/* The command named s (underscores accepted for dashes), or NULL after an error line with a guess. */
static int (*find_cmd(const char *s))(int, char **) {
    int (*fn)(int, char **) = NULL;
    for (int i = 0; i < N_CMDS && !fn; i++)
        if (!strcmp(s, g_cmds[i].name)) fn = lookup(s);
    if (!fn) {
        char n[64];
        snprintf(n, sizeof n, "%s", s);
        for (char *p = n; *p; p++) if (*p == '_') *p = '-';
        for (int i = 0; i < N_CMDS && !fn; i++)
            if (!strcmp(n, g_cmds[i].name)) fn = lookup(g_cmds[i].name);
        if (!fn) {
            const char *names[N_CMDS];
            for (int i = 0; i < N_CMDS; i++) names[i] = g_cmds[i].name;
            const char *g = ms_closest(n, names, N_CMDS);
            if (g) fprintf(stderr, "moeserve: unknown command '%s' (did you mean '%s'?)\n", s, g);
            else fprintf(stderr, "moeserve: unknown command '%s' (moeserve --help lists the commands)\n", s);
            return NULL;
        }
    }
    return fn;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || (!strcmp(argv[1], "help") && argc == 2)) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V") || !strcmp(argv[1], "version")) {
        printf("moeserve %s\n", MS_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "help")) {
        if (argc > 3) {
            fprintf(stderr, "moeserve help: one command at a time (moeserve help <command>)\n");
            return 2;
        }
        int (*fn)(int, char **) = find_cmd(argv[2]);
        if (!fn) return 2;
        char *av[] = {argv[2], "--help", NULL};
        return fn(2, av);
    }
    if (argv[1][0] == '-') {
        fprintf(stderr, "moeserve: '%s' before a command (usage: moeserve <command> [flags]; moeserve --help)\n", argv[1]);
        return 2;
    }
    int (*fn)(int, char **) = find_cmd(argv[1]);
    if (!fn) return 2;
    return fn(argc - 1, argv + 1);
}
