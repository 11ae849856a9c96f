"""The original mllm-kernel's module path for ``int8_scaled_mm`` (there a CUTLASS kernel
for sm_80-sm_89; here the Hopper kernel of :mod:`mllm_kernel.cuda.jit.int8_scaled_mm`)."""

from mllm_kernel.cuda.jit.int8_scaled_mm import int8_scaled_mm

__all__ = ["int8_scaled_mm"]
