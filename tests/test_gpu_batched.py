"""GPU checks of batched decode: every kernel backend gives the same greedy tokens at every batch
(they share the tiles and the plan, so the arithmetic is the same), for 0.6b and 8b.

Run on the device machine: python3 -m pytest -m gpu tests/test_gpu_batched.py -v -s
"""

import pytest
import torch

from test_gpu_sizes import _model, _prompt, assert_kernel_backends_agree

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("size", ["0.6b", "8b"])
@pytest.mark.parametrize("batch", [1, 4, 8, 16, 32, 64])
def test_kernel_backends_agree(size, batch):
    model = _model(size)
    prompt = _prompt(model.config.vocab_size, (batch, 32))
    assert_kernel_backends_agree(model, prompt, 32)
    del model
    torch.cuda.empty_cache()


@pytest.fixture(scope="module")
def few_heads(tmp_path_factory):
    """A 4-layer checkpoint with 4 query heads, 2 kv heads and a 768-row MLP (a TP 4 rank of 0.6b's
    layer shapes), random weights: at batch 2+ its GEMV stages have fewer tiles than workers, so
    some workers hold only attention splits, most of them empty at a short context."""
    from tests.conftest import SEED, build_checkpoint
    return build_checkpoint(tmp_path_factory.mktemp("fewheads") / "ckpt", SEED, vocab=4096, hidden=1024,
                            intermediate=768, layers=4, heads=4, kv_heads=2, head_dim=128)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("batch", [2, 4])
def test_workers_of_empty_splits_keep_the_layers_order(few_heads, batch, dtype):
    """64 greedy steps in one launch: the megakernel gives per-op's tokens and logits to the bit. (A
    worker holding only empty attention splits once took its tickets unwaited, ran ahead into
    later layers' tickets and made the combine run on partials not yet written.)"""
    from tests import tp_ranks
    prompts = _prompt(4096, (batch, 16)).tolist()
    out = tp_ranks.decode(0, 1, str(few_heads.folder), ["per-op", "megakernel"], prompts, 64, 64, 96, dtype,
                          False, "cuda")
    toks, logits = out["megakernel"]
    diff = (toks != out["per-op"][0]).nonzero()
    assert not len(diff), f"megakernel parts from per-op at sequence {int(diff[0, 0])} step {int(diff[0, 1])}"
    assert torch.equal(logits, out["per-op"][1])
