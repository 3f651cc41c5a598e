"""FP8 weights in Qwen's -FP8 format: block quantization and its inverse; loading such a checkpoint
(its projections stay FP8) or quantizing on load; every kernel backend's FP8 tiles, at batch 1 and
batched, against transformers on the same dequantized weights; and a clear error for every
quantization this runtime does not load, before any tensor is allocated."""

from __future__ import annotations

import json
import math

import pytest
import torch

from megakernel import MegaQwen3, load_model
from models.qwen3.fp8 import (FP8_MAX, UnsupportedQuantization, check_quantization_config, dequantize_blockwise,
                              quantize_blockwise, scale_rows)
from models.qwen3.weights import CheckpointError, Qwen3Weights, load_checkpoint, weight_bytes

QWEN_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Ragged against 128 everywhere: hidden 160, q/kv rows 160/32, intermediate 352.
SHAPE = dict(hidden=160, intermediate=352, heads=10, kv_heads=2, head_dim=16)


def expand(s: torch.Tensor, n: int, k: int) -> torch.Tensor:
    return s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]


@pytest.mark.parametrize("n,k", [(128, 128), (300, 200), (1, 129), (257, 96), (40, 640)])
def test_round_trip_within_e4m3_precision(seed, n, k):
    g = torch.Generator().manual_seed(seed)
    # Blocks of very different magnitudes, so a single scale for the tensor would not do.
    w = torch.randn(n, k, generator=g) * expand(torch.exp(3 * torch.randn(math.ceil(n / 128), math.ceil(k / 128),
                                                                            generator=g)), n, k)
    q, s = quantize_blockwise(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (n, k)
    assert s.dtype == torch.float32 and s.shape == (math.ceil(n / 128), math.ceil(k / 128))
    # Each block's largest magnitude lands on e4m3's largest value, 448 (scale = amax / 448).
    qf = q.float().abs()
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            assert float(qf[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].max()) == FP8_MAX
            assert float(s[i, j]) == pytest.approx(float(blk.abs().max()) / FP8_MAX, rel=1e-6)
    back = dequantize_blockwise(q, s)
    assert back.dtype == torch.float32 and back.shape == (n, k)
    # e4m3: 3 mantissa bits, so rounding moves a normal value by at most 2^-4 of itself; below
    # the smallest normal (2^-6 in scaled units) the step is 2^-9, half of it 2^-10.
    bound = w.abs() * 2 ** -4 + expand(s, n, k) * 2 ** -10
    err = (back - w).abs()
    assert bool((err <= bound * (1 + 1e-6)).all()), f"worst excess {float((err - bound).max()):.3g}"
    assert float(err.max()) > 0     # the values really went through fp8
    # Quantizing the dequantized weight again gives the same fp8 values and scales.
    q2, s2 = quantize_blockwise(back)
    assert torch.equal(q2.float(), q.float()) and torch.allclose(s2, s, rtol=1e-6)


def test_dequantize_multiplies_each_block_by_its_scale():
    q = torch.tensor([[1.0, -2.0, 0.5]] * 130).to(torch.float8_e4m3fn)      # 130 x 3: two row blocks
    s = torch.tensor([[0.25], [3.0]])
    out = dequantize_blockwise(q, s)
    assert torch.equal(out[:128], torch.tensor([[0.25, -0.5, 0.125]] * 128))
    assert torch.equal(out[128:], torch.tensor([[3.0, -6.0, 1.5]] * 2))
    with pytest.raises(ValueError, match=r"expected \[2, 1\]"):
        dequantize_blockwise(q, torch.ones(1, 1))


def test_zero_block_quantizes_to_zero():
    w = torch.zeros(130, 10)
    w[129, 3] = 5.0
    q, s = quantize_blockwise(w)
    assert torch.isfinite(s).all() and torch.equal(dequantize_blockwise(q, s), w)


# ---------------------------------------------------------------------------------------------
# Checkpoints in Qwen's FP8 layout


def write_fp8_checkpoint(tiny) -> dict[str, torch.Tensor]:
    """Rewrite a tiny checkpoint as Qwen's -FP8 checkpoints are: projections in float8_e4m3fn with
    float32 *_scale_inv, everything else bf16, quantization_config in config.json; two shards,
    the scales in the second (a loader must follow each scale to its file). Returns the
    float32 state dict of the weights the files hold."""
    from safetensors.torch import save_file

    for f in tiny.folder.glob("model*.safetensors*"):
        f.unlink()
    shard1, shard2, real = {}, {}, {}
    for name, t in tiny.hf.state_dict().items():
        if name == "lm_head.weight" and tiny.hf.config.tie_word_embeddings:
            continue
        if any(f".{p}." in name for p in PROJ):
            q, s = quantize_blockwise(t)
            shard1[name], shard2[name + "_scale_inv"] = q, s
            real[name] = dequantize_blockwise(q, s)
        else:
            shard1[name] = t.to(torch.bfloat16).contiguous()
            real[name] = shard1[name].float()
    files = {"model-00001-of-00002.safetensors": shard1, "model-00002-of-00002.safetensors": shard2}
    for fname, sd in files.items():
        save_file(sd, str(tiny.folder / fname), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {n: fname for fname, sd in files.items() for n in sd}}
    (tiny.folder / "model.safetensors.index.json").write_text(json.dumps(index))
    set_quantization(tiny.folder, QWEN_FP8)
    return real


def set_quantization(folder, qc):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = qc
    (folder / "config.json").write_text(json.dumps(cfg))


def oracle_logits(tiny, real, prompt: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """transformers' float32 logits on the dequantized weights ``real``, at the prompt's last position
    and after each of ``tokens`` (teacher forcing): [len(tokens) + 1, V]."""
    from transformers import Qwen3ForCausalLM
    oracle = Qwen3ForCausalLM(tiny.hf.config).float().eval()
    missing, unexpected = oracle.load_state_dict(real, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    with torch.no_grad():
        return oracle(torch.cat([prompt, torch.tensor(tokens, dtype=torch.long)])[None]).logits[0, len(prompt) - 1:]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_fp8_checkpoint_matches_hf_on_dequantized_weights(tiny_checkpoint, seed, tie):
    tiny = tiny_checkpoint(tie=tie, **SHAPE)
    real = write_fp8_checkpoint(tiny)
    # The oracle runs on the dequantized weights, not the float32 originals they came from.
    wq = tiny.hf.model.layers[0].self_attn.q_proj.weight
    assert not torch.equal(real["model.layers.0.self_attn.q_proj.weight"], wq)

    model = load_model(str(tiny.folder), device="cpu", dtype=torch.float32, progress=False)
    assert model.quantization == "fp8" and model.weights.wqkv.dtype == torch.float8_e4m3fn
    assert model.weights.tied == tie
    prompt = torch.randint(0, tiny.vocab_size, (5 + seed % 11,), generator=torch.Generator().manual_seed(seed))
    mk = MegaQwen3(model, backend="reference", batch_size=1, max_seq_len=len(prompt) + 8, fp8_activations="none")
    mk.prefill(prompt[None])
    tokens, logits = [], [mk.logits[0].clone()]
    for _ in range(4):
        tokens.append(int(logits[-1].argmax()))
        mk.step()
        logits.append(mk.logits[0].clone())
    for ours, theirs in zip(logits, oracle_logits(tiny, real, prompt, tokens)):
        assert rel(ours, theirs) < 1e-5


def test_fp8_checkpoint_stays_fp8_in_the_fused_layout(tiny_checkpoint):
    from safetensors.torch import load_file

    tiny = tiny_checkpoint(**SHAPE)
    real = write_fp8_checkpoint(tiny)
    files = {k: v for f in sorted(tiny.folder.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    cfg, w = load_checkpoint(tiny.folder, dtype=torch.bfloat16, progress=False)
    assert w.dtype == torch.bfloat16 and w.quantization == "fp8"
    assert w.embed.dtype == w.lm_head.dtype == w.input_norm.dtype == torch.bfloat16
    assert {n: getattr(w, n).dtype for n in ("wqkv", "wo", "wgate_up", "wdown")} == dict.fromkeys(
        ("wqkv", "wo", "wgate_up", "wdown"), torch.float8_e4m3fn)
    q, kv, i = cfg.q_size, cfg.kv_size, cfg.intermediate_size
    sb = scale_rows(cfg)
    assert sb == 32 and w.scale_rows == sb      # q 160, k and v 32 rows: not multiples of 128
    p = "model.layers.1."
    u8 = lambda t: t.view(torch.uint8)  # noqa: E731  (fp8 compared bit for bit)
    # q|k|v and gate|up rows, each from its own projection, bit for bit
    assert torch.equal(u8(w.wqkv[1, q:q + kv]), u8(files[p + "self_attn.k_proj.weight"]))
    assert torch.equal(u8(w.wgate_up[1, i:]), u8(files[p + "mlp.up_proj.weight"]))
    # each part's 128-row scale blocks repeated over its 32-row scale rows
    k_scale = files[p + "self_attn.k_proj.weight_scale_inv"]
    assert torch.equal(w.wqkv_scale[1, q // sb], k_scale[0])
    v_scale = files[p + "self_attn.v_proj.weight_scale_inv"]
    assert torch.equal(w.wqkv_scale[1, (q + kv) // sb], v_scale[0])
    q_scale = files[p + "self_attn.q_proj.weight_scale_inv"]      # rows 128..159 are q's second block
    assert torch.equal(w.wqkv_scale[1, 128 // sb], q_scale[1]) and torch.equal(w.wqkv_scale[1, 0], q_scale[0])
    # what the torch paths multiply by: the dequantized weights, in the model's dtype
    assert torch.equal(w.proj("wqkv", 1)[q:q + kv], real[p + "self_attn.k_proj.weight"].bfloat16())
    assert torch.equal(w.proj("wgate_up", 1)[i:], real[p + "mlp.up_proj.weight"].bfloat16())
    assert torch.equal(w.proj("wdown", 1), real[p + "mlp.down_proj.weight"].bfloat16())
    # the memory check counts what was allocated: one byte a projection weight, plus scales
    assert w.nbytes() == weight_bytes(cfg, torch.bfloat16, "fp8") < weight_bytes(cfg, torch.bfloat16)


def test_quantize_on_load_gives_the_fp8_checkpoints_weights(tiny_checkpoint):
    """``quantize="fp8"`` on a plain checkpoint quantizes each projection as Qwen's FP8 files are."""
    plain = tiny_checkpoint(**SHAPE)
    quantized = load_model(str(plain.folder), device="cpu", quantize="fp8", progress=False).weights
    write_fp8_checkpoint(plain)      # the same weights, quantized by quantize_blockwise into files
    stored = load_model(str(plain.folder), device="cpu", progress=False).weights
    for name in ("wqkv", "wo", "wgate_up", "wdown"):
        assert torch.equal(getattr(quantized, name).view(torch.uint8), getattr(stored, name).view(torch.uint8))
        assert torch.equal(getattr(quantized, name + "_scale"), getattr(stored, name + "_scale"))
    with pytest.raises(ValueError, match="quantize 'int8' is not supported: use 'fp8'"):
        load_model(str(plain.folder), device="cpu", quantize="int8", progress=False)


@pytest.mark.parametrize("size", ["0.6b", "8b", "32b"])
def test_fp8_bytes_of_the_published_sizes(size):
    """What the memory check and the floor count with FP8 projections: one byte a projection
    weight, a float32 scale per 128x128 block of each, everything else in bf16."""
    from models.qwen3.config import PRESETS
    cfg = PRESETS[size]
    L, H, I, q, kv = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size
    proj = L * cfg.layer_matrix_params
    blocks = L * sum(math.ceil(n / 128) * math.ceil(k / 128)
                     for n, k in [(q, H), (kv, H), (kv, H), (H, q), (I, H), (I, H), (H, I)])
    assert scale_rows(cfg) == 128
    assert weight_bytes(cfg, torch.bfloat16, "fp8") == proj + 4 * blocks + 2 * (cfg.num_parameters() - proj)
    assert weight_bytes(cfg, torch.bfloat16) == 2 * cfg.num_parameters()


BACKEND_CASES = [(be, b) for b in (1, 2) for be in ("per-op", "megakernel", "superkernel", "vm")]


@pytest.mark.parametrize("backend,batch", BACKEND_CASES, ids=[f"{be}-b{b}" for be, b in BACKEND_CASES])
def test_fp8_tiles_match_hf_on_dequantized_weights(tiny_checkpoint, seed, backend, batch):
    """Every kernel backend's FP8 tiles (register tiles at batch 1, the batched tensor-core tiles at
    batch 2) against transformers on the dequantized weights, in float32, over decode steps."""
    tiny = tiny_checkpoint(**SHAPE)
    real = write_fp8_checkpoint(tiny)
    model = load_model(str(tiny.folder), device="cpu", dtype=torch.float32, progress=False)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, tiny.vocab_size, (n,), generator=g) for n in (5, 3)[:batch]]
    steps = 2
    mk = MegaQwen3(model, backend=backend, batch_size=batch, max_seq_len=8 + steps, fp8_activations="none")
    assert mk.backend.plan.FP8 == 1
    mk.prefill(prompts)
    tokens, logits = [mk.tokens.tolist()], [mk.logits.clone()]
    for _ in range(steps):
        mk.step()
        tokens.append(mk.tokens.tolist())
        logits.append(mk.logits.clone())
    for b, prompt in enumerate(prompts):
        fed = [t[b] for t in tokens[:-1]]
        want = oracle_logits(tiny, real, prompt, fed)
        for i, (ours, theirs) in enumerate(zip([lg[b] for lg in logits], want)):
            assert rel(ours, theirs) < 1e-5, f"sequence {b}, step {i}: relative error {rel(ours, theirs):.2e}"


UNSUPPORTED = {
    "block-64": ({**QWEN_FP8, "weight_block_size": [64, 64]}, "FP8 with 64x64 weight blocks"),
    "per-tensor": ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "per-tensor FP8"),
    "static-act": ({**QWEN_FP8, "activation_scheme": "static"}, "static activation scales"),
    "e5m2": ({**QWEN_FP8, "fmt": "e5m2"}, 'format "e5m2"'),
    "per-channel": ({"quant_method": "compressed-tensors", "format": "float-quantized",
                     "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                         "num_bits": 8, "type": "float", "strategy": "channel"}}}},
                    "compressed-tensors quantization .*8-bit float weights, strategy channel"),
    "fbgemm": ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}, "fbgemm per-channel FP8"),
    "awq": ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}, 'AWQ .*"awq", 4-bit'),
    "gptq": ({"quant_method": "gptq", "bits": 8, "group_size": 128}, 'GPTQ .*"gptq", 8-bit'),
    "bnb": ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes .*4-bit"),
    "unknown": ({"quant_method": "squeezed", "bits": 3}, 'unknown quant_method "squeezed"'),
    "no-method": ({"bits": 4}, "no quant_method"),
}


@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_unsupported_quantization_is_one_clear_error(case):
    qc, what = UNSUPPORTED[case]
    with pytest.raises(UnsupportedQuantization, match=what) as e:
        check_quantization_config({"quantization_config": qc})
    assert "\n" not in str(e.value) and "supported: FP8 e4m3 with 128x128 weight blocks" in str(e.value)


def test_qwen_format_is_accepted():
    assert check_quantization_config({"quantization_config": QWEN_FP8}) == (128, 128)
    assert check_quantization_config({"hidden_size": 8}) is None


@pytest.fixture
def no_allocation(monkeypatch):
    """Fails a test that allocates the model's weights (anything but the meta-device shapes)."""
    real_empty = Qwen3Weights.empty

    def empty(cfg, dtype, device):
        assert str(device) == "meta", "weights were allocated before the checkpoint was refused"
        return real_empty(cfg, dtype, device)

    monkeypatch.setattr(Qwen3Weights, "empty", staticmethod(empty))


@pytest.mark.parametrize("case", ["block-64", "per-tensor", "awq", "per-channel", "unknown"])
def test_unsupported_checkpoint_fails_before_allocating(tiny_checkpoint, no_allocation, case):
    tiny = tiny_checkpoint(**SHAPE)
    write_fp8_checkpoint(tiny)
    qc, what = UNSUPPORTED[case]
    set_quantization(tiny.folder, qc)
    with pytest.raises(CheckpointError, match=what) as e:
        load_model(str(tiny.folder), device="cpu", progress=False)
    assert str(tiny.folder / "config.json") in str(e.value)


def test_damaged_fp8_checkpoints_fail_from_headers(tiny_checkpoint, no_allocation):
    from safetensors.torch import load_file, save_file

    tiny = tiny_checkpoint(**SHAPE)
    write_fp8_checkpoint(tiny)
    scales_file = tiny.folder / "model-00002-of-00002.safetensors"
    scales = load_file(str(scales_file))
    name = "model.layers.1.mlp.down_proj.weight_scale_inv"

    bad = dict(scales, **{name: torch.ones(2, 2)})     # down is [160, 352]: scales [2, 3]
    save_file(bad, str(scales_file))
    with pytest.raises(CheckpointError, match=r"down_proj.weight_scale_inv has shape \[2, 2\], expected \[2, 3\]"):
        load_model(str(tiny.folder), device="cpu", progress=False)

    save_file({k: v for k, v in scales.items() if k != name}, str(scales_file))
    index = json.loads((tiny.folder / "model.safetensors.index.json").read_text())
    del index["weight_map"][name]
    (tiny.folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"FP8 weight model.layers.1.mlp.down_proj.weight has no "):
        load_model(str(tiny.folder), device="cpu", progress=False)

    # FP8 tensors under a config.json that does not declare FP8.
    save_file(scales, str(scales_file))
    cfg = json.loads((tiny.folder / "config.json").read_text())
    del cfg["quantization_config"]
    (tiny.folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="F8_E4M3, but config.json has no FP8 quantization_config"):
        load_model(str(tiny.folder), device="cpu", progress=False)


# ---------------------------------------------------------------------------------------------
# The command lines, the results table, devices without FP8


def test_generate_quantize_fp8_on_the_tiny_random_model(cli):
    """``--quantize fp8`` from generate's command line: the interpreted per-op FP8 tiles and the
    reference on the same FP8 weights give the same greedy tokens, and the summary says fp8."""
    args = ("-m", "tiny-random", "--random-weights", "--quantize", "fp8", "--prompt-ids", "1 2 3 4", "-n", 4,
            "--device", "cpu", "--json")
    runs = {}
    for backend in ("reference", "per-op"):
        proc = cli(*args, "--backend", backend, timeout=300)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert "with FP8 projections" in proc.stderr
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        assert summary["quantization"] == "fp8" and summary["dtype"] == "float32"
        runs[backend] = summary["sequences"][0]["tokens"]
    assert len(runs["per-op"]) == 4 and runs["per-op"] == runs["reference"]
    bad = cli(*args[:4], "int4", timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "invalid choice: 'int4'" in bad.stderr


def test_bench_rows_carry_the_quantization(tmp_path, capsys):
    from megakernel import bench, results
    record = tmp_path / "r.jsonl"
    assert bench.main(["--device", "cpu", "--quantize", "fp8", "--compare", "per-op", "-n", "3", "--prompt-len", "4",
                       "--warmup", "0", "--record", str(record)]) == 0
    out = capsys.readouterr().out
    assert "fp8 projections" in out
    rows = results.read_rows(record)
    assert {r["backend"] for r in rows} == {"megakernel", "per-op"}
    assert all(r["quantization"] == "fp8" and r["fp8_activations"] == "dynamic" and not r["error"] for r in rows)
    assert "w8a8" in out
    # the floor counts the FP8 bytes: a tiny model's weights with one-byte projections
    tiny = bench.tiny_model(torch.device("cpu"), quantize="fp8")
    assert rows[0]["bytes_per_step"] < bench.step_bytes(bench.tiny_model(torch.device("cpu")), [4, 4])
    assert tiny.weights.nbytes() < rows[0]["bytes_per_step"]
    plain = dict(rows[0], quantization=None, fp8_activations=None, time="0")
    weight_only = dict(rows[0], fp8_activations="none")
    assert results.precision(rows[0]) == "float32, fp8 w8a8" and results.precision(plain) == "float32"
    assert results.precision(weight_only) == "float32, fp8 weights"
    table = results.headline_markdown(rows + [plain], include_cpu=True)
    assert "| float32, fp8 w8a8 |" in table and "| float32 |" in table


@pytest.mark.parametrize("argv, message", [
    (["--quantize", "fp8", "--compare", "torch-compile"], "--compare torch-compile runs 16-bit weights only"),
    (["--quantize", "int4"], "invalid choice: 'int4'"),
    (["--fp8-activations", "dynamic"], "--fp8-activations is for FP8 weights"),
    (["--quantize", "fp8", "--fp8-activations", "static"], "invalid choice: 'static'"),
])
def test_bench_refuses_what_fp8_cannot_run(argv, message, capsys):
    from megakernel import bench
    assert bench.main(argv + ["--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and message in err, err


def test_fp8_is_refused_on_the_npu_before_loading():
    from types import SimpleNamespace

    from megakernel import device
    with pytest.raises(RuntimeError, match="FP8 weights are not supported on the NPU: triton-ascend documents no "
                                           "float8 type"):
        device.check_fp8(SimpleNamespace(type="npu"))
    device.check_fp8(torch.device("cpu"))      # the interpreter reads float8e4nv


def test_plan_costs_count_fp8_bytes():
    from models.qwen3.config import PRESETS
    from scheduler.ops import Op, cost, make_plan
    cfg = PRESETS["8b"]
    bf16, fp8 = (make_plan(cfg, 1, 4096, 264, fp8=q) for q in (False, True))
    assert fp8.FP8 == 1 and bf16.FP8 == 0
    # tiles are sized as for bf16 weights; only their bytes differ
    assert {k: v for k, v in vars(bf16).items() if k != "FP8"} == {k: v for k, v in vars(fp8).items() if k != "FP8"}
    R, H = fp8.R_QKV, cfg.hidden_size
    assert cost(fp8, Op.QKV, 3) == 3 * (R * H + math.ceil(R / 128) * math.ceil(H / 128) * 4)
    assert cost(bf16, Op.QKV, 3) == 3 * R * H * 2
    assert cost(fp8, Op.LMHEAD, 2) == cost(bf16, Op.LMHEAD, 2)      # the LM head stays bf16


def test_fp8_weights_save_in_qwens_layout_and_load_back(tmp_path):
    """``save_checkpoint`` of FP8 weights writes Qwen's FP8 layout (what transformers' FP8 path and
    this loader read), and loading it gives the same fp8 values and scales."""
    from models.qwen3.config import DEMO_PRESETS
    from models.qwen3.weights import random_weights, save_checkpoint
    cfg = DEMO_PRESETS["tiny-random"]
    w = random_weights(cfg, seed=3, quantize="fp8")
    folder = save_checkpoint(tmp_path / "fp8", cfg, w)
    assert json.loads((folder / "config.json").read_text())["quantization_config"] == QWEN_FP8
    _, back = load_checkpoint(folder, progress=False)
    for name in ("wqkv", "wo", "wgate_up", "wdown"):
        assert torch.equal(getattr(back, name).view(torch.uint8), getattr(w, name).view(torch.uint8))
        assert torch.equal(getattr(back, name + "_scale"), getattr(w, name + "_scale"))
    assert torch.equal(back.dequantized().wqkv, w.dequantized().wqkv)


# ---------------------------------------------------------------------------------------------
# The batched tile's e4m3 -> bf16 (integer ops on both halves of a word, ``e4m3_bf16``)

import triton  # noqa: E402  (after megakernel, which picks the interpreter on the CPU)
import triton.language as tl  # noqa: E402

from instructions.fp8 import e4m3_bf16, e4m3_halves  # noqa: E402


@triton.jit
def _decode_bf16(w_ptr, halves_ptr, out_ptr, N: tl.constexpr, F32: tl.constexpr):
    """The words as ``load_wbs`` reads them: their halves before the multiply by 2^120 (bytes 0 and 2
    of word i at halves[i], 1 and 3 at halves[N / 4 + i]) and the decoded block, as one row."""
    i = tl.arange(0, N // 4)
    w = tl.load(w_ptr.to(tl.pointer_type(tl.int32)) + i)
    even, odd = e4m3_halves(w)
    tl.store(halves_ptr + i, even)
    tl.store(halves_ptr + N // 4 + i, odd)
    tl.store(out_ptr + tl.arange(0, N), tl.reshape(e4m3_bf16(tl.reshape(w, [1, 1, N // 4]), F32), [N]))


@pytest.mark.parametrize("route", ["float32", pytest.param("bf16", marks=pytest.mark.gpu)])
def test_e4m3_bf16_decode_is_exact_for_every_byte(route):
    """Every e4m3 byte but NaN, in the byte order of a row: before the multiply, each half is the bf16
    of the value times 2^-120 (a bf16 subnormal for the 14 e4m3 subnormals); after it, the decode is
    the value's bf16 conversion bit for bit (``route`` bf16, the GPU's packed bf16 multiply; float32,
    what a float32 model and the interpreter use, whose bf16 arithmetic flushes subnormals)."""
    dev = "cuda" if route == "bf16" else ("cuda" if torch.cuda.is_available() else "cpu")
    codes = torch.tensor([b for b in range(256) if b not in (0x7F, 0xFF)] + [0x00, 0x80], dtype=torch.uint8)
    fp8 = codes.view(torch.float8_e4m3fn).to(dev)
    halves = torch.empty(128, dtype=torch.int32, device=dev)
    f32 = route == "float32"
    out = torch.empty(256, dtype=torch.float32 if f32 else torch.bfloat16, device=dev)
    _decode_bf16[(1,)](fp8, halves, out, N=256, F32=f32)
    tiny = (fp8.float().cpu() * 2.0 ** -120).to(torch.bfloat16).view(torch.int16).long() & 0xFFFF
    words = tiny.view(64, 4)
    want = torch.cat([words[:, 0] | words[:, 2] << 16, words[:, 1] | words[:, 3] << 16])
    assert torch.equal(halves.cpu().long() & 0xFFFFFFFF, want), "halves differ from bf16(value * 2^-120)"
    assert int(((tiny & 0x7F80) == 0).logical_and(tiny & 0x7F != 0).sum()) == 14
    ref = fp8.float() if f32 else fp8.to(torch.bfloat16)
    assert torch.equal(out.view(torch.int32 if f32 else torch.int16), ref.view(torch.int32 if f32 else torch.int16))


REGISTER_PATHS = dict(BATCHED=0, MMA_V3=1, SWAP_CALL=0, SWAP_PRE=0, R_QKV=8, R_O=64, R_GU=8, R_DOWN=64, R_LM=8, BK_H=64, BK_Q=128, BK_I=128)


@pytest.mark.parametrize("batch", [1, 2])
def test_fp8_register_tiles_every_path(tiny_checkpoint, seed, batch):
    """The register tiles' FP8 paths the default plans of the tiny shape leave out: several K-chunks
    (K 160 and 352 over chunks of 64 and 128), a tile whose rows span two scale rows (64 over 32)
    with a chunk of one 128-column block, and two sequences through the register tiles (no
    batched tile), against transformers on the dequantized weights."""
    tiny = tiny_checkpoint(**SHAPE)
    real = write_fp8_checkpoint(tiny)
    model = load_model(str(tiny.folder), device="cpu", dtype=torch.float32, progress=False)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, tiny.vocab_size, (n,), generator=g) for n in (4, 6)[:batch]]
    mk = MegaQwen3(model, backend="megakernel", batch_size=batch, max_seq_len=10, plan_overrides=REGISTER_PATHS,
                   fp8_activations="none")
    plan = mk.backend.plan
    assert plan.FP8 == 1 and plan.BATCHED == 0 and plan.SCALE_ROWS == 32
    assert (plan.R_O, plan.BK_Q, plan.BK_H) == (64, 128, 64)
    mk.prefill(prompts)
    tokens, logits = [mk.tokens.tolist()], [mk.logits.clone()]
    mk.step()
    tokens.append(mk.tokens.tolist())
    logits.append(mk.logits.clone())
    for b, prompt in enumerate(prompts):
        want = oracle_logits(tiny, real, prompt, [t[b] for t in tokens[:-1]])
        for i, (ours, theirs) in enumerate(zip([lg[b] for lg in logits], want)):
            assert rel(ours, theirs) < 1e-5, f"sequence {b}, step {i}: relative error {rel(ours, theirs):.2e}"
