"""``MegaQwen3``: decode state (KV cache, pending tokens, logits) and the backends that step it.

Every backend advances the same state in place: it reads the pending token of each sequence from
``tokens``, appends that token's keys and values at position ``cache.lengths[b]``, writes float32
``logits``, puts the next token into ``tokens`` and adds one to ``lengths``. Because all of
that lives in device memory, a kernel backend's step needs no host work beyond its launch.
Prompts are prefilled into the same cache by ``models.qwen3.prefill`` (torch GEMMs and SDPA).

The next token is each sequence's greedy choice, or a sample with its own settings (temperature,
top-k, top-p, seed; ``set_slot_sampling``) drawn in the step on the device (every backend but
``vm``, which draws the same token on the host): ``instructions/sample.py``, whose torch reference
(``models.qwen3.sampling.device_sample_reference``) also chooses a prefill's first token. A draw
depends only on (seed, position, logits), so a seeded sequence gets the same tokens whatever its
batch, slot or steps per launch.
"""

from __future__ import annotations

from typing import Callable, Sequence

import random

import torch

from models.qwen3 import prefill as qwen3_prefill
from models.qwen3.reference import KVCache, Qwen3Reference
from models.qwen3.sampling import SEED_BITS, SamplingParams, device_sample_reference, slot_settings

BACKENDS = ("megakernel", "superkernel", "per-op", "cuda-graph", "reference", "vm")


class ReferenceBackend:
    """The torch model, one op at a time (the oracle; also the ``reference`` baseline)."""

    device_sampling = True      # the torch sampler, on the logits' device

    def __init__(self, mk: "MegaQwen3", **_):
        self.mk = mk

    def decode(self):
        mk = self.mk
        mk.logits.copy_(mk.reference.decode(mk.tokens.long()))
        if mk.sampled_slots():
            mk.tokens.copy_(mk.sample_reference(mk.cache.lengths))
        else:
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


def fp8_scheme(quantization: str | None, asked: str | None, tp: int = 1) -> str | None:
    """How FP8 projections take their inputs: "dynamic" (w8a8: quantized per 128 columns at run
    time, the scheme Qwen's FP8 checkpoints declare and the default) or "none" (weight-only); None
    for 16-bit weights. Tensor parallelism runs weight-only (with a warning where nobody chose); a
    choice that cannot run is refused here, before any work."""
    from models.qwen3.fp8 import ACTIVATION_SCHEMES
    if asked is not None and asked not in ACTIVATION_SCHEMES:
        raise ValueError(f"fp8_activations {asked!r}: choose one of {', '.join(ACTIVATION_SCHEMES)}")
    if quantization != "fp8":
        if asked == "dynamic":
            raise ValueError("fp8_activations 'dynamic' (w8a8) needs FP8 weights: an -FP8 checkpoint or --quantize fp8")
        return None
    if tp > 1:
        # O's and down's sums are a rank's partials there, and the w8a8 tile needs their whole rows
        if asked == "dynamic":
            raise ValueError(f"FP8 activations (w8a8) are not built for tensor parallelism (--tp {tp}); pass "
                             f"--fp8-activations none (weight-only FP8)")
        if asked is None:
            import warnings
            warnings.warn(f"FP8 activations (w8a8) are not built for --tp {tp}: FP8 weights run weight-only "
                          f"(--fp8-activations none)", stacklevel=3)
        return "none"
    return asked or "dynamic"


class MegaQwen3:
    """Decode a Qwen3 model with one of the backends in ``BACKENDS``.

    ``prefill`` returns the first generated token of each sequence and ``step`` the next one, so
    ``[mk.prefill(ids)] + [mk.step() for _ in range(n - 1)]`` are the tokens ``mk.generate(ids,
    max_new_tokens=n)`` returns (without stop tokens):

    >>> mk = MegaQwen3(load_model("tiny-random", random_weights=True), max_seq_len=64, backend="reference")
    >>> first = mk.prefill([1, 2, 3]); second = mk.step()
    """

    def __init__(self, model, max_seq_len: int = 4096, batch_size: int = 1, backend: str = "megakernel",
                 plan: str = "auto", fp8_activations: str | None = None, **backend_options):
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
        if max_seq_len < 2:
            raise ValueError(f"max_seq_len must be at least 2, got {max_seq_len}")
        if not 1 <= batch_size:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.model, self.config, self.weights = model, model.config, model.weights
        # tensor parallelism: the model is this rank's share (models/qwen3/tp.py), and the ranks
        # add their partial sums after O and down (megakernel/tp.py)
        self.tp = getattr(model, "tp", 1)
        self.tp_group = None
        self._reduce = None
        if self.tp > 1:
            from . import tp as tp_mod
            self.tp_group = tp_mod.current()
            if self.tp_group is None or self.tp_group.tp != self.tp:
                raise RuntimeError(f"a model loaded for --tp {self.tp} needs its group: megakernel.tp.init({self.tp}) "
                                   f"in each of {self.tp} processes (torchrun, or megakernel.tp.launch)")
            if model.shard.rank != self.tp_group.rank:
                raise ValueError(f"the model is rank {model.shard.rank}'s share, this process is rank "
                                 f"{self.tp_group.rank}")
            self._reduce = self.tp_group.all_reduce
        self.backend_name = backend
        # FP8 weights: FP8 inputs too (w8a8, "dynamic", the checkpoint's declared scheme and the
        # default) or weight-only ("none"); decode only: the prefill multiplies dequantized weights
        self.fp8_activations = fp8_scheme(model.weights.quantization, fp8_activations, self.tp)
        self.w8a8 = self.fp8_activations == "dynamic"
        self.max_seq_len, self.batch_size = max_seq_len, batch_size
        dev, dt = self.weights.device, self.weights.dtype
        kv_bytes = self.config.kv_bytes_per_position(dt.itemsize) * batch_size * max_seq_len
        from .model import check_memory
        check_memory(dev, kv_bytes, f"a KV cache for batch {batch_size} x {max_seq_len} positions")
        self.cache = KVCache.allocate(self.config, batch_size, max_seq_len, dt, dev)
        self.tokens = torch.zeros(batch_size, dtype=torch.int32, device=dev)      # pending input tokens
        self.logits = torch.zeros(batch_size, self.config.vocab_size, dtype=torch.float32, device=dev)
        self.reference = Qwen3Reference(self.config, self.weights, self.cache, reduce=self._reduce, w8a8=self.w8a8)
        self.sampling = SamplingParams()
        # each slot's sampling settings, in the step's buffers (``set_slot_sampling``) and on the host
        self.sampling_buffers = dict(inv_temp=torch.zeros(batch_size, dtype=torch.float32, device=dev),
                                     top_k=torch.zeros(batch_size, dtype=torch.int32, device=dev),
                                     top_p=torch.ones(batch_size, dtype=torch.float32, device=dev),
                                     seed=torch.zeros(batch_size, dtype=torch.int64, device=dev))
        self.slot_sampling: list[SamplingParams] = [SamplingParams()] * batch_size
        self._seed_rng = random.Random()        # seeds of unseeded sampled sequences (OS entropy)
        self._lengths = [0] * batch_size    # host mirror of cache.lengths: bounds checks need no sync
        self.finish_reasons: list[str | None] = [None] * batch_size   # of the last generate()
        self.num_generated: list[int] = [0] * batch_size
        if self.tp > 1 and backend in ("megakernel", "superkernel"):
            # the REDUCE instructions read every rank's partials and flags (symmetric memory)
            c = self.config
            self.tp_buffers = self.tp_group.buffers(c.num_hidden_layers, batch_size, c.hidden_size)
        # the plan the kernel backends run: a tuned one from the plan cache (megakernel.tune) or
        # the rules'; options given here win over the tuned ones
        from . import plans
        self.plan_choice = plans.choose(plan, dev, self.config, dt, batch_size, max_seq_len, backend, model.name,
                                        tp=self.tp, quant=plans.quant_name(model.weights.quantization, self.w8a8))
        options = {**self.plan_choice.options(), **backend_options}
        if self.plan_choice.entry is not None and backend_options.get("plan_overrides"):
            options["plan_overrides"] = {**self.plan_choice.entry.fields, **backend_options["plan_overrides"]}
        self.backend = _make_backend(backend, self, **options)

    def __repr__(self) -> str:
        return (f"MegaQwen3({self.model.name!r}, backend={self.backend_name!r}, batch_size={self.batch_size}, "
                f"max_seq_len={self.max_seq_len}, {str(self.weights.dtype).removeprefix('torch.')} on "
                f"{self.weights.device})")

    def reset(self):
        """Forget the sequences; buffers and the compiled tape are kept."""
        self.cache.reset()
        self.tokens.zero_()
        self._lengths = [0] * self.batch_size

    @torch.no_grad()
    def prefill(self, input_ids, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                seed: int | None = None) -> torch.Tensor:
        """Start new sequences: fill the cache with the prompts (LongTensor [B, T], a list of ids,
        or a list of lists of different lengths) and return the first generated token of each,
        LongTensor [B], chosen from the last position's logits with these sampling settings
        (greedy by default; ``step`` keeps them). The logits stay in ``logits`` (float32 [B,
        vocab]); the tokens are also in ``tokens``, the input of the next ``step``."""
        sampling = SamplingParams(temperature, top_k, top_p, seed)
        prompts = self._check_prompts(input_ids)
        self.reset()
        self.sampling = sampling
        # every sequence samples with these settings; seeded, sequence b's seed is seed + b (the
        # same seed for all would give every row the same noise), else each draws its own
        for b in range(self.batch_size):
            self._set_sampling(b, sampling if seed is None else
                               SamplingParams(temperature, top_k, top_p, (seed + b) % (1 << SEED_BITS)))
        self._sync_sampling()
        self.logits.copy_(qwen3_prefill.prefill(self.config, self.weights, self.cache, prompts, reduce=self._reduce))
        self._lengths = [p.numel() for p in prompts]
        # the first token's position is the prompt's length
        self.tokens.copy_(self.sample_reference(self.cache.lengths))
        return self.tokens.long()

    # -----------------------------------------------------------------------------------------
    # Sampling settings

    def _set_sampling(self, b: int, params: SamplingParams):
        if not params.greedy and params.seed is None:
            params = SamplingParams(params.temperature, params.top_k, params.top_p,
                                    self._seed_rng.getrandbits(SEED_BITS))
        inv_t, k, p, seed = slot_settings(params, self.config.vocab_size)
        buf = self.sampling_buffers
        buf["inv_temp"][b], buf["top_k"][b], buf["top_p"][b], buf["seed"][b] = inv_t, k, p, seed
        self.slot_sampling[b] = params

    def _sync_sampling(self):
        """The backend runs its sampling plan while any slot samples, its greedy one otherwise."""
        switch = getattr(self.backend, "set_sampling", None) if hasattr(self, "backend") else None
        if switch is not None:
            switch(bool(self.sampled_slots()))

    def sampled_slots(self) -> list[int]:
        """The slots whose settings sample (temperature > 0)."""
        return [b for b, sp in enumerate(self.slot_sampling) if not sp.greedy]

    @property
    def device_sampling(self) -> bool:
        """Whether the backend draws sampled tokens in the step (all but ``vm``), so that sampling
        too runs several steps a launch where the backend does."""
        return bool(getattr(self.backend, "device_sampling", False))

    def set_slot_sampling(self, b: int, params: SamplingParams | None = None):
        """Slot ``b``'s sampling settings from its next token on (None: greedy). A sampled slot
        without a seed gets one drawn now from a host RNG (``slot_sampling[b].seed`` says which).
        Settings are checked (``SamplingParams``) before anything changes."""
        if not 0 <= b < self.batch_size:
            raise ValueError(f"slot {b} is outside the batch of {self.batch_size}")
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"slot {b}'s sampling settings must be a SamplingParams, not {type(params).__name__}")
        self._set_sampling(b, params)
        self._sync_sampling()

    def sample_reference(self, positions: torch.Tensor, rows=None) -> torch.Tensor:
        """The tokens the device sampler chooses from ``logits`` (rows ``rows``, default all) with
        each slot's settings, the chosen tokens' positions given; LongTensor on the device."""
        rows = slice(None) if rows is None else rows
        buf = self.sampling_buffers
        return device_sample_reference(self.logits[rows], buf["inv_temp"][rows], buf["top_k"][rows],
                                       buf["top_p"][rows], buf["seed"][rows], positions)

    def _check_prompts(self, input_ids) -> list[torch.Tensor]:
        prompts = _as_prompts(input_ids, self.batch_size)
        for b, p in enumerate(prompts):
            self._check_prompt(f"prompt {b}", p)
        return prompts

    def _check_prompt(self, name: str, p: torch.Tensor):
        """A prompt (1-D ids) must be non-empty, leave room to generate and hold only vocabulary ids."""
        V = self.config.vocab_size
        if p.numel() == 0:
            raise ValueError(f"{name} is empty")
        if p.numel() >= self.max_seq_len:
            raise ValueError(f"{name} has {p.numel()} tokens; max_seq_len is {self.max_seq_len}, "
                             f"which leaves no room to generate")
        if int(p.min()) < 0 or int(p.max()) >= V:
            raise ValueError(f"{name} has token ids outside [0, {V})")

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
        """One decode step for the whole batch: each sequence's pending token (in ``tokens``: the
        one ``prefill`` or the last step chose) goes in, and the token after it comes out; returns
        those new tokens, LongTensor [B] (also left in ``tokens`` for the next step)."""
        self._check_room(1)
        self._decode()
        self._lengths = [n + 1 for n in self._lengths]
        if not self.device_sampling and self.sampled_slots():
            # the host draws what the device sampler would (``vm``)
            self.tokens.copy_(self.sample_reference(self.cache.lengths))
        return self.tokens.long()

    def _decode(self, *steps):
        """The backend's decode; with tensor parallelism a failure here stops every rank first
        (``megakernel.tp``), so that none waits on this one."""
        try:
            self.backend.decode(*steps)
        except BaseException:
            if self.tp_group is not None:
                self.tp_group.abort()
            raise

    @property
    def steps_per_launch(self) -> int:
        """Decode steps ``steps()`` runs per kernel launch: up to 64 on the megakernel, greedy or
        sampling on the device (each step's token goes to the next step's embedding on the
        device), else 1."""
        if self.sampled_slots() and not self.device_sampling:
            return 1
        return getattr(self.backend, "max_steps_per_launch", 1)

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
                self._decode(k)
                self._lengths = [m + k for m in self._lengths]
                out.append(self.backend.st.hist[:k].T.long())    # a copy: the next launch rewrites hist
            n -= k
        return torch.cat(out, dim=1)

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens: int | Sequence[int] = 64, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 stop_tokens: Sequence[int] = (), on_token: Callable[[torch.Tensor], None] | None = None,
                 pad_token_id: int = -1) -> torch.Tensor:
        """Prefill, then decode until every sequence has finished; returns LongTensor [B, N] on
        the model's device, N the tokens of the longest-running sequence.

        A sequence finishes at its first token in ``stop_tokens`` (kept in its row) or once it
        has ``max_new_tokens`` tokens (one number for all, or one per sequence); the others go on.
        The batch decodes in lockstep, so a finished sequence keeps decoding on the device until
        the last one finishes, but those tokens are dropped: the rest of its row is
        ``pad_token_id`` (default -1, which is no token id). Afterwards ``finish_reasons[b]`` is
        ``"stop"`` or ``"length"`` and ``num_generated[b]`` the tokens of row ``b`` before its
        padding. ``on_token`` sees each step's tokens as a CPU LongTensor [B], padded the same way.
        The cache must hold the longest prompt plus the largest ``max_new_tokens`` less one."""
        limits = [max_new_tokens] * self.batch_size if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if len(limits) != self.batch_size:
            raise ValueError(f"max_new_tokens has {len(limits)} entries for batch_size {self.batch_size}")
        if min(limits) < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {min(limits)}")
        SamplingParams(temperature, top_k, top_p, seed)     # bad settings fail before any work
        prompts = self._check_prompts(input_ids)
        room = self.max_seq_len - max(p.numel() for p in prompts)
        if max(limits) > room + 1:
            raise ValueError(f"{max(limits)} new tokens do not fit: the longest prompt leaves room for "
                             f"{room + 1} within max_seq_len {self.max_seq_len}")
        B, stops = self.batch_size, set(int(t) for t in stop_tokens)
        done, count, reasons = [False] * B, [0] * B, [None] * B
        rows: list[torch.Tensor] = []

        def take(tokens: torch.Tensor):
            kept = []
            for b, t in enumerate(tokens.tolist()):
                if done[b]:
                    kept.append(pad_token_id)
                    continue
                kept.append(t)
                count[b] += 1
                if t in stops or count[b] >= limits[b]:
                    done[b], reasons[b] = True, "stop" if t in stops else "length"
            rows.append(torch.tensor(kept, dtype=torch.long))
            if on_token is not None:
                on_token(rows[-1])

        take(self.prefill(prompts, temperature, top_k, top_p, seed).cpu())
        # decoding on the megakernel runs several steps per launch after a first one alone
        # (which compiles the kernel on first use, so the tokens' arrival times show it apart)
        chunk, made = self.steps_per_launch, 1
        while not all(done):
            left = max(limits[b] for b in range(B) if not done[b]) - made
            k = 1 if made == 1 else min(chunk, left)
            for column in self.steps(k).cpu().unbind(1):
                take(column)
                if all(done):
                    break
            made += k
        self.finish_reasons, self.num_generated = reasons, count
        return torch.stack(rows, dim=1).to(self.tokens.device)

    # -----------------------------------------------------------------------------------------
    # Per-slot control for continuous batching (megakernel.serve). Each of the batch_size rows
    # is a slot that holds one sequence or none: a sequence is prefilled into its slot alone,
    # the whole batch steps together, and a slot is freed without touching the others. An idle
    # slot is parked at length PARK_LENGTH with token 0: it still runs in the step (the batch is
    # static) and its output is ignored.

    PARK_LENGTH = 1

    def _prefill_one(self, b: int, ids: torch.Tensor) -> torch.Tensor:
        """Fill sequence b's cache with ``ids`` from position 0; float32 logits [V] of the last
        position. The prefill of ``prefill`` run on a one-sequence view of the cache (views share
        its memory), so the other slots are untouched."""
        c = self.cache
        one = KVCache(k=c.k[:, b:b + 1], v=c.v[:, b:b + 1], lengths=c.lengths[b:b + 1])
        return qwen3_prefill.prefill(self.config, self.weights, one, [ids], reduce=self._reduce)[0]

    @torch.no_grad()
    def prefill_slot(self, b: int, input_ids) -> torch.Tensor:
        """Prefill slot ``b`` with one prompt (a list or 1-D tensor of ids) from position 0 and
        leave every other slot as it is. Sets the slot's length and its pending token (chosen on
        the device with the slot's settings, ``set_slot_sampling``: the greedy choice by default;
        ``set_token`` replaces it). Returns float32 logits [V] of the last position."""
        if not 0 <= b < self.batch_size:
            raise ValueError(f"slot {b} is outside the batch of {self.batch_size}")
        ids = torch.as_tensor(input_ids, dtype=torch.long).flatten().cpu()
        self._check_prompt(f"slot {b}'s prompt", ids)
        logits = self._prefill_one(b, ids.to(self.tokens.device)).float()
        self.cache.lengths[b] = ids.numel()
        self._lengths[b] = ids.numel()
        self.logits[b] = logits
        self.tokens[b] = self.sample_reference(self.cache.lengths[b:b + 1], slice(b, b + 1))[0]
        return logits

    def set_token(self, b: int, token: int | torch.Tensor):
        """Make ``token`` slot b's pending input token (the next step appends it)."""
        self.tokens[b] = token

    def free_slot(self, b: int):
        """Park slot ``b``: its sequence (and its sampling settings) forgotten, the others untouched."""
        self.cache.lengths[b] = self.PARK_LENGTH
        self.tokens[b] = 0
        self._lengths[b] = self.PARK_LENGTH
        if not self.slot_sampling[b].greedy:
            self.set_slot_sampling(b, None)

    def reset_slots(self):
        """Forget every sequence and park every slot (after a failed step, say); every slot greedy."""
        self.reset()
        for b in self.sampled_slots():
            self._set_sampling(b, SamplingParams())
        self._sync_sampling()
        self.cache.lengths.fill_(self.PARK_LENGTH)
        self._lengths = [self.PARK_LENGTH] * self.batch_size

    @torch.no_grad()
    def step_slots(self, active: Sequence[int]) -> torch.Tensor:
        """One decode step of the whole batch in which only the slots in ``active`` hold
        sequences; the others are parked again after it. Returns the greedy next tokens,
        LongTensor [B] on the host (this synchronises); ``self.logits`` holds every slot's logits.
        Where the backend reports kernel errors late (on a GPU, a step's error is read during
        the next), it is asked at once, so that a failed step never yields tokens."""
        active = set(active)
        full = [b for b in active if self._lengths[b] + 1 > self.max_seq_len]
        if full:
            raise ValueError(f"slot {full[0]} is at {self._lengths[full[0]]} of max_seq_len {self.max_seq_len}: "
                             f"no room for another step")
        self._decode()
        check = getattr(self.backend, "synchronize", None)
        if check is not None:
            check()
        self._lengths = [n + 1 if b in active else self.PARK_LENGTH for b, n in enumerate(self._lengths)]
        if len(active) < self.batch_size:
            parked = [b for b in range(self.batch_size) if b not in active]
            self.cache.lengths[parked] = self.PARK_LENGTH
            self.tokens[parked] = 0
        return self.tokens.long().cpu()
