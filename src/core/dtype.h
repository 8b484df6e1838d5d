/* dtype.h - element types found in checkpoints and used for activations, with exact scalar
 * conversions. Every quantized format in moeserve is defined by these functions: the CPU backend,
 * the CUDA kernels and `moeserve quantize` must agree with them bit for bit. */
#ifndef MS_CORE_DTYPE_H
#define MS_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum ms_dtype {
    MS_DTYPE_INVALID = 0,
    MS_F32,
    MS_F16,
    MS_BF16,
    MS_F8E4M3, /* float8_e4m3fn: no inf, 0x7f/0xff NaN, max 448 */
    MS_U8,     /* raw bytes; NVFP4 packs two E2M1 codes per byte (low nibble first) */
    MS_I32,
    MS_I64,
    MS_F64,
    MS_I8,
    MS_BOOL,
} ms_dtype;

/* Bytes per element (U8 for packed FP4 counts the byte). 0 for MS_DTYPE_INVALID. */
size_t ms_dtype_size(ms_dtype t);
/* Name as safetensors spells it ("BF16", "F8_E4M3", ...). */
const char *ms_dtype_name(ms_dtype t);
/* Parses a safetensors dtype string; MS_DTYPE_INVALID when unknown. */
ms_dtype ms_dtype_parse(const char *s);

static inline float ms_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round-to-nearest-even, NaN preserved (quiet). Same as torch's float->bfloat16 cast. */
static inline uint16_t ms_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* IEEE half to float, exact. */
float ms_f16_to_f32(uint16_t h);
/* float to IEEE half, round-to-nearest-even, overflow to inf. */
uint16_t ms_f32_to_f16(float f);

/* float8_e4m3fn byte to float, exact (table driven). */
extern float ms_e4m3_table[256];
static inline float ms_e4m3_to_f32(uint8_t b) { return ms_e4m3_table[b]; }
/* float to float8_e4m3fn, round-to-nearest-even, saturating to +-448 (as torch's
 * `.to(torch.float8_e4m3fn)` after clamping); NaN maps to 0x7f. */
uint8_t ms_f32_to_e4m3(float f);

/* E2M1 (FP4) code 0..15 to value: {0,.5,1,1.5,2,3,4,6} and negatives for codes 8..15. */
extern const float ms_e2m1_table[16];
static inline float ms_e2m1_to_f32(uint8_t code) { return ms_e2m1_table[code & 15]; }
/* float to nearest E2M1 code, ties to even code, saturating at +-6. */
uint8_t ms_f32_to_e2m1(float f);

/* Converts n elements of type t at src to float. t must be F32, F16, BF16 or F8E4M3. */
void ms_convert_to_f32(ms_dtype t, const void *src, float *dst, size_t n);

/* Must be called once before using ms_e4m3_table (idempotent, thread-safe after first call). */
void ms_dtype_init(void);

#endif
