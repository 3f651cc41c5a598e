#!/usr/bin/env bash
# Session 4, GPU round 5: the counter poll without acquire's L1 invalidation (MEGAKERNEL_POLL=relaxed)
# and weights through L2 only (MEGAKERNEL_WEIGHTS_CG=1), each alone and together, 0.6b b1 (and 8b),
# with a phase trace of both.   bash bench/rounds/s4r5.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
smoke() { name=$1; shift; timeout 120 python3 bench/gpu_smoke.py --steps 128 --trace-dir "$out/r/trace-$name" "$@" 2>&1 \
  | tee "$out/r/smoke-$name.log" | grep -v "^  workers\|first step\|WARNING\|^  regs"; }
smoke base --backends megakernel,cuda-graph,megakernel:NSPLIT=8
MEGAKERNEL_POLL=relaxed smoke relaxed --backends megakernel
MEGAKERNEL_WEIGHTS_CG=1 smoke wcg --backends megakernel
MEGAKERNEL_POLL=relaxed MEGAKERNEL_WEIGHTS_CG=1 smoke both --backends megakernel,megakernel:NSPLIT=8,megakernel:trace=1
for f in "$out"/r/trace-*/*.json; do echo "== $f"; python3 bench/phase_stats.py "$f"; done 2>&1 | tee "$out/r/phases.txt"
timeout 150 python3 bench/gpu_smoke.py --model 8b --steps 32 --backends megakernel 2>&1 | tee "$out/r/smoke-8b-base.log" | grep median
MEGAKERNEL_POLL=relaxed MEGAKERNEL_WEIGHTS_CG=1 timeout 150 python3 bench/gpu_smoke.py --model 8b --steps 32 \
  --backends megakernel 2>&1 | tee "$out/r/smoke-8b-both.log" | grep "median\|equal"
tar czf "$out/results.tgz" -C "$out" r
