"""The bench's compiled peers on the CPU: ``torch-compile`` (models/qwen3/static_decode.py) against
Hugging Face's Qwen3ForCausalLM, and both it and ``hf-compile`` as compiled graphs whose only
mutated inputs are static ones, which is what CUDA graph trees need to record a step (an input
mutated that is not static is inductor's "skipping cudagraphs due to mutated inputs")."""

from __future__ import annotations

import pytest
import torch

from models.qwen3.static_decode import StaticDecoder
from models.qwen3.weights import load_checkpoint

SHAPE = dict(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)


def rel_err(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@torch.no_grad()
def test_static_decode_matches_hf(tiny_checkpoint, seed):
    """Prefill logits (over two prefill chunks) and every teacher-forced decode step's logits equal
    HF's full forward over the same tokens, for a batch of two."""
    from models.qwen3 import static_decode
    tiny = tiny_checkpoint(**SHAPE)
    cfg, w = load_checkpoint(tiny.folder, progress=False)
    g = torch.Generator().manual_seed(seed)
    B, P, N = 2, 7, 6
    ids = torch.randint(0, cfg.vocab_size, (B, P + N), generator=g)
    dec = StaticDecoder(cfg, w, B, max_seq_len=24, compile=False)
    for t in dec.cache.k + dec.cache.v:   # stale entries past a sequence's position must not count
        t.copy_(1e3 * torch.randn(t.shape, generator=g))
    full = tiny.hf(ids).logits.float()                  # [B, P + N, V]
    logits = static_decode.prefill_logits(cfg, w, dec.cache, ids[:, :P], chunk=4)
    assert rel_err(logits, full[:, P - 1]) < 1e-5
    pos = torch.full((B,), P)
    for i in range(N):
        step = static_decode.decode_logits(cfg, w, dec.cache, ids[:, P + i], pos)
        assert rel_err(step, full[:, P + i]) < 1e-5, i
        pos += 1
    # the greedy wrapper: prefill's token, then each step's argmax
    assert torch.equal(dec.prefill(ids[:, :P]), full[:, P - 1].argmax(-1))
    assert torch.equal(dec.step(ids[:, P]), full[:, P].argmax(-1))
    assert dec.pos.tolist() == [P + 1] * B


def _recording_backend(seen: dict):
    """A torch.compile backend that runs AOTAutograd (as inductor does) and records which graph
    inputs the step mutates and which inputs are static, the two sets inductor's cudagraph check
    compares."""
    from torch._functorch.aot_autograd import aot_module_simplified

    def backend(gm, example_inputs):
        def forward(graph, inputs):
            meta = torch._guards.TracingContext.try_get().fw_metadata
            seen["static"] = set(meta.static_input_indices)
            seen["mutated"] = {i for i, info in enumerate(meta.input_info) if info.mutates_data or
                               info.mutates_metadata}
            return graph
        return aot_module_simplified(gm, example_inputs, fw_compiler=forward)
    return backend


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@torch.no_grad()
def test_torch_compile_peer_mutates_only_static_inputs(tiny_checkpoint, seed, fresh_dynamo):
    """The compiled step writes the KV cache and nothing else, and the cache is static; its tokens
    equal the eager step's."""
    tiny = tiny_checkpoint(**SHAPE)
    cfg, w = load_checkpoint(tiny.folder, progress=False)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (3, 5), generator=g)
    seen = {}
    eager = StaticDecoder(cfg, w, 3, 16, compile=False)
    dec = StaticDecoder(cfg, w, 3, 16, compile=False)
    dec._step = torch.compile(dec._greedy, backend=_recording_backend(seen), fullgraph=True, dynamic=False)
    a, b = eager.prefill(ids), dec.prefill(ids)
    for _ in range(4):
        a, b = eager.step(a), dec.step(b)
        assert torch.equal(a, b)
    assert seen["mutated"], "the step must write the KV cache"
    assert seen["mutated"] <= seen["static"], seen


@torch.no_grad()
def test_hf_compile_peer_mutates_only_static_inputs(tiny_checkpoint, seed, fresh_dynamo):
    """transformers' StaticCache under the bench's set-up: its in-place cache writes (and its
    length counter) are on static inputs too; its tokens equal eager transformers'."""
    from megakernel.bench import HFRunner
    tiny = tiny_checkpoint(**SHAPE)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, tiny.vocab_size, (2, 5), generator=g)
    seen = {}
    compiled = HFRunner(tiny.hf, 2, 16, compiled=True, compile_backend=_recording_backend(seen))
    a = compiled.prefill(ids)
    full = ids
    for _ in range(4):
        full = torch.cat([full, a[:, None]], 1)
        a = compiled.forced(a)
        assert torch.equal(a, tiny.hf(full).logits[:, -1].argmax(-1))
    assert seen["mutated"] and seen["mutated"] <= seen["static"], seen


@torch.no_grad()
@pytest.mark.parametrize("tie", [False, True])
def test_hf_peer_shares_our_weights(tiny_checkpoint, seed, tie):
    """The bench's transformers peer holds views of the model's stacked weights, not a second copy
    (32b in bf16 would need 128 GB), and gives the logits of transformers' own load of the checkpoint."""
    from megakernel.bench import hf_model
    from megakernel.model import load_model
    tiny = tiny_checkpoint(**SHAPE, tie=tie)
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    peer = hf_model(model)
    ours = {t.untyped_storage().data_ptr() for t in vars(model.weights).values() if isinstance(t, torch.Tensor)}
    assert all(p.untyped_storage().data_ptr() in ours for p in peer.parameters())
    assert (peer.lm_head.weight is peer.model.embed_tokens.weight) == tie
    ids = torch.randint(0, tiny.vocab_size, (2, 9), generator=torch.Generator().manual_seed(seed))
    assert rel_err(peer(ids).logits, tiny.hf(ids).logits) < 1e-6
