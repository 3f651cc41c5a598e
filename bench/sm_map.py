"""Which workers share an SM, from a light trace (``gpu_smoke --trace-dir``): prints the pairs'
pattern (w and w + W/2, or w and w + 1, ...).   python3 bench/sm_map.py TRACE.json"""
import json
import sys
from collections import defaultdict

events = json.load(open(sys.argv[1]))["traceEvents"]
sm = {}
for e in events:
    if e.get("args", {}).get("sm") is not None:
        sm[e["tid"]] = e["args"]["sm"]
W = len(sm)
by = defaultdict(list)
for w, s in sm.items():
    by[s].append(w)
diffs = defaultdict(int)
for ws in by.values():
    ws = sorted(ws)
    for a, b in zip(ws, ws[1:]):
        diffs[b - a] += 1
print(f"workers {W}, SMs {len(by)}, workers per SM {sorted({len(v) for v in by.values()})}")
print("distance between SM mates:", dict(sorted(diffs.items(), key=lambda kv: -kv[1])[:8]))
print("first workers' SMs:", [sm[w] for w in sorted(sm)[:16]])
