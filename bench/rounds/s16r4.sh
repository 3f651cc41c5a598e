#!/usr/bin/env bash
# Session 16, GPU round 4 (H100): the sizes the H100 had not run on today's code, with the recorded
# command of s11r5 / s14r6 (megakernel at 64 steps per launch against cuda-graph, prompt 128, 128
# new tokens): 1.7b (its down projection changed in session 13), 14b and 32b (sessions 15's changes;
# never on the H100).
#   bash bench/rounds/s16r4.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
gpu=$(python3 -c "import re, torch; n = torch.cuda.get_device_name(); m = re.search(r'\b[A-Z]+\d{2,4}\b', n); print((m.group(0) if m else n.split()[-1]).lower())")
echo "$gpu"
for m in ${SIZES:-1.7b 14b 32b}; do
  timeout 240 python3 -m megakernel.bench --model $m --random-weights --compare cuda-graph --prompt-len 128 \
    --new-tokens 128 --output-json "$out/$gpu-$m-b1-p128-n128.json" > "$out/$gpu-$m-b1-p128-n128.log" 2>/tmp/err-$m
  echo "== $m rc $?"; grep -A3 "^backend" "$out/$gpu-$m-b1-p128-n128.log" || tail -5 /tmp/err-$m
done
