"""Qwen3 weights: loading Hugging Face checkpoints into the stacked layout the kernels read.

Every kernel and the torch reference read the same tensors. Per-layer weights are stacked along a
leading layer axis and the projections that share an input are concatenated (q|k|v, gate|up), so
a tile finds its weights from the layer index and a constexpr shape, with no per-layer pointer
table. Loading copies each checkpoint tensor once into its slot of the stacked buffer, so peak
memory is one model plus one tensor.

Sources, in the order ``resolve_checkpoint`` tries them: a local folder; a size alias
(``0.6b``..``32b``) or repo id in the local Hugging Face cache; a download where the network
allows. Where none works that is an error that says how to get the checkpoint: weights are never
substituted. Random weights of the true shapes come only when asked for (``load_random``),
written once to a cache folder as safetensors so later runs reload them quickly.

Qwen's FP8 checkpoints (``quantization_config`` in config.json, ``*_scale_inv`` block scales beside
float8_e4m3fn projections; see ``fp8.py``) are checked the same way, from config and headers, and
load as FP8: the four stacked projections stay float8_e4m3fn beside float32 scale grids (the FP8
tiles read them), everything else in the requested dtype. ``quantize="fp8"`` puts a bf16 checkpoint,
or random weights, into the same format on load, one projection at a time.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from . import fp8
from .config import DEMO_PRESETS, PRESETS, REPO_IDS, Qwen3Config, size_key
from .fp8 import UnsupportedQuantization, check_quantization_config, scale_shape


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: the message names the file or tensor and why."""


PROJ_NAMES = ("wqkv", "wo", "wgate_up", "wdown")   # the projections FP8 stores as float8_e4m3fn
QUANTIZATIONS = ("fp8",)


def check_quantize(quantize) -> str | None:
    """``quantize`` as given (None or "fp8"); anything else is a ValueError that names the choices."""
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize {quantize!r} is not supported: use {' or '.join(map(repr, QUANTIZATIONS))} "
                         f"(block FP8 e4m3 weights, as in Qwen's -FP8 checkpoints), or None")
    return quantize


@dataclass
class Qwen3Weights:
    """All weights of a Qwen3 model, stacked over layers. Shapes use L layers, H hidden,
    D head_dim, Hq/Hkv query/kv heads, I intermediate, V vocab."""
    embed: torch.Tensor        # [V, H]
    lm_head: torch.Tensor      # [V, H]; the same tensor as embed when tied
    final_norm: torch.Tensor   # [H]
    input_norm: torch.Tensor   # [L, H]
    post_norm: torch.Tensor    # [L, H]
    q_norm: torch.Tensor       # [L, D]
    k_norm: torch.Tensor       # [L, D]
    wqkv: torch.Tensor         # [L, (Hq + 2 Hkv) D, H]: q rows, then k rows, then v rows
    wo: torch.Tensor           # [L, H, Hq D]
    wgate_up: torch.Tensor     # [L, 2 I, H]: gate rows, then up rows
    wdown: torch.Tensor        # [L, H, I]
    # FP8 (``fp8.py``): the four projections above are float8_e4m3fn and these their float32
    # scales, [L, ceil(rows / scale_rows), ceil(K / 128)] (``fp8.scale_rows``); None otherwise.
    wqkv_scale: torch.Tensor | None = None
    wo_scale: torch.Tensor | None = None
    wgate_up_scale: torch.Tensor | None = None
    wdown_scale: torch.Tensor | None = None

    def __repr__(self) -> str:
        fp8 = ", fp8 projections" if self.quantization else ""
        return (f"Qwen3Weights({self.wqkv.shape[0]} layers, hidden {self.embed.shape[1]}, vocab {self.embed.shape[0]}, "
                f"{str(self.dtype).removeprefix('torch.')}{fp8} on {self.device}, {self.nbytes() / 1e9:.2f} GB"
                f"{', tied head' if self.tied else ''})")

    @property
    def dtype(self) -> torch.dtype:
        """The model's dtype: embeddings, norms, the LM head, activations and the KV cache."""
        return self.embed.dtype

    @property
    def quantization(self) -> str | None:
        """"fp8" where the projections are block FP8, else None."""
        return "fp8" if self.wqkv.dtype == torch.float8_e4m3fn else None

    @property
    def scale_rows(self) -> int:
        """Rows a scale row covers (``fp8.scale_rows``); 128 where the weights are not FP8."""
        if self.wqkv_scale is None:
            return fp8.BLOCK
        return self.wqkv.shape[1] // self.wqkv_scale.shape[1]

    @property
    def device(self) -> torch.device:
        return self.wqkv.device

    @property
    def tied(self) -> bool:
        if self.lm_head.is_meta:     # (every meta tensor's data_ptr is 0)
            return self.lm_head is self.embed
        return self.lm_head.data_ptr() == self.embed.data_ptr()

    def proj(self, name: str, layer: int) -> torch.Tensor:
        """Projection ``name`` (``PROJ_NAMES``) of one layer in the model's dtype, dequantized where
        FP8: what the torch paths (the reference, prefill) multiply by."""
        w = getattr(self, name)[layer]
        if w.dtype != torch.float8_e4m3fn:
            return w
        return fp8.dequantize_grid(w, getattr(self, name + "_scale")[layer], self.scale_rows, self.dtype)

    def dequantized(self, dtype=None) -> "Qwen3Weights":
        """A copy in plain ``dtype`` (default: the model's) with the projections dequantized, one
        layer at a time; in float32 these are exactly the weights the FP8 tiles multiply by."""
        dtype = dtype or self.dtype
        out = {k: v.to(dtype) for k, v in self.tensors().items()
               if k != "lm_head" and k not in PROJ_NAMES and not k.endswith("_scale")}
        for name in PROJ_NAMES:
            t = getattr(self, name)
            out[name] = torch.empty(t.shape, dtype=dtype, device=t.device)
            for l in range(t.shape[0]):
                out[name][l] = self.proj(name, l)
        head = out["embed"] if self.tied else self.lm_head.to(dtype)
        return Qwen3Weights(lm_head=head, **out)

    def to(self, dtype=None, device=None) -> "Qwen3Weights":
        """A copy in another dtype/device that keeps a tied head tied. FP8 projections and their
        scales keep their own dtypes (only the device changes)."""
        def move(k, v):
            keep = k.endswith("_scale") or v.dtype == torch.float8_e4m3fn
            return v.to(device=device, dtype=None if keep else dtype)
        moved = {k: move(k, v) for k, v in self.tensors().items() if k != "lm_head"}
        head = moved["embed"] if self.tied else self.lm_head.to(device=device, dtype=dtype)
        return Qwen3Weights(lm_head=head, **moved)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def nbytes(self) -> int:
        """Bytes of weights a decode step reads (a tied head counted once; FP8 projections at one
        byte a weight, plus their scales)."""
        total = sum(t.numel() * t.element_size() for n, t in self.tensors().items() if n != "lm_head")
        if not self.tied:
            total += self.lm_head.numel() * self.lm_head.element_size()
        return total

    @staticmethod
    def empty(cfg: Qwen3Config, dtype: torch.dtype, device, quantize: str | None = None) -> "Qwen3Weights":
        L, H, D, I, V = (cfg.num_hidden_layers, cfg.hidden_size, cfg.head_dim,
                         cfg.intermediate_size, cfg.vocab_size)
        e = lambda *shape: torch.empty(*shape, dtype=dtype, device=device)  # noqa: E731
        embed = e(V, H)
        proj = {"wqkv": (cfg.qkv_size, H), "wo": (H, cfg.q_size), "wgate_up": (2 * I, H), "wdown": (H, I)}
        scales = {}
        if check_quantize(quantize) == "fp8":
            rows = fp8.scale_rows(cfg)
            scales = {n + "_scale": torch.empty(L, *fp8.grid_shape(*nk, rows), dtype=torch.float32, device=device)
                      for n, nk in proj.items()}
        pdt = torch.float8_e4m3fn if quantize else dtype
        return Qwen3Weights(
            embed=embed, lm_head=embed if cfg.tie_word_embeddings else e(V, H), final_norm=e(H),
            input_norm=e(L, H), post_norm=e(L, H), q_norm=e(L, D), k_norm=e(L, D),
            **{n: torch.empty(L, *nk, dtype=pdt, device=device) for n, nk in proj.items()}, **scales)


def weight_bytes(cfg: Qwen3Config, dtype: torch.dtype, quantize: str | None = None) -> int:
    """Bytes the weights of ``cfg`` take in ``dtype`` (FP8 projections and their scales with
    ``quantize``): what a memory check before loading counts."""
    return Qwen3Weights.empty(cfg, dtype, "meta", quantize).nbytes()


def proj_parts(cfg: Qwen3Config, name: str) -> list[tuple[int, int]]:
    """(first row, rows) of each Hugging Face tensor in stacked projection ``name``: q, k, v in
    wqkv; gate, up in wgate_up; the one tensor of wo and wdown. Each has its own scale blocks."""
    q, kv, I, H = cfg.q_size, cfg.kv_size, cfg.intermediate_size, cfg.hidden_size
    return {"wqkv": [(0, q), (q, kv), (q + kv, kv)], "wgate_up": [(0, I), (I, I)],
            "wo": [(0, H)], "wdown": [(0, H)]}[name]


HF_PROJ = {"wqkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "wo": ("self_attn.o_proj",),
           "wgate_up": ("mlp.gate_proj", "mlp.up_proj"), "wdown": ("mlp.down_proj",)}


def _proj_slots(cfg: Qwen3Config, l: int):
    """(HF weight name, stacked projection, first row, rows) of layer l's projections."""
    for name, hf in HF_PROJ.items():
        for part, (r0, n) in zip(hf, proj_parts(cfg, name)):
            yield f"model.layers.{l}.{part}.weight", name, r0, n


def hf_slots(cfg: Qwen3Config, w: Qwen3Weights) -> dict[str, torch.Tensor]:
    """Map every Hugging Face tensor name to the view of the stacked buffer it fills (an FP8
    projection's scales: ``hf_scale_slots``)."""
    slots = {
        "model.embed_tokens.weight": w.embed,
        "model.norm.weight": w.final_norm,
    }
    if not cfg.tie_word_embeddings:
        slots["lm_head.weight"] = w.lm_head
    for l in range(cfg.num_hidden_layers):
        p = f"model.layers.{l}."
        slots.update({
            p + "input_layernorm.weight": w.input_norm[l],
            p + "post_attention_layernorm.weight": w.post_norm[l],
            p + "self_attn.q_norm.weight": w.q_norm[l],
            p + "self_attn.k_norm.weight": w.k_norm[l],
        })
        slots.update({hf: getattr(w, name)[l, r0:r0 + n] for hf, name, r0, n in _proj_slots(cfg, l)})
    return slots


def hf_scale_slots(cfg: Qwen3Config, w: Qwen3Weights) -> dict[str, tuple[torch.Tensor, int]]:
    """FP8 weights: each projection's ``<name>_scale_inv`` -> (the rows of the stacked scale grid
    it fills, the projection's rows); a part starts on a scale row (``fp8.scale_rows``)."""
    rows = w.scale_rows
    return {hf + fp8.SCALE_SUFFIX: (getattr(w, name + "_scale")[l, r0 // rows:(r0 + n + rows - 1) // rows], n)
            for l in range(cfg.num_hidden_layers) for hf, name, r0, n in _proj_slots(cfg, l)}


def to_hf_state_dict(cfg: Qwen3Config, w: Qwen3Weights) -> dict[str, torch.Tensor]:
    """The inverse of loading: HF names to (contiguous copies of) our tensors; FP8 weights with
    their ``_scale_inv`` in Qwen's layout."""
    sd = {name: t.contiguous().clone() for name, t in hf_slots(cfg, w).items()}
    if w.quantization:
        sd.update({name: fp8.from_grid(grid, n, w.scale_rows) for name, (grid, n) in hf_scale_slots(cfg, w).items()})
    if cfg.tie_word_embeddings:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    return sd


def random_weights(cfg: Qwen3Config, seed: int = 0, dtype=torch.float32, device="cpu",
                   quantize: str | None = None) -> Qwen3Weights:
    """Deterministic random weights of the true shapes (for one seed and device type), scaled so
    every layer moves the residual stream about as much as the embedding does: the greedy
    tokens then depend on the whole network (not just echo the input) and win by clear margins.
    Generated one layer slice at a time, on the target device, so large models need no host copy.
    With ``quantize="fp8"`` each projection's slice, rounded to ``dtype`` as it would be stored,
    is quantized part by part (the same values as without, in FP8)."""
    g = torch.Generator(device=device).manual_seed(seed)
    w = Qwen3Weights.empty(cfg, dtype, device, quantize)
    norms = ("input_norm", "post_norm", "q_norm", "k_norm", "final_norm")
    for name, t in w.tensors().items():
        if (name == "lm_head" and w.tied) or name.endswith("_scale"):
            continue
        if name in norms:
            std, mean = 0.1, 1.0   # norm weights around 1, as trained models have
        else:
            std, mean = (0.1 if name == "embed" else t.shape[-1] ** -0.5), 0.0
        for l, part in enumerate(t if t.dim() == 3 else [t]):
            r = torch.randn(part.shape, generator=g, device=device, dtype=torch.float32) * std + mean
            if part.dtype != torch.float8_e4m3fn:
                part.copy_(r)
                continue
            r = r.to(dtype)
            for r0, n in proj_parts(cfg, name):
                _put_fp8(w, name, l, r0, *fp8.quantize_blockwise(r[r0:r0 + n]))
    return w


def _put_fp8(w: Qwen3Weights, name: str, l: int, r0: int, q: torch.Tensor, scale_inv: torch.Tensor):
    """Store one projection's fp8 rows and its scale_inv at row r0 of layer l's stacked ``name``."""
    rows, n = w.scale_rows, q.shape[0]
    getattr(w, name)[l, r0:r0 + n].copy_(q)
    getattr(w, name + "_scale")[l, r0 // rows:(r0 + n + rows - 1) // rows].copy_(fp8.to_grid(scale_inv, n, rows))


# ---------------------------------------------------------------------------------------------
# Checkpoint files


def _read_safetensors_header(path: Path) -> dict:
    """Validate a safetensors file's header so that a truncated or corrupt file gets a clear
    error naming it, rather than a crash deep inside the reader."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n <= 0 or 8 + n > size:
                raise CheckpointError(f"{path}: corrupt safetensors header (claims {n} bytes, file has {size})")
            header = json.loads(f.read(n))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{path}: corrupt safetensors header (not JSON)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a table of tensors)")
    end = 8 + n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise CheckpointError(f"{path}: corrupt safetensors header (tensor {name} has no data_offsets)")
        start, stop = offsets
        if end + stop > size:
            raise CheckpointError(f"{path}: truncated safetensors file: tensor {name} ends at byte "
                                  f"{end + stop}, the file has {size}")
    return header


def checkpoint_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index}: not a safetensors index ({e})") from None
        files = sorted({folder / f for f in weight_map.values()})
        for f in files:
            if not f.exists():
                raise CheckpointError(f"{index}: names {f.name}, which is missing from {folder}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors files")
    return files


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SCALE_SUFFIX = fp8.SCALE_SUFFIX


def fp8_block(folder: Path) -> tuple[int, int] | None:
    """The FP8 weight block of the checkpoint in ``folder`` from its config.json's
    quantization_config (None: not quantized); any other quantization is a CheckpointError."""
    path = folder / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None     # no config.json, or a damaged one that Qwen3Config.from_json reports
    try:
        return check_quantization_config(raw if isinstance(raw, dict) else {})
    except UnsupportedQuantization as e:
        raise CheckpointError(f"{path}: {e}") from None


def _check_fp8(f: Path, name: str, info: dict, slot: torch.Tensor | None, block) -> None:
    """An FP8 tensor's header: a projection weight in float8_e4m3fn, or its float32 scale_inv of
    one scale per block, in a checkpoint whose config.json declares FP8."""
    where = f"{f}: tensor {name}"
    if block is None:
        raise CheckpointError(f"{where} is {info.get('dtype')}, but config.json has no FP8 quantization_config")
    if name.endswith(SCALE_SUFFIX):
        if info.get("dtype") not in ("F32", "BF16", "F16"):
            raise CheckpointError(f"{where} has dtype {info.get('dtype')}, expected F32 block scales")
        want = list(scale_shape(*slot.shape, block[0]))
        if info.get("shape") != want:
            raise CheckpointError(f"{where} has shape {info.get('shape')}, expected {want} "
                                  f"(one scale per {block[0]}x{block[1]} block of a {list(slot.shape)} weight)")
    elif name.split(".")[-2:-1] not in [[p] for p in PROJECTIONS]:
        raise CheckpointError(f"{where} is float8_e4m3fn; only the linear projections may be FP8 "
                              f"(embeddings, the LM head and norms stay bf16)")


def check_checkpoint(folder: str | Path, cfg: Qwen3Config | None = None) -> dict[Path, dict]:
    """Check a checkpoint folder from its config.json and safetensors headers alone, before any
    weight is read: every file whole, every tensor expected and of the shape config.json implies,
    none missing. Returns each file's header; raises CheckpointError naming the file and tensor."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such checkpoint folder")
    cfg = cfg or Qwen3Config.from_json(folder / "config.json")
    block = fp8_block(folder)
    headers = {f: _read_safetensors_header(f) for f in checkpoint_files(folder)}
    slots = hf_slots(cfg, Qwen3Weights.empty(cfg, torch.float32, "meta"))
    seen: set[str] = set()
    fp8: set[str] = set()
    scales: set[str] = set()
    for f, header in headers.items():
        for name, info in header.items():
            if name == "__metadata__" or (name == "lm_head.weight" and cfg.tie_word_embeddings):
                continue    # tied: some exports store a copy; the embedding is the one read
            if name.endswith(SCALE_SUFFIX) and name.removesuffix(SCALE_SUFFIX) in slots:
                _check_fp8(f, name, info, slots[name.removesuffix(SCALE_SUFFIX)], block)
                scales.add(name.removesuffix(SCALE_SUFFIX))
                continue
            if isinstance(info, dict) and info.get("dtype") == "F8_E4M3":
                _check_fp8(f, name, info, slots.get(name), block)
                fp8.add(name)
            slot = slots.get(name)
            if slot is None:
                if name.endswith("rotary_emb.inv_freq"):
                    continue
                raise CheckpointError(f"{f}: unexpected tensor {name} for a Qwen3 model with "
                                      f"{cfg.num_hidden_layers} layers")
            shape = info.get("shape")
            if shape != list(slot.shape):
                raise CheckpointError(f"{f}: tensor {name} has shape {shape}, config.json implies {list(slot.shape)}")
            seen.add(name)
    missing = sorted(set(slots) - seen)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise CheckpointError(f"{folder}: missing weights {', '.join(missing[:3])}{more}")
    if fp8 != scales:
        name = sorted(fp8 ^ scales)[0]
        why = "has no " + name + SCALE_SUFFIX if name in fp8 else "is not float8_e4m3fn but has a " + SCALE_SUFFIX
        raise CheckpointError(f"{folder}: FP8 weight {name} {why}")
    if block is not None and not fp8:
        raise CheckpointError(f"{folder / 'config.json'}: declares FP8 quantization, but no weight is float8_e4m3fn")
    return headers


def load_checkpoint(folder: str | Path, dtype=torch.float32, device="cpu", cfg: Qwen3Config | None = None,
                    progress: bool = True, quantize: str | None = None,
                    shard=None) -> tuple[Qwen3Config, Qwen3Weights]:
    """Load a local Hugging Face Qwen3 checkpoint folder into the stacked layout, converting
    each tensor to ``dtype`` (bf16 files load into float32 and back exactly). An FP8 checkpoint's
    projections stay FP8 with their scales; ``quantize="fp8"`` quantizes a plain checkpoint's
    projections on load, one tensor at a time (on ``device``). The folder is checked first
    (``check_checkpoint``), so a damaged one fails before anything is allocated. ``shard`` (a
    ``tp.TPShard``): only that rank's share reaches ``device``, each tensor (and FP8 scale) cut on
    the host as it is read, and the returned config is the rank's (``tp.shard_config``)."""
    from safetensors import safe_open
    from tqdm.auto import tqdm

    folder = Path(folder)
    check_quantize(quantize)
    headers = check_checkpoint(folder, cfg)
    cfg = cfg or Qwen3Config.from_json(folder / "config.json")
    if fp8_block(folder) is not None:
        quantize = "fp8"
    if shard is not None:
        if quantize:
            shard.check_fp8()
        cfg = shard.config
    cut = shard.take if shard is not None else (lambda name, t: t)
    w = Qwen3Weights.empty(cfg, dtype, device, quantize)
    slots = hf_slots(cfg, w)
    scale_slots = hf_scale_slots(cfg, w) if quantize else {}
    proj = {hf: (name, l, r0) for l in range(cfg.num_hidden_layers) for hf, name, r0, _ in _proj_slots(cfg, l)}
    total = sum(len([k for k in h if k != "__metadata__"]) for h in headers.values())
    bar = tqdm(total=total, desc=f"Loading {folder.name}", unit="tensor", disable=not progress,
               file=sys.stderr)
    for f in headers:
        try:
            with safe_open(str(f), framework="pt", device="cpu") as sf:
                for name in sf.keys():
                    bar.update(1)
                    slot = slots.get(name)
                    if name in scale_slots:
                        grid, n = scale_slots[name]
                        grid.copy_(fp8.to_grid(cut(name, sf.get_tensor(name)), n, w.scale_rows))
                    if slot is None:
                        continue    # checked above: a scale_inv, a tied head's copy or rotary_emb.inv_freq
                    t = sf.get_tensor(name)
                    t = cut(name, t)
                    if slot.dtype == torch.float8_e4m3fn and t.dtype != torch.float8_e4m3fn:
                        _put_fp8(w, *proj[name], *fp8.quantize_blockwise(t.to(device)))
                    else:
                        slot.copy_(t.to(dtype) if t.dtype != torch.float8_e4m3fn else t)
        except Exception as e:  # the safetensors reader's own errors on damaged files
            raise CheckpointError(f"{f}: cannot read ({type(e).__name__}: {e})") from None
    bar.close()
    return cfg, w


def save_checkpoint(folder: str | Path, cfg: Qwen3Config, w: Qwen3Weights, dtype=None) -> Path:
    """Write config.json and model.safetensors in Hugging Face's layout (FP8 weights in Qwen's
    FP8 layout, with its quantization_config; ``dtype`` converts the others). The tensors go to a
    temporary file renamed at the end, removed if writing fails or is interrupted."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if dtype is None or w.quantization:
        sd = to_hf_state_dict(cfg, w)
        if cfg.tie_word_embeddings:
            del sd["lm_head.weight"]
        keep = lambda k, t: dtype is None or k.endswith(SCALE_SUFFIX) or t.dtype == torch.float8_e4m3fn  # noqa: E731
        sd = {k: t if keep(k, t) else t.to(dtype) for k, t in sd.items()}
    else:   # one converted copy per tensor (separate storage, as safetensors requires)
        sd = {k: t.to(dtype=dtype, copy=True).contiguous() for k, t in hf_slots(cfg, w).items()}
    _write_safetensors({k: v.cpu() for k, v in sd.items()}, folder / "model.safetensors", save_file)
    config = cfg.to_dict()
    if w.quantization:
        config["quantization_config"] = dict(fp8.QWEN_CONFIG)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def _write_safetensors(sd: dict, path: Path, save_file):
    tmp = path.with_name(path.name + ".tmp")
    try:
        save_file(sd, str(tmp), metadata={"format": "pt"})
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------------
# Resolving a model name: the one place a name becomes shapes (``shapes_for``) or a checkpoint
# folder (``resolve_checkpoint``). A name is a checkpoint folder, a size alias (0.6b .. 32b, any
# case), the repo id of one (Qwen/Qwen3-0.6B), another Hugging Face repo id, or the demo shape
# ``tiny-random``.


def cache_dir() -> Path:
    """The one cache folder (random weights, tuned plans): ``$MEGAKERNEL_CACHE``, else
    ``$XDG_CACHE_HOME/megakernel``, else ``~/.cache/megakernel``."""
    root = os.environ.get("MEGAKERNEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "megakernel")
    return Path(root).expanduser()


def _folder_name(name: str) -> Path | None:
    """``name`` as a folder path where it names one (or is written as a path), else None."""
    p = Path(name).expanduser()
    if p.exists() or str(name).startswith((".", "/", "~")):
        return p
    return None


def _unknown(name: str) -> CheckpointError:
    return CheckpointError(f"unknown model {name!r}: use a size ({' '.join(PRESETS)}), a Hugging Face repo id, a "
                           f"checkpoint folder, or the demo shape {' '.join(DEMO_PRESETS)}")


def shapes_for(name: str) -> Qwen3Config:
    """The shapes of model ``name`` without its weights: a folder's config.json, a Qwen3 size's
    published config (by alias or repo id), the demo shape, or another repo id's config.json from
    the local Hugging Face cache. Anything else raises CheckpointError (ValueError)."""
    folder = _folder_name(name)
    if folder is not None:
        if not folder.is_dir():
            raise CheckpointError(f"{folder}: no such checkpoint folder")
        return Qwen3Config.from_json(folder / "config.json")
    key = size_key(name)
    if key is not None:
        return PRESETS.get(key) or DEMO_PRESETS[key]
    if "/" not in name:
        raise _unknown(name)
    try:
        from huggingface_hub import hf_hub_download
        path = hf_hub_download(name, "config.json", local_files_only=True)
    except Exception:
        raise CheckpointError(f"no known shapes for {name!r}: it is not a Qwen3 size and its config.json is not "
                              f"in the local Hugging Face cache (get it with `hf download {name}`)") from None
    return Qwen3Config.from_json(path)


def cache_label(name: str) -> str:
    """One name per model for the random-weights cache, so that an alias and its repo id share
    one folder: the repo id of a Qwen3 size, the folder's name of a folder, else the name."""
    key = size_key(name)
    if key is not None:
        return REPO_IDS.get(key, key).replace("/", "--")
    folder = _folder_name(name)
    if folder is not None:
        return folder.resolve().name or "model"
    return name.replace("/", "--")


def resolve_checkpoint(name: str, allow_download: bool = True) -> Path:
    """The local folder of model ``name``'s checkpoint: the folder itself, or the repo's
    snapshot in the local Hugging Face cache, downloaded first where it is missing and
    ``allow_download`` and the network allow. Raises CheckpointError (one line, saying how to get
    it) where there is none: weights are never substituted here."""
    folder = _folder_name(name)
    if folder is not None:
        if not folder.is_dir():
            raise CheckpointError(f"{folder}: no such checkpoint folder")
        return folder
    key = size_key(name)
    if key in DEMO_PRESETS:
        raise CheckpointError(f"{name!r} is a demo shape with no checkpoint: it runs with random weights only "
                              f"(--random-weights; random_weights=True in load_model)")
    if key is None and "/" not in name:
        raise _unknown(name)
    repo = REPO_IDS[key] if key is not None else name
    random_hint = ", or run its shapes with random weights (--random-weights; random_weights=True in load_model)"
    how = f"get it with `hf download {repo}` or pass a checkpoint folder{random_hint if key else ''}"
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(f"{repo}: huggingface_hub is not installed, so the Hugging Face cache cannot be "
                              f"read: pass a checkpoint folder{random_hint if key else ''}") from None
    patterns = ["*.json", "*.safetensors", "tokenizer*", "*.txt"]
    try:
        return Path(snapshot_download(repo, allow_patterns=patterns, local_files_only=True))
    except Exception:
        pass
    if not allow_download:
        raise CheckpointError(f"{repo} is not in the local Hugging Face cache and downloads are off "
                              f"(allow_download=False): {how}")
    if _offline():
        raise CheckpointError(f"{repo} is not in the local Hugging Face cache and downloads are off "
                              f"(HF_HUB_OFFLINE): {how}")
    print(f"Downloading {repo} from the Hugging Face Hub ...", file=sys.stderr)
    try:
        return Path(snapshot_download(repo, allow_patterns=patterns))
    except Exception as e:
        # the cause whole: cut short it reads as a garbled word ("snapsh)")
        why = " ".join(str(e).split()) or "no message"
        raise CheckpointError(f"{repo} is not in the local Hugging Face cache and could not be downloaded "
                              f"({type(e).__name__}: {why}): {how}") from None


def _offline() -> bool:
    try:
        from huggingface_hub import constants
        return bool(constants.HF_HUB_OFFLINE)
    except (ImportError, AttributeError):
        return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def preset_for(name: str) -> Qwen3Config | None:
    """The published (or demo) shapes of a size alias or its repo id, else None."""
    key = size_key(name)
    return None if key is None else PRESETS.get(key) or DEMO_PRESETS[key]


# ---------------------------------------------------------------------------------------------
# Host memory


def available_host_memory() -> int | None:
    """Bytes of host memory available to a new allocation (MemAvailable: free plus reclaimable
    cache), or None where the system does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_host_memory(nbytes: int, what: str, margin: float = 1.05):
    """Raise MemoryError, before allocating, where ``nbytes`` for ``what`` do not fit the host's
    available memory: one line instead of the allocator's message or the OOM killer."""
    free = available_host_memory()
    if free is not None and nbytes * margin > free:
        gib = 1024 ** 3
        raise MemoryError(f"{what} needs {nbytes / gib:.1f} GiB of host memory, and {free / gib:.1f} GiB is "
                          f"available; use a smaller model or dtype, or a machine with more memory")


# ---------------------------------------------------------------------------------------------
# Random weights


def load_random(cfg: Qwen3Config, seed: int, dtype, device, label: str, progress: bool = True,
                quantize: str | None = None, shard=None) -> Qwen3Weights:
    """Deterministic random weights. Models under 2B parameters are generated once on the CPU and
    cached as safetensors (float32 for tiny ones, bf16 otherwise) so later runs load the same
    values quickly on any device; larger ones are generated on the device each time. The cache
    folder appears whole or not at all: it is written under a temporary name that is removed if
    writing fails or is interrupted. ``quantize="fp8"``: the same values, quantized on load.
    ``shard`` (a ``tp.TPShard`` of ``cfg``): that rank's share of the same values."""
    import hashlib
    import shutil

    params = cfg.num_parameters()
    if params > 2_000_000_000:
        if shard is not None:
            return shard.random(seed=seed, dtype=dtype, device=device, quantize=quantize)
        return random_weights(cfg, seed=seed, dtype=dtype, device=device, quantize=quantize)
    key = hashlib.sha1(json.dumps([cfg.to_dict(), seed], sort_keys=True).encode()).hexdigest()[:12]
    folder = cache_dir() / "random" / f"{label}-seed{seed}-{key}"
    if (folder / "model.safetensors").exists():
        try:
            return load_checkpoint(folder, dtype=dtype, device=device, cfg=cfg, progress=progress,
                                   quantize=quantize, shard=shard)[1]
        except CheckpointError as e:
            print(f"Regenerating random weights: cached copy unreadable ({e})", file=sys.stderr)
    disk_dtype = torch.float32 if params < 50_000_000 else torch.bfloat16
    # float32 values, their converted copy, and safetensors' serialised bytes of that copy
    check_host_memory(params * (4 + 2 * disk_dtype.itemsize), f"generating random weights for {label}")
    print(f"Generating random weights for {label} (once; cached in {folder}) ...", file=sys.stderr)
    w = random_weights(cfg, seed=seed, dtype=torch.float32, device="cpu")
    _remove_stale_partials(folder)
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    try:
        save_checkpoint(partial, cfg, w, dtype=disk_dtype)
        if folder.exists():
            shutil.rmtree(folder)       # an unreadable copy, reported above
        partial.replace(folder)
    except OSError as e:
        shutil.rmtree(partial, ignore_errors=True)
        print(f"(not caching random weights: {e})", file=sys.stderr)
        w = w.to(dtype=disk_dtype).to(dtype=dtype)
        if shard is not None:
            if quantize:
                shard.check_fp8()
            w, cfg = shard.cut(w), shard.config
        w = w.to(device=device)
        return _quantized(cfg, w) if quantize else w
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    del w
    return load_checkpoint(folder, dtype=dtype, device=device, cfg=cfg, progress=progress, quantize=quantize,
                           shard=shard)[1]


def _quantized(cfg: Qwen3Config, w: Qwen3Weights) -> Qwen3Weights:
    """``w`` with its projections quantized to FP8, part by part (a small model's fallback)."""
    out = Qwen3Weights.empty(cfg, w.dtype, w.device, "fp8")
    for name, t in w.tensors().items():
        if name not in PROJ_NAMES and name != "lm_head":
            getattr(out, name).copy_(t)
    if not w.tied:
        out.lm_head.copy_(w.lm_head)
    for l in range(cfg.num_hidden_layers):
        for _, name, r0, n in _proj_slots(cfg, l):
            _put_fp8(out, name, l, r0, *fp8.quantize_blockwise(getattr(w, name)[l, r0:r0 + n]))
    return out


def _remove_stale_partials(folder: Path):
    """Partial cache folders of ``folder`` left by a process that was killed outright."""
    import shutil
    for p in folder.parent.glob(f"{folder.name}.partial-*"):
        try:
            pid = int(p.name.rsplit("-", 1)[1])
            os.kill(pid, 0)
            continue                    # its writer is still running
        except ProcessLookupError:
            pass
        except (ValueError, PermissionError):
            continue
        shutil.rmtree(p, ignore_errors=True)
