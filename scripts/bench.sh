#!/usr/bin/env bash
# CPU benchmarks behind the figures in the issues' closing notes (`make bench`): the demo model's
# per-step speed against this machine's memory bandwidth, tokenizer throughput against the JS and
# Rust references, and `moeserve bench` against `moeserve serve` at several concurrencies.
# Usage: scripts/bench.sh [BUILD_DIR]. Results print as they come; nothing here asserts.
set -u
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN=$BUILD/moeserve
echo "== bench-model, demo model (cpu)"
"$BIN" bench-model --device cpu --model models/demo --batches 1,8,64 --ctx 256 --prefill 512
echo "== bench-model, GLM-4.5-Air shapes cut to 2 layers, dummy weights (bf16, nvfp4)"
for q in bf16 nvfp4; do
  "$BIN" bench-model --device cpu --model configs/glm-4.5-air.json --load-format dummy --dummy-quant $q \
    --override num_hidden_layers=2 --batches 1,4 --ctx 256 --prefill 128
done
echo "== tokenizer"
MS_BIN=$BIN scripts/bench-tokenizer.sh || true
echo "== serving: moeserve bench against moeserve serve (demo model), random 128/128"
port=18555
"$BIN" serve --port $port >/tmp/moeserve-bench-serve.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
for c in 1 8 16 64 256; do
  n=$((c * 4)); [ $n -lt 32 ] && n=32
  echo "-- concurrency $c"
  "$BIN" bench --backend sglang-oai --port $port --dataset-name random --tokenizer models/demo \
    --random-input-len 128 --random-output-len 128 --random-range-ratio 1 --num-prompts $n \
    --max-concurrency $c --seed 1 --disable-tqdm | grep -E "Output token throughput|Total token throughput|Mean TTFT|Median TTFT|Mean ITL|Median ITL|P99 ITL"
done
