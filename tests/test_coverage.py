"""bench/coverage.py: which rows of the complete sweep the results table still lacks, per GPU type
and sweep part (issue 53)."""

import json

from bench import coverage


def _row(**kw):
    base = dict(device="NVIDIA H100 80GB HBM3", model="0.6b", dtype="bfloat16", quantization=None,
                fp8_activations=None, tp=1, batch_size=1, prompt_len=128, backend="megakernel", plan="rules",
                ms_per_step=1.0, prefill_ms=5.0, error=None, time="2026-11-28T00:00:00+00:00")
    return {**base, **kw}


def test_a_part_is_missing_until_every_row_of_it_is_recorded(tmp_path):
    parts = lambda gaps, g: gaps.get(g, {})     # noqa: E731
    rows = [_row(model=m, backend=be) for m in ("0.6b", "1.7b", "4b") for be in ("megakernel", "cuda-graph")]
    gaps = coverage.missing(rows)
    assert "sizes-small" not in parts(gaps, "H100") and "sizes-small" in parts(gaps, "H200")
    # a row that failed, a CPU row, a float32 row and a serving row cover nothing
    bad = [_row(model="8b", error="out of memory"), _row(model="8b", device="cpu"), _row(model="14b", dtype="float32"),
           _row(model="14b", backend="serve")]
    assert coverage.missing(bad)["H100"]["sizes-8b-14b"] == coverage.missing([])["H100"]["sizes-8b-14b"]
    # FP8 rows name their scheme; a TP row from before the race fix does not count for the TP parts
    fp8 = [_row(model="32b", quantization="fp8", fp8_activations=a) for a in ("dynamic", "none")]
    assert "fp8-32b" not in parts(coverage.missing(fp8), "H100")
    old_tp = [_row(model="14b", tp=tp, batch_size=b, backend=be, time="2026-11-26T10:00:00+00:00")
              for tp in (1, 2, 4) for b in (1, 8) for be in ("megakernel", "cuda-graph")]
    assert len(coverage.missing(old_tp)["H100"]["tp-14b"]) == 12
    assert "tp-14b" not in parts(coverage.missing([{**r, "time": coverage.TP_AFTER} for r in old_tp]), "H100")
    # prefill rows (no decode figure) count for the prefill parts; the tuned plans only on the H200
    pre = [_row(ms_per_step=None, prompt_len=n, backend=be, device="NVIDIA H200")
           for n in coverage.PREFILL_LENS for be in ("megakernel", "hf")]
    assert "prefill-0.6b" not in parts(coverage.missing(pre), "H200")
    assert "tune-8b" in parts(coverage.missing([]), "H200") and "tune-8b" not in parts(coverage.missing([]), "H100")

    table = tmp_path / "results.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert coverage.main(["--table", str(table)]) == 0
    assert coverage.main(["--table", str(table), "--check"]) == 1
