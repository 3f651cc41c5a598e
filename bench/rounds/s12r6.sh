#!/usr/bin/env bash
# Session 12, GPU round 6: where the tagged activations' time goes. Per-kernel time of the per-op
# step (old tree against new), and a traced megakernel step (phases) of the new tree.
#   bash bench/rounds/s12r6.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
(cd _ab_old && timeout 120 python3 bench/perop_profile.py 2>&1 | grep -v WARN | sed "s/^/old /")  | tee "$out/profile.txt"
timeout 120 python3 bench/perop_profile.py 2>&1 | grep -v WARN | sed "s/^/new /" | tee -a "$out/profile.txt"
timeout 200 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends megakernel:trace=1 \
  --trace-dir "$out/tr" 2>&1 | grep -E "median" 
python3 bench/phase_stats.py "$out"/tr/*.json 2>&1 | tee "$out/phases.txt" | head -40
(cd _ab_old && timeout 200 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends megakernel:trace=1 \
  --trace-dir "$out/trold" 2>&1 | grep -E "median" && python3 bench/phase_stats.py "$out"/trold/*.json 2>&1 | tee "$out/phases-old.txt" | head -40)
rm -rf "$out/tr" "$out/trold"
