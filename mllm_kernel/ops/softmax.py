"""softmax (with temperature) along any dim, and its backward."""

from __future__ import annotations

from typing import Any

import torch

from mllm_kernel.ops.op import Op, like


def softmax(
    x: torch.Tensor,
    dim: int = -1,
    temperature: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Returns ``softmax(x / temperature)`` along ``dim`` in ``x``'s dtype, computed in
    float32.

    float32, bfloat16 or float16, any shape and strides; rows of any length. Fastest
    along a contiguous dim (the last one, usually). A ``dim`` out of range raises
    IndexError, as torch.softmax does; ``temperature`` (default 1) must be finite and
    > 0. ``out``: ``x``'s shape and dtype, no zero strides; it may be ``x`` itself, but
    not overlap it otherwise. Any DLPack tensor is taken; the result is a torch tensor.
    Differentiable: with ``x`` requiring grad the result has a grad_fn.
    """


def softmax_backward(
    grad_out: torch.Tensor, out: torch.Tensor, grad_input: torch.Tensor | None = None
) -> torch.Tensor:
    """The gradient of softmax over the last dim: ``out * (grad_out - sum(grad_out * out))``,
    where ``out`` is the forward result. Written into ``grad_input`` if given (``out``'s
    shape and dtype, no zero strides, sharing no memory with ``grad_out`` or ``out``),
    else into a new tensor.
    """


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
        grad_x = SOFTMAX_BACKWARD.torch_op(rows_grad, rows_out).movedim(-1, ctx.dim)
    else:
        # In float32, as the kernel computes it, rounded once: a 16-bit dot and difference
        # lose the small entries (bf16: ten times torch's relative error there).
        g, o = grad.float(), out.float()
        grad_x = o * (g - (g * o).sum(ctx.dim, keepdim=True)) / ctx.temperature
        return grad_x.to(grad.dtype), None, None
    return grad_x / ctx.temperature, None, None


# dim is normalised by the kernels (op_inputs.dim: it needs x's rank).
SOFTMAX = Op(softmax, out="out", fake=like("x"), autograd=(_backward, _save_for_backward))
SOFTMAX_BACKWARD = Op(softmax_backward, out="grad_input", fake=like("out"))
