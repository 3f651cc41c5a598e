"""Prompt processing (prefill) on torch's GEMMs and ``scaled_dot_product_attention``.

The prompts of a batch are packed back to back into one token stream (no padding to the longest),
which is cut into chunks of at most ``chunk_size`` tokens (by default as many as an activation budget
holds: most prompts are one chunk); each chunk goes through every layer before the next one starts,
so activations stay bounded by the chunk however long the prompt is. Per layer:
the input RMSNorm, one fused QKV GEMM, then one Triton kernel (``prefill_kernels``) for q/k RMSNorm
and RoPE over all heads, writing the rotated queries for SDPA and the chunk's keys and values into
the KV cache in the layout the decode kernels read (``[layers, batch, kv_heads, max_seq_len,
head_dim]``), then attention for each piece of a sequence in the chunk: its queries against its
sequence's cache up to and including itself, causal from the lower right (``causal_lower_right``;
prompts that start in the chunk share one SDPA call, padded to the longest, ``group_pieces``),
then O projection and MLP (SiLU(gate) * up one more Triton kernel) with the residual adds fused
into the GEMMs (``addmm_``). Only the last position of each sequence reaches the final norm and the
LM head. That is nine launches a layer for a chunk of one piece; where the Triton kernels cannot
run, torch ops do the same work in seventeen.

The chunk plan is made on the host from the prompt lengths before any work, so the loop issues
kernels without waiting on the device. Numerics follow Hugging Face's Qwen3 as the reference does;
in bf16 a few roundings fall differently (fused RMSNorm and residual adds, the q/k norm and RoPE
in float32 with one rounding), all within bf16 rounding. On the CPU the same code runs in float32
through SDPA's CPU kernels and Triton's interpreter.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch.backends.cuda import SDPAParams, can_use_flash_attention
from torch.nn.attention.bias import causal_lower_right

from . import prefill_kernels
from .config import Qwen3Config
from .reference import KVCache, rope_cos_sin
from .weights import Qwen3Weights

# A chunk's activations (about ``act_bytes_per_token`` each) are bounded by this budget rather than
# by a token count: a prompt that fits is one chunk, whose attention is plain causal (SDPA's flash
# kernel), where later chunks would attend from the lower right over their cache prefix.
PREFILL_ACT_BYTES = 2 << 30
# ... or, on a GPU where more is free, this fraction of what is free: 8b's 32k-token prompt on an H200
# is then one chunk, as transformers runs it, not two of 16k (the second attending over the first)
PREFILL_FREE_FRACTION = 0.25
PREFILL_MIN_CHUNK = 4096    # never fewer tokens a chunk: below this the GEMMs lose their rate
PREFILL_CHUNK: int | None = None   # a fixed chunk size instead of the budget (tests)


def act_bytes_per_token(cfg: Qwen3Config, itemsize: int) -> int:
    """Bytes a token's activations take in one layer of ``prefill``: x and its norm, qkv and the
    rotated q/k, attention's output, gate|up and the SiLU product."""
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    return itemsize * (3 * cfg.hidden_size + 2 * qkv + cfg.q_size + 3 * cfg.intermediate_size)


def cuda_memory(device: torch.device) -> tuple[int, int]:
    """(bytes an allocation on CUDA ``device`` can still get, the device's total): the driver's free
    memory plus what torch's caching allocator holds but no tensor uses."""
    free, total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device), total


def act_budget(device: torch.device | None) -> int:
    """Bytes a chunk's activations may take: PREFILL_ACT_BYTES, or on a CUDA GPU PREFILL_FREE_FRACTION
    of its free memory (``cuda_memory``) where that is more."""
    if device is None or device.type != "cuda":
        return PREFILL_ACT_BYTES
    return max(PREFILL_ACT_BYTES, int(cuda_memory(device)[0] * PREFILL_FREE_FRACTION))


def default_chunk(cfg: Qwen3Config, dtype: torch.dtype, device: torch.device | None = None) -> int:
    """Tokens a chunk: PREFILL_CHUNK where set, else as many as ``act_budget(device)`` holds (no
    device: PREFILL_ACT_BYTES, which every rank of a tensor-parallel run must use alike)."""
    if PREFILL_CHUNK is not None:
        return PREFILL_CHUNK
    per = act_bytes_per_token(cfg, dtype.itemsize)
    return max(PREFILL_MIN_CHUNK, act_budget(device) // per)


def plan_chunks(lengths: Sequence[int], chunk_size: int) -> list[list[tuple[int, int, int, int]]]:
    """Cut the packed stream of sequences of ``lengths`` into chunks of at most ``chunk_size``
    tokens. Each chunk is a list of pieces ``(sequence, first position, offset in the chunk,
    tokens)``; every chunk but the last is full, so chunk i starts at token i * chunk_size."""
    chunks, cur, fill = [], [], 0
    for b, n in enumerate(lengths):
        pos = 0
        while pos < n:
            m = min(n - pos, chunk_size - fill)
            cur.append((b, pos, fill, m))
            pos, fill = pos + m, fill + m
            if fill == chunk_size:
                chunks.append(cur)
                cur, fill = [], 0
    if cur:
        chunks.append(cur)
    return chunks


def _flash_takes_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether SDPA's flash backend takes ``attend(q, k, v, ...)`` with k/v at their own head count
    (it depends on dtypes, head counts and layouts, not on the lengths). Flash reads
    grouped heads natively on both routes (``is_causal`` and ``causal_lower_right``, which calls
    the flash kernel directly); elsewhere k/v are expanded to every query head, as SDPA's math
    backend would do itself, because the lower-right route's efficient kernel gets no GQA handling."""
    return q.is_cuda and can_use_flash_attention(SDPAParams(q, k, v, None, 0.0, False, True))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool, mask) -> torch.Tensor:
    """Causal attention of T queries at the last T of S key positions, for G sequences: q [G, Hq,
    T, D], k and v [G, Hkv, S, D] with S >= T; ``gqa``: ``_flash_takes_gqa`` of such a call;
    ``mask``: None where S == T, else ``causal_lower_right(T, S)``. Returns [G, T, Hq, D]."""
    if not gqa and q.shape[1] != k.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    # A square block is plain causal attention, which every backend takes (cuDNN, flash,
    # efficient); a chunk after the first sees its cache prefix, i.e. causal from the lower right,
    # which SDPA routes to flash (or efficient) with the diagonal aligned to the last key.
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa)
    return out.transpose(1, 2)


# Prompts that start in the same chunk share one SDPA call, padded to the longest of them, while
# the padding at most doubles their tokens (a server admits many short prompts at once: one call
# a piece a layer cost more host time than the GPU work).
GROUP_PAD_RATIO = 2


def group_pieces(pieces: Sequence[tuple[int, int, int, int]]) -> list[list[tuple[int, int, int, int]]]:
    """Runs of a chunk's consecutive pieces, each attended in one call: pieces that start their
    sequence (position 0) group while G x the longest stays within GROUP_PAD_RATIO x their tokens;
    a piece that continues its sequence from an earlier chunk (it attends over a cache prefix) is
    a run of its own."""
    runs: list[list] = []
    for p in pieces:
        cur = runs[-1] if runs and runs[-1][0][1] == 0 else None
        if p[1] == 0 and cur is not None:
            ms = [m for *_, m in cur] + [p[3]]
            if len(ms) * max(ms) <= GROUP_PAD_RATIO * sum(ms):
                cur.append(p)
                continue
        runs.append([p])
    return runs


class _Run:
    """One SDPA call a layer for a run of pieces (``group_pieces``) of a chunk: its queries as a
    [G, Hq, T, D] view of the chunk's rotated queries (or, where lengths differ, a zero-padded copy),
    its sequences' keys and values in the cache up to the run's end, its mask."""

    def __init__(self, run, q: torch.Tensor, cache: KVCache, slots: Sequence[int]):
        o, lens = run[0][2], [m for *_, m in run]
        T, G = max(lens), len(run)
        seq = [slots[b] for b, *_ in run]
        p0 = run[0][1]          # 0 unless a lone continuing piece
        self.q_src = q[o:o + sum(lens)]
        self.pad = None
        if all(m == T for m in lens):
            self.q = self.q_src.view(G, T, *q.shape[1:]).transpose(1, 2)
        else:   # each piece's rows at g * T + r of a [G * T] buffer; the padding's rows stay zero
            self.pad = torch.cat([torch.arange(m) + g * T for g, m in enumerate(lens)]).to(q.device)
            self.buf = q.new_zeros(G * T, *q.shape[1:])
            self.q = self.buf.view(G, T, *q.shape[1:]).transpose(1, 2)
        end = p0 + T
        if seq == list(range(seq[0], seq[0] + G)):     # neighbouring slots: views, no copy
            self.k = cache.k[:, seq[0]:seq[0] + G, :, :end].unbind(0)
            self.v = cache.v[:, seq[0]:seq[0] + G, :, :end].unbind(0)
            self.idx = None
        else:
            self.k, self.v = cache.k[:, :, :, :end].unbind(0), cache.v[:, :, :, :end].unbind(0)
            self.idx = torch.tensor(seq, device=q.device)
        self.mask = None if p0 == 0 else causal_lower_right(T, end)

    def __call__(self, l: int, gqa: bool) -> torch.Tensor:
        """Layer l's attention output of the run's tokens, [n, Hq, D] in the chunk's order."""
        if self.pad is not None:
            self.buf.index_copy_(0, self.pad, self.q_src)
        k, v = self.k[l], self.v[l]
        if self.idx is not None:
            k, v = k.index_select(0, self.idx), v.index_select(0, self.idx)
        out = attend(self.q, k, v, gqa, self.mask).flatten(0, 1)      # [G * T, Hq, D]
        return out if self.pad is None else out[self.pad]


def pack(ids: Sequence[torch.Tensor], slots: Sequence[int]) -> torch.Tensor:
    """Prompts ``ids`` (1-D) packed back to back on the host: LongTensor [3, tokens] of each token's
    id, position and sequence (its slot of the cache)."""
    lengths = [p.numel() for p in ids]
    return torch.stack((torch.cat(ids).long(), torch.cat([torch.arange(n) for n in lengths]),
                        torch.tensor(slots).repeat_interleave(torch.tensor(lengths))))


class Layers:
    """A layer of the prefill over a chunk, after its attention: per-layer weights as views made
    once (FP8 ones dequantized at each call), shared by ``prefill`` and the prefill graphs."""

    def __init__(self, w: Qwen3Weights):
        self.in_norm, self.post_norm = w.input_norm.unbind(0), w.post_norm.unbind(0)
        self.wqkv, self.wgate_up = _layer_weights(w, "wqkv"), _layer_weights(w, "wgate_up")
        self.wo_t, self.wdown_t = _layer_weights(w, "wo", True), _layer_weights(w, "wdown", True)

    def run(self, x: torch.Tensor, l: int, rope_attend, act: torch.Tensor, eps: float, fused: bool, reduce=None):
        """Layer l on the chunk's residual x [n, H], in place: ``rope_attend(qkv, l)`` takes the QKV
        GEMM's output, writes the cache and returns attention's [n, q_size]; O and the MLP follow
        with their residual adds (``reduce``: the tensor-parallel sum of their partial sums). ``act``
        [n, I] holds SiLU(gate) * up (``fused``: by the Triton kernel)."""
        H, I = x.shape[1], act.shape[1]
        attn = rope_attend(F.linear(F.rms_norm(x, (H,), self.in_norm[l], eps), self.wqkv(l)), l)
        if reduce is None:
            x.addmm_(attn, self.wo_t(l))
        else:
            x.add_(reduce(attn @ self.wo_t(l)))
        gate_up = F.linear(F.rms_norm(x, (H,), self.post_norm[l], eps), self.wgate_up(l))
        if fused:
            prefill_kernels.silu_mul(gate_up, act)
        else:
            torch.mul(F.silu(gate_up[:, :I]), gate_up[:, I:], out=act)
        if reduce is None:
            x.addmm_(act, self.wdown_t(l))
        else:
            x.add_(reduce(act @ self.wdown_t(l)))


def _layer_weights(w: Qwen3Weights, name: str, transposed: bool = False):
    """Layer l's projection ``name`` (``.T`` where ``transposed``) as ``get(l)``: views made once,
    by one op, for plain weights; dequantized at each call for FP8 (every layer at once would not
    fit)."""
    if w.quantization is None:
        t = getattr(w, name)
        return (t.mT if transposed else t).unbind(0).__getitem__
    return (lambda l: w.proj(name, l).T) if transposed else (lambda l: w.proj(name, l))


@torch.no_grad()
def prefill(cfg: Qwen3Config, w: Qwen3Weights, cache: KVCache, prompts: Sequence,
            chunk_size: int | None = None, reduce=None, slots: Sequence[int] | None = None) -> torch.Tensor:
    """Prefill sequence b of ``cache`` with ``prompts[b]`` (1-D token ids) from position 0, in
    chunks of at most ``chunk_size`` tokens (default ``default_chunk``, on the weights' device); sets
    ``cache.lengths``.
    Returns float32 logits [B, vocab] of each prompt's last position. ``reduce``: with tensor
    parallelism (``cfg`` and ``w`` one rank's share, ``tp.py``), the in-place sum over the ranks
    of the O and down projections' partial sums, before their residual adds. ``slots``: prompt i
    goes into the cache's sequence ``slots[i]`` instead (the others are left as they are), so a
    server admits several prompts into a running batch in one pass."""
    if chunk_size is None:   # ranks of a TP run must cut alike: their free memory may differ
        chunk_size = default_chunk(cfg, w.dtype, w.device if reduce is None else None)
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    if slots is None:
        if len(prompts) != cache.batch_size:
            raise ValueError(f"got {len(prompts)} prompts for a batch of {cache.batch_size}")
        slots = range(len(prompts))
    slots = [int(b) for b in slots]
    if len(slots) != len(prompts) or len(set(slots)) != len(slots) or \
            not all(0 <= b < cache.batch_size for b in slots):
        raise ValueError(f"slots {slots} for {len(prompts)} prompts: need one distinct slot of the batch of "
                         f"{cache.batch_size} each")
    ids = [torch.as_tensor(p).cpu() for p in prompts]
    for b, p in enumerate(ids):
        if p.dim() != 1 or p.numel() == 0 or p.is_floating_point() or p.is_complex():
            raise ValueError(f"prompt {b} must be a non-empty 1-D sequence of token ids, got shape "
                             f"{list(p.shape)} of {p.dtype}")
        if p.numel() > cache.max_seq_len:
            raise ValueError(f"prompt {b} has {p.numel()} tokens; the cache holds {cache.max_seq_len}")
        if int(p.min()) < 0 or int(p.max()) >= cfg.vocab_size:
            raise ValueError(f"prompt {b} has token ids outside [0, {cfg.vocab_size})")

    dev = w.device
    lengths = [p.numel() for p in ids]
    # one upload for the whole batch (seqs: each token's sequence in the cache, its slot)
    tokens, positions, seqs = pack(ids, slots).to(dev)
    D, Hq, Hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    L, I, eps = cfg.num_hidden_layers, cfg.intermediate_size, cfg.rms_norm_eps
    cos, sin = rope_cos_sin(positions, D, cfg.rope_theta, torch.float32)     # [N, D]
    fused = prefill_kernels.supported(dev, w.dtype)
    if not fused:
        qk_rope = _TorchQKRope(cfg, w, cos, sin)
    # Per-layer views made once (each by one op), so that the layer loop issues little but launches.
    layers = Layers(w)
    q_norm, k_norm = w.q_norm.unbind(0), w.k_norm.unbind(0)
    cache_k, cache_v = cache.k.unbind(0), cache.v.unbind(0)

    last: list[torch.Tensor | None] = [None] * len(ids)
    gqa = None       # whether SDPA's flash backend takes grouped k/v: the same for every piece
    for c, pieces in enumerate(plan_chunks(lengths, chunk_size)):
        c0 = c * chunk_size
        n = sum(m for *_, m in pieces)
        span = slice(c0, c0 + n)
        cos_c, sin_c, seq_c, pos_c = cos[span], sin[span], seqs[span], positions[span]
        # The rotated queries (the kernel's [n, Hq, D], or the torch path's q|k [n, Hq + Hkv, D]) and
        # SiLU(gate) * up: one buffer each per chunk, rewritten by every layer.
        qk = None if fused else torch.empty(n, Hq + Hkv, D, dtype=w.dtype, device=dev)
        q = torch.empty(n, Hq, D, dtype=w.dtype, device=dev) if fused else qk[:, :Hq]
        act = torch.empty(n, I, dtype=w.dtype, device=dev)
        runs = [_Run(run, q, cache, slots) for run in group_pieces(pieces)]
        if gqa is None:
            gqa = _flash_takes_gqa(runs[0].q[:1], runs[0].k[0][:1], runs[0].v[0][:1])
        def rope_attend(qkv, l):
            if fused:
                prefill_kernels.qk_norm_rope_cache(qkv, q_norm[l], k_norm[l], cos_c, sin_c, seq_c, pos_c,
                                                   cache_k[l], cache_v[l], q, eps)
            else:
                qk_rope(qkv, l, c0, [(slots[b], p0, o, m) for b, p0, o, m in pieces], cache, qk)
            outs = [run(l, gqa) for run in runs]
            return (outs[0] if len(outs) == 1 else torch.cat(outs)).reshape(n, cfg.q_size)

        x = w.embed[tokens[span]]                                          # [n, H]
        for l in range(L):
            layers.run(x, l, rope_attend, act, eps, fused, reduce)
        for b, p0, o, m in pieces:
            if p0 + m == lengths[b]:
                last[b] = x[o + m - 1:o + m]
    h = F.rms_norm(torch.cat(last), (cfg.hidden_size,), w.final_norm, eps)
    logits = F.linear(h, w.lm_head).float()
    cache.lengths[torch.tensor(slots, device=cache.lengths.device)] = torch.tensor(
        lengths, dtype=cache.lengths.dtype).to(cache.lengths.device)
    return logits


class _TorchQKRope:
    """q/k RMSNorm, RoPE and the cache writes in torch ops, where the Triton kernel does not run.
    The norm weight is folded into one RoPE table pair per token, so that norm + weight + RoPE is
    three passes over q and k: with y = x * w, RoPE(y) = x * (w cos) + rotate_half(x) * (roll(w) sin'),
    where sin' is sin with its first half negated. The q and k heads are viewed as G + 1 groups of
    Hkv heads (G groups of queries, then the keys), so the tables broadcast over Hkv."""

    def __init__(self, cfg: Qwen3Config, w: Qwen3Weights, cos: torch.Tensor, sin: torch.Tensor):
        L, G, D, half = cfg.num_hidden_layers, cfg.group_size, cfg.head_dim, cfg.head_dim // 2
        self.cfg, self.dtype = cfg, w.dtype
        self.norm_w = torch.cat((w.q_norm[:, None].expand(L, G, D), w.k_norm[:, None]), dim=1).float()[:, :, None]
        self.norm_w_rolled = self.norm_w.roll(half, dims=-1)                 # [L, G + 1, 1, D]
        self.sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)[:, None, None]
        self.cos = cos[:, None, None]                                        # [N, 1, 1, D]

    def __call__(self, qkv: torch.Tensor, l: int, c0: int, pieces, cache: KVCache, out: torch.Tensor):
        """Layer l for the chunk at c0: the rotated q|k into out [n, Hq + Hkv, D], k and v into the cache."""
        cfg, n = self.cfg, qkv.shape[0]
        G, Hq, Hkv, D, half = cfg.group_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.head_dim // 2
        k_end = cfg.q_size + cfg.kv_size
        rope_cos, rope_sin = torch.empty(2, n, G + 1, 1, D, dtype=self.dtype, device=qkv.device)
        torch.mul(self.cos[c0:c0 + n], self.norm_w[l], out=rope_cos)           # computed in float32
        torch.mul(self.sin[c0:c0 + n], self.norm_w_rolled[l], out=rope_sin)
        qkn = F.rms_norm(qkv[:, :k_end].view(n, G + 1, Hkv, D), (D,), eps=cfg.rms_norm_eps)
        qk = torch.mul(qkn, rope_cos, out=out.view(n, G + 1, Hkv, D))
        qk[..., :half].addcmul_(qkn[..., half:], rope_sin[..., :half])
        qk[..., half:].addcmul_(qkn[..., :half], rope_sin[..., half:])
        k, v = out[:, Hq:], qkv[:, k_end:].view(n, Hkv, D)
        for b, p0, o, m in pieces:
            cache.k[l, b, :, p0:p0 + m] = k[o:o + m].transpose(0, 1)
            cache.v[l, b, :, p0:p0 + m] = v[o:o + m].transpose(0, 1)
