"""The original mllm-kernel's module path ``mllm_kernel.jit_utils.compile``: nothing is
compiled here (that is :mod:`.loader` and :mod:`.build`).

The original defined its whole JIT core in this module, and code written against it
imports from here (``from mllm_kernel.jit_utils.compile import cache_once,
load_cpu_jit, make_cpp_args``); every public name of :mod:`mllm_kernel.jit_utils`
is served under this path too.
"""

from mllm_kernel.jit_utils import *  # noqa: F403 (the package's names, under the original's path)
from mllm_kernel.jit_utils import __all__  # noqa: F401 (what a star import here gives)
