"""Lower every kernel through triton-ascend's front end to its Linalg stage, without an NPU.

triton-ascend's compiler runs on x86 without the Ascend toolkit (CANN) up to its Linalg stage
(``ttir_to_linalg`` through the bundled ``triton-adapter-opt``); only the last step to an NPU
binary needs CANN. This script records the exact launches of every kernel backend (on ``meta``
tensors, as ``megakernel.compile_check`` does), lowers each kernel for an Ascend target, and
compares the outcome with ``tests/npu_lowering_expected.json``: it fails when a kernel that lowered
before stops lowering, and says which kernels lower and which do not (with the compiler's reason).

It needs triton-ascend in a virtual environment of its own (it replaces community Triton's
``triton`` package), with torch:

    python3 -m venv .venv-ascend
    .venv-ascend/bin/pip install torch==2.13.0 triton-ascend==3.2.0 pybind11 numpy safetensors tqdm \
        huggingface_hub tokenizers --no-deps
    .venv-ascend/bin/python tests/npu_lowering.py [--write]

``--write`` records the current outcome as the new expectation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXPECTED = REPO / "tests" / "npu_lowering_expected.json"


def lower_all(arch: str, model: str, workers: int, max_seq_len: int) -> dict[str, dict]:
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["DEVICE"] = "npu"                     # only picks the import path; nothing runs
    os.environ.setdefault("TRITON_ASCEND_ARCH", arch)
    sys.path.insert(0, str(REPO))
    import torch
    from triton.backends.ascend.compiler import AscendBackend
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource
    from triton._C.libtriton import ir

    from megakernel.buffers import kernel_params
    from megakernel.compile_check import _type, record_launches

    backend = AscendBackend(GPUTarget("npu", arch, 0))
    out: dict[str, dict] = {}
    for fn, kwargs, _ in record_launches(model, workers, 1, max_seq_len, torch.bfloat16, prefetch_tape=False,
                                        uniform_tape=False):
        params = kernel_params(fn)
        consts = {name: kwargs[name] for name, const in params if const}
        sig = {name: ("constexpr" if const else _type(kwargs[name])) for name, const in params}
        name = fn.__name__
        if name in out and out[name]["lowers"]:
            continue
        opts = backend.parse_options({})
        md = dict(opts.__dict__)
        md.update(target=backend.target, hash="npu-lowering-check")
        try:
            ctx = ir.context()
            ir.load_dialects(ctx)
            backend.load_dialects(ctx)
            src = ASTSource(fn, sig, consts)
            mod = src.make_ir(opts, backend.get_codegen_implementation(), backend.get_module_map(), ctx)
            from triton.backends.ascend.compiler import make_ttir, ttir_to_linalg
            ttir = make_ttir(mod, md, opts)
            linalg = ttir_to_linalg(ttir, md, opts, named_ops=True)
            mix = "mix" if "linalg.matmul" in linalg else "aiv"
            out[name] = {"lowers": True, "mode": mix}
        except Exception as e:  # the front end's or the adapter's own error, kept for the report
            msg = getattr(e, "stderr", None)
            msg = msg.decode(errors="replace") if isinstance(msg, bytes) else str(e)
            lines = [line for line in msg.splitlines() if line.strip()]
            out[name] = {"lowers": False, "reason": " | ".join(lines[-3:])[:500]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="Ascend910B2")
    ap.add_argument("--model", default="0.6b")
    ap.add_argument("--workers", type=int, default=48, help="vector cores of an Ascend910B2")
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--write", action="store_true", help="record this outcome as the expectation")
    args = ap.parse_args(argv)
    try:
        import triton.backends.ascend  # noqa: F401
    except ImportError:
        print("error: triton-ascend is not installed in this environment (see this file's docstring)",
              file=sys.stderr)
        return 2
    result = lower_all(args.arch, args.model, args.workers, args.max_seq_len)
    for name, r in result.items():
        print(f"{name:<16} {'lowers (' + r['mode'] + ')' if r['lowers'] else 'DOES NOT LOWER: ' + r['reason']}")
    if args.write:
        EXPECTED.write_text(json.dumps({k: v["lowers"] for k, v in result.items()}, indent=1) + "\n")
        print(f"expectation written to {EXPECTED}")
        return 0
    expected = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}
    regressed = [k for k, ok in expected.items() if ok and not result.get(k, {}).get("lowers")]
    if regressed:
        print(f"FAILED: lowered before, not now: {', '.join(regressed)}")
        return 1
    print(f"{sum(r['lowers'] for r in result.values())} of {len(result)} kernels lower; none regressed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
