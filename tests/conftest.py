"""Shared fixtures: an isolated cache per test session, and the cuda / nvcc /
compile_grid markers."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

import mllm_kernel


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _has_nvcc() -> bool:
    from mllm_kernel.jit_utils import toolchain
    from mllm_kernel.jit_utils.errors import ToolchainError

    try:
        toolchain.find_cuda()
    except ToolchainError:
        return False
    return True


HAS_GPU = _has_gpu()
HAS_NVCC = _has_nvcc()
# The long compile grid (every CUDA kernel variant through nvcc) runs on request: CI
# sets it; the README's test command stays a few minutes on two cores without it.
COMPILE_GRID = os.environ.get("MLLM_KERNEL_TEST_COMPILE_GRID", "") == "1"


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none visible)")
    skip_nvcc = pytest.mark.skip(reason="needs the CUDA toolkit (nvcc not found)")
    skip_grid = pytest.mark.skip(
        reason="the CUDA compile grid: set MLLM_KERNEL_TEST_COMPILE_GRID=1 to run it"
    )
    for item in items:
        if "compile_grid" in item.keywords and not COMPILE_GRID:
            item.add_marker(skip_grid)
        if "cuda" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
        if "nvcc" in item.keywords and not HAS_NVCC:
            item.add_marker(skip_nvcc)


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory, request):
    """Every test run builds into its own cache unless one is given. The workers of a
    parallel run (pytest-xdist) share it, as processes share a real cache (locked,
    installed atomically): each kernel is built once per run, not once per worker."""
    if os.environ.get("MLLM_KERNEL_TEST_KEEP_CACHE"):
        yield
        return
    worker = hasattr(request.config, "workerinput")  # set in pytest-xdist's workers
    if not worker:
        root = tmp_path_factory.mktemp("mllm_kernel_cache")
    else:  # the workers' temporary directories share this parent, unique to the run
        root = tmp_path_factory.getbasetemp().parent / "mllm_kernel_cache"
    previous = os.environ.get("MLLM_KERNEL_CACHE_DIR")
    os.environ["MLLM_KERNEL_CACHE_DIR"] = str(root)
    yield
    if previous is None:
        os.environ.pop("MLLM_KERNEL_CACHE_DIR", None)
    else:
        os.environ["MLLM_KERNEL_CACHE_DIR"] = previous
    if not worker:  # a worker's may still be in use by another worker
        shutil.rmtree(root, ignore_errors=True)


# The package a child process imports: this checkout's, ahead of what PYTHONPATH holds
# already (on the GPU machine, tvm-ffi's wheels in /tmp/site).
PACKAGE_PARENT = str(Path(mllm_kernel.__file__).resolve().parents[1])
CHILD_PYTHONPATH = os.pathsep.join(p for p in (PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p)


def child_env(**variables: str) -> dict[str, str]:
    """The environment of a child Python process that imports this package: ours, with
    :data:`CHILD_PYTHONPATH` and ``variables``."""
    return {**os.environ, "PYTHONPATH": CHILD_PYTHONPATH, **variables}


def write_script(path: Path, text: str) -> Path:
    """An executable file (mode 0755) holding ``text``, with its parent directories: a
    stand-in compiler, wrapper or tool."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def run_host_program(directory: Path, source: str) -> str:
    """Builds ``source``, a host program that includes the package's headers (compiled
    for sm_90a, so that every kernel header parses), with nvcc in ``directory``, runs it
    and returns what it printed: how the nvcc tests read the C++ side's constants."""
    import subprocess

    from mllm_kernel.jit_utils import paths, toolchain

    source_path, program = directory / "facts.cu", directory / "facts"
    source_path.write_text(source)
    nvcc = toolchain.find_cuda().nvcc.path
    includes = [f"-I{d}" for d in (paths.include_dir(), *paths.tvm_ffi_include_dirs())]
    command = [str(nvcc), "-std=c++20", "-arch=sm_90a", *includes, "-o", str(program)]
    build = subprocess.run([*command, str(source_path)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    return subprocess.run([str(program)], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def reset_toolchain():
    """Forgets the compilers found before and after the test (PATH / CXX changes)."""
    from mllm_kernel.jit_utils import toolchain

    toolchain.reset()
    yield
    toolchain.reset()


# A one-function CPU module for tests of the JIT core: small, so that it builds fast.
OK_SOURCE = "namespace ok { template <int K> int f() { return K; } }\n"


@pytest.fixture
def ok_source(tmp_path):
    """``OK_SOURCE`` written to ``tmp_path / "ok.cpp"``."""
    source = tmp_path / "ok.cpp"
    source.write_text(OK_SOURCE)
    return source


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A private, empty cache root for one test."""
    root = tmp_path / "cache"
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", str(root))
    return root


@pytest.fixture
def warnings_logged():
    """The mllm_kernel logger's WARNING records during the test, as text."""
    from mllm_kernel.jit_utils.logging_setup import get_logger

    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                records.append(record.getMessage())

    handler = Collect()
    logger = get_logger()
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


# The arch list that makes the GEMMs run their sm_80 kernels on any GPU from sm_80 on:
# compute_80 PTX, which the driver compiles for the GPU (an H100 runs the Ampere path).
SM80_PATH_ARCH_LIST = "8.0+PTX"


def force_sm80_path(monkeypatch) -> None:
    """Until the test ends, ``gemm`` and ``int8_scaled_mm`` run their sm_80 kernels
    (built as compute_80 PTX) whatever the GPU: the arch list has no sm_90a code, so
    ``device_facts.matmul_path`` picks them, and the choices made before are forgotten."""
    import importlib

    facts = importlib.import_module("mllm_kernel.cuda.device_facts")
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", SM80_PATH_ARCH_LIST)
    monkeypatch.setattr(facts, "_matmul_paths", {})
    for name in ("gemm", "int8_scaled_mm"):
        monkeypatch.setattr(importlib.import_module(f"mllm_kernel.cuda.jit.{name}"), "_plans", {})


@pytest.fixture(params=["wgmma", "sm80"])
def gemm_path(request, monkeypatch):
    """Runs a GEMM test through each of the GEMMs' kernels: ``wgmma`` (an sm_90 GPU
    with sm_90a code: skipped elsewhere) and ``sm80`` (mma.sync as compute_80 PTX, on
    any GPU from sm_80 on: on an H100 the Ampere path, JIT-compiled by the driver)."""
    import torch

    capability = torch.cuda.get_device_capability() if HAS_GPU else (0, 0)
    if request.param == "wgmma":
        if capability != (9, 0):
            pytest.skip("the wgmma kernels need an sm_90 GPU (H100/H200)")
    else:
        if capability < (8, 0):
            pytest.skip("the sm_80 kernels need a GPU of compute capability 8.0 or newer")
        force_sm80_path(monkeypatch)
    return request.param
