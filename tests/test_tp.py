"""Tensor parallelism on the CPU: the sharding, the tapes, and gloo processes (``megakernel.tp.spawn``)
running each backend at TP 2 against TP 1 on a tiny random checkpoint, the megakernel through the
interpreter with shared files standing in for symmetric memory."""

from __future__ import annotations

import functools
import re

import pytest
import torch

import megakernel  # noqa: F401  (the interpreter before any kernel is defined)
from megakernel import load_model
from megakernel import tp as tp_mod
from models.qwen3.config import PRESETS, Qwen3Config
from models.qwen3.tp import TPShard, check_tp, random_shard, shard_config, shard_weights
from models.qwen3.weights import random_weights
from scheduler.graph import build_tape
from scheduler.kinds import Op
from scheduler.ops import make_plan
from scheduler.validate import validate
from tests import tp_ranks

TINY = Qwen3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=16, vocab_size=128)


def test_degrees_and_divisibility_are_checked():
    with pytest.raises(ValueError, match="degree 3 is not supported"):
        check_tp(TINY, 3)
    with pytest.raises(ValueError, match="4 key/value heads .* do not divide among 8"):
        check_tp(TINY, 8)
    c = shard_config(PRESETS["32b"], 4)
    assert (c.num_attention_heads, c.num_key_value_heads, c.intermediate_size) == (16, 2, 6400)
    assert c.hidden_size == 5120 and c.vocab_size == PRESETS["32b"].vocab_size


@pytest.mark.parametrize("tp", [2, 4])
def test_shards_put_together_are_the_model(tp, seed):
    """Every rank's share of random weights, generated shard by shard, is the cut of the whole
    model's; the cuts put back together (q, k, v rows per rank; O and down columns) are the whole."""
    full = random_weights(TINY, seed=seed)
    shards = [random_shard(TPShard(TINY, tp, r), seed=seed) for r in range(tp)]
    for r, s in enumerate(shards):
        cut = shard_weights(TPShard(TINY, tp, r), full)
        for name, t in s.tensors().items():
            assert torch.equal(t, cut.tensors()[name]), name
    q, kv, I = TINY.q_size, TINY.kv_size, TINY.intermediate_size
    qr, kvr, Ir = q // tp, kv // tp, I // tp
    assert torch.equal(torch.cat([s.wo for s in shards], dim=2), full.wo)
    assert torch.equal(torch.cat([s.wdown for s in shards], dim=2), full.wdown)
    assert torch.equal(torch.cat([s.wqkv[:, :qr] for s in shards], dim=1), full.wqkv[:, :q])
    assert torch.equal(torch.cat([s.wqkv[:, qr + kvr:] for s in shards], dim=1), full.wqkv[:, q + kv:])
    assert torch.equal(torch.cat([s.wgate_up[:, Ir:] for s in shards], dim=1), full.wgate_up[:, I:])
    assert all(torch.equal(s.embed, full.embed) and torch.equal(s.final_norm, full.final_norm) for s in shards)


def test_checkpoint_loads_one_ranks_share(tiny_checkpoint):
    t = tiny_checkpoint(heads=4, kv_heads=2)
    whole = load_model(str(t.folder), dtype="float32", progress=False)
    for r in range(2):
        part = load_model(str(t.folder), dtype="float32", progress=False, tp=2, rank=r)
        assert part.config.num_key_value_heads == 1 and part.config.intermediate_size == 64
        cut = shard_weights(TPShard(whole.config, 2, r), whole.weights)
        for name, v in part.weights.tensors().items():
            assert torch.equal(v, cut.tensors()[name]), name


@pytest.mark.parametrize("name,tp,workers,batch", [("8b", 2, 264, 1), ("14b", 4, 132, 8), ("32b", 4, 264, 1),
                                                   ("0.6b", 2, 8, 2)])
@pytest.mark.parametrize("mode", ["megakernel", "superkernel"])
def test_tp_tapes_are_valid(name, tp, workers, batch, mode):
    """A rank's tape: its own shapes, O and down as partials, two REDUCE stages a layer (slots 2 l
    and 2 l + 1), every stage scheduled once and deadlock-free (``validate``)."""
    plan = make_plan(shard_config(PRESETS[name], tp), batch, 4096, workers, tp=tp)
    assert plan.TP == tp and plan.HKV == PRESETS[name].num_key_value_heads // tp
    tape = build_tape(plan, workers, mode=mode)
    validate(tape)
    ops = [ins for _, _, ins in tape.instructions()]
    assert not any(i.op in (Op.OPROJ, Op.DOWN) for i in ops)
    assert {i.layer for i in ops if i.op == Op.REDUCE} == set(range(2 * plan.L))


@pytest.mark.parametrize("name,tp,workers,batch", [("8b", 2, 264, 8), ("14b", 4, 132, 8), ("0.6b", 2, 8, 2)])
def test_tp_batches_take_the_weights_on_m_tile_unless_asked(name, tp, workers, batch):
    """A TP batch takes the weights-on-M tile as at TP 1: 64-row O and down blocks, their K-splits,
    REDUCE tiles of whole 64-column blocks, a valid tape, a plan the tuner accepts; ``tp_swap=False``
    keeps it on the batch-on-M tile (rule ``tp-batch-on-m``)."""
    from megakernel.tune import check_plan
    from scheduler.ops import Plan, batch_on_m_plan, plan_and_rules
    cfg = shard_config(PRESETS[name], tp)
    plan, fired = plan_and_rules(cfg, batch, 4096, workers, tp=tp, tp_swap=False)
    assert plan.BATCHED == 1 and "tp-batch-on-m" in [r.name for r, _ in fired]
    swap, fired = plan_and_rules(cfg, batch, 4096, workers, tp=tp)
    assert "tp-batch-on-m" not in [r.name for r, _ in fired]
    one = make_plan(cfg, batch, 4096, workers)       # TP 1's plan of the same shapes
    assert (swap.BATCHED, swap.R_O, swap.R_DOWN, swap.TP) == (2, 64, 64, tp) and swap.R_AR % 64 == 0
    assert (swap.SK_QKV, swap.SK_O, swap.SK_GU, swap.SK_DOWN) == (one.SK_QKV, one.SK_O, one.SK_GU, one.SK_DOWN)
    assert check_plan(swap) is None and check_plan(plan) is None
    assert batch_on_m_plan(swap, workers).BATCHED == 1
    for mode in ("megakernel", "superkernel"):
        validate(build_tape(swap, workers, mode=mode))
    with pytest.raises(ValueError, match="R_AR=32: a REDUCE tile of the weights-on-M tile"):
        Plan(**{**__import__("dataclasses").asdict(swap), "R_AR": 32})
    # w8a8 (FP8 activations) takes the weights-on-M tile at TP too, batch 1 as well
    for b in (1, batch):
        w8 = make_plan(cfg, b, 4096, workers, tp=tp, fp8=True, w8a8=True)
        assert (w8.BATCHED, w8.BATCH_INPUT, w8.TP) == (2, 2, tp)
        # e4m3 on wgmma at every batch (mma.sync was slower at 8b batch 16), the tile called to batch 16
        assert (w8.MMA_V3, w8.SWAP_CALL) == (1, int(b <= 16))


PROMPTS = [[1, 2, 3, 4, 5], [6, 7]]


@pytest.fixture(scope="module")
def tp_checkpoint(tmp_path_factory):
    from tests.conftest import SEED, build_checkpoint
    return build_checkpoint(tmp_path_factory.mktemp("tp") / "ckpt", SEED, heads=4, kv_heads=2)


def assert_tp2_equals_tp1(ranks, one, backends):
    """Each backend's TP 2 run gives TP 1's tokens (``one``: tokens, logits), the two ranks' tokens
    and logits equal to the bit, and logits within float32 rounding of TP 1's."""
    for backend in backends:
        (tok0, lg0), (tok1, lg1) = ranks[0][backend], ranks[1][backend]
        assert tok0.tolist() == one[0].tolist(), backend
        assert torch.equal(tok0, tok1) and torch.equal(lg0, lg1), backend
        torch.testing.assert_close(lg0, one[1], rtol=1e-4, atol=1e-4, msg=backend)


def test_tp2_equals_tp1_on_every_backend(tp_checkpoint):
    """Two gloo processes running reference, vm, per-op and the megakernel at TP 2 give TP 1's
    tokens, and logits within float32 rounding of TP 1's (the sums are split differently), the
    same on both ranks to the bit (every rank adds the partials in one order)."""
    folder = str(tp_checkpoint.folder)
    backends = ("reference", "vm", "per-op", "megakernel")
    one = tp_ranks.decode(0, 1, folder, ["reference"], PROMPTS, 5)["reference"]
    ranks = tp_mod.spawn(2, tp_ranks.decode, 2, folder, backends, PROMPTS, 5, timeout_s=300)
    assert_tp2_equals_tp1(ranks, one, backends)


def test_tp2_megakernel_several_steps_a_launch(tp_checkpoint):
    """Steps in launches of three: each launch's later steps wait on the previous step's ARGMAX and
    the REDUCE flags take the step's number, so a launch of several steps pairs up across ranks."""
    folder = str(tp_checkpoint.folder)
    one = tp_ranks.decode(0, 1, folder, ["reference"], PROMPTS, 6)["reference"]
    ranks = tp_mod.spawn(2, tp_ranks.decode, 2, folder, ["megakernel", "superkernel"], PROMPTS, 6, 3,
                         timeout_s=300)
    for r in range(2):
        assert ranks[r]["megakernel"][0].tolist() == one[0].tolist()
        assert ranks[r]["superkernel"][0].tolist() == one[0].tolist()


@pytest.mark.parametrize("overrides", [None, {"SK_O": 2, "SK_DOWN": 2}], ids=["whole-K", "K-splits"])
def test_tp2_on_the_weights_on_m_tile(tp_checkpoint, overrides):
    """TP 2 with its batch on the weights-on-M tile (the default; O's and down's partials with and
    without K-splits): TP 1's tokens on every backend, the ranks equal to the bit, and the per-op
    backend (REDUCE on the host, then ``xs_kernel``) equal to the megakernel (``reduce_tile`` with
    XS) to the bit, logits and the xs and xss the last REDUCE wrote. The megakernel runs launches of
    three steps (the others one), so a step's REDUCE follows the last one's in the same launch."""
    folder = str(tp_checkpoint.folder)
    backends = ("reference", "vm", "per-op", "megakernel")
    one = tp_ranks.decode(0, 1, folder, ["reference"], PROMPTS, 5)["reference"]
    ranks = tp_mod.spawn(2, functools.partial(tp_ranks.decode, plan_overrides=overrides), 2, folder,
                         backends, PROMPTS, 5, 3, timeout_s=600)
    assert_tp2_equals_tp1(ranks, one, backends)
    for r in range(2):
        for be in ("vm", "per-op", "megakernel"):
            plan = ranks[r]["plans"][be]
            assert (plan["BATCHED"], plan["R_O"], plan["TP"]) == (2, 64, 2), be
            assert (plan["SK_O"], plan["SK_DOWN"]) == ((2, 2) if overrides else (1, 1)), be
        assert torch.equal(ranks[r]["per-op"][1], ranks[r]["megakernel"][1])
        for a, b in zip(ranks[r]["xs"]["per-op"], ranks[r]["xs"]["megakernel"]):
            assert torch.equal(a, b) and a.abs().sum() > 0


def test_a_rank_that_aborts_stops_the_others(tp_checkpoint):
    """Rank 1's step fails (it writes the abort word): every rank's next megakernel step raises
    RankError naming rank 1, at once, not after a timeout."""
    seen = tp_mod.spawn(2, tp_ranks.stop_one, 2, str(tp_checkpoint.folder), "megakernel", PROMPTS, 1, "abort",
                        timeout_s=300)
    for r in range(2):
        assert seen[r].startswith(f"RankError: megakernel rank {r} of 2: rank 1 aborted the run"), seen[r]


def test_generate_cli_tp(cli):
    """generate --tp 2 starts two processes and prints rank 0's tokens, the same as --tp 1 (the
    megakernel through the interpreter); a degree that is not one, or that the heads do not divide,
    is one line and status 2 before any work."""
    args = ("-m", "tiny-random", "--random-weights", "--prompt-ids", "1 2 3", "-n", "5")
    one = cli(*args)
    two = cli(*args, "--tp", "2", "--backend", "megakernel", timeout=300)
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.split() == one.stdout.split() and len(one.stdout.split()) == 5
    assert "tensor parallel over 2 ranks" in two.stderr
    for tp, msg in (("3", "degree 3 is not supported"), ("4", "2 key/value heads .* do not divide among 4")):
        bad = cli(*args, "--tp", tp)
        assert bad.returncode == 2 and bad.stdout == ""
        assert re.search(msg, bad.stderr.strip().splitlines()[-1]), bad.stderr


def test_headline_has_a_tp_column_for_tp_rows():
    from megakernel import results
    base = dict(device="NVIDIA H100", model="14b", dtype="bfloat16", batch_size=1, prompt_len=128, new_tokens=128,
                time="2026-11-26T00:00:00", git_commit="abc", git_dirty=False, floor_ms=1.0, pct_of_floor=50.0)
    rows = [dict(base, backend="megakernel", ms_per_step=9.0),
            dict(base, backend="megakernel", ms_per_step=5.0, tp=2),
            dict(base, backend="cuda-graph", ms_per_step=6.0, tp=2)]
    lines = [ln for ln in results.headline_markdown(rows).splitlines() if ln.startswith("| ") and "---" not in ln]
    assert lines[0].startswith("| device | model | dtype | batch | tp |")
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[1:]]
    assert [(c[4], c[7], c[8]) for c in cells] == [("1", "9.000", "-"), ("2", "5.000", "6.000")]
    assert "tp" not in results.headline_markdown(rows[:1]).splitlines()[0]


# ---------------------------------------------------------------------------------------------
# FP8 weights at TP: each rank's FP8 values and scale blocks are the whole model's, cut apart

# Every part whole 128-row scale blocks at TP 2 (q, k, v 128 rows a rank; intermediate 128 a rank)
FP8_SHAPE = dict(hidden=128, intermediate=256, heads=2, kv_heads=2, head_dim=128)
FP8_TINY = Qwen3Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=2, head_dim=128, vocab_size=96)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to the bit (fp8 compared as bytes)."""
    if a.dtype == torch.float8_e4m3fn:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return a.dtype == b.dtype and torch.equal(a, b)


def test_fp8_shards_are_the_whole_models_cut(seed):
    """FP8 random weights generated rank by rank are the one-GPU FP8 weights cut along whole scale
    blocks: the same fp8 bytes and the same scales (so TP runs the one-GPU model's values)."""
    from models.qwen3.tp import check_tp_fp8
    full = random_weights(FP8_TINY, seed=seed, quantize="fp8")
    for r in range(2):
        shard = TPShard(FP8_TINY, 2, r)
        mine = random_shard(shard, seed=seed, quantize="fp8")
        cut = shard_weights(shard, full)
        assert mine.quantization == "fp8" and mine.scale_rows == 128
        assert set(mine.tensors()) == set(cut.tensors()) and "wqkv_scale" in mine.tensors()
        for name, t in mine.tensors().items():
            assert _same(t, cut.tensors()[name]), name
    # the FP8 split needs whole blocks: TINY's 16-wide heads are refused with one line
    with pytest.raises(ValueError, match=r"--tp 2 with FP8 weights: .* whole 128-row scale blocks"):
        check_tp_fp8(TINY, 2)
    with pytest.raises(ValueError, match="with FP8 weights"):
        random_shard(TPShard(TINY, 2, 0), quantize="fp8")


@pytest.mark.parametrize("how", ["fp8-checkpoint", "quantize-on-load"])
def test_fp8_checkpoint_loads_one_ranks_share(tiny_checkpoint, how):
    """A rank loads its share of an FP8 checkpoint (weights and _scale_inv cut as they are read), or
    of a plain one quantized on load: the cut of the whole model's FP8 weights, bit for bit."""
    from tests.test_fp8 import write_fp8_checkpoint
    t = tiny_checkpoint(**FP8_SHAPE)
    quantize = "fp8"
    if how == "fp8-checkpoint":
        write_fp8_checkpoint(t)
        quantize = None             # the checkpoint is FP8 by itself
    whole = load_model(str(t.folder), dtype="float32", progress=False, quantize=quantize)
    assert whole.quantization == "fp8"
    for r in range(2):
        part = load_model(str(t.folder), dtype="float32", progress=False, quantize=quantize, tp=2, rank=r)
        assert part.quantization == "fp8" and part.config.intermediate_size == 128
        cut = shard_weights(TPShard(whole.config, 2, r), whole.weights)
        for name, v in part.weights.tensors().items():
            assert _same(v, cut.tensors()[name]), name


def _fp8_checkpoint(tmp_path) -> str:
    """A tiny checkpoint of FP8_SHAPE in Qwen's FP8 layout; its folder."""
    from tests.conftest import SEED, build_checkpoint
    from tests.test_fp8 import write_fp8_checkpoint
    t = build_checkpoint(tmp_path / "fp8", SEED, **FP8_SHAPE)
    write_fp8_checkpoint(t)
    return str(t.folder)


def test_tp2_fp8_equals_tp1_fp8(tmp_path):
    """Two gloo processes at TP 2 on an FP8 checkpoint give TP 1's FP8 tokens on the reference,
    per-op and the megakernel (the FP8 tiles on each rank's share), the ranks' logits equal to the
    bit and within float32 rounding of TP 1's."""
    folder = _fp8_checkpoint(tmp_path)
    backends = ("reference", "per-op", "megakernel")
    # weight-only FP8 (TP's default; w8a8: test_tp2_w8a8_equals_tp1_w8a8)
    one = tp_ranks.decode(0, 1, folder, ["megakernel"], PROMPTS, 4, fp8_activations="none")["megakernel"]
    ranks = tp_mod.spawn(2, functools.partial(tp_ranks.decode, fp8_activations="none"), 2, folder, backends,
                         PROMPTS, 4, timeout_s=300)
    assert_tp2_equals_tp1(ranks, one, backends)


def test_tp2_w8a8_equals_tp1_w8a8(tmp_path):
    """FP8 activations (w8a8), asked for, at TP 2: each rank's plan on the weights-on-M tile with e4m3
    inputs gives TP 1 w8a8's tokens on the reference, per-op and the megakernel, the ranks equal to
    the bit and per-op equal to the megakernel to the bit. The logits are within a small relative
    error of TP 1's: the ranks' partial sums round x differently, which can move an input's e4m3
    rounding."""
    folder = _fp8_checkpoint(tmp_path)
    backends = ("reference", "per-op", "megakernel")
    one = tp_ranks.decode(0, 1, folder, ["megakernel"], PROMPTS, 4, fp8_activations="dynamic")["megakernel"]
    ranks = tp_mod.spawn(2, functools.partial(tp_ranks.decode, fp8_activations="dynamic"), 2, folder, backends,
                         PROMPTS, 4, timeout_s=600)
    for r in range(2):
        for be in ("per-op", "megakernel"):
            plan = ranks[r]["plans"][be]
            assert (plan["BATCHED"], plan["BATCH_INPUT"], plan["FP8"], plan["TP"]) == (2, 2, 1, 2), be
        assert torch.equal(ranks[r]["per-op"][1], ranks[r]["megakernel"][1])
    for be in backends:
        (tok0, lg0), (tok1, lg1) = ranks[0][be], ranks[1][be]
        assert tok0.tolist() == one[0].tolist(), be
        assert torch.equal(tok0, tok1) and torch.equal(lg0, lg1), be
        rel = ((lg0 - one[1]).norm() / one[1].norm()).item()
        assert rel < 1e-3, f"{be}: relative error {rel:.2e} against TP 1 w8a8"


def test_generate_cli_refuses_fp8_tp_that_does_not_split(cli):
    """--quantize fp8 --tp 2 on a model whose heads are not whole 128-row scale blocks a rank: one
    line and status 2, before any process is started."""
    bad = cli("-m", "tiny-random", "--random-weights", "--prompt-ids", "1 2 3", "-n", "2", "--quantize", "fp8",
              "--tp", "2")
    assert bad.returncode == 2 and bad.stdout == ""
    last = bad.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --tp 2 with FP8 weights") and "128-row scale blocks" in last, bad.stderr


def test_tuned_plans_are_keyed_by_the_tp_degree():
    """A rank's plan is not a one-GPU plan of the same shapes (its tape has REDUCE stages): the plan
    cache keys entries by TP degree, a TP run never takes a one-GPU entry, and entries written
    before the degree was part of the key read as TP 1."""
    from megakernel import plans
    cfg = shard_config(TINY, 2)
    one = plans.Key.of("cpu", cfg, torch.float32, 1, 64)
    two = plans.Key.of("cpu", cfg, torch.float32, 1, 64, tp=2)
    assert one.tp == 1 and two.tp == 2 and one.id() != two.id()

    def entry(key, **fields):
        return plans.Entry(key=key, fields=fields, strategy="balanced", workers_per_sm=None,
                           tuned_at="2026-01-02T03:04:05+00:00", rules_ms=2.0, tuned_ms=1.0, max_seq_len=64)

    plans.save([entry(one, KV_STAGES=2)])
    assert plans.choose("auto", "cpu", cfg, torch.float32, 1, 64).entry.fields == {"KV_STAGES": 2}
    assert plans.choose("auto", "cpu", cfg, torch.float32, 1, 64, tp=2).name == "rules"
    with pytest.raises(ValueError, match="the tuner measures one GPU .* use --plan rules"):
        plans.choose("tuned", "cpu", cfg, torch.float32, 1, 64, tp=2)
    plans.save([entry(two, KV_STAGES=1)])
    assert plans.choose("tuned", "cpu", cfg, torch.float32, 1, 64, tp=2).entry.fields == {"KV_STAGES": 1}
    old = entry(one).to_json()
    del old["key"]["tp"]
    assert plans.Entry.from_json(old).key == one
