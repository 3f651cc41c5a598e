#!/usr/bin/env bash
# Session 12, GPU round 5: tagged activations (every word of x, qkv, attn, act carries its
# version; the GEMV, attention and embed instructions signal with relaxed atomics, the LM head,
# ARGMAX and each worker's last instruction release) against the previous commit (_ab_old, a
# `git archive` of it), one process each, interleaved, twice; then every GPU test.
#   bash bench/rounds/s12r5.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
for rep in 1 2; do
  (cd _ab_old && timeout 120 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
     --backends per-op,megakernel:spl=64 2>&1 | grep -E "median|tokens equal|regs|Error" | sed "s/^/old /")
  timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
     --backends per-op,megakernel:spl=64,megakernel,cuda-graph 2>&1 | grep -E "median|tokens equal|regs|Error|error" | sed "s/^/new /"
done | tee "$out/ab.txt"
timeout 330 python3 -m pytest -m gpu -q 2>&1 | tee "$out/gpu-tests.log" | tail -5
