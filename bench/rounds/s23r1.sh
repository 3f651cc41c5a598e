#!/usr/bin/env bash
# Session 23, GPU round 1 (H100, 0.6b): no step boundary (MEGAKERNEL_NO_BOUNDARY=1, read at import:
# EMBED waits for the previous step's ARGMAX instead of every worker, so a worker's first instruction
# of a step loads its weights before it waits) against main, one process per variant, alternating
# (256 steps, 64 a launch; tokens against per-op's); then a light trace (trace=2) of each with the
# step's edges.
# The switch is not on main: its diff is results/s23r1/no-boundary.diff (NOTES 61).
#   bash bench/rounds/s23r1.sh "$OUT/s23r1"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
for r in 1 2 3; do
  for e in 0 1; do
    t=$SECONDS
    MEGAKERNEL_NO_BOUNDARY=$e timeout 100 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
      --backends per-op,megakernel:spl=64 2>&1 | grep -E "median|equal|regs|rror" | sed "s/^/nob=$e /" \
      | tee -a "$out/ab.txt"
    echo "nob=$e round $r took $((SECONDS - t)) s" | tee -a "$out/ab.txt"
  done
done
for e in 0 1; do
  MEGAKERNEL_NO_BOUNDARY=$e timeout 90 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends \
    megakernel:spl=64:trace=2 --trace-dir "$out/tr$e" 2>&1 | grep -E "median|rror" | sed "s/^/nob=$e /" \
    | tee -a "$out/ab.txt"
  for f in "$out"/tr$e/*.json; do
    echo "== nob=$e $(basename "$f")"; python3 bench/step_edges.py "$f"; python3 bench/phase_stats.py "$f"
  done > "$out/edges-$e.txt" 2>&1
done
rm -rf "$out"/tr0 "$out"/tr1
grep -E "^==|^(EMBED|QKV|LMHEAD|ARGMAX)\[" "$out"/edges-*.txt
