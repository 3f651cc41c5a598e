#!/usr/bin/env bash
# Session 18, GPU round 2: activations stored as bf16 (s18r1: act as bf16 in the hot allocation
# 0.748-0.752 against 0.756-0.762), one process per variant, alternating, three times (0.6b, 256
# steps, max_seq_len 392, 64 steps per launch): act, act allocated apart (MEGAKERNEL_BF16_COLD=1:
# is it the bytes or the L2 half?), attn, qkv, all three; tokens against per-op's in the first
# round; phase traces of main and all three.
#   bash bench/rounds/s18r2.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
for rep in 1 2 3; do
  po=; [ "$rep" = 1 ] && po=per-op,
  for v in main: act:act actcold:act attn:attn qkv:qkv all:act,attn,qkv; do
    name=${v%%:*}; lo=${v#*:}
    cold=0; [ "$name" = actcold ] && cold=1
    MEGAKERNEL_BF16=$lo MEGAKERNEL_BF16_COLD=$cold timeout 150 python3 bench/gpu_smoke.py --steps 256 \
      --max-seq-len 392 --backends $po$mk 2>&1 | pick "$name-$rep"
  done
done | tee "$out/ab.txt"
for v in main: all:act,attn,qkv; do
  name=${v%%:*}; lo=${v#*:}
  MEGAKERNEL_BF16=$lo timeout 150 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends $mk:trace=1 \
    --trace-dir "$out/tr-$name" 2>&1 | pick "trace-$name"
  python3 bench/phase_stats.py "$out"/tr-$name/*.json > "$out/phases-$name.txt" 2>&1
  rm -rf "$out/tr-$name"
done
cat "$out"/phases-*.txt
