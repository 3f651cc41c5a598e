"""Tokenizer loading, Qwen3's chat template and stop tokens."""

from __future__ import annotations

import json

import pytest

from models.qwen3.config import PRESETS
from models.qwen3.tokenizer import chat_text, load_tokenizer, stop_token_ids

SHAPE = dict(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)


def test_no_tokenizer_json(tmp_path):
    assert load_tokenizer(None) is None and load_tokenizer(tmp_path) is None


def test_damaged_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(ValueError) as e:
        load_tokenizer(tmp_path)
    assert "tokenizer.json" in str(e.value) and "\n" not in str(e.value)


def test_chat_template(tiny_checkpoint):
    tok = load_tokenizer(tiny_checkpoint(tokenizer=True, **SHAPE).folder)
    start, end = tok.token_id("<|im_start|>"), tok.token_id("<|im_end|>")
    ids = tok.encode_chat("the cat is big")
    assert ids == ([start] + tok.encode("user\nthe cat is big") + [end] + tok.encode("\n") + [start]
                   + tok.encode("assistant\n"))
    assert ids == tok.encode(chat_text("the cat is big"))   # the special tokens are split out as HF does
    assert chat_text("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_needs_the_special_tokens(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "hi": 1}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match="<|im_start|>"):
        load_tokenizer(tmp_path).encode_chat("hi")


def test_stop_token_ids(tmp_path):
    cfg = PRESETS["0.6b"]
    assert stop_token_ids(None, cfg) == [151645]
    assert stop_token_ids(tmp_path, cfg) == [151645]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    assert stop_token_ids(tmp_path, cfg) == [151643, 151645]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert stop_token_ids(tmp_path, cfg) == [7, 151645]
    (tmp_path / "generation_config.json").write_text("{")
    with pytest.raises(ValueError, match="generation_config.json"):
        stop_token_ids(tmp_path, cfg)
