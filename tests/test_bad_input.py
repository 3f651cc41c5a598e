"""Bad input gets one clear line naming the file or value: as an exception from the API, and from
the CLI as ``error: ...`` on stderr with exit status 2 and no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from megakernel import MegaQwen3, load_model
from models.qwen3.weights import CheckpointError

SHAPE = dict(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)


def _truncate(folder: Path):
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return "model.safetensors", "truncated"


def _truncate_to_nothing(folder: Path):
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[:5])
    return "model.safetensors", "truncated"


def _corrupt_header(folder: Path):
    f = folder / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:40] = b"\xff" * 32
    f.write_bytes(bytes(data))
    return "model.safetensors", "corrupt safetensors header"


def _oversized_header(folder: Path):
    f = folder / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[:8] = (1 << 40).to_bytes(8, "little")
    f.write_bytes(bytes(data))
    return "model.safetensors", "corrupt safetensors header"


def _header_not_a_table(folder: Path):
    f = folder / "model.safetensors"
    header = b"[1, 2, 3]"
    f.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 64)
    return "model.safetensors", "corrupt safetensors header"


def _header_without_offsets(folder: Path):
    f = folder / "model.safetensors"
    header = json.dumps({"model.norm.weight": {"dtype": "F32", "shape": [64]}}).encode()
    f.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 256)
    return "model.safetensors", "model.norm.weight"


def _wrong_shape(folder: Path):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (folder / "config.json").write_text(json.dumps(cfg))
    return "mlp.", "config.json implies"


def _missing_weight(folder: Path):
    f = folder / "model.safetensors"
    sd = load_file(str(f))
    del sd["model.layers.1.self_attn.k_norm.weight"]
    save_file(sd, str(f), metadata={"format": "pt"})
    return "missing weights", "model.layers.1.self_attn.k_norm.weight"


def _no_config(folder: Path):
    (folder / "config.json").unlink()
    return "config.json", str(folder)


def _bad_config(folder: Path):
    (folder / "config.json").write_text("{not json")
    return "config.json", "not valid JSON"


def _config_not_an_object(folder: Path):
    (folder / "config.json").write_text("[64, 128]")
    return "config.json", "not a JSON object"


def _config_wrong_model_type(folder: Path):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "llama"
    (folder / "config.json").write_text(json.dumps(cfg))
    return "config.json", "'llama'"


DAMAGE = {f.__name__.lstrip("_"): f for f in (
    _truncate, _truncate_to_nothing, _corrupt_header, _oversized_header, _header_not_a_table, _header_without_offsets,
    _wrong_shape, _missing_weight, _no_config, _bad_config, _config_not_an_object, _config_wrong_model_type)}


def one_line(e: BaseException) -> str:
    msg = str(e)
    assert "\n" not in msg, msg
    return msg


# ---------------------------------------------------------------------------------------------
# API


def test_missing_folder(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(CheckpointError) as e:
        load_model(str(missing), device="cpu")
    assert str(missing) in one_line(e.value) and "no such checkpoint folder" in str(e.value)


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_checkpoint(tiny_checkpoint, damage):
    tiny = tiny_checkpoint(**SHAPE)
    fragments = DAMAGE[damage](tiny.folder)
    with pytest.raises((CheckpointError, ValueError, FileNotFoundError)) as e:
        load_model(str(tiny.folder), device="cpu", progress=False)
    msg = one_line(e.value)
    assert str(tiny.folder) in msg, msg
    for fragment in fragments:
        assert fragment in msg, msg


def test_sharded_checkpoint_missing_a_shard(tiny_checkpoint):
    tiny = tiny_checkpoint(max_shard_size="40KB", **SHAPE)
    shards = sorted(tiny.folder.glob("model-*.safetensors"))
    assert len(shards) > 1
    shards[-1].unlink()
    with pytest.raises(CheckpointError) as e:
        load_model(str(tiny.folder), device="cpu", progress=False)
    msg = one_line(e.value)
    assert "model.safetensors.index.json" in msg and shards[-1].name in msg and "missing" in msg, msg


@pytest.mark.parametrize("name", ["7b", "0.5B", "qwen3"])
def test_unknown_size_alias(name):
    with pytest.raises(CheckpointError) as e:
        load_model(name, device="cpu")
    msg = one_line(e.value)
    assert repr(name) in msg and "0.6b" in msg, msg


def test_unknown_alias_with_random_weights():
    with pytest.raises(CheckpointError) as e:
        load_model("7b", random_weights=True, device="cpu")
    assert "'7b'" in one_line(e.value)


@pytest.fixture
def tiny_model(tiny_checkpoint):
    return load_model(str(tiny_checkpoint(**SHAPE).folder), device="cpu", progress=False)


def test_prompt_longer_than_max_seq_len(tiny_model):
    mk = MegaQwen3(tiny_model, backend="reference", max_seq_len=8)
    with pytest.raises(ValueError) as e:
        mk.generate(list(range(1, 11)), max_new_tokens=4)
    msg = one_line(e.value)
    assert "10 tokens" in msg and "max_seq_len is 8" in msg, msg
    with pytest.raises(ValueError, match="do not fit"):
        mk.generate([1, 2, 3], max_new_tokens=10)


@pytest.mark.parametrize("top_p", [0.0, -0.1, 1.5])
def test_top_p_outside_unit_interval(tiny_model, top_p):
    mk = MegaQwen3(tiny_model, backend="reference", max_seq_len=16)
    with pytest.raises(ValueError) as e:
        mk.generate([1, 2, 3], max_new_tokens=2, temperature=1.0, top_p=top_p)
    msg = one_line(e.value)
    assert "top-p" in msg and str(top_p) in msg, msg


def test_token_ids_outside_vocab(tiny_model):
    mk = MegaQwen3(tiny_model, backend="reference", max_seq_len=16)
    with pytest.raises(ValueError, match=r"outside \[0, 320\)"):
        mk.prefill([1, 2, 320])


def test_unknown_backend(tiny_model):
    with pytest.raises(ValueError) as e:
        MegaQwen3(tiny_model, backend="warp-drive")
    assert "'warp-drive'" in one_line(e.value) and "reference" in str(e.value)


@pytest.mark.parametrize("maxnreg", [0, 256])
def test_register_cap_outside_what_ptxas_allots(tiny_model, maxnreg):
    with pytest.raises(ValueError, match=rf"maxnreg={maxnreg}: a thread's register cap is 1 to 255"):
        MegaQwen3(tiny_model, backend="megakernel", max_seq_len=16, maxnreg=maxnreg)


def test_uniform_tape_off_cuda(tiny_model):
    # the warp-uniform tape is PTX (redux.sync): the interpreter has no such thing
    with pytest.raises(ValueError, match="uniform_tape=True needs a CUDA GPU of compute capability 8.0"):
        MegaQwen3(tiny_model, backend="megakernel", max_seq_len=16, uniform_tape=True)


# ---------------------------------------------------------------------------------------------
# CLI


def assert_cli_error(proc, *fragments):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return lines


def test_cli_missing_folder(cli, tmp_path):
    missing = tmp_path / "nothing-here"
    lines = assert_cli_error(cli("--model", missing), str(missing), "no such checkpoint folder")
    assert len(lines) == 1


@pytest.mark.parametrize("damage", ["truncate", "corrupt_header", "wrong_shape", "missing_weight"])
def test_cli_damaged_checkpoint(cli, tiny_checkpoint, damage):
    tiny = tiny_checkpoint(**SHAPE)
    fragments = DAMAGE[damage](tiny.folder)
    lines = assert_cli_error(cli("--model", tiny.folder, "--device", "cpu"), str(tiny.folder), *fragments)
    assert len(lines) == 1, lines


def test_cli_unknown_size_alias(cli):
    assert_cli_error(cli("--model", "7b"), "'7b'")


def test_cli_prompt_longer_than_max_seq_len(cli, tiny_checkpoint):
    tiny = tiny_checkpoint(**SHAPE)
    lines = assert_cli_error(cli("--model", tiny.folder, "--prompt-ids", " ".join(map(str, range(1, 11))),
                                 "--max-seq-len", 6, "--device", "cpu"),
                             "10 tokens", "--max-seq-len 6")
    assert not any(line.startswith("Loaded") for line in lines), lines     # checked before loading


@pytest.mark.parametrize("args, fragments", [
    (["--top-p", "1.5"], ["top-p", "1.5"]),
    (["--top-p", "0"], ["top-p", "(0, 1]"]),
    (["--backend", "warp-drive"], ["'warp-drive'", "reference"]),
    (["--max-new-tokens", "lots"], ["--max-new-tokens", "'lots'"]),
])
def test_cli_bad_settings(cli, args, fragments):
    """Settings are checked before any model is loaded: the error is the only line."""
    lines = assert_cli_error(cli("--model", "0.6b", "--random-weights", *args), *fragments)
    assert len(lines) == 1, lines


def test_backend_not_built_yet(monkeypatch, tiny_model, tiny_checkpoint, capsys):
    """A backend whose module does not exist yet: a clear error from the API, and from the CLI."""
    from megakernel import generate, runtime

    real = runtime._make_backend

    def missing(name, mk, **options):
        if name == "per-op":
            return runtime._import_backend(name, "megakernel.no_such_backend", "make")(mk)
        return real(name, mk, **options)

    monkeypatch.setattr(runtime, "_make_backend", missing)
    with pytest.raises(RuntimeError) as e:
        MegaQwen3(tiny_model, backend="per-op")
    assert "not built yet" in one_line(e.value) and "'per-op'" in str(e.value)
    tiny = tiny_checkpoint(**SHAPE)
    assert generate.main(["--model", str(tiny.folder), "--backend", "per-op", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: backend 'per-op' is not built yet"), err


def test_cli_device_not_present(cli):
    if torch.cuda.is_available():
        pytest.skip("CUDA is present")
    assert_cli_error(cli("--model", "0.6b", "--random-weights", "--device", "cuda"), "cuda")
