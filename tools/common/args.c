/* args.c - see args.h. */
#include "common/args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ms_args_init(ms_args *a, int argc, char **argv) {
    a->argc = argc;
    a->argv = argv;
    a->used = calloc((size_t)argc + 1, 1);
    if (!a->used) return -1;
    if (argc > 0) a->used[0] = 1;
    return 0;
}

void ms_args_free(ms_args *a) { free(a->used); a->used = NULL; }

/* Finds --name or --name=value starting at index `from`; returns index or -1; *eq points at the
 * value after '=' when present. */
static int find(ms_args *a, const char *name, int from, const char **eq) {
    size_t n = strlen(name);
    for (int i = from; i < a->argc; i++) {
        const char *s = a->argv[i];
        if (s[0] != '-' || s[1] != '-') continue;
        if (strncmp(s + 2, name, n) != 0) continue;
        if (s[2 + n] == 0) { *eq = NULL; return i; }
        if (s[2 + n] == '=') { *eq = s + 3 + n; return i; }
    }
    return -1;
}

const char *ms_args_str(ms_args *a, const char *name, const char *def) {
    const char *eq;
    int i = find(a, name, 1, &eq);
    if (i < 0) return def;
    a->used[i] = 1;
    if (eq) return eq;
    if (i + 1 >= a->argc) { fprintf(stderr, "flag --%s: missing value\n", name); return def; }
    a->used[i + 1] = 1;
    return a->argv[i + 1];
}

int ms_args_flag(ms_args *a, const char *name) {
    const char *eq;
    int i = find(a, name, 1, &eq);
    if (i < 0) return 0;
    a->used[i] = 1;
    if (eq) return strcmp(eq, "0") && strcmp(eq, "false");
    return 1;
}

long long ms_args_int(ms_args *a, const char *name, long long def, int *bad) {
    const char *s = ms_args_str(a, name, NULL);
    if (!s) return def;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) {
        fprintf(stderr, "flag --%s: '%s' is not an integer\n", name, s);
        *bad = 1;
        return def;
    }
    return v;
}

double ms_args_float(ms_args *a, const char *name, double def, int *bad) {
    const char *s = ms_args_str(a, name, NULL);
    if (!s) return def;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || v != v) {
        fprintf(stderr, "flag --%s: '%s' is not a number\n", name, s);
        *bad = 1;
        return def;
    }
    return v;
}

int ms_args_multi(ms_args *a, const char *name, const char **out, int cap) {
    int n = 0, from = 1;
    const char *eq;
    for (;;) {
        int i = find(a, name, from, &eq);
        if (i < 0) break;
        a->used[i] = 1;
        const char *v = eq;
        if (!v && i + 1 < a->argc) { v = a->argv[i + 1]; a->used[i + 1] = 1; }
        if (v && n < cap) out[n++] = v;
        from = i + 1;
    }
    return n;
}

int ms_args_check_unknown(ms_args *a, const char *cmd) {
    for (int i = 1; i < a->argc; i++) {
        if (!a->used[i]) {
            fprintf(stderr, "moeserve %s: unknown argument '%s' (see moeserve %s --help)\n", cmd, a->argv[i], cmd);
            return -1;
        }
    }
    return 0;
}

int ms_parse_ids(const char *s, int32_t **out, int *n) {
    *out = NULL;
    *n = 0;
    if (!s || !*s) return -1;
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return -1;
    int k = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > 0x7fffffffL) { free(ids); return -1; }
        ids[k++] = (int32_t)v;
        if (*end == ',') p = end + 1;
        else if (*end == 0) p = end;
        else { free(ids); return -1; }
    }
    *out = ids;
    *n = k;
    return 0;
}
