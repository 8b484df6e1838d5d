#!/usr/bin/env bash
# gpu-kern-ab.sh - the batch-1 decode kernels of branch kern (bench/NOTES.md "Batch-1 decode kernels")
# checked and A/B-timed in one run on the GPU machine, from the repo root with a prebuilt BUILD dir as
# for gpu-bench.sh:
#   1. correctness: test_cuda_ops' router cases (both MS_CU_ROUTER forms run inside the test), then
#      test_moe_cuda and test_cuda_ops' linear cases once per NVFP4 GEMV form (MS_CU_GEMV_FP4 = FORMS)
#   2. bench-model decode, GLM-4.5-Air shapes with NVFP4 dummy weights, once per form (--profile:
#      synchronised sections per step, moe_experts and router among them), then the router forms
#      at batch 1 with the default GEMV
# Logs and JSON under $OUT; a summary table last. Knobs: BUILD, OUT, AIR_LAYERS (46), BATCHES
# (1,8,64), FORMS ("v1 v2 v2o v3"), WPS (extra v3 run with MS_CU_GEMV_WARPS_PER_SM=WPS; default 16,
# empty to skip). About 6-8 minutes.
. "$(dirname "$0")/gpu-env.sh"
AIR_LAYERS=${AIR_LAYERS:-46}
BATCHES=${BATCHES:-1,8,64}
FORMS=${FORMS:-"v1 v2 v2o v3"}
WPS=${WPS-16}
rows=()
row() { rows+=("$(printf '%-44s %s' "$1" "$2")"); }


test_run "router (split + warp)" "$OUT/kern-router.log" MS_TEST_ONLY=router timeout 300 "$BUILD/tests/backend/test_cuda_ops"
for v in $FORMS; do
  test_run "moe_cuda MS_CU_GEMV_FP4=$v" "$OUT/kern-moe-$v.log" MS_CU_GEMV_FP4=$v timeout 300 "$BUILD/tests/moe/test_moe_cuda"
  test_run "cuda_ops linear MS_CU_GEMV_FP4=$v" "$OUT/kern-linear-$v.log" MS_CU_GEMV_FP4=$v MS_TEST_ONLY=linear \
    timeout 300 "$BUILD/tests/backend/test_cuda_ops"
done

bench() { # name batches env...
  local name=$1 batches=$2; shift 2
  env "$@" timeout 150 "$BIN" bench-model --device cuda --load-format dummy --dummy-quant nvfp4 \
    --model configs/glm-4.5-air.json --override num_hidden_layers=$AIR_LAYERS --batches "$batches" --ctx 256 \
    --prefill 64 --profile --json >"$OUT/kern-$name.json" 2>"$OUT/kern-$name.log"
  local rc=$?
  local s
  s=$(python3 - "$OUT/kern-$name.json" "$OUT/kern-$name.log" <<'PY' 2>/dev/null
import json, re, sys
j = json.load(open(sys.argv[1]))
prof = {}
for l in open(sys.argv[2]):
    m = re.match(r'profile batch (\d+) ctx \d+ .*?:(.*)', l)
    if m:
        prof[int(m.group(1))] = dict((k.strip(), float(v)) for k, v in re.findall(r' ([^;]+?) ([0-9.]+);', m.group(2)))
out = []
for d in j["decode"]:
    if "skipped" in d: continue
    p = prof.get(d["batch"], {})
    out.append("b%d %.3f ms (moe_experts %s, router %s)" % (d["batch"], d["ms_per_step"],
               p.get("moe_experts", "?"), p.get("router", "?")))
print("; ".join(out))
PY
)
  [ $rc = 0 ] && row "bench $name" "${s:-see $OUT/kern-$name.log}" || row "bench $name" "FAIL rc=$rc ($OUT/kern-$name.log)"
}
for v in $FORMS; do bench "gemv-$v" "$BATCHES" MS_CU_GEMV_FP4=$v; done
[ -n "$WPS" ] && bench "gemv-v3-wps$WPS" "$BATCHES" MS_CU_GEMV_FP4=v3 MS_CU_GEMV_WARPS_PER_SM=$WPS
for r in warp split; do bench "router-$r" 1 MS_CU_ROUTER=$r; done

echo
echo "=== gpu-kern-ab summary (profile sections in ms per step)"
printf '%s\n' "${rows[@]}" | tee "$OUT/kern-summary.txt"
