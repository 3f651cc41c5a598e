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

import random
import time
import warnings
from typing import Callable, Sequence

import torch

from models.qwen3 import prefill as qwen3_prefill
from models.qwen3.reference import KVCache, Qwen3Reference
from models.qwen3.sampling import SEED_BITS, SamplingParams, device_sample_reference, slot_settings

BACKENDS = ("megakernel", "superkernel", "per-op", "cuda-graph", "reference", "vm")
KERNEL_BACKENDS = ("megakernel", "superkernel", "per-op", "cuda-graph")     # they run the plans' tiles on a GPU
# The batches a server compiles (``MegaQwen3(buckets=...)``): each step runs the smallest that
# holds its sequences, up to the allocated batch
BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def bucket_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """``BUCKETS`` below ``max_num_seqs``, and ``max_num_seqs`` itself."""
    return tuple(n for n in BUCKETS if n < max_num_seqs) + (max_num_seqs,)


def check_buckets(buckets, batch_size: int, tp: int = 1) -> tuple[int, ...]:
    """The sorted bucket sizes, the allocated batch among them; a ValueError for sizes outside
    1..batch_size, or smaller buckets with tensor parallelism (its symmetric buffers are sized
    for the whole batch)."""
    if buckets is None:
        return (batch_size,)
    sizes = sorted({int(n) for n in buckets} | {batch_size})
    if sizes[0] < 1 or sizes[-1] > batch_size:
        raise ValueError(f"batch buckets {sizes} must lie in 1..{batch_size} (the batch allocated)")
    if tp > 1 and len(sizes) > 1:
        raise ValueError("batch buckets smaller than the batch need tp 1: a tensor-parallel step runs the whole batch")
    return tuple(sizes)


class ReferenceBackend:
    """The torch model, one op at a time (the oracle; also the ``reference`` baseline).
    ``steps_per_launch`` > 1 lets one ``decode(k)`` run k greedy steps as the megakernel's launch
    does (their tokens in ``hist``), so the server's multi-step path runs on the CPU too."""

    device_sampling = True      # the torch sampler, on the logits' device

    def __init__(self, mk: "MegaQwen3", steps_per_launch: int = 1, **_):
        from .buffers import MAX_STEPS_PER_LAUNCH
        if not 1 <= steps_per_launch <= MAX_STEPS_PER_LAUNCH:
            raise ValueError(f"steps_per_launch must be 1 to {MAX_STEPS_PER_LAUNCH}, got {steps_per_launch}")
        self.mk = mk
        self.max_steps_per_launch = steps_per_launch
        self.hist = torch.zeros(steps_per_launch, mk.batch_size, dtype=torch.int32, device=mk.tokens.device)

    def decode(self, steps: int = 1):
        if not 1 <= steps <= self.max_steps_per_launch:
            raise ValueError(f"reference runs 1 to {self.max_steps_per_launch} steps per launch, not {steps}")
        mk = self.mk
        for s in range(steps):
            mk.logits.copy_(mk.reference.decode(mk.tokens.long()))
            if mk.sampled_slots():
                mk.tokens.copy_(mk.sample_reference(mk.cache.lengths))
            else:
                mk.tokens.copy_(mk.logits.argmax(-1))
            self.hist[s] = mk.tokens


def _launch_tokens(backend, k: int) -> torch.Tensor:
    """The tokens of the last launch's k steps, int32 [k, B] (a view: the next launch rewrites it)."""
    hist = backend.st.hist if hasattr(backend, "st") else backend.hist
    return hist[:k]


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
        return ReferenceBackend(mk, **options)
    if name == "vm":
        return _import_backend(name, "megakernel.vm", "VMBackend")(mk, **options)
    if name in ("megakernel", "superkernel", "per-op", "cuda-graph"):
        return _import_backend(name, "megakernel.backends", "make_kernel_backend")(name, mk, **options)
    raise ValueError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")


def _backend_options(mk, backend: str, choice, backend_options: dict) -> dict:
    """A kernel backend's options: the tuned plan's where one is cached, then those given (a plan
    field given wins over the tuned one's); with the rules' plan on a GPU, the rules' layout of
    workers (``scheduler.ops.default_layout``) unless warps or workers an SM are given, or more
    workers than that layout holds (those then run as they did before it: 4 warps, two an SM)."""
    options = {**choice.options(), **backend_options}
    if choice.entry is not None and backend_options.get("plan_overrides"):
        options["plan_overrides"] = {**choice.entry.fields, **backend_options["plan_overrides"]}
    if (backend in KERNEL_BACKENDS and mk.weights.device.type == "cuda" and choice.entry is None
            and "num_warps" not in options and "workers_per_sm" not in options):
        from .backends import rules_layout
        warps, per_sm = rules_layout(mk, options.get("num_workers"))
        if warps != 4:
            options.update(num_warps=warps, workers_per_sm=per_sm)
    return options


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
    for 16-bit weights. A choice that cannot run is refused here, before any work.

    Tensor parallelism runs w8a8 where asked ("dynamic": its plans then take the weights-on-M tile,
    whose xs REDUCE writes, ``scheduler.ops.plan_and_rules``) and by default stays weight-only, with a
    warning: at 8b TP 2 (two H200s) w8a8 was not faster than weight-only at batch 1 and 2% faster at
    batch 8 (docs/performance.md, "Plans of TP > 1")."""
    from models.qwen3.fp8 import ACTIVATION_SCHEMES
    if asked is not None and asked not in ACTIVATION_SCHEMES:
        raise ValueError(f"fp8_activations {asked!r}: choose one of {', '.join(ACTIVATION_SCHEMES)}")
    if quantization != "fp8":
        if asked == "dynamic":
            raise ValueError("fp8_activations 'dynamic' (w8a8) needs FP8 weights: an -FP8 checkpoint or --quantize fp8")
        return None
    if tp > 1 and asked is None:
        warnings.warn(f"FP8 activations (w8a8) are not the default at --tp {tp} (under TP they were not faster than "
                      f"weight-only at batch 1): FP8 weights run weight-only; --fp8-activations dynamic asks for w8a8",
                      stacklevel=3)
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
                 plan: str = "auto", fp8_activations: str | None = None, buckets: Sequence[int] | None = None,
                 **backend_options):
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
        self._prefill_graphs = None     # enable_prefill_graphs
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
        self.backend = _make_backend(backend, self, **_backend_options(self, backend, self.plan_choice, backend_options))
        # batch buckets (``step_slots``): smaller batches that step the first slots of this cache
        self.buckets = check_buckets(buckets, batch_size, self.tp)
        self.bucket = batch_size       # the batch the last step_slots ran
        self._latest_launch: dict[int, SlotLaunch] = {}     # each backend's last launch_slots (by id)
        t0 = time.perf_counter()
        self._views = {n: SlotView(self, n, plan, backend_options) for n in self.buckets if n < batch_size}
        self.buckets_build_s = time.perf_counter() - t0   # their tapes (and, on a GPU, kernels) built

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
        on = bool(self.sampled_slots())
        backends = ([self.backend] if hasattr(self, "backend") else []) + \
            [v.backend for v in getattr(self, "_views", {}).values()]
        for be in backends:
            switch = getattr(be, "set_sampling", None)
            if switch is not None:
                switch(on)

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
                out.append(_launch_tokens(self.backend, k).T.long())    # a copy: the next launch rewrites hist
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
    # is a slot that holds one sequence or none: sequences are prefilled into their slots (several
    # in one packed pass), the batch steps together, and a slot is freed without touching the
    # others. An idle slot is parked at length PARK_LENGTH with token 0: inside the batch that
    # steps it still runs (its output ignored) and is parked again after the step.
    #
    # Batch buckets: with ``buckets``, ``step_slots`` runs the smallest bucket that holds the
    # highest active slot, a backend of that batch over the first slots of this one cache (a
    # ``SlotView``: views, no copy). A server keeps its sequences in the lowest slots
    # (``move_slot``), so the bucket follows the number of sequences.

    PARK_LENGTH = 1

    def bucket_for(self, active: Sequence[int]) -> int:
        """The smallest bucket that holds every slot in ``active``."""
        top = max(active, default=-1) + 1
        return next(n for n in self.buckets if n >= top)

    @torch.no_grad()
    def prefill_slots(self, slots: Sequence[int], prompts: Sequence) -> torch.Tensor:
        """Prefill each of ``slots`` with its prompt (lists or 1-D tensors of ids) from position 0,
        all in one packed prefill, and leave every other slot as it is. Sets each slot's length
        and its pending token (chosen with the slot's settings, ``set_slot_sampling``: the greedy
        choice by default; ``set_token`` replaces it). Returns float32 logits [len(slots), V] of
        each prompt's last position."""
        slots = [int(b) for b in slots]
        if len(slots) != len(prompts) or not slots:
            raise ValueError(f"{len(slots)} slots for {len(prompts)} prompts: need one slot a prompt, at least one")
        if len(set(slots)) != len(slots):
            raise ValueError(f"slots {slots} repeat a slot")
        for b in slots:
            if not 0 <= b < self.batch_size:
                raise ValueError(f"slot {b} is outside the batch of {self.batch_size}")
        ids = [torch.as_tensor(p, dtype=torch.long).flatten().cpu() for p in prompts]
        for b, p in zip(slots, ids):
            self._check_prompt(f"slot {b}'s prompt", p)
        graphs = self._prefill_graphs
        if graphs is not None and graphs.fits([p.numel() for p in ids]):
            logits = graphs(ids, slots)
        else:
            logits = qwen3_prefill.prefill(self.config, self.weights, self.cache, ids, reduce=self._reduce,
                                           slots=slots).float()
        idx = torch.tensor(slots, device=self.tokens.device)
        for b, p in zip(slots, ids):
            self._lengths[b] = p.numel()
        self.logits[idx] = logits
        # each slot's first token with its own settings (``set_slot_sampling``; greedy by default),
        # at the position of its prompt's length
        positions = torch.tensor([p.numel() for p in ids], dtype=self.cache.lengths.dtype, device=self.tokens.device)
        self.tokens[idx] = self.sample_reference(positions, idx).to(self.tokens.dtype)
        return logits

    def enable_prefill_graphs(self, max_tokens: int = 2048):
        """Run ``prefill_slots`` of short fresh prompts (at most ``max_tokens`` in all, each at most
        ``prefill_graphs.MAX_PROMPT_LEN``) as CUDA graphs, one per token bucket, captured now
        (``models/qwen3/prefill_graphs.py``): a short admission is otherwise bound by the host's
        launches. Logits equal the eager prefill's within rounding. 16-bit weights on one GPU."""
        from models.qwen3.prefill_graphs import PrefillGraphs
        if self.tp > 1:
            raise ValueError("prefill graphs run on one GPU (not with --tp)")
        self._prefill_graphs = PrefillGraphs(self.config, self.weights, self.cache, self.batch_size, max_tokens)
        self._prefill_graphs.capture_all()

    @torch.no_grad()
    def prefill_slot(self, b: int, input_ids) -> torch.Tensor:
        """Prefill slot ``b`` with one prompt (a list or 1-D tensor of ids) from position 0 and
        leave every other slot as it is. Sets the slot's length and its pending token (chosen on
        the device with the slot's settings, ``set_slot_sampling``: the greedy choice by default;
        ``set_token`` replaces it). Returns float32 logits [V] of the last position."""
        if not 0 <= b < self.batch_size:
            raise ValueError(f"slot {b} is outside the batch of {self.batch_size}")
        return self.prefill_slots([b], [input_ids])[0]

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

    @torch.no_grad()
    def move_slot(self, src: int, dst: int):
        """Move the sequence of slot ``src`` into slot ``dst`` (whose sequence, if any, is
        forgotten) and park ``src``: its cached keys and values up to its length, its length, its
        pending token, logits and sampling settings. A server fills the hole a finished sequence leaves with its
        highest one, so its sequences stay in the lowest slots and a smaller bucket holds them."""
        for b in (src, dst):
            if not 0 <= b < self.batch_size:
                raise ValueError(f"slot {b} is outside the batch of {self.batch_size}")
        if src == dst:
            return
        n = self._lengths[src]
        c = self.cache
        c.k[:, dst, :, :n] = c.k[:, src, :, :n]
        c.v[:, dst, :, :n] = c.v[:, src, :, :n]
        c.lengths[dst] = c.lengths[src]
        self.tokens[dst] = self.tokens[src]
        self.logits[dst] = self.logits[src]
        self._lengths[dst] = n
        # its sampling settings too, seed included: its draws go on as they would have in src
        self._set_sampling(dst, self.slot_sampling[src])
        self.free_slot(src)
        self._sync_sampling()

    def reset_slots(self):
        """Forget every sequence and park every slot (after a failed step, say); every slot greedy."""
        self.reset()
        for b in self.sampled_slots():
            self._set_sampling(b, SamplingParams())
        self._sync_sampling()
        self.cache.lengths.fill_(self.PARK_LENGTH)
        self._lengths = [self.PARK_LENGTH] * self.batch_size

    def bucket_backend(self, n: int):
        """The backend that steps bucket ``n``."""
        return self.backend if n == self.batch_size else self._views[n].backend

    def slot_steps_per_launch(self, n: int | None = None) -> int:
        """Steps one ``step_slots`` launch may run on bucket ``n`` (default: the allocated batch):
        the backend's most (64 on the megakernel, 1 on backends that run a step a launch)."""
        return getattr(self.bucket_backend(self.batch_size if n is None else n), "max_steps_per_launch", 1)

    @torch.no_grad()
    def step_slots(self, active: Sequence[int], steps: int = 1, bucket: int | None = None) -> torch.Tensor:
        """``steps`` decode steps, in one launch, of the smallest bucket that holds the slots in
        ``active`` (or of ``bucket``); the bucket's other slots run too and are parked again
        after it, slots past the bucket are not touched (they must be idle). Returns the greedy
        tokens on the host (this synchronises): LongTensor [B] for one step, [B, steps] for
        several (slots past the bucket 0); ``self.logits`` holds the bucket's last logits. Where the
        backend reports kernel errors late (on a GPU, a step's error is read during the next), it
        is asked at once, so that a failed step never yields tokens. Several steps a launch feed
        each step's token to the next on the device: the greedy choice, unless the backend
        samples on the device."""
        return self.launch_slots(active, steps, bucket).tokens()

    @torch.no_grad()
    def launch_slots(self, active: Sequence[int], steps: int = 1, bucket: int | None = None) -> "SlotLaunch":
        """``step_slots`` without the wait: the launch is queued on the device and its tokens are
        copied to the host as it ends; ``SlotLaunch.tokens()`` waits for them (and for nothing
        queued after). A server queues the next launch before it reads this one's tokens, so the
        device does not idle while the host hands them out: each step's pending token is already
        on the device. The host's lengths count the launch at once, so a launch queued after it
        is checked for room as if it had run."""
        active = set(active)
        n = self.bucket_for(active) if bucket is None else bucket
        if n not in self.buckets or (active and max(active) >= n):
            raise ValueError(f"bucket {n} is not one of {self.buckets} holding slots {sorted(active)}")
        most = self.slot_steps_per_launch(n)
        if not 1 <= steps <= most:
            raise ValueError(f"step_slots runs 1 to {most} steps a launch on this backend, not {steps}")
        full = [b for b in active if self._lengths[b] + steps > self.max_seq_len]
        if full or self.PARK_LENGTH + steps > self.max_seq_len:
            b = full[0] if full else None
            where = f"slot {b} is at {self._lengths[b]}" if full else f"a parked slot is at {self.PARK_LENGTH}"
            more = "another step" if steps == 1 else f"{steps} more steps"
            raise ValueError(f"{where} of max_seq_len {self.max_seq_len}: no room for {more}")
        view = self if n == self.batch_size else self._views[n]
        start, t0 = None, time.perf_counter()
        if self.tokens.device.type == "cuda":     # the device's start: after what is queued before it
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        if steps == 1:
            view._decode()
        else:
            view._decode(steps)
        out = self.tokens if steps == 1 else _launch_tokens(view.backend, steps)    # int32 [B] / [steps, n]
        launch = SlotLaunch(self, view.backend, out, steps, start, time.perf_counter() - t0)
        self._latest_launch[id(view.backend)] = launch
        self.bucket = n
        for b in range(n):
            self._lengths[b] = self._lengths[b] + steps if b in active else self.PARK_LENGTH
        # parked again by slices: a list index is copied to the device, which waits for the launch
        b = 0
        while b < n:
            if b in active:
                b += 1
                continue
            end = next((e for e in range(b, n) if e in active), n)
            self.cache.lengths[b:end] = self.PARK_LENGTH
            self.tokens[b:end] = 0
            b = end
        return launch


class SlotLaunch:
    """A launch of ``MegaQwen3.launch_slots``: its tokens, copied to the host behind it (on a GPU
    without waiting), and its kernel errors asked for when they are read."""

    def __init__(self, mk: MegaQwen3, backend, out: torch.Tensor, steps: int, start, wall: float):
        self._mk, self._backend, self.steps = mk, backend, steps
        self._start, self._wall, self._event = start, wall, None
        if out.device.type == "cuda":
            self._host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            self._host.copy_(out, non_blocking=True)
            self._event = torch.cuda.Event(enable_timing=start is not None)
            self._event.record()
        else:
            self._host = out.clone()
        self._result: torch.Tensor | None = None

    def seconds(self) -> float:
        """The launch's time: on a GPU the device's, from its start to its tokens' copy (after
        ``tokens()``); else the launch call's."""
        if self._event is None or self._start is None:
            return self._wall
        return self._start.elapsed_time(self._event) / 1e3

    def done(self) -> bool:
        """Whether the launch has ended (its tokens can be read without waiting)."""
        return self._event is None or self._event.query()

    def tokens(self) -> torch.Tensor:
        """The launch's tokens as ``step_slots`` returns them: LongTensor [B] for one step, [B,
        steps] for several. Waits for this launch only. Its kernel errors are asked for here where
        it was its backend's last launch; a later launch of the same backend has already read them
        (a step's error word is read during the next launch), and raised if there was one."""
        if self._result is not None:
            return self._result
        if self._event is not None:
            self._event.synchronize()
        latest = self._mk._latest_launch
        if latest.get(id(self._backend)) is self:
            check = getattr(self._backend, "synchronize", None)
            if check is not None:
                check()
            del latest[id(self._backend)]
        host = self._host.long()
        if self.steps > 1:
            host = host.T
            host = torch.cat((host, torch.zeros(self._mk.batch_size - host.shape[0], self.steps, dtype=torch.long)))
        self._result = host
        return host


class EndedLaunch:
    """A launch that has already ended, as ``SlotLaunch`` (a runtime whose ranks step together):
    its tokens and the launch call's time, which waited for it."""

    def __init__(self, tokens: torch.Tensor, seconds: float):
        self._tokens, self._seconds = tokens, seconds

    def seconds(self) -> float:
        return self._seconds

    def done(self) -> bool:
        return True

    def tokens(self) -> torch.Tensor:
        return self._tokens


class SlotView:
    """The first ``n`` slots of a ``MegaQwen3`` as a ``MegaQwen3`` of batch ``n`` that a backend
    steps: its cache, tokens and logits are views of the runtime's (no copy), its plan the one for
    batch ``n``. The KV cache view ``k[:, :n]`` is not contiguous: the kernels address it from its
    base with the cache's own layer stride (``Plan.KV_B``, ``backends.with_cache``); the reference
    and the prefill index it as any strided tensor."""

    def __init__(self, mk: MegaQwen3, n: int, plan: str, backend_options: dict):
        from . import plans
        self.model, self.config, self.weights = mk.model, mk.config, mk.weights
        self.tp, self.tp_group = mk.tp, mk.tp_group
        self.backend_name, self.max_seq_len, self.batch_size = mk.backend_name, mk.max_seq_len, n
        c = mk.cache
        self.cache = KVCache(k=c.k[:, :n], v=c.v[:, :n], lengths=c.lengths[:n])
        self.tokens, self.logits = mk.tokens[:n], mk.logits[:n]
        self.fp8_activations, self.w8a8 = mk.fp8_activations, mk.w8a8
        self.reference = Qwen3Reference(self.config, self.weights, self.cache, reduce=mk._reduce, w8a8=self.w8a8)
        self._mk = mk
        self.sampling_buffers = {k: v[:n] for k, v in mk.sampling_buffers.items()}
        # a tuned plan where one is cached for this batch (--plan tuned asks it of the full batch only)
        self.plan_choice = plans.choose("auto" if plan == "tuned" else plan, self.weights.device, self.config,
                                        self.weights.dtype, n, self.max_seq_len, self.backend_name, mk.model.name,
                                        tp=self.tp, quant=plans.quant_name(self.weights.quantization, self.w8a8))
        self.backend = _make_backend(self.backend_name, self, **_backend_options(self, self.backend_name,
                                                                                 self.plan_choice, backend_options))

    def sampled_slots(self) -> list[int]:
        return [b for b in self._mk.sampled_slots() if b < self.batch_size]

    # (it reads only the view's logits and sampling buffers)
    sample_reference = MegaQwen3.sample_reference

    def _decode(self, *steps):
        self.backend.decode(*steps)
