"""The original mllm-kernel's ``mllm_kernel.cuda.jit.store_cache`` module path.

``from mllm_kernel.cuda.jit.store_cache import can_use_store_cache, store_cache``
gives the functions defined in :mod:`mllm_kernel.cuda.jit.kv_cache`.
"""

from mllm_kernel.cuda.jit.kv_cache import can_use_store_cache, store_cache

__all__ = ["can_use_store_cache", "store_cache"]
