#!/usr/bin/env bash
# Session 15, GPU round 3 (H200): after gate/up's chunks loaded together (NOTES 49). The GPU tests,
# then the bench against cuda-graph at 14b and 32b (prompt 128, 128 new tokens, the megakernel at
# 64 steps per launch), for bench/README.md.
#   bash bench/rounds/s15r3.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
gpu=$(python3 -c "import re, torch; n = torch.cuda.get_device_name(); m = re.search(r'\b[A-Z]+\d{2,4}\b', n); print((m.group(0) if m else n.split()[-1]).lower())")
timeout 300 python3 -m pytest -m gpu -q -s 2>&1 | tee "$out/$gpu-gpu-tests.log" | tail -4
for m in ${SIZES:-14b 32b}; do
  timeout 200 python3 -m megakernel.bench --model $m --random-weights --compare cuda-graph --prompt-len 128 \
    --new-tokens 128 --output-json "$out/$gpu-$m-b1-p128-n128.json" > "$out/$gpu-$m-b1-p128-n128.log" 2>/dev/null
  echo "== $m"; grep -A3 "^backend" "$out/$gpu-$m-b1-p128-n128.log"
done
