"""CPU ops, compiled for this machine on first use and cached."""

from mllm_kernel.cpu.jit.add_constant import add_constant

__all__ = ["add_constant"]
