"""``python -m megakernel.generate``: stream a Qwen3 continuation of a prompt, then its speed.

Text goes to stdout as it is generated (the running id list is decoded and the new suffix
printed, so multi-token characters come out whole); progress and timing go to stderr, ending with
"Decode: N tokens, X ms/token, Y tok/s". With ``--json`` the last stdout line is one JSON object.
A model without a tokenizer (random weights) reads ``--prompt`` as token ids and prints ids.
A mistake in the input (a missing or damaged checkpoint, an unknown name, a bad setting) ends
with one line ``error: ...`` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from models.qwen3.sampling import SamplingParams
from models.qwen3.tokenizer import stop_token_ids

from . import device as devices
from .model import load_model
from .runtime import BACKENDS, MegaQwen3

DEFAULT_PROMPT = "The capital of France is"
DEFAULT_PROMPT_IDS = [1, 2, 3, 4]   # for models without a tokenizer: any ids inside every vocab


class UsageError(Exception):
    """A mistake in the command line or its input: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def default_backend(device: torch.device) -> str:
    """The backend used when --backend is not given: the megakernel on a GPU; on an Ascend NPU the
    phase launches (per-op), since counter waits there are unverified (docs/npu.md); the reference
    on the CPU, where the kernels run through the interpreter (slow)."""
    return {"cuda": "megakernel", "npu": "per-op"}.get(device.type, "reference")


def parse_args(argv=None) -> argparse.Namespace:
    p = _Parser(prog="python -m megakernel.generate", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="0.6b",
                   help="size alias (0.6b 1.7b 4b 8b 14b 32b), Hugging Face repo id, or checkpoint folder")
    p.add_argument("--random-weights", action="store_true",
                   help="deterministic random weights of the model's shapes (no download; outputs are ids)")
    p.add_argument("--prompt", default=None,
                   help="prompt text; token ids separated by spaces where the model has no tokenizer")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in Qwen3's chat template")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None, help="sampling seed (random weights always use seed 0)")
    p.add_argument("--backend", default=None,
                   help=f"one of {', '.join(BACKENDS)} (default: megakernel on CUDA, else reference)")
    p.add_argument("--device", default=None, help="cpu, cuda or npu (default: the best available)")
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="KV cache length (default: prompt length + max-new-tokens)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last stdout line")
    args = p.parse_args(argv)
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.backend is not None and args.backend not in BACKENDS:
        raise UsageError(f"unknown backend {args.backend!r}: choose one of {', '.join(BACKENDS)}")
    try:   # check the sampling settings before a model is loaded
        SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return args


def _prompt_ids(args, model) -> list[int]:
    tok = model.tokenizer
    if tok is not None:
        text = DEFAULT_PROMPT if args.prompt is None else args.prompt
        return tok.encode_chat(text) if args.chat else tok.encode(text)
    why = "random weights" if model.random_weights else "no tokenizer.json in the checkpoint"
    print(f"note: {model.name} has no tokenizer ({why}): the prompt and the output are token ids, "
          f"not text", file=sys.stderr)
    if args.chat:
        raise UsageError("--chat needs a tokenizer, and this model has none")
    if args.prompt is not None:
        try:
            return [int(t) for t in args.prompt.split()]
        except ValueError:
            print(f"note: --prompt is not a list of token ids; using the default prompt "
                  f"{' '.join(map(str, DEFAULT_PROMPT_IDS))}", file=sys.stderr)
    return list(DEFAULT_PROMPT_IDS)


class _Streamer:
    """Prints each new token as it arrives and notes when it came. Text is decoded with the prompt
    in front, so that spacing at the seam comes out as the tokenizer means it."""

    def __init__(self, tokenizer, prompt: list[int], stops: list[int]):
        self.tok, self.prompt, self.stops = tokenizer, prompt, set(stops)
        self.ids: list[int] = []
        self.times: list[float] = []
        self.stopped = False
        self.start = self.printed = tokenizer.decode(prompt) if tokenizer is not None else ""

    def __call__(self, token: torch.Tensor):
        t = int(token[0])          # synchronises: the token is ready when it is printed
        self.times.append(time.perf_counter())
        if self.stopped or t in self.stops:
            self.stopped = True
            return
        self.ids.append(t)
        if self.tok is None:
            sys.stdout.write(f"{t} ")
        else:
            text = self.tok.decode(self.prompt + self.ids)
            if text.endswith("\ufffd"):
                return             # half of a multi-byte character: wait for the rest
            sys.stdout.write(text[len(self.printed):])
            self.printed = text
        sys.stdout.flush()

    def text(self) -> str | None:
        return None if self.tok is None else self.tok.decode(self.prompt + self.ids)[len(self.start):]


def run(args) -> dict:
    dev = devices.resolve(args.device)
    backend = args.backend or default_backend(dev)
    t0 = time.perf_counter()
    model = load_model(args.model, random_weights=args.random_weights, device=dev, progress=sys.stderr.isatty())
    cfg = model.config
    print(f"Loaded {args.model}: {cfg.num_parameters() / 1e6:,.1f} M parameters, {model.dtype}, {dev}, "
          f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    ids = _prompt_ids(args, model)
    max_seq_len = args.max_seq_len or len(ids) + args.max_new_tokens
    if len(ids) >= max_seq_len:
        raise UsageError(f"the prompt has {len(ids)} tokens; --max-seq-len {max_seq_len} leaves no room to "
                         f"generate")
    mk = MegaQwen3(model, max_seq_len=max_seq_len, batch_size=1, backend=backend)
    mode = {"megakernel": "persistent kernel, counter waits", "superkernel": "persistent kernel, grid barriers",
            "per-op": "phase launches, one per stage"}.get(backend)
    print(f"Backend {backend}{f' ({mode})' if mode else ''}; prompt {len(ids)} tokens; max_seq_len {max_seq_len}",
          file=sys.stderr)
    stops = stop_token_ids(model.checkpoint, cfg)
    stream = _Streamer(model.tokenizer, ids, stops)
    if not args.chat:
        sys.stdout.write(stream.start)   # echo the prompt text (nothing where it is ids)
        sys.stdout.flush()
    t_start = time.perf_counter()
    mk.generate([ids], max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                top_p=args.top_p, seed=args.seed, stop_tokens=stops, on_token=stream)
    sys.stdout.write("\n")
    summary = {"model": args.model, "backend": backend, "device": str(dev),
               "dtype": str(model.dtype).removeprefix("torch."), "random_weights": model.random_weights,
               "prompt_tokens": len(ids), "tokens": stream.ids, "text": stream.text()}
    summary.update(timings(t_start, stream.times))
    print(f"Prefill: {len(ids)} tokens in {summary['prefill_ms']:.1f} ms", file=sys.stderr)
    if summary["first_step_ms"] is not None:
        print(f"First decode step: {summary['first_step_ms']:.1f} ms (warm-up such as kernel compilation; "
              f"left out of the figures below)", file=sys.stderr)
    if summary["decode_steps"]:
        print(f"Decode: {summary['decode_steps']} tokens, {summary['ms_per_token']:.3f} ms/token, "
              f"{summary['tokens_per_s']:.2f} tok/s", file=sys.stderr)
    else:
        print("Decode: 0 tokens, n/a ms/token, n/a tok/s (too few tokens to time a decode step)", file=sys.stderr)
    return summary


def timings(t_start: float, times: list[float]) -> dict:
    """Prefill time (to the first token) and decode speed from the arrival times of the tokens.
    The first decode step pays for kernel compilation and warm-up, so where there are others it is
    reported on its own and the speed is taken over the rest."""
    gaps = [b - a for a, b in zip(times, times[1:])]
    first = gaps.pop(0) * 1e3 if len(gaps) > 1 else None
    total = sum(gaps)
    return {"prefill_ms": (times[0] - t_start) * 1e3, "first_step_ms": first, "decode_steps": len(gaps),
            "ms_per_token": total * 1e3 / len(gaps) if gaps else None,
            "tokens_per_s": len(gaps) / total if gaps and total > 0 else None}


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        summary = run(args)
    except (UsageError, ValueError, OSError, RuntimeError, MemoryError) as e:
        # ValueError covers CheckpointError and bad settings; OSError unreadable files; RuntimeError
        # an absent device or a backend not built yet.
        sys.stdout.flush()
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
