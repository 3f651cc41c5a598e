#!/usr/bin/env bash
# Session 18, GPU round 3: qkv, attn and act in the weights' dtype (bf16), laid out with x and the
# counters (s18r2's "all": 0.744-0.747 against 0.757-0.759), as built, against the previous commit
# unpacked in _main/, alternating processes: 0.6b three times, 1.7b twice, 8b once (128 steps);
# tokens against per-op's in the first of each.
#   bash bench/rounds/s18r3.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
for m in 0.6b:3:256 1.7b:2:256 8b:1:128; do
  IFS=: read model reps steps <<< "$m"
  for rep in $(seq $reps); do
    po=; [ "$rep" = 1 ] && po=per-op,
    (cd _main && timeout 240 python3 bench/gpu_smoke.py --model $model --steps $steps --max-seq-len 392 --backends $po$mk 2>&1 \
      | pick "$model-main-$rep")
    timeout 240 python3 bench/gpu_smoke.py --model $model --steps $steps --max-seq-len 392 --backends $po$mk 2>&1 \
      | pick "$model-bf16-$rep"
  done
done | tee "$out/ab.txt"
