"""gdn_decode on the GPU (declared in :mod:`mllm_kernel.ops.gdn`), at the original
mllm-kernel's module path ``mllm_kernel.cuda.jit.gdn_decode``::

    from mllm_kernel.cuda.jit.gdn_decode import gdn_decode

    output = gdn_decode(q, k, v, a, b, A_log, dt_bias, state_pool, cache_indices)
"""

from __future__ import annotations

import torch

from mllm_kernel.cuda.device_facts import device_facts
from mllm_kernel.cuda.jit.bounds_check import error_counter, raise_if_counted
from mllm_kernel.jit_utils import env
from mllm_kernel.jit_utils.cuda_arch import ArchSupport
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.gdn import GDN_DECODE

_GDN_DECODE = KernelModule(
    "gdn_decode",
    device="cuda",
    sources=["gdn_decode.cu"],
    exports=["gdn_decode"],
    # The state is staged through shared memory by cp.async; no mma.sync or ldmatrix.
    archs=ArchSupport(minimum=(8, 0), uses="cp.async"),
)


@GDN_DECODE.kernel("cuda")
def gdn_decode(
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    state_pool,
    cache_indices,
    g,
    beta,
    scale,
    use_qk_l2norm,
    intermediate_states,
    out,
):
    """one pass over each state (read once, written once, whatever T); sm_80 and
    newer.

    >>> B, H, HV, K, V = 4, 16, 32, 128, 128
    >>> x = lambda *shape: torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    >>> pool = torch.zeros(8, HV, V, K, device="cuda")
    >>> A_log, dt_bias = torch.zeros(HV, device="cuda"), torch.zeros(HV, device="cuda")
    >>> idx = torch.tensor([3, 0, -1, 5], device="cuda")
    >>> o = gdn_decode(x(B, H, K), x(B, H, K), x(B, HV, V), x(B, HV), x(B, HV), A_log,
    ...                dt_bias, pool, idx)
    >>> o.shape
    torch.Size([4, 32, 128])
    """
    out = torch.empty_like(v) if out is None else out
    errors = error_counter(q) if env.check_bounds() else None
    index = q.get_device()
    _GDN_DECODE[index].gdn_decode(
        out,
        q,
        k,
        v,
        a,
        b,
        A_log,
        dt_bias,
        g,
        beta,
        state_pool,
        cache_indices,
        intermediate_states,
        scale,
        use_qk_l2norm,
        errors,
        device_facts(index).sm_count,
        -1,
    )
    if errors is not None:
        raise_if_counted(
            errors,
            "gdn_decode: {count} of argument 'cache_indices' are >= the pool's "
            f"{state_pool.shape[0]} states; their outputs are NaN and the pool was not touched",
        )
    return out
