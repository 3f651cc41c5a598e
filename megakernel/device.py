"""Which device runs the model: CUDA, an Ascend NPU, or the CPU through Triton's interpreter.

``TRITON_INTERPRET`` is read when a ``@triton.jit`` function is *defined*, so the choice must be
made before any kernel module is imported; ``megakernel/__init__.py`` calls ``configure()`` first
thing. ``DEVICE=cpu|cuda|npu`` forces a choice.
"""

from __future__ import annotations

import os

import torch

_NPU_AVAILABLE: bool | None = None


def npu_available() -> bool:
    """True where torch_npu imports and sees a device. Importing torch_npu without the Ascend
    toolkit can fail in many ways, so any exception means no NPU."""
    global _NPU_AVAILABLE
    if _NPU_AVAILABLE is None:
        try:
            import torch_npu  # noqa: F401
            _NPU_AVAILABLE = bool(torch.npu.is_available())
        except Exception:
            _NPU_AVAILABLE = False
    return _NPU_AVAILABLE


def npu_vector_cores(device) -> int:
    """Vector cores of an Ascend NPU: the grid of a vector-only kernel maps onto them one program
    per core, so this is the persistent kernel's worker count. Read from triton-ascend's driver
    (the documented way), else from torch_npu's device properties."""
    index = torch.device(device).index or 0
    try:
        import triton.runtime.driver as driver
        return int(driver.active.utils.get_device_properties(index)["num_vectorcore"])
    except Exception:
        pass
    props = torch.npu.get_device_properties(index)
    cores = getattr(props, "vector_core_num", None)
    if not cores:
        raise RuntimeError("cannot read the NPU's vector core count (neither triton-ascend's driver nor "
                           "torch_npu's device properties give it)")
    return int(cores)


def default_device() -> str:
    forced = os.environ.get("DEVICE")
    if forced:
        if forced not in ("cpu", "cuda", "npu"):
            raise ValueError(f"DEVICE={forced!r}: use cpu, cuda or npu")
        return forced
    if torch.cuda.is_available():
        return "cuda"
    if npu_available():
        return "npu"
    return "cpu"


def configure() -> str:
    """Pick the default device and, for the CPU, switch Triton to its interpreter."""
    dev = default_device()
    if dev == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return dev


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve(device: str | torch.device | None) -> torch.device:
    name = str(device if device is not None else default_device())
    if name.split(":")[0] == "npu" and not npu_available():
        # checked before torch.device(): torch only knows the "npu" type once torch_npu is imported
        raise RuntimeError("device npu asked for, but torch_npu does not import or sees no NPU")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise RuntimeError(f"device {name!r} is not supported (use cpu, cuda or npu)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device cuda asked for, but torch sees no CUDA GPU")
    if dev.type == "npu" and not npu_available():
        raise RuntimeError("device npu asked for, but torch_npu does not import or sees no NPU")
    if dev.type not in ("cpu", "cuda", "npu"):
        raise RuntimeError(f"device {dev} is not supported (use cpu, cuda or npu)")
    return dev


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on an accelerator; float32 on the CPU, where the interpreter has no bf16 arithmetic."""
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def check_fits(device: torch.device, nbytes: int, what: str, margin: float = 1.05):
    """Raise a clear error before allocating ``nbytes`` for ``what`` on an accelerator that does
    not have them free (the CPU is not checked: the OS decides there)."""
    if device.type != "cuda":
        return
    from models.qwen3.prefill import cuda_memory     # (counts torch's reserved, unused memory as free)
    free, total = cuda_memory(device)
    if nbytes * margin > free:
        gib = 1024 ** 3
        raise MemoryError(f"{what} needs {nbytes / gib:.1f} GiB on {torch.cuda.get_device_name(device)}, which "
                          f"has {free / gib:.1f} GiB free of {total / gib:.1f} GiB; use a smaller model, "
                          f"batch or max_seq_len")


def check_fp8(device: torch.device):
    """Refuse FP8 weights, before anything is loaded, on a device whose kernels cannot read them:
    an Ascend NPU (triton-ascend documents no float8 type; docs/npu.md) or an NVIDIA GPU below
    compute capability 8.9 (Triton's float8e4nv conversions need Ada or Hopper)."""
    if device.type == "npu":
        raise RuntimeError("FP8 weights are not supported on the NPU: triton-ascend documents no float8 type "
                           "(docs/npu.md); load the model in bf16 there")
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            raise RuntimeError(f"FP8 weights need an NVIDIA GPU of compute capability 8.9 or above (Ada, Hopper); "
                               f"{torch.cuda.get_device_name(device)} is {major}.{minor}: load the model in bf16")
