"""Continuous batching over a ``MegaQwen3`` of ``max_num_seqs`` slots, in one background thread.

The thread loops: it frees the slots of cancelled sequences, admits queued sequences into free
slots, runs one decode launch, chooses each sequence's tokens with its own sampling settings, and
hands the new text to the requests' asyncio queues. A finished sequence frees its slot at once.

The step fits the load:
- **Batch buckets.** The runtime is built with batches of 1, 2, 4, ... up to ``max_num_seqs``
  (``runtime.bucket_sizes``), all over one KV cache; a launch runs the smallest that holds the
  active sequences. The sequences are kept in the lowest slots: where one finishes below the
  highest, the highest moves into its hole (``MegaQwen3.move_slot`` copies that one sequence's
  cached rows, its length and pending token). Compaction was chosen over a slot map read by the
  step because it leaves the kernels' addressing as it is (a bucket's sequences are its first
  rows, whose cache a view of the big one is, read with the cache's layer stride, ``Plan.KV_B``)
  and costs one sequence's KV copy per finish, a fraction of a step at the contexts served.
- **Several steps a launch.** While no request waits for a free slot and no active sequence can
  finish by length within k steps, one launch runs k steps (up to the backend's
  ``steps_per_launch``: 64 on the megakernel) and the k tokens then stream together. k is bounded
  so that the launch takes at most ``max_launch_ms`` at the bucket's measured step time, which is
  the longest a request arriving meanwhile waits for admission. A stop string or stop id can
  end a sequence inside the launch: its tokens past the stop are dropped, as
  ``MegaQwen3.generate`` drops them. Multi-step launches need every active sequence greedy, or
  a runtime that samples on the device (``mk.device_sampling``); otherwise sampled sequences draw
  on the host from each step's logits, one step a launch.
- **The next launch queued.** Where every active sequence's next token is chosen on the device
  (greedy, or sampled there), the next launch is queued shortly (``CHAIN_LEAD_S``) before the one
  in flight should end, and that one's tokens are read and handed out while it runs
  (``MegaQwen3.launch_slots``): the device does not wait for the host's token handling between
  launches. A request or a cancellation that arrives before that point stops the chain, so it
  still waits for at most the launch in flight. A sequence that a stop ends in the launch read has
  run on in the queued one: those tokens are dropped; slots freed and moved meanwhile are moved
  behind the queued launch on the device, so its rows stay its sequences'.
- **Admission in one pass.** Queued prompts are prefilled together in one packed prefill
  (``MegaQwen3.prefill_slots``). While others run, one admission prefills at most
  ``max_batched_tokens`` prompt tokens (at least one prompt), so that the running sequences wait
  no longer than that prefill between tokens; with none running, it takes as many as there are
  free slots.

A failed step (a kernel's timed-out wait, ``MegakernelError``, or any other exception) fails the
requests in flight with a 500 that names the error, resets the batch, and the loop goes on with
the queue.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Callable

import torch

from models.qwen3.sampling import SamplingParams, sample

from .metrics import Metrics
from .text import Detokenizer

log = logging.getLogger("megakernel.serve")


class QueueFull(Exception):
    """The queue is at its bound (answered with a 503)."""


class EngineStopped(Exception):
    """The engine is not running (answered with a 503)."""


@dataclass(frozen=True)
class GenParams:
    sampling: SamplingParams
    max_tokens: int
    stop_ids: frozenset = frozenset()     # token ids that end a sequence (not part of its text)
    stop: tuple[str, ...] = ()            # strings that end a sequence (cut from its text)
    n: int = 1


@dataclass
class Delta:
    """New output of choice ``index``: text (possibly empty while held back) and token ids."""
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None


@dataclass
class Failure:
    """The request failed; ``status`` is the HTTP status to answer with."""
    status: int
    message: str
    type: str = "server_error"


class Request:
    """One API request: ``n`` sequences from each of its prompts (OpenAI's completions take a list
    of prompts), choice ``p * n + j`` the ``j``-th of prompt ``p``. Events (``Delta`` and
    ``Failure``) arrive on ``events``, an asyncio queue of the event loop that made the request."""

    _ids = itertools.count()

    def __init__(self, prompts: list[list[int]], params: GenParams, decode: Callable[[list[int]], str]):
        self.id = next(Request._ids)
        self.prompts = [list(p) for p in prompts]
        self.params = params
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self.arrival = time.perf_counter()
        self.cancelled = False   # set by the API (the client went away), read by the engine thread
        self.done = False        # every sequence finished, or the request failed
        self.seqs = [Sequence(self, p * params.n + j, j, prompt, Detokenizer(decode))
                     for p, prompt in enumerate(self.prompts) for j in range(params.n)]

    @property
    def prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))

    @property
    def completion_tokens(self) -> int:
        return sum(len(s.out_ids) for s in self.seqs)


class Sequence:
    """One choice of a request, and the slot it holds while it runs."""

    def __init__(self, req: Request, index: int, choice: int, prompt_ids: list[int], detok: Detokenizer):
        # index: the choice's place in the response; choice: its place among its prompt's n
        self.req, self.index, self.choice, self.prompt_ids, self.detok = req, index, choice, prompt_ids, detok
        self.slot: int | None = None
        self.out_ids: list[int] = []
        self.text = ""           # text so far, stop strings applied
        self.sent = 0            # characters of text handed out
        self.generator: torch.Generator | None = None
        self.finish_reason: str | None = None
        self.last_time = 0.0


class Engine:
    # a launch queued behind the one in flight is queued this long before that one should end: the
    # host's launch call must land before the device idles
    CHAIN_LEAD_S = 0.002

    def __init__(self, mk, metrics: Metrics, max_queue: int = 256, max_launch_ms: float = 20.0,
                 max_batched_tokens: int = 2048):
        if max_launch_ms <= 0:
            raise ValueError(f"max_launch_ms must be positive, got {max_launch_ms}")
        if max_batched_tokens < 1:
            raise ValueError(f"max_batched_tokens must be at least 1, got {max_batched_tokens}")
        self.mk = mk
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_launch_s = max_launch_ms / 1000
        self.max_batched_tokens = max_batched_tokens
        self.batch_size = mk.batch_size
        self.buckets = tuple(getattr(mk, "buckets", (mk.batch_size,)))
        # the runtime chooses sampled tokens on the device (set_slot_sampling): no host sampling,
        # and sampled sequences also get several steps a launch
        self.device_sampling = bool(getattr(mk, "device_sampling", False))
        self.step_s: dict[int, float] = {}     # measured seconds a decode step takes, per bucket
        self.last_steps = 0                     # steps of the last launch
        self.slots: list[Sequence | None] = [None] * mk.batch_size    # occupied: the first count
        self.queue: deque[Sequence] = deque()
        self.cv = threading.Condition()
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.error: str | None = None         # why the engine stopped, where it died
        self._cancels = False
        self.device = mk.tokens.device

    # ------------------------------------------------------------------------------------------
    # The API's side (event loop thread)

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive() and not self.stopping

    @property
    def count(self) -> int:
        """Sequences holding slots: slots 0 .. count - 1 (compaction keeps them the lowest)."""
        return next((b for b, s in enumerate(self.slots) if s is None), self.batch_size)

    def status(self) -> dict:
        mk = self.mk
        dev = self.device
        return {"running": sum(s is not None for s in self.slots), "queued": len(self.queue),
                "batch_size": self.batch_size, "max_num_seqs": self.batch_size, "max_queue": self.max_queue,
                # the compiled batches, the one the last launch ran, and its steps
                "buckets": list(self.buckets), "bucket": getattr(mk, "bucket", self.batch_size),
                "steps_per_launch": self.last_steps, "max_launch_ms": self.max_launch_s * 1000,
                # what a load generator records beside its figures (``loadtest --record``)
                "backend": getattr(mk, "backend_name", None), "max_seq_len": getattr(mk, "max_seq_len", None),
                "dtype": str(mk.weights.dtype).removeprefix("torch.") if hasattr(mk, "weights") else None,
                "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev)}

    def submit(self, req: Request):
        with self.cv:
            if not self.running:
                raise EngineStopped(f"the engine is not running{f' ({self.error})' if self.error else ''}")
            if len(self.queue) + len(req.seqs) > self.max_queue:
                raise QueueFull(f"the server is at capacity: {len(self.queue)} sequences are waiting for "
                                f"{self.batch_size} slots (the queue holds {self.max_queue}); retry later")
            self.queue.extend(req.seqs)
            self.metrics.queue_depth.set(len(self.queue))
            self.cv.notify()

    def cancel(self, req: Request):
        """The client went away: free the request's slots (at the engine's next turn)."""
        if req.done or req.cancelled:
            return
        req.cancelled = True
        with self.cv:
            self._cancels = True
            self.cv.notify()

    # ------------------------------------------------------------------------------------------
    # The engine thread

    def start(self, warmup: bool = True):
        self.mk.reset_slots()
        if warmup:
            self.warm_up()
        self.thread = threading.Thread(target=self._loop, name="megakernel-engine", daemon=True)
        self.thread.start()

    def warm_up(self, sampling: bool | None = None):
        """Run the prefill and a step of every bucket before serving: on a GPU the first launch of
        each compiles its kernels (its tape was built with the runtime). The second step of each
        gives its step time, which bounds the first multi-step launches (``max_launch_ms``).
        ``sampling`` (default: where the device samples and the kernels are compiled, on a GPU):
        also build and compile every bucket's plan that samples on the device, which the first
        sampled request would otherwise wait for, and every client with it."""
        mk = self.mk
        t0 = time.perf_counter()
        mk.prefill_slots([0], [[0]])
        mk.reset_slots()
        for n in self.buckets:
            mk.step_slots([], bucket=n)     # every slot parked: only the time matters
            t = time.perf_counter()
            mk.step_slots([], bucket=n)
            self.step_s[n] = time.perf_counter() - t
        mk.reset_slots()
        built = getattr(mk, "buckets_build_s", 0.0)
        log.info("batch buckets %s compiled and warmed up in %.1f s; a step takes %s ms (short context)",
                 ", ".join(map(str, self.buckets)), built + time.perf_counter() - t0,
                 ", ".join(f"{n}: {self.step_s[n] * 1e3:.2f}" for n in self.buckets))
        if sampling is None:
            device = getattr(getattr(mk, "weights", None), "device", None)
            sampling = device is not None and device.type == "cuda"
        if sampling and self.device_sampling:
            t0 = time.perf_counter()
            mk.set_slot_sampling(0, SamplingParams(1.0, seed=0))    # every bucket switches to its sampling plan
            for n in self.buckets:
                mk.step_slots([], bucket=n)
            mk.reset_slots()        # (every slot greedy again: the greedy plans)
            log.info("their plans that sample on the device compiled in %.1f s", time.perf_counter() - t0)

    def stop(self, timeout: float = 30.0):
        with self.cv:
            self.stopping = True
            self.cv.notify()
        if self.thread is not None:
            self.thread.join(timeout)

    def _loop(self):
        while True:
            with self.cv:
                while not self.stopping and not self.queue and not self._cancels and not any(self.slots):
                    self.cv.wait()
                if self.stopping:
                    break
            events: list = []
            try:
                self._turn(events)
            except Exception as e:   # the batch's state is unknown: fail what ran on it, start afresh
                self._step_failed(e, events)
            self._deliver(events)
        events = []
        self._fail_everything(self.error or "the server is shutting down", 503, events)
        self._deliver(events)

    def _turn(self, events: list):
        if self._cancels:
            self._drop_cancelled()
        self._admit(events)
        if events:      # the first tokens go out now, not after the launch that follows
            self._deliver(events)
            events.clear()
        n = self.count
        self.metrics.running.set(n)
        if n:
            self._decode(n, events)

    def _drop_cancelled(self):
        with self.cv:
            self._cancels = False
            kept = [s for s in self.queue if not s.req.cancelled]
            dropped = {s.req for s in self.queue if s.req.cancelled}
            self.queue = deque(kept)
            self.metrics.queue_depth.set(len(self.queue))
        for s in [s for s in self.slots if s is not None and s.req.cancelled]:    # _free moves slots
            dropped.add(s.req)
            self._free(s)
        for req in dropped:
            if not req.done:
                req.done = True
                self.metrics.requests.labels("cancelled").inc()
                log.info("request %d cancelled (the client went away) after %d tokens", req.id,
                         req.completion_tokens)

    def _admit(self, events: list):
        """Prefill queued sequences into the free slots above the running ones, in one packed
        prefill; with others running, at most ``max_batched_tokens`` prompt tokens (one prompt at
        least)."""
        first = self.count
        free = self.batch_size - first
        running = first > 0
        batch, tokens = [], 0
        with self.cv:
            while self.queue and len(batch) < free:
                seq = self.queue[0]
                if seq.req.done or seq.req.cancelled:
                    self.queue.popleft()
                    continue
                n = len(seq.prompt_ids)
                if running and batch and tokens + n > self.max_batched_tokens:
                    break
                self.queue.popleft()
                batch.append(seq)
                tokens += n
            self.metrics.queue_depth.set(len(self.queue))
        if not batch:
            return
        slots = list(range(first, first + len(batch)))
        start = time.perf_counter()
        for seq in batch:
            if seq.choice == 0:
                self.metrics.queue_time.observe(start - seq.req.arrival)
        try:
            chosen = self._prefill(batch, slots)
        except Exception as e:
            if len(batch) == 1:
                chosen = [self._prefill_failed(batch[0], slots[0], e, events)]
            else:   # one at a time, so that a prompt that fails fails only its own request
                chosen = []
                for seq, b in zip(batch, slots):
                    try:
                        chosen.append(self._prefill([seq], [b])[0])
                    except Exception as e1:
                        chosen.append(self._prefill_failed(seq, b, e1, events))
        now = time.perf_counter()
        self.metrics.prefill.observe(now - start)
        placed = []
        for seq, b, token in zip(batch, slots, chosen):
            if token is None:
                continue
            if seq.req.done:     # another of its request's prompts failed after it was prefilled
                self.mk.free_slot(b)
                continue
            if seq.choice == 0:
                self.metrics.prompt_tokens.inc(len(seq.prompt_ids))
            seq.slot = b
            self.slots[b] = seq
            placed.append((seq, token))
        # a failed prefill left a hole among the new slots: close it before anything steps
        self._compact()
        for seq, token in placed:
            self._accept(seq, [token], now, events)

    def _prefill(self, batch: list[Sequence], slots: list[int]) -> list[int]:
        """Prefill ``batch`` into ``slots``; each sequence's first token (also its slot's pending one)."""
        mk = self.mk
        if self.device_sampling:     # the first token too is chosen on the device, with its settings
            for seq, b in zip(batch, slots):
                mk.set_slot_sampling(b, self._device_params(seq))
        logits = mk.prefill_slots(slots, [seq.prompt_ids for seq in batch])
        if self.device_sampling:
            return mk.tokens[torch.tensor(slots, device=mk.tokens.device)].tolist()
        out = []
        for i, (seq, b) in enumerate(zip(batch, slots)):
            sp = seq.req.params.sampling
            if sp.greedy:
                out.append(int(logits[i].argmax()))
                continue
            if sp.seed is not None:
                # seeded by its place among its prompt's choices, so that a prompt of a list draws
                # what it draws when sent alone
                seq.generator = torch.Generator(device=self.device).manual_seed(sp.seed + seq.choice)
            token = int(sample(logits[i:i + 1], sp, seq.generator))
            mk.set_token(b, token)
            out.append(token)
        return out

    def _prefill_failed(self, seq: Sequence, b: int, e: Exception, events: list) -> None:
        self.mk.free_slot(b)
        self.metrics.engine_errors.inc()
        log.error("prefill of request %d failed: %s", seq.req.id, _describe(e), exc_info=e)
        self._fail(seq.req, Failure(500, f"prefill failed: {_describe(e)}"), events)
        return None

    @staticmethod
    def _device_params(seq: Sequence) -> SamplingParams:
        """A sequence's settings for the device's sampler: its seed offset by its place among its
        prompt's choices, as the host's generator is."""
        sp = seq.req.params.sampling
        return SamplingParams(sp.temperature, sp.top_k, sp.top_p, None if sp.seed is None else sp.seed + seq.choice)

    def _launch_steps(self, n: int, inflight: int = 0) -> int:
        """Steps the next launch runs for the n active sequences (module doc), queued behind a
        launch of ``inflight`` steps not yet read (0: none); 0 where a sequence ends within those."""
        mk = self.mk
        seqs = self.slots[:n]
        left = min(s.req.params.max_tokens - len(s.out_ids) for s in seqs) - inflight
        if inflight and left < 1:
            return 0
        bucket = mk.bucket_for(range(n)) if hasattr(mk, "bucket_for") else self.batch_size
        most = mk.slot_steps_per_launch(bucket) if hasattr(mk, "slot_steps_per_launch") else 1
        if most <= 1:
            return 1
        with self.cv:
            if self.queue and n < self.batch_size:
                return 1        # someone waits for a free slot: admit at the next turn
        if self._host_draws(seqs):
            return 1
        k = min(most, left, mk.max_seq_len - mk.PARK_LENGTH)
        step = self.step_s.get(bucket)
        if step:
            k = min(k, int(self.max_launch_s / step + 1e-6))
        return max(1, k)

    def _host_draws(self, seqs) -> bool:
        """Whether the host draws a token of these sequences: a sampled one where the runtime does
        not sample on the device."""
        return not self.device_sampling and not all(s.req.params.sampling.greedy for s in seqs)

    def _decode(self, n: int, events: list):
        """Launches until the host is needed between two (module doc, "The next launch queued"):
        each one's tokens are handed out while the next runs."""
        launch = self._launch(n, self._launch_steps(n))
        while launch is not None:
            nxt = self._chain(launch)
            self._take(launch, events)
            if nxt is not None:
                self._deliver(events)
                events.clear()
            launch = nxt

    def _launch(self, n: int, k: int) -> "_InFlight":
        mk = self.mk
        handle = mk.launch_slots(list(range(n)), steps=k)      # the lowest slots (compaction)
        return _InFlight(handle, self.slots[:n], k, mk.bucket, time.perf_counter())

    def _chain(self, cur: "_InFlight") -> "_InFlight | None":
        """The next launch, queued behind ``cur`` before its tokens are read, where the host is not
        needed between them; None where it is."""
        n = self.count       # those of cur that the last tokens read did not end (compacted)
        if not n:
            return None
        if self._host_draws(self.slots[:n]):
            return None      # each step's token needs the host
        if not self._wait_to_chain(cur):
            return None
        k = self._launch_steps(n, inflight=cur.k)
        return self._launch(n, k) if k else None

    def _wait_to_chain(self, cur: "_InFlight") -> bool:
        """Wait until shortly before ``cur`` should end (its steps at the bucket's measured step
        time, less ``CHAIN_LEAD_S``), then say whether the next launch may be queued behind it: not
        where a request waits for a free slot, a client went away or the engine stops. Those need
        the host between launches, so they still wait for at most the launch in flight."""
        step = self.step_s.get(cur.bucket)
        end = cur.t0 + cur.k * step - self.CHAIN_LEAD_S if step and not cur.handle.done() else 0.0
        with self.cv:
            while True:
                if self.stopping or self._cancels or (self.queue and self.count < self.batch_size):
                    return False
                left = end - time.perf_counter()
                if left <= 0:
                    return True
                self.cv.wait(left)

    def _take(self, launch: "_InFlight", events: list):
        """Read ``launch``'s tokens and hand them to its sequences (those still running)."""
        n, k, seqs = len(launch.seqs), launch.k, launch.seqs
        rows = launch.handle.tokens()[:n].tolist()
        if k == 1:
            rows = [[t] for t in rows]
            sampled = [b for b in range(n) if not seqs[b].req.params.sampling.greedy]
            if sampled and not self.device_sampling:   # their greedy choices give way to a host draw
                for b, t in self._sample(sampled).items():
                    rows[b] = [t]
        now = time.perf_counter()
        per_step = launch.handle.seconds() / k       # on a GPU the device's time
        # the bucket's step time, followed as contexts grow (it bounds the next launches)
        old = self.step_s.get(launch.bucket)
        self.step_s[launch.bucket] = per_step if old is None else 0.8 * old + 0.2 * per_step
        self.last_steps = k
        m = self.metrics
        m.step.observe(per_step)
        m.bucket.set(launch.bucket)
        m.launch_steps.set(k)
        for seq, row in zip(seqs, rows):     # by sequence: a finish below moves slots
            self._accept(seq, row, now, events)

    def _sample(self, slots: list[int]) -> dict[int, int]:
        """Each slot's token under its own settings. Unseeded slots that share settings are sampled
        in one call; a seeded one draws from its own generator, so its tokens do not depend on the
        other requests in the batch."""
        logits = self.mk.logits
        groups: dict[tuple, list[int]] = defaultdict(list)
        order, drawn = [], []
        for b in slots:
            seq = self.slots[b]
            sp = seq.req.params.sampling
            if seq.generator is None:
                groups[(sp.temperature, sp.top_k, sp.top_p)].append(b)
            else:
                order.append(b)
                drawn.append(sample(logits[b:b + 1], sp, seq.generator))
        for (temperature, top_k, top_p), bs in groups.items():
            idx = torch.tensor(bs, device=logits.device)
            order += bs
            drawn.append(sample(logits[idx], SamplingParams(temperature, top_k, top_p)))
        values = torch.cat(drawn)
        self.mk.tokens[torch.tensor(order, device=logits.device)] = values.to(self.mk.tokens.dtype)
        return dict(zip(order, values.tolist()))

    def _accept(self, seq: Sequence, tokens: list[int], now: float, events: list):
        """Take ``tokens`` (one launch's, in order) as the sequence's next; hand out the text they
        complete in one event; retire the sequence where it ends (tokens past its end are dropped)."""
        req, p = seq.req, seq.req.params
        m = self.metrics
        if seq.finish_reason:
            return
        gap = (now - seq.last_time) / len(tokens)    # a launch's tokens share its time
        taken = []
        finish = None
        longest = max(map(len, p.stop)) if p.stop else 0
        for token in tokens:
            m.generation_tokens.inc()
            if seq.out_ids:
                m.itl.observe(gap)
            else:
                m.ttft.observe(now - req.arrival)
            seq.out_ids.append(token)
            taken.append(token)
            if token in p.stop_ids:
                piece, finish = "", "stop"
            else:
                piece = seq.detok.add(token)
                if len(seq.out_ids) >= p.max_tokens:
                    finish = "length"
            if finish:
                piece += seq.detok.flush()
            seq.text += piece
            if p.stop:
                # a stop string may begin in text held back at an earlier token
                start = max(0, seq.sent - longest + 1)
                hits = [i for i in (seq.text.find(s, start) for s in p.stop) if i >= 0]
                if hits:
                    seq.text, finish = seq.text[:min(hits)], "stop"
            if finish:
                break
        seq.last_time = now
        hold = 0 if finish else max(0, longest - 1)   # what could still become a stop string
        end = max(seq.sent, len(seq.text) - hold)
        events.append((req, Delta(seq.index, seq.text[seq.sent:end], taken, finish)))
        seq.sent = end
        if finish:
            seq.finish_reason = finish
            self._free(seq)
            if all(s.finish_reason for s in req.seqs):
                req.done = True
                m.requests.labels("ok").inc()
                m.e2e.observe(now - req.arrival)
                log.info("request %d done: %d prompt tokens, %d completion tokens, %s", req.id,
                         req.prompt_tokens, req.completion_tokens,
                         ",".join(s.finish_reason for s in req.seqs))

    def _free(self, seq: Sequence):
        """Free the sequence's slot; the highest sequence moves into it (compaction)."""
        b = seq.slot
        if b is None:
            return
        seq.slot = None
        self.slots[b] = None
        self.mk.free_slot(b)
        self._compact()

    def _compact(self):
        """Move the highest sequences into the holes below them, so that the sequences hold the
        lowest slots and the smallest bucket holds them."""
        while True:
            hole = next((b for b, s in enumerate(self.slots) if s is None), None)
            top = next((b for b in range(self.batch_size - 1, -1, -1) if self.slots[b] is not None), None)
            if hole is None or top is None or top < hole:
                return
            seq = self.slots[top]
            self.mk.move_slot(top, hole)
            self.slots[hole], self.slots[top] = seq, None
            seq.slot = hole     # (move_slot carries its sampling settings, seed included)

    def _fail(self, req: Request, failure: Failure, events: list):
        for s in req.seqs:
            self._free(s)
        if not req.done:
            req.done = True
            self.metrics.requests.labels("error" if failure.status >= 500 and failure.status != 503
                                         else "rejected").inc()
            events.append((req, failure))

    def _step_failed(self, e: Exception, events: list):
        self.metrics.engine_errors.inc()
        log.error("decode step failed; failing the requests in flight and resetting the batch: %s",
                  _describe(e))
        failure = Failure(500, f"the decode step failed: {_describe(e)}. The batch was reset; the request "
                               f"may be retried")
        failed = {s.req for s in self.slots if s is not None}
        for s in self.slots:     # no compaction on a device in an unknown state: the reset parks all
            if s is not None:
                s.slot = None
        self.slots = [None] * self.batch_size
        for req in failed:
            self._fail(req, failure, events)
        try:
            self.mk.reset_slots()
        except Exception as e2:    # the device itself is gone: stop serving rather than serve garbage
            log.exception("resetting the batch failed; the engine stops")
            with self.cv:
                self.stopping = True
                self.error = f"resetting the batch after a failed step failed: {_describe(e2)}"
        self.slots = [None] * self.batch_size

    def _fail_everything(self, why: str, status: int, events: list):
        with self.cv:
            queued = list(self.queue)
            self.queue.clear()
        failure = Failure(status, why, "server_error")
        for req in {s.req for s in queued} | {s.req for s in self.slots if s is not None}:
            self._fail(req, failure, events)

    @staticmethod
    def _deliver(events: list):
        """Hand each loop its requests' events in one call."""
        by_loop: dict = defaultdict(list)
        for req, ev in events:
            by_loop[req.loop].append((req, ev))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:   # the loop has closed (shutdown): nobody is listening
                pass


@dataclass
class _InFlight:
    """A decode launch not yet read: its sequences by row (slots may move before it is read), its
    steps and bucket, and when the host's launch call returned (on a GPU about when the launch
    began to run: the megakernel's launch call waits for the launch before it)."""
    handle: object
    seqs: list
    k: int
    bucket: int
    t0: float


def _put_all(items):
    for req, ev in items:
        req.events.put_nowait(ev)


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"
