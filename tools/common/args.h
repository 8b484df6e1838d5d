/* args.h - flag parsing shared by the command-line mains ("--name value" and "--name=value"). */
#ifndef MS_TOOLS_ARGS_H
#define MS_TOOLS_ARGS_H

#include <stdint.h>

typedef struct ms_args {
    int argc;
    char **argv;
    unsigned char *used; /* which argv entries were consumed (for unknown-flag errors) */
} ms_args;

/* Wraps argv (argv[0] is the command name). Returns 0, or -1 on allocation failure. */
int ms_args_init(ms_args *a, int argc, char **argv);
void ms_args_free(ms_args *a);
/* Value of --name, or def when absent. A flag given without a value prints an error and returns def. */
const char *ms_args_str(ms_args *a, const char *name, const char *def);
/* 1 if the boolean flag --name is present. */
int ms_args_flag(ms_args *a, const char *name);
/* Numeric flags: on a malformed value, print "flag --name: ..." to stderr and set *bad = 1. */
long long ms_args_int(ms_args *a, const char *name, long long def, int *bad);
double ms_args_float(ms_args *a, const char *name, double def, int *bad);
/* All values of a repeatable flag (--exclude a --exclude b); returns count, fills out[0..cap). */
int ms_args_multi(ms_args *a, const char *name, const char **out, int cap);
/* After all lookups: prints "unknown flag X" for the first unconsumed argument; returns -1 if any. */
int ms_args_check_unknown(ms_args *a, const char *cmd);
/* Parses "3,1,4" into a malloc'd int32 array (caller frees); -1 on a malformed list. */
int ms_parse_ids(const char *s, int32_t **out, int *n);

#endif
