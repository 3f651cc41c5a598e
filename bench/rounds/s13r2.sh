#!/usr/bin/env bash
# Session 13, GPU round 2: where the tagged words' time goes. A traced megakernel step (phases) of
# tag8 with relaxed signals, tag8 with every signal released, and main (_main/).
#   bash bench/rounds/s13r2.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
trace() {   # name, then the environment
  local name=$1; shift
  env "$@" timeout 200 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends megakernel:trace=1 \
    --trace-dir "$out/tr-$name" 2>&1 | grep -E "median" | sed "s/^/$name /"
  python3 bench/phase_stats.py "$out"/tr-$name/*.json > "$out/phases-$name.txt" 2>&1
  head -12 "$out/phases-$name.txt" | sed "s/^/$name /"
  rm -rf "$out/tr-$name"
}
trace tag8 MEGAKERNEL_TAG_RELEASE=0
trace tag8-release MEGAKERNEL_TAG_RELEASE=1
(cd _main && trace main X=1)
