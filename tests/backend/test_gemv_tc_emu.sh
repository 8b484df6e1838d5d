#!/usr/bin/env bash
# The streaming bf16 GEMV (k_gvb in src/backend/cuda/gemv_bf16.cu), both its CUDA-core step and its
# tensor-core step (gemv_tc.cuh, MS_CU_BF16_STREAM_MMA), checked without a GPU: the kernel's part of the
# file is compiled for the host with cuda_internal.cuh swapped for tests/backend/gemv_tc_emu/gvb_emu.h
# (every CUDA thread a host thread, mma.sync rebuilt from the PTX ISA fragment tables, cp.async landing at
# its wait, then in a second pass at issue) under the address and undefined-behaviour sanitizers, and compared with a float64 reference
# (tests/backend/gemv_tc_emu/main.cpp). The GPU itself is covered by test_cuda_ops on the GPU machine.
set -u
cd "$(dirname "$0")/../.."
. tests/backend/emu_lib.sh
emu_init gemv_tc_emu
sed -n '1,/^\/\* ---- The claiming form/p' src/backend/cuda/gemv_bf16.cu | sed -e '$d' |
  sed -e 's|^#include "backend/cuda/cuda_internal.cuh"$|#include "gvb_emu.h"|' \
      -e '/^#include "backend\/cuda\/norm_stage.cuh"$/d' \
      -e 's|extern __shared__ uint4 gb_smem\[\];|uint4 *gb_smem = EB->smem;|' \
      >"$OUTDIR/gvb_emu.cpp" || fail "cutting k_gvb out of gemv_bf16.cu"
for gone in 'asm' 'extern __shared__' '#include "backend/cuda/cuda_internal.cuh"' '#include "backend/cuda/norm_stage.cuh"'; do
  grep -q -- "$gone" "$OUTDIR/gvb_emu.cpp" && fail "gemv_bf16.cu changed shape: '$gone' is still there after the rewrite (update this script)"
done
grep -q 'void k_gvb(gb_args a)' "$OUTDIR/gvb_emu.cpp" || fail "gemv_bf16.cu changed shape: k_gvb not found (update this script)"
build() {
  ${CXX:-g++} -std=c++20 -O1 -g -Isrc -Itests/backend/gemv_mma_emu -Itests/backend/gemv_tc_emu -I"$OUTDIR" -pthread \
    -Wno-unused-function "$@" -o "$OUTDIR/gemv_tc_emu" tests/backend/gemv_tc_emu/main.cpp
}
emu_build build
emu_run_both_landings "$OUTDIR/gemv_tc_emu"
