#!/usr/bin/env bash
# The claiming bf16 GEMV's walk (src/backend/cuda/gemv_walk.cuh: which unit each step of a k_gvd warp
# copies and computes, the claims, the hand-over of a range between the load and math streams) checked
# without a GPU: tests/backend/gvd_walk_emu/main.cpp drives every warp of a launch as the kernel does and
# interleaves their steps and claims at random, under the address and undefined-behaviour sanitizers.
# The kernel's arithmetic and memory order are test_cuda_ops' (test_linear_bf16_dyn) on the GPU machine.
set -u
cd "$(dirname "$0")/../.."
. tests/backend/emu_lib.sh
emu_init gvd_walk_emu
build() { ${CXX:-g++} -std=c++20 -O1 -g -Isrc -pthread "$@" -o "$OUTDIR/gvd_walk_emu" tests/backend/gvd_walk_emu/main.cpp; }
emu_build build
timeout 900 "$OUTDIR/gvd_walk_emu"
