"""Device selection: CUDA, an Ascend NPU where torch_npu imports, else the CPU and the interpreter."""

import sys
import types

import pytest
import torch

from megakernel import device


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(device, "_NPU_AVAILABLE", None)
    monkeypatch.delenv("DEVICE", raising=False)
    return monkeypatch


def test_torch_npu_that_fails_to_import_means_no_npu(fresh):
    class Broken(types.ModuleType):
        def __getattr__(self, name):
            raise OSError("libascendcl.so: cannot open shared object file")
    fresh.setitem(sys.modules, "torch_npu", None)          # import raises ImportError
    assert device.npu_available() is False
    fresh.setattr(device, "_NPU_AVAILABLE", None)
    fresh.setitem(sys.modules, "torch_npu", Broken("torch_npu"))
    fresh.setattr(torch, "npu", Broken("npu"), raising=False)   # any exception, not only ImportError
    assert device.npu_available() is False


def test_npu_selected_where_torch_npu_works(fresh):
    fake = types.SimpleNamespace(is_available=lambda: True)
    fresh.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    fresh.setattr(torch, "npu", fake, raising=False)
    fresh.setattr(torch.cuda, "is_available", lambda: False)
    assert device.default_device() == "npu"


def test_cpu_fallback_and_forced_device(fresh):
    fresh.setattr(device, "_NPU_AVAILABLE", False)
    fresh.setattr(torch.cuda, "is_available", lambda: False)
    assert device.default_device() == "cpu"
    fresh.setenv("DEVICE", "npu")
    assert device.default_device() == "npu"
    with pytest.raises(RuntimeError, match="torch_npu does not import"):
        device.resolve("npu")
    fresh.setenv("DEVICE", "tpu")
    with pytest.raises(ValueError, match="DEVICE='tpu'"):
        device.default_device()


def test_cuda_asked_for_without_cuda(fresh):
    fresh.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        device.resolve("cuda")


def test_npu_worker_count_from_core_counts(fresh):
    """The persistent grid on an NPU is its vector-core count (read, never hard-coded)."""
    fresh.setattr(torch, "npu", types.SimpleNamespace(
        get_device_properties=lambda i: types.SimpleNamespace(vector_core_num=40)), raising=False)
    assert device.npu_vector_cores("cpu") == 40     # community Triton has no Ascend driver: torch_npu's count
    fresh.setattr(torch, "npu", types.SimpleNamespace(
        get_device_properties=lambda i: types.SimpleNamespace(vector_core_num=None)), raising=False)
    with pytest.raises(RuntimeError, match="vector core count"):
        device.npu_vector_cores("cpu")


def test_cpu_is_interpreted_and_float32_by_default():
    if torch.cuda.is_available():
        pytest.skip("CPU machines only")
    assert device.interpreted()
    assert device.default_dtype(torch.device("cpu")) == torch.float32
    assert device.default_dtype(torch.device("cuda")) == torch.bfloat16


def test_fit_check_counts_what_torchs_allocator_holds_unused(monkeypatch):
    """Memory torch's caching allocator reserved for tensors since freed (a peer's activations, an
    earlier setting's cache) is free to the next allocation: the check must not refuse it."""
    gib = 1024 ** 3
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "GPU")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (1 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 30 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 20 * gib)
    cuda = torch.device("cuda", 0)
    device.check_fits(cuda, 8 * gib, "a KV cache")          # 1 GiB free + 10 reserved unused
    with pytest.raises(MemoryError, match=r"a KV cache needs 12.0 GiB on GPU, which has 11.0 GiB free"):
        device.check_fits(cuda, 12 * gib, "a KV cache")
