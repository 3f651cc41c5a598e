"""The step's edges in a phase trace: EMBED, layer 0's stages, the LM head and ARGMAX, in us after
the step's first instruction started (start, median wait return / input / math done, last end, and
the 10th / 50th / 90th percentile of its instructions' ends).

    python3 bench/step_edges.py trace.json
"""

import json
import statistics
import sys


def main():
    ev = json.load(open(sys.argv[1]))["traceEvents"]
    t0 = min(e["ts"] for e in ev)
    for name, layer in (("EMBED", 0), ("QKV", 0), ("ATTN", 0), ("OPROJ", 0), ("GATEUP", 0), ("DOWN", 0),
                        ("DOWN", 27), ("LMHEAD", 0), ("ARGMAX", 0)):
        es = [e for e in ev if e["name"] == name and e["args"]["layer"] == layer]
        if not es:
            continue
        row = [f"{name}[{layer}] n {len(es)} start {min(e['ts'] for e in es) - t0:.2f}"]
        for k in ("waited", "input", "computed"):
            v = [e["ts"] + e["args"][k] - t0 for e in es if k in e["args"]]
            if v:
                row.append(f"{k} {statistics.median(v):.2f}")
        ends = sorted(e["ts"] + e["dur"] - t0 for e in es)
        row.append(f"end {ends[-1]:.2f}")
        if len(ends) > 1:       # how its instructions' ends spread: the stage's tail
            row.append("ends p10/p50/p90 " + "/".join(f"{ends[int(q * (len(ends) - 1))]:.2f}" for q in (.1, .5, .9)))
        print(" ".join(row))


if __name__ == "__main__":
    main()
