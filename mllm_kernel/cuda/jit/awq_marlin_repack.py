"""``awq_marlin_repack`` (the original mllm-kernel's module path): AWQ-packed weights
to the Marlin layout of :func:`mllm_kernel.cuda.jit.gptq_marlin_gemm`."""

from __future__ import annotations

import torch

from mllm_kernel.cuda.jit.gptq_marlin_repack import (
    check_packed,
    check_repack_sizes,
    marlin_repacked_empty,
)
from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import torch_op

_tracing = torch.compiler.is_dynamo_compiling

_REPACK = KernelModule(
    "awq_marlin_repack",
    device="cuda",
    sources=["marlin_repack.cu"],
    exports=["awq_marlin_repack"],
)


def awq_marlin_repack(
    b_q_weight: torch.Tensor, size_k: int, size_n: int, num_bits: int
) -> torch.Tensor:
    """AWQ-packed weights in the Marlin layout, for :func:`gptq_marlin_gemm`.

    ``b_q_weight``: int32 ``[size_k, size_n // (32 // num_bits)]`` in AWQ's column
    order inside a word (4-bit: columns 0, 2, 4, 6, 1, 3, 5, 7 from the low bits up).
    ``num_bits`` 4 or 8; ``size_k`` a multiple of 16, ``size_n`` of 64. Returns int32
    ``[size_k // 16, size_n * 16 // pack]``; zero points go through
    :func:`mllm_kernel.cuda.jit.marlin_format.awq_to_marlin_zero_points`.

    >>> q = torch.randint(0, 2**31, (4096, 4096 // 8), dtype=torch.int32, device="cuda")
    >>> awq_marlin_repack(q, 4096, 4096, 4).shape  # doctest: +SKIP
    torch.Size([256, 8192])
    """
    if _tracing():
        return AWQ_MARLIN_REPACK_OP(b_q_weight, size_k, size_n, num_bits)
    b_q_weight = op_inputs.tensor(b_q_weight, "b_q_weight")
    size_k, size_n, num_bits = check_repack_sizes(size_k, size_n, num_bits)
    pack = 32 // num_bits
    check_packed(b_q_weight, (size_k, size_n // pack), "AWQ: size_k, size_n // (32 // num_bits)")
    try:
        module = _REPACK[b_q_weight.get_device()]
        out = torch.empty(
            (size_k // 16, size_n * 16 // pack), dtype=torch.int32, device=b_q_weight.device
        )
        module.awq_marlin_repack(b_q_weight.contiguous(), out, size_k, size_n, num_bits)
    except Exception as error:
        op_inputs.explain(error, "cuda", b_q_weight=b_q_weight)
        raise
    return out


AWQ_MARLIN_REPACK_OP = torch_op(
    "awq_marlin_repack",
    "(Tensor b_q_weight, SymInt size_k, SymInt size_n, int num_bits) -> Tensor",
    fake=marlin_repacked_empty,
).implement("cuda", awq_marlin_repack)


__all__ = ["awq_marlin_repack"]
