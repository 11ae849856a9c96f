"""CUDA kernels: sources in ``csrc/``, Python entry points in :mod:`mllm_kernel.cuda.jit`;
raw ``extern "C"`` kernels from Python through :mod:`mllm_kernel.cuda.runtime`; and the
seed-style object API :class:`Gemm` (a GEMM of one shape, its tile chosen once)."""

from mllm_kernel.cuda.jit.gemm import Gemm
from mllm_kernel.cuda.runtime import (
    CompiledKernel,
    CudaModule,
    Kernel,
    compile_kernel,
    compile_to_cubin,
    compile_to_ptx,
    device_info,
    load_cubin,
    load_ptx,
)

__all__ = [
    "CompiledKernel",
    "CudaModule",
    "Gemm",
    "Kernel",
    "compile_kernel",
    "compile_to_cubin",
    "compile_to_ptx",
    "device_info",
    "load_cubin",
    "load_ptx",
]
