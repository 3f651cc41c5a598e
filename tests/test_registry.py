"""The instruction-kind registry and the buffer spec hold together: every kind has its device half,
the persistent kernel dispatches exactly the registry's kinds, every kernel parameter is a buffer of
the spec, a plan field or a known scalar, and the layers import only downhill."""

import ast
from pathlib import Path

import pytest

import megakernel  # noqa: F401  (sets the interpreter up before any kernel is defined)
from instructions.registry import DEVICE_KINDS
from megakernel import buffers
from megakernel.buffers import BY_NAME, kernel_params
from models.qwen3.config import PRESETS
from scheduler.kinds import CONTROL, KINDS, Op
from scheduler.ops import make_plan

REPO = Path(__file__).resolve().parents[1]


def test_every_kind_has_its_device_half():
    assert sorted(DEVICE_KINDS) == sorted(Op[k.name] for k in KINDS)
    for op, dk in DEVICE_KINDS.items():
        assert dk.op == op and callable(dk.reference)


def _dispatched(fn_name: str) -> set[str]:
    """The OP_<NAME> constants that ``megakernel.kernel.<fn_name>`` compares the opcode with."""
    tree = ast.parse((REPO / "megakernel" / "kernel.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn_name)
    names = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "op":
            for c in node.comparators:
                if isinstance(c, ast.Name) and c.id.startswith("OP_"):
                    names.add(c.id[3:])
    return names


def test_kernel_dispatch_covers_exactly_the_registry():
    from megakernel import kernel
    dispatched = _dispatched("megakernel")
    assert dispatched == {k.name for k in KINDS} | {"BARRIER"}, \
        "megakernel/kernel.py's dispatch chain must have one branch per kind of scheduler.kinds"
    for name in dispatched:
        assert getattr(kernel, f"OP_{name}").value == int(Op[name])
    assert set(CONTROL) == {"NOOP", "BARRIER"}


@pytest.mark.parametrize("op", list(DEVICE_KINDS), ids=lambda op: op.name)
def test_kind_buffers_are_in_the_spec(op):
    """A kind's declared buffers exist in the spec, and its per-op kernel reads and writes only them:
    its parameters are those buffers, plan fields, ``layer`` and ``eps``."""
    dk = DEVICE_KINDS[op]
    assert set(dk.reads) | set(dk.writes) <= set(BY_NAME), "unknown buffer names"
    if dk.kernel is None:       # a host step between the per-op launches instead (REDUCE)
        assert callable(dk.host)
        return
    plan = make_plan(PRESETS["0.6b"], 1, 64, 8)
    for name, const in kernel_params(dk.kernel):
        if const:
            assert name in plan.constexprs(), f"{name}: a per-op kernel's constexprs are plan fields"
        elif name.endswith("_ptr"):
            assert name[:-4] in set(dk.reads) | set(dk.writes), f"{name} is not among the kind's buffers"
        else:
            assert name in ("layer", "eps"), name


def test_megakernel_parameters_are_the_spec():
    """The persistent kernel's pointers are the spec's buffers, every kind's among them; its other
    parameters are plan fields, backend options and the launch's scalars."""
    from megakernel.kernel import megakernel as mk_fn
    params = kernel_params(mk_fn)
    ptrs = {n[:-4] for n, c in params if not c and n.endswith("_ptr")}
    assert ptrs <= set(BY_NAME)
    assert set().union(*(set(k.reads) | set(k.writes) for k in DEVICE_KINDS.values())) <= ptrs
    assert ptrs == set(BY_NAME), f"spec buffers the kernel does not take: {set(BY_NAME) - ptrs}"
    plan = make_plan(PRESETS["8b"], 2, 392, 16)
    options = {"SPIN", "TRACE", "PREFETCH_TAPE", "SM_PAIRS", "UNIFORM_TAPE"}
    assert {n for n, c in params if c} == set(plan.constexprs()) | options
    assert {n for n, c in params if not c and not n.endswith("_ptr")} == {"eps", "max_len", "steps", "argmax_c",
                                                                          "argmax_n"}


def test_kernel_args_names_what_is_missing():
    from instructions.matvec import oproj_kernel
    st = buffers.StepBuffers({"attn": 1, "wo": 2}, eps=1e-6, rope_theta=1.0)
    with pytest.raises(KeyError, match="oproj_kernel: no value for its parameter 'x_ptr'"):
        buffers.kernel_args(oproj_kernel, st, make_plan(PRESETS["0.6b"], 1, 64, 8).constexprs(), layer=0)


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


@pytest.mark.parametrize("package,forbidden", [
    ("models", ("triton", "scheduler", "instructions", "megakernel")),
    ("scheduler", ("triton", "instructions", "megakernel")),
    ("instructions", ("megakernel",)),
])
def test_layers_import_downhill(package, forbidden):
    """models <- scheduler (no Triton) <- instructions <- the backends and the runtime (megakernel).
    One exception: the prefill's own elementwise kernels (models/qwen3/prefill_kernels.py) are
    Triton; they still import nothing of the scheduler, the instructions or the runtime."""
    bad = [(p.name, m) for p in (REPO / package).rglob("*.py") for m in _imports(p)
           if m.split(".")[0] in forbidden
           and not (p == REPO / "models/qwen3/prefill_kernels.py" and m.split(".")[0] == "triton")]
    assert not bad, bad


def test_no_import_circle_in_models():
    """Within models/qwen3 no two modules import each other, lazily or not (the TP shard is handed
    to the weights' loaders, which call its methods instead of importing models/qwen3/tp.py)."""
    pkg = REPO / "models" / "qwen3"
    deps = {}
    for p in pkg.glob("*.py"):
        mods = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                mods |= {node.module} if node.module else {a.name for a in node.names}
        deps[p.stem] = mods
    circles = sorted((a, b) for a in deps for b in deps[a] if a < b and a in deps.get(b, ()))
    assert not circles, circles
