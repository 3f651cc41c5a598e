#!/usr/bin/env bash
# The complete recorded sweep of issue 53, in parts that each fit one 10-minute device call. Run
# every part on an H100 and again on an H200; rows go to bench/results.jsonl (each with its
# command, commit and device), and `python -m bench.render` draws the README and docs/results.md.
#
#   bash bench/sweep.sh --list            # the parts, what each runs, the GPUs it needs
#   bash bench/sweep.sh --print PART      # its commands, without running them
#   bash bench/sweep.sh PART [PART...]    # run them (exit status 1 if any command failed)
#   bash bench/sweep.sh --gpus N PART...  # one-GPU parts side by side on N GPUs, one a GPU, each
#                                         # GPU taking the next part when its last one ends
#   python -m bench.coverage              # per GPU type, the parts whose rows the table still lacks
#
# A part's time is a guess from earlier runs (compiled peers take 30-75 s to compile per setting; on
# an H100 one call fit 0.6b at batch 1, 4 and 8 with every peer, or 8b at two batches, so run one
# part a call); a bench cut short keeps the rows that finished (marked partial), so a part that
# overruns loses only its last setting. RECORD=path
# records elsewhere. The peers share the model's weights (transformers' holds views of them), so
# 32b's 64 GB is on the GPU once; a backend that does not fit reports its failure in its row and
# the others run.
set -u
RECORD=${RECORD:-bench/results.jsonl}
BENCH="python -m megakernel.bench --random-weights --prompt-len 128 -n 128 --record $RECORD"
PEERS="--compare cuda-graph,torch-compile,hf-compile"
PREFILL="--prefill-only --prompt-len 128,512,1024,4096,16384,32768"

# name|GPUs|what
PARTS=(
  "sizes-small|1|0.6b, 1.7b and 4b at batch 1, beside cuda-graph"
  "sizes-8b-14b|1|8b and 14b at batch 1, beside cuda-graph"
  "sizes-32b|1|32b at batch 1, beside cuda-graph"
  "decode-0.6b-a|1|0.6b at batch 1, 4 and 8 beside cuda-graph, torch-compile and hf-compile"
  "decode-0.6b-b|1|0.6b at batch 16 and 32 beside the same peers"
  "decode-0.6b-c|1|0.6b at batch 64 beside the same peers"
  "decode-1.7b|1|1.7b at batch 1, 8, 16, 32 and 64 beside cuda-graph (issue 50's small-model ratios)"
  "decode-8b-a|1|8b at batch 1 and 4 beside the same peers"
  "decode-8b-b|1|8b at batch 8 and 16 beside the same peers"
  "decode-8b-c|1|8b at batch 32 and 64 beside the same peers"
  "decode-32b-a|1|32b at batch 1 and 4 beside the same peers"
  "decode-32b-b|1|32b at batch 8 and 16 beside the same peers"
  "decode-32b-c|1|32b at batch 32 and 64 beside the same peers"
  "prefill-0.6b|1|0.6b prefill at 128 to 32k tokens, beside transformers"
  "prefill-8b|1|8b prefill at 128 to 32k tokens, beside transformers"
  "prefill-32b|1|32b prefill at 128 to 32k tokens, beside transformers"
  "fp8|1|0.6b and 8b with FP8 projections, w8a8 (the default), at batch 1, 8 and 16, beside cuda-graph"
  "fp8-weight-only|1|0.6b and 8b with FP8 projections, weight-only (--fp8-activations none), at batch 1, 8 and 16"
  "fp8-32b|1|32b with FP8 projections, w8a8 and weight-only, at batch 1"
  "tp-8b|4|8b at TP 1, 2 and 4, batch 1 and 8, beside cuda-graph at the same TP"
  "tp-14b|4|14b at TP 1, 2 and 4, batch 1 and 8, beside cuda-graph at the same TP"
  "tp-32b|4|32b at TP 1, 2 and 4, batch 1 and 8, beside cuda-graph at the same TP"
  "tune-0.6b|1|python -m megakernel.tune for 0.6b (batch 1 and 8), then rules against tuned"
  "tune-8b|1|python -m megakernel.tune for 8b (batch 1 and 8), then rules against tuned"
  "tune-8b-w8a8|1|python -m megakernel.tune for 8b with FP8 w8a8 projections (batch 1 and 8), then rules against tuned"
  "serve-0.6b|1|the server under load (megakernel.loadtest --serve): 0.6b at 1, 8, 32 and 64 clients"
  "serve-0.6b-eager|1|the same with --prefill-graphs off (the eager prefill)"
  "serve-8b|1|the server under load: 8b at 1, 8, 32 and 64 clients"
)

commands() {    # the commands of part $1, one a line
    case "$1" in
    sizes-small)   for m in 0.6b 1.7b 4b; do echo "$BENCH -m $m --batch-size 1 --compare cuda-graph"; done ;;
    sizes-8b-14b)  for m in 8b 14b; do echo "$BENCH -m $m --batch-size 1 --compare cuda-graph"; done ;;
    sizes-32b)     echo "$BENCH -m 32b --batch-size 1 --compare cuda-graph" ;;
    decode-0.6b-a) echo "$BENCH -m 0.6b --batch-size 1,4,8 $PEERS" ;;
    decode-0.6b-b) echo "$BENCH -m 0.6b --batch-size 16,32 $PEERS" ;;
    decode-0.6b-c) echo "$BENCH -m 0.6b --batch-size 64 $PEERS" ;;
    decode-1.7b)   echo "$BENCH -m 1.7b --batch-size 1,8,16,32,64 --compare cuda-graph" ;;
    decode-8b-a)   echo "$BENCH -m 8b --batch-size 1,4 $PEERS" ;;
    decode-8b-b)   echo "$BENCH -m 8b --batch-size 8,16 $PEERS" ;;
    decode-8b-c)   echo "$BENCH -m 8b --batch-size 32,64 $PEERS" ;;
    decode-32b-a)  echo "$BENCH -m 32b --batch-size 1,4 $PEERS" ;;
    decode-32b-b)  echo "$BENCH -m 32b --batch-size 8,16 $PEERS" ;;
    decode-32b-c)  echo "$BENCH -m 32b --batch-size 32,64 $PEERS" ;;
    prefill-*)     echo "python -m megakernel.bench --random-weights -m ${1#prefill-} $PREFILL --record $RECORD" ;;
    fp8)           for m in 0.6b 8b; do
                       echo "$BENCH -m $m --quantize fp8 --batch-size 1,8,16 --compare cuda-graph"; done ;;
    fp8-weight-only) for m in 0.6b 8b; do
                       echo "$BENCH -m $m --quantize fp8 --fp8-activations none --batch-size 1,8,16 --compare megakernel"; done ;;
    fp8-32b)       for a in dynamic none; do
                       echo "$BENCH -m 32b --quantize fp8 --fp8-activations $a --batch-size 1 --compare megakernel"; done ;;
    tp-*)          for tp in 1 2 4; do
                       echo "$BENCH -m ${1#tp-} --tp $tp --batch-size 1,8 --compare cuda-graph"; done ;;
    tune-*-w8a8)   local m=${1#tune-}; m=${m%-w8a8}
                   echo "python -m megakernel.tune -m $m --random-weights --quantize fp8 --batch-size 1,8 --max-seq-len 264 --budget-s 300"
                   echo "$BENCH -m $m --quantize fp8 --batch-size 1,8 --plan rules,tuned --compare cuda-graph" ;;
    tune-*)        # the bench's max_seq_len is 128 + 128 + 8 = 264: tune that bucket
                   echo "python -m megakernel.tune -m ${1#tune-} --random-weights --batch-size 1,8 --max-seq-len 264 --budget-s 300"
                   echo "$BENCH -m ${1#tune-} --batch-size 1,8 --plan rules,tuned --compare cuda-graph" ;;
    serve-*)       local m=${1#serve-} extra=""
                   [ "${m%-eager}" != "$m" ] && m=${m%-eager} && extra=" --prefill-graphs off"
                   echo "python -m megakernel.loadtest --serve \"--model $m --random-weights$extra\" --concurrency 1,8,32,64 --duration 20 --max-tokens 128 --record $RECORD" ;;
    *)             return 1 ;;
    esac
}


usage() { echo "usage: bash bench/sweep.sh --list | --print PART | [--gpus N] PART [PART...]" >&2; exit 2; }

part_gpus() { local p; for p in "${PARTS[@]}"; do [ "${p%%|*}" = "$1" ] && { IFS='|' read -r _ g _ <<<"$p"; echo "$g"; }; done; }
known() { [ -n "$(part_gpus "$1")" ]; }

[ $# -ge 1 ] || usage
gpus=1
case "$1" in
--list)
    printf '%-18s %-5s %s\n' part GPUs "what it runs"
    for p in "${PARTS[@]}"; do IFS='|' read -r name gpus what <<<"$p"; printf '%-18s %-5s %s\n' "$name" "$gpus" "$what"; done
    exit 0 ;;
--print)
    [ $# -eq 2 ] || usage
    known "$2" || { echo "error: no part '$2' (bash bench/sweep.sh --list names them)" >&2; exit 2; }
    commands "$2"; exit 0 ;;
--gpus)
    [ $# -ge 3 ] && [[ "$2" =~ ^[1-9][0-9]*$ ]] || usage
    gpus=$2; shift 2 ;;
-*) usage ;;
esac
for part in "$@"; do     # every name checked before anything runs
    known "$part" || { echo "error: no part '$part' (bash bench/sweep.sh --list names them)" >&2; exit 2; }
    if [ "$gpus" -gt 1 ] && [ "$(part_gpus "$part")" != 1 ]; then
        echo "error: part '$part' needs $(part_gpus "$part") GPUs; --gpus runs one-GPU parts side by side (run it alone)" >&2
        exit 2
    fi
done
cd "$(dirname "$0")/.." || exit 2
# multi-GPU parts: NVLink multicast off, as bench/tp_run.sh runs them
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

run_part() {    # part $1, its rows recorded in $2
    local cmd failed=0
    while IFS= read -r cmd; do
        cmd=${cmd//"--record $RECORD"/"--record $2"}
        echo "+ $cmd" >&2
        eval "$cmd" || { echo "FAILED ($?): $cmd" >&2; failed=1; }     # eval: --serve's quoted settings
        [ "${stop:-0}" = 1 ] && break       # interrupted (a lane's trap): no further command
    done < <(commands "$1")
    return $failed
}

if [ "$gpus" -eq 1 ]; then
    failed=0
    for part in "$@"; do run_part "$part" "$RECORD" || failed=1; done
    exit $failed
fi

# Side by side: each GPU's parts record into RECORD.gpuN, moved into RECORD as each part ends (one
# lane at a time: a bench cut short rewrites its own file to mark its rows partial, which must not
# race another's appends). On SIGINT or SIGTERM (Ctrl-C, or `timeout -s INT` around a device call)
# the benches keep their finished rows; each lane moves them and takes no further part.
parts=("$@")
queue=$(mktemp -d)
echo 0 >"$queue/next"
for ((g = 0; g < gpus; g++)); do
    (
        stop=0
        trap 'stop=1' INT TERM
        lane_record="$RECORD.gpu$g" failed=0
        while [ $stop -eq 0 ]; do
            i=$(flock "$queue/next" sh -c 'i=$(cat "$1"); echo $((i + 1)) >"$1"; echo "$i"' _ "$queue/next")
            [ "$i" -lt ${#parts[@]} ] || break
            echo "== part ${parts[$i]} on GPU $g" >&2
            CUDA_VISIBLE_DEVICES=$g run_part "${parts[$i]}" "$lane_record" || failed=1
            if [ -s "$lane_record" ]; then
                flock "$queue/next" sh -c 'cat "$1" >>"$2" && rm "$1"' _ "$lane_record" "$RECORD" || failed=1
            fi
        done
        echo $failed >"$queue/failed.$g"
    ) 2>&1 | (trap '' INT TERM; exec sed -u "s/^/[gpu $g] /") &
done
wait
failed=0
for ((g = 0; g < gpus; g++)); do [ "$(cat "$queue/failed.$g" 2>/dev/null)" = 0 ] || failed=1; done
rm -rf "$queue"
exit $failed
