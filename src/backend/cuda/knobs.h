/* knobs.h - the CUDA backend's environment knobs (kernel choices and launch tuning) as one table
 * (knobs.c): each knob's name, default, accepted values, when it is read and what it means. Every
 * reader in backend/cuda and moe/cuda goes through cu_knob(); `moeserve doctor` prints the table
 * (ms_cuda_knobs_print in backend_cuda.h). Plain C, free of CUDA headers (the host emulation of
 * gemv_mma.cu links knobs.c too). */
#ifndef MS_BACKEND_CUDA_KNOBS_H
#define MS_BACKEND_CUDA_KNOBS_H

#ifdef __cplusplus
extern "C" {
#endif

/* The knobs; the table in knobs.c is indexed by these. */
typedef enum cu_knob_id {
    CU_KNOB_GEMV,              /* MS_CU_GEMV: CU_GEMV_MMA or CU_GEMV_GV2 (read once) */
    CU_KNOB_GEMV_WARPS_PER_SM, /* MS_CU_GEMV_WARPS_PER_SM: integer (read once) */
    CU_KNOB_GEMV_MAX_T,        /* MS_CU_GEMV_MAX_T: integer (read once) */
    CU_KNOB_BF16_GEMV_MAX_T,   /* MS_CU_BF16_GEMV_MAX_T: integer (read once) */
    CU_KNOB_GG,                /* MS_CU_GG: CU_GG_MMA, CU_GG_OLD or CU_GG_SYNC (read at every call) */
    CU_KNOB_ATTN_NO_SPLIT,     /* MS_ATTN_NO_SPLIT: 1 when set to anything (read at every call) */
    CU_KNOB_ATTN_NO_MMA,       /* MS_ATTN_NO_MMA: 1 when set to anything (read at every call) */
    CU_KNOB_ROUTER_UNFUSED,    /* MS_CU_ROUTER_UNFUSED: 1 when set to anything (read at every call) */
    CU_KNOB_GEMV_FP4,          /* MS_CU_GEMV_FP4: CU_GEMV_FP4_AUTO, _W8, _V2, _V1, _V2O or _V3 (read at every call) */
    CU_KNOB_ROUTER,            /* MS_CU_ROUTER: CU_ROUTER_SPLIT or CU_ROUTER_WARP (read at every call) */
    CU_KNOB_LT_TUNE,           /* MS_CU_LT_TUNE: candidates timed, 0..32 (read once) */
    CU_KNOB_PDL,               /* MS_CU_PDL: 1 (default) or 0 (read once) */
    CU_KNOB_BF16_GEMV_MAX_N,   /* MS_CU_BF16_GEMV_MAX_N: integer (read once) */
    CU_KNOB_GW_N,              /* MS_CU_GW_N: CU_GW_N_128 or CU_GW_N_256 (read at every call) */
    CU_KNOB_MLA_HEADS,         /* MS_CU_MLA_HEADS: CU_MLA_HEADS_AUTO, _64 or _16 (read at every call) */
    CU_KNOB_BF16_STREAM_MAX_T, /* MS_CU_BF16_STREAM_MAX_T: 0..4 (read at every call) */
    CU_KNOB_BF16_STREAM_EARLY, /* MS_CU_BF16_STREAM_EARLY: 0 or 1 (read once) */
    CU_KNOB_MOE_FUSED,         /* MS_CU_MOE_FUSED: 0..8 (read at every call) */
    CU_KNOB_NORM_FOLD,         /* MS_CU_NORM_FOLD: 0..3, default 2 (read at every call) */
    CU_KNOB_MLA_ABSORB,        /* MS_CU_MLA_ABSORB: 0 or 1, default 1 (read at every call) */
    CU_KNOB_MLA_PREP,          /* MS_CU_MLA_PREP: 0 or 1, default 1 (read at every call) */
    CU_KNOB_ATTN_PREP,         /* MS_CU_ATTN_PREP: 0..2, default 2 (read at every call) */
    CU_KNOB_ATTN_SPLIT_TILES,  /* MS_CU_ATTN_SPLIT_TILES: 0..1048576 (read at every call) */
    CU_KNOB_MOE_ROUTE,         /* MS_CU_MOE_ROUTE: 0 or 1, default 1 (read at every call) */
    CU_KNOB_BF16_STREAM_DYN,   /* MS_CU_BF16_STREAM_DYN: 0..95, default 0 (read at every call) */
    CU_KNOB_BF16_STREAM_KS,    /* MS_CU_BF16_STREAM_KS: 0, 1, 2, 4 or 8, default 0 (read at every call) */
    CU_KNOB_BF16_STREAM_MMA,   /* MS_CU_BF16_STREAM_MMA: 0 or 1, default 0 (read at every call) */
    CU_KNOB_BF16_STREAM_L2PF,  /* MS_CU_BF16_STREAM_L2PF: 0..256, default 0 (read at every call) */
    CU_KNOB_BF16_STREAM_L2PF_MINK, /* MS_CU_BF16_STREAM_L2PF_MINK: 0..1048576, default 8192 (read at every call) */
    CU_KNOB_BF16_STREAM_DEEPK, /* MS_CU_BF16_STREAM_DEEPK: 0 or 12, default 0 (read at every call) */
    CU_KNOB_ATTN_MERGE_EARLY,  /* MS_CU_ATTN_MERGE_EARLY: 0 or 1, default 0 (read at every call) */
    CU_KNOB_NORM_EARLY,        /* MS_CU_NORM_EARLY: 0 or 1, default 0 (read at every call) */
    CU_KNOB_COUNT
} cu_knob_id;

/* Values of the choice knobs (the index of the value's name in the table). */
enum { CU_GEMV_MMA = 0, CU_GEMV_GV2 = 1 };
enum { CU_GG_MMA = 0, CU_GG_OLD = 1, CU_GG_SYNC = 2 };
enum { CU_GEMV_FP4_V2 = 0, CU_GEMV_FP4_V1 = 1, CU_GEMV_FP4_V2O = 2, CU_GEMV_FP4_V3 = 3, CU_GEMV_FP4_AUTO = 4, CU_GEMV_FP4_W8 = 5 };
enum { CU_ROUTER_SPLIT = 0, CU_ROUTER_WARP = 1 };
enum { CU_GW_N_128 = 0, CU_GW_N_256 = 1 };
enum { CU_MLA_HEADS_AUTO = 0, CU_MLA_HEADS_64 = 1, CU_MLA_HEADS_16 = 2 };

/* Value in effect of knob id. Integers: the variable parsed as a decimal integer inside the knob's
 * range, else the default. Choices: the index of the variable's value among the knob's names; unset
 * or empty gives the default, anything else the default with one warning per process. Flags: 1 when
 * the variable is set (to any value, even empty), else 0. A knob marked "read once" is read at its
 * first use and kept for the process (a step never pays for getenv); the others are read at every
 * call, so tests may set and unset them between calls. Thread-safe. */
int cu_knob(cu_knob_id id);

/* Drops the kept value of a read-once knob, so that its next cu_knob reads the environment again.
 * For tests that A/B a read-once knob in one process (MS_CU_PDL): whatever was built from the old
 * value keeps it (a recorded CUDA graph keeps the launch attributes it was captured with). Thread-safe;
 * nothing for a knob read at every call. */
void cu_knob_forget(cu_knob_id id);

#ifdef __cplusplus
}
#endif

#endif
