"""Where each stage's time goes, from a phase trace (``--trace`` / ``gpu_smoke.py ...:trace=1``).

For each layer stage, over layers 2-25 of the step, the median and 90th percentile (``med/p90``,
microseconds) of: ``gap`` (the stage's last end after the previous stage's last end), ``tail`` (its
last end after the median of its instructions' ends), and per
instruction ``start`` and ``waited`` (after the previous stage's last end), then the durations
``w-start`` (start to wait return), ``input-w`` (wait return to input arrived), ``first-in`` and
``comp-in`` (input to the first and last tile's math done; attention: ``first`` is the ticket),
``end-comp`` (math done to end, stores and release), and ``end`` (after the previous stage's end).

    python3 bench/phase_stats.py trace.json
"""

import json
import statistics
import sys
from collections import defaultdict

from trace_summary import STAGES      # bench/ is the script's directory, so on sys.path


def _prev(op, layer):
    i = STAGES.index(op)
    return (STAGES[i - 1], layer) if i > 0 else ("DOWN", layer - 1)


def phase_table(events, layers=range(2, 26)):
    by = defaultdict(list)
    for e in events:
        by[(e["name"], e["args"]["layer"])].append(e)
    ends = {k: max(e["ts"] + e["dur"] for e in v) for k, v in by.items()}
    rows = defaultdict(lambda: defaultdict(list))
    for (op, layer), evs in by.items():
        pe = ends.get(_prev(op, layer)) if op in STAGES else None
        if pe is None or layer not in layers:
            continue
        r = rows[op]
        r["gap"].append(ends[(op, layer)] - pe)
        r["tail"].append(ends[(op, layer)] - statistics.median(e["ts"] + e["dur"] for e in evs))
        for e in evs:
            a = e["args"]
            if "input" not in a:      # an empty attention split (no wait, no input)
                continue
            r["start"].append(e["ts"] - pe)
            r["waited"].append(e["ts"] + a["waited"] - pe)
            r["w-start"].append(a["waited"])
            r["input-w"].append(a["input"] - a["waited"])
            if "first" in a:
                r["first-in"].append(a["first"] - a["input"])
            if "computed" in a:
                r["comp-in"].append(a["computed"] - a["input"])
            r["end-comp"].append(e["dur"] - a.get("computed", a.get("first", 0)))
            r["end"].append(e["ts"] + e["dur"] - pe)
    return rows


def main():
    rows = phase_table(json.load(open(sys.argv[1]))["traceEvents"])
    for op in STAGES:
        cols = " ".join(f"{k} {statistics.median(v):.2f}/{sorted(v)[int(.9 * len(v))]:.2f}"
                        for k, v in rows[op].items())
        print(op, cols)


if __name__ == "__main__":
    main()
