"""The weights-on-M batched tile (``instructions/wgmma.py``) on the CPU: with its row blocks split
over K (the partials added by the last split to finish), the kernel backends give the reference's
greedy tokens and each other's logits bit for bit, at batches padded to different MMA widths."""

import pytest
import torch

from instructions.kind import split_rows
from megakernel import MegaQwen3, load_model

from test_reference_vs_hf import random_prompt, rel_err

SPLITS = dict(SK_QKV=2, SK_O=2, SK_GU=2, SK_DOWN=4)


def _run(model, backend, prompts, steps, **opts):
    mk = MegaQwen3(model, max_seq_len=32, batch_size=len(prompts), backend=backend, **opts)
    out = mk.generate(prompts, max_new_tokens=steps)
    return mk, out, mk.logits.clone()


@pytest.mark.parametrize("batch", [2, 17])
def test_split_k_tiles_match_reference(tiny_checkpoint, seed, batch):
    tiny = tiny_checkpoint(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    g = torch.Generator().manual_seed(seed)
    prompts = [random_prompt(int(n), tiny.vocab_size, seed + i)
               for i, n in enumerate(torch.randint(1, 10, (batch,), generator=g))]     # ragged
    steps = 4
    _, ref, ref_logits = _run(model, "reference", prompts, steps)
    logits = {}
    for backend in ("megakernel", "per-op"):
        mk, out, logits[backend] = _run(model, backend, prompts, steps, plan_overrides=SPLITS)
        plan = mk.backend.plan
        assert plan.BATCHED == 2 and (plan.SK_QKV, plan.SK_O, plan.SK_GU, plan.SK_DOWN) == (2, 2, 2, 4)
        assert torch.equal(out, ref), f"{backend}: {out.tolist()} != reference {ref.tolist()}"
        assert rel_err(logits[backend], ref_logits) < 1e-4, backend
    assert torch.equal(logits["megakernel"], logits["per-op"])


def test_split_rows_of_an_instruction():
    """A torch reference computes a row block once, where the instruction holds its last split."""
    # 3 splits a block of 64 rows, N = 150 (3 blocks, the last of 22 rows)
    assert split_rows(0, 3, 64, 3, 150) == slice(0, 64)
    assert split_rows(0, 2, 64, 3, 150) is None
    assert split_rows(2, 6, 64, 3, 150) == slice(0, 128)
    assert split_rows(6, 9, 64, 3, 150) == slice(128, 150)
    assert split_rows(2, 3, 64, 1, 150) == slice(128, 150)     # no splits: the tiles' own rows
