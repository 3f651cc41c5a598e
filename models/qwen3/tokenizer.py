"""Text <-> token ids through a checkpoint's ``tokenizer.json`` (the ``tokenizers`` library)."""

from __future__ import annotations

from pathlib import Path


class Tokenizer:
    def __init__(self, path: Path):
        from tokenizers import Tokenizer as _Tok
        self.path = path
        self._tok = _Tok.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)


def load_tokenizer(folder: str | Path | None) -> Tokenizer | None:
    """The folder's tokenizer, or None where it has no tokenizer.json."""
    if folder is None:
        return None
    path = Path(folder) / "tokenizer.json"
    return Tokenizer(path) if path.exists() else None
