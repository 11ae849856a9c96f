"""softmax (with temperature) along any dim on the CPU, computed in float32."""

from __future__ import annotations

from typing import Any

import torch

from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import torch_op

_tracing = torch.compiler.is_dynamo_compiling

_SOFTMAX = KernelModule("softmax", device="cpu", sources=["softmax.cpp"], exports=["softmax"])


def softmax(
    x: torch.Tensor,
    dim: int = -1,
    temperature: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Returns ``softmax(x / temperature)`` along ``dim`` in ``x``'s dtype.

    float32, bfloat16 or float16, any shape and strides. Fastest along a
    contiguous dim (the last one, usually); other dims are read strided. A
    ``dim`` out of range raises IndexError, as torch.softmax does; ``temperature``
    (default 1) must be finite and > 0. ``out``: ``x``'s shape and dtype, no zero
    strides; it may be ``x`` itself, but not overlap it otherwise. Any DLPack tensor
    (a numpy array) is taken; the result is a torch tensor. Differentiable: with ``x``
    requiring grad the result has a grad_fn (the backward in torch ops on the CPU).

    >>> softmax(torch.zeros(2, 2))
    tensor([[0.5000, 0.5000],
            [0.5000, 0.5000]])
    """
    if _tracing():
        return SOFTMAX_OP(x, dim, temperature, out=out)
    x = op_inputs.tensor(x, "x")
    # Differentiable: the registered op (which refuses a grad-requiring out=).
    if (x.requires_grad or getattr(out, "requires_grad", False)) and torch.is_grad_enabled():
        return SOFTMAX_OP(x, dim, temperature, out=out)
    t = 1.0 if temperature is None else op_inputs.number(temperature, "temperature")
    if type(dim) is not int or dim != -1:
        dim = op_inputs.dim(dim, x.dim())
    try:
        out = torch.empty_like(x) if out is None else op_inputs.output(out, "out")
        if dim in (-1, x.dim() - 1):
            _SOFTMAX[()].softmax(out, x, t, torch.get_num_threads())
        else:  # the kernel normalises the last dim: move `dim` there (views, no copies)
            _SOFTMAX[()].softmax(
                out.movedim(dim, -1), x.movedim(dim, -1), t, torch.get_num_threads()
            )
    except Exception as error:
        op_inputs.explain(error, "cpu", x=x, out=out)
        raise
    return out


def _save_for_backward(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    _, dim, temperature = inputs
    ctx.save_for_backward(output)
    ctx.dim, ctx.temperature = dim, 1.0 if temperature is None else float(temperature)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
    """d softmax(x / t) = softmax_backward(grad, out) / t, along the op's dim: the
    softmax_backward kernel on a GPU, the same formula in torch ops on the CPU."""
    (out,) = ctx.saved_tensors
    if grad.is_cuda:
        rows_grad = grad.movedim(ctx.dim, -1).contiguous()
        rows_out = out.movedim(ctx.dim, -1).contiguous()
        grad_x = torch.ops.mllm_kernel.softmax_backward(rows_grad, rows_out).movedim(-1, ctx.dim)
    else:
        grad_x = out * (grad - (grad * out).sum(ctx.dim, keepdim=True))
    return grad_x / ctx.temperature, None, None


# The one declaration of the op on both devices (the CUDA file imports these).
SOFTMAX_AUTOGRAD = (_backward, _save_for_backward)
SOFTMAX_OP = torch_op(
    "softmax",
    "(Tensor x, int dim=-1, float? temperature=None) -> Tensor",
    fake=lambda x, dim=-1, temperature=None: torch.empty_like(x),
    out="out",
    autograd=SOFTMAX_AUTOGRAD,
).implement("cpu", softmax)
