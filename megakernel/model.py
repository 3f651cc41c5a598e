"""``load_model``: a size alias, repo id or checkpoint folder -> weights on a device."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from models.qwen3.config import Qwen3Config
from models.qwen3.weights import CheckpointError, Qwen3Weights, load_checkpoint, load_random, preset_for, \
    resolve_checkpoint

from . import device as devices


@dataclass
class Qwen3Model:
    name: str
    config: Qwen3Config
    weights: Qwen3Weights
    checkpoint: Path | None     # None for random weights
    tokenizer: object | None    # models.qwen3.tokenizer.Tokenizer, or None where none is known

    @property
    def random_weights(self) -> bool:
        return self.checkpoint is None

    @property
    def device(self) -> torch.device:
        return self.weights.device

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.dtype


def load_model(name: str, random_weights: bool = False, seed: int = 0, device=None, dtype=None,
               progress: bool = True, allow_download: bool = True) -> Qwen3Model:
    """Load ``name``: a size alias (0.6b 1.7b 4b 8b 14b 32b), a Hugging Face repo id, or a local
    checkpoint folder. The local HF cache is tried first, then a download where the network
    allows; otherwise, or with ``random_weights=True``, deterministic random weights of the true
    shapes (outputs are then meaningless, and a warning says so)."""
    dev = devices.resolve(device)
    dtype = dtype or devices.default_dtype(dev)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype {dtype} is not supported (float32, bfloat16 or float16)")
    if dev.type == "cpu" and dtype != torch.float32:
        print(f"note: {dtype} on the CPU runs the reference in {dtype}; the interpreter's kernels need "
              f"float32", file=sys.stderr)
    from models.qwen3.tokenizer import load_tokenizer

    folder = None if random_weights else resolve_checkpoint(name, allow_download=allow_download)
    if folder is not None:
        cfg = Qwen3Config.from_json(folder / "config.json")
        devices.check_fits(dev, cfg.num_parameters() * dtype.itemsize, f"{name}'s weights in {dtype}")
        cfg, w = load_checkpoint(folder, dtype=dtype, device=dev, progress=progress)
        return Qwen3Model(name, cfg, w, folder, load_tokenizer(folder))
    cfg = preset_for(name)
    if cfg is None:
        p = Path(name).expanduser()
        if p.is_dir() and (p / "config.json").exists():
            cfg = Qwen3Config.from_json(p / "config.json")   # random weights of a folder's shapes
        else:
            raise CheckpointError(f"no checkpoint for {name!r} and no known shapes for random weights")
    devices.check_fits(dev, cfg.num_parameters() * dtype.itemsize, f"{name}'s weights in {dtype}")
    reason = "as asked (random_weights=True)" if random_weights else "no checkpoint found locally or online"
    print(f"WARNING: {name}: using deterministic random weights (seed {seed}) of the true shapes, "
          f"{reason}. Outputs are meaningless text.", file=sys.stderr)
    w = load_random(cfg, seed, dtype, dev, label=name.replace("/", "--"), progress=progress)
    return Qwen3Model(name, cfg, w, None, None)
