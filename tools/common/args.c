/* args.c - see args.h. getopt_long does the tokenizing; this file builds its option array from the
 * command's tables, turns its error returns into one-line messages, and answers lookups. */
#include "common/args.h"

#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MS_OPT_HELP_VAL 'h'
#define MS_OPT_BASE 256

/* One spelling (name or alias) of one option. */
typedef struct spelling {
    const ms_opt *opt;
    char name[64];
} spelling;

static int collect(const ms_cmd *cmd, spelling *sp, int cap) {
    int n = 0;
    for (int g = 0; g < MS_MAX_OPT_GROUPS && cmd->groups[g]; g++)
        for (const ms_opt *o = cmd->groups[g]; o->name; o++) {
            if (n < cap) sp[n].opt = o, snprintf(sp[n].name, sizeof sp[n].name, "%s", o->name), n++;
            for (const char *p = o->aliases; p && *p;) {
                size_t l = strcspn(p, ",");
                if (n < cap) sp[n].opt = o, snprintf(sp[n].name, sizeof sp[n].name, "%.*s", (int)l, p), n++;
                p += l + (p[l] == ',');
            }
        }
    return n;
}

static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < c)
                c = d[i - 2][j - 2] + 1; /* a swap of two neighbours is one typo */
            d[i][j] = c;
        }
    return d[la][lb];
}

const char *ms_closest(const char *word, const char *const *cands, int n) {
    const char *best = NULL;
    int bd = 1 << 30;
    size_t wl = strlen(word);
    for (int i = 0; i < n; i++) {
        int d = edit_distance(word, cands[i]);
        /* a prefix of a long name ("--max-tok") is a likely meaning too */
        if (wl >= 3 && !strncmp(cands[i], word, wl)) d = d < 2 ? d : 2;
        if (d < bd) bd = d, best = cands[i];
    }
    int limit = wl < 4 ? 1 : wl < 9 ? 2 : 3;
    return best && bd <= limit ? best : NULL;
}

static const char *suggest(const char *word, const spelling *sp, int n) {
    const char *c[512];
    int k = 0;
    for (int i = 0; i < n && k < 510; i++) c[k++] = sp[i].name;
    c[k++] = "help";
    return ms_closest(word, c, k);
}

void ms_args_usage(const ms_cmd *cmd, void *fp) {
    FILE *f = fp;
    fprintf(f, "usage: moeserve %s %s\n", cmd->name, cmd->synopsis ? cmd->synopsis : "[flags]");
    if (cmd->about) fprintf(f, "%s\n", cmd->about);
    fprintf(f, "\nflags:\n");
    for (int g = 0; g < MS_MAX_OPT_GROUPS && cmd->groups[g]; g++)
        for (const ms_opt *o = cmd->groups[g]; o->name; o++) {
            char left[128];
            int l = snprintf(left, sizeof left, "  --%s%s%s%s", o->name, o->kind == MS_OPT_BOOL ? "" : " ",
                             o->kind == MS_OPT_BOOL ? "" : (o->metavar ? o->metavar : "VALUE"),
                             o->kind == MS_OPT_MULTI ? " (repeatable)" : "");
            fputs(left, f);
            const char *h = o->help ? o->help : "";
            int first = 1;
            do {
                size_t hl = strcspn(h, "\n");
                /* the first line follows the flag (one space when the flag is long), the rest align */
                fprintf(f, "%*s%.*s\n", first ? (l < 34 ? 34 - l : 1) : 34, "", (int)hl, h);
                first = 0;
                h += hl + (h[hl] == '\n');
            } while (*h);
            if (o->aliases) {
                fprintf(f, "%34s(also", "");
                for (const char *p = o->aliases; *p;) {
                    size_t al = strcspn(p, ",");
                    fprintf(f, " --%.*s", (int)al, p);
                    p += al + (p[al] == ',');
                }
                fprintf(f, ")\n");
            }
        }
    fprintf(f, "  -h, --help                      this text\n");
}

/* Adds one parsed entry, refusing a repeat of a single-valued flag with a different value. */
static int add_entry(ms_args *a, const ms_opt *o, const char *val, const char *spelled, char *msg, size_t cap) {
    for (int i = 0; i < a->n && o->kind != MS_OPT_MULTI; i++) {
        if (a->ent[i].opt != o) continue;
        const char *pv = a->ent[i].val;
        int same = o->kind == MS_OPT_BOOL ? ((pv == NULL) == (val == NULL) && (!pv || !strcmp(pv, val)))
                                          : !strcmp(pv, val);
        if (same) return 0;
        snprintf(msg, cap, "flag --%s is given twice with different values ('%s' as --%s, then '%s')", o->name,
                 pv ? pv : "true", a->ent[i].spelled, val ? val : "true");
        return -1;
    }
    a->ent[a->n++] = (ms_arg_ent){o, val, spelled};
    return 0;
}

int ms_args_parse(ms_args *a, const ms_cmd *cmd, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    spelling sp[512];
    int ns = collect(cmd, sp, 512);
    struct option *lo = calloc((size_t)ns + 2, sizeof *lo);
    a->ent = calloc((size_t)argc + 1, sizeof *a->ent);
    if (!lo || !a->ent) {
        free(lo);
        fprintf(stderr, "moeserve %s: out of memory\n", cmd->name);
        return -1;
    }
    for (int i = 0; i < ns; i++)
        lo[i] = (struct option){sp[i].name, sp[i].opt->kind == MS_OPT_BOOL ? optional_argument : required_argument,
                                NULL, MS_OPT_BASE + i};
    lo[ns] = (struct option){"help", no_argument, NULL, MS_OPT_HELP_VAL};
    char msg[512] = "";
    int help = 0;
    optind = 0; /* full re-initialisation: a command may parse more than once per process */
    opterr = 0;
    for (;;) {
        int at = optind ? optind : 1, li = -1;
        int c = getopt_long(argc, argv, "-:h", lo, &li);
        if (c == -1) break;
        if (c == MS_OPT_HELP_VAL) help = 1;
        if (msg[0] || help) continue; /* keep scanning only to find a --help further on */
        const char *text = at < argc ? argv[at] : "";
        char word[64];
        snprintf(word, sizeof word, "%.*s", (int)strcspn(text + strspn(text, "-"), "="), text + strspn(text, "-"));
        if (c == 1) {
            snprintf(msg, sizeof msg, "unexpected argument '%s' (flags start with --; see moeserve %s --help)", optarg,
                     cmd->name);
        } else if (c == ':') {
            snprintf(msg, sizeof msg, "flag --%s: missing value", word);
        } else if (c == '?') {
            const char *s = suggest(word, sp, ns);
            int known = 0;
            for (int i = 0; i < ns && !known; i++) known = !strcmp(sp[i].name, word);
            if (text[0] == '-' && text[1] != '-')
                snprintf(msg, sizeof msg, "unknown flag '%s' (flags start with two dashes%s%s%s)", text,
                         s ? ": did you mean --" : "", s ? s : "", s ? "?" : "");
            else if (known || !strcmp(word, "help"))
                snprintf(msg, sizeof msg, "flag --%s takes no value (given '%s')", word, text);
            else if (s)
                snprintf(msg, sizeof msg, "unknown flag '%s' (did you mean --%s?)", text, s);
            else
                snprintf(msg, sizeof msg, "unknown flag '%s' (see moeserve %s --help)", text, cmd->name);
        } else if (c >= MS_OPT_BASE) {
            const spelling *s = &sp[c - MS_OPT_BASE];
            const ms_opt *o = s->opt;
            if (strncmp(text, "--", 2) || strcmp(word, s->name)) {
                snprintf(msg, sizeof msg, "flag '%s': write the flag in full, as --%s", text, s->name);
            } else if (o->kind == MS_OPT_BOOL) {
                const char *v = optarg;
                if (v && strcmp(v, "true") && strcmp(v, "false") && strcmp(v, "1") && strcmp(v, "0") &&
                    strcmp(v, "yes") && strcmp(v, "no"))
                    snprintf(msg, sizeof msg, "flag --%s: '%s' is not true or false", s->name, v);
                else
                    add_entry(a, o, v, s->name, msg, sizeof msg);
            } else if (!strchr(text, '=') && optarg[0] == '-' && optarg[1] == '-' && optarg[2]) {
                snprintf(msg, sizeof msg, "flag --%s: missing value (the next argument, %s, is a flag; write --%s=%s "
                         "if it is the value)", s->name, optarg, s->name, optarg);
            } else {
                add_entry(a, o, optarg, s->name, msg, sizeof msg);
            }
        }
    }
    free(lo);
    optind = 0;
    if (help) {
        ms_args_usage(cmd, stdout);
        fflush(stdout);
        ms_args_free(a); /* the caller returns at once: nothing to look up */
        return 1;
    }
    if (msg[0]) {
        fprintf(stderr, "moeserve %s: %s\n", cmd->name, msg);
        ms_args_free(a);
        return -1;
    }
    return 0;
}

void ms_args_free(ms_args *a) {
    free(a->ent);
    a->ent = NULL;
    a->n = 0;
}

static const ms_opt *opt_of(ms_args *a, const char *name) {
    for (int g = 0; g < MS_MAX_OPT_GROUPS && a->cmd->groups[g]; g++)
        for (const ms_opt *o = a->cmd->groups[g]; o->name; o++)
            if (!strcmp(o->name, name)) return o;
    assert(!"flag looked up that is not in the command's table");
    return NULL;
}

static const ms_arg_ent *last_of(ms_args *a, const char *name) {
    const ms_opt *o = opt_of(a, name);
    for (int i = a->n - 1; i >= 0; i--)
        if (a->ent[i].opt == o) return &a->ent[i];
    return NULL;
}

const char *ms_args_str(ms_args *a, const char *name, const char *def) {
    const ms_arg_ent *e = last_of(a, name);
    return e && e->val ? e->val : def;
}

int ms_args_flag(ms_args *a, const char *name) {
    const ms_arg_ent *e = last_of(a, name);
    if (!e) return 0;
    const char *v = e->val;
    return !v || !(!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "no"));
}

int ms_args_given(ms_args *a, const char *name) { return last_of(a, name) != NULL; }

long long ms_args_int(ms_args *a, const char *name, long long def, int *bad) {
    const char *s = ms_args_str(a, name, NULL);
    if (!s) return def;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) {
        fprintf(stderr, "moeserve %s: flag --%s: '%s' is not an integer\n", a->cmd->name, name, s);
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
        fprintf(stderr, "moeserve %s: flag --%s: '%s' is not a number\n", a->cmd->name, name, s);
        *bad = 1;
        return def;
    }
    return v;
}

int ms_args_multi(ms_args *a, const char *name, const char **out, int cap) {
    const ms_opt *o = opt_of(a, name);
    int n = 0;
    for (int i = 0; i < a->n; i++)
        if (a->ent[i].opt == o && n < cap) out[n++] = a->ent[i].val;
    return n;
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
