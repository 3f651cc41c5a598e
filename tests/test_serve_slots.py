"""MegaQwen3's per-slot control (prefill_slot, step_slots, free_slot), which continuous batching
stands on: sequences that join, leave and reuse slots of a running batch, next to idle slots,
decode exactly as each would alone; for the reference and for the megakernel (Triton's
interpreter)."""

from __future__ import annotations

import pytest
import torch

from megakernel import MegaQwen3, load_model

from test_reference_vs_hf import random_prompt

SHAPE = dict(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)


def solo(model, prompt, steps, backend, **opts) -> list[int]:
    mk = MegaQwen3(model, max_seq_len=32, batch_size=1, backend=backend, **opts)
    return mk.generate([prompt], max_new_tokens=steps)[0].tolist()


@pytest.mark.parametrize("backend,opts", [("reference", {}), ("megakernel", {"max_bk": 32})],
                         ids=["reference", "megakernel"])
def test_slots_join_leave_and_reuse(tiny_checkpoint, seed, backend, opts):
    """Batch 3. Step by step: A enters slot 0; B enters slot 2 a step later (slot 1 idle all
    along); A leaves and C takes slot 0 mid-flight. Each gets the tokens it gets alone (from the
    reference, which the kernels match token for token)."""
    tiny = tiny_checkpoint(**SHAPE)
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompts = {name: random_prompt(n, tiny.vocab_size, seed + n) for name, n in (("A", 5), ("B", 9), ("C", 3))}
    steps = {"A": 3, "B": 5, "C": 3}
    want = {k: solo(model, prompts[k], steps[k], "reference") for k in prompts}

    mk = MegaQwen3(model, max_seq_len=32, batch_size=3, backend=backend, **opts)
    mk.reset_slots()
    got = {k: [] for k in prompts}
    where = {}                                       # name -> slot

    def enter(name, b):
        logits = mk.prefill_slot(b, prompts[name])
        got[name].append(int(logits.argmax()))
        where[name] = b

    enter("A", 0)
    t = 0
    while any(len(got[k]) < steps[k] for k in prompts):
        if t == 1:
            enter("B", 2)
        if "A" in where and len(got["A"]) == steps["A"]:
            mk.free_slot(where.pop("A"))
            enter("C", 0)
        active = [b for k, b in where.items() if len(got[k]) < steps[k]]
        tokens = mk.step_slots(active)
        for k, b in where.items():
            if len(got[k]) < steps[k]:
                got[k].append(int(tokens[b]))
        assert mk.cache.lengths[1] == mk.PARK_LENGTH and mk._lengths[1] == mk.PARK_LENGTH   # idle stays parked
        t += 1
    assert got == want


def test_prefill_slot_checks_its_input(tiny_checkpoint):
    tiny = tiny_checkpoint(**SHAPE)
    mk = MegaQwen3(load_model(str(tiny.folder), device="cpu", progress=False), max_seq_len=8, batch_size=2,
                   backend="reference")
    mk.reset_slots()
    with pytest.raises(ValueError, match="outside the batch"):
        mk.prefill_slot(2, [1])
    with pytest.raises(ValueError, match="empty"):
        mk.prefill_slot(0, [])
    with pytest.raises(ValueError, match="no room"):
        mk.prefill_slot(0, list(range(8)))
    with pytest.raises(ValueError, match="outside"):
        mk.prefill_slot(0, [tiny.vocab_size])
    mk.prefill_slot(0, [1, 2, 3, 4, 5, 6])
    mk.step_slots([0])
    with pytest.raises(ValueError, match="no room for another step"):   # length 7, then 8 = max_seq_len
        mk.step_slots([0])
        mk.step_slots([0])
    mk.reset_slots()
    assert mk.cache.lengths.tolist() == [mk.PARK_LENGTH] * 2
