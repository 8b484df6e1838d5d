#!/usr/bin/env bash
# The decode router's register expert choice (src/backend/cuda/route_regs.cuh, used by k_router_split in
# elementwise.cu) checked without a GPU: compiled for the host with a warp as 32 threads
# (tests/backend/route_emu/main.cpp) under the address and undefined-behaviour sanitizers and compared
# with the CPU backend's routing rules, ids and weights bit for bit. The GPU kernel itself is covered
# by test_cuda_ops (test_router_decode) on the GPU machine.
set -u
cd "$(dirname "$0")/../.."
OUTDIR=${MS_BUILD:-build}/route_emu
mkdir -p "$OUTDIR"
CXX=${CXX:-g++}
flags="-std=c++20 -O1 -g -Isrc -pthread"
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
if ! $CXX $flags $san -o "$OUTDIR/route_emu" tests/backend/route_emu/main.cpp 2>"$OUTDIR/build.log"; then
  $CXX $flags -o "$OUTDIR/route_emu" tests/backend/route_emu/main.cpp 2>>"$OUTDIR/build.log" ||
    { cat "$OUTDIR/build.log"; echo "FAIL building the emulation"; echo "## test_route_emu: 0 passed, 1 failed"; exit 1; }
fi
timeout 600 "$OUTDIR/route_emu"
