"""Gated activations on the CPU (declared in :mod:`mllm_kernel.ops.activation`)."""

from __future__ import annotations

import torch

from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.activation import SILU_AND_MUL, SILU_AND_MUL_BACKWARD, gated_output

_ACTIVATION = KernelModule(
    "activation",
    device="cpu",
    sources=["activation.cpp"],
    exports=["silu_and_mul", "silu_and_mul_backward"],
)


@SILU_AND_MUL.kernel("cpu")
def silu_and_mul(input, out):
    """each row of ``input`` contiguous (rows may be strided).

    >>> silu_and_mul(torch.tensor([[0.0, 3.0]]))
    tensor([[0.]])
    """
    out = gated_output(input) if out is None else out
    _ACTIVATION[()].silu_and_mul(out, input, torch.get_num_threads())
    return out


@SILU_AND_MUL_BACKWARD.kernel("cpu")
def silu_and_mul_backward(grad_output, input):
    """as on every device.

    >>> silu_and_mul_backward(torch.ones(1, 1), torch.tensor([[0.0, 3.0]]))
    tensor([[1.5000, 0.0000]])
    """
    grad_input = torch.empty_like(input)
    _ACTIVATION[()].silu_and_mul_backward(grad_input, grad_output, input, torch.get_num_threads())
    return grad_input
