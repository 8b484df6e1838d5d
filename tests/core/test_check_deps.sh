#!/usr/bin/env bash
# scripts/check-deps.sh itself: the tree passes, and a planted include that goes up the layer order
# (core including engine) or a CUDA header outside a cuda/ folder makes it fail naming the file.
set -u
cd "$(dirname "$0")/../.."
pass=0; fail=0
check() { if eval "$2"; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); echo "FAIL $1"; fi; }
out=$(scripts/check-deps.sh 2>&1); rc=$?
check "the tree's includes point down" '[[ $rc == 0 ]]'
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src/core" "$tmp/src/engine" "$tmp/src/model"
printf '#include "engine/engine.h"\n' > "$tmp/src/core/up.c"
printf '#include "core/status.h"\n' > "$tmp/src/engine/engine.h"
out=$(MS_CHECK_ROOT="$tmp" scripts/check-deps.sh 2>&1); rc=$?
check "an upward include fails, naming file and include" '[[ $rc != 0 && $out == *"src/core/up.c includes \"engine/engine.h\""* ]]'
rm "$tmp/src/core/up.c"; printf '#include <cuda_runtime.h>\n' > "$tmp/src/model/k.c"
out=$(MS_CHECK_ROOT="$tmp" scripts/check-deps.sh 2>&1); rc=$?
check "a CUDA header outside cuda/ fails" '[[ $rc != 0 && $out == *"src/model/k.c includes a CUDA"* ]]'
echo "## test_check_deps: $pass passed, $fail failed"
[ $fail = 0 ]
