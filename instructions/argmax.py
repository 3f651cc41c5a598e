"""ARGMAX: the greedy next token from the LM head's per-tile maxima; advances the sequence.

token[b] = index of the largest logit (the first one on ties, as ``torch.argmax``), read from the
LMHEAD tiles' (max, argmax) pairs, also written to ``hist[s * B + b]`` (step s of a launch of
``steps``); the last step of the launch adds ``steps`` to length[b] (attention reads the position
as length + s, so lengths stay fixed within a launch). Writing these inside the step is what lets
the next step start with no host work. Qwen3-0.6B: 9496 pairs per sequence, 76 KB.
"""

import triton
import triton.language as tl

from .common import wait_counter


@triton.jit
def argmax_tile(t0, t1, amax_v_ptr, amax_i_ptr, tokens_ptr, lengths_ptr, hist_ptr, s, steps, cnt_ptr, target,
                B: tl.constexpr, NT: tl.constexpr, BLOCK: tl.constexpr, WAIT: tl.constexpr, SPIN: tl.constexpr):
    seen = target
    if WAIT:
        seen = wait_counter(cnt_ptr, target, SPIN)
    kk = tl.arange(0, BLOCK)
    for b in range(t0, t1):
        best_v = tl.full([BLOCK], float("-inf"), tl.float32)
        best_i = tl.full([BLOCK], 2147483647, tl.int32)
        for k0 in range(0, NT, BLOCK):
            m = k0 + kk < NT
            v = tl.load(amax_v_ptr + b * NT + k0 + kk, mask=m, other=float("-inf"), cache_modifier=".cg")
            i = tl.load(amax_i_ptr + b * NT + k0 + kk, mask=m, other=2147483647, cache_modifier=".cg")
            take = (v > best_v) | ((v == best_v) & (i < best_i))
            best_v = tl.where(take, v, best_v)
            best_i = tl.where(take, i, best_i)
        top = tl.max(best_v, axis=0)
        tok = tl.min(tl.where(best_v == top, best_i, 2147483647), axis=0)
        tl.store(tokens_ptr + b, tok)
        tl.store(hist_ptr + s * B + b, tok)
        if s == steps - 1:
            tl.store(lengths_ptr + b, tl.load(lengths_ptr + b) + steps)
    return seen


@triton.jit
def argmax_kernel(amax_v_ptr, amax_i_ptr, tokens_ptr, lengths_ptr, B: tl.constexpr, NT: tl.constexpr,
                  BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    argmax_tile(pid, pid + 1, amax_v_ptr, amax_i_ptr, tokens_ptr, lengths_ptr, tokens_ptr, 0, 1, lengths_ptr, 0,
                B, NT, BLOCK, False, 0)


def argmax(st, p, layer=0):
    from scheduler.ops import Op
    argmax_kernel[(p.B,)](st.amax_v, st.amax_i, st.tokens, st.lengths, B=p.B, NT=p.tiles(Op.LMHEAD), BLOCK=1024,
                          num_warps=4)


def argmax_ref(st, p, layer, t0, t1):
    for b in range(t0, t1):
        top = st.amax_v[b].max()
        st.tokens[b] = st.amax_i[b][st.amax_v[b] == top].min()
        st.lengths[b] += 1
