#!/usr/bin/env bash
# Attention implementations, --check-numerics and the machine's links on the GPU machine (issue 18),
# from the repo root with a prebuilt BUILD dir (as gpu-check.sh). Under 4 minutes on one H200:
#   1. CUDA op tests of every attention implementation against the CPU (test_cuda_ops, attention
#      cases only) and the forward test on the GPU (graphs, --check-numerics step mode, refusals);
#   2. `moeserve doctor --interconnect` (implementations supported/refused, copies, launches, GPU
#      pairs, NCCL all-reduce, collectives projected for GLM-5 at --tp 1 and 8);
#   3. bench-model on a GLM-5-shaped dummy model (6 layers, nvfp4, ctx past index_topk so DSA is
#      sparse): auto with --profile (the step split), auto with --check-numerics (its overhead),
#      then every implementation forced on all three flags, and mma / flash on a GLM-4.5-Air-shaped
#      one (GQA); a forced choice that cannot run must be refused at start-up with the sentence;
#   4. `moeserve compare` of two implementations on the same GPU (fixtures, layer by layer).
# Logs under $OUT; a short table is printed last. Exit status 1 on any failure.
. "$(dirname "$0")/gpu-env.sh"
rows=()
fails=0
row() { rows+=("$(printf '%-52s %-6s %s' "$1" "$2" "${3:-}")"); [ "$2" = FAIL ] && fails=$((fails + 1)); }
t_start=$(date +%s)

# 1. op tests (attention cases) and the forward test
log="$OUT/attn_ops.log"
MS_TEST_ONLY=attn,mla,indexer,checks timeout 150 "$BUILD/tests/backend/test_cuda_ops" >"$log" 2>&1
rc=$?; sum=$(grep -a '^## ' "$log" | tail -1 | sed 's/^## [^:]*: //')
if [ $rc = 0 ] && [[ $sum =~ ^[1-9][0-9]*\ passed,\ 0\ failed ]]; then row "op tests: attention implementations vs cpu" ok "$sum"
else row "op tests: attention implementations vs cpu" FAIL "rc=$rc ${sum:-no summary}; $(grep -a FAIL "$log" | head -2 | tr '\n' ' ')"; fi
log="$OUT/forward_cache.log"
timeout 90 "$BUILD/tests/model/test_forward_cache" cuda >"$log" 2>&1
rc=$?; sum=$(grep -a '^## ' "$log" | tail -1 | sed 's/^## [^:]*: //')
if [ $rc = 0 ] && [[ $sum =~ ^[1-9][0-9]*\ passed,\ 0\ failed ]]; then row "forward test on cuda (check-numerics, graphs)" ok "$sum"
else row "forward test on cuda (check-numerics, graphs)" FAIL "rc=$rc ${sum:-no summary}"; fi

# 2. doctor --interconnect
log="$OUT/doctor_interconnect.log"
timeout 90 "$BIN" doctor --no-selftest --interconnect --config configs/glm-5.json --tp 8 >"$log" 2>&1
rc=$?
if [ $rc = 0 ]; then row "doctor --interconnect" ok "$(grep -c 'FLAG:' "$log") flags; $(grep -A2 'H2D pinned' "$log" | head -1 | awk '{print "H2D pinned "$3" GB/s, "$4" us"}')"
else row "doctor --interconnect" FAIL "rc=$rc"; fi

# 3. bench-model on a GLM-5-shaped dummy model
BM=("$BIN" bench-model --device cuda --model configs/glm-5.json --override num_hidden_layers=6 --load-format dummy
    --dummy-quant nvfp4 --batches 1,32 --ctx 3008 --prefill 512)
step_ms() { grep -E '^decode +batch +'"$2"' ' "$1" | head -1 | sed -E 's/.* ([0-9.]+) ms\/step.*/\1/'; }
log="$OUT/bench_auto_profile.log"
timeout 100 "${BM[@]}" --profile >"$log" 2>&1
rc=$?
if [ $rc = 0 ]; then row "bench-model glm-5x6 auto --profile" ok "b1 $(step_ms "$log" 1) ms, b32 $(step_ms "$log" 32) ms/step"
else row "bench-model glm-5x6 auto --profile" FAIL "rc=$rc $(tail -1 "$log")"; fi
for spec in "check:--check-numerics" "flash:--attention-backend flash --nsa-prefill-backend flash --nsa-decode-backend flash" "flash_nosplit:--attention-backend flash_nosplit --nsa-prefill-backend flash_nosplit --nsa-decode-backend flash_nosplit" \
            "ref:--attention-backend ref --nsa-prefill-backend ref --nsa-decode-backend ref" \
            "nsa-masked:--nsa-prefill-backend ref --nsa-decode-backend ref"; do
  name=${spec%%:*}; flags=${spec#*:}
  [ $(( $(date +%s) - t_start )) -gt 200 ] && { row "bench-model $name" skip "time budget"; continue; }
  log="$OUT/bench_$name.log"
  # shellcheck disable=SC2086
  timeout 60 "${BM[@]}" $flags >"$log" 2>&1
  rc=$?
  if [ $rc = 0 ]; then row "bench-model glm-5x6 $name" ok "b1 $(step_ms "$log" 1) ms, b32 $(step_ms "$log" 32) ms/step"
  else row "bench-model glm-5x6 $name" FAIL "rc=$rc $(tail -1 "$log" | cut -c1-150)"; fi
done
# GQA (GLM-4.5-Air-shaped, 4 layers): the tensor-core kernel and the CUDA-core one forced
BA=("$BIN" bench-model --device cuda --model configs/glm-4.5-air.json --override num_hidden_layers=4 --load-format dummy
    --dummy-quant nvfp4 --batches 1,32 --ctx 2048 --prefill 0)
for name in mma flash; do
  [ $(( $(date +%s) - t_start )) -gt 200 ] && { row "bench-model glm-4.5-air x4 $name" skip "time budget"; continue; }
  log="$OUT/bench_air_$name.log"
  timeout 45 "${BA[@]}" --attention-backend $name >"$log" 2>&1
  rc=$?
  if [ $rc = 0 ]; then row "bench-model glm-4.5-air x4 $name" ok "b1 $(step_ms "$log" 1) ms, b32 $(step_ms "$log" 32) ms/step"
  else row "bench-model glm-4.5-air x4 $name" FAIL "rc=$rc $(tail -1 "$log" | cut -c1-150)"; fi
done
# a forced choice that cannot run (mma covers latent widths 64/128/512): refused at start-up naming
# the flag, GPU, capability, reason, alternatives
log="$OUT/bench_refused.log"
timeout 60 "$BIN" bench-model --device cuda --model configs/glm-5.json --load-format dummy --override num_hidden_layers=4 \
  --override kv_lora_rank=96 --batches 1 --ctx 16 --prefill 0 --nsa-decode-backend mma >"$log" 2>&1
rc=$?
if [ $rc != 0 ] && grep -q 'nsa-decode-backend.*compute capability.*those that can' "$log"; then row "forced mma for DSA (latent width 96) is refused" ok "$(grep -o "cannot run.*" "$log" | head -1 | cut -c1-110)"
else row "forced mma for DSA (latent width 96) is refused" FAIL "rc=$rc $(tail -1 "$log" | cut -c1-150)"; fi

# 4. compare two implementations on the same GPU
for c in "glm4_moe:cuda:attn=flash:cuda:attn=ref" "glm_moe_dsa:cuda:attn=flash,nsa=flash:cuda:attn=ref,nsa=ref" \
         "glm_moe_dsa:cuda:attn=mma,nsa=mma:cuda:attn=ref,nsa=ref"; do
  fx=${c%%:*}; rest=${c#*:}; a=${rest%:cuda:*}; b=cuda:${rest##*:cuda:}
  ci=$((${ci:-0} + 1)); log="$OUT/compare_${fx}_$ci.log"
  timeout 60 "$BIN" compare --model "tests/fixtures/$fx" --a "$a" --b "$b" --ids 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20 >"$log" 2>&1
  rc=$?
  if [ $rc = 0 ]; then row "compare $fx $a vs $b" ok "$(grep '^logits' "$log" | awk '{print "logits rel "$2}')"
  else row "compare $fx $a vs $b" FAIL "rc=$rc $(tail -1 "$log" | cut -c1-120)"; fi
done

echo
echo "=== attention implementations (doctor)"; sed -n '/^attention implementations/,/^$/p' "$OUT/doctor_interconnect.log" | head -40
echo "=== interconnect"; sed -n '/^interconnect/,$p' "$OUT/doctor_interconnect.log"
echo "=== step split (bench-model --profile, GLM-5 x 6 layers)"; grep -a '^profile split' "$OUT/bench_auto_profile.log"
b1=$(step_ms "$OUT/bench_auto_profile.log" 1); c1=$(step_ms "$OUT/bench_check.log" 1)
b32=$(step_ms "$OUT/bench_auto_profile.log" 32); c32=$(step_ms "$OUT/bench_check.log" 32)
[ -n "$b1" ] && [ -n "$c1" ] && echo "=== --check-numerics overhead: batch 1 $b1 -> $c1 ms/step, batch 32 $b32 -> $c32 ms/step" &&
  python3 -c "print('    %+.1f%% / %+.1f%%' % (100*($c1/$b1-1), 100*($c32/$b32-1)))" 2>/dev/null
echo "=== summary ($(( $(date +%s) - t_start )) s)"
printf '%s\n' "${rows[@]}"
[ $fails = 0 ]
