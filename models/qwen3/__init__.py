"""Qwen3 dense models: configuration, checkpoints, tokenizer and the torch reference."""

from .config import PRESETS, REPO_IDS, Qwen3Config
from .reference import KVCache, Qwen3Reference
from .sampling import SamplingParams, sample
from .weights import CheckpointError, Qwen3Weights

__all__ = ["PRESETS", "REPO_IDS", "Qwen3Config", "KVCache", "Qwen3Reference", "SamplingParams", "sample",
           "CheckpointError", "Qwen3Weights"]
