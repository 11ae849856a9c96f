"""softmax (with temperature) along any dim on the CPU, computed in float32."""

from __future__ import annotations

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
    (a numpy array) is taken; the result is a torch tensor.

    >>> softmax(torch.zeros(2, 2))
    tensor([[0.5000, 0.5000],
            [0.5000, 0.5000]])
    """
    if _tracing():
        return SOFTMAX_OP(x, dim, temperature, out=out)
    x = op_inputs.tensor(x, "x")
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


SOFTMAX_OP = torch_op(
    "softmax",
    "(Tensor x, int dim=-1, float? temperature=None) -> Tensor",
    fake=lambda x, dim=-1, temperature=None: torch.empty_like(x),
    out="out",
).implement("cpu", softmax)
