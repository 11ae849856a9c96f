"""Numerically stable softmax (with temperature) and its backward, on the GPU."""

from __future__ import annotations

import torch

from mllm_kernel.cpu.jit.softmax import SOFTMAX_AUTOGRAD
from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import refuse_grad, torch_op

_tracing = torch.compiler.is_dynamo_compiling

_SOFTMAX = KernelModule(
    "softmax",
    device="cuda",
    sources=["softmax.cu"],
    exports=["softmax_forward", "softmax_backward"],
)


def softmax(
    x: torch.Tensor,
    dim: int = -1,
    temperature: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``softmax(x / temperature)`` along ``dim`` (fp32/fp16/bf16, fp32 math).

    Rows of any length (1 to 256k and beyond); the last dim is the fast case, any
    other ``dim`` is moved last through a copy (the result has ``x``'s layout, as
    torch.softmax's does). A ``dim`` out of range raises IndexError, as torch.softmax
    does. ``out``: ``x``'s shape and dtype, no zero strides; it may be ``x`` itself,
    but not overlap it otherwise. Differentiable through :func:`softmax_backward`.

    >>> softmax(torch.randn(4, 128256, device="cuda"), temperature=0.7).sum(-1)  # doctest: +SKIP
    tensor([1.0000, 1.0000, 1.0000, 1.0000], device='cuda:0')
    """
    if _tracing():
        return SOFTMAX_OP(x, dim, temperature, out=out)
    x = op_inputs.tensor(x, "x")
    # Differentiable: the registered op (which refuses a grad-requiring out=).
    if (x.requires_grad or getattr(out, "requires_grad", False)) and torch.is_grad_enabled():
        return SOFTMAX_OP(x, dim, temperature, out=out)
    t = 1.0 if temperature is None else op_inputs.number(temperature, "temperature")
    if out is not None:
        out = op_inputs.output(out, "out")
    if type(dim) is not int or dim != -1:
        dim = op_inputs.dim(dim, x.dim())
    try:
        module = _SOFTMAX[x.get_device()]
        if dim in (-1, x.dim() - 1):
            if out is None:
                out = torch.empty_like(x)
            module.softmax_forward(out, x, t)
            return out
        rows = x.movedim(dim, -1).contiguous()  # may be x itself: not written
        result = torch.empty_like(rows)
        module.softmax_forward(result, rows, t)
    except Exception as error:
        op_inputs.explain(error, "cuda", x=x, out=out)
        raise
    if out is None:
        out = torch.empty_like(x)
    out.copy_(result.movedim(-1, dim))
    return out


def softmax_backward(
    grad_out: torch.Tensor, out: torch.Tensor, grad_input: torch.Tensor | None = None
) -> torch.Tensor:
    """The gradient of softmax over the last dim: ``out * (grad_out - sum(grad_out * out))``,
    where ``out`` is the forward result. Written into ``grad_input`` if given (``out``'s
    shape and dtype, no zero strides, sharing no memory with ``grad_out`` or ``out``),
    else into a new tensor.

    >>> softmax_backward(torch.ones(2, 8, device="cuda"), softmax(torch.randn(2, 8, device="cuda")))
    ... # doctest: +SKIP
    """
    if _tracing():
        return SOFTMAX_BACKWARD_OP(grad_out, out, grad_input=grad_input)
    grad_out = op_inputs.tensor(grad_out, "grad_out")
    out = op_inputs.tensor(out, "out")
    refuse_grad("softmax_backward", grad_out, out, grad_input)
    try:
        if grad_input is None:
            grad_input = torch.empty_like(out)
        else:
            grad_input = op_inputs.output(grad_input, "grad_input")
        _SOFTMAX[out.get_device()].softmax_backward(grad_input, grad_out, out)
    except Exception as error:
        op_inputs.explain(error, "cuda", grad_out=grad_out, out=out, grad_input=grad_input)
        raise
    return grad_input


SOFTMAX_OP = torch_op(
    "softmax",
    "(Tensor x, int dim=-1, float? temperature=None) -> Tensor",
    fake=lambda x, dim=-1, temperature=None: torch.empty_like(x),
    out="out",
    autograd=SOFTMAX_AUTOGRAD,
).implement("cuda", softmax)
SOFTMAX_BACKWARD_OP = torch_op(
    "softmax_backward",
    "(Tensor grad_out, Tensor out) -> Tensor",
    fake=lambda grad_out, out: torch.empty_like(out),
    out="grad_input",
).implement("cuda", softmax_backward)
