"""python -m bench.render: the README's results by question, the full table and the plots, from the results table.

Reads bench/results.jsonl (one row per backend and setting of each recorded run: `python -m
megakernel.bench --record bench/results.jsonl`, and `python -m megakernel.loadtest --record`).
Writes, between README's `<!-- results:begin -->` and `<!-- results:end -->` markers (nothing else
of the README changes), a short block of small tables, one per question (decode over batch beside
the peers, prefill over prompt length, FP8 against 16-bit weights, TP scaling, serving under load),
each with its plot; every row, with its device, commit and command, to docs/results.md; and the
plots into bench/plots/ (per device, model and dtype: ms/step over batch size and over prompt
length, prefill ms over prompt length; and one per question, q-*.png).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # run as a script too: python bench/render.py

from megakernel import results  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.render", description=__doc__.splitlines()[0].split(": ", 1)[1],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--table", default=str(ROOT / "bench" / "results.jsonl"), help="the results table (JSON lines)")
    p.add_argument("--readme", default=str(ROOT / "README.md"), help="the file whose results block is rewritten")
    p.add_argument("--plots", default=str(ROOT / "bench" / "plots"), help="folder for the plots")
    p.add_argument("--full", default=str(ROOT / "docs" / "results.md"), help="the file for the full table")
    p.add_argument("--include-cpu", action="store_true",
                   help="also use rows measured on the CPU (Triton's interpreter; left out by default)")
    p.add_argument("--print", dest="print_only", action="store_true",
                   help="print the headline table instead of writing the README and the plots")
    args = p.parse_args(argv)
    try:
        rows = results.read_rows(args.table)
        if args.print_only:
            print(results.headline_markdown(rows, include_cpu=args.include_cpu))
            return 0
        readme, full = Path(args.readme), Path(args.full)
        text = readme.read_text()
        results.replace_block(text, "")      # no markers: refuse before writing anything
        block = results.questions_markdown(rows, args.plots, readme.resolve().parent, include_cpu=args.include_cpu)
        readme.write_text(results.replace_block(text, block))
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(results.full_markdown(rows))
        written = results.plot_rows(rows, args.plots, include_cpu=args.include_cpu)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.readme}: results by question; {args.full}: all {len(rows)} rows; "
          f"{len(written)} plots in {args.plots}", file=sys.stderr)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
