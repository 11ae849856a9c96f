"""The original mllm-kernel's module path of the chunked gated-delta-net extend::

    from mllm_kernel.cuda.jit.gdn_extend_chunkwise import gdn_extend_chunkwise

    output = gdn_extend_chunkwise(
        q, k, v, a, b, A_log, dt_bias, state_pool, cache_indices, cu_seqlens,
    )

``gdn_extend_chunkwise`` is :func:`mllm_kernel.cuda.jit.gdn_extend.gdn_extend` (the same
function: its positional arguments are the original's, its keywords extra), and
:func:`precompile` builds its kernels ahead of the first call, as the original's did.
"""

from __future__ import annotations

import logging

from mllm_kernel.cuda.jit.gdn_extend import _GDN_EXTEND, gdn_extend

gdn_extend_chunkwise = gdn_extend


def precompile() -> bool:
    """Builds (or loads from the cache) gdn_extend's module for the current GPU, so that
    the first call does not wait for the compiler; True when it is ready, False (with a
    logged warning) when it cannot be built here.

    >>> from mllm_kernel.cuda.jit.gdn_extend_chunkwise import precompile
    >>> precompile()  # at server start-up
    True
    """
    try:
        _GDN_EXTEND.current()
    except Exception as error:
        logging.getLogger(__name__).warning(
            "gdn_extend_chunkwise precompile failed: %s: %s", type(error).__name__, error
        )
        return False
    return True


__all__ = ["gdn_extend_chunkwise", "precompile"]
