#!/usr/bin/env bash
# Demo model accuracy through a real `moeserve serve`, driven by the openai SDK (tools/eval_demo.mjs):
# 300 held-out arithmetic questions (thinking on and off) and calculator tool prompts, for the bf16
# demo and its NVFP4 variant. Targets: >= 95% exact content, reasoning always in reasoning_content,
# >= 95% tool calls parsed with valid JSON arguments, NVFP4 within 3 points of bf16.
set -u
cd "$(dirname "$0")/../.."
BIN=${MS_BIN:-build/moeserve}
pass=0; fail=0
tmp=$(mktemp -d)
cleanup() { [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }

for variant in demo demo-nvfp4; do
  port=$(free_port)
  "$BIN" serve --model-path "models/$variant" --port "$port" >"$tmp/$variant.log" 2>&1 &
  pid=$!
  up=0
  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && { up=1; break; }; kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if [ $up = 0 ]; then
    fail=$((fail + 1)); echo "FAIL $variant: server did not become healthy"; cat "$tmp/$variant.log"
  elif node tools/eval_demo.mjs --base-url "http://127.0.0.1:$port/v1" --n 300 --json "$tmp/$variant.json"; then
    pass=$((pass + 1)); echo "ok   $variant meets the accuracy targets"
  else
    fail=$((fail + 1)); echo "FAIL $variant misses an accuracy target"; tail -5 "$tmp/$variant.log"
  fi
  kill "$pid"; wait "$pid" 2>/dev/null; pid=
done
if [ -f "$tmp/demo.json" ] && [ -f "$tmp/demo-nvfp4.json" ]; then
  if node -e '
    const a = require(process.argv[1]), b = require(process.argv[2]);
    const d = Math.abs(a.exact_all - b.exact_all) * 100;
    console.log(`bf16 ${(a.exact_all*100).toFixed(1)}% vs nvfp4 ${(b.exact_all*100).toFixed(1)}%: ${d.toFixed(1)} points apart`);
    process.exit(d <= 3 ? 0 : 1);' "$tmp/demo.json" "$tmp/demo-nvfp4.json"; then
    pass=$((pass + 1)); echo "ok   nvfp4 within 3 points of bf16"
  else fail=$((fail + 1)); echo "FAIL nvfp4 more than 3 points from bf16"; fi
else fail=$((fail + 1)); echo "FAIL missing eval results"; fi
echo "## test_demo_eval: $pass passed, $fail failed"
[ $fail = 0 ]
