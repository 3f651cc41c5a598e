#!/usr/bin/env bash
# Session 3, GPU round 2: LL mode (activations carry their versions) against counters, 0.6b b1
# with a trace; the GPU tests of the megakernel; batches.   bash bench/rounds/s3r2.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
timeout 200 python3 bench/gpu_smoke.py --steps 128 --trace-dir "$out/r/trace" \
  --backends per-op,megakernel,megakernel:ll=0,cuda-graph,megakernel:NSPLIT=8:NSPLIT_PAD=8,megakernel:ll=0:NSPLIT=8:NSPLIT_PAD=8,megakernel:trace=1,megakernel:ll=0:trace=1 2>&1 | tee "$out/r/smoke.log" | grep -v "^  workers"
for f in "$out"/r/trace/*.json; do echo "== $f"; python3 bench/trace_summary.py "$f" --layers 3; done 2>&1 | tee "$out/r/trace-summary.txt"
timeout 150 python3 bench/batch_bench.py --batches 4,8,16 --json "$out/r/batch.json" 2>&1 | tee "$out/r/batch.log" | tail -9
timeout 200 python3 -m pytest -m gpu -q -x tests/test_gpu_megakernel.py 2>&1 | tee "$out/r/gpu-tests.log" | tail -5
rm -rf "$out/r/trace"
tar czf "$out/results.tgz" -C "$out" r
