#!/usr/bin/env bash
# Session 16, GPU round 1: the LM head's last fifth as a pool of tiles claimed at run time
# (Plan.LM_POOL). Traced steps with and without the pool (the LM head's ends: step_edges), then
# 0.6b interleaved in one process: the plan's pool (a fifth), none (LM_POOL=0: main's LM head),
# a tenth and a third; twice. Then main's tree (unpacked in _main) beside this one, and 8b.
#   bash bench/rounds/s16r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
if [ "${TRACE:-1}" = 1 ]; then
  timeout 200 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 \
    --backends per-op,$mk:trace=1,$mk:trace=1:LM_POOL=0 --trace-dir "$out/tr" 2>&1 | pick trace
  for f in "$out"/tr/*.json; do
    echo "== $(basename "$f")"; python3 bench/step_edges.py "$f" | grep -E "DOWN\[27\]|LMHEAD|ARGMAX"
    python3 bench/phase_stats.py "$f"
  done > "$out/edges.txt" 2>&1
  rm -rf "$out/tr"; cat "$out/edges.txt"
fi
{
for rep in $(seq ${REPS:-2}); do
  timeout 240 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
    --backends per-op,$mk,$mk:LM_POOL=0,$mk:LM_POOL=949,$mk:LM_POOL=3165 2>&1 | pick "0.6b-$rep"
done
[ "${MAIN:-1}" = 1 ] && [ -d _main ] && (cd _main && timeout 200 python3 bench/gpu_smoke.py --steps 256 \
  --max-seq-len 392 --backends per-op,$mk 2>&1 | pick main)
[ "${B8:-1}" = 1 ] && timeout 300 python3 bench/gpu_smoke.py --model 8b --steps 128 --max-seq-len 392 \
  --backends per-op,$mk,$mk:LM_POOL=0 2>&1 | pick 8b
} | tee "$out/ab.txt"
