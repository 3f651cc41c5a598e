"""The library API says what it does: ``prefill`` returns the first generated tokens and ``step``
the next, so a prefill-then-step loop gets the tokens ``generate`` gets; a batch's sequences end
on their own (a stop token or their own limit) while the others go on; docs/usage.md's library
example runs as written."""

from __future__ import annotations

import re

import pytest
import torch

from megakernel import MegaQwen3, load_model

from test_reference_vs_hf import random_prompt

SHAPE = dict(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)


@pytest.fixture
def tiny_model(tiny_checkpoint):
    tiny = tiny_checkpoint(**SHAPE)
    return load_model(str(tiny.folder), device="cpu", progress=False)


def prefill_then_step(mk, prompts, n, **sampling) -> torch.Tensor:
    tokens = [mk.prefill(prompts, **sampling)]
    tokens += [mk.step() for _ in range(n - 1)]
    return torch.stack(tokens, dim=1)


@pytest.mark.parametrize("backend, n", [("reference", 12), ("vm", 6), ("megakernel", 4)])
def test_prefill_then_step_gets_the_tokens_generate_gets(tiny_model, seed, backend, n):
    prompts = [random_prompt(5, 320, seed), random_prompt(3, 320, seed + 1)]
    mk = MegaQwen3(tiny_model, max_seq_len=16, batch_size=2, backend=backend)
    looped = prefill_then_step(mk, prompts, n)
    assert looped.shape == (2, n)
    generated = mk.generate(prompts, max_new_tokens=n)
    assert torch.equal(looped, generated), (looped.tolist(), generated.tolist())
    # the first token is the argmax of the prompt's last logits, which generate does not skip
    mk.prefill(prompts)
    assert torch.equal(mk.logits.argmax(-1), generated[:, 0])


def test_prefill_then_step_with_seeded_sampling(tiny_model, seed):
    prompts = [random_prompt(6, 320, seed)]
    mk = MegaQwen3(tiny_model, max_seq_len=32, backend="reference")
    sampling = dict(temperature=1.5, top_k=50, top_p=0.95, seed=seed)
    looped = prefill_then_step(mk, prompts, 16, **sampling)
    assert torch.equal(looped, mk.generate(prompts, max_new_tokens=16, **sampling))
    assert not torch.equal(looped, mk.generate(prompts, max_new_tokens=16)), "sampling made no difference"


def test_batch_sequences_end_on_their_own(tiny_model, seed):
    """Limits of 3, 8 and 5 tokens and a stop token that the last sequence makes early: each row
    holds that sequence's own tokens up to its end, then padding; the batch runs until the last
    sequence ends, and on_token sees the same padded tokens step by step."""
    prompts = [random_prompt(4, 320, seed + i) for i in range(3)]
    free = MegaQwen3(tiny_model, max_seq_len=16, batch_size=3, backend="reference").generate(prompts, 8)
    stop = int(free[2, 1])
    ends = []
    for b, limit in enumerate([3, 8, 5]):
        row = free[b, :limit].tolist()
        ends.append(row.index(stop) + 1 if stop in row else limit)
    mk = MegaQwen3(tiny_model, max_seq_len=16, batch_size=3, backend="reference")
    seen = []
    out = mk.generate(prompts, max_new_tokens=[3, 8, 5], stop_tokens=[stop], on_token=seen.append)
    assert out.shape == (3, max(ends))
    for b in range(3):
        assert out[b, :ends[b]].tolist() == free[b, :ends[b]].tolist(), b
        assert (out[b, ends[b]:] == -1).all(), out[b].tolist()
    assert mk.num_generated == ends
    assert mk.finish_reasons[2] == "stop" and ends[2] <= 2
    assert mk.finish_reasons[0] == ("stop" if stop in free[0, :3].tolist() else "length")
    assert torch.equal(torch.stack(seen, dim=1), out)
    # another pad id, and every sequence stopping at once
    out = mk.generate(prompts, max_new_tokens=4, pad_token_id=0)
    assert out.shape == (3, 4) and mk.finish_reasons == ["length"] * 3 and mk.num_generated == [4] * 3


def test_generate_checks_before_any_work(tiny_model):
    mk = MegaQwen3(tiny_model, max_seq_len=8, batch_size=2, backend="reference")
    mk.prefill([[1, 2], [3]])
    kept = (list(mk._lengths), mk.tokens.clone())
    for kwargs, message in [(dict(max_new_tokens=[2]), "1 entries for batch_size 2"),
                            (dict(max_new_tokens=[2, 0]), "at least 1"),
                            (dict(max_new_tokens=9), "do not fit"),
                            (dict(max_new_tokens=2, top_p=2.0, temperature=1.0), "top-p")]:
        with pytest.raises(ValueError, match=message):
            mk.generate([[1, 2, 3], [4]], **kwargs)
        assert (mk._lengths, mk.tokens.tolist()) == (kept[0], kept[1].tolist()), "state changed by a refused call"


def test_reprs_are_one_line(tiny_model):
    mk = MegaQwen3(tiny_model, max_seq_len=8, backend="reference")
    for obj in (tiny_model, tiny_model.weights, mk):
        text = repr(obj)
        assert "\n" not in text and len(text) < 200 and "tensor(" not in text, text
    assert "2 layers" in repr(tiny_model.weights) and "backend='reference'" in repr(mk)


def usage_library_example() -> str:
    """docs/usage.md's library example (the README's shorter one runs in test_readme.py)."""
    usage = (__import__("pathlib").Path(__file__).resolve().parents[1] / "docs" / "usage.md").read_text()
    section = usage[usage.index("## Library"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_usage_library_example_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    code = usage_library_example()
    assert "mk.prefill(" in code and "mk.step()" in code and "assert" in code
    exec(compile(code, "docs/usage.md", "exec"), {})     # its own assert compares the loop with generate
    printed = capsys.readouterr().out
    assert re.search(r"tensor\(\[\[", printed), printed


def test_the_rules_layout_of_workers_goes_to_every_kernel_backend(monkeypatch):
    """On a GPU with the rules' plan, 0.6b from batch 32 runs one worker of 8 warps an SM
    (``scheduler.ops.default_layout``), and every kernel backend gets that layout, so they plan alike;
    options given, or a tuned plan's own layout, win (more workers than it holds too); batch 16, the
    reference and the CPU keep theirs."""
    from types import SimpleNamespace

    from megakernel import backends
    from megakernel.plans import Choice, Entry, Key
    from megakernel.runtime import KERNEL_BACKENDS, _backend_options
    from models.qwen3.config import PRESETS

    monkeypatch.setattr(backends, "default_workers", lambda dev: 132)

    def view(batch, device="cuda"):
        w = SimpleNamespace(device=torch.device(device), dtype=torch.bfloat16, quantization=None)
        return SimpleNamespace(weights=w, config=PRESETS["0.6b"], batch_size=batch, tp=1)

    rules = Choice("rules")
    for name in KERNEL_BACKENDS:
        assert _backend_options(view(64), name, rules, {}) == {"num_warps": 8, "workers_per_sm": 1}
    assert _backend_options(view(32), "megakernel", rules, {"num_workers": 132}) == \
        {"num_workers": 132, "num_warps": 8, "workers_per_sm": 1}
    assert _backend_options(view(64), "megakernel", rules, {"num_warps": 4}) == {"num_warps": 4}
    # more workers than one an SM: the layout before it (4 warps, two an SM), which holds them
    assert _backend_options(view(64), "megakernel", rules, {"num_workers": 264}) == {"num_workers": 264}
    assert _backend_options(view(16), "megakernel", rules, {}) == {}
    assert _backend_options(view(64), "reference", rules, {}) == {}
    assert _backend_options(view(64, "cpu"), "megakernel", rules, {}) == {}
    entry = Entry(key=Key.of("cpu", PRESETS["0.6b"], torch.bfloat16, 64, 512), fields={"R_LM": 128},
                  strategy="balanced", workers_per_sm=2, tuned_at="2026-11-29T00:00:00+00:00", rules_ms=1.0,
                  tuned_ms=0.9, max_seq_len=512)
    assert _backend_options(view(64), "megakernel", Choice("tuned", entry), {}) == \
        {"plan_overrides": {"R_LM": 128}, "strategy": "balanced", "workers_per_sm": 2}
