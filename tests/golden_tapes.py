"""Digests of the tapes (and plans) the scheduler builds for every preset, for the golden-tape test.

    python -m tests.golden_tapes            # rewrite tests/data/tapes_golden.json

Run it only where a change to the tapes is meant; ``tests/scheduler/test_tapes_golden.py``
recomputes the digests and compares them, so a refactor that changes a tape fails there.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from pathlib import Path

PATH = Path(__file__).parent / "data" / "tapes_golden.json"
PRESET_NAMES = ("0.6b", "1.7b", "4b", "8b", "14b", "32b")
WORKERS = (264, 132, 8)
BATCHES = (1, 2, 8)
SEQ_LENS = (64, 392, 4096)
MODES = ("megakernel", "superkernel")


def configurations():
    return itertools.product(PRESET_NAMES, WORKERS, BATCHES, SEQ_LENS, MODES)


def key(name, workers, batch, seq, mode) -> str:
    return f"{name} w{workers} b{batch} s{seq} {mode}"


def digest(name, workers, batch, seq, mode) -> dict:
    """sha256 of the encoded tape (words, lengths) and of what the kernel is compiled for (the plan's
    constexprs, the counters, whether rows are paired on SMs)."""
    from models.qwen3.config import PRESETS
    from scheduler.graph import build_tape, encode
    from scheduler.ops import make_plan

    plan = make_plan(PRESETS[name], batch, seq, workers)
    tape = build_tape(plan, workers, mode=mode)
    words, lengths = encode(tape)
    h = hashlib.sha256(words.numpy().tobytes())
    h.update(lengths.numpy().tobytes())
    consts = tape.plan.constexprs()
    # fields at the value that compiles what the kernel did before they existed digest as before:
    # a greedy plan (no SAMPLE stage), the weights-on-M tile fed by pointer loads, its batch padded from 8,
    # its pipeline in 80 KB
    for name, before in (("SAMPLE", 0), ("SAMPLE_CHUNK", 4096), ("SWAP_TMA", 0), ("SWAP_MIN_N", 8), ("SWAP_SMEM", 80)):
        if consts.get(name) == before:
            consts.pop(name)
    meta = json.dumps({"plan": consts, "counters": tape.num_counters,
                       "sm_mates": tape.sm_mates, "shape": list(words.shape)}, sort_keys=True)
    return {"tape": h.hexdigest(), "plan": hashlib.sha256(meta.encode()).hexdigest()}


def compute() -> dict:
    return {key(*c): digest(*c) for c in configurations()}


def main() -> int:
    PATH.parent.mkdir(parents=True, exist_ok=True)
    PATH.write_text(json.dumps(compute(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {PATH}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
