"""Issue #7, batches above one: ms per decode step against the batch, and batched tokens against
batch 1 (random weights, no network needed; 0.6b bf16 unless told). From the repository root on a
GPU machine:

    python3 bench/batch_bench.py [--batches 1,4,8,16] [--backends megakernel,cuda-graph] [--steps 32]
                                 [--prompt-len 128] [--model 8b] [--quantize fp8] [--no-tokens]
                                 [--json out.json]

A backend may carry tile-plan overrides, ``NAME:FIELD=N:...`` (e.g. ``megakernel:R_O=16:R_DOWN=16``),
and backend options in lower case (``megakernel:prefetch_tape=0``), so that variants are compared
in one run.

For each backend and batch B: prefill a random [B, prompt-len] prompt, run 3 warm-up steps, then
time ``--steps`` steps one by one with CUDA events (median, p10, p90 ms per step; tokens/s), and
print the megakernel's registers, spills, shared memory and programs per SM. Then the tokens:
batch 8 (float32 batched tiles) must equal batch-1 runs of the same prompts for two of its
sequences; batch 16 (TF32 tensor-core tiles) is compared the same way for information only (a near
tie may part the greedy paths). Each part runs on its own: a failure prints its traceback and the
rest goes on; the exit status is 1 when anything failed or batch 8 differs. Takes 1-3 minutes,
most of it compiling the kernels once per batch size.
"""

import argparse
import json
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402

from megakernel import MegaQwen3, load_model  # noqa: E402

WARMUP = 3


def log(msg):
    print(msg, flush=True)


def time_steps(mk, prompt, steps):
    """Prefill, warm up, then [ms] of ``steps`` decode steps, each between two CUDA events."""
    mk.reset()
    mk.prefill(prompt)
    for _ in range(WARMUP):
        mk.step()
    torch.cuda.synchronize()
    events = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        mk.step()
        b.record()
        events.append((a, b))
    torch.cuda.synchronize()
    if hasattr(mk.backend, "synchronize"):
        mk.backend.synchronize()     # raises a timed-out wait of the last steps
    return sorted(a.elapsed_time(b) for a, b in events)


def bench_one(model, spec, B, args, gen):
    row = {"backend": spec, "batch": B}
    t = time.time()
    backend, *fields = spec.split(":")
    # FIELD=N (upper case) overrides a plan field; name=N a backend option (prefetch_tape=0, spin=...)
    pairs = [(k, int(v)) for k, v in (f.split("=") for f in fields)]
    opts = {k: v for k, v in pairs if not k.isupper()}
    if any(k.isupper() for k, _ in pairs):
        opts["plan_overrides"] = {k: v for k, v in pairs if k.isupper()}
    mk = MegaQwen3(model, max_seq_len=args.max_seq_len, batch_size=B, backend=backend, **opts)
    prompt = torch.randint(0, model.config.vocab_size, (B, args.prompt_len), generator=gen)
    ms = time_steps(mk, prompt, args.steps)
    med = statistics.median(ms)
    row.update(ms_median=round(med, 4), ms_p10=round(ms[len(ms) // 10], 4), ms_p90=round(ms[9 * len(ms) // 10], 4),
               tokens_per_s=round(B * 1e3 / med, 1), setup_s=round(time.time() - t, 1))
    info = getattr(mk.backend, "kernel_info", None)
    if info:
        row.update(info)
    plan = getattr(mk.backend, "plan", None)
    log(f"{spec:<11} B={B:<3} median {med:7.3f} ms  p10 {row['ms_p10']:7.3f}  p90 {row['ms_p90']:7.3f}  "
        f"{row['tokens_per_s']:9.1f} tok/s  setup {row['setup_s']:5.1f}s"
        + (f"  regs {info['n_regs']} spills {info['n_spills']} shared {info['shared']} "
           f"per-SM {info['resident_per_sm']}" if info else "")
        + (f"  R qkv/o/gu/down/lm {plan.R_QKV}/{plan.R_O}/{plan.R_GU}/{plan.R_DOWN}/{plan.R_LM}" if plan else ""))
    del mk
    torch.cuda.empty_cache()
    return row


def tokens_vs_alone(model, B, seqs, args, gen):
    """Greedy tokens of the megakernel at batch B against batch-1 runs of sequences ``seqs``."""
    prompt = torch.randint(0, model.config.vocab_size, (B, args.prompt_len), generator=gen)
    mk = MegaQwen3(model, max_seq_len=args.max_seq_len, batch_size=B, backend="megakernel")
    batch = mk.generate(prompt, max_new_tokens=args.steps)
    mk.backend.synchronize()
    del mk
    alone_mk = MegaQwen3(model, max_seq_len=args.max_seq_len, batch_size=1, backend="megakernel")
    out = {}
    for b in seqs:
        alone_mk.reset()
        alone = alone_mk.generate(prompt[b:b + 1], max_new_tokens=args.steps)
        diff = (batch[b].cpu() != alone[0].cpu()).nonzero()
        out[b] = None if len(diff) == 0 else int(diff[0, 0])
        log(f"batch {B} sequence {b}: " + ("same tokens as alone" if out[b] is None
                                           else f"differs from alone from step {out[b]} of {args.steps}"))
    del alone_mk
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,4,8,16")
    ap.add_argument("--backends", default="megakernel,cuda-graph")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-seq-len", type=int, default=None, help="default prompt-len + 72, as the recorded runs")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--model", default="0.6b")
    ap.add_argument("--quantize", choices=["fp8"], default=None, help="block-FP8 projections (w8a8 by default)")
    ap.add_argument("--no-tokens", action="store_true", help="time only; skip the batched-against-alone tokens")
    args = ap.parse_args()
    args.max_seq_len = args.max_seq_len or args.prompt_len + 72
    seed = args.seed if args.seed is not None else int(time.time())
    log(f"torch {torch.__version__} triton {triton.__version__} {torch.cuda.get_device_name()} prompt seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    t = time.time()
    model = load_model(args.model, random_weights=True, device="cuda", dtype=torch.bfloat16, progress=False,
                       quantize=args.quantize)
    log(f"model loaded in {time.time() - t:.1f}s")
    rows, failures, checks = [], [], {}
    for B in [int(b) for b in args.batches.split(",")]:
        for backend in args.backends.split(","):
            try:
                rows.append(bench_one(model, backend, B, args, gen))
            except Exception:
                failures.append(f"{backend} B={B}")
                traceback.print_exc()
                sys.stdout.flush()
    for B, seqs in () if args.no_tokens else ((8, (0, 5)), (16, (3, 14))):
        try:
            checks[B] = tokens_vs_alone(model, B, seqs, args, gen)
        except Exception:
            failures.append(f"tokens B={B}")
            traceback.print_exc()
            sys.stdout.flush()
    log("\nms per step (median)")
    backends = args.backends.split(",")
    width = max(13, *(len(b) + 2 for b in backends))
    log("batch " + "".join(f"{b:>{width}}" for b in backends))
    for B in sorted({r["batch"] for r in rows}):
        cells = {r["backend"]: r["ms_median"] for r in rows if r["batch"] == B}
        log(f"{B:>5} " + "".join(f"{cells[b]:>{width}.3f}" if b in cells else f"{'-':>{width}}" for b in backends))
    batch8_ok = args.no_tokens or (8 in checks and all(v is None for v in checks[8].values()))
    log(f"batch 8 tokens equal batch 1: {batch8_ok}" + (f"; failed: {', '.join(failures)}" if failures else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": seed, "device": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "rows": rows, "tokens_first_diff": {str(k): v for k, v in checks.items()},
                       "failures": failures}, f, indent=1)
    return 0 if batch8_ok and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
