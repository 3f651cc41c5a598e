"""The torch reference, loaded through ``load_model`` and run by ``MegaQwen3``, against Hugging
Face's ``Qwen3ForCausalLM`` on tiny random checkpoints in float32: logits and greedy tokens."""

from __future__ import annotations

import json

import pytest
import torch

from megakernel import MegaQwen3, load_model
from models.qwen3.weights import load_checkpoint, to_hf_state_dict

STEPS = 32
SHAPES = {
    # name: (hidden, intermediate, heads, kv_heads, head_dim)
    "gqa1": dict(hidden=64, intermediate=128, heads=4, kv_heads=4, head_dim=16),
    "gqa2": dict(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16),
    "gqa5-odd": dict(hidden=160, intermediate=352, heads=10, kv_heads=2, head_dim=16),
}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@torch.no_grad()
def hf_greedy(hf, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """HF greedy decoding by full forwards over the growing sequence: tokens and each step's logits."""
    ids, logits = list(prompt), []
    for _ in range(n):
        lg = hf(torch.tensor([ids])).logits[0, -1].float()
        logits.append(lg)
        ids.append(int(lg.argmax()))
    return ids[len(prompt):], logits


def assert_same_greedy(ours: list[int], theirs: list[int], their_logits: list[torch.Tensor]):
    """Equal token lists; a first difference is accepted only where HF's own top two logits tie
    to within float32 rounding (then either choice is right and the sequences part ways)."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            top2 = their_logits[i].topk(2).values
            gap = float(top2[0] - top2[1])
            assert gap < 1e-4 * max(1.0, float(top2[0].abs())), (
                f"step {i}: ours {a}, HF {b} (HF's margin {gap:.3g}, not a tie)\nours {ours}\nHF   {theirs}")
            return
    assert len(ours) == len(theirs)


def random_prompt(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_batch1_logits_and_greedy(tiny_checkpoint, seed, shape, tie):
    tiny = tiny_checkpoint(tie=tie, **SHAPES[shape])
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    assert model.dtype == torch.float32 and model.weights.tied == tie
    prompt = random_prompt(3 + seed % 17, tiny.vocab_size, seed)
    mk = MegaQwen3(model, backend="reference", batch_size=1, max_seq_len=len(prompt) + STEPS + 3)

    first = mk.prefill(torch.tensor([prompt]))
    logits = mk.logits.clone()
    assert logits.shape == (1, tiny.vocab_size) and logits.dtype == torch.float32
    assert first.shape == (1,) and int(first[0]) == int(logits[0].argmax())   # greedy: the first token
    with torch.no_grad():
        hf_logits = tiny.hf(torch.tensor([prompt])).logits[0, -1]
    assert rel_err(logits[0], hf_logits) < 1e-5

    # Decode steps: each step's logits against HF's at the same position of the same sequence.
    tokens, step_logits = [int(first[0])], [logits[0]]
    for _ in range(STEPS - 1):
        tokens.append(int(mk.step()[0]))
        step_logits.append(mk.logits[0].clone())
    with torch.no_grad():
        full = tiny.hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]
    errs = [rel_err(ours, theirs) for ours, theirs in zip(step_logits, full)]
    assert max(errs) < 1e-5, f"worst step {errs.index(max(errs))}: relative error {max(errs):.3g}"

    theirs, their_logits = hf_greedy(tiny.hf, prompt, STEPS)
    assert_same_greedy(tokens, theirs, their_logits)
    # generate() gives the same tokens as prefill + step.
    again = mk.generate([prompt], max_new_tokens=STEPS)
    assert again.shape == (1, STEPS) and again[0].tolist() == tokens


@pytest.mark.parametrize("shape", list(SHAPES))
def test_batch2_prompts_of_different_lengths(tiny_checkpoint, seed, shape):
    tiny = tiny_checkpoint(tie=shape == "gqa2", **SHAPES[shape])
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    n = 4 + seed % 9
    prompts = [random_prompt(n, tiny.vocab_size, seed), random_prompt(n + 7, tiny.vocab_size, seed + 1)]
    mk = MegaQwen3(model, backend="reference", batch_size=2, max_seq_len=n + 7 + STEPS)

    mk.prefill(prompts)
    logits = mk.logits.clone()
    assert logits.shape == (2, tiny.vocab_size)
    out = mk.generate(prompts, max_new_tokens=STEPS)
    assert out.shape == (2, STEPS)
    for b, prompt in enumerate(prompts):
        with torch.no_grad():
            hf_logits = tiny.hf(torch.tensor([prompt])).logits[0, -1]
        assert rel_err(logits[b], hf_logits) < 1e-5, f"row {b}"
        theirs, their_logits = hf_greedy(tiny.hf, prompt, STEPS)
        assert_same_greedy(out[b].tolist(), theirs, their_logits)


def test_sharded_checkpoint(tiny_checkpoint, seed):
    tiny = tiny_checkpoint(max_shard_size="40KB", **SHAPES["gqa2"])
    index = tiny.folder / "model.safetensors.index.json"
    assert index.exists(), sorted(p.name for p in tiny.folder.iterdir())
    assert len(set(json.loads(index.read_text())["weight_map"].values())) > 1
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    ours = to_hf_state_dict(model.config, model.weights)
    for name, t in tiny.hf.state_dict().items():
        assert torch.equal(ours[name], t), name
    prompt = random_prompt(9, tiny.vocab_size, seed)
    mk = MegaQwen3(model, backend="reference", max_seq_len=16)
    with torch.no_grad():
        hf_logits = tiny.hf(torch.tensor([prompt])).logits[0, -1]
    mk.prefill(prompt)
    assert rel_err(mk.logits[0], hf_logits) < 1e-5


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_bf16_checkpoint_loads_into_float32_exactly(tiny_checkpoint, tie):
    tiny = tiny_checkpoint(dtype=torch.bfloat16, tie=tie, **SHAPES["gqa5-odd"])
    stored = tiny.hf.state_dict()
    assert all(t.dtype == torch.bfloat16 for t in stored.values())
    cfg, w32 = load_checkpoint(tiny.folder, dtype=torch.float32, progress=False)
    assert w32.dtype == torch.float32 and w32.tied == tie
    back = to_hf_state_dict(cfg, w32)
    for name, t in stored.items():
        assert torch.equal(back[name], t.float()), name          # widening is exact
        assert torch.equal(back[name].to(torch.bfloat16), t), name   # and narrows back bit for bit
    _, w16 = load_checkpoint(tiny.folder, dtype=torch.bfloat16, progress=False)
    assert w16.tied == tie
    for name, t in to_hf_state_dict(cfg, w16).items():
        assert torch.equal(t, stored[name]), name
    assert all(torch.equal(a.to(torch.bfloat16), b) for a, b in
               zip(w32.tensors().values(), w32.to(dtype=torch.bfloat16).tensors().values()))
