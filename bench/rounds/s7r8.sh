#!/usr/bin/env bash
# Session 7, GPU round 8: gate/up tiles keeping two tiles' loads in flight after the wait
# (MEGAKERNEL_GU_DEEP=1, tiles of at most 8192 weights: 0.6b's 4-row tiles) against one (0),
# one process each, interleaved twice (0.6b batch 1, max_seq_len 392, 256 steps); then the
# recorded run's bench and every GPU test with GU_DEEP's default (1).
#   bash bench/rounds/s7r8.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
for pass in 1 2; do
  for v in 0 1; do
    be=megakernel,megakernel; [ $pass = 1 ] && [ $v = 0 ] && be=per-op,megakernel
    echo "=== pass $pass GU_DEEP=$v"
    MEGAKERNEL_GU_DEEP=$v timeout 100 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $be 2>&1 \
      | grep -v "^  workers\|WARNING\|Generating" | sed "s/^/[deep=$v] /"
  done
done 2>&1 | tee "$out/r/smoke.log" | grep "median\|equal\|spills"
dir="$out/r"
timeout 200 python3 -m megakernel.bench --model 0.6b --random-weights \
  --compare per-op,superkernel,cuda-graph,torch-compile,hf --prompt-len 128 --new-tokens 256 \
  --output-json "$dir/h200-0.6b-b1-p128-n256.json" --plot "$dir/h200-0.6b-b1-p128-n256.png" \
  > "$dir/h200-0.6b-b1-p128-n256.log" 2>/dev/null
grep -A8 "^backend" "$dir/h200-0.6b-b1-p128-n256.log"
timeout 250 python3 -m pytest -m gpu -q -s 2>&1 | tee "$dir/h200-gpu-tests.log" | tail -3
