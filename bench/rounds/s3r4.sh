#!/usr/bin/env bash
# Session 3, GPU round 4: 8b batch 1 before (d1b35cf, copied to old_d1b35cf/) and after the
# attn-long/batch-dot merges, with traces.   bash bench/rounds/s3r4.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
for tree in old_d1b35cf .; do
  tag=$([ "$tree" = . ] && echo new || echo old)
  (cd "$tree" && timeout 200 python3 bench/gpu_smoke.py --model 8b --steps 64 --trace-dir "$out/r/trace-$tag" \
     --backends megakernel,cuda-graph,megakernel:trace=1) 2>&1 | grep -v "^  workers" | tee "$out/r/smoke-8b-$tag.log"
  for f in "$out"/r/trace-$tag/*.json; do python3 bench/trace_summary.py "$f" --layers 3; done 2>&1 | tee "$out/r/trace-8b-$tag.txt"
done
rm -rf "$out"/r/trace-*/
tar czf "$out/results.tgz" -C "$out" r
