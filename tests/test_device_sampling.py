"""Sampling on the device (instructions/sample.py) against its torch reference
(models.qwen3.sampling.device_sample_reference), and the runtime's per-slot settings.

The SAMPLE kernel runs on the CPU through Triton's interpreter: on random logits (both of its
paths: candidates compacted, and the whole row where the needed level holds more than CAP), and in
every kernel backend on a tiny model, where seeded tokens must not depend on the batch, the slot
or the steps per launch.
"""

from __future__ import annotations

import math

import pytest
import torch

from models.qwen3.sampling import SamplingParams, device_sample_reference, gumbel_noise, slot_settings

from test_reference_vs_hf import random_prompt

import triton  # noqa: E402  (after conftest has chosen the interpreter)
import triton.language as tl  # noqa: E402

from instructions.sample import gumbel  # noqa: E402


@triton.jit
def noise(out_ptr, bits_ptr, seed, pos, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, gumbel(seed, pos, i))
    z = i * 0
    r, _, _, _ = tl.philox(seed, i, z + pos, z, z)
    tl.store(bits_ptr + i, r.to(tl.int64))


def _kernel_sample(logits, inv, topk, topp, seed, pos, chunk=4096, with_stats=False):
    """Run the per-op sampling kernels (SSTATS and SPICK over chunks of ``chunk`` logits, then
    SAMPLE) on ``logits`` with an amax word from their argmax; the chosen tokens."""
    from instructions.common import argmax_key_ref
    from instructions.sample import CAP, NS, sample_kernel, spick_kernel, sstats_kernel
    B, V = logits.shape
    best, idx = logits.max(1)
    amax = argmax_key_ref(best, idx)
    lengths = (pos - 1).to(torch.int32)
    nch = -(-V // chunk)
    stats = torch.full((B, (nch + 1) * NS.value), float("nan"), device=logits.device)
    cand = torch.zeros(B, CAP.value, device=logits.device)
    cidx = torch.zeros(B, CAP.value, dtype=torch.int32, device=logits.device)
    sstats_kernel[(B * nch,)](logits, amax, lengths, inv, topk, topp, seed, stats, V=V, SAMPLE_CHUNK=chunk)
    spick_kernel[(B * nch,)](logits, amax, inv, topk, topp, stats, cand, cidx, V=V, SAMPLE_CHUNK=chunk)
    sample_kernel[(B,)](logits, amax, lengths, inv, topk, topp, seed, stats, cand, cidx, V=V, SAMPLE_CHUNK=chunk)
    tokens = 4294967295 - (amax & 4294967295)
    return (tokens, stats.view(B, nch + 1, NS.value)) if with_stats else tokens


def _settings(rows):
    """(inv_temp, top_k, top_p, seed) tensors of SamplingParams rows."""
    cols = list(zip(*(slot_settings(p, 10 ** 9) for p in rows)))
    return (torch.tensor(cols[0], dtype=torch.float32), torch.tensor(cols[1], dtype=torch.int32),
            torch.tensor(cols[2], dtype=torch.float32), torch.tensor(cols[3], dtype=torch.int64))


def test_kernel_matches_reference_on_logits(seed):
    g = torch.Generator().manual_seed(seed)
    V = 2500
    rows = [SamplingParams(1.0, seed=seed), SamplingParams(0.7, top_k=40, seed=seed + 1),
            SamplingParams(), SamplingParams(1.5, top_p=0.8, seed=seed + 2),
            SamplingParams(0.6, top_k=20, top_p=0.95, seed=seed + 3), SamplingParams(2.0, top_k=1, seed=5),
            SamplingParams(1.0, top_k=1500, top_p=0.99, seed=(1 << 62) + seed),   # > CAP: the whole row
            SamplingParams(1.0, top_p=0.9, seed=seed + 4), SamplingParams(0.5, top_k=5, top_p=0.9, seed=seed + 5)]
    logits = torch.randn(len(rows), V, generator=g) * 4
    logits[8] *= 100                    # wide: the top-k set lies below the lowest level (the whole row)
    logits[0] *= 10                     # pure temperature, candidates compacted (within 32 of the max)
    logits[7] *= 0.001                  # flat: top-p's level holds the whole row
    logits[3, 17] = logits[3, 18] = logits[3].max() + 1     # a tie at the top
    inv, topk, topp, sd = _settings(rows)
    pos = torch.arange(len(rows)) * 7 + 3
    for trial, chunk in ((0, 4096), (1, 4096), (1, 512), (1, 1000)):     # one chunk; five, the last one short
        want = device_sample_reference(logits, inv, topk, topp, sd, pos + trial)
        got = _kernel_sample(logits, inv, topk, topp, sd, pos + trial, chunk)
        assert got.tolist() == want.tolist(), chunk
        assert want[2] == logits[2].argmax() and want[5] == logits[5].argmax()    # greedy, top-k 1


def test_a_max_far_above_the_rest_still_compacts(seed):
    """A row whose max stands far above the rest (as the random 0.6b model's sampled rows do at
    times), at T = 0.8: 30 tokens 8.3 / T below it, 3000 more 12 / T below. With levels a factor 2
    apart the first holding 20 tokens (16) held 3031, past CAP, and the whole row was read dozens of
    times; the level at 2^3.5 holds 31. The draw equals the reference's."""
    from instructions.sample import CAP, NL
    g = torch.Generator().manual_seed(seed)
    V = 20000
    d = torch.full((2, V), 40.0)
    d[:, 100:130] = 8.3
    d[:, 1000:4000] = 12.0
    d[:, 7] = 0.0
    logits = -0.8 * d + (torch.rand(2, V, generator=g) - 0.5) * 0.01     # jitter within each group
    rows = [SamplingParams(0.8, top_k=20, top_p=0.95, seed=seed), SamplingParams(0.8, top_k=30, seed=seed + 1)]
    inv, topk, topp, sd = _settings(rows)
    pos = torch.tensor([40, 41])
    got, stats = _kernel_sample(logits, inv, topk, topp, sd, pos, with_stats=True)
    assert got.tolist() == device_sample_reference(logits, inv, topk, topp, sd, pos).tolist()
    level, n = stats[:, -1, 0], stats[:, -1, 1]      # SPICK's choice: the level and its candidates
    assert (level < NL.value).all() and (n == 31).all(), stats[:, -1, :2]


def test_philox_noise_is_tritons():
    """The torch Philox is ``tl.philox``'s, bit for bit; the noise made from it agrees to float32
    rounding (log's last bit may differ between implementations)."""
    from models.qwen3.sampling import philox
    for s, pos in ((0, 0), (12345, 7), ((1 << 63) - 1, 4095)):
        out, bits = torch.zeros(64), torch.zeros(64, dtype=torch.int64)
        noise[(1,)](out, bits, s, pos, N=64)
        idx = torch.arange(64)
        assert torch.equal(bits & 0xFFFFFFFF, philox(s, idx, torch.full_like(idx, pos)))
        assert torch.allclose(out, gumbel_noise(s, pos, idx), rtol=1e-6, atol=1e-6)


def _chi_square(draws: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    n = draws.numel()
    seen = torch.bincount(draws, minlength=probs.numel()).double()
    keep = probs > 0
    assert seen[~keep].sum() == 0, "a token outside the allowed set was drawn"
    expected = probs[keep].double() * n
    return float(((seen[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


@pytest.mark.parametrize("params", [SamplingParams(0.8), SamplingParams(1.3, top_k=4),
                                    SamplingParams(1.0, top_p=0.7)], ids=["temperature", "top-k", "top-p"])
def test_distribution_follows_softmax(seed, params):
    """Over many seeds (and positions) the draws follow softmax(logits / T) restricted to the allowed
    tokens: a chi-square test at the 0.1% level (critical values of 1 to 7 degrees of freedom)."""
    V, n = 8, 3000
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(seed)) * 1.5
    rows = [SamplingParams(params.temperature, params.top_k, params.top_p, seed * 7919 + i) for i in range(n)]
    inv, topk, topp, sd = _settings(rows)
    draws = device_sample_reference(logits.expand(n, V), inv, topk, topp, sd, torch.arange(n) % 97)
    z = logits[0] / params.temperature
    allowed = torch.ones(V, dtype=torch.bool)
    if params.top_k:
        allowed &= logits[0] >= logits[0].topk(params.top_k).values[-1]
    p = torch.softmax(z.masked_fill(~allowed, float("-inf")), -1)
    if params.top_p:
        order = p.argsort(descending=True)
        before = p[order].cumsum(0) - p[order]
        allowed[order[before >= params.top_p]] = False
        p = torch.softmax(z.masked_fill(~allowed, float("-inf")), -1)
    chi2, dof = _chi_square(draws, p)       # (it also asserts nothing outside the allowed set was drawn)
    if dof:     # one allowed token (top-p met by the first): the check above is the whole test
        critical = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}[dof]
        assert chi2 < critical, (chi2, dof, p.tolist())


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=float("nan")), "temperature"), (dict(temperature=float("inf")), "temperature"),
    (dict(temperature=1.0, top_k=2.5), "top-k"), (dict(temperature=1.0, top_p=float("nan")), "top-p"),
    (dict(temperature=1.0, seed=1.5), "seed"), (dict(temperature=-0.1), "temperature"),
])
def test_bad_settings_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.fixture
def tiny_model(tiny_checkpoint):
    from megakernel import load_model
    tiny = tiny_checkpoint(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)
    return load_model(str(tiny.folder), device="cpu", progress=False)


def test_bad_settings_refused_before_any_work(tiny_model):
    from megakernel import MegaQwen3
    mk = MegaQwen3(tiny_model, max_seq_len=32, batch_size=2, backend="reference")
    mk.prefill([[1, 2, 3], [4, 5]])
    before = (mk.tokens.clone(), mk.cache.lengths.clone())
    for bad in (dict(temperature=-1.0), dict(temperature=1.0, top_k=0), dict(temperature=1.0, top_p=1.5)):
        with pytest.raises(ValueError):
            mk.generate([[1, 2, 3], [4, 5]], max_new_tokens=4, **bad)
    with pytest.raises(TypeError, match="SamplingParams"):
        mk.set_slot_sampling(0, dict(temperature=1.0))
    with pytest.raises(ValueError, match="slot 5"):
        mk.set_slot_sampling(5, SamplingParams(1.0))
    assert torch.equal(mk.tokens, before[0]) and torch.equal(mk.cache.lengths, before[1])
    assert mk.sampled_slots() == []


def _slot_run(model, backend, batch, slot, prompt, params, n, others=(), per_launch=None):
    """Prefill ``prompt`` into ``slot`` of a batch (the other slots: ``others``' prompts and settings)
    and decode n tokens; the slot's tokens, the first from prefill."""
    from megakernel import MegaQwen3
    mk = MegaQwen3(model, max_seq_len=40, batch_size=batch, backend=backend)
    mk.reset_slots()
    for b, (p, sp) in zip([b for b in range(batch) if b != slot], others):
        mk.set_slot_sampling(b, sp)
        mk.prefill_slot(b, p)
    mk.set_slot_sampling(slot, params)
    mk.prefill_slot(slot, prompt)
    first = int(mk.tokens[slot])
    rest = mk.steps(n - 1, per_launch=per_launch)
    return [first] + rest[slot].tolist(), mk


@pytest.mark.slow
def test_seeded_tokens_do_not_depend_on_batch_slot_or_launch(tiny_model, seed):
    """A seeded sequence's tokens on the megakernel: alone at batch 1 with one step a launch, in
    slot 5 of a batch of 8 among greedy and other sampled sequences, in launches of 4 steps; and
    the reference backend's, and vm's (drawn on the host)."""
    V = tiny_model.config.vocab_size
    prompt = random_prompt(5, V, seed)
    params = SamplingParams(1.2, top_k=50, top_p=0.9, seed=seed)
    others = [(random_prompt(3 + i, V, seed + 10 + i), SamplingParams(0.9, seed=i) if i % 2 else SamplingParams())
              for i in range(7)]
    want, _ = _slot_run(tiny_model, "reference", 1, 0, prompt, params, 9)
    assert _slot_run(tiny_model, "vm", 2, 1, prompt, params, 9, others[:1])[0] == want
    alone, mk1 = _slot_run(tiny_model, "megakernel", 1, 0, prompt, params, 9, per_launch=1)
    assert mk1.steps_per_launch > 1 and mk1.backend.plan.SAMPLE == 1
    assert alone == want
    batched, mk8 = _slot_run(tiny_model, "megakernel", 8, 5, prompt, params, 9, others, per_launch=4)
    assert batched == want
    # the greedy slots beside it decode greedily
    for b, (p, sp) in zip([0, 2], [others[0], others[2]]):
        assert sp.greedy
        ref, _ = _slot_run(tiny_model, "reference", 1, 0, p, sp, 9)
        assert int(mk8.tokens[b]) == ref[-1]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["per-op", "superkernel"])
def test_other_kernel_backends_sample_as_the_reference(tiny_model, seed, backend):
    from megakernel import MegaQwen3
    V = tiny_model.config.vocab_size
    prompts = [random_prompt(4, V, seed), random_prompt(6, V, seed + 1)]
    kw = dict(max_new_tokens=6, temperature=0.8, top_k=30, top_p=0.95, seed=seed)
    want = MegaQwen3(tiny_model, max_seq_len=32, batch_size=2, backend="reference").generate(prompts, **kw)
    mk = MegaQwen3(tiny_model, max_seq_len=32, batch_size=2, backend=backend)
    assert mk.device_sampling
    assert torch.equal(mk.generate(prompts, **kw), want)
    # back to greedy: the backend's greedy plan again, and argmax tokens
    greedy = MegaQwen3(tiny_model, max_seq_len=32, batch_size=2, backend="reference").generate(prompts, max_new_tokens=4)
    assert torch.equal(mk.generate(prompts, max_new_tokens=4), greedy)
    assert mk.backend.plan.SAMPLE == 0


@pytest.mark.slow
def test_greedy_and_top_k_1_unchanged_on_the_megakernel(tiny_model, seed):
    """Greedy decoding keeps the greedy plan (no SAMPLE stage); top-k 1 at any temperature, and a
    greedy slot beside sampled ones, give the greedy tokens."""
    from megakernel import MegaQwen3
    V = tiny_model.config.vocab_size
    prompts = [random_prompt(4, V, seed), random_prompt(7, V, seed + 1)]
    mk = MegaQwen3(tiny_model, max_seq_len=32, batch_size=2, backend="megakernel")
    greedy = mk.generate(prompts, max_new_tokens=8)
    assert mk.backend.plan.SAMPLE == 0
    assert not any(ins.op == 13 for _, _, ins in mk.backend.tape.instructions())
    assert torch.equal(mk.generate(prompts, max_new_tokens=8, temperature=2.5, top_k=1, seed=seed), greedy)
    assert mk.backend.plan.SAMPLE == 1
    # slot 0 greedy, slot 1 sampled
    mk.reset_slots()
    mk.set_slot_sampling(1, SamplingParams(1.0, seed=seed))
    mk.prefill_slot(0, prompts[0])
    mk.prefill_slot(1, prompts[1])
    out = mk.steps(7)
    assert out[0].tolist() == greedy[0, 1:].tolist()


def test_unseeded_slots_draw_their_own_seeds(tiny_model):
    from megakernel import MegaQwen3
    mk = MegaQwen3(tiny_model, max_seq_len=32, batch_size=2, backend="reference")
    mk.set_slot_sampling(0, SamplingParams(1.0))
    mk.set_slot_sampling(1, SamplingParams(1.0))
    s0, s1 = mk.slot_sampling[0].seed, mk.slot_sampling[1].seed
    assert s0 is not None and s1 is not None and s0 != s1
    assert mk.sampling_buffers["seed"].tolist() == [s0, s1]
    mk.free_slot(1)
    assert mk.sampled_slots() == [0] and float(mk.sampling_buffers["inv_temp"][1]) == 0.0
    assert math.isclose(float(mk.sampling_buffers["inv_temp"][0]), 1.0)
