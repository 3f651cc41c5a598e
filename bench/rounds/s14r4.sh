#!/usr/bin/env bash
# Session 14, GPU round 4: where 8b's megakernel loses to cuda-graph (NOTES 45: 2.3% on the H100).
# A traced megakernel step (phases per stage, tails) against the per-op step's kernel times
# (torch.profiler), and the untraced megakernel and cuda-graph in one process.
#   bash bench/rounds/s14r4.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs" | sed "s/^/$1 /"; }
timeout 200 python3 bench/gpu_smoke.py --model 8b --steps 128 --max-seq-len 392 \
  --backends per-op,megakernel:spl=64,cuda-graph 2>&1 | pick 8b | tee "$out/ab.txt"
timeout 200 python3 bench/gpu_smoke.py --model 8b --steps 32 --max-seq-len 392 --backends megakernel:trace=1:spl=32 \
  --trace-dir "$out/tr" 2>&1 | pick trace | tee -a "$out/ab.txt"
python3 bench/phase_stats.py "$out"/tr/*.json > "$out/phases.txt" 2>&1
python3 bench/tail_stats.py "$out"/tr/*.json 8 > "$out/tails.txt" 2>&1
python3 bench/step_edges.py "$out"/tr/*.json > "$out/edges.txt" 2>&1
gzip -c "$out"/tr/*.json > "$out/trace.json.gz"; rm -rf "$out/tr"
timeout 200 python3 bench/perop_profile.py --model 8b --steps 4 2>&1 | tail -14 > "$out/perop.txt"
cat "$out/phases.txt" "$out/tails.txt" "$out/edges.txt" "$out/perop.txt"
