#!/usr/bin/env bash
# Tensor parallelism on a machine of 2 or 4 GPUs (issue #43): the GPU tests, then the recorded bench
# of 8b, 14b and 32b (random weights, bf16, prompt 128, 128 new tokens) at TP 1, 2 and 4 (as many as
# the GPUs allow), batch 1 and 8, megakernel against cuda-graph at the same TP (NCCL all-reduces).
#
#   bash bench/tp_run.sh            # tests, then every model
#   MODELS="14b" bash bench/tp_run.sh
#   SKIP_TESTS=1 bash bench/tp_run.sh
#
# Rows go to bench/results.jsonl (python -m bench.render draws the README's table from it).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
MODELS=${MODELS:-"8b 14b 32b"}
echo "GPUs: $GPUS; models: $MODELS"
if [ -z "${SKIP_TESTS:-}" ]; then
    python -m pytest -m gpu -q tests/test_gpu_tp.py || echo "GPU TP tests FAILED (see above)"
fi
for m in $MODELS; do
    for tp in 1 2 4; do
        [ "$tp" -gt "$GPUS" ] && continue
        python -m megakernel.bench --model "$m" --random-weights --tp "$tp" --batch-size 1,8 --prompt-len 128 \
            --max-new-tokens 128 --compare cuda-graph --record bench/results.jsonl \
            --output-json "bench/tp-$m-tp$tp.json" || echo "bench $m tp $tp FAILED"
    done
done
python -m bench.render --print
