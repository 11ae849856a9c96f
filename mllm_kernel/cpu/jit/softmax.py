"""softmax (with temperature) along any dim on the CPU (declared in
:mod:`mllm_kernel.ops.softmax`)."""

from __future__ import annotations

import torch

from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.softmax import SOFTMAX

_SOFTMAX = KernelModule("softmax", device="cpu", sources=["softmax.cpp"], exports=["softmax"])


@SOFTMAX.kernel("cpu")
def softmax(x, dim, temperature, out):
    """other dims than the last are read strided (no copy); the backward runs in torch
    ops.

    >>> softmax(torch.zeros(2, 2))
    tensor([[0.5000, 0.5000],
            [0.5000, 0.5000]])
    """
    t = 1.0 if temperature is None else temperature
    if dim != -1:
        dim = op_inputs.dim(dim, x.dim())
    out = torch.empty_like(x) if out is None else out
    # The last dim, or an out= of another shape: the kernel's check names it as passed
    # (moved, its shape would read swapped, or fail to move at all).
    if dim in (-1, x.dim() - 1) or out.shape != x.shape:
        _SOFTMAX[()].softmax(out, x, t, torch.get_num_threads())
    else:  # the kernel normalises the last dim: move `dim` there (views, no copies)
        _SOFTMAX[()].softmax(out.movedim(dim, -1), x.movedim(dim, -1), t, torch.get_num_threads())
    return out
