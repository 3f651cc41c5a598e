"""Batches and long contexts on the CPU: a batch decodes each sequence exactly as it would alone,
and attention split across positions stays exact when the context is long relative to the model.
"""

import pytest
import torch

from megakernel import MegaQwen3, load_model

from test_reference_vs_hf import random_prompt, rel_err


@pytest.mark.parametrize("backend", ["reference", "megakernel"])
def test_batch_equals_each_sequence_alone(tiny_checkpoint, seed, backend):
    tiny = tiny_checkpoint(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompts = [random_prompt(n, tiny.vocab_size, seed + n) for n in (9, 3, 6)]
    steps = 10
    batch = MegaQwen3(model, max_seq_len=32, batch_size=3, backend=backend).generate(prompts, max_new_tokens=steps)
    for b, p in enumerate(prompts):
        alone = MegaQwen3(model, max_seq_len=32, batch_size=1, backend=backend).generate([p], max_new_tokens=steps)
        assert torch.equal(batch[b], alone[0]), f"sequence {b}: batch {batch[b].tolist()} alone {alone[0].tolist()}"


def test_long_context_split_attention(tiny_checkpoint, seed):
    """A 300-token prompt on a hidden-64 model, attention cut into 4 splits of many blocks each."""
    tiny = tiny_checkpoint(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompt = random_prompt(300, tiny.vocab_size, seed)
    ref = MegaQwen3(model, max_seq_len=320, backend="reference")
    mk = MegaQwen3(model, max_seq_len=320, backend="megakernel", plan_overrides={"NSPLIT": 4, "NSPLIT_PAD": 4})
    want = ref.generate([prompt], max_new_tokens=4)
    got = mk.generate([prompt], max_new_tokens=4)
    assert torch.equal(got, want)
    assert rel_err(mk.logits, ref.logits) < 1e-4
