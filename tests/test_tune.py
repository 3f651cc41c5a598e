"""The tuner (megakernel/tune.py) and the plan cache (megakernel/plans.py) on the CPU: the search runs
the persistent kernel through the interpreter on a tiny model with a fake timer and clock; the cache
is written, read back and used; entries of another device or Triton are not used; a corrupt cache
is ignored with a warning; a tuned plan's tokens and logits against the rules'."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO

SHAPE = dict(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)


@pytest.fixture
def tiny_model(tiny_checkpoint):
    from megakernel import load_model
    return load_model(str(tiny_checkpoint(**SHAPE).folder), device="cpu", progress=False)


class FakeClock:
    """Seconds that pass only when the fake timer says a launch ran."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def fake_timer(clock, cost, calls=None, interrupt_at=None):
    """A timer for ``Tuner``: each timed launch 'takes' ``cost(plan)`` ms and one second of ``clock``."""
    class Timer:
        def __init__(self, backend):
            self.plan = backend.plan

        def __enter__(self):
            if calls is not None:
                calls.append(self.plan)
                if interrupt_at is not None and len(calls) == interrupt_at:
                    raise KeyboardInterrupt
            return self

        def __exit__(self, *exc):
            clock.t += 1.0

        def ms(self):
            return cost(self.plan)
    return Timer


def pooled_is_faster(plan):
    """The fake measure: pools (which move tiles between workers, not their arithmetic) win."""
    return 2.0 - 0.5 * any(getattr(plan, f) for f in ("POOL_O", "POOL_GU", "POOL_DOWN", "POOL_LM")) \
        + 0.01 * plan.NSPLIT


def test_search_keeps_the_fastest_and_runs_use_it(tiny_model, capsys):
    from dataclasses import replace
    from megakernel import MegaQwen3, plans, tune
    clock, calls = FakeClock(), []
    outs = tune.tune(tiny_model, [1], [48], budget_s=7, timer=fake_timer(clock, pooled_is_faster, calls),
                     clock=clock, show_progress=False)
    (out,) = outs
    measured = [m for m in out.measured if m.ms is not None]
    # the budget: the rules' plan and then as many candidates as fit 7 fake seconds of 2 launches each
    assert 2 <= len(measured) <= 4 and measured[0].candidate == tune.Candidate()
    assert all(m.ms == pooled_is_faster(replace(calls[0], **m.candidate.overrides)) for m in measured)
    best = min(measured, key=lambda m: m.ms)
    e = out.entry
    assert e.fields == best.candidate.overrides and any(k.startswith("POOL_") for k in e.fields)
    assert e.tuned_ms == pytest.approx(best.ms) and e.rules_ms == pytest.approx(pooled_is_faster(calls[0]))
    assert e.tuned_ms < e.rules_ms and e.key.batch == 1 and e.key.context == 64 and e.workers_per_sm is None
    assert not out.interrupted

    # the cache holds it, keyed by this device and Triton, and a run in the same bucket uses it
    path = plans.cache_path()
    data = json.loads(path.read_text())
    (raw,) = data["entries"].values()
    assert raw["key"]["device"] == plans.device_name("cpu") and raw["key"]["triton"] == plans.triton_version()
    assert raw["fields"] == e.fields and raw["rules_ms"] == e.rules_ms and raw["tuned_at"]
    tuned = MegaQwen3(tiny_model, max_seq_len=40, backend="megakernel")           # bucket 64: auto -> tuned
    assert tuned.plan_choice.name == "tuned" and tuned.plan_choice.label.startswith("tuned on 20")
    assert all(getattr(tuned.backend.plan, k) == v for k, v in e.fields.items())
    rules = MegaQwen3(tiny_model, max_seq_len=40, backend="megakernel", plan="rules")
    assert rules.plan_choice.label == "rules" and rules.backend.plan != tuned.backend.plan
    other = MegaQwen3(tiny_model, max_seq_len=100, backend="megakernel")          # bucket 128: none
    assert other.plan_choice.name == "rules"
    # pools change which worker runs a tile, not its arithmetic: the same logits and tokens
    prompt = torch.randint(0, tiny_model.config.vocab_size, (6,)).tolist()
    a = rules.generate(prompt, max_new_tokens=4)
    la = rules.logits.clone()
    b = tuned.generate(prompt, max_new_tokens=4)
    assert torch.equal(a, b) and torch.equal(la, tuned.logits)
    assert tune.order_only(tune.Candidate(), best.candidate)


def test_interrupt_keeps_what_was_measured(tiny_model):
    from megakernel import plans, tune
    clock, calls = FakeClock(), []
    # the fifth timed launch is Ctrl-C: the rules' plan and one candidate (two launches each) are in
    with pytest.raises(KeyboardInterrupt):
        tune.tune(tiny_model, [1], [48], budget_s=100, timer=fake_timer(clock, pooled_is_faster, calls, 5),
                  clock=clock, show_progress=False)
    (entry,) = plans.load().values()
    assert entry.extra["interrupted"] is True and entry.measured == 2
    assert entry.tuned_ms < entry.rules_ms and any(k.startswith("POOL_") for k in entry.fields)


def _entry(plans, key, **fields):
    return plans.Entry(key=key, fields=fields, strategy="balanced", workers_per_sm=None,
                       tuned_at="2026-01-02T03:04:05+00:00", rules_ms=2.0, tuned_ms=1.0, max_seq_len=64)


def test_plans_of_another_device_or_triton_are_not_used(tiny_model):
    from dataclasses import replace
    from megakernel import MegaQwen3, plans
    key = plans.Key.of("cpu", tiny_model.config, tiny_model.dtype, 1, 64)
    plans.save([_entry(plans, replace(key, device="NVIDIA H200"), KV_STAGES=2),
                _entry(plans, replace(key, triton="0.0.1"), KV_STAGES=2)])
    assert len(json.loads(plans.cache_path().read_text())["entries"]) == 2
    assert plans.lookup(key) is None
    mk = MegaQwen3(tiny_model, max_seq_len=64, backend="megakernel")
    assert mk.plan_choice.name == "rules" and mk.backend.plan.KV_STAGES == 3
    with pytest.raises(ValueError, match="no tuned plan .*python -m megakernel.tune --model .* --batch-size 1 "
                                         "--max-seq-len 64"):
        MegaQwen3(tiny_model, max_seq_len=64, backend="megakernel", plan="tuned")
    # this device's entry, added beside them, is used (the others are kept)
    plans.save([_entry(plans, key, KV_STAGES=2)])
    assert len(plans.load()) == 3
    mk = MegaQwen3(tiny_model, max_seq_len=64, backend="megakernel", plan="tuned")
    assert mk.backend.plan.KV_STAGES == 2 and mk.plan_choice.label == "tuned on 2026-01-02"
    # the reference runs no tape: no plan
    assert MegaQwen3(tiny_model, max_seq_len=64, backend="reference").plan_choice.name is None


def test_a_plan_tuned_on_16_bit_weights_is_not_used_for_fp8(tiny_model):
    """FP8 tiles read half the bytes: a plan tuned on the model's 16-bit weights is not theirs, and
    one tuned on FP8 weights is not a 16-bit run's (the key names the format; entries written
    before it existed are 16-bit)."""
    from dataclasses import replace
    from megakernel import MegaQwen3, plans
    key = plans.Key.of("cpu", tiny_model.config, tiny_model.dtype, 1, 64)
    assert key.quant == "" and plans.Key.of("cpu", tiny_model.config, tiny_model.dtype, 1, 64, quant="fp8") \
        == replace(key, quant="fp8")
    plans.save([_entry(plans, key, KV_STAGES=2)])
    assert plans.choose("auto", "cpu", tiny_model.config, tiny_model.dtype, 1, 64, quant="fp8").name == "rules"
    with pytest.raises(ValueError, match="no tuned plan for .* with fp8 weights"):
        plans.choose("tuned", "cpu", tiny_model.config, tiny_model.dtype, 1, 64, quant="fp8")
    plans.save([_entry(plans, replace(key, quant="fp8"), KV_STAGES=1)])
    assert plans.choose("tuned", "cpu", tiny_model.config, tiny_model.dtype, 1, 64, quant="fp8").entry.fields \
        == {"KV_STAGES": 1}
    mk = MegaQwen3(tiny_model, max_seq_len=64, backend="megakernel", plan="tuned")     # 16-bit weights
    assert mk.backend.plan.KV_STAGES == 2


def test_fp8_plans_are_tuned_under_the_scheme_a_run_takes(tiny_checkpoint):
    """FP8 weights are tuned in the scheme a run takes (w8a8 unless asked otherwise), each scheme
    under its own key: a w8a8 run finds the plan tuned for w8a8, a weight-only run does not."""
    from megakernel import MegaQwen3, load_model, plans, tune
    model = load_model(str(tiny_checkpoint(**SHAPE).folder), device="cpu", progress=False, quantize="fp8")
    clock = FakeClock()
    (out,) = tune.tune(model, [1], [48], budget_s=0, timer=fake_timer(clock, lambda plan: 1.0), clock=clock,
                       show_progress=False)
    assert out.entry.key.quant == "fp8-w8a8" and out.entry.key.context == 64
    assert tune.Tuner(model, 1, 48, fp8_activations="none").key.quant == "fp8"
    w8a8 = MegaQwen3(model, max_seq_len=40, backend="megakernel")
    assert w8a8.w8a8 and w8a8.plan_choice.name == "tuned"
    weight_only = MegaQwen3(model, max_seq_len=40, backend="megakernel", fp8_activations="none")
    assert weight_only.plan_choice.name == "rules"
    with pytest.raises(ValueError, match="--quantize fp8 --fp8-activations none"):
        plans.choose("tuned", "cpu", model.config, model.dtype, 1, 40, quant="fp8")


def test_a_tuned_layout_of_8_warps_round_trips_and_is_checked(tiny_model, capsys):
    """A tuned plan's warps a worker are kept in the cache and given to the backends (entries of
    before, without the field, run 4); a count the tuner never picks is ignored with a warning."""
    from dataclasses import replace
    from megakernel import plans
    key = plans.Key.of("cpu", tiny_model.config, tiny_model.dtype, 1, 64)
    eight = replace(_entry(plans, key, KV_STAGES=2), num_warps=8, workers_per_sm=1)
    assert eight.options() == {"plan_overrides": {"KV_STAGES": 2}, "strategy": "balanced", "workers_per_sm": 1,
                               "num_warps": 8}
    assert "8 warps a worker" in eight.changes() and "1 workers per SM" in eight.changes()
    plans.save([eight])
    assert plans.lookup(key).num_warps == 8 and plans.Choice("tuned", eight).record()["plan_fields"]["num_warps"] == 8
    raw = json.loads(plans.cache_path().read_text())
    (entry,) = raw["entries"].values()
    del entry["num_warps"]
    assert plans.Entry.from_json(entry).num_warps == 4 and "num_warps" not in plans.Entry.from_json(entry).options()
    entry["num_warps"] = 6
    plans.cache_path().write_text(json.dumps(raw))
    assert plans.lookup(key) is None
    assert "num_warps=6: a tuned plan runs 4 or 8 warps a worker" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["{not json", '{"format": 99, "entries": {}}', "[1, 2]",
                                  '{"format": 1, "entries": {"k": {"key": {"device": "x"}}}}'])
def test_a_corrupt_cache_is_ignored_with_a_warning(tiny_model, capsys, text):
    from megakernel import MegaQwen3, plans
    path = plans.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    mk = MegaQwen3(tiny_model, max_seq_len=64, backend="per-op")
    assert mk.plan_choice.name == "rules"
    assert "warning: plan cache" in capsys.readouterr().err
    # the tuner's next save replaces it with a good file
    key = plans.Key.of("cpu", tiny_model.config, tiny_model.dtype, 1, 64)
    plans.save([_entry(plans, key, KV_STAGES=2)])
    assert plans.lookup(key).fields == {"KV_STAGES": 2}
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".plans-")]    # no temporary left


def test_a_plan_that_changes_the_sums_stays_close(tiny_model):
    """More attention splits and narrower K-chunks change the order of sums, so logits may differ
    in rounding; they stay within float32 noise of the rules' plan and of the reference."""
    from megakernel import MegaQwen3, plans
    key = plans.Key.of("cpu", tiny_model.config, tiny_model.dtype, 1, 64)
    plans.save([_entry(plans, key, NSPLIT=4, BK_H=32, BK_I=64)])
    prompt = torch.randint(0, tiny_model.config.vocab_size, (9,)).tolist()
    logits = {}
    for plan, backend in (("rules", "megakernel"), ("tuned", "megakernel"), ("tuned", "reference")):
        mk = MegaQwen3(tiny_model, max_seq_len=64, backend=backend, plan=plan)
        mk.prefill(prompt)
        rows = [mk.logits.clone()]
        for _ in range(3):
            mk.step()
            rows.append(mk.logits.clone())
        logits[plan, backend] = torch.stack(rows)
        if backend == "megakernel" and plan == "tuned":
            assert mk.backend.plan.NSPLIT == 4 and mk.backend.plan.BK_H == 32
    base = logits["rules", "megakernel"]
    for other in (logits["tuned", "megakernel"], logits["tuned", "reference"]):
        assert torch.allclose(other, base, atol=1e-4, rtol=1e-4), (other - base).abs().max()


def test_every_move_is_checked_or_named():
    """On the presets' shapes at 264 workers, every first-pass candidate either passes the plan
    checks and the tape validator or has a reason; the neighbourhood is small."""
    from dataclasses import replace
    from models.qwen3.weights import shapes_for
    from megakernel.tune import Candidate, check_plan, moves
    from scheduler.graph import build_tape
    from scheduler.ops import make_plan
    from scheduler.validate import validate
    for name, B in (("0.6b", 1), ("8b", 8)):
        base = make_plan(shapes_for(name), B, 4096, 264)
        assert check_plan(base) is None
        cands = moves(base, Candidate(), 264, cuda=True)
        assert 10 <= len(cands) <= 40 and len(set(cands)) == len(cands)
        assert Candidate((), "balanced", 1) in cands
        assert any(c.overrides.get("BATCH_INPUT") == 1 for c in cands) == bool(base.BATCHED)
        # the weights-on-M tile's K-splits are searched, its O and down blocks stay 64 rows
        assert any("SK_DOWN" in c.overrides for c in cands) == (base.BATCHED == 2)
        assert not any("R_O" in c.overrides or "R_DOWN" in c.overrides for c in cands if base.BATCHED == 2)
        valid = 0
        for c in cands[:6]:
            if c.workers_per_sm:
                continue
            plan = replace(base, **c.overrides)
            if check_plan(plan) is None:
                validate(build_tape(plan, 264, strategy=c.strategy))
                valid += 1
        assert valid >= 3
        # the feed of the weights-on-M tile: TMA, and from 8 rows up to 16 (wgmma under Triton 3.6)
        assert any(c.overrides.get("SWAP_TMA") == 1 for c in cands) == (base.BATCHED == 2)
        assert any(c.overrides.get("SWAP_MIN_N") == 16 for c in cands) == (base.BATCHED == 2 and B <= 8)
        # and its pipeline's shared memory, 80 KB against 112, and the layout of one worker of 8
        # warps an SM with 224 KB of pipeline (and from there back to the default)
        assert any(c.overrides.get("SWAP_SMEM") == 112 for c in cands) == (base.BATCHED == 2)
        eight = Candidate((), "balanced", 1, 8)     # (its 224 KB are the rules' at 8 warps)
        assert (eight in cands) == (base.BATCHED == 2)
        if base.BATCHED == 2:
            assert eight.options() == {"plan_overrides": {}, "strategy": "balanced", "workers_per_sm": 1,
                                       "num_warps": 8}
            back = moves(make_plan(shapes_for(name), B, 4096, 132, num_warps=8), eight, 132, cuda=True)
            assert Candidate() in back and all(c.num_warps == 8 for c in back if c != Candidate())
    # w8a8's e4m3 input is the checkpoint's scheme: its plans move everything but that
    base = make_plan(shapes_for("8b"), 8, 4096, 264, fp8=True, w8a8=True)
    cands = moves(base, Candidate(), 264, cuda=True)
    assert cands and not any("BATCH_INPUT" in c.overrides for c in cands)



def test_pools_are_searched_on_the_weights_on_m_tile():
    """From batch 32 (no chunk before the wait) the tuner tries pools on the weights-on-M tile, and the
    pooled plan passes the checks and the tape validator; a plan that loads a chunk before its wait
    (SWAP_PRE, to batch 16 with bf16 weights) is not offered one, and one given is refused by name."""
    from dataclasses import replace
    from models.qwen3.weights import shapes_for
    from megakernel.tune import Candidate, check_plan, moves, with_pools
    from scheduler.graph import build_tape
    from scheduler.ops import POOL_FIELDS, make_plan
    from scheduler.validate import validate
    base = make_plan(shapes_for("8b"), 64, 4096, 264, bf16_inputs=True)
    assert base.BATCHED == 2 and not base.SWAP_PRE
    pooled = [c for c in moves(base, Candidate(), 264, cuda=True) if any(k.startswith("POOL_") for k in c.overrides)]
    assert len(pooled) == 1
    plan = replace(base, **pooled[0].overrides)
    assert plan.POOL_LM and check_plan(plan) is None
    validate(build_tape(plan, 264))
    pre = make_plan(shapes_for("8b"), 8, 4096, 264, bf16_inputs=True)
    assert pre.SWAP_PRE
    assert not any(k.startswith("POOL_") for c in moves(pre, Candidate(), 264, cuda=True) for k in c.overrides)
    assert not any(pre.pool(op) for op in POOL_FIELDS) and with_pools(pre, 264, True) == pre
    with pytest.raises(ValueError, match="SWAP_PRE"):
        replace(plan, SWAP_PRE=1)


def run(module, *args, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(torch.get_num_threads()))
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_cli_tunes_and_generate_and_bench_use_it(tmp_path):
    """The commands end to end: tune (real timings through the interpreter, a tiny budget), then
    generate and bench with the tuned plan, and bench --plan rules,tuned recording both."""
    from megakernel import plans, results
    r = run("megakernel.tune", "-m", "tiny-random", "--random-weights", "--max-seq-len", "32", "--budget-s", "4")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "batch 1  context 32  rules" in r.stdout
    (entry,) = plans.load().values()
    assert entry.key.context == 32 and entry.measured >= 1 and entry.rules_ms > 0
    g = run("megakernel.generate", "-m", "tiny-random", "--random-weights", "--backend", "megakernel",
            "--plan", "tuned", "--max-seq-len", "32", "-n", "3")
    assert g.returncode == 0, g.stderr[-3000:]
    assert f"plan: tuned on {entry.date}" in g.stderr
    table = tmp_path / "results.jsonl"
    b = run("megakernel.bench", "-m", "tiny-random", "--random-weights", "--compare", "per-op", "--plan",
            "rules,tuned", "-n", "3", "--record", table)
    assert b.returncode == 0, b.stderr[-3000:]
    rows = results.read_rows(table)
    got = [(x["backend"], x["plan"]) for x in rows]
    assert got == [("megakernel", "rules"), ("per-op", "rules"), ("megakernel", "tuned"), ("per-op", "tuned")]
    for x in rows:
        assert x["error"] is None and x["ms_per_step"] > 0
        assert (x["plan_tuned_at"] == entry.tuned_at) == (x["plan"] == "tuned")
    assert rows[2]["plan_fields"]["strategy"] == entry.strategy
    # the tuned megakernel's agreement is against the rules' megakernel
    assert rows[2]["token_agreement"] is not None
    assert f"tuned {entry.date}" in b.stdout
    text = results.headline_markdown(rows, include_cpu=True)
    assert "megakernel tuned ms/step" in text.splitlines()[0]


@pytest.mark.parametrize("module, argv, message", [
    ("megakernel.tune", ["-m", "tiny-random", "--random-weights", "--budget-s", "0"], "--budget-s must be positive"),
    ("megakernel.tune", ["-m", "tiny-random", "--random-weights", "--batch-size", "1,x"], "--batch-size takes"),
    ("megakernel.tune", ["-m", "tiny-random", "--random-weights", "--max-seq-len", "2"], "leaves no room"),
    ("megakernel.tune", ["-m", "0.6b", "--random-weights"], "--force-cpu"),
    ("megakernel.tune", ["-m", "tiny-random", "--random-weights", "--fp8-activations", "none"],
     "--fp8-activations is for FP8 weights"),
    ("megakernel.generate", ["-m", "tiny-random", "--random-weights", "--plan", "tuned", "--backend", "megakernel"],
     "no tuned plan"),
    ("megakernel.generate", ["-m", "tiny-random", "--random-weights", "--plan", "fast"], "invalid choice"),
    ("megakernel.bench", ["--plan", "rules,fast"], "--plan takes auto, rules or tuned"),
    ("megakernel.bench", ["--plan", "tuned"], "no tuned plan"),
])
def test_bad_input_is_one_line(module, argv, message):
    r = run(module, *argv, timeout=300)
    assert r.returncode == 2 and message in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
