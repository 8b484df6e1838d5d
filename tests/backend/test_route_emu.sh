#!/usr/bin/env bash
# The decode router checked without a GPU: its register expert choice (src/backend/cuda/route_regs.cuh)
# and the whole k_router_split kernel (cut out of src/backend/cuda/elementwise.cu) compiled for the host
# with every CUDA thread a host thread (tests/backend/route_emu/main.cpp, split.cpp) under the address
# and undefined-behaviour sanitizers, compared with the CPU backend's routing rules (ids and weights bit
# for bit) and a float64 reference for the logits. The GPU kernel itself is covered
# by test_cuda_ops (test_router_decode) on the GPU machine.
set -u
cd "$(dirname "$0")/../.."
. tests/backend/emu_lib.sh
emu_init route_emu
# cu_norm_in (cuda_internal.cuh) and cu_norm_stage (norm_stage.cuh: the folded norm of k_router_split<1>), then k_router_split's section of
# elementwise.cu, their CUDA-only lines swapped for split.cpp's shims (the block's shared memory: one
# static array, the blocks running one after another)
{ awk '/^#define CU_NORM_U/{f=1} f; f&&/^} cu_norm_in;/{exit}' src/backend/cuda/cuda_internal.cuh
  awk '/^static __device__ __forceinline__ void cu_norm_stage/{f=1} f; f&&/^}/{exit}' src/backend/cuda/norm_stage.cuh |
    sed -e 's/^static __device__ __forceinline__ void/static void/' -e 's/__shared__ float red\[34\];/static float red[34];/'
  awk '/^\/\* ---- router GEMV split over K/{f=1} f&&/^\/\* Contract in cuda_internal.cuh. \*\//{exit} f' \
    src/backend/cuda/elementwise.cu; } |
  sed -e '/into L2 for the last block/d' -e '/prefetch.global.L2/d' \
      -e 's|extern __shared__ uint4 rssm\[\];|uint4 *rssm = EMU_SMEM;|' -e 's|__shared__ bool last;|static bool last;|' \
      >"$OUTDIR/rs_emu.cpp" || fail "cutting k_router_split"
for gone in 'asm' '__shared__'; do
  grep -q -- "$gone" "$OUTDIR/rs_emu.cpp" && fail "elementwise.cu changed shape: '$gone' left in k_router_split's section (update this script)"
done
grep -q 'static void cu_norm_stage' "$OUTDIR/rs_emu.cpp" || fail "cu_norm_stage not found in norm_stage.cuh"
grep -q 'void k_router_split' "$OUTDIR/rs_emu.cpp" || fail "k_router_split not found in elementwise.cu"
build() { ${CXX:-g++} -std=c++20 -O1 -g -Isrc -I"$OUTDIR" -Itests/backend/route_emu -pthread "$@" -o "$OUTDIR/route_emu" tests/backend/route_emu/main.cpp; }
emu_build build
timeout 600 "$OUTDIR/route_emu"
