"""Every registered CUDA kernel variant compiles and links for sm_90a and for sm_80,
which has no thread-block clusters (no GPU needed), where the kernel runs there. Kernels
built on Hopper's matrix instructions must show them in their SASS."""

from __future__ import annotations

import contextlib
import dataclasses
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
from mllm_kernel.jit_utils.cuda_arch import parse_arch_list
from mllm_kernel.jit_utils.spec import BuildSpec, Wrapper

# Kernel name -> the SASS instruction every variant must contain (HGMMA / IGMMA: the
# 16-bit / int8 wgmma ran through; a kernel on the slower mma.sync path would show only
# HMMA / IMMA).
EXPECTED_SASS = {
    "gemm": "HGMMA",
    "int8_scaled_mm": "IGMMA",
    "gptq_marlin_gemm_wgmma": "HGMMA",
    # The sm_80 path of the same ops: mma.sync's 16-bit and int8 instructions.
    "gemm_sm80": "HMMA",
    "int8_scaled_mm_sm80": "IMMA",
    "gdn_extend": "HMMA",  # the chunk's products on mma.sync
}


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


CUDA_KERNELS = [pytest.param(entry, id=entry.name) for entry in registry.kernels("cuda")]


def _every_variant(entry: Any) -> BuildSpec:
    """One module holding every variant of ``entry``, for sm_90a and sm_80 at once: each
    variant's exports renamed ``<export>_<i>``. A build pays ~9 s of host compilation
    (the tvm-ffi headers) whatever the kernel, so one build per kernel instead of one
    per variant and arch keeps this file within CI's time on 2 cores; every variant's
    device code is still compiled and assembled for both archs."""
    with cuda_arch_override("9.0a,8.0"):
        specs = [entry.spec(variant) for variant in entry.variants]
    first = specs[0]
    for spec in specs[1:]:  # what may differ between variants: their template arguments
        same_args = {"template_args": (), "cuda_wrappers": first.cuda_wrappers}
        assert dataclasses.replace(spec, **same_args) == dataclasses.replace(first, **same_args), (
            f"{entry.name}: variants differ beyond their template arguments"
        )
    wrappers = tuple(
        Wrapper(f"{w.export_name}_{i}", w.expression)
        for i, spec in enumerate(specs)
        for w in spec.cuda_wrappers
    )
    return dataclasses.replace(first, template_args=("every_variant",), cuda_wrappers=wrappers)


@pytest.fixture(scope="module")
def every_kernel_built(tmp_path_factory):
    """Every CUDA kernel's all-variants module, built as many at once as there are cores
    (nvcc is single-threaded); maps a kernel name to (spec, result or the exception)."""
    entries = [param.values[0] for param in CUDA_KERNELS]
    root = tmp_path_factory.mktemp("every_variant")

    def run(index: int):
        spec = _every_variant(entries[index])
        where = root / str(index)
        where.mkdir()
        started = time.monotonic()
        try:
            result = build(spec, where, where / "build.log")
        except Exception as error:  # reported by the kernel's own test
            return spec, error
        print(f"{entries[index].name}: {len(entries[index].variants)} variants in "
              f"{time.monotonic() - started:.1f}s")  # fmt: skip
        return spec, result

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        outcomes = list(pool.map(run, range(len(entries))))
    return {entry.name: outcome for entry, outcome in zip(entries, outcomes, strict=True)}


@pytest.mark.nvcc
@pytest.mark.compile_grid
@pytest.mark.parametrize("entry", CUDA_KERNELS)
def test_every_variant_compiles_for_sm90a_and_sm80(entry, every_kernel_built):
    spec, result = every_kernel_built[entry.name]
    if isinstance(result, Exception):
        raise result
    # sm_90a-only kernels (wgmma) are built for sm_90a alone: see test_arch_support.py.
    wanted = [a for a in ("8.0", "9.0a") if entry.archs.supports(parse_arch_list(a)[0])]
    assert [str(a) for a in spec.cuda_archs] == wanted
    assert result.artifact.is_file()
    instruction = EXPECTED_SASS.get(entry.name)
    if instruction:
        sass = _sass(result.artifact)
        assert re.search(rf"\b{instruction}\.", sass), f"{entry.name}: no {instruction} in the SASS"


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


@pytest.mark.nvcc
@pytest.mark.compile_grid
@pytest.mark.parametrize("arch", ["8.6", "8.7", "8.9"])
def test_the_sm80_gemms_compile_for_every_ampere_and_ada_arch(arch, tmp_path):
    """The sm_80 GEMMs' first variant (the decode tile) of each op, in one module, for
    the other sm_80-89 archs the original served (A10/RTX 30, Orin, L4/RTX 40), their
    SASS on mma.sync; the compile grid above builds every variant for sm_80."""
    entries = {entry.name: entry for entry in registry.kernels("cuda")}
    with cuda_arch_override(arch):
        specs = [entries[name].spec(entries[name].variants[0]) for name in EXPECTED_SASS
                 if name.endswith("_sm80")]  # fmt: skip
    assert [str(a) for a in specs[0].cuda_archs] == [arch]
    wrappers = tuple(w for spec in specs for w in spec.cuda_wrappers)
    spec = dataclasses.replace(
        specs[0],
        cuda_files=tuple(dict.fromkeys(f for spec in specs for f in spec.cuda_files)),
        template_args=("sm80_gemms", arch),
        cuda_wrappers=wrappers,
    )
    result = build(spec, tmp_path, tmp_path / "build.log")
    sass = _sass(result.artifact)
    for instruction in ("HMMA", "IMMA"):
        assert re.search(rf"\b{instruction}\.", sass), f"sm_{arch}: no {instruction} in the SASS"
