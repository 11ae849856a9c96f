"""The KV cache's bookkeeping ops: scatter new K/V rows into their slots, and flatten
request rows of slot indices into FlashInfer's ``kv_indices`` layout."""

from __future__ import annotations

import math

import torch

from mllm_kernel.ops.op import Op

# The original mllm-kernel's warp splits: 2 warps per row need a multiple of 256 bytes,
# 4 warps a multiple of 512. Our kernel picks its own, but refuses what the original did.
_SPLIT_ROW_MULTIPLE = {1: 1, 2: 256, 4: 512}


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
    the kernel (this synchronises the stream, so it is a debugging aid; calls captured in
    a CUDA graph still skip such slots but cannot raise). Two tokens given one slot race:
    that row ends up holding parts of either.

    ``row_bytes`` and ``num_split`` are the original mllm-kernel's: the kernel finds the
    row size itself and chooses how many warps copy a row, so both are only checked
    (0 means automatic; a ``row_bytes`` other than k's row size, or a ``num_split`` the
    original would refuse, is a ValueError).
    """


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
    it) means 0. A request whose ranges fall outside the tensors copies nothing
    (IndexError afterwards with ``MLLM_KERNEL_CHECK_BOUNDS=1``, except in a CUDA graph's
    capture). Requests' output ranges must not overlap (``kv_indptr`` nondecreasing, as
    FlashInfer's): overlapping ones race.
    """


def _check_row_bytes_and_split(k: torch.Tensor, row_bytes: int, num_split: int) -> None:
    """The original's ``row_bytes`` / ``num_split``: validated, never needed by a kernel."""
    if row_bytes == 0 and num_split == 0:  # the defaults: automatic
        return
    k_row_bytes = math.prod(k.shape[1:]) * k.element_size()
    if row_bytes not in (0, k_row_bytes):
        raise ValueError(
            f"argument 'row_bytes': {row_bytes} disagrees with argument 'k', whose rows hold "
            f"{k_row_bytes} bytes; pass row_bytes=0 (the default) to take it from k"
        )
    if num_split != 0 and num_split not in _SPLIT_ROW_MULTIPLE:
        raise ValueError(
            f"argument 'num_split': expected 0 (automatic), 1, 2 or 4, got {num_split}"
        )
    multiple = _SPLIT_ROW_MULTIPLE.get(num_split, 1)
    if k_row_bytes % multiple:
        raise ValueError(
            f"argument 'num_split': {num_split} needs rows of a multiple of {multiple} bytes, "
            f"got {k_row_bytes}; pass num_split=0 and the kernel chooses"
        )


STORE_CACHE = Op(store_cache, writes=("k_cache", "v_cache"), check=_check_row_bytes_and_split)
CREATE_KV_INDICES = Op(create_kv_indices, writes=("kv_indices",))
