#!/usr/bin/env bash
# The bench runs of the sizes/batch/context issue, one JSON + PNG each in bench/results/ (or $1).
# Run from the repository root on a GPU machine: bash bench/matrix.sh [outdir] [new_tokens] [parts]
# parts (default all): any of sizes, batches, contexts; SIZES="0.6b 8b" picks the sizes run, and
# BATCH_TOKENS (default: new_tokens) the tokens of the batch and context runs.
set -u
out=${1:-bench/results}; n=${2:-256}; parts=${3:-sizes,batches,contexts}
nb=${BATCH_TOKENS:-$n}
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name().split()[-1].lower())")
run() {  # name, tokens, then bench arguments
  name=$1; tok=$2; shift 2
  timeout 300 python3 -m megakernel.bench --random-weights --compare cuda-graph,superkernel --new-tokens "$tok" \
    --output-json "$out/$gpu-$name.json" --plot "$out/$gpu-$name.png" "$@" 2>&1 | grep -A4 "^backend" | head -4
}
if [[ $parts == *sizes* ]]; then
  for size in ${SIZES:-0.6b 1.7b 4b 8b 14b 32b}; do run "$size-b1-p128" "$n" --model $size --prompt-len 128; done
fi
if [[ $parts == *batches* ]]; then
  for b in 4 8 16; do run "0.6b-b$b-p128" "$nb" --model 0.6b --batch-size $b --prompt-len 128; done
  for b in 4 8 16; do run "8b-b$b-p128" "$nb" --model 8b --batch-size $b --prompt-len 128; done
fi
if [[ $parts == *contexts* ]]; then
  for ctx in 1024 8192 32768; do run "0.6b-b1-ctx$ctx" "$nb" --model 0.6b --prompt-len $ctx; done
fi
