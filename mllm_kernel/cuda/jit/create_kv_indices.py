"""create_kv_indices on the GPU (declared in :mod:`mllm_kernel.ops.kv_cache`), at the
original mllm-kernel's module path ``mllm_kernel.cuda.jit.create_kv_indices``."""

from __future__ import annotations

from mllm_kernel.cuda.jit.bounds_check import error_counter, raise_if_counted
from mllm_kernel.jit_utils import env
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.kv_cache import CREATE_KV_INDICES

_NO_START = (0,)

_CREATE_KV_INDICES = KernelModule(
    "create_kv_indices",
    device="cuda",
    sources=["create_kv_indices.cu"],
    exports=["create_kv_indices"],
)


@CREATE_KV_INDICES.kernel("cuda")
def create_kv_indices(
    req_to_token, req_pool_indices, page_kernel_lens, kv_indptr, kv_start_idx, kv_indices
):
    """one row of CTAs per request.

    >>> create_kv_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, None, kv_indices)
    ... # doctest: +SKIP
    """
    if kv_start_idx is not None and kv_start_idx.shape == _NO_START:
        kv_start_idx = None  # the original mllm-kernel's "no start offsets"
    module = _CREATE_KV_INDICES[kv_indices.get_device()]
    errors = error_counter(kv_indices) if env.check_bounds() else None
    module.create_kv_indices(
        req_to_token, req_pool_indices, page_kernel_lens, kv_indptr, kv_start_idx, kv_indices,
        errors,
    )  # fmt: skip
    if errors is not None:
        raise_if_counted(
            errors,
            "create_kv_indices: {count} request(s) index outside 'req_to_token' or "
            "'kv_indices' (argument 'req_pool_indices', 'kv_start_idx', 'page_kernel_lens' "
            "or 'kv_indptr'); nothing was copied for them",
        )
