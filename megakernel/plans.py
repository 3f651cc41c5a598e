"""Tuned plans: the cache that ``python -m megakernel.tune`` writes, and which plan a run uses.

The cache is one JSON file, ``plans.json`` in the cache folder the random weights use
(``$MEGAKERNEL_CACHE``, else ``$XDG_CACHE_HOME/megakernel``, else ``~/.cache/megakernel``). An entry is keyed by the device's name, Triton's version, the model's
shapes, the dtype, the batch size, the context bucket (max_seq_len rounded up to a power of
two) and the tensor parallel degree; an entry made on another device or with another Triton is
never used. It holds the plan's fields that differ from the rules' plan (``scheduler.ops.make_plan``)
at that worker count, the tape placement strategy and the workers per SM, and says when it was
tuned and what the rules' plan and the tuned one measured.

A run's plan is ``auto`` (the tuned one where the cache has it, else the rules'), ``rules`` or
``tuned`` (an error where the cache has none). Every kernel backend of a ``MegaQwen3`` gets the same
options, so their plans, and their tokens, agree.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field, fields as dc_fields
from pathlib import Path

from scheduler.ops import Plan, next_pow2

CHOICES = ("auto", "rules", "tuned")
CACHE_FILE = "plans.json"
FORMAT = 1
# The plan fields the tuner moves; shapes (B H D ... S) come from the model and the run.
TUNABLE = ("R_QKV", "R_O", "R_GU", "R_DOWN", "R_LM", "BK_H", "BK_Q", "BK_I", "NSPLIT", "BLOCK_S", "KV_STAGES",
           "ATTN_NEW", "POOL_O", "POOL_GU", "POOL_DOWN", "POOL_LM", "BATCH_INPUT", "SK_QKV", "SK_O", "SK_GU", "SK_DOWN", "SWAP_TMA",
           "SWAP_MIN_N", "MMA_V3", "SWAP_CALL", "SWAP_PRE", "SWAP_SMEM", "ATTN_CALL",
           "ATTN_PAIR")
STRATEGIES = ("balanced", "round-robin")
# Backends that run a tape, and so a plan; the reference runs the torch model.
PLANNED_BACKENDS = ("megakernel", "superkernel", "per-op", "cuda-graph", "vm")


def cache_path() -> Path:
    from models.qwen3.weights import cache_dir
    return cache_dir() / CACHE_FILE


def device_name(device) -> str:
    import torch
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "npu":
        return f"Ascend NPU {torch.npu.get_device_name(dev)}"
    return "cpu (Triton interpreter)"


def triton_version() -> str:
    import triton
    return triton.__version__


def context_bucket(max_seq_len: int) -> int:
    return next_pow2(max_seq_len)


def shape_name(cfg) -> str:
    """The shapes a plan depends on, as one string (a checkpoint of the same shapes shares plans)."""
    return (f"H{cfg.hidden_size}-I{cfg.intermediate_size}-L{cfg.num_hidden_layers}-HQ{cfg.num_attention_heads}-"
            f"HKV{cfg.num_key_value_heads}-D{cfg.head_dim}-V{cfg.vocab_size}")


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Key:
    device: str
    triton: str
    shape: str
    dtype: str
    batch: int
    context: int        # max_seq_len rounded up to a power of two
    # tensor parallel degree: ``shape`` is then one rank's, and the tape has REDUCE stages (a
    # rank's plan is not a one-GPU plan of the same shapes); entries written without it are TP 1
    tp: int = 1
    # the projections' quantization ("fp8"; "" for 16-bit weights): FP8 tiles read half the bytes,
    # so a plan tuned on 16-bit weights is not theirs; entries written without it are 16-bit
    quant: str = ""

    @classmethod
    def of(cls, device, cfg, dtype, batch: int, max_seq_len: int, tp: int = 1, quant: str | None = None) -> "Key":
        return cls(device_name(device), triton_version(), shape_name(cfg), dtype_name(dtype), int(batch),
                   context_bucket(max_seq_len), int(tp), quant or "")

    def id(self) -> str:
        return (f"{self.device} | triton {self.triton} | {self.shape} | {self.dtype} | batch {self.batch} | "
                f"context {self.context} | tp {self.tp}{f' | {self.quant} weights' if self.quant else ''}")

    def describe(self) -> str:
        return (f"{self.shape} {self.dtype}{f' with {self.quant} weights' if self.quant else ''} at batch "
                f"{self.batch}, max_seq_len up to {self.context}"
                f"{f', tensor parallel {self.tp}' if self.tp > 1 else ''}, on {self.device} with Triton {self.triton}")


@dataclass
class Entry:
    """One tuned plan: ``fields`` are the plan's values that differ from the rules' plan."""
    key: Key
    fields: dict
    strategy: str
    workers_per_sm: int | None      # None off CUDA (the interpreter runs one worker)
    tuned_at: str                   # ISO time, UTC
    rules_ms: float                 # ms per decode step measured at tuning, the rules' plan
    tuned_ms: float                 # ... this plan
    max_seq_len: int                # what it was measured at
    measured: int = 0               # candidates measured
    extra: dict = field(default_factory=dict)
    num_warps: int = 4              # warps a worker (8 with one worker an SM: the whole SM's shared memory)

    @property
    def date(self) -> str:
        return self.tuned_at[:10]

    def options(self) -> dict:
        """The kernel backends' options that run this plan."""
        opts = {"plan_overrides": dict(self.fields), "strategy": self.strategy}
        if self.workers_per_sm is not None:
            opts["workers_per_sm"] = self.workers_per_sm
        if self.num_warps != 4:
            opts["num_warps"] = self.num_warps
        return opts

    def changes(self) -> str:
        """What this plan changes from the rules' one."""
        moved = " ".join(f"{k}={v}" for k, v in sorted(self.fields.items()))
        extra = [f"strategy {self.strategy}"] if self.strategy != "balanced" else []
        if self.workers_per_sm not in (None, 2):
            extra.append(f"{self.workers_per_sm} workers per SM")
        if self.num_warps != 4:
            extra.append(f"{self.num_warps} warps a worker")
        return ", ".join(x for x in [moved] + extra if x) or "the rules' plan"

    def describe(self) -> str:
        return f"{self.changes()} ({self.tuned_ms:.3f} ms/step against the rules' {self.rules_ms:.3f})"

    def to_json(self) -> dict:
        d = asdict(self)
        d["key"] = asdict(self.key)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Entry":
        d = dict(d)
        key = Key(**d.pop("key"))
        known = {f.name for f in dc_fields(cls)}
        e = cls(key=key, **{k: v for k, v in d.items() if k in known})
        plan_fields = {f.name for f in dc_fields(Plan)}
        bad = [k for k in e.fields if k not in plan_fields or not isinstance(e.fields[k], int)]
        if bad:
            raise ValueError(f"plan field {bad[0]!r} is not an integer field of this version's Plan")
        if e.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {e.strategy!r}")
        if e.num_warps not in (4, 8):
            raise ValueError(f"num_warps={e.num_warps!r}: a tuned plan runs 4 or 8 warps a worker")
        return e


def _warn(msg: str):
    print(f"warning: {msg}", file=sys.stderr)


def load(path: Path | None = None) -> dict[str, Entry]:
    """Every usable entry of the cache by ``Key.id``; a missing file is empty, a corrupt one is
    ignored with a warning (the tuner then writes a fresh one), as is an entry it cannot read."""
    path = Path(path) if path is not None else cache_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        _warn(f"plan cache {path}: cannot be read ({e.strerror or e}); using the rules' plans")
        return {}
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            raise ValueError(f"not a plan cache of format {FORMAT}")
    except ValueError as e:
        _warn(f"plan cache {path} is corrupt ({' '.join(str(e).split())[:120]}): ignored; using the rules' plans")
        return {}
    out = {}
    for k, raw in data["entries"].items():
        try:
            entry = Entry.from_json(raw)
        except (TypeError, ValueError, KeyError) as e:
            _warn(f"plan cache {path}: entry {k!r} ignored ({e})")
            continue
        out[entry.key.id()] = entry
    return out


def save(entries: list[Entry], path: Path | None = None) -> Path:
    """Add (or replace) ``entries`` in the cache, keeping the others; written to a temporary file
    and renamed over the cache, so a reader never sees half a file."""
    path = Path(path) if path is not None else cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = {k: e.to_json() for k, e in load(path).items()}
    for e in entries:
        merged[e.key.id()] = e.to_json()
    fd, tmp = tempfile.mkstemp(prefix=".plans-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "entries": merged}, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def lookup(key: Key, path: Path | None = None) -> Entry | None:
    return load(path).get(key.id())


@dataclass
class Choice:
    """The plan a run uses: ``name`` "rules" or "tuned" (None: the backend runs no plan)."""
    name: str | None
    entry: Entry | None = None

    @property
    def label(self) -> str:
        if self.name is None:
            return "none (the reference backend runs no tape)"
        if self.entry is None:
            return "rules"
        return f"tuned on {self.entry.date}"

    def options(self) -> dict:
        return self.entry.options() if self.entry is not None else {}

    def record(self) -> dict:
        """What a results row records about the plan."""
        e = self.entry
        return {"plan": self.name, "plan_tuned_at": e.tuned_at if e else None,
                "plan_fields": ({**e.fields, "strategy": e.strategy, "workers_per_sm": e.workers_per_sm,
                                 "num_warps": e.num_warps}
                                if e else None)}


def quant_name(quantization: str | None, w8a8: bool = False) -> str:
    """A plan key's ``quant``: "fp8" for weight-only FP8, "fp8-w8a8" with FP8 activations (their
    tiles differ), "" for 16-bit weights."""
    return "" if not quantization else f"{quantization}-w8a8" if w8a8 else quantization


def tune_command(key: Key, model: str = "MODEL") -> str:
    quant = {"fp8": " --quantize fp8 --fp8-activations none", "fp8-w8a8": " --quantize fp8"}.get(key.quant, "")
    return f"python -m megakernel.tune --model {model} --batch-size {key.batch} --max-seq-len {key.context}{quant}"


def choose(choice: str, device, cfg, dtype, batch: int, max_seq_len: int, backend: str = "megakernel",
           model: str = "MODEL", path: Path | None = None, tp: int = 1, quant: str | None = None) -> Choice:
    """The plan for a run: ``auto`` the tuned one where cached, else the rules'; ``rules``;
    ``tuned``, where a missing entry is a ValueError that says how to make one. ``tp`` > 1:
    ``cfg`` is one rank's shapes, and only an entry of that degree is used; ``quant`` ("fp8"):
    only an entry tuned on weights of that format."""
    if choice not in CHOICES:
        raise ValueError(f"unknown plan {choice!r}: choose one of {', '.join(CHOICES)}")
    if backend not in PLANNED_BACKENDS:
        return Choice(None)
    if choice == "rules":
        return Choice("rules")
    key = Key.of(device, cfg, dtype, batch, max_seq_len, tp, quant)
    entry = lookup(key, path)
    if entry is None and choice == "tuned" and tp > 1:
        raise ValueError(f"no tuned plan for {key.describe()} in {path or cache_path()}: the tuner measures one "
                         f"GPU (it has no --tp), so use --plan rules")
    if entry is None and choice == "tuned":
        raise ValueError(f"no tuned plan for {key.describe()} in {path or cache_path()}: make one with "
                         f"`{tune_command(key, model)}`, or use --plan rules")
    return Choice("tuned", entry) if entry is not None else Choice("rules")
