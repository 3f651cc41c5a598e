"""bench/sweep.sh --gpus: one-GPU parts side by side, one a GPU, their rows all in the table (issue
53's sweep in fewer device calls). A stand-in ``python`` on PATH records one row a command."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE = """#!/usr/bin/env bash
# a stand-in for the bench: one row a command, into the file after --record
rec=""; prev=""
for a in "$@"; do [ "$prev" = "--record" ] && rec=$a; prev=$a; done
sleep "${FAKE_SLEEP:-0.1}" & pid=$!
trap 'kill $pid; echo "{\\"cmd\\": \\"$*\\", \\"gpu\\": \\"$CUDA_VISIBLE_DEVICES\\", \\"partial\\": true}" >>"$rec"; exit 130' INT
wait $pid
[ -n "$rec" ] && echo "{\\"cmd\\": \\"$*\\", \\"gpu\\": \\"$CUDA_VISIBLE_DEVICES\\"}" >>"$rec"
case "$*" in *"${FAKE_FAIL:-@none@}"*) exit 1 ;; esac
exit 0
"""


@pytest.fixture
def fake_env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(FAKE)
    (bin_dir / "python").chmod(0o755)
    record = tmp_path / "rows.jsonl"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record)}
    return env, record


def _rows(record):
    return [json.loads(l) for l in record.read_text().splitlines()] if record.exists() else []


def test_parts_side_by_side_put_every_row_in_the_table(fake_env):
    env, record = fake_env
    parts = ["sizes-small", "sizes-8b-14b", "decode-0.6b-a", "fp8"]    # 3 + 2 + 1 + 2 commands
    r = subprocess.run(["bash", "bench/sweep.sh", "--gpus", "2", *parts], cwd=ROOT, env={**env, "FAKE_FAIL": "-m 14b"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr + r.stdout      # the 14b command failed: reported, the rest ran
    rows = _rows(record)
    assert len(rows) == 8 and {row["gpu"] for row in rows} == {"0", "1"}
    assert not list(record.parent.glob("rows.jsonl.gpu*")), "a GPU's rows were left out of the table"
    # each part once, on the lane that printed it (which lane takes the first part is a race)
    taken = re.findall(r"^\[gpu (\d)\] == part (\S+) on GPU (\d)$", r.stdout, re.M)
    assert sorted(p for _, p, _ in taken) == sorted(parts) and all(a == b for a, _, b in taken), r.stdout
    assert {a for a, _, _ in taken} == {"0", "1"}, r.stdout
    # one-GPU parts only
    bad = subprocess.run(["bash", "bench/sweep.sh", "--gpus", "2", "fp8", "tp-8b"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "needs 4 GPUs" in bad.stderr and len(_rows(record)) == 8


@pytest.mark.skipif(sys.platform == "win32", reason="process groups")
def test_an_interrupted_sweep_keeps_the_running_rows_and_starts_no_more(fake_env):
    env, record = fake_env
    p = subprocess.Popen(["bash", "bench/sweep.sh", "--gpus", "2", "sizes-small", "sizes-8b-14b", "fp8", "decode-0.6b-a"],
                         cwd=ROOT, env={**env, "FAKE_SLEEP": "30"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    time.sleep(3)
    os.killpg(p.pid, signal.SIGINT)        # as Ctrl-C, or timeout -s INT around a device call
    out, _ = p.communicate(timeout=60)
    rows = _rows(record)
    assert len(rows) == 2 and all(row.get("partial") for row in rows), out    # one running command a GPU
    assert "fp8" not in out and "decode-0.6b-a" not in out, out
    assert not list(record.parent.glob("rows.jsonl.gpu*"))
