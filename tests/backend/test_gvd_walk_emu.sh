#!/usr/bin/env bash
# The claiming bf16 GEMV's walk (src/backend/cuda/gemv_walk.cuh: which unit each step of a k_gvd warp
# copies and computes, the claims, the hand-over of a range between the load and math streams) checked
# without a GPU: tests/backend/gvd_walk_emu/main.cpp drives every warp of a launch as the kernel does and
# interleaves their steps and claims at random, under the address and undefined-behaviour sanitizers.
# The kernel's arithmetic and memory order are test_cuda_ops' (test_linear_bf16_dyn) on the GPU machine.
set -u
cd "$(dirname "$0")/../.."
OUTDIR=${MS_BUILD:-build}/gvd_walk_emu
mkdir -p "$OUTDIR"
CXX=${CXX:-g++}
flags="-std=c++20 -O1 -g -Isrc -pthread"
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
if ! $CXX $flags $san -o "$OUTDIR/gvd_walk_emu" tests/backend/gvd_walk_emu/main.cpp 2>"$OUTDIR/build.log"; then
  $CXX $flags -o "$OUTDIR/gvd_walk_emu" tests/backend/gvd_walk_emu/main.cpp 2>>"$OUTDIR/build.log" ||
    { cat "$OUTDIR/build.log"; echo "FAIL building the emulation"; echo "## test_gvd_walk_emu: 0 passed, 1 failed"; exit 1; }
fi
timeout 900 "$OUTDIR/gvd_walk_emu"
