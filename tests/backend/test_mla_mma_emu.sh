#!/usr/bin/env bash
# The absorbed-MLA tensor-core kernel (src/backend/cuda/attn_mla_mma.cu) checked without a GPU: its
# kernel and launch code are compiled for the host with the CUDA-only lines swapped for
# tests/backend/mla_mma_emu/emu.h (each CUDA thread a host thread, ldmatrix and mma.sync rebuilt from
# the PTX ISA tables, named barriers of a head tile's 2 or 4 warps) under the address and undefined-behaviour
# sanitizers, then compared with a float64 reference (tests/backend/mla_mma_emu/main.cpp), in two passes
# (cp.async copies landing at their wait, then at issue). The GPU itself is covered by test_cuda_ops on
# the GPU machine.
set -u
cd "$(dirname "$0")/../.."
. tests/backend/emu_lib.sh
emu_init mla_mma_emu
sed -e 's|^#include "backend/cuda/cuda_internal.cuh"$|#include "emu.h"|' \
    -e 's|extern __shared__ __align__(16) unsigned char mm_sm\[\];|unsigned char *mm_sm = EB->smem;|' \
    -e 's|^__device__ __forceinline__ void mm_pair_sync(int id, int n) { asm volatile.*$|static inline void mm_pair_sync(int id, int n) { emu_pair_sync(id, n); }|' \
    -e 's|CK(cu_launch(k_mla_mma<DK, DV, HB>, grid, mm_form<HB>::THREADS, sm, cu_of(b)->stream, \*a));|emu_launch(k_mla_mma<DK, DV, HB>, grid, mm_form<HB>::THREADS, sm, *a);|' \
    -e '/^\/\* The (latent row, value width) pairs compiled/,$d' \
    src/backend/cuda/attn_mla_mma.cu >"$OUTDIR/mla_emu.cpp" || fail "rewriting attn_mla_mma.cu"
for gone in 'asm' '<<<' 'extern __shared__' '#include "backend/cuda/cuda_internal.cuh"'; do
  grep -q -- "$gone" "$OUTDIR/mla_emu.cpp" && fail "attn_mla_mma.cu changed shape: '$gone' is still there after the rewrite (update this script)"
done
grep -q 'emu_launch(k_mla_mma' "$OUTDIR/mla_emu.cpp" || fail "attn_mla_mma.cu changed shape: kernel launch not found (update this script)"
# the flash-attention tile steps, as the GPU build has them
sed -n '/^\/\* Two floats as a bf16x2 register/,/^__device__ __forceinline__ float warp_sum/p' \
    src/backend/cuda/cuda_internal.cuh | sed -e '$d' >"$OUTDIR/frag_tiles.inc"
grep -q 'cu_pv_tile' "$OUTDIR/frag_tiles.inc" || fail "cuda_internal.cuh changed shape: cu_pv_tile not found (update this script)"
build() {
  ${CXX:-g++} -std=c++20 -O1 -g -fno-strict-aliasing -Itests/backend/mla_mma_emu -I"$OUTDIR" -pthread -Wno-unused-function \
    "$@" -o "$OUTDIR/mla_mma_emu" tests/backend/mla_mma_emu/main.cpp
}
emu_build build
emu_run_both_landings "$OUTDIR/mla_mma_emu"
