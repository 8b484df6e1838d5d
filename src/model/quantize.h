/* quantize.h - weight quantization into the checkpoint formats moeserve reads (spec 4.1, 4.2).
 *
 * The math follows the ModelOpt / DeepSeek export conventions exactly so that `moeserve quantize`
 * output is what those tools would write for the same weights, and so that tests can check the
 * round trip bit for bit against ms_linear_dequant_row. Source weights are F32, F16 or BF16
 * row-major [N, K]; work is split over rows on the default thread pool. */
#ifndef MS_MODEL_QUANTIZE_H
#define MS_MODEL_QUANTIZE_H

#include "core/dtype.h"
#include "core/status.h"

#include <stdint.h>

/* Same result as ms_f32_to_e4m3 (RNE, saturating at +-448, NaN -> 0x7f) by bit arithmetic
 * instead of a table search: the FP8 quantizer calls it once per weight. */
uint8_t ms_quant_f32_to_e4m3(float f);

/* max |W| over n elements of a float tensor (NaN counts as +inf so it is caught). */
float ms_quant_amax(ms_dtype dt, const void *src, int64_t n);

/* NVFP4 global scale: amax / (6 * 448); 1.0 for an all-zero tensor (any value dequantizes zeros). */
float ms_quant_nvfp4_scale2(float amax);

/* NVFP4 (ModelOpt): K % 16 == 0. scale2 = ms_quant_nvfp4_scale2(amax(W)); per 16-element block
 * s = e4m3(amax_blk / (6 * scale2)); codes = E2M1 RNE of W / (float(s) * scale2), low nibble =
 * even k. A block whose scale rounds to 0 gets codes 0. Outputs: codes [N, K/2], scales [N, K/16],
 * *scale2. Fails on a non-finite weight, naming `what`. */
int ms_quantize_nvfp4(ms_dtype dt, const void *src, int64_t N, int64_t K, uint8_t *codes, uint8_t *scales,
                      float *scale2, const char *what, ms_err *err);

/* Scales only (no codes) of the NVFP4 quantization above: scales [N, K/16] and *scale2. */
int ms_quantize_nvfp4_scales(ms_dtype dt, const void *src, int64_t N, int64_t K, uint8_t *scales, float *scale2,
                             const char *what, ms_err *err);

/* FP8 block (DeepSeek style): per 128x128 block scale = amax_blk / 448 (float32; 1.0 for an
 * all-zero block), codes = e4m3 RNE of W / scale. scale_inv [ceil(N/128), ceil(K/128)] is the
 * multiplier stored as weight_scale_inv. codes may be NULL to compute only the scales. */
int ms_quantize_fp8_block(ms_dtype dt, const void *src, int64_t N, int64_t K, uint8_t *codes, float *scale_inv,
                          const char *what, ms_err *err);

#endif
