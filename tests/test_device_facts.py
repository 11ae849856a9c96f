"""mllm_kernel.cuda.device_facts on the CPU: torch's device queries replaced by fakes
that count their calls, so the memo (one property read per GPU index, shared by every
op), the errors for a bad index and the Hopper admission are checked without a GPU."""

from __future__ import annotations

import importlib
import logging
from types import SimpleNamespace

import pytest
import torch

from mllm_kernel.cuda import device_facts as facts_module
from mllm_kernel.cuda.device_facts import (
    DeviceFacts,
    device_facts,
    matmul_path,
    require_hopper,
)
from mllm_kernel.jit_utils.cuda_driver import GpuUnavailableError
from mllm_kernel.jit_utils.logging_setup import get_logger

# By module path: mllm_kernel.cuda.jit's attributes gemm and int8_scaled_mm are the ops.
gemm_module = importlib.import_module("mllm_kernel.cuda.jit.gemm")
int8_module = importlib.import_module("mllm_kernel.cuda.jit.int8_scaled_mm")
gptq_marlin_module = importlib.import_module("mllm_kernel.cuda.jit.gptq_marlin")

H100 = SimpleNamespace(name="NVIDIA H100", major=9, minor=0, multi_processor_count=132)
A100 = SimpleNamespace(name="NVIDIA A100", major=8, minor=0, multi_processor_count=108)


@pytest.fixture
def gpus(monkeypatch):
    """Two fake GPUs, cuda:0 an H100 and cuda:1 an A100, and nothing remembered of
    either; returns the list of indices get_device_properties was asked for."""
    asked: list[int] = []
    props = [H100, A100]

    def get_device_properties(index):
        asked.append(index)
        return props[index]

    monkeypatch.setattr(facts_module, "_facts", {})
    monkeypatch.setattr(facts_module, "_sm90a_ready", set())
    monkeypatch.setattr(facts_module, "_matmul_paths", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(props))
    monkeypatch.setattr(torch.cuda, "get_device_properties", get_device_properties)
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "8.0;9.0a")
    return asked


def test_facts_are_read_once_per_index(gpus):
    assert device_facts(0) == DeviceFacts(0, "NVIDIA H100", (9, 0), 132)
    assert device_facts(1) == DeviceFacts(1, "NVIDIA A100", (8, 0), 108)
    for _ in range(3):
        assert device_facts(0).sm_count == 132
        assert device_facts(1).capability == (8, 0)
    assert gpus == [0, 1]


def test_every_op_reads_the_same_facts(gpus, monkeypatch):
    """gemm, int8_scaled_mm and gptq_marlin_gemm plan from one read of the GPU."""
    monkeypatch.setattr(gemm_module, "_plans", {})
    monkeypatch.setattr(int8_module, "_plans", {})
    monkeypatch.setattr(gptq_marlin_module, "_devices", {})
    gemm_module._plan(4096, 4096, 4096, 0)
    int8_module._plan(16, 4096, 4096, 0)
    assert gptq_marlin_module._device_facts(0) == (132, True, True)
    assert gptq_marlin_module._device_facts(1) == (108, False, False)
    assert gpus == [0, 1]


@pytest.mark.parametrize(
    "index, error, message",
    [
        (2, ValueError, r"^no GPU has index 2: torch sees 2 \(cuda:0 to cuda:1"),
        (-1, ValueError, r"^no GPU has index -1: torch sees 2 "),
        ("0", TypeError, r"^device index must be an int \(0 for cuda:0\), got '0'"),
        (True, TypeError, r"^device index must be an int \(0 for cuda:0\), got True"),
    ],
)
def test_a_bad_index_is_refused_before_torch_is_asked(gpus, index, error, message):
    with pytest.raises(error, match=message):
        device_facts(index)
    assert gpus == [] and facts_module._facts == {}


def test_the_error_names_cuda_visible_devices_when_it_is_set(gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with pytest.raises(ValueError, match=r"cuda:1, CUDA_VISIBLE_DEVICES='3,5'\)"):
        device_facts(2)


def test_no_gpu_is_a_gpu_unavailable_error(gpus, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(GpuUnavailableError, match=r"^device_facts needs "):
        device_facts(0)
    assert gpus == []


def test_require_hopper_names_the_op_and_the_gpu(gpus):
    assert require_hopper(0, "gemm").sm_count == 132
    with pytest.raises(
        NotImplementedError,
        match=r"^int8_scaled_mm needs a GPU of compute capability 9\.0 \(Hopper: H100, H200; "
        r"it uses TMA and wgmma\); cuda:1 has compute capability 8\.0$",
    ):
        require_hopper(1, "int8_scaled_mm")


def test_require_hopper_needs_sm90a_code(gpus, monkeypatch):
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "9.0")
    with pytest.raises(NotImplementedError, match=r"^gemm needs code built for sm_90a .*9\.0a"):
        require_hopper(0, "gemm")
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "9.0a")
    assert require_hopper(0, "gemm").index == 0


def test_require_hopper_checks_the_build_once_and_the_gpu_every_call(gpus, monkeypatch):
    """The arch list is resolved once per index (it is off the hot path after that);
    the capability comes from the memo on every call, so replacing a GPU's facts (as
    the GPU tests do to stand for another GPU) is refused at once."""
    resolved: list[int] = []
    real = facts_module.resolve_cuda_archs
    monkeypatch.setattr(
        facts_module, "resolve_cuda_archs", lambda index: resolved.append(index) or real(index)
    )
    for _ in range(3):
        require_hopper(0, "gemm")
    assert resolved == [0]
    monkeypatch.setitem(facts_module._facts, 0, DeviceFacts(0, "NVIDIA A100", (8, 0), 108))
    with pytest.raises(NotImplementedError, match=r"cuda:0 has compute capability 8\.0"):
        require_hopper(0, "gemm")


def test_matmul_path_is_wgmma_on_sm90_with_sm90a_code_and_sm80_elsewhere(gpus, monkeypatch):
    assert matmul_path(0, "gemm").wgmma is True
    assert matmul_path(1, "gemm") == facts_module.MatmulPath(device_facts(1), wgmma=False)
    # Decided once per index: the hot path reads a dict.
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "8.0+PTX")
    assert matmul_path(0, "gemm").wgmma is True
    # Without sm_90a code (the tests' switch: compute_80 PTX) an H100 runs the sm_80 kernels.
    monkeypatch.setattr(facts_module, "_matmul_paths", {})
    assert matmul_path(0, "int8_scaled_mm").wgmma is False
    monkeypatch.setattr(facts_module, "_matmul_paths", {})
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "9.0")
    assert matmul_path(0, "gemm").wgmma is False


@pytest.mark.parametrize(
    ("name", "major", "minor", "sms"),
    [("RTX 4090", 8, 9, 128), ("Jetson Orin", 8, 7, 16), ("B200", 10, 0, 148)],
)
def test_the_ops_plan_sm80_tiles_on_gpus_without_wgmma(gpus, monkeypatch, name, major, minor, sms):
    from mllm_kernel.cuda.jit.gemm_sm80 import bind_gemm, bind_int8_scaled_mm, choose_sm80_tile

    props = SimpleNamespace(name=name, major=major, minor=minor, multi_processor_count=sms)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", f"{major}.{minor}")
    monkeypatch.setattr(gemm_module, "_plans", {})
    monkeypatch.setattr(int8_module, "_plans", {})
    plan = gemm_module._plan(16, 4096, 4096, 0)
    assert plan == (bind_gemm, choose_sm80_tile(16, 4096, 4096, sms))
    plan = int8_module._plan(1024, 4096, 4096, 0)
    assert plan == (bind_int8_scaled_mm, choose_sm80_tile(1024, 4096, 4096, sms, 1))


def test_a_gemm_plans_and_looks_its_kernel_up_once_per_shape_dtype_and_gpu(gpus, monkeypatch):
    """run_gemm plans a shape on its first call for its dtype and GPU and keeps the launch,
    the kernel looked up: later calls pay one dictionary lookup, and another dtype (another
    kernel module) is planned apart. Operands are stand-ins (a GPU index, no memory): the
    kernels are fakes that record their arguments."""
    monkeypatch.setattr(gemm_module, "_plans", {})
    planned: list[tuple] = []
    real_plan = gemm_module._plan
    monkeypatch.setattr(
        gemm_module, "_plan", lambda *shape: planned.append(shape) or real_plan(*shape)
    )
    launched: list[tuple] = []
    choice = gemm_module.choose_tile(16, 4096, 4096, H100.multi_processor_count)
    for dtype in (torch.bfloat16, torch.float16):
        kernel = SimpleNamespace(gemm=lambda *args, dtype=dtype: launched.append((dtype, *args)))
        monkeypatch.setitem(gemm_module._GEMM, (0, dtype, *choice.tile.shape_args), kernel)

    def operand(shape, dtype):
        return SimpleNamespace(shape=shape, dtype=dtype, get_device=lambda: 0)

    b = operand((4096, 4096), torch.bfloat16)
    a, out = operand((16, 4096), torch.bfloat16), operand((16, 4096), torch.float32)
    assert gemm_module.run_gemm(a, b, out) is out
    assert gemm_module.run_gemm(a, b, out, None, torch.bfloat16) is out
    a16 = operand((16, 4096), torch.float16)
    gemm_module.run_gemm(a16, b, out)
    assert planned == [(16, 4096, 4096, 0), (16, 4096, 4096, 0)]
    tail = (choice.split, choice.group_rows)
    assert launched == [
        (torch.bfloat16, out, a, b, None, torch.float32, *tail),
        (torch.bfloat16, out, a, b, None, torch.bfloat16, *tail),
        (torch.float16, out, a16, b, None, torch.float32, *tail),
    ]
    assert gemm_module._plans.keys() == {
        (16, 4096, 4096, 0, torch.bfloat16),
        (16, 4096, 4096, 0, torch.float16),
    }


def test_the_ops_refuse_gpus_before_sm80_naming_op_gpu_and_archs(gpus, monkeypatch):
    turing = SimpleNamespace(name="Tesla T4", major=7, minor=5, multi_processor_count=40)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: turing)
    monkeypatch.setattr(int8_module, "_plans", {})
    with pytest.raises(
        NotImplementedError,
        match=r"^int8_scaled_mm runs on sm_80 and newer \(it uses mma.sync, ldmatrix and "
        r"cp.async; the wgmma kernels on sm_90a only\); cuda:0 \(Tesla T4\) is sm_75 "
        r"\(compute capability 7\.5\)$",
    ):
        int8_module._plan(16, 4096, 4096, 0)
    assert int8_module._plans == {}


@pytest.fixture
def logged():
    """The records of the ``mllm_kernel`` logger during the test, at INFO and above
    (through a handler of its own: what caplog sees of a logger that does not propagate
    differs between pytest versions)."""
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record)

    logger, handler = get_logger(), Collect()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_an_sm90_gpu_without_sm90a_code_says_once_that_it_runs_the_sm80_kernels(
    gpus, monkeypatch, logged
):
    """Not silent: an H100 that runs the sm_80 kernels because the arch list has no
    sm_90a code says so at INFO, once for that GPU (every op, every call after reads the
    decision); an A100, whose own kernels they are, and an H100 with sm_90a code say
    nothing."""
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "8.0+PTX")
    for op in ("gemm", "int8_scaled_mm", "gemm"):
        assert matmul_path(0, op).wgmma is False
    assert matmul_path(1, "gemm").wgmma is False
    assert [(r.levelno, r.getMessage()) for r in logged] == [
        (
            logging.INFO,
            "cuda:0 (NVIDIA H100) is sm_90 but the archs built for (8.0+PTX, from "
            "$MLLM_KERNEL_CUDA_ARCH_LIST) have no sm_90a code: gemm and int8_scaled_mm run "
            "their sm_80 kernels (mma.sync) there, not the wgmma ones; add 9.0a to the arch "
            "list to run those",
        )
    ]
    logged.clear()
    monkeypatch.setattr(facts_module, "_matmul_paths", {})
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "8.0;9.0a")
    assert matmul_path(0, "gemm").wgmma is True
    assert logged == []
