#!/usr/bin/env bash
# One whole GPU round for a device lease: the GPU tests, the recorded 0.6b run with every peer,
# then the size/batch/context matrix; everything lands in DIR/r and is packed into DIR/results.tgz
# (the device tool returns at most 8 files, so fetch the tarball and unpack it into bench/results).
#   bash bench/device_round.sh "$OUT" [new_tokens_for_the_matrix]
set -u
out=${1:?output folder}; n=${2:-64}
mkdir -p "$out/r"
export PYTHONUNBUFFERED=1
timeout 300 python3 -m pytest -m gpu -q -s 2>&1 | tee "$out/r/gpu-tests.log" | tail -5
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name().split()[-1].lower())")
timeout 300 python3 -m megakernel.bench --model 0.6b --random-weights \
  --compare per-op,superkernel,cuda-graph,torch-compile,hf --prompt-len 128 --new-tokens 256 \
  --output-json "$out/r/$gpu-0.6b-b1-p128-n256.json" --plot "$out/r/$gpu-0.6b-b1-p128-n256.png" \
  > "$out/r/$gpu-0.6b-b1-p128-n256.log" 2>/dev/null
grep -A7 "^backend" "$out/r/$gpu-0.6b-b1-p128-n256.log"
bash "$(dirname "$0")/matrix.sh" "$out/r" "$n"
tar czf "$out/results.tgz" -C "$out" r
