"""Every registered CUDA kernel variant compiles and links for sm_90a, and every CUDA
module also for sm_80, which has no thread-block clusters (no GPU needed). Kernels
built on Hopper's matrix instructions must show them in their SASS."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from mllm_kernel.jit_utils import cuda_arch_override, registry
from mllm_kernel.jit_utils.build import build

# Kernel name -> the SASS instruction every variant must contain (HGMMA / IGMMA: the
# 16-bit / int8 wgmma ran through; a kernel on the slower mma.sync path would show only
# HMMA / IMMA).
EXPECTED_SASS = {"gemm": "HGMMA", "int8_scaled_mm": "IGMMA"}


def _cuda_binary(name: str) -> Path | None:
    """``name`` (cuobjdump, nvdisasm) from the toolkit, PATH, or the nvidia-cuda-* wheels."""
    from mllm_kernel.jit_utils import toolchain
    from mllm_kernel.jit_utils.errors import ToolchainError

    candidates = []
    with contextlib.suppress(ToolchainError):
        candidates.append(toolchain.find_cuda().nvcc.path.parent / name)
    if shutil.which(name):
        candidates.append(Path(shutil.which(name)))
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec else ():
        candidates += sorted(Path(root).glob(f"cu*/bin/{name}"))
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def _sass(artifact: Path) -> str:
    cuobjdump, nvdisasm = _cuda_binary("cuobjdump"), _cuda_binary("nvdisasm")
    if cuobjdump is None or nvdisasm is None:
        pytest.fail("cuobjdump/nvdisasm not found: install the dev extra (nvidia-cuda-cuobjdump)")
    env = {**os.environ, "PATH": f"{nvdisasm.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        [str(cuobjdump), "-sass", str(artifact)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


CUDA_VARIANTS = [
    pytest.param(entry, variant, id=f"{entry.name}-{'-'.join(map(str, variant)) or 'all'}")
    for entry in registry.kernels("cuda")
    for variant in entry.variants
]


def _build_all(arch: str, jobs: list[tuple[Any, tuple[Any, ...]]], root: Path) -> dict:
    """Builds every (entry, variant) of ``jobs`` for ``arch`` into ``root``, as many at
    once as there are cores (nvcc is single-threaded: CI's 2 cores halve the wall time
    of this file), and maps each job to its build result or the exception it raised."""
    with cuda_arch_override(arch):
        specs = [entry.plan(variant) for entry, variant in jobs]

    def run(index):
        spec, where = specs[index], root / str(index)
        where.mkdir(parents=True)
        started = time.monotonic()
        try:
            result = build(spec, where, where / "build.log")
        except Exception as error:  # reported by the job's own test
            return spec, error
        print(f"{spec.describe()}: {time.monotonic() - started:.1f}s")
        return spec, result

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        outcomes = pool.map(run, range(len(jobs)))
        return {(e.name, v): outcome for (e, v), outcome in zip(jobs, outcomes, strict=True)}


@pytest.fixture(scope="module")
def sm90a_builds(tmp_path_factory):
    jobs = [tuple(param.values) for param in CUDA_VARIANTS]
    return _build_all("9.0a", jobs, tmp_path_factory.mktemp("sm90a"))


@pytest.fixture(scope="module")
def sm80_builds(tmp_path_factory):
    jobs = [tuple(param.values) for param in SM80_VARIANTS]
    return _build_all("8.0", jobs, tmp_path_factory.mktemp("sm80"))


def _outcome(builds: dict, entry: Any, variant: tuple[Any, ...]):
    spec, outcome = builds[(entry.name, variant)]
    if isinstance(outcome, Exception):
        raise outcome
    return spec, outcome


@pytest.mark.nvcc
@pytest.mark.parametrize(("entry", "variant"), CUDA_VARIANTS)
def test_compiles_for_sm90a(entry, variant, sm90a_builds):
    spec, result = _outcome(sm90a_builds, entry, variant)
    assert [str(a) for a in spec.cuda_archs] == ["9.0a"]
    assert result.artifact.is_file()
    instruction = EXPECTED_SASS.get(entry.name)
    if instruction:
        assert re.search(rf"\b{instruction}\.", _sass(result.artifact)), (
            f"{spec.describe()}: no {instruction} in the SASS"
        )


SM80_VARIANTS = [pytest.param(e, e.variants[0], id=e.name) for e in registry.kernels("cuda")]


@pytest.mark.nvcc
@pytest.mark.parametrize(("entry", "variant"), SM80_VARIANTS)
def test_compiles_for_sm80(entry, variant, sm80_builds):
    spec, result = _outcome(sm80_builds, entry, variant)
    assert [str(a) for a in spec.cuda_archs] == ["8.0"]
    assert result.artifact.is_file()


def test_every_op_module_registers_a_variant():
    names = {entry.name for entry in registry.kernels("cuda")}
    assert {
        "rmsnorm",
        "activation",
        "rope",
        "softmax",
        "store_cache",
        "create_kv_indices",
        "add_constant",
        "add_constant_runtime",
        "gemm",
        "int8_scaled_mm",
        "per_token_quant",
    } <= names
