/* args.h - the one flag parser of every command. Each command declares its flags in a table (name,
 * SGLang-style aliases, value or not, help line); argv is read by glibc's getopt_long against that
 * table, so spelling, "--name value" / "--name=value", --help/-h anywhere, "did you mean" on an
 * unknown flag, missing values and conflicting repeats behave the same in every command, and the
 * usage text is generated from the same table the parser reads (it cannot drift from the code). */
#ifndef MS_TOOLS_ARGS_H
#define MS_TOOLS_ARGS_H

#include <stdint.h>

enum { MS_OPT_BOOL, MS_OPT_VALUE, MS_OPT_MULTI };

typedef struct ms_opt {
    const char *name;    /* canonical spelling without "--"; lookups use it */
    const char *aliases; /* other spellings, comma-separated ("tp-size,tensor-parallel-size"), or NULL */
    int kind;            /* MS_OPT_BOOL (no value; --x=false allowed), MS_OPT_VALUE, MS_OPT_MULTI (repeatable) */
    const char *metavar; /* "N", "DIR", ... for the usage text (values only) */
    const char *help;    /* one line; a '\n' continues it on the next usage line */
} ms_opt;

#define MS_OPT_END {0, 0, 0, 0, 0}
#define MS_MAX_OPT_GROUPS 4

typedef struct ms_cmd {
    const char *name;     /* "serve", "bench-model" */
    const char *synopsis; /* after "usage: moeserve NAME ", e.g. "--model DIR --ids 3,1,4 [flags]" */
    const char *about;    /* a paragraph printed under the usage line */
    const ms_opt *groups[MS_MAX_OPT_GROUPS]; /* flag tables, each ended by MS_OPT_END; NULL ends the list */
} ms_cmd;

typedef struct ms_arg_ent {
    const ms_opt *opt;
    const char *val;     /* NULL for a plain boolean */
    const char *spelled; /* the spelling the user wrote, without "--" (for messages) */
} ms_arg_ent;

typedef struct ms_args {
    const ms_cmd *cmd;
    int n;
    ms_arg_ent *ent; /* what was given, in argv order */
} ms_args;

/* Parses argv (argv[0] is the command name) against cmd's tables. Returns 0 when the flags are
 * well formed; 1 after printing the usage to stdout (--help or -h anywhere); -1 after printing one
 * error line to stderr (unknown flag with a "did you mean", missing value, abbreviation, a value for
 * a plain flag, a positional argument, a repeat with a different value). Callers return
 * ms_args_exit(rc) on a non-zero rc: 0 after help, 2 after an error (nothing is left to free then). */
int ms_args_parse(ms_args *a, const ms_cmd *cmd, int argc, char **argv);
static inline int ms_args_exit(int rc) { return rc > 0 ? 0 : 2; }
void ms_args_free(ms_args *a);
/* Prints cmd's usage text (synopsis, about, every flag with its aliases) to f (a FILE *). */
void ms_args_usage(const ms_cmd *cmd, void *f);

/* Lookups by canonical name; the name must be in the command's tables (a programming error else).
 * Value of --name, or def when absent. */
const char *ms_args_str(ms_args *a, const char *name, const char *def);
/* 1 if the boolean flag is given (and not as --name=false / =0 / =no). */
int ms_args_flag(ms_args *a, const char *name);
/* 1 if the flag was given at all (any value). */
int ms_args_given(ms_args *a, const char *name);
/* Numeric flags: on a malformed value, print "moeserve CMD: flag --name: ..." to stderr and set *bad = 1. */
long long ms_args_int(ms_args *a, const char *name, long long def, int *bad);
double ms_args_float(ms_args *a, const char *name, double def, int *bad);
/* All values of a repeatable flag (--exclude a --exclude b); returns count, fills out[0..cap). */
int ms_args_multi(ms_args *a, const char *name, const char **out, int cap);
/* Parses "3,1,4" into a malloc'd int32 array (caller frees); -1 on a malformed list. */
int ms_parse_ids(const char *s, int32_t **out, int *n);
/* The closest of cands[0..n) to word by edit distance when it is close enough to be a likely typo
 * (used for "did you mean"), else NULL. */
const char *ms_closest(const char *word, const char *const *cands, int n);

#endif
