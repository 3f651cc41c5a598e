"""``python -m megakernel.bench`` on the CPU: the card, the table and the JSON last line, with a
failing backend reported while the others still run."""

import json
import os
import subprocess
import sys

import torch

from conftest import REPO

FIELDS = ("device", "versions", "command", "model", "dtype", "batch_size", "prompt_len", "new_tokens",
          "copy_gbps", "bytes_per_step", "floor_ms", "results")
RESULT_FIELDS = ("backend", "prefill_ms", "ms_per_token_median", "ms_per_token_p10", "ms_per_token_p90",
                 "tokens_per_s", "gbps", "pct_of_floor", "tokens_match")


def test_bench_json_and_a_failing_backend(tiny_checkpoint, tmp_path):
    tiny = tiny_checkpoint(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(torch.get_num_threads()))
    out_json, plot = tmp_path / "b.json", tmp_path / "b.png"
    # cuda-graph needs a CUDA GPU: on the CPU it fails, and the others must still report
    r = subprocess.run([sys.executable, "-m", "megakernel.bench", "--model", str(tiny.folder), "--compare",
                        "per-op,superkernel,cuda-graph", "--prompt-len", "5", "--new-tokens", "4",
                        "--output-json", str(out_json), "--plot", str(plot)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    last = json.loads(r.stdout.strip().splitlines()[-1])
    for f in FIELDS:
        assert f in last, f
    assert "interpreter" in last["device"]
    rows = {row["backend"]: row for row in last["results"]}
    assert list(rows) == ["megakernel", "per-op", "superkernel", "cuda-graph"]
    for name in ("megakernel", "per-op", "superkernel"):
        for f in RESULT_FIELDS:
            assert f in rows[name], (name, f)
        assert rows[name]["tokens_match"] is True, name
        assert rows[name]["ms_per_token_median"] > 0
    assert "CUDA" in rows["cuda-graph"]["error"] and rows["cuda-graph"]["tokens_match"] is None
    assert "ERROR" in r.stdout          # the table shows the failure in its row
    assert json.loads(out_json.read_text())["results"][0]["backend"] == "megakernel"
    assert plot.stat().st_size > 1000
