#!/usr/bin/env bash
# gpu-mla-heads.sh - the MLA kernel's 16-head decode form (branch mlahs, bench/NOTES.md "MLA decode head
# split") checked and A/B-timed in one run on the GPU machine, from the repo root with a prebuilt BUILD
# dir as for gpu-bench.sh:
#   1. correctness: test_cuda_ops' knob, attention-implementation and MLA cases (every MLA case also
#      runs the mma kernel forced to 64 and to 16 heads a block), the forward and MTP tests on cuda
#      (their fixtures have <= 16 heads: the 16-head form by default now)
#   2. bench-model decode, GLM-5 shapes cut to 12 layers, batches 1,2,4 at ctx 1024 and 16384, with
#      MS_CU_MLA_HEADS=64, =16 (the 16-head form everywhere) and auto (64 for GLM-5's 64 heads since the
#      session-7 measurement; 16 only for models of at most 16 heads)
#   3. ncu gpu__time_duration of k_mla_mma and k_attn_combine at batch 1 ctx 1024 (graph mode), both
#      forms (64 and 16): mean us per launch by grid (scripts/ncu_times.py)
# Logs under $OUT; a summary table last. Knobs: BUILD, OUT, LAYERS (12), BATCHES (1,2,4), NCU_LAYERS (4).
# About 6 minutes.
. "$(dirname "$0")/gpu-env.sh"
LAYERS=${LAYERS:-12}
BATCHES=${BATCHES:-1,2,4}
NCU_LAYERS=${NCU_LAYERS:-4}
rows=()
row() { rows+=("$(printf '%-40s %s' "$1" "$2")"); }

test_run "cuda_ops knobs/attn_impls/mla" "$OUT/mlah-ops.log" MS_TEST_ONLY=knobs,attn_impls,mla timeout 300 \
  "$BUILD/tests/backend/test_cuda_ops"
test_run "forward_cache cuda" "$OUT/mlah-forward.log" timeout 200 "$BUILD/tests/model/test_forward_cache" cuda
test_run "mtp cuda" "$OUT/mlah-mtp.log" timeout 200 "$BUILD/tests/model/test_mtp" cuda

for h in 64 16 auto; do
  log="$OUT/mlah-bench-$h.log"
  MS_CU_MLA_HEADS=$h timeout 240 "$BIN" bench-model --device cuda --load-format dummy --dummy-quant nvfp4 \
    --model configs/glm-5.json --override num_hidden_layers=$LAYERS --batches "$BATCHES" --ctx 1024,16384 \
    --prefill 64 >"$log" 2>&1
  rc=$?
  s=$(grep -aE '^decode' "$log" | sed -E 's/^decode +batch +([0-9]+) +ctx +([0-9]+): +[0-9.]+ tok\/s +([0-9.]+) ms\/step.*/b\1 ctx \2 \3 ms;/' | tr '\n' ' ')
  [ $rc = 0 ] && row "bench MS_CU_MLA_HEADS=$h" "${s:-see $log}" || row "bench MS_CU_MLA_HEADS=$h" "FAIL rc=$rc ($log)"
done

NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for h in 64 16; do
  [ -z "$NCU" ] && { row "ncu" "ncu not found"; break; }
  csv="$OUT/mlah-ncu-$h.csv"
  MS_CU_MLA_HEADS=$h timeout 300 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum \
    --kernel-name regex:'k_mla_mma|k_attn_combine' --csv --log-file "$csv" \
    "$BIN" bench-model --device cuda --model configs/glm-5.json --load-format dummy --dummy-quant nvfp4 \
    --override num_hidden_layers=$NCU_LAYERS --batches 1 --ctx 1024 --prefill 64 >"$OUT/mlah-ncu-$h.log" 2>&1
  s=$(python3 scripts/ncu_times.py decode "$csv" 2>/dev/null)
  row "ncu b1 ctx 1024 MS_CU_MLA_HEADS=$h" "${s:-see $csv}"
done

echo
echo "=== gpu-mla-heads summary"
printf '%s\n' "${rows[@]}" | tee "$OUT/mlah-summary.txt"
