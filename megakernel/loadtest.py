"""``python -m megakernel.loadtest``: concurrent streaming clients against an OpenAI-compatible
server for a fixed time; reports requests/s, output tokens/s and p50/p99 of time to first token
and inter-token latency, and whether anything failed or was lost.

    python -m megakernel.loadtest --url http://127.0.0.1:8000 --concurrency 32 --duration 60
    python -m megakernel.loadtest --serve "--model 0.6b --random-weights" --concurrency 1,8,32,64 \
        --duration 20 --record bench/results.jsonl       # starts, loads and stops its own server

Each client sends streamed completions one after another until the time is up (those under way
then are finished and counted). Prompts are token ids by default, so that a server of random
weights (no tokenizer) is measured the same way; ``--prompt`` sends text. Every response is
checked: an HTTP error or an error event counts as failed; a stream that ends without ``[DONE]``,
or whose streamed tokens differ in number from its usage (or from --max-tokens where EOS is
ignored), counts as lost. The exit status is 1 where anything failed or was lost, 2 for bad
input, else 0; ``--json`` prints the report as one JSON object as the last stdout line.

Where the server has a Prometheus ``/metrics`` (``megakernel.serve``), the report also gives the
server's own p50s over the run (from its histograms, the difference of a scrape before and after,
interpolated within a bucket as Prometheus' ``histogram_quantile``): time to first token from the
request's arrival to its first token in the engine, its wait for admission and the admitting
prefill, and the decode step. A client TTFT far above
the server's is spent outside the engine (HTTP, the event loops, this client).

The clients are spread over processes (``--processes``; by default one per 16 clients), each with
its own event loop, started together: one Python process parsing thousands of streamed chunks a
second is busy enough that its own delays would count as the server's. The report gives each
process's CPU use and says where it is over 80% of a CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from megakernel import cli
from megakernel.cli import UsageError

# Random prompt ids are drawn from here: inside every Qwen3 vocabulary and any byte-level one.
PROMPT_ID_RANGE = (10, 256)
# the server's histograms (megakernel.serve.metrics) whose p50 over the run the report gives, by key
# the default spreads the clients over processes of at most this many each; a process busier than
# CLIENT_BUSY of a CPU is said to be a bottleneck of its own
CLIENTS_PER_PROCESS = 16
CLIENT_BUSY = 0.8
SERVER_HISTOGRAMS = {"server_ttft_ms_p50": "megakernel_time_to_first_token_seconds",
                     "server_queue_ms_p50": "megakernel_request_queue_time_seconds",
                     "server_prefill_ms_p50": "megakernel_prefill_seconds",
                     "server_step_ms_p50": "megakernel_decode_step_seconds"}


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.Parser(prog="python -m megakernel.loadtest", description=cli.description(__doc__))
    p.add_argument("--url", default=None, help="the server's base URL (default: http://127.0.0.1:8000, or the "
                   "server --serve starts)")
    p.add_argument("--concurrency", type=_counts, default=[32],
                   help="clients sending at once; several separated by commas (1,8,32,64) run one after another, "
                        "each a report (and a row)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds to keep sending")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens each completion asks for")
    p.add_argument("--prompt-tokens", type=int, default=32, help="length of the random token-id prompts")
    p.add_argument("--prompt", default=None, help="send this text as every prompt instead of token ids")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    p.add_argument("--eos", action="store_true", help="let EOS end a completion (without it: ignore_eos, so every "
                   "completion is --max-tokens long)")
    p.add_argument("--model", default=None, help="model name (default: the server's first in /v1/models)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    p.add_argument("--processes", type=int, default=None,
                   help="client processes the clients are spread over (default: one per 16 clients, at most half "
                        "the CPUs): one Python process streaming thousands of chunks a second is itself the "
                        "bottleneck, and its own delays would count as the server's latency")
    p.add_argument("--serve", metavar="ARGS", default=None,
                   help="start `python -m megakernel.serve ARGS` (on a free local port), wait until it answers, "
                        "load it, and stop it at the end: one command for a recorded run, the server's settings "
                        "in the row's command")
    p.add_argument("--serve-timeout", type=float, default=900.0,
                   help="seconds --serve's server may take to start (compiling every batch bucket)")
    p.add_argument("--json", action="store_true", help="print the report as JSON as the last stdout line "
                   "(a list of them for several --concurrency)")
    p.add_argument("--record", metavar="PATH", default=None,
                   help="append the report as a row to the results table (e.g. bench/results.jsonl), with the "
                        "server's device, backend and batch from its /health")
    args = p.parse_args(argv)
    if args.record:
        from .results import check_writable
        try:
            check_writable(args.record, "--record")
        except ValueError as e:
            raise UsageError(str(e)) from None
    for name in ("max_tokens", "prompt_tokens", "processes"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not args.duration > 0 or not args.timeout > 0 or not args.serve_timeout > 0:
        raise UsageError("--duration, --timeout and --serve-timeout must be positive")
    if args.serve is not None:
        if args.url is not None:
            raise UsageError("--url and --serve both name the server: give one")
        args.serve = shlex.split(args.serve)
    elif args.url is None:
        args.url = "http://127.0.0.1:8000"
    return args


def _counts(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected client counts separated by commas, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"client counts must be at least 1, got {text!r}")
    return out


def for_concurrency(args, c: int) -> argparse.Namespace:
    """``args`` for one run of ``c`` clients: its processes, by default one per CLIENTS_PER_PROCESS
    clients and at most half the CPUs."""
    one = argparse.Namespace(**vars(args))
    one.concurrency = c
    P = args.processes or max(1, min(-(-c // CLIENTS_PER_PROCESS), (os.cpu_count() or 2) // 2))
    one.processes = min(P, c)
    return one


@dataclass
class Stats:
    ok: int = 0
    failed: int = 0
    lost: int = 0
    tokens: int = 0
    ttft: list = field(default_factory=list)
    later: list = field(default_factory=list)      # the ttft of each client's requests after its first
    itl: list = field(default_factory=list)
    errors: list = field(default_factory=list)

    def fail(self, kind: str, why: str):
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.errors) < 10:
            self.errors.append(f"{kind}: {why}")


async def one_request(client, args, model: str, prompt, stats: Stats, first_of_client: bool = False):
    body = {"model": model, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": args.temperature,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": not args.eos,
            "return_token_ids": True}
    t0 = time.perf_counter()
    first = last = None
    streamed, usage, done = 0, None, False
    ttft, gaps = None, []
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                stats.fail("failed", f"HTTP {r.status_code}: {text[:200]}")
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    stats.fail("failed", f"error event: {chunk['error'].get('message')}")
                    return
                if chunk.get("usage"):
                    usage = chunk["usage"]
                n = sum(len(c.get("token_ids") or []) for c in chunk.get("choices", []))
                if not n:
                    continue
                now = time.perf_counter()
                streamed += n
                if first is None:
                    first, ttft = now, now - t0
                else:            # tokens that arrived together share the gap
                    gaps += [(now - last) / n] * n
                last = now
    except Exception as e:   # connection refused or reset, timeout, bad JSON: the request failed
        stats.fail("failed", f"{type(e).__name__}: {e}")
        return
    if not done or usage is None:
        stats.fail("lost", "the stream ended without [DONE] or usage")
        return
    if streamed != usage["completion_tokens"] or (not args.eos and streamed != args.max_tokens):
        stats.fail("lost", f"{streamed} tokens streamed, usage says {usage['completion_tokens']}, asked "
                           f"{args.max_tokens}")
        return
    stats.ok += 1
    stats.tokens += streamed
    stats.ttft.append(ttft)
    if not first_of_client:
        stats.later.append(ttft)
    stats.itl += gaps


async def scrape(client) -> dict | None:
    """{histogram name: [(upper bound, cumulative count)]} of the server's /metrics, or None where it
    has none."""
    from prometheus_client.parser import text_string_to_metric_families
    try:
        r = await client.get("/metrics", timeout=10)
    except Exception:
        return None
    if r.status_code != 200:
        return None
    out = {}
    for fam in text_string_to_metric_families(r.text):
        if fam.name in SERVER_HISTOGRAMS.values():
            out[fam.name] = sorted((float(s.labels["le"]), s.value) for s in fam.samples
                                   if s.name.endswith("_bucket"))
    return out


def histogram_p50(before: list, after: list) -> float | None:
    """The median, in ms, of what a cumulative histogram counted between two scrapes (linear within
    its bucket, as Prometheus' histogram_quantile); None where it counted nothing."""
    before = dict(before)
    counts = [(le, c - before.get(le, 0.0)) for le, c in after]
    total = counts[-1][1] if counts else 0.0
    if total <= 0:
        return None
    rank, lo, below = total / 2, 0.0, 0.0
    for le, c in counts:
        if c >= rank:
            if le == float("inf"):
                return lo * 1e3
            return (lo + (le - lo) * (rank - below) / max(c - below, 1e-12)) * 1e3
        lo, below = le, c
    return None


async def _clients(args, model: str, n: int, rng: random.Random, deadline: float) -> Stats:
    """``n`` clients, each sending one request after another until ``deadline`` (time.monotonic)."""
    import httpx
    stats = Stats()
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=args.url.rstrip("/"), timeout=args.timeout, limits=limits) as client:
        async def client_loop():
            first = True
            while time.monotonic() < deadline:
                prompt = args.prompt if args.prompt is not None else \
                    [rng.randrange(*PROMPT_ID_RANGE) for _ in range(args.prompt_tokens)]
                await one_request(client, args, model, prompt, stats, first)
                first = False

        await asyncio.gather(*(client_loop() for _ in range(n)))
    return stats


def _process(args, model: str, n: int, seed: int, ready, go, deadline, out):
    """One client process: ``n`` clients from the moment ``go`` is set until ``deadline``; puts its
    Stats, the time it finished and the CPU seconds it used on ``out``."""
    try:
        ready.put(os.getpid())
        go.wait()
        cpu = time.process_time()
        stats = asyncio.run(_clients(args, model, n, random.Random(seed), deadline.value))
        out.put((stats, time.monotonic(), time.process_time() - cpu))
    except BaseException as e:    # the parent reports it rather than waiting for ever
        out.put(e)


def _merge(parts: list[Stats]) -> Stats:
    total = Stats()
    for p in parts:
        total.ok, total.failed, total.lost, total.tokens = (total.ok + p.ok, total.failed + p.failed,
                                                            total.lost + p.lost, total.tokens + p.tokens)
        total.ttft += p.ttft
        total.later += p.later
        total.itl += p.itl
        total.errors += p.errors[:10 - len(total.errors)]
    return total


def _spread(args, model: str) -> tuple[Stats, float, float]:
    """The clients over ``args.processes`` processes, started together: merged Stats, the wall time
    from the start to the last one's end, and the processes' mean CPU use (a fraction of one CPU)."""
    ctx = multiprocessing.get_context("spawn")
    ready, out, go, deadline = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    P = args.processes
    shares = [args.concurrency // P + (i < args.concurrency % P) for i in range(P)]
    procs = [ctx.Process(target=_process, args=(args, model, n, args.seed * 1000 + i, ready, go, deadline, out),
                         daemon=True) for i, n in enumerate(shares)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=120)
        t0 = time.monotonic()
        deadline.value = t0 + args.duration
        go.set()
        results = [out.get(timeout=args.duration + args.timeout + 60) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise RuntimeError(f"a client process failed: {type(failed[0]).__name__}: {failed[0]}")
    wall = max(end for _, end, _ in results) - t0
    return _merge([st for st, _, _ in results]), wall, sum(cpu for *_, cpu in results) / len(results) / wall


async def run(args) -> dict:
    import httpx
    async with httpx.AsyncClient(base_url=args.url.rstrip("/"), timeout=args.timeout) as client:
        try:
            models = (await client.get("/v1/models", timeout=10)).json()["data"]
        except Exception as e:
            raise UsageError(f"cannot reach an OpenAI-compatible server at {args.url} ({type(e).__name__}: {e})") \
                from None
        model = args.model or models[0]["id"]
        health = (await client.get("/health", timeout=10)).json()
        before = await scrape(client)
        if args.processes == 1:
            cpu, t0 = time.process_time(), time.monotonic()
            stats = await _clients(args, model, args.concurrency, random.Random(args.seed), t0 + args.duration)
            wall = time.monotonic() - t0
            cpu_use = (time.process_time() - cpu) / wall
        else:     # the processes run their own event loops; this one only waits
            stats, wall, cpu_use = await asyncio.to_thread(_spread, args, model)
        after = await scrape(client) if before is not None else None
    server_side = {key: histogram_p50(before.get(name, []), after.get(name, [])) if after else None
                   for key, name in SERVER_HISTOGRAMS.items()}

    def pct(xs, q):
        return float(np.percentile(xs, q) * 1e3) if xs else None

    return {"url": args.url, "model": model, "concurrency": args.concurrency, "duration_s": wall,
            "max_tokens": args.max_tokens, "requests": stats.ok, "failed": stats.failed, "lost": stats.lost,
            "requests_per_s": stats.ok / wall, "output_tokens": stats.tokens,
            "output_tokens_per_s": stats.tokens / wall,
            "ttft_ms_p50": pct(stats.ttft, 50), "ttft_ms_p99": pct(stats.ttft, 99),
            # the first wave (every client's first request, all sent at once) left out
            "ttft_ms_p99_later": pct(stats.later, 99),
            "itl_ms_p50": pct(stats.itl, 50), "itl_ms_p99": pct(stats.itl, 99), **server_side,
            "client_processes": args.processes, "client_cpu": round(cpu_use, 3),
            "errors": stats.errors, "server": health}


def record_row(args, argv, report: dict) -> dict:
    """The report as a row of the results table: the run's header (as the bench writes it), the
    server's facts from /health, and the figures."""
    from . import results
    srv = report.get("server") or {}
    return {**results.run_header("megakernel.loadtest", argv if argv is not None else sys.argv[1:]),
            "device": srv.get("device"), "model": report["model"], "dtype": srv.get("dtype"), "backend": "serve",
            "serve_backend": srv.get("backend"), "batch_size": srv.get("batch_size"),
            "max_seq_len": srv.get("max_seq_len"), "prompt_len": args.prompt_tokens, "new_tokens": args.max_tokens,
            **{k: report.get(k) for k in results.SERVE_FIELDS if k in report},
            "error": None if not (report["failed"] or report["lost"]) else "; ".join(report["errors"][:3])}


def _ms(x) -> str:
    return "n/a" if x is None else f"{x:.1f} ms"


def start_server(args) -> tuple[subprocess.Popen, str]:
    """``python -m megakernel.serve`` with ``args.serve`` on a free local port; returns once it
    answers /health (a UsageError where it exits first or takes longer than --serve-timeout)."""
    import httpx
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "megakernel.serve", *args.serve, "--host", "127.0.0.1", "--port", str(port)]
    log = tempfile.NamedTemporaryFile(prefix="megakernel-serve-", suffix=".log", delete=False)
    print(f"starting the server: {shlex.join(cmd[1:])} (its log: {log.name})", file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url, t0 = f"http://127.0.0.1:{port}", time.monotonic()
    while True:
        if proc.poll() is not None:
            with open(log.name, errors="replace") as f:
                tail = " / ".join(f.read().strip().splitlines()[-3:])
            raise UsageError(f"the server exited with status {proc.returncode} before serving: {tail}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() - t0 > args.serve_timeout:
            stop_server(proc)
            raise UsageError(f"the server did not answer /health within {args.serve_timeout:.0f} s (its log: "
                             f"{log.name})")
        time.sleep(1)
    print(f"the server answers at {url} after {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return proc, url


def stop_server(proc: subprocess.Popen):
    """Ctrl-C, as a user stops it; killed where it has not stopped within 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def print_report(report: dict):
    print(f"{report['model']} at {report['url']}: {report['concurrency']} clients for {report['duration_s']:.1f} s, "
          f"max_tokens {report['max_tokens']}")
    print(f"requests: {report['requests']} done, {report['failed']} failed, {report['lost']} lost; "
          f"{report['requests_per_s']:.2f} requests/s")
    print(f"output: {report['output_tokens']} tokens, {report['output_tokens_per_s']:.1f} tokens/s")
    print(f"time to first token: p50 {_ms(report['ttft_ms_p50'])}, p99 {_ms(report['ttft_ms_p99'])} "
          f"(p99 of each client's requests after its first: {_ms(report.get('ttft_ms_p99_later'))})")
    print(f"inter-token latency: p50 {_ms(report['itl_ms_p50'])}, p99 {_ms(report['itl_ms_p99'])}")
    busy = report["client_cpu"] > CLIENT_BUSY
    print(f"clients: {report['client_processes']} process(es), each {100 * report['client_cpu']:.0f}% of a CPU"
          + (f" (over {100 * CLIENT_BUSY:.0f}%: the clients' own delays count in these latencies; give more "
             f"--processes)" if busy else ""))
    if report.get("server_ttft_ms_p50") is not None:
        print(f"the server's own p50s: time to first token {_ms(report['server_ttft_ms_p50'])} (arrival to the "
              f"engine's first token; of it, waiting for admission {_ms(report.get('server_queue_ms_p50'))} and "
              f"the admitting prefill {_ms(report.get('server_prefill_ms_p50'))}), decode step "
              f"{_ms(report['server_step_ms_p50'])}")
    for e in report["errors"]:
        print(f"  {e}")


def main(argv=None) -> int:
    proc = None
    reports = []
    try:
        args = parse_args(argv)
        if args.serve is not None:
            proc, args.url = start_server(args)
        for c in args.concurrency:
            one = for_concurrency(args, c)
            report = asyncio.run(run(one))
            print_report(report)
            if args.record:
                from .results import append_rows
                append_rows(args.record, [record_row(one, argv, report)])
                print(f"1 row appended to {args.record}")
            reports.append(report)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if proc is not None:
            stop_server(proc)
    if args.json:
        print(json.dumps(reports[0] if len(reports) == 1 else reports))
    return 1 if any(r["failed"] or r["lost"] for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
