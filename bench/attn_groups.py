"""Attention per kv group, from a light trace (``gpu_smoke ...:trace=2 --trace-dir``): when each
group's splits got their input and finished their math, when the group's combine ended, and when
the O projection's waits returned, in us after the layer's QKV stage ended. Medians over layers
2-25. Says how much the O projection waits for the slowest group (what an O projection that waited
per group could win) and how long a combine takes after its group's last math.

    python3 bench/attn_groups.py trace.json [--nsplit 32]
"""

import argparse
import json
import statistics
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--nsplit", type=int, default=32)
    args = ap.parse_args()
    by = defaultdict(list)
    for e in json.load(open(args.trace))["traceEvents"]:
        by[(e["name"], e["args"]["layer"])].append(e)
    rows = defaultdict(list)
    for layer in range(2, 26):
        if ("ATTN", layer) not in by or ("OPROJ", layer) not in by:
            continue
        t0 = max(e["ts"] + e["dur"] for e in by[("QKV", layer)])
        groups = defaultdict(list)
        for e in by[("ATTN", layer)]:
            groups[e["args"]["tiles"][0] // args.nsplit].append(e)
        ends, combines = [], []
        for g, evs in sorted(groups.items()):
            busy = [e for e in evs if "input" in e["args"]]
            end = max(e["ts"] + e["dur"] for e in evs) - t0
            ends.append(end)
            if busy:
                rows["group input (last split)"].append(max(e["ts"] + e["args"]["input"] for e in busy) - t0)
                computed = max(e["ts"] + e["args"].get("computed", 0) for e in busy) - t0
                rows["group math done (last split)"].append(computed)
                combines.append(end - computed)
            rows["busy splits a group"].append(len(busy))
        ends.sort()
        rows["first group ends"].append(ends[0])
        rows["median group ends"].append(statistics.median(ends))
        rows["last group ends"].append(ends[-1])
        rows["last - median group"].append(ends[-1] - statistics.median(ends))
        rows["combine after the group's last math"].extend(combines)
        o = by[("OPROJ", layer)]
        rows["O waits return (median)"].append(statistics.median(e["ts"] + e["args"]["waited"] for e in o
                                                                 if "waited" in e["args"]) - t0)
        rows["O's last end"].append(max(e["ts"] + e["dur"] for e in o) - t0)
    for k, v in rows.items():
        print(f"{k:40s} median {statistics.median(v):6.2f}  p10 {sorted(v)[len(v) // 10]:6.2f}  "
              f"p90 {sorted(v)[int(.9 * len(v))]:6.2f}")


if __name__ == "__main__":
    main()
