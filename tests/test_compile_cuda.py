"""Every kernel compiles for Hopper (sm_90) with Triton's own compiler, on the CPU.

The interpreter cannot see what only the compiler rejects; this catches it in CI. CI runs this file
again under Triton 3.6, the GPU machines' version (``.ci/run``): which dots become wgmma depends on
the version (3.6 lowers a dot of N = 8 to mma.sync, 3.9 to wgmma).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from models.qwen3.config import PRESETS
from scheduler.ops import make_plan

REPO = Path(__file__).resolve().parents[1]


# batch 1 (the register tiles); the weights-on-M tile padded to 16 on wgmma (SWAP_MIN_N=16, MMA_V3=1:
# the rules' 8 is mma.sync under Triton 3.6; inlined, SWAP_CALL=0), with its weights by TMA and called (SWAP_CALL), and at 32 in the plan that
# samples on the device (its three sampling tiles and attention's, ATTN_CALL, called from the
# persistent kernel); w8a8 at batch 1
# (its projections on the weights-on-M tile with e4m3 inputs); batch 16 as the rules plan it, every
# dot on mma.sync (MMA_V3=0: compiled with Triton's DISABLE_MMA_V3; a chunk before the wait,
# SWAP_PRE); batch 64 with two kv heads an attention tile (ATTN_PAIR)
WGMMA = {"SWAP_MIN_N": 16, "MMA_V3": 1, "SWAP_CALL": 0, "SWAP_PRE": 0}   # (no chunk taken before the wait)


@pytest.mark.parametrize("batch,fp8,fields", [(1, False, {}), (4, False, WGMMA), (4, False, {**WGMMA, "SWAP_TMA": 1, "SWAP_CALL": 1}),
                                              (32, False, {"SAMPLE": 1, "ATTN_CALL": 1}), (1, True, WGMMA), (16, False, {}),
                                              (64, False, {"ATTN_PAIR": 2, "NSPLIT": 1, "ATTN_NEW": 0})],
                         ids=["b1", "b4-n16", "b4-n16-tma", "b32-sampling-attn-call", "b1-w8a8-n16", "b16-mma-sync",
                              "b64-attn-pair"])
def test_all_kernels_compile_for_sm90(batch, fp8, fields):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(DEVICE="cuda", PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "megakernel.compile_check", "--model", "0.6b", "--workers", "264",
                        "--max-seq-len", "512", "--batch-size", str(batch), "--json",
                        *(["--quantize", "fp8", "--fp8-activations", "dynamic"] if fp8 else []),
                        *[a for k, v in fields.items() for a in ("--set", f"{k}={v}")]], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    report = json.loads(r.stdout.strip().splitlines()[-1])
    failed = [row for row in report if not row["ok"]]
    assert not failed, failed
    names = {row["kernel"] for row in report}
    assert {"megakernel", "qkv_kernel", "attn_kernel", "oproj_kernel", "gateup_kernel", "lmhead_kernel",
            "argmax_kernel", "embed_kernel"} <= names
    assert r.returncode == 0
    if fields.get("SAMPLE"):
        assert {"sstats_kernel", "spick_kernel", "sample_kernel"} <= names
    rows = {row["kernel"]: row for row in report}
    # the persistent kernel takes the tape's words warp-uniform (``uniform_tape``, on by default for
    # CUDA): a redux.sync for each of an instruction's eight words
    assert rows["megakernel"]["redux"] >= 8, rows["megakernel"]
    gemv = ("qkv_kernel", "oproj_kernel", "gateup_kernel", "down_kernel", "lmhead_kernel")
    if batch == 16:
        # the rules' batch 16 (``mma-sync-to-16``): no wgmma in any kernel
        for name in gemv:
            assert rows[name]["mma_sync"] >= 1 and rows[name]["wgmma"] == 0, rows[name]
        assert rows["megakernel"]["wgmma"] == 0 and rows["megakernel"]["mma_sync"] > rows["attn_kernel"]["mma_sync"]
    elif batch > 1 or fp8:
        # the batched projections are on Hopper's wgmma (instructions.wgmma): every weight dot, none left
        # on mma.sync; in the persistent kernel only attention's dots are mma.sync
        for name in gemv:
            assert rows[name]["wgmma"] >= 1 and rows[name]["mma_sync"] == 0, rows[name]
        assert rows["megakernel"]["wgmma"] >= sum(rows[n]["wgmma"] for n in gemv)     # (+ the TP partials)
        assert rows["megakernel"]["mma_sync"] == rows["attn_kernel"]["mma_sync"]
    plan = make_plan(PRESETS["0.6b"], batch, 512, 264, fp8=fp8, w8a8=fp8)
    if fields.get("SWAP_CALL", plan.SWAP_CALL):     # (batch 16's rules call it: called-to-16)
        # the weights-on-M tile called, not inlined, from the persistent kernel and the per-op kernels alike
        assert rows["megakernel"]["calls"] >= 1 and rows["qkv_kernel"]["calls"] >= 1, rows["megakernel"]
    else:
        assert rows["megakernel"]["calls"] == (3 if fields.get("SAMPLE") else 0) + fields.get("ATTN_CALL", plan.ATTN_CALL), \
            rows["megakernel"]
    if fields.get("SWAP_TMA"):
        # every projection's weights come by TMA copies
        for name in gemv:
            assert rows[name]["tma"] >= 1, rows[name]
