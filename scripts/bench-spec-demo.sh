#!/usr/bin/env bash
# Speculative decoding on the built-in demo model, on this machine's CPU: the same held-out questions
# (tools/eval_demo.mjs, one request at a time: a single stream, temperature 0) against two servers on
# models/demo, one plain and one with --speculative-algorithm NEXTN (the demo's own trained MTP layer),
# then prints output tokens per second of each, the ratio and the mean accept length the speculating
# server reports (/get_server_info). Both servers use the same worker threads (MS_THREADS, else all cores).
# Usage: scripts/bench-spec-demo.sh [N questions, default 140] [num-steps, default 3]
set -eu
cd "$(dirname "$0")/.."
BIN=${MS_BIN:-build/moeserve}
N=${1:-140}; STEPS=${2:-3}
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
for mode in plain nextn; do
  port=$(free_port)
  extra=()
  [ $mode = nextn ] && extra=(--speculative-algorithm NEXTN --speculative-num-steps "$STEPS" --speculative-eagle-topk 1
                              --speculative-num-draft-tokens $((STEPS + 1)))
  "$BIN" serve --model-path models/demo --port "$port" "${extra[@]}" >"$tmp/$mode.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
  node tools/eval_demo.mjs --base-url "http://127.0.0.1:$port/v1" --n "$N" --concurrency 1 --json "$tmp/$mode.json" \
    --min-exact 0 --min-mode 0 --min-category 0 --min-tool 0 | head -3
  [ $mode = nextn ] && curl -s "http://127.0.0.1:$port/get_server_info" >"$tmp/info.json"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
done
node -e '
const fs = require("fs"), [a, b, info] = process.argv.slice(1).map((f) => JSON.parse(fs.readFileSync(f)));
const acc = info.internal_states?.[0]?.avg_spec_accept_length;
console.log(`single stream, temperature 0, ${a.n_arith + a.n_tool} questions:`);
console.log(`  plain: ${a.output_tokens_per_s.toFixed(1)} tok/s (${a.completion_tokens} tokens in ${a.seconds.toFixed(1)} s, exact ${(100 * a.exact_all).toFixed(1)}%)`);
console.log(`  NEXTN: ${b.output_tokens_per_s.toFixed(1)} tok/s (${b.completion_tokens} tokens in ${b.seconds.toFixed(1)} s, exact ${(100 * b.exact_all).toFixed(1)}%)`);
console.log(`  speed-up ${(b.output_tokens_per_s / a.output_tokens_per_s).toFixed(2)}x, mean accept length ${acc?.toFixed(2)} (of ${'"$STEPS"' + 1})`);
' "$tmp/plain.json" "$tmp/nextn.json" "$tmp/info.json"
