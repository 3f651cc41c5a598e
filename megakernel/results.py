"""The results table: ``bench/results.jsonl``, one JSON object a line, one line per backend of each
(batch size, prompt length) of a recorded bench run; and what is drawn from it, the README's
headline table and the plots (``python -m bench.render``).

Every row carries the run it came from (``run``, ``time``, ``command``, ``device``, ``versions``,
``git_commit``, ``git_dirty``), the setting (``model``, ``weights``, ``dtype``, ``quantization``
(``fp8``: block-FP8 projections; absent or null: none), ``tp``: the GPUs the model is split over,
absent from rows recorded before tensor parallelism, which ran on one; ``batch_size``,
``prompt_len``, ``new_tokens``, ``max_seq_len``) and the measurements (``ms_per_step``: the median
decode step of the whole batch; ``prefill_ms``; ``pct_of_floor``; ...; ``error`` where the backend
failed), and the plan its kernels ran (``plan``: ``rules`` or ``tuned``, None for a backend that runs
no tape and in rows from before the tuner; ``plan_tuned_at``; ``plan_fields``, what the tuned plan
changed). ``ROW_FIELDS`` lists them all; a row of ``python -m megakernel.loadtest --record`` (backend
``serve``) has ``SERVE_ROW_FIELDS``: the server under load.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import subprocess
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUN_FIELDS = ("run", "time", "command", "device", "versions", "git_commit", "git_dirty", "model", "weights",
              "dtype", "quantization", "copy_gbps", "prompt_seed", "tp")
CONFIG_FIELDS = ("batch_size", "prompt_len", "new_tokens", "max_seq_len")
MEASURE_FIELDS = ("backend", "implementation", "ms_per_step", "ms_per_step_p10", "ms_per_step_p90", "tokens_per_s",
                  "ratio_to_batch1", "prefill_ms", "prompt_tokens_per_s", "ttft_ms", "floor_ms", "pct_of_floor",
                  "bytes_per_step", "gbps", "speedup_vs_megakernel", "token_agreement", "tokens_match",
                  "compile_s", "setup_s", "steps_per_launch", "cuda_graphs", "cudagraph_skip", "plan", "plan_tuned_at",
                  "plan_fields", "error")
# rows of ``python -m megakernel.loadtest --record`` (backend "serve"): the server under load
SERVE_FIELDS = ("concurrency", "duration_s", "requests", "failed", "lost", "requests_per_s",
                "output_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "serve_backend")
ROW_FIELDS = RUN_FIELDS + CONFIG_FIELDS + MEASURE_FIELDS
SERVE_ROW_FIELDS = ROW_FIELDS + SERVE_FIELDS
BACKEND_ORDER = ("megakernel", "cuda-graph", "torch-compile", "hf-compile", "superkernel", "per-op", "hf", "reference")
CODE_PATHS = ("megakernel", "instructions", "scheduler", "models", "pyproject.toml")
MARK_BEGIN, MARK_END = "<!-- results:begin -->", "<!-- results:end -->"


# ---------------------------------------------------------------------------------------------
# What a run records about itself


def git_state(root: Path = REPO) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout the code runs from; dirty means tracked changes under the
    code paths (the results table, plots and README change between a run and its commit, so they
    do not count). A copy of the tree run on another machine may carry a stale or no .git: there
    the commit the copy was made from is given as MEGAKERNEL_GIT_COMMIT (MEGAKERNEL_GIT_DIRTY=1 where
    the copy had code changes), which takes precedence. (None, None) outside a git checkout."""
    if os.environ.get("MEGAKERNEL_GIT_COMMIT"):
        return os.environ["MEGAKERNEL_GIT_COMMIT"], os.environ.get("MEGAKERNEL_GIT_DIRTY") == "1"
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                 *CODE_PATHS], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit or None, bool(status.strip())


def run_header(module: str, argv: list[str]) -> dict:
    """What every recorded run says about itself: its id and time, the command (``python -m
    <module> <argv>``), the versions, and the commit it ran."""
    commit, dirty = git_state()
    now = datetime.now(timezone.utc)
    return {"run": f"{now:%Y%m%dT%H%M%SZ}-{(commit or 'nogit')[:7]}", "time": now.isoformat(timespec="seconds"),
            "command": shlex.join(["python", "-m", module, *argv]), "versions": versions(),
            "git_commit": commit, "git_dirty": dirty}


def versions() -> dict:
    """Python, torch, Triton, transformers, and on a CUDA machine the CUDA runtime and the driver."""
    import torch
    import triton
    v = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__}
    try:
        import transformers
        v["transformers"] = transformers.__version__
    except ImportError:
        v["transformers"] = None
    if torch.cuda.is_available():
        v["cuda"] = torch.version.cuda
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=True).stdout
            v["driver"] = out.split()[0] if out.split() else None
        except (OSError, subprocess.SubprocessError):
            v["driver"] = None
    return v


# ---------------------------------------------------------------------------------------------
# The table file


def check_writable(path: str, flag: str):
    """Raise ValueError naming ``flag`` where ``path`` cannot be written (checked before any work)."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {path}: is a directory")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: no directory {parent}")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"{flag} {path}: not writable")


def append_rows(path: str | Path, rows: list[dict]):
    with open(path, "a") as f:
        for r in rows:
            fields = SERVE_ROW_FIELDS if r.get("backend") == "serve" else ROW_FIELDS
            f.write(json.dumps({k: r.get(k) for k in fields}) + "\n")


def read_rows(path: str | Path) -> list[dict]:
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{i}: not a JSON object ({e})") from None
    return rows


# ---------------------------------------------------------------------------------------------
# The headline


def _is_cpu(row) -> bool:
    return str(row.get("device", "")).startswith("cpu")


def column(row: dict) -> str:
    """A row's column in the headline: its backend, with " tuned" where it ran a tuned plan (rows
    from before the tuner, and rules plans, are the backend's own column)."""
    return row["backend"] + (" tuned" if row.get("plan") == "tuned" else "")


def precision(row) -> str:
    """A row's weights as the table and plots label them: its dtype, and ``fp8 weights`` where the
    projections were block FP8 (rows recorded before FP8 existed have no quantization)."""
    return f"{row['dtype']}, fp8 weights" if row.get("quantization") == "fp8" else str(row["dtype"])


def headline(rows: list[dict], include_cpu: bool = False) -> list[dict]:
    """The latest decode measurement per (device, model, precision, batch, backend and plan): rows
    with a ms/step and no error, from the latest run that has one; within that run, its shortest
    prompt (the headline is decode speed at short context; longer ones go to the plots)."""
    best: dict[tuple, dict] = {}
    for r in rows:
        if r.get("ms_per_step") is None or r.get("error") or (_is_cpu(r) and not include_cpu):
            continue
        key = (r["device"], r["model"], precision(r), r["batch_size"], _tp(r), column(r))
        old = best.get(key)
        if old is None or (r["time"], -r["prompt_len"]) > (old["time"], -old["prompt_len"]):
            best[key] = r
    return sorted(best.values(), key=lambda r: (r["device"], r["model"], precision(r), r["batch_size"], _tp(r),
                                                _backend_rank(column(r))))


def _tp(row) -> int:
    """A row's tensor parallel degree (rows recorded before TP existed ran on one GPU)."""
    return row.get("tp") or 1


def _backend_rank(name: str) -> tuple:
    """Order of the columns: BACKEND_ORDER, a backend's tuned column right after its own."""
    base, tuned = name.removesuffix(" tuned"), name.endswith(" tuned")
    return (BACKEND_ORDER.index(base) if base in BACKEND_ORDER else len(BACKEND_ORDER), tuned)


def _model_key(name: str):
    """0.6b < 1.7b < 8b < 14b; other names after, alphabetically."""
    m = re.fullmatch(r"([0-9.]+)b", str(name).lower())
    return (0, float(m.group(1)), "") if m else (1, 0.0, str(name))


def headline_markdown(rows: list[dict], include_cpu: bool = False) -> str:
    """The README's table: one line per device, model, precision (dtype, FP8) and batch; ms/step of each backend
    (the latest run of each), the megakernel's % of the bandwidth floor, and the runs used."""
    picked = headline(rows, include_cpu)
    if not picked:
        return "_No recorded runs yet: `python -m megakernel.bench --record bench/results.jsonl` on a GPU, then " \
               "`python -m bench.render`._"
    backends = sorted({column(r) for r in picked}, key=_backend_rank)
    groups: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in picked:
        groups[(r["device"], r["model"], precision(r), r["batch_size"], _tp(r))][column(r)] = r
    show_tp = any(k[4] > 1 for k in groups)     # the tp column only where a row is tensor parallel
    tuned = "megakernel tuned" in backends
    head = ["device", "model", "dtype", "batch"] + (["tp"] if show_tp else []) + ["prompt + new", "floor ms"] + \
        [f"{b} ms/step" for b in backends] + ["megakernel % of floor"] + \
        (["megakernel tuned % of floor"] if tuned else []) + ["runs"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key in sorted(groups, key=lambda k: (k[0], _model_key(k[1]), k[2], k[3], k[4])):
        cells = groups[key]
        mk = cells.get("megakernel")
        ref = mk or next(iter(cells.values()))
        runs = sorted({f"{r['time'][:10]} {str(r.get('git_commit') or '?')[:7]}{'+' if r.get('git_dirty') else ''}"
                       for r in cells.values()})
        row = [str(key[0]), str(key[1]), str(key[2]), str(key[3])] + ([str(key[4])] if show_tp else []) + \
            [f"{ref['prompt_len']} + {ref['new_tokens']}", _fmt(ref.get("floor_ms"))]
        row += [_fmt(cells[b]["ms_per_step"]) if b in cells else "-" for b in backends]
        row += [_fmt(mk.get("pct_of_floor"), 1) if mk else "-"]
        if tuned:
            mkt = cells.get("megakernel tuned")
            row += [_fmt(mkt.get("pct_of_floor"), 1) if mkt else "-"]
        row += [", ".join(runs)]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    tp_note = "; tp: GPUs the model is split over (the floor is one GPU's share)" if show_tp else ""
    lines.append("ms/step: median time of one decode step of the whole batch (lower is better)" + tp_note +
                 "; `+` after a commit: the run had uncommitted code changes" +
                 ("; tuned: the plan `python -m megakernel.tune` chose on that GPU, the others the rules' plan"
                  if tuned else "") + ". Every row: `bench/results.jsonl`.")
    return "\n".join(lines)


def _fmt(v, digits=3) -> str:
    return f"{v:.{digits}f}" if isinstance(v, (int, float)) else "-"


def replace_block(text: str, block: str) -> str:
    """``text`` with everything between the results markers replaced by ``block``."""
    i, j = text.find(MARK_BEGIN), text.find(MARK_END)
    if i < 0 or j < i:
        raise ValueError(f"no {MARK_BEGIN} ... {MARK_END} markers")
    return text[:i + len(MARK_BEGIN)] + "\n" + block.rstrip() + "\n" + text[j:]


# ---------------------------------------------------------------------------------------------
# Plots


def _slug(*parts) -> str:
    return "-".join(re.sub(r"[^a-z0-9.]+", "-", str(p).lower()).strip("-") for p in parts)


def _latest_series(rows, x_field: str, y_field: str, fixed: dict):
    """{backend (and " tuned", ``column``): [(x, y)]}: per backend, plan and x, the latest row
    matching ``fixed`` that has y."""
    best: dict[tuple, dict] = {}
    for r in rows:
        if r.get(y_field) is None or r.get("error") or any(r.get(k) != v for k, v in fixed.items()):
            continue
        key = (column(r), r[x_field])
        if key not in best or r["time"] > best[key]["time"]:
            best[key] = r
    series: dict[str, list] = defaultdict(list)
    for (backend, x), r in sorted(best.items(), key=lambda kv: (_backend_rank(kv[0][0]), kv[0][1])):
        series[backend].append((x, r[y_field]))
    return series


def plot_series(series: dict, xlabel: str, ylabel: str, title: str, path: Path, floor=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for backend, pts in series.items():
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="o", label=backend)
    if floor:
        xs, ys = zip(*floor)
        ax.plot(xs, ys, color="black", linestyle="--", label="bandwidth floor")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted({x for pts in series.values() for x, _ in pts})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_rows(rows: list[dict], outdir: str | Path, include_cpu: bool = False) -> list[Path]:
    """Per device, model and dtype: ms/step over batch size (at the shortest prompt), ms/step over
    prompt length (at the smallest batch) and prefill ms over prompt length, one line per backend,
    where a setting has two or more points. Returns the files written."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    rows = [r for r in rows if include_cpu or not _is_cpu(r)]
    written = []
    for dev, model, dtype in sorted({(r["device"], r["model"], precision(r)) for r in rows}):
        mine = [r for r in rows if (r["device"], r["model"], precision(r)) == (dev, model, dtype)]
        base = {"device": dev, "model": model}
        title = f"{model} {dtype} on {dev}"
        timed = [r for r in mine if r.get("ms_per_step") is not None]
        plans = []
        if timed:
            plen = min(r["prompt_len"] for r in timed)
            batch = min(r["batch_size"] for r in timed)
            plans += [("batch_size", "ms_per_step", {"prompt_len": plen}, "batch size", "ms per decode step",
                       f"{title}, prompt {plen}", "batch"),
                      ("prompt_len", "ms_per_step", {"batch_size": batch}, "prompt length (context)",
                       "ms per decode step", f"{title}, batch {batch}", "context")]
        prefilled = [r for r in mine if r.get("prefill_ms") is not None]
        if prefilled:
            batch = min(r["batch_size"] for r in prefilled)
            plans.append(("prompt_len", "prefill_ms", {"batch_size": batch}, "prompt length", "prefill ms",
                          f"{title}, batch {batch}", "prefill"))
        for x, y, fixed, xlabel, ylabel, t, tag in plans:
            series = _latest_series(mine, x, y, {**base, **fixed})
            if len({p[0] for pts in series.values() for p in pts}) < 2:
                continue
            floor = None
            if y == "ms_per_step" and "megakernel" in series:
                fl = _latest_series(mine, x, "floor_ms", {**base, **fixed, "backend": "megakernel"})
                floor = fl.get("megakernel")
            path = outdir / f"{_slug(dev, model, dtype)}-{tag}.png"
            plot_series(series, xlabel, ylabel, t, path, floor)
            written.append(path)
    return written
