#!/usr/bin/env bash
# The command line a new user meets: every command's --help (and `moeserve help CMD`, and --help
# after other flags) prints usage to stdout and exits 0; --version; a table of bad flags each exits 2
# with one line on stderr (did-you-mean, missing value, conflicting repeat, malformed value,
# positional); SGLang's aliases are accepted; the model-path sentences (.gguf, missing directory,
# no config, no tokenizer); serve reports a busy port before loading any weights.
set -u
cd "$(dirname "$0")/../.."
BIN=${MS_BIN:-build/moeserve}
pass=0; fail=0; out=""
check() { if eval "$2"; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); echo "FAIL $1"; echo "$out" | head -5; fi; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export HF_HUB_OFFLINE=1 HF_HOME="$tmp/hf"

cmds=$("$BIN" --help | awk '/^commands:/{on=1; next} on && NF {print $1}')
check "moeserve --help lists 16 commands on stdout" '[[ $(wc -w <<<"$cmds") == 16 ]]'
for c in $cmds; do
  out=$("$BIN" "$c" --help 2>"$tmp/err"); rc=$?
  check "$c --help: usage on stdout, exit 0, nothing on stderr" '[[ $rc == 0 && $out == "usage: moeserve $c "* && ! -s "$tmp/err" && $out == *"-h, --help"* ]]'
  h2=$("$BIN" help "$c" 2>/dev/null)
  check "moeserve help $c prints the same" '[[ "$h2" == "$out" ]]'
  out=$("$BIN" "$c" --no-such-flag -h 2>&1); rc=$?
  check "$c --no-such-flag -h: help wins anywhere" '[[ $rc == 0 && $out == "usage: moeserve $c "* ]]'
done
out=$("$BIN" --version); rc=$?
check "--version" '[[ $rc == 0 && $out =~ ^moeserve\ [0-9]+\.[0-9]+\.[0-9]+$ ]]'
out=$("$BIN" help 2>/dev/null)
check "moeserve help alone lists the commands" '[[ $out == *"commands:"*serve* ]]'

mkdir -p "$tmp/gg" "$tmp/notok" "$tmp/noconf"
: >"$tmp/gg/model-Q4_K_M.gguf"; : >"$tmp/m.gguf"
cp tests/fixtures/glm4_moe/config.json tests/fixtures/glm4_moe/model.safetensors "$tmp/notok/"
cp models/demo/tokenizer.json "$tmp/noconf/"
# command line | exit code | text the one stderr line must hold
while IFS='|' read -r args want text; do
  [[ -z $args || $args == \#* ]] && continue
  out=$(eval "\"\$BIN\" $args" </dev/null 2>&1 >/dev/null); rc=$?
  check "$args -> exit $want, '$text'" '[[ $rc == "$want" && $(wc -l <<<"$out") == 1 && $out == *"$text"* ]]'
done <<EOT
serve --port|2|flag --port: missing value
serve --prot 8000|2|did you mean --port?
serve --port 1 --port 2|2|given twice with different values
serve --tp 2 --tp-size 4|2|flag --tp is given twice
serve --port abc|2|'abc' is not an integer
serve --port 70000|2|not in [0, 65535]
serve -port 8000|2|flags start with two dashes: did you mean --port?
serve --po 8000|2|write the flag in full, as --port
serve --model-path --port 8000|2|the next argument, --port, is a flag
serve --log-level loud|2|is not error, warning, info or debug
serve --disable-radix-cache=maybe|2|is not true or false
serve --model-path $tmp/m.gguf|2|is a GGUF file
serve --model-path $tmp/gg|2|holds a GGUF file (model-Q4_K_M.gguf)
serve --model-path $tmp/missing|2|does not exist: pass a checkpoint directory
serve --model-path $tmp/noconf|2|has no config.json
serve --model-path $tmp/notok|2|has no tokenizer.json
serve --model-path no-such-org/no-such-model|2|not in the Hugging Face cache
serve --ep 3 --tp 4|2|must divide --tp
generate --ids 1,2|2|flag --model DIR is required
generate --model tests/fixtures/glm4_moe --ids 1 --temperature hot|2|'hot' is not a number
generate --model tests/fixtures/glm4_moe --ids x|2|flag --ids
logits --model tests/fixtures/glm4_moe --ids 1|2|flag --out FILE is required
tokenize stray|2|unexpected argument 'stray'
tokenize --model $tmp/notok|2|has no tokenizer.json
inspect --model $tmp/noconf|2|has no config.json
detokenize --model models/demo|2|flag --ids
template --model models/demo|2|flag --messages is required
inspect|2|--model
bench --num-promts 3|2|did you mean --num-prompts?
bench --backend foo|2|flag --backend
quantize --to fp8 --in models/demo|2|flag --out is required
chat --max-tokens 0|2|flag --max-tokens
doctor --devcie 0|2|did you mean --device?
tune --reps 0|2|flag --reps
compare --a cpu|2|flag --model
bench-model --model tests/fixtures/glm4_moe --mem-mb 1|2|out of range
serve --speculative-num-steps 3|2|needs --speculative-algorithm NEXTN
serve --speculative-algorithm MEDUSA|2|is not NEXTN or EAGLE
serve --speculative-algorithm NEXTN --speculative-eagle-topk 4|2|only 1 is supported
serve --speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-num-draft-tokens 5|2|must be --speculative-num-steps + 1
generate --model tests/fixtures/glm4_moe --ids 1 --speculative-algorithm NEXTN --no-cache|2|cannot be combined
generate --model tests/fixtures/glm4_moe --ids 1 --speculative-algorithm NEXTN|1|model.layers.3.eh_proj.weight' is missing
generate --model tests/fixtures/glm4_moe --ids 1 --speculative-algorithm NEXTN --tp 2 --nnodes 2 --dist-init-addr 127.0.0.1:1|1|runs on one node
bench-tokenizer --mb 0|2|flag --mb
bench-grammar --repeat 0 --model models/demo|2|flag --repeat
srve|2|did you mean 'serve'?
--port 8000|2|before a command
EOT

# aliases are accepted: with a busy port, serve stops at the port check (before the model loads)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
python3 -c 'import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); s.bind(("127.0.0.1",int(sys.argv[1]))); s.listen(1); open(sys.argv[2],"w").close(); time.sleep(60)' "$port" "$tmp/listening" &
lpid=$!
for _ in $(seq 50); do [ -e "$tmp/listening" ] && break; sleep 0.1; done
t0=$(date +%s%N)
out=$("$BIN" serve --tensor-parallel-size 1 --expert-parallel-size 1 --log-level warning --port "$port" 2>&1); rc=$?
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
kill $lpid 2>/dev/null; wait $lpid 2>/dev/null
check "SGLang aliases accepted; a busy port is reported before loading (${ms} ms)" '[[ $rc == 1 && $out == *"is already in use"* && $out != *"executor"* ]]'
out=$("$BIN" bench --num-prompts 1 --model m 2>&1); rc=$?
check "bench defaults to serve's port 8000" '[[ $rc != 0 && $out == *"127.0.0.1:8000"* ]]'
out=$(printf '/help\n/nonsense\n/quit\n' | timeout 120 "$BIN" chat --port 0 --log-level warning 2>&1); rc=$?
check "chat passes serve flags through (--port, --log-level), /help lists the commands, unknown /x is not sent" \
  '[[ $rc == 0 && $out == *"/think on|off"* && $out == *"unknown command"* ]]'
# inspect: a memory estimate from a config alone
out=$("$BIN" inspect --model configs/glm-5.json --dtype nvfp4 --gpu H200 2>&1); rc=$?
check "inspect a config alone: parameters, weights, KV per token, GPUs of a named kind" \
  '[[ $rc == 0 && $out == *"no weights read"* && $out == *"743.9 B loaded"* && $out == *"kv cache:"*"per token"* && $out == *"H200 141 GB: 4;"* ]]'
out=$("$BIN" inspect --model configs/glm-4.5-air.json --tp 4 --gpu 80 --context-length 32768 --batch 8 2>&1); rc=$?
check "inspect --tp N --gpu GB --context-length --batch says whether it fits" '[[ $rc == 0 && $out == *"GPU 80 GB: fits at --tp 4"* && $out == *"262144 tokens"* ]]'
out=$("$BIN" inspect --model configs/glm-4.5-air.json --tp 16 2>&1 >/dev/null); rc=$?
check "inspect --tp the model cannot split: exit 2, the field named" '[[ $rc == 2 && $out == *"num_key_value_heads (8)"* ]]'
out=$("$BIN" inspect --model tests/fixtures/glm4_moe_fp8 2>&1); rc=$?
check "inspect a checkpoint: the loader's report and an estimate in the checkpoint's format" '[[ $rc == 0 && $out == *"group"*"formats"* && $out == *"(fp8 weights"* ]]'
# a served request: one access-log line at info level; /get_server_info shows the values in effect
"$BIN" serve --port 0 >"$tmp/serve.out" 2>"$tmp/serve.err" &
spid=$!
for _ in $(seq 100); do grep -q "serving" "$tmp/serve.out" 2>/dev/null && break; sleep 0.1; done
url=$(grep -o 'http://[0-9.:]*' "$tmp/serve.out" | head -1)
info=$(curl -s "$url/get_server_info"); curl -s "$url/nope" >/dev/null
sleep 0.3
kill $spid 2>/dev/null; wait $spid 2>/dev/null
out=$(cat "$tmp/serve.err")
check "access log: one info line per request (method, path, status, time)" '[[ $out == *"GET /get_server_info 200 "*" ms"* && $out == *"GET /nope 404 "* ]]'
out=$info
check "/get_server_info flags hold the effective values, not zeros" \
  '[[ $info == *"\"max_running_requests\":256"* && $info == *"\"chunked_prefill_size\":2048"* && $info == *"\"max_queued_requests\":1024"* && $info == *"\"max_total_tokens\":"[1-9]* ]]'

# quantize: progress per layer, a used --out refused, --force clears what quantize owns (no stale
# hf_quant_config.json from an NVFP4 run after an FP8 one), the result loads with one declaration
out=$("$BIN" quantize --to nvfp4 --in tests/fixtures/glm4_moe --out "$tmp/q" 2>&1); rc=$?
check "quantize shows progress per layer" '[[ $rc == 0 && $out == *"quantize: layer 0 done"*"modules"* && -f $tmp/q/hf_quant_config.json ]]'
out=$("$BIN" quantize --to fp8 --in tests/fixtures/glm4_moe --out "$tmp/q" 2>&1); rc=$?
check "quantize into a used folder is refused without --force" '[[ $rc != 0 && $out == *"is not empty"*"--force"* ]]'
out=$("$BIN" quantize --to fp8 --in tests/fixtures/glm4_moe --out "$tmp/q" --force 2>&1 && "$BIN" inspect --model "$tmp/q" 2>&1); rc=$?
check "--force replaces the owned files: no stale hf_quant_config.json, loads as FP8" \
  '[[ $rc == 0 && ! -e $tmp/q/hf_quant_config.json && $out == *"declared FP8 block"* ]]'

# chat: a refused request shows the server's error; a reply cut by --max-tokens is marked
out=$(printf 'What is 12+30?\n/quit\n' | timeout 120 "$BIN" chat --max-tokens 3 2>&1); rc=$?
check "chat marks a reply cut by --max-tokens" '[[ $rc == 0 && $out == *"[cut: --max-tokens reached]"* ]]'
"$BIN" serve --port 0 --api-key sekret >"$tmp/k.out" 2>/dev/null &
kpid=$!
for _ in $(seq 100); do grep -q "serving" "$tmp/k.out" 2>/dev/null && break; sleep 0.1; done
kurl=$(grep -o 'http://[0-9.:]*' "$tmp/k.out" | head -1)
out=$(printf 'What is 1+1?\n/quit\n' | timeout 60 "$BIN" chat --url "$kurl" 2>&1)
check "chat shows the server's refusal (HTTP 401 and its message)" '[[ $out == *"refused the request (HTTP 401)"*"API key"* ]]'
out=$(printf 'What is 1+1?\n/quit\n' | timeout 60 "$BIN" chat --url "$kurl" --api-key sekret 2>&1)
check "chat --api-key is sent" '[[ $out != *"refused"* && $out == *"2"* ]]'
kill $kpid 2>/dev/null; wait $kpid 2>/dev/null

# doctor on a machine without a GPU: the CPU, memory, and a self-test of the CPU runner
out=$(timeout 300 "$BIN" doctor 2>&1); rc=$?
check "doctor reports the CPU and memory and self-tests the CPU runner in every format" \
  '[[ $rc == 0 && $out == *"cpu: "*"logical cores"* && $out == *"memory: "*GiB* && $(grep -c "cpu      T=5 .* ok" <<<"$out") == 3 && $out == *"self-test: all ok"* ]]'

# make install PREFIX=...: the binary on PATH, the demo model where serve finds it
make -s install PREFIX="$tmp/prefix" BUILD="${MS_BUILD:-build}" >/dev/null 2>&1
out=$(cd "$tmp" && PATH="$tmp/prefix/bin:$PATH" moeserve --version 2>&1)
check "make install PREFIX=DIR puts moeserve on PATH" '[[ $out == "moeserve "* && -f $tmp/prefix/share/moeserve/models/demo/config.json ]]'
out=$(cd "$tmp" && printf '/quit\n' | timeout 60 "$tmp/prefix/bin/moeserve" chat 2>&1); rc=$?
check "the installed binary finds its demo model from any directory" '[[ $rc == 0 && $out == *"moeserve chat on http://127.0.0.1:"* ]]'
echo "## test_cli: $pass passed, $fail failed"
[ $fail = 0 ]
