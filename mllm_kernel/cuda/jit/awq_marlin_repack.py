"""``awq_marlin_repack`` on the GPU (declared in :mod:`mllm_kernel.ops.marlin`; the
original mllm-kernel's module path): AWQ-packed weights to the Marlin layout of
:func:`mllm_kernel.cuda.jit.gptq_marlin_gemm`."""

from __future__ import annotations

import torch

from mllm_kernel.cuda.jit.gptq_marlin_repack import repacked
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.marlin import AWQ_MARLIN_REPACK

_REPACK = KernelModule(
    "awq_marlin_repack",
    device="cuda",
    sources=["marlin_repack.cu"],
    exports=["awq_marlin_repack"],
)


@AWQ_MARLIN_REPACK.kernel("cuda")
def awq_marlin_repack(b_q_weight, size_k, size_n, num_bits):
    """runs on ``b_q_weight``'s GPU.

    >>> q = torch.randint(0, 2**31, (4096, 4096 // 8), dtype=torch.int32, device="cuda")
    >>> awq_marlin_repack(q, 4096, 4096, 4).shape  # doctest: +SKIP
    torch.Size([256, 8192])
    """
    module = _REPACK[b_q_weight.get_device()]
    out = torch.empty(b_q_weight.numel(), dtype=torch.int32, device=b_q_weight.device)
    module.awq_marlin_repack(b_q_weight.contiguous(), out, size_k, size_n, num_bits)
    return repacked(out, size_k)


__all__ = ["awq_marlin_repack"]
