"""rmsnorm (differentiable), fused_add_rmsnorm (sglang / FlashInfer semantics) and
rmsnorm_backward on the CPU."""

from __future__ import annotations

from typing import Any

import torch

from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import refuse_grad, torch_op

_tracing = torch.compiler.is_dynamo_compiling

_RMSNORM = KernelModule(
    "rmsnorm",
    device="cpu",
    sources=["rmsnorm.cpp"],
    exports=["rmsnorm", "fused_add_rmsnorm", "rmsnorm_backward"],
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
    if torch.is_grad_enabled() and (
        input.requires_grad or weight.requires_grad or getattr(out, "requires_grad", False)
    ):
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
    refuse_grad("fused_add_rmsnorm", input, residual, weight)
    try:
        _RMSNORM[()].fused_add_rmsnorm(input, residual, weight, eps, torch.get_num_threads())
    except Exception as error:
        op_inputs.explain(error, "cpu", input=input, residual=residual, weight=weight)
        raise


def rmsnorm_backward(
    grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of :func:`rmsnorm` for ``grad_output`` (``input``'s shape and dtype):
    ``(grad_input, grad_weight)``, in ``input``'s and ``weight``'s dtypes.

    With ``r = 1 / sqrt(mean(input**2, -1) + eps)``: ``grad_input = r * grad_output *
    weight - input * r**3 / hidden * sum(grad_output * weight * input, -1)`` and
    ``grad_weight = sum over rows of grad_output * input * r``, in float32; the row sums
    are taken in an order that depends on the shape only, so the result does not depend
    on the thread count. What ``rmsnorm(...).backward()`` runs.

    >>> x, w = torch.randn(2, 8), torch.ones(8)
    >>> [g.shape for g in rmsnorm_backward(torch.ones(2, 8), x, w)]
    [torch.Size([2, 8]), torch.Size([8])]
    """
    if _tracing():
        return RMSNORM_BACKWARD_OP(grad_output, input, weight, eps)
    grad_output = op_inputs.tensor(grad_output, "grad_output")
    input = op_inputs.tensor(input, "input")
    weight = op_inputs.tensor(weight, "weight")
    eps = op_inputs.number(eps, "eps")
    refuse_grad("rmsnorm_backward", grad_output, input, weight)
    try:
        grad_input = torch.empty_like(input)
        grad_weight = torch.empty(weight.shape, dtype=torch.float32)
        _RMSNORM[()].rmsnorm_backward(
            grad_input, grad_weight, grad_output, input, weight, eps, torch.get_num_threads()
        )
    except Exception as error:
        op_inputs.explain(error, "cpu", grad_output=grad_output, input=input, weight=weight)
        raise
    return grad_input, grad_weight.to(weight.dtype)


def _save_for_backward(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    input, weight, eps = inputs
    ctx.save_for_backward(input, weight)
    ctx.eps = eps


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    """rmsnorm_backward on the device of the tensors (the op of either device's file)."""
    input, weight = ctx.saved_tensors
    # A grad may come expanded (the backward of .sum() has zero strides): the kernels
    # take rows with a unit last stride.
    grad_input, grad_weight = torch.ops.mllm_kernel.rmsnorm_backward(
        grad.contiguous(), input, weight, ctx.eps
    )
    return grad_input, grad_weight, None


# The one declaration of rmsnorm's autograd on both devices (the CUDA file imports it).
RMSNORM_AUTOGRAD = (_backward, _save_for_backward)
RMSNORM_OP = torch_op(
    "rmsnorm",
    "(Tensor input, Tensor weight, float eps=1e-06) -> Tensor",
    fake=lambda input, weight, eps=1e-6: torch.empty_like(input),
    out="out",
    autograd=RMSNORM_AUTOGRAD,
).implement("cpu", rmsnorm)
RMSNORM_BACKWARD_OP = torch_op(
    "rmsnorm_backward",
    "(Tensor grad_output, Tensor input, Tensor weight, float eps=1e-06) -> (Tensor, Tensor)",
    fake=lambda grad_output, input, weight, eps=1e-6: (
        torch.empty_like(input),
        torch.empty_like(weight),
    ),
).implement("cpu", rmsnorm_backward)
FUSED_ADD_RMSNORM_OP = torch_op(
    "fused_add_rmsnorm",
    "(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float eps=1e-06) -> ()",
).implement("cpu", fused_add_rmsnorm)
