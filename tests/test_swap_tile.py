"""The weights-on-M batched tile (``instructions/wgmma.py``) on the CPU: with its row blocks split
over K (the partials added by the last split to finish), the kernel backends give the reference's
greedy tokens and each other's logits bit for bit, at batches padded to different MMA widths."""

import pytest
import torch
import triton
import triton.language as tl

from instructions.kind import split_rows
from instructions.wgmma import SS_ROWS, _ss_tree, load_rstd
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



def test_pools_on_the_weights_on_m_tile(tiny_checkpoint, seed):
    """Pools (a stage's last tiles claimed at run time after an instruction's own) on the weights-on-M
    tile, over K-splits: the megakernel, over launches of several steps and single steps, gives the
    reference's tokens and the per-op kernels' logits bit for bit; the VM the same tokens. A plan
    that loads chunks before its wait (SWAP_PRE) takes no pool."""
    import dataclasses
    from scheduler.ops import Op
    tiny = tiny_checkpoint(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    g = torch.Generator().manual_seed(seed)
    prompts = [random_prompt(int(n), tiny.vocab_size, seed + i)
               for i, n in enumerate(torch.randint(1, 10, (3,), generator=g))]
    _, ref, ref_logits = _run(model, "reference", prompts, 5)
    pools = dict(SPLITS, R_GU=16, R_LM=16, SWAP_PRE=0, POOL_O=1, POOL_GU=7, POOL_DOWN=3, POOL_LM=9)
    mk = MegaQwen3(model, max_seq_len=32, batch_size=3, backend="megakernel", plan_overrides=pools)
    plan = mk.backend.plan
    assert plan.BATCHED == 2 and [plan.pool(op) for op in (Op.OPROJ, Op.GATEUP, Op.DOWN, Op.LMHEAD)] == [1, 7, 3, 9]
    assert [plan.tiles(op) for op in (Op.OPROJ, Op.GATEUP, Op.DOWN, Op.LMHEAD)] == [2, 16, 4, 20]
    mk.prefill(prompts)
    first = mk.logits.argmax(-1)
    got = torch.cat([first[:, None], mk.steps(3, per_launch=3), mk.step()[:, None]], 1)
    assert torch.equal(got, ref), f"{got.tolist()} != reference {ref.tolist()}"
    assert rel_err(mk.logits, ref_logits) < 1e-4
    _, out, perop_logits = _run(model, "per-op", prompts, 5, plan_overrides=pools)
    assert torch.equal(out, ref) and torch.equal(mk.logits, perop_logits)
    _, out, _ = _run(model, "vm", prompts, 5, plan_overrides=pools)
    assert torch.equal(out, ref)
    with pytest.raises(ValueError, match="SWAP_PRE"):
        dataclasses.replace(plan, SWAP_PRE=1)


def test_split_rows_of_an_instruction():
    """A torch reference computes a row block once, where the instruction holds its last split."""
    # 3 splits a block of 64 rows, N = 150 (3 blocks, the last of 22 rows)
    assert split_rows(0, 3, 64, 3, 150) == slice(0, 64)
    assert split_rows(0, 2, 64, 3, 150) is None
    assert split_rows(2, 6, 64, 3, 150) == slice(0, 128)
    assert split_rows(6, 9, 64, 3, 150) == slice(128, 150)
    assert split_rows(2, 3, 64, 1, 150) == slice(128, 150)     # no splits: the tiles' own rows


@triton.jit
def rstd_kernel(xss_ptr, out_ptr, eps, B: tl.constexpr, H: tl.constexpr, BP: tl.constexpr, NSS: tl.constexpr,
                NSS_PAD: tl.constexpr):
    b = tl.arange(0, BP)
    tl.store(out_ptr + b, load_rstd(xss_ptr, eps, B, H, BP), mask=b < B)
    # the same blocks in one load, one tree
    tl.store(out_ptr + BP + b, 1.0 / tl.sqrt(_ss_tree(xss_ptr, 0, B, NSS, NSS_PAD, BP) / H + eps), mask=b < B)


@pytest.mark.parametrize("B, BP, H", [(64, 64, 5120), (3, 8, 5120), (64, 64, 1024)])
def test_rstd_adds_the_sums_of_squares_by_one_fixed_tree(seed, B, BP, H):
    """1/rms from the blocks' sums of squares: [B, NSS] values added by the pairwise tree (columns 2i
    and 2i + 1, then those sums in pairs), whether the tile loads them whole or in quarters (64 x
    5120: more values than a thread should hold), bit for bit, so per-op and the megakernel agree."""
    nss = -(-H // SS_ROWS.value)
    g = torch.Generator().manual_seed(seed)
    xss = torch.exp(3 * torch.randn(nss, B, generator=g))     # magnitudes far apart: order shows
    pad = 1 << (nss - 1).bit_length()
    out = torch.zeros(2, BP)
    rstd_kernel[(1,)](xss, out, 1e-6, B=B, H=H, BP=BP, NSS=nss, NSS_PAD=pad)
    assert torch.equal(out[0, :B], out[1, :B])
    tree = torch.nn.functional.pad(xss.t(), (0, pad - nss))
    while tree.shape[1] > 1:
        tree = tree[:, 0::2] + tree[:, 1::2]
    torch.testing.assert_close(out[0, :B], 1.0 / torch.sqrt(tree[:, 0] / H + 1e-6), rtol=2e-7, atol=0)
    assert not torch.equal(tree[:, 0], xss.sum(0)), "the values should tell one order of additions from another"
