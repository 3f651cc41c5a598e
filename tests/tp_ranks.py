"""What each rank of the tensor-parallel tests runs (``megakernel.tp.spawn`` calls these in new
processes, which import this module by name)."""

from __future__ import annotations

import torch


def _model(rank: int, tp: int, name: str, random_weights: bool, dtype: str, device=None, quantize=None):
    import megakernel  # noqa: F401  (the interpreter on the CPU, before any kernel is defined)
    from megakernel import load_model
    from megakernel import tp as tp_mod

    torch.set_num_threads(1)
    if tp > 1:
        tp_mod.init(tp)
    return load_model(name, random_weights=random_weights, dtype=dtype, tp=tp, rank=rank, progress=False,
                      device=device, quantize=quantize)


def decode(rank: int, tp: int, name: str, backends, prompts, steps: int, per_launch: int = 1, max_seq_len: int = 32,
           dtype: str = "float32", random_weights: bool = False, device=None, quantize=None, **options) -> dict:
    """Rank ``rank`` of ``tp``: load its share of model ``name`` (a checkpoint folder, or random
    weights), then for each backend prefill ``prompts`` and decode ``steps`` greedy steps in
    launches of ``per_launch``. Returns backend: (tokens [B, 1 + steps], the last logits [B, V]),
    CPU tensors, and under "plans" and "xs" each kernel backend's plan (a dict of its fields) and
    its last xs and xss (the weights-on-M tile's normalised input). ``quantize="fp8"``: the
    projections in block FP8."""
    import dataclasses

    from megakernel import MegaQwen3

    model = _model(rank, tp, name, random_weights, dtype, device, quantize)
    out = {}
    for backend in backends:
        mk = MegaQwen3(model, max_seq_len=max_seq_len, batch_size=len(prompts), backend=backend, **options)
        toks = [mk.prefill(prompts)[:, None].cpu()]
        if steps:
            toks.append(mk.steps(steps, per_launch=min(per_launch, mk.steps_per_launch)).cpu())
        out[backend] = (torch.cat(toks, dim=1), mk.logits.cpu().clone())
        plan, st = getattr(mk.backend, "plan", None), getattr(mk.backend, "st", None)
        if plan is not None:
            out.setdefault("plans", {})[backend] = dataclasses.asdict(plan)
        if st is not None and "xs" in st.tensors:
            out.setdefault("xs", {})[backend] = (st.xs.cpu().clone(), st.xss.cpu().clone())
    return out


def stop_one(rank: int, tp: int, name: str, backend: str, prompts, stopping: int, how: str, dtype: str = "float32",
             device=None, **options) -> str:
    """Rank ``stopping`` stops after a first step, the others go on stepping. ``how``: "abort", its
    next step fails (it writes the abort word, as a failing step does, then steps on); "exit", its
    process ends without a word. Returns what each rank saw: the error it raised (type, message and
    seconds it took), or "exited"."""
    import time

    from megakernel import MegaQwen3

    model = _model(rank, tp, name, False, dtype, device)
    mk = MegaQwen3(model, max_seq_len=32, batch_size=len(prompts), backend=backend, **options)
    mk.prefill(prompts)
    mk.step()
    mk.backend.synchronize()
    if rank == stopping:
        if how == "exit":
            return "exited"
        mk.tp_group.abort()
    t0 = time.perf_counter()
    try:
        for _ in range(4):
            mk.step()
            mk.backend.synchronize()
    except Exception as e:
        return f"{type(e).__name__}: {e} ({time.perf_counter() - t0:.1f} s)"
    return "no error"