#!/usr/bin/env bash
# Session 4, GPU round 6: every GPU test, the recorded 0.6b batch-1 run with every peer, and the
# weights-through-L2 experiment (MEGAKERNEL_WEIGHTS_CG=1) against the default at 0.6b and 8b.
#   bash bench/rounds/s4r6.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
bash "$(dirname "$0")/../recorded_run.sh" "$out/r"
for m in 0.6b 8b; do
  for wcg in 0 1; do
    MEGAKERNEL_WEIGHTS_CG=$wcg timeout 120 python3 bench/gpu_smoke.py --model $m --steps 64 --backends megakernel 2>&1 \
      | tee "$out/r/smoke-$m-wcg$wcg.log" | grep median | sed "s/^/$m wcg=$wcg /"
  done
done
tar czf "$out/results.tgz" -C "$out" r
