"""CPU kernels: sources in ``csrc/``, Python entry points in :mod:`mllm_kernel.cpu.jit`."""

# As in the original mllm-kernel: mllm_kernel.cpu.jit is reachable after importing cpu.
from mllm_kernel.cpu import jit

__all__ = ["jit"]
