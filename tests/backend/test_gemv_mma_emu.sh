#!/usr/bin/env bash
# The tensor-core GEMV (src/backend/cuda/gemv_mma.cu with its device pieces in gemv_mma.cuh) checked
# without a GPU: its kernel and launch code (header and source concatenated) are compiled for the
# host with the CUDA-only lines swapped for tests/backend/gemv_mma_emu/emu.h
# (each CUDA thread a host thread, mma.sync rebuilt from the PTX ISA fragment tables, exactness of the
# in-register dequantization asserted) under the address and undefined-behaviour sanitizers, then
# compared with a float64 reference (tests/backend/gemv_mma_emu/main.cpp). The GPU itself is covered
# by test_cuda_ops and test_moe_cuda on the GPU machine.
set -u
cd "$(dirname "$0")/../.."
. tests/backend/emu_lib.sh
emu_init gemv_mma_emu
cat src/backend/cuda/gemv_mma.cuh src/backend/cuda/gemv_mma.cu |
  sed -e 's|^#include "backend/cuda/cuda_internal.cuh"$|#include "emu.h"|' \
    -e '/^#include "backend\/cuda\/gemv_mma.cuh"$/d' \
    -e '/^extern "C" {$/,/^}$/d' \
    -e '/\/\* ---- PTX wrappers ---- \*\//,/\/\* ---- exact decoders/{/\/\* ---- exact decoders/!d}' \
    -e 's|extern __shared__ uint4 gm_smem\[\];|uint4 *gm_smem = EB->smem;|' \
    -e 's|return cu_launch(k_gmma<F, M, NT>, grid, threads, smem, st, a);|emu_launch(k_gmma<F, M, NT>, grid, threads, smem, a); return cudaGetLastError();|' \
    -e 's|cudaFuncSetAttribute(k_gmma<F, M, NT>,|cudaFuncSetAttribute(0,|' \
    >"$OUTDIR/gm_emu.cpp" || fail "rewriting gemv_mma.cu"
for gone in 'asm' '<<<' 'extern __shared__' '#include "backend/cuda/cuda_internal.cuh"'; do
  grep -q -- "$gone" "$OUTDIR/gm_emu.cpp" && fail "gemv_mma.cu changed shape: '$gone' is still there after the rewrite (update this script)"
done
grep -q 'emu_launch(k_gmma' "$OUTDIR/gm_emu.cpp" || fail "gemv_mma.cu changed shape: kernel launch not found (update this script)"
# the knob table (src/backend/cuda/knobs.c) is the library's own, compiled as C
build() { # extra flags
  ${CC:-gcc} -std=c11 -D_GNU_SOURCE -O1 -g -Isrc "$@" -c -o "$OUTDIR/knobs.o" src/backend/cuda/knobs.c &&
    ${CXX:-g++} -std=c++20 -O1 -g -Isrc -Itests/backend/gemv_mma_emu -I"$OUTDIR" -pthread "$@" \
      -o "$OUTDIR/gemv_mma_emu" tests/backend/gemv_mma_emu/main.cpp "$OUTDIR/knobs.o"
}
emu_build build
timeout 600 "$OUTDIR/gemv_mma_emu"
rc=$?
[ $rc = 0 ] || echo "FAIL emulation exited with $rc"
exit $rc
