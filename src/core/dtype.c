/* dtype.c - exact scalar conversions for checkpoint dtypes (see dtype.h for the contract). */
#include "core/dtype.h"

#include <math.h>
#include <pthread.h>

float ms_e4m3_table[256];
const float ms_e2m1_table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static float e4m3_decode(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7) return NAN;
    if (e == 0) v = ldexpf((float)m / 8.0f, -6);
    else v = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return s ? -v : v;
}

static void init_tables(void) {
    for (int i = 0; i < 256; i++) ms_e4m3_table[i] = e4m3_decode((uint8_t)i);
}

void ms_dtype_init(void) { pthread_once(&g_once, init_tables); }

size_t ms_dtype_size(ms_dtype t) {
    switch (t) {
    case MS_F64: case MS_I64: return 8;
    case MS_F32: case MS_I32: return 4;
    case MS_F16: case MS_BF16: return 2;
    case MS_F8E4M3: case MS_U8: case MS_I8: case MS_BOOL: return 1;
    default: return 0;
    }
}

static const struct { ms_dtype t; const char *name; } g_names[] = {
    {MS_F32, "F32"}, {MS_F16, "F16"}, {MS_BF16, "BF16"}, {MS_F8E4M3, "F8_E4M3"}, {MS_U8, "U8"},
    {MS_I32, "I32"}, {MS_I64, "I64"}, {MS_F64, "F64"},   {MS_I8, "I8"},         {MS_BOOL, "BOOL"},
};

const char *ms_dtype_name(ms_dtype t) {
    for (size_t i = 0; i < sizeof g_names / sizeof g_names[0]; i++)
        if (g_names[i].t == t) return g_names[i].name;
    return "INVALID";
}

ms_dtype ms_dtype_parse(const char *s) {
    for (size_t i = 0; i < sizeof g_names / sizeof g_names[0]; i++)
        if (!strcmp(g_names[i].name, s)) return g_names[i].t;
    return MS_DTYPE_INVALID;
}

float ms_f16_to_f32(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexpf((float)m, -24);
    else v = ldexpf((float)(m | 1024), e - 25);
    return s ? -v : v;
}

uint16_t ms_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    float a = fabsf(f);
    if (isnan(f)) return (uint16_t)(sign | 0x7e00u);
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00u);
    if (a < ldexpf(1.0f, -14)) { /* subnormal: quantum 2^-24, RNE via rintf */
        return (uint16_t)(sign | (uint32_t)rintf(a * 16777216.0f));
    }
    int e;
    float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5,1) */
    uint32_t mant = (uint32_t)rintf(ldexpf(m, 11)); /* 11 significant bits incl. implicit */
    if (mant == 2048) { mant = 1024; e++; }
    uint32_t he = (uint32_t)(e - 1 + 15);
    return (uint16_t)(sign | (he << 10) | (mant & 1023u));
}

/* Nearest representable e4m3 by exhaustive search over the 127 non-negative finite codes:
 * exact RNE semantics (ties go to the even code) without bit tricks; quantize is not a hot path. */
uint8_t ms_f32_to_e4m3(float f) {
    ms_dtype_init();
    if (isnan(f)) return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.0f) return sign | 0x7e;
    int lo = 0, hi = 0x7e; /* codes are monotonic in value for 0..0x7e */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (ms_e4m3_table[mid] <= a) lo = mid; else hi = mid;
    }
    float dl = a - ms_e4m3_table[lo], dh = ms_e4m3_table[hi] - a;
    uint8_t code;
    if (dl < dh) code = (uint8_t)lo;
    else if (dh < dl) code = (uint8_t)hi;
    else code = (uint8_t)((lo & 1) ? hi : lo);
    return sign | code;
}

uint8_t ms_f32_to_e2m1(float f) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    uint8_t sign = (f < 0.0f || (f == 0.0f && signbit(f))) ? 8 : 0;
    float a = fabsf(f);
    if (isnan(a)) return 0;
    if (a >= 6.0f) return sign | 7;
    int lo = 0;
    while (lo < 7 && mag[lo + 1] <= a) lo++;
    if (lo == 7) return sign | 7;
    float dl = a - mag[lo], dh = mag[lo + 1] - a;
    int code = dl < dh ? lo : dh < dl ? lo + 1 : ((lo & 1) ? lo + 1 : lo);
    return (uint8_t)(sign | code);
}

void ms_convert_to_f32(ms_dtype t, const void *src, float *dst, size_t n) {
    ms_dtype_init();
    switch (t) {
    case MS_F32: memcpy(dst, src, n * 4); break;
    case MS_BF16: for (size_t i = 0; i < n; i++) dst[i] = ms_bf16_to_f32(((const uint16_t *)src)[i]); break;
    case MS_F16: for (size_t i = 0; i < n; i++) dst[i] = ms_f16_to_f32(((const uint16_t *)src)[i]); break;
    case MS_F8E4M3: for (size_t i = 0; i < n; i++) dst[i] = ms_e4m3_table[((const uint8_t *)src)[i]]; break;
    default: for (size_t i = 0; i < n; i++) dst[i] = NAN; break;
    }
}
