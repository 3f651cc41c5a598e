#!/usr/bin/env bash
# Session 3, GPU round 5: attention's KV pipeline depth (plan KV_STAGES) at 0.6b and 8b batch 1,
# and at 32k context.   bash bench/rounds/s3r5.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
for m in 8b 0.6b; do
  timeout 200 python3 bench/gpu_smoke.py --model $m --steps 64 \
    --backends megakernel,megakernel:KV_STAGES=1,megakernel:KV_STAGES=2,megakernel:KV_STAGES=3,cuda-graph 2>&1 \
    | grep -v "^  workers" | tee "$out/r/smoke-$m.log"
done
for st in 1 2 4; do
  timeout 150 python3 bench/attn_bench.py --contexts 1024,32768 --set KV_STAGES=$st 2>&1 | tee "$out/r/attn-st$st.log" | grep "ctx\|step:"
done
tar czf "$out/results.tgz" -C "$out" r
