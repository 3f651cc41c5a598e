"""ARGMAX: the greedy next token from the LM head's packed maximum; advances the sequence.

The LM head's tiles raise ``amax[b]`` with an atomic max of their (max, first argmax) packed as one
int64 (``common.argmax_key``), so the largest logit's first index is one word: token[b] is read
from it (the first maximum on ties, as ``torch.argmax``) and the word is reset for the next step in
the same atomic exchange, rather than a reduction over every LM-head tile's (max, argmax) pair.
The token is also written to ``hist[s * B + b]`` (step s
of a launch of ``steps``); the last step of the launch adds ``steps`` to length[b] (attention
reads the position as length + s, so lengths stay fixed within a launch). Writing these inside the
step is what lets the next step start with no host work.
"""

import triton
import triton.language as tl

from scheduler.kinds import Op

from .common import KEY_EMPTY, RELAXED, wait_counter
from .kind import DeviceKind


@triton.jit
def argmax_tile(t0, t1, amax_ptr, tokens_ptr, lengths_ptr, hist_ptr, s, steps, cnt_ptr, target,
                B: tl.constexpr, WAIT: tl.constexpr, SPIN: tl.constexpr):
    seen = target
    if WAIT:
        seen = wait_counter(cnt_ptr, target, SPIN)
    for b in range(t0, t1):
        key = tl.atomic_xchg(amax_ptr + b, KEY_EMPTY, sem=RELAXED, scope="gpu")
        tok = (4294967295 - (key & 4294967295)).to(tl.int32)
        tl.store(tokens_ptr + b, tok)
        tl.store(hist_ptr + s * B + b, tok)
        if s == steps - 1:
            tl.store(lengths_ptr + b, tl.load(lengths_ptr + b) + steps)
    return seen


@triton.jit
def argmax_kernel(amax_ptr, tokens_ptr, lengths_ptr, B: tl.constexpr):
    pid = tl.program_id(0)
    # one step a launch (s 0 of 1), no wait; the history is the token itself
    argmax_tile(pid, pid + 1, amax_ptr, tokens_ptr, lengths_ptr, hist_ptr=tokens_ptr, s=0, steps=1,
                cnt_ptr=lengths_ptr, target=0, B=B, WAIT=False, SPIN=0)


def argmax_ref(st, p, layer, t0, t1):
    for b in range(t0, t1):
        key = int(st.amax[b])
        st.amax[b] = KEY_EMPTY.value
        st.tokens[b] = 4294967295 - (key & 4294967295)
        st.lengths[b] += 1


KINDS = (DeviceKind(Op.ARGMAX, argmax_tile, argmax_kernel, argmax_ref, reads=("amax", "lengths"),
                    writes=("amax", "tokens", "lengths", "hist"), num_warps=1),)
