"""GPU check that the per-op kernels and the persistent kernel compute a batched step bit for bit
alike: the same tiles under the same plan, compiled into two kernels, must not round differently.
(Batches 17 to 64 once parted by a float32 rounding of each row's RMS statistic: a tl.sum whose
order followed the register layout the compiler chose, not the same in the two kernels.)

Run on the device machine: python3 -m pytest -m gpu tests/test_gpu_batched_bitwise.py -v -s
"""

import dataclasses

import pytest
import torch

from test_gpu_sizes import _model, _prompt

pytestmark = pytest.mark.gpu

# what one decode step leaves behind: the last layer's scratch buffers, every layer's new K and V
SCRATCH = ("qkv", "attn", "act", "x")


def _one_step(model, backend, prompt, batch_input="split", **overrides):
    from megakernel import MegaQwen3
    from scheduler.ops import BATCH_INPUTS
    mk = MegaQwen3(model, max_seq_len=prompt.shape[1] + 8, batch_size=prompt.shape[0], backend=backend,
                   plan_overrides={"BATCH_INPUT": BATCH_INPUTS[batch_input], **overrides})
    mk.prefill(prompt)
    before = (mk.cache.k.clone(), mk.cache.v.clone())
    mk.step()
    torch.cuda.synchronize()
    mk.backend.synchronize()
    out = {name: mk.backend.st[name].clone() for name in SCRATCH}
    out.update(logits=mk.logits.clone(), k_cache=mk.cache.k.clone(), v_cache=mk.cache.v.clone(),
               tokens=mk.tokens.clone())
    plan = {k: v for k, v in dataclasses.asdict(mk.backend.plan).items() if not k.startswith("POOL_")}
    return out, before, plan


@pytest.mark.parametrize("batch_input", ["split", "bf16"])     # the plan's BATCH_INPUT (scheduler.ops)
@pytest.mark.parametrize("batch", [13, 17, 32, 64])     # 13: mma.sync (MMA_V3 0), the others wgmma
def test_per_op_step_equals_megakernel_bitwise(batch, batch_input):
    print(f"plan {_per_op_against_megakernel(batch, batch_input)}")


@pytest.mark.parametrize("batch", [32, 64])
def test_attention_pair_per_op_equals_megakernel_bitwise(batch):
    """Two kv heads an attention tile (ATTN_PAIR 2, one split): the per-op kernels and the persistent
    kernel still compute the step bit for bit alike."""
    assert _per_op_against_megakernel(batch, "bf16", ATTN_PAIR=2, NSPLIT=1, ATTN_NEW=0)["ATTN_PAIR"] == 2


@pytest.mark.parametrize("pre", [1, 2])
@pytest.mark.parametrize("batch", [8, 16, 64])
def test_weights_before_the_wait_per_op_equals_megakernel_bitwise(batch, pre):
    """SWAP_PRE (the weights-on-M tile's first chunks loaded before its wait, added after the rest):
    the per-op kernels and the persistent kernel still compute the step bit for bit alike."""
    assert _per_op_against_megakernel(batch, "bf16", SWAP_PRE=pre)["SWAP_PRE"] == pre


def _per_op_against_megakernel(batch: int, batch_input: str, **overrides) -> dict:
    """One 0.6b step at ``batch`` on per-op and on the megakernel under one plan (with ``overrides``):
    asserts the same prefill and every buffer bit for bit alike after the step; returns the plan."""
    model = _model("0.6b")
    prompt = _prompt(model.config.vocab_size, (batch, 24))
    mega, mega_before, mega_plan = _one_step(model, "megakernel", prompt, batch_input, **overrides)
    per_op, per_op_before, per_op_plan = _one_step(model, "per-op", prompt, batch_input, **overrides)
    assert mega_plan == per_op_plan, "the two backends chose different tiles: nothing to compare bit for bit"
    assert all(torch.equal(a, b) for a, b in zip(mega_before, per_op_before)), "the prefills differ"
    parted = _parted(mega, per_op)
    assert not parted, "per-op parts from megakernel after one step: " + "; ".join(parted)
    del model
    torch.cuda.empty_cache()
    return mega_plan


def _parted(one: dict, other: dict) -> list[str]:
    parted = []
    for name, a in one.items():
        b = other[name]
        if not torch.equal(a, b):
            diff = (a.float() - b.float()).abs()
            rows = (a != b).reshape(-1, a.shape[-1]).any(1).sum().item()
            parted.append(f"{name}: max |diff| {diff.max().item():.3g} in {rows} row(s)")
    return parted


@pytest.mark.parametrize("field", ["SWAP_TMA", "SWAP_CALL", "ATTN_CALL"])
@pytest.mark.parametrize("batch", [8, 32])
def test_tile_variants_equal_the_default_bitwise(batch, field):
    """SWAP_TMA (the weights-on-M tile's weights by TMA), SWAP_CALL (the tile called, not inlined) and
    ATTN_CALL (attention's tile called) give the same step on as off, bit for bit, in the persistent
    kernel and the per-op kernels:
    the same weights reach the same MMA, the same code adds them."""
    model = _model("0.6b")
    prompt = _prompt(model.config.vocab_size, (batch, 24))
    for backend in ("megakernel", "per-op"):
        base, _, plan = _one_step(model, backend, prompt, **{field: 0})
        other, _, other_plan = _one_step(model, backend, prompt, **{field: 1})
        assert other_plan[field] == 1 and plan["BATCHED"] == 2
        parted = _parted(base, other)
        assert not parted, f"{backend}: {field}=1 parts from the default: " + "; ".join(parted)
    del model
    torch.cuda.empty_cache()
