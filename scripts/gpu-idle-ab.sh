#!/usr/bin/env bash
# gpu-idle-ab.sh - session 29's knobs for the weights streamed in the latency-bound kernels' idle memory
# (bench/NOTES.md "Session 29") checked and A/B-timed in one run on the GPU machine, from the repo root with
# a prebuilt BUILD dir as for gpu-bench.sh:
#   1. correctness: test_cuda_ops (the knobs' cases), then test_forward_cache and test_mtp on the GPU with
#      every knob on (graphs against op by op, CPU reference)
#   2. bench-model batch-1 decode, GLM-4.5-Air shapes with NVFP4 dummy weights at 256 keys, every setting of
#      CONFIGS in ROUNDS interleaved rounds (one process each), then GLM-5 cut to 12 layers and Air at 8192
#      keys for G5_CONFIGS / LONG_CONFIGS
# SKIP_TESTS=1 leaves step 1 out; an empty CONFIGS / G5_CONFIGS / LONG_CONFIGS / TRACE_CONFIGS leaves that part out.
# A setting is "M P K D N": MS_CU_ATTN_MERGE_EARLY, MS_CU_BF16_STREAM_L2PF, MS_CU_BF16_STREAM_L2PF_MINK,
# MS_CU_BF16_STREAM_DEEPK, MS_CU_NORM_EARLY. Air runs 46 layers where the GPU has more than 100 GB, else 24
# (an H100 80GB). With a baseline binary packed (gpu-pack.sh BASE_BUILD=...: the default path before these
# knobs) each round and GLM-5 time it too, so a change of the default path's code shows in the same run.
# Logs under $OUT; the summary (ms a step) last. About 8-9 minutes on an H200.
. "$(dirname "$0")/gpu-env.sh"
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ROUNDS=${ROUNDS:-2}
CONFIGS=${CONFIGS-"0,0,8192,0,0 1,0,8192,0,0 1,16,8192,0,0 1,32,8192,0,0 1,64,8192,0,0 1,0,8192,12,0 1,16,8192,12,0 0,0,8192,0,1 1,16,8192,0,1 1,16,0,0,1"}
G5_CONFIGS=${G5_CONFIGS-"0,0,8192,0,0 1,16,8192,0,0 1,32,8192,0,0 0,0,8192,0,1"}
LONG_CONFIGS=${LONG_CONFIGS-"0,0,8192,0,0 1,16,8192,0,0 1,32,8192,0,0"}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/idle-gpu.txt"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
AIRL=46
[ "${mem:-0}" -lt 100000 ] && AIRL=24
rows=()
row() { rows+=("$(printf '%-58s %s' "$1" "$2")"); }
knobs() { # "M,P,K,D,N" -> env assignments
  local IFS=,
  set -- $1
  echo "MS_CU_ATTN_MERGE_EARLY=$1 MS_CU_BF16_STREAM_L2PF=$2 MS_CU_BF16_STREAM_L2PF_MINK=$3 MS_CU_BF16_STREAM_DEEPK=$4 MS_CU_NORM_EARLY=$5"
}
ALL_ON=$(knobs 1,32,8192,12,1)
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  test_run "test_cuda_ops" "$OUT/idle-cuda-ops.log" timeout 400 "$BUILD/tests/backend/test_cuda_ops"
  test_run "forward_cache cuda, all knobs on" "$OUT/idle-fwd.log" $ALL_ON timeout 300 "$BUILD/tests/model/test_forward_cache" cuda
  test_run "mtp cuda, all knobs on" "$OUT/idle-mtp.log" $ALL_ON timeout 300 "$BUILD/tests/model/test_mtp" cuda
fi
AIR="--model configs/glm-4.5-air.json --override num_hidden_layers=$AIRL"
run_bm() { # tag label binary [VAR=value...] -- bench-model args...: one batch-1 run, its ms a step as a row
  local tag=$1 label=$2 bin=$3 envs=() ms
  shift 3
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" timeout 150 "$bin" bench-model --device cuda --load-format dummy --dummy-quant nvfp4 --json \
    --prefill 64 --batches 1 "$@" >"$OUT/idle-bm.json" 2>"$OUT/idle-bm.err"
  ms=$(python3 -c "import json; print('%.3f' % json.load(open('$OUT/idle-bm.json'))['decode'][0]['ms_per_step'])" 2>/dev/null) ||
    ms="ERR $(tail -1 "$OUT/idle-bm.err" | cut -c1-60)"
  echo "$tag $label $ms" >>"$OUT/idle-bench.txt"
  row "$tag $label" "$ms"
}
bm() { local tag=$1 cfg=$2; shift 2; run_bm "$tag" "$cfg" "$BIN" $(knobs "$cfg") -- "$@"; }
# the packed baseline binary (moeserve-base) with its own defaults
base() { local tag=$1; shift; [ ! -x "$BUILD/moeserve-base" ] || run_bm "$tag" "baseline binary" "$BUILD/moeserve-base" -- "$@"; }
for r in $(seq 1 "$ROUNDS"); do
  base "air$AIRL ctx256 r$r" $AIR --ctx 256
  for c in $CONFIGS; do bm "air$AIRL ctx256 r$r" "$c" $AIR --ctx 256; done
done
base "glm5x12 ctx1024" --model configs/glm-5.json --override num_hidden_layers=12 --ctx 1024
for c in $G5_CONFIGS; do bm "glm5x12 ctx1024" "$c" --model configs/glm-5.json --override num_hidden_layers=12 --ctx 1024; done
for c in $LONG_CONFIGS; do bm "air$AIRL ctx8192" "$c" $AIR --ctx 8192; done
# 3. with a kernel-trace build packed (scripts/gpu-pack.sh TRACE_BUILD=...): the links of Air's and GLM-5's
#    batch-1 chain for TRACE_CONFIGS (scripts/trace_links.py; full tables under $OUT)
TRACE_CONFIGS=${TRACE_CONFIGS-"0,0,8192,0,0 1,16,8192,0,0"}
traces=()
if [ -x "$BUILD/moeserve-trace" ]; then
  for c in $TRACE_CONFIGS; do
    for m in air g5; do
      tf="/tmp/trace-$m-${c//,/_}.txt" # raw (MBs): only the tables go to $OUT
      if [ $m = air ]; then margs="$AIR --ctx 256"; else margs="--model configs/glm-5.json --override num_hidden_layers=12 --ctx 1024"; fi
      env $(knobs "$c") MS_CU_TRACE_OUT="$tf" timeout 150 "$BUILD/moeserve-trace" bench-model --device cuda --load-format dummy \
        --dummy-quant nvfp4 --json --prefill 64 --batches 1 $margs >"$OUT/trace-bm.json" 2>"$OUT/trace-bm.err"
      lf="$OUT/trace-$m-${c//,/_}.links"
      python3 scripts/trace_links.py "$tf" >"$lf" 2>&1
      traces+=("== trace $m $c ==" "$(sed -n '1p;/# by kernel/,$p' "$lf" | head -16)")
    done
  done
fi
echo
echo "== gpu-idle-ab summary (setting: merge-early,l2pf-steps,l2pf-min-K,deep-ring,norm-early; ms a step) =="
cat "$OUT/idle-gpu.txt"
printf '%s\n' "${rows[@]}"
if [ ${#traces[@]} -gt 0 ]; then printf '%s\n' "${traces[@]}"; fi
