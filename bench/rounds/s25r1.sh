#!/usr/bin/env bash
# Session 25, GPU round 1 (H100, 0.6b): tape rows paired on SMs by the kernel (kernel._paired_row:
# rows w and w + 132 share an SM whatever the driver's placement) with gate/up's early pieces by
# SM (MEGAKERNEL_GU_SM=1) or by the old lowest-workers rule (0), against the commit before (HEAD
# unpacked in _main/). A light trace of the new code first (bench/sm_map.py must show 132 for every
# pair), then one process each, alternating three times; the GPU tests on the new code last.
#   bash bench/rounds/s25r1.sh "$OUT/s25r1"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
here=$(pwd)
P=megakernel:spl=64
MEGAKERNEL_GU_SM=1 timeout 150 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends $P:trace=2 \
  --trace-dir "$out/tr" 2>&1 | grep -E "median|rror|Traceback" | tee -a "$out/ab.txt"
for f in "$out"/tr/*.json; do python3 bench/sm_map.py "$f"; python3 bench/phase_stats.py "$f"; done 2>&1 \
  | tee "$out/trace.txt"
rm -rf "$out/tr"
for r in 1 2 3; do
  for v in before gu0 gu1; do
    d=$here; [ $v = before ] && d=$here/_main
    echo "== $v" | tee -a "$out/ab.txt"
    (cd "$d" && MEGAKERNEL_GU_SM=${v#gu} timeout 150 python3 bench/gpu_smoke.py --model 0.6b --steps 256 \
      --max-seq-len 392 --backends "per-op,$P,$P" 2>&1) | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
  done
done
MEGAKERNEL_GU_SM=1 timeout 300 python3 -m pytest -m gpu -q -x tests/test_gpu_megakernel.py 2>&1 | tail -5 | tee "$out/gpu-tests.txt"
