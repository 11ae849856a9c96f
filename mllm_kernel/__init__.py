"""mllm-kernel: JIT-compiled CPU and CUDA kernels for LLM inference on apache-tvm-ffi.

Built-in ops live in :mod:`mllm_kernel.cpu.jit` and :mod:`mllm_kernel.cuda.jit` (and are
the torch custom ops ``torch.ops.mllm_kernel.*``); the machinery to write your own is
in :mod:`mllm_kernel.jit_utils`::

    from mllm_kernel.jit_utils import KernelModule, load_cpu_jit, make_cpp_args

As in the original mllm-kernel, ``mllm_kernel.jit`` is the ``@jit`` decorator
(:func:`mllm_kernel.jit_utils.jit`) and ``mllm_kernel.cpu`` / ``mllm_kernel.cuda`` /
``mllm_kernel.jit_utils`` are reachable as attributes; they are imported on first use,
so ``import mllm_kernel`` stays cheap. Nothing else is public at the top level.
"""

# Private names: the namespace holds only the public API.
import importlib as _importlib
from typing import Any as _Any

__version__ = "0.1.0"

__all__ = ["__version__", "cpu", "cuda", "jit", "jit_utils"]

_SUBPACKAGES = ("cpu", "cuda", "jit_utils")


def __getattr__(name: str) -> _Any:
    if name == "jit":
        from mllm_kernel.jit_utils import jit

        return jit
    if name in _SUBPACKAGES:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
