"""What a new user trips on first (issue "First contact"): nothing substituted silently, every
argument checked before any work, one line for a mistake (exit 2) or Ctrl-C (exit 130), nothing
left in the cache after a failed or interrupted run, help on every flag, the command list."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from megakernel import load_model
from models.qwen3 import weights as weights_mod
from models.qwen3.weights import CheckpointError, cache_label

from test_bad_input import assert_cli_error, one_line

SHAPE = dict(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)


def files_under(folder) -> list:
    return sorted(str(p) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


# ---------------------------------------------------------------------------------------------
# Nothing substituted


@pytest.mark.parametrize("name, repo", [("0.6b", "Qwen/Qwen3-0.6B"), ("0.6B", "Qwen/Qwen3-0.6B"),
                                        ("Qwen/Qwen3-1.7B", "Qwen/Qwen3-1.7B")])
def test_model_neither_cached_nor_downloadable_is_an_error(cli, tmp_path, name, repo):
    proc = cli("-m", name, "-p", "The capital of France is")
    lines = assert_cli_error(proc, repo, f"hf download {repo}", "--random-weights")
    assert len(lines) == 1 and proc.stdout == ""
    assert files_under(tmp_path / "mkcache") == []          # no random checkpoint written unasked


def test_load_model_without_a_checkpoint_raises(monkeypatch, tmp_path):
    import huggingface_hub

    def absent(*args, **kwargs):
        raise OSError("not in the cache, and offline")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", absent)
    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    for kwargs in (dict(), dict(allow_download=False)):
        with pytest.raises(CheckpointError) as e:
            load_model("0.6b", device="cpu", **kwargs)
        msg = one_line(e.value)
        assert "Qwen/Qwen3-0.6B" in msg and "hf download" in msg and "random_weights=True" in msg, msg
    assert files_under(tmp_path) == []


def test_a_failed_download_quotes_its_cause_whole(monkeypatch, tmp_path):
    import huggingface_hub
    cause = ("An error happened while trying to locate the file on the Hub and we cannot find the appropriate "
             "snapshot folder for the specified revision on the local disk. Please check your internet "
             "connection and try again.")

    def absent(*args, **kwargs):
        raise OSError(cause)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", absent)
    monkeypatch.setattr(weights_mod, "_offline", lambda: False)
    with pytest.raises(CheckpointError) as e:
        load_model("0.6b", device="cpu")
    msg = one_line(e.value)
    assert f"(OSError: {cause})" in msg and msg.endswith("random_weights=True in load_model)"), msg


def test_demo_shape_needs_random_weights(cli):
    assert_cli_error(cli("-m", "tiny-random"), "'tiny-random' is a demo shape", "--random-weights")
    with pytest.raises(CheckpointError, match="random_weights=True"):
        load_model("tiny-random", device="cpu")
    model = load_model("tiny-random", random_weights=True, device="cpu", progress=False)
    assert model.random_weights and model.config.num_hidden_layers == 2


def test_alias_and_repo_id_share_one_cache_folder():
    assert cache_label("0.6b") == cache_label("0.6B") == cache_label("Qwen/Qwen3-0.6B") == \
        cache_label("qwen/qwen3-0.6b") == "Qwen--Qwen3-0.6B"
    assert cache_label("1.7b") == cache_label("Qwen/Qwen3-1.7B") != cache_label("0.6b")


# ---------------------------------------------------------------------------------------------
# The random-weights cache: whole or nothing


def _save_partially_then(exc):
    def save_file(sd, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"\0" * 4096)          # half a file on disk when the write is cut short
        raise exc
    return save_file


def test_interrupted_cache_write_leaves_nothing(monkeypatch, tmp_path):
    import safetensors.torch
    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(safetensors.torch, "save_file", _save_partially_then(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        load_model("tiny-random", random_weights=True, device="cpu", progress=False)
    assert files_under(tmp_path) == []


def test_failed_cache_write_leaves_nothing_and_still_loads(monkeypatch, tmp_path):
    import safetensors.torch
    want = load_model("tiny-random", random_weights=True, device="cpu", progress=False)   # the user's cache
    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(safetensors.torch, "save_file", _save_partially_then(OSError(28, "No space left on device")))
    got = load_model("tiny-random", random_weights=True, device="cpu", progress=False)
    assert files_under(tmp_path) == []
    for name, t in want.weights.tensors().items():
        assert torch.equal(t, getattr(got.weights, name)), name


def test_partial_cache_of_a_killed_process_is_cleared(monkeypatch, tmp_path):
    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    model = load_model("tiny-random", random_weights=True, device="cpu", progress=False)
    folder = next((tmp_path / "random").iterdir())
    stale = folder.with_name(f"{folder.name}.partial-{2 ** 30}")      # no process has this id
    stale.mkdir()
    (stale / "model.safetensors.tmp").write_bytes(b"\0" * 64)
    import shutil
    shutil.rmtree(folder)
    again = load_model("tiny-random", random_weights=True, device="cpu", progress=False)
    assert not stale.exists() and (folder / "model.safetensors").exists()
    assert torch.equal(model.weights.wqkv, again.weights.wqkv)


@pytest.mark.slow
def test_ctrl_c_while_making_random_weights(tmp_path):
    """A real SIGINT to ``generate`` while it makes 0.6b's random weights (tens of seconds): one
    line, status 130, and no partial file in the cache."""
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", MEGAKERNEL_CACHE=str(tmp_path / "mkcache"),
               PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "megakernel.generate", "-m", "0.6b", "--random-weights",
                             "-n", "2", "--device", "cpu"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line.rstrip("\n"))
        if line.startswith("Generating random weights") or not line:
            break
    assert lines[-1].startswith("Generating random weights"), lines
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    lines += err.splitlines()
    assert proc.returncode == 130, lines
    assert lines[-1] == "interrupted" and "Traceback" not in err, lines
    assert files_under(tmp_path / "mkcache") == []


REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------
# Ctrl-C in every CLI: one line, status 130


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def _assert_interrupted(code, capsys):
    assert code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "interrupted" and not any(line.startswith("error:") for line in err), err


def test_ctrl_c_in_generate(monkeypatch, capsys, tiny_checkpoint):
    from megakernel import generate, runtime
    monkeypatch.setattr(runtime.MegaQwen3, "generate", _interrupt)
    tiny = tiny_checkpoint(**SHAPE)
    _assert_interrupted(generate.main(["-m", str(tiny.folder), "--device", "cpu"]), capsys)


def test_ctrl_c_in_tape(monkeypatch, capsys):
    from megakernel import tape
    monkeypatch.setattr(tape, "summary", _interrupt)
    _assert_interrupted(tape.main(["-m", "0.6b"]), capsys)


def test_ctrl_c_in_compile_check(monkeypatch, capsys):
    from megakernel import compile_check
    monkeypatch.setattr(compile_check, "_rerun_compiled", _interrupt)   # under TRITON_INTERPRET
    monkeypatch.setattr(compile_check, "compile_all", _interrupt)       # without it
    _assert_interrupted(compile_check.main(["-m", "0.6b"]), capsys)


# ---------------------------------------------------------------------------------------------
# Arguments checked before any work


@pytest.mark.parametrize("args, fragments", [
    (["--max-seq-len", "0"], ["--max-seq-len", "at least 2"]),
    (["--max-new-tokens", "0"], ["--max-new-tokens", "at least 1"]),
    (["--top-k", "0"], ["--top-k", "at least 1"]),
    (["--temperature", "-1"], ["temperature", "-1"]),
    (["--temperature", "nan"], ["--temperature", "'nan'"]),
    (["--dtype", "int8"], ["--dtype", "'int8'"]),
    (["--prompt-ids", "1 2 abc"], ["--prompt-ids", "'1 2 abc'"]),
    (["--prompt-ids", "1 -2"], ["--prompt-ids", "negative"]),
    (["--prompt", "hi", "--prompt-ids", "1 2"], ["--prompt-ids", "not both"]),
    (["--prompt-ids", "1 2", "--chat"], ["--chat", "--prompt-ids"]),
    (["--prompts-file", "/no/such/prompts.txt"], ["--prompts-file", "/no/such/prompts.txt"]),
    (["--backend", "megakernel", "--dtype", "bfloat16", "--device", "cpu"], ["--dtype float32"]),
])
def test_bad_arguments_fail_before_loading(cli, args, fragments):
    lines = assert_cli_error(cli("-m", "0.6b", "--random-weights", *args), *fragments)
    assert len(lines) == 1, lines


def test_token_id_outside_the_vocabulary_fails_before_loading(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(**SHAPE)
    lines = assert_cli_error(cli("-m", tiny.folder, "--random-weights", "--prompt-ids", "1 320", "--device", "cpu"),
                             "token id 320", "[0, 320)")
    assert len(lines) == 1, lines


def test_empty_prompts_file(cli, tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n  \n")
    assert_cli_error(cli("-m", "0.6b", "--random-weights", "--prompts-file", path), "no prompts")


def test_not_enough_host_memory_is_one_line_before_allocating(monkeypatch, capsys):
    """8b in float32 on a CPU with 2 GiB free: the needed and the available memory, no allocation."""
    from megakernel import generate
    monkeypatch.setattr(weights_mod, "available_host_memory", lambda: 2 * 1024 ** 3)
    with pytest.raises(MemoryError) as e:
        load_model("8b", random_weights=True, device="cpu")
    msg = one_line(e.value)
    assert "needs 30.5 GiB of host memory" in msg and "2.0 GiB is available" in msg, msg
    assert generate.main(["-m", "8b", "--random-weights", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "GiB of host memory" in err[-1], err
    assert not any(line.startswith("Loaded") for line in err), err


def test_compile_check_bad_model_and_fields(capsys):
    from megakernel import compile_check
    assert compile_check.main(["-m", "3.3b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown model '3.3b'"), err
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(DEVICE="cuda", PYTHONPATH=str(REPO))
    for args, fragment in ((["--set", "NOPE=1"], "not a tile-plan field"), (["--option", "spin=x"], "NAME=INTEGER"),
                           (["--workers", "0"], "at least 1")):
        r = subprocess.run([sys.executable, "-m", "megakernel.compile_check", *args], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and fragment in lines[0], (args, r.stderr)


# ---------------------------------------------------------------------------------------------
# Flags: help and defaults everywhere, short forms, the command list


def _parsers():
    from megakernel import compile_check, generate, tape
    return {"generate": generate.build_parser(), "tape": tape.build_parser(),
            "compile_check": compile_check.build_parser()}


@pytest.mark.parametrize("name", ["generate", "tape", "compile_check"])
def test_every_flag_has_help_and_its_default(name):
    parser = _parsers()[name]
    text = parser.format_help()
    assert "``" not in text and "-m MODEL, --model MODEL" in text
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        assert action.help, f"{name} {action.option_strings} has no help"
        if not (action.default is None or action.default is False or action.default == []):
            shown = parser._get_formatter()._get_help_string(action) % vars(action)
            assert f"default: {action.default}" in shown or "default:" in action.help, \
                f"{name} {action.option_strings}: no default shown"


def test_generate_short_forms():
    args = _parsers()["generate"].parse_args(["-m", "1.7b", "-p", "hi", "-p", "there", "-n", "5",
                                              "--dtype", "bfloat16"])
    assert (args.model, args.prompt, args.max_new_tokens, args.dtype) == ("1.7b", ["hi", "there"], 5, "bfloat16")


def test_python_dash_m_megakernel_lists_and_runs_the_commands(cli):
    listing = cli(module="megakernel")
    assert listing.returncode == 0, listing.stderr
    for command in ("generate", "bench", "tape", "compile_check"):
        assert f"\n  {command} " in listing.stdout, listing.stdout
    run = cli("tape", "-m", "tiny-random", "--workers", "2", module="megakernel")
    assert run.returncode == 0 and "valid:" in run.stdout, run.stderr
    assert_cli_error(cli("frobnicate", module="megakernel"), "unknown command 'frobnicate'")
