#!/usr/bin/env bash
# Session 13, GPU round 5: relaxed DOWN (and EMBED) signals with the checks, without them (unsafe:
# MEGAKERNEL_NO_SLOW=1, stale words used as read), and the format alone; timed, then traced (phases).
#   bash bench/rounds/s13r5.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "megakernel.*median|megakernel.*tokens equal|regs" | sed "s/^/$1 /"; }
run() { timeout 100 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends per-op,megakernel:spl=64 2>&1; }
for rep in 1 2; do
  for v in "DOWN 0" "DOWN 1" "QKV,ATTN,OPROJ,GATEUP,DOWN 1" " 0"; do
    set -- $v; [ $# -eq 1 ] && set -- "" $1
    MEGAKERNEL_RELAX=$1 MEGAKERNEL_NO_SLOW=$2 run | pick "relax=[$1] no_slow=$2"
  done
done | tee "$out/ab.txt"
trace() {   # name, then the environment
  local name=$1; shift
  env "$@" timeout 200 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends megakernel:trace=1 \
    --trace-dir "$out/tr-$name" 2>&1 | grep -E "median" | sed "s/^/$name /"
  python3 bench/phase_stats.py "$out"/tr-$name/*.json > "$out/phases-$name.txt" 2>&1
  head -6 "$out/phases-$name.txt" | sed "s/^/$name /"
  rm -rf "$out/tr-$name"
}
trace down MEGAKERNEL_RELAX=DOWN
trace format MEGAKERNEL_RELAX=
