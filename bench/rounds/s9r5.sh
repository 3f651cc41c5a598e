#!/usr/bin/env bash
# Session 9, GPU round 5: the one-split attention path (no ticket, no combine) where make_plan
# already takes one split: batch 32 at 264 workers (264 // (32 x 8 kv heads) = 1). The code before
# it against after, twice each, in two trees. The device has no git: before the run, write the
# previous commit's two files beside this script (they are not kept in the repository):
#   git show a5578ae:instructions/attention.py > bench/rounds/s9r5_attention_head.py
#   git show a5578ae:megakernel/backends.py > bench/rounds/s9r5_backends_head.py
#   bash bench/rounds/s9r5.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
old=/tmp/s9r5-old; rm -rf "$old"; mkdir -p "$old"
cp -r megakernel instructions scheduler models bench "$old"/
cp bench/rounds/s9r5_attention_head.py "$old/instructions/attention.py"
cp bench/rounds/s9r5_backends_head.py "$old/megakernel/backends.py"
run() {  # tree tag
  (cd "$1" && timeout 200 python3 -m megakernel.bench --model 0.6b --random-weights --batch-size 32 \
     --prompt-len 128 --new-tokens 64 --max-seq-len 200 --compare cuda-graph --output-json "$out/b32-$2.json" 2>&1 \
     | grep -E "^(megakernel|cuda-graph|bytes)" )
}
for i in 1 2; do
  echo "== before ($i)"; run "$old" "before$i"
  echo "== after ($i)"; run "$PWD" "after$i"
done 2>&1 | tee "$out/b32.txt"
