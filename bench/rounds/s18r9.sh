#!/usr/bin/env bash
# Session 18, GPU round 9: two more activations as bf16 (probe switch MEGAKERNEL_PROBE, diff in
# results/s18r9/probe.diff): the attention partials (opart, read by each group's combining tile)
# and the residual stream x (read by every QKV, gate/up and LM head tile), one process per
# variant, alternating, three times; tokens against per-op's in the first round.
#   bash bench/rounds/s18r9.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
for rep in 1 2 3; do
  po=; [ "$rep" = 1 ] && po=per-op,
  for v in main: opart:opart x:x both:opart,x; do
    name=${v%%:*}
    MEGAKERNEL_PROBE=${v#*:} timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
      --backends $po$mk 2>&1 | pick "$name-$rep"
  done
done | tee "$out/ab.txt"
