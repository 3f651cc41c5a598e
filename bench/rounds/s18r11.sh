#!/usr/bin/env bash
# Session 18, GPU round 11: s18r10 found R_O 8 and R_DOWN 4 each ~1% faster than the plan at 0.6b
# now that act is bf16 (the plan halves R_DOWN at batch 1, NOTES 32, measured with float32 act).
# Both together at 0.6b, and R_DOWN unhalved at 1.7b and 8b; one process per model, the variants
# in turn, then again in the reverse order; tokens against per-op's in the first.
#   bash bench/rounds/s18r11.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
for m in "0.6b:256:$mk $mk:R_O=8 $mk:R_DOWN=4 $mk:R_O=8:R_DOWN=4 $mk" "1.7b:256:$mk $mk:R_DOWN=4 $mk" \
         "8b:128:$mk $mk:R_DOWN=4 $mk"; do
  IFS=: read model steps vs <<< "$m"
  vs="${m#*:*:}"
  fwd=$(echo $vs | tr ' ' ',')
  rev=$(echo $vs | tr ' ' '\n' | tac | tr '\n' ',' | sed 's/,$//')
  timeout 280 python3 bench/gpu_smoke.py --model $model --steps $steps --max-seq-len 392 --backends per-op,$fwd 2>&1 | pick "$model-fwd"
  timeout 280 python3 bench/gpu_smoke.py --model $model --steps $steps --max-seq-len 392 --backends $rev 2>&1 | pick "$model-rev"
done | tee "$out/ab.txt"
