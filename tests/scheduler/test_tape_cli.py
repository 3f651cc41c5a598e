"""``python -m megakernel.tape``: the tape summary from a model's shapes alone, in seconds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megakernel.tape import main

REPO = Path(__file__).resolve().parents[2]


def test_cli_0_6b_132_workers_in_a_subprocess():
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "megakernel.tape", "--model", "0.6b", "--workers", "132"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert elapsed < 30, elapsed
    out = r.stdout
    assert re.search(r"^dependent steps per layer: 5\.07$", out, re.M), out[-2000:]
    assert "workers 132" in out and "valid:" in out
    rows = [line for line in out.splitlines() if re.match(r"^\s*\d+\s+\d+\s+\d+\s+[\d.]+\s+[\d.]+$", line)]
    assert len(rows) == 132                       # one row per worker
    for kind in ("EMBED", "QKV", "ATTN", "OPROJ", "GATEUP", "DOWN", "LMHEAD", "ARGMAX"):
        assert re.search(rf"^{kind}\s+\d+", out, re.M), kind
    assert re.search(r"^balance \(max/mean bytes per worker\): 1\.\d+$", out, re.M)


@pytest.mark.parametrize("strategy", ["round-robin", "balanced"])
@pytest.mark.parametrize("mode", ["megakernel", "superkernel"])
def test_cli_from_a_checkpoint_folder(tmp_path, capsys, strategy, mode):
    cfg = dict(model_type="qwen3", hidden_size=64, intermediate_size=96, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=100)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["--model", str(tmp_path), "--workers", "7", "--strategy", strategy, "--mode", mode,
                 "--batch-size", "3", "--max-seq-len", "100"]) == 0
    out = capsys.readouterr().out
    assert f"mode {mode}  strategy {strategy}  workers 7  batch 3  max_seq_len 100" in out
    assert "dependent steps: 17 per step over 3 layers" in out        # 5 per layer + embed, LM head, argmax
    assert "dependent steps per layer: 5.67" in out
    assert ("BARRIER" in out) == (mode == "superkernel")


@pytest.mark.parametrize("args, fragment", [
    (["--model", "7b"], "unknown model '7b'"),
    (["--model", "0.6b", "--workers", "0"], "--workers: must be at least 1"),
    (["--model", "0.6b", "--batch-size", "0"], "--batch-size: must be at least 1"),
    (["--model", "0.6b", "--max-seq-len", "1"], "--max-seq-len: must be at least 2"),
    (["--model", "0.6b", "--bandwidth", "0"], "--bandwidth must be positive"),
    (["--model", "3.3b"], "unknown model '3.3b'"),
    (["--model", "0.6b", "--workers", "many"], "'many' is not an integer"),
    (["--model", "0.6b", "--strategy", "random"], "invalid choice"),
    (["--model", "0.6b", "--mode", "fast"], "invalid choice"),
    (["--workers", "4"], "--model"),
    (["--model", "/nonexistent/folder"], "no such checkpoint folder"),
])
def test_cli_errors(capsys, args, fragment):
    with pytest.raises(SystemExit) as e:
        code = main(args)
        raise SystemExit(code)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and fragment in err[0], err


def test_cli_bad_config(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{not json")
    assert main(["--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "not valid JSON" in err[0]


def test_cli_defaults_to_the_runtimes_workers_and_explains_the_plan(capsys):
    """Without --workers the CLI prints the tape the runtime runs on an H100 (2 x 132 workers), and
    --explain names the plan rules that fired, each with the fields it set and its reason."""
    from megakernel.tape import main
    from scheduler.ops import PLAN_RULES, WORKERS_PER_SM, plan_and_rules
    from models.qwen3.config import PRESETS
    assert main(["--model", "8b", "--explain", "--max-seq-len", "392"]) == 0
    out = capsys.readouterr().out
    assert f"workers {WORKERS_PER_SM * 132}" in out
    _, fired = plan_and_rules(PRESETS["8b"], 1, 392, WORKERS_PER_SM * 132)
    assert {r.name for r, _ in fired} == {"splits-by-context", "balanced-gateup", "half-down-tiles", "pools"}
    for rule, fields in fired:
        assert f"  {rule.name}: " in out and rule.why in out
    for rule in PLAN_RULES:
        if rule not in [r for r, _ in fired]:
            assert f"  {rule.name}: " not in out
