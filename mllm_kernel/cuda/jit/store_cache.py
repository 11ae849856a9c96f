"""store_cache: scatter new K/V rows into their KV-cache slots (the original mllm-kernel's
module path ``mllm_kernel.cuda.jit.store_cache``)."""

from __future__ import annotations

import math

import torch

from mllm_kernel.cuda.jit.bounds_check import error_counter, raise_if_counted
from mllm_kernel.jit_utils import env, op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.logging_setup import get_logger
from mllm_kernel.jit_utils.torch_op import refuse_grad, torch_op

_tracing = torch.compiler.is_dynamo_compiling

# The original mllm-kernel's warp splits: 2 warps per row need a multiple of 256 bytes,
# 4 warps a multiple of 512. Our kernel picks its own, but refuses what the original did.
_SPLIT_ROW_MULTIPLE = {1: 1, 2: 256, 4: 512}

_STORE_CACHE = KernelModule(
    "store_cache", device="cuda", sources=["store_cache.cu"], exports=["store_cache"]
)


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
        _STORE_CACHE.current()
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
    if _tracing():
        return STORE_CACHE_OP(
            k, v, k_cache, v_cache, indices, row_bytes=row_bytes, num_split=num_split
        )
    k = op_inputs.tensor(k, "k")
    v = op_inputs.tensor(v, "v")
    k_cache = op_inputs.output(k_cache, "k_cache")
    v_cache = op_inputs.output(v_cache, "v_cache")
    indices = op_inputs.tensor(indices, "indices")
    refuse_grad("store_cache", k, v, k_cache, v_cache)
    if row_bytes != 0 or num_split != 0:  # the defaults cost one comparison each
        _check_row_bytes_and_split(k, row_bytes, num_split)
    try:
        module = _STORE_CACHE[k.get_device()]
        errors = error_counter(k) if env.check_bounds() else None
        module.store_cache(k, v, k_cache, v_cache, indices, errors)
    except Exception as error:
        op_inputs.explain(
            error, "cuda", k=k, v=v, k_cache=k_cache, v_cache=v_cache, indices=indices
        )
        raise
    if errors is not None:
        raise_if_counted(
            errors,
            "store_cache: {count} of argument 'indices' are >= the cache's "
            f"{k_cache.shape[0]} slots; those rows were not written",
        )


STORE_CACHE_OP = torch_op(
    "store_cache",
    "(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor indices, *, "
    "int row_bytes=0, int num_split=0) -> ()",
).implement("cuda", store_cache)
