"""The results table: ``bench/results.jsonl``, one JSON object a line, one line per backend of each
(batch size, prompt length) of a recorded bench run; and what is drawn from it, the README's
headline table and the plots (``python -m bench.render``).

Every row carries the run it came from (``run``, ``time``, ``command``, ``device``, ``versions``,
``git_commit``, ``git_dirty``), the setting (``model``, ``weights``, ``dtype``, ``quantization``
(``fp8``: block-FP8 projections; absent or null: none), ``fp8_activations`` (``dynamic``: w8a8,
``none``: weight-only; absent from FP8 rows recorded before w8a8, which ran weight-only), ``tp``: the GPUs the model is split over,
absent from rows recorded before tensor parallelism, which ran on one; ``batch_size``,
``prompt_len``, ``new_tokens``, ``max_seq_len``) and the measurements (``ms_per_step``: the median
decode step of the whole batch; ``prefill_ms``; ``pct_of_floor``; ...; ``error`` where the backend
failed), and the plan its kernels ran (``plan``: ``rules`` or ``tuned``, None for a backend that runs
no tape and in rows from before the tuner; ``plan_tuned_at``; ``plan_fields``, what the tuned plan
changed). ``ROW_FIELDS`` lists them all; a row of ``python -m megakernel.loadtest --record`` (backend
``serve``) has ``SERVE_ROW_FIELDS``: the server under load.

``git_commit`` is the commit the code ran from (as MEGAKERNEL_GIT_COMMIT gave it, where set), or null
where the run could not know it: code run outside a git checkout (an sdist, a zip of the files) without
MEGAKERNEL_GIT_COMMIT set. A ``git archive`` copy still knows it (megakernel/ARCHIVED_COMMIT), but not
whether it was edited: ``git_dirty`` is then null. Null rather than a made-up string, so that nothing
compares it with a real commit; the tables show it as ``unknown``. ``partial`` is true on the rows of a
run cut short (Ctrl-C, SIGTERM, an error part-way): each row is appended the moment it finishes, and the
run's rows are marked when it is cut; null on a run that finished (and in older rows). A run killed
outright (SIGKILL) leaves its finished rows unmarked.
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
              "dtype", "quantization", "fp8_activations", "copy_gbps", "prompt_seed", "tp", "partial")
CONFIG_FIELDS = ("batch_size", "prompt_len", "new_tokens", "max_seq_len")
MEASURE_FIELDS = ("backend", "implementation", "ms_per_step", "ms_per_step_p10", "ms_per_step_p90", "tokens_per_s",
                  "ratio_to_batch1", "prefill_ms", "prompt_tokens_per_s", "ttft_ms", "floor_ms", "pct_of_floor",
                  "bytes_per_step", "gbps", "speedup_vs_megakernel", "token_agreement", "tokens_match",
                  "compile_s", "setup_s", "steps_per_launch", "cuda_graphs", "cudagraph_skip", "plan", "plan_tuned_at",
                  "plan_fields", "error")
# rows of ``python -m megakernel.loadtest --record`` (backend "serve"): the server under load
SERVE_FIELDS = ("concurrency", "duration_s", "requests", "failed", "lost", "requests_per_s",
                "output_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "ttft_ms_p99_later", "itl_ms_p50", "itl_ms_p99",
                "serve_backend",
                "server_ttft_ms_p50", "server_queue_ms_p50", "server_prefill_ms_p50", "server_step_ms_p50",
                "client_processes", "client_cpu")
ROW_FIELDS = RUN_FIELDS + CONFIG_FIELDS + MEASURE_FIELDS
SERVE_ROW_FIELDS = ROW_FIELDS + SERVE_FIELDS
BACKEND_ORDER = ("megakernel", "cuda-graph", "torch-compile", "hf-compile", "superkernel", "per-op", "hf", "reference")
CODE_PATHS = ("megakernel", "instructions", "scheduler", "models", "pyproject.toml")
MARK_BEGIN, MARK_END = "<!-- results:begin -->", "<!-- results:end -->"


# ---------------------------------------------------------------------------------------------
# What a run records about itself


ARCHIVED_COMMIT = Path(__file__).resolve().parent / "ARCHIVED_COMMIT"   # filled in by git archive


def git_state(root: Path = REPO) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout the code runs from; dirty means tracked changes under the
    code paths (the results table, plots and README change between a run and its commit, so they
    do not count). A copy of the tree run on another machine may carry a stale or no .git: there
    the commit the copy was made from is given as MEGAKERNEL_GIT_COMMIT (MEGAKERNEL_GIT_DIRTY=1 where
    the copy had code changes), which takes precedence. Outside a git checkout, a ``git archive``
    copy names its commit in megakernel/ARCHIVED_COMMIT (export-subst, .gitattributes), dirty
    unknown (None); anything else (an sdist, a zip of the files) gives (None, None)."""
    if os.environ.get("MEGAKERNEL_GIT_COMMIT"):
        return os.environ["MEGAKERNEL_GIT_COMMIT"], os.environ.get("MEGAKERNEL_GIT_DIRTY") == "1"
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                 *CODE_PATHS], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return archived_commit(), None
    return commit or None, bool(status.strip())


def archived_commit() -> str | None:
    """The commit ``git archive`` wrote into ARCHIVED_COMMIT; None where the file was copied as is
    (it then still reads ``$Format:%H$``) or is missing."""
    try:
        text = ARCHIVED_COMMIT.read_text().strip()
    except OSError:
        return None
    return text if re.fullmatch(r"[0-9a-f]{40}", text) else None


def commit_cell(row: dict) -> str:
    """A row's commit as the tables show it: 7 characters, ``+`` where the code had uncommitted
    changes, ``unknown`` where the run could not tell (git_commit null)."""
    c = row.get("git_commit")
    return f"{str(c)[:7]}{'+' if row.get('git_dirty') else ''}" if c else "unknown"


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


def mark_partial(path: str | Path, run: dict) -> int:
    """Mark ``partial`` the rows of ``run`` (same run id, time and command) already appended to
    ``path``: a run cut short appends each row as it finishes, not knowing it will be cut. Other
    lines are kept byte for byte; the file is replaced whole (a temporary file renamed over it).
    Returns the rows marked."""
    key = (run["run"], run["time"], run["command"])
    path = Path(path)
    lines, n = [], 0
    for line in path.read_text().splitlines(keepends=True):
        try:
            r = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            r = None
        if isinstance(r, dict) and (r.get("run"), r.get("time"), r.get("command")) == key:
            r["partial"] = True
            line, n = json.dumps(r) + "\n", n + 1
        lines.append(line)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text("".join(lines))
    os.replace(tmp, path)
    return n


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
    """A row's weights as the table and plots label them: its dtype, and ``fp8 w8a8`` or ``fp8
    weights`` (weight-only) where the projections were block FP8 (rows recorded before FP8 existed
    have no quantization; before w8a8, no fp8_activations: they ran weight-only)."""
    if row.get("quantization") != "fp8":
        return str(row["dtype"])
    return f"{row['dtype']}, fp8 w8a8" if row.get("fp8_activations") == "dynamic" else f"{row['dtype']}, fp8 weights"


def fp8_scheme(row) -> str:
    """A row's weights' scheme: "16-bit", FP8 "weight-only" (and every FP8 row from before w8a8),
    or "w8a8" (FP8 activations too)."""
    if row.get("quantization") != "fp8":
        return "16-bit"
    return "w8a8" if row.get("fp8_activations") == "dynamic" else "weight-only"


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
        runs = sorted({f"{r['time'][:10]} {commit_cell(r)}" for r in cells.values()})
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
    where a setting has two or more points; one GPU's rows only (TP's have their own plot, whose
    later rows would otherwise stand in for TP 1's points). Returns the files written."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    rows = [r for r in rows if (include_cpu or not _is_cpu(r)) and _tp(r) == 1]
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


# ---------------------------------------------------------------------------------------------
# The README's results by question, and the full table (docs/results.md)

PEER_COLUMNS = ("cuda-graph", "torch-compile", "hf-compile", "superkernel", "per-op", "hf")


def short_device(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100``: the README's tables name the card only."""
    name = str(name)
    if name.startswith("cpu"):
        return "cpu"
    return name.removeprefix("NVIDIA ").split()[0] if name.startswith("NVIDIA ") else name


def _table(head: list[str], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + ["| " + " | ".join(r) + " |" for r in body]


def _decode_rows(rows, include_cpu):
    """The latest decode rows (headline's pick) of one GPU's 16-bit weights."""
    return [r for r in headline(rows, include_cpu) if r.get("new_tokens", 2) > 1]


def _plot_link(path: Path, rel_to: Path) -> str:
    return f"[{path.name}]({os.path.relpath(path, rel_to)})"


def questions_markdown(rows: list[dict], plots: str | Path, rel_to: str | Path, include_cpu: bool = False) -> str:
    """The README's results block: one small table per question (decode over batch beside the
    peers, prefill over prompt length, FP8 against 16-bit weights, TP scaling, serving under load),
    each with its plot, drawn into ``plots`` (links relative to ``rel_to``, the README's folder).
    Each cell is the latest recorded measurement; docs/results.md has every row."""
    plots, rel_to = Path(plots), Path(rel_to)
    plots.mkdir(parents=True, exist_ok=True)
    rows = [r for r in rows if include_cpu or not _is_cpu(r)]
    out = []
    dec = _decode_rows(rows, include_cpu)
    bf16 = [r for r in dec if r.get("quantization") != "fp8" and _tp(r) == 1 and r.get("plan") != "tuned"]

    out.append("**How fast is a decode step, by batch, against the peers?** ms per step of the whole batch "
               "(lower is better), 16-bit weights, one GPU:")
    for dev in sorted({r["device"] for r in bf16}):
        mine = [r for r in bf16 if r["device"] == dev]
        peers = [b for b in PEER_COLUMNS if any(r["backend"] == b for r in mine)][:3]
        cells = {(r["model"], r["batch_size"], r["backend"]): r for r in mine}
        keys = sorted({(r["model"], r["batch_size"]) for r in mine}, key=lambda k: (_model_key(k[0]), k[1]))
        body = [[m, str(b)] + [_fmt(cells[(m, b, x)]["ms_per_step"]) if (m, b, x) in cells else "-"
                               for x in ["megakernel"] + peers] for m, b in keys]
        out += ["", f"{short_device(dev)}:", ""] + _table(["model", "batch", "megakernel"] + peers, body)
        path = plots / f"q-decode-{_slug(short_device(dev))}.png"
        series = defaultdict(list)
        for (m, b, x), r in sorted(cells.items(), key=lambda kv: (_model_key(kv[0][0]), kv[0][1])):
            if x in ["megakernel"] + peers:
                series[f"{m} {x}"].append((b, r["ms_per_step"]))
        if series:
            plot_series(series, "batch size", "ms per decode step", f"decode on {short_device(dev)}", path)
            out += ["", f"Plot: {_plot_link(path, rel_to)}"]

    # prefill-only runs (no decode step timed): a decode run's prefill is a warm-up's, a few samples
    pre = [r for r in rows if r.get("prefill_ms") is not None and r.get("ms_per_step") is None
           and not r.get("error") and r["batch_size"] == 1
           and r.get("quantization") != "fp8" and _tp(r) == 1 and r["backend"] in ("megakernel", "hf")]
    latest: dict[tuple, dict] = {}
    for r in pre:
        k = (short_device(r["device"]), r["model"], r["prompt_len"], r["backend"])
        if k not in latest or r["time"] > latest[k]["time"]:
            latest[k] = r
    keys = sorted({k[:3] for k in latest}, key=lambda k: (k[0], _model_key(k[1]), k[2]))
    keys = [k for k in keys if len({x[2] for x in latest if x[:2] == k[:2]}) > 1]   # an x-axis: 2+ lengths
    out += ["", "**How long does the prefill take, by prompt length?** ms to prefill one prompt (batch 1), "
                "the megakernel's, and in brackets transformers' time over it (above 1: the megakernel is faster):", ""]
    # one row a model and GPU, one column a prompt length: a table a reader takes in at a glance
    models = sorted({k[:2] for k in keys}, key=lambda k: (k[0], _model_key(k[1])))
    lens = sorted({k[2] for k in keys})

    def cell(d, m, p):
        mk, hf = latest.get((d, m, p, "megakernel")), latest.get((d, m, p, "hf"))
        if mk is None:
            return "-"
        return _fmt(mk["prefill_ms"], 1) + (f" ({hf['prefill_ms'] / mk['prefill_ms']:.2f}x)" if hf else "")
    body = [[f"{m} on {d}"] + [cell(d, m, p) for p in lens] for d, m in models]
    out += _table(["model"] + [f"{p:,}" for p in lens], body) \
        if body else ["_No prefill runs over several prompt lengths recorded._"]
    series = defaultdict(list)
    for (d, m, p, b), r in sorted(latest.items(), key=lambda kv: (_model_key(kv[0][1]), kv[0][2])):
        if (d, m, p) in keys:
            series[f"{m} {d} {b}"].append((p, r["prefill_ms"]))
    if series:
        path = plots / "q-prefill.png"
        plot_series(series, "prompt length", "prefill ms", "prefill, batch 1", path)
        out += ["", f"Plot: {_plot_link(path, rel_to)}"]

    mk = {(r["device"], r["model"], r["batch_size"], fp8_scheme(r)): r for r in dec
          if r["backend"] == "megakernel" and _tp(r) == 1 and r.get("plan") != "tuned"}
    keys = sorted({k[:3] for k in mk if k[3] != "16-bit" and k[:3] + ("16-bit",) in mk},
                  key=lambda k: (k[0], _model_key(k[1]), k[2]))
    out += ["", "**What does FP8 buy?** megakernel ms per step, block-FP8 projections (weight-only, and w8a8: "
                "FP8 activations too) against 16-bit weights:", ""]

    def ms(k, scheme):
        r = mk.get(k + (scheme,))
        return r and r["ms_per_step"]

    body = [[f"{m} on {short_device(d)}", str(b), _fmt(ms((d, m, b), "16-bit")), _fmt(ms((d, m, b), "weight-only")),
             _fmt(ms((d, m, b), "w8a8")),
             _fmt(ms((d, m, b), "w8a8") / ms((d, m, b), "16-bit"), 2) if ms((d, m, b), "w8a8") else "-"]
            for d, m, b in keys]
    out += _table(["model", "batch", "16-bit ms", "fp8 weight-only ms", "fp8 w8a8 ms", "w8a8 / 16-bit"], body) \
        if body else ["_No FP8 run beside a 16-bit one recorded._"]
    if keys:
        path = plots / "q-fp8.png"
        series = {"16-bit": [], "fp8 weight-only": [], "fp8 w8a8": []}
        labels = []
        for i, (d, m, b) in enumerate(keys):
            labels.append(f"{m} {short_device(d)} b{b}")
            for scheme in ("16-bit", "weight-only", "w8a8"):
                series["16-bit" if scheme == "16-bit" else f"fp8 {scheme}"].append(ms((d, m, b), scheme) or 0.0)
        plot_bars(labels, series, "megakernel ms per decode step", "FP8 against 16-bit weights", path)
        out += ["", f"Plot: {_plot_link(path, rel_to)}"]

    tp = {(r["device"], r["model"], r["batch_size"], _tp(r)): r for r in dec
          if r["backend"] == "megakernel" and r.get("quantization") != "fp8" and r.get("plan") != "tuned"}
    keys = sorted({k[:3] for k in tp if len({x[3] for x in tp if x[:3] == k[:3]}) > 1},
                  key=lambda k: (k[0], _model_key(k[1]), k[2]))
    out += ["", "**How does it scale over GPUs (tensor parallel)?** megakernel ms per step at 1, 2 and 4 GPUs:", ""]
    body = [[f"{m} on {short_device(d)}", str(b)] + [_fmt(tp[(d, m, b, n)]["ms_per_step"]) if (d, m, b, n) in tp
                                                     else "-" for n in (1, 2, 4)] for d, m, b in keys]
    out += _table(["model", "batch", "tp 1", "tp 2", "tp 4"], body) if body else ["_No TP runs recorded._"]
    if keys:
        path = plots / "q-tp.png"
        series = {f"{m} {short_device(d)} b{b}": [(n, tp[(d, m, b, n)]["ms_per_step"]) for n in (1, 2, 4)
                                                  if (d, m, b, n) in tp] for d, m, b in keys}
        plot_series(series, "GPUs (tp)", "ms per decode step", "megakernel, tensor parallel", path)
        out += ["", f"Plot: {_plot_link(path, rel_to)}"]

    serve: dict[tuple, dict] = {}
    for r in rows:
        if r.get("backend") == "serve" and not r.get("error"):
            k = (r["device"], r["model"], r.get("concurrency"))
            if k not in serve or r["time"] > serve[k]["time"]:
                serve[k] = r
    out += ["", "**How does the server hold up under load?** `python -m megakernel.loadtest` against "
            "`python -m megakernel.serve`:", ""]
    keys = sorted(serve, key=lambda k: (k[0], _model_key(k[1]), k[2] or 0))
    body = [[f"{m} on {short_device(d)}", str(c), _fmt(serve[(d, m, c)].get("requests_per_s"), 1),
             _fmt(serve[(d, m, c)].get("output_tokens_per_s"), 0), _fmt(serve[(d, m, c)].get("ttft_ms_p50"), 1),
             _fmt(serve[(d, m, c)].get("itl_ms_p50"), 2), str(serve[(d, m, c)].get("git_commit") or "?")[:7]]
            for d, m, c in keys]
    # the server changed between runs (static batch, then buckets): each cell names its commit
    out += _table(["model", "clients", "requests/s", "output tok/s", "TTFT p50 ms", "ITL p50 ms", "commit"], body) \
        if body else ["_No load test recorded._"]
    if keys:
        path = plots / "q-serve.png"
        plot_bars([f"{m} {short_device(d)} c{c}" for d, m, c in keys],
                  {"output tok/s": [serve[k].get("output_tokens_per_s") or 0 for k in keys]},
                  "output tokens/s", "serving under load", path)
        out += ["", f"Plot: {_plot_link(path, rel_to)}"]
    out += ["", "Each cell: the latest recorded run. Every row, with its device, commit and command: "
            "[docs/results.md](docs/results.md)."]
    return "\n".join(out)


def plot_bars(labels: list[str], series: dict[str, list[float]], ylabel: str, title: str, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(labels) + 2), 4))
    width = 0.8 / max(1, len(series))
    for i, (name, ys) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(labels))], ys, width, label=name)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(labels))], labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def full_markdown(rows: list[dict]) -> str:
    """docs/results.md: every row of the table (CPU rows too; each names its device), sorted by
    device, model, weights, tp, batch, prompt and backend; then every run with its commit and command."""
    def key(r):
        return (str(r.get("device")), _model_key(r.get("model")), precision(r), _tp(r), r.get("batch_size") or 0,
                r.get("prompt_len") or 0, _backend_rank(column(r)), r.get("time") or "")
    runs: dict[str, dict] = {}
    for r in rows:
        runs.setdefault(r.get("run") or "?", r)
    decode = sorted((r for r in rows if r.get("backend") != "serve"), key=key)
    serve = sorted((r for r in rows if r.get("backend") == "serve"), key=key)

    def note(r):
        return "; ".join(x for x in (f"error: {r['error']}" if r.get("error") else "",
                                     "partial run" if r.get("partial") else "") if x) or ""
    out = ["# Results: every recorded row", "",
           "Drawn from `bench/results.jsonl` by `python -m bench.render` (do not edit by hand). "
           f"{len(rows)} rows: {len(decode)} from `python -m megakernel.bench`, {len(serve)} from "
           "`python -m megakernel.loadtest`. ms/step: median decode step of the whole batch; floor: the bytes a "
           "step must read over the measured copy bandwidth; agree: token agreement with the megakernel under "
           "teacher forcing; commit `+`: uncommitted code changes, `unknown`: run outside a git checkout. "
           "The README's results block picks the latest of these per question.", "", "## Bench rows", ""]
    out += _table(["device", "model", "dtype", "tp", "batch", "prompt + new", "backend", "plan", "ms/step", "floor ms",
                   "% floor", "prefill ms", "TTFT ms", "agree", "run", "note"],
                  [[short_device(r.get("device")), str(r.get("model")), precision(r), str(_tp(r)),
                    str(r.get("batch_size")), f"{r.get('prompt_len')} + {r.get('new_tokens')}", r["backend"],
                    _plan_name(r), _fmt(r.get("ms_per_step")), _fmt(r.get("floor_ms")),
                    _fmt(r.get("pct_of_floor"), 1), _fmt(r.get("prefill_ms"), 2), _fmt(r.get("ttft_ms"), 2),
                    _fmt(r.get("token_agreement"), 3), str(r.get("run")), note(r).replace("|", "/")]
                   for r in decode])
    out += ["", "## Serving rows", ""]
    out += _table(["device", "model", "backend", "batch", "clients", "requests/s", "output tok/s", "TTFT p50 / p99 ms",
                   "ITL p50 / p99 ms", "failed", "run", "note"],
                  [[short_device(r.get("device")), str(r.get("model")), str(r.get("serve_backend")),
                    str(r.get("batch_size")), str(r.get("concurrency")), _fmt(r.get("requests_per_s"), 1),
                    _fmt(r.get("output_tokens_per_s"), 0),
                    f"{_fmt(r.get('ttft_ms_p50'), 1)} / {_fmt(r.get('ttft_ms_p99'), 1)}",
                    f"{_fmt(r.get('itl_ms_p50'), 2)} / {_fmt(r.get('itl_ms_p99'), 2)}", str(r.get("failed")),
                    str(r.get("run")), note(r).replace("|", "/")] for r in serve]) if serve else ["_None recorded._"]
    out += ["", "## Runs", ""]
    out += _table(["run", "device", "commit", "command"],
                  [[str(k), str(r.get("device")), commit_cell(r), f"`{r.get('command')}`"]
                   for k, r in sorted(runs.items(), key=lambda kv: str(kv[1].get("time")))])
    return "\n".join(out) + "\n"


def _plan_name(r) -> str:
    if r.get("plan") == "tuned" and r.get("plan_tuned_at"):
        return f"tuned {r['plan_tuned_at'][:10]}"
    return r.get("plan") or "-"
