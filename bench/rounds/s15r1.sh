#!/usr/bin/env bash
# Session 15, GPU round 1 (H200): the large sizes on today's code. 14b and 32b were last measured in
# session 3 (megakernel 7% and 28% behind cuda-graph); their tapes and tiles changed since (NOTES
# 45, 48). The bench against cuda-graph for both, then where 14b's step goes: the untraced
# megakernel and cuda-graph in one process, a traced step, and the per-op kernels' times.
#   bash bench/rounds/s15r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
gpu=$(python3 -c "import re, torch; n = torch.cuda.get_device_name(); m = re.search(r'\b[A-Z]+\d{2,4}\b', n); print((m.group(0) if m else n.split()[-1]).lower())")
pick() { grep -E "median|tokens equal|regs|Error|error" | sed "s/^/$1 /"; }
for m in ${SIZES:-14b 32b}; do
  timeout 280 python3 -m megakernel.bench --model $m --random-weights --compare cuda-graph --prompt-len 128 \
    --new-tokens 64 --output-json "$out/$gpu-$m-b1-p128-n64.json" > "$out/$gpu-$m-b1-p128-n64.log" 2>&1
  echo "== $m rc $?"; grep -A3 "^backend" "$out/$gpu-$m-b1-p128-n64.log" || tail -5 "$out/$gpu-$m-b1-p128-n64.log"
done
[ "${TRACE:-1}" = 1 ] || exit 0
timeout 200 python3 bench/gpu_smoke.py --model 14b --steps 32 --max-seq-len 392 --backends megakernel:trace=1:spl=32 \
  --trace-dir "$out/tr" 2>&1 | pick trace | tee "$out/ab.txt"
python3 bench/phase_stats.py "$out"/tr/*.json > "$out/phases.txt" 2>&1
python3 bench/tail_stats.py "$out"/tr/*.json 8 > "$out/tails.txt" 2>&1
python3 bench/step_edges.py "$out"/tr/*.json > "$out/edges.txt" 2>&1
gzip -c "$out"/tr/*.json > "$out/trace14b.json.gz"; rm -rf "$out/tr"
timeout 200 python3 bench/perop_profile.py --model 14b --steps 4 2>&1 | tail -14 > "$out/perop.txt"
cat "$out/phases.txt" "$out/edges.txt" "$out/perop.txt"
