"""What each rank of the tensor-parallel tests runs (``megakernel.tp.spawn`` calls these in new
processes, which import this module by name)."""

from __future__ import annotations

import torch


def decode(rank: int, tp: int, folder: str, backend: str, prompts, steps: int, max_seq_len: int = 32,
           dtype: str = "float32", random_name: str | None = None, **options):
    """Rank ``rank`` of ``tp``: load its share of the checkpoint in ``folder`` (or of random
    weights of ``random_name``), prefill ``prompts``, decode ``steps`` greedy steps one at a time.
    Returns (tokens [B, 1 + steps], the last logits [B, V]) as CPU tensors."""
    import megakernel  # noqa: F401  (the interpreter on the CPU, before any kernel is defined)
    from megakernel import MegaQwen3, load_model
    from megakernel import tp as tp_mod

    torch.set_num_threads(1)
    if tp > 1:
        tp_mod.init(tp)
    name, rw = (random_name, True) if random_name else (folder, False)
    model = load_model(name, random_weights=rw, dtype=dtype, tp=tp, rank=rank, progress=False)
    mk = MegaQwen3(model, max_seq_len=max_seq_len, batch_size=len(prompts), backend=backend, **options)
    out = [mk.prefill(prompts).cpu()]
    for _ in range(steps):
        out.append(mk.step().cpu())
    return torch.stack(out, dim=1), mk.logits.cpu().clone()
