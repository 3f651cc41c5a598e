"""MegaQwen3's per-slot control (prefill_slot, step_slots, free_slot), which continuous batching
stands on: sequences that join, leave and reuse slots of a running batch, next to idle slots,
decode exactly as each would alone; for the reference and for the megakernel (Triton's
interpreter); and the engine's detokenizer never splits a character."""

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


def byte_tokenizer():
    """A byte-level BPE (Qwen's kind) trained on text with multi-byte characters, so that tokens
    carry parts of characters."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=330, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["naïve café 中文字 😀 déjà vu the cat sat"] * 10, trainer)
    return tok


def test_detokenizer_never_splits_a_character(seed):
    from megakernel.serve.text import Detokenizer
    tok = byte_tokenizer()
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    g = torch.Generator().manual_seed(seed)
    # random ids (invalid UTF-8 too) and a text's own ids, byte by byte: held back until whole
    text = "naïve 中文 😀!"
    byte_ids = [tok.token_to_id(c) for c in byte_symbols(text)]
    cases = [torch.randint(0, tok.get_vocab_size(), (60,), generator=g).tolist() for _ in range(20)] + [byte_ids]
    for ids in cases:
        d = Detokenizer(decode)
        pieces = [d.add(t) for t in ids]
        pieces.append(d.flush())
        assert "".join(pieces) == decode(ids)
        assert not any(p.endswith("\ufffd") for p in pieces[:-1])   # an incomplete character waits
    d = Detokenizer(decode)
    pieces = [d.add(t) for t in byte_ids] + [d.flush()]
    assert [p for p in pieces if p] == ["n", "a", "ï", "v", "e", " ", "中", "文", " ", "😀", "!"]


def byte_symbols(text: str) -> str:
    """The byte-level alphabet's symbol of each UTF-8 byte of ``text``."""
    from tokenizers import pre_tokenizers
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(text)[0][0]
