"""rmsnorm, fused_add_rmsnorm and rmsnorm_backward on the CPU (declared in
:mod:`mllm_kernel.ops.rmsnorm`)."""

from __future__ import annotations

import torch

from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.rmsnorm import FUSED_ADD_RMSNORM, RMSNORM, RMSNORM_BACKWARD

_RMSNORM = KernelModule(
    "rmsnorm",
    device="cpu",
    sources=["rmsnorm.cpp"],
    exports=["rmsnorm", "fused_add_rmsnorm", "rmsnorm_backward"],
)


@RMSNORM.kernel("cpu")
def rmsnorm(input, weight, eps, out):
    """each row of ``input`` contiguous (rows may be strided).

    >>> rmsnorm(torch.full((1, 4), 2.0), torch.ones(4))
    tensor([[1.0000, 1.0000, 1.0000, 1.0000]])
    """
    out = torch.empty_like(input) if out is None else out
    _RMSNORM[()].rmsnorm(out, input, weight, eps, torch.get_num_threads())
    return out


@FUSED_ADD_RMSNORM.kernel("cpu")
def fused_add_rmsnorm(input, residual, weight, eps):
    """rows of both may be strided.

    >>> x, residual = torch.ones(1, 4), torch.ones(1, 4)
    >>> fused_add_rmsnorm(x, residual, torch.ones(4))
    >>> residual
    tensor([[2., 2., 2., 2.]])
    """
    _RMSNORM[()].fused_add_rmsnorm(input, residual, weight, eps, torch.get_num_threads())


@RMSNORM_BACKWARD.kernel("cpu")
def rmsnorm_backward(grad_output, input, weight, eps):
    """the row sums do not depend on the thread count.

    >>> x, w = torch.randn(2, 8), torch.ones(8)
    >>> [g.shape for g in rmsnorm_backward(torch.ones(2, 8), x, w)]
    [torch.Size([2, 8]), torch.Size([8])]
    """
    grad_input = torch.empty_like(input)
    grad_weight = weight.new_empty(size=weight.shape, dtype=torch.float32)
    _RMSNORM[()].rmsnorm_backward(
        grad_input, grad_weight, grad_output, input, weight, eps, torch.get_num_threads()
    )
    return grad_input, grad_weight.to(weight.dtype)
