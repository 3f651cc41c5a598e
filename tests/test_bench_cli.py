"""``python -m megakernel.bench`` on the CPU: tables over batch sizes and prompt lengths, the JSON last
line, the results table and what bench/render draws from it, a failing backend reported while the
others still run, an interrupted run keeping its finished rows, and bad settings refused before any work."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO, code_commit

SHAPE = dict(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)


def run_bench(*args, timeout=900):
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(torch.get_num_threads()))
    return subprocess.run([sys.executable, "-m", "megakernel.bench", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_bench_records_rows_and_render_draws_them(tiny_checkpoint, tmp_path):
    from megakernel import results
    tiny = tiny_checkpoint(**SHAPE)
    out_json, plot, table = tmp_path / "b.json", tmp_path / "b.png", tmp_path / "results.jsonl"
    # cuda-graph needs a CUDA GPU: on the CPU it fails, and the others must still report
    r = run_bench("-m", tiny.folder, "--compare", "per-op,cuda-graph", "--batch-size", "1,2", "--prompt-len", "4,6",
                  "-n", 3, "--output-json", out_json, "--plot", plot, "--record", table)
    assert r.returncode == 0, r.stderr[-3000:]
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert "interpreter" in last["device"]
    assert last["batch_sizes"] == [1, 2] and last["prompt_lens"] == [4, 6] and last["new_tokens"] == 3
    settings = [(B, P) for B in (1, 2) for P in (4, 6)]
    got = [(row["batch_size"], row["prompt_len"], row["backend"]) for row in last["results"]]
    assert got == [(B, P, name) for B, P in settings for name in ("megakernel", "per-op", "cuda-graph")]
    for row in last["results"]:
        if row["backend"] == "cuda-graph":
            assert "CUDA" in row["error"] and row["ms_per_step"] is None
            continue
        assert row["error"] is None
        assert row["ms_per_step"] > 0 and row["prefill_ms"] > 0 and row["ttft_ms"] >= row["prefill_ms"] * 0.5
        assert row["tokens_per_s"] == pytest.approx(row["batch_size"] * 1e3 / row["ms_per_step"], rel=1e-3)
        # teacher forcing: the per-op launches agree with the megakernel's tokens, and so do the
        # megakernel's own one-step launches with its multi-step ones
        assert row["token_agreement"] == 1.0 and row["tokens_match"] is True
        assert row["bytes_per_step"] > 0
        b1 = next(x for x in last["results"] if (x["backend"], x["batch_size"], x["prompt_len"]) ==
                  (row["backend"], 1, row["prompt_len"]))
        assert row["ratio_to_batch1"] == pytest.approx(row["ms_per_step"] / b1["ms_per_step"], rel=1e-3)
    # the floor counts every sequence's KV cache: batch 2 reads more bytes a step than batch 1
    mk = {(x["batch_size"], x["prompt_len"]): x for x in last["results"] if x["backend"] == "megakernel"}
    assert mk[(2, 4)]["bytes_per_step"] > mk[(1, 4)]["bytes_per_step"]
    assert "ERROR" in r.stdout and "decode, prompt 4" in r.stdout and "prefill" in r.stdout
    # each row was printed as it finished, in the order run, before the tables at the end
    streamed = r.stdout[r.stdout.index("rows as they finish"):r.stdout.index("decode, prompt 4")].splitlines()[2:]
    assert [tuple(ln.split()[:3]) for ln in streamed if ln.strip()] == \
        [(str(B), str(P), name) for B, P in settings for name in ("megakernel", "per-op", "cuda-graph")]
    assert json.loads(out_json.read_text())["results"] == last["results"]
    assert plot.stat().st_size > 1000

    # the results table: one row per backend and setting, every field, the run's facts in each
    rows = results.read_rows(table)
    assert len(rows) == len(last["results"])
    commit = code_commit()    # None where nothing says (an sdist, a zip): the row says so too
    for row in rows:
        assert set(row) == set(results.ROW_FIELDS)
        assert row["command"].startswith("python -m megakernel.bench -m ") and "--record" in row["command"]
        assert row["git_commit"] == commit and row["partial"] is None
        # dirty is known in a checkout, not in a copy (git archive, sdist)
        assert isinstance(row["git_dirty"], bool) if (REPO / ".git").exists() else row["git_dirty"] is None
        assert {"torch", "triton", "transformers"} <= set(row["versions"])
        assert row["model"] == str(tiny.folder) and row["dtype"] == "float32" and row["new_tokens"] == 3
        assert row["run"] == rows[0]["run"] and row["time"] == rows[0]["time"]
    assert [(x["batch_size"], x["prompt_len"], x["backend"], x["ms_per_step"]) for x in rows] == \
        [(x["batch_size"], x["prompt_len"], x["backend"], x["ms_per_step"]) for x in last["results"]]

    # the prefill question draws on prefill-only runs (a decode run's prefill is a warm-up's)
    rp = run_bench("-m", tiny.folder, "--prefill-only", "--prompt-len", "4,6", "--compare", "megakernel",
                   "--record", table)
    assert rp.returncode == 0, rp.stderr[-3000:]
    pre_rows = results.read_rows(table)[len(rows):]
    assert pre_rows and all(x["ms_per_step"] is None and x["prefill_ms"] > 0 for x in pre_rows)

    # bench/render: results by question in the README's block, every row in the full table, the plots
    readme, full = tmp_path / "README.md", tmp_path / "docs" / "results.md"
    readme.write_text("# t\n\n## Results\n\n<!-- results:begin -->\nstale\n<!-- results:end -->\n\nafter\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    rr = subprocess.run([sys.executable, "-m", "bench.render", "--table", str(table), "--readme", str(readme),
                         "--full", str(full), "--plots", str(tmp_path / "plots"), "--include-cpu"], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=300)
    assert rr.returncode == 0, rr.stderr
    text = readme.read_text()
    assert "stale" not in text and text.startswith("# t\n") and text.endswith("after\n")
    block = text[text.index(results.MARK_BEGIN):text.index(results.MARK_END)]
    lines = [ln for ln in block.splitlines() if ln.startswith("| ") and not ln.startswith("| ---")]
    # the decode question: megakernel beside the peer that ran (cuda-graph failed: no column)
    assert lines[0] == "| model | batch | megakernel | per-op |"
    for B, line in zip((1, 2), lines[1:3]):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:3] == [str(tiny.folder), str(B), f"{mk[(B, 4)]['ms_per_step']:.3f}"]
    assert "(plots/q-decode-cpu.png)" in block and "(plots/q-prefill.png)" in block
    assert "No FP8 run" in block and "No TP runs" in block and "No load test" in block
    assert max(len(ln.strip("|").split("|")) for ln in lines) <= 6       # small tables
    # the full table: every row, each with its run, whose device, commit and command are listed
    doc = full.read_text()
    bench_rows = doc[doc.index("## Bench rows"):doc.index("## Serving rows")]
    body = [ln for ln in bench_rows.splitlines() if ln.startswith("| ") and not ln.startswith("| ---")][1:]
    assert len(body) == len(rows) + len(pre_rows)
    assert all(f"| {rows[0]['run']} |" in ln or f"| {pre_rows[0]['run']} |" in ln for ln in body)
    assert sorted(ln.split("|")[7].strip() for ln in body) == sorted(x["backend"] for x in rows + pre_rows)
    runs = doc[doc.index("## Runs"):]
    assert rows[0]["command"] in runs and rows[0]["device"] in runs and results.commit_cell(rows[0]) in runs
    plots = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert sorted(p.rsplit("-", 1)[1] for p in plots if not p.startswith("q-")) == \
        ["batch.png", "context.png", "prefill.png"], plots
    assert [p for p in plots if p.startswith("q-")] == ["q-decode-cpu.png", "q-prefill.png"]
    assert all((tmp_path / "plots" / p).stat().st_size > 1000 for p in plots)
    # CPU rows stay out of the headline unless asked for
    assert "No recorded runs" in results.headline_markdown(rows)


def _bench_until(args, line_starts, sig):
    """Start the bench, read stdout until a line starting with ``line_starts``, send ``sig``;
    returns (returncode, stdout, stderr)."""
    import signal  # noqa: F401  (sig is a signal.Signals)
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS=str(torch.get_num_threads()))
    p = subprocess.Popen([sys.executable, "-m", "megakernel.bench", *map(str, args)], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in p.stdout:
            seen.append(line)
            if line.lstrip().startswith(line_starts):
                p.send_signal(sig)
                break
        else:
            raise AssertionError("the bench ended before the line: " + "".join(seen) + p.stderr.read()[-3000:])
        out, err = p.communicate(timeout=600)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, "".join(seen) + out, err


def test_interrupted_bench_keeps_the_rows_that_finished(tmp_path):
    import signal
    from megakernel import results
    out_json, table = tmp_path / "b.json", tmp_path / "results.jsonl"
    table.write_text('{"run": "older", "time": "t", "command": "c", "backend": "megakernel"}\n')
    # five settings: Ctrl-C after the first row lands long before the last
    args = ["--device", "cpu", "--compare", "per-op", "--batch-size", "1,2,3,4,5", "--prompt-len", "4", "-n", 3,
            "--seed", 1, "--output-json", out_json, "--record", table]
    rc, out, err = _bench_until(args, "1      4  megakernel", signal.SIGINT)
    assert rc == 130, err[-3000:]
    assert err.strip().endswith("interrupted")
    doc = json.loads(out_json.read_text())
    assert doc["partial"] is True and 1 <= len(doc["results"]) < 10
    assert (doc["results"][0]["batch_size"], doc["results"][0]["backend"]) == (1, "megakernel")
    assert all(r["partial"] is True and r["error"] is None and r["ms_per_step"] > 0 for r in doc["results"])
    assert json.loads(out.strip().splitlines()[-1]) == doc     # printed as well, the last stdout line
    rows = results.read_rows(table)
    assert rows[0] == {"run": "older", "time": "t", "command": "c", "backend": "megakernel"}   # untouched
    assert [(r["batch_size"], r["backend"], r["ms_per_step"], r["partial"]) for r in rows[1:]] == \
        [(r["batch_size"], r["backend"], r["ms_per_step"], True) for r in doc["results"]]


def test_interrupted_bench_never_clobbers_a_finished_json(tmp_path):
    import signal
    out_json = tmp_path / "b.json"
    finished = '{"results": [{"backend": "megakernel", "ms_per_step": 1.0}]}\n'
    out_json.write_text(finished)
    # SIGTERM once the card is out, before any row finishes: nothing to write, the old file stays
    rc, out, err = _bench_until(["--device", "cpu", "--compare", "per-op", "--batch-size", "1,2", "-n", 3,
                                 "--output-json", out_json], "plan ", signal.SIGTERM)
    assert rc == 143, err[-3000:]
    assert out_json.read_text() == finished
    assert f"no row finished: {out_json} left as it was" in err and err.strip().endswith("terminated (SIGTERM)")
    assert not list(tmp_path.glob("b.json.tmp*"))


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "0"], "--batch-size values must be at least 1"),
    (["--batch-size", "-1"], "--batch-size values must be at least 1"),
    (["--batch-size", "1,two"], "--batch-size takes integers"),
    (["--prompt-len", "0"], "--prompt-len values must be at least 1"),
    (["--max-seq-len", "4", "--prompt-len", "8"], "--max-seq-len 4 is too short"),
    (["--max-seq-len", "0"], "--max-seq-len must be at least 2"),
    (["--compare", "per-op,warp-drive"], "unknown backend 'warp-drive'"),
    (["--output-json", "/nonexistent/dir/x.json"], "--output-json /nonexistent/dir/x.json: no directory"),
    (["--record", "/nonexistent/dir/r.jsonl"], "--record /nonexistent/dir/r.jsonl: no directory"),
    (["-n", "0"], "--max-new-tokens must be at least 1"),
    (["--prefill-only", "-n", "8"], "--prefill-only times no decode step"),
    (["--steps-per-launch", "65"], "--steps-per-launch must be between 1 and 64"),
    (["--model", "0.6b"], "--force-cpu"),
    (["--trace", "/tmp/t.json"], "--trace reads the GPU's clocks"),
    (["--frobnicate"], "unrecognized arguments"),
])
def test_bad_settings_are_refused_before_any_work(argv, message, capsys):
    from megakernel import bench
    assert bench.main(argv + ["--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    assert out == ""    # no card: nothing was loaded or run
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


def test_cpu_defaults_size_themselves(monkeypatch, capsys):
    """On the CPU the defaults are the tiny model and a short run; real sizes need --force-cpu."""
    from megakernel import bench
    cpu = torch.device("cpu")
    args = bench.parse_args([])
    bench.settle(args, cpu)
    assert (args.model, args.prompt_lens, args.max_new_tokens) == ("tiny", [16], 8)
    assert args.compare_list == ["per-op", "superkernel"]
    assert args.max_seq_len > 16 + 8
    assert bench.tiny_model(cpu).config.num_parameters() < bench.CPU_MAX_PARAMS
    args = bench.parse_args(["-m", "8b", "--force-cpu"])
    bench.settle(args, cpu)              # forced: no refusal
    args = bench.parse_args(["--prefill-only", "--prompt-len", "32"])
    bench.settle(args, cpu)
    assert args.max_new_tokens == 1 and args.compare_list == ["hf"]
    capsys.readouterr()
    args = bench.parse_args(["-m", "0.6b", "--prefill-only", "--prompt-len", "32"])
    bench.settle(args, cpu)              # no decode step: not refused, but told it is slow
    assert "note: 0.6b prefill on the CPU" in capsys.readouterr().err
    # the old flag name still works
    assert bench.parse_args(["--new-tokens", "5"]).max_new_tokens == 5

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(bench, "bench", interrupted)
    assert bench.main([]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


def test_help_shows_defaults_without_rest_quoting():
    r = run_bench("--help", timeout=120)
    assert r.returncode == 0
    assert "``" not in r.stdout and "(default: 1)" in r.stdout and "(default: 64)" in r.stdout
    assert "-n N, --max-new-tokens N, --new-tokens N" in r.stdout and "-m MODEL, --model MODEL" in r.stdout


def test_plots_per_model_leave_tensor_parallel_rows_to_their_own(tmp_path, monkeypatch):
    """A later TP 2 row at a batch the TP 1 rows also have does not stand in for TP 1's point in the
    model's ms-over-batch plot."""
    from megakernel import results
    drawn = {}
    monkeypatch.setattr(results, "plot_series", lambda series, *a, **k: drawn.setdefault(a[3].name, series))
    row = dict(device="NVIDIA H200", model="8b", dtype="bfloat16", prompt_len=128, backend="megakernel",
               new_tokens=128, floor_ms=1.0)
    rows = [dict(row, batch_size=1, ms_per_step=4.1, time="2026-11-01T00:00:00"),
            dict(row, batch_size=8, ms_per_step=4.4, time="2026-11-01T00:00:01"),
            dict(row, batch_size=8, ms_per_step=3.3, tp=2, time="2026-11-02T00:00:00")]
    results.plot_rows(rows, tmp_path)
    (name, series), = [(n, s) for n, s in drawn.items() if n.endswith("-batch.png")]
    assert [y for _, y in series["megakernel"]] == [4.1, 4.4]
