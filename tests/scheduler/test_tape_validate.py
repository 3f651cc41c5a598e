"""The tape validator: real tapes pass (many shapes, batch sizes, worker counts, both strategies and
modes), and hand-broken tapes fail with a message naming the offending instruction."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.qwen3.config import PRESETS, Qwen3Config
from scheduler.graph import (MODES, STRATEGIES, Segment, Stage, Tape, build_stages, build_tape, decode, encode, lagged,
                             lagged_gateup)
from scheduler.ops import Op, make_plan
from scheduler.validate import TapeError, dependent_steps, validate

REPO = Path(__file__).resolve().parents[2]
WORKERS = (1, 2, 3, 7, 8, 132)


def tiny(hidden=160, inter=352, layers=2, heads=10, kv=2, head_dim=16, vocab=300, tie=False):
    return Qwen3Config(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, vocab_size=vocab,
                       tie_word_embeddings=tie)


TINY = {"g5": tiny(), "g1": tiny(heads=4, kv=4, tie=True), "g2": tiny(heads=8, kv=4, head_dim=8, layers=3),
        "odd": tiny(hidden=72, inter=100, heads=6, kv=3, head_dim=12, vocab=37, layers=1)}


def stage_rank(plan):
    return {(s.op, s.layer): k for k, s in enumerate(build_stages(plan))}


def check_invariants(tape: Tape):
    """What validate() promises, checked independently and more bluntly."""
    plan = tape.plan
    # every tile of every stage exactly once
    seen = defaultdict(list)
    for _, _, ins in tape.instructions():
        if ins.op != Op.BARRIER:
            seen[(Op(ins.op), ins.layer)].extend(range(ins.tile_start, ins.tile_end))
    pools = defaultdict(set)
    for _, _, ins in tape.instructions():
        if ins.op != Op.BARRIER:
            pools[(Op(ins.op), ins.layer)].add((ins.pool_counter, ins.pool_claims))
    for s in build_stages(plan):
        # a pool: the stage's last tiles, claimed at run time by all of its instructions
        pool, n = plan.pool(s.op), plan.tiles(s.op)
        assert sorted(seen.pop((s.op, s.layer))) == list(range(n - pool))
        claims = pools[(s.op, s.layer)]
        instrs = sum(1 for _, _, i in tape.instructions() if (i.op, i.layer) == (s.op, s.layer))
        assert claims == ({(claims.copy().pop()[0], pool + instrs)} if pool else {(0, 0)})
        if pool:
            assert tape.mode == "megakernel" and 0 < next(iter(claims))[0] < tape.num_counters
    assert not seen
    # each worker's list in stage order, so a wait only names an earlier stage
    rank = stage_rank(plan)
    for lst in tape.workers:
        ranks = [rank[(Op(i.op), i.layer)] if i.op != Op.BARRIER else i.layer + 0.5 for i in lst]
        assert ranks == sorted(ranks)
    # waits count exactly the raisers of their counter
    raisers = defaultdict(int)
    for _, _, ins in tape.instructions():
        if ins.signal_counter > 0:
            raisers[ins.signal_counter] += 1
    for _, _, ins in tape.instructions():
        if ins.wait_per_step:
            assert ins.wait_per_step == raisers[ins.wait_counter]
    if tape.mode == "superkernel":
        assert all(i.wait_per_step == 0 for _, _, i in tape.instructions() if i.op != Op.BARRIER)
        bars = [[i for i in lst if i.op == Op.BARRIER] for lst in tape.workers]
        assert all(b == bars[0] for b in bars) and len(bars[0]) == len(build_stages(plan)) - 1
    else:
        assert all(i.op != Op.BARRIER for _, _, i in tape.instructions())
        # everything but the embedding waits on something
        assert all(i.wait_per_step > 0 for _, _, i in tape.instructions() if i.op != Op.EMBED)
    # encode/decode round trip
    words, lengths = encode(tape)
    assert words.shape[0] == lengths.shape[0] == tape.num_workers
    assert decode(words, lengths) == tape.workers
    # one wait per stage boundary on the longest chain: embed, 6 per layer, LM head, argmax
    assert dependent_steps(tape) == 5 * plan.L + 2
    validate(tape)
    validate(decode(words, lengths), plan, tape.mode, tape.counter_names)


# ---------------------------------------------------------------------------------------------
# valid tapes


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("batch", [1, 2, 3, 4])
def test_tiny_tapes_validate(name, workers, batch):
    for k, (strategy, mode) in enumerate((s, m) for s in STRATEGIES for m in MODES):
        plan = make_plan(TINY[name], batch, [2, 17, 64, 4096][(batch + k) % 4], workers)
        check_invariants(build_tape(plan, workers, strategy=strategy, mode=mode))


@pytest.mark.parametrize("size", list(PRESETS))
def test_preset_tapes_validate(size):
    """Published shapes at 132 workers (an H100/H200), one strategy and mode each, and 8 workers."""
    k = list(PRESETS).index(size)
    strategy, mode = STRATEGIES[k % 2], MODES[(k // 2) % 2]
    check_invariants(build_tape(make_plan(PRESETS[size], 1 + k % 4, 4096, 132), 132, strategy, mode))
    validate(build_tape(make_plan(PRESETS[size], 3, 1024, 8), 8, STRATEGIES[1 - k % 2], MODES[1 - (k // 2) % 2]))


@st.composite
def configs(draw):
    kv = draw(st.integers(1, 4))
    head_dim = draw(st.sampled_from([2, 4, 6, 8, 12, 16, 24, 64, 128]))
    return Qwen3Config(hidden_size=draw(st.integers(8, 320)), intermediate_size=draw(st.integers(8, 700)),
                       num_hidden_layers=draw(st.integers(1, 3)), num_attention_heads=kv * draw(st.integers(1, 4)),
                       num_key_value_heads=kv, head_dim=head_dim, vocab_size=draw(st.integers(2, 1000)),
                       tie_word_embeddings=draw(st.booleans()))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(), batch=st.integers(1, 4), workers=st.sampled_from(WORKERS),
       seq=st.integers(2, 5000), strategy=st.sampled_from(STRATEGIES), mode=st.sampled_from(MODES))
def test_random_shapes_validate(cfg, batch, workers, seq, strategy, mode):
    check_invariants(build_tape(make_plan(cfg, batch, seq, workers), workers, strategy, mode))


def test_scheduler_imports_no_triton():
    code = ("import sys; import scheduler, scheduler.kinds, scheduler.ops, scheduler.graph, scheduler.validate; "
            "bad = [m for m in sys.modules if m == 'triton' or m.startswith(('triton.', 'instructions', "
            "'megakernel'))]; assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------------------------
# broken tapes


@pytest.fixture
def tape2():
    """Batch 2 over 2 workers, round-robin: EMBED tile 0 on worker 0, tile 1 on worker 1."""
    # one kv head an attention tile (not the rules' pairs), so attention has two groups to confuse
    plan = dataclasses.replace(make_plan(TINY["g5"], 2, 64, 2), ATTN_PAIR=1)
    tape = build_tape(plan, 2, "round-robin", "megakernel")
    assert [i.op for i in (tape.workers[0][0], tape.workers[1][0])] == [Op.EMBED, Op.EMBED]
    return tape


def lists_of(tape):
    return [list(lst) for lst in tape.workers]


def rejects(lists, tape, *fragments, mode=None):
    with pytest.raises(TapeError) as e:
        validate(lists, tape.plan, mode or tape.mode, tape.counter_names)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, msg
    return msg


def first(lists, op, layer=0, worker=None):
    for w, lst in enumerate(lists):
        for i, ins in enumerate(lst):
            if ins.op == op and ins.layer == layer and worker in (None, w):
                return w, i
    raise LookupError(op)


def test_missing_producer_no_wait(tape2):
    L = lists_of(tape2)
    w, i = first(L, Op.QKV, worker=1)
    L[w][i] = dataclasses.replace(L[w][i], wait_counter=0, wait_per_step=0)
    rejects(L, tape2, f"worker {w} position {i} ({L[w][i].describe()})", "needs EMBED layer 0", "waits on nothing")


def test_missing_producer_unraised_counter(tape2):
    L = lists_of(tape2)
    w, i = first(L, Op.OPROJ, layer=1)
    L[w][i] = dataclasses.replace(L[w][i], wait_counter=tape2.num_counters - 1 + 50)
    rejects(L, tape2, f"worker {w} position {i} ({L[w][i].describe()})", "no instruction raises")


def test_missing_producer_wrong_group(tape2):
    """ATTN of kv group 0 waiting on group 1's QKV counter: no deadlock, but the wrong producer."""
    L = lists_of(tape2)
    w, i = first(L, Op.ATTN)
    g1 = next(ins for lst in L for ins in lst if ins.op == Op.ATTN and ins.layer == 0
              and ins.wait_counter != L[w][i].wait_counter)
    L[w][i] = dataclasses.replace(L[w][i], wait_counter=g1.wait_counter, wait_per_step=g1.wait_per_step)
    rejects(L, tape2, f"worker {w} position {i} (ATTN layer 0 tiles", "needs QKV layer 0 kv group 0",
            "a missing producer")


def test_missing_signal(tape2):
    L = lists_of(tape2)
    L[0][0] = dataclasses.replace(L[0][0], signal_counter=-1)       # EMBED tile 0 signals nothing
    rejects(L, tape2, "QKV layer 0", "only 1 instruction raises", "never satisfied")


def test_extra_signal(tape2):
    """A counter raised more often than waited for: the next step's wait would pass early."""
    L = lists_of(tape2)
    L[1].append(dataclasses.replace(L[1][-1], signal_counter=L[0][0].signal_counter))
    L[1].pop(-2)
    rejects(L, tape2, "3 instructions raise", "later step")


def test_cycle_across_two_workers():
    """Worker 1 runs ARGMAX before EMBED; worker 0 runs everything else, starting with QKV, which
    waits for that EMBED, while ARGMAX waits for worker 0's LM head."""
    plan = make_plan(TINY["g5"], 1, 64, 1)
    tape = build_tape(plan, 1, "round-robin")
    body = tape.workers[0]
    assert body[0].op == Op.EMBED and body[-1].op == Op.ARGMAX
    L = [body[1:-1], [body[-1], body[0]]]
    validate([body[1:], [body[0]]], plan, counter_names=tape.counter_names)     # the order that works
    msg = rejects(L, tape, "deadlock", "Cycle", f"worker 0 position 0 ({body[1].describe()})",
                  "counter 1 (EMBED layer 0 group 0)", "raised by worker 1 position 1 (EMBED layer 0 tiles 0..0)",
                  "worker 1 position 0 (ARGMAX layer 0 tiles 0..0)", "LMHEAD layer 0")
    assert "behind it on worker 1" in msg and "behind it on worker 0" in msg


def test_cycle_within_a_worker(tape2):
    L = lists_of(tape2)
    L[0].insert(0, L[0].pop())      # the last instruction first: it waits on its own worker's producers
    rejects(L, tape2, "deadlock", f"worker 0 position 0 ({L[0][0].describe()})", "later on the same worker")


def test_duplicate_tile(tape2):
    L = lists_of(tape2)
    w, i = first(L, Op.GATEUP, worker=0)
    L[1].insert(5, L[w][i])
    rejects(L, tape2, f"worker 1 position 5 ({L[w][i].describe()}) repeats tiles",
            f"already scheduled by worker {w} position {i}")


def test_overlapping_tiles(tape2):
    L = lists_of(tape2)
    w, i = first(L, Op.LMHEAD)
    ins = L[w][i]
    L[w][i] = dataclasses.replace(ins, tile_end=ins.tile_end + 1)
    rejects(L, tape2, "repeats tiles", "LMHEAD layer 0")


def test_missing_tile(tape2):
    L = lists_of(tape2)
    w, i = first(L, Op.DOWN, layer=1)
    gone = L[w].pop(i)
    rejects(L, tape2, f"DOWN layer 1: tiles {gone.tile_start}..{gone.tile_end - 1} are scheduled nowhere")


def test_missing_last_tiles(tape2):
    L = lists_of(tape2)
    n = tape2.plan.tiles(Op.LMHEAD)
    w, i = next((w, i) for w, lst in enumerate(L) for i, ins in enumerate(lst)
                if ins.op == Op.LMHEAD and ins.tile_end == n)
    L[w][i] = dataclasses.replace(L[w][i], tile_end=n - 1)
    rejects(L, tape2, f"LMHEAD layer 0: tiles {n - 1}..{n - 1} are scheduled nowhere (last is worker {w} "
            f"position {i}")


@pytest.mark.parametrize("change, fragment", [
    (dict(op=99), "unknown opcode 99"),
    (dict(layer=7), "layer 7 does not exist"),
    (dict(tile_start=3, tile_end=3), "not a non-empty range"),
    (dict(tile_end=10_000), "not a non-empty range"),
    (dict(signal_counter=0), "signals counter 0"),
    (dict(wait_counter=0), "counter 0 is reserved"),
])
def test_malformed(tape2, change, fragment):
    L = lists_of(tape2)
    w, i = first(L, Op.OPROJ, worker=1)
    L[w][i] = dataclasses.replace(L[w][i], **change)
    rejects(L, tape2, f"worker {w} position {i}", fragment)


def test_counter_out_of_range(tape2):
    L = lists_of(tape2)
    w, i = first(L, Op.OPROJ, worker=1)
    L[w][i] = dataclasses.replace(L[w][i], signal_counter=tape2.num_counters)
    with pytest.raises(TapeError, match=f"worker {w} position {i}.*out of range"):
        validate(dataclasses.replace(tape2, workers=L))


@pytest.fixture
def super2():
    plan = make_plan(TINY["g2"], 2, 64, 2)
    return build_tape(plan, 2, "balanced", "superkernel")


def test_superkernel_missing_barrier(super2):
    L = lists_of(super2)
    w, i = first(L, Op.BARRIER, worker=1)
    L[1].pop(i)
    rejects(L, super2, "worker 0 position", "(BARRIER)", "every worker must reach each barrier")


def test_superkernel_barriers_out_of_order(super2):
    L = lists_of(super2)
    a, b = [i for i, ins in enumerate(L[1]) if ins.op == Op.BARRIER][:2]
    L[1][a], L[1][b] = L[1][b], L[1][a]
    rejects(L, super2, "deadlock", "(BARRIER)")


def test_superkernel_consumer_before_barrier(super2):
    L = lists_of(super2)
    w, i = first(L, Op.QKV, worker=1)
    L[1].insert(0, L[1].pop(i))      # QKV ahead of the barrier after EMBED
    rejects(L, super2, f"worker 1 position 0 ({L[1][0].describe()}) needs EMBED layer 0",
            "is not before a barrier")


def test_superkernel_swapped_stages(super2):
    """A consumer and its producer swapped on one worker, both within one barrier interval."""
    L = lists_of(super2)
    w, i = first(L, Op.OPROJ, worker=0)
    j = next(j for j in range(i + 1, len(L[0])) if L[0][j].op == Op.GATEUP)
    L[0][i], L[0][j] = L[0][j], L[0][i]
    L[0] = [x for x in L[0] if not (x.op == Op.BARRIER and x.layer == stage_rank(super2.plan)[(Op.OPROJ, 0)])]
    L[1] = [x for x in L[1] if not (x.op == Op.BARRIER and x.layer == stage_rank(super2.plan)[(Op.OPROJ, 0)])]
    rejects(L, super2, "needs OPROJ layer 0", "not before a barrier")


def test_raw_lists_need_plan(tape2):
    with pytest.raises(TypeError):
        validate(tape2.workers)
    validate(tape2.workers, tape2.plan)     # mode inferred: no barriers, megakernel
    with pytest.raises(TapeError, match="no workers"):
        validate([], tape2.plan)


def test_empty_worker_lists_are_fine():
    """More workers than instructions in a stage leaves some workers idle in it; a worker may have
    nothing at all."""
    plan = make_plan(TINY["odd"], 1, 8, 1)
    tape = build_tape(plan, 1, "round-robin")
    validate(tape.workers + [[], []], plan)
    assert dependent_steps(tape.workers + [[]]) == 5 * plan.L + 2


def test_build_tape_rejects_bad_arguments():
    plan = make_plan(TINY["odd"], 1, 8, 2)
    for kwargs in (dict(strategy="random"), dict(mode="fast"), dict(workers=0)):
        with pytest.raises(ValueError):
            build_tape(plan, **{"workers": 2, **kwargs})


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 40000), workers=st.integers(1, 600), cap=st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
def test_balanced_rows(n, workers, cap):
    """The gate/up rows per tile: a power of two within the cap, whose busiest worker holds at
    most 1.1x the fewest rows any allowed tile size gives it, and the largest such."""
    from scheduler.ops import _balanced

    def busiest(r):
        return -(-(-(-n // r)) // workers) * r
    r = _balanced(cap, n, workers)
    sizes = [1 << i for i in range(cap.bit_length())]
    assert r in sizes
    best = min(busiest(s) for s in sizes)
    assert busiest(r) <= 1.1 * best
    assert all(busiest(s) > 1.1 * best for s in sizes if s > r)


def test_balanced_gateup_plan():
    """0.6b at 172 workers: 8-row gate/up tiles (384) leave some workers 24 rows, 4-row tiles (768)
    20, 2-row tiles (1536) 18, the fewest; 8b keeps its 2-row tiles (47 vs 48 rows is inside the
    slack). At 264 workers 0.6b's gate/up is placed by when its workers get there (``lagged``), with
    tiles of the whole register budget."""
    assert make_plan(PRESETS["0.6b"], 1, 392, 172).R_GU == 2
    assert make_plan(PRESETS["8b"], 1, 392, 264).R_GU == 2
    assert make_plan(PRESETS["0.6b"], 1, 392, 264).R_GU == 8
    assert make_plan(PRESETS["0.6b"], 4, 392, 264).R_GU == 64     # batched plans have their own rule


@pytest.mark.parametrize("name", ["0.6b", "1.7b", "8b", "14b", "32b"])
@pytest.mark.parametrize("batch,workers", [(2, 264), (8, 264), (16, 132), (64, 264), (5, 7)])
def test_batched_plan_rows(name, batch, workers):
    """From batch 2 every GEMV is on the weights-on-M tile: 64-row blocks (wgmma's M), each split over
    K so that the stage has at most a tile a worker where the blocks are fewer than the workers, the
    splits a power of two over whole 128-column chunks, the most that fit (from batch 32 at most
    about sqrt(K / 2B): a split's weights against the partials its block's last split sums); no QKV tile straddles two
    kv heads' rows (attention waits on each head's own tiles)."""
    from scheduler.graph import qkv_group
    from scheduler.ops import SWAP_ROWS
    cfg = PRESETS[name]
    p = make_plan(cfg, batch, 392, workers)
    assert p.BATCHED == 2
    assert p.R_O == p.R_GU == p.R_DOWN == p.R_LM == SWAP_ROWS
    for op, sk, n, k in ((Op.QKV, p.SK_QKV, p.QKV_ROWS, p.H), (Op.OPROJ, p.SK_O, p.H, p.HQ * p.D),
                         (Op.GATEUP, p.SK_GU, p.I, p.H), (Op.DOWN, p.SK_DOWN, p.H, p.I)):
        blocks = p.tiles(op) // sk
        assert sk & (sk - 1) == 0 and k % sk == 0
        assert sk == 1 or (blocks * sk <= workers and (k // sk) % 128 == 0), (op, sk)
        more = 2 * sk
        capped = batch >= 32 and more * more > k / batch       # balanced-splits: past sqrt(K / 2B), rounded
        assert capped or blocks * more > workers or k % more or (k // more) % 128, (op, sk, "a split more would fit")
    by_row = dataclasses.replace(p, R_QKV=1, SK_QKV=1)     # qkv_group of a one-row tile: its row's kv head
    for t in range(p.tiles(Op.QKV)):
        rb = t // p.SK_QKV
        rows = range(rb * p.R_QKV, min((rb + 1) * p.R_QKV, p.QKV_ROWS))
        assert {qkv_group(by_row, r) for r in rows} == {qkv_group(p, t)}, t


@pytest.mark.parametrize("n,late,workers", [(384, 128, 264), (10, 3, 7), (5, 4, 8), (100, 1, 2), (3, 2, 4)])
def test_lagged_gateup_cut(n, late, workers):
    """The late workers' pieces hold m tiles, the early workers' at most m + 1, m the least with
    which late * m + early * (m + 1) tiles cover the stage; together they cover it once, in order."""
    stage = Stage(Op.GATEUP, 0, [Segment(7, 7 + n, (Op.GATEUP, 0, 0))], [(Op.OPROJ, 0, 0)])
    late_p, early_p = lagged_gateup(stage, late, workers)
    m = next(m for m in range(1, n + 1) if late * m + (workers - late) * (m + 1) >= n)
    assert len(late_p) <= late and len(early_p) <= workers - late
    assert all(b - a == m for a, b, _, _ in late_p[:-1]) and all(0 < b - a <= m for a, b, _, _ in late_p)
    assert all(0 < b - a <= m + 1 for a, b, _, _ in early_p)
    cuts = [(a, b) for a, b, _, _ in late_p + early_p]
    assert cuts[0][0] == 7 and cuts[-1][1] == 7 + n and all(x[1] == y[0] for x, y in zip(cuts, cuts[1:]))


@pytest.mark.parametrize("seq", [64, 392, 4096])
def test_lagged_mlp_placement(seq):
    """0.6b at batch 1 on 264 workers (O on half of them): a group's early attention splits go to the
    lower half of the workers and its late ones to the upper half (so that the two workers of an
    SM hold one of each), each layer's O tiles to the workers whose attention split is latest in its
    group, gate/up gives them one tile each and the others at most two, and down runs on the O
    workers alone, two tiles each. Not in a superkernel tape, nor with
    round-robin, nor at batch 2 or 1.7b."""
    cfg = PRESETS["0.6b"]
    plan = make_plan(cfg, 1, seq, 264)
    assert lagged(plan, 264) and plan.R_GU == 8
    tape = build_tape(plan, 264)
    check_invariants(tape)
    for layer in (0, 13, 27):
        held = defaultdict(lambda: defaultdict(int))       # op: worker: tiles
        split = {}
        for w, _, ins in tape.instructions():
            if ins.layer == layer and ins.op in (Op.ATTN, Op.OPROJ, Op.GATEUP, Op.DOWN):
                held[ins.op][w] += ins.ntiles
                if ins.op == Op.ATTN:
                    split[w] = min(split.get(w, plan.NSPLIT), ins.tile_start % plan.NSPLIT)
        o = set(held[Op.OPROJ])
        assert len(o) == plan.tiles(Op.OPROJ) == 128 and set(held[Op.OPROJ].values()) == {1}
        # a group's early splits on the lower half of the workers, its late ones 132 workers on
        tile_of = {w: ins.tile_start for w, _, ins in tape.instructions() if ins.layer == layer and ins.op == Op.ATTN}
        worker_of = {t: w for w, t in tile_of.items()}
        half = plan.NSPLIT // 2
        assert all(worker_of[t + half] == worker_of[t] + 132 < 264 for t in worker_of if t % plan.NSPLIT < half)
        assert o <= set(range(132, 264))
        assert min(split.get(w, plan.NSPLIT) for w in o) >= max(split[w] for w in split if w not in o)
        assert {held[Op.GATEUP][w] for w in o} == {1}
        assert max(held[Op.GATEUP][w] for w in range(264) if w not in o) == 2
        # the tape pairs rows w and w + 132 on an SM: no SM holds four gate/up tiles (384 over 132)
        per_sm = [held[Op.GATEUP][w] + held[Op.GATEUP][w + 132] for w in range(132)]
        assert sum(per_sm) == plan.tiles(Op.GATEUP) and max(per_sm) == 3
        assert set(held[Op.DOWN]) == o and set(held[Op.DOWN].values()) == {2}
    assert tape.sm_mates
    assert not build_tape(plan, 264, mode="superkernel").sm_mates and not build_tape(make_plan(cfg, 2, seq, 264), 264).sm_mates
    assert not lagged(plan, 264, mode="superkernel") and not lagged(plan, 264, strategy="round-robin")
    assert not lagged(make_plan(cfg, 2, seq, 264), 264) and not lagged(make_plan(PRESETS["1.7b"], 1, seq, 264), 264)


@pytest.mark.parametrize("size", ["0.6b", "1.7b", "4b", "8b", "14b", "32b"])
@pytest.mark.parametrize("workers", [264, 132, 8])
def test_batch1_down_tiles(size, workers):
    """At batch 1 a down chunk holds half the weights the register budget allows where a down row
    takes more than two chunks (half the bytes in flight at its wait; docs/performance.md, "GEMV tile sizes"), the
    whole budget where it takes one or two (0.6b, 1.7b). Where the down rows are longer than four
    chunks (14b, 32b) that half is cut half as wide and twice as tall."""
    from scheduler.ops import _rows
    cfg = PRESETS[size]
    b1, b2 = make_plan(cfg, 1, 392, workers), make_plan(cfg, 2, 392, workers)
    full = _rows(cfg.hidden_size, cfg.intermediate_size, workers)      # the whole register budget
    long_rows = cfg.intermediate_size > 4 * b2.BK_I
    assert long_rows == (size in ("14b", "32b"))
    halved = cfg.intermediate_size > 2 * b2.BK_I
    assert halved == (size not in ("0.6b", "1.7b"))
    assert b1.BK_I == (b2.BK_I // 2 if long_rows else b2.BK_I)
    assert b1.R_DOWN * b1.BK_I == (max(1, full // 2) if halved else full) * b2.BK_I
    assert b1.R_DOWN * b1.BK_I <= 16384
    validate(build_tape(b1, workers))


@pytest.mark.parametrize("size", list(PRESETS))
@pytest.mark.parametrize("workers", [264, 132])
def test_one_piece_per_worker_where_segments_allow(size, workers):
    """A stage of no more segments than workers gives no worker two of its instructions, and its
    largest piece is the smallest any cut along the segments allows (8b's QKV at 264 workers: 24
    segments of 128 and 32 tiles, where rounding each segment up made 272 pieces and left 8
    workers 10 tiles; docs/performance.md, "Placement"). (A lagged tape cuts gate/up and down by when their
    workers get there instead: ``test_lagged_mlp_placement``.)"""
    for batch in (1, 8):
        plan = make_plan(PRESETS[size], batch, 392, workers)
        tape = build_tape(plan, workers)
        for stage in build_stages(plan)[:8]:
            if lagged(plan, workers) and stage.op in (Op.GATEUP, Op.DOWN):
                continue
            sizes = [s.tile_end - s.tile_start for s in stage.segments]
            held = defaultdict(list)
            for w, _, ins in tape.instructions():
                if (ins.op, ins.layer) == (stage.op, stage.layer):
                    held[w].append(ins.ntiles)
            if len(sizes) <= workers:
                assert max(len(v) for v in held.values()) == 1, (stage.op.name, stage.layer)
                # no cut of these segments into at most `workers` pieces has a smaller largest piece
                best = next(c for c in range(1, max(sizes) + 1) if sum(-(-n // c) for n in sizes) <= workers)
                assert max(max(v) for v in held.values()) == best, (stage.op.name, best)


@pytest.mark.parametrize("size", list(PRESETS))
@pytest.mark.parametrize("workers", [264, 132])
def test_pools_where_workers_stream_several_tiles(size, workers):
    """At batch 1, where gate/up streams at least POOL_MIN_BYTES a worker (8b, 14b, 32b at 264
    workers; docs/performance.md, "Placement"), a GEMV stage (not QKV, whose tiles attention waits on by kv group)
    whose tiles give every worker at least POOL_MIN_TILES leaves 1 / POOL_DIV of them to a pool;
    smaller models, batches and superkernel tapes have none. The tape's instructions of a pooled
    stage claim from one counter of their own, counting the pool plus one claim each a step."""
    from scheduler.ops import POOL_DIV, POOL_MIN_BYTES, POOL_MIN_TILES, cost, without_pools
    plan = make_plan(PRESETS[size], 1, 392, workers)
    pooled = cost(plan, Op.GATEUP, plan.tiles(Op.GATEUP)) >= POOL_MIN_BYTES * workers
    assert pooled == (size in ("8b", "14b", "32b") or (size, workers) == ("4b", 132))
    for op in (Op.OPROJ, Op.GATEUP, Op.DOWN, Op.LMHEAD):
        n = plan.tiles(op)
        assert plan.pool(op) == (n // POOL_DIV if pooled and n >= POOL_MIN_TILES * workers else 0), op.name
    assert plan.pool(Op.QKV) == 0 and (plan.POOL_LM > 0) == pooled
    assert not any(make_plan(PRESETS[size], 2, 392, workers).pool(op) for op in Op)
    if (size, workers) == ("14b", 264):     # pools in every stage but QKV (other presets: test_preset_tapes_validate)
        assert all(plan.pool(op) for op in (Op.OPROJ, Op.GATEUP, Op.DOWN, Op.LMHEAD))
        check_invariants(build_tape(plan, workers))
        sk = build_tape(plan, workers, mode="superkernel")
        assert sk.plan == without_pools(plan)
        assert all(i.pool_counter == i.pool_claims == 0 for _, _, i in sk.instructions())


@pytest.mark.parametrize("size", list(PRESETS))
@pytest.mark.parametrize("workers", [264, 132])
def test_new_position_split_at_short_contexts(size, workers):
    """Attention's split 0 holds the new position alone (ATTN_NEW) where a layer's weights are under
    ATTN_NEW_MAX_BYTES a worker (0.6b only) and every cached split, cut over NSPLIT - 1 splits, is
    still one block at max_seq_len (docs/performance.md, "Attention"): the recorded runs' 392 at batch 1 (and 32, where
    0.6b's splits are not capped by the blocks), and 2 at 264 workers; not at 1024 (32 splits: 1024 /
    31 > 32 positions), nor where a batch leaves few splits (batch 2 at 132 workers: 8), nor with one
    split (the other sizes at 32), which a plan refuses to combine with it."""
    from scheduler.ops import ATTN_NEW_MAX_BYTES, cost
    cfg = PRESETS[size]
    small = size == "0.6b"
    for batch, seq, want in ((1, 392, small), (2, 392, small and workers == 264), (1, 1024, False), (8, 392, False),
                             (1, 32, small)):
        plan = make_plan(cfg, batch, seq, workers)
        assert plan.ATTN_NEW == want, (batch, seq, plan.NSPLIT)
        if batch == 1 and seq == 392:
            layer = sum(cost(plan, op, plan.tiles(op)) for op in (Op.QKV, Op.OPROJ, Op.GATEUP, Op.DOWN))
            assert (layer < ATTN_NEW_MAX_BYTES * workers) == small
            assert -(-seq // (plan.NSPLIT - 1)) <= plan.BLOCK_S
    with pytest.raises(ValueError, match="ATTN_NEW=1 needs NSPLIT >= 2"):
        dataclasses.replace(make_plan(cfg, 1, 392, workers), ATTN_NEW=1, NSPLIT=1)


@pytest.mark.parametrize("size", list(PRESETS))
@pytest.mark.parametrize("workers", [264, 132])
def test_short_layers_split_on_every_worker(size, workers):
    """Where a layer's weights are under ATTN_NEW_MAX_BYTES a worker (0.6b) a batch-1 plan gives every
    worker an attention split whatever max_seq_len (the splits past the context are empty) and O tiles
    of twice the rows, where the registers allow: at 264 workers half the workers hold one. Other
    sizes, and batches, keep splits capped by the blocks of max_seq_len and the O tiles the register
    budget gives (batches: ``swap_rows``)."""
    from scheduler.ops import TILE_ELEMS, _rows, swap_rows
    cfg = PRESETS[size]
    short = size == "0.6b"
    splits = 1 << (workers // cfg.num_key_value_heads).bit_length() - 1
    for batch, seq in ((1, 64), (1, 392), (1, 4096), (2, 392), (8, 392)):
        plan = make_plan(cfg, batch, seq, workers)
        capped = min(splits // batch, 1 << (-(-seq // plan.BLOCK_S) - 1).bit_length())
        assert plan.NSPLIT == (splits if short and batch == 1 else capped), (batch, seq)
        r_o = _rows(cfg.hidden_size, cfg.q_size, workers) if batch == 1 else swap_rows(cfg.hidden_size)
        if short and batch == 1:
            assert plan.R_O == min(2 * r_o, TILE_ELEMS // plan.BK_Q), seq
            if workers == 264:
                assert workers // 4 < plan.tiles(Op.OPROJ) <= workers // 2
            check_invariants(build_tape(plan, workers))     # the plans this rule changes
        else:
            assert plan.R_O == r_o, (batch, seq)


@pytest.fixture
def pooled():
    """A tape with pools in the O projection and the LM head (2 workers)."""
    plan = dataclasses.replace(make_plan(TINY["g5"], 1, 64, 2), R_O=8, POOL_O=5, POOL_GU=0, POOL_DOWN=0, POOL_LM=3)
    tape = build_tape(plan, 2, "round-robin", "megakernel")
    check_invariants(tape)
    return tape


@pytest.mark.parametrize("change, fragment", [
    (lambda ins, t: dict(pool_claims=ins.pool_claims + 1), "where its pool of 5 tiles and the stage's 2 "
                                                            "instructions make 7"),
    (lambda ins, t: dict(pool_counter=ins.signal_counter), "not a counter of its own"),
    (lambda ins, t: dict(tile_end=t.plan.tiles(Op.OPROJ)), "which are its pool's"),
])
def test_bad_pool(pooled, change, fragment):
    L = lists_of(pooled)
    w, i = first(L, Op.OPROJ, layer=1, worker=1)
    L[w][i] = dataclasses.replace(L[w][i], **change(L[w][i], pooled))
    rejects(L, pooled, fragment)


def test_pool_counter_out_of_range(pooled):
    L = lists_of(pooled)
    for w, lst in enumerate(L):
        L[w] = [dataclasses.replace(i, pool_counter=pooled.num_counters) if i.op == Op.OPROJ and i.layer == 1 else i
                for i in lst]
    with pytest.raises(TapeError, match="OPROJ layer 1.*not a counter of its own .reserved, out of range"):
        validate(dataclasses.replace(pooled, workers=L))


def test_pool_fields_where_no_pool_or_shared(pooled):
    L = lists_of(pooled)
    w, i = first(L, Op.GATEUP, worker=0)
    o = L[w][first(L, Op.OPROJ, worker=0)[1]]
    L[w][i] = dataclasses.replace(L[w][i], pool_counter=o.pool_counter, pool_claims=o.pool_claims)
    rejects(L, pooled, f"worker {w} position {i}", "but GATEUP has no pool")
    L = lists_of(pooled)
    w, i = first(L, Op.OPROJ, layer=1, worker=0)
    o = L[w][first(L, Op.OPROJ, layer=0, worker=0)[1]]
    L[w][i] = dataclasses.replace(L[w][i], pool_counter=o.pool_counter)
    rejects(L, pooled, "which OPROJ layer 0 claims from too")


def test_batch_beyond_the_tiles_is_refused():
    """The batched tile pads the batch to at most MAX_BATCH rows: a larger batch is an error, not a
    batch cut short."""
    from scheduler.ops import MAX_BATCH
    make_plan(PRESETS["0.6b"], MAX_BATCH, 392, 264)
    with pytest.raises(ValueError, match=f"1 to {MAX_BATCH}"):
        make_plan(PRESETS["0.6b"], MAX_BATCH + 1, 392, 264)
