#!/usr/bin/env bash
# Session 3, GPU round 3a: every GPU test, the recorded 0.6b batch-1 run with every peer, the
# sizes in SIZES (default 1.7b 4b 8b) at batch 1 (256 tokens).   bash bench/rounds/s3r3a.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name().split()[-1].lower())")
timeout 300 python3 -m pytest -m gpu -q 2>&1 | tee "$out/r/$gpu-gpu-tests.log" | tail -4
timeout 300 python3 -m megakernel.bench --model 0.6b --random-weights \
  --compare per-op,superkernel,cuda-graph,torch-compile,hf --prompt-len 128 --new-tokens 256 \
  --output-json "$out/r/$gpu-0.6b-b1-p128-n256.json" --plot "$out/r/$gpu-0.6b-b1-p128-n256.png" \
  > "$out/r/$gpu-0.6b-b1-p128-n256.log" 2>/dev/null
grep -A8 "^backend" "$out/r/$gpu-0.6b-b1-p128-n256.log"
SIZES="${SIZES:-1.7b 4b 8b}" bash bench/matrix.sh "$out/r" 256 sizes
tar czf "$out/results.tgz" -C "$out" r
