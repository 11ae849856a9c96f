"""The JIT core: describe a kernel module, build it once, cache it, load it.

>>> from mllm_kernel.jit_utils import cache_once, load_cpu_jit, make_cpp_args

An op file declares each of its modules once as a :class:`KernelModule` (name, device,
sources, exported C++ functions, variants: see :mod:`.kernel_module`) and each of its
ops as a torch custom op with :func:`torch_op`; its Python wrapper checks its arguments
with :mod:`mllm_kernel.jit_utils.op_inputs`. Lower level: :func:`load_cpu_jit`,
:func:`load_cuda_jit`, :func:`make_cpp_args`, :func:`cache_once` and
:func:`register_kernel`. :func:`use_application_logging`
routes the ``mllm_kernel`` logger into the application's logging.

For code written against the original mllm-kernel: the :func:`jit` decorator, the
registry functions :func:`register_jit_kernel`, :func:`get_jit_kernel_registry`,
:func:`clear_jit_kernel_registry` and the ``MLLM_KERNEL_*_PATH`` / ``*_DIR`` constants
(:mod:`mllm_kernel.jit_utils.path_constants`).
"""

from mllm_kernel.jit_utils.cpp_args import CppArgs, make_cpp_args
from mllm_kernel.jit_utils.cuda_arch import cuda_arch_override
from mllm_kernel.jit_utils.errors import (
    CacheLockTimeout,
    CudaArchError,
    KernelBuildError,
    ToolchainError,
)
from mllm_kernel.jit_utils.jit_decorator import jit
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.loader import load_cpu_jit, load_cuda_jit
from mllm_kernel.jit_utils.logging_setup import use_application_logging
from mllm_kernel.jit_utils.memo import cache_once
from mllm_kernel.jit_utils.path_constants import (
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
)
from mllm_kernel.jit_utils.registry import (
    clear_jit_kernel_registry,
    get_jit_kernel_registry,
    register_jit_kernel,
    register_kernel,
)
from mllm_kernel.jit_utils.torch_op import torch_op

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
    "CacheLockTimeout",
    "CppArgs",
    "CudaArchError",
    "KernelBuildError",
    "KernelModule",
    "ToolchainError",
    "cache_once",
    "clear_jit_kernel_registry",
    "cuda_arch_override",
    "get_jit_kernel_registry",
    "jit",
    "load_cpu_jit",
    "load_cuda_jit",
    "make_cpp_args",
    "register_jit_kernel",
    "register_kernel",
    "torch_op",
    "use_application_logging",
]
