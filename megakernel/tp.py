"""Tensor parallelism: the process group, the symmetric buffers, and launching one process per GPU.

One process per rank (GPU), each holding its share of the model (``models/qwen3/tp.py``) and
running its own persistent megakernel over a tape of its own shapes. The ranks meet at the
REDUCE instructions (``instructions/allreduce.py``), which read each other's partial sums and
flags through peer pointers:

- on CUDA, PyTorch's symmetric memory (``torch.distributed._symmetric_memory``: ``empty``, then
  ``rendezvous``, whose handle's ``buffer_ptrs`` are every rank's buffer in this process), with
  NVLink multicast off (no multimem operations are used; ``NCCL_NVLS_ENABLE=0`` and
  ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` are set in the processes this module starts);
- on the CPU, a stand-in with the same shape: each rank's buffer is a shared file that every rank
  maps, so the interpreted kernel reads its peers' memory through their addresses in its own
  process, as on a GPU.

torch.distributed (NCCL on CUDA, gloo on the CPU) sets the group up, exchanges the file names, and
carries the all-reduces of the per-op backends, the prefill and the reference.

Failure: a REDUCE waits on its peers boundedly and also gives up when this rank's abort word is
set. A rank whose step fails writes its abort word on every rank (``TPGroup.abort``) before it
raises; every other rank's kernel then stops at its next REDUCE and raises ``RankError`` naming
that rank; a rank that stops without a word (killed, hung) makes the others' REDUCE waits time
out, about a second on a GPU, and raise ``RankError`` naming it. Host collectives are bounded by
the process group's timeout (``MEGAKERNEL_TP_TIMEOUT``, seconds, default 60). After a
``RankError`` the group is spent: every later step raises it again.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import tempfile
import time
import uuid

import torch

from .backends import RankError  # noqa: F401  (raised by the backends, named here)

# set in every process this module starts, before CUDA or NCCL are touched
TP_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


_GROUP: "TPGroup | None" = None


def current() -> "TPGroup | None":
    """The process's tensor-parallel group, once ``init`` has made it."""
    return _GROUP


def env_rank() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) where torchrun (or ``launch``) set them, else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return rank, world, int(os.environ.get("LOCAL_RANK", rank))


def init(tp: int, device: torch.device | None = None) -> "TPGroup":
    """Join the tensor-parallel group of ``tp`` ranks described by the environment (RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT: torchrun's, or ``launch``'s); the one
    group of this process, made once."""
    global _GROUP
    if _GROUP is not None:
        if _GROUP.tp != tp:
            raise ValueError(f"this process is already rank {_GROUP.rank} of a group of {_GROUP.tp}, not {tp}")
        return _GROUP
    where = env_rank()
    if where is None:
        raise RuntimeError(f"--tp {tp} needs one process per rank: run under torchrun, or let the command "
                           f"start them (megakernel.tp.launch)")
    rank, world, local = where
    if world != tp:
        raise ValueError(f"--tp {tp}, but WORLD_SIZE is {world}: start {tp} processes (torchrun --nproc-per-node {tp})")
    for k, v in TP_ENV.items():
        os.environ.setdefault(k, v)
    _GROUP = TPGroup(tp, rank, local, device)
    return _GROUP


class TPGroup:
    """This process's rank of a tensor-parallel run: torch.distributed's group, its symmetric
    buffers, and the abort word."""

    def __init__(self, tp: int, rank: int, local_rank: int, device: torch.device | None = None):
        import torch.distributed as dist

        from . import device as devices
        self.tp, self.rank = tp, rank
        dev = device or devices.resolve(None)
        if dev.type == "cuda":
            dev = torch.device("cuda", local_rank if dev.index is None else dev.index)
            torch.cuda.set_device(dev)
        self.device = dev
        timeout = datetime.timedelta(seconds=float(os.environ.get("MEGAKERNEL_TP_TIMEOUT", "60")))
        if not dist.is_initialized():
            dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=tp,
                                    timeout=timeout)
        self.dist = dist
        self._flags_views: list[torch.Tensor] = []
        self._keep = []             # the mappings and handles that keep peer memory alive

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the ranks, in place (the prefill's and the reference's reductions)."""
        self.dist.all_reduce(t)
        return t

    def barrier(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.dist.barrier()

    # -------------------------------------------------------------------------------------------
    # symmetric buffers

    def buffers(self, L: int, B: int, H: int) -> dict[str, torch.Tensor]:
        """The REDUCE instructions' buffers (``megakernel.buffers``: part, flags, peers), zeroed, in
        memory every rank can read: this rank's ``part`` [2 L, B, H] float32 and ``flags`` [1 + 2 L]
        int32, and ``peers`` [2 tp] int64, every rank's part and flags addresses in this process.
        A collective: every rank calls it with the same shapes."""
        part_bytes = 2 * L * B * H * 4
        flags_off = -(-part_bytes // 256) * 256
        nbytes = flags_off + (1 + 2 * L) * 4
        if self.device.type == "cuda":
            raw, ptrs = self._symmetric_cuda(nbytes)
        else:
            raw, ptrs = self._shared_files(nbytes)
        part = raw[:part_bytes].view(torch.float32).view(2 * L, B, H)
        flags = raw[flags_off:nbytes].view(torch.int32)
        peers = torch.tensor([p + o for o in (0, flags_off) for p in ptrs], dtype=torch.int64, device=self.device)
        self.barrier()      # every rank's zeroed buffers before any kernel reads a peer's
        self.flags = flags
        self._flags_off, self._nflags = flags_off, 1 + 2 * L
        return {"part": part, "flags": flags, "peers": peers}

    def _symmetric_cuda(self, nbytes: int):
        import warnings

        import torch.distributed._symmetric_memory as symm_mem
        name = self.dist.group.WORLD.group_name
        with warnings.catch_warnings():     # deprecated (and unneeded) from torch 2.9 on; needed before
            warnings.simplefilter("ignore")
            if hasattr(symm_mem, "enable_symm_mem_for_group"):
                symm_mem.enable_symm_mem_for_group(name)
        raw = symm_mem.empty(nbytes, dtype=torch.uint8, device=self.device)
        raw.zero_()
        handle = symm_mem.rendezvous(raw, name)
        self._keep.append((raw, handle))
        self._handle = handle
        return raw, [int(p) for p in handle.buffer_ptrs]

    def _shared_files(self, nbytes: int):
        """The CPU's stand-in for symmetric memory: rank r's buffer is a shared file that every rank
        maps (at its own address), removed once all have mapped it."""
        box = [uuid.uuid4().hex if self.rank == 0 else None]
        self.dist.broadcast_object_list(box, src=0)
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        paths = [os.path.join(folder, f"megakernel-tp-{box[0]}-{r}") for r in range(self.tp)]
        own = torch.from_file(paths[self.rank], shared=True, size=nbytes, dtype=torch.uint8)
        own.zero_()
        self.dist.barrier()
        views = [own if r == self.rank else torch.from_file(p, shared=True, size=nbytes, dtype=torch.uint8)
                 for r, p in enumerate(paths)]
        self.dist.barrier()
        os.unlink(paths[self.rank])
        self._keep.append(views)
        self._peer_raw = views
        return own, [v.data_ptr() for v in views]

    def _peer_flags(self, r: int) -> torch.Tensor:
        if self.device.type == "cuda":
            return self._handle.get_buffer(r, (self._nflags,), torch.int32, self._flags_off // 4)
        return self._peer_raw[r][self._flags_off:self._flags_off + 4 * self._nflags].view(torch.int32)

    def abort(self):
        """Tell every rank's kernel to stop at its next REDUCE: write 1 + this rank into every
        rank's abort word (``flags[0]``), this one's too, so the group stays stopped. The first
        abort wins: a rank already stopped by another's word passes it on as it is (the aborting
        rank has written it everywhere), and a word already set is not overwritten."""
        if not hasattr(self, "flags") or int(self.flags[0]):
            return
        for r in range(self.tp):
            word = self._peer_flags(r)[:1]
            if not int(word.item()):
                word.fill_(1 + self.rank)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def aborted_by(self) -> int | None:
        """The rank that aborted the group, where one did."""
        if not hasattr(self, "flags"):
            return None
        a = int(self.flags[0])
        return a - 1 if a else None

    def reset_flags(self):
        """Zero the step flags on every rank at once (with the counters, every 65536 steps): a
        collective, so that no rank zeroes its flags while a peer may still read them."""
        self.barrier()
        self.flags[1:].zero_()
        self.barrier()

    # the served calls (``Leader``, ``follow``): Python objects over a gloo group beside NCCL's,
    # made by the first call (every rank's first is the server's warm-up)

    def _control(self):
        if getattr(self, "_ctrl", None) is None:
            self._ctrl = self.dist.new_group(backend="gloo") if self.device.type == "cuda" else self.dist.group.WORLD
        return self._ctrl

    def send_call(self, msg):
        self.dist.broadcast_object_list([msg], src=0, group=self._control())

    def recv_call(self):
        box = [None]
        self.dist.broadcast_object_list(box, src=0, group=self._control())
        return box[0]

    def close(self):
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


# -----------------------------------------------------------------------------------------------
# one process per rank


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _ErrorsOnly:
    """stderr of a rank other than 0: only its ``error:`` lines, labelled with the rank."""

    def __init__(self, stream, rank: int):
        self.stream, self.rank, self.buf = stream, rank, ""

    def write(self, text: str) -> int:
        self.buf += text
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            if line.startswith("error:"):
                self.stream.write(f"error: rank {self.rank}: {line[len('error:'):].strip()}\n")
                self.stream.flush()
        return len(text)

    def flush(self):
        pass

    def isatty(self) -> bool:
        return False


def _child(rank: int, tp: int, port: int, target: str, argv: list[str], queue):
    os.environ.update(TP_ENV, RANK=str(rank), WORLD_SIZE=str(tp), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if rank:
        sys.stdout = open(os.devnull, "w")
        sys.stderr = _ErrorsOnly(sys.__stderr__, rank)
    import importlib
    module, fn = target.split(":")
    code = 1
    try:
        code = getattr(importlib.import_module(module), fn)(argv)
    finally:
        queue.put((rank, code))
        sys.stdout.flush()


def launch(tp: int, target: str, argv: list[str], grace_s: float = 30.0) -> int:
    """Run ``target`` ("module:function", called with ``argv``, returning an exit status) in ``tp``
    processes, ranks 0 .. tp - 1 (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set as
    torchrun sets them), rank 0's output as the command's; the others print only their errors.
    Returns rank 0's status, or the first failing rank's where rank 0 succeeded. A rank that
    ends in failure leaves the others ``grace_s`` seconds to end (they raise ``RankError``) before
    they are stopped."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_child, args=(r, tp, port, target, argv, queue), daemon=False) for r in range(tp)]
    for p in procs:
        p.start()
    codes: dict[int, int] = {}
    deadline = None
    import queue as queues
    import time
    try:
        while len(codes) < tp:
            try:
                rank, code = queue.get(timeout=0.5)
                codes[rank] = code
                if code and deadline is None:
                    deadline = time.monotonic() + grace_s
            except queues.Empty:
                pass
            for r, p in enumerate(procs):
                if r not in codes and not p.is_alive():
                    codes[r] = p.exitcode or 1     # died without reporting (killed)
                    deadline = deadline or time.monotonic() + grace_s
            if deadline is not None and time.monotonic() > deadline:
                for r, p in enumerate(procs):
                    if r not in codes:
                        p.terminate()
                        codes[r] = 1
    except KeyboardInterrupt:
        for p in procs:
            p.terminate()
        raise
    for p in procs:
        p.join(timeout=5)
    return codes.get(0) or next((c for _, c in sorted(codes.items()) if c), 0)


def _run_rank(rank: int, tp: int, port: int, fn, args, queue):
    os.environ.update(TP_ENV, RANK=str(rank), WORLD_SIZE=str(tp), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import pickle
    try:
        # plain pickle: tensors by value (torch's queue would share memory that dies with this process)
        queue.put((rank, True, pickle.dumps(fn(rank, *args))))
    except BaseException as e:      # reported to the caller, with its type, instead of a traceback here
        queue.put((rank, False, f"{type(e).__name__}: {e}"))


def spawn(tp: int, fn, *args, timeout_s: float = 600.0) -> list:
    """``fn(rank, *args)`` in ``tp`` new processes, one per rank (environment as ``launch`` sets it;
    ``fn`` calls ``init(tp)`` and loads its share: ``load_model(..., tp=tp, rank=rank)``), and
    their return values (picklable) in rank order. A rank that raises makes this raise
    RuntimeError with every failing rank's error; ranks still running ``timeout_s`` after the
    start are stopped and reported."""
    import multiprocessing as mp
    import queue as queues
    import time

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_run_rank, args=(r, tp, port, fn, args, q)) for r in range(tp)]
    for p in procs:
        p.start()
    results: dict[int, tuple[bool, object]] = {}
    deadline = time.monotonic() + timeout_s
    while len(results) < tp and time.monotonic() < deadline:
        try:
            rank, ok, value = q.get(timeout=0.5)
            results[rank] = (ok, value)
        except queues.Empty:
            for r, p in enumerate(procs):
                if r not in results and not p.is_alive() and q.empty():
                    results[r] = (False, f"died with exit code {p.exitcode}")
    for r, p in enumerate(procs):
        if r not in results:
            p.terminate()
            results[r] = (False, f"still running after {timeout_s:.0f} s: stopped")
        p.join(timeout=10)
    failed = [f"rank {r}: {v}" for r, (ok, v) in sorted(results.items()) if not ok]
    if failed:
        raise RuntimeError("; ".join(failed))
    import pickle
    return [pickle.loads(results[r][1]) for r in range(tp)]


def parse_tp(text: str) -> int:
    """An argparse type for --tp: a degree of ``TP_DEGREES``."""
    import argparse

    from models.qwen3.tp import TP_DEGREES
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n not in TP_DEGREES:
        raise argparse.ArgumentTypeError(f"tensor parallel degree {n} is not supported: choose one of "
                                         f"{', '.join(map(str, TP_DEGREES))}")
    return n


def start(tp: int, device: torch.device, config, target: str, argv: list[str],
          quantize: str | None = None) -> tuple[int | None, torch.device]:
    """A command line's --tp: (exit status, device). Checks, before any work, that the model
    divides among ``tp`` ranks (its FP8 scale blocks too, with ``quantize``, the run's
    quantization) and that there are ``tp`` GPUs (on CUDA; the CPU runs gloo
    processes); then, where no rank is set in the environment, starts ``tp`` processes that run
    ``target`` (``launch``) and returns their status; where one is (torchrun, or ``launch``'s
    processes), joins the group, keeps rank 0's output alone, and returns (None, this rank's
    device) for the command to go on. ``tp`` 1: (None, device)."""
    from models.qwen3.tp import check_tp, check_tp_fp8
    if tp == 1:
        return None, device
    (check_tp_fp8 if quantize else check_tp)(config, tp)
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"--tp {tp} runs on CUDA GPUs (or the CPU, for tests), not {device.type}")
    if device.type == "cuda" and torch.cuda.device_count() < tp:
        raise ValueError(f"--tp {tp} needs {tp} GPUs, this machine has {torch.cuda.device_count()}")
    where = env_rank()
    if where is None:
        return launch(tp, target, argv), device
    rank, world, local = where
    if world != tp:
        raise ValueError(f"--tp {tp}, but WORLD_SIZE is {world}: start {tp} processes (torchrun --nproc-per-node {tp})")
    if rank and not isinstance(sys.stderr, _ErrorsOnly):       # under torchrun: rank 0 speaks for all
        sys.stdout = open(os.devnull, "w")
        sys.stderr = _ErrorsOnly(sys.__stderr__, rank)
    if device.type == "cuda":
        device = torch.device("cuda", local)
    init(tp, device)
    return None, device


# -----------------------------------------------------------------------------------------------
# serving: rank 0 takes the requests, the other ranks repeat its calls


class Leader:
    """Rank 0's ``MegaQwen3`` in a served tensor-parallel run (``megakernel.serve``): the calls that
    change the batch (``CALLS``) go to every rank before they run here, with the pending tokens of a
    step (the server samples them into ``tokens`` on rank 0), so every rank runs the same steps;
    anything else is this rank's ``MegaQwen3``'s."""

    CALLS = ("prefill_slot", "prefill_slots", "set_token", "free_slot", "move_slot", "reset_slots", "step_slots",
             "reset")

    def __init__(self, mk, group: TPGroup):
        self._mk, self._group = mk, group

    def __getattr__(self, name):
        attr = getattr(self._mk, name)
        if name not in self.CALLS:
            return attr

        def call(*args, **kwargs):
            tokens = self._mk.tokens.cpu() if name == "step_slots" else None
            self._group.send_call((name, _to_host(args), _to_host(kwargs), tokens))
            return attr(*args, **kwargs)
        return call

    def launch_slots(self, *args, **kwargs):
        """``step_slots`` on every rank, ended: the ranks step together, so no launch is left queued."""
        from .runtime import EndedLaunch
        t0 = time.perf_counter()
        tokens = self.step_slots(*args, **kwargs)
        return EndedLaunch(tokens, time.perf_counter() - t0)

    def stop(self):
        """Let the other ranks' ``follow`` return."""
        self._group.send_call(None)


def _to_host(value):
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    return value


def follow(mk, group: TPGroup) -> int:
    """A rank other than 0 of a served run: repeat rank 0's calls (``Leader``) on ``mk`` until it
    stops; 0. A call that fails here fails on rank 0 too (a failed step raises ``RankError`` on
    every rank), which reports it; this rank goes on following."""
    while True:
        msg = group.recv_call()
        if msg is None:
            return 0
        name, args, kwargs, tokens = msg
        if tokens is not None:
            mk.tokens.copy_(tokens)
        try:
            getattr(mk, name)(*args, **kwargs)
        except Exception as e:
            print(f"error: {type(e).__name__}: {' '.join(str(e).split())}", file=sys.stderr)
