"""Short prefills as CUDA graphs: one replay instead of about ten launches a layer.

A server's admissions are short prompts (tens to hundreds of tokens), whose prefill
(``prefill.py``) is bound by the host issuing its launches: on an H200 one prompt of 32 tokens of
0.6b took 12.6 ms of launches for well under a millisecond of GPU work. Here the whole prefill of
at most ``max_tokens`` tokens is captured once per token bucket (16, 32, ..., ``max_tokens``) over
fixed buffers, and each admission copies its packed tokens, positions and sequences into them and
replays the smallest bucket that holds them. Padding tokens belong to sequence -1: the q/k kernel
writes no cache for them and ``prefill_kernels.cache_attention`` gives them no keys. Attention is
that kernel (each token over its sequence's cache up to its position, one launch whatever the
lengths), not SDPA, since the graph cannot depend on the prompts' lengths: so the logits equal the
eager prefill's within rounding, not bit for bit.

Only fresh prompts from position 0, of 16-bit weights on one GPU (no FP8, no tensor parallelism),
whose total and each length fit (``fits``). On the CPU the same body runs without capture (the
tests), through Triton's interpreter in float32.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from . import prefill_kernels
from .config import Qwen3Config
from .prefill import Layers, pack
from .reference import KVCache, rope_cos_sin
from .weights import Qwen3Weights

MIN_BUCKET = 16
# a token's attention reads its sequence's keys one by one up to its position: keep prompts short
MAX_PROMPT_LEN = 512


def unsupported(w: Qwen3Weights) -> str | None:
    """Why the prefill graphs cannot run these weights, or None where they can."""
    if w.quantization is not None:
        return "prefill graphs run 16-bit weights only"
    if not prefill_kernels.supported(w.device, w.dtype):
        return f"prefill graphs need the prefill's Triton kernels on {w.device} in {w.dtype}"
    return None


class PrefillGraphs:
    """Prefill of up to ``max_prompts`` fresh prompts, ``max_tokens`` tokens in all, into ``cache``:
    ``graphs(prompts, slots)`` as ``prefill(cfg, w, cache, prompts, slots=slots)``."""

    def __init__(self, cfg: Qwen3Config, w: Qwen3Weights, cache: KVCache, max_prompts: int,
                 max_tokens: int = 2048, capture: bool | None = None):
        why = unsupported(w)
        if why:
            raise ValueError(why)
        dev = w.device
        self.cfg, self.w, self.cache, self.max_prompts = cfg, w, cache, max_prompts
        self.layers = Layers(w)
        self.capture = dev.type == "cuda" if capture is None else capture
        self.buckets = []
        n = MIN_BUCKET
        while n < max_tokens:
            self.buckets.append(n)
            n *= 2
        self.buckets.append(max(max_tokens, MIN_BUCKET))
        self.max_tokens = self.buckets[-1]
        N, G = self.max_tokens, max_prompts
        # the fixed inputs, filled before each replay in one copy: tokens, positions, sequences
        # (-1 pads), then each prompt's last row (padding prompts read row 0)
        self.inputs = torch.zeros(3 * N + G, dtype=torch.long, device=dev)
        self._host = torch.zeros_like(self.inputs, device="cpu", pin_memory=dev.type == "cuda")
        self.logits = torch.zeros(G, cfg.vocab_size, dtype=torch.float32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # the graphs share one memory pool (one replays at a time); the host buffer is refilled only
        # once the previous upload from it has happened
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self._uploaded = None

    def fits(self, lengths: Sequence[int]) -> bool:
        return 0 < len(lengths) <= self.max_prompts and sum(lengths) <= self.max_tokens and \
            max(lengths) <= min(MAX_PROMPT_LEN, self.cache.max_seq_len)

    def capture_all(self):
        """Capture every bucket's graph now (a server's start-up), the kernels compiled first."""
        if not self.capture:
            return
        for n in self.buckets:
            self._graph(n)

    def __call__(self, prompts: Sequence, slots: Sequence[int]) -> torch.Tensor:
        """Float32 logits [len(prompts), V] of each prompt's last position; sets the slots' cache
        lengths. The prompts must ``fit`` (the caller checks ids and slots)."""
        ids = [torch.as_tensor(p).flatten().cpu() for p in prompts]
        lengths = [p.numel() for p in ids]
        if not self.fits(lengths) or len(slots) != len(ids):
            raise ValueError(f"prompts of {lengths} tokens into slots {list(slots)} do not fit the prefill graphs "
                             f"({self.max_prompts} prompts, {self.max_tokens} tokens, {MAX_PROMPT_LEN} a prompt)")
        total = sum(lengths)
        n = next(b for b in self.buckets if b >= total)
        N = self.max_tokens
        h = self._host
        if self._uploaded is not None:
            self._uploaded.synchronize()
        h.zero_()
        h[2 * N:3 * N] = -1
        h[:3 * N].view(3, N)[:, :total] = pack(ids, slots)
        h[3 * N:3 * N + len(ids)] = torch.tensor(lengths).cumsum(0) - 1
        self.inputs.copy_(h, non_blocking=True)
        if self.inputs.is_cuda:
            self._uploaded = torch.cuda.Event()
            self._uploaded.record()
        if self.capture:
            self._graph(n).replay()
        else:
            self._body(n)
        cache = self.cache
        cache.lengths[torch.tensor(slots, device=cache.lengths.device)] = torch.tensor(
            lengths, dtype=cache.lengths.dtype).to(cache.lengths.device)
        return self.logits[:len(ids)].clone()

    def _graph(self, n: int) -> torch.cuda.CUDAGraph:
        g = self.graphs.get(n)
        if g is None:
            # the warm-up run compiles the kernels and lets cuBLAS choose, outside the capture; it
            # prefills nothing (every token pads), so the cache is untouched
            self.inputs.zero_()
            self.inputs[2 * self.max_tokens:3 * self.max_tokens] = -1
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                self._body(n)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                self._body(n)
            self.graphs[n] = g
        return g

    @torch.no_grad()
    def _body(self, n: int):
        """The prefill of bucket n over the fixed inputs: ``prefill.prefill``'s layers with
        ``cache_attention`` for attention."""
        cfg, w, cache = self.cfg, self.w, self.cache
        N, G = self.max_tokens, self.max_prompts
        tokens, pos, seq = self.inputs[:n], self.inputs[N:N + n], self.inputs[2 * N:2 * N + n]
        last = self.inputs[3 * N:3 * N + G]
        D, Hq, eps = cfg.head_dim, cfg.num_attention_heads, cfg.rms_norm_eps
        cos, sin = rope_cos_sin(pos, D, cfg.rope_theta, torch.float32)
        q = torch.empty(n, Hq, D, dtype=w.dtype, device=w.device)
        attn = torch.empty_like(q)
        act = torch.empty(n, cfg.intermediate_size, dtype=w.dtype, device=w.device)

        def rope_attend(qkv, l):
            prefill_kernels.qk_norm_rope_cache(qkv, w.q_norm[l], w.k_norm[l], cos, sin, seq, pos, cache.k[l],
                                               cache.v[l], q, eps)
            prefill_kernels.cache_attention(q, cache.k[l], cache.v[l], seq, pos, attn)
            return attn.view(n, cfg.q_size)

        x = w.embed[tokens]
        for l in range(cfg.num_hidden_layers):
            self.layers.run(x, l, rope_attend, act, eps, fused=True)
        h = F.rms_norm(x[last.clamp(max=n - 1)], (cfg.hidden_size,), w.final_norm, eps)
        self.logits.copy_(F.linear(h, w.lm_head).float())
