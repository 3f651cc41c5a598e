"""GPU checks of batched decode: every kernel backend gives the same greedy tokens at every batch
(they share the tiles and the plan, so the arithmetic is the same), for 0.6b and 8b.

Run on the device machine: python3 -m pytest -m gpu tests/test_gpu_batched.py -v -s
"""

import pytest
import torch

from test_gpu_sizes import _model, _prompt, assert_kernel_backends_agree

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("size", ["0.6b", "8b"])
@pytest.mark.parametrize("batch", [1, 4, 8, 16, 64])
def test_kernel_backends_agree(size, batch):
    model = _model(size)
    prompt = _prompt(model.config.vocab_size, (batch, 32))
    assert_kernel_backends_agree(model, prompt, 32)
    del model
    torch.cuda.empty_cache()
