#!/usr/bin/env bash
# Tensor parallelism across processes ("nodes") on 127.0.0.1, CPU ranks over the TCP communicator:
# two `moeserve serve --tp 2 --nnodes 2` processes answer a greedy chat request exactly as one
# process with one rank does, node 1 serves no HTTP, and when either process is killed the other
# exits non-zero within --dist-timeout with a message naming the node. Nothing may hang: every
# wait here is bounded.
set -u
cd "$(dirname "$0")/../.."
BIN=${MS_BIN:-build/moeserve}
MODEL=models/demo
TO=5 # --dist-timeout, seconds
pass=0; fail=0
check() { if eval "$2"; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); echo "FAIL $1"; fi; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ready() { # url, seconds
  for _ in $(seq 1 $(( $2 * 5 ))); do curl -sf "$1/health" >/dev/null 2>&1 && return 0; sleep 0.2; done; return 1
}
# exit code of pid within s seconds, or "hang"
wait_exit() {
  for _ in $(seq 1 $(( $2 * 10 ))); do
    if ! kill -0 "$1" 2>/dev/null; then wait "$1"; echo $?; return; fi; sleep 0.1
  done; echo hang
}
REQ='{"model":"demo","messages":[{"role":"user","content":"What is 17+25?"}],"max_tokens":64,"temperature":0}'
tmp=$(mktemp -d); trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT

# reference: one process, one rank
P=$(free_port)
"$BIN" serve --model-path $MODEL --port "$P" >"$tmp/ref.log" 2>&1 & ref=$!
wait_ready "http://127.0.0.1:$P" 60 || { echo "reference server did not start"; cat "$tmp/ref.log"; }
want=$(curl -s "http://127.0.0.1:$P/v1/chat/completions" -H 'Content-Type: application/json' -d "$REQ" | python3 -c 'import json,sys; m=json.load(sys.stdin)["choices"][0]["message"]; print(m.get("reasoning_content"), "|", m.get("content"))')
kill $ref; wait $ref 2>/dev/null

start_pair() { # sets n0, n1, url
  local dp hp; dp=$(free_port); hp=$(free_port)
  "$BIN" serve --model-path $MODEL --tp 2 --nnodes 2 --node-rank 1 --dist-init-addr "127.0.0.1:$dp" --dist-timeout $TO >"$tmp/n1.log" 2>&1 & n1=$!
  "$BIN" serve --model-path $MODEL --tp 2 --nnodes 2 --node-rank 0 --dist-init-addr "127.0.0.1:$dp" --dist-timeout $TO --port "$hp" >"$tmp/n0.log" 2>&1 & n0=$!
  url="http://127.0.0.1:$hp"
  wait_ready "$url" 60
}

start_pair
check "two nodes start and node 0 serves" 'curl -sf "$url/health" >/dev/null'
got=$(curl -s "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$REQ" | python3 -c 'import json,sys; m=json.load(sys.stdin)["choices"][0]["message"]; print(m.get("reasoning_content"), "|", m.get("content"))')
check "greedy reply over two nodes equals one rank's" '[[ -n "$want" && "$got" == "$want" ]]'
check "node 1 follows node 0 and serves no HTTP" 'grep -q "node 1 of 2 following node 0" "$tmp/n1.log"'
kill -9 $n1
rc=$(wait_exit $n0 $((TO + 10)))
check "node 1 killed: node 0 exits non-zero in time (rc $rc)" '[[ $rc != hang && $rc != 0 ]]'
check "node 0 names the lost node" 'grep -q "node 1" "$tmp/n0.log"'

start_pair
curl -s "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$REQ" >/dev/null
kill -9 $n0
rc=$(wait_exit $n1 $((TO + 10)))
check "node 0 killed: node 1 exits non-zero in time (rc $rc)" '[[ $rc != hang && $rc != 0 ]]'
check "node 1 names node 0" 'grep -q "node 0" "$tmp/n1.log"'
if [ $fail != 0 ]; then echo "--- node 0 log"; tail -5 "$tmp/n0.log"; echo "--- node 1 log"; tail -5 "$tmp/n1.log"; fi
echo "## test_dist_nodes: $pass passed, $fail failed"
[ $fail = 0 ]
