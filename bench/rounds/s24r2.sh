#!/usr/bin/env bash
# (The st=lag-* strategies were an experiment: apply bench/results/s24r4/lag-experiment.diff to the
# commit before 24 to rerun this; main has the rule in the balanced strategy, NOTES 63.)
# Session 24, GPU round 2 (H100, 0.6b): lag-all (lag-gu-down with the O projection on the workers
# whose attention split is the latest of its group, i.e. empty at this context) beside lag-gu-down
# and the plan, alternating in one process; then a light trace of lag-gu-down and of lag-all.
#   bash bench/rounds/s24r2.sh "$OUT/s24r2"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
P=megakernel:spl=64
LGD=$P:R_GU=8:st=lag-gu-down
LA=$P:R_GU=8:st=lag-all
timeout 300 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
  --backends "per-op,$P,$LGD,$LA,$P,$LA,$LGD,$P,$LGD,$LA" 2>&1 \
  | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
for v in "$LGD" "$LA"; do
  timeout 120 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends $v:trace=2 --trace-dir "$out/tr" \
    2>&1 | grep -E "median|rror" | tee -a "$out/ab.txt"
  for f in "$out"/tr/*.json; do
    echo "== $v $(basename "$f")"; python3 bench/step_edges.py "$f"; python3 bench/phase_stats.py "$f"
    python3 bench/tail_stats.py "$f" 2>&1 | head -20
  done >> "$out/phases.txt" 2>&1
  rm -rf "$out"/tr
done
cat "$out/phases.txt"
