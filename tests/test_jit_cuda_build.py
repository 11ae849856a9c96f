"""CUDA builds without a GPU (CI): compile for sm_90a, key by arch, report nvcc errors."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from mllm_kernel.jit_utils import (
    KernelBuildError,
    cuda_arch_override,
    load_cuda_jit,
    make_cpp_args,
    toolchain,
)
from mllm_kernel.jit_utils.cache import Manifest

pytestmark = pytest.mark.nvcc

KERNEL = textwrap.dedent("""
    #include "mllm_kernel/tensor.hpp"
    #include "mllm_kernel/utils.cuh"

    namespace fill_demo {
    template <typename T>
    __global__ void fill_kernel(T* out, int64_t n, float value) {
      const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
      if (i < n) out[i] = mllm_kernel::from_float<T>(value);
    }

    template <typename T>
    void fill(tvm::ffi::TensorView out, double value) {
      using namespace mllm_kernel;
      SymbolicSize n{"n"};
      SymbolicDevice device;
      TensorMatcher({n}).dtype<T>().device(kDLCUDA, device).contiguous().verify(out, "out");
      KernelLauncher(div_ceil<int64_t>(n.value(), 256), 256, out.device())(
          fill_kernel<T>, data_ptr<T>(out), n.value(), static_cast<float>(value));
    }
    }  // namespace fill_demo
""")


def _load(source: Path, dtype: torch.dtype):
    args = make_cpp_args(dtype)
    return load_cuda_jit(
        "fill_demo",
        *args,
        cuda_files=[str(source)],
        cuda_wrappers=[("fill", f"fill_demo::fill<{args}>")],
    )


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "fill.cu"
    path.write_text(KERNEL)
    return path


def _module_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if not p.name.startswith("."))


def test_compiles_for_sm90a_without_a_gpu(source, fresh_cache):
    with cuda_arch_override("9.0a"):
        module = _load(source, torch.bfloat16)
    assert module.implements_function("fill")
    (module_dir,) = _module_dirs(fresh_cache)
    assert module_dir.name.startswith("fill_demo_cuda_bf16_t_")
    assert not (module_dir / "main.cpp").exists()  # no C++ wrapper was asked for
    cuobjdump = toolchain.find_cuda().home / "bin" / "cuobjdump"
    if cuobjdump.is_file() or shutil.which("cuobjdump"):
        listing = subprocess.run(
            [str(cuobjdump), "--list-elf", str(module_dir / Manifest.read(module_dir).artifact)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "sm_90a" in listing, listing


def test_each_arch_has_its_own_cache_entry(source, fresh_cache):
    with cuda_arch_override("9.0a"):
        _load(source, torch.float16)
    with cuda_arch_override("8.0"):
        _load(source, torch.float16)
    with cuda_arch_override("9.0a"):
        _load(source, torch.float16)  # found again, not rebuilt
    assert len(_module_dirs(fresh_cache)) == 2


def test_nvcc_error_leads_with_file_and_line(tmp_path, fresh_cache):
    broken = tmp_path / "broken.cu"
    broken.write_text(
        "namespace fill_demo {\ntemplate <typename T>\nvoid fill() { undefined_thing; }\n}\n"
    )
    with cuda_arch_override("9.0a"), pytest.raises(KernelBuildError) as info:
        _load(broken, torch.float16)
    assert str(info.value).startswith(f"{broken}:3: ")
    assert "fp16_t" in str(info.value)


def test_unsupported_arch_has_a_hint(source, fresh_cache):
    with cuda_arch_override("1.0"), pytest.raises(KernelBuildError) as info:
        _load(source, torch.float16)
    assert info.value.hint and "MLLM_KERNEL_CUDA_ARCH_LIST" in info.value.hint
