"""Tensor parallelism on 2 (and 4) GPUs: one process per GPU (``megakernel.tp.spawn``), NCCL and
symmetric memory. Skipped where fewer than 2 GPUs are visible.

    python -m pytest -m gpu tests/test_gpu_tp.py
"""

from __future__ import annotations

import functools

import pytest
import torch

from megakernel import tp as tp_mod
from tests import tp_ranks

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")]

SHAPE = dict(vocab=4096, hidden=1024, intermediate=3072, layers=4, heads=16, kv_heads=8, head_dim=128)
STEPS = 64


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A 4-layer checkpoint of 0.6b's layer shapes (8 kv heads: TP 2 and 4 divide it), random weights."""
    from tests.conftest import SEED, build_checkpoint
    return build_checkpoint(tmp_path_factory.mktemp("gputp") / "ckpt", SEED, **SHAPE)


def _prompts(batch: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, SHAPE["vocab"], (batch, 16), generator=g).tolist()


def _tps():
    return [tp for tp in (2, 4) if torch.cuda.device_count() >= tp]


@pytest.mark.parametrize("tp", _tps())
@pytest.mark.parametrize("batch", [1, 4])
def test_tp_tokens_equal_tp1_float32(checkpoint, tp, batch):
    """64 greedy steps (one launch) of the megakernel at TP N give TP 1's tokens in float32, and
    every rank the same logits to the bit; per-op (NCCL all-reduces) the same tokens."""
    folder, prompts = str(checkpoint.folder), _prompts(batch)
    one = tp_mod.spawn(1, tp_ranks.decode, 1, folder, ["megakernel"], prompts, STEPS, STEPS, 96, "float32",
                       False, "cuda")[0]["megakernel"]
    ranks = tp_mod.spawn(tp, tp_ranks.decode, tp, folder, ["megakernel", "per-op"], prompts, STEPS, STEPS, 96,
                         "float32", False, "cuda")
    for backend in ("megakernel", "per-op"):
        assert ranks[0][backend][0].tolist() == one[0].tolist(), backend
        for r in range(1, tp):
            assert torch.equal(ranks[r][backend][1], ranks[0][backend][1]), (backend, r)
    torch.testing.assert_close(ranks[0]["megakernel"][1], one[1], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("tp", _tps())
def test_kernel_backends_agree_at_tp_bf16(checkpoint, tp):
    """At TP N in bf16 the megakernel, superkernel, per-op and cuda-graph give the same tokens (the
    same tiles and plan; the REDUCE and NCCL's all-reduce add two partials the same way at TP 2)."""
    folder, prompts = str(checkpoint.folder), _prompts(2, 1)
    backends = ["megakernel", "superkernel", "per-op", "cuda-graph"]
    ranks = tp_mod.spawn(tp, tp_ranks.decode, tp, folder, backends, prompts, STEPS, STEPS, 96, "bfloat16", False,
                         "cuda")
    mk = ranks[0]["megakernel"][0]
    for backend in backends:
        toks = ranks[0][backend][0]
        agree = (toks == mk).float().mean().item()
        if tp == 2:
            assert toks.tolist() == mk.tolist(), backend
        else:   # NCCL's ring sums four partials in its own order: bf16 runs may part late
            assert agree >= 0.9, (backend, agree)


# (batch, tp_swap, the FP8 activation scheme or None for bf16 weights)
LAUNCH_CASES = {"batch-on-M": (8, False, None), "weights-on-M": (8, True, None), "w8a8-batch-1": (1, True, "dynamic")}


@pytest.mark.parametrize("tp", _tps())
@pytest.mark.parametrize("case", list(LAUNCH_CASES))
def test_tp_launches_of_one_and_of_many_steps_agree(checkpoint, tp, case):
    """The megakernel's tokens from one launch of 64 steps equal those of 64 launches of one step: at
    batch 8 in bf16 on the TP plans' weights-on-M tile (the default) and on the batch-on-M tile
    (``tp_swap=False``), and at batch 1 with FP8 w8a8, which runs the weights-on-M tile at batch 1.
    The REDUCE's in-place sum once parted there between launches (8b on two H200s, from step 1-4;
    at batch 8 on two H100s before it added its sequences together: docs/performance.md, "Plans of
    TP > 1")."""
    batch, swap, fp8 = LAUNCH_CASES[case]
    folder, prompts = str(checkpoint.folder), _prompts(batch, 2)
    run = functools.partial(tp_ranks.decode, tp_swap=swap, quantize="fp8" if fp8 else None,
                            **({"fp8_activations": fp8} if fp8 else {}))
    many = tp_mod.spawn(tp, run, tp, folder, ["megakernel"], prompts, STEPS, STEPS, 96, "bfloat16", False, "cuda")
    one = tp_mod.spawn(tp, run, tp, folder, ["megakernel"], prompts, STEPS, 1, 96, "bfloat16", False, "cuda")
    assert many[0]["plans"]["megakernel"]["BATCHED"] == (2 if swap else 1)
    assert many[0]["megakernel"][0].tolist() == one[0]["megakernel"][0].tolist()


@pytest.mark.parametrize("how", ["abort", "exit"])
def test_a_stopped_rank_gives_every_rank_the_named_error(checkpoint, how):
    """Rank 1's step fails (abort: it writes the abort word) or its process ends without a word
    (exit): every running rank raises RankError naming rank 1 within seconds."""
    seen = tp_mod.spawn(2, tp_ranks.stop_one, 2, str(checkpoint.folder), "megakernel", _prompts(1), 1, how,
                        "bfloat16", "cuda", timeout_s=300)
    running = [0] if how == "exit" else [0, 1]
    for r in running:
        assert seen[r].startswith(f"RankError: megakernel rank {r} of 2: rank 1 "), seen[r]
        assert float(seen[r].rsplit("(", 1)[1].split()[0]) < 10, seen[r]
    if how == "exit":
        assert seen[1] == "exited"
        assert "never published" in seen[0]
