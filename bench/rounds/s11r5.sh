#!/usr/bin/env bash
# Session 11, GPU round 5: the other sizes at batch 1 on the same code (megakernel at 64 steps per
# launch against cuda-graph), prompt 128, 128 new tokens, for the per-size picture.
#   bash bench/rounds/s11r5.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
gpu=$(python3 -c "import re, torch; n = torch.cuda.get_device_name(); m = re.search(r'\b[A-Z]+\d{2,4}\b', n); print((m.group(0) if m else n.split()[-1]).lower())")
for m in 1.7b 4b 8b; do
  timeout 170 python3 -m megakernel.bench --model $m --random-weights --compare cuda-graph --prompt-len 128 \
    --new-tokens 128 --output-json "$out/$gpu-$m-b1-p128-n128.json" > "$out/$gpu-$m-b1-p128-n128.log" 2>/dev/null
  echo "== $m"; grep -A3 "^backend" "$out/$gpu-$m-b1-p128-n128.log"
done
