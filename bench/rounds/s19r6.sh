#!/usr/bin/env bash
# Session 19, GPU rounds 6 and 7 (H100, 14b, where cuda-graph led by 5.5% in s19r5): two levers in
# one process (every K-chunk 8192 wide; one worker of 8 warps per SM), then a phase trace of the
# megakernel and per-op's per-kernel profile.
#   bash bench/rounds/s19r6.sh "$OUT/s19r6" "$OUT/s19r7"
set -u
a=${1:?out}; b=${2:?out}; mkdir -p "$a" "$b"
timeout 580 python3 bench/gpu_smoke.py --model 14b --steps 32 --max-seq-len 392 --backends \
  cuda-graph,megakernel:spl=16,megakernel:spl=16:bk=8192,megakernel:spl=16:nw=8:wps=1,megakernel:spl=16 2>&1 \
  | grep -E "median|equal|regs|rror" | tee "$a/ab14b.txt"
timeout 280 python3 bench/gpu_smoke.py --model 14b --steps 16 --max-seq-len 392 --backends megakernel:spl=16:trace=1 \
  --trace-dir "$b/tr" 2>&1 | grep -E "median|rror"
python3 bench/phase_stats.py "$b"/tr/*.json > "$b/phases-14b.txt" 2>&1
python3 bench/trace_summary.py "$b"/tr/*.json > "$b/summary-14b.txt" 2>&1
rm -rf "$b/tr"
timeout 200 python3 bench/perop_profile.py --model 14b 2>&1 | tail -25 | tee "$b/perop-14b.txt"
