"""``MegaQwen3``: decode state (KV cache, pending tokens, logits) and the backends that step it.

Every backend advances the same state in place: it reads the pending token of each sequence from
``tokens``, appends that token's keys and values at position ``cache.lengths[b]``, writes float32
``logits``, puts the greedy next token into ``tokens`` and adds one to ``lengths``. Because all of
that lives in device memory, a kernel backend's step needs no host work beyond its launch.
Prompts are prefilled by the torch reference into the same cache (see ``prefill``).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from models.qwen3.reference import KVCache, Qwen3Reference
from models.qwen3.sampling import SamplingParams, sample

BACKENDS = ("megakernel", "superkernel", "per-op", "cuda-graph", "reference", "vm")


class ReferenceBackend:
    """The torch model, one op at a time (the oracle; also the ``reference`` baseline)."""

    def __init__(self, mk: "MegaQwen3"):
        self.mk = mk

    def decode(self):
        mk = self.mk
        mk.logits.copy_(mk.reference.decode(mk.tokens.long()))
        mk.tokens.copy_(mk.logits.argmax(-1))


def _import_backend(name: str, module: str, attr: str):
    """``module.attr``, or a clear error where the backend's module does not exist yet."""
    import importlib
    try:
        return getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise RuntimeError(f"backend {name!r} is not built yet (no module {module})") from None


def _make_backend(name: str, mk: "MegaQwen3", **options):
    if name == "reference":
        return ReferenceBackend(mk)
    if name == "vm":
        return _import_backend(name, "megakernel.vm", "VMBackend")(mk, **options)
    if name in ("megakernel", "superkernel", "per-op", "cuda-graph"):
        return _import_backend(name, "megakernel.backends", "make_kernel_backend")(name, mk, **options)
    raise ValueError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")


def _as_prompts(input_ids, batch_size: int) -> list[torch.Tensor]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, length], got shape {list(input_ids.shape)}")
        prompts = [row for row in input_ids.long().cpu()]
    elif len(input_ids) and isinstance(input_ids[0], int):
        prompts = [torch.tensor(input_ids, dtype=torch.long)]
    else:
        prompts = [torch.as_tensor(list(p), dtype=torch.long) for p in input_ids]
    if len(prompts) != batch_size:
        raise ValueError(f"got {len(prompts)} prompts for batch_size {batch_size}")
    return prompts


class MegaQwen3:
    """Decode a Qwen3 model with one of the backends in ``BACKENDS``.

    >>> mk = MegaQwen3(load_model("0.6b"), max_seq_len=4096, batch_size=1)
    >>> logits = mk.prefill([1, 2, 3]); tok = mk.step()
    """

    def __init__(self, model, max_seq_len: int = 4096, batch_size: int = 1, backend: str = "megakernel",
                 **backend_options):
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
        if max_seq_len < 2:
            raise ValueError(f"max_seq_len must be at least 2, got {max_seq_len}")
        if not 1 <= batch_size:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.model, self.config, self.weights = model, model.config, model.weights
        self.backend_name = backend
        self.max_seq_len, self.batch_size = max_seq_len, batch_size
        dev, dt = self.weights.device, self.weights.dtype
        kv_bytes = self.config.kv_bytes_per_position(dt.itemsize) * batch_size * max_seq_len
        from .device import check_fits
        check_fits(dev, kv_bytes, f"a KV cache for batch {batch_size} x {max_seq_len} positions")
        self.cache = KVCache.allocate(self.config, batch_size, max_seq_len, dt, dev)
        self.tokens = torch.zeros(batch_size, dtype=torch.int32, device=dev)      # pending input tokens
        self.logits = torch.zeros(batch_size, self.config.vocab_size, dtype=torch.float32, device=dev)
        self.reference = Qwen3Reference(self.config, self.weights, self.cache)
        self.sampling = SamplingParams()
        self._generator: torch.Generator | None = None
        self._lengths = [0] * batch_size    # host mirror of cache.lengths: bounds checks need no sync
        self.backend = _make_backend(backend, self, **backend_options)

    def reset(self):
        """Forget the sequences; buffers and the compiled tape are kept."""
        self.cache.reset()
        self.tokens.zero_()
        self._lengths = [0] * self.batch_size

    @torch.no_grad()
    def prefill(self, input_ids) -> torch.Tensor:
        """Fill the cache with the prompts (LongTensor [B, T], a list of ids, or a list of lists of
        different lengths) and return float32 logits [B, vocab] of each last position. The first
        decode token is chosen from them with the current sampling settings."""
        prompts = _as_prompts(input_ids, self.batch_size)
        V = self.config.vocab_size
        for b, p in enumerate(prompts):
            if p.numel() == 0:
                raise ValueError(f"prompt {b} is empty")
            if p.numel() >= self.max_seq_len:
                raise ValueError(f"prompt {b} has {p.numel()} tokens; max_seq_len is {self.max_seq_len}, "
                                 f"which leaves no room to generate")
            if int(p.min()) < 0 or int(p.max()) >= V:
                raise ValueError(f"prompt {b} has token ids outside [0, {V})")
        self.reset()
        self.logits.copy_(self.reference.prefill(prompts))
        self._lengths = [p.numel() for p in prompts]
        self.tokens.copy_(sample(self.logits, self.sampling, self._generator))
        return self.logits.clone()

    def _check_room(self, n: int):
        if not any(self._lengths):
            raise RuntimeError("step() before prefill(): there is no sequence to continue")
        full = [b for b, k in enumerate(self._lengths) if k + n > self.max_seq_len]
        if full:
            b = full[0]
            raise ValueError(f"sequence {b} is at {self._lengths[b]} of max_seq_len {self.max_seq_len}: "
                             f"no room for {n} more step(s); reset() or build with a larger max_seq_len")

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """One decode step for the whole batch; returns the next tokens, LongTensor [B]."""
        self._check_room(1)
        self.backend.decode()
        self._lengths = [n + 1 for n in self._lengths]
        if not self.sampling.greedy:
            self.tokens.copy_(sample(self.logits, self.sampling, self._generator))
        return self.tokens.long()

    @property
    def steps_per_launch(self) -> int:
        """Decode steps ``steps()`` runs per kernel launch: up to 64 for greedy decoding on the
        megakernel (each step's token goes to the next step's embedding on the device), else 1."""
        return getattr(self.backend, "max_steps_per_launch", 1) if self.sampling.greedy else 1

    @torch.no_grad()
    def steps(self, n: int, per_launch: int | None = None) -> torch.Tensor:
        """``n`` decode steps; returns their tokens, LongTensor [B, n]. The same tokens as ``n``
        calls of ``step()``, in launches of up to ``per_launch`` steps (default and most:
        ``steps_per_launch``)."""
        most = self.steps_per_launch
        k_max = most if per_launch is None else per_launch
        if n < 1 or not 1 <= k_max <= most:
            raise ValueError(f"steps({n}, per_launch={per_launch}): need n >= 1 and 1 <= per_launch <= {most}")
        self._check_room(n)
        out = []
        while n > 0:
            k = min(n, k_max)
            if k == 1:
                out.append(self.step()[:, None])
            else:
                self.backend.decode(k)
                self._lengths = [m + k for m in self._lengths]
                out.append(self.backend.st.hist[:k].T.long())    # a copy: the next launch rewrites hist
            n -= k
        return torch.cat(out, dim=1)

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None,
                 stop_tokens: Sequence[int] = (),
                 on_token: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """Prefill, then decode ``max_new_tokens`` tokens; LongTensor [B, N]. Stops early once every
        sequence has produced one of ``stop_tokens``. ``on_token`` sees each new [B] tensor."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        self.sampling = SamplingParams(temperature, top_k, top_p, seed)
        self._generator = None
        if seed is not None and not self.sampling.greedy:
            self._generator = torch.Generator(device=self.tokens.device).manual_seed(seed)
        self.prefill(input_ids)
        room = self.max_seq_len - max(self._lengths)
        if max_new_tokens > room + 1:
            raise ValueError(f"{max_new_tokens} new tokens do not fit: the longest prompt leaves room for "
                             f"{room + 1} within max_seq_len {self.max_seq_len}")
        out = [self.tokens.long()]
        done = torch.zeros(self.batch_size, dtype=torch.bool)
        stops = torch.tensor(list(stop_tokens), dtype=torch.long)
        # greedy decoding on the megakernel runs several steps per launch after a first one alone
        # (which compiles the kernel on first use, so the tokens' arrival times show it apart); a
        # launch may run steps past the last stop token, whose tokens are dropped
        chunk = self.steps_per_launch
        pending: list[torch.Tensor] = []
        for i in range(max_new_tokens):
            if i:
                if not pending:
                    pending = list(self.steps(1 if i == 1 else min(chunk, max_new_tokens - i)).unbind(1))
                out.append(pending.pop(0))
            if on_token is not None:
                on_token(out[-1])
            if len(stops):
                done |= torch.isin(out[-1].cpu(), stops)
                if bool(done.all()):
                    break
        return torch.stack(out, dim=1)
