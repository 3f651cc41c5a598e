#!/usr/bin/env bash
# The GPU tests and the recorded 0.6b batch-1 run with every peer, into DIR (the first part of
# every whole GPU round: bench/device_round.sh, bench/rounds/s3r3a.sh, s4r6.sh).
#   bash bench/recorded_run.sh DIR
set -u
dir=${1:?output folder}; mkdir -p "$dir"
export PYTHONUNBUFFERED=1
# the model in the device's name (H200, H100, ...), for file names: "NVIDIA H100 80GB HBM3" -> h100
gpu=$(python3 -c "import re, torch; n = torch.cuda.get_device_name(); m = re.search(r'\b[A-Z]+\d{2,4}\b', n); print((m.group(0) if m else n.split()[-1]).lower())")
# -s: the tests print their prompt seeds (PROMPT_SEED=N repeats one)
timeout 300 python3 -m pytest -m gpu -q -s 2>&1 | tee "$dir/$gpu-gpu-tests.log" | tail -4
timeout 300 python3 -m megakernel.bench --model 0.6b --random-weights \
  --compare per-op,superkernel,cuda-graph,torch-compile,hf --prompt-len 128 --new-tokens 256 \
  --output-json "$dir/$gpu-0.6b-b1-p128-n256.json" --plot "$dir/$gpu-0.6b-b1-p128-n256.png" \
  > "$dir/$gpu-0.6b-b1-p128-n256.log" 2>/dev/null
grep -A8 "^backend" "$dir/$gpu-0.6b-b1-p128-n256.log"
