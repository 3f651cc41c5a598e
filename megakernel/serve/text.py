"""Prompts to token ids and token ids back to text, for the server.

Chat prompts are rendered by transformers' ``apply_chat_template`` from the checkpoint's own Jinja
template, so a system prompt, several turns and template switches such as Qwen3's
``enable_thinking`` come out exactly as transformers (and vLLM) render them. A model without a
tokenizer (random weights) is served on token ids alone: prompts are lists of ids and the output
text is its ids separated by spaces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable


class PromptError(ValueError):
    """The request's prompt cannot be turned into token ids (answered with a 400)."""


class TextCodec:
    """A checkpoint's tokenizer (transformers), or none: then prompts and outputs are token ids."""

    def __init__(self, tokenizer, vocab_size: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size

    @staticmethod
    def load(folder: str | Path | None, vocab_size: int) -> "TextCodec":
        """The folder's tokenizer where it has a ``tokenizer.json``, else an ids-only codec."""
        if folder is None or not (Path(folder) / "tokenizer.json").exists():
            return TextCodec(None, vocab_size)
        from transformers import AutoTokenizer
        try:
            tok = AutoTokenizer.from_pretrained(str(folder))
        except Exception as e:   # transformers raises many kinds for a damaged folder
            why = " ".join(str(e).split()) or type(e).__name__
            raise ValueError(f"{folder}: cannot load the tokenizer ({why})") from None
        return TextCodec(tok, vocab_size)

    @property
    def has_text(self) -> bool:
        return self.tokenizer is not None

    @property
    def has_chat_template(self) -> bool:
        return self.tokenizer is not None and bool(getattr(self.tokenizer, "chat_template", None))

    def check_ids(self, ids: list[int]) -> list[int]:
        if not ids:
            raise PromptError("the prompt is empty")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise PromptError(f"the prompt has token id {bad[0]}, outside the vocabulary [0, {self.vocab_size})")
        return ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.tokenizer is None:
            raise PromptError("this model has no tokenizer (random weights, or no tokenizer.json in the "
                              "checkpoint): send the prompt as a list of token ids")
        return self.check_ids(list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens)))

    def render_chat(self, messages: list[dict], template_kwargs: dict | None = None,
                    add_generation_prompt: bool = True) -> str:
        """The conversation as the checkpoint's chat template renders it (text, not ids)."""
        if self.tokenizer is None:
            raise PromptError("chat completions need a tokenizer and a chat template; this model has no "
                              "tokenizer (random weights?): use /v1/completions with token ids")
        if not self.has_chat_template:
            raise PromptError("this model's tokenizer has no chat template: use /v1/completions")
        kwargs = dict(template_kwargs or {})
        for reserved in ("conversation", "messages", "tokenize", "add_generation_prompt", "return_dict"):
            if reserved in kwargs:
                raise PromptError(f"chat_template_kwargs may not set {reserved!r}")
        from jinja2 import TemplateError
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt, **kwargs)
        except TemplateError as e:
            raise PromptError(f"the chat template rejected the messages: {e}") from None

    def chat_ids(self, messages: list[dict], template_kwargs: dict | None = None,
                 add_generation_prompt: bool = True) -> list[int]:
        # the template writes the special tokens itself, so none are added again (as vLLM does)
        return self.encode(self.render_chat(messages, template_kwargs, add_generation_prompt),
                           add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class Detokenizer:
    """Turns a growing list of token ids into pieces of text whose concatenation is the decoded
    text, holding a piece back while it ends in an incomplete UTF-8 character (a byte-level token
    can carry half of one), so that streamed text equals the text decoded at once.

    Each step decodes only a short window: the ids since the last piece went out plus the few
    before them, which give the decoder its context (spaces between words, say). The piece is
    what the new ids add to the window's earlier text (the method of text-generation-inference
    and vLLM)."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self.prefix = 0      # the window starts here
        self.read = 0        # ids before this have been given out as text

    def add(self, token: int) -> str:
        self.ids.append(token)
        return self._piece(final=False)

    def flush(self) -> str:
        """Whatever is held back (at the end of a sequence), replacement characters included."""
        return self._piece(final=True)

    def _piece(self, final: bool) -> str:
        before = self.decode(self.ids[self.prefix:self.read])
        text = self.decode(self.ids[self.prefix:])
        if len(text) > len(before) and (final or not text.endswith("\ufffd")):
            self.prefix, self.read = self.read, len(self.ids)
            return text[len(before):]
        return ""
