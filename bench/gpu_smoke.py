"""One GPU round: every kernel backend on 0.6b random bf16 weights; tokens compared, steps timed.

    python3 bench/gpu_smoke.py [--steps 64] [--prompt-len 128]

A backend is ``name[:key=value...]``: nw / wps / bk / workers / trace / st (strategy) are backend options,
``spl=K`` times launches of K steps (ms per token = launch time / K), any other key a plan field.
``trace=1`` stamps every GEMV tile's math, ``trace=2`` (light) only what happens once an
instruction: start, wait, input, end (``instructions.common``, TRACE).
"""
import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402

from megakernel import MegaQwen3, load_model  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=64)
ap.add_argument("--prompt-len", type=int, default=128)
ap.add_argument("--backends", default="per-op,megakernel,superkernel,cuda-graph,reference")
ap.add_argument("--model", default="0.6b")
ap.add_argument("--max-seq-len", type=int, default=1024)
ap.add_argument("--trace-dir", default=None, help="variants with trace=1 write <dir>/<variant>.json")
args = ap.parse_args()
print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), flush=True)
t = time.time()
model = load_model(args.model, random_weights=True, device="cuda", dtype=torch.bfloat16, progress=False)
print(f"load {time.time() - t:.1f}s", flush=True)
g = torch.Generator().manual_seed(int(time.time()))
prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt_len), generator=g)
res = {}
for be in args.backends.split(","):
    try:
        t = time.time()
        name, *kv = be.split(":")
        keys = {"nw": "num_warps", "wps": "workers_per_sm", "bk": "max_bk", "workers": "num_workers"}
        keys["trace"] = "trace"
        spl = int(dict(x.split("=") for x in kv).get("spl", 1))    # steps per launch (greedy megakernel)
        kv = [x for x in kv if not x.startswith("spl=")]
        opts = {keys[k]: int(v) for k, v in (x.split("=") for x in kv) if k in keys}
        opts.update({"strategy": v for k, v in (x.split("=") for x in kv) if k == "st"})
        plan = {k: int(v) for k, v in (x.split("=") for x in kv) if k not in keys and k != "st"}
        if plan:
            opts["plan_overrides"] = plan
        mk = MegaQwen3(model, max_seq_len=args.max_seq_len, batch_size=1, backend=name, **opts)
        mk.prefill(prompt)
        mk.step(); torch.cuda.synchronize()
        print(f"{be}: first step incl. compile {time.time() - t:.1f}s", flush=True)
        toks = mk.generate(prompt, max_new_tokens=args.steps)
        torch.cuda.synchronize()
        # timing: steps between events
        mk.prefill(prompt)
        times = []
        for _ in range(args.steps // spl):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            mk.step() if spl == 1 else mk.steps(spl, per_launch=spl)
            b.record()
            times.append((a, b))
        torch.cuda.synchronize()
        if hasattr(mk.backend, "synchronize"):
            mk.backend.synchronize()
        ms = sorted(a.elapsed_time(b) / spl for a, b in times)
        res[be] = toks
        print(f"{be}: median {ms[len(ms)//2]:.3f} ms/token p10 {ms[len(ms)//10]:.3f} p90 {ms[9*len(ms)//10]:.3f}",
              flush=True)
        if opts.get("trace") and args.trace_dir:
            from megakernel.bench import write_trace
            os.makedirs(args.trace_dir, exist_ok=True)
            write_trace(mk.backend, os.path.join(args.trace_dir, be.replace(":", "_").replace("=", "") + ".json"))
        if name in ("megakernel", "superkernel"):
            k = mk.backend
            print(f"  workers {k.tape.num_workers} plan {k.plan}", flush=True)
            ki = k.kernel_info     # this backend's own compiled kernel (the cache's last entry is the
            # last one compiled, which is another variant's where this one's was compiled before)
            print(f"  regs {ki['n_regs']} spills {ki['n_spills']} shared {ki['shared']}", flush=True)
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
base = res.get("per-op", res.get("megakernel"))
for be, tk in res.items():
    if base is not None:
        same = (tk == base).float().mean().item()
        first = (tk != base).nonzero()
        print(f"{be}: tokens equal to per-op: {same:.3f} first diff {first[0].tolist() if len(first) else None}")
