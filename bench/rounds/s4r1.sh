#!/usr/bin/env bash
# Session 4, GPU round 1: where a stage's gap goes (phase stamps inside the tiles, bench/trace_summary.py),
# and the poll by every thread's ld.acquire (MEGAKERNEL_POLL=ld) against one thread's and a CTA
# broadcast, 0.6b b1.   bash bench/rounds/s4r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
timeout 170 python3 bench/gpu_smoke.py --steps 128 --trace-dir "$out/r/trace-atom" \
  --backends megakernel,cuda-graph,megakernel:NSPLIT=8,megakernel:trace=1,megakernel:NSPLIT=8:trace=1 2>&1 \
  | tee "$out/r/smoke-atom.log" | grep -v "^  workers"
MEGAKERNEL_POLL=ld timeout 150 python3 bench/gpu_smoke.py --steps 128 --trace-dir "$out/r/trace-ld" \
  --backends megakernel,megakernel:NSPLIT=8,megakernel:trace=1,per-op 2>&1 \
  | tee "$out/r/smoke-ld.log" | grep -v "^  workers"
for f in "$out"/r/trace-*/*.json; do echo "== $f"; python3 bench/trace_summary.py "$f" --layers 3,4; done 2>&1 \
  | tee "$out/r/trace-summary.txt"
tar czf "$out/results.tgz" -C "$out" r
