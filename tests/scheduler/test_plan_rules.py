"""make_plan's rules: each fires for some preset (none is dead), each sets only plan fields, and the
plan is the base plan with exactly the fired rules' fields applied in order."""

import dataclasses
import itertools

from models.qwen3.config import PRESETS
from scheduler.ops import PLAN_RULES, Plan, make_plan, plan_and_rules

FIELDS = {f.name for f in dataclasses.fields(Plan)}


def test_every_rule_fires_somewhere_and_sets_plan_fields():
    fired = set()
    for size, batch, seq, (workers, warps), bf16 in itertools.product(PRESETS, (1, 2, 64), (64, 392, 8192),
                                                                      ((264, 4), (132, 4), (132, 8)), (False, True)):
        plan, rules = plan_and_rules(PRESETS[size], batch, seq, workers, num_warps=warps, bf16_inputs=bf16)
        assert plan == make_plan(PRESETS[size], batch, seq, workers, num_warps=warps, bf16_inputs=bf16)
        for rule, fields in rules:
            assert fields and set(fields) <= FIELDS, rule.name
            fired.add(rule.name)
    assert fired == {r.name for r in PLAN_RULES}


def test_rules_are_named_once_with_a_one_line_reason():
    names = [r.name for r in PLAN_RULES]
    assert len(names) == len(set(names))
    assert all(r.why and "\n" not in r.why and len(r.why) <= 110 for r in PLAN_RULES)


def test_fired_fields_are_what_differs_from_the_base_plan():
    """The fields a plan has besides its base plan's are among those its fired rules set."""
    from scheduler.ops import MAX_BK, TILE_ELEMS, PlanInputs, _base_plan
    for size in ("0.6b", "8b"):
        plan, rules = plan_and_rules(PRESETS[size], 1, 392, 264)
        base = _base_plan(PlanInputs(PRESETS[size], 1, 392, 264, MAX_BK, TILE_ELEMS, False,
                                     short=size == "0.6b"), None, None)
        changed = {k for k in FIELDS if getattr(base, k) != getattr(plan, k)}
        assert changed and changed <= set().union(*(set(f) for _, f in rules))


def test_large_batches_balance_a_splits_weights_against_the_partials_summed():
    """From batch 32 a block's K-splits are about sqrt(K / 2B) (a power of two): a split reads
    128 K / SK bytes of weights and the block's last split SK * B * 256 of partials. 0.6b batch 64
    goes from O's 16 and down's 8 splits to 4 each; batch 16 and 8b keep the tile count's splits."""
    small, rules = plan_and_rules(PRESETS["0.6b"], 64, 264, 264)
    assert (small.SK_QKV, small.SK_O, small.SK_GU, small.SK_DOWN) == (4, 4, 4, 4)
    assert "balanced-splits" in [r.name for r, _ in rules]
    assert make_plan(PRESETS["0.6b"], 32, 264, 264).SK_O == 8
    assert make_plan(PRESETS["0.6b"], 16, 264, 264).SK_O == 16
    big, rules = plan_and_rules(PRESETS["8b"], 64, 264, 264)
    assert (big.SK_O, big.SK_DOWN) == (4, 4) and "balanced-splits" not in [r.name for r, _ in rules]


def test_batches_above_32_give_the_weights_on_m_pipeline_112_kb():
    """From batch 33 (the batch padded to 64 on N) the weights-on-M tile's pipeline takes 112 KB
    (gate/up's chunks stay 128 columns wide), encoded in the tiles' kind as BT_SMEM units; up to 32
    it keeps 80 KB. A budget outside 80-224 KB, off a multiple of 16, or off that tile is refused."""
    import pytest
    from instructions.common import BT_SMEM
    for b, kb in ((2, 80), (16, 80), (32, 80), (33, 112), (64, 112)):
        plan, rules = plan_and_rules(PRESETS["8b"], b, 392, 264, bf16_inputs=True)
        assert plan.SWAP_SMEM == kb and ("deep-pipeline" in [r.name for r, _ in rules]) == (kb == 112), b
    plan = make_plan(PRESETS["0.6b"], 64, 392, 264)
    assert plan.BT == dataclasses.replace(plan, SWAP_SMEM=80).BT + 2 * BT_SMEM.value
    assert dataclasses.replace(plan, SWAP_SMEM=224).BT == plan.BT + 7 * BT_SMEM.value
    for bad in (64, 120, 240):
        with pytest.raises(ValueError, match=rf"SWAP_SMEM={bad}: the weights-on-M tile's pipeline takes 80 to 224"):
            dataclasses.replace(plan, SWAP_SMEM=bad)
    with pytest.raises(ValueError, match=r"SWAP_SMEM=112: .*\(80 where BATCHED=0 is not 2\)"):
        dataclasses.replace(make_plan(PRESETS["0.6b"], 1, 392, 264), SWAP_SMEM=112)


def test_short_layers_from_batch_32_run_one_worker_of_eight_warps_an_sm():
    """The rules' layout of workers: two of 4 warps an SM, but from batch 32 where a layer's bf16
    weights are short at one worker an SM (0.6b, not 1.7b or 8b), one of 8 warps whose pipeline takes
    the SM's 224 KB (rule whole-sm-pipeline). Not timed, so not taken: float32 or FP8 weights, TP."""
    from scheduler.ops import WORKERS_PER_SM, default_layout
    small = PRESETS["0.6b"]
    for batch in (32, 33, 64):
        assert default_layout(small, batch, 132, bf16=True) == (8, 1), batch
    for batch in (1, 8, 16, 31):
        assert default_layout(small, batch, 132, bf16=True) == (4, WORKERS_PER_SM), batch
    for size in ("1.7b", "8b", "32b"):
        assert default_layout(PRESETS[size], 64, 132, bf16=True) == (4, WORKERS_PER_SM), size
    # a worker count asked for: one an SM holds 132, two of 4 warps what is more
    assert default_layout(small, 64, 132, bf16=True, workers=132) == (8, 1)
    assert default_layout(small, 64, 132, bf16=True, workers=264) == (4, WORKERS_PER_SM)
    for other in (dict(bf16=False), dict(bf16=True, fp8=True), dict(bf16=True, tp=2)):
        assert default_layout(small, 64, 132, **other) == (4, WORKERS_PER_SM), other
    plan, rules = plan_and_rules(small, 64, 392, 132, num_warps=8, bf16_inputs=True)
    assert plan.SWAP_SMEM == 224 and "whole-sm-pipeline" in [r.name for r, _ in rules]
    assert make_plan(small, 64, 392, 264, bf16_inputs=True).SWAP_SMEM == 112
    assert make_plan(small, 8, 392, 132, num_warps=8, bf16_inputs=True).SWAP_SMEM == 224
    assert make_plan(small, 1, 392, 132, num_warps=8, bf16_inputs=True).SWAP_SMEM == 80     # no batched tile


def test_more_kv_heads_than_workers_pair_them_in_attention_tiles():
    """Where a step has more kv heads (batch x HKV) than workers, an attention tile takes two
    (ATTN_PAIR 2, one split); at or below the worker count each takes one."""
    for size in ("0.6b", "8b", "32b"):
        plan, rules = plan_and_rules(PRESETS[size], 64, 264, 264)
        assert (plan.ATTN_PAIR, plan.NSPLIT) == (2, 1) and "attention-pairs" in [r.name for r, _ in rules]
        assert make_plan(PRESETS[size], 32, 264, 264).ATTN_PAIR == 1
    assert make_plan(PRESETS["0.6b"], 64, 264, 528).ATTN_PAIR == 1


def test_the_mma_sync_tile_loads_a_chunk_before_its_wait():
    """Batches 2 to 16 (the mma.sync tile) load their first chunk of weights before the wait
    (SWAP_PRE 1) with bf16 weights; batch 1's register tiles, the wgmma plans from batch 32 and FP8
    weights (w8a8's e4m3 tile spills with it) do not."""
    for b, pre in ((1, 0), (2, 1), (16, 1), (32, 0), (64, 0)):
        plan, rules = plan_and_rules(PRESETS["8b"], b, 392, 264, bf16_inputs=True)
        assert plan.SWAP_PRE == pre and ("weights-before-the-wait" in [r.name for r, _ in rules]) == bool(pre), b
        assert make_plan(PRESETS["8b"], b, 392, 264, fp8=True, w8a8=True).SWAP_PRE == 0
        assert make_plan(PRESETS["8b"], b, 392, 264, fp8=True).SWAP_PRE == 0


def test_bf16_weights_round_the_batched_input_to_bf16():
    """bf16 weights on the weights-on-M tile take the input as one bf16 operand (BATCH_INPUT 1);
    float32 models keep "split" (float32-exact), as do batch 1, FP8 (w8a8's e4m3 or weight-only)
    and TP, where the batch-on-M tile runs."""
    from scheduler.ops import BATCH_INPUTS
    cfg = PRESETS["8b"]
    assert make_plan(cfg, 8, 264, 264, bf16_inputs=True).BATCH_INPUT == BATCH_INPUTS["bf16"]
    assert make_plan(cfg, 8, 264, 264).BATCH_INPUT == BATCH_INPUTS["split"]
    assert make_plan(cfg, 1, 264, 264, bf16_inputs=True).BATCH_INPUT == BATCH_INPUTS["split"]
    assert make_plan(cfg, 8, 264, 264, bf16_inputs=True, fp8=True).BATCH_INPUT == BATCH_INPUTS["split"]
    assert make_plan(cfg, 8, 264, 264, bf16_inputs=True, fp8=True, w8a8=True).BATCH_INPUT == BATCH_INPUTS["fp8"]
    assert make_plan(cfg, 8, 264, 264, bf16_inputs=True, tp=2).BATCH_INPUT == BATCH_INPUTS["split"]
