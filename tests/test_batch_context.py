"""Batches and long contexts on the CPU: a batch decodes each sequence exactly as it would alone,
and attention split across positions stays exact when the context is long relative to the model.
"""

import pytest
import torch

from megakernel import MegaQwen3, load_model

from test_reference_vs_hf import random_prompt, rel_err


@pytest.mark.parametrize("backend,opts,batch_opts", [
    ("reference", {}, {}),
    # one worker: tiles of batch-1 sizes loop over the sequences
    ("megakernel", {"max_bk": 32}, {"plan_overrides": dict(BATCHED=0, MMA_V3=1, SWAP_CALL=0, SWAP_PRE=0, R_QKV=8, R_O=8, R_GU=8, R_DOWN=8, R_LM=8)}),
    ("megakernel", {"max_bk": 32}, {}),                                  # the plan's batched tiles
    ("per-op", {"max_bk": 32}, {}),
    ("vm", {"max_bk": 32}, {}),
    # both kv heads in one attention tile (ATTN_PAIR, one split): tile t is sequence t's two heads
    ("megakernel", {"max_bk": 32, "plan_overrides": {"ATTN_PAIR": 2, "NSPLIT": 1, "ATTN_NEW": 0}}, {}),
], ids=["reference", "megakernel-loop", "megakernel-batched", "per-op-batched", "vm-batched", "megakernel-pair"])
def test_batch_equals_each_sequence_alone(tiny_checkpoint, seed, monkeypatch, backend, opts, batch_opts):
    """Batch 3 against each sequence alone at batch 1, with 32-wide K-chunks so that every GEMV
    loops over several chunks; the batch's tiles loop over the sequences or (as the plan picks from
    batch 2) read their weights once for all three on the weights-on-M tile, in 16-column chunks."""
    import triton.language as tl

    import instructions.wgmma as wgmma
    monkeypatch.setattr(wgmma, "KC_SWAP", tl.constexpr(16))
    tiny = tiny_checkpoint(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompts = [random_prompt(n, tiny.vocab_size, seed + n) for n in (9, 3, 6)]
    steps = 10
    mk = MegaQwen3(model, max_seq_len=32, batch_size=3, backend=backend, **opts, **batch_opts)
    if backend not in ("reference", "vm"):
        assert mk.backend.plan.BATCHED == (0 if batch_opts else 2)
    batch = mk.generate(prompts, max_new_tokens=steps)
    for b, p in enumerate(prompts):
        alone = MegaQwen3(model, max_seq_len=32, batch_size=1, backend=backend, **opts)
        alone = alone.generate([p], max_new_tokens=steps)
        assert torch.equal(batch[b], alone[0]), f"sequence {b}: batch {batch[b].tolist()} alone {alone[0].tolist()}"


def test_tensor_core_batch_equals_each_sequence_alone(tiny_checkpoint, seed):
    """A batch of 17 sequences of as many prompt lengths (the batch padded to 32 columns of tl.dot):
    tiles of 8 rows are padded to 64, so the padding masks are exercised. One kv head keeps the
    attention tiles (one per sequence and kv head) few."""
    n = 17
    tiny = tiny_checkpoint(hidden=64, intermediate=128, heads=4, kv_heads=1, head_dim=16)
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    lengths = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) + 1
    prompts = [random_prompt(int(length), tiny.vocab_size, seed + i) for i, length in enumerate(lengths)]
    opts = dict(plan_overrides={"R_QKV": 8, "R_GU": 8, "R_LM": 8}, max_bk=32)
    steps = 4
    mk = MegaQwen3(model, max_seq_len=32, batch_size=n, backend="megakernel", **opts)
    batch = mk.generate(prompts, max_new_tokens=steps)
    ref = MegaQwen3(model, max_seq_len=32, batch_size=n, backend="reference")
    assert torch.equal(batch, ref.generate(prompts, max_new_tokens=steps))
    assert rel_err(mk.logits, ref.logits) < 1e-4
    for b in (0, n - 1):
        alone = MegaQwen3(model, max_seq_len=32, batch_size=1, backend="megakernel", **opts)
        alone = alone.generate([prompts[b]], max_new_tokens=steps)
        assert torch.equal(batch[b], alone[0]), f"sequence {b}: batch {batch[b].tolist()} alone {alone[0].tolist()}"


@pytest.mark.parametrize("backend,nsplit,block_s,dot,new,pair", [
    ("megakernel", 5, 16, True, 0, 1),     # 5 splits of 4 blocks; one worker runs all tiles as one instruction
    ("per-op", 8, 32, True, 0, 1),         # 5 busy splits of 2 blocks, 3 empty ones; one program per tile
    ("megakernel", 4, 64, True, 0, 1),     # the tiny model's default block: 1 or 2 blocks per split
    ("megakernel", 4, 64, False, 0, 1),    # Ascend's vector-unit products, walked in 16-position blocks
    ("megakernel", 1, 64, True, 0, 1),     # one split walks all 5 blocks and normalises its own output
    ("per-op", 1, 32, True, 0, 1),
    # split 0 holds the new position alone (ATTN_NEW): 4 cached splits of 5 blocks; 5 busy of 2
    # (the last partly masked) and 2 empty; the VM's reference tiles cut them alike
    ("megakernel", 5, 16, True, 1, 1),
    ("per-op", 8, 32, True, 1, 1),
    ("vm", 5, 16, True, 1, 1),
    ("megakernel", 4, 64, False, 1, 1),
    # both kv heads in one tile (ATTN_PAIR 2): their stacked blocks walked as one, 5 and 10 of them
    ("megakernel", 1, 64, True, 0, 2),
    ("per-op", 1, 32, True, 0, 2),
    ("vm", 1, 32, True, 0, 2),
    ("megakernel", 1, 64, False, 0, 2),
])
def test_long_context_split_attention(tiny_checkpoint, seed, monkeypatch, backend, nsplit, block_s, dot, new, pair):
    """A 300-token prompt on a hidden-64 model: attention cut into splits of several KV blocks
    (full, partly masked and empty ones; the new token in the last busy split, or with ATTN_NEW in
    split 0 alone), combined by the last split to finish (two splits at a time, as a GPU's 32 do),
    or with one split over two kv heads a tile (ATTN_PAIR), against the reference."""
    import triton.language as tl

    import instructions.attention as attention
    import instructions.reduce as reduce
    monkeypatch.setattr(reduce, "CHUNK_ELEMS", tl.constexpr(2 * 2 * 16))
    if not dot:
        monkeypatch.setattr(attention, "DOT", tl.constexpr(False))
        monkeypatch.setattr(attention, "VEC_ELEMS", tl.constexpr(2 * 16 * 16))
    tiny = tiny_checkpoint(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16)
    model = load_model(str(tiny.folder), device="cpu", progress=False)
    prompt = random_prompt(300, tiny.vocab_size, seed)
    ref = MegaQwen3(model, max_seq_len=320, backend="reference")
    mk = MegaQwen3(model, max_seq_len=320, backend=backend,
                   plan_overrides={"NSPLIT": nsplit, "BLOCK_S": block_s, "ATTN_NEW": new, "ATTN_PAIR": pair})
    want = ref.generate([prompt], max_new_tokens=4)
    got = mk.generate([prompt], max_new_tokens=4)
    assert torch.equal(got, want)
    assert rel_err(mk.logits, ref.logits) < 1e-4
