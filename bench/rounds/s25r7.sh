#!/usr/bin/env bash
# Session 25, GPU round 7 (H100, 0.6b): attention's ticket relaxed (no fence before it), the
# combining split checking the partials it read against the NaN the previous combine left in each
# slot (MEGAKERNEL_ATTN_POISON=1, experiment), and the same without the check (=unchecked: unsafe, a
# diagnostic of what the fence costs), against main: one process each, alternating three times;
# then the megakernel GPU tests with the checked variant (teacher-forced against the reference).
#   bash bench/rounds/s25r7.sh "$OUT/s25r7"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
P=megakernel:spl=64
for r in 1 2 3; do
  for e in 0 1 unchecked; do
    echo "== POISON=$e" | tee -a "$out/ab.txt"
    MEGAKERNEL_ATTN_POISON=$e timeout 200 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
      --backends "per-op,$P,$P" 2>&1 | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
  done
done
MEGAKERNEL_ATTN_POISON=1 timeout 200 python3 bench/gpu_smoke.py --steps 128 --max-seq-len 392 --backends $P:trace=2 \
  --trace-dir "$out/tr" 2>&1 | grep -E "median|rror" | tee -a "$out/trace.txt"
for f in "$out"/tr/*.json; do python3 bench/phase_stats.py "$f"; python3 bench/attn_groups.py "$f"; done >> "$out/trace.txt" 2>&1
rm -rf "$out/tr"
MEGAKERNEL_ATTN_POISON=1 timeout 300 python3 -m pytest -m gpu -q -x tests/test_gpu_megakernel.py 2>&1 | tail -3 | tee "$out/gpu-tests.txt"
