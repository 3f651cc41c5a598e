"""``python -m megakernel.bench``: the megakernel against the baselines and peers, in one process.

    python -m megakernel.bench --model 0.6b --compare per-op,superkernel,cuda-graph,torch-compile,hf

Every backend decodes the same prompt with the same weights. Per backend: prefill time, per-step
decode times (device events; median, p10, p90), tokens/s, achieved GB/s (bytes the step must
read over its time), % of the floor, and whether its greedy tokens match the megakernel's. The
floor is the bytes a step must read (every weight once plus the KV cache up to each position) over
the device-to-device copy bandwidth measured in this run. Prints a card, a table, and as the last
stdout line one JSON object (also written to ``--output-json``); ``--plot`` draws ms/token per
backend with the floor; ``--trace`` writes the megakernel's per-instruction timeline (Perfetto).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import megakernel  # noqa: F401  (selects the device before any kernel module loads)

import torch

PEERS = ("per-op", "superkernel", "cuda-graph", "torch-compile", "hf", "reference")


def log(msg: str):
    print(msg, file=sys.stderr, flush=True)


def _accel(device):
    """torch.cuda or torch.npu (the same Event/synchronize API), or None on the CPU."""
    return {"cuda": torch.cuda, "npu": getattr(torch, "npu", None)}.get(device.type)


IMPLEMENTATION = {   # what each backend name runs, per device type, reported in every result
    "megakernel": "persistent kernel, counter waits",
    "superkernel": "persistent kernel, grid-wide barrier between stages",
    "per-op": "one launch per stage (phase launches)",
    "cuda-graph": "per-op launches in one CUDA graph",
    "torch-compile": "reference under torch.compile(mode='reduce-overhead')",
    "hf": "transformers Qwen3ForCausalLM",
    "reference": "torch reference, eager",
}
NPU_IMPLEMENTATION = {"superkernel": "TorchAir torchair.scope.super_kernel over the reference's decode step"}


class Timer:
    """Device-event timing on an accelerator, wall clock on the CPU."""

    def __init__(self, device):
        self.api = _accel(device)
        self.cuda = self.api is not None

    def __enter__(self):
        if self.cuda:
            self.a, self.b = self.api.Event(enable_timing=True), self.api.Event(enable_timing=True)
            self.a.record()
        else:
            self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.b.record()
        else:
            self.ms_ = (time.perf_counter() - self.t) * 1e3

    def ms(self) -> float:
        return self.a.elapsed_time(self.b) if self.cuda else self.ms_


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


def step_bytes(model, batch: int, lengths: list[int]) -> int:
    """Bytes one decode step must read: every weight once, plus each sequence's KV cache up to and
    including its new position."""
    cfg, w = model.config, model.weights
    kv = sum(cfg.kv_bytes_per_position(w.dtype.itemsize) * (n + 1) for n in lengths)
    return w.nbytes() + kv


class HFRunner:
    """transformers' Qwen3ForCausalLM with the same weights, stepped with its own KV cache."""

    def __init__(self, model, batch):
        from transformers import Qwen3Config as HFConfig, Qwen3ForCausalLM
        from models.qwen3.weights import to_hf_state_dict
        cfg = model.config
        d = cfg.to_dict()
        d.pop("architectures", None)
        d["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
        hc = HFConfig(**{k: v for k, v in d.items() if k not in ("model_type", "torch_dtype")})
        with torch.device(model.weights.device):
            m = Qwen3ForCausalLM(hc).to(model.weights.dtype)
        m.load_state_dict(to_hf_state_dict(cfg, model.weights), strict=False)
        self.m = m.eval()
        self.batch = batch

    @torch.no_grad()
    def prefill(self, ids):
        out = self.m(input_ids=ids.to(self.m.device), use_cache=True)
        self.cache = out.past_key_values
        return out.logits[:, -1].float()

    @torch.no_grad()
    def step(self, tok):
        out = self.m(input_ids=tok[:, None], past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return out.logits[:, -1].float()


def run_backend(name, model, prompt, args, dev):
    """Set up backend ``name``, then time one prefill and ``new_tokens - 1`` greedy decode steps;
    returns (result dict, tokens [B, N])."""
    B = prompt.shape[0]
    res = {"backend": name}
    res["implementation"] = (NPU_IMPLEMENTATION if dev.type == "npu" else {}).get(name, IMPLEMENTATION[name])
    t0 = time.perf_counter()
    warmup = max(1, args.warmup) if dev.type != "cpu" else 0   # compile and warm up on an accelerator
    finish = None
    if name == "hf":
        runner = HFRunner(model, B)
        prefill = lambda: runner.prefill(prompt).argmax(-1)  # noqa: E731
        step = lambda tok, k: runner.step(tok).argmax(-1)[:, None]  # noqa: E731
    elif name == "torch-compile" or (name == "superkernel" and dev.type == "npu"):
        from models.qwen3.reference import KVCache, Qwen3Reference, decode_static
        cfg, w = model.config, model.weights
        cache = KVCache.allocate(cfg, B, args.max_seq_len, w.dtype, w.device)
        ref = Qwen3Reference(cfg, w, cache)
        body = lambda tok: decode_static(cfg, w, cache, tok)  # noqa: E731
        if name == "superkernel":   # on an Ascend NPU: TorchAir's SuperKernel fusion of the whole step
            fn = _torchair_superkernel(body)
        else:
            fn = torch.compile(body, mode="reduce-overhead", fullgraph=True)
        prefill = lambda: (cache.reset(), ref.prefill(list(prompt)).argmax(-1))[1]  # noqa: E731
        step = lambda tok, k: fn(tok).argmax(-1)[:, None].clone()  # noqa: E731
        warmup = 3      # compile and record the graph, on any device
    else:
        from . import MegaQwen3
        opts = {"trace": True} if name == "megakernel" and args.trace else {}
        mk = MegaQwen3(model, max_seq_len=args.max_seq_len, batch_size=B, backend=name, **opts)
        prefill = lambda: (mk.prefill(prompt), mk.tokens.long())[1]  # noqa: E731
        res["steps_per_launch"] = min(args.steps_per_launch, mk.steps_per_launch)
        step = lambda tok, k: mk.steps(k, per_launch=k)  # noqa: E731

        def finish_kernel():
            if hasattr(mk.backend, "synchronize"):
                mk.backend.synchronize()     # raises a timed-out wait of the last steps
            if name == "megakernel" and args.trace:
                write_trace(mk.backend, args.trace)
        finish = finish_kernel
    tokens, times, prefill_ms, setup_s = _time_decode(prefill, step, args.new_tokens, warmup, dev, t0,
                                                      res.get("steps_per_launch", 1))
    if finish is not None:
        finish()
    times.sort()
    med = statistics.median(times) if times else None
    res.update(prefill_ms=prefill_ms, setup_s=round(setup_s, 2),
               ms_per_token_median=med, ms_per_token_p10=_pct(times, 10), ms_per_token_p90=_pct(times, 90),
               tokens_per_s=B * 1e3 / med if med else None)
    return res, tokens


def _time_decode(prefill, step, n, warmup, dev, t0, per_launch=1):
    """Warm up, then time one prefill and n - 1 steps with device events. ``prefill()`` returns the
    first tokens [B]; ``step(tok, k)`` the next k (at most ``per_launch``; backends that run one step
    at a time get k = 1) as [B, k], timed as a whole and counted as k steps of a k-th of its time
    each. Returns (tokens [B, n], step ms, prefill ms, setup s since ``t0``)."""
    for _ in range(warmup):
        step(prefill(), min(per_launch, n - 1))
    _sync(dev)
    setup_s = time.perf_counter() - t0
    with Timer(dev) as tp:
        tok = prefill()
    _sync(dev)
    out, timers = [tok], []
    left = n - 1
    while left > 0:
        k = min(per_launch, left)
        with Timer(dev) as t:
            toks = list(step(tok, k).unbind(1))
        out += toks
        tok = toks[-1]
        timers += [(t, k)] * k
        left -= k
    _sync(dev)
    return torch.stack(out, 1).cpu(), [t.ms() / k for t, k in timers], tp.ms(), setup_s


def _pct(xs, p):
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def _sync(dev):
    if _accel(dev) is not None:
        _accel(dev).synchronize()


def _torchair_superkernel(step):
    """The SuperKernel baseline on an Ascend NPU, written to TorchAir's documented API (not run
    here: no NPU is reachable): the decode step compiled in static-graph mode with its body in one
    ``torchair.scope.super_kernel`` scope, so the graph engine fuses its ops into one launch."""
    import torchair
    from torchair.configs.compiler_config import CompilerConfig

    config = CompilerConfig()
    config.mode = "max-autotune"        # static graph (GE) mode, which SuperKernel requires

    def scoped(tok):
        with torchair.scope.super_kernel("decode_step", ""):
            return step(tok)
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
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in result["results"] if r.get("ms_per_token_median")]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([r["backend"] for r in rows], [r["ms_per_token_median"] for r in rows], color="tab:blue")
    if result.get("floor_ms"):
        ax.axhline(result["floor_ms"], color="tab:red", linestyle="--", label=f"floor {result['floor_ms']:.3f} ms")
        ax.legend()
    ax.set_ylabel("ms / token (median)")
    ax.set_title(f"{result['model']} {result['dtype']} batch {result['batch_size']} on {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    log(f"plot written to {path}")


def versions():
    import triton
    v = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__}
    try:
        import transformers
        v["transformers"] = transformers.__version__
    except ImportError:
        pass
    return v


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m megakernel.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="0.6b")
    ap.add_argument("--compare", default="per-op,superkernel", help=f"comma list of: {', '.join(PEERS)}")
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--prompt-len", default="128", help="one length or a comma list")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--max-seq-len", type=int, default=None)
    ap.add_argument("--steps-per-launch", type=int, default=64,
                    help="decode steps per launch of the megakernel (greedy), 1 to 64, as generate() runs them; "
                         "a launch's time counts as that many steps of equal time")
    ap.add_argument("--device", default=None)
    ap.add_argument("--seed", type=int, default=None, help="prompt seed (default: fresh each run)")
    ap.add_argument("--output-json")
    ap.add_argument("--plot")
    ap.add_argument("--trace")
    args = ap.parse_args(argv)
    try:
        result = bench(args)
    except (ValueError, RuntimeError, OSError, MemoryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    line = json.dumps(result)
    if args.output_json:
        with open(args.output_json, "w") as f:
            f.write(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(result, args.plot)
    print(line)
    return 0


def bench(args):
    from . import load_model
    compare = [c for c in args.compare.split(",") if c]
    bad = [c for c in compare if c not in PEERS]
    if bad:
        raise ValueError(f"unknown backend {bad[0]!r} in --compare: choose from {', '.join(PEERS)}")
    lens = [int(x) for x in args.prompt_len.split(",")]
    from .backends import MAX_STEPS_PER_LAUNCH
    if not 1 <= args.steps_per_launch <= MAX_STEPS_PER_LAUNCH:
        raise ValueError(f"--steps-per-launch must be between 1 and {MAX_STEPS_PER_LAUNCH}")
    if args.new_tokens < 2:
        raise ValueError("--new-tokens must be at least 2")
    model = load_model(args.model, random_weights=args.random_weights, device=args.device)
    dev, cfg = model.device, model.config
    args.max_seq_len = args.max_seq_len or max(lens) + args.new_tokens + 8
    seed = args.seed if args.seed is not None else int(time.time())
    g = torch.Generator().manual_seed(seed)
    bw = copy_bandwidth_gbps(dev)
    out_results = []
    for plen in lens:
        prompt = torch.randint(0, cfg.vocab_size, (args.batch_size, plen), generator=g)
        positions = [plen + i for i in range(args.new_tokens - 1)]
        per_step = [step_bytes(model, args.batch_size, [p] * args.batch_size) for p in positions]
        nbytes = statistics.mean(per_step)
        floor_ms = nbytes / (bw * 1e9) * 1e3 if bw else None
        rows, base = [], None
        for name in ["megakernel"] + [c for c in compare if c != "megakernel"]:
            log(f"[{plen}] {name} ...")
            try:
                res, toks = run_backend(name, model, prompt, args, dev)
                if base is None:
                    base = toks
                match = (toks == base)
                res["tokens_match"] = bool(match.all())
                res["tokens_match_frac"] = round(match.float().mean().item(), 4)
            except Exception as e:  # a failing backend is reported; the others still run
                res = {"backend": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                       "tokens_match": None}
            med = res.get("ms_per_token_median")
            res["gbps"] = nbytes / (med * 1e-3) / 1e9 if med else None
            res["pct_of_floor"] = 100 * floor_ms / med if (med and floor_ms) else None
            rows.append(res)
        mk_ms = rows[0].get("ms_per_token_median")
        for r in rows:
            m = r.get("ms_per_token_median")
            r["speedup_vs_megakernel"] = (m / mk_ms) if (m and mk_ms) else None
            for k in ("prefill_ms", "ms_per_token_median", "ms_per_token_p10", "ms_per_token_p90", "tokens_per_s",
                      "gbps", "pct_of_floor", "speedup_vs_megakernel"):
                r.setdefault(k, None)
                if isinstance(r[k], float):
                    r[k] = round(r[k], 4)
        out_results.append((plen, nbytes, floor_ms, rows))
    plen, nbytes, floor_ms, rows = out_results[0]
    result = {
        "device": _device_name(dev),
        "versions": versions(), "command": "python -m megakernel.bench " + " ".join(sys.argv[1:]),
        "model": args.model, "weights": "random" if model.random_weights else str(model.checkpoint),
        "dtype": str(model.dtype).replace("torch.", ""), "batch_size": args.batch_size, "prompt_len": plen,
        "new_tokens": args.new_tokens, "prompt_seed": seed, "copy_gbps": round(bw, 1) if bw else None,
        "bytes_per_step": int(nbytes), "floor_ms": round(floor_ms, 4) if floor_ms else None, "results": rows,
    }
    if len(out_results) > 1:
        result["by_prompt_len"] = [{"prompt_len": p, "bytes_per_step": int(n), "floor_ms": f, "results": r}
                                   for p, n, f, r in out_results]
    print_card(result)
    for p, n, f, r in out_results:
        print_table(p, r)
    return result


def _device_name(dev) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "npu":
        return f"Ascend NPU {torch.npu.get_device_name(dev)}"
    return "cpu (Triton interpreter: timings are not GPU timings)"


def print_card(r):
    print(f"device      {r['device']}")
    print(f"versions    {' '.join(f'{k} {v}' for k, v in r['versions'].items())}")
    print(f"model       {r['model']} ({r['weights']} weights) {r['dtype']}, batch {r['batch_size']}, "
          f"prompt {r['prompt_len']}, {r['new_tokens']} new tokens")
    bw = f"{r['copy_gbps']:.0f} GB/s" if r["copy_gbps"] else "not measured (no GPU)"
    fl = f"{r['floor_ms']:.3f} ms/token" if r["floor_ms"] else "n/a"
    print(f"copy bw     {bw}")
    print(f"bytes/step  {r['bytes_per_step'] / 1e6:.1f} MB   floor {fl}")


def print_table(plen, rows):
    print(f"\nprompt {plen}:")
    hdr = f"{'backend':<14}{'prefill ms':>11}{'median':>9}{'p10':>9}{'p90':>9}{'tok/s':>9}{'GB/s':>8}" \
          f"{'% floor':>9}{'vs mk':>7}  tokens"
    print(hdr)
    f = lambda v, w, d=3: f"{v:>{w}.{d}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"  # noqa: E731
    for r in rows:
        if "error" in r:
            print(f"{r['backend']:<14}  ERROR: {r['error']}")
            continue
        print(f"{r['backend']:<14}{f(r['prefill_ms'], 11, 2)}{f(r['ms_per_token_median'], 9)}"
              f"{f(r['ms_per_token_p10'], 9)}{f(r['ms_per_token_p90'], 9)}{f(r['tokens_per_s'], 9, 1)}"
              f"{f(r['gbps'], 8, 0)}{f(r['pct_of_floor'], 9, 1)}{f(r['speedup_vs_megakernel'], 7, 2)}  "
              f"{'match' if r['tokens_match'] else 'DIFFER (' + str(r.get('tokens_match_frac')) + ')'}")


if __name__ == "__main__":
    sys.exit(main())
