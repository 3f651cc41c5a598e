#!/usr/bin/env bash
# Session 4, GPU round 6: every GPU test, the recorded 0.6b batch-1 run with every peer, and the
# weights-through-L2 experiment (MEGAKERNEL_WEIGHTS_CG=1) against the default at 0.6b and 8b.
#   bash bench/rounds/s4r6.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name().split()[-1].lower())")
timeout 300 python3 -m pytest -m gpu -q 2>&1 | tee "$out/r/$gpu-gpu-tests.log" | tail -3
timeout 300 python3 -m megakernel.bench --model 0.6b --random-weights \
  --compare per-op,superkernel,cuda-graph,torch-compile,hf --prompt-len 128 --new-tokens 256 \
  --output-json "$out/r/$gpu-0.6b-b1-p128-n256.json" --plot "$out/r/$gpu-0.6b-b1-p128-n256.png" \
  > "$out/r/$gpu-0.6b-b1-p128-n256.log" 2>/dev/null
grep -A8 "^backend" "$out/r/$gpu-0.6b-b1-p128-n256.log"
for m in 0.6b 8b; do
  for wcg in 0 1; do
    MEGAKERNEL_WEIGHTS_CG=$wcg timeout 120 python3 bench/gpu_smoke.py --model $m --steps 64 --backends megakernel 2>&1 \
      | tee "$out/r/smoke-$m-wcg$wcg.log" | grep median | sed "s/^/$m wcg=$wcg /"
  done
done
tar czf "$out/results.tgz" -C "$out" r
