#!/usr/bin/env bash
# Session 3, GPU round 6a (after KV_STAGES 3): round 3a again, with 0.6b among the sizes.
#   bash bench/rounds/s3r6a.sh "$OUT"
SIZES="0.6b 1.7b 4b 8b" exec bash "$(dirname "$0")/s3r3a.sh" "$@"
