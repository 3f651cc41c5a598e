"""Which workers end each stage last, and why (from a phase trace with ``trace=1``).

A stage ends when its last tile does; ``phase_stats.py`` shows that the last end comes 0.7-2.7 us
after the median one. This script asks whether the late workers are the same from layer to layer
(a property of the assignment or of the SM) or different each time (noise in the memory system),
and which phase makes them late. For each layer stage, over layers 2-25:

- ``tail``: the last end after the median end (us), median over layers;
- ``rank-corr``: Spearman correlation of the workers' end times between consecutive layers (1: the
  same order every layer; 0: a fresh order every layer);
- ``late-again``: how often one of the K last workers of a layer is among the K last of the next;
- ``prev-late``: how often one of the K last workers had also been among the K last of the previous
  stage (a worker that ends a stage late issues its next weights late);
- for the K last workers against all: median start, wait return, input, math and store phases (us
  after the previous stage's last end or after the previous phase), tiles, and whether their SM
  mate (the other worker on the SM, when the trace records SMs) is also late.

    python3 bench/tail_stats.py trace.json [K]
"""

import json
import statistics
import sys
from collections import defaultdict

from phase_stats import _prev
from trace_summary import STAGES      # bench/ is the script's directory, so on sys.path


def _ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0] * len(v)
    for k, i in enumerate(order):
        r[i] = k
    return r


def _spearman(a, b):
    ra, rb = _ranks(a), _ranks(b)
    n = len(a)
    ma, mb = (n - 1) / 2, (n - 1) / 2
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = sum((x - ma) ** 2 for x in ra)
    return cov / var if var else 0.0


def _mean(name):
    """Columns printed as a mean: tile counts and the shares ending in ``-late``; the others (times,
    ``rank-corr``, ``late-again``) as a median."""
    return name.endswith("tiles") or name.endswith("-late")


def tail_table(events, k=8, layers=range(2, 26)):
    by = defaultdict(dict)          # (op, layer) -> worker -> event
    for e in events:
        if e["name"] in STAGES:
            by[(e["name"], e["args"]["layer"])][e["tid"]] = e
    ends = {key: max(e["ts"] + e["dur"] for e in v.values()) for key, v in by.items()}
    sm = {e["tid"]: e["args"].get("sm") for e in events}
    mate = defaultdict(list)
    for w, s in sm.items():
        mate[s].append(w)
    out = {}
    for op in STAGES:
        rows = defaultdict(list)
        prev_order = None
        for layer in layers:
            evs = by.get((op, layer))
            prev = _prev(op, layer)
            pe = ends.get(prev)
            if not evs or pe is None:
                continue
            # workers with input (an empty attention split has neither a wait nor a tail of its own)
            ws = sorted(w for w, e in evs.items() if "input" in e["args"])
            end = {w: evs[w]["ts"] + evs[w]["dur"] - pe for w in ws}
            med = statistics.median(end.values())
            rows["tail"].append(max(end.values()) - med)
            late = sorted(ws, key=lambda w: end[w])[-k:]
            if prev_order is not None:
                common = [w for w in ws if w in prev_order]
                rows["rank-corr"].append(_spearman([end[w] for w in common], [prev_order[w] for w in common]))
                prev_late = sorted(prev_order, key=lambda w: prev_order[w])[-k:]
                rows["late-again"].append(len(set(late) & set(prev_late)) / k)
            prev_order = end
            pevs = by.get(prev, {})
            pws = [w for w, e in pevs.items() if "input" in e["args"]]
            if pws:
                pend = sorted(pws, key=lambda w: pevs[w]["ts"] + pevs[w]["dur"])[-k:]
                rows["prev-late"].append(len(set(late) & set(pend)) / k)
            for group, members in (("late", late), ("all", ws)):
                for w in members:
                    a = evs[w]["args"]
                    rows[f"{group} start"].append(evs[w]["ts"] - pe)
                    rows[f"{group} waited"].append(evs[w]["ts"] + a["waited"] - pe)
                    rows[f"{group} input-w"].append(a["input"] - a["waited"])
                    if "computed" in a:
                        rows[f"{group} comp-in"].append(a["computed"] - a["input"])
                    rows[f"{group} end-comp"].append(evs[w]["dur"] - a.get("computed", a.get("first", 0)))
                    rows[f"{group} tiles"].append(a["tiles"][1] - a["tiles"][0])
                    if sm.get(w) is not None:
                        rows[f"{group} mate-late"].append(
                            float(any(m != w and m in late for m in mate[sm[w]])))
        out[op] = rows
    return out


def main():
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    table = tail_table(json.load(open(sys.argv[1]))["traceEvents"], k)
    for op in STAGES:
        cols = " ".join(f"{name} {(statistics.mean if _mean(name) else statistics.median)(v):.2f}"
                        for name, v in table[op].items() if v)
        print(op, cols)


if __name__ == "__main__":
    main()
