#!/usr/bin/env bash
# Session 15, GPU round 8 (H200): after the down chunk rule (NOTES 50: BK_I 2048, R_DOWN 4 at batch 1
# where the down rows are longer than four chunks: 14b, 32b). The bench against cuda-graph at 14b and
# 32b (prompt 128, 128 new tokens), which now runs the same plan; then the GPU tests.
#   bash bench/rounds/s15r8.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
gpu=$(python3 -c "import re, torch; n = torch.cuda.get_device_name(); m = re.search(r'\b[A-Z]+\d{2,4}\b', n); print((m.group(0) if m else n.split()[-1]).lower())")
for m in ${SIZES:-14b 32b}; do
  timeout 200 python3 -m megakernel.bench --model $m --random-weights --compare cuda-graph --prompt-len 128 \
    --new-tokens 128 --output-json "$out/$gpu-$m-b1-p128-n128.json" > "$out/$gpu-$m-b1-p128-n128.log" 2>/dev/null
  echo "== $m"; grep -A3 "^backend" "$out/$gpu-$m-b1-p128-n128.log"
done
[ "${TESTS:-1}" = 1 ] && timeout 300 python3 -m pytest -m gpu -q -s 2>&1 | tee "$out/$gpu-gpu-tests.log" | tail -3
