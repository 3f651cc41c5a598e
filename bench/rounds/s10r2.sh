#!/usr/bin/env bash
# Session 10, GPU round 2: why the O projection's input took 3.4 us (0.64 before) with the summed
# attention (s10r1). One process per variant (MEGAKERNEL_DIAG is read at import), traced:
# f32 = float32 sums and atomics; store = plain stores instead of atomics (wrong sums); nodiv = O
# does not divide (wrong); noref = the reference from the new key only. Then untraced timings.
#   bash bench/rounds/s10r2.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
for d in none f32 store nodiv noref store,nodiv; do
  MEGAKERNEL_DIAG=$d timeout 100 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --trace-dir "$out/$d" \
    --backends megakernel,megakernel:trace=1 2>&1 | grep "median" | sed "s/^/$d /"
  python3 bench/phase_stats.py "$out/$d/megakernel_trace1.json" | grep -E "^(ATTN|OPROJ)" | sed "s/^/$d /"
done 2>&1 | tee "$out/diag.txt"
