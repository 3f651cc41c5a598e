"""Every kernel compiles for Hopper (sm_90) with Triton's own compiler, on the CPU.

The interpreter cannot see what only the compiler rejects; this catches it in CI.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("batch", [1, 4, 16])   # batch 1; the weights-on-M tile at two batch paddings
def test_all_kernels_compile_for_sm90(batch):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(DEVICE="cuda", PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "megakernel.compile_check", "--model", "0.6b", "--workers", "264",
                        "--max-seq-len", "512", "--batch-size", str(batch), "--json"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    report = json.loads(r.stdout.strip().splitlines()[-1])
    failed = [row for row in report if not row["ok"]]
    assert not failed, failed
    names = {row["kernel"] for row in report}
    assert {"megakernel", "qkv_kernel", "attn_kernel", "oproj_kernel", "gateup_kernel", "lmhead_kernel",
            "argmax_kernel", "embed_kernel"} <= names
    assert r.returncode == 0
    rows = {row["kernel"]: row for row in report}
    gemv = ("qkv_kernel", "oproj_kernel", "gateup_kernel", "down_kernel", "lmhead_kernel")
    if batch > 1:
        # the batched projections are on Hopper's wgmma (instructions.wgmma): every weight dot, none left
        # on mma.sync; in the persistent kernel only attention's dots are mma.sync
        for name in gemv:
            assert rows[name]["wgmma"] >= 1 and rows[name]["mma_sync"] == 0, rows[name]
        assert rows["megakernel"]["wgmma"] >= sum(rows[n]["wgmma"] for n in gemv)     # (+ the TP partials)
        assert rows["megakernel"]["mma_sync"] == rows["attn_kernel"]["mma_sync"]
