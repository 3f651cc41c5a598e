#!/usr/bin/env bash
# Session 23, GPU round 5 (H100, 0.6b): make_plan's new rule for short layers at batch 1 (every
# worker an attention split, the O projection on half the workers) at other contexts than 392:
# max_seq_len 64 (prompt 16; before: NSPLIT 2, R_O 4, no ATTN_NEW) and 4096 (prompt 128; before:
# R_O 4), each against the plan before, alternating in one process; and the rule's 392 once more.
#   bash bench/rounds/s23r5.sh "$OUT/s23r5"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
run() {   # label, max_seq_len, prompt, steps, steps a launch, old-plan overrides[, another variant]
  local b=megakernel:spl=$5
  timeout 150 python3 bench/gpu_smoke.py --model 0.6b --steps $4 --prompt-len $3 --max-seq-len $2 \
    --backends "per-op,$b,$b:$6,$b,$b:$6${7:+,$b:$7}" 2>&1 | grep -E "median|regs|equal|rror|workers" \
    | sed "s/^/$1 /" | tee -a "$out/ab.txt"
}
run s64 64 16 40 8 NSPLIT=2:R_O=4:ATTN_NEW=0 NSPLIT=2:ATTN_NEW=0
run s4096 4096 128 256 64 R_O=4
run s392 392 128 256 64 NSPLIT=16:R_O=4
