"""Continuous batching over a ``MegaQwen3`` of ``batch_size`` slots, in one background thread.

The thread loops: it frees the slots of cancelled sequences, admits queued sequences into free
slots (each prompt prefilled into its slot alone; while others run, one a turn, so that they wait
no longer than one prefill), runs one decode step of the whole batch (idle slots run too and are
ignored: the batch is static), chooses each sequence's token with its own sampling settings,
and hands the new text to the requests' asyncio queues. A finished sequence frees its slot at once.

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
    def __init__(self, mk, metrics: Metrics, max_queue: int = 256):
        self.mk = mk
        self.metrics = metrics
        self.max_queue = max_queue
        self.batch_size = mk.batch_size
        self.slots: list[Sequence | None] = [None] * mk.batch_size
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

    def status(self) -> dict:
        mk = self.mk
        dev = self.device
        return {"running": sum(s is not None for s in self.slots), "queued": len(self.queue),
                "batch_size": self.batch_size, "max_queue": self.max_queue,
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
        if warmup:   # compiles the kernels (on a GPU, the first step's launch) before serving
            t0 = time.perf_counter()
            self.mk.prefill_slot(0, [0])
            self.mk.step_slots([0])
            self.mk.reset_slots()
            log.info("warm-up step done in %.1f s", time.perf_counter() - t0)
        self.thread = threading.Thread(target=self._loop, name="megakernel-engine", daemon=True)
        self.thread.start()

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
        active = [b for b, s in enumerate(self.slots) if s is not None]
        self.metrics.running.set(len(active))
        if active:
            self._decode(active, events)

    def _drop_cancelled(self):
        with self.cv:
            self._cancels = False
            kept = [s for s in self.queue if not s.req.cancelled]
            dropped = {s.req for s in self.queue if s.req.cancelled}
            self.queue = deque(kept)
            self.metrics.queue_depth.set(len(self.queue))
        for s in self.slots:
            if s is not None and s.req.cancelled:
                dropped.add(s.req)
                self._free(s)
        for req in dropped:
            if not req.done:
                req.done = True
                self.metrics.requests.labels("cancelled").inc()
                log.info("request %d cancelled (the client went away) after %d tokens", req.id,
                         req.completion_tokens)

    def _admit(self, events: list):
        # With others running, one prompt a turn: they wait for at most one prefill between tokens.
        budget = self.batch_size if not any(self.slots) else 1
        while budget:
            free = [b for b, s in enumerate(self.slots) if s is None]
            if not free:
                return
            with self.cv:
                if not self.queue:
                    return
                seq = self.queue.popleft()
                self.metrics.queue_depth.set(len(self.queue))
            req = seq.req
            if req.done or req.cancelled:
                continue
            b = free[0]
            sp = req.params.sampling
            try:
                logits = self.mk.prefill_slot(b, seq.prompt_ids)
                if not sp.greedy:
                    if sp.seed is not None:
                        # seeded by its place among its prompt's choices, so that a prompt of a
                        # list draws what it draws when sent alone
                        seq.generator = torch.Generator(device=self.device).manual_seed(sp.seed + seq.choice)
                    token = int(sample(logits[None], sp, seq.generator))
                else:
                    token = int(logits.argmax())
            except Exception as e:
                self.mk.free_slot(b)
                self.metrics.engine_errors.inc()
                log.exception("prefill of request %d failed", req.id)
                self._fail(req, Failure(500, f"prefill failed: {_describe(e)}"), events)
                continue
            if seq.choice == 0:
                self.metrics.prompt_tokens.inc(len(seq.prompt_ids))
            seq.slot = b
            self.slots[b] = seq
            self._accept(seq, token, time.perf_counter(), events)
            if seq.slot is not None:
                self.mk.set_token(b, token)
            budget -= 1

    def _decode(self, active: list[int], events: list):
        t0 = time.perf_counter()
        tokens = self.mk.step_slots(active).tolist()
        sampled = [b for b in active if not self.slots[b].req.params.sampling.greedy]
        if sampled:   # their greedy choices give way to a draw under their own settings
            for b, t in self._sample(sampled).items():
                tokens[b] = t
        now = time.perf_counter()
        self.metrics.step.observe(now - t0)
        for b in active:
            self._accept(self.slots[b], tokens[b], now, events)

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

    def _accept(self, seq: Sequence, token: int, now: float, events: list):
        """Take ``token`` as the sequence's next; hand out the text it completes; retire the
        sequence where it ends."""
        req, p = seq.req, seq.req.params
        m = self.metrics
        m.generation_tokens.inc()
        if seq.out_ids:
            m.itl.observe(now - seq.last_time)
        else:
            m.ttft.observe(now - req.arrival)
        seq.last_time = now
        seq.out_ids.append(token)
        finish = None
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
            # a stop string may begin in text held back at the previous token
            longest = max(map(len, p.stop))
            start = max(0, seq.sent - longest + 1)
            hits = [i for i in (seq.text.find(s, start) for s in p.stop) if i >= 0]
            if hits:
                seq.text, finish = seq.text[:min(hits)], "stop"
            hold = 0 if finish else longest - 1   # what could still become a stop string
        else:
            hold = 0
        end = max(seq.sent, len(seq.text) - hold)
        events.append((req, Delta(seq.index, seq.text[seq.sent:end], [token], finish)))
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
        if seq.slot is not None:
            self.mk.free_slot(seq.slot)
            self.slots[seq.slot] = None
            seq.slot = None

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
        for req in {s.req for s in self.slots if s is not None}:
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


def _put_all(items):
    for req, ev in items:
        req.events.put_nowait(ev)


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"
