"""mllm-kernel: JIT-compiled CPU and CUDA kernels for LLM inference on apache-tvm-ffi.

Built-in ops live in :mod:`mllm_kernel.cpu.jit` and :mod:`mllm_kernel.cuda.jit`;
the machinery to write your own is in :mod:`mllm_kernel.jit_utils`::

    from mllm_kernel.jit_utils import cache_once, load_cpu_jit, make_cpp_args
"""

__version__ = "0.1.0"
