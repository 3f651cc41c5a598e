"""Does the order in which persistent programs walk their tiles change the streaming rate?

The megakernel gives each worker a contiguous block of a GEMV's tiles (worker w: tiles
[w*C, (w+1)*C)), so at any moment 264 workers read 264 places spread over the matrix. Per-op
kernels launch a program per tile, which the hardware starts in order, so the tiles in flight
are a window of neighbouring rows. This probe streams a bf16 [N, K] matrix through the
megakernel's tile loop (R rows a tile, the next tile's weights loaded while this one's product
is computed, ``evict_first``) in three orders, the same bytes each:

- ``blocks``: P programs, program p walks tiles p*C .. p*C + C - 1 (the megakernel's tape);
- ``strided``: P programs, program p walks tiles p, p + P, p + 2P, ... (a window of P tiles);
- ``per-op``: one program per tile (a kernel launch per GEMV);
- ``pool``: P programs, each claiming its next tile from a counter at run time.

It also prints the spread of the programs' end times, and at K = 5120 (14b, 32b) compares the
plan's masked second chunk with an exact one and with one 8192-wide chunk (docs/performance.md, "Placement").

    python3 bench/probes/stream_order.py [--per-sm 2] [--reps 5]
"""
import argparse

import torch
import triton
import triton.language as tl


@triton.jit
def _tile(pid, i, P, C: tl.constexpr, MODE: tl.constexpr):
    if MODE == 0:
        return pid * C + i
    return pid + i * P


@triton.jit
def stream_gemv(w_ptr, x_ptr, out_ptr, N, P, K: tl.constexpr, R: tl.constexpr, C: tl.constexpr,
                MODE: tl.constexpr, t_ptr=None, STAMP: tl.constexpr = False):
    pid = tl.program_id(0)
    if STAMP:
        tl.store(t_ptr + P + pid, tl.extra.cuda.globaltimer())
    r = tl.arange(0, R)
    k = tl.arange(0, K)
    x = tl.load(x_ptr + k)
    t = _tile(pid, 0, P, C, MODE)
    rows = t * R + r
    w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + k[None, :], mask=(rows < N)[:, None], other=0.0,
                eviction_policy="evict_first")
    for i in range(C):
        tn = _tile(pid, i + 1, P, C, MODE)
        rn = tn * R + r
        w_next = tl.load(w_ptr + rn[:, None].to(tl.int64) * K + k[None, :],
                         mask=((rn < N) & (i + 1 < C))[:, None], other=0.0, eviction_policy="evict_first")
        acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        rows = _tile(pid, i, P, C, MODE) * R + r
        tl.store(out_ptr + rows, acc, mask=rows < N)
        w = w_next
    if STAMP:
        tl.store(t_ptr + pid, tl.extra.cuda.globaltimer())


@triton.jit
def _claim(claim_ptr, lane):
    """One lane's relaxed atomic claim of the next tile, left in that lane's register (no CTA
    barrier waits for the reply until ``_claimed`` reads it)."""
    return tl.atomic_add(claim_ptr + lane * 0, 1, mask=lane == 0, sem="relaxed", scope="gpu")


@triton.jit
def _claimed(v, lane):
    return tl.sum(tl.where(lane == 0, v, 0), axis=0)


@triton.jit
def stream_pool(w_ptr, x_ptr, out_ptr, claim_ptr, N, K: tl.constexpr, R: tl.constexpr, LANES: tl.constexpr):
    """``stream_gemv`` with every tile claimed at run time from a counter (a program that runs ahead
    takes more tiles): the claim of the tile after next goes out while this tile computes."""
    r = tl.arange(0, R)
    k = tl.arange(0, K)
    lane = tl.arange(0, LANES)
    NT = (N + R - 1) // R
    x = tl.load(x_ptr + k)
    t = _claimed(_claim(claim_ptr, lane), lane)
    v_next = _claim(claim_ptr, lane)
    rows = t * R + r
    w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + k[None, :], mask=(rows < N)[:, None], other=0.0,
                eviction_policy="evict_first")
    while t < NT:
        tn = _claimed(v_next, lane)
        v_next = _claim(claim_ptr, lane)
        rn = tn * R + r
        w_next = tl.load(w_ptr + rn[:, None].to(tl.int64) * K + k[None, :], mask=(rn < N)[:, None], other=0.0,
                         eviction_policy="evict_first")
        acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        rows = t * R + r
        tl.store(out_ptr + rows, acc, mask=rows < N)
        w = w_next
        t = tn


@triton.jit
def stream_gemv2(w_ptr, x_ptr, out_ptr, N, P, K: tl.constexpr, R: tl.constexpr, C: tl.constexpr,
                 BK: tl.constexpr, TAIL: tl.constexpr):
    """``stream_gemv`` in ``blocks`` order for a K of one chunk of BK plus, with TAIL, a second chunk
    of TAIL columns (masked past K; TAIL = BK is the megakernel's second chunk at hidden 5120),
    loaded when the tile starts, as ``gemv.dot_rows`` does."""
    pid = tl.program_id(0)
    r = tl.arange(0, R)
    k = tl.arange(0, BK)
    kt = BK + tl.arange(0, TAIL if TAIL > 0 else 1)
    x = tl.load(x_ptr + k, mask=k < K, other=0.0)
    xt = tl.load(x_ptr + kt, mask=kt < K, other=0.0)
    rows = pid * C * R + r
    w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + k[None, :], mask=(rows < N)[:, None] & (k < K)[None, :],
                other=0.0, eviction_policy="evict_first")
    for i in range(C):
        rows = (pid * C + i) * R + r
        rn = rows + R
        w_next = tl.load(w_ptr + rn[:, None].to(tl.int64) * K + k[None, :],
                         mask=((rn < N) & (i + 1 < C))[:, None] & (k < K)[None, :], other=0.0,
                         eviction_policy="evict_first")
        if TAIL > 0:
            wt = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + kt[None, :],
                         mask=(rows < N)[:, None] & (kt < K)[None, :], other=0.0, eviction_policy="evict_first")
        acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        if TAIL > 0:
            acc += tl.sum(wt.to(tl.float32) * xt[None, :], axis=1)
        tl.store(out_ptr + rows, acc, mask=rows < N)
        w = w_next


def rate(fn, nbytes, reps, launches=10):
    """GB/s of ``reps`` samples, each ``launches`` back-to-back launches between two events (a
    launch's own start is then a few us in ~100)."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(launches):
            fn()
        e1.record()
        torch.cuda.synchronize()
        out.append(launches * nbytes / e0.elapsed_time(e1) / 1e6)
    return out


def compare(runs, nbytes, reps, out, ref):
    """Print each run's GB/s (the runs in turn, so drift falls on each alike) and its largest error
    against ``ref``."""
    gb = {name: [] for name in runs}
    for _ in range(reps):
        for name, fn in runs.items():
            gb[name] += rate(fn, nbytes, 1)
    for name, fn in runs.items():
        out.zero_()
        fn()
        err = (out - ref).abs().max().item()
        print(f"  {name:18s} GB/s " + " ".join(f"{g:5.0f}" for g in gb[name]) + f"   max err {err:.2e}",
              flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-sm", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), f"{sms} SMs", torch.__version__, triton.__version__, flush=True)
    a = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=5, rep=50)
    print(f"copy bandwidth {2 * a.numel() / ms / 1e6:.0f} GB/s", flush=True)
    del a, b
    P = sms * args.per_sm
    # (N, K, R): the 0.6b LM head (R_LM 16), 14b-like streaming tiles of 4 and 2 rows of 4096
    for N, K, R in ((151936, 1024, 16), (131072, 4096, 4), (131072, 4096, 2)):
        w = torch.randn(N, K, device="cuda").to(torch.bfloat16)
        x = torch.randn(K, device="cuda")
        out = torch.empty(N, device="cuda")
        tiles = -(-N // R)
        C = -(-tiles // P)
        nbytes = N * K * 2
        ref = w.float() @ x
        claims = torch.zeros(4096, dtype=torch.int32, device="cuda")
        nxt = [0]

        def pool(R=R, K=K, N=N, w=w, x=x, out=out, claims=claims):
            nxt[0] = (nxt[0] + 1) % claims.numel()
            if nxt[0] == 0:
                claims.zero_()
            stream_pool[(P,)](w, x, out, claims[nxt[0]:], N, K=K, R=R, LANES=128)

        runs = {
            "blocks": lambda: stream_gemv[(P,)](w, x, out, N, P, K=K, R=R, C=C, MODE=0),
            "pool": pool,
            "strided": lambda: stream_gemv[(P,)](w, x, out, N, P, K=K, R=R, C=C, MODE=1),
            "per-op": lambda: stream_gemv[(tiles,)](w, x, out, N, tiles, K=K, R=R, C=1, MODE=0),
        }
        print(f"[{N}, {K}] bf16 ({nbytes / 1e6:.0f} MB), {R}-row tiles ({R * K * 2 // 1024} KB), "
              f"{P} programs x {C} tiles", flush=True)
        stamps = torch.zeros(2 * P, dtype=torch.int64, device="cuda")
        for mode in (0, 1):
            spread = []
            for _ in range(3):
                stream_gemv[(P,)](w, x, out, N, P, K=K, R=R, C=C, MODE=mode, t_ptr=stamps, STAMP=True)
                torch.cuda.synchronize()
                end, start = stamps[:P].double().cpu(), stamps[P:].double().cpu()
                d = end - start.min()
                q = torch.quantile(d, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64))
                spread.append(f"{q[0] / 1e3:.1f}/{q[1] / 1e3:.1f}/{q[2] / 1e3:.1f}/{d.max() / 1e3:.1f}")
            print(f"  {('blocks', 'strided')[mode]} programs' ends p10/p50/p90/max us after the first start: "
                  + "  ".join(spread), flush=True)
        compare(runs, nbytes, args.reps, out, ref)
        del w
    # hidden 5120 (14b, 32b): a 4096 chunk and a 1024 tail, or (the plan) a second 4096 chunk
    # three-quarters masked, or one 8192 chunk at half the rows
    N, K = 65536 + 32768, 5120
    w = torch.randn(N, K, device="cuda").to(torch.bfloat16)
    x = torch.randn(K, device="cuda")
    out = torch.empty(N, device="cuda")
    ref = w.float() @ x
    nbytes = N * K * 2
    runs = {}
    for name, R, BK, TAIL in (("4096+1024", 4, 4096, 1024), ("4096+4096m", 4, 4096, 4096),
                              ("8192m", 2, 8192, 0), ("4096+1024 r2", 2, 4096, 1024)):
        tiles = -(-N // R)
        C = -(-tiles // P)
        runs[name] = (lambda R=R, BK=BK, TAIL=TAIL, C=C:
                      stream_gemv2[(P,)](w, x, out, N, P, K=K, R=R, C=C, BK=BK, TAIL=TAIL))
        runs[name + " per-op"] = (lambda R=R, BK=BK, TAIL=TAIL, tiles=tiles:
                                  stream_gemv2[(tiles,)](w, x, out, N, tiles, K=K, R=R, C=1, BK=BK, TAIL=TAIL))
    print(f"[{N}, {K}] bf16 ({nbytes / 1e6:.0f} MB), {P} programs", flush=True)
    compare(runs, nbytes, args.reps, out, ref)


if __name__ == "__main__":
    main()
