"""Rotary position embedding on the GPU (declared in :mod:`mllm_kernel.ops.rope`)."""

from __future__ import annotations

from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.rope import APPLY_ROPE

_ROPE = KernelModule("rope", device="cuda", sources=["rope.cu"], exports=["apply_rope_inplace"])


@APPLY_ROPE.kernel("cuda")
def apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache, is_neox):
    """one CTA per token, a thread rotating a few pairs of one head.

    >>> apply_rope_with_cos_sin_cache_inplace(pos, q, k, 128, cache)  # doctest: +SKIP
    """
    _ROPE[query.get_device()].apply_rope_inplace(
        positions, query, key, cos_sin_cache, head_size, is_neox
    )
