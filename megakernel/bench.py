"""python -m megakernel.bench: the megakernel against its baselines and peers, on the same weights and prompts.

    python -m megakernel.bench --model 0.6b --random-weights --batch-size 1,8 --record bench/results.jsonl

For each batch size and prompt length, every backend prefills the same random prompt and then
decodes greedily, free-running, with its steps timed by device events (median, p10, p90 per
step of the whole batch). Also per backend: prefill time, prompt tokens/s and the time to the
first token; the warm-up's time (kernel compilation, torch.compile and CUDA graph capture) apart
from the step times; whether a compiled peer ran under CUDA graphs; and its token agreement
with the megakernel under teacher forcing (fed the megakernel's tokens, its argmax at each step
against the megakernel's next token). The floor is the bytes a step must read (every weight
once, every sequence's KV cache up to its position) over the device's copy bandwidth measured
in the same run. Prints a card, each row the moment its backend finishes (with --record, appends
it to the results table, bench/results.jsonl, at once), then tables, and as the last stdout line
one JSON object. Cut short by Ctrl-C or SIGTERM, it prints what finished, writes --output-json
with the finished rows marked partial (never an empty one over an earlier run's) and exits 130 or 143.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time

import megakernel  # noqa: F401  (selects the device before any kernel module loads)

import torch

from . import device as devices
from . import results as table
from . import tp as tp_mod

PEERS = ("per-op", "superkernel", "cuda-graph", "torch-compile", "hf-compile", "hf", "reference")
KERNEL_BACKENDS = ("megakernel", "superkernel", "per-op", "cuda-graph", "reference")
# the peers that run tensor parallel (the torch and transformers peers hold the whole model)
TP_PEERS = ("per-op", "superkernel", "cuda-graph", "reference")
DEFAULT_COMPARE = {"cuda": "cuda-graph,torch-compile,hf-compile", "npu": "per-op,superkernel",
                   "cpu": "per-op,superkernel"}
GPU_DEFAULTS = {"model": "0.6b", "prompt_len": "128", "max_new_tokens": 256}
CPU_DEFAULTS = {"model": "tiny", "prompt_len": "16", "max_new_tokens": 8}
CPU_MAX_PARAMS = 20_000_000     # past this, one interpreted decode step takes minutes

IMPLEMENTATION = {   # what each backend name runs, reported in every result
    "megakernel": "persistent kernel, counter waits",
    "superkernel": "persistent kernel, grid-wide barrier between stages",
    "per-op": "one launch per stage (phase launches)",
    "cuda-graph": "per-op launches in one CUDA graph",
    "torch-compile": "gpt-fast-style static decode (models/qwen3/static_decode.py) under "
                     "torch.compile(mode='reduce-overhead', fullgraph=True)",
    "hf-compile": "transformers Qwen3ForCausalLM with StaticCache, forward under "
                  "torch.compile(mode='reduce-overhead', fullgraph=True)",
    "hf": "transformers Qwen3ForCausalLM, eager, DynamicCache",
    "reference": "torch reference, eager",
}
NPU_IMPLEMENTATION = {"superkernel": "TorchAir torchair.scope.super_kernel over the static decode step"}


class UsageError(Exception):
    """A setting the bench cannot run: one line ``error: ...``, exit status 2, before any work."""


def log(msg: str):
    print(msg, file=sys.stderr, flush=True)


def _accel(device):
    """torch.cuda or torch.npu (the same Event/synchronize API), or None on the CPU."""
    return {"cuda": torch.cuda, "npu": getattr(torch, "npu", None)}.get(device.type)


def _sync(dev):
    if _accel(dev) is not None:
        _accel(dev).synchronize()


class Timer:
    """Device-event timing on an accelerator, wall clock on the CPU."""

    def __init__(self, device):
        self.api = _accel(device)

    def __enter__(self):
        if self.api is not None:
            self.a, self.b = self.api.Event(enable_timing=True), self.api.Event(enable_timing=True)
            self.a.record()
        else:
            self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.api is not None:
            self.b.record()
        else:
            self.ms_ = (time.perf_counter() - self.t) * 1e3

    def ms(self) -> float:
        return self.a.elapsed_time(self.b) if self.api is not None else self.ms_


def copy_bandwidth_gbps(device) -> float | None:
    """Device-to-device copy, counting bytes read and written (what a decode step's reads are
    compared against)."""
    if _accel(device) is None:
        return None
    n = 1 << 28
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(10):
        with Timer(device) as t:
            b.copy_(a)
        times.append(t)
    _sync(device)
    ms = statistics.median(t.ms() for t in times)
    return 2 * n / (ms * 1e-3) / 1e9


def step_bytes(model, lengths: list[int]) -> int:
    """Bytes one decode step must read: every weight once, plus each sequence's KV cache up to and
    including its new position."""
    cfg, w = model.config, model.weights
    kv = sum(cfg.kv_bytes_per_position(w.dtype.itemsize) * (n + 1) for n in lengths)
    return w.nbytes() + kv


# ---------------------------------------------------------------------------------------------
# Backends: each a runner with prefill() -> first tokens [B], steps(tok, k) -> next k tokens
# [B, k] (free-running; k up to per_launch) and forced(tok) -> the next tokens [B] after tok


class KernelRunner:
    """A MegaQwen3 backend; prompts are prefilled by MegaQwen3.prefill."""

    def __init__(self, name, model, batch, args, plan="auto"):
        from . import MegaQwen3
        opts = {"trace": True} if name == "megakernel" and args.trace else {}
        self.mk = MegaQwen3(model, max_seq_len=args.max_seq_len, batch_size=batch, backend=name, plan=plan,
                            fp8_activations=args.fp8_activations, **opts)
        self.plan = self.mk.plan_choice
        self.per_launch = min(args.steps_per_launch, self.mk.steps_per_launch)

    def prefill(self, prompt):
        self.mk.prefill(prompt)
        return self.mk.tokens.long()      # the first generated token of each sequence

    def steps(self, tok, k):
        if k > 1:
            return self.mk.steps(k, per_launch=k)
        self.mk.step()                    # decodes mk.tokens (= tok) and leaves the next there
        return self.mk.tokens.long()[:, None]

    def forced(self, tok):
        self.mk.tokens.copy_(tok)
        self.mk.step()
        return self.mk.tokens.long()

    def finish(self, args):
        if hasattr(self.mk.backend, "synchronize"):
            self.mk.backend.synchronize()     # raises a timed-out wait of the last steps
        if self.mk.backend_name == "megakernel" and args.trace:
            write_trace(self.mk.backend, args.trace)


class StaticRunner:
    """The torch-compile peer (and, on an Ascend NPU, TorchAir's SuperKernel over the same step)."""

    per_launch = 1

    def __init__(self, name, model, batch, args, dev):
        from models.qwen3.static_decode import StaticDecoder
        npu_superkernel = name == "superkernel" and dev.type == "npu"
        self.dec = StaticDecoder(model.config, model.weights, batch, args.max_seq_len, compile=not npu_superkernel)
        if npu_superkernel:
            self.dec._step = _torchair_superkernel(self.dec._greedy)

    def prefill(self, prompt):
        return self.dec.prefill(prompt)

    def steps(self, tok, k):
        return self.dec.step(tok)[:, None]

    def forced(self, tok):
        return self.dec.step(tok)

    def finish(self, args):
        pass


def hf_model(model):
    """transformers' Qwen3ForCausalLM on the same weights: its parameters are views of our stacked
    tensors, not copies, so the peer costs no second copy of the model (32b is 64 GB in bf16)."""
    from transformers import Qwen3Config as HFConfig, Qwen3ForCausalLM
    from models.qwen3.weights import hf_slots
    cfg, dtype, dev = model.config, model.weights.dtype, model.weights.device
    d = cfg.to_dict()
    d.pop("architectures", None)
    d["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    hc = HFConfig(**{k: v for k, v in d.items() if k not in ("model_type", "torch_dtype")})
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):      # no memory: every parameter is assigned a view below
            m = Qwen3ForCausalLM(hc)
    finally:
        torch.set_default_dtype(default)
    # a tensor of another dtype (none today) is cast, as load_state_dict's copy would have cast it
    slots = {k: t if t.dtype == dtype else t.to(dtype) for k, t in hf_slots(cfg, model.weights).items()}
    missing, unexpected = m.load_state_dict(slots, strict=False, assign=True)
    missing = [k for k in missing if not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"weights do not map onto Qwen3ForCausalLM: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}")
    if cfg.tie_word_embeddings:
        m.lm_head.weight = m.model.embed_tokens.weight
    # the rotary frequencies are buffers computed at construction: made again on the device
    with torch.device(dev):
        m.model.rotary_emb = type(m.model.rotary_emb)(hc)
    left = [n for n, t in [*m.named_parameters(), *m.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"Qwen3ForCausalLM holds tensors this bench does not fill: {left[:3]}")
    return m.eval()


class HFRunner:
    """transformers' Qwen3ForCausalLM: ``hf`` eager with its DynamicCache; ``hf-compile`` with a
    StaticCache and the forward under torch.compile(mode="reduce-overhead", fullgraph=True), as
    transformers' documentation on static caches sets it up (the prefill runs eagerly, as
    ``generate`` runs it)."""

    per_launch = 1

    def __init__(self, m, batch, max_seq_len, compiled: bool, compile_backend: str = "inductor"):
        import inspect
        self.m, self.compiled = m, compiled
        params = inspect.signature(type(m).forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"   # renamed in transformers 5.2x
        self.cache = None
        if compiled:
            from transformers import StaticCache
            self.cache = StaticCache(config=m.config, max_cache_len=max_seq_len)
            self.fwd = torch.compile(m.forward, backend=compile_backend, mode="reduce-overhead" if
                                     compile_backend == "inductor" else None, fullgraph=True)

    @torch.no_grad()
    def prefill(self, prompt):
        if self.compiled:
            self.cache.reset()
        else:
            from transformers import DynamicCache
            self.cache = DynamicCache(config=self.m.config)
        out = self.m(input_ids=prompt.to(self.m.device), use_cache=True, logits_to_keep=1,
                     **{self.cache_kw: self.cache})
        return out.logits[:, -1].argmax(-1)

    @torch.no_grad()
    def forced(self, tok):
        if self.compiled:
            torch.compiler.cudagraph_mark_step_begin()
            out = self.fwd(input_ids=tok[:, None].long(), use_cache=True, **{self.cache_kw: self.cache})
        else:
            out = self.m(input_ids=tok[:, None].long(), use_cache=True, **{self.cache_kw: self.cache})
        return out.logits[:, -1].argmax(-1)

    def steps(self, tok, k):
        return self.forced(tok)[:, None]

    def finish(self, args):
        pass


class CudaGraphWatch:
    """Counts what torch.compile did with CUDA graphs while a compiled peer ran: the skips inductor
    reported ("skipping cudagraphs due to ...": its counter and its log lines) and the graphs that
    CUDA graph trees recorded."""

    class _Catch(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.messages = []

        def emit(self, record):
            msg = record.getMessage()
            if "skipping cudagraphs" in msg:
                self.messages.append(msg.splitlines()[0])

    def __init__(self, dev):
        self.dev = dev

    def __enter__(self):
        from torch._dynamo.utils import counters
        self.counters = counters
        self.skips0 = counters["inductor"]["cudagraph_skips"]
        self.catch = self._Catch()
        logging.getLogger("torch").addHandler(self.catch)
        return self

    def __exit__(self, *exc):
        logging.getLogger("torch").removeHandler(self.catch)

    def report(self) -> dict:
        skips = self.counters["inductor"]["cudagraph_skips"] - self.skips0
        if self.dev.type != "cuda":
            return {"cuda_graphs": None, "cudagraph_skip": None}
        recorded = None
        try:
            from torch._inductor import cudagraph_trees
            manager = cudagraph_trees.get_manager(self.dev.index or 0, create_if_none_exists=False)
            recorded = 0 if manager is None else sum(1 for _ in manager.get_roots())
        except Exception:        # private API: where it moved, the skip count alone decides
            pass
        ok = skips == 0 and recorded != 0
        why = self.catch.messages[0] if self.catch.messages else \
            (f"{skips} cudagraph skip(s)" if skips else "no CUDA graph recorded" if recorded == 0 else None)
        return {"cuda_graphs": ok, "cudagraph_skip": None if ok else why}


def make_runner(name, model, batch, args, dev, shared, plan="auto"):
    if name in ("hf", "hf-compile"):
        if "hf_model" not in shared:
            shared["hf_model"] = hf_model(model)   # built once per run, reused at every setting
        return HFRunner(shared["hf_model"], batch, args.max_seq_len, compiled=name == "hf-compile")
    if name == "torch-compile" or (name == "superkernel" and dev.type == "npu"):
        return StaticRunner(name, model, batch, args, dev)
    return KernelRunner(name, model, batch, args, plan)


def run_backend(name, model, prompt, args, dev, shared, base, plan="auto"):
    """Set up backend ``name`` with ``plan`` and measure it on ``prompt``: the warm-up (which
    compiles), the prefill, free-running greedy decode steps, then the token agreement against
    ``base`` (the megakernel's tokens [B, N]; for the megakernel, its own, or those of the
    megakernel under the run's first plan) under teacher forcing. Returns (row, free-running
    tokens)."""
    B = prompt.shape[0]
    compiled = name in ("torch-compile", "hf-compile")
    row = {"backend": name,
           "implementation": (NPU_IMPLEMENTATION if dev.type == "npu" else {}).get(name, IMPLEMENTATION[name])}
    if compiled:
        torch._dynamo.reset()   # a fresh compile per setting: no stale graphs, no recompile limit
    watch = CudaGraphWatch(dev)
    t0 = time.perf_counter()
    with watch:
        runner = make_runner(name, model, B, args, dev, shared, plan)
        row.update(runner.plan.record() if hasattr(runner, "plan") else {"plan": None})
        row["setup_s"] = round(time.perf_counter() - t0, 2)
        n = args.max_new_tokens
        warmup = args.warmup if dev.type != "cpu" else 0
        if compiled:
            warmup = max(warmup, 1)     # compile here, not in a timed step
        t1 = time.perf_counter()
        for _ in range(warmup):
            tok = runner.prefill(prompt)
            left = n - 1
            # compiled peers: three steps at least, so that the graph is recorded before timing
            for _ in range(3 if compiled else 1):
                if left > 0:
                    k = min(runner.per_launch, left)
                    tok = runner.steps(tok, k)[:, -1]
                    left -= k
        _sync(dev)
        row["compile_s"] = round(time.perf_counter() - t1, 2) if warmup else None
        tokens, times, pre = _time_decode(runner, prompt, n, dev, reps=3 if dev.type != "cpu" else 1)
        runner.finish(args)
        if name == "megakernel" and base is None:
            base = tokens     # its own launches of one step, fed its tokens, must give them back
        if base is not None:
            row["token_agreement"] = round(_agreement(runner, prompt, base, dev), 4)
            row["tokens_match"] = row["token_agreement"] == 1.0
    if compiled:
        row.update(watch.report())
    row["steps_per_launch"] = runner.per_launch
    row.update(pre)
    times.sort()
    med = statistics.median(times) if times else None
    row.update(ms_per_step=med, ms_per_step_p10=_pct(times, 10), ms_per_step_p90=_pct(times, 90),
               tokens_per_s=B * 1e3 / med if med else None)
    del runner
    if compiled:
        torch._dynamo.reset()   # frees the graphs' memory pools before the next backend
    return row, tokens


def _time_decode(runner, prompt, n, dev, reps):
    """Time ``reps`` prefills (median; the time to the first token is the wall time until the
    first tokens are on the host) and then n - 1 free-running steps, launched ``per_launch`` at a
    time and each counted as a k-th of its launch. Returns (tokens [B, n], step ms, prefill dict)."""
    B, P = prompt.shape
    pre_ms, ttft = [], []
    for _ in range(reps):
        _sync(dev)
        w0 = time.perf_counter()
        with Timer(dev) as t:
            tok = runner.prefill(prompt)
        first = tok.cpu()
        ttft.append((time.perf_counter() - w0) * 1e3)
        _sync(dev)
        pre_ms.append(t.ms())
    prefill_ms = statistics.median(pre_ms)
    out, timers = [first], []
    left = n - 1
    while left > 0:
        k = min(runner.per_launch, left)
        with Timer(dev) as t:
            toks = runner.steps(tok, k)
        out += list(toks.unbind(1))
        tok = out[-1]
        timers += [(t, k)] * k
        left -= k
    _sync(dev)
    pre = {"prefill_ms": prefill_ms, "prompt_tokens_per_s": B * P * 1e3 / prefill_ms if prefill_ms else None,
           "ttft_ms": statistics.median(ttft)}
    return torch.stack([t.cpu() for t in out], 1), [t.ms() / k for t, k in timers], pre


@torch.no_grad()
def _agreement(runner, prompt, base, dev) -> float:
    """Teacher forcing: prefill, then feed the base's token i and compare the argmax with its token
    i + 1. The fraction of the base's [B, N] tokens matched."""
    pred = [runner.prefill(prompt).cpu()]
    for i in range(base.shape[1] - 1):
        pred.append(runner.forced(base[:, i].contiguous().to(dev)).cpu())   # strides as free-running
    return (torch.stack(pred, 1) == base).float().mean().item()


def _pct(xs, p):
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def _torchair_superkernel(step):
    """The SuperKernel baseline on an Ascend NPU, written to TorchAir's documented API (not run
    here: no NPU is reachable): the decode step compiled in static-graph mode with its body in one
    ``torchair.scope.super_kernel`` scope, so the graph engine fuses its ops into one launch."""
    import torchair
    from torchair.configs.compiler_config import CompilerConfig

    config = CompilerConfig()
    config.mode = "max-autotune"        # static graph (GE) mode, which SuperKernel requires

    def scoped(tok, pos):
        with torchair.scope.super_kernel("decode_step", ""):
            return step(tok, pos)
    return torch.compile(scoped, backend=torchair.get_npu_backend(compiler_config=config), dynamic=False,
                         fullgraph=True)


def write_trace(backend, path):
    """Chrome/Perfetto trace of the last step: one track per worker, one slice per instruction."""
    from scheduler.ops import Op
    events = backend.trace_events()
    t0 = min(e[3] for e in events if e[3] > 0)
    # phases: microseconds after the instruction's start at which the tile reached each stamp
    trace = [{"name": Op(ins.op).name, "ph": "X", "pid": 0, "tid": w, "ts": (s - t0) / 1e3,
              "dur": max(0.0, (e - s) / 1e3),
              "args": {"layer": ins.layer, "tiles": [ins.tile_start, ins.tile_end],
                       "sm": sm, **{k: round((v - s) / 1e3, 3) for k, v in ph.items() if v > 0}}}
             for w, i, ins, s, e, ph, sm in events if s > 0]
    with open(path, "w") as f:
        json.dump({"traceEvents": trace, "displayTimeUnit": "ns"}, f)
    log(f"trace: {len(trace)} instructions written to {path}")


def plot(result, path):
    """ms/step per backend over batch size (several batches), else over prompt length (several
    lengths), else one bar per backend; the bandwidth floor dashed."""
    from pathlib import Path
    rows = [r for r in result["results"] if r.get("ms_per_step") is not None]
    title = f"{result['model']} {result['dtype']} on {result['device']}"
    batches = sorted({r["batch_size"] for r in rows})
    lens = sorted({r["prompt_len"] for r in rows})
    if len(batches) > 1 or len(lens) > 1:
        x = "batch_size" if len(batches) > 1 else "prompt_len"
        fixed = {"prompt_len": lens[0]} if x == "batch_size" else {"batch_size": batches[0]}
        pick = [dict(r, time="", device="", model="", dtype="") for r in rows]
        series = table._latest_series(pick, x, "ms_per_step", fixed)
        floor = table._latest_series(pick, x, "floor_ms", {**fixed, "backend": "megakernel"}).get("megakernel")
        table.plot_series(series, "batch size" if x == "batch_size" else "prompt length", "ms per decode step",
                          title, Path(path), floor)
    else:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.bar([r["backend"] for r in rows], [r["ms_per_step"] for r in rows], color="tab:blue")
        floor = rows[0].get("floor_ms") if rows else None
        if floor:
            ax.axhline(floor, color="tab:red", linestyle="--", label=f"floor {floor:.3f} ms")
            ax.legend()
        ax.set_ylabel("ms per decode step (median)")
        ax.set_title(f"{title}, batch {batches[0] if batches else '-'}", fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
    log(f"plot written to {path}")


# ---------------------------------------------------------------------------------------------
# Command line


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except where the default depends on the device (the help says how)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _int_list(flag: str, text: str, least: int = 1) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes integers separated by commas, got {text!r}") from None
    if not values:
        raise UsageError(f"{flag} is empty")
    bad = [v for v in values if v < least]
    if bad:
        raise UsageError(f"{flag} values must be at least {least}, got {bad[0]}")
    return list(dict.fromkeys(values))


def parse_args(argv=None) -> argparse.Namespace:
    doc = __doc__.split("\n\n")
    title = doc[0].split(": ", 1)[1]
    title = title[0].upper() + title[1:]
    p = _Parser(prog="python -m megakernel.bench", description=f"{title} {doc[2]}".replace("\n", " "),
                formatter_class=_Formatter)
    p.add_argument("-m", "--model", default=None,
                   help="size alias (0.6b 1.7b 4b 8b 14b 32b), Hugging Face repo id, checkpoint folder, or tiny "
                        "(a 2-layer random model); default 0.6b on a GPU, tiny on the CPU")
    p.add_argument("--random-weights", action="store_true",
                   help="deterministic random weights of the model's shapes (no download)")
    p.add_argument("--quantize", choices=("fp8",), default=None,
                   help="fp8: the linear projections in block FP8 (Qwen's -FP8 format), quantized on load, read by "
                        "the kernels' FP8 tiles; the floor counts their bytes. Peers outside the kernel backends "
                        "run 16-bit weights only, so the default comparison is then the kernel backends'")
    p.add_argument("--fp8-activations", choices=("dynamic", "none"), default=None,
                   help="FP8 weights: how the projections take their inputs: dynamic (w8a8: e4m3 per 128 values, quantized at run time, the scheme Qwen's FP8 checkpoints declare; the default) or none (weight-only FP8, 16-bit inputs)")
    p.add_argument("--compare", default=None, metavar="NAME[,NAME...]",
                   help=f"backends to run besides the megakernel, comma-separated, from: {', '.join(PEERS)}; "
                        f"default {DEFAULT_COMPARE['cuda']} on a GPU, {DEFAULT_COMPARE['cpu']} on the CPU, "
                        f"hf with --prefill-only")
    p.add_argument("--batch-size", default="1", metavar="B[,B...]",
                   help="batch size, or several separated by commas (1,4,8,16)")
    p.add_argument("--prompt-len", default=None, metavar="P[,P...]",
                   help="prompt length, or several separated by commas (128,1024,4096); "
                        f"default {GPU_DEFAULTS['prompt_len']} on a GPU, {CPU_DEFAULTS['prompt_len']} on the CPU")
    p.add_argument("-n", "--max-new-tokens", "--new-tokens", dest="max_new_tokens", type=int, default=None,
                   metavar="N",
                   help="tokens generated per sequence (the first comes from the prefill; 1 times the prefill "
                        f"only); default {GPU_DEFAULTS['max_new_tokens']} on a GPU, "
                        f"{CPU_DEFAULTS['max_new_tokens']} on the CPU")
    p.add_argument("--prefill-only", action="store_true",
                   help="time the prefill only (the same as --max-new-tokens 1): long prompts stay cheap")
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="KV cache length; default the longest prompt + max-new-tokens + 8")
    p.add_argument("--plan", default="auto", metavar="PLAN[,PLAN...]",
                   help="the kernels' tile plan: auto (tuned where python -m megakernel.tune cached one for this "
                        "device, model, batch and max_seq_len, else rules), rules or tuned; rules,tuned compares "
                        "the two in one run (each plan's rows record it)")
    p.add_argument("--warmup", type=int, default=2, help="untimed prefill + decode rounds before timing (accelerators)")
    p.add_argument("--steps-per-launch", type=int, default=64,
                   help="decode steps per launch of the megakernel (greedy), 1 to 64, as generate() runs them; "
                        "a launch's time counts as that many steps of equal time")
    p.add_argument("--device", default=None, help="cpu, cuda or npu; default the best available")
    p.add_argument("--tp", type=tp_mod.parse_tp, default=1,
                   help="tensor parallel degree: the model split over this many GPUs, one process each (started "
                        "here, or by torchrun); rank 0 prints and records. Peers: per-op, cuda-graph, superkernel")
    p.add_argument("--seed", type=int, default=None, help="prompt seed; default a fresh one each run (recorded)")
    p.add_argument("--force-cpu", action="store_true",
                   help=f"run a model of more than {CPU_MAX_PARAMS // 1_000_000}M parameters on the CPU anyway "
                        f"(Triton's interpreter: minutes a step); --prefill-only needs no forcing")
    p.add_argument("--output-json", default=None, help="also write the JSON result (the last stdout line) here")
    p.add_argument("--record", default=None,
                   help="append one row per backend and setting to this results table (bench/results.jsonl)")
    p.add_argument("--plot", default=None, help="draw ms/step per backend into this PNG file")
    p.add_argument("--trace", default=None,
                   help="write the megakernel's per-instruction timeline of its last setting here (Perfetto JSON)")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.batch_sizes = _int_list("--batch-size", args.batch_size)
    if args.prefill_only:
        if args.max_new_tokens not in (None, 1):
            raise UsageError(f"--prefill-only times no decode step, but --max-new-tokens is {args.max_new_tokens}")
        args.max_new_tokens = 1
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.prompt_len is not None:
        args.prompt_lens = _int_list("--prompt-len", args.prompt_len)
    if args.max_seq_len is not None and args.max_seq_len < 2:
        raise UsageError(f"--max-seq-len must be at least 2, got {args.max_seq_len}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be at least 0, got {args.warmup}")
    from .backends import MAX_STEPS_PER_LAUNCH
    if not 1 <= args.steps_per_launch <= MAX_STEPS_PER_LAUNCH:
        raise UsageError(f"--steps-per-launch must be between 1 and {MAX_STEPS_PER_LAUNCH}, "
                         f"got {args.steps_per_launch}")
    if args.compare is not None:
        args.compare_list = _backends(args.compare)
    args.plans = list(dict.fromkeys(x.strip() for x in args.plan.split(",") if x.strip()))
    bad = [x for x in args.plans if x not in ("auto", "rules", "tuned")]
    if bad or not args.plans:
        raise UsageError(f"--plan takes auto, rules or tuned (comma-separated), got {args.plan!r}")
    for flag in ("output_json", "record", "plot", "trace"):
        path = getattr(args, flag)
        if path is not None:
            try:
                table.check_writable(path, "--" + flag.replace("_", "-"))
            except ValueError as e:
                raise UsageError(str(e)) from None
    return args


def _backends(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in names if c not in PEERS and c != "megakernel"]
    if bad:
        raise UsageError(f"unknown backend {bad[0]!r} in --compare: choose from {', '.join(PEERS)}")
    return [c for c in dict.fromkeys(names) if c != "megakernel"]


def settle(args, dev):
    """Fill in the device-dependent defaults and check that the settings fit together (before any
    model is loaded)."""
    on_cpu = dev.type == "cpu"
    if args.trace and dev.type != "cuda":
        raise UsageError("--trace reads the GPU's clocks in the kernel: it needs a CUDA GPU")
    d = CPU_DEFAULTS if on_cpu else GPU_DEFAULTS
    if args.model is None:
        args.model = d["model"]
    if args.prompt_len is None:
        args.prompt_lens = _int_list("--prompt-len", d["prompt_len"])
    if args.max_new_tokens is None:
        args.max_new_tokens = d["max_new_tokens"]
    if args.compare is None and args.tp > 1:
        args.compare_list = _backends("cuda-graph" if dev.type == "cuda" else "per-op")
    elif args.compare is None:
        args.compare_list = _backends("hf" if args.max_new_tokens == 1 else DEFAULT_COMPARE.get(dev.type, "per-op"))
        if args.quantize:
            args.compare_list = [c for c in args.compare_list if c in KERNEL_BACKENDS]
    if args.quantize:
        other = [c for c in args.compare_list if c not in KERNEL_BACKENDS]
        if other:
            raise UsageError(f"--compare {other[0]} runs 16-bit weights only, not --quantize fp8: compare it in a "
                             f"run without --quantize (kernel peers: {', '.join(KERNEL_BACKENDS)})")
        devices.check_fp8(dev)
    need = max(args.prompt_lens) + max(args.max_new_tokens - 1, 1)   # the prompt, then every decoded token
    if args.max_seq_len is None:
        args.max_seq_len = max(args.prompt_lens) + args.max_new_tokens + 8
    elif args.max_seq_len < need:
        raise UsageError(f"--max-seq-len {args.max_seq_len} is too short for a {max(args.prompt_lens)}-token "
                         f"prompt and {args.max_new_tokens} new tokens (needs {need})")
    if on_cpu and args.model != "tiny" and not args.force_cpu:
        cfg = _config_of(args.model)
        if cfg is not None and cfg.num_parameters() > CPU_MAX_PARAMS:
            if not args.prefill_only:
                raise UsageError(_cpu_refusal(args.model, cfg.num_parameters()))
            # a prefill runs torch's ops, not the interpreter: slow on a CPU, but it ends
            print(f"note: {args.model} prefill on the CPU: torch's ops, tens of seconds per 1k prompt tokens at "
                  f"0.6b, more for longer prompts and larger models", file=sys.stderr)


def _cpu_refusal(name, params):
    return (f"{name} has {params / 1e6:,.0f}M parameters; on the CPU the kernels run through Triton's interpreter, "
            f"minutes a decode step: run on a GPU, leave out --model for the tiny CPU model, or pass --force-cpu")


def _config_of(name):
    """The model's shapes without loading it: a size alias or a checkpoint folder; None otherwise."""
    from pathlib import Path
    from models.qwen3.config import Qwen3Config
    from models.qwen3.weights import preset_for
    cfg = preset_for(name)
    folder = Path(name).expanduser()
    if cfg is None and (folder / "config.json").is_file():
        try:
            cfg = Qwen3Config.from_json(folder / "config.json")
        except (OSError, ValueError):
            return None   # load_model reports it
    return cfg


def _fp8_words(run: dict) -> str:
    """The card's words for a run's FP8 scheme ("" for 16-bit weights)."""
    if not run.get("quantization"):
        return ""
    return {"dynamic": ", fp8 projections, w8a8 (activations e4m3 per 128)",
            "none": ", fp8 projections, weight-only"}.get(run.get("fp8_activations"), ", fp8 projections")


def tiny_model(dev, dtype=None, quantize=None):
    """A 2-layer random Qwen3 of toy shapes: the bench's default on the CPU, where the kernels run
    through Triton's interpreter. Its timings say nothing about a GPU."""
    from models.qwen3.config import Qwen3Config
    from models.qwen3.weights import random_weights
    from .model import Qwen3Model
    cfg = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=512)
    w = random_weights(cfg, seed=0, dtype=dtype or devices.default_dtype(dev), device=dev, quantize=quantize)
    return Qwen3Model("tiny", cfg, w, None, None)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the bench is, like Ctrl-C: the finished rows are kept."""


def _on_sigterm(signum, frame):
    raise Terminated()


def main(argv=None):
    import signal
    try:
        # SIGTERM (a timeout, a job scheduler) ends the run as Ctrl-C does: what finished is kept
        old_term = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:      # not the main thread: leave SIGTERM alone
        old_term = None
    try:
        args = parse_args(argv)
        result = bench(args)
        if "tp_status" in result:       # the ranks' processes ran it
            return result["tp_status"]
    except (UsageError, ValueError, RuntimeError, OSError, MemoryError) as e:
        sys.stdout.flush()
        print(f"error: {' '.join(str(e).split()) or type(e).__name__}", file=sys.stderr)
        return 2
    except Terminated:
        print("\nterminated (SIGTERM)", file=sys.stderr)
        return 143      # 128 + SIGTERM, as a shell reports a process the signal ended
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130      # 128 + SIGINT
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    print(json.dumps(result))
    return 0


def bench(args) -> dict:
    """Run every setting; each row is printed (and with --record appended) as it finishes. Cut
    short (Ctrl-C, SIGTERM, an error), the rows that finished are printed and written with
    ``partial`` set, and the exception goes on to ``main``."""
    from . import load_model
    dev = devices.resolve(args.device)
    settle(args, dev)
    rank = 0
    if args.tp > 1:
        if args.model == "tiny":
            raise UsageError("--tp needs a model size or checkpoint (--model), not the tiny CPU default")
        bad = [c for c in args.compare_list if c not in TP_PEERS]
        if bad:
            raise UsageError(f"--compare {bad[0]} does not run tensor parallel: at --tp choose from {', '.join(TP_PEERS)}")
        from .model import locate_model
        source = locate_model(args.model, random_weights=args.random_weights)
        status, dev = tp_mod.start(args.tp, dev, source.config, "megakernel.bench:main", args.argv,
                                   args.quantize or source.quantization)
        if status is not None:
            return {"tp_status": status}
        rank = tp_mod.current().rank
    if args.model == "tiny":
        model = tiny_model(dev, quantize=args.quantize)
    else:
        model = load_model(args.model, random_weights=args.random_weights, device=dev, quantize=args.quantize,
                           tp=args.tp, rank=rank)
        if (dev.type == "cpu" and model.config.num_parameters() > CPU_MAX_PARAMS and not args.force_cpu
                and not args.prefill_only):
            raise UsageError(_cpu_refusal(args.model, model.config.num_parameters()))
    cfg = model.config
    if args.fp8_activations and not model.quantization:
        raise UsageError("--fp8-activations is for FP8 weights: add --quantize fp8 (or bench an -FP8 checkpoint)")
    from .runtime import fp8_scheme
    from . import plans
    # the scheme resolved once (a warning at TP, where nobody chose): the runners, the plan key and the rows
    args.fp8_activations = fp8_scheme(model.quantization, args.fp8_activations, args.tp)
    for B in args.batch_sizes if "tuned" in args.plans else ():     # a missing tuned plan: before any timing
        plans.choose("tuned", dev, cfg, model.dtype, B, args.max_seq_len, "megakernel", args.model, tp=args.tp,
                     quant=plans.quant_name(model.weights.quantization, args.fp8_activations == "dynamic"))
    seed = args.seed if args.seed is not None else int(time.time())
    g = torch.Generator().manual_seed(seed)
    bw = copy_bandwidth_gbps(dev)
    run = {**table.run_header("megakernel.bench", args.argv), "device": _device_name(dev), "model": args.model, "weights": "random" if model.random_weights else str(model.checkpoint),
           "dtype": str(model.dtype).replace("torch.", ""), "quantization": model.quantization,
           "fp8_activations": args.fp8_activations,
           "copy_gbps": round(bw, 1) if bw else None,
           "prompt_seed": seed, "tp": args.tp}
    result = {**run, "batch_sizes": args.batch_sizes, "prompt_lens": args.prompt_lens,
              "new_tokens": args.max_new_tokens, "max_seq_len": args.max_seq_len,
              "backends": ["megakernel"] + args.compare_list, "plans": args.plans, "results": []}
    shared = {}
    writer = rank == 0      # with --tp, rank 0 alone prints rows and writes files

    def emit(row):
        """A finished row: its ratios to the rows before it, then recorded and printed at once
        (recorded first: a row that was printed is in --record whenever a Ctrl-C comes after it)."""
        _finish_row(row, result["results"])
        if writer and args.record:
            table.append_rows(args.record, [{**run, **row}])
        result["results"].append(row)
        if writer:
            print_row(row, first=len(result["results"]) == 1)

    try:
        print_card(result, model)
        for B in args.batch_sizes:
            for P in args.prompt_lens:
                prompt = torch.randint(0, cfg.vocab_size, (B, P), generator=g)
                run_setting(model, prompt, args, dev, bw, shared, emit)
    except BaseException:
        if writer:
            _keep_partial(result, run, args)
        raise
    if writer:
        _write_outputs(result, args)
        print_tables(result)
    return result


def run_setting(model, prompt, args, dev, bw, shared, emit):
    """Every backend at one batch size and prompt length, under each plan of --plan; the megakernel
    first, as the base of its plan's token agreement (a later plan's megakernel is compared with
    the first's). Backends that run no plan run once, with the first. Each row goes to ``emit``
    the moment its backend finishes."""
    from .plans import PLANNED_BACKENDS
    B, P = prompt.shape
    n = args.max_new_tokens
    positions = [P + i for i in range(n - 1)]
    nbytes = statistics.mean(step_bytes(model, [p] * B) for p in positions) if positions else None
    floor_ms = nbytes / (bw * 1e9) * 1e3 if (bw and nbytes) else None
    first = None
    runs = [(plan, name) for k, plan in enumerate(args.plans) for name in ["megakernel"] + args.compare_list
            if k == 0 or name in PLANNED_BACKENDS]
    for plan, name in runs:
        if name == "megakernel":
            base = first
        tag = f", plan {plan}" if len(args.plans) > 1 and name in PLANNED_BACKENDS else ""
        log(f"[batch {B}, prompt {P}{tag}] {name} ...")
        try:
            row, toks = run_backend(name, model, prompt, args, dev, shared, base, plan)
            if name == "megakernel":
                first = first if first is not None else toks
                base = toks
        except KeyboardInterrupt:
            raise
        except Exception as e:  # a failing backend is reported in its row; the others still run
            row = {"backend": name, "implementation": IMPLEMENTATION[name],
                   "plan": plan if name in PLANNED_BACKENDS else None,
                   "error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"}
            log(f"[batch {B}, prompt {P}] {name} failed: {row['error']}")
        med = row.get("ms_per_step")
        row.update(batch_size=B, prompt_len=P, new_tokens=n, max_seq_len=args.max_seq_len, floor_ms=floor_ms,
                   bytes_per_step=int(nbytes) if nbytes else None,
                   gbps=nbytes / (med * 1e-3) / 1e9 if (med and nbytes) else None,
                   pct_of_floor=100 * floor_ms / med if (med and floor_ms) else None)
        emit(row)


def _finish_row(r, earlier):
    """Ratios to rows that finished before (a row is printed and recorded as it finishes): to the
    megakernel of the same setting and plan, or of the first plan for a backend that runs none
    (the megakernel runs first in each setting); to batch 1 of the same backend, plan and prompt
    where batch 1 ran earlier (list it first). Every field present, floats rounded."""
    rows = earlier + [r]
    mk = b1 = None
    for x in rows:
        if mk is None and x["backend"] == "megakernel" and (x["batch_size"], x["prompt_len"]) == \
                (r["batch_size"], r["prompt_len"]) and (not r.get("plan") or x.get("plan") == r.get("plan")):
            mk = x.get("ms_per_step")
        if b1 is None and (x["backend"], x.get("plan"), x["batch_size"], x["prompt_len"]) == \
                (r["backend"], r.get("plan"), 1, r["prompt_len"]):
            b1 = x.get("ms_per_step")
    m = r.get("ms_per_step")
    r["speedup_vs_megakernel"] = m / mk if (m and mk) else None
    r["ratio_to_batch1"] = m / b1 if (m and b1) else None
    for k in table.CONFIG_FIELDS + table.MEASURE_FIELDS:
        r.setdefault(k, None)
        if isinstance(r[k], float):
            r[k] = round(r[k], 4)


def _keep_partial(result, run, args):
    """A run cut short: print and write the rows that finished, each and the document marked
    ``partial``; the rows already in --record are marked there too. Nothing finished: the
    --output-json of an earlier run is left as it was. Further Ctrl-C/SIGTERM wait until done."""
    import signal
    rows = result["results"]
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)} \
        if _main_thread() else {}
    try:
        result["partial"] = True
        for r in rows:
            r["partial"] = True
        if not rows:
            if args.output_json:
                log(f"no row finished: {args.output_json} left as it was")
            return
        if args.record:
            n = table.mark_partial(args.record, run)
            log(f"{n} rows in {args.record} marked partial")
        _write_outputs(result, args)
        print_tables(result)
        print(json.dumps(result), flush=True)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _write_outputs(result, args):
    """The JSON file (whole or not at all: a temporary file renamed over it) and the plot; the
    table rows went to --record as they finished."""
    if args.output_json:
        import os
        tmp = f"{args.output_json}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(json.dumps(result, indent=1) + "\n")
        os.replace(tmp, args.output_json)
        if result.get("partial"):
            log(f"{len(result['results'])} finished rows written to {args.output_json}, marked partial")
    if args.record and result["results"] and not result.get("partial"):
        log(f"{len(result['results'])} rows appended to {args.record}")
    if args.plot and any(r.get("ms_per_step") for r in result["results"]):
        plot(result, args.plot)


def _device_name(dev) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "npu":
        return f"Ascend NPU {torch.npu.get_device_name(dev)}"
    return "cpu (Triton interpreter: timings are not GPU timings)"


def print_card(r, model):
    print(f"device      {r['device']}")
    print(f"versions    {' '.join(f'{k} {v}' for k, v in r['versions'].items())}")
    dirty = " (uncommitted changes)" if r["git_dirty"] else ""
    code = r["git_commit"] or "commit unknown (not a git checkout; MEGAKERNEL_GIT_COMMIT names it)"
    print(f"code        {code}{dirty}")
    print(f"model       {r['model']} ({r['weights']} weights, {model.config.num_parameters() / 1e6:,.1f}M "
          f"parameters) {r['dtype']}{_fp8_words(r)}")
    print(f"setting     batch {','.join(map(str, r['batch_sizes']))}; prompt {','.join(map(str, r['prompt_lens']))}; "
          f"{r['new_tokens']} new tokens; max_seq_len {r['max_seq_len']}; prompt seed {r['prompt_seed']}")
    print(f"plan        {', '.join(r['plans'])} (the kernels' tiles: rules, tuned by python -m megakernel.tune, "
          f"or auto, tuned where cached)")
    bw = f"{r['copy_gbps']:.0f} GB/s" if r["copy_gbps"] else "not measured (no GPU)"
    print(f"copy bw     {bw}")
    print(f"weights     {model.weights.nbytes() / 1e6:.1f} MB read each step, plus every sequence's KV cache")
    sys.stdout.flush()


def _plan_cell(r) -> str:
    """The decode table's plan column: rules, tuned and its date, or - (the backend runs no plan)."""
    if r.get("plan") == "tuned" and r.get("plan_tuned_at"):
        return f"tuned {r['plan_tuned_at'][:10]}"
    return r.get("plan") or "-"


ROW_HEAD = (f"{'batch':>5}{'prompt':>7}  {'backend':<14}{'plan':<17}{'ms/step':>9}{'p10':>9}{'p90':>9}{'tok/s':>10}"
            f"{'x b1':>7}{'% floor':>8}{'vs mk':>7}{'prefill ms':>11}{'TTFT ms':>9}{'agree':>7}")


def _cell(v, w, d=3):
    return f"{v:>{w}.{d}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"


def print_row(r, first=False):
    """One finished row, printed the moment its backend finishes (the tables at the end sort them)."""
    if first:
        print("\nrows as they finish (x b1: ms/step over batch 1's; vs mk: over the megakernel's):")
        print(ROW_HEAD)
    lead = f"{r['batch_size']:>5}{r['prompt_len']:>7}  {r['backend']:<14}{_plan_cell(r):<17}"
    if r.get("error"):
        print(f"{lead}ERROR: {r['error']}", flush=True)
        return
    print(f"{lead}{_cell(r['ms_per_step'], 9)}{_cell(r['ms_per_step_p10'], 9)}{_cell(r['ms_per_step_p90'], 9)}"
          f"{_cell(r['tokens_per_s'], 10, 1)}{_cell(r['ratio_to_batch1'], 7, 2)}{_cell(r['pct_of_floor'], 8, 1)}"
          f"{_cell(r['speedup_vs_megakernel'], 7, 2)}{_cell(r['prefill_ms'], 11, 2)}{_cell(r['ttft_ms'], 9, 2)}"
          f"{_cell(r['token_agreement'], 7, 3)}", flush=True)


def print_tables(result):
    f = lambda v, w, d=3: f"{v:>{w}.{d}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"  # noqa: E731
    rows = result["results"]
    decode = [r for r in rows if r.get("ms_per_step") is not None or r.get("error")]
    if result["new_tokens"] > 1:
        for P in result["prompt_lens"]:
            mine = [r for r in decode if r["prompt_len"] == P]
            if not mine:
                continue
            print(f"\ndecode, prompt {P}, {result['new_tokens']} new tokens (floor: ms/step at the copy "
                  f"bandwidth; x b1: ms/step over batch 1's; vs mk: over the megakernel's):")
            print(f"{'batch':>5}{'floor':>7}  {'backend':<14}{'plan':<17}{'ms/step':>9}{'p10':>9}{'p90':>9}{'tok/s':>10}"
                  f"{'x b1':>8}{'GB/s':>8}{'% floor':>9}{'vs mk':>8}{'compile s':>10}{'agree':>7}  graphs")
            for r in mine:
                if r.get("error"):
                    print(f"{r['batch_size']:>5}{'':>7}  {r['backend']:<14}{_plan_cell(r):<17}ERROR: {r['error']}")
                    continue
                graphs = {True: "yes", False: f"NO: {r.get('cudagraph_skip')}", None: ""}[r.get("cuda_graphs")]
                print(f"{r['batch_size']:>5}{f(r['floor_ms'], 7)}  {r['backend']:<14}{_plan_cell(r):<17}"
                      f"{f(r['ms_per_step'], 9)}"
                      f"{f(r['ms_per_step_p10'], 9)}{f(r['ms_per_step_p90'], 9)}{f(r['tokens_per_s'], 10, 1)}"
                      f"{f(r['ratio_to_batch1'], 8, 2)}{f(r['gbps'], 8, 0)}{f(r['pct_of_floor'], 9, 1)}"
                      f"{f(r['speedup_vs_megakernel'], 8, 2)}{f(r['compile_s'], 10, 1)}"
                      f"{f(r['token_agreement'], 7, 3)}  {graphs}")
    print("\nprefill (median of the timed prefills; TTFT: until the first tokens are on the host):")
    print(f"{'prompt':>6}{'batch':>6}  {'backend':<14}{'prefill ms':>11}{'prompt tok/s':>14}{'TTFT ms':>10}")
    for r in sorted(rows, key=lambda r: (r["prompt_len"], r["batch_size"])):
        if r.get("error"):
            if result["new_tokens"] == 1:
                print(f"{r['prompt_len']:>6}{r['batch_size']:>6}  {r['backend']:<14}ERROR: {r['error']}")
            continue
        print(f"{r['prompt_len']:>6}{r['batch_size']:>6}  {r['backend']:<14}{f(r['prefill_ms'], 11, 2)}"
              f"{f(r['prompt_tokens_per_s'], 14, 0)}{f(r['ttft_ms'], 10, 2)}")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
