"""The kernel backends on the CPU, through Triton's interpreter (one worker), against the
reference and transformers: megakernel, superkernel and per-op must give the same greedy tokens
as each other, as the reference and as Hugging Face for 32 steps, with logits within 1e-4.
"""

import pytest
import torch

from megakernel import MegaQwen3, load_model
from megakernel.backends import MegakernelError

from test_reference_vs_hf import assert_same_greedy, hf_greedy, random_prompt, rel_err

STEPS = 32
KERNELS = ("megakernel", "superkernel", "per-op")


def _run(model, backend, prompts, steps):
    mk = MegaQwen3(model, max_seq_len=64, batch_size=len(prompts), backend=backend)
    out = mk.generate(prompts, max_new_tokens=steps)
    return out, mk.logits.clone()


@pytest.mark.parametrize("shape", [
    dict(hidden=160, intermediate=352, heads=10, kv_heads=2, head_dim=16, tie=True),    # GQA 5, odd sizes
    dict(hidden=64, intermediate=128, heads=4, kv_heads=4, head_dim=16, tie=False),     # GQA 1, untied
], ids=["gqa5-tied-odd", "gqa1-untied"])
def test_kernel_backends_match_reference_and_hf(tiny_checkpoint, seed, shape):
    tiny = tiny_checkpoint(**shape)
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompts = [random_prompt(7, tiny.vocab_size, seed), random_prompt(4, tiny.vocab_size, seed + 1)]
    ref_tokens, ref_logits = _run(model, "reference", prompts, STEPS)
    for b, p in enumerate(prompts):
        theirs, their_logits = hf_greedy(tiny.hf, p, STEPS)
        assert_same_greedy(ref_tokens[b].tolist(), theirs, their_logits)
    for backend in KERNELS:
        tokens, logits = _run(model, backend, prompts, STEPS)
        assert torch.equal(tokens, ref_tokens), f"{backend}: {tokens.tolist()} != reference {ref_tokens.tolist()}"
        assert rel_err(logits, ref_logits) < 1e-4, backend


def test_broken_tape_names_the_instruction(tiny_checkpoint):
    tiny = tiny_checkpoint()
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    mk = MegaQwen3(model, max_seq_len=32, backend="megakernel")
    mk.prefill([1, 2, 3])
    be = mk.backend
    w, i = next((w, i) for w, i, ins in be.tape.instructions() if ins.op == 4)   # an O projection
    be.words[w, i, 5] = 10 ** 6
    with pytest.raises(MegakernelError, match=rf"worker {w} timed out at tape position {i} \(OPROJ layer 0"):
        mk.step()
    # the state is recoverable: counters were reset, a fresh sequence decodes again
    be.words[w, i, 5] = be.tape.workers[w][i].wait_per_step
    mk.prefill([1, 2, 3])
    mk.step()
