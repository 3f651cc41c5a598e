#!/usr/bin/env bash
# One whole GPU round for a device lease: the GPU tests, the recorded 0.6b run with every peer,
# then the size/batch/context matrix; everything lands in DIR/r and is packed into DIR/results.tgz
# (the device tool returns at most 8 files, so fetch the tarball and unpack it into bench/results).
#   bash bench/device_round.sh "$OUT" [new_tokens_for_the_matrix]
set -u
out=${1:?output folder}; n=${2:-64}
mkdir -p "$out/r"
export PYTHONUNBUFFERED=1
bash "$(dirname "$0")/recorded_run.sh" "$out/r"
bash "$(dirname "$0")/matrix.sh" "$out/r" "$n"
tar czf "$out/results.tgz" -C "$out" r
