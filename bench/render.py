"""python -m bench.render: the README's headline table and the plots, drawn from the results table.

Reads bench/results.jsonl (one row per backend and setting of each recorded run: `python -m
megakernel.bench --record bench/results.jsonl`), writes the headline (the latest run per device,
model, dtype, batch size and backend) between README's `<!-- results:begin -->` and
`<!-- results:end -->` markers, and the plots (ms/step over batch size and over prompt length,
prefill ms over prompt length, one line per backend) into bench/plots/.
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
    p.add_argument("--include-cpu", action="store_true",
                   help="also use rows measured on the CPU (Triton's interpreter; left out by default)")
    p.add_argument("--print", dest="print_only", action="store_true",
                   help="print the headline table instead of writing the README and the plots")
    args = p.parse_args(argv)
    try:
        rows = results.read_rows(args.table)
        block = results.headline_markdown(rows, include_cpu=args.include_cpu)
        if args.print_only:
            print(block)
            return 0
        readme = Path(args.readme)
        readme.write_text(results.replace_block(readme.read_text(), block))
        written = results.plot_rows(rows, args.plots, include_cpu=args.include_cpu)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.readme}: headline of {len(results.headline(rows, args.include_cpu))} measurements; "
          f"{len(written)} plots in {args.plots}", file=sys.stderr)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
