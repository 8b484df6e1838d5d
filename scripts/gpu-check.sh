#!/usr/bin/env bash
# GPU validation, run on the GPU machine from the repo root with a prebuilt BUILD dir (made here with
# `make build`, then scripts/bundle-libs.sh). Runs the CUDA op and MoE runner tests, `moeserve doctor`
# (with its runner self-test and micro-benchmarks), fixture conformance with --device cuda for each MoE
# runner (logits vs tests/fixtures/*/ref.json: relative error <= 2e-2 per position, greedy ids equal
# where the reference's top-2 gap exceeds the error), and cached decode == full recompute. Full logs go
# under $OUT (default ./gpu-out); a short summary table is printed last. Exit status 1 on any failure.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$BUILD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
BIN=$BUILD/moeserve
RUNNERS=${RUNNERS:-"naive grouped decode"}
rows=()
fails=0
row() { rows+=("$(printf '%-46s %-6s %s' "$1" "$2" "${3:-}")"); [ "$2" = FAIL ] && fails=$((fails + 1)); }

{ nvidia-smi; echo; uname -a; } >"$OUT/machine.log" 2>&1

# 1. test programs
for t in backend/test_cuda_ops moe/test_moe_cuda; do
  log="$OUT/$(basename $t).log"
  if [ ! -x "$BUILD/tests/$t" ]; then row "$t" FAIL "not built"; continue; fi
  timeout 300 "$BUILD/tests/$t" >"$log" 2>&1
  rc=$?
  sum=$(grep -a '^## ' "$log" | tail -1 | sed 's/^## [^:]*: //')
  if [ $rc = 0 ] && [[ $sum =~ ^[1-9][0-9]*\ passed,\ 0\ failed ]]; then row "$t" ok "$sum"; else row "$t" FAIL "rc=$rc ${sum:-no summary}"; fi
done

# 2. doctor (GPU facts, runner support, self-test vs the cpu runner, micro-benchmarks)
timeout 300 "$BIN" doctor --bench >"$OUT/doctor.log" 2>&1
rc=$?
if [ $rc = 0 ]; then row "moeserve doctor --bench" ok "$(grep -c ' ok$' "$OUT/doctor.log") self-test rows ok"; else row "moeserve doctor --bench" FAIL "rc=$rc"; fi

# 3. fixture conformance and cached decode == full recompute
if ! "$BIN" logits --help >/dev/null 2>&1 && ! "$BIN" logits 2>&1 | grep -qi 'flag\|usage\|model'; then
  row "fixtures" FAIL "moeserve logits not in this build"
else
  for fx in tests/fixtures/*/; do
    fx=${fx%/}
    [ -f "$fx/ref.json" ] || continue
    name=$(basename "$fx")
    for r in $RUNNERS; do
      log="$OUT/fixtures.log"
      echo "=== $name runner=$r" >>"$log"
      res=$(timeout 180 python3 - "$BIN" "$fx" "$r" "$OUT" 2>>"$log" <<'PY'
import json, os, subprocess, sys
import numpy as np
binp, fx, runner, out = sys.argv[1:5]
ref = json.load(open(os.path.join(fx, "ref.json")))
V = ref["vocab"]; ids = ref["ids"]
rl = np.fromfile(os.path.join(fx, ref["logits_file"]), dtype="<f4").reshape(len(ids), V)
tmp = os.path.join(out, "logits_tmp.f32")
def run(args):
    p = subprocess.run([binp] + args, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        sys.stderr.write(" ".join(args) + "\n" + p.stderr)
        raise SystemExit("FAIL command failed: " + p.stderr.strip().splitlines()[-1][:120] if p.stderr.strip() else "FAIL rc")
    return p.stdout
common = ["--model", fx, "--device", "cuda", "--moe-runner-backend", runner]
run(["logits", "--ids", ",".join(map(str, ids)), "--out", tmp] + common)
gl = np.fromfile(tmp, dtype="<f4").reshape(len(ids), V)
rel = np.abs(gl - rl).max(axis=1) / np.maximum(np.abs(rl).max(axis=1), 1e-6)
err = np.abs(gl - rl).max(axis=1)
bad_pos = [i for i in range(len(ids)) if not (rel[i] <= 2e-2)]
srt = np.sort(rl, axis=1); gap = srt[:, -1] - srt[:, -2]
am_bad = [i for i in range(len(ids)) if gap[i] > 2 * err[i] and gl[i].argmax() != rl[i].argmax()]
msgs = []
ok = not bad_pos and not am_bad
msgs.append("max rel %.2e" % rel.max())
if bad_pos: msgs.append("positions over 2e-2: %s" % bad_pos[:5])
if am_bad: msgs.append("argmax differs at %s" % am_bad[:5])
# greedy continuation (cached decode) vs the reference and vs a full recompute on the GPU
gp = ref["greedy_prompt"]; gref = ref["greedy_ids"]
o = run(["generate", "--ids", ",".join(map(str, gp)), "--max-tokens", str(len(gref)), "--temperature", "0",
         "--ignore-eos", "--print-ids"] + common).strip().splitlines()
gen = [int(x) for x in o[-1].replace(" ", "").split(",") if x] if o else []
if gen != gref:
    if ref.get("greedy_min_gap", 0) > 2 * float(err.max()):
        ok = False; msgs.append("greedy %s != ref %s" % (gen, gref))
    else:
        msgs.append("greedy differs within the top-2 gap")
full = gp + gen
run(["logits", "--ids", ",".join(map(str, full)), "--out", tmp] + common)
fl = np.fromfile(tmp, dtype="<f4").reshape(len(full), V)
recomputed = [int(fl[len(gp) - 1 + i].argmax()) for i in range(len(gen))]
if recomputed != gen:
    s2 = np.sort(fl, axis=1); g2 = (s2[:, -1] - s2[:, -2])[len(gp) - 1:len(full) - 1]
    if g2.min() > 5e-2:
        ok = False; msgs.append("cached decode %s != full recompute %s" % (gen, recomputed))
    else:
        msgs.append("cached/recompute differ within a tiny gap")
print(("ok " if ok else "FAIL ") + "; ".join(msgs))
PY
)
      st=${res%% *}; [ -z "$res" ] && st=FAIL
      echo "$res" >>"$log"
      [ "$st" = ok ] || st=FAIL
      row "fixture $name [$r]" "$st" "${res#* }"
    done
  done
fi

echo
echo "gpu-check summary ($(date -u +%FT%TZ), logs in $OUT)"
printf '%s\n' "${rows[@]}" | tee "$OUT/summary.txt"
echo "$fails failed"
[ $fails = 0 ]
