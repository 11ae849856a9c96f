"""Numerically stable softmax (with temperature) and its backward."""

from __future__ import annotations

import torch

from mllm_kernel.cuda.jit.device_module import module_for
from mllm_kernel.jit_utils import cache_once, load_cuda_jit, op_inputs, register_kernel


@register_kernel("softmax", device="cuda", variants=[()])
@cache_once
def _module():
    return load_cuda_jit(
        "softmax",
        cuda_files=["softmax.cu"],
        cuda_wrappers=[
            ("softmax_forward", "mllm_kernel::cuda::softmax_forward"),
            ("softmax_backward", "mllm_kernel::cuda::softmax_backward"),
        ],
    )


def softmax(
    x: torch.Tensor,
    dim: int = -1,
    temperature: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``softmax(x / temperature)`` along ``dim`` (fp32/fp16/bf16, fp32 math).

    Rows of any length (1 to 256k and beyond); the last dim is the fast case, any
    other ``dim`` is moved last through a copy. A ``dim`` out of range raises
    IndexError, as torch.softmax does. ``out``: ``x``'s shape and dtype, no zero
    strides; it may be ``x`` itself, but not overlap it otherwise.

    >>> softmax(torch.randn(4, 128256, device="cuda"), temperature=0.7).sum(-1)  # doctest: +SKIP
    tensor([1.0000, 1.0000, 1.0000, 1.0000], device='cuda:0')
    """
    x = op_inputs.tensor(x, "x")
    t = 1.0 if temperature is None else op_inputs.number(temperature, "temperature")
    if out is not None:
        out = op_inputs.output(out, "out")
    if type(dim) is not int or dim != -1:
        dim = op_inputs.dim(dim, x.dim())
    last = dim in (-1, x.dim() - 1)
    try:
        module = module_for(_module, x)
        src = x if last else x.movedim(dim, -1).contiguous()
        dst = out if (out is not None and last) else torch.empty_like(src)
        module.softmax_forward(dst, src, t)
    except Exception as error:
        op_inputs.explain(error, "cuda", x=x, out=out)
        raise
    if last:
        return dst
    result = dst.movedim(-1, dim)
    if out is None:
        return result
    out.copy_(result)
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
    grad_out = op_inputs.tensor(grad_out, "grad_out")
    out = op_inputs.tensor(out, "out")
    try:
        if grad_input is None:
            grad_input = torch.empty_like(out)
        else:
            grad_input = op_inputs.output(grad_input, "grad_input")
        module_for(_module, out).softmax_backward(grad_input, grad_out, out)
    except Exception as error:
        op_inputs.explain(error, "cuda", grad_out=grad_out, out=out, grad_input=grad_input)
        raise
    return grad_input
