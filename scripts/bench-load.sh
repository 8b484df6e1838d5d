#!/usr/bin/env bash
# How fast moeserve loads a real sharded checkpoint against what the disk can do: makes a large
# GLM-4.5-Air-shaped bf16 checkpoint once (tools/make_test_ckpt.py), then with the page cache dropped
# before each read (needs root; otherwise the figures are marked "warm"): one shard read sequentially
# with dd (the disk's single-stream rate), all shards read at once (its parallel rate), and
# `moeserve bench-model --device cpu` opening and prefetching the checkpoint (its "loaded in" time).
#   CKPT (default /tmp/moeserve-load-ckpt)  LAYERS (default 2: ~7.4 GB)  BIN (default build/moeserve)
set -u
cd "$(dirname "$0")/.."
CKPT=${CKPT:-/tmp/moeserve-load-ckpt}
LAYERS=${LAYERS:-2}
BIN=${BIN:-build/moeserve}
[ -f "$CKPT/config.json" ] || python3 tools/make_test_ckpt.py "$CKPT" --layers "$LAYERS" >/dev/null || exit 1
drop() { sync; if echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then echo cold; else echo warm; fi; }
bytes=$(du -cb "$CKPT"/*.safetensors | tail -1 | cut -f1)
first=$(ls "$CKPT"/*.safetensors | head -1)
fb=$(stat -c %s "$first")

st=$(drop); t0=$(date +%s.%N)
dd if="$first" of=/dev/null bs=16M 2>/dev/null
t1=$(date +%s.%N)
rate() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%6.2f GB/s (%.2f GB in %.2f s)", b / s / 1e9, b / 1e9, s }'; }
echo "disk, one shard, one stream ($st):   $(rate "$fb" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')")"

st=$(drop); t0=$(date +%s.%N)
for f in "$CKPT"/*.safetensors; do dd if="$f" of=/dev/null bs=16M 2>/dev/null & done; wait
t1=$(date +%s.%N)
echo "disk, all shards in parallel ($st): $(rate "$bytes" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')")"

st=$(drop)
out=$(MS_LOG=info "$BIN" bench-model --device cpu --model "$CKPT" --batches 1 --ctx 16 --prefill 16 2>&1)
ld=$(echo "$out" | sed -n 's/.*(loaded in \([0-9.]*\) s).*/\1/p' | head -1)
[ -n "$ld" ] || { echo "$out" | tail -5; echo "bench-model did not report a load time"; exit 1; }
echo "moeserve open + prefetch ($st):      $(rate "$bytes" "$ld")"
