#!/usr/bin/env bash
# Session 3, GPU round 1: the merged batch-dot + attn-long code. GPU tests, the 0.6b batch-1 step
# (with a trace), attention at 1k/8k/32k (BLOCK_S 32 and 64), batched tiles at 4/8 (loop vs
# batched product) and 16.   bash bench/rounds/s3r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
timeout 150 python3 bench/gpu_smoke.py --steps 128 --trace-dir "$out/r/trace" \
  --backends per-op,megakernel,cuda-graph,megakernel:NSPLIT=8:NSPLIT_PAD=8,megakernel:trace=1 2>&1 | tee "$out/r/smoke.log" | grep -v "^  workers"
for f in "$out"/r/trace/*.json; do python3 bench/trace_summary.py "$f" --layers 3 | tee "$out/r/trace-summary.txt"; done
timeout 200 python3 bench/attn_bench.py 2>&1 | tee "$out/r/attn.log" | tail -12
timeout 120 python3 bench/attn_bench.py --set BLOCK_S=64 --no-step 2>&1 | tee "$out/r/attn-bs64.log" | tail -6
timeout 150 python3 bench/batch_bench.py --batches 4,8,16 --json "$out/r/batch-default.json" 2>&1 | tee "$out/r/batch-default.log" | grep -iv "^ *compil" | tail -14
MEGAKERNEL_BATCHED_FROM=2 timeout 150 python3 bench/batch_bench.py --batches 4,8 --backends megakernel --json "$out/r/batch-from2.json" 2>&1 | tee "$out/r/batch-from2.log" | tail -10
tar czf "$out/results.tgz" -C "$out" r
