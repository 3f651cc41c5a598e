"""Text <-> token ids through a checkpoint's ``tokenizer.json`` (the ``tokenizers`` library), the
Qwen3 chat template for one user message, and the ids that end a generation.

The chat template is written out rather than rendered from the checkpoint's Jinja template so that
no template engine is needed: for a single user message with ``add_generation_prompt=True``,
Qwen3's template gives exactly ``<|im_start|>user\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``.
The special tokens are looked up by name, never left to the text tokenizer to split out.
"""

from __future__ import annotations

import json
from pathlib import Path

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


class Tokenizer:
    def __init__(self, path: Path):
        from tokenizers import Tokenizer as _Tok
        self.path = Path(path)
        try:
            self._tok = _Tok.from_file(str(path))
        except Exception as e:  # the library raises a bare Exception on a damaged file
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(f"{path}: cannot read tokenizer ({why})") from None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def encode_chat(self, text: str) -> list[int]:
        """Ids of one user message followed by the assistant's turn, as Qwen3's chat template
        renders it: ``<|im_start|>user\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``."""
        start, end = self.token_id(IM_START), self.token_id(IM_END)
        if start is None or end is None:
            raise ValueError(f"{self.path}: no {IM_START} / {IM_END} tokens, so --chat cannot be used "
                             f"with this tokenizer")
        return ([start] + self.encode(f"user\n{text}") + [end] + self.encode("\n")
                + [start] + self.encode("assistant\n"))


def chat_text(text: str) -> str:
    """The chat prompt as text (what ``encode_chat`` encodes)."""
    return f"{IM_START}user\n{text}{IM_END}\n{IM_START}assistant\n"


def load_tokenizer(folder: str | Path | None) -> Tokenizer | None:
    """The folder's tokenizer, or None where it has no tokenizer.json."""
    if folder is None:
        return None
    path = Path(folder) / "tokenizer.json"
    return Tokenizer(path) if path.exists() else None


def stop_token_ids(folder: str | Path | None, config) -> list[int]:
    """Token ids that end a generation: ``eos_token_id`` of the folder's generation_config.json
    (Qwen3 lists both ``<|im_end|>`` and ``<|endoftext|>`` there) together with config.json's."""
    ids = list(config.eos_token_ids)
    if folder is not None:
        path = Path(folder) / "generation_config.json"
        if path.exists():
            try:
                eos = json.loads(path.read_text()).get("eos_token_id")
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
            ids += [eos] if isinstance(eos, int) else list(eos or [])
    return sorted(set(ids))
