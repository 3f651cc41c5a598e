"""How fast does the swapped batched tile (instructions/wgmma.py) stream a projection's weights?

(docs/performance.md's table came from this probe's first version, whose tile normalised its float32
input itself; the tile now reads the normalised input as the x-writing stages leave it, built here
by ``norm_input``.)

Each projection of an 8b layer (QKV, O, gate/up, down; or another size's with ``--model``) as a
per-op launch of ``swap_tiles``, one program a tile, for batches 1-64, rows per tile 64 or 128 and
K-splits 1-8, beside cuBLAS (torch's bf16 matmul of the bf16 input): microseconds a projection and
GB/s of weights. Eight layers' weights are cycled so that no projection finds its weights in the L2;
the launches are timed inside a CUDA graph. First checks the tile against float64.

    python3 bench/probes/swap_tile.py [--model 8b] [--batches 1,8,16,32,64]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository root

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from instructions.common import GATEUP, RESIDUAL, STORE  # noqa: E402
from instructions.wgmma import swap_tiles  # noqa: E402
from models.qwen3.weights import shapes_for  # noqa: E402


@triton.jit
def swap_kernel(w_ptr, w2_ptr, in_ptr, xss_ptr, eps, out_ptr, kpart_ptr, tick_ptr, B: tl.constexpr, N: tl.constexpr,
                K: tl.constexpr, R: tl.constexpr, SK: tl.constexpr, NORM: tl.constexpr, TWO: tl.constexpr,
                EPI: tl.constexpr):
    pid = tl.program_id(0)
    swap_tiles(pid, pid + 1, w_ptr, w2_ptr, w_ptr, w_ptr, in_ptr, xss_ptr, eps, out_ptr, out_ptr, kpart_ptr, tick_ptr,
               out_ptr, out_ptr, tick_ptr, 0, B, N, K, R, SK, 128, NORM, TWO, EPI, False, False, 0, False,
               0, tick_ptr, 0)


def norm_input(x, nw):
    """A normalised stage's input as the x-writing stages leave it (``instructions.wgmma``): x times
    the norm weight as a bf16 head and remainder [2, B, K], and x's sums of squares a 64 columns."""
    y = x * nw.float()
    hi = y.bfloat16()
    xs = torch.stack([hi, (y - hi.float()).bfloat16()])
    xss = (x * x).view(x.shape[0], -1, 64).sum(-1).T.contiguous()
    return xs, xss


def graph_us(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        t0.record()
        for _ in range(reps):
            g.replay()
        t1.record()
        t1.synchronize()
        best = min(best, t0.elapsed_time(t1) * 1000 / reps)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="8b")
    ap.add_argument("--batches", default="1,8,16,32,64")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="only the plan's likely configurations")
    args = ap.parse_args()
    cfg = shapes_for(args.model)
    H, I, Q, QKV = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.qkv_size
    dev = "cuda"
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)

    # correctness against float64 at one shape each
    for (N, K, NORM, TWO, EPI, R, SK) in ((QKV, H, True, False, STORE, 64, 2), (H, Q, False, False, RESIDUAL, 128, 4),
                                          (I, H, True, True, GATEUP, 64, 1)):
        for B in (3, 16):
            w = torch.randn(N, K, device=dev).bfloat16() * 0.05
            w2 = torch.randn(N, K, device=dev).bfloat16() * 0.05
            x = torch.randn(B, K, device=dev)
            nw = (1 + 0.1 * torch.randn(K, device=dev)).bfloat16()
            xin, xss = norm_input(x, nw) if NORM else (x.bfloat16(), x)
            out = torch.randn(B, N, device=dev)
            out0 = out.clone()
            nrb = -(-N // R)
            kpart = torch.zeros(SK * B * 2 * N + nrb * SK * B + 1, device=dev)
            tick = torch.zeros(nrb, dtype=torch.int32, device=dev)
            swap_kernel[(nrb * SK,)](w, w2, xin, xss, 1e-6, out, kpart, tick, B, N, K, R, SK, NORM, TWO, EPI)
            h = (x if NORM else xin).double()
            if NORM:
                h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * nw.double()
            ref = h @ w.double().T
            if TWO:
                ref = torch.nn.functional.silu(ref) * (h @ w2.double().T)
            if EPI == RESIDUAL:
                ref = ref + out0.double()
            err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
            print(f"check N={N} K={K} B={B} R={R} SK={SK} epi={EPI}: rel err {err:.2e}", flush=True)

    ops = [("qkv", QKV, H, True, False, STORE), ("o", H, Q, False, False, RESIDUAL),
           ("gateup", I, H, True, True, GATEUP), ("down", H, I, False, False, RESIDUAL)]
    L = args.layers
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    for name, N, K, NORM, TWO, EPI in ops:
        ws = [torch.randn(N, K, device=dev).bfloat16() for _ in range(L)]
        w2s = [torch.randn(N, K, device=dev).bfloat16() for _ in range(L)] if TWO else ws
        nw = torch.ones(K, device=dev).bfloat16()
        wbytes = N * K * 2 * (2 if TWO else 1)
        for B in [int(b) for b in args.batches.split(",")]:
            x = torch.randn(B, K, device=dev)
            xin, xss = norm_input(x, nw) if NORM else (x.bfloat16(), x)
            out = torch.zeros(B, N, device=dev)
            xb = x.bfloat16()
            wt = [torch.cat([a, b]) if TWO else a for a, b in zip(ws, w2s)]
            us = graph_us(lambda: [torch.matmul(xb, w.T) for w in wt])
            print(f"{name:7s} N={N:6d} K={K:6d} B={B:3d} cublas          {us / L:8.1f} us {wbytes / (us / L) / 1e3:7.0f} GB/s",
                  flush=True)
            for R in (64, 128):
                nrb = -(-N // R)
                for SK in (1, 2, 3, 4, 6, 8):
                    if K % (SK * 128) or nrb * SK > 4 * sm or (args.quick and nrb * SK < sm // 2):
                        continue
                    kpart = torch.zeros(SK * B * 2 * N + nrb * SK * B + 1, device=dev)
                    tick = torch.zeros(nrb, dtype=torch.int32, device=dev)

                    def run():
                        for w, w2 in zip(ws, w2s):
                            swap_kernel[(nrb * SK,)](w, w2, xin, xss, 1e-6, out, kpart, tick, B, N, K, R, SK, NORM,
                                                     TWO, EPI)
                    try:
                        us = graph_us(run)
                    except Exception as e:      # a configuration that does not compile or fit
                        print(f"{name:7s} B={B} R={R} SK={SK}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                        continue
                    print(f"{name:7s} N={N:6d} K={K:6d} B={B:3d} R={R:3d} SK={SK} tiles={nrb * SK:4d} "
                          f"{us / L:8.1f} us {wbytes / (us / L) / 1e3:7.0f} GB/s", flush=True)
        del ws, w2s
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
