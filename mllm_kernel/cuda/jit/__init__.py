"""CUDA ops, compiled for the tensor's GPU on first use and cached.

Importing this package neither needs a GPU nor initialises CUDA; each op builds
(or loads from the cache) its module on its first call. Each op is also the torch
custom op ``torch.ops.mllm_kernel.<name>`` (what ``torch.compile`` traces); the
functions here call their kernels directly.

The original mllm-kernel's module paths (``mllm_kernel.cuda.jit.store_cache``,
``.create_kv_indices``, ``.gdn_decode``, ``.gdn_extend_chunkwise``, ``.rms_norm_gated``,
``.add_constant``, ``.gptq_marlin``, ``.gptq_marlin_repack``, ``.awq_marlin_repack``,
``.int8_scaled_mm``, ``.int8_scaled_mm_cutlass``) are modules too. They are imported
below, before the function of the same name is bound here: importing a submodule for
the first time sets the package attribute to the module, and that must not replace the
function later.
"""

from mllm_kernel.cuda.jit.activation import (
    gelu_and_mul,
    gelu_tanh_and_mul,
    silu_and_mul,
    silu_and_mul_backward,
)
from mllm_kernel.cuda.jit.add_constant import add_constant, add_constant_runtime
from mllm_kernel.cuda.jit.awq_marlin_repack import awq_marlin_repack
from mllm_kernel.cuda.jit.create_kv_indices import create_kv_indices
from mllm_kernel.cuda.jit.gdn_decode import gdn_decode
from mllm_kernel.cuda.jit.gdn_extend import gdn_extend
from mllm_kernel.cuda.jit.gemm import gemm
from mllm_kernel.cuda.jit.gptq_marlin import gptq_marlin_gemm
from mllm_kernel.cuda.jit.gptq_marlin_repack import gptq_marlin_repack
from mllm_kernel.cuda.jit.int8_scaled_mm import int8_scaled_mm
from mllm_kernel.cuda.jit.marlin_format import (
    awq_to_marlin_zero_points,
    marlin_make_workspace,
    marlin_permute_scales,
    marlin_zero_points,
)
from mllm_kernel.cuda.jit.per_token_quant import per_token_quant_int8
from mllm_kernel.cuda.jit.rms_norm_gated import rms_norm_gated
from mllm_kernel.cuda.jit.rmsnorm import fused_add_rmsnorm, rmsnorm, rmsnorm_backward
from mllm_kernel.cuda.jit.rope import apply_rope_with_cos_sin_cache_inplace
from mllm_kernel.cuda.jit.scalar_type import scalar_types
from mllm_kernel.cuda.jit.softmax import softmax, softmax_backward
from mllm_kernel.cuda.jit.store_cache import can_use_store_cache, store_cache

__all__ = [
    "add_constant",
    "add_constant_runtime",
    "apply_rope_with_cos_sin_cache_inplace",
    "awq_marlin_repack",
    "awq_to_marlin_zero_points",
    "can_use_store_cache",
    "create_kv_indices",
    "fused_add_rmsnorm",
    "gdn_decode",
    "gdn_extend",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "gemm",
    "gptq_marlin_gemm",
    "gptq_marlin_repack",
    "int8_scaled_mm",
    "marlin_make_workspace",
    "marlin_permute_scales",
    "marlin_zero_points",
    "per_token_quant_int8",
    "rms_norm_gated",
    "rmsnorm",
    "rmsnorm_backward",
    "scalar_types",
    "silu_and_mul",
    "silu_and_mul_backward",
    "softmax",
    "softmax_backward",
    "store_cache",
]
