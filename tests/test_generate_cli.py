"""``python -m megakernel.generate`` end to end on tiny checkpoints, in a subprocess."""

from __future__ import annotations

import json
import re

import torch

from megakernel import MegaQwen3, load_model
from megakernel.generate import default_backend
from models.qwen3.tokenizer import load_tokenizer

SHAPE = dict(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)
DECODE_LINE = re.compile(r"^Decode: (\d+) tokens, [\d.]+ ms/token, [\d.]+ tok/s")


def greedy(folder, ids, n, stops=()):
    mk = MegaQwen3(load_model(str(folder), device="cpu", progress=False), backend="reference",
                   max_seq_len=len(ids) + n)
    out = mk.generate([ids], max_new_tokens=n, stop_tokens=stops)[0].tolist()
    return out[:next((i for i, t in enumerate(out) if t in stops), len(out))]


def ok(proc):
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def test_default_backend():
    assert default_backend(torch.device("cpu")) == "reference"
    assert default_backend(torch.device("cuda")) == "megakernel"


def test_streams_text_and_speed(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(tokenizer=True, **SHAPE)
    prompt = "the cat is in the"
    proc = ok(cli("--model", tiny.folder, "--prompt", prompt, "--max-new-tokens", 8, "--device", "cpu"))
    tok = load_tokenizer(tiny.folder)
    ids = tok.encode(prompt)
    expected = tok.decode(ids + greedy(tiny.folder, ids, 8))
    assert proc.stdout.rstrip("\n") == expected
    assert proc.stdout.startswith(prompt)
    last = proc.stderr.strip().splitlines()[-1]
    m = DECODE_LINE.match(last)
    assert m and int(m.group(1)) == 6, proc.stderr   # 8 tokens: prefill, first step, 6 timed
    assert re.search(r"^First decode step: [\d.]+ ms", proc.stderr, re.M), proc.stderr
    assert re.search(r"^Prefill: 5 tokens in [\d.]+ ms", proc.stderr, re.M), proc.stderr
    assert "Backend reference" in proc.stderr


def test_json_summary(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(tokenizer=True, **SHAPE)
    proc = ok(cli("--model", tiny.folder, "--prompt", "a dog and a", "--max-new-tokens", 6, "--json",
                  "--device", "cpu"))
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    tok = load_tokenizer(tiny.folder)
    ids = tok.encode("a dog and a")
    assert summary["tokens"] == greedy(tiny.folder, ids, 6)
    assert summary["text"] == tok.decode(ids + summary["tokens"])[len(tok.decode(ids)):]
    assert summary["backend"] == "reference" and summary["device"] == "cpu"
    assert summary["model"] == str(tiny.folder) and summary["prompt_tokens"] == len(ids)
    assert summary["ms_per_token"] > 0 and summary["tokens_per_s"] > 0
    assert summary["random_weights"] is False


def test_chat_template(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(tokenizer=True, **SHAPE)
    proc = ok(cli("--model", tiny.folder, "--prompt", "what is the capital of france", "--chat",
                  "--max-new-tokens", 4, "--json", "--device", "cpu"))
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    tok = load_tokenizer(tiny.folder)
    ids = tok.encode_chat("what is the capital of france")
    assert summary["prompt_tokens"] == len(ids)
    assert summary["tokens"] == greedy(tiny.folder, ids, 4)
    assert "<|im_start|>" not in proc.stdout      # the template is not echoed


def test_stops_at_generation_config_eos(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(tokenizer=True, **SHAPE)
    ids = load_tokenizer(tiny.folder).encode("the sun and the moon")
    free = greedy(tiny.folder, ids, 6)
    stop = free[2]
    (tiny.folder / "generation_config.json").write_text(json.dumps({"eos_token_id": stop}))
    proc = ok(cli("--model", tiny.folder, "--prompt", "the sun and the moon", "--max-new-tokens", 6, "--json",
                  "--device", "cpu"))
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["tokens"] == free[:free.index(stop)]


def test_random_weights_prints_token_ids(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(**SHAPE)
    proc = ok(cli("--model", tiny.folder, "--random-weights", "--prompt", "5 17 42", "--max-new-tokens", 5,
                  "--json", "--device", "cpu"))
    assert "random weights" in proc.stderr and "token ids" in proc.stderr
    lines = proc.stdout.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["random_weights"] is True and summary["text"] is None
    assert summary["prompt_tokens"] == 3 and len(summary["tokens"]) == 5
    assert [int(t) for t in lines[0].split()] == summary["tokens"]
    assert all(0 <= t < tiny.vocab_size for t in summary["tokens"])
    assert DECODE_LINE.match(proc.stderr.strip().splitlines()[-1]), proc.stderr


def test_random_weights_text_prompt_falls_back_to_default_ids(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(**SHAPE)
    proc = ok(cli("--model", tiny.folder, "--random-weights", "--prompt", "hello there", "--max-new-tokens", 2,
                  "--device", "cpu"))
    assert "not a list of token ids" in proc.stderr
    assert len(proc.stdout.split()) == 2


def test_seeded_sampling_is_reproducible(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(tokenizer=True, **SHAPE)
    args = ["--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--seed", "7"]
    runs = [json.loads(ok(cli("--model", tiny.folder, "--prompt", "the dog", "--max-new-tokens", 6, "--json",
                              "--device", "cpu", *args)).stdout.strip().splitlines()[-1])["tokens"]
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_kernel_backend_gives_the_reference_tokens(cli, tiny_checkpoint):
    """The CLI's --backend reaches the kernel backends (Triton's interpreter on the CPU)."""
    tiny = tiny_checkpoint(tokenizer=True, **SHAPE)
    runs = {b: json.loads(ok(cli("--model", tiny.folder, "--prompt", "the cat", "--max-new-tokens", 4, "--json",
                                 "--backend", b, "--device", "cpu")).stdout.strip().splitlines()[-1])
            for b in ("reference", "megakernel")}
    assert runs["megakernel"]["backend"] == "megakernel"
    assert runs["megakernel"]["tokens"] == runs["reference"]["tokens"]
