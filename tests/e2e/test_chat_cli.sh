#!/usr/bin/env bash
# `moeserve chat` end to end: it starts its own server on a free loopback port, streams replies with
# the reasoning apart from the answer, keeps the conversation, switches thinking off with /think
# off (and the --no-think flag), and stops its server on /quit. The first chat runs in a session
# of its own, so "its server is gone" looks at that session only, not at every process on the machine.
set -u
cd "$(dirname "$0")/../.."
BIN=${MS_BIN:-build/moeserve}
pass=0; fail=0
check() { if eval "$2"; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); echo "FAIL $1"; echo "$out" | head -20; fi; }
sidf=$(mktemp)
trap 'rm -f "$sidf"' EXIT
out=$(printf 'What is 12+30?\n/think off\nWhat is 9*7?\n/quit\n' |
      setsid -w bash -c 'echo $$ >"$0"; exec timeout 120 "$1" chat' "$sidf" "$BIN" 2>&1)
sid=$(cat "$sidf")
check "thinking reply shows reasoning, then the answer" '[[ $out == *"[reasoning] We add 12 and 30"* && $out == *"[answer] 12 + 30 = 42"* ]]'
check "after /think off the answer comes without reasoning" '[[ $out == *"9 × 7 = 63"* && $(grep -c "\[reasoning\]" <<<"$out") == 1 ]]'
out=$(printf 'What is 5+6?\n' | timeout 120 "$BIN" chat --no-think --model-path models/demo-nvfp4 2>&1)
check "--no-think with another model (its server gets the serve flags)" '[[ $out == *"5 + 6 = 11"* && $out != *"[reasoning]"* ]]'
check "the chat's server is gone after it exits (nothing left in its session)" '[[ -n $sid && -z $(ps -o pid= -s "$sid") ]]'
echo "## test_chat_cli: $pass passed, $fail failed"
[ $fail = 0 ]
