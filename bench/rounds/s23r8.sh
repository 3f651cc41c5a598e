#!/usr/bin/env bash
# Session 23, GPU round 8 (H100, 0.6b): a light trace (trace=2) of the plan after NOTES 61, with the
# stage gaps (bench/phase_stats.py) and the step's edges (bench/step_edges.py), for the closing
# breakdown; then 256 workers against 264 once more (s23r7: -0.4%, within the spread), three
# processes, alternating.
#   bash bench/rounds/s23r8.sh "$OUT/s23r8"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
b=megakernel:spl=64
timeout 120 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends $b:trace=2 --trace-dir "$out/tr" \
  2>&1 | grep -E "median|rror" | tee -a "$out/ab.txt"
for f in "$out"/tr/*.json; do
  echo "== $(basename "$f")"; python3 bench/step_edges.py "$f"; python3 bench/phase_stats.py "$f"
  python3 bench/tail_stats.py "$f" 2>&1 | head -20
done > "$out/phases.txt" 2>&1
rm -rf "$out"/tr
cat "$out/phases.txt"
for r in 1 2 3; do
  timeout 100 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
    --backends "$b,$b:workers=256,$b,$b:workers=256" 2>&1 | grep -E "median|rror" | tee -a "$out/ab.txt"
done
