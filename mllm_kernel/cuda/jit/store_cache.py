"""store_cache on the GPU (declared in :mod:`mllm_kernel.ops.kv_cache`), at the original
mllm-kernel's module path ``mllm_kernel.cuda.jit.store_cache``."""

from __future__ import annotations

from mllm_kernel.cuda.jit.bounds_check import error_counter, raise_if_counted
from mllm_kernel.jit_utils import env
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.logging_setup import get_logger
from mllm_kernel.ops.kv_cache import STORE_CACHE

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


@STORE_CACHE.kernel("cuda")
def store_cache(k, v, k_cache, v_cache, indices, row_bytes, num_split):
    """one warp per token copies both rows, in the widest loads the row allows
    (``row_bytes`` and ``num_split`` were checked by the op).

    >>> store_cache(k, v, k_cache, v_cache, out_cache_loc)  # doctest: +SKIP
    """
    module = _STORE_CACHE[k.get_device()]
    errors = error_counter(k) if env.check_bounds() else None
    module.store_cache(k, v, k_cache, v_cache, indices, errors)
    if errors is not None:
        raise_if_counted(
            errors,
            "store_cache: {count} of argument 'indices' are >= the cache's "
            f"{k_cache.shape[0]} slots; those rows were not written",
        )
