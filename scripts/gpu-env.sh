# gpu-env.sh - sourced by the GPU-machine scripts (gpu-check, gpu-bench, gpu-profile): repo root as
# the working directory, BUILD (prebuilt here, default build) and OUT (logs, default ./gpu-out),
# the carried libraries on the loader path, NVLink multicast off, BIN = the moeserve binary, test_run.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$BUILD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
BIN=$BUILD/moeserve
# test_run NAME LOG [VAR=value...] COMMAND...: runs a test program with those variables, its output in LOG,
# and hands the caller's row() "ok <its ## summary>" or "FAIL rc=... (LOG)" (a test program passes with status
# 0 and a summary of at least one passed and none failed)
test_run() {
  local name=$1 log=$2; shift 2
  env "$@" >"$log" 2>&1
  local rc=$? sum
  sum=$(grep -a '^## ' "$log" | tail -1 | sed 's/^## [^:]*: //')
  if [ $rc = 0 ] && [[ $sum =~ ^[1-9][0-9]*\ passed,\ 0\ failed ]]; then row "$name" "ok $sum"; else row "$name" "FAIL rc=$rc ${sum:-no summary} ($log)"; fi
}
