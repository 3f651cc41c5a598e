"""Choosing the next token from logits: greedy, temperature, top-k, top-p, seeded.

Runs on the logits' device with no host synchronisation, so a decode loop stays asynchronous.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self):
        import math
        if not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool) \
                or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or isinstance(self.top_k, bool)):
            raise ValueError(f"top-k must be an integer >= 1, got {self.top_k!r}")
        if self.top_p is not None and (not isinstance(self.top_p, (int, float)) or isinstance(self.top_p, bool)
                                       or math.isnan(self.top_p)):
            raise ValueError(f"top-p must be a number in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top-k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits: float [B, V] -> LongTensor [B]."""
    if params.greedy:
        return logits.argmax(dim=-1)
    logits = logits.float() / params.temperature
    if params.top_k is not None and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p is not None and params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cum - torch.softmax(sorted_logits, dim=-1) >= params.top_p   # keep the first past p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


# ---------------------------------------------------------------------------------------------
# The device sampler's torch reference (``instructions/sample.py`` runs the same in the step).
#
# Each sequence has its own settings (one row of the step's ``inv_temp``, ``top_k``, ``top_p``,
# ``seed`` buffers, ``slot_settings``) and its draw depends only on (seed, position, logits):
# token = argmax over the allowed tokens of (l - max) / T + G, G = -log(-log(u)) with u from
# Philox-4x32-10 keyed by the seed, counter (vocabulary index, position, 0, 0): Triton's
# ``tl.philox``, reimplemented here bit for bit (integer arithmetic), so the noise is the same
# integers on any device. The thresholds are exact integer searches; only a probability-mass sum
# (top-p) and log/exp can round differently from the kernel's, which changes a token only where
# two candidates tie to within that rounding. This is the reference the kernels are tested
# against, and what chooses a prefill's first token (on the logits' device, without Triton).

_M32 = 0xFFFFFFFF
_PHILOX_KEY_A, _PHILOX_KEY_B = 0x9E3779B9, 0xBB67AE85
_PHILOX_ROUND_A, _PHILOX_ROUND_B = 0xD2511F53, 0xCD9E8D57
_UNIFORM_SCALE = 4.6566127342e-10      # Triton's uint_to_uniform_float for 32 bits
_U_MIN = 2.3283064e-10                 # u = 0 is drawn as this (instructions/sample.py U_MIN)
SEED_BITS = 63                         # seeds are kept modulo 2^63 (an int64 buffer word)


def _mulhilo(a: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of a * b for int64 tensors a of 32-bit values and a 32-bit constant,
    without overflowing int64: a's two 16-bit halves are multiplied apart."""
    p_lo = (a & 0xFFFF) * b
    p_hi = (a >> 16) * b
    lo = (((p_hi & 0xFFFF) << 16) + p_lo) & _M32
    hi = ((p_hi + (p_lo >> 16)) >> 16) & _M32
    return hi, lo


def philox(seed: int, c0: torch.Tensor, c1: torch.Tensor, rounds: int = 10) -> torch.Tensor:
    """The first 32-bit output of Philox-4x32 (``tl.philox(seed, c0, c1, 0, 0)``) as int64 tensors."""
    seed &= (1 << 64) - 1
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    c0, c1 = c0.long() & _M32, c1.long() & _M32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    for _ in range(rounds):
        hi_b, lo_b = _mulhilo(c2, _PHILOX_ROUND_B)
        hi_a, lo_a = _mulhilo(c0, _PHILOX_ROUND_A)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _PHILOX_KEY_A) & _M32, (k1 + _PHILOX_KEY_B) & _M32
    return c0


def gumbel_noise(seed: int, pos: int, idx: torch.Tensor) -> torch.Tensor:
    """The kernel's Gumbel noise (float32) of vocabulary indices ``idx`` at position ``pos``."""
    r = philox(seed, idx, torch.full_like(idx, pos))
    x = torch.where(r >= 1 << 31, r - (1 << 32), r)         # as int32
    x = torch.where(x < 0, -x - 1, x)
    u = torch.clamp(x.to(torch.float32) * torch.tensor(_UNIFORM_SCALE, dtype=torch.float32), min=_U_MIN)
    return -torch.log(-torch.log(u))


def order_key(v: torch.Tensor) -> torch.Tensor:
    """float32 -> int64 keys in the same order (-0.0 as 0.0), as the kernel's ``order_key``."""
    v = torch.where(v == 0, torch.zeros_like(v), v)
    bits = v.contiguous().view(torch.int32).long()
    return torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


def slot_settings(params: SamplingParams, vocab_size: int) -> tuple[float, int, float, int]:
    """A sequence's words in the step's sampling buffers: (1 / temperature as float32, 0 where
    greedy; top-k, 0 where off; top-p, 1.0 where off; seed modulo 2^63, 0 where none)."""
    inv_t = 0.0 if params.greedy else float(torch.tensor(1.0 / params.temperature, dtype=torch.float32))
    k = params.top_k if params.top_k is not None and params.top_k < vocab_size else 0
    p = params.top_p if params.top_p is not None else 1.0
    seed = (params.seed or 0) % (1 << SEED_BITS)
    return inv_t, int(k), float(p), seed


def _sample_row(l: torch.Tensor, inv_t: torch.Tensor, k: int, p: torch.Tensor, seed: int, pos: int) -> int:
    V = l.numel()
    m = l.max()
    d = (m - l) * inv_t
    e = torch.exp(-d)
    keys = order_key(l)
    thr = -(1 << 31)
    k_on = 0 < k < V
    if k_on:
        thr = int(keys.topk(k).values[-1])             # the k-th largest key
    if float(p) < 1.0:
        Zs = e[keys >= thr].sum() if k_on else e.sum()
        need = p * Zs
        # the largest key t >= thr whose tokens (key >= t) weigh at least need
        order = torch.argsort(keys, descending=True, stable=True)
        sk, cum = keys[order], torch.cumsum(e[order], 0)
        last_of_key = torch.ones_like(sk, dtype=torch.bool)
        last_of_key[:-1] = sk[:-1] != sk[1:]          # cum over every token of a tied key
        ok = last_of_key & (cum >= need) & (sk >= thr)
        if bool(ok.any()):
            thr = max(thr, int(sk[ok.nonzero()[0, 0]]))
    allowed = keys >= thr
    score = torch.where(allowed, gumbel_noise(seed, pos, torch.arange(V, device=l.device)) - d,
                        torch.tensor(float("-inf"), device=l.device))
    best = score.max()
    return int((score == best).nonzero()[0, 0])


def device_sample_reference(logits: torch.Tensor, inv_temp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                            seed: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The device sampler on float32 logits [B, V] with each row's settings (``slot_settings``'s
    words, tensors [B]) and the position of the token it chooses (pos [B]); LongTensor [B] on the
    logits' device. Greedy rows (inv_temp 0) are ``argmax`` (the first maximum)."""
    logits = logits.float()
    out = logits.argmax(-1)
    inv = inv_temp.float().cpu()
    for b in range(logits.shape[0]):
        if float(inv[b]) > 0:
            out[b] = _sample_row(logits[b], inv_temp[b].float(), int(top_k[b]), top_p[b].float(), int(seed[b]),
                                 int(pos[b]))
    return out
