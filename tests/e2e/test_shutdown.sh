#!/usr/bin/env bash
# Graceful shutdown of `moeserve serve` on the demo model (issue 17): on SIGTERM/SIGINT it stops
# accepting connections, lets running requests finish within --shutdown-timeout (finish_reason
# "length" here), aborts what is still running after it (finish_reason "abort", the stream still
# ends with [DONE]) and exits 0. Every server is started and stopped by this script, on a free port.
set -u
cd "$(dirname "$0")/../.."
BIN=${MS_BIN:-build/moeserve}
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
pass=0; fail=0
check() { if eval "$2"; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); echo "FAIL $1"; cat "$tmp"/*.log 2>/dev/null | tail -20; fi; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_server TIMEOUT -> sets port, spid
start_server() {
  port=$(free_port)
  "$BIN" serve --port "$port" --shutdown-timeout "$1" >"$tmp/serve.log" 2>&1 &
  spid=$!; pids+=("$spid")
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/health" && return 0; sleep 0.1; done
  return 1
}

# a streaming request long enough to be running when the signal comes
long_stream() {
  curl -s -N -m 120 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":1900,"ignore_eos":true,"stream":true}' >"$1"
}

wait_tokens() { # until the stream in $1 has data chunks
  for _ in $(seq 200); do [ "$(grep -c '^data: {' "$1" 2>/dev/null)" -ge 3 ] && return 0; sleep 0.05; done
  return 1
}

# 1. drained: enough time to finish
start_server 60 || { echo "FAIL server did not start"; exit 1; }
long_stream "$tmp/a.txt" & cpid=$!
wait_tokens "$tmp/a.txt"
kill -TERM "$spid"
sleep 0.3
curl -s -m 2 -o /dev/null "http://127.0.0.1:$port/health"; refused=$?
wait "$spid"; rc=$?
wait "$cpid"
check "SIGTERM with a running stream: exit status 0" '[ $rc = 0 ]'
check "no new connections once stopping" '[ $refused != 0 ]'
check "the running stream was drained to its end (length, [DONE])" 'grep -q "\"finish_reason\":\"length\"" "$tmp/a.txt" && grep -q "data: \[DONE\]" "$tmp/a.txt"'

# 2. not enough time: the rest is aborted with a proper finish_reason
start_server 0.3 || { echo "FAIL server did not start"; exit 1; }
long_stream "$tmp/b.txt" & cpid=$!
wait_tokens "$tmp/b.txt"
t0=$(date +%s.%N)
kill -INT "$spid"
wait "$spid"; rc=$?
t1=$(date +%s.%N)
wait "$cpid"
check "SIGINT past the shutdown timeout: exit status 0" '[ $rc = 0 ]'
check "it stopped promptly (< 10 s)" 'python3 -c "import sys; sys.exit(0 if $t1 - $t0 < 10 else 1)"'
check "the unfinished stream ends with finish_reason abort and [DONE]" 'grep -q "\"finish_reason\":\"abort\"" "$tmp/b.txt" && grep -q "data: \[DONE\]" "$tmp/b.txt"'

echo "## test_shutdown: $pass passed, $fail failed"
[ $fail = 0 ]
