"""python -m megakernel.generate: continue one or more prompts with a Qwen3 model, streaming the text.

One prompt: its continuation streams to stdout as it is generated. Several (--prompt repeated or
--prompts-file; the batch size is their number): each sequence's text comes out as lines labelled
[0], [1], ..., a sequence stopping at its end-of-sequence token or its token limit while the others
go on. With --json, stdout is JSON lines instead: one object per sequence as it finishes, then a
summary. Progress and timing go to stderr: the time to the first token, then
"Decode: N tokens, X ms/token, Y tok/s".

A model with no tokenizer (random weights) takes prompts as token ids only (--prompt-ids) and
prints ids. A mistake in the input ends with one line "error: ..." on stderr and exit status 2,
before any weights are loaded where it can be known then; Ctrl-C ends with one line "interrupted"
and exit status 130.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

import torch

from models.qwen3.sampling import SamplingParams
from models.qwen3.tokenizer import stop_token_ids

from . import cli
from . import device as devices
from . import tp as tp_mod
from .cli import UsageError
from .model import DTYPES, check_memory, locate_model, resolve_dtype
from .runtime import BACKENDS, MegaQwen3

DEFAULT_PROMPT = "The capital of France is"
DEFAULT_PROMPT_IDS = [1, 2, 3, 4]   # for models without a tokenizer: any ids inside every vocab

EPILOG = """examples:
  python -m megakernel.generate -m 0.6b -p "The capital of France is" -n 32
  python -m megakernel.generate -m Qwen/Qwen3-1.7B --chat -p "Why is the sky blue?" --temperature 0.7 --top-p 0.9
  python -m megakernel.generate -m 0.6b -p "Once upon a time" -p "The recipe for bread:" --json
  python -m megakernel.generate -m 0.6b --random-weights --prompt-ids "1 2 3 4" -n 16
"""


def default_backend(device: torch.device) -> str:
    """The backend used when --backend is not given: the megakernel on a GPU; on an Ascend NPU the
    phase launches (per-op), since counter waits there are unverified (docs/npu.md); the reference
    on the CPU, where the kernels run through the interpreter (slow)."""
    return {"cuda": "megakernel", "npu": "per-op"}.get(device.type, "reference")


def _token_ids(text: str) -> list[int]:
    """An argparse type: token ids separated by spaces or commas."""
    parts = [p for p in re.split(r"[,\s]+", text.strip()) if p]
    if not parts:
        raise argparse.ArgumentTypeError("no token ids given")
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of token ids (integers separated by spaces or "
                                         f"commas)") from None
    if min(ids) < 0:
        raise argparse.ArgumentTypeError(f"token ids cannot be negative, got {min(ids)}")
    return ids


def build_parser() -> cli.Parser:
    p = cli.Parser(prog="python -m megakernel.generate", description=cli.description(__doc__), epilog=EPILOG)
    p.add_argument("-m", "--model", default="0.6b",
                   help="size alias (0.6b 1.7b 4b 8b 14b 32b), Hugging Face repo id, checkpoint folder, or the "
                        "demo shape tiny-random (random weights only)")
    p.add_argument("--random-weights", action="store_true",
                   help="run the model's shapes with deterministic random weights instead of its checkpoint (no "
                        "download, no tokenizer: prompts and output are token ids)")
    g = p.add_argument_group("prompts (one sequence each; the batch size is their number)")
    g.add_argument("-p", "--prompt", action="append", metavar="TEXT",
                   help=f"prompt text; repeat for a batch (default: {DEFAULT_PROMPT!r}, or the ids "
                        f"{' '.join(map(str, DEFAULT_PROMPT_IDS))} for a model without a tokenizer)")
    g.add_argument("--prompts-file", metavar="PATH", help="a UTF-8 text file with one prompt per line (blank lines "
                                                           "are skipped)")
    g.add_argument("--prompt-ids", action="append", type=_token_ids, metavar="IDS",
                   help="a prompt as token ids, e.g. '1 2 3' or '1,2,3'; repeat for a batch")
    g.add_argument("--chat", action="store_true", help="wrap each text prompt in Qwen3's chat template")
    g = p.add_argument_group("generation")
    g.add_argument("-n", "--max-new-tokens", type=cli.at_least(1), default=64,
                   help="tokens to generate per sequence, at most (a sequence also stops at end-of-sequence)")
    g.add_argument("--temperature", type=cli.number, default=0.0, help="sampling temperature; 0 is greedy")
    g.add_argument("--top-k", type=cli.at_least(1), default=None,
                   help="sample from the k most likely tokens (default: all; needs --temperature > 0)")
    g.add_argument("--top-p", type=cli.number, default=None,
                   help="sample from the smallest set of tokens whose probability reaches p, in (0, 1] "
                        "(default: 1; needs --temperature > 0)")
    g.add_argument("--seed", type=int, default=None,
                   help="sampling seed, for repeatable samples (default: unseeded; needs --temperature > 0)")
    g = p.add_argument_group("runtime")
    g.add_argument("--backend", choices=BACKENDS, default=None,
                   help="how a decode step runs (default: megakernel on CUDA, per-op on an NPU, reference on the "
                        "CPU)")
    g.add_argument("--device", default=None,
                   help="cpu, cuda, cuda:N or npu (default: the best available; DEVICE=... sets it too)")
    g.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="weight and KV-cache dtype (default: bfloat16 on an accelerator, float32 on the CPU)")
    g.add_argument("--quantize", choices=("fp8",), default=None,
                   help="fp8: the linear projections in block FP8 (Qwen's -FP8 format), quantized on load; an FP8 "
                        "checkpoint is FP8 without it")
    g.add_argument("--fp8-activations", choices=("dynamic", "none"), default=None,
                   help="FP8 weights: how the projections take their inputs: dynamic (w8a8: e4m3 per 128 values, "
                        "quantized at run time, the scheme Qwen's FP8 checkpoints declare; the default) or none "
                        "(weight-only FP8, 16-bit inputs)")
    g.add_argument("--max-seq-len", type=cli.at_least(2), default=None,
                   help="KV-cache positions per sequence (default: the longest prompt + --max-new-tokens)")
    g.add_argument("--tp", type=tp_mod.parse_tp, default=1,
                   help="tensor parallel degree: the model split over this many GPUs, one process each (started "
                        "here, or by torchrun); rank 0 prints")
    g.add_argument("--plan", choices=("auto", "rules", "tuned"), default="auto",
                   help="the kernels' tile plan: tuned (from python -m megakernel.tune's cache), rules, or auto "
                        "(tuned where cached for this device, model, batch and max_seq_len, else rules)")
    p.add_argument("--json", action="store_true",
                   help="stdout as JSON lines: one object per sequence as it finishes, then a summary")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """Parse and check everything that needs no model: types, ranges, the prompts file, the
    device; flags that do nothing in the chosen mode get one warning line."""
    args = build_parser().parse_args(argv)
    args.file_prompts = _read_prompts_file(args.prompts_file) if args.prompts_file is not None else []
    texts = (args.prompt or []) + args.file_prompts
    if texts and args.prompt_ids:
        raise UsageError("give the prompts as text (--prompt, --prompts-file) or as token ids (--prompt-ids), "
                         "not both")
    if args.chat and args.prompt_ids:
        raise UsageError("--chat wraps text prompts in the chat template; it cannot be used with --prompt-ids")
    if args.prompt is not None and any(not t for t in args.prompt):
        raise UsageError("--prompt is empty")
    try:
        SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.temperature == 0:
        idle = [flag for flag, value in (("--top-k", args.top_k), ("--top-p", args.top_p), ("--seed", args.seed))
                if value is not None]
        if idle:
            print(f"warning: {', '.join(idle)} {'has' if len(idle) == 1 else 'have'} no effect at --temperature 0 "
                  f"(greedy decoding)", file=sys.stderr)
    args.device = devices.resolve(args.device)
    args.dtype = resolve_dtype(args.dtype, args.device)
    if args.quantize:
        devices.check_fp8(args.device)
    return args


def _read_prompts_file(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError:
        raise UsageError(f"--prompts-file {path}: not UTF-8 text") from None
    except OSError as e:
        raise UsageError(f"--prompts-file {path}: {e.strerror or e}") from None
    prompts = [line for line in lines if line.strip()]
    if not prompts:
        raise UsageError(f"--prompts-file {path}: no prompts in it")
    return prompts


def prompt_ids(args, source) -> list[list[int]]:
    """The prompts as token ids: text through the model's tokenizer (a text prompt without one is
    an error), ids as given, checked against the vocabulary."""
    tok = source.tokenizer
    texts = (args.prompt or []) + args.file_prompts
    if args.prompt_ids:
        ids = [list(p) for p in args.prompt_ids]
    elif tok is None:
        why = "random weights" if source.random_weights else "no tokenizer.json in the checkpoint"
        if texts or args.chat:
            raise UsageError(f"{source.name} has no tokenizer ({why}), so it cannot read text: give the prompt as "
                             f"token ids, e.g. --prompt-ids '1 2 3'")
        print(f"note: {source.name} has no tokenizer ({why}): prompting with the ids "
              f"{' '.join(map(str, DEFAULT_PROMPT_IDS))}; output is token ids", file=sys.stderr)
        ids = [list(DEFAULT_PROMPT_IDS)]
    else:
        texts = texts or [DEFAULT_PROMPT]
        ids = [tok.encode_chat(t) if args.chat else tok.encode(t) for t in texts]
        empty = [i for i, p in enumerate(ids) if not p]
        if empty:
            raise UsageError(f"prompt {empty[0]} ({texts[empty[0]]!r}) encodes to no tokens")
    V = source.config.vocab_size
    for i, p in enumerate(ids):
        bad = [t for t in p if t >= V]
        if bad:
            raise UsageError(f"prompt {i}: token id {bad[0]} is outside the vocabulary of {source.name} [0, {V})")
    return ids


class _Sequence:
    """One sequence's output: its new tokens, its text (decoded with the prompt in front, so that
    spacing at the seam comes out as the tokenizer means it), and whether it has finished."""

    def __init__(self, index: int, tokenizer, prompt: list[int], echo: bool, stops: set[int], limit: int):
        self.index, self.tok, self.prompt, self.stops, self.limit = index, tokenizer, prompt, stops, limit
        self.ids: list[int] = []
        self.finish_reason: str | None = None
        self.prefix = tokenizer.decode(prompt) if tokenizer is not None else ""
        self.echo = echo and tokenizer is not None     # the output starts with the prompt's text
        self.shown = self.prefix                       # the text so far, passed on or echoed

    def add(self, t: int) -> str:
        """Take token ``t``; returns the text it completes (nothing for a stop token, or half of a
        multi-byte character)."""
        if t in self.stops:
            self.finish_reason = "stop"
            return ""
        self.ids.append(t)
        if len(self.ids) >= self.limit:
            self.finish_reason = "length"
        if self.tok is None:
            return f"{t} "
        text = self.tok.decode(self.prompt + self.ids)
        if text.endswith("\ufffd") and self.finish_reason is None:
            return ""              # half of a multi-byte character: wait for the rest
        new, self.shown = text[len(self.shown):], text
        return new

    def text(self) -> str | None:
        return None if self.tok is None else self.tok.decode(self.prompt + self.ids)[len(self.prefix):]

    def summary(self) -> dict:
        return {"index": self.index, "prompt_tokens": len(self.prompt), "tokens": self.ids, "text": self.text(),
                "finish_reason": self.finish_reason}


class _Output:
    """Sends each step's tokens to stdout: one sequence streams as it comes; several come as
    lines labelled ``[i]`` (each line when it is complete); with --json, one JSON line per
    sequence as it finishes. Notes each step's arrival time."""

    def __init__(self, seqs: list[_Sequence], as_json: bool):
        self.seqs, self.json = seqs, as_json
        self.times: list[float] = []
        self.pending = [s.prefix if s.echo else "" for s in seqs]   # a labelled line not yet complete
        self.printed = [False for _ in seqs]
        self.open_line = False                   # stdout ends mid-line
        if not as_json and len(seqs) == 1:
            self._write(self.pending[0])

    def _write(self, text: str):
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
            self.open_line = not text.endswith("\n")

    def __call__(self, tokens: torch.Tensor):
        self.times.append(time.perf_counter())
        for s, t in zip(self.seqs, tokens.tolist()):
            if s.finish_reason is not None:
                continue
            new = s.add(t)
            if self.json:
                if s.finish_reason is not None:
                    self._write(json.dumps(s.summary()) + "\n")
            elif len(self.seqs) == 1:
                self._write(new)
            else:
                self.pending[s.index] += new
                *lines, self.pending[s.index] = self.pending[s.index].split("\n")
                rest = self.pending[s.index].rstrip(" ")
                if s.finish_reason is not None and (rest or not (lines or self.printed[s.index])):
                    lines.append(rest)
                for line in lines:
                    self._write(f"[{s.index}] {line}\n")
                    self.printed[s.index] = True

    def end(self):
        if self.open_line:
            self._write("\n")


def run(args) -> dict:
    dev, dtype = args.device, args.dtype
    backend = args.backend or default_backend(dev)
    if dev.type == "cpu" and backend in ("megakernel", "superkernel", "per-op") and dtype != torch.float32:
        raise UsageError(f"--backend {backend} on the CPU runs through Triton's interpreter, which needs "
                         f"--dtype float32, not {str(dtype).removeprefix('torch.')}")
    source = locate_model(args.model, random_weights=args.random_weights)
    cfg = source.config
    prompts = prompt_ids(args, source)
    quantize = args.quantize or source.quantization
    if args.tp > 1:
        if backend == "cuda-graph" and dev.type != "cuda":
            raise UsageError("--backend cuda-graph needs a CUDA GPU")
        # one process per rank, each running this command from here (tp.start)
        status, dev = tp_mod.start(args.tp, dev, cfg, "megakernel.generate:main", args.argv, quantize)
        if status is not None:
            args.tp_status = status
            return {}
    B, n = len(prompts), args.max_new_tokens
    longest = max(map(len, prompts))
    max_seq_len = args.max_seq_len if args.max_seq_len is not None else longest + n
    if longest >= max_seq_len:
        raise UsageError(f"the prompt has {longest} tokens; --max-seq-len {max_seq_len} leaves no room to generate")
    if longest + n - 1 > max_seq_len:
        raise UsageError(f"--max-new-tokens {n} does not fit: a prompt of {longest} tokens leaves room for "
                         f"{max_seq_len - longest + 1} within --max-seq-len {max_seq_len}")
    if max_seq_len > cfg.max_position_embeddings:
        print(f"warning: --max-seq-len {max_seq_len} is past {source.name}'s max_position_embeddings "
              f"({cfg.max_position_embeddings}): it was not trained on positions that far", file=sys.stderr)
    from models.qwen3.tp import shard_config
    from models.qwen3.weights import weight_bytes
    here = shard_config(cfg, args.tp)       # this rank's shapes (the whole model at --tp 1)
    kv = here.kv_bytes_per_position(dtype.itemsize) * B * max_seq_len
    if quantize:
        devices.check_fp8(dev)      # an FP8 checkpoint on a device that cannot read it
    fp8 = " with FP8 projections" if quantize else ""
    share = f" (a rank's share of --tp {args.tp})" if args.tp > 1 else ""
    check_memory(dev, weight_bytes(here, dtype, quantize) + kv,
                 f"{source.name} in {str(dtype).removeprefix('torch.')}{fp8} with a KV cache of {B} x {max_seq_len}"
                 f"{share}")

    from . import plans
    # a missing tuned plan: now, before the load
    if args.fp8_activations and not quantize:
        raise UsageError("--fp8-activations is for FP8 weights: add --quantize fp8 (or load an -FP8 checkpoint)")
    from .runtime import fp8_scheme
    scheme = fp8_scheme(quantize, args.fp8_activations, args.tp)     # resolved once: one warning at TP
    plans.choose(args.plan, dev, here, dtype, B, max_seq_len, backend, args.model, tp=args.tp,
                 quant=plans.quant_name(quantize, scheme == "dynamic"))
    t0 = time.perf_counter()
    rank = tp_mod.current().rank if args.tp > 1 else 0
    model = source.load(dev, dtype, progress=sys.stderr.isatty(), quantize=args.quantize, tp=args.tp, rank=rank)
    print(f"Loaded {args.model}: {cfg.num_parameters() / 1e6:,.1f} M parameters, {model.dtype}{fp8}, {dev}, "
          f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    mk = MegaQwen3(model, max_seq_len=max_seq_len, batch_size=B, backend=backend, plan=args.plan,
                   fp8_activations=scheme)
    mode = {"megakernel": "persistent kernel, counter waits", "superkernel": "persistent kernel, grid barriers",
            "per-op": "phase launches, one per stage"}.get(backend)
    lengths = f"{longest} tokens" if B == 1 else f"{B} prompts of {min(map(len, prompts))}-{longest} tokens"
    tp_note = f"; tensor parallel over {args.tp} ranks" if args.tp > 1 else ""
    scheme = {"dynamic": "; FP8 w8a8 (activations e4m3 per 128)", "none": "; FP8 weight-only"}.get(mk.fp8_activations, "")
    print(f"Backend {backend}{f' ({mode})' if mode else ''}; plan: {mk.plan_choice.label}; prompt {lengths}; "
          f"max_seq_len {max_seq_len}{tp_note}{scheme}", file=sys.stderr)
    stops = set(stop_token_ids(model.checkpoint, cfg))
    seqs = [_Sequence(i, model.tokenizer, p, not args.chat, stops, n) for i, p in enumerate(prompts)]
    out = _Output(seqs, args.json)
    args.output = out                    # main() ends a half-written line on Ctrl-C
    t_start = time.perf_counter()
    mk.generate(prompts, max_new_tokens=n, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                seed=args.seed, stop_tokens=sorted(stops), on_token=out)
    out.end()
    summary = {"model": args.model, "backend": backend, "device": str(dev), "tp": args.tp,
               "dtype": str(model.dtype).removeprefix("torch."), "quantization": model.quantization,
               "fp8_activations": mk.fp8_activations, "random_weights": model.random_weights,
               "batch_size": B, "max_seq_len": max_seq_len, **mk.plan_choice.record(),
               "sequences": [s.summary() for s in seqs]}
    summary.update(timings(t_start, out.times, B))
    prefill = f"{longest} prompt tokens" if B == 1 else f"{B} prompts, {sum(map(len, prompts))} tokens"
    print(f"Time to first token: {summary['ttft_ms']:.1f} ms (prefill of {prefill})", file=sys.stderr)
    if summary["first_step_ms"] is not None:
        print(f"First decode step: {summary['first_step_ms']:.1f} ms (warm-up such as kernel compilation; "
              f"left out of the figures below)", file=sys.stderr)
    if not summary["decode_steps"]:
        print("Decode: 0 tokens, n/a ms/token, n/a tok/s (too few tokens to time a decode step)", file=sys.stderr)
    elif B == 1:
        print(f"Decode: {summary['decode_steps']} tokens, {summary['ms_per_token']:.3f} ms/token, "
              f"{summary['tokens_per_s']:.2f} tok/s", file=sys.stderr)
    else:
        print(f"Decode: {summary['decode_steps']} steps of {B} sequences, {summary['ms_per_token']:.3f} ms/token "
              f"per sequence, {summary['tokens_per_s']:.2f} tok/s in all", file=sys.stderr)
    return summary


def timings(t_start: float, times: list[float], batch_size: int = 1) -> dict:
    """Time to the first token (the prefill and its sampling, from the call to its arrival on the
    host) and decode speed from the arrival times of each step's tokens. The first decode step
    pays for kernel compilation and warm-up, so where there are others it is reported on its own
    and the speed is taken over the rest; tok/s counts every sequence of the batch."""
    gaps = [b - a for a, b in zip(times, times[1:])]
    first = gaps.pop(0) * 1e3 if len(gaps) > 1 else None
    total = sum(gaps)
    return {"ttft_ms": (times[0] - t_start) * 1e3, "first_step_ms": first, "decode_steps": len(gaps),
            "ms_per_token": total * 1e3 / len(gaps) if gaps else None,
            "tokens_per_s": batch_size * len(gaps) / total if gaps and total > 0 else None}


def main(argv=None) -> int:
    state = {}

    def body() -> int:
        state["args"] = args = parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)
        summary = run(args)
        if getattr(args, "tp_status", None) is not None:    # the ranks' processes ran it
            return args.tp_status
        if args.json:
            print(json.dumps(summary))
        return 0

    def end_line():
        out = getattr(state.get("args"), "output", None)
        if out is not None:
            out.end()

    # ValueError covers CheckpointError and bad settings; OSError unreadable files; RuntimeError
    # an absent device or a backend not built yet; MemoryError a model that does not fit
    return cli.run(body, on_interrupt=end_line)


if __name__ == "__main__":
    sys.exit(main())
