#!/usr/bin/env bash
# The bench runs of the sizes/batch/context issue, one JSON + PNG each in bench/results/ (or $1).
# Run from the repository root on a GPU machine: bash bench/matrix.sh [outdir] [new_tokens]
set -u
out=${1:-bench/results}; n=${2:-256}
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name().split()[-1].lower())")
run() {  # name, then bench arguments
  name=$1; shift
  timeout 300 python3 -m megakernel.bench --random-weights --compare cuda-graph,superkernel --new-tokens "$n" \
    --output-json "$out/$gpu-$name.json" --plot "$out/$gpu-$name.png" "$@" 2>&1 | grep -A4 "^backend" | head -4
}
for size in 0.6b 1.7b 4b 8b 14b 32b; do run "$size-b1-p128" --model $size --prompt-len 128; done
for b in 4 8 16; do run "0.6b-b$b-p128" --model 0.6b --batch-size $b --prompt-len 128; done
for b in 4 8 16; do run "8b-b$b-p128" --model 8b --batch-size $b --prompt-len 128; done
for ctx in 1024 8192 32768; do run "0.6b-b1-ctx$ctx" --model 0.6b --prompt-len $ctx; done
