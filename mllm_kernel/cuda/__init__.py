"""CUDA kernels: sources in ``csrc/``, Python entry points in :mod:`mllm_kernel.cuda.jit`.

Also the seed-style object API: :class:`Gemm` (a GEMM of one shape, its tile chosen once).
"""

from mllm_kernel.cuda.jit.gemm import Gemm

__all__ = ["Gemm"]
