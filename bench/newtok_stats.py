"""Attention's splits per (layer, kv group) in a phase trace (trace=1): how much later the split
that holds the new position takes its ticket than the group's other active splits, and the math
phase (input to computed) of each kind, medians over layers 2-25 (docs/performance.md, "Attention").

    python3 bench/newtok_stats.py trace.json[.gz] NSPLIT NEWTOK

NEWTOK 0: the new position is in the last active split (with its cached block); 1: split 0 holds
it alone (the plan's ATTN_NEW). Needs one attention tile per instruction (batch 1).
"""

import gzip
import json
import statistics as st
import sys
from collections import defaultdict


def main(path, nsplit, newtok, hkv=8):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("name") == "ATTN"]
    groups = defaultdict(list)
    for e in events:
        t0, t1 = e["args"]["tiles"]
        if t1 - t0 == 1 and 2 <= e["args"]["layer"] <= 25:
            groups[(e["args"]["layer"], (t0 // nsplit) % hkv)].append((t0 % nsplit, e))
    rows = []
    for tiles in groups.values():
        act = {s: e for s, e in tiles if "input" in e["args"]}
        if len(act) < 2:
            continue
        new = 0 if newtok else max(act)
        at = {s: {k: e["ts"] + e["args"][k] for k in ("waited", "input", "computed", "first")} for s, e in act.items()}
        others = [s for s in act if s != new]
        end = max(e["ts"] + e["dur"] for _, e in tiles)
        rows.append({
            "active splits": len(act),
            "new ticket - latest other ticket": at[new]["first"] - max(at[s]["first"] for s in others),
            "group end - last ticket": end - max(a["first"] for a in at.values()),
            "group end - first wait": end - min(a["waited"] for a in at.values()),
            "new split math": at[new]["computed"] - at[new]["input"],
            "other splits math": st.median(at[s]["computed"] - at[s]["input"] for s in others),
        })
    print(f"{len(rows)} groups (layers 2-25), medians:")
    for k in rows[0]:
        print(f"  {k}: {st.median(r[k] for r in rows):.2f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
