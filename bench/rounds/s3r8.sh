#!/usr/bin/env bash
# Session 3, GPU round 8: 8b at batch 4 and 8 after the plan's BATCHED rule (loop over the
# sequences where workers have many tiles), recorded as the matrix does.   bash bench/rounds/s3r8.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name().split()[-1].lower())")
for b in 4 8; do
  timeout 200 python3 -m megakernel.bench --random-weights --compare cuda-graph,superkernel --new-tokens 64 \
    --output-json "$out/r/$gpu-8b-b$b-p128.json" --plot "$out/r/$gpu-8b-b$b-p128.png" --model 8b --batch-size $b \
    --prompt-len 128 2>&1 | grep -A4 "^backend" | head -4
done
tar czf "$out/results.tgz" -C "$out" r
