"""Numerically stable softmax (with temperature) and its backward on the GPU (declared in
:mod:`mllm_kernel.ops.softmax`)."""

from __future__ import annotations

import torch

from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.softmax import SOFTMAX, SOFTMAX_BACKWARD

_SOFTMAX = KernelModule(
    "softmax",
    device="cuda",
    sources=["softmax.cu"],
    exports=["softmax_forward", "softmax_backward"],
)


def _rows_in_place(x: torch.Tensor) -> bool:
    """Whether the kernel reads ``x``'s rows where they are (rows.hpp's as_rows): the
    last dim contiguous, the leading ones collapsing into one row stride; other layouts
    are copied first (tests/test_cuda_softmax.py checks that both agree). A 0-d x goes
    to the kernel, which refuses it."""
    if x.dim() <= 2 and (x.dim() == 0 or x.stride(-1) == 1 or x.size(-1) <= 1):
        return True
    if x.is_contiguous():
        return True
    if x.size(-1) > 1 and x.stride(-1) != 1:
        return False
    span = None  # the elements the inner leading dims step over, once collapsed
    for size, stride in zip(reversed(x.shape[:-1]), reversed(x.stride()[:-1]), strict=True):
        if size == 1:
            continue
        if span is not None and stride != span:
            return False
        span = stride * size
    return True


@SOFTMAX.kernel("cuda")
def softmax(x, dim, temperature, out):
    """rows of 1 to 256k elements and beyond; a ``dim`` other than the last, or rows that
    are not evenly strided with a contiguous last dim, go through a contiguous copy (the
    result has ``x``'s layout, as torch.softmax's does). The backward is
    :func:`softmax_backward`.

    >>> softmax(torch.randn(4, 128256, device="cuda"), temperature=0.7).sum(-1)  # doctest: +SKIP
    tensor([1.0000, 1.0000, 1.0000, 1.0000], device='cuda:0')
    """
    t = 1.0 if temperature is None else temperature
    if dim != -1:
        dim = op_inputs.dim(dim, x.dim())
    module = _SOFTMAX[x.get_device()]
    # In place along the last dim; or an out= the copy below would take wrongly (copy_
    # broadcasts, casts and crosses devices), which the kernel's checks refuse as passed.
    mismatched = out is not None and (
        out.shape != x.shape or out.dtype != x.dtype or out.device != x.device
    )
    if (dim in (-1, x.dim() - 1) and _rows_in_place(x)) or mismatched:
        out = torch.empty_like(x) if out is None else out
        module.softmax_forward(out, x, t)
        return out
    rows = x.movedim(dim, -1).contiguous()  # may be x itself: not written
    result = torch.empty_like(rows)
    module.softmax_forward(result, rows, t)
    out = torch.empty_like(x) if out is None else out
    out.copy_(result.movedim(-1, dim))
    return out


@SOFTMAX_BACKWARD.kernel("cuda")
def softmax_backward(grad_out, out, grad_input):
    """any float dtype of the forward.

    >>> softmax_backward(torch.ones(2, 8, device="cuda"), softmax(torch.randn(2, 8, device="cuda")))
    ... # doctest: +SKIP
    """
    grad_input = torch.empty_like(out) if grad_input is None else grad_input
    _SOFTMAX[out.get_device()].softmax_backward(grad_input, grad_out, out)
    return grad_input
