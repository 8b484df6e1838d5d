#!/usr/bin/env bash
# Runs on the GPU machine (PyTorch + transformers there): writes the conformance fixtures and trains
# the demo model. Results come back as $OUT/fixtures.tgz and $OUT/demo.tgz; logs in $OUT.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -c "import torch, transformers, tokenizers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'cuda', torch.cuda.is_available())"
rm -rf /tmp/fx /tmp/demo; mkdir -p /tmp/fx /tmp/demo
OUT=$OUT python3 tools/make_fixtures.py /tmp/fx > "$OUT/fixtures.log" 2>&1 &
fx=$!
# the committed demo (v2, with its MTP layer): seed 21, MTP loss weight 0.5, 455 s (it ran beside a second
# seed on the same H200, 1905 steps; alone it takes more steps in the same time)
python3 tools/train_demo.py --template configs/templates/glm5.jinja --out /tmp/demo --seconds "${TRAIN_SECONDS:-455}" \
  --seed "${TRAIN_SEED:-21}" --mtp-weight "${MTP_WEIGHT:-0.5}" --workers 8 > "$OUT/train.log" 2>&1
echo "train rc=$?"
wait $fx; echo "fixtures rc=$?"
tar czf "$OUT/fixtures.tgz" -C /tmp fx
tar czf "$OUT/demo.tgz" -C /tmp demo
echo "---- fixtures.log"; tail -30 "$OUT/fixtures.log"
echo "---- train.log"; grep -v '^step' "$OUT/train.log" | tail -25; grep '^step' "$OUT/train.log" | tail -5
