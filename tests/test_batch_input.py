"""The batched tiles' two ways of feeding a 16-bit input to the tensor cores (the plan's BATCH_INPUT,
``scheduler.ops.BATCH_INPUTS``; the third, "fp8", is w8a8's, tests/test_w8a8.py): "split" (a bf16
head and remainder) and "bf16" (one bf16 operand), on the weights-on-M tile (the plans' from batch 2) and the batch-on-M one (BATCHED 1). On the CPU the models are float32,
so "split" multiplies in full float32 and "bf16" rounds the input to bf16 (ties to even, as the
GPU does) before the float32 product: each kernel backend must give the same bits as the others
for the same variant, and both must follow transformers, "bf16" within bf16 rounding.
"""

import pytest
import torch

from megakernel import MegaQwen3, load_model
from scheduler.ops import BATCH_INPUTS, make_plan

from test_fp8 import SHAPE as FP8_SHAPE, oracle_logits, write_fp8_checkpoint
from test_reference_vs_hf import random_prompt, rel_err

KERNELS = ("megakernel", "superkernel", "per-op")
SHAPE = dict(hidden=64, intermediate=128, heads=4, kv_heads=1, head_dim=16)


# the batch-on-M tile's plan fields for SHAPE (multiples of 8 rows, no K-splits)
BATCH_ON_M = dict(BATCHED=1, MMA_V3=1, SWAP_CALL=0, SWAP_PRE=0, R_QKV=16, R_O=16, R_GU=16, R_DOWN=16, R_LM=16, SK_QKV=1, SK_O=1, SK_GU=1, SK_DOWN=1)


def teacher_forced_logits(model, backend, prompts, fed, variant, tile):
    """Each decode step's logits [steps, B, V], every step fed the tokens ``fed[s]`` (so all
    backends and variants see the same inputs whatever their argmax)."""
    overrides = {"BATCH_INPUT": BATCH_INPUTS[variant], **(BATCH_ON_M if tile == 1 else {})}
    return forced_logits(model, backend, prompts, fed, overrides, BATCHED=tile)


def forced_logits(model, backend, prompts, fed, overrides, **expect):
    """``teacher_forced_logits`` under the plan fields ``overrides``; ``expect``: plan fields checked."""
    mk = MegaQwen3(model, max_seq_len=32, batch_size=len(prompts), backend=backend, plan_overrides=overrides,
                   max_bk=32, fp8_activations="none" if model.quantization else None)
    for name, v in {**overrides, **expect}.items():
        assert getattr(mk.backend.plan, name) == v, name
    mk.prefill(prompts)
    out = []
    for tokens in fed:
        mk.tokens.copy_(torch.tensor(tokens, dtype=mk.tokens.dtype))
        mk.step()
        out.append(mk.logits.clone())
    return torch.stack(out)


@torch.no_grad()
def hf_logits(hf, prompt, fed_b):
    """transformers' logits after each token of ``fed_b`` following the prompt (float32)."""
    ids = torch.tensor([list(prompt) + list(fed_b)])
    return hf(ids).logits[0, len(prompt):].float()


def _prompts_and_fed(vocab, seed, batch, steps):
    """``batch`` random prompts of 1-8 tokens and the tokens fed at each of ``steps`` steps."""
    g = torch.Generator().manual_seed(seed)
    prompts = [random_prompt(int(n), vocab, seed + i) for i, n in enumerate(torch.randint(1, 9, (batch,), generator=g))]
    return prompts, torch.randint(0, vocab, (steps, batch), generator=g).tolist()


def _hf_batch(hf, prompts, fed):
    """``hf_logits`` of each sequence, as [steps, B, V]."""
    return torch.stack([hf_logits(hf, p, [f[b] for f in fed]) for b, p in enumerate(prompts)], 1)


@pytest.mark.parametrize("batch,chunk_cols,fp8,tile", [(2, 16, False, 2), (2, 16, False, 1), (17, None, False, 2),
                                                       (2, None, True, 2)],
                         ids=["b2-16col-chunks", "b2-batch-on-m", "b17", "b2-fp8"])
def test_batch_input_variants_agree_across_backends_and_with_hf(tiny_checkpoint, seed, monkeypatch, batch,
                                                                 chunk_cols, fp8, tile):
    """Batch 2 (with 16-column chunks, several a tile), on both batched tiles, batch 17 (the batch
    padded to 32 MMA columns) and FP8 weights at batch 2: for each variant the three kernel backends
    give bitwise equal logits; against transformers (on the dequantized weights for FP8) "split" is
    float32-exact and "bf16" within bf16 rounding, and the two variants differ (the rounding is
    really done)."""
    if chunk_cols:
        import triton.language as tl

        import instructions.batch_mma as batch_mma
        import instructions.wgmma as wgmma
        monkeypatch.setattr(batch_mma, "BW_ELEMS", tl.constexpr(16 * chunk_cols))
        monkeypatch.setattr(wgmma, "KC_SWAP", tl.constexpr(chunk_cols))
    tiny = tiny_checkpoint(**(FP8_SHAPE if fp8 else SHAPE))
    real = write_fp8_checkpoint(tiny) if fp8 else None
    model = load_model(str(tiny.folder), device="cpu", dtype=torch.float32, progress=False)
    assert (model.quantization == "fp8") == fp8
    g = torch.Generator().manual_seed(seed)
    prompts = [random_prompt(int(n), tiny.vocab_size, seed + i)
               for i, n in enumerate(torch.randint(1, 9, (batch,), generator=g))]
    steps = 2
    fed = torch.randint(0, tiny.vocab_size, (steps, batch), generator=g).tolist()
    if fp8:
        want = [oracle_logits(tiny, real, torch.tensor(p), [fed[s][b] for s in range(steps)])[1:]
                for b, p in enumerate(prompts)]
    else:
        want = [hf_logits(tiny.hf, p, [fed[s][b] for s in range(steps)]) for b, p in enumerate(prompts)]
    want = torch.stack(want, dim=1)     # [steps, B, V]
    got = {}
    for variant in ("split", "bf16"):      # (the third, "fp8", is w8a8's: tests/test_w8a8.py)
        runs = {be: teacher_forced_logits(model, be, prompts, fed, variant, tile) for be in KERNELS}
        for be in KERNELS[1:]:
            assert torch.equal(runs[be], runs[KERNELS[0]]), f"{variant}: {be} differs from {KERNELS[0]}"
        got[variant] = runs[KERNELS[0]]
    assert rel_err(got["split"], want) < 1e-5
    err = rel_err(got["bf16"], want)
    assert err < 1e-2, f"bf16 input: relative error {err:.2e} against transformers"
    assert not torch.equal(got["bf16"], got["split"])


@pytest.mark.parametrize("pre", [1, 2])
def test_weights_taken_before_the_wait_follow_transformers(tiny_checkpoint, seed, monkeypatch, pre):
    """SWAP_PRE (a split's first chunks of weights loaded before the wait, added after the rest) at
    batch 3 with 16-column chunks, so a split has several and a worker several tiles (the later
    tiles load theirs before their loop): the kernel backends give the same bits (every tile adds
    its chunks in one order), float32-exact against transformers, and gate/up split over K."""
    import triton.language as tl

    import instructions.wgmma as wgmma
    monkeypatch.setattr(wgmma, "KC_SWAP", tl.constexpr(16))
    tiny = tiny_checkpoint(**SHAPE)
    model = load_model(str(tiny.folder), device="cpu", dtype=torch.float32, progress=False)
    prompts, fed = _prompts_and_fed(tiny.vocab_size, seed, 3, 2)
    want = _hf_batch(tiny.hf, prompts, fed)
    runs = {be: forced_logits(model, be, prompts, fed, {"SWAP_PRE": pre, "SK_GU": 2}, BATCHED=2) for be in KERNELS}
    for be in KERNELS[1:]:
        assert torch.equal(runs[be], runs[KERNELS[0]]), f"SWAP_PRE={pre}: {be} differs from {KERNELS[0]}"
    err = rel_err(runs[KERNELS[0]], want)
    assert err < 1e-5, f"SWAP_PRE={pre}: relative error {err:.2e} against transformers"


def test_bf16_input_stays_within_transformers_bf16_error(tiny_checkpoint, seed):
    """The default for bf16 weights (rule bf16-input): on bf16 weights (read as float32, so the
    interpreter multiplies the GPU's operands), "bf16" logits are no further from float32
    transformers than transformers' own bf16 model of the same checkpoint; "split" stays exact."""
    from transformers import Qwen3ForCausalLM
    tiny = tiny_checkpoint(dtype=torch.bfloat16, **SHAPE)
    truth = Qwen3ForCausalLM.from_pretrained(tiny.folder, dtype=torch.float32).eval()
    model = load_model(str(tiny.folder), device="cpu", dtype=torch.float32, progress=False)
    prompts, fed = _prompts_and_fed(tiny.vocab_size, seed, 3, 3)
    want, hf16 = _hf_batch(truth, prompts, fed), _hf_batch(tiny.hf, prompts, fed)
    ours = teacher_forced_logits(model, "megakernel", prompts, fed, "bf16", 2)
    err, err_hf = rel_err(ours, want), rel_err(hf16, want)
    assert 0 < err <= err_hf, f"bf16 input: {err:.2e} from float32, transformers' bf16 model {err_hf:.2e}"
    assert rel_err(teacher_forced_logits(model, "megakernel", prompts, fed, "split", 2), want) < 1e-5


def test_batch_input_is_checked():
    """A plan's BATCH_INPUT outside BATCH_INPUTS is refused with the values it takes; so are the
    weights-on-M tile's feed fields outside their values or off that tile. Each sets its bit of BT."""
    from models.qwen3.config import PRESETS
    plan = make_plan(PRESETS["0.6b"], 8, 128, 132, bf16_inputs=True)
    assert plan.BATCH_INPUT == BATCH_INPUTS["bf16"]
    import dataclasses
    with pytest.raises(ValueError, match=r"BATCH_INPUT=3 is not one of 0 \(split\), 1 \(bf16\), 2 \(fp8\)"):
        dataclasses.replace(plan, BATCH_INPUT=3)
    with pytest.raises(ValueError, match=r"BATCH_INPUT=2 \(fp8, w8a8\) needs FP8 weights"):
        dataclasses.replace(plan, BATCH_INPUT=2)
    # batch 8 on mma.sync (the rule mma-sync-to-16), its tile called (called-to-16) and a chunk taken before
    # the wait (weights-before-the-wait); batch 32 as Triton chooses
    assert plan.BATCHED == 2 and plan.SWAP_TMA == 0 and plan.SWAP_MIN_N == 8 and plan.MMA_V3 == 0
    assert plan.SWAP_CALL == 1 and plan.SWAP_PRE == 1 and plan.BT == 3 + 1 + 32 + 64 + 128
    assert make_plan(PRESETS["0.6b"], 32, 128, 132).BT == 3
    assert make_plan(PRESETS["0.6b"], 8, 128, 132).SWAP_PRE == 0      # (float32: the rule is bf16's)
    assert dataclasses.replace(plan, SWAP_TMA=1, SWAP_MIN_N=16, BATCH_INPUT=0, MMA_V3=1, SWAP_CALL=0,
                               SWAP_PRE=0).BT == 3 + 8 + 16
    with pytest.raises(ValueError, match=r"MMA_V3=0: 1, or 0 \(every dot on mma.sync\) on the weights-on-M tile"):
        dataclasses.replace(plan, BATCHED=1, SK_QKV=1, SK_O=1, SK_GU=1, SK_DOWN=1)
    with pytest.raises(ValueError, match=r"SWAP_CALL=1: .* \(BATCHED=2; with BATCHED=1 set SWAP_CALL=0\)"):
        dataclasses.replace(plan, BATCHED=1, MMA_V3=1, SK_QKV=1, SK_O=1, SK_GU=1, SK_DOWN=1)
    with pytest.raises(ValueError, match=r"SWAP_MIN_N=32: the weights-on-M tile pads the batch to 8 or 16"):
        dataclasses.replace(plan, SWAP_MIN_N=32)
    assert dataclasses.replace(plan, SWAP_PRE=2).BT == plan.BT + 128
    with pytest.raises(ValueError, match=r"SWAP_PRE=3: 0, or 1 or 2 chunks on the weights-on-M tile"):
        dataclasses.replace(plan, SWAP_PRE=3)
    with pytest.raises(ValueError, match=r"SWAP_TMA=1: 0, or 1 on the weights-on-M tile"):
        dataclasses.replace(plan, SWAP_TMA=1, BATCHED=1, MMA_V3=1, SWAP_CALL=0, SK_QKV=1, SK_O=1, SK_GU=1, SK_DOWN=1)


@pytest.mark.parametrize("batch", [3])
def test_tma_weights_and_wider_padding_give_the_same_bits(tiny_checkpoint, seed, batch):
    """SWAP_TMA=1 (the weights-on-M tile's weights by tensor descriptor) gives the pointer loads' logits
    bit for bit on each kernel backend: with 48-row QKV blocks a 64-row chunk also reads the next
    block's rows, and the last block reads past the matrix (zeros); gate/up split over K reads past
    its split's columns, where the input is masked. So does the tile called rather than inlined
    (SWAP_CALL, and attention's, ATTN_CALL; the interpreter inlines nothing, so this checks the
    dispatch, and the GPU's bitwise test the code); the batch padded to 16 (SWAP_MIN_N) gives them
    within float32 rounding (below)."""
    tiny = tiny_checkpoint(**SHAPE)
    model = load_model(str(tiny.folder), device="cpu", dtype=torch.float32, progress=False)
    g = torch.Generator().manual_seed(seed)
    prompts = [random_prompt(int(n), tiny.vocab_size, seed + i)
               for i, n in enumerate(torch.randint(1, 9, (batch,), generator=g))]
    fed = torch.randint(0, tiny.vocab_size, (2, batch), generator=g).tolist()
    for be in ("megakernel", "per-op"):
        runs = [forced_logits(model, be, prompts, fed, {"SWAP_TMA": tma, "SWAP_MIN_N": min_n, "SWAP_CALL": call,
                                                        "ATTN_CALL": attn, "R_QKV": 48, "SK_GU": 2}, BATCHED=2)
                for tma, min_n, call, attn in ((0, 8, 0, 0), (1, 8, 0, 0), (0, 16, 0, 0), (0, 8, 1, 0), (0, 8, 0, 1))]
        assert torch.equal(runs[0], runs[1]), f"{be}: TMA weights differ from pointer loads"
        # not to the bit here: the interpreter's dot is numpy's sgemm, which on some CPUs rounds a
        # product differently by its N (on an AMD EPYC, 200 of 200 random [64, K] x [K, 8 or 16]
        # products parted in their shared columns), so the padding is held to float32 rounding
        torch.testing.assert_close(runs[2], runs[0], rtol=1e-5, atol=1e-5,
                                   msg=f"{be}: the batch padded to 16 differs from 8")
        assert torch.equal(runs[0], runs[3]), f"{be}: the tile called differs from the tile inlined"
        assert torch.equal(runs[0], runs[4]), f"{be}: attention's tile called differs from it inlined"
