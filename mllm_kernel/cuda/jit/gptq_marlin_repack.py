"""``gptq_marlin_repack`` on the GPU (declared in :mod:`mllm_kernel.ops.marlin`; the
original mllm-kernel's module path): GPTQ-packed weights to the Marlin layout of
:func:`mllm_kernel.cuda.jit.gptq_marlin_gemm`."""

from __future__ import annotations

import torch

from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.marlin import GPTQ_MARLIN_REPACK

_REPACK = KernelModule(
    "gptq_marlin_repack",
    device="cuda",
    sources=["marlin_repack.cu"],
    exports=["gptq_marlin_repack"],
)


def repacked(words: torch.Tensor, size_k: int) -> torch.Tensor:
    """The repacked words (``out``, flat, as the kernels write it once they have checked
    the sizes) in their ``[size_k // 16, size_n * 16 // pack]`` shape. Flat, because the
    output is allocated before the sizes are checked: the input has as many words."""
    return words.view(size_k // 16, -1)


@GPTQ_MARLIN_REPACK.kernel("cuda")
def gptq_marlin_repack(b_q_weight, perm, size_k, size_n, num_bits):
    """runs on ``b_q_weight``'s GPU.

    >>> q = torch.randint(0, 2**31, (4096 // 8, 4096), dtype=torch.int32, device="cuda")
    >>> gptq_marlin_repack(q, None, 4096, 4096, 4).shape  # doctest: +SKIP
    torch.Size([256, 8192])
    """
    module = _REPACK[b_q_weight.get_device()]
    if perm is not None and perm.numel() == 0:
        perm = None  # the original's way of passing none
    # The values of perm are rows the kernel reads, checked here: reading them needs the
    # GPU's result (a sync the kernel does not make), skipped while a graph captures (the
    # kernel clamps them then), and for a perm the kernel refuses anyway (its dtype and
    # shape are checked there).
    if (
        perm is not None
        and perm.dtype == torch.int32
        and perm.shape == (size_k,)
        and not torch.cuda.is_current_stream_capturing()
        and bool(((perm < 0) | (perm >= size_k)).any())
    ):
        raise ValueError(f"argument 'perm': values must lie in [0, {size_k})")
    out = torch.empty(b_q_weight.numel(), dtype=torch.int32, device=b_q_weight.device)
    module.gptq_marlin_repack(
        b_q_weight.contiguous(),
        None if perm is None else perm.contiguous(),
        out,
        size_k,
        size_n,
        num_bits,
    )
    return repacked(out, size_k)


__all__ = ["gptq_marlin_repack"]
