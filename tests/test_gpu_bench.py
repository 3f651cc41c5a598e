"""GPU checks of the bench's compiled peers: torch-compile and hf-compile record and replay CUDA graphs
at batch 1 and 8 (no "skipping cudagraphs"), agree with the megakernel under teacher forcing, and
torch-compile (gpt-fast style) is at least as fast as transformers' static-cache set-up.

Run on the device machine: python3 -m pytest -m gpu tests/test_gpu_bench.py -v -s
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("size", ["0.6b", "8b"])
def test_compiled_peers_run_under_cuda_graphs(size, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "megakernel.bench", "-m", size, "--random-weights", "--compare",
                        "torch-compile,hf-compile", "--batch-size", "1,8", "--prompt-len", "128", "-n", "64",
                        "--output-json", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=2400)
    print(r.stdout[-4000:])
    assert r.returncode == 0, r.stderr[-4000:]
    assert "skipping cudagraphs" not in r.stderr, r.stderr[-4000:]
    rows = json.loads(out.read_text())["results"]
    assert {(x["backend"], x["batch_size"]) for x in rows} == \
        {(b, B) for b in ("megakernel", "torch-compile", "hf-compile") for B in (1, 8)}
    for row in rows:
        assert row["error"] is None, row
        assert row["ms_per_step"] > 0 and row["pct_of_floor"] > 0 and row["prefill_ms"] > 0
        # teacher forcing: only near-ties of bf16 rounding may pick another token
        assert row["token_agreement"] >= 0.95, row
        if row["backend"] != "megakernel":
            assert row["cuda_graphs"] is True, row
            assert row["compile_s"] > 0
    for B in (1, 8):
        ms = {x["backend"]: x["ms_per_step"] for x in rows if x["batch_size"] == B}
        assert ms["torch-compile"] <= 1.03 * ms["hf-compile"], (B, ms)
