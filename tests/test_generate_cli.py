"""``python -m megakernel.generate`` end to end on tiny checkpoints, in a subprocess."""

from __future__ import annotations

import json
import re

import pytest
import torch

from megakernel import MegaQwen3, load_model
from megakernel.generate import default_backend
from models.qwen3.tokenizer import load_tokenizer

SHAPE = dict(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)
DECODE_LINE = re.compile(r"^Decode: (\d+) tokens, [\d.]+ ms/token, [\d.]+ tok/s")


def greedy(folder, ids, n, stops=()):
    """The reference's greedy continuation of one prompt, cut before its first stop token."""
    mk = MegaQwen3(load_model(str(folder), device="cpu", progress=False), backend="reference",
                   max_seq_len=len(ids) + n)
    out = mk.generate([ids], max_new_tokens=n, stop_tokens=stops)[0].tolist()
    return out[:next((i for i, t in enumerate(out) if t in stops), len(out))]


def ok(proc):
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def json_lines(proc) -> list[dict]:
    """--json output: every stdout line is one JSON object; the last is the summary."""
    return [json.loads(line) for line in proc.stdout.strip().splitlines()]


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
    assert re.search(r"^Time to first token: [\d.]+ ms \(prefill of 5 prompt tokens\)", proc.stderr, re.M), \
        proc.stderr
    assert "Backend reference" in proc.stderr


def test_short_flags_are_the_long_ones(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(tokenizer=True, **SHAPE)
    long = ok(cli("--model", tiny.folder, "--prompt", "the dog", "--max-new-tokens", 5, "--device", "cpu"))
    short = ok(cli("-m", tiny.folder, "-p", "the dog", "-n", 5, "--device", "cpu"))
    assert short.stdout == long.stdout and short.stdout.startswith("the dog")


def test_json_lines(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(tokenizer=True, **SHAPE)
    proc = ok(cli("--model", tiny.folder, "--prompt", "a dog and a", "--max-new-tokens", 6, "--json",
                  "--device", "cpu"))
    *seqs, summary = json_lines(proc)
    tok = load_tokenizer(tiny.folder)
    ids = tok.encode("a dog and a")
    assert len(seqs) == 1 and summary["sequences"] == seqs
    seq = seqs[0]
    assert seq["tokens"] == greedy(tiny.folder, ids, 6)
    assert seq["text"] == tok.decode(ids + seq["tokens"])[len(tok.decode(ids)):]
    assert seq["index"] == 0 and seq["prompt_tokens"] == len(ids) and seq["finish_reason"] == "length"
    assert summary["backend"] == "reference" and summary["device"] == "cpu" and summary["batch_size"] == 1
    assert summary["model"] == str(tiny.folder) and summary["max_seq_len"] == len(ids) + 6
    assert summary["ms_per_token"] > 0 and summary["tokens_per_s"] > 0 and summary["ttft_ms"] > 0
    assert summary["random_weights"] is False
    m = re.search(r"^Time to first token: ([\d.]+) ms", proc.stderr, re.M)
    assert m and float(m.group(1)) == pytest.approx(summary["ttft_ms"], abs=0.051), proc.stderr


def test_chat_template(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(tokenizer=True, **SHAPE)
    proc = ok(cli("--model", tiny.folder, "--prompt", "what is the capital of france", "--chat",
                  "--max-new-tokens", 4, "--json", "--device", "cpu"))
    seq = json_lines(proc)[-1]["sequences"][0]
    tok = load_tokenizer(tiny.folder)
    ids = tok.encode_chat("what is the capital of france")
    assert seq["prompt_tokens"] == len(ids)
    assert seq["tokens"] == greedy(tiny.folder, ids, 4)
    plain = ok(cli("--model", tiny.folder, "--prompt", "what is the capital of france", "--chat",
                   "--max-new-tokens", 4, "--device", "cpu"))
    assert "<|im_start|>" not in plain.stdout      # the template is not echoed
    assert plain.stdout.rstrip("\n") == seq["text"]


def test_stops_at_generation_config_eos(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(tokenizer=True, **SHAPE)
    ids = load_tokenizer(tiny.folder).encode("the sun and the moon")
    free = greedy(tiny.folder, ids, 6)
    stop = free[2]
    (tiny.folder / "generation_config.json").write_text(json.dumps({"eos_token_id": stop}))
    proc = ok(cli("--model", tiny.folder, "--prompt", "the sun and the moon", "--max-new-tokens", 6, "--json",
                  "--device", "cpu"))
    seq = json_lines(proc)[-1]["sequences"][0]
    assert seq["tokens"] == free[:free.index(stop)] and seq["finish_reason"] == "stop"


def test_random_weights_take_and_print_token_ids(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(**SHAPE)
    args = ("--model", tiny.folder, "--random-weights", "--prompt-ids", "5 17 42", "--max-new-tokens", 5,
            "--device", "cpu")
    proc = ok(cli(*args, "--json"))
    assert "random weights" in proc.stderr
    summary = json_lines(proc)[-1]
    seq = summary["sequences"][0]
    assert summary["random_weights"] is True and seq["text"] is None
    assert seq["prompt_tokens"] == 3 and len(seq["tokens"]) == 5
    assert all(0 <= t < tiny.vocab_size for t in seq["tokens"])
    assert DECODE_LINE.match(proc.stderr.strip().splitlines()[-1]), proc.stderr
    plain = ok(cli(*args[:4], "5,17,42", *args[5:]))      # commas separate ids too
    assert [int(t) for t in plain.stdout.split()] == seq["tokens"]


@pytest.mark.parametrize("prompt", ["hello there", "1,2,3", "1 2 abc"])
def test_text_prompt_without_a_tokenizer_is_an_error(cli, tiny_checkpoint, prompt):
    """Text is never read as ids (nor replaced by a default) where the model has no tokenizer."""
    from test_bad_input import assert_cli_error
    tiny = tiny_checkpoint(**SHAPE)
    lines = assert_cli_error(cli("--model", tiny.folder, "--random-weights", "--prompt", prompt, "--device", "cpu"),
                             "no tokenizer", "--prompt-ids")
    assert not any(line.startswith("Loaded") for line in lines), lines


def test_seeded_sampling_is_reproducible(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(tokenizer=True, **SHAPE)
    args = ["--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--seed", "7"]
    runs = [json_lines(ok(cli("--model", tiny.folder, "--prompt", "the dog", "--max-new-tokens", 6, "--json",
                              "--device", "cpu", *args)))[-1]["sequences"][0]["tokens"] for _ in range(2)]
    assert runs[0] == runs[1]


def test_sampling_flags_at_temperature_0_warn(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(tokenizer=True, **SHAPE)
    proc = ok(cli("--model", tiny.folder, "--prompt", "the dog", "-n", 3, "--top-k", 5, "--top-p", 0.5,
                  "--device", "cpu"))
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "--top-k, --top-p" in warnings[0] and "--temperature 0" in warnings[0], warnings


def test_kernel_backend_gives_the_reference_tokens(cli, tiny_checkpoint):
    """The CLI's --backend reaches the kernel backends (Triton's interpreter on the CPU)."""
    tiny = tiny_checkpoint(tokenizer=True, **SHAPE)
    runs = {b: json_lines(ok(cli("--model", tiny.folder, "--prompt", "the cat", "--max-new-tokens", 4, "--json",
                                 "--backend", b, "--device", "cpu")))[-1]
            for b in ("reference", "megakernel")}
    assert runs["megakernel"]["backend"] == "megakernel"
    assert runs["megakernel"]["sequences"] == runs["reference"]["sequences"]


# ---------------------------------------------------------------------------------------------
# Several prompts: a batch


PROMPTS = ["the cat is in the", "a dog", "the sun and the moon and the"]


def test_batch_of_prompts_labelled_lines(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(tokenizer=True, **SHAPE)
    args = [a for p in PROMPTS for a in ("--prompt", p)]
    proc = ok(cli("--model", tiny.folder, *args, "--max-new-tokens", 5, "--device", "cpu"))
    tok = load_tokenizer(tiny.folder)
    lines = proc.stdout.splitlines()
    assert all(re.match(r"^\[[012]\] ", line) for line in lines), lines
    for i, p in enumerate(PROMPTS):
        text = tok.decode(tok.encode(p) + greedy(tiny.folder, tok.encode(p), 5))
        *whole, rest = text.split("\n")       # each line of a sequence's text labelled, in order
        expected = whole + ([rest.rstrip(" ")] if rest.rstrip(" ") or not whole else [])
        assert [line[4:] for line in lines if line.startswith(f"[{i}] ")] == expected
    assert "prompt 3 prompts of 2-7 tokens" in proc.stderr
    assert re.search(r"^Decode: 3 steps of 3 sequences, [\d.]+ ms/token per sequence, [\d.]+ tok/s in all$",
                     proc.stderr, re.M), proc.stderr


def test_batch_from_a_prompts_file_equals_repeated_prompt(cli, tiny_checkpoint, tmp_path):
    tiny = tiny_checkpoint(tokenizer=True, **SHAPE)
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS[:2]) + "\n\n")      # blank lines are skipped
    from_file = json_lines(ok(cli("--model", tiny.folder, "--prompts-file", path, "-n", 4, "--json",
                                  "--device", "cpu")))[-1]
    repeated = json_lines(ok(cli("--model", tiny.folder, "-p", PROMPTS[0], "-p", PROMPTS[1], "-n", 4, "--json",
                                 "--device", "cpu")))[-1]
    assert from_file["batch_size"] == 2 and from_file["sequences"] == repeated["sequences"]


def test_batch_sequence_stops_at_eos_while_the_others_go_on(cli, tiny_checkpoint):
    """One sequence reaches its end-of-sequence token early; it stops (its JSON line comes first)
    and the others generate all their tokens, the same as each alone."""
    tiny = tiny_checkpoint(tokenizer=True, **SHAPE)
    tok = load_tokenizer(tiny.folder)
    ids = [tok.encode(p) for p in PROMPTS]
    free = [greedy(tiny.folder, p, 6) for p in ids]
    # a token that one sequence makes early and the others never make: that one alone stops on it
    i, stop = next(((i, t) for i in range(3) for t in free[i][:4] if all(t not in f for j, f in enumerate(free)
                                                                           if j != i)), (None, None))
    assert stop is not None, f"every early token of each sequence is made by another too: {free}"
    (tiny.folder / "generation_config.json").write_text(json.dumps({"eos_token_id": stop}))
    proc = ok(cli("--model", tiny.folder, *[a for p in PROMPTS for a in ("-p", p)], "-n", 6, "--json",
                  "--device", "cpu"))
    *seqs, summary = json_lines(proc)
    assert seqs[0]["index"] == i and seqs[0]["finish_reason"] == "stop"      # it finished first
    assert seqs[0]["tokens"] == free[i][:free[i].index(stop)]
    by_index = {s["index"]: s for s in seqs}
    assert sorted(by_index) == [0, 1, 2] and summary["sequences"] == [by_index[j] for j in range(3)]
    for j in {0, 1, 2} - {i}:
        assert by_index[j]["tokens"] == free[j] and by_index[j]["finish_reason"] == "length"


def test_prompt_ids_repeated_make_a_batch(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(**SHAPE)
    proc = ok(cli("--model", tiny.folder, "--random-weights", "--prompt-ids", "5 17 42", "--prompt-ids", "9,8",
                  "-n", 4, "--device", "cpu"))
    lines = proc.stdout.splitlines()
    assert sorted(line.split()[0] for line in lines) == ["[0]", "[1]"], lines
    for line in lines:
        assert len(line.split()) == 5 and all(0 <= int(t) < tiny.vocab_size for t in line.split()[1:])
