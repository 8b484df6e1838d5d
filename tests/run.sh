#!/usr/bin/env bash
# Runs every test layer and prints the total as the last line: "N passed, N failed".
# Each test program prints "## <name>: N passed, M failed" lines; a program that crashes or exits
# non-zero without such a line counts as one failure. Usage: tests/run.sh [BUILD_DIR] [FILTER]
# FILTER: a substring of the test path, or several separated by commas (a test runs if any matches).
set -u
cd "$(dirname "$0")/.."
BUILD=${1:-build}
FILTER=${2:-}
export MS_BIN="$PWD/$BUILD/moeserve" MS_BUILD="$PWD/$BUILD"
export MS_THREADS=${MS_THREADS:-2}
pass=0; fail=0

wanted() { # test path -> status 0 when FILTER is empty or one of its substrings is in the path
  [ -z "$FILTER" ] && return 0
  local f IFS=,
  for f in $FILTER; do [[ $1 == *$f* ]] && return 0; done
  return 1
}
logdir=$BUILD/test-logs; mkdir -p "$logdir"

run_one() { # name, command...
  local name=$1; shift
  local log="$logdir/$(echo "$name" | tr '/' '_').log"
  local t0=$(date +%s)
  "$@" >"$log" 2>&1
  local rc=$?
  local p=0 f=0 seen=0
  while read -r line; do
    if [[ $line =~ ^##\ .*:\ ([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
      p=$((p + BASH_REMATCH[1])); f=$((f + BASH_REMATCH[2])); seen=1
    fi
  done < <(grep -a '^## ' "$log")
  if [ $seen = 0 ] || { [ $rc != 0 ] && [ $f = 0 ]; }; then f=$((f + 1)); fi
  pass=$((pass + p)); fail=$((fail + f))
  local status=ok; [ $f != 0 ] && status=FAIL
  printf '%-4s %-44s %4d passed %3d failed  %3ss\n' "$status" "$name" $p $f $(( $(date +%s) - t0 ))
  if [ $f != 0 ]; then grep -a -E 'FAIL|error|Error|ERROR|runtime error|Sanitizer' "$log" | head -20 | sed 's/^/     | /'; fi
}

for t in $(find "$BUILD/tests" -type f -perm -u+x -name 'test_*' | sort); do
  name=${t#$BUILD/tests/}
  wanted "$name" || continue
  run_one "$name" "$t"
done
if [ -z "${MS_ASAN:-}" ] || [ "${MS_ASAN_NODE:-1}" = 1 ]; then
  for t in $(find tests -name 'test_*.mjs' -o -name 'test_*.sh' | sort); do
    wanted "$t" || continue
    case $t in
      *.mjs) run_one "$t" node "$t" ;;
      *.sh) run_one "$t" bash "$t" ;;
    esac
  done
fi
echo "$pass passed, $fail failed"
[ $fail = 0 ]
