"""``python -m megakernel.serve``: an OpenAI-compatible server over continuous batching.

    python -m megakernel.serve --model 0.6b --port 8000

Each decode launch runs the smallest compiled batch (1, 2, 4, ... up to ``--max-num-seqs``) that
holds the running sequences, several steps a launch while nobody waits; prompts that arrive
together are prefilled in one pass (``megakernel.serve.engine``).

A mistake in the command line or the model (an unknown size, a damaged checkpoint, a port in use)
ends with one line ``error: ...`` on stderr and exit status 2, before the model is loaded where
it can be told sooner.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
import time
from pathlib import Path

from megakernel import cli
from megakernel.cli import UsageError
from megakernel.runtime import BUCKETS
from scheduler.ops import MAX_BATCH

log = logging.getLogger("megakernel.serve")

NEEDS = ("fastapi", "uvicorn", "prometheus_client", "transformers")


DEFAULT_MAX_NUM_SEQS = 64     # the largest bucket of runtime.BUCKETS
CPU_MAX_NUM_SEQS = 8          # the interpreter's steps take seconds: a small batch
TP_MAX_NUM_SEQS = 16          # every rank must agree without measuring its memory
# Memory the default --max-num-seqs leaves free beside the KV cache: the prefill's activations
# (models.qwen3.prefill.act_budget: 2 GiB, or a quarter of what the cache leaves free), the step's
# scratch and the allocator's slack
KV_RESERVE_BYTES = 3 << 30
KV_FREE_FRACTION = 0.9


def parse_args(argv=None) -> argparse.Namespace:
    from megakernel.runtime import BACKENDS
    p = cli.Parser(prog="python -m megakernel.serve", description=cli.description(__doc__))
    p.add_argument("--model", default="0.6b",
                   help="size alias (0.6b 1.7b 4b 8b 14b 32b), Hugging Face repo id, or checkpoint folder")
    p.add_argument("--random-weights", action="store_true",
                   help="deterministic random weights of the model's shapes (no tokenizer: prompts are token ids)")
    p.add_argument("--served-model-name", default=None, help="the model's name in the API (default: --model)")
    p.add_argument("--max-num-seqs", "--batch-size", dest="max_num_seqs", type=cli.at_least(1), default=None,
                   help="sequences decoded at once, the slots of the KV cache (vLLM's name; --batch-size is an "
                        f"alias). Batches of {', '.join(map(str, BUCKETS))} up to it are compiled, each launch "
                        f"running the smallest that holds the sequences (default: as many as the GPU's free memory "
                        f"holds at --max-seq-len, at most {DEFAULT_MAX_NUM_SEQS}; {CPU_MAX_NUM_SEQS} on the CPU; "
                        f"{TP_MAX_NUM_SEQS} with --tp)")
    p.add_argument("--max-seq-len", type=int, default=4096,
                   help="context of each slot: prompt plus completion tokens")
    p.add_argument("--max-launch-ms", type=cli.number, default=20.0,
                   help="longest a decode launch of several steps may take (at the measured step time): the "
                        "longest a new request waits for admission while others decode")
    p.add_argument("--max-num-batched-tokens", type=cli.at_least(1), default=2048,
                   help="prompt tokens one packed admission prefills while other sequences decode (they wait "
                        "for it between tokens); at least one prompt is admitted whatever its length")
    p.add_argument("--max-queue", type=int, default=256,
                   help="sequences that may wait for a slot; past that, requests get a 503")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free one)")
    p.add_argument("--backend", default=None,
                   help=f"one of {', '.join(BACKENDS)} (default: megakernel on CUDA, else reference)")
    p.add_argument("--device", default=None, help="cpu, cuda or npu (default: the best available)")
    p.add_argument("--tp", type=_tp_degree, default=1,
                   help="tensor parallel degree: the model split over this many GPUs, one process each (started "
                        "here, or by torchrun); rank 0 serves, the others repeat its steps")
    p.add_argument("--plan", choices=("auto", "rules", "tuned"), default="auto",
                   help="the kernels' tile plan: tuned (python -m megakernel.tune's cache), rules, or auto (tuned "
                        "where cached for this device, model, batch and max_seq_len)")
    p.add_argument("--fp8-activations", choices=("dynamic", "none"), default=None,
                   help="FP8 checkpoints: how the projections take their inputs: dynamic (w8a8: e4m3 per 128 "
                        "values, quantized at run time, the scheme Qwen's FP8 checkpoints declare; the default) or "
                        "none (weight-only FP8)")
    p.add_argument("--prefill-graphs", nargs="?", const="on", default="auto", choices=("auto", "on", "off"),
                   help="admit short prompts (up to --max-num-batched-tokens in all, 512 each) by CUDA graphs of "
                        "the prefill, captured at start: one replay instead of about ten launches a layer "
                        "(16-bit weights, one GPU; logits within rounding of the eager prefill's). auto (the "
                        "default): where those hold; on: or fail; off: the eager prefill")
    p.add_argument("--log-prompts", action="store_true", help="log prompt text")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                   help="the server's and uvicorn's logging")
    args = p.parse_args(argv)
    if args.max_num_seqs is not None and args.max_num_seqs > MAX_BATCH:
        raise UsageError(f"--max-num-seqs must be at most {MAX_BATCH} (the kernels' largest batch), got "
                         f"{args.max_num_seqs}")
    if not args.max_launch_ms > 0:
        raise UsageError(f"--max-launch-ms must be positive, got {args.max_launch_ms}")
    if args.max_seq_len < 2:
        raise UsageError(f"--max-seq-len must be at least 2, got {args.max_seq_len}")
    if args.max_queue < 1:
        raise UsageError(f"--max-queue must be at least 1, got {args.max_queue}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    if args.backend is not None and args.backend not in BACKENDS:
        raise UsageError(f"unknown backend {args.backend!r}: choose one of {', '.join(BACKENDS)}")
    return args


def _tp_degree(text: str) -> int:
    from megakernel import tp as tp_mod
    return tp_mod.parse_tp(text)


def check_dependencies():
    import importlib.util
    missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"the server needs {', '.join(missing)}: pip install -e \".[serve]\"")


def listen(host: str, port: int) -> socket.socket:
    """A bound socket, so that a port in use is reported before the model loads."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port} ({e.strerror or e})") from None
    return sock


def sampling_defaults(folder: Path | None) -> dict:
    """Sampling settings the checkpoint's generation_config.json gives for requests that leave
    them out, as vLLM applies them (Qwen3: temperature 0.6, top_p 0.95, top_k 20)."""
    path = None if folder is None else Path(folder) / "generation_config.json"
    if path is None or not path.exists():
        return {}
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if cfg.get("do_sample") is False:
        return {"temperature": 0.0}
    return {k: cfg[k] for k in ("temperature", "top_p", "top_k") if cfg.get(k) is not None}


def default_max_num_seqs(model, max_seq_len: int) -> int:
    """Sequences whose KV cache at ``max_seq_len`` the GPU's free memory holds beside
    ``KV_RESERVE_BYTES`` (at most ``DEFAULT_MAX_NUM_SEQS``); ``CPU_MAX_NUM_SEQS`` off CUDA,
    ``TP_MAX_NUM_SEQS`` with tensor parallelism. A MemoryError where not even one fits. Free memory
    counts what torch's allocator holds unused (``prefill.cuda_memory``, as the fit check does)."""
    import torch

    from models.qwen3.prefill import cuda_memory
    if model.tp > 1:
        return TP_MAX_NUM_SEQS
    dev = model.device
    if dev.type != "cuda":
        return CPU_MAX_NUM_SEQS
    free, _ = cuda_memory(dev)
    per_seq = model.config.kv_bytes_per_position(model.dtype.itemsize) * max_seq_len
    fits = int((free * KV_FREE_FRACTION - KV_RESERVE_BYTES) // per_seq)
    if fits < 1:
        gib = 1024 ** 3
        raise MemoryError(f"the KV cache of one sequence of --max-seq-len {max_seq_len} ({per_seq / gib:.2f} GiB) "
                          f"does not fit in the {free / gib:.1f} GiB free on {torch.cuda.get_device_name(dev)} beside "
                          f"{KV_RESERVE_BYTES / gib:.0f} GiB for activations; use a smaller --max-seq-len")
    return min(DEFAULT_MAX_NUM_SEQS, fits)


def _prefill_graphs_fit(mk) -> bool:
    """Whether the prefill graphs can run here (--prefill-graphs auto): a CUDA GPU, 16-bit weights, one
    GPU. On an H200 they cut the first token's median 2-2.5x at 1 to 64 clients (docs/performance.md)."""
    from models.qwen3.prefill_graphs import unsupported
    return mk.weights.device.type == "cuda" and mk.tp == 1 and unsupported(mk.weights) is None


def build(model, *, batch_size: int | None = None, max_seq_len: int = 4096, max_queue: int = 256,
          backend: str | None = None, name: str | None = None, log_prompts: bool = False, warmup: bool = True,
          plan: str = "auto", max_launch_ms: float = 20.0, max_batched_tokens: int = 2048, buckets: bool = True,
          backend_options: dict | None = None, fp8_activations: str | None = None, prefill_graphs: str = "auto"):
    """The FastAPI app and its running engine for a loaded ``Qwen3Model`` (megakernel.load_model).
    ``batch_size``: --max-num-seqs (default ``default_max_num_seqs``); ``buckets``: compile the
    smaller batches too (``runtime.bucket_sizes``; tensor parallelism runs the whole batch);
    ``backend_options``: the runtime's backend's (tests); ``prefill_graphs``: as --prefill-graphs."""
    if prefill_graphs not in ("auto", "on", "off"):
        raise ValueError(f"prefill_graphs must be auto, on or off, got {prefill_graphs!r}")
    from models.qwen3.tokenizer import stop_token_ids

    from megakernel.generate import default_backend
    from megakernel.runtime import MegaQwen3, bucket_sizes

    from .api import ServerConfig, create_app
    from .engine import Engine
    from .metrics import Metrics
    from .text import TextCodec

    codec = TextCodec.load(model.checkpoint, model.config.vocab_size)
    config = ServerConfig(model_name=name or model.name, max_seq_len=max_seq_len,
                          stop_ids=frozenset(stop_token_ids(model.checkpoint, model.config)),
                          defaults=sampling_defaults(model.checkpoint), log_prompts=log_prompts)
    backend = backend or default_backend(model.device)
    batch_size = batch_size or default_max_num_seqs(model, max_seq_len)
    sizes = bucket_sizes(batch_size) if buckets and model.tp == 1 else None
    mk = MegaQwen3(model, max_seq_len=max_seq_len, batch_size=batch_size, backend=backend, plan=plan, buckets=sizes,
                   fp8_activations=fp8_activations, **(backend_options or {}))
    if prefill_graphs == "on" or (prefill_graphs == "auto" and _prefill_graphs_fit(mk)):
        t = time.perf_counter()
        mk.enable_prefill_graphs(max_batched_tokens)
        log.info("prefill graphs of up to %d tokens captured in %.1f s", max_batched_tokens, time.perf_counter() - t)
    else:
        log.info("prefill: eager (--prefill-graphs %s)", prefill_graphs)
    if mk.tp > 1:       # rank 0 of a tensor-parallel run: the other ranks repeat its calls (tp.follow)
        from megakernel import tp as tp_mod
        mk = tp_mod.Leader(mk, mk.tp_group)
    metrics = Metrics(batch_size, max_queue)
    engine = Engine(mk, metrics, max_queue=max_queue, max_launch_ms=max_launch_ms,
                    max_batched_tokens=max_batched_tokens)
    engine.start(warmup=warmup)
    app = create_app(engine, codec, config, metrics)
    return app, engine, config, codec


def main(argv=None) -> int:
    from megakernel import tp as tp_mod
    follower = args = None
    try:
        args = parse_args(argv)
        check_dependencies()
        where = tp_mod.env_rank() if args.tp > 1 else None
        follower = where is not None and where[0] > 0
        sock = None if follower else listen(args.host, args.port)
        if args.tp > 1 and where is None:
            # one process per rank, each running this command; rank 0 listens again
            from megakernel import device as devices
            from megakernel.model import locate_model
            sock.close()
            source = locate_model(args.model, random_weights=args.random_weights)
            return tp_mod.start(args.tp, devices.resolve(args.device), source.config, "megakernel.serve.server:main",
                                list(sys.argv[1:] if argv is None else argv), source.quantization)[0]
    except (UsageError, ValueError, RuntimeError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import prometheus_client
    prometheus_client.disable_created_metrics()   # the *_created series only repeat the start time
    try:
        import uvicorn

        from megakernel import device as devices
        from megakernel.model import load_model
        dev = devices.resolve(args.device)
        rank = 0
        if args.tp > 1:
            from megakernel.model import locate_model
            source = locate_model(args.model, random_weights=args.random_weights)
            _, dev = tp_mod.start(args.tp, dev, source.config, "", [], source.quantization)
            rank = tp_mod.current().rank
        t0 = time.perf_counter()
        model = load_model(args.model, random_weights=args.random_weights, device=dev,
                           progress=sys.stderr.isatty(), tp=args.tp, rank=rank)
        if follower:
            from megakernel.generate import default_backend
            from megakernel.runtime import MegaQwen3
            mk = MegaQwen3(model, max_seq_len=args.max_seq_len,
                           batch_size=args.max_num_seqs or default_max_num_seqs(model, args.max_seq_len),
                           backend=args.backend or default_backend(dev), plan=args.plan,
                           fp8_activations=args.fp8_activations)
            return tp_mod.follow(mk, tp_mod.current())
        app, engine, config, codec = build(model, batch_size=args.max_num_seqs, max_seq_len=args.max_seq_len,
                                           max_queue=args.max_queue, backend=args.backend,
                                           name=args.served_model_name or args.model, log_prompts=args.log_prompts,
                                           plan=args.plan, max_launch_ms=args.max_launch_ms,
                                           max_batched_tokens=args.max_num_batched_tokens,
                                           fp8_activations=args.fp8_activations, prefill_graphs=args.prefill_graphs)
    except (UsageError, ValueError, OSError, RuntimeError, MemoryError) as e:
        # ValueError covers CheckpointError and bad settings; RuntimeError an absent device or backend
        if sock is not None:
            sock.close()
        print(f"error: {' '.join(str(e).split()) or type(e).__name__}", file=sys.stderr)
        return 2
    host, port = sock.getsockname()[:2]
    seqs = engine.batch_size
    kv_gib = model.config.kv_bytes_per_position(model.dtype.itemsize) * seqs * args.max_seq_len / 1024 ** 3
    log.info("serving %s (%s, %s) on http://%s:%d: %d sequences at once (--max-num-seqs%s), a KV cache of %d "
             "tokens (%d x %d, %.2f GiB), batches %s, max_seq_len %d, backend %s, plan: %s, %s; ready in %.1f s",
             config.model_name, model.dtype, model.device, host, port, seqs,
             "" if args.max_num_seqs else ": what memory holds" if model.device.type == "cuda" and args.tp == 1
             else ": the default", seqs * args.max_seq_len, seqs, args.max_seq_len, kv_gib,
             ", ".join(map(str, engine.buckets)), args.max_seq_len,
             engine.mk.backend_name, engine.mk.plan_choice.label, "text and chat" if codec.has_chat_template else
             "text" if codec.has_text else "token ids only (no tokenizer)", time.perf_counter() - t0)
    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=5))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:   # uvicorn shut down gracefully, then passes Ctrl-C on
        return 130
    finally:
        if args.tp > 1:
            engine.stop()
            engine.mk.stop()    # the other ranks' tp.follow returns
    return 0
