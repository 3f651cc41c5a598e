"""The ``torch-compile`` peer: Qwen3 decode in plain torch, written for ``torch.compile`` with CUDA graphs.

The layout follows gpt-fast (github.com/pytorch-labs/gpt-fast): every tensor the step reads or
writes sits at a fixed address that is marked static (``torch._dynamo.mark_static_address``), so
CUDA graph trees replay the step without copying the weights in, and accept the step's only
mutation, the in-place write of the new keys and values into per-layer cache buffers. The
position of each sequence is a device tensor passed in and advanced outside the compiled region,
so no Python state changes inside it and the graph has fixed shapes at every batch size.

Numerics are the reference's (``models.qwen3.reference``: RMSNorm, q/k norm before RoPE, float32
softmax). Attention reads the whole static cache with the positions past each sequence masked out
(the shapes stay fixed); GQA multiplies each key/value head by its group of query heads as one
batched matmul, so the cache is never expanded per query head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import Qwen3Config
from .reference import _mlp_residual, _qkv, rmsnorm, rope_cos_sin
from .weights import Qwen3Weights


class StaticKVCache:
    """Keys and values per layer, each ``[B, Hkv, max_seq_len, D]`` in its own buffer at a fixed
    address (one buffer per layer, as gpt-fast has it: a mutated view of one shared buffer would
    make the compiled step an aliasing-input graph)."""

    def __init__(self, cfg: Qwen3Config, batch_size: int, max_seq_len: int, dtype, device):
        shape = (batch_size, cfg.num_key_value_heads, max_seq_len, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        for t in (*self.k, *self.v):
            torch._dynamo.mark_static_address(t)

    @property
    def batch_size(self) -> int:
        return self.k[0].shape[0]

    @property
    def max_seq_len(self) -> int:
        return self.k[0].shape[2]


def _write_kv(cache: StaticKVCache, l: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor):
    """Keys/values ``[B, T, Hkv, D]`` of tokens at positions ``pos`` [B, T] into layer l, in place."""
    b = torch.arange(k.shape[0], device=k.device)[:, None]
    cache.k[l][b, :, pos] = k
    cache.v[l][b, :, pos] = v


def decode_logits(cfg: Qwen3Config, w: Qwen3Weights, cache: StaticKVCache, tokens: torch.Tensor,
                  pos: torch.Tensor) -> torch.Tensor:
    """One decode step: token b at position ``pos[b]`` (int64 device tensors [B]); its keys and
    values go into the cache and it attends to positions ``<= pos[b]``. Float32 logits [B, V]."""
    B, D, G, Hkv = tokens.shape[0], cfg.head_dim, cfg.group_size, cfg.num_key_value_heads
    S = cache.max_seq_len
    cos, sin = rope_cos_sin(pos, D, cfg.rope_theta, w.dtype)                   # [B, D]
    cos, sin = cos[:, None], sin[:, None]
    visible = torch.arange(S, device=pos.device)[None, :] <= pos[:, None]     # [B, S]
    visible = visible[:, None, None, :]                                        # [B, 1, 1, S]
    x = w.embed[tokens]                                                        # [B, H]
    for l in range(cfg.num_hidden_layers):
        q, k, v = _qkv(cfg, w, l, x, cos, sin)                                # [B, heads, D]
        _write_kv(cache, l, k[:, None], v[:, None], pos[:, None])
        qg = q.view(B, Hkv, G, D)                         # query heads h = j * G + g use kv head j
        scores = torch.matmul(qg, cache.k[l].transpose(-1, -2)) * D ** -0.5   # [B, Hkv, G, S]
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        o = torch.matmul(probs, cache.v[l]).reshape(B, cfg.q_size)            # [B, Hkv, G, D]
        x = x + o @ w.proj("wo", l).T
        x = _mlp_residual(cfg, w, l, x)
    return (rmsnorm(x, w.final_norm, cfg.rms_norm_eps) @ w.lm_head.T).float()


def prefill_logits(cfg: Qwen3Config, w: Qwen3Weights, cache: StaticKVCache, ids: torch.Tensor,
                   chunk: int = 1024) -> torch.Tensor:
    """Prompts ``ids`` [B, T] (one length for the batch) from position 0, in chunks of ``chunk``
    tokens through torch's SDPA; fills the cache and returns float32 logits [B, V] of the last
    position. Eager, like gpt-fast's prefill outside the decode graph."""
    B, T = ids.shape
    D = cfg.head_dim
    if T >= cache.max_seq_len:
        raise ValueError(f"a {T}-token prompt leaves no room in max_seq_len {cache.max_seq_len}")
    for start in range(0, T, chunk):
        end = min(T, start + chunk)
        n = end - start
        pos = torch.arange(start, end, device=ids.device)
        cos, sin = rope_cos_sin(pos, D, cfg.rope_theta, w.dtype)
        cos, sin = cos.repeat(B, 1)[:, None], sin.repeat(B, 1)[:, None]       # [B n, 1, D]
        mask = torch.arange(end, device=ids.device)[None, :] <= pos[:, None]  # [n, end]: the cache, then causal
        x = w.embed[ids[:, start:end]].reshape(B * n, -1)
        for l in range(cfg.num_hidden_layers):
            q, k, v = _qkv(cfg, w, l, x, cos, sin)                            # [B n, heads, D]
            _write_kv(cache, l, k.view(B, n, -1, D), v.view(B, n, -1, D), pos.expand(B, n))
            kk = cache.k[l][:, :, :end].repeat_interleave(cfg.group_size, dim=1)
            vv = cache.v[l][:, :, :end].repeat_interleave(cfg.group_size, dim=1)
            o = F.scaled_dot_product_attention(q.view(B, n, -1, D).transpose(1, 2), kk, vv, attn_mask=mask)
            x = x + o.transpose(1, 2).reshape(B * n, cfg.q_size) @ w.proj("wo", l).T
            x = _mlp_residual(cfg, w, l, x)
    last = x.view(B, n, -1)[:, -1]
    return (rmsnorm(last, w.final_norm, cfg.rms_norm_eps) @ w.lm_head.T).float()


class StaticDecoder:
    """Greedy decoding with the step under ``torch.compile(mode="reduce-overhead", fullgraph=True)``
    (CUDA graph trees on a GPU). ``prefill(ids)`` returns the first tokens [B]; ``step(tokens)``
    decodes them and returns the next [B]. ``compile=False`` runs the same step eagerly."""

    def __init__(self, cfg: Qwen3Config, weights: Qwen3Weights, batch_size: int, max_seq_len: int,
                 compile: bool = True, mode: str = "reduce-overhead"):
        self.cfg, self.w = cfg, weights
        self.cache = StaticKVCache(cfg, batch_size, max_seq_len, weights.dtype, weights.device)
        for t in weights.tensors().values():
            torch._dynamo.mark_static_address(t)   # read in place by the graph, never copied in
        self.pos = torch.zeros(batch_size, dtype=torch.long, device=weights.device)
        self.compiled = compile
        self._step = torch.compile(self._greedy, mode=mode, fullgraph=True, dynamic=False) if compile \
            else self._greedy

    def _greedy(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return decode_logits(self.cfg, self.w, self.cache, tokens, pos).argmax(-1)

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(self.pos.device)
        if ids.dim() != 2 or ids.shape[0] != self.cache.batch_size:
            raise ValueError(f"prefill takes [batch {self.cache.batch_size}, length] ids, got {list(ids.shape)}")
        logits = prefill_logits(self.cfg, self.w, self.cache, ids)
        self.pos.fill_(ids.shape[1])
        return logits.argmax(-1)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.compiled:
            torch.compiler.cudagraph_mark_step_begin()   # the last step's outputs are consumed
        # contiguous: a strided column of a token history would be a new graph (a stride guard)
        out = self._step(tokens.to(self.pos.device).long().contiguous(), self.pos)
        self.pos += 1       # outside the graph: the graph only reads the position
        return out.clone()  # the graph's output buffer is rewritten by the next replay
