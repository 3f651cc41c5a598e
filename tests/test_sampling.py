"""Choosing the next token: greedy, temperature, top-k, top-p, seeded reproducibility."""

from __future__ import annotations

import pytest
import torch

from models.qwen3.sampling import SamplingParams, sample


def random_logits(seed: int, batch=4, vocab=300, scale=3.0) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def test_greedy_is_argmax(seed):
    logits = random_logits(seed)
    assert torch.equal(sample(logits, SamplingParams()), logits.argmax(-1))


@pytest.mark.parametrize("temperature", [0.1, 1.0, 7.5])
def test_top_k_1_is_greedy_at_any_temperature(seed, temperature):
    logits = random_logits(seed)
    g = torch.Generator().manual_seed(seed)
    for _ in range(20):
        assert torch.equal(sample(logits, SamplingParams(temperature, top_k=1), g), logits.argmax(-1))


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_tiny_top_p_is_greedy(seed, temperature):
    logits = random_logits(seed)
    g = torch.Generator().manual_seed(seed)
    for _ in range(20):
        assert torch.equal(sample(logits, SamplingParams(temperature, top_p=1e-6), g), logits.argmax(-1))


def test_top_k_and_top_p_keep_only_their_candidates(seed):
    logits = random_logits(seed, batch=1)
    g = torch.Generator().manual_seed(seed)
    top5 = set(logits[0].topk(5).indices.tolist())
    drawn = {int(sample(logits, SamplingParams(1.0, top_k=5), g)) for _ in range(200)}
    assert drawn <= top5
    probs = torch.softmax(logits[0], -1)
    order = probs.argsort(descending=True)
    nucleus = set(order[:int((probs[order].cumsum(0) < 0.5).sum()) + 1].tolist())
    drawn = {int(sample(logits, SamplingParams(1.0, top_p=0.5), g)) for _ in range(200)}
    assert drawn <= nucleus


def test_seeded_sample_is_reproducible(seed):
    logits = random_logits(seed, scale=1.0)
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=seed)
    g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    a = torch.stack([sample(logits, params, g1) for _ in range(50)])
    b = torch.stack([sample(logits, params, g2) for _ in range(50)])
    assert torch.equal(a, b)
    assert len(set(a[:, 0].tolist())) > 1   # and it is sampling, not a fixed choice


@pytest.mark.parametrize("temperature", [0.7, 1.0, 2.0])
def test_temperature_frequencies_follow_softmax(seed, temperature):
    vocab, n = 6, 20000
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed + 1)
    draws = sample(logits.expand(n, vocab), SamplingParams(temperature), g)
    freq = torch.bincount(draws, minlength=vocab).float() / n
    expected = torch.softmax(logits[0] / temperature, -1)
    # Binomial standard error is at most 0.5 / sqrt(n) = 0.0035: 5 sigma is 0.018.
    assert (freq - expected).abs().max() < 0.018, (freq, expected)


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=1.0, top_k=0), "top-k"),
    (dict(temperature=1.0, top_p=0.0), "top-p"),
    (dict(temperature=1.0, top_p=1.5), "top-p"),
])
def test_bad_settings_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_generate_seeded_and_top_k_1(tiny_checkpoint, seed):
    from megakernel import MegaQwen3, load_model

    tiny = tiny_checkpoint(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)
    mk = MegaQwen3(load_model(str(tiny.folder), device="cpu", progress=False), backend="reference",
                   max_seq_len=32)
    prompt = [5, 9, 13]
    greedy = mk.generate(prompt, max_new_tokens=12)
    assert torch.equal(mk.generate(prompt, max_new_tokens=12, temperature=3.0, top_k=1, seed=seed), greedy)
    assert torch.equal(mk.generate(prompt, max_new_tokens=12, temperature=0.5, top_p=1e-6, seed=seed), greedy)
    a = mk.generate(prompt, max_new_tokens=12, temperature=1.5, top_p=0.95, seed=seed)
    b = mk.generate(prompt, max_new_tokens=12, temperature=1.5, top_p=0.95, seed=seed)
    assert torch.equal(a, b)
    draws = {tuple(mk.generate(prompt, max_new_tokens=12, temperature=1.5, seed=seed + i)[0].tolist())
             for i in range(4)}
    assert len(draws) > 1   # different seeds sample different continuations
