"""CUDA ops, compiled for the tensor's GPU on first use and cached.

Importing this package neither needs a GPU nor initialises CUDA; each op builds
(or loads from the cache) its module on its first call.
"""

from mllm_kernel.cuda.jit.activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul
from mllm_kernel.cuda.jit.add_constant import add_constant, add_constant_runtime
from mllm_kernel.cuda.jit.gemm import gemm
from mllm_kernel.cuda.jit.kv_cache import create_kv_indices, store_cache
from mllm_kernel.cuda.jit.norm import fused_add_rmsnorm, rms_norm_gated, rmsnorm
from mllm_kernel.cuda.jit.rope import apply_rope_with_cos_sin_cache_inplace
from mllm_kernel.cuda.jit.softmax import softmax, softmax_backward

__all__ = [
    "add_constant",
    "add_constant_runtime",
    "apply_rope_with_cos_sin_cache_inplace",
    "create_kv_indices",
    "fused_add_rmsnorm",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "gemm",
    "rms_norm_gated",
    "rmsnorm",
    "silu_and_mul",
    "softmax",
    "softmax_backward",
    "store_cache",
]
