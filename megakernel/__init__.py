"""A persistent single-kernel Triton megakernel runtime for Qwen3 decode.

    from megakernel import load_model, MegaQwen3
    mk = MegaQwen3(load_model("0.6b"), max_seq_len=4096, batch_size=1)
    out = mk.generate([151644, 872], max_new_tokens=64)
"""

from . import device as _device

DEVICE = _device.configure()   # must run before any @triton.jit is defined (TRITON_INTERPRET)

from .model import Qwen3Model, load_model  # noqa: E402
from .runtime import BACKENDS, MegaQwen3  # noqa: E402

__all__ = ["load_model", "MegaQwen3", "Qwen3Model", "BACKENDS", "DEVICE"]
