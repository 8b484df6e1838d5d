/* config_internal.h - the config.json reader shared by config.c (common keys) and the
 * architecture tables (arch_*.c, their own keys), so every field is read with the same rules:
 * absent and null are the same, integral reals are integers, and a bad value fails naming the
 * field. Not for use outside src/model. */
#ifndef MS_MODEL_CONFIG_INTERNAL_H
#define MS_MODEL_CONFIG_INTERNAL_H

#include "model/config.h"

#include <jansson.h>

typedef struct ms_cfg_reader {
    const char *path; /* config file, for messages */
    ms_err *err;
    json_t *root;     /* the config object (borrowed) */
    double partial_rotary_factor; /* from either RoPE spelling (1.0 when absent) */
    int prf_present;              /* partial_rotary_factor was given */
} ms_cfg_reader;

/* o[key], or NULL when o is not an object or the value is absent or null. */
json_t *ms_cfg_get(json_t *o, const char *key);
/* Fails with MS_ERR_FORMAT: "<path>: field '<field>' <what>". */
int ms_cfg_bad(ms_cfg_reader *c, const char *field, const char *what);
/* Number / integer fields with a default when absent. min_kind: 0 any finite, 1 >= 0, 2 > 0. */
int ms_cfg_double(ms_cfg_reader *c, json_t *o, const char *key, double def, int min_kind, double *out);
int ms_cfg_int(ms_cfg_reader *c, json_t *o, const char *key, int def, int min_kind, int *out);
/* A required positive integer. */
int ms_cfg_req_int(ms_cfg_reader *c, json_t *o, const char *key, int *out);
int ms_cfg_bool(ms_cfg_reader *c, json_t *o, const char *key, int def, int *out);

#endif
