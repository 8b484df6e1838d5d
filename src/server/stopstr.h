/* stopstr.h - OpenAI `stop` strings matched on the detokenized text across token boundaries.
 *
 * Text that could be the beginning of a stop string is held back until it either completes the
 * stop string (then it and everything after it are dropped) or cannot anymore (then released).
 * The matched stop string is never part of the output. */
#ifndef MS_SERVER_STOPSTR_H
#define MS_SERVER_STOPSTR_H

#include "server/sbuf.h"

#define MS_MAX_STOP_STRINGS 16

typedef struct ms_stopstr {
    int n;
    char *s[MS_MAX_STOP_STRINGS]; /* owned copies */
    ms_sbuf held;
    int matched; /* a stop string was found; later input is ignored */
} ms_stopstr;

/* Copies the n (<= MS_MAX_STOP_STRINGS) non-empty strings; empty strings are ignored. */
void ms_stopstr_init(ms_stopstr *m, const char *const *stops, int n);
void ms_stopstr_free(ms_stopstr *m);
/* Feeds text; appends what is now certain to be output to *out. Returns 1 once a stop string has
 * matched (the caller then ends the request), else 0. */
int ms_stopstr_push(ms_stopstr *m, const char *text, size_t n, ms_sbuf *out);
/* End of generation without a match: releases the held text. */
void ms_stopstr_flush(ms_stopstr *m, ms_sbuf *out);

#endif
