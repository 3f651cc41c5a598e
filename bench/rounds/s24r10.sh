#!/usr/bin/env bash
# (Needs bench/results/s24r10/gu-defer.diff on the commit before session 24's NOTES 65.)
# Session 24, GPU round 10 (H100, 0.6b): traffic moved out of attention's chain. With
# MEGAKERNEL_GU_DEFER=1 each worker with no O tile holds a NOOP that waits on attention's counter
# before its gate/up instruction, so its first gate/up tile's weights (4.4 MB over 136 workers)
# are asked for during O instead of during attention (NOTES 56, 63: traffic under attention
# lengthens it). The kernel gains the NOOP wait (megakernel/kernel.py); GU_DEFER=0 is today's tape
# on that kernel, main/ today's commit. One process each, alternating twice.
#   bash bench/rounds/s24r10.sh "$OUT/s24r10"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
here=$(pwd)
for r in 1 2; do
  for v in defer0 defer1 main; do
    d=$here; [ $v = main ] && d=$here/_main
    e=0; [ $v = defer1 ] && e=1
    echo "== $v" | tee -a "$out/ab.txt"
    (cd "$d" && MEGAKERNEL_GU_DEFER=$e timeout 150 python3 bench/gpu_smoke.py --model 0.6b --steps 256 \
      --max-seq-len 392 --backends "per-op,megakernel:spl=64,megakernel:spl=64" 2>&1) \
      | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
  done
done
