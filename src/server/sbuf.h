/* sbuf.h - a growable byte string for building responses, SSE chunks and parser outputs.
 *
 * The server builds many small strings per token; this keeps that code short and bounds-safe.
 * Allocation failure aborts (MS_ASSERT): the server cannot continue meaningfully without memory
 * for a few bytes of text, and the per-request size is bounded elsewhere (max_tokens, body limit). */
#ifndef MS_SERVER_SBUF_H
#define MS_SERVER_SBUF_H

#include "core/fmt.h"

#include <stddef.h>

typedef struct ms_sbuf {
    char *s;    /* NUL-terminated when cap > 0 */
    size_t len; /* bytes, excluding the NUL */
    size_t cap;
} ms_sbuf;

/* Appends n bytes (may contain NULs). */
void ms_sbuf_add(ms_sbuf *b, const char *p, size_t n);
void ms_sbuf_adds(ms_sbuf *b, const char *s);
void ms_sbuf_addc(ms_sbuf *b, char c);
void ms_sbuf_printf(ms_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s[0..n) as the inside of a JSON string (quotes not added): escapes ", \, control chars;
 * keeps non-ASCII UTF-8 as is (Python's ensure_ascii=False). */
void ms_sbuf_add_json_escaped(ms_sbuf *b, const char *s, size_t n);
/* Appends a quoted JSON string. */
void ms_sbuf_add_json_str(ms_sbuf *b, const char *s, size_t n);
/* Appends v as a number in the shortest form that reads back as the same double (integers below
 * 1e15 without a fraction or exponent); non-finite values as C prints them ("inf", "nan"). The one
 * number printer of the server layer: metrics text and JSON alike. */
void ms_sbuf_add_double(ms_sbuf *b, double v);
/* The same for a float: the shortest form that reads back as the same float (at most 9 digits). */
void ms_sbuf_add_float(ms_sbuf *b, float v);
/* Drops the first n bytes. */
void ms_sbuf_consume(ms_sbuf *b, size_t n);
void ms_sbuf_clear(ms_sbuf *b);
void ms_sbuf_free(ms_sbuf *b);
/* Returns the buffer (malloc'd, NUL-terminated, never NULL) and resets b; caller frees. */
char *ms_sbuf_take(ms_sbuf *b);
/* Returns the contents as a C string (never NULL; "" when empty). Valid until the next change. */
const char *ms_sbuf_str(const ms_sbuf *b);

#endif
