#!/usr/bin/env bash
# Session 14, GPU round 1 (main + the trace's SM slot): a traced step with each worker's SM, for
# bench/tail_stats.py (which workers end each stage last, and why); then tile sizes at the wait
# (R_QKV 8, R_DOWN 1) and all weights through L2 (MEGAKERNEL_WEIGHTS_CG=1) on this GPU, one
# process per cache policy, interleaved, twice.
#   bash bench/rounds/s14r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs" | sed "s/^/$1 /"; }
[ "${TRACE:-1}" = 1 ] && { timeout 200 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends megakernel:trace=1 \
  --trace-dir "$out/tr" 2>&1 | pick trace
python3 bench/phase_stats.py "$out"/tr/*.json > "$out/phases.txt" 2>&1
python3 bench/tail_stats.py "$out"/tr/*.json 8 > "$out/tails.txt" 2>&1
gzip -c "$out"/tr/*.json > "$out/trace.json.gz"; rm -rf "$out/tr"
cat "$out/phases.txt" "$out/tails.txt"; }
mk=megakernel:spl=64
for rep in $(seq ${REPS:-2}); do
  timeout 200 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
    --backends per-op,$mk,$mk:R_QKV=8,$mk:R_DOWN=1,$mk:R_QKV=8:R_DOWN=1 2>&1 | pick default
  MEGAKERNEL_WEIGHTS_CG=1 timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
    --backends per-op,$mk,$mk:R_QKV=8 2>&1 | pick cg
done | tee "$out/ab.txt"
