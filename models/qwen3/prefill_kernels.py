"""Triton kernels of the prefill (``prefill.py``): the elementwise work of a layer in two launches.

At short and mid prompt lengths the prefill is bound by the host issuing launches, not by the GPU:
the q/k RMSNorm, RoPE and the KV-cache writes were seven torch ops a layer and SiLU x up two. Here

- ``qk_norm_rope_cache`` reads the QKV GEMM's output once and, per token and head, applies the q
  or k RMSNorm (with its weight) and RoPE (rotate_half, as Hugging Face's Qwen3) in float32, writes
  the rotated queries into a ``[n, Hq, D]`` buffer (which SDPA reads as ``[Hq, T, D]`` without a
  copy) and the rotated keys and the values into the KV cache at each token's (sequence, position);
- ``silu_mul`` reads the gate|up GEMM's output once and writes SiLU(gate) * up.

Both compute in float32 and round once to the model's dtype. Tiles are rows of (token, head) or
of tokens by a column block (``_tile_rows``). A third, ``cache_attention``, is attention for the
prefill graphs (``prefill_graphs.py``): each token over its sequence's cache up to its position,
one launch whatever the prompts' lengths.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


# The CPU runs these kernels through Triton's interpreter, far slower than torch's ops at a real
# model's shapes (about 0.5 s a layer for 512 tokens of 0.6b), so a CPU prefill keeps the torch ops
# unless this is set (the prefill tests set it, to run the kernels through the whole prefill).
INTERPRET_ON_CPU = False


def supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether these kernels run for tensors of ``dtype`` on ``device``: an NVIDIA GPU with the
    kernels compiled, or, with ``INTERPRET_ON_CPU``, the CPU in float32 with them interpreted (the
    interpreter has no 16-bit arithmetic). Elsewhere (an Ascend NPU, whose Triton these kernels are
    not tested on, or a CPU) the prefill keeps its torch ops."""
    if device.type == "cuda":
        return not _INTERPRETED
    return INTERPRET_ON_CPU and device.type == "cpu" and dtype == torch.float32 and _INTERPRETED


# (the row counts only bound the masks: not specialised, so every prompt length shares one kernel)
@triton.jit(do_not_specialize=["rows"])
def _qk_norm_rope_cache_kernel(qkv_ptr, q_ptr, k_ptr, v_ptr, q_norm_ptr, k_norm_ptr, cos_ptr, sin_ptr,
                               seq_ptr, pos_ptr, rows, qkv_stride, cache_sb, cache_sh, cache_sp, eps,
                               HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                               BLOCK_R: tl.constexpr, BLOCK_HALF: tl.constexpr):
    # Row r is head h of token t, heads in the QKV GEMM's order: Hq queries, Hkv keys, Hkv values.
    # Each head is handled as its two halves, the pairs rotate_half mixes, so every load and store
    # is a contiguous run of D / 2 elements.
    HT: tl.constexpr = HQ + 2 * HKV
    HALF: tl.constexpr = D // 2
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    e = tl.arange(0, BLOCK_HALF)[None, :]
    row_ok = r < rows
    t = r // HT
    h = (r % HT).to(tl.int32)
    is_q = (h < HQ)[:, None]
    is_k = ((h >= HQ) & (h < HQ + HKV))[:, None]
    is_v = (h >= HQ + HKV)[:, None]
    col_ok = e < HALF
    mask = row_ok[:, None] & col_ok

    src = qkv_ptr + (t * qkv_stride + h * D)[:, None] + e
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    rstd = (1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D + eps))[:, None]
    w1 = tl.where(is_q, tl.load(q_norm_ptr + e, mask=col_ok, other=0.0).to(tl.float32),
                  tl.load(k_norm_ptr + e, mask=col_ok, other=0.0).to(tl.float32))
    w2 = tl.where(is_q, tl.load(q_norm_ptr + HALF + e, mask=col_ok, other=0.0).to(tl.float32),
                  tl.load(k_norm_ptr + HALF + e, mask=col_ok, other=0.0).to(tl.float32))
    y1 = x1 * rstd * w1
    y2 = x2 * rstd * w2
    trig = (t * D)[:, None] + e
    cos1 = tl.load(cos_ptr + trig, mask=mask, other=0.0)
    cos2 = tl.load(cos_ptr + HALF + trig, mask=mask, other=0.0)
    sin1 = tl.load(sin_ptr + trig, mask=mask, other=0.0)
    sin2 = tl.load(sin_ptr + HALF + trig, mask=mask, other=0.0)
    # y * cos + rotate_half(y) * sin, rotate_half(y) = (-y2, y1)
    o1 = y1 * cos1 - y2 * sin1
    o2 = y2 * cos2 + y1 * sin2

    q_dst = q_ptr + ((t * HQ + h) * D)[:, None] + e
    tl.store(q_dst, o1.to(q_ptr.dtype.element_ty), mask=mask & is_q)
    tl.store(q_dst + HALF, o2.to(q_ptr.dtype.element_ty), mask=mask & is_q)
    b = tl.load(seq_ptr + t, mask=row_ok, other=0).to(tl.int64)
    p = tl.load(pos_ptr + t, mask=row_ok, other=0).to(tl.int64)
    # a token of sequence -1 pads a fixed-size prefill (``prefill_graphs``): it writes no cache
    mask = mask & (b >= 0)[:, None]
    slot = b * cache_sb + p * cache_sp
    k_dst = k_ptr + (slot + (h - HQ) * cache_sh)[:, None] + e
    tl.store(k_dst, o1.to(k_ptr.dtype.element_ty), mask=mask & is_k)
    tl.store(k_dst + HALF, o2.to(k_ptr.dtype.element_ty), mask=mask & is_k)
    v_dst = v_ptr + (slot + (h - HQ - HKV) * cache_sh)[:, None] + e
    tl.store(v_dst, x1.to(v_ptr.dtype.element_ty), mask=mask & is_v)
    tl.store(v_dst + HALF, x2.to(v_ptr.dtype.element_ty), mask=mask & is_v)


# (the token count only sizes the grid; positions bound each program's loop)
@triton.jit
def _cache_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, seq_ptr, pos_ptr, cache_sb, cache_sh, cache_sp, scale,
                            HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, G_PAD: tl.constexpr,
                            D_PAD: tl.constexpr, BLOCK_N: tl.constexpr):
    # Program (t, h): token t's G query heads of kv head h against its sequence's cached keys at
    # positions 0 .. pos[t] (causal), online softmax in float32. Its own key is in the cache
    # already: qk_norm_rope_cache writes the chunk's keys before attention runs.
    G: tl.constexpr = HQ // HKV
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    b = tl.load(seq_ptr + t).to(tl.int64)
    p = tl.load(pos_ptr + t).to(tl.int64)
    n_keys = tl.where(b >= 0, p + 1, 0)        # a padding token (sequence -1) attends to nothing
    g = tl.arange(0, G_PAD)[:, None]
    d = tl.arange(0, D_PAD)[None, :]
    qmask = (g < G) & (d < D)
    q = tl.load(q_ptr + (t * HQ + h * G + g) * D + d, mask=qmask, other=0.0)
    base = tl.maximum(b, 0) * cache_sb + h * cache_sh
    n = tl.arange(0, BLOCK_N)[:, None]
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    for start in range(0, n_keys, BLOCK_N):
        kmask = (start + n < n_keys) & (d < D)
        k = tl.load(k_ptr + base + (start + n) * cache_sp + d, mask=kmask, other=0.0)
        v = tl.load(v_ptr + base + (start + n) * cache_sp + d, mask=kmask, other=0.0)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale                      # [G_PAD, BLOCK_N]
        s = tl.where((start + tl.arange(0, BLOCK_N))[None, :] < n_keys, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        pr = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(pr, axis=1)
        acc = acc * alpha[:, None] + tl.dot(pr.to(v.dtype), v).to(tl.float32)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + (t * HQ + h * G + g) * D + d, out.to(out_ptr.dtype.element_ty), mask=qmask)


class _Launcher:
    """``kernel[grid](*args, **constexprs)`` through the compiled kernel once one exists for the
    arguments' specialization, skipping Triton's binder: at short prompts the prefill is bound by
    the host, and the binder was half of a launch's host time (about 10 of 21 us on an H100 host).
    The key is at least as fine as Triton's: each tensor's dtype and 16-byte alignment, each
    integer's 1, multiple-of-16 and 32-bit tests, the constexprs and the device; a new key goes
    through the JIT, which compiles or finds the kernel, and its result is kept. Under the
    interpreter (no compiled kernels) every launch goes through the JIT."""

    def __init__(self, kernel):
        self.kernel, self.compiled = kernel, {}

    @staticmethod
    def _spec(a):
        if isinstance(a, torch.Tensor):
            return a.dtype, a.data_ptr() % 16 == 0
        if isinstance(a, int):
            return a == 1, a % 16 == 0, -2**31 <= a < 2**31
        return type(a)

    def __call__(self, grid, *args, num_warps: int, **constexprs):
        if _INTERPRETED:
            self.kernel[grid](*args, **constexprs, num_warps=num_warps)
            return
        grid = tuple(grid) + (1,) * (3 - len(grid))
        key = (torch.cuda.current_device(), num_warps, tuple(constexprs.values()), *map(self._spec, args))
        run = self.compiled.get(key)
        if run is None:
            k = self.kernel[grid](*args, **constexprs, num_warps=num_warps)
            self.compiled[key] = k.result() if hasattr(k, "result") else k
            return
        run[grid](*args, *(constexprs[name] for name in self.kernel.arg_names[len(args):]))


def _tile_rows(rows: int, width: int) -> int:
    """Rows of a tile ``width`` wide: 2k elements on a GPU (the same for every prompt length, so one
    compiled kernel serves all); under the interpreter up to 256k, but no more rows than there are,
    since there each program is a Python call and the work per call is numpy's."""
    if not _INTERPRETED:
        return max(1, 2048 // width)
    return min(triton.next_power_of_2(rows), max(1, (1 << 18) // width))


def qk_norm_rope_cache(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, cos: torch.Tensor,
                       sin: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, q_out: torch.Tensor, eps: float):
    """One layer's q/k norm, RoPE and cache write for a chunk of n tokens, in one launch.

    qkv [n, (Hq + 2 Hkv) D] (rows contiguous); q_norm, k_norm [D]; cos, sin [n, D] float32 (the
    plain tables, sin not negated); seq, pos [n] integer: token i is sequence seq[i] at position
    pos[i]; k_cache, v_cache [B, Hkv, S, D] (one layer of the cache, last dim contiguous); q_out
    [n, Hq, D] contiguous, filled with the rotated queries."""
    n, Hq, D = q_out.shape
    Hkv = k_cache.shape[1]
    assert qkv.shape == (n, (Hq + 2 * Hkv) * D) and qkv.stride(1) == 1 and q_out.is_contiguous()
    assert cos.shape == sin.shape == (n, D) and cos.is_contiguous() and sin.is_contiguous()
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1
    rows = n * (Hq + 2 * Hkv)
    block_half = triton.next_power_of_2(D // 2)
    block_r = _tile_rows(rows, 2 * block_half)
    grid = (triton.cdiv(rows, block_r),)
    _qk_launch(grid, qkv, q_out, k_cache, v_cache, q_norm, k_norm, cos, sin, seq, pos, rows, qkv.stride(0),
               k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), eps, HQ=Hq, HKV=Hkv, D=D, BLOCK_R=block_r,
               BLOCK_HALF=block_half, num_warps=4)


@triton.jit(do_not_specialize=["n"])
def _silu_mul_kernel(gu_ptr, out_ptr, n, gu_stride, out_stride, I: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n)[:, None] & (cols < I)[None, :]
    src = gu_ptr + (rows * gu_stride)[:, None] + cols[None, :]
    g = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(src + I, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + (rows * out_stride)[:, None] + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


# Whether ``triton.jit`` made interpreted functions: it reads TRITON_INTERPRET when a kernel is
# defined, so this, not the variable now, says where the kernels can run.
_INTERPRETED = isinstance(_silu_mul_kernel, InterpretedFunction)
_qk_launch, _silu_launch = _Launcher(_qk_norm_rope_cache_kernel), _Launcher(_silu_mul_kernel)
_attn_launch = _Launcher(_cache_attention_kernel)


def cache_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq: torch.Tensor,
                    pos: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Causal attention of n tokens over the KV cache, each its sequence's keys up to its position:
    q and out [n, Hq, D] contiguous; k_cache, v_cache [B, Hkv, S, D] (one layer, last dim
    contiguous); seq, pos [n]: token i is sequence seq[i] (-1: padding, whose output is zero) at
    position pos[i]. One launch whatever the prompts' lengths, so a fixed-size prefill can be a
    CUDA graph (``prefill_graphs``); its cost grows with each token's position, so it is meant for
    short prompts."""
    n, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    assert out.shape == q.shape and q.is_contiguous() and out.is_contiguous()
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1
    g_pad = max(16, triton.next_power_of_2(Hq // Hkv))       # tl.dot's least M
    _attn_launch((n, Hkv), q, k_cache, v_cache, out, seq, pos, k_cache.stride(0), k_cache.stride(1),
                 k_cache.stride(2), D ** -0.5, HQ=Hq, HKV=Hkv, D=D, G_PAD=g_pad, D_PAD=triton.next_power_of_2(D),
                 BLOCK_N=32, num_warps=4)
    return out


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of gate_up [n, 2 I] = gate | up into out [n, I], reading gate_up once."""
    n, I = out.shape
    assert gate_up.shape == (n, 2 * I) and gate_up.stride(1) == 1 and out.stride(1) == 1
    block_n = min(triton.next_power_of_2(I), 1024)
    block_m = _tile_rows(n, block_n)
    grid = (triton.cdiv(n, block_m), triton.cdiv(I, block_n))
    _silu_launch(grid, gate_up, out, n, gate_up.stride(0), out.stride(0), I=I, BLOCK_M=block_m, BLOCK_N=block_n,
                 num_warps=4)
    return out
