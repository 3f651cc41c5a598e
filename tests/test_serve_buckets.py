"""The server at every load (issue 51), on the CPU: batch buckets over one KV cache with slot
compaction, several decode steps a launch while nobody waits, and admission in one packed
prefill. Every request's greedy tokens are held to the tokens its prompt gets alone (the
reference runtime at batch 1), whatever else runs beside it; prompts are random token ids of the
run's seed."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from conftest import SEED  # noqa: E402
from test_reference_vs_hf import random_prompt  # noqa: E402
from test_serve import health, metric, post, serving, sse_events, streamed_choices, wait_for, write_checkpoint  # noqa: E402

from megakernel import MegaQwen3, load_model  # noqa: E402

MAX_SEQ_LEN = 96
# the reference backend with launches of several steps (as the megakernel's), and a launch bound
# that the CPU's step times never reach, so that the multi-step path runs
MULTI = dict(backend_options={"steps_per_launch": 8}, max_launch_ms=60_000)


@pytest.fixture(scope="module")
def ids_ckpt(tmp_path_factory):
    """A tiny checkpoint without a tokenizer (prompts and outputs are token ids), its model and
    the greedy tokens of a prompt alone."""
    folder = tmp_path_factory.mktemp("buckets") / "tiny"
    tiny = write_checkpoint(folder, (SEED + 5151) % 2**31, tokenizer=False)
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    solo = MegaQwen3(model, max_seq_len=MAX_SEQ_LEN, batch_size=1, backend="reference")

    def alone(prompt, n):
        return solo.generate([prompt], max_new_tokens=n)[0].tolist()
    return SimpleNamespace(folder=tiny.folder, vocab=tiny.vocab_size, model=model, alone=alone)


def prompts(vocab: int, k: int, salt: int) -> list[list[int]]:
    """k fresh random prompts of 2 to 17 tokens."""
    return [random_prompt(2 + (salt * 7 + 5 * i) % 16, vocab, SEED + 1000 * salt + i) for i in range(k)]


class Recorder:
    """Wraps the engine's runtime calls to record each launch (bucket, steps) and each
    admission and slot move, in order."""

    def __init__(self, engine, delay: float = 0.0):
        self.log: list[tuple] = []
        mk = engine.mk
        step, prefill, move = mk.launch_slots, mk.prefill_slots, mk.move_slot

        def launch_slots(active, steps=1, **kw):
            if delay:
                time.sleep(delay)
            out = step(active, steps, **kw)
            self.log.append(("step", mk.bucket, steps, len(list(active))))
            return out

        def prefill_slots(slots, ps):
            self.log.append(("prefill", list(slots)))
            return prefill(slots, ps)

        def move_slot(src, dst):
            self.log.append(("move", src, dst))
            return move(src, dst)
        mk.launch_slots, mk.prefill_slots, mk.move_slot = launch_slots, prefill_slots, move_slot

    def of(self, kind: str) -> list[tuple]:
        return [e for e in self.log if e[0] == kind]


def complete(s, prompt, n, **extra) -> list[int]:
    r = post(s, "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                                    **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


async def _complete_async(client, prompt, n, delay=0.0, stream=False):
    await asyncio.sleep(delay)
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    if stream:
        async with client.stream("POST", "/v1/completions", json=dict(body, stream=True)) as r:
            assert r.status_code == 200
            return streamed_choices(sse_events([line async for line in r.aiter_lines()]))[0]["ids"]
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def run_clients(s, jobs) -> list[list[int]]:
    """jobs: (prompt, max_tokens, delay before sending, stream); each one's token ids."""
    async def everyone():
        async with httpx.AsyncClient(base_url=s.url, timeout=120) as client:
            return await asyncio.gather(*(_complete_async(client, p, n, d, st) for p, n, d, st in jobs))
    return asyncio.run(everyone())


# ---------------------------------------------------------------------------------------------
# The runtime: buckets over one cache, packed prefill into chosen slots, moves


@pytest.mark.parametrize("backend,opts", [("reference", {}), ("vm", {}), ("megakernel", {"max_bk": 32})],
                         ids=["reference", "vm", "megakernel"])
def test_buckets_share_one_cache(ids_ckpt, backend, opts):
    """Batch 4 with buckets 1, 2, 4: three prompts admitted in one packed prefill into slots 2, 0
    and 1 step in bucket 4 (slot 3 idle); then slot 0's leaves, slot 2's moves into its hole and
    the two step in bucket 2, then one alone in bucket 1. Each gets its solo tokens: a bucket's
    kernels read the big cache in place (its layer stride, Plan.KV_B). The megakernel runs few
    steps (the interpreter takes about a second a step)."""
    model = ids_ckpt.model
    ps = prompts(ids_ckpt.vocab, 3, salt=1)
    want = [ids_ckpt.alone(p, 6) for p in ps]
    mk = MegaQwen3(model, max_seq_len=MAX_SEQ_LEN, batch_size=4, backend=backend, buckets=(1, 2), **opts)
    assert mk.buckets == (1, 2, 4)
    mk.reset_slots()
    where = {0: 2, 1: 0, 2: 1}                      # prompt -> slot
    logits = mk.prefill_slots([where[i] for i in range(3)], ps)
    got = {i: [int(logits[i].argmax())] for i in range(3)}

    def step(active_prompts, bucket):
        out = mk.step_slots([where[i] for i in active_prompts])
        assert mk.bucket == bucket
        for i in active_prompts:
            got[i].append(int(out[where[i]]))
    step([0, 1, 2], 4)
    assert mk.cache.lengths[3] == mk.PARK_LENGTH          # the idle slot stays parked
    step([0, 1, 2], 4)
    mk.free_slot(where.pop(1))                            # slot 0 leaves ...
    mk.move_slot(2, 0)                                    # ... and prompt 0 moves into its hole
    where[0] = 0
    for _ in range(3):
        step([0, 2], 2)
    assert mk.cache.lengths[2] == mk.PARK_LENGTH
    assert got[0] == want[0] and got[2] == want[2]
    assert got[1] == want[1][:3]
    if backend == "megakernel":
        return
    mk.free_slot(where.pop(0))
    mk.move_slot(1, 0)
    where[2] = 0
    step([2], 1)
    assert got[2] == ids_ckpt.alone(ps[2], 7)


def test_prefill_slots_packs_prompts_as_one_at_a_time(ids_ckpt):
    """Several prompts of different lengths prefilled in one pass into scattered slots give the
    logits and tokens of one prefill_slot each; the slots left out are untouched."""
    model = ids_ckpt.model
    ps = prompts(ids_ckpt.vocab, 4, salt=2)
    slots = [5, 1, 6, 3]
    one = MegaQwen3(model, max_seq_len=MAX_SEQ_LEN, batch_size=8, backend="reference")
    one.reset_slots()
    packed = MegaQwen3(model, max_seq_len=MAX_SEQ_LEN, batch_size=8, backend="reference")
    packed.reset_slots()
    want = torch.stack([one.prefill_slot(b, p) for b, p in zip(slots, ps)])
    got = packed.prefill_slots(slots, ps)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert packed.cache.lengths.tolist() == one.cache.lengths.tolist()
    assert [packed._lengths[b] for b in slots] == [len(p) for p in ps]
    for _ in range(4):
        assert packed.step_slots(slots).tolist() == one.step_slots(slots).tolist()
    with pytest.raises(ValueError, match="repeat"):
        packed.prefill_slots([1, 1], ps[:2])
    with pytest.raises(ValueError, match="outside the batch"):
        packed.prefill_slots([8], ps[:1])


def test_kv_stride_is_checked(ids_ckpt):
    """A kernel step refuses a cache view whose layer stride its plan does not say."""
    from dataclasses import replace

    from megakernel.backends import step_buffers, tile_plan
    from megakernel.buffers import cache_batch
    mk = MegaQwen3(ids_ckpt.model, max_seq_len=32, batch_size=4, backend="reference", buckets=(2,))
    view = mk._views[2]
    assert cache_batch(view.cache.k) == 4 and cache_batch(mk.cache.k) == 4
    plan = tile_plan(view, 1, max_bk=32)
    assert (plan.B, plan.KV_B, plan.kv_batch) == (2, 4, 4)
    with pytest.raises(ValueError, match="KV_B says 2"):
        step_buffers(view, replace(plan, KV_B=0))
    with pytest.raises(ValueError, match="at least the plan's batch"):
        replace(plan, KV_B=1)


# ---------------------------------------------------------------------------------------------
# The engine


def test_greedy_tokens_alone_among_others_and_across_bucket_changes(ids_ckpt):
    """One request's greedy tokens are the same (a) alone, (b) among 7 others sent at once, and
    (c) while others arrive and finish around it (the bucket grows and shrinks, slots move), with
    launches of several steps."""
    with serving(ids_ckpt.folder, batch_size=8, max_seq_len=MAX_SEQ_LEN, step_delay=0.0, **MULTI) as s:
        rec = Recorder(s.engine, delay=0.03)
        target = prompts(ids_ckpt.vocab, 1, salt=3)[0]
        want = ids_ckpt.alone(target, 64)
        assert complete(s, target, 64) == want                         # (a) alone
        assert {e[1] for e in rec.of("step")} == {1}
        assert max(e[2] for e in rec.of("step")) > 1, "no launch ran several steps"

        others = prompts(ids_ckpt.vocab, 7, salt=4)
        rec.log.clear()
        got = run_clients(s, [(target, 64, 0, True)] + [(p, 9 + 3 * i, 0, i % 2 == 0) for i, p in enumerate(others)])
        assert got[0] == want                                          # (b) among 7 others
        for i, p in enumerate(others):
            assert got[1 + i] == ids_ckpt.alone(p, 9 + 3 * i), i
        assert max(e[1] for e in rec.of("step")) >= 4, "the requests hardly ran together"

        # (c) a short one first, so that the target's slot moves when it ends; then others arrive
        # one by one, and leave, shortest first
        rec.log.clear()
        short = prompts(ids_ckpt.vocab, 1, salt=5)[0]
        jobs = [(short, 3, 0, False), (target, 64, 0.01, True)] + \
               [(p, 4 + 2 * i, 0.05 + 0.04 * i, i % 2 == 1) for i, p in enumerate(others[:5])]
        got = run_clients(s, jobs)
        assert got[1] == want                                          # (c) across bucket changes
        assert got[0] == ids_ckpt.alone(short, 3)
        for i, p in enumerate(others[:5]):
            assert got[2 + i] == ids_ckpt.alone(p, 4 + 2 * i), i
        buckets = [e[1] for e in rec.of("step")]
        assert len(set(buckets)) >= 3, f"the bucket hardly changed: {buckets}"
        assert any(b < max(buckets) for b in buckets[buckets.index(max(buckets)):]), "the bucket never shrank"
        assert rec.of("move"), "no sequence moved into a hole"
        assert health(s)["running"] == 0 and health(s)["bucket"] in s.engine.buckets
        assert metric(s, "megakernel_batch_bucket") in s.engine.buckets


def test_disconnect_frees_the_slot_and_compaction_keeps_the_others(ids_ckpt):
    """Three streams on four slots; the middle one's client goes away: its slot is freed at once,
    the highest sequence moves into it, and the two left get their solo tokens."""
    with serving(ids_ckpt.folder, batch_size=4, max_seq_len=MAX_SEQ_LEN, step_delay=0.05) as s:
        rec = Recorder(s.engine)
        a, b, c = prompts(ids_ckpt.vocab, 3, salt=6)
        results = {}

        def run(name, p):
            results[name] = complete(s, p, 30)
        ta = threading.Thread(target=run, args=("a", a))
        ta.start()
        wait_for(lambda: health(s)["running"] == 1, what="a to run")
        body = {"prompt": b, "max_tokens": 70, "temperature": 0, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()      # kept: dropping the iterator would close the stream
            assert next(line for line in lines if line.startswith("data: "))
            tc = threading.Thread(target=run, args=("c", c))
            tc.start()
            wait_for(lambda: health(s)["running"] == 3, what="c to run")
        wait_for(lambda: health(s)["running"] == 2, timeout=3, what="b's slot to be freed")
        wait_for(lambda: metric(s, "megakernel_requests_total", {"outcome": "cancelled"}) == 1,
                 what="the cancellation to be counted")
        ta.join(60)
        tc.join(60)
        assert results["a"] == ids_ckpt.alone(a, 30)
        assert results["c"] == ids_ckpt.alone(c, 30)
        assert ("move", 2, 1) in rec.log, f"c did not move into b's slot: {rec.of('move')}"
        wait_for(lambda: health(s)["running"] == 0, what="the slots to empty")


def test_requests_arriving_during_a_multi_step_launch_are_all_answered(ids_ckpt):
    """Six requests sent while a launch of several steps runs: each is answered with its solo
    tokens, and all are admitted together (one packed prefill) right after that launch: they
    waited for no more than one launch."""
    with serving(ids_ckpt.folder, batch_size=8, max_seq_len=MAX_SEQ_LEN, **MULTI) as s:
        rec = Recorder(s.engine)
        mk = s.engine.mk
        step = mk.launch_slots
        arrivals = prompts(ids_ckpt.vocab, 6, salt=7)
        results: dict[int, list[int]] = {}
        fired = threading.Event()
        senders = []

        def send(i):
            results[i] = complete(s, arrivals[i], 6 + i)

        def launch_slots(active, steps=1, **kw):
            if steps > 1 and not fired.is_set():      # the first multi-step launch: send them now
                fired.set()
                senders.extend(threading.Thread(target=send, args=(i,)) for i in range(len(arrivals)))
                for t in senders:
                    t.start()
                wait_for(lambda: health(s)["queued"] == len(arrivals), what="the arrivals to queue")
                rec.log.append(("arrived",))
            return step(active, steps, **kw)
        mk.launch_slots = launch_slots

        first = prompts(ids_ckpt.vocab, 1, salt=8)[0]
        assert complete(s, first, 30) == ids_ckpt.alone(first, 30)
        for t in senders:
            t.join(60)
        assert fired.is_set()
        assert sorted(results) == list(range(len(arrivals)))
        for i, p in enumerate(arrivals):
            assert results[i] == ids_ckpt.alone(p, 6 + i), i
        at = rec.log.index(("arrived",))
        launch, admit, after = rec.log[at + 1], rec.log[at + 2], rec.log[at + 3]
        assert launch[0] == "step" and launch[2] > 1
        assert admit == ("prefill", [1, 2, 3, 4, 5, 6]), rec.log[at:at + 4]
        assert after[0] == "step" and after[3] == 7


def test_warm_up_compiles_every_buckets_sampling_plan(ids_ckpt):
    """Where the device samples, warm-up also builds (and on a GPU compiles) each bucket's plan that
    samples, so the first sampled request waits for no compile; serving then starts greedy."""
    from megakernel.serve.engine import Engine
    from megakernel.serve.metrics import Metrics
    mk = MegaQwen3(ids_ckpt.model, max_seq_len=MAX_SEQ_LEN, batch_size=2, backend="megakernel", buckets=(1, 2))
    engine = Engine(mk, Metrics(2, 8))
    engine.warm_up(sampling=True)
    for n in (1, 2):
        be = mk.bucket_backend(n)
        assert not be.sampling and True in be._variants, n     # the sampling plan built and kept
        assert be._variants[True]["plan"].SAMPLE == 1
    assert not mk.sampled_slots() and set(engine.step_s) == {1, 2}


def test_launch_length_rules(ids_ckpt):
    """k steps a launch: 1 while someone waits for a free slot or a sampled sequence runs on a
    runtime that samples on the host (several where the device samples), never past the first sequence to finish by length, and within max_launch_ms at the
    bucket's measured step time."""
    from megakernel.serve.engine import Engine, GenParams
    from megakernel.serve.metrics import Metrics
    from models.qwen3.sampling import SamplingParams
    mk = MegaQwen3(ids_ckpt.model, max_seq_len=MAX_SEQ_LEN, batch_size=4, backend="reference", buckets=(1, 2),
                   steps_per_launch=64)
    engine = Engine(mk, Metrics(4, 8), max_launch_ms=20)

    def seq(max_tokens, out=0, temperature=0.0):
        req = SimpleNamespace(params=GenParams(SamplingParams(temperature), max_tokens))
        return SimpleNamespace(req=req, out_ids=[0] * out)
    engine.slots = [seq(50, 2), seq(30, 5), None, None]
    engine.step_s = {2: 0.001}
    assert engine._launch_steps(2) == 20               # 20 ms at 1 ms a step
    engine.step_s = {2: 0.0001}
    assert engine._launch_steps(2) == 25               # the second sequence ends in 25 tokens
    engine.slots[1] = seq(30, 29)
    assert engine._launch_steps(2) == 1
    engine.slots[1] = seq(30, 5, temperature=1.0)
    assert engine.device_sampling and engine._launch_steps(2) == 25     # sampled in the step, on the device
    engine.device_sampling = False
    assert engine._launch_steps(2) == 1                # a runtime that samples on the host: a step a launch
    engine.device_sampling = True
    engine.slots[1] = seq(30, 5)
    engine.queue.append(object())
    assert engine._launch_steps(2) == 1                # a request waits for a free slot
    engine.slots = [seq(50, 2)] * 4
    engine.step_s = {4: 0.0001}
    assert engine._launch_steps(4) == 48               # none free: nobody can be admitted anyway


def test_openai_client_on_the_multi_step_server(tmp_path, seed):
    """The official client drives completions (several prompts, admitted together) and streamed
    chat against a server of buckets and multi-step launches; the completions are each prompt's
    solo greedy tokens."""
    from test_serve import write_checkpoint as with_tokenizer
    folder = tmp_path / "chat"
    with_tokenizer(folder, seed)
    model = load_model(str(folder), device="cpu", progress=False)
    solo = MegaQwen3(model, max_seq_len=MAX_SEQ_LEN, batch_size=1, backend="reference")
    with serving(folder, batch_size=4, max_seq_len=MAX_SEQ_LEN, **MULTI) as s:
        rec = Recorder(s.engine)
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        ps = prompts(model.config.vocab_size, 3, salt=9)
        r = client.completions.create(model=s.name, prompt=ps, max_tokens=10, temperature=0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True})
        for c, p in zip(r.choices, ps):
            assert c.token_ids == solo.generate([p], max_new_tokens=10)[0].tolist()
            assert c.finish_reason == "length"
        assert ("prefill", [0, 1, 2]) in rec.log          # the list's prompts in one pass
        assert max(e[2] for e in rec.of("step")) > 1
        chunks = list(client.chat.completions.create(
            model=s.name, messages=[{"role": "user", "content": "the cat sat"}], max_tokens=12, temperature=0,
            stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}}))
        assert chunks[-1].usage.completion_tokens == 12
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
        full = client.chat.completions.create(
            model=s.name, messages=[{"role": "user", "content": "the cat sat"}], max_tokens=12, temperature=0,
            extra_body={"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}})
        assert full.choices[0].message.content == "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_first_tokens_go_out_before_the_launch_that_follows(ids_ckpt):
    """An admitted request's first token is handed to its client as soon as its prefill is done,
    not after the (possibly many-step) decode launch of the same turn: on a GPU that launch is up
    to --max-launch-ms, which the time to first token would otherwise pay."""
    from megakernel.serve.engine import Engine, GenParams, Request
    from megakernel.serve.metrics import Metrics
    from models.qwen3.sampling import SamplingParams
    mk = MegaQwen3(ids_ckpt.model, max_seq_len=MAX_SEQ_LEN, batch_size=4, backend="reference", buckets=(1, 2),
                   steps_per_launch=64)
    engine = Engine(mk, Metrics(4, 8), max_launch_ms=20)
    engine.step_s = {n: 0.0001 for n in mk.buckets}
    order = []
    launch_slots, deliver = mk.launch_slots, engine._deliver

    def step(*args, **kw):
        order.append("launch")
        return launch_slots(*args, **kw)

    def hand_out(events):
        order.append([type(ev).__name__ for _, ev in events])
        deliver(events)

    mk.launch_slots, engine._deliver = step, hand_out

    async def turn():
        req = Request([prompts(ids_ckpt.vocab, 1, 7)[0]], GenParams(SamplingParams(), 8), lambda ids: "")
        engine.queue.extend(req.seqs)
        engine._turn([])
        return req

    req = asyncio.run(turn())
    assert order[:2] == [["Delta"], "launch"], order
    assert len(req.seqs[0].out_ids) > 1      # the launch ran several steps after the first token


@pytest.mark.parametrize("backend,opts", [("reference", {"steps_per_launch": 8}), ("megakernel", {"max_bk": 32})],
                         ids=["reference", "megakernel"])
def test_a_launch_queued_before_the_last_is_read(ids_ckpt, backend, opts):
    """``launch_slots`` queues a launch without waiting for it: each launch's tokens stay its own
    though the next launch rewrites the step's buffers before they are read, and a slot freed and
    moved between two launches (its sequence ended in the first) takes its place behind them."""
    ps = prompts(ids_ckpt.vocab, 3, salt=12)
    want = [ids_ckpt.alone(p, 7) for p in ps]
    mk = MegaQwen3(ids_ckpt.model, max_seq_len=MAX_SEQ_LEN, batch_size=4, backend=backend, buckets=(1, 2), **opts)
    mk.reset_slots()
    mk.prefill_slots([0, 1, 2], ps)
    first = mk.launch_slots([0, 1, 2], steps=2)           # bucket 4
    second = mk.launch_slots([0, 1, 2], steps=2)          # queued before the first is read
    mk.free_slot(1)
    mk.move_slot(2, 1)
    third = mk.launch_slots([0, 1], steps=2)              # bucket 2
    assert first.tokens()[:3].tolist() == [w[1:3] for w in want]
    assert second.tokens()[:3].tolist() == [w[3:5] for w in want]
    assert third.tokens()[:2].tolist() == [want[0][5:7], want[2][5:7]]
    assert mk.bucket == 2 and third.done()


def test_idle_slots_between_active_ones_are_parked_after_a_launch(ids_ckpt):
    """A bucket's idle slots, wherever they lie among the active ones, run parked and are parked
    again after the launch (length PARK_LENGTH, token 0), while the active slots go on as alone."""
    ps = prompts(ids_ckpt.vocab, 4, salt=14)
    mk = MegaQwen3(ids_ckpt.model, max_seq_len=MAX_SEQ_LEN, batch_size=4, backend="reference", buckets=(1, 2),
                   steps_per_launch=4)
    mk.reset_slots()
    mk.prefill_slots([0, 1, 2, 3], ps)
    mk.free_slot(1)
    mk.free_slot(3)
    out = mk.launch_slots([0, 2], steps=3).tokens()
    assert mk.bucket == 4
    assert out[0].tolist() == ids_ckpt.alone(ps[0], 4)[1:] and out[2].tolist() == ids_ckpt.alone(ps[2], 4)[1:]
    park = mk.PARK_LENGTH
    assert [mk.cache.lengths[b].item() for b in (1, 3)] == [park, park] == [mk._lengths[b] for b in (1, 3)]
    assert [mk.tokens[b].item() for b in (1, 3)] == [0, 0]
    assert mk.cache.lengths[0].item() == len(ps[0]) + 3 and mk.cache.lengths[2].item() == len(ps[2]) + 3


def test_the_next_launch_is_queued_before_the_last_ones_tokens_are_read(ids_ckpt):
    """With every sequence greedy and nobody waiting, the engine queues the next launch before it
    reads the last one's tokens. A sequence that a stop id ends in the launch read has run on in
    the queued one: those tokens are dropped, and both requests get their solo tokens."""
    from megakernel.serve.engine import Engine, GenParams, Request
    from megakernel.serve.metrics import Metrics
    from models.qwen3.sampling import SamplingParams
    mk = MegaQwen3(ids_ckpt.model, max_seq_len=MAX_SEQ_LEN, batch_size=2, backend="reference", buckets=(1,),
                   steps_per_launch=8)
    engine = Engine(mk, Metrics(2, 8), max_launch_ms=60_000)
    engine.step_s = {n: 0.001 for n in mk.buckets}
    log = []
    launch = mk.launch_slots

    def logged(active, steps=1, **kw):
        handle = launch(active, steps, **kw)
        i = sum(e[0] == "launch" for e in log)
        log.append(("launch", i))
        read = handle.tokens
        handle.tokens = lambda: (log.append(("read", i)), read())[1]
        return handle
    mk.launch_slots = logged
    a, b = prompts(ids_ckpt.vocab, 2, salt=13)
    want_a, want_b = ids_ckpt.alone(a, 30), ids_ckpt.alone(b, 30)
    # b's stop: a token that first comes after its first token, in a launch (8 steps) not its last
    j = next(i for i in range(1, 25) if want_b[i] not in want_b[:i])

    async def serve():
        ra = Request([a], GenParams(SamplingParams(), 30), lambda ids: "")
        rb = Request([b], GenParams(SamplingParams(), 30, stop_ids=frozenset({want_b[j]})), lambda ids: "")
        engine.queue.extend(ra.seqs + rb.seqs)
        while not (ra.done and rb.done):
            engine._turn([])
        return ra.seqs[0], rb.seqs[0]
    sa, sb = asyncio.run(serve())
    assert sa.out_ids == want_a and sa.finish_reason == "length"
    assert sb.out_ids == want_b[:j + 1] and sb.finish_reason == "stop"
    m = (j - 1) // 8        # the launch that gave b's stop: the next was queued before it was read
    assert log.index(("launch", m + 1)) < log.index(("read", m)), log
    assert all(log.index(("launch", i + 1)) < log.index(("read", i)) for i in range(3)), log
