"""The LM head's packed argmax (``instructions.common.argmax_key``): one int64 per value whose
maximum over a row names the same index as ``torch.argmax``, in Triton (the interpreter) and in
the torch version the VM uses."""

import torch
import triton
import triton.language as tl

from instructions.common import argmax_key, argmax_key_ref


@triton.jit
def _keys_kernel(v_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, argmax_key(tl.load(v_ptr + i), i))


def _rows(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(8):
        v = torch.randn(64, generator=g) * 10
        rows.append(v.clone())
        tied = v.clone()
        tied[torch.randperm(64, generator=g)[:4]] = v.max()           # the maximum four times
        rows.append(tied)
        rows.append(-v.abs() - 1)                                     # every value negative
    zeros = -torch.rand(64, generator=g) - 1
    zeros[9], zeros[30] = -0.0, 0.0                                   # -0.0 first: ties with 0.0
    rows.append(zeros)
    inf = torch.randn(64, generator=g)
    inf[5] = inf[40] = float("inf")
    rows.append(inf)
    nan = torch.randn(64, generator=g)
    nan[17] = nan[50] = float("nan")
    nan[3] = float("inf")
    rows.append(nan)
    return rows


def test_argmax_key_picks_torch_argmax(seed):
    for v in _rows(seed):
        idx = torch.arange(v.numel())
        ref = argmax_key_ref(v, idx)
        out = torch.empty(v.numel(), dtype=torch.int64)
        _keys_kernel[(1,)](v, out, N=v.numel())
        assert torch.equal(out, ref), v
        best = int(ref.max())
        assert 4294967295 - (best & 4294967295) == int(torch.argmax(v)), v
