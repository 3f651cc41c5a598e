#!/usr/bin/env bash
# Session 6, GPU round 2 (diagnostic): where the fused MLP's time goes (s6r1: gate/up stage 19.7 us
# against 6.9 + 4.5 for gate/up and down). MEGAKERNEL_FUSED_DIAG: 1 plain stores instead of the
# int64 atomics (wrong sums, the cost of the atomics), 2 down weights read contiguously (wrong
# weights, the cost of the strided column reads), 3 both, 4 a fence in every warp after its atomics
# (s6r1's traced run parted from per-op at step 1: are other warps' REDs covered by the release?).
#   bash bench/rounds/s6r2.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
for d in 0 4 1 2 3; do
  echo "=== MEGAKERNEL_FUSED_DIAG=$d"
  be=megakernel,megakernel:trace=1,megakernel:trace=1
  [ $d = 0 ] || [ $d = 4 ] && be=per-op,$be
  MEGAKERNEL_FUSED_DIAG=$d timeout 100 python3 bench/gpu_smoke.py --steps 128 --trace-dir "$out/r/trace$d" \
    --backends $be 2>&1 | tee "$out/r/smoke$d.log" | grep -v "^  workers\|regs"
  python3 bench/phase_stats.py "$out/r/trace$d/megakernel_trace1.json" 2>&1 | tee "$out/r/phases$d.txt"
done
tar czf "$out/results.tgz" -C "$out" r
