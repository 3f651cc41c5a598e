"""Tensor parallelism: how one rank's share of a Qwen3 model is cut (Megatron's split).

A rank of ``tp`` holds:

- attention column-parallel by heads: query heads ``[r HQ/tp, (r+1) HQ/tp)`` and kv heads
  ``[r HKV/tp, (r+1) HKV/tp)`` (a kv head's query group stays on its rank, since HQ/tp = G HKV/tp),
  their q, k, v rows of the fused QKV weight, the matching columns of O (row-parallel), and their
  part of the KV cache;
- the MLP column-parallel on gate/up (I/tp rows each) and row-parallel on down (the same I/tp
  columns);
- the embedding, every norm and the LM head whole (replicated): every rank then holds the same
  residual stream after each all-reduce and computes the same logits and token, with no exchange
  after the LM head (``docs/design.md``, "Tensor parallelism", says what a vocabulary split would
  save and cost).

So a rank is a Qwen3 model of its own shapes (``shard_config``: HQ/tp heads, HKV/tp kv heads, I/tp
intermediate) whose O and down projections give partial sums that the ranks add (all-reduce)
before the residual add. Everything that reads a config (plan, tape, KV cache, prefill) runs
the rank's shapes unchanged; ``TPShard.take`` cuts a full checkpoint tensor to the rank's share as
it loads, so no rank holds the whole model on its device.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from . import fp8
from .config import Qwen3Config
from .weights import Qwen3Weights, _put_fp8, proj_parts, random_weights

TP_DEGREES = (1, 2, 4, 8)


def check_tp(cfg: Qwen3Config, tp: int) -> None:
    """ValueError (one line) where ``cfg`` cannot be split over ``tp`` ranks."""
    if tp not in TP_DEGREES:
        raise ValueError(f"tensor parallel degree {tp} is not supported: choose one of "
                         f"{', '.join(map(str, TP_DEGREES))}")
    for what, n in (("key/value heads (num_key_value_heads)", cfg.num_key_value_heads),
                    ("query heads (num_attention_heads)", cfg.num_attention_heads),
                    ("intermediate_size", cfg.intermediate_size)):
        if n % tp:
            raise ValueError(f"--tp {tp}: the model's {n} {what} do not divide among {tp} ranks")


def check_tp_fp8(cfg: Qwen3Config, tp: int) -> None:
    """ValueError (one line) where ``cfg``'s FP8 projections cannot be split over ``tp`` ranks along
    their 128x128 scale blocks: each rank's q, k, v rows and gate, up rows (and so O's and down's
    columns) must be whole blocks, so a rank's share is the whole model's FP8 values and scales cut
    apart, bit for bit (every Qwen3 size splits so at TP 2, 4 and 8)."""
    check_tp(cfg, tp)
    for what, n in (("query rows (num_attention_heads x head_dim)", cfg.q_size),
                    ("key/value rows (num_key_value_heads x head_dim)", cfg.kv_size),
                    ("intermediate_size", cfg.intermediate_size)):
        if n % (tp * fp8.BLOCK):
            raise ValueError(f"--tp {tp} with FP8 weights: the model's {n} {what} do not split into whole "
                             f"{fp8.BLOCK}-row scale blocks on each of {tp} ranks")


def shard_config(cfg: Qwen3Config, tp: int) -> Qwen3Config:
    """The shapes one rank of ``tp`` computes: HQ/tp query heads, HKV/tp kv heads, I/tp rows of
    the MLP; hidden size, vocabulary and layers whole."""
    check_tp(cfg, tp)
    if tp == 1:
        return cfg
    return dataclasses.replace(cfg, num_attention_heads=cfg.num_attention_heads // tp,
                               num_key_value_heads=cfg.num_key_value_heads // tp,
                               intermediate_size=cfg.intermediate_size // tp)


@dataclass(frozen=True)
class TPShard:
    """Rank ``rank`` of ``tp``, of the model of full shapes ``full``."""
    full: Qwen3Config
    tp: int
    rank: int

    def __post_init__(self):
        check_tp(self.full, self.tp)
        if not 0 <= self.rank < self.tp:
            raise ValueError(f"rank {self.rank} is outside tensor parallel degree {self.tp}")

    @property
    def config(self) -> Qwen3Config:
        return shard_config(self.full, self.tp)

    def _span(self, n: int) -> slice:
        k = n // self.tp
        return slice(self.rank * k, (self.rank + 1) * k)

    def _unit(self, scales: bool) -> int:
        """Rows (or columns) one element stands for: a scale block of FP8 scales (their split,
        ``check_tp_fp8``, is along whole blocks), else 1."""
        if not scales:
            return 1
        check_tp_fp8(self.full, self.tp)
        return fp8.BLOCK

    def take(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """This rank's share of the full Hugging Face tensor ``name`` (a view where it is one
        block; the tensor itself where it is replicated); an FP8 weight's ``_scale_inv`` cut along
        the same rows or columns."""
        if self.tp == 1:
            return t
        scales = name.endswith(".weight" + fp8.SCALE_SUFFIX)
        u = self._unit(scales)
        c, D = self.full, self.full.head_dim
        leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") or scales else ""
        if leaf == "q_proj":
            return t[self._span(c.num_attention_heads * D // u)]
        if leaf in ("k_proj", "v_proj"):
            return t[self._span(c.num_key_value_heads * D // u)]
        if leaf in ("gate_proj", "up_proj"):
            return t[self._span(c.intermediate_size // u)]
        if leaf == "o_proj":
            return t[:, self._span(c.num_attention_heads * D // u)]
        if leaf == "down_proj":
            return t[:, self._span(c.intermediate_size // u)]
        return t

    def take_stacked(self, name: str, part: torch.Tensor) -> torch.Tensor:
        """This rank's share of one layer's slice ``part`` of the stacked weight ``name``
        (``Qwen3Weights``' field names: wqkv's q, k and v rows, wgate_up's gate and up rows, the
        columns of wo and wdown; the others whole). FP8 scale grids (``<name>_scale``, one row a
        128-row block where the split is allowed) are cut along the same blocks."""
        if self.tp == 1:
            return part
        u = self._unit(name.endswith("_scale"))
        name = name.removesuffix("_scale")
        c = self.full
        q, kv, I = c.q_size // u, c.kv_size // u, c.intermediate_size // u
        if name == "wqkv":
            return torch.cat((part[:q][self._span(q)], part[q:q + kv][self._span(kv)], part[q + kv:][self._span(kv)]))
        if name == "wgate_up":
            return torch.cat((part[:I][self._span(I)], part[I:][self._span(I)]))
        if name == "wo":
            return part[:, self._span(q)]
        if name == "wdown":
            return part[:, self._span(I)]
        return part

    def describe(self) -> str:
        return f"rank {self.rank} of {self.tp}"

    # What ``weights``' loaders ask of the shard they are given (so that module needs no import of
    # this one, which imports it)
    def check_fp8(self) -> None:
        """An FP8 model splits along whole scale blocks (``check_tp_fp8``)."""
        check_tp_fp8(self.full, self.tp)

    def random(self, seed: int = 0, dtype=torch.float32, device="cpu", quantize: str | None = None):
        return random_shard(self, seed, dtype, device, quantize)

    def cut(self, w):
        return shard_weights(self, w)


def random_shard(shard: TPShard, seed: int = 0, dtype=torch.float32, device="cpu", quantize: str | None = None):
    """``weights.random_weights`` of the full model, cut to ``shard``'s share as it is generated:
    the same values a one-rank run gets (the same generator, drawn in the same order, a layer
    slice at a time), of which this rank keeps its part, so TP runs equal a one-GPU run. With
    ``quantize="fp8"`` the rank's projection parts are quantized as ``random_weights`` quantizes
    the whole ones: its scale blocks are whole blocks of the full model's (``check_tp_fp8``), so
    the values and scales are the one-GPU run's, cut apart."""
    if shard.tp == 1:
        return random_weights(shard.full, seed=seed, dtype=dtype, device=device, quantize=quantize)
    if quantize:
        check_tp_fp8(shard.full, shard.tp)
    g = torch.Generator(device=device).manual_seed(seed)
    whole = Qwen3Weights.empty(shard.full, dtype, "meta")
    w = Qwen3Weights.empty(shard.config, dtype, device, quantize)
    norms = ("input_norm", "post_norm", "q_norm", "k_norm", "final_norm")
    for name, t in whole.tensors().items():
        if name == "lm_head" and shard.full.tie_word_embeddings:     # (meta tensors all look tied)
            continue
        std, mean = (0.1, 1.0) if name in norms else ((0.1 if name == "embed" else t.shape[-1] ** -0.5), 0.0)
        mine = getattr(w, name)
        for l, part in enumerate(t if t.dim() == 3 else [t]):
            full_part = torch.randn(part.shape, generator=g, device=device, dtype=torch.float32) * std + mean
            cut = shard.take_stacked(name, full_part)
            if mine.dtype == torch.float8_e4m3fn:
                cut = cut.to(dtype)         # rounded as stored, then quantized (``random_weights``)
                for r0, n in proj_parts(shard.config, name):
                    _put_fp8(w, name, l, r0, *fp8.quantize_blockwise(cut[r0:r0 + n]))
            else:
                (mine[l] if t.dim() == 3 else mine).copy_(cut)
    return w


def shard_weights(shard: TPShard, w):
    """A rank's share of full ``Qwen3Weights`` ``w`` (copies; a tied head stays tied; FP8
    projections with their scale grids)."""
    parts = {}
    for name, t in w.tensors().items():
        if name == "lm_head" and w.tied:
            continue
        parts[name] = torch.stack([shard.take_stacked(name, p) for p in t]) if t.dim() == 3 else \
            shard.take_stacked(name, t).clone()
    return Qwen3Weights(lm_head=parts["embed"] if w.tied else parts["lm_head"],
                        **{k: v for k, v in parts.items() if k != "lm_head"})
