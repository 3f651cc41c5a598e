"""GPU checks of the FP8 tiles (issue #41): with ``quantize="fp8"`` every kernel backend gives the
same greedy tokens; teacher-forced, the megakernel's top-1 agrees with the float32 reference on the
dequantized weights wherever float32 clearly decides; and transformers' own FP8 path, where it runs,
is no closer to that reference than ours. Random weights of the true shapes (no checkpoint needed).

Run on the device machine: python3 -m pytest -m gpu tests/test_gpu_fp8.py -v -s
Timings, FP8 against bf16 (docs/performance.md, "FP8 weights"):
    python -m megakernel.bench -m 8b --random-weights --batch-size 1,8 --quantize fp8 --record bench/results.jsonl
"""

from __future__ import annotations

import pytest
import torch

from test_gpu_reference import CLEAR_MARGIN, agree, teacher_forced
from test_gpu_sizes import _prompt, assert_kernel_backends_agree

pytestmark = pytest.mark.gpu

POSITIONS = 256
MIN_CLEAR = 32   # positions where float32 clearly decides: at 99%, none of them may part


def _fp8_model(size):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 weights need compute capability 8.9 or above")
    from megakernel import load_model
    return load_model(size, random_weights=True, device="cuda", dtype=torch.bfloat16, progress=False,
                      quantize="fp8")


@pytest.mark.parametrize("batch", [1, 8])
def test_8b_fp8_kernel_backends_agree(batch):
    model = _fp8_model("8b")
    assert model.quantization == "fp8" and model.weights.wqkv.dtype == torch.float8_e4m3fn
    prompt = _prompt(model.config.vocab_size, (batch, 32))
    assert_kernel_backends_agree(model, prompt, 128)
    del model
    torch.cuda.empty_cache()


def _float32_reference(model):
    """The same model with its projections dequantized into float32: what the FP8 tiles approximate
    (in bf16 activations)."""
    from megakernel.model import Qwen3Model
    return Qwen3Model(model.name, model.config, model.weights.dequantized(torch.float32), None, None)


def ours_and_float32(model, ids: torch.Tensor):
    """Teacher-forced logits of the megakernel and of the float32 reference on the dequantized
    weights, and the positions where float32 clearly decides (top two more than CLEAR_MARGIN apart)."""
    ours = teacher_forced(model, ids, "megakernel")
    ref = teacher_forced(_float32_reference(model), ids, "reference")
    top2 = ref.topk(2, dim=-1).values
    return ours, ref, top2[:, 0] - top2[:, 1] > CLEAR_MARGIN


@torch.no_grad()
@pytest.mark.parametrize("size", ["0.6b", "8b"])
def test_fp8_top1_agrees_with_float32_on_the_dequantized_weights(size, seed):
    model = _fp8_model(size)
    # random weights of the larger model have flatter logits: few positions are clear, so more of them
    n = POSITIONS * (4 if size == "8b" else 1)
    ids = torch.randint(0, model.config.vocab_size, (n + 1,), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(seed))
    ours, ref, clear = ours_and_float32(model, ids)
    print(f"{size} fp8: top-1 agreement with float32 on the dequantized weights {agree(ours, ref):.4f} overall, "
          f"{agree(ours, ref, clear):.4f} at the {int(clear.sum())} positions with a margin > {CLEAR_MARGIN}")
    assert int(clear.sum()) >= MIN_CLEAR, "too few clear positions for the check to mean much"
    assert agree(ours, ref, clear) >= 0.99


@torch.no_grad()
def test_against_transformers_fp8(tmp_path, seed):
    """transformers' FineGrainedFP8 path on the same FP8 checkpoint (written in Qwen's layout). It
    also quantizes the activations (dynamic 128-wide blocks), so it is a different arithmetic: ours,
    weight-only, must be at least as close to the float32 reference as it is."""
    from models.qwen3.weights import save_checkpoint
    model = _fp8_model("0.6b")
    save_checkpoint(tmp_path / "fp8", model.config, model.weights)
    try:
        from transformers import AutoModelForCausalLM
        hf = AutoModelForCausalLM.from_pretrained(tmp_path / "fp8", device_map="cuda").eval()
        ids = torch.randint(0, model.config.vocab_size, (POSITIONS + 1,), device="cuda",
                            generator=torch.Generator(device="cuda").manual_seed(seed))
        theirs = hf(ids[None, :POSITIONS]).logits[0].float()
    except Exception as e:    # its FP8 kernels need packages or hardware this machine may lack
        pytest.skip(f"transformers' FP8 path does not run here: {type(e).__name__}: {str(e)[:200]}")
    ours, ref, clear = ours_and_float32(model, ids)
    print(f"clear positions {int(clear.sum())}: ours vs float32 {agree(ours, ref, clear):.4f}, transformers fp8 vs "
          f"float32 {agree(theirs, ref, clear):.4f}, ours vs transformers fp8 {agree(ours, theirs, clear):.4f}")
    assert agree(ours, ref, clear) >= agree(theirs, ref, clear)
