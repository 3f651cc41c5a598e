#!/usr/bin/env bash
# Session 17, GPU round 3: the sync counters and the attention tickets packed (int32 words side by
# side: a 128-byte line holds 32 counters, every ticket of a layer) or MEGAKERNEL_SYNC_STRIDE words
# apart. A poll is an atomic too, so polls of one stage's counter and the release atomics of the
# stages beside it queue at the same line. s17r2 also showed a second megakernel in one process
# ~1.7% slower than the first (different buffer addresses), so one variant per process here.
# Per round: main's tree, then this tree at strides 1, 8, 32, 256; three rounds; tokens compared
# with per-op in the first.
#   bash bench/rounds/s17r3.sh "$OUT"    (main's tree unpacked in _main/)
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
for rep in $(seq ${REPS:-3}); do
  po=; [ "$rep" = 1 ] && po=per-op,
  (cd _main && timeout 120 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $mk 2>&1 | pick "main-$rep")
  for s in 1 8 32 256; do
    MEGAKERNEL_SYNC_STRIDE=$s timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
      --backends $po$mk 2>&1 | pick "stride$s-$rep"
  done
done | tee "$out/ab.txt"
