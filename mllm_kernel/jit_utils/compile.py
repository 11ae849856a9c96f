"""The original mllm-kernel's ``mllm_kernel.jit_utils.compile`` module path.

Code written against the original imports its helpers from here
(``from mllm_kernel.jit_utils.compile import cache_once, make_cpp_args``); each name
is the one :mod:`mllm_kernel.jit_utils` exports, defined once elsewhere.
"""

from mllm_kernel.jit_utils import (
    MLLM_KERNEL_ASCEND_CSRC_DIR,
    MLLM_KERNEL_ASCEND_INCLUDE_DIR,
    MLLM_KERNEL_ASCEND_PATH,
    MLLM_KERNEL_CPU_CSRC_DIR,
    MLLM_KERNEL_CPU_INCLUDE_DIR,
    MLLM_KERNEL_CPU_PATH,
    MLLM_KERNEL_CUDA_CSRC_DIR,
    MLLM_KERNEL_CUDA_INCLUDE_DIR,
    MLLM_KERNEL_CUDA_PATH,
    MLLM_KERNEL_INCLUDE_DIR,
    MLLM_KERNEL_TOP_PATH,
    cache_once,
    clear_jit_kernel_registry,
    get_jit_kernel_registry,
    jit,
    load_cpu_jit,
    load_cuda_jit,
    make_cpp_args,
    register_jit_kernel,
)

__all__ = [
    "MLLM_KERNEL_ASCEND_CSRC_DIR",
    "MLLM_KERNEL_ASCEND_INCLUDE_DIR",
    "MLLM_KERNEL_ASCEND_PATH",
    "MLLM_KERNEL_CPU_CSRC_DIR",
    "MLLM_KERNEL_CPU_INCLUDE_DIR",
    "MLLM_KERNEL_CPU_PATH",
    "MLLM_KERNEL_CUDA_CSRC_DIR",
    "MLLM_KERNEL_CUDA_INCLUDE_DIR",
    "MLLM_KERNEL_CUDA_PATH",
    "MLLM_KERNEL_INCLUDE_DIR",
    "MLLM_KERNEL_TOP_PATH",
    "cache_once",
    "clear_jit_kernel_registry",
    "get_jit_kernel_registry",
    "jit",
    "load_cpu_jit",
    "load_cuda_jit",
    "make_cpp_args",
    "register_jit_kernel",
]
