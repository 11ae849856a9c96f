"""CUDA ops, compiled for the tensor's GPU on first use and cached.

Importing this package neither needs a GPU nor initialises CUDA; each op builds
(or loads from the cache) its module on its first call. Each op is also the torch
custom op ``torch.ops.mllm_kernel.<name>`` (what ``torch.compile`` traces); the
functions here call their kernels directly.

The original mllm-kernel's module paths (``mllm_kernel.cuda.jit.store_cache``,
``.create_kv_indices``, ``.rms_norm_gated``, ``.add_constant``) are modules too. They
are imported below, before the function of the same name is bound here: importing a
submodule for the first time sets the package attribute to the module, and that must
not replace the function later.
"""

from mllm_kernel.cuda.jit.activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul
from mllm_kernel.cuda.jit.add_constant import add_constant, add_constant_runtime
from mllm_kernel.cuda.jit.create_kv_indices import create_kv_indices
from mllm_kernel.cuda.jit.gemm import gemm
from mllm_kernel.cuda.jit.rms_norm_gated import rms_norm_gated
from mllm_kernel.cuda.jit.rmsnorm import fused_add_rmsnorm, rmsnorm
from mllm_kernel.cuda.jit.rope import apply_rope_with_cos_sin_cache_inplace
from mllm_kernel.cuda.jit.softmax import softmax, softmax_backward
from mllm_kernel.cuda.jit.store_cache import can_use_store_cache, store_cache

__all__ = [
    "add_constant",
    "add_constant_runtime",
    "apply_rope_with_cos_sin_cache_inplace",
    "can_use_store_cache",
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
