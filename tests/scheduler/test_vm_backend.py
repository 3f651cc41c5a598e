"""The ``vm`` backend (the tape interpreted with torch references) against the reference backend
and Hugging Face, on tiny checkpoints: same greedy tokens, logits within float32 rounding."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from models.qwen3.config import Qwen3Config
from models.qwen3.weights import random_weights, save_checkpoint
from scheduler.ops import Op

STEPS = 9
# (name, config, seed): GQA groups of 5, 1 and 2; tied and untied LM heads
CONFIGS = {
    "g5-untied": Qwen3Config(hidden_size=160, intermediate_size=352, num_hidden_layers=2, num_attention_heads=10,
                             num_key_value_heads=2, head_dim=16, vocab_size=300),
    "g1-tied": Qwen3Config(hidden_size=160, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=4, head_dim=16, vocab_size=300, tie_word_embeddings=True),
    "g2-untied": Qwen3Config(hidden_size=96, intermediate_size=200, num_hidden_layers=3, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=32, vocab_size=300),
}
PROMPTS = {1: [[5, 17, 42, 7, 99, 3]], 2: [[5, 17, 42, 7, 99, 3, 250, 12, 8, 1, 77], [31, 2]]}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The VM runs thousands of tiny ops: with several intra-op threads on a shared 2-core machine,
    their spin-waits make a step 100x slower whenever another process holds a core."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from megakernel import load_model
    cache = {}

    def get(name):
        if name not in cache:
            cfg = CONFIGS[name]
            folder = save_checkpoint(tmp_path_factory.mktemp(name), cfg, random_weights(cfg, seed=len(cache) + 11))
            cache[name] = load_model(str(folder), device="cpu", progress=False)
        return cache[name]

    return get


def run(model, backend, batch, steps=STEPS, max_seq_len=64, **options):
    """Prefill, then ``steps`` decode steps: (tokens [B, steps], logits [steps, B, V])."""
    from megakernel import MegaQwen3
    mk = MegaQwen3(model, max_seq_len=max_seq_len, batch_size=batch, backend=backend, **options)
    mk.prefill(PROMPTS[batch])
    toks, logits = [], []
    for _ in range(steps):
        toks.append(mk.step().clone())
        logits.append(mk.logits.clone())
    return torch.stack(toks, 1), torch.stack(logits), mk


_reference: dict = {}


def reference(models, name, batch):
    if (name, batch) not in _reference:
        _reference[(name, batch)] = run(models(name), "reference", batch)[:2]
    return _reference[(name, batch)]


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("workers", [1, 3, 8])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_vm_matches_reference(models, name, workers, batch):
    ref_tok, ref_logits = reference(models, name, batch)
    strategy = ("balanced", "round-robin")[(workers + batch) % 2]
    tok, logits, mk = run(models(name), "vm", batch, num_workers=workers, strategy=strategy)
    assert mk.backend.tape.num_workers == workers
    assert torch.equal(tok, ref_tok)
    err = ((logits - ref_logits).abs().amax() / ref_logits.abs().amax()).item()
    assert err < 1e-5, err
    # the state advanced: lengths count the prompt and every decoded token
    assert mk.cache.lengths.tolist() == [len(p) + STEPS for p in PROMPTS[batch]]
    # every instruction of the tape ran once in the last step, in an order the waits allow
    ran = mk.backend.order
    assert sorted(map(dataclasses.astuple, ran)) == sorted(dataclasses.astuple(i)
                                                           for _, _, i in mk.backend.tape.instructions())


def test_vm_superkernel_tape(models):
    ref_tok, ref_logits = reference(models, "g5-untied", 2)
    tok, logits, mk = run(models("g5-untied"), "vm", 2, num_workers=3, mode="superkernel")
    assert mk.backend.tape.mode == "superkernel"
    assert torch.equal(tok, ref_tok)
    assert ((logits - ref_logits).abs().amax() / ref_logits.abs().amax()).item() < 1e-5


@pytest.mark.parametrize("name", ["g5-untied", "g2-untied"])
def test_vm_lagged_tape(models, name):
    """A batch-1 tape whose O projection runs on at most half the workers places O, gate/up and down
    by when their workers get there (``scheduler.graph.lagged``); it decodes as the reference does."""
    from scheduler.graph import lagged
    ref_tok, ref_logits = reference(models, name, 1)
    tok, logits, mk = run(models(name), "vm", 1, num_workers=8)
    assert lagged(mk.backend.tape.plan, 8, mk.backend.tape.mode, mk.backend.tape.strategy)
    assert torch.equal(tok, ref_tok)
    assert ((logits - ref_logits).abs().amax() / ref_logits.abs().amax()).item() < 1e-5


def test_vm_interleaves_workers(models):
    """With several workers the run order is not the tape's stage order of any one worker list:
    a worker that is blocked lets the others advance."""
    _, _, mk = run(models("g5-untied"), "vm", 2, steps=1, num_workers=3)
    ops = [i.op for i in mk.backend.order]
    assert ops[0] == Op.EMBED and ops[-1] == Op.ARGMAX
    lists = mk.backend.tape.workers
    assert mk.backend.order != [i for lst in lists for i in lst]


def test_vm_matches_hf(tiny_checkpoint):
    """Greedy tokens of the VM equal Hugging Face's Qwen3ForCausalLM on its own checkpoint."""
    from megakernel import MegaQwen3, load_model
    tiny = tiny_checkpoint(vocab=300, hidden=160, intermediate=352, layers=2, heads=10, kv_heads=2, head_dim=16)
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompts = PROMPTS[2]
    mk = MegaQwen3(model, max_seq_len=64, batch_size=2, backend="vm", num_workers=3)
    out = mk.generate(prompts, max_new_tokens=STEPS)
    with torch.no_grad():
        for b, p in enumerate(prompts):
            ids = torch.tensor([p])
            for _ in range(STEPS):
                ids = torch.cat([ids, tiny.hf(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
            assert out[b].tolist() == ids[0, len(p):].tolist()


def test_vm_reports_stuck_instructions(models):
    """A tape that deadlocks stops the VM with the cycle named, instead of looping forever."""
    from megakernel.vm import VMError
    _, _, mk = run(models("g5-untied"), "vm", 1, steps=1, num_workers=2, strategy="round-robin")
    vm = mk.backend
    lists = [list(lst) for lst in vm.tape.workers]
    lists[0].insert(0, lists[0].pop())       # the last instruction first: it waits on its own producers
    vm.tape = dataclasses.replace(vm.tape, workers=lists)
    with pytest.raises(VMError, match=r"deadlock.*worker 0 position 0 \(" + lists[0][0].describe()):
        mk.step()
    assert vm.counters == {} and vm.steps == 0


def test_vm_checks_its_tape(models, monkeypatch):
    """The backend validates the tape it builds (a broken build_tape fails at construction)."""
    import megakernel.vm as vm_module
    from megakernel import MegaQwen3
    from scheduler.validate import TapeError
    real = vm_module.build_tape

    def dropping(*args, **kwargs):
        tape = real(*args, **kwargs)
        tape.workers[0].pop(1)
        return tape

    monkeypatch.setattr(vm_module, "build_tape", dropping)
    with pytest.raises(TapeError, match="scheduled nowhere"):
        MegaQwen3(models("g1-tied"), max_seq_len=32, batch_size=1, backend="vm", num_workers=2)
