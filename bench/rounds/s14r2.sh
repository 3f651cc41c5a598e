#!/usr/bin/env bash
# Session 14, GPU round 2: attention's combining split fixed in advance (the last active split,
# which holds the new position: it polls the others' count instead of fencing its own partial and
# taking an acq_rel ticket) in the repository root, against main unpacked in _main/. One process
# each, interleaved, twice; cuda-graph (its attention kernel takes the same path) once each. Then
# traced steps for where the time goes, and the step's edges at 64 steps per launch and at one.
#   bash bench/rounds/s14r2.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs" | sed "s/^/$1 /"; }
run() { timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends "$1" 2>&1; }
for rep in 1 2; do
  run per-op,megakernel:spl=64 | pick new
  (cd _main && run per-op,megakernel:spl=64 | pick main)
done | tee "$out/ab.txt"
{ run cuda-graph | pick new; (cd _main && run cuda-graph | pick main); } | tee -a "$out/ab.txt"
trace() {   # name, steps per launch
  timeout 150 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends megakernel:trace=1:spl=$2 \
    --trace-dir "$out/tr-$1" 2>&1 | pick "trace-$1"
  python3 bench/phase_stats.py "$out"/tr-$1/*.json > "$out/phases-$1.txt" 2>&1
  python3 bench/tail_stats.py "$out"/tr-$1/*.json 8 > "$out/tails-$1.txt" 2>&1
  python3 bench/step_edges.py "$out"/tr-$1/*.json > "$out/edges-$1.txt" 2>&1
  cat "$out/phases-$1.txt" "$out/edges-$1.txt" | sed "s/^/$1 /"
}
trace new 64
trace new1 1
cp bench/tail_stats.py bench/step_edges.py _main/bench/
(cd _main && trace main1 1)
gzip -c "$out"/tr-new/*.json > "$out/trace-new.json.gz"; rm -rf "$out"/tr-*
