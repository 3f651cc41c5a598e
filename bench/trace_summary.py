"""Summarise a megakernel trace (``python -m megakernel.bench ... --trace trace.json``).

Prints, per instruction kind, the time per worker and per instruction (waits included), and for a
few layers when each stage's first instruction started and its last one ended: the gaps between
stage ends are the dependent-step latencies the performance notes talk about. Then, per stage, where
that gap goes, from the tiles' phase stamps (``instructions.common.stamp``), in microseconds after the
previous stage's last end: when the wait returned (median over the stage's instructions and for the
one that ended last), then that last instruction's input load, math, and stores plus release.

    python3 bench/trace_summary.py trace.json [--layers 3,4]
"""

import argparse
import json
import statistics
from collections import defaultdict

STAGES = ("QKV", "ATTN", "OPROJ", "GATEUP", "DOWN")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--layers", default="3,4")
    args = ap.parse_args()
    events = json.load(open(args.trace))["traceEvents"]
    workers = len({e["tid"] for e in events})
    span = max(e["ts"] + e["dur"] for e in events)
    print(f"{workers} workers, step {span:.1f} us")
    total, count = defaultdict(float), defaultdict(int)
    for e in events:
        total[e["name"]] += e["dur"]
        count[e["name"]] += 1
    print(f"{'kind':8} {'instrs':>7} {'us/worker':>10} {'us/instr':>9}")
    for k in sorted(total, key=lambda k: -total[k]):
        print(f"{k:8} {count[k]:7d} {total[k] / workers:10.1f} {total[k] / count[k]:9.2f}")
    bounds = defaultdict(lambda: [float("inf"), 0.0])
    for e in events:
        b = bounds[(e["name"], e["args"]["layer"])]
        b[0], b[1] = min(b[0], e["ts"]), max(b[1], e["ts"] + e["dur"])
    for layer in (int(x) for x in args.layers.split(",")):
        prev = None
        for op in STAGES:
            if (op, layer) not in bounds:
                continue
            start, end = bounds[(op, layer)]
            gap = f"  +{end - prev:.1f} after the previous stage" if prev is not None else ""
            print(f"layer {layer} {op:7} first start {start:8.1f} last end {end:8.1f}{gap}")
            prev = end
        phases(events, layer)


def phases(events, layer):
    """The gap of each stage of ``layer`` split by the phase stamps (see the module docstring)."""
    prev = None
    print(f"layer {layer}, us after the previous stage's last end: median wait return over the stage; the "
          "instruction that ended last: start, wait returned, input arrived, first tile's math done "
          "(attention: ticket taken), last tile's math done, end (after its release)")
    for op in STAGES:
        evs = [e for e in events if e["name"] == op and e["args"]["layer"] == layer]
        if not evs:
            continue
        last = max(evs, key=lambda e: e["ts"] + e["dur"])
        end = last["ts"] + last["dur"]
        if prev is not None and "waited" in last["args"]:
            a = last["args"]
            rel = last["ts"] - prev
            w_med = statistics.median([e["ts"] + e["args"]["waited"] - prev for e in evs if "waited" in e["args"]])
            cols = " ".join(f"{k} {rel + a[k]:5.1f}" for k in ("waited", "input", "first", "computed") if k in a)
            print(f"  {op:7} wait(med) {w_med:5.1f} | start {rel:5.1f} {cols} end {end - prev:5.1f}"
                  f"  (worker {last['tid']}, {len(evs)} instructions)")
        prev = end


if __name__ == "__main__":
    main()
