"""Per-token int8 quantisation of activations on the GPU (declared in
:mod:`mllm_kernel.ops.gemm`): the inputs of :func:`int8_scaled_mm`."""

from __future__ import annotations

import torch

from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.gemm import PER_TOKEN_QUANT_INT8

_QUANT = KernelModule(
    "per_token_quant",
    device="cuda",
    sources=["per_token_quant.cu"],
    exports=["per_token_quant_int8"],
)


@PER_TOKEN_QUANT_INT8.kernel("cuda")
def per_token_quant_int8(x, scale_dtype):
    """one CTA per row; the rows may be strided (each contiguous).

    >>> x_q, scales = per_token_quant_int8(torch.randn(16, 4096, device="cuda"))
    >>> x_q.dtype, scales.shape
    (torch.int8, torch.Size([16, 1]))
    """
    x_q = x.new_empty(size=x.shape, dtype=torch.int8)
    scales = x.new_empty(size=(*x.shape[:-1], 1), dtype=scale_dtype)
    _QUANT[x.get_device()].per_token_quant_int8(x_q, scales, x)
    return x_q, scales
