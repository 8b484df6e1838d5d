#!/usr/bin/env bash
# test_badinput.sh - `moeserve inspect` on broken checkpoints: exit code != 0 (and not a crash),
# exactly one stderr line, naming the case's file and the tensor or field. The broken checkpoints
# come from the C test's case table (test_badinput --write DIR) so both tests cover the same cases.
set -u
cd "$(dirname "$0")/../.."
BUILD=${MS_BUILD:-$PWD/build}
BIN=${MS_BIN:-$BUILD/moeserve}
GEN=$BUILD/tests/model/test_badinput
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
if ! "$GEN" --write "$tmp" >"$tmp/cases.tsv" || [ ! -s "$tmp/cases.tsv" ]; then
  echo "FAIL could not write the bad-input cases with $GEN"
  echo "## tests/model/test_badinput.sh: 0 passed, 1 failed"; exit 1
fi
while IFS=$'\t' read -r name n1 n2; do
  "$BIN" inspect --model "$tmp/$name" >"$tmp/out" 2>"$tmp/err"; rc=$?
  lines=$(wc -l <"$tmp/err")
  why=""
  [ $rc -eq 0 ] && why="exit code 0"
  [ $rc -ge 128 ] && why="crashed (exit $rc)"
  [ "$lines" != 1 ] && why="$why; $lines stderr lines"
  grep -qF -- "$tmp/$name" "$tmp/err" || why="$why; does not name the file"
  grep -qF -- "$n1" "$tmp/err" || why="$why; lacks '$n1'"
  [ -n "$n2" ] && ! grep -qF -- "$n2" "$tmp/err" && why="$why; lacks '$n2'"
  if [ -z "$why" ]; then pass=$((pass + 1)); echo "ok   $name"
  else fail=$((fail + 1)); echo "FAIL $name: ${why#; }"; sed 's/^/     | /' "$tmp/err"; fi
done <"$tmp/cases.tsv"
echo "## tests/model/test_badinput.sh: $pass passed, $fail failed"
[ $fail = 0 ]
