#!/usr/bin/env bash
# Model paths as users give them, offline: a Hugging Face repo id is downloaded from a fake hub on
# 127.0.0.1 (tests/hub/fake_hub.py serving models/demo, HF_ENDPOINT pointing at it) into the
# standard cache layout, then served from the cache by its id, also with HF_HUB_OFFLINE=1 and no
# server at all; a transfer cut in the middle resumes with a Range request, within one run and
# across runs (.incomplete blob); a corrupted file fails its sha256 check; a gated repo needs
# HF_TOKEN; a cache laid out by hand as huggingface-cli writes it is found by id and --revision.
set -u
cd "$(dirname "$0")/../.."
BIN=${MS_BIN:-build/moeserve}
pass=0; fail=0; out=""
check() { if eval "$2"; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); echo "FAIL $1"; echo "$out" | tail -5; fi; }
tmp=$(mktemp -d)
hub_pid=""
stop_hub() { if [ -n "$hub_pid" ]; then kill "$hub_pid" 2>/dev/null; wait "$hub_pid" 2>/dev/null; hub_pid=""; fi; }
trap 'stop_hub; rm -rf "$tmp"' EXIT
start_hub() { # env for the hub may precede the call
  stop_hub
  rm -f "$tmp/port" "$tmp/log"; : >"$tmp/log"
  python3 tests/hub/fake_hub.py models/demo testorg/demo "$tmp/port" "$tmp/log" &
  hub_pid=$!
  for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
  export HF_ENDPOINT="http://127.0.0.1:$(cat "$tmp/port")"
}
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN HF_HUB_CACHE HF_HUB_OFFLINE
export HF_HOME="$tmp/hf"
commit=$(python3 -c 'import hashlib; print(hashlib.sha1(b"testorg/demo").hexdigest())')
repo="$tmp/hf/hub/models--testorg--demo"
want_tok=$(printf 'Hello, world' | "$BIN" tokenize --model models/demo)
want_gen=$("$BIN" generate --model models/demo --ids 1,2,3 --max-tokens 3 2>/dev/null)

start_hub
out=$(printf 'Hello, world' | "$BIN" tokenize --model testorg/demo 2>&1)
check "tokenize --model ORG/NAME downloads from HF_ENDPOINT and tokenizes" '[[ $(tail -1 <<<"$out") == "$want_tok" ]]'
check "the cache has the hub layout: refs/main, snapshots/COMMIT/* -> ../../blobs/*" \
  '[[ $(cat "$repo/refs/main") == "$commit" && $(readlink "$repo/snapshots/$commit/tokenizer.json") == ../../blobs/* && -f "$repo/snapshots/$commit/tokenizer.json" ]]'
sha=$(sha256sum models/demo/model.safetensors | cut -c1-64)
check "LFS blobs are named by their sha256, as huggingface_hub names them" '[[ -f "$repo/blobs/$sha" && $(readlink "$repo/snapshots/$commit/model.safetensors") == "../../blobs/$sha" ]]'
check "only model files are fetched (README.md is not)" '! grep -q README "$tmp/log" && [[ ! -e "$repo/snapshots/$commit/README.md" ]]'
n_before=$(wc -l <"$tmp/log")
out=$("$BIN" generate --model testorg/demo --ids 1,2,3 --max-tokens 3 2>&1)
check "a second command uses the cache without a request" '[[ $(tail -1 <<<"$out") == "$want_gen" && $(wc -l <"$tmp/log") == "$n_before" ]]'
stop_hub
out=$(HF_HUB_OFFLINE=1 "$BIN" generate --model testorg/demo --ids 1,2,3 --max-tokens 3 2>&1)
check "HF_HUB_OFFLINE=1 serves from the cache with no hub running" '[[ $(tail -1 <<<"$out") == "$want_gen" ]]'
out=$(HF_HUB_OFFLINE=1 HF_HOME="$tmp/empty" "$BIN" tokenize --model testorg/demo </dev/null 2>&1); rc=$?
check "HF_HUB_OFFLINE=1 with an empty cache: exit 2 and a sentence naming HF_HUB_OFFLINE" '[[ $rc == 2 && $out == *"not in the Hugging Face cache"*HF_HUB_OFFLINE* ]]'

# a transfer cut in the middle resumes with a Range request within the same run
HUB_CUT=model.safetensors:3000000 start_hub
export HF_HOME="$tmp/hf2"
out=$("$BIN" generate --model testorg/demo --ids 1,2,3 --max-tokens 3 2>&1)
check "a cut transfer is resumed (Range request) and the model runs" \
  '[[ $(tail -1 <<<"$out") == "$want_gen" ]] && grep -q "resolve/$commit/model.safetensors range=bytes=[1-9][0-9]*-" "$tmp/log"'
stop_hub

# an interrupted earlier run left an .incomplete blob: the next run continues it
export HF_HOME="$tmp/hf3"
mkdir -p "$tmp/hf3/hub/models--testorg--demo/blobs"
head -c 1048576 models/demo/model.safetensors >"$tmp/hf3/hub/models--testorg--demo/blobs/$sha.incomplete"
start_hub
out=$(printf 'Hello, world' | "$BIN" tokenize --model testorg/demo 2>&1)
check "an .incomplete blob from an earlier run is resumed from its size" \
  '[[ $(tail -1 <<<"$out") == "$want_tok" ]] && grep -q "model.safetensors range=bytes=1048576-" "$tmp/log" && [[ ! -e "$tmp/hf3/hub/models--testorg--demo/blobs/$sha.incomplete" ]]'
stop_hub

# checksum, token, unknown repo
export HF_HOME="$tmp/hf4"
HUB_CORRUPT=model.safetensors start_hub
out=$("$BIN" tokenize --model testorg/demo </dev/null 2>&1); rc=$?
check "a corrupted download fails its sha256 check, and no ref names the snapshot" '[[ $rc == 2 && $out == *"sha256 mismatch"* && ! -e "$tmp/hf4/hub/models--testorg--demo/refs/main" ]]'
stop_hub
export HF_HOME="$tmp/hf5"
HUB_TOKEN=secret start_hub
out=$("$BIN" tokenize --model testorg/demo </dev/null 2>&1); rc=$?
check "a gated repo without HF_TOKEN: exit 2, the sentence names HF_TOKEN" '[[ $rc == 2 && $out == *"gated or private"*HF_TOKEN* ]]'
out=$(printf 'Hello, world' | HF_TOKEN=secret "$BIN" tokenize --model testorg/demo 2>&1)
check "with HF_TOKEN the download carries it and succeeds" '[[ $(tail -1 <<<"$out") == "$want_tok" ]] && ! grep -q "auth=0" <(grep resolve "$tmp/log")'
out=$(HF_TOKEN=secret "$BIN" tokenize --model testorg/nothere </dev/null 2>&1); rc=$?
check "an unknown repo: exit 2, 'no such repo'" '[[ $rc == 2 && $out == *"no such repo"* ]]'
stop_hub

# a cache written by huggingface-cli (files in snapshots, refs/main), found by id and by --revision
export HF_HOME="$tmp/unused"
export HF_HUB_CACHE="$tmp/cli-cache"
c2=0123456789abcdef0123456789abcdef01234567
mkdir -p "$HF_HUB_CACHE/models--other--tiny/snapshots/$c2" "$HF_HUB_CACHE/models--other--tiny/refs"
cp models/demo/tokenizer.json models/demo/tokenizer_config.json "$HF_HUB_CACHE/models--other--tiny/snapshots/$c2/"
printf '%s' "$c2" >"$HF_HUB_CACHE/models--other--tiny/refs/main"
export HF_ENDPOINT=http://127.0.0.1:9  # nothing listens: any request would fail
out=$(printf 'Hello, world' | "$BIN" tokenize --model other/tiny 2>&1)
check "HF_HUB_CACHE laid out by huggingface-cli: found by repo id, no network" '[[ $(tail -1 <<<"$out") == "$want_tok" ]]'
out=$(printf 'Hello, world' | "$BIN" tokenize --model other/tiny --revision "$c2" 2>&1)
check "--revision COMMIT picks that snapshot" '[[ $(tail -1 <<<"$out") == "$want_tok" ]]'
out=$("$BIN" tokenize --model other/tiny --revision v9 </dev/null 2>&1); rc=$?
check "--revision that is not cached goes to the hub, and says it cannot reach it" '[[ $rc == 2 && $out == *"cannot reach"* ]]'
echo "## test_hub_download: $pass passed, $fail failed"
[ $fail = 0 ]
