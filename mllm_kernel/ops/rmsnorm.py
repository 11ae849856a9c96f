"""RMSNorm: plain (differentiable), fused with the residual add (in place), gated by
silu(z), and its backward."""

from __future__ import annotations

from typing import Any

import torch

from mllm_kernel.ops.op import Op, like, named


def rmsnorm(
    input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Returns ``input / sqrt(mean(input**2, -1) + eps) * weight`` over the last dim,
    computed in float32.

    ``input``: ``[..., hidden]`` float32, bfloat16 or float16, any hidden size and leading
    shape. ``weight``: ``[hidden]``, ``input``'s dtype. ``eps``: a number. ``out``:
    written in place if given (``input``'s shape and dtype, no zero strides); it may be
    ``input`` itself, but not overlap ``input`` or ``weight`` otherwise. Any DLPack
    tensor (a numpy or CuPy array) is taken; the result is a torch tensor.
    Differentiable: with a tensor requiring grad the result has a grad_fn
    (``rmsnorm_backward``).
    """


def fused_add_rmsnorm(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> None:
    """In place: ``residual += input``, then ``input = rmsnorm(residual, weight, eps)``.

    The same numbers on every device: the sum is taken in float32 and stored in
    ``residual`` (rounded to its dtype), and the norm is that of ``residual`` as stored,
    in float32: ``input`` ends as ``rmsnorm(residual)`` of the ``residual`` the caller
    sees afterwards. ``residual`` has ``input``'s shape and dtype; both are written, so
    neither may have a zero stride or overlap the other or ``weight``.
    """


def rms_norm_gated(
    x: torch.Tensor,
    weight: torch.Tensor,
    z: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``rmsnorm(x) * weight * silu(z)`` over the last dim (``z`` shaped like ``x``);
    with ``z=None``, plain ``rmsnorm`` (``rmsnorm(x) * weight``). The argument order is
    the original mllm-kernel's. ``out`` as for ``rmsnorm``: it may be ``x`` itself, but
    overlap neither ``x`` nor ``z`` otherwise.
    """


def rmsnorm_backward(
    grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of ``rmsnorm`` for ``grad_output`` (``input``'s shape and dtype):
    ``(grad_input, grad_weight)``, in ``input``'s and ``weight``'s dtypes.

    With ``r = 1 / sqrt(mean(input**2, -1) + eps)``: ``grad_input = r * grad_output *
    weight - input * r**3 / hidden * sum(grad_output * weight * input, -1)`` and
    ``grad_weight = sum over rows of grad_output * input * r``, in float32; the row sums
    are taken in an order that depends on the shape only (no atomics), so the result is
    deterministic. What ``rmsnorm(...).backward()`` runs.
    """


def _save_for_backward(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    input, weight, eps = inputs
    ctx.save_for_backward(input, weight)
    ctx.eps = eps


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    """rmsnorm_backward on the device of the tensors."""
    input, weight = ctx.saved_tensors
    # A grad may come expanded (the backward of .sum() has zero strides): the kernels
    # take rows with a unit last stride.
    grad_input, grad_weight = RMSNORM_BACKWARD.torch_op(grad.contiguous(), input, weight, ctx.eps)
    return grad_input, grad_weight, None


RMSNORM = Op(rmsnorm, out="out", fake=like("input"), autograd=(_backward, _save_for_backward))
FUSED_ADD_RMSNORM = Op(fused_add_rmsnorm, writes=("input", "residual"))
RMS_NORM_GATED = Op(rms_norm_gated, out="out", fake=like("x"))
RMSNORM_BACKWARD = Op(
    rmsnorm_backward,
    fake=named(lambda input, weight: (torch.empty_like(input), torch.empty_like(weight))),
)
