"""Gated activations on the GPU (declared in :mod:`mllm_kernel.ops.activation`): silu,
gelu and gelu-tanh, and silu's backward."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.activation import (
    GELU_AND_MUL,
    GELU_TANH_AND_MUL,
    SILU_AND_MUL,
    SILU_AND_MUL_BACKWARD,
    gated_output,
)

_ACTIVATION = KernelModule(
    "activation",
    device="cuda",
    sources=["activation.cu"],
    exports=["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul", "silu_and_mul_backward"],
)


def _gated(export: str, doc: str) -> Callable[..., torch.Tensor]:
    """The kernel function of the gated activation the module exports as ``export``."""

    def kernel(input, out):
        out = gated_output(input) if out is None else out
        getattr(_ACTIVATION[input.get_device()], export)(out, input)
        return out

    kernel.__doc__ = doc
    return kernel


silu_and_mul = SILU_AND_MUL.kernel("cuda")(
    _gated(
        "silu_and_mul",
        """any leading shape, rows contiguous.

    >>> silu_and_mul(torch.randn(8, 2 * 11008, device="cuda", dtype=torch.bfloat16)).shape
    torch.Size([8, 11008])
    """,
    )
)
gelu_and_mul = GELU_AND_MUL.kernel("cuda")(
    _gated(
        "gelu_and_mul",
        """as for ``silu_and_mul``.

    >>> gelu_and_mul(torch.randn(2, 8, device="cuda")).shape
    torch.Size([2, 4])
    """,
    )
)
gelu_tanh_and_mul = GELU_TANH_AND_MUL.kernel("cuda")(
    _gated(
        "gelu_tanh_and_mul",
        """as for ``silu_and_mul``.

    >>> gelu_tanh_and_mul(torch.randn(2, 8, device="cuda")).shape
    torch.Size([2, 4])
    """,
    )
)


@SILU_AND_MUL_BACKWARD.kernel("cuda")
def silu_and_mul_backward(grad_output, input):
    """float32 math.

    >>> silu_and_mul_backward(torch.ones(8, 11008, device="cuda"),
    ...                       torch.randn(8, 2 * 11008, device="cuda")).shape
    torch.Size([8, 22016])
    """
    grad_input = torch.empty_like(input)
    _ACTIVATION[input.get_device()].silu_and_mul_backward(grad_input, grad_output, input)
    return grad_input
