"""The JIT core: describe a kernel module, build it once, cache it, load it.

>>> from mllm_kernel.jit_utils import cache_once, load_cpu_jit, make_cpp_args

See :func:`load_cpu_jit`, :func:`load_cuda_jit`, :func:`make_cpp_args`,
:func:`cache_once` and :func:`register_kernel`; an op's Python wrapper checks its
arguments with :mod:`mllm_kernel.jit_utils.op_inputs`.
"""

from mllm_kernel.jit_utils.cache_once import cache_once
from mllm_kernel.jit_utils.cpp_args import CppArgs, make_cpp_args
from mllm_kernel.jit_utils.cuda_arch import cuda_arch_override
from mllm_kernel.jit_utils.errors import (
    CacheLockTimeout,
    CudaArchError,
    KernelBuildError,
    ToolchainError,
)
from mllm_kernel.jit_utils.loader import load_cpu_jit, load_cuda_jit
from mllm_kernel.jit_utils.registry import register_kernel

__all__ = [
    "CacheLockTimeout",
    "CppArgs",
    "CudaArchError",
    "KernelBuildError",
    "ToolchainError",
    "cache_once",
    "cuda_arch_override",
    "load_cpu_jit",
    "load_cuda_jit",
    "make_cpp_args",
    "register_kernel",
]
