"""The kernel backends on the CPU, through Triton's interpreter (one worker), against the
reference and transformers: megakernel, superkernel and per-op must give the same greedy tokens
as each other, as the reference and as Hugging Face for 32 steps, with logits within 1e-4.
"""

import pytest
import torch

from megakernel import MegaQwen3, load_model
from megakernel.backends import MegakernelError
from scheduler.ops import Op

from test_reference_vs_hf import assert_same_greedy, hf_greedy, random_prompt, rel_err

STEPS = 32
KERNELS = ("megakernel", "superkernel", "per-op")


def _run(model, backend, prompts, steps):
    mk = MegaQwen3(model, max_seq_len=64, batch_size=len(prompts), backend=backend)
    out = mk.generate(prompts, max_new_tokens=steps)
    return out, mk.logits.clone()


@pytest.mark.parametrize("shape", [
    dict(hidden=160, intermediate=352, heads=10, kv_heads=2, head_dim=16, tie=True),    # GQA 5, odd sizes
    dict(hidden=64, intermediate=128, heads=4, kv_heads=4, head_dim=16, tie=False),     # GQA 1, untied
], ids=["gqa5-tied-odd", "gqa1-untied"])
def test_kernel_backends_match_reference_and_hf(tiny_checkpoint, seed, shape):
    tiny = tiny_checkpoint(**shape)
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompts = [random_prompt(7, tiny.vocab_size, seed), random_prompt(4, tiny.vocab_size, seed + 1)]
    ref_tokens, ref_logits = _run(model, "reference", prompts, STEPS)
    for b, p in enumerate(prompts):
        theirs, their_logits = hf_greedy(tiny.hf, p, STEPS)
        assert_same_greedy(ref_tokens[b].tolist(), theirs, their_logits)
    for backend in KERNELS:
        tokens, logits = _run(model, backend, prompts, STEPS)
        assert torch.equal(tokens, ref_tokens), f"{backend}: {tokens.tolist()} != reference {ref_tokens.tolist()}"
        assert rel_err(logits, ref_logits) < 1e-4, backend


def test_broken_tape_names_the_instruction(tiny_checkpoint):
    tiny = tiny_checkpoint()
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    mk = MegaQwen3(model, max_seq_len=32, backend="megakernel")
    mk.prefill([1, 2, 3])
    be = mk.backend
    w, i = next((w, i) for w, i, ins in be.tape.instructions() if ins.op == 4)   # an O projection
    be.words[w, i, 5] = 10 ** 6
    with pytest.raises(MegakernelError, match=rf"worker {w} timed out at tape position {i} \(OPROJ layer 0"):
        mk.step()
    # the state is recoverable: counters were reset, a fresh sequence decodes again
    be.words[w, i, 5] = be.tape.workers[w][i].wait_per_step
    mk.prefill([1, 2, 3])
    mk.step()


def test_several_steps_per_launch(tiny_checkpoint, seed):
    """Launches of several steps give the tokens of one step per launch, for sequences of different
    lengths, and leave the state where single steps would: a later step() continues it."""
    tiny = tiny_checkpoint(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompts = [random_prompt(5, tiny.vocab_size, seed), random_prompt(9, tiny.vocab_size, seed + 1)]
    ref = MegaQwen3(model, max_seq_len=40, batch_size=2, backend="reference")
    ref.prefill(prompts)
    want = torch.stack([ref.step() for _ in range(12)], dim=1)
    mk = MegaQwen3(model, max_seq_len=40, batch_size=2, backend="megakernel")
    assert mk.steps_per_launch > 1
    mk.prefill(prompts)
    got = torch.cat([mk.steps(5, per_launch=5), mk.steps(6, per_launch=3), mk.step()[:, None]], dim=1)
    assert torch.equal(got, want), f"{got.tolist()} != reference {want.tolist()}"
    assert mk.cache.lengths.tolist() == ref.cache.lengths.tolist() == [5 + 12, 9 + 12]
    assert rel_err(mk.logits, ref.logits) < 1e-4
    with pytest.raises(ValueError, match="no room for 20 more"):
        mk.steps(20)


def test_generate_stops_as_with_single_steps(tiny_checkpoint, seed):
    """generate() on the megakernel runs launches of several steps; where a stop token ends it,
    the result is the single-step result (the launch's extra steps are dropped)."""
    tiny = tiny_checkpoint(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompt = random_prompt(6, tiny.vocab_size, seed)
    ref = MegaQwen3(model, max_seq_len=40, backend="reference")
    full = ref.generate([prompt], max_new_tokens=20)
    stop = int(full[0, 7])      # a token the greedy run produces; generation ends at its first use
    want = ref.generate([prompt], max_new_tokens=20, stop_tokens=[stop])
    mk = MegaQwen3(model, max_seq_len=40, backend="megakernel")
    seen = []
    got = mk.generate([prompt], max_new_tokens=20, stop_tokens=[stop], on_token=seen.append)
    assert torch.equal(got, want)
    assert len(seen) == want.shape[1] <= 8


def test_step_boundary_wait_is_bounded(tiny_checkpoint):
    """A step of a multi-step launch whose boundary wait cannot be met stops with an error that
    names the wait, instead of spinning."""
    tiny = tiny_checkpoint()
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    mk = MegaQwen3(model, max_seq_len=32, backend="megakernel")
    mk.prefill([1, 2, 3])
    n = mk.backend.argmax_n
    mk.backend.argmax_n = 10 ** 6
    with pytest.raises(MegakernelError, match=r"worker 0 timed out at the start of a step .* previous step's ARGMAX"):
        mk.steps(2, per_launch=2)
    mk.backend.argmax_n = n
    mk.prefill([1, 2, 3])
    assert mk.steps(3).shape == (1, 3)


def test_pairing_failure_is_named(tiny_checkpoint):
    """A program that could not take its tape row (``kernel._paired_row``: its SM mate never
    published one, or its SM id is past the table) is reported as such, ahead of the waits that
    stalled behind it, and the pairing counts are reset with the counters. (The kernel's side needs
    two programs on an SM: tests/test_gpu_megakernel.py.)"""
    tiny = tiny_checkpoint()
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    mk = MegaQwen3(model, max_seq_len=32, backend="megakernel")
    be = mk.backend
    be.pairs.fill_(5)
    with pytest.raises(MegakernelError, match=r"program 0, the second on SM 7, timed out waiting for the first "
                                              r"to publish its tape row in launch 3 \(it read 8192\)"):
        be.raise_error([1, -2, 7, 3, 8192])
    assert int(be.pairs.abs().sum()) == 0 and int(be.err.abs().sum()) == 0
    with pytest.raises(MegakernelError, match=r"program 0 on SM 2000 found no SM id below 1024"):
        be.raise_error([1, -2, 2000, 1024, -1])
    mk.prefill([1, 2, 3])
    assert mk.steps(2).shape == (1, 2)


def _assert_hot_layout(tensors):
    """Zeroed, in order and apart, each from a chunk 1 (mod 4) of 4 KB, and each of at most 8 KB in
    the first one's half of the L2 (bit 12 XOR bit 13 of the address)."""
    from megakernel.backends import HOT_CHUNK
    half = lambda a: ((a >> 12) ^ (a >> 13)) & 1   # noqa: E731
    spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors]
    for (_, a1), (b0, _) in zip(spans, spans[1:]):
        assert b0 >= a1
    for a0, a1 in spans:
        assert a0 % (4 * HOT_CHUNK) == HOT_CHUNK
        assert half(a0) == half(spans[0][0])
        if a1 - a0 <= 2 * HOT_CHUNK:
            assert half(a1 - 1) == half(a0)
    for t in tensors:
        assert not t.any()


@pytest.mark.parametrize("x_shape, words", [((1, 1024), 338), ((1, 2048), 500), ((2, 2560), 900), ((1, 1), 1)])
def test_hot_buffers_layout(x_shape, words):
    """The step's hot buffers in one allocation: apart, each from a chunk 1 (mod 4) of 4 KB, so
    that each of at most 8 KB lies in one half of the L2 (bit 12 XOR bit 13), the same for all."""
    from megakernel.backends import hot_buffers
    attn_shape = (x_shape[0], 2048)
    x, attn, sync = hot_buffers([x_shape, attn_shape, (words,)], [torch.float32, torch.float32, torch.int32], "cpu")
    assert (x.shape, attn.shape, sync.shape) == (x_shape, attn_shape, (words,))
    assert (x.dtype, attn.dtype, sync.dtype) == (torch.float32, torch.float32, torch.int32)
    _assert_hot_layout([x, attn, sync])
    x.fill_(1.0)
    attn.fill_(2.0)
    assert not sync.any() and (attn == 2.0).all()      # writing one leaves the others alone


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_state_dtypes_and_layout(tiny_checkpoint, dtype):
    """qkv, attn and act are stored in the weights' dtype (bf16 on a GPU, as transformers keeps
    them: half the bytes their readers load), x and the attention partials in float32; x, attn,
    the counters, act and qkv share the hot allocation, each from a chunk 1 (mod 4) of 4 KB."""
    from megakernel.backends import step_buffers, tile_plan
    tiny = tiny_checkpoint(hidden=256, intermediate=768, heads=8, kv_heads=2, head_dim=32)
    model = load_model(str(tiny.folder), device="cpu", dtype=dtype, progress=False)
    mk = MegaQwen3(model, max_seq_len=32, backend="reference")
    st = step_buffers(mk, tile_plan(mk, 4), counters=100)
    assert st.x.dtype == st.opart.dtype == st.ml.dtype == st.logits.dtype == torch.float32
    assert st.qkv.dtype == st.attn.dtype == st.act.dtype == dtype
    _assert_hot_layout([st.x, st.attn, st.counters, st.act, st.qkv])


def test_pools_match_reference(tiny_checkpoint, seed):
    """Stages with pools (their last tiles claimed at run time, scheduler/ops.py) in the O projection,
    gate/up, down and the LM head give the reference's tokens, over launches of several steps (the
    claims of step s are counted from the claims of the steps before it) and single steps; the
    VM, which lets the first instruction take the pool, too."""
    tiny = tiny_checkpoint(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompt = random_prompt(5, tiny.vocab_size, seed)
    ref = MegaQwen3(model, max_seq_len=40, backend="reference")
    full = ref.generate([prompt], max_new_tokens=12)
    ref.prefill([prompt])
    want = torch.stack([ref.step() for _ in range(12)], dim=1)
    pools = dict(R_O=4, R_GU=4, R_DOWN=4, R_LM=8, POOL_O=5, POOL_GU=7, POOL_DOWN=3, POOL_LM=9)
    mk = MegaQwen3(model, max_seq_len=40, backend="megakernel", plan_overrides=pools)
    plan = mk.backend.plan
    assert [plan.pool(op) for op in (Op.OPROJ, Op.GATEUP, Op.DOWN, Op.LMHEAD)] == [5, 7, 3, 9]
    assert sum(1 for _, _, i in mk.backend.tape.instructions() if i.pool_counter) == 3 * 2 + 1
    mk.prefill([prompt])
    got = torch.cat([mk.steps(5, per_launch=5), mk.steps(6, per_launch=3), mk.step()[:, None]], dim=1)
    assert torch.equal(got, want), f"{got.tolist()} != reference {want.tolist()}"
    assert rel_err(mk.logits, ref.logits) < 1e-4
    vm = MegaQwen3(model, max_seq_len=40, backend="vm", plan_overrides=pools)
    assert vm.backend.plan == plan
    assert torch.equal(vm.generate([prompt], max_new_tokens=12), full)
