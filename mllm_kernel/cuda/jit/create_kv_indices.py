"""The original mllm-kernel's ``mllm_kernel.cuda.jit.create_kv_indices`` module path.

``from mllm_kernel.cuda.jit.create_kv_indices import create_kv_indices`` gives the
function defined in :mod:`mllm_kernel.cuda.jit.kv_cache`.
"""

from mllm_kernel.cuda.jit.kv_cache import create_kv_indices

__all__ = ["create_kv_indices"]
