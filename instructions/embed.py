"""EMBED: x[b] = embed[token[b]] (float32 residual stream).

Qwen3-0.6B: token [1] int32, embed [151936, 1024] bf16 -> x [1, 1024] fp32. Reads H*2 bytes per
sequence. Matches ``Qwen3Model.embed_tokens``. Runs inside the step so a decode step needs no host
work: the token comes from the previous step's ARGMAX (or from prefill).
"""

import triton
import triton.language as tl

from scheduler.kinds import Op

from .common import BT_SWAP
from .kind import DeviceKind
from .wgmma import embed_xs


@triton.jit
def embed_tile(t0, t1, tokens_ptr, embed_ptr, x_ptr, input_norm_ptr, xs_ptr, xss_ptr, B: tl.constexpr,
               H: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr):
    """Sequences [t0, t1): x[b] = embed[token[b]]; for the weights-on-M tiles also the first QKV's
    normalised input (``wgmma.embed_xs``)."""
    kk = tl.arange(0, BK)
    for b in range(t0, t1):
        tok = tl.load(tokens_ptr + b).to(tl.int64)
        for k0 in range(0, H, BK):
            v = tl.load(embed_ptr + tok * H + k0 + kk, mask=k0 + kk < H, other=0.0)
            tl.store(x_ptr + b * H + k0 + kk, v.to(tl.float32), mask=k0 + kk < H)
        if BT >= BT_SWAP:
            embed_xs(b, embed_ptr, tok, input_norm_ptr, xs_ptr, xss_ptr, B, H)


@triton.jit
def embed_kernel(tokens_ptr, embed_ptr, x_ptr, input_norm_ptr, xs_ptr, xss_ptr, B: tl.constexpr, H: tl.constexpr,
                 BK_H: tl.constexpr, BT: tl.constexpr):
    pid = tl.program_id(0)
    embed_tile(pid, pid + 1, tokens_ptr, embed_ptr, x_ptr, input_norm_ptr, xs_ptr, xss_ptr, B, H, BK_H, BT)


def embed_ref(st, p, layer, t0, t1):
    for b in range(t0, t1):
        st.x[b] = st.embed[st.tokens[b].long()].float()


KINDS = (DeviceKind(Op.EMBED, embed_tile, embed_kernel, embed_ref, reads=("tokens", "embed", "input_norm"),
                    writes=("x", "xs", "xss"),
                    num_warps=4),)
