#!/usr/bin/env bash
# Session 19, GPU round 8: the tiles after a worker's first through a software pipeline in shared
# memory (plan fields LM_STAGES for the LM head, W_STAGES for QKV/O/gate-up/down; 1 = today's
# next-tile-in-registers loop). 0.6b (one process, forward then reverse), then 14b with 8192-wide
# chunks (s19r6: bk=8192 10.297 against 10.45 ms, cuda-graph 9.90). The two plan fields are not on
# main: it ran with results/s19r8/stages.diff applied.
#   bash bench/rounds/s19r8.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|Error|error|regs" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
vs="$mk $mk:LM_STAGES=2 $mk:LM_STAGES=3 $mk:LM_STAGES=4 $mk:W_STAGES=3 $mk:W_STAGES=3:LM_STAGES=3 $mk"
fwd=$(echo $vs | tr ' ' ',')
rev=$(echo $vs | tr ' ' '\n' | tac | tr '\n' ',' | sed 's/,$//')
timeout 200 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends per-op,$fwd 2>&1 | pick fwd | tee "$out/ab.txt"
timeout 200 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $rev 2>&1 | pick rev | tee -a "$out/ab.txt"
mk=megakernel:spl=16:bk=8192
timeout 280 python3 bench/gpu_smoke.py --model 14b --steps 32 --max-seq-len 392 --backends \
  cuda-graph,$mk,$mk:LM_STAGES=3,$mk:W_STAGES=3:LM_STAGES=3,$mk:W_STAGES=4:LM_STAGES=4,$mk 2>&1 | pick 14b | tee -a "$out/ab.txt"
