"""python -m megakernel.compile_check: compile every kernel for a GPU target, without a GPU.

The interpreter runs the kernels' Python on the CPU, so it cannot catch what only the compiler
rejects (a variable whose type differs between the branches of an ``if``, say), nor show how many
registers the persistent kernel needs. This compiles the megakernel and every per-op kernel with
Triton's own compiler (bundled ``ptxas``) for an NVIDIA architecture, with the exact arguments a
real step passes (recorded from the backends on ``meta`` tensors, so nothing is allocated), and
reports registers, spills and how its dots lowered (Hopper's wgmma or mma.sync) per kernel. It must
run without ``TRITON_INTERPRET``; it re-executes
itself in a clean environment when that is set.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys


def _type(v) -> str:
    import torch
    if isinstance(v, torch.Tensor):
        return "*" + {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32",
                      torch.int64: "i64", torch.float8_e4m3fn: "fp8e4nv"}[v.dtype]
    if isinstance(v, bool):
        return "i1"
    if isinstance(v, int):
        return "i32"
    if isinstance(v, float):
        return "fp32"
    raise TypeError(f"cannot type argument {v!r}")


def _aligned(v) -> bool:
    """Whether a launch specialises the argument as divisible by 16, as Triton's launcher does for
    tensors (torch allocations are aligned) and integers that are multiples of 16. Without it the
    compiler cannot vectorise loads, and registers differ from the kernel that actually runs."""
    import torch
    if isinstance(v, torch.Tensor):
        return True
    return isinstance(v, int) and not isinstance(v, bool) and v % 16 == 0


def record_launches(model_name: str, workers: int, batch: int, max_seq_len: int, dtype, tp: int = 1, quantize=None,
                    fp8_activations=None, **options):
    """(kernel, keyword arguments, plan) of one step of every kernel backend, on meta tensors (FP8
    projections with ``quantize="fp8"``, their inputs as ``runtime.fp8_scheme`` chooses from
    ``fp8_activations``); ``tp`` > 1: of a rank of a tensor-parallel run (its shapes, the partials
    and REDUCE; no group is joined)."""
    from megakernel import backends
    from megakernel.model import Qwen3Model
    from megakernel.runtime import MegaQwen3
    from models.qwen3.weights import Qwen3Weights, shapes_for

    from models.qwen3.tp import check_tp_fp8, shard_config
    if quantize and tp > 1:
        check_tp_fp8(shapes_for(model_name), tp)
    cfg = shard_config(shapes_for(model_name), tp)
    model = Qwen3Model(model_name, cfg, Qwen3Weights.empty(cfg, dtype, "meta", quantize), None, None)
    from megakernel.runtime import fp8_scheme
    scheme = fp8_scheme("fp8" if quantize else None, fp8_activations, tp)     # (the model's own tp is 1)
    mk = MegaQwen3(model, max_seq_len=max_seq_len, batch_size=batch, backend="reference", fp8_activations=scheme)
    mk.tp = tp      # the backends plan a rank's tape from it; the REDUCE buffers stay meta tensors
    calls = []
    # SAMPLE is the backends' to set (the sampling plan runs while any sequence samples): --set
    # SAMPLE=1 compiles that plan
    overrides = dict(options.pop("plan_overrides", None) or {})
    sampling = bool(overrides.pop("SAMPLE", 0))
    options = {**options, "plan_overrides": overrides}
    for mode in ("megakernel", "superkernel"):
        be = backends.PersistentBackend(mk, mode=mode, num_workers=workers, **options)
        be.set_sampling(sampling)
        if be.tape.sm_mates and workers % 2 == 0:
            be.sm_pairs = workers // 2      # as a GPU of workers / 2 SMs runs it (kernel._paired_row)
        calls.append((be.kernel, be.launch_args(), be.plan))
    per_op = backends.PerOpBackend(mk, num_workers=workers, **options)
    per_op.set_sampling(sampling)
    calls += [(fn, kwargs, per_op.plan) for fn, grid, kwargs in per_op.seq
              if grid is not None]      # (not the host steps: the REDUCE's all-reduce)
    if per_op.plan.TP > 1 and per_op.plan.BATCHED == 2:
        # the kernel the host REDUCE launches after its all-reduce on the weights-on-M tile (xs and xss)
        from instructions.allreduce import xs_kernel
        from megakernel.buffers import kernel_args
        calls.append((xs_kernel, {**kernel_args(xs_kernel, per_op.st, per_op.plan.constexprs(), slot=1),
                                  "num_warps": 4}, per_op.plan))
    return calls


def compile_all(model_name="0.6b", workers=264, batch=1, max_seq_len=4096, arch=90, dtype_name="bfloat16",
                tp: int = 1, quantize=None, fp8_activations=None, **options):
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from megakernel import backends
    from megakernel.buffers import kernel_params

    target = GPUTarget("cuda", arch, 32)
    seen, report = set(), []
    for fn, kwargs, plan in record_launches(model_name, workers, batch, max_seq_len, getattr(torch, dtype_name), tp,
                                      quantize, fp8_activations, **options):
        opts = {k: kwargs[k] for k in ("num_warps", "num_stages", "maxnreg") if k in kwargs}
        params = kernel_params(fn)
        consts = {name: kwargs[name] for name, const in params if const}
        sig, attrs = {}, {}
        for i, (name, const) in enumerate(params):
            sig[name] = "constexpr" if const else _type(kwargs[name])
            if not const and _aligned(kwargs[name]):
                attrs[(i,)] = [["tt.divisibility", 16]]
        key = (fn.__name__, json.dumps(sig, sort_keys=True), json.dumps({k: str(v) for k, v in consts.items()},
                                                                          sort_keys=True), str(opts))
        if key in seen:
            continue
        seen.add(key)
        row = {"kernel": fn.__name__}
        try:
            with backends.triton_mma(plan):
                k = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs), target=target, options=opts)
            meta = k.metadata
            regs, stack, spill_ld, spill_st, r2ur = _resources(k)
            row.update(ok=True, shared=meta.shared, num_warps=meta.num_warps, n_regs=regs, stack_bytes=stack,
                       spill_loads=spill_ld, spill_stores=spill_st, r2ur=r2ur,
                       redux=len(re.findall(r"redux\.sync", k.asm.get("ptx", ""))),
                       **_mma_kinds(k.asm.get("ttgir", "")))
        except Exception as e:
            lines = [l for l in str(e).splitlines() if l.strip()]
            chain, c = [], e              # Triton wraps the real error in one CompilationError per call frame
            while c is not None:
                chain.append(str(c))
                c = c.__cause__ or c.__context__
            row.update(ok=False, error=" | ".join(lines[-4:])[:600], detail="\n".join(chain))
        report.append(row)
    return report


def _mma_kinds(ttgir: str) -> dict:
    """How the kernel's dots lowered, from its TTGIR: ``wgmma`` Hopper's warp-group MMAs
    (``ttng.warp_group_dot``, where the dot's M is a multiple of 64), ``mma_sync`` the dots left on
    the older warp-level MMA (``tt.dot`` on an ``nvidia_mma`` layout); ``tma`` the loads made TMA
    copies into shared memory (the plan's SWAP_TMA); ``calls`` the calls of functions not inlined (the
    sampling tiles, the weights-on-M tile with SWAP_CALL, attention's with ATTN_CALL)."""
    return {"wgmma": len(re.findall(r"ttng\.warp_group_dot ", ttgir)), "mma_sync": len(re.findall(r"= tt\.dot ", ttgir)),
            "tma": len(re.findall(r"ttng\.async_tma_copy_global_to_local ", ttgir)),
            "calls": len(re.findall(r"tt\.call @", ttgir))}


def _resources(k):
    """(registers per thread, stack bytes, spill loads, spill stores, R2URs) from the cubin, through
    the cuobjdump that Triton ships: the stack is a frame's size, the spills (the SASS's LDL and STL,
    counted where they stand in the code) say how much of it the code goes back to; an R2UR moves a
    value ptxas could not prove warp-uniform into a uniform register (a wgmma descriptor built in
    vector registers: the persistent kernel's ``uniform_tape``). Nones where it cannot be read."""
    import tempfile

    import triton
    try:
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
            sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
        regs = re.search(r"REG:(\d+)", out)
        stack = re.search(r"STACK:(\d+)", out)
        counts = [len(re.findall(rf"\b{op}\b", sass)) if sass else None for op in ("LDL", "STL", "R2UR")]
        return (int(regs.group(1)) if regs else None), (int(stack.group(1)) if stack else None), *counts
    except Exception:
        return None, None, None, None, None


def _assignments(items: list[str], flag: str) -> dict[str, int]:
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            out[name.strip()] = int(value)
        except ValueError:
            from .cli import UsageError
            raise UsageError(f"{flag} {item!r}: expected NAME=INTEGER") from None
    return out


def build_parser():
    from . import cli
    ap = cli.Parser(prog="python -m megakernel.compile_check", description=cli.description(__doc__),
                    epilog="example:\n  python -m megakernel.compile_check -m 0.6b --workers 264 --arch 90 --json")
    ap.add_argument("-m", "--model", default="0.6b",
                    help="size alias (0.6b 1.7b 4b 8b 14b 32b), its repo id, a checkpoint folder with a config.json, "
                         "or the demo shape tiny-random")
    ap.add_argument("--workers", type=cli.at_least(1), default=None,
                    help="worker programs of the persistent kernel (default: what the rules' layout runs on an "
                         "H100's or H200's 132 SMs, two an SM, or one of 8 warps where scheduler.ops.default_layout "
                         "says so)")
    ap.add_argument("--batch-size", type=cli.at_least(1), default=1, help="sequences decoded together")
    ap.add_argument("--max-seq-len", type=cli.at_least(2), default=4096, help="KV-cache positions per sequence")
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                    help="weight and KV-cache dtype")
    ap.add_argument("--quantize", choices=("fp8",), default=None,
                    help="fp8: the QKV, O, gate/up and down projections in block FP8 (the FP8 tiles)")
    ap.add_argument("--fp8-activations", choices=("dynamic", "none"), default=None,
                    help="with --quantize fp8: dynamic (w8a8) or none (weight-only); default as a run chooses it "
                         "(w8a8, but weight-only at --tp > 1)")
    ap.add_argument("--arch", type=cli.at_least(70), default=90,
                    help="CUDA compute capability: 90 for H100/H200, 80 for A100")
    ap.add_argument("--num-warps", type=int, choices=(1, 2, 4, 8, 16, 32), default=None,
                    help="warps per program (default: the rules' layout's, as --workers)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=N",
                    help="override a tile-plan field, e.g. --set R_GU=16 (repeatable)")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=N",
                    help="a backend option, e.g. --option workers_per_sm=1 (repeatable)")
    ap.add_argument("--tp", type=int, choices=(1, 2, 4, 8), default=1,
                    help="compile a rank's kernels of a tensor-parallel run of this degree")
    ap.add_argument("--json", action="store_true", help="print the report as JSON on the last stdout line")
    ap.add_argument("--verbose", action="store_true", help="print each failed compile's whole error chain")
    return ap


def check_args(args):
    """Everything that can be checked without Triton's compiler: the model's shapes, the plan
    fields and backend options named."""
    import dataclasses
    import inspect

    from models.qwen3.weights import shapes_for
    from scheduler.ops import Plan

    from models.qwen3.tp import check_tp, check_tp_fp8

    from .cli import UsageError
    cfg = shapes_for(args.model)
    try:
        (check_tp_fp8 if args.quantize else check_tp)(cfg, args.tp)
    except ValueError as e:
        raise UsageError(str(e)) from None
    args.overrides = _assignments(args.set, "--set")
    fields = {f.name for f in dataclasses.fields(Plan)}
    bad = sorted(set(args.overrides) - fields)
    if bad:
        raise UsageError(f"--set {bad[0]}: not a tile-plan field (one of {', '.join(sorted(fields))})")
    args.options = _assignments(args.option, "--option")
    if args.options:
        from megakernel import backends
        known = set(inspect.signature(backends.PersistentBackend.__init__).parameters) - {
            "self", "mk", "mode", "num_workers", "num_warps", "plan_overrides"}    # those have flags
        bad = sorted(set(args.options) - known)
        if bad:
            raise UsageError(f"--option {bad[0]}: not a backend option (one of {', '.join(sorted(known))})")


def _layout(args):
    """--workers and --num-warps where not given: the rules' layout on a GPU of an H100's (and
    H200's) SMs (``scheduler.ops.default_layout``), as a run with the rules' plan takes it."""
    from models.qwen3.weights import shapes_for
    from scheduler.ops import WORKERS_PER_SM, default_layout

    from .tape import H100_SMS
    warps, per_sm = 4, WORKERS_PER_SM
    if args.num_warps is None and args.workers is None:
        warps, per_sm = default_layout(shapes_for(args.model), args.batch_size, H100_SMS,
                                       bf16=args.dtype == "bfloat16", tp=args.tp, fp8=args.quantize == "fp8")
    args.num_warps = args.num_warps or warps
    args.workers = args.workers or H100_SMS * per_sm


def main(argv=None):
    from . import cli

    def body() -> int:
        args = build_parser().parse_args(argv)
        if os.environ.get("TRITON_INTERPRET") == "1":
            from models.qwen3.weights import shapes_for
            shapes_for(args.model)          # a bad name fails here, before the second process
            return _rerun_compiled(sys.argv[1:] if argv is None else list(argv))
        os.environ.setdefault("DEVICE", "cuda")
        check_args(args)
        _layout(args)
        report = compile_all(args.model, args.workers, args.batch_size, args.max_seq_len, args.arch,
                             dtype_name=args.dtype, tp=args.tp, quantize=args.quantize,
                             fp8_activations=args.fp8_activations, num_warps=args.num_warps,
                             plan_overrides=args.overrides, **args.options)
        import triton
        # which dots become wgmma depends on the version (3.6 lowers a dot of N = 8 to mma.sync)
        print(f"Triton {triton.__version__}, sm_{args.arch}")
        for r in report:
            if r["ok"]:
                print(f"{r['kernel']:<16} ok    warps {r['num_warps']}  shared {r['shared']}  regs {r['n_regs']}  "
                      f"stack {r['stack_bytes']} (spill ld/st {r['spill_loads']}/{r['spill_stores']})  R2UR {r['r2ur']}  "
                      f"dots: wgmma {r['wgmma']}, mma.sync {r['mma_sync']}  tma loads {r['tma']}  calls {r['calls']}")
            else:
                print(f"{r['kernel']:<16} FAIL  {r['error']}")
                if args.verbose:
                    print(r["detail"], file=sys.stderr)
        if args.json:
            print(json.dumps(report))
        return 0 if all(r["ok"] for r in report) else 1

    return cli.run(body)


def _rerun_compiled(argv: list[str]) -> int:
    """Run this tool again without TRITON_INTERPRET (read when kernels are defined, so it cannot be
    switched off in this process). On Ctrl-C the child prints the one line and this stays quiet."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["DEVICE"] = "cuda"    # only picks the import path: nothing runs on a device
    child = subprocess.Popen([sys.executable, "-m", "megakernel.compile_check", *argv], env=env)
    try:
        return child.wait()
    except KeyboardInterrupt:
        try:
            code = child.wait(timeout=10)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            child.kill()
            code = None
        if code == 130:
            return 130
        raise


if __name__ == "__main__":
    sys.exit(main())
