"""RMSNorm on the GPU (declared in :mod:`mllm_kernel.ops.rmsnorm`): plain, fused with
the residual add (in place), gated by silu(z), and the backward."""

from __future__ import annotations

import math

import torch

from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.rmsnorm import FUSED_ADD_RMSNORM, RMS_NORM_GATED, RMSNORM, RMSNORM_BACKWARD

_RMSNORM = KernelModule(
    "rmsnorm",
    device="cuda",
    sources=["rmsnorm.cu"],
    exports=[
        "rmsnorm",
        "fused_add_rmsnorm",
        "rms_norm_gated",
        "rmsnorm_backward",
        "rmsnorm_backward_workspace_rows",
    ],
)


@RMSNORM.kernel("cuda")
def rmsnorm(input, weight, eps, out):
    """any strides with contiguous rows.

    >>> x = torch.randn(4, 4096, dtype=torch.bfloat16, device="cuda")
    >>> rmsnorm(x, torch.ones(4096, dtype=torch.bfloat16, device="cuda")).shape
    torch.Size([4, 4096])
    """
    out = torch.empty_like(input) if out is None else out
    _RMSNORM[input.get_device()].rmsnorm(out, input, weight, eps)
    return out


@FUSED_ADD_RMSNORM.kernel("cuda")
def fused_add_rmsnorm(input, residual, weight, eps):
    """one CTA per row.

    >>> fused_add_rmsnorm(hidden, residual, weight)  # doctest: +SKIP
    """
    _RMSNORM[input.get_device()].fused_add_rmsnorm(input, residual, weight, eps)


@RMS_NORM_GATED.kernel("cuda")
def rms_norm_gated(x, weight, z, eps, out):
    """fp32/fp16/bf16.

    >>> rms_norm_gated(x, weight, z=gate, eps=1e-6).shape == x.shape  # doctest: +SKIP
    True
    """
    out = torch.empty_like(x) if out is None else out
    module = _RMSNORM[x.get_device()]
    if z is None:
        module.rmsnorm(out, x, weight, eps)
    else:
        module.rms_norm_gated(out, x, z, weight, eps)
    return out


@RMSNORM_BACKWARD.kernel("cuda")
def rmsnorm_backward(grad_output, input, weight, eps):
    """``grad_weight``'s row sum is per-CTA float32 partials in a workspace, added in row
    order by a second kernel; the workspace's size is the kernel's own rule
    (``rmsnorm_backward_workspace_rows``).

    >>> x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    >>> w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    >>> [g.shape for g in rmsnorm_backward(torch.ones_like(x), x, w)]
    [torch.Size([8, 4096]), torch.Size([4096])]
    """
    module = _RMSNORM[input.get_device()]
    hidden = input.shape[-1] if input.dim() else 0
    # The rows are the leading dims' product, also where hidden is 0 (numel is then 0).
    rows = math.prod(input.shape[:-1]) if input.dim() else 0
    workspace = torch.empty(
        (module.rmsnorm_backward_workspace_rows(rows), hidden),
        dtype=torch.float32,
        device=input.device,
    )
    grad_input = torch.empty_like(input)
    grad_weight = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
    module.rmsnorm_backward(grad_input, grad_weight, workspace, grad_output, input, weight, eps)
    return grad_input, grad_weight.to(weight.dtype)
