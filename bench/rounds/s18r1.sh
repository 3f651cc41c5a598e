#!/usr/bin/env bash
# Session 18, GPU round 1: two probes, one process per variant, alternating, three times (0.6b,
# 256 steps, max_seq_len 392, 64 steps per launch): MEGAKERNEL_STEP_PREFETCH=1 (before a step's
# boundary wait each worker asks the L2 for its first QKV tile's weights: layer 0's QKV computes
# 5.3 us after its input where a layer's takes 1.3, s14r1) and MEGAKERNEL_ACT_BF16=1 (act stored
# as bf16 in the x/attn/counters half of the L2: down's input 12 -> 6 KB); then traced steps of
# main and the prefetch for bench/step_edges.py.
#   bash bench/rounds/s18r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
for rep in 1 2 3; do
  po=; [ "$rep" = 1 ] && po=per-op,
  for v in main:X=0 pf:MEGAKERNEL_STEP_PREFETCH=1 act:MEGAKERNEL_ACT_BF16=1 both:MEGAKERNEL_STEP_PREFETCH=1; do
    name=${v%%:*}; ev=${v#*:}
    extra=; [ "$name" = both ] && extra=MEGAKERNEL_ACT_BF16=1
    env $ev $extra timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $po$mk 2>&1 \
      | pick "$name-$rep"
  done
done | tee "$out/ab.txt"
for v in main:X=0 pf:MEGAKERNEL_STEP_PREFETCH=1; do
  name=${v%%:*}; ev=${v#*:}
  env $ev timeout 150 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends $mk:trace=1 \
    --trace-dir "$out/tr-$name" 2>&1 | pick "trace-$name"
  python3 bench/step_edges.py "$out"/tr-$name/*.json > "$out/edges-$name.txt" 2>&1
  python3 bench/phase_stats.py "$out"/tr-$name/*.json > "$out/phases-$name.txt" 2>&1
  rm -rf "$out/tr-$name"
done
cat "$out"/edges-*.txt
