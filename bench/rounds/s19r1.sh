#!/usr/bin/env bash
# Session 19, GPU round 1: a worker's O projection and its gate/up tiles run as one instruction, the
# first PRE gate/up tiles' weights loaded before the O projection's wait (MEGAKERNEL_PRE_GU), so
# that workers waiting through attention hold their gate/up weights when O ends. One process per
# variant (the switch is read at import), 0.6b batch 1, max_seq_len 392, 256 steps in launches of 64.
# The switch is not on main: it ran with results/s19r1/pre-gu.diff applied.
#   bash bench/rounds/s19r1.sh "$OUT" "0 1 2 3 2:1"
set -u
out=${1:?out}; vs=${2:-"0 1 2 3"}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|differ|Error|error|regs" | sed "s/^/$1 /"; }
for v in $vs; do
  IFS=: read pre skip <<< "$v"
  po=; [ "$pre" = 3 ] && po=per-op,
  MEGAKERNEL_PRE_GU=$pre MEGAKERNEL_PRE_GU_SKIP_ATTN=$([ -n "$skip" ] && echo 1 || echo 0) \
    timeout 160 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends ${po}megakernel:spl=64 \
    2>&1 | pick "pre$v"
done | tee -a "$out/ab.txt"
