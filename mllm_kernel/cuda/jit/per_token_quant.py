"""Per-token int8 quantisation of activations: the inputs of :func:`int8_scaled_mm`."""

from __future__ import annotations

import torch

from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import refuse_grad, torch_op

_tracing = torch.compiler.is_dynamo_compiling

_QUANT = KernelModule(
    "per_token_quant",
    device="cuda",
    sources=["per_token_quant.cu"],
    exports=["per_token_quant_int8"],
)


def per_token_quant_int8(
    x: torch.Tensor, scale_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantises each row of ``x``'s last dim to int8 with its own scale, in one pass.

    ``scales = max(|row|) / 127`` (at least ``1e-10 / 127``) and ``x_q = round(row *
    127 / max(|row|))``, rounding halves away from zero, so ``x ~ x_q * scales`` with
    ``|x_q| <= 127``. ``x``: fp32, fp16 or bf16, any leading shape, any hidden size,
    the last dim contiguous. Returns ``x_q`` (int8, ``x``'s shape) and ``scales``
    (``scale_dtype``, which must be float32: ``x.shape[:-1] + (1,)``), the original
    mllm-kernel's shapes.

    >>> x_q, scales = per_token_quant_int8(torch.randn(16, 4096, device="cuda"))
    >>> x_q.dtype, scales.shape
    (torch.int8, torch.Size([16, 1]))
    """
    if _tracing():
        return PER_TOKEN_QUANT_INT8_OP(x, scale_dtype)
    x = op_inputs.tensor(x, "x")
    refuse_grad("per_token_quant_int8", x)
    if scale_dtype != torch.float32:
        raise ValueError(
            f"argument 'scale_dtype': expected torch.float32 (the scales int8_scaled_mm reads) "
            f"but got {scale_dtype!r}"
        )
    try:
        x_q = torch.empty(x.shape, dtype=torch.int8, device=x.device)
        scales = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
        _QUANT[x.get_device()].per_token_quant_int8(x_q, scales, x)
    except Exception as error:
        op_inputs.explain(error, "cuda", x=x)
        raise
    return x_q, scales


def _per_token_quant_int8_fake(
    x: torch.Tensor, scale_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    # New contiguous tensors, as the eager op allocates them (x's strides are not kept).
    return (
        x.new_empty(x.shape, dtype=torch.int8),
        x.new_empty((*x.shape[:-1], 1), dtype=torch.float32),
    )


PER_TOKEN_QUANT_INT8_OP = torch_op(
    "per_token_quant_int8",
    "(Tensor x, ScalarType scale_dtype=float32) -> (Tensor, Tensor)",
    fake=_per_token_quant_int8_fake,
).implement("cuda", per_token_quant_int8)
