"""python -m bench.coverage: which rows of the complete recorded sweep are still missing from the results table.

The sweep (issue 53; `bash bench/sweep.sh --list` names its parts) asks, on an H100 and on an H200:
every size at batch 1 beside cuda-graph; 0.6b, 8b and 32b at batch 1 to 64 beside every peer; the
prefill from 128 to 32k tokens beside transformers; FP8 (w8a8 and weight-only) at batch 1, 8 and 16;
TP 1, 2 and 4 for 8b, 14b and 32b at batch 1 and 8, recorded after the attention-race fix; and, on the
H200, the tuned plans beside the rules'. This lists, per GPU type, each sweep part that still has a
missing row, with the settings it lacks, so that the next device call runs exactly those parts.
A row counts where it finished without an error (``partial`` rows count: their figure is whole).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # run as a script too: python bench/coverage.py

from megakernel import results  # noqa: E402

GPUS = ("H100", "H200")
PEERS = ("megakernel", "cuda-graph", "torch-compile", "hf-compile")
PREFILL_LENS = (128, 512, 1024, 4096, 16384, 32768)
# TP rows before this commit's time ran into the attention race (fixed in 200b1c7)
TP_AFTER = "2026-11-26T17:00:04+00:00"


def required() -> list[tuple[str, tuple]]:
    """(sweep part, setting) for every row the sweep asks for on one GPU type; a setting is (kind, model,
    batch or prompt length, backend, scheme, tp, plan)."""
    out = []
    for part, models in (("sizes-small", ("0.6b", "1.7b", "4b")), ("sizes-8b-14b", ("8b", "14b")),
                         ("sizes-32b", ("32b",))):
        out += [(part, ("decode", m, 1, be, "bf16", 1, "rules")) for m in models for be in PEERS[:2]]
    for m in ("0.6b", "8b", "32b"):
        split = ((1, 4, 8), (16, 32), (64,)) if m == "0.6b" else ((1, 4), (8, 16), (32, 64))
        for letter, batches in zip("abc", split):
            out += [(f"decode-{m}-{letter}", ("decode", m, b, be, "bf16", 1, "rules")) for b in batches for be in PEERS]
        out += [(f"prefill-{m}", ("prefill", m, n, be, "bf16", 1, None)) for n in PREFILL_LENS
                for be in ("megakernel", "hf")]
    for m in ("0.6b", "8b"):
        out += [("fp8", ("decode", m, b, be, "fp8 w8a8", 1, "rules")) for b in (1, 8, 16) for be in PEERS[:2]]
        out += [("fp8-weight-only", ("decode", m, b, "megakernel", "fp8 weight-only", 1, "rules")) for b in (1, 8, 16)]
    out += [("fp8-32b", ("decode", "32b", 1, "megakernel", s, 1, "rules")) for s in ("fp8 w8a8", "fp8 weight-only")]
    for m in ("8b", "14b", "32b"):
        out += [(f"tp-{m}", ("tp", m, b, be, "bf16", tp, "rules")) for tp in (1, 2, 4) for b in (1, 8)
                for be in PEERS[:2]]
    return out


def tuned_required() -> list[tuple[str, tuple]]:
    """The tuned plans the sweep records on the H200 (issue 53: rules against tuned)."""
    return [(f"tune-{m}", ("decode", m, b, "megakernel", "bf16", 1, plan)) for m in ("0.6b", "8b") for b in (1, 8)
            for plan in ("rules", "tuned")]


def gpu_type(row) -> str | None:
    return next((g for g in GPUS if g in (row.get("device") or "")), None)


def settings_of(row) -> set[tuple]:
    """The settings a finished row covers (a TP row also covers its decode setting; a TP row from
    before the race fix covers only that)."""
    if row.get("error") or row.get("backend") == "serve":
        return set()
    tp = row.get("tp") or 1
    scheme = {"16-bit": "bf16"}.get(results.fp8_scheme(row), f"fp8 {results.fp8_scheme(row)}")
    if scheme == "bf16" and row.get("dtype") != "bfloat16":
        return set()
    if row.get("ms_per_step") is None:
        if row.get("prefill_ms") is None:
            return set()
        return {("prefill", row["model"], row["prompt_len"], row["backend"], scheme, tp, None)}
    plan = row.get("plan") or "rules"
    out = {("decode", row["model"], row["batch_size"], row["backend"], scheme, tp, plan)}
    if (row.get("time") or "") >= TP_AFTER:
        out.add(("tp", row["model"], row["batch_size"], row["backend"], scheme, tp, plan))
    return out


def missing(rows: list[dict]) -> dict[str, dict[str, list[tuple]]]:
    """GPU type -> sweep part -> the settings no row covers, in the sweep's order."""
    have = {g: set() for g in GPUS}
    for r in rows:
        g = gpu_type(r)
        if g:
            have[g] |= settings_of(r)
    out: dict[str, dict[str, list[tuple]]] = {}
    for g in GPUS:
        need = required() + (tuned_required() if g == "H200" else [])
        for part, s in need:
            if s not in have[g]:
                out.setdefault(g, {}).setdefault(part, []).append(s)
    return out


def _describe(s: tuple) -> str:
    kind, model, n, backend, scheme, tp, plan = s
    where = f"prompt {n}" if kind == "prefill" else f"batch {n}"
    extra = "".join([f" {scheme}" if scheme != "bf16" else "", f" TP {tp}" if tp > 1 or kind == "tp" else "",
                     f" {plan} plan" if plan == "tuned" else ""])
    return f"{model} {where} {backend}{extra}"


def report(gaps: dict[str, dict[str, list[tuple]]]) -> str:
    lines = []
    for g in GPUS:
        parts = gaps.get(g, {})
        n = sum(map(len, parts.values()))
        lines.append(f"{g}: {n} rows missing" + (f", in {len(parts)} parts: bash bench/sweep.sh "
                                                  f"{' '.join(parts)}" if parts else ""))
        for part, settings in parts.items():
            shown = ", ".join(_describe(s) for s in settings[:6])
            lines.append(f"  {part:<16} {len(settings):>3}: {shown}{', ...' if len(settings) > 6 else ''}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.coverage", description=__doc__.splitlines()[0].split(": ", 1)[1],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--table", default=str(ROOT / "bench" / "results.jsonl"), help="the results table (JSON lines)")
    p.add_argument("--check", action="store_true", help="exit with status 1 where any row is missing")
    args = p.parse_args(argv)
    try:
        gaps = missing(results.read_rows(args.table))
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report(gaps))
    return 1 if args.check and gaps else 0


if __name__ == "__main__":
    sys.exit(main())
