"""KV-cache bookkeeping: scatter new K/V rows into slots, flatten req_to_token."""

from __future__ import annotations

import math

import torch

from mllm_kernel.cuda.jit.device_module import module_for
from mllm_kernel.jit_utils import cache_once, env, load_cuda_jit, op_inputs, register_kernel
from mllm_kernel.jit_utils.logging_setup import get_logger

# The original mllm-kernel's warp splits: 2 warps per row need a multiple of 256 bytes,
# 4 warps a multiple of 512. Our kernel picks its own, but refuses what the original did.
_SPLIT_ROW_MULTIPLE = {1: 1, 2: 256, 4: 512}
_NO_START = (0,)


@register_kernel("store_cache", device="cuda", variants=[()])
@cache_once
def _store_module():
    return load_cuda_jit(
        "store_cache",
        cuda_files=["store_cache.cu"],
        cuda_wrappers=[("store_cache", "mllm_kernel::cuda::store_cache")],
    )


@register_kernel("create_kv_indices", device="cuda", variants=[()])
@cache_once
def _indices_module():
    return load_cuda_jit(
        "create_kv_indices",
        cuda_files=["create_kv_indices.cu"],
        cuda_wrappers=[("create_kv_indices", "mllm_kernel::cuda::create_kv_indices")],
    )


def _error_counter(like: torch.Tensor) -> torch.Tensor:
    """A zeroed int32 counter on ``like``'s device, for MLLM_KERNEL_CHECK_BOUNDS=1.

    Callers test ``env.check_bounds()`` themselves and build no message unless it is
    set: these ops run once per decode step, where every Python call counts.
    """
    return torch.zeros(1, dtype=torch.int32, device=like.device)


def _raise_if_counted(errors: torch.Tensor, message: str) -> None:
    # Reading the counter synchronises; it is skipped while a CUDA graph is captured,
    # where the kernel still refuses every out-of-range write.
    if torch.cuda.is_current_stream_capturing():
        return
    count = int(errors.item())
    if count:
        raise IndexError(message.format(count=count))


def can_use_store_cache(row_bytes: int) -> bool:
    """Whether :func:`store_cache` can take rows of ``row_bytes`` bytes here: any positive
    size, once the kernel builds (compiled for the current GPU on the first call).

    Never raises: False (with a warning in the ``mllm_kernel`` log) for a size that is
    not a positive int or when the kernel cannot be built or loaded, as the original
    mllm-kernel's function of this name does.

    >>> can_use_store_cache(8 * 128 * 2)  # doctest: +SKIP
    True
    """
    if type(row_bytes) is not int or row_bytes <= 0:  # bool is not a row size
        get_logger().warning("store_cache cannot take row_bytes=%r: expected an int > 0", row_bytes)
        return False
    try:
        _store_module()
    except Exception as error:  # no GPU, no nvcc, a failed build: say so, answer False
        get_logger().warning("store_cache kernel unavailable: %s", str(error).splitlines()[0])
        return False
    return True


def _check_row_bytes_and_split(k: torch.Tensor, row_bytes: object, num_split: object) -> None:
    """The original's ``row_bytes`` / ``num_split``: validated, not needed by our kernel."""
    row_bytes = op_inputs.integer(row_bytes, "row_bytes")
    num_split = op_inputs.integer(num_split, "num_split")
    k_row_bytes = math.prod(k.shape[1:]) * k.element_size()
    if row_bytes not in (0, k_row_bytes):
        raise ValueError(
            f"argument 'row_bytes': {row_bytes} disagrees with argument 'k', whose rows hold "
            f"{k_row_bytes} bytes; pass row_bytes=0 (the default) to take it from k"
        )
    row_bytes = k_row_bytes
    if num_split != 0 and num_split not in _SPLIT_ROW_MULTIPLE:
        raise ValueError(
            f"argument 'num_split': expected 0 (automatic), 1, 2 or 4, got {num_split}"
        )
    multiple = _SPLIT_ROW_MULTIPLE.get(num_split, 1)
    if row_bytes % multiple:
        raise ValueError(
            f"argument 'num_split': {num_split} needs rows of a multiple of {multiple} bytes, "
            f"got {row_bytes}; pass num_split=0 and the kernel chooses"
        )


def store_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    *,
    row_bytes: int = 0,
    num_split: int = 0,
) -> None:
    """``k_cache[indices[t]] = k[t]`` and ``v_cache[indices[t]] = v[t]`` for every token t.

    ``k`` ``[tokens, ...]`` and ``k_cache`` ``[slots, ...]`` with the same dtype and the
    same number of elements per row (likewise ``v``/``v_cache``); rows contiguous,
    the token/slot dim may be strided. ``indices`` int32 or int64 ``[tokens]``; a
    negative slot is padding and skipped; a slot ``>= slots`` is never written, and
    with ``MLLM_KERNEL_CHECK_BOUNDS=1`` (read at the first call) raises IndexError after
    the kernel (this synchronises the stream, so it is a debugging aid).

    ``row_bytes`` and ``num_split`` are the original mllm-kernel's: the kernel finds the
    row size itself and chooses how many warps copy a row, so both are only checked
    (0 means automatic; a ``row_bytes`` other than k's row size, or a ``num_split`` the
    original would refuse, is a ValueError).

    >>> store_cache(k, v, k_cache, v_cache, out_cache_loc)  # doctest: +SKIP
    """
    k = op_inputs.tensor(k, "k")
    v = op_inputs.tensor(v, "v")
    k_cache = op_inputs.output(k_cache, "k_cache")
    v_cache = op_inputs.output(v_cache, "v_cache")
    indices = op_inputs.tensor(indices, "indices")
    if row_bytes != 0 or num_split != 0:  # the defaults cost one comparison each
        _check_row_bytes_and_split(k, row_bytes, num_split)
    try:
        module = module_for(_store_module, k)
        errors = _error_counter(k) if env.check_bounds() else None
        module.store_cache(k, v, k_cache, v_cache, indices, errors)
    except Exception as error:
        op_inputs.explain(
            error, "cuda", k=k, v=v, k_cache=k_cache, v_cache=v_cache, indices=indices
        )
        raise
    if errors is not None:
        _raise_if_counted(
            errors,
            "store_cache: {count} of argument 'indices' are >= the cache's "
            f"{k_cache.shape[0]} slots; those rows were not written",
        )


def create_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_kernel_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
) -> None:
    """Fills ``kv_indices`` in FlashInfer's layout: for request i,
    ``kv_indices[kv_indptr[i] : kv_indptr[i] + page_kernel_lens[i]] =
    req_to_token[req_pool_indices[i], kv_start_idx[i] : kv_start_idx[i] + page_kernel_lens[i]]``.

    ``req_to_token`` int32/int64 ``[pool_size, max_context]`` and ``kv_indices`` (1-D,
    contiguous) share a dtype; the 1-D index inputs may be int32 or int64 and strided;
    ``kv_start_idx`` None (or an empty ``[0]`` tensor, as the original mllm-kernel takes
    it) means 0. A request whose ranges fall outside the tensors
    copies nothing (IndexError afterwards with ``MLLM_KERNEL_CHECK_BOUNDS=1``).

    >>> create_kv_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, None, kv_indices)
    ... # doctest: +SKIP
    """
    req_to_token = op_inputs.tensor(req_to_token, "req_to_token")
    req_pool_indices = op_inputs.tensor(req_pool_indices, "req_pool_indices")
    page_kernel_lens = op_inputs.tensor(page_kernel_lens, "page_kernel_lens")
    kv_indptr = op_inputs.tensor(kv_indptr, "kv_indptr")
    kv_start_idx = op_inputs.optional_tensor(kv_start_idx, "kv_start_idx")
    if kv_start_idx is not None and kv_start_idx.shape == _NO_START:
        kv_start_idx = None  # the original mllm-kernel's "no start offsets"
    kv_indices = op_inputs.output(kv_indices, "kv_indices")
    try:
        module = module_for(_indices_module, kv_indices)
        errors = _error_counter(kv_indices) if env.check_bounds() else None
        module.create_kv_indices(
            req_to_token,
            req_pool_indices,
            page_kernel_lens,
            kv_indptr,
            kv_start_idx,
            kv_indices,
            errors,
        )
    except Exception as error:
        op_inputs.explain(
            error,
            "cuda",
            req_to_token=req_to_token,
            req_pool_indices=req_pool_indices,
            page_kernel_lens=page_kernel_lens,
            kv_indptr=kv_indptr,
            kv_start_idx=kv_start_idx,
            kv_indices=kv_indices,
        )
        raise
    if errors is not None:
        _raise_if_counted(
            errors,
            "create_kv_indices: {count} request(s) index outside 'req_to_token' or "
            "'kv_indices' (argument 'req_pool_indices', 'kv_start_idx', 'page_kernel_lens' "
            "or 'kv_indptr'); nothing was copied for them",
        )
