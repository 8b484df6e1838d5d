#!/usr/bin/env bash
# GPU time per kernel of bench-model decode steps, from Nsight Compute (ncu, one metric:
# gpu__time_duration, no replay), aggregated by kernel name and grid: where a step's GPU time goes
# without the sync brackets of `bench-model --profile`. Also measures the launch floor: the same
# 46-layer decode on a model so small that every kernel is trivial, so its step time is the cost of
# issuing the step's launches and copies. Run on the GPU machine from the repo root with a prebuilt
# BUILD dir; logs under $OUT; tables printed last.
#   LAYERS (default 4)  layers of the model profiled with ncu
#   BATCHES (default 1,64)
#   MODEL (default configs/glm-4.5-air.json), CTX (256), PREFILL (256): the profiled shape
#   TAG (default b): file prefix under $OUT, so several models can share one $OUT
#   FLOOR (default 1): 0 skips the launch-floor run
#   GRAPH (default 0): 1 profiles the decode steps as the CUDA graphs they run as (kernel nodes; attention
#     then shows the split-K it was recorded with, sized for the context class, not the eager one)
. "$(dirname "$0")/gpu-env.sh"
LAYERS=${LAYERS:-4}
BATCHES=${BATCHES:-1,64}
MODEL=${MODEL:-configs/glm-4.5-air.json}
CTX=${CTX:-256}
PREFILL=${PREFILL:-256}
TAG=${TAG:-b}
FLOOR=${FLOOR:-1}
GRAPH=${GRAPH:-0}
EAGER=--disable-cuda-graph
[ "$GRAPH" = 1 ] && EAGER=
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)

if [ "$FLOOR" = 1 ]; then
echo "=== launch floor: 46 layers, tiny shapes (hidden 256, 8 heads, 64-wide experts, vocab 2048)" | tee "$OUT/profile-summary.txt"
timeout 120 "$BIN" bench-model --device cuda --model configs/glm-4.5-air.json --load-format dummy --dummy-quant nvfp4 \
  --override num_hidden_layers=46 --override hidden_size=256 --override intermediate_size=256 \
  --override moe_intermediate_size=64 --override vocab_size=2048 --override num_attention_heads=8 \
  --override num_key_value_heads=2 --override head_dim=32 --batches "$BATCHES" --ctx 256 --prefill 64 \
  >"$OUT/launch-floor.log" 2>&1
grep -E '^decode|^prefill' "$OUT/launch-floor.log" | tee -a "$OUT/profile-summary.txt"
fi

if [ -z "$NCU" ]; then echo "ncu not found" | tee -a "$OUT/profile-summary.txt"; exit 1; fi
IFS=, read -ra BL <<<"$BATCHES"
for b in "${BL[@]}"; do
  csv="$OUT/ncu-$TAG$b.csv"
  timeout 400 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --log-file "$csv" \
    "$BIN" bench-model --device cuda --model "$MODEL" --load-format dummy --dummy-quant nvfp4 \
    --override num_hidden_layers=$LAYERS --batches "$b" --ctx "$CTX" --prefill "$PREFILL" $EAGER >"$OUT/ncu-$TAG$b.log" 2>&1
  echo "=== ncu $MODEL batch $b ctx $CTX prefill $PREFILL, $LAYERS layers (rc=$?): kernels by total time; 'per step' divides by the decode steps" | tee -a "$OUT/profile-summary.txt"
  python3 scripts/ncu_times.py table "$csv" "$OUT/ncu-$TAG$b.log" | tee -a "$OUT/profile-summary.txt"
done
