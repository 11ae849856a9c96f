"""gdn_extend on the GPU (declared in :mod:`mllm_kernel.ops.gdn`): the gated delta net
over packed variable-length sequences, a chunk of 64 tokens at a time on tensor cores::

    from mllm_kernel.cuda.jit import gdn_extend

    o = gdn_extend(q, k, v, a, b, A_log, dt_bias, state_pool, cache_indices, cu_seqlens)

The original mllm-kernel's module path and name, ``gdn_extend_chunkwise``, are
:mod:`mllm_kernel.cuda.jit.gdn_extend_chunkwise`.
"""

from __future__ import annotations

import torch

from mllm_kernel.cuda.jit.bounds_check import raise_if_counted
from mllm_kernel.jit_utils import env
from mllm_kernel.jit_utils.cuda_arch import AMPERE_OR_NEWER
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.gdn import GDN_EXTEND

_GDN_EXTEND = KernelModule(
    "gdn_extend",
    device="cuda",
    sources=["gdn_extend.cu"],
    exports=["gdn_extend"],
    archs=AMPERE_OR_NEWER,
)


@GDN_EXTEND.kernel("cuda")
def gdn_extend(
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    state_pool,
    cache_indices,
    cu_seqlens,
    g,
    beta,
    scale,
    use_qk_l2norm,
    out,
):
    """one CTA per (sequence, value head, 32 state rows) walks the sequence's chunks
    in order, its state slice in registers (read from the pool once, written once);
    mma.sync on sm_80 and newer. Deterministic: no atomics on the state.

    >>> H, HV, K, V = 16, 32, 128, 128
    >>> cu_seqlens = torch.tensor([0, 100, 100, 350], device="cuda")  # 3 sequences
    >>> x = lambda *shape: torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    >>> pool = torch.zeros(8, HV, V, K, device="cuda")
    >>> A_log, dt_bias = torch.zeros(HV, device="cuda"), torch.zeros(HV, device="cuda")
    >>> idx = torch.tensor([3, 0, -1], device="cuda")
    >>> o = gdn_extend(x(350, H, K), x(350, H, K), x(350, HV, V), x(350, HV), x(350, HV),
    ...                A_log, dt_bias, pool, idx, cu_seqlens)
    >>> o.shape
    torch.Size([350, 32, 128])
    """
    out = torch.empty_like(v) if out is None else out
    # [0]: indices past the pool, [1]: sequences outside the tokens
    errors = torch.zeros(2, dtype=torch.int32, device=q.device) if env.check_bounds() else None
    _GDN_EXTEND[q.get_device()].gdn_extend(
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
        cu_seqlens,
        scale,
        use_qk_l2norm,
        errors,
    )
    if errors is not None:
        raise_if_counted(
            errors[0],
            "gdn_extend: {count} of argument 'cache_indices' are >= the pool's "
            f"{state_pool.shape[0]} states; their outputs are NaN and the pool was not touched",
        )
        raise_if_counted(
            errors[1],
            "gdn_extend: {count} sequences of argument 'cu_seqlens' are not within the "
            f"{q.shape[0]} tokens (0 <= cu_seqlens[n] <= cu_seqlens[n + 1] <= total_tokens); "
            "they were skipped",
        )
    return out
