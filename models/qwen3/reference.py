"""The torch reference Qwen3 model, with a static KV cache: the oracle the kernels are held to.

Numerics follow Hugging Face's ``Qwen3ForCausalLM`` (transformers/models/qwen3/modeling_qwen3.py):
RMSNorm in float32 then cast back before the weight multiply; q/k RMSNorm per head *before* RoPE;
RoPE in the half-split ("rotate_half") form with float32 angles; softmax in float32; GQA by
repeating each key/value head over its group of query heads. Every sequence of a batch has its
own length, so prompts of different lengths prefill and decode side by side.

The cache layout is the one the kernels use: ``k, v: [layers, batch, kv_heads, max_seq_len,
head_dim]``, so one kv head's keys are contiguous rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import fp8
from .config import Qwen3Config
from .weights import Qwen3Weights


@dataclass
class KVCache:
    k: torch.Tensor        # [L, B, Hkv, S, D]
    v: torch.Tensor        # [L, B, Hkv, S, D]
    lengths: torch.Tensor  # [B] int32: positions filled so far (= position of the next token)

    @staticmethod
    def allocate(cfg: Qwen3Config, batch_size: int, max_seq_len: int, dtype, device) -> "KVCache":
        shape = (cfg.num_hidden_layers, batch_size, cfg.num_key_value_heads, max_seq_len, cfg.head_dim)
        return KVCache(k=torch.zeros(shape, dtype=dtype, device=device),
                       v=torch.zeros(shape, dtype=dtype, device=device),
                       lengths=torch.zeros(batch_size, dtype=torch.int32, device=device))

    @property
    def max_seq_len(self) -> int:
        return self.k.shape[3]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    def reset(self):
        self.lengths.zero_()


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype):
    """cos, sin of shape [*positions.shape, head_dim], computed in float32 as HF does."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device)
                                .float() / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _attend(q, k, v, mask, group):
    """q: [Hq, T, D]; k, v: [Hkv, S, D]; mask: [T, S] bool (True = attend)."""
    k = k.repeat_interleave(group, dim=0)
    v = v.repeat_interleave(group, dim=0)
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, v)


def linear(h: torch.Tensor, w: Qwen3Weights, name: str, l: int, w8a8: bool = False) -> torch.Tensor:
    """h @ projection ``name`` of layer l transposed; with ``w8a8`` (FP8 weights) the inputs are
    quantized too, per 128 columns (``fp8.w8a8_linear``), else the weights are dequantized."""
    if w8a8 and w.quantization:
        return fp8.w8a8_linear(h, getattr(w, name)[l], getattr(w, name + "_scale")[l], w.scale_rows).to(h.dtype)
    return h @ w.proj(name, l).T


def normed_linear(x: torch.Tensor, nw: torch.Tensor, eps: float, w: Qwen3Weights, name: str, l: int,
                  w8a8: bool = False) -> torch.Tensor:
    """``linear`` of rmsnorm(x) times ``nw``. With w8a8 (FP8 weights) the input is quantized as the
    kernels do it: x times the norm weight in float32, per 128 columns, and each row's 1/rms applied
    to the product (it scales every block alike). Quantizing after the 1/rms, as vLLM does, is the
    same scheme but breaks the exact ties of bf16-valued inputs (the embeddings) differently."""
    if w8a8 and w.quantization:
        x32 = x.float()
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        y = fp8.w8a8_linear(x32 * nw.float(), getattr(w, name)[l], getattr(w, name + "_scale")[l], w.scale_rows)
        return (y * rstd).to(x.dtype)
    return linear(rmsnorm(x, nw, eps), w, name, l)


def _qkv(cfg: Qwen3Config, w: Qwen3Weights, l: int, x: torch.Tensor, cos, sin, w8a8: bool = False):
    """Layer l's q, k (normed per head, then rotated) and v for rows x [N, H]: [N, heads, D] each;
    cos/sin broadcast against [N, 1, D]."""
    N, D = x.shape[0], cfg.head_dim
    qkv = normed_linear(x, w.input_norm[l], cfg.rms_norm_eps, w, "wqkv", l, w8a8)
    q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
    q = apply_rope(rmsnorm(q.view(N, -1, D), w.q_norm[l], cfg.rms_norm_eps), cos, sin)
    k = apply_rope(rmsnorm(k.view(N, -1, D), w.k_norm[l], cfg.rms_norm_eps), cos, sin)
    return q, k, v.view(N, -1, D)


def _mlp_residual(cfg: Qwen3Config, w: Qwen3Weights, l: int, x: torch.Tensor, reduce=None,
                  w8a8: bool = False) -> torch.Tensor:
    gate, up = normed_linear(x, w.post_norm[l], cfg.rms_norm_eps, w, "wgate_up", l, w8a8).split(
        cfg.intermediate_size, dim=-1)
    return x + _summed(linear(F.silu(gate) * up, w, "wdown", l, w8a8), reduce)


def _summed(partial: torch.Tensor, reduce) -> torch.Tensor:
    """A projection's output; with tensor parallelism (``reduce``) its sum over the ranks."""
    return partial if reduce is None else reduce(partial.contiguous())


def forward_tokens(cfg: Qwen3Config, w: Qwen3Weights, cache: KVCache, b: int, ids: torch.Tensor,
                   start: int, all_logits: bool = False, reduce=None, w8a8: bool = False) -> torch.Tensor:
    """Run tokens ``ids`` [T] of sequence ``b`` at positions start..start+T-1, appending their keys
    and values to the cache. Returns float32 logits of the last position [V] (or all, [T, V]).
    ``reduce``: tensor parallelism's in-place sum over the ranks of O's and down's partial sums.
    ``w8a8``: FP8 projections take FP8 inputs (``linear``)."""
    T = ids.shape[0]
    if start + T > cache.max_seq_len:
        raise ValueError(f"sequence {b}: {start + T} positions exceed max_seq_len {cache.max_seq_len}")
    D = cfg.head_dim
    pos = torch.arange(start, start + T, device=ids.device)
    cos, sin = rope_cos_sin(pos, D, cfg.rope_theta, w.dtype)
    key_pos = torch.arange(start + T, device=ids.device)
    mask = key_pos[None, :] <= pos[:, None]
    x = w.embed[ids]                                              # [T, H]
    for l in range(cfg.num_hidden_layers):
        q, k, v = _qkv(cfg, w, l, x, cos[:, None], sin[:, None], w8a8)        # [T, heads, D]
        cache.k[l, b, :, start:start + T] = k.transpose(0, 1)
        cache.v[l, b, :, start:start + T] = v.transpose(0, 1)
        o = _attend(q.transpose(0, 1), cache.k[l, b, :, :start + T], cache.v[l, b, :, :start + T], mask,
                    cfg.group_size)
        x = x + _summed(linear(o.transpose(0, 1).reshape(T, cfg.q_size), w, "wo", l, w8a8), reduce)
        x = _mlp_residual(cfg, w, l, x, reduce, w8a8)
    x = rmsnorm(x if all_logits else x[-1:], w.final_norm, cfg.rms_norm_eps)
    logits = (x @ w.lm_head.T).float()
    return logits if all_logits else logits[0]


class Qwen3Reference:
    """Prefill and one-token decode steps over a static KV cache, in plain torch."""

    PREFILL_CHUNK = 512

    def __init__(self, cfg: Qwen3Config, weights: Qwen3Weights, cache: KVCache, reduce=None, w8a8: bool = False):
        self.cfg, self.w, self.cache, self.reduce, self.w8a8 = cfg, weights, cache, reduce, w8a8

    @torch.no_grad()
    def prefill(self, prompts: list[torch.Tensor]) -> torch.Tensor:
        """Prefill sequence b with prompts[b] (1-D token ids) from position 0; float32 [B, V]."""
        if len(prompts) != self.cache.batch_size:
            raise ValueError(f"got {len(prompts)} prompts for a batch of {self.cache.batch_size}")
        out = []
        for b, ids in enumerate(prompts):
            ids = ids.to(self.w.device)
            # Chunks bound the attention scores' memory ([heads, chunk, length]) on long prompts.
            for start in range(0, ids.shape[0], self.PREFILL_CHUNK):
                logits = forward_tokens(self.cfg, self.w, self.cache, b,
                                        ids[start:start + self.PREFILL_CHUNK], start, reduce=self.reduce,
                                        w8a8=self.w8a8)
            out.append(logits)
            self.cache.lengths[b] = ids.shape[0]
        return torch.stack(out)

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """One step: token b goes at position lengths[b]; returns float32 logits [B, V]."""
        lengths = self.cache.lengths.tolist()
        out = [forward_tokens(self.cfg, self.w, self.cache, b, tokens[b:b + 1], lengths[b], reduce=self.reduce,
                              w8a8=self.w8a8)
               for b in range(len(lengths))]
        self.cache.lengths += 1
        return torch.stack(out)

