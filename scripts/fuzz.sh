#!/usr/bin/env bash
# fuzz.sh BUILD SECONDS [TARGET...] - runs each libFuzzer target of BUILD/fuzz/ for SECONDS at low
# priority, on a working corpus in BUILD/fuzz-corpus/TARGET seeded from tests/fuzz/corpus/TARGET
# (the seeds in the repository are never written to). Prints one line per target with its
# executions and crashes; exits 1 when any target crashed (the inputs are in BUILD/fuzz-crashes/).
set -u
cd "$(dirname "$0")/.."
BUILD=${1:?usage: fuzz.sh BUILD SECONDS [TARGET...]}
SECS=${2:?usage: fuzz.sh BUILD SECONDS [TARGET...]}
shift 2
targets=("$@")
if [ ${#targets[@]} = 0 ]; then
  for f in tests/fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
fi
mkdir -p "$BUILD/fuzz-crashes"
failed=0
for t in "${targets[@]}"; do
  bin="$BUILD/fuzz/$t"
  [ -x "$bin" ] || { echo "fuzz: $bin is not built"; failed=1; continue; }
  work="$BUILD/fuzz-corpus/$t"; tmp="$BUILD/fuzz-tmp/$t"
  mkdir -p "$work" "$tmp"
  log="$BUILD/fuzz-$t.log"
  MS_FUZZ_DIR="$PWD/$tmp" ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    nice -n 19 "$bin" -max_total_time="$SECS" -timeout=20 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$BUILD/fuzz-crashes/$t-" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  rm -rf "$tmp"
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  crashes=$(ls "$BUILD/fuzz-crashes/" 2>/dev/null | grep -c "^$t-")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  if [ $rc = 0 ]; then
    printf 'ok   %-20s %10s execs  %s  crashes: %s\n' "$t" "${execs:-?}" "${cov:-}" "$crashes"
  else
    failed=1
    printf 'FAIL %-20s %10s execs  exit %d  crashes: %s (see %s)\n' "$t" "${execs:-?}" "$rc" "$crashes" "$log"
    grep -m3 -E 'ERROR|SUMMARY|runtime error' "$log" | sed 's/^/     | /'
  fi
done
exit $failed
