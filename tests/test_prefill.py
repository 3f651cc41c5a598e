"""The chunked prefill (models/qwen3/prefill.py) against Hugging Face's Qwen3ForCausalLM on tiny
random checkpoints in float32: last-position logits and every layer's keys and values in the
cache, for prompts that cross chunk boundaries and for batches of prompts of different lengths."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megakernel import MegaQwen3, load_model
from models.qwen3 import prefill as qwen3_prefill
from models.qwen3.prefill import plan_chunks, prefill
from models.qwen3.reference import KVCache, Qwen3Reference

from test_reference_vs_hf import SHAPES, assert_same_greedy, hf_greedy, random_prompt, rel_err


@pytest.fixture(autouse=True)
def _kernels_on_cpu(monkeypatch):
    """These tests run the prefill's Triton kernels through the interpreter (tiny shapes), which a
    CPU prefill otherwise leaves to torch's ops."""
    monkeypatch.setattr(qwen3_prefill.prefill_kernels, "INTERPRET_ON_CPU", True)


@torch.no_grad()
def hf_prefill(hf, prompt: list[int]):
    """HF's last-position logits [V] and per-layer keys and values, each [kv_heads, T, D]."""
    out = hf(torch.tensor([prompt]), use_cache=True)
    kv = out.get("cache") or out.get("past_key_values")   # renamed in transformers 5.2x
    return out.logits[0, -1], [(layer.keys[0], layer.values[0]) for layer in kv.layers]


def assert_matches_hf(tiny, cache: KVCache, logits: torch.Tensor, prompts: list[list[int]]):
    for b, prompt in enumerate(prompts):
        want, kv = hf_prefill(tiny.hf, prompt)
        assert rel_err(logits[b], want) < 1e-5, f"sequence {b}: logits relative error {rel_err(logits[b], want):.3g}"
        n = len(prompt)
        for l, (k, v) in enumerate(kv):
            assert rel_err(cache.k[l, b, :, :n], k) < 1e-5, f"sequence {b}, layer {l}: keys"
            assert rel_err(cache.v[l, b, :, :n], v) < 1e-5, f"sequence {b}, layer {l}: values"
        # Nothing is written past the prompt: the next positions belong to decode.
        assert not cache.k[:, b, :, n:].any() and not cache.v[:, b, :, n:].any(), f"sequence {b}: written past {n}"
    assert cache.lengths.tolist() == [len(p) for p in prompts]


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_prompt_across_chunks_matches_hf(tiny_checkpoint, seed, shape, tie):
    """One prompt of 11 to 19 tokens in chunks of 5: the second and later chunks attend to the
    cache the chunks before them wrote, with grouped kv heads in all but ``gqa1``."""
    tiny = tiny_checkpoint(tie=tie, **SHAPES[shape])
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompt = random_prompt(11 + seed % 9, tiny.vocab_size, seed)
    cache = KVCache.allocate(model.config, 1, 24, torch.float32, "cpu")
    logits = prefill(model.config, model.weights, cache, [torch.tensor(prompt)], chunk_size=5)
    assert logits.shape == (1, tiny.vocab_size) and logits.dtype == torch.float32
    assert_matches_hf(tiny, cache, logits, [prompt])


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 64])
def test_batch_of_different_lengths_matches_hf(tiny_checkpoint, seed, chunk_size):
    """Four prompts packed back to back (no padding): a chunk may hold the end of one prompt and
    the start of the next, and a one-token prompt may share a chunk with both neighbours."""
    tiny = tiny_checkpoint(**SHAPES["gqa5-odd"])
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    lengths = [9 + seed % 5, 1, 4, 13]
    prompts = [random_prompt(n, tiny.vocab_size, seed + i) for i, n in enumerate(lengths)]
    cache = KVCache.allocate(model.config, len(prompts), 20, torch.float32, "cpu")
    logits = prefill(model.config, model.weights, cache, [torch.tensor(p) for p in prompts], chunk_size=chunk_size)
    assert logits.shape == (len(prompts), tiny.vocab_size)
    assert_matches_hf(tiny, cache, logits, prompts)


@pytest.mark.parametrize("lengths,chunk_size", [([5], 5), ([12], 5), ([3, 1, 9, 2], 4), ([1] * 7, 3), ([40, 7], 16)])
def test_chunk_plan_covers_each_prompt_once_in_order(lengths, chunk_size):
    chunks = plan_chunks(lengths, chunk_size)
    sizes = [sum(m for *_, m in pieces) for pieces in chunks]
    assert all(s == chunk_size for s in sizes[:-1]) and 1 <= sizes[-1] <= chunk_size
    assert sum(sizes) == sum(lengths) and len(chunks) == -(-sum(lengths) // chunk_size)
    seen = {b: 0 for b in range(len(lengths))}
    stream = 0
    for c, pieces in enumerate(chunks):
        offset = 0
        for b, pos, o, m in pieces:
            assert (o, pos) == (offset, seen[b]) and m >= 1
            assert c * chunk_size + o == stream, "pieces follow the packed stream"
            seen[b], offset, stream = pos + m, offset + m, stream + m
    assert [seen[b] for b in range(len(lengths))] == lengths


def test_decode_after_prefill_as_before(tiny_checkpoint, seed, monkeypatch):
    """MegaQwen3.prefill goes through the chunked prefill (here in chunks of 4, the module's
    constant): its cache and logits equal those of the reference's own prefill, and decoding from
    its cache gives HF's greedy tokens."""
    tiny = tiny_checkpoint(**SHAPES["gqa2"])
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    cfg, w = model.config, model.weights
    prompts = [random_prompt(10 + seed % 7, tiny.vocab_size, seed), random_prompt(3, tiny.vocab_size, seed + 1)]
    steps = 12
    monkeypatch.setattr(qwen3_prefill, "PREFILL_CHUNK", 4)
    calls = []
    monkeypatch.setattr(qwen3_prefill, "plan_chunks", lambda *a: calls.append(a) or plan_chunks(*a))
    mk = MegaQwen3(model, backend="reference", batch_size=2, max_seq_len=32)
    mk.prefill(prompts)
    assert calls == [([len(p) for p in prompts], 4)]

    old = KVCache.allocate(cfg, 2, 32, torch.float32, "cpu")
    old_logits = Qwen3Reference(cfg, w, old).prefill([torch.tensor(p) for p in prompts])
    assert rel_err(mk.logits, old_logits) < 1e-6
    assert torch.equal(mk.cache.lengths, old.lengths)
    for b, p in enumerate(prompts):
        assert rel_err(mk.cache.k[:, b, :, :len(p)], old.k[:, b, :, :len(p)]) < 1e-6
        assert rel_err(mk.cache.v[:, b, :, :len(p)], old.v[:, b, :, :len(p)]) < 1e-6

    decode = Qwen3Reference(cfg, w, mk.cache).decode
    tokens = [mk.logits.argmax(-1)]
    for _ in range(steps - 1):
        tokens.append(decode(tokens[-1]).argmax(-1))
    tokens = torch.stack(tokens, dim=1)
    for b, prompt in enumerate(prompts):
        theirs, their_logits = hf_greedy(tiny.hf, prompt, steps)
        assert_same_greedy(tokens[b].tolist(), theirs, their_logits)


@pytest.mark.parametrize("prompts,chunk_size,message", [
    ([[1, 2]], 0, "chunk_size must be a positive integer"),
    ([[1, 2], [3]], 8, "got 2 prompts for a batch of 1"),
    ([[]], 8, "prompt 0 must be a non-empty 1-D sequence"),
    ([[[1, 2]]], 8, "prompt 0 must be a non-empty 1-D sequence"),
    ([[1] * 17], 8, "prompt 0 has 17 tokens; the cache holds 16"),
    ([[1, 99999]], 8, "prompt 0 has token ids outside"),
], ids=["chunk-0", "count", "empty", "2-D", "too-long", "id-range"])
def test_bad_input_is_refused_before_any_work(tiny_checkpoint, prompts, chunk_size, message):
    tiny = tiny_checkpoint(**SHAPES["gqa2"])
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    cache = KVCache.allocate(model.config, 1, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match=message):
        prefill(model.config, model.weights, cache, prompts, chunk_size=chunk_size)
    assert not cache.k.any() and not cache.lengths.any()


def test_default_chunk_is_bounded_by_the_activation_budget():
    """A chunk's activations stay within PREFILL_ACT_BYTES (or the GEMM-rate minimum), so a long
    prompt of a small model is one chunk (plain causal attention) and a large model's is cut."""
    from models.qwen3.config import PRESETS
    for name, cfg in PRESETS.items():
        n = qwen3_prefill.default_chunk(cfg, torch.bfloat16)
        per = qwen3_prefill.act_bytes_per_token(cfg, 2)
        assert n >= qwen3_prefill.PREFILL_MIN_CHUNK, name
        assert n == qwen3_prefill.PREFILL_MIN_CHUNK or n * per <= qwen3_prefill.PREFILL_ACT_BYTES, name
        assert (n + 1) * per > qwen3_prefill.PREFILL_ACT_BYTES or n == qwen3_prefill.PREFILL_MIN_CHUNK, name
    assert qwen3_prefill.default_chunk(PRESETS["0.6b"], torch.bfloat16) >= 32768
    assert qwen3_prefill.default_chunk(PRESETS["32b"], torch.bfloat16) < 32768


def _chunk_descriptors(lengths):
    """Each packed token's (sequence, position), as prefill builds them."""
    seq = torch.arange(len(lengths)).repeat_interleave(torch.tensor(lengths))
    pos = torch.cat([torch.arange(n) for n in lengths])
    return seq, pos


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(6, 2, 16), (4, 4, 12)], ids=["gqa3", "gqa1-d12"])
def test_fused_qk_norm_rope_cache_matches_torch(seed, heads, kv_heads, head_dim):
    """The Triton kernel (interpreted here) against Hugging Face's formulas (``reference.rmsnorm``,
    ``apply_rope``) and against the torch fallback on fresh random q|k|v, norm weights and positions:
    a batch of three sequences packed into chunks of 8, so pieces of a sequence cross a chunk, and
    a head_dim that is not a power of two."""
    from models.qwen3 import prefill_kernels
    from models.qwen3.config import Qwen3Config
    from models.qwen3.reference import apply_rope, rmsnorm, rope_cos_sin

    g = torch.Generator().manual_seed(seed)
    cfg = Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, head_dim=head_dim, rope_theta=10_000.0)
    L, D = cfg.num_hidden_layers, head_dim
    w = SimpleNamespace(q_norm=1 + 0.3 * torch.randn(L, D, generator=g), k_norm=1 + 0.3 * torch.randn(L, D, generator=g),
                        dtype=torch.float32)
    lengths, chunk = [5, 11, 3], 8
    seq, pos = _chunk_descriptors(lengths)
    cos, sin = rope_cos_sin(pos, D, cfg.rope_theta, torch.float32)
    ours = KVCache.allocate(cfg, len(lengths), 16, torch.float32, "cpu")
    fallback = KVCache.allocate(cfg, len(lengths), 16, torch.float32, "cpu")
    torch_path = qwen3_prefill._TorchQKRope(cfg, w, cos, sin)
    plan = plan_chunks(lengths, chunk)
    assert any(p0 > 0 for pieces in plan for _, p0, _, _ in pieces), "a sequence crosses a chunk"
    for c, pieces in enumerate(plan):
        c0, n = c * chunk, sum(m for *_, m in pieces)
        for l in range(L):
            qkv = 3 * torch.randn(n, cfg.qkv_size, generator=g)
            q = torch.empty(n, heads, D)
            span = slice(c0, c0 + n)
            prefill_kernels.qk_norm_rope_cache(qkv, w.q_norm[l], w.k_norm[l], cos[span], sin[span], seq[span],
                                               pos[span], ours.k[l], ours.v[l], q, cfg.rms_norm_eps)
            qk_torch = torch.empty(n, heads + kv_heads, D)
            torch_path(qkv, l, c0, pieces, fallback, qk_torch)
            q_torch = qk_torch[:, :heads]
            q_hf = apply_rope(rmsnorm(qkv[:, :cfg.q_size].view(n, heads, D), w.q_norm[l], cfg.rms_norm_eps),
                              cos[span, None], sin[span, None])
            assert rel_err(q, q_hf) < 1e-6 and rel_err(q_torch, q_hf) < 1e-6, f"chunk {c}, layer {l}: queries"
            k_hf = apply_rope(rmsnorm(qkv[:, cfg.q_size:cfg.q_size + cfg.kv_size].view(n, kv_heads, D), w.k_norm[l],
                                      cfg.rms_norm_eps), cos[span, None], sin[span, None])
            for b, p0, o, m in pieces:
                assert rel_err(ours.k[l, b, :, p0:p0 + m], k_hf[o:o + m].transpose(0, 1)) < 1e-6
                assert torch.equal(ours.v[l, b, :, p0:p0 + m],
                                   qkv[o:o + m, cfg.q_size + cfg.kv_size:].view(m, kv_heads, D).transpose(0, 1))
    # the kernel wrote exactly where the torch path did: each prompt's positions and nothing more
    for b, n in enumerate(lengths):
        assert ours.k[:, b, :, :n].all() and not ours.k[:, b, :, n:].any() and not ours.v[:, b, :, n:].any()
    assert rel_err(ours.k, fallback.k) < 1e-6 and torch.equal(ours.v, fallback.v)


def test_fused_silu_mul_matches_torch(seed):
    from models.qwen3 import prefill_kernels
    g = torch.Generator().manual_seed(seed)
    for n, inter in [(7, 40), (3, 1500)]:      # one column block, and several with a ragged last
        gate_up = 4 * torch.randn(n, 2 * inter, generator=g)
        out = prefill_kernels.silu_mul(gate_up, torch.empty(n, inter))
        want = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        assert rel_err(out, want) < 1e-6


def test_torch_fallback_matches_hf_and_the_kernels(tiny_checkpoint, seed, monkeypatch):
    """Where the kernels cannot run (prefill_kernels.supported false), the torch ops give HF's
    logits and cache, and the same as the kernels to float32 rounding, on a batch across chunks."""
    tiny = tiny_checkpoint(**SHAPES["gqa5-odd"])
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompts = [random_prompt(n, tiny.vocab_size, seed + i) for i, n in enumerate([7 + seed % 5, 2, 10])]

    def run():
        cache = KVCache.allocate(model.config, len(prompts), 20, torch.float32, "cpu")
        return prefill(model.config, model.weights, cache, [torch.tensor(p) for p in prompts], chunk_size=6), cache

    fused_logits, fused = run()
    monkeypatch.setattr(qwen3_prefill.prefill_kernels, "supported", lambda *a: False)
    monkeypatch.setattr(qwen3_prefill.prefill_kernels, "qk_norm_rope_cache", None)   # never called
    monkeypatch.setattr(qwen3_prefill.prefill_kernels, "silu_mul", None)
    logits, cache = run()
    assert_matches_hf(tiny, cache, logits, prompts)
    assert rel_err(logits, fused_logits) < 1e-6
    assert rel_err(cache.k, fused.k) < 1e-6 and rel_err(cache.v, fused.v) < 1e-6


_COMPILE_PREFILL_KERNELS = """
import json, re, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from models.qwen3 import prefill_kernels as pk
assert not pk._INTERPRETED
target, rows = GPUTarget("cuda", 90, 32), []
def compile(fn, sig, consts, aligned):
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(sig) if name in aligned}
    ptx = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs), target=target,
                         options=dict(num_warps=4)).asm["ptx"]
    rows.append(dict(kernel=fn.__name__, consts=str(consts), scalar_16bit_stores=len(re.findall(r"st\\.global\\.b16", ptx))))
for hq, hkv, inter in ((16, 8, 3072), (32, 8, 12288)):        # 0.6b, 8b
    sig = {n: "*bf16" for n in ("qkv_ptr", "q_ptr", "k_ptr", "v_ptr", "q_norm_ptr", "k_norm_ptr")}
    sig.update(cos_ptr="*fp32", sin_ptr="*fp32", seq_ptr="*i64", pos_ptr="*i64", rows="i32", qkv_stride="i32",
               cache_sb="i32", cache_sh="i32", cache_sp="i32", eps="fp32", HQ="constexpr", HKV="constexpr",
               D="constexpr", BLOCK_R="constexpr", BLOCK_HALF="constexpr")
    # as a launch specialises them: pointers and the strides, multiples of 16
    compile(pk._qk_norm_rope_cache_kernel, sig, dict(HQ=hq, HKV=hkv, D=128, BLOCK_R=16, BLOCK_HALF=64),
            [n for n in sig if n.endswith("_ptr") or n.endswith("stride") or n.startswith("cache_")])
    sig = dict(gu_ptr="*bf16", out_ptr="*bf16", n="i32", gu_stride="i32", out_stride="i32", I="constexpr",
               BLOCK_M="constexpr", BLOCK_N="constexpr")
    compile(pk._silu_mul_kernel, sig, dict(I=inter, BLOCK_M=2, BLOCK_N=1024), ["gu_ptr", "out_ptr", "gu_stride", "out_stride"])
    sig = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", out_ptr="*bf16", seq_ptr="*i64", pos_ptr="*i64",
               cache_sb="i32", cache_sh="i32", cache_sp="i32", scale="fp32", HQ="constexpr", HKV="constexpr",
               D="constexpr", G_PAD="constexpr", D_PAD="constexpr", BLOCK_N="constexpr")
    compile(pk._cache_attention_kernel, sig, dict(HQ=hq, HKV=hkv, D=128, G_PAD=16, D_PAD=128, BLOCK_N=32),
            [n for n in sig if n.endswith("_ptr") or n.startswith("cache_")])
print(json.dumps(rows))
"""


def test_prefill_kernels_compile_for_sm90():
    """The interpreter cannot see what only Triton's compiler rejects: the kernels compile for
    Hopper with 0.6b's and 8b's shapes in bf16, and store whole vectors (no 16-bit scalar stores:
    each head half and each column block is one contiguous run)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(repo)
    r = subprocess.run([sys.executable, "-c", _COMPILE_PREFILL_KERNELS], cwd=repo, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(rows) == 6 and all(row["scalar_16bit_stores"] == 0 for row in rows), rows


@pytest.mark.gpu
def test_gpu_fused_kernels_within_bf16_rounding(seed):
    """On a GPU, in bf16 with Qwen3-0.6B's head shapes: the compiled kernels are what prefill runs,
    and their outputs are within bf16 rounding of the float32 formulas on the same inputs (one
    rounding each, where the torch path rounds several times); values are copied exactly."""
    from models.qwen3 import prefill_kernels
    from models.qwen3.reference import apply_rope, rmsnorm, rope_cos_sin

    dev, bf16 = torch.device("cuda"), torch.bfloat16
    assert prefill_kernels.supported(dev, bf16)
    g = torch.Generator(device=dev).manual_seed(seed)
    Hq, Hkv, D, eps = 16, 8, 128, 1e-6
    lengths = [700, 1, 300]
    seq, pos = (t.to(dev) for t in _chunk_descriptors(lengths))
    n = sum(lengths)
    cos, sin = rope_cos_sin(pos, D, 1_000_000.0, torch.float32)
    qkv = (3 * torch.randn(n, (Hq + 2 * Hkv) * D, generator=g, device=dev)).to(bf16)
    q_norm, k_norm = (1 + 0.3 * torch.randn(2, D, generator=g, device=dev)).to(bf16)
    k_cache, v_cache = torch.zeros(2, len(lengths), Hkv, 1024, D, dtype=bf16, device=dev)
    q = torch.empty(n, Hq, D, dtype=bf16, device=dev)
    prefill_kernels.qk_norm_rope_cache(qkv, q_norm, k_norm, cos, sin, seq, pos, k_cache, v_cache, q, eps)
    x = qkv.float()
    q_want = apply_rope(rmsnorm(x[:, :Hq * D].view(n, Hq, D), q_norm.float(), eps), cos[:, None], sin[:, None])
    k_want = apply_rope(rmsnorm(x[:, Hq * D:(Hq + Hkv) * D].view(n, Hkv, D), k_norm.float(), eps),
                        cos[:, None], sin[:, None])
    assert rel_err(q, q_want) < 4e-3
    k_got = torch.cat([k_cache[b, :, :m].transpose(0, 1) for b, m in enumerate(lengths)])
    v_got = torch.cat([v_cache[b, :, :m].transpose(0, 1) for b, m in enumerate(lengths)])
    assert rel_err(k_got, k_want) < 4e-3
    assert torch.equal(v_got, qkv[:, (Hq + Hkv) * D:].view(n, Hkv, D))
    assert not k_cache[0, :, :, 700:].any() and not v_cache[2, :, :, 300:].any()
    # launched again through the kept compiled kernel, and with token descriptors 8 bytes off the
    # 16-byte alignment (another specialization, so another kernel): the same rows
    for start in (0, 0, 1):
        again = torch.empty(n - start, Hq, D, dtype=bf16, device=dev)
        prefill_kernels.qk_norm_rope_cache(qkv[start:], q_norm, k_norm, cos[start:], sin[start:], seq[start:],
                                           pos[start:], k_cache, v_cache, again, eps)
        assert torch.equal(again, q[start:])
    assert len(prefill_kernels._qk_launch.compiled) >= 2

    gate_up = (4 * torch.randn(n, 2 * 3072, generator=g, device=dev)).to(bf16)
    act = prefill_kernels.silu_mul(gate_up, torch.empty(n, 3072, dtype=bf16, device=dev))
    want = torch.nn.functional.silu(gate_up[:, :3072].float()) * gate_up[:, 3072:].float()
    assert rel_err(act, want) < 4e-3


def test_cpu_prefill_keeps_torch_ops_unless_asked(monkeypatch):
    """Interpreted kernels are far slower than torch's ops at real shapes: a CPU prefill uses them
    only when INTERPRET_ON_CPU is set (as these tests do), and never in 16-bit."""
    from models.qwen3 import prefill_kernels
    cpu = torch.device("cpu")
    assert prefill_kernels.supported(cpu, torch.float32)
    assert not prefill_kernels.supported(cpu, torch.bfloat16)
    monkeypatch.setattr(prefill_kernels, "INTERPRET_ON_CPU", False)
    assert not prefill_kernels.supported(cpu, torch.float32)


@pytest.mark.parametrize("pieces,runs", [
    ([(0, 0, 0, 4), (1, 0, 4, 4), (2, 0, 8, 4)], [[0, 1, 2]]),
    ([(0, 3, 0, 2), (1, 0, 2, 5), (2, 0, 7, 3)], [[0], [1, 2]]),     # a continuing piece runs alone
    ([(0, 0, 0, 9), (1, 0, 9, 1), (2, 0, 10, 2)], [[0, 1], [2]]),    # 2 x 9 <= 2 x 10; 3 x 9 > 2 x 12
])
def test_pieces_that_start_their_prompts_share_one_attention_call(pieces, runs):
    got = qwen3_prefill.group_pieces(pieces)
    assert [[pieces.index(p) for p in run] for run in got] == runs


@pytest.mark.parametrize("lengths,slots", [([6, 6, 6], [1, 2, 3]), ([4, 4], [3, 0]), ([5, 7, 6, 2], [3, 0, 2, 1])],
                         ids=["equal-neighbours", "equal-scattered", "ragged-scattered"])
def test_grouped_attention_gives_what_one_call_a_prompt_gives(tiny_checkpoint, seed, monkeypatch, lengths, slots):
    """Prompts admitted together (a server's packed admission, into any slots) attend in one padded
    SDPA call. Prompts of one length get the bits of one call a prompt; ragged ones the same values
    within float32 rounding (the CPU's SDPA sums a padded row in another order; the cache's keys
    and values, written before attention, stay the same bits)."""
    tiny = tiny_checkpoint(**SHAPES["gqa5-odd"])
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompts = [torch.tensor(random_prompt(n, tiny.vocab_size, seed + i)) for i, n in enumerate(lengths)]
    assert len(qwen3_prefill.group_pieces(qwen3_prefill.plan_chunks(lengths, 64)[0])) < len(lengths)
    stale = KVCache.allocate(model.config, 4, 12, torch.float32, "cpu")
    stale.k.normal_(), stale.v.normal_()      # old keys past each prompt must not leak in
    out = []
    for ratio in (qwen3_prefill.GROUP_PAD_RATIO, 0):     # 0: every piece its own call
        monkeypatch.setattr(qwen3_prefill, "GROUP_PAD_RATIO", ratio)
        cache = KVCache(stale.k.clone(), stale.v.clone(), stale.lengths.clone())
        out.append((prefill(model.config, model.weights, cache, prompts, slots=slots), cache))
    (grouped, c1), (alone, c2) = out
    if len(set(lengths)) == 1:
        assert torch.equal(grouped, alone)
        assert torch.equal(c1.k, c2.k) and torch.equal(c1.v, c2.v)
    else:
        assert rel_err(grouped, alone) < 1e-5
        assert rel_err(c1.k, c2.k) < 1e-5 and rel_err(c1.v, c2.v) < 1e-5
    assert torch.equal(c1.lengths, c2.lengths)


@pytest.mark.parametrize("lengths,slots", [([5, 7, 6, 2], [3, 0, 2, 1]), ([9], [2]), ([1, 1, 16], [0, 1, 3])],
                         ids=["ragged", "one", "short-and-long"])
def test_prefill_graph_body_equals_the_eager_prefill(tiny_checkpoint, seed, lengths, slots):
    """The fixed-size prefill that CUDA graphs capture (``prefill_graphs``, run here without capture
    through the interpreter): padded to its token bucket, attention by ``cache_attention`` over the
    cache. Logits and cache equal the eager prefill's within float32 rounding, and nothing is
    written for the padding or into other slots."""
    from models.qwen3.prefill_graphs import PrefillGraphs
    tiny = tiny_checkpoint(**SHAPES["gqa5-odd"])
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompts = [torch.tensor(random_prompt(n, tiny.vocab_size, seed + i)) for i, n in enumerate(lengths)]
    stale = KVCache.allocate(model.config, 4, 24, torch.float32, "cpu")
    stale.k.normal_(), stale.v.normal_()
    eager = KVCache(stale.k.clone(), stale.v.clone(), stale.lengths.clone())
    want = prefill(model.config, model.weights, eager, prompts, slots=slots)
    cache = KVCache(stale.k.clone(), stale.v.clone(), stale.lengths.clone())
    graphs = PrefillGraphs(model.config, model.weights, cache, max_prompts=4, max_tokens=32)
    assert graphs.buckets == [16, 32] and graphs.fits(lengths) and not graphs.capture
    got = graphs(prompts, slots)
    assert got.shape == want.shape and rel_err(got, want) < 1e-5
    assert rel_err(cache.k, eager.k) < 1e-5 and rel_err(cache.v, eager.v) < 1e-5
    for b in range(4):      # past each prompt (and in the slot left out) the old keys are untouched
        n = lengths[slots.index(b)] if b in slots else 0
        assert torch.equal(cache.k[:, b, :, n:], stale.k[:, b, :, n:]), f"slot {b}"
    assert torch.equal(cache.lengths, eager.lengths)
    assert not graphs.fits([33]) and not graphs.fits([1] * 5) and not graphs.fits([20, 20])


def test_prefill_slots_with_graphs_gives_the_eager_first_tokens(tiny_checkpoint, seed, monkeypatch):
    """``MegaQwen3.enable_prefill_graphs``: prompts that fit go through the graphs' prefill, longer
    ones through the eager one, and both give the eager prefill's first tokens."""
    from models.qwen3.prefill_graphs import PrefillGraphs
    ran = []
    call = PrefillGraphs.__call__
    monkeypatch.setattr(PrefillGraphs, "__call__", lambda self, p, s: ran.append(len(p)) or call(self, p, s))
    tiny = tiny_checkpoint(**SHAPES["gqa5-odd"])
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompts = [random_prompt(n, tiny.vocab_size, seed + i) for i, n in enumerate([6, 3, 11])]
    firsts = []
    for graphs in (False, True):
        mk = MegaQwen3(model, max_seq_len=40, batch_size=3, backend="reference")
        if graphs:
            mk.enable_prefill_graphs(max_tokens=16)
        mk.prefill_slots([2, 0], prompts[:2])             # 9 tokens: the graphs' bucket of 16
        mk.prefill_slots([1], [prompts[2] * 2])          # 22 tokens: past it, the eager prefill
        firsts.append((mk.tokens.tolist(), mk.cache.lengths.tolist()))
    assert firsts[0] == firsts[1] and ran == [2]


def test_chunk_grows_with_a_gpus_free_memory(monkeypatch):
    """On a GPU with room, a chunk's activations may take a quarter of the free memory (what torch's
    allocator holds unused included): 8b's 32k-token prompt is one chunk with 100 GiB free, and
    with 4 GiB free the fixed budget holds. Without a device (a TP rank) the budget is fixed."""
    from models.qwen3.config import PRESETS
    gib = 1024 ** 3
    mem = {"free": 90 * gib, "unused": 10 * gib}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (mem["free"], 141 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 20 * gib + mem["unused"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 20 * gib)
    cfg, cuda = PRESETS["8b"], torch.device("cuda", 0)
    per = qwen3_prefill.act_bytes_per_token(cfg, 2)
    assert qwen3_prefill.act_budget(cuda) == 25 * gib
    assert qwen3_prefill.default_chunk(cfg, torch.bfloat16, cuda) == 25 * gib // per >= 32768
    assert qwen3_prefill.default_chunk(cfg, torch.bfloat16) == qwen3_prefill.PREFILL_ACT_BYTES // per < 32768
    mem.update(free=1 * gib, unused=3 * gib)
    assert qwen3_prefill.act_budget(cuda) == qwen3_prefill.PREFILL_ACT_BYTES
    assert qwen3_prefill.act_budget(torch.device("cpu")) == qwen3_prefill.PREFILL_ACT_BYTES
