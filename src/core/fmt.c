/* fmt.c - float printing with other languages' exact rules. Templates are rendered with the
 * digits the model saw in training (Python's repr), so these cannot be left to printf's %g. */
#include "core/fmt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ms_fmt_roundtrip(char *buf, size_t cap, double v, int exp_form, int is_float) {
    const int max_digits = is_float ? 9 : 17;
    for (int p = 1; p <= max_digits; p++) {
        if (exp_form) snprintf(buf, cap, "%.*e", p - 1, v);
        else snprintf(buf, cap, "%.*g", p, v);
        double back = strtod(buf, NULL);
        if (is_float ? (float)back == (float)v : back == v) return;
    }
}

int ms_fmt_shortest(double v, char digits[24], int *exp10) {
    char tmp[40];
    ms_fmt_roundtrip(tmp, sizeof tmp, fabs(v), 1, 0);
    int k = 0;
    const char *p = tmp;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[k++] = *p;
    while (k > 1 && digits[k - 1] == '0') k--;
    digits[k] = 0;
    *exp10 = *p == 'e' ? atoi(p + 1) : 0;
    return k;
}

/* Writes sign + digits with the decimal point after `point` digits (point may be <= 0 or > k). */
static char *put_fixed(char *o, const char *digits, int k, int point) {
    if (point <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -point; i++) *o++ = '0';
        memcpy(o, digits, (size_t)k);
        return o + k;
    }
    if (point >= k) {
        memcpy(o, digits, (size_t)k);
        o += k;
        for (int i = 0; i < point - k; i++) *o++ = '0';
        *o++ = '.', *o++ = '0'; /* Python keeps ".0" on integral floats */
        return o;
    }
    memcpy(o, digits, (size_t)point);
    o += point;
    *o++ = '.';
    memcpy(o, digits + point, (size_t)(k - point));
    return o + (k - point);
}

static char *put_exp(char *o, const char *digits, int k, int e, int min_exp_digits) {
    *o++ = digits[0];
    if (k > 1) {
        *o++ = '.';
        memcpy(o, digits + 1, (size_t)(k - 1));
        o += k - 1;
    }
    o += sprintf(o, "e%c%0*d", e < 0 ? '-' : '+', min_exp_digits, e < 0 ? -e : e);
    return o;
}

size_t ms_fmt_pyfloat(double v, char out[40]) {
    if (isnan(v)) return (size_t)sprintf(out, "nan");
    if (isinf(v)) return (size_t)sprintf(out, v < 0 ? "-inf" : "inf");
    if (v == 0) return (size_t)sprintf(out, signbit(v) ? "-0.0" : "0.0");
    char d[24];
    int e, k = ms_fmt_shortest(v, d, &e);
    char *o = out;
    if (v < 0) *o++ = '-';
    int point = e + 1; /* CPython's decpt: repr switches to exponent form outside (-4, 16] */
    if (point > -4 && point <= 16) o = put_fixed(o, d, k, point);
    else o = put_exp(o, d, k, e, 2);
    *o = 0;
    return (size_t)(o - out);
}

size_t ms_fmt_pyjson_float(double v, char out[40]) {
    if (isnan(v)) return (size_t)sprintf(out, "NaN");
    if (isinf(v)) return (size_t)sprintf(out, v < 0 ? "-Infinity" : "Infinity");
    return ms_fmt_pyfloat(v, out);
}
