"""The original mllm-kernel's ``mllm_kernel.cuda.jit.rms_norm_gated`` module path.

``from mllm_kernel.cuda.jit.rms_norm_gated import rms_norm_gated`` gives the function
defined in :mod:`mllm_kernel.cuda.jit.rmsnorm`.
"""

from mllm_kernel.cuda.jit.rmsnorm import rms_norm_gated

__all__ = ["rms_norm_gated"]
