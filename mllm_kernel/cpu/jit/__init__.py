"""CPU ops, compiled for this machine on first use and cached.

Each op is also the torch custom op ``torch.ops.mllm_kernel.<name>`` (what
``torch.compile`` traces); the functions here call their kernels directly.
"""

from mllm_kernel.cpu.jit.activation import silu_and_mul, silu_and_mul_backward
from mllm_kernel.cpu.jit.add_constant import add_constant, add_constant_runtime
from mllm_kernel.cpu.jit.rmsnorm import fused_add_rmsnorm, rmsnorm, rmsnorm_backward
from mllm_kernel.cpu.jit.softmax import softmax

__all__ = [
    "add_constant",
    "add_constant_runtime",
    "fused_add_rmsnorm",
    "rmsnorm",
    "rmsnorm_backward",
    "silu_and_mul",
    "silu_and_mul_backward",
    "softmax",
]
