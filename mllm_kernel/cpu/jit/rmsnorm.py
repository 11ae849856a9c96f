"""rmsnorm and fused_add_rmsnorm (sglang / FlashInfer semantics) on the CPU."""

from __future__ import annotations

import torch

from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import torch_op

_tracing = torch.compiler.is_dynamo_compiling

_RMSNORM = KernelModule(
    "rmsnorm", device="cpu", sources=["rmsnorm.cpp"], exports=["rmsnorm", "fused_add_rmsnorm"]
)


def rmsnorm(
    input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Returns ``input / sqrt(mean(input**2, -1) + eps) * weight``, computed in float32.

    ``input``: ``[..., hidden]`` float32, bfloat16 or float16, each row contiguous
    (rows may be strided). ``weight``: ``[hidden]``, ``input``'s dtype. ``eps``: a
    number. ``out``: written in place if given (``input``'s shape and dtype, no zero
    strides); it may be ``input`` itself, but not overlap ``input`` or ``weight``
    otherwise. Any DLPack tensor (a numpy array) is taken; the result is a torch tensor.

    >>> rmsnorm(torch.full((1, 4), 2.0), torch.ones(4))
    tensor([[1.0000, 1.0000, 1.0000, 1.0000]])
    """
    if _tracing():
        return RMSNORM_OP(input, weight, eps, out=out)
    input = op_inputs.tensor(input, "input")
    weight = op_inputs.tensor(weight, "weight")
    if torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad):
        return RMSNORM_OP(input, weight, eps, out=out)  # autograd's path (see RMSNORM_OP)
    eps = op_inputs.number(eps, "eps")
    try:
        out = torch.empty_like(input) if out is None else op_inputs.output(out, "out")
        _RMSNORM[()].rmsnorm(out, input, weight, eps, torch.get_num_threads())
    except Exception as error:
        op_inputs.explain(error, "cpu", input=input, weight=weight, out=out)
        raise
    return out


def fused_add_rmsnorm(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> None:
    """In place: ``residual += input``, then ``input = rmsnorm(residual, weight, eps)``.

    The norm uses the float32 sum, not its rounding stored in ``residual``
    (as FlashInfer). ``residual`` has ``input``'s shape and dtype; rows of both may
    be strided. Both are written, so neither may have a zero stride or overlap
    the other or ``weight``.

    >>> x, residual = torch.ones(1, 4), torch.ones(1, 4)
    >>> fused_add_rmsnorm(x, residual, torch.ones(4))
    >>> residual
    tensor([[2., 2., 2., 2.]])
    """
    if _tracing():
        return FUSED_ADD_RMSNORM_OP(input, residual, weight, eps)
    input = op_inputs.output(input, "input")
    residual = op_inputs.output(residual, "residual")
    weight = op_inputs.tensor(weight, "weight")
    eps = op_inputs.number(eps, "eps")
    try:
        _RMSNORM[()].fused_add_rmsnorm(input, residual, weight, eps, torch.get_num_threads())
    except Exception as error:
        op_inputs.explain(error, "cpu", input=input, residual=residual, weight=weight)
        raise


# Without a backward yet (its kernels are their own change), a grad required of rmsnorm
# is a RuntimeError that says so; the backward is passed as torch_op(..., autograd=).
RMSNORM_OP = torch_op(
    "rmsnorm",
    "(Tensor input, Tensor weight, float eps=1e-06) -> Tensor",
    fake=lambda input, weight, eps=1e-6: torch.empty_like(input),
    out="out",
).implement("cpu", rmsnorm)
FUSED_ADD_RMSNORM_OP = torch_op(
    "fused_add_rmsnorm",
    "(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float eps=1e-06) -> ()",
).implement("cpu", fused_add_rmsnorm)
