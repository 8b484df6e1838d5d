/* main.c - the single `moeserve <command>` binary. Each command is a thin main in tools/cmd_*.c;
 * commands not compiled into this build are reported as such (weak symbols). */
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
    int (**fn)(int, char **);
    const char *help;
} g_cmds[] = {
#define E(n) {#n, NULL, NULL},
    CMDS(E)
#undef E
};

static int (*lookup(const char *name))(int, char **) {
#define L(n) if (!strcmp(name, #n)) return cmd_##n;
    CMDS(L)
#undef L
    if (!strcmp(name, "bench-model")) return cmd_bench_model;
    if (!strcmp(name, "bench-tokenizer")) return cmd_bench_tokenizer;
    if (!strcmp(name, "bench-grammar")) return cmd_bench_grammar;
    return NULL;
}

static void usage(void) {
    fprintf(stderr, "usage: moeserve <command> [flags]\ncommands:");
    for (size_t i = 0; i < sizeof g_cmds / sizeof g_cmds[0]; i++) {
        char n[64];
        snprintf(n, sizeof n, "%s", g_cmds[i].name);
        for (char *p = n; *p; p++) if (*p == '_') *p = '-';
        fprintf(stderr, " %s", n);
    }
    fprintf(stderr, "\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage();
        return argc < 2 ? 2 : 0;
    }
    int (*fn)(int, char **) = lookup(argv[1]);
    if (!fn) {
        char n[64];
        snprintf(n, sizeof n, "%s", argv[1]);
        for (char *p = n; *p; p++) if (*p == '-') *p = '_';
        fn = lookup(n);
    }
    if (!fn) {
        fprintf(stderr, "moeserve: unknown command '%s'\n", argv[1]);
        usage();
        return 2;
    }
    return fn(argc - 1, argv + 1);
}
