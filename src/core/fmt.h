/* fmt.h - number printing that must match other programs byte for byte (Python's repr of floats,
 * as chat templates and OpenAI-compatible JSON producers print them), kept in one place so every
 * layer prints the same digits. */
#ifndef MS_CORE_FMT_H
#define MS_CORE_FMT_H

#include <stddef.h>

/* Writes v into buf with the fewest significant digits that read back (strtod) as the same double,
 * or the same float when is_float: "%.*e" layout when exp_form, else "%.*g". The one digit search
 * behind every float printer (server metrics and JSON, the tool parser's repr, the templates'). */
void ms_fmt_roundtrip(char *buf, size_t cap, double v, int exp_form, int is_float);

/* Shortest round-trip digits of a finite, non-zero |v|: writes 1..17 decimal digits (no sign, no
 * dot, no trailing zeros) and a NUL to digits, and sets *exp10 so that |v| = d.ddd x 10^exp10.
 * Returns the digit count. */
int ms_fmt_shortest(double v, char digits[24], int *exp10);

/* Python's repr(float) / str(float): "1.0", "0.1", "1e-05", "1e+16", "1.5e+16", "-0.0", "inf",
 * "-inf", "nan". Writes a NUL-terminated string to out; returns its length. */
size_t ms_fmt_pyfloat(double v, char out[40]);

/* Python's json.dumps of a float (allow_nan=True): repr, except "Infinity", "-Infinity", "NaN". */
size_t ms_fmt_pyjson_float(double v, char out[40]);

#endif
