"""``load_model``: a size alias, repo id or checkpoint folder -> weights on a device.

Loading is two steps so that a command line can check everything before the slow part:
``locate_model`` finds the checkpoint (or, only when asked, random weights) and reads its shapes
and tokenizer; ``ModelSource.load`` reads the weights onto a device after a memory check.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from models.qwen3.config import Qwen3Config
from models.qwen3.tp import TPShard, check_tp_fp8
from models.qwen3.weights import Qwen3Weights, cache_label, check_checkpoint, check_host_memory, check_quantize, \
    fp8_block, load_checkpoint, load_random, resolve_checkpoint, shapes_for, weight_bytes

from . import device as devices

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_memory(device: torch.device, nbytes: int, what: str):
    """MemoryError (one line: what is needed, what is free) before ``nbytes`` for ``what`` are
    allocated on ``device``: GPU memory on CUDA, host memory on the CPU."""
    if device.type == "cpu":
        check_host_memory(nbytes, what)
    else:
        devices.check_fits(device, nbytes, what)


@dataclass(repr=False)
class Qwen3Model:
    name: str
    config: Qwen3Config
    weights: Qwen3Weights
    checkpoint: Path | None     # None for random weights
    tokenizer: object | None    # models.qwen3.tokenizer.Tokenizer, or None where none is known
    shard: TPShard | None = None    # tensor parallelism: config and weights are this rank's share

    @property
    def tp(self) -> int:
        return self.shard.tp if self.shard else 1

    @property
    def random_weights(self) -> bool:
        return self.checkpoint is None

    @property
    def device(self) -> torch.device:
        return self.weights.device

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.dtype

    @property
    def quantization(self) -> str | None:
        return self.weights.quantization

    def __repr__(self) -> str:
        source = "random weights" if self.random_weights else str(self.checkpoint)
        fp8 = ", fp8 projections" if self.quantization else ""
        return (f"Qwen3Model({self.name!r}, {self.config.num_parameters() / 1e6:,.1f}M parameters, "
                f"{str(self.dtype).removeprefix('torch.')}{fp8} on {self.device}, {source})")


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights come from, with its shapes and tokenizer: what ``locate_model``
    finds before any weight is read."""
    name: str
    config: Qwen3Config
    checkpoint: Path | None     # None: random weights of ``config``'s shapes
    tokenizer: object | None

    @property
    def random_weights(self) -> bool:
        return self.checkpoint is None

    @property
    def quantization(self) -> str | None:
        """"fp8" where the checkpoint itself is Qwen's block FP8, else None."""
        return "fp8" if self.checkpoint is not None and fp8_block(self.checkpoint) is not None else None

    def weight_bytes(self, dtype: torch.dtype, quantize: str | None = None) -> int:
        """Bytes the weights take in ``dtype``, FP8 projections counted at one byte where the
        checkpoint is FP8 or ``quantize`` asks for it."""
        return weight_bytes(self.config, dtype, quantize or self.quantization)

    def load(self, device=None, dtype=None, seed: int = 0, progress: bool = True,
             quantize: str | None = None, tp: int = 1, rank: int = 0) -> Qwen3Model:
        """The weights on ``device`` in ``dtype`` (default: bf16 on an accelerator, float32 on
        the CPU), after checking that they fit there; with ``quantize="fp8"`` the projections in
        block FP8 (as an FP8 checkpoint's already are). ``tp`` > 1: only rank ``rank``'s share of
        them (``models.qwen3.tp``), and the model's config is that rank's."""
        shard = TPShard(self.config, tp, rank) if tp > 1 else None
        cfg_here = shard.config if shard else self.config
        dev = devices.resolve(device)
        dtype = resolve_dtype(dtype, dev)
        quantize = check_quantize(quantize) or self.quantization
        if quantize:
            devices.check_fp8(dev)
            if shard:
                check_tp_fp8(self.config, tp)
        if dev.type == "cpu" and dtype != torch.float32:
            print(f"note: {dtype} on the CPU runs the reference in {dtype}; the interpreter's kernels need "
                  f"float32", file=sys.stderr)
        what = f"{self.name}'s weights in {str(dtype).removeprefix('torch.')}"
        what += (" with FP8 projections" if quantize else "") + (f" ({shard.describe()})" if shard else "")
        check_memory(dev, weight_bytes(cfg_here, dtype, quantize), what)
        if self.checkpoint is not None:
            cfg, w = load_checkpoint(self.checkpoint, dtype=dtype, device=dev, cfg=self.config, progress=progress,
                                     quantize=quantize, shard=shard)
        else:
            if rank == 0:
                print(f"note: {self.name}: deterministic random weights (seed {seed}) of the true shapes, as asked; "
                      f"outputs are meaningless", file=sys.stderr)
            cfg, w = cfg_here, load_random(self.config, seed, dtype, dev, label=cache_label(self.name),
                                           progress=progress, quantize=quantize, shard=shard)
        return Qwen3Model(self.name, cfg, w, self.checkpoint, self.tokenizer, shard)


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    """A torch dtype from a dtype or its name (None: the device's default)."""
    if dtype is None:
        return devices.default_dtype(device)
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not supported: choose one of {', '.join(DTYPES)}")
        dtype = DTYPES[dtype]
    if dtype not in DTYPES.values():
        raise ValueError(f"dtype {dtype} is not supported (float32, bfloat16 or float16)")
    return dtype


def locate_model(name: str, random_weights: bool = False, allow_download: bool = True) -> ModelSource:
    """Find model ``name`` (a size alias 0.6b 1.7b 4b 8b 14b 32b, a Hugging Face repo id, a local
    checkpoint folder, or the demo shape ``tiny-random``) and read its shapes and tokenizer; no
    weights are read. A checkpoint is taken from the folder, else the local Hugging Face cache,
    else downloaded where ``allow_download`` and the network allow; where there is none, a
    CheckpointError (ValueError) says how to get it. Random weights only with
    ``random_weights=True``: then the shapes come from ``shapes_for`` and there is no tokenizer."""
    from models.qwen3.tokenizer import load_tokenizer

    if random_weights:
        return ModelSource(name, shapes_for(name), None, None)
    folder = resolve_checkpoint(name, allow_download=allow_download)
    cfg = Qwen3Config.from_json(folder / "config.json")
    check_checkpoint(folder, cfg)       # headers only: a damaged checkpoint fails before any work
    return ModelSource(name, cfg, folder, load_tokenizer(folder))


def load_model(name: str, random_weights: bool = False, seed: int = 0, device=None, dtype=None,
               progress: bool = True, allow_download: bool = True, quantize: str | None = None, tp: int = 1,
               rank: int = 0) -> Qwen3Model:
    """Load ``name``: a size alias (0.6b 1.7b 4b 8b 14b 32b), a Hugging Face repo id, or a local
    checkpoint folder. The folder, else the local Hugging Face cache, else a download where
    ``allow_download`` and the network allow; where none has it, CheckpointError (a ValueError)
    says how to get it. ``random_weights=True`` gives deterministic random weights (``seed``) of
    the model's true shapes instead, without a checkpoint: outputs are then meaningless. Also
    ``tiny-random``, a demo shape that has only random weights. ``dtype``: a torch dtype or its
    name (default bf16 on an accelerator, float32 on the CPU). ``quantize="fp8"``: the linear
    projections in block FP8 (Qwen's -FP8 format, which an FP8 checkpoint loads in anyway), read by
    the kernels' FP8 tiles; embeddings, norms and the LM head stay in ``dtype``. MemoryError,
    before anything is allocated, where the weights do not fit the device. ``tp`` > 1 loads rank
    ``rank``'s share of a tensor-parallel run (``models.qwen3.tp``; ``megakernel.tp`` runs the ranks)."""
    dev = devices.resolve(device)
    dtype = resolve_dtype(dtype, dev)
    check_quantize(quantize)
    return locate_model(name, random_weights, allow_download).load(dev, dtype, seed=seed, progress=progress,
                                                                   quantize=quantize, tp=tp, rank=rank)
