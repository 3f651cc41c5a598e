"""FP8 weights in the format of Qwen's ``-FP8`` checkpoints (``Qwen/Qwen3-0.6B-FP8`` ... ``-32B-FP8``).

Each linear projection weight [N, K] is stored as ``float8_e4m3fn`` beside a float32
``<name>_scale_inv`` of one scale per 128x128 block, shape [ceil(N/128), ceil(K/128)]; the real
weight is the fp8 value times its block's scale_inv (DeepSeek-V3's "fine-grained" FP8, which
transformers calls FineGrainedFP8 and vLLM ``fp8`` with ``weight_block_size``). Embeddings, the
LM head and the norms stay in bf16. This module only reads and checks that format and converts
between it and real weights; it has no kernels.
"""

from __future__ import annotations

import math

import torch

BLOCK = 128
SCALE_SUFFIX = "_scale_inv"     # a projection's block scales: ``<weight name>_scale_inv``
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max     # 448: the largest finite e4m3fn value

# The quantization_config of Qwen's -FP8 checkpoints, written with FP8 weights (``save_checkpoint``)
QWEN_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}

SUPPORTED = ('FP8 e4m3 with 128x128 weight blocks and dynamic activations '
             '(quant_method "fp8", as in Qwen\'s -FP8 checkpoints)')


class UnsupportedQuantization(ValueError):
    """A config.json quantization_config that this runtime cannot load; the message names it."""


def _refuse(what: str) -> UnsupportedQuantization:
    return UnsupportedQuantization(f"quantization_config: {what} is not supported; supported: {SUPPORTED}")


def _describe_compressed_tensors(q: dict) -> str:
    """compressed-tensors puts the scheme in config_groups: name the weights' type, bits and
    strategy (tensor, channel, group, block) so the message says which variant was found."""
    parts = []
    for group in (q.get("config_groups") or {}).values():
        w = group.get("weights") if isinstance(group, dict) else None
        if isinstance(w, dict):
            parts.append(f"{w.get('num_bits', '?')}-bit {w.get('type', '?')} weights, "
                         f"strategy {w.get('strategy', '?')}")
    fmt = q.get("format")
    detail = "; ".join(dict.fromkeys(parts))
    inner = ", ".join(x for x in (f"format {fmt}" if fmt else "", detail) if x)
    return f'compressed-tensors quantization (quant_method "compressed-tensors"{", " + inner if inner else ""})'


_OTHER_METHODS = {
    "awq": "AWQ quantization",
    "gptq": "GPTQ quantization",
    "bitsandbytes": "bitsandbytes quantization",
    "gguf": "GGUF quantization",
    "hqq": "HQQ quantization",
    "eetq": "EETQ quantization",
    "quanto": "quanto quantization",
    "torchao": "torchao quantization",
    "fbgemm_fp8": "fbgemm per-channel FP8",
    "mxfp4": "MXFP4 quantization",
}


def check_quantization_config(cfg: dict) -> tuple[int, int] | None:
    """The weight block shape of a config.json dict's FP8 quantization, or None where the
    checkpoint is not quantized. Anything but Qwen's FP8 format raises UnsupportedQuantization
    naming what was found, so a checkpoint is refused before any tensor is allocated."""
    q = cfg.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, dict):
        raise _refuse(f"{q!r} (not a table)")
    method = q.get("quant_method")
    if method is None:
        raise _refuse(f"a config with no quant_method ({sorted(q)})")
    m = str(method).lower().replace("_", "-")
    if m == "compressed-tensors":
        raise _refuse(_describe_compressed_tensors(q))
    if m.replace("-", "_") in _OTHER_METHODS:
        bits = q.get("bits") or (4 if q.get("load_in_4bit") else 8 if q.get("load_in_8bit") else None)
        raise _refuse(f'{_OTHER_METHODS[m.replace("-", "_")]} (quant_method "{method}"'
                      f'{f", {bits}-bit weights" if bits else ""})')
    if m != "fp8":
        raise _refuse(f'unknown quant_method "{method}"')
    fmt = q.get("fmt", "e4m3")      # transformers' FineGrainedFP8Config writes no fmt; it means e4m3
    if fmt != "e4m3":
        raise _refuse(f'FP8 in format "{fmt}"')
    scheme = q.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise _refuse(f'FP8 with {scheme} activation scales (activation_scheme "{scheme}")')
    block = q.get("weight_block_size")
    if block is None:
        raise _refuse("per-tensor FP8 (no weight_block_size)")
    if not isinstance(block, (list, tuple)) or list(block) != [BLOCK, BLOCK]:
        shape = "x".join(map(str, block)) + " weight blocks" if isinstance(block, (list, tuple)) else "weight blocks"
        raise _refuse(f"FP8 with {shape} (weight_block_size {block!r})")
    return (BLOCK, BLOCK)


def scale_shape(n: int, k: int, block: int = BLOCK) -> tuple[int, int]:
    """Shape of the scale_inv of an [n, k] weight: one scale per block, partial blocks included."""
    return (math.ceil(n / block), math.ceil(k / block))


def _expand(scale_inv: torch.Tensor, n: int, k: int, block: int) -> torch.Tensor:
    """Each block's scale repeated over its block, cut to [n, k]."""
    return scale_inv.repeat_interleave(block, 0).repeat_interleave(block, 1)[:n, :k]


def quantize_blockwise(w: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize an [N, K] weight as Qwen and DeepSeek do: per block, scale = amax / 448, stored
    as scale_inv (what the dequantizer multiplies by), values = w / scale_inv in float8_e4m3fn.
    Returns (fp8 [N, K], float32 scale_inv [ceil(N/block), ceil(K/block)])."""
    if w.dim() != 2:
        raise ValueError(f"quantize_blockwise: a 2-D weight is needed, got shape {list(w.shape)}")
    n, k = w.shape
    nb, kb = scale_shape(n, k, block)
    wf = w.float()
    padded = torch.zeros(nb * block, kb * block, dtype=torch.float32, device=w.device)
    padded[:n, :k] = wf        # zero padding does not change a ragged block's amax
    amax = padded.view(nb, block, kb, block).abs().amax(dim=(1, 3))
    # An all-zero block gets scale 1 (any scale stores its zeros exactly) rather than 0/0.
    scale_inv = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (wf / _expand(scale_inv, n, k, block)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale_inv


def dequantize_blockwise(q: torch.Tensor, scale_inv: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """The float32 weight of an fp8 [N, K] tensor and its per-block scale_inv."""
    if q.dim() != 2:
        raise ValueError(f"dequantize_blockwise: a 2-D weight is needed, got shape {list(q.shape)}")
    n, k = q.shape
    if tuple(scale_inv.shape) != scale_shape(n, k, block):
        raise ValueError(f"dequantize_blockwise: scale_inv of shape {list(scale_inv.shape)} for a weight of shape "
                         f"{[n, k]}, expected {list(scale_shape(n, k, block))} ({block}x{block} blocks)")
    return q.float() * _expand(scale_inv.float(), n, k, block)


# ---------------------------------------------------------------------------------------------
# The stacked layout the kernels read. The runtime fuses q|k|v and gate|up rows (``weights.py``),
# each part with its own 128-row scale blocks, so the fused tensor's scales are stored as one grid
# of ``scale_rows`` rows a scale row: 128 wherever every part is a multiple of 128 rows (every
# Qwen3 size), fewer only in small test shapes, whose 128-row blocks are then repeated. Any row r
# of a fused or single projection finds its scale at [r // scale_rows, k // 128].


def scale_rows(cfg) -> int:
    """Rows a scale row covers in the stacked grids of ``cfg``'s projections: the largest power of
    two that divides 128 and every fused part (q, k, v rows; gate, up rows)."""
    return math.gcd(BLOCK, cfg.q_size, cfg.kv_size, cfg.intermediate_size)


def grid_shape(n: int, k: int, rows: int) -> tuple[int, int]:
    """Shape of the stacked scale grid of an [n, k] projection at ``rows`` rows a scale row."""
    return (math.ceil(n / rows), math.ceil(k / BLOCK))


def to_grid(scale_inv: torch.Tensor, n: int, rows: int) -> torch.Tensor:
    """A part's [ceil(n/128), kb] scale_inv as ``rows``-row scale rows: [ceil(n/rows), kb]."""
    return scale_inv.float().repeat_interleave(BLOCK // rows, 0)[:math.ceil(n / rows)]


def from_grid(grid: torch.Tensor, n: int, rows: int) -> torch.Tensor:
    """The inverse of ``to_grid`` for a part whose rows start on a 128-row block: its scale_inv."""
    return grid[::BLOCK // rows][:math.ceil(n / BLOCK)].contiguous()


def dequantize_grid(q: torch.Tensor, grid: torch.Tensor, rows: int, dtype=torch.float32) -> torch.Tensor:
    """The weight of fp8 rows ``q`` [n, k] whose scales are ``grid`` at ``rows`` rows a scale row
    (the grid's first row covering q's first row), computed as the kernels do: fp8.float() * scale
    in float32, then ``dtype``."""
    n, k = q.shape
    s = grid.repeat_interleave(rows, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
    return (q.float() * s).to(dtype)


# ---------------------------------------------------------------------------------------------
# w8a8: the scheme Qwen's FP8 checkpoints declare ("activation_scheme": "dynamic"). Each token's
# input to a projection is quantized at run time to e4m3 per 128 columns, and e4m3 multiplies e4m3
# with both block scales applied per 128-column block (vLLM's W8A8BlockFp8LinearOp). The torch
# reference of the kernels' w8a8 tiles (instructions/wgmma.py).

ACT_EPS = 1e-10     # the smallest amax a block's scale is made from (vLLM's, for all-zero blocks)
ACTIVATION_SCHEMES = ("dynamic", "none")    # w8a8, or weight-only FP8 (--fp8-activations)


def quantize_activations(x: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] per ``block`` columns (the last block may be partial): (e4m3 [..., K], float32
    scales [..., ceil(K / block)]), scale = max(amax, 1e-10) / 448 and x ~ q * scale."""
    K = x.shape[-1]
    kb = math.ceil(K / block)
    g = torch.nn.functional.pad(x.float(), (0, kb * block - K)).unflatten(-1, (kb, block))
    scale = g.abs().amax(-1).clamp_min(ACT_EPS) / FP8_MAX
    q = (g / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.flatten(-2)[..., :K], scale


def w8a8_linear(x: torch.Tensor, q: torch.Tensor, grid: torch.Tensor, rows: int) -> torch.Tensor:
    """x [T, K] @ W^T for fp8 rows ``q`` [N, K] with scales ``grid`` (``rows`` rows a scale row), the
    w8a8 way: x quantized per 128 columns (``quantize_activations``), each 128-column block's e4m3
    product summed in float32 and scaled by its two scales. float32 [T, N]."""
    xq, sx = quantize_activations(x)
    N, K = q.shape
    sw = grid.float().repeat_interleave(rows, 0)[:N]          # [N, K / 128]
    out = torch.zeros(x.shape[0], N, dtype=torch.float32, device=x.device)
    for j in range(math.ceil(K / BLOCK)):
        c = slice(j * BLOCK, (j + 1) * BLOCK)
        out += (xq[:, c].float() @ q[:, c].float().T) * sx[:, j, None] * sw[None, :, j]
    return out
