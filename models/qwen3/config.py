"""Qwen3 dense model configuration, with Hugging Face's own field names.

Shapes are always read from a checkpoint's ``config.json``; the presets below exist so that
``--random-weights`` can build a model of the true published shapes without a download. Never
derive ``head_dim`` from ``hidden_size // num_attention_heads``: Qwen3-0.6B has 16 heads of 128
(2048) over a hidden size of 1024.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Qwen3Config:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 128
    vocab_size: int = 151936
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 40960
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self):
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"config: {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"config: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"config: head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (GQA group)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def qkv_size(self) -> int:
        return self.q_size + 2 * self.kv_size

    @property
    def eos_token_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return [self.eos_token_id] if isinstance(self.eos_token_id, int) else list(self.eos_token_id)

    @property
    def layer_matrix_params(self) -> int:
        """Parameters of one layer's projections: QKV, O, gate, up and down (no norms)."""
        return self.hidden_size * (self.qkv_size + self.q_size + 3 * self.intermediate_size)

    def num_parameters(self) -> int:
        """Parameter count, a tied LM head counted once."""
        h, d = self.hidden_size, self.head_dim
        per_layer = self.layer_matrix_params + 2 * h + 2 * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + head + h + self.num_hidden_layers * per_layer

    def kv_bytes_per_position(self, itemsize: int) -> int:
        """Bytes of K and V cache one position adds, over all layers, for one sequence."""
        return 2 * self.num_hidden_layers * self.kv_size * itemsize

    @classmethod
    def from_dict(cls, d: dict) -> "Qwen3Config":
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        # transformers 5 writes RoPE settings as rope_parameters; 4.x as rope_theta + rope_scaling.
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
            raise ValueError(f"config: RoPE scaling {rope.get('rope_type', rope.get('type'))!r} is not supported")
        if "rope_theta" in rope:
            kwargs["rope_theta"] = rope["rope_theta"]
        if kwargs.get("head_dim") is None and "hidden_size" in d and "num_attention_heads" in d:
            # Older Qwen-style configs without head_dim: HF's fallback.
            kwargs["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.name not in kwargs]
        if missing:
            raise ValueError(f"config: missing fields {', '.join(missing)}")
        if d.get("model_type") not in (None, "qwen3"):
            raise ValueError(f"config: model_type {d.get('model_type')!r} is not 'qwen3'")
        return cls(**kwargs)

    @classmethod
    def from_json(cls, path: str | Path) -> "Qwen3Config":
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no config.json") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(d, dict):
            raise ValueError(f"{path}: not a JSON object")
        try:
            return cls.from_dict(d)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_act="silu",
                 attention_bias=False, torch_dtype="bfloat16")
        return d


def _preset(hidden, inter, layers, heads, kv, tie):
    return Qwen3Config(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv, head_dim=128,
                       vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
                       tie_word_embeddings=tie, max_position_embeddings=40960,
                       bos_token_id=151643, eos_token_id=151645)


# Published shapes of the dense Qwen3 family (the config.json of each Qwen/Qwen3-<size> repo).
PRESETS: dict[str, Qwen3Config] = {
    "0.6b": _preset(1024, 3072, 28, 16, 8, True),
    "1.7b": _preset(2048, 6144, 28, 16, 8, True),
    "4b": _preset(2560, 9728, 36, 32, 8, True),
    "8b": _preset(4096, 12288, 36, 32, 8, False),
    "14b": _preset(5120, 17408, 40, 40, 8, False),
    "32b": _preset(5120, 25600, 64, 64, 8, False),
}

REPO_IDS: dict[str, str] = {size: f"Qwen/Qwen3-{size.upper()}" for size in PRESETS}

# A demo shape for examples and smoke runs on the CPU (a step through Triton's interpreter takes
# about a second). No checkpoint of it exists: it only ever runs with random weights.
DEMO_PRESETS: dict[str, Qwen3Config] = {
    "tiny-random": Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=16, vocab_size=1024, tie_word_embeddings=True,
                               max_position_embeddings=4096),
}


def size_key(name: str) -> str | None:
    """The preset key of a model name: ``0.6b``, ``0.6B`` and ``Qwen/Qwen3-0.6B`` all give
    ``0.6b``; ``tiny-random`` gives itself; any other name gives None."""
    key = str(name).strip().lower()
    if key in PRESETS or key in DEMO_PRESETS:
        return key
    return next((size for size, repo in REPO_IDS.items() if repo.lower() == key), None)
