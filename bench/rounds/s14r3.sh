#!/usr/bin/env bash
# Session 14, GPU round 3: the new token's key and value put into their row of the first KV block
# (one block product attends to them) in the repository root, against main unpacked in _main/.
# One process each, interleaved, twice; then a traced step of each, kept for per-tile reading.
#   bash bench/rounds/s14r3.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs" | sed "s/^/$1 /"; }
run() { timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends "$1" 2>&1; }
for rep in 1 2; do
  run per-op,megakernel:spl=64 | pick new
  (cd _main && run per-op,megakernel:spl=64 | pick main)
done | tee "$out/ab.txt"
trace() {   # name
  timeout 150 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends megakernel:trace=1:spl=64 \
    --trace-dir "$out/tr-$1" 2>&1 | pick "trace-$1"
  python3 bench/phase_stats.py "$out"/tr-$1/*.json > "$out/phases-$1.txt" 2>&1
  cat "$out/phases-$1.txt" | sed "s/^/$1 /"
  gzip -c "$out"/tr-$1/*.json > "$out/trace-$1.json.gz"; rm -rf "$out/tr-$1"
}
trace new
(cd _main && trace main)
