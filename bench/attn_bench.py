"""Attention at long contexts: the per-op attention kernel and the whole megakernel step at 1k, 8k
and 32k cached positions, in ms and effective GB/s of KV cache read.

    python3 bench/attn_bench.py [--model 0.6b] [--contexts 1024,8192,32768] [--iters 20] [--no-step]
                                [--set BLOCK_S=64 --set NSPLIT=64 ...]

Random bf16 weights and a random KV cache (no prefill: the lengths are set directly), so it needs
no network and runs in well under three minutes on one H100/H200. The per-op attention kernel is
timed as one step's 28 layer launches replayed from a CUDA graph (no host launch cost); GB/s is
the KV cache bytes the step reads (every layer, K and V, all cached positions) over that time. The
megakernel step is timed over 16 steps from each context; its GB/s counts the KV bytes only, and
"floor" adds the weights at the copy bandwidth measured here. Each measurement that fails prints
its error and the script goes on.
"""

import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

DEVICE = "cuda"


def copy_bandwidth(nbytes=1 << 30, iters=10):
    """Device-to-device copy bandwidth in bytes/s (read + write counted once each)."""
    a = torch.empty(nbytes // 2, dtype=torch.uint8, device=DEVICE)
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        b.copy_(a)
    e.record()
    torch.cuda.synchronize()
    return 2 * a.numel() * iters / (s.elapsed_time(e) / 1e3)


def fill_cache(mk, seed=0):
    """Random keys and values of a realistic scale (the attention's work does not depend on them)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    for t in (mk.cache.k, mk.cache.v):
        for layer in range(t.shape[0]):     # per layer: no 3.7 GB float32 temporary
            t[layer].copy_(torch.randn(t[layer].shape, generator=g, device=DEVICE, dtype=torch.float32))


def set_length(mk, n):
    mk.cache.lengths.fill_(n)
    mk._lengths = [n] * mk.batch_size      # the host mirror that step() checks


def kv_bytes(cfg, n, batch=1, itemsize=2):
    return cfg.kv_bytes_per_position(itemsize) * n * batch


def kernel_resources(jit_fn):
    """(registers, spills, shared bytes) of the compiled versions of a @triton.jit function, where
    this Triton exposes them."""
    out = []
    try:
        for cache in getattr(jit_fn, "device_caches", {}).values():
            kernels = cache[0] if isinstance(cache, tuple) else cache
            for k in kernels.values():
                k._init_handles()
                out.append((k.n_regs, k.n_spills, k.metadata.shared))
    except Exception as e:  # noqa: BLE001
        out.append(f"unavailable ({type(e).__name__})")
    return out


def time_graph(fn, iters):
    """ms per call of fn, replayed from a CUDA graph (falls back to plain launches)."""
    fn()
    torch.cuda.synchronize()
    run = fn
    try:
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
            with torch.cuda.graph(g, stream=stream):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        run = g.replay
    except Exception as e:  # noqa: BLE001
        print(f"  (CUDA graph capture failed: {type(e).__name__}: {e}; timing plain launches)", flush=True)
    run()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        run()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / iters


def bench_attention(model, contexts, iters, overrides):
    from instructions import attention as k_attention
    from megakernel import MegaQwen3
    cfg = model.config
    mk = MegaQwen3(model, max_seq_len=max(contexts) + 64, backend="per-op", plan_overrides=overrides)
    be = mk.backend
    st, plan = be.st, be.plan
    print(f"per-op attention: plan NSPLIT {plan.NSPLIT}, BLOCK_S {plan.BLOCK_S}, "
          f"{plan.B * plan.HKV * plan.NSPLIT} tiles per layer", flush=True)
    fill_cache(mk)
    st.qkv.copy_(torch.randn(st.qkv.shape, device=DEVICE))
    rows = []
    for n in contexts:
        try:
            set_length(mk, n)

            attn_launches = [(fn, grid, kw) for fn, grid, kw in be.seq if fn is k_attention.attn_kernel]

            def step():
                for fn, grid, kw in attn_launches:     # every layer's
                    fn[grid](**kw)
            ms = time_graph(step, iters)
            gbs = kv_bytes(cfg, n) / (ms / 1e3) / 1e9
            rows.append((n, ms, gbs))
            print(f"  ctx {n:>6}: {ms:8.3f} ms / step ({ms / plan.L * 1e3:7.1f} us / layer), KV "
                  f"{kv_bytes(cfg, n) / 1e9:6.3f} GB -> {gbs:7.1f} GB/s", flush=True)
        except Exception:  # noqa: BLE001
            print(f"  ctx {n}: FAILED", flush=True)
            traceback.print_exc()
    print(f"  attn_kernel (regs, spills, shared): {kernel_resources(k_attention.attn_kernel)}", flush=True)
    return rows


def bench_step(model, contexts, steps, bw, overrides):
    from megakernel import MegaQwen3
    cfg = model.config
    mk = MegaQwen3(model, max_seq_len=max(contexts) + 64 + 2 * steps, backend="megakernel",
                   plan_overrides=overrides)
    info = getattr(mk.backend, "kernel_info", {})
    p = mk.backend.plan
    print(f"megakernel step: {mk.backend.tape.num_workers} workers, plan NSPLIT {p.NSPLIT}, BLOCK_S "
          f"{p.BLOCK_S}; kernel {info}", flush=True)
    mk.prefill([1])
    fill_cache(mk)
    w = model.weights.nbytes()
    rows = []
    for n in contexts:
        try:
            set_length(mk, n)
            for _ in range(2):
                mk.step()
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(steps):
                mk.step()
            e.record()
            torch.cuda.synchronize()
            mk.backend.synchronize()
            ms = s.elapsed_time(e) / steps
            kv = kv_bytes(cfg, n + 2 + steps // 2)
            floor = (w + kv) / bw * 1e3
            rows.append((n, ms, w + kv))
            print(f"  ctx {n:>6}: {ms:8.3f} ms / token, KV {kv / 1e9:6.3f} GB -> {kv / (ms / 1e3) / 1e9:7.1f} "
                  f"GB/s; floor {floor:6.3f} ms ({100 * floor / ms:5.1f}% of it)", flush=True)
        except Exception:  # noqa: BLE001
            print(f"  ctx {n}: FAILED", flush=True)
            traceback.print_exc()
    if len(rows) >= 2:
        (n0, t0, b0), (n1, t1, b1) = rows[0], rows[-1]
        print(f"  time ratio {n1} / {n0}: {t1 / t0:.2f}; bytes ratio {b1 / b0:.2f} (tests/test_gpu_sizes.py "
              f"asks time ratio <= 1.25 x bytes ratio = {1.25 * b1 / b0:.2f})", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="0.6b")
    ap.add_argument("--contexts", default="1024,8192,32768")
    ap.add_argument("--iters", type=int, default=20, help="graph replays per per-op measurement")
    ap.add_argument("--steps", type=int, default=16, help="megakernel steps per measurement")
    ap.add_argument("--no-step", action="store_true", help="only the per-op attention kernel")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=N",
                    help="override a tile-plan field, e.g. --set BLOCK_S=64 (NSPLIT_PAD follows NSPLIT)")
    args = ap.parse_args()
    overrides = {k: int(v) for k, v in (x.split("=", 1) for x in args.set)}
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    import triton

    from megakernel import load_model
    contexts = [int(c) for c in args.contexts.split(",")]
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__}", flush=True)
    t = time.time()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    model = load_model(args.model, random_weights=True, device=DEVICE, dtype=torch.bfloat16, progress=False)
    print(f"model {args.model} loaded in {time.time() - t:.1f}s", flush=True)
    for name, fn in (("attention", lambda: bench_attention(model, contexts, args.iters, overrides)),
                     ("step", lambda: None if args.no_step else bench_step(model, contexts, args.steps, bw,
                                                                           overrides))):
        t = time.time()
        try:
            fn()
        except Exception:  # noqa: BLE001
            print(f"{name}: FAILED", flush=True)
            traceback.print_exc()
        torch.cuda.empty_cache()      # the caches of the run before
        print(f"({name}: {time.time() - t:.1f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
