#!/usr/bin/env bash
# The fused indexer-key kernel (k_idx_k_prep) and the rotating rope-part copy of the absorbed MLA query
# (k_copy_rope) checked without a GPU: they and the kernels they replace (k_norm, k_rope, k_kv_store),
# with the device helpers they share, are cut out of src/backend/cuda/elementwise.cu (rope_pair and
# cu_rope_part_unit out of cuda_internal.cuh) and compiled for
# the host with every CUDA thread a host thread (tests/backend/prep_emu/main.cpp) under the address and
# undefined-behaviour sanitizers. Fused and unfused must agree bit for bit (the indexing, the barriers,
# the untouched cache rows, a padding slot), and both must match a float64 LayerNorm + RoPE. The GPU's
# own float ops (sincosf, FMA contraction) are covered by test_cuda_ops (test_idx_k_prep,
# test_absorb_rope) on the GPU machine.
set -u
cd "$(dirname "$0")/../.."
. tests/backend/emu_lib.sh
emu_init prep_emu
# one function: from the line starting with $1 to the first line that is "}" (or that line alone when
# it closes itself)
cut_fn() { awk -v pat="$1" 'index($0, pat) == 1 { f = 1; if ($0 ~ /}$/) { print; exit } } f { print } f && /^}/ { exit }' \
    "${2:-src/backend/cuda/elementwise.cu}"; }
: >"$OUTDIR/prep_cut.cpp"
for p in "__device__ __forceinline__ void rope_pair" "__device__ __forceinline__ void cu_rope_part_unit"; do
  body=$(cut_fn "$p" src/backend/cuda/cuda_internal.cuh)
  [ -n "$body" ] || fail "'$p' not found in cuda_internal.cuh (update this script)"
  printf '%s\n\n' "$body" >>"$OUTDIR/prep_cut.cpp"
done
for p in "__device__ float block_sum" "__device__ __forceinline__ void ln_stats" "__device__ __forceinline__ float ln_value" \
         "static int ln_threads" "__device__ __forceinline__ void rms_row" "__global__ void k_norm(" "__global__ void k_rope(" \
         "__global__ void k_copy_rope(" "__device__ __forceinline__ void idx_k_row" "__global__ void k_idx_k_prep(" \
         "__global__ void k_kv_store("; do
  body=$(cut_fn "$p")
  [ -n "$body" ] || fail "'$p' not found in elementwise.cu (update this script)"
  printf '%s\n\n' "$body" >>"$OUTDIR/prep_cut.cpp"
done
sed -i 's|__shared__ float sh\[32\];|float *sh = EMU_SH;|' "$OUTDIR/prep_cut.cpp"
for gone in 'asm' '__shared__'; do
  grep -q -- "$gone" "$OUTDIR/prep_cut.cpp" && fail "elementwise.cu changed shape: '$gone' left in the cut kernels (update this script)"
done
build() {
  ${CXX:-g++} -std=c++20 -O1 -g -ffp-contract=off -Isrc -I"$OUTDIR" -Itests/backend/prep_emu -pthread "$@" \
    -o "$OUTDIR/prep_emu" tests/backend/prep_emu/main.cpp
}
emu_build build
timeout 600 "$OUTDIR/prep_emu"
