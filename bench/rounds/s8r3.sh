#!/usr/bin/env bash
# Session 8, GPU round 3: what of session 4/7's all-weights-through-L2 gain (0.6b -1.3%, 8b +2.5%)
# comes from the later tiles' loads (MEGAKERNEL_NEXT_CG=1: only the loads issued after the wait go
# .cg) and what from dropping evict_first (MEGAKERNEL_NO_EVICT_FIRST=1), each in its own process
# (read at import), interleaved twice; 8b once each. Batch 1, max_seq_len 392.
#   bash bench/rounds/s8r3.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
run() {  # label, env, model, steps
  echo "== $1 $3"
  env $2 timeout 120 python3 bench/gpu_smoke.py --model "$3" --steps "$4" --max-seq-len 392 --backends megakernel 2>&1 \
    | grep "median\|spills\|Error\|error" | sed "s/^/$1 $3 /"
}
for i in 1 2; do
  run main X=0 0.6b 256; run next-cg MEGAKERNEL_NEXT_CG=1 0.6b 256; run no-evict MEGAKERNEL_NO_EVICT_FIRST=1 0.6b 256
  run all-cg MEGAKERNEL_WEIGHTS_CG=1 0.6b 256
done 2>&1 | tee "$out/r/smoke06.log"
for v in "main X=0" "next-cg MEGAKERNEL_NEXT_CG=1" "no-evict MEGAKERNEL_NO_EVICT_FIRST=1"; do
  run $v 8b 128
done 2>&1 | tee "$out/r/smoke8b.log"
