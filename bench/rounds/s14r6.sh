#!/usr/bin/env bash
# Session 14, GPU round 6 (H100): after split_stage's one piece per worker (NOTES 48). The GPU
# tests, then 4b and 8b at batch 1 with the recorded command of s11r5 (megakernel at 64 steps per
# launch against cuda-graph, prompt 128, 128 new tokens).
#   bash bench/rounds/s14r6.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
gpu=$(python3 -c "import re, torch; n = torch.cuda.get_device_name(); m = re.search(r'\b[A-Z]+\d{2,4}\b', n); print((m.group(0) if m else n.split()[-1]).lower())")
timeout 300 python3 -m pytest -m gpu -q -s 2>&1 | tee "$out/$gpu-gpu-tests.log" | tail -4
for m in 4b 8b; do
  timeout 170 python3 -m megakernel.bench --model $m --random-weights --compare cuda-graph --prompt-len 128 \
    --new-tokens 128 --output-json "$out/$gpu-$m-b1-p128-n128.json" > "$out/$gpu-$m-b1-p128-n128.log" 2>/dev/null
  echo "== $m"; grep -A3 "^backend" "$out/$gpu-$m-b1-p128-n128.log"
done
