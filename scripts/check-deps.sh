#!/usr/bin/env bash
# Fails on an #include that goes up the layer order of DESIGN.md (dependencies point down only), and
# on a CUDA/NCCL/cuBLAS header included outside a cuda/ folder. Each layer lists the layers it may
# include; a layer may always include itself. `make check-deps` (part of `make test`) runs it.
set -u
cd "${MS_CHECK_ROOT:-$(dirname "$0")/..}"
declare -A allowed=(
  [core]=""
  [tokenizer]="core"
  [backend]="core"
  [dist]="core backend"
  [moe]="core backend"
  [model]="core backend moe dist"
  [kv]="core"
  [sched]="core kv"
  [grammar]="core tokenizer"
  [engine]="core backend moe dist model kv sched grammar"
  [bench]="core"
  [hub]="core"
  [server]="core tokenizer grammar engine model sched kv"
)
bad=0
while IFS= read -r f; do
  layer=${f#src/}; layer=${layer%%/*}
  if [[ -z ${allowed[$layer]+x} ]]; then echo "check-deps: $f: layer '$layer' is not in the layer table (scripts/check-deps.sh)"; bad=1; continue; fi
  while IFS= read -r line; do
    inc=${line#*\"}; inc=${inc%%\"*}; dep=${inc%%/*}
    [[ $inc == */* ]] || continue          # a file of the same folder
    [[ $dep == "$layer" ]] && continue
    if [[ " ${allowed[$layer]} " != *" $dep "* ]]; then
      echo "check-deps: $f includes \"$inc\": $layer may include only: ${allowed[$layer]:-nothing}"
      bad=1
    fi
  done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$f")
  if [[ $f != */cuda/* ]] && grep -qE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<(cuda|cublas|nccl|curand|cuda_runtime)' "$f"; then
    echo "check-deps: $f includes a CUDA/NCCL header outside a cuda/ folder"; bad=1
  fi
done < <(find src -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | sort)
if [ $bad = 0 ]; then echo "check-deps: every include points down the layer order"; fi
exit $bad
