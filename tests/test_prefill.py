"""The chunked prefill (models/qwen3/prefill.py) against Hugging Face's Qwen3ForCausalLM on tiny
random checkpoints in float32: last-position logits and every layer's keys and values in the
cache, for prompts that cross chunk boundaries and for batches of prompts of different lengths."""

from __future__ import annotations

import pytest
import torch

from megakernel import MegaQwen3, load_model
from models.qwen3 import prefill as qwen3_prefill
from models.qwen3.prefill import plan_chunks, prefill
from models.qwen3.reference import KVCache, Qwen3Reference

from test_reference_vs_hf import SHAPES, assert_same_greedy, hf_greedy, random_prompt, rel_err


@torch.no_grad()
def hf_prefill(hf, prompt: list[int]):
    """HF's last-position logits [V] and per-layer keys and values, each [kv_heads, T, D]."""
    out = hf(torch.tensor([prompt]), use_cache=True)
    kv = out.get("cache") or out.get("past_key_values")   # renamed in transformers 5.2x
    return out.logits[0, -1], [(layer.keys[0], layer.values[0]) for layer in kv.layers]


def assert_matches_hf(tiny, cache: KVCache, logits: torch.Tensor, prompts: list[list[int]]):
    for b, prompt in enumerate(prompts):
        want, kv = hf_prefill(tiny.hf, prompt)
        assert rel_err(logits[b], want) < 1e-5, f"sequence {b}: logits relative error {rel_err(logits[b], want):.3g}"
        n = len(prompt)
        for l, (k, v) in enumerate(kv):
            assert rel_err(cache.k[l, b, :, :n], k) < 1e-5, f"sequence {b}, layer {l}: keys"
            assert rel_err(cache.v[l, b, :, :n], v) < 1e-5, f"sequence {b}, layer {l}: values"
        # Nothing is written past the prompt: the next positions belong to decode.
        assert not cache.k[:, b, :, n:].any() and not cache.v[:, b, :, n:].any(), f"sequence {b}: written past {n}"
    assert cache.lengths.tolist() == [len(p) for p in prompts]


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_prompt_across_chunks_matches_hf(tiny_checkpoint, seed, shape, tie):
    """One prompt of 11 to 19 tokens in chunks of 5: the second and later chunks attend to the
    cache the chunks before them wrote, with grouped kv heads in all but ``gqa1``."""
    tiny = tiny_checkpoint(tie=tie, **SHAPES[shape])
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompt = random_prompt(11 + seed % 9, tiny.vocab_size, seed)
    cache = KVCache.allocate(model.config, 1, 24, torch.float32, "cpu")
    logits = prefill(model.config, model.weights, cache, [torch.tensor(prompt)], chunk_size=5)
    assert logits.shape == (1, tiny.vocab_size) and logits.dtype == torch.float32
    assert_matches_hf(tiny, cache, logits, [prompt])


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 64])
def test_batch_of_different_lengths_matches_hf(tiny_checkpoint, seed, chunk_size):
    """Four prompts packed back to back (no padding): a chunk may hold the end of one prompt and
    the start of the next, and a one-token prompt may share a chunk with both neighbours."""
    tiny = tiny_checkpoint(**SHAPES["gqa5-odd"])
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    lengths = [9 + seed % 5, 1, 4, 13]
    prompts = [random_prompt(n, tiny.vocab_size, seed + i) for i, n in enumerate(lengths)]
    cache = KVCache.allocate(model.config, len(prompts), 20, torch.float32, "cpu")
    logits = prefill(model.config, model.weights, cache, [torch.tensor(p) for p in prompts], chunk_size=chunk_size)
    assert logits.shape == (len(prompts), tiny.vocab_size)
    assert_matches_hf(tiny, cache, logits, prompts)


@pytest.mark.parametrize("lengths,chunk_size", [([5], 5), ([12], 5), ([3, 1, 9, 2], 4), ([1] * 7, 3), ([40, 7], 16)])
def test_chunk_plan_covers_each_prompt_once_in_order(lengths, chunk_size):
    chunks = plan_chunks(lengths, chunk_size)
    sizes = [sum(m for *_, m in pieces) for pieces in chunks]
    assert all(s == chunk_size for s in sizes[:-1]) and 1 <= sizes[-1] <= chunk_size
    assert sum(sizes) == sum(lengths) and len(chunks) == -(-sum(lengths) // chunk_size)
    seen = {b: 0 for b in range(len(lengths))}
    stream = 0
    for c, pieces in enumerate(chunks):
        offset = 0
        for b, pos, o, m in pieces:
            assert (o, pos) == (offset, seen[b]) and m >= 1
            assert c * chunk_size + o == stream, "pieces follow the packed stream"
            seen[b], offset, stream = pos + m, offset + m, stream + m
    assert [seen[b] for b in range(len(lengths))] == lengths


def test_decode_after_prefill_as_before(tiny_checkpoint, seed, monkeypatch):
    """MegaQwen3.prefill goes through the chunked prefill (here in chunks of 4, the module's
    constant): its cache and logits equal those of the reference's own prefill, and decoding from
    its cache gives HF's greedy tokens."""
    tiny = tiny_checkpoint(**SHAPES["gqa2"])
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    cfg, w = model.config, model.weights
    prompts = [random_prompt(10 + seed % 7, tiny.vocab_size, seed), random_prompt(3, tiny.vocab_size, seed + 1)]
    steps = 12
    monkeypatch.setattr(qwen3_prefill, "PREFILL_CHUNK", 4)
    calls = []
    monkeypatch.setattr(qwen3_prefill, "plan_chunks", lambda *a: calls.append(a) or plan_chunks(*a))
    mk = MegaQwen3(model, backend="reference", batch_size=2, max_seq_len=32)
    mk.prefill(prompts)
    assert calls == [([len(p) for p in prompts], 4)]

    old = KVCache.allocate(cfg, 2, 32, torch.float32, "cpu")
    old_logits = Qwen3Reference(cfg, w, old).prefill([torch.tensor(p) for p in prompts])
    assert rel_err(mk.logits, old_logits) < 1e-6
    assert torch.equal(mk.cache.lengths, old.lengths)
    for b, p in enumerate(prompts):
        assert rel_err(mk.cache.k[:, b, :, :len(p)], old.k[:, b, :, :len(p)]) < 1e-6
        assert rel_err(mk.cache.v[:, b, :, :len(p)], old.v[:, b, :, :len(p)]) < 1e-6

    decode = Qwen3Reference(cfg, w, mk.cache).decode
    tokens = [mk.logits.argmax(-1)]
    for _ in range(steps - 1):
        tokens.append(decode(tokens[-1]).argmax(-1))
    tokens = torch.stack(tokens, dim=1)
    for b, prompt in enumerate(prompts):
        theirs, their_logits = hf_greedy(tiny.hf, prompt, steps)
        assert_same_greedy(tokens[b].tolist(), theirs, their_logits)


@pytest.mark.parametrize("prompts,chunk_size,message", [
    ([[1, 2]], 0, "chunk_size must be a positive integer"),
    ([[1, 2], [3]], 8, "got 2 prompts for a batch of 1"),
    ([[]], 8, "prompt 0 must be a non-empty 1-D sequence"),
    ([[[1, 2]]], 8, "prompt 0 must be a non-empty 1-D sequence"),
    ([[1] * 17], 8, "prompt 0 has 17 tokens; the cache holds 16"),
    ([[1, 99999]], 8, "prompt 0 has token ids outside"),
], ids=["chunk-0", "count", "empty", "2-D", "too-long", "id-range"])
def test_bad_input_is_refused_before_any_work(tiny_checkpoint, prompts, chunk_size, message):
    tiny = tiny_checkpoint(**SHAPES["gqa2"])
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    cache = KVCache.allocate(model.config, 1, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match=message):
        prefill(model.config, model.weights, cache, prompts, chunk_size=chunk_size)
    assert not cache.k.any() and not cache.lengths.any()


def test_default_chunk_is_bounded_by_the_activation_budget():
    """A chunk's activations stay within PREFILL_ACT_BYTES (or the GEMM-rate minimum), so a long
    prompt of a small model is one chunk (plain causal attention) and a large model's is cut."""
    from models.qwen3.config import PRESETS
    for name, cfg in PRESETS.items():
        n = qwen3_prefill.default_chunk(cfg, torch.bfloat16)
        per = qwen3_prefill.act_bytes_per_token(cfg, 2)
        assert n >= qwen3_prefill.PREFILL_MIN_CHUNK, name
        assert n == qwen3_prefill.PREFILL_MIN_CHUNK or n * per <= qwen3_prefill.PREFILL_ACT_BYTES, name
        assert (n + 1) * per > qwen3_prefill.PREFILL_ACT_BYTES or n == qwen3_prefill.PREFILL_MIN_CHUNK, name
    assert qwen3_prefill.default_chunk(PRESETS["0.6b"], torch.bfloat16) >= 32768
    assert qwen3_prefill.default_chunk(PRESETS["32b"], torch.bfloat16) < 32768
