"""add_constant and add_constant_runtime on the CPU (declared in
:mod:`mllm_kernel.ops.add_constant`)."""

from __future__ import annotations

import torch

from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.add_constant import (
    ADD_CONSTANT,
    ADD_CONSTANT_RUNTIME,
    ALLOWED_CONSTANTS,
    checked_constant,
)

_ADD_CONSTANT = KernelModule(
    "add_constant",
    device="cpu",
    sources=["add_constant.cpp"],
    exports=["add_constant"],
    variants=[(c,) for c in ALLOWED_CONSTANTS],
    check_variant=checked_constant,
)
_ADD_CONSTANT_RUNTIME = KernelModule(
    "add_constant_runtime",
    device="cpu",
    sources=["add_constant.cpp"],
    exports=["add_constant_runtime"],
)


@ADD_CONSTANT.kernel("cpu")
def add_constant(src, constant, out):
    """``src``: any shape and strides; float32, float64, bfloat16, float16, int32 or
    int64; ``out`` any strides but zero ones.

    >>> add_constant(torch.zeros(3), 8)
    tensor([8., 8., 8.])
    """
    out = torch.empty_like(src) if out is None else out
    _ADD_CONSTANT[constant].add_constant(out, src, torch.get_num_threads())
    return out


@ADD_CONSTANT_RUNTIME.kernel("cpu")
def add_constant_runtime(src, constant, out):
    """``src``: any shape and strides; float32, float64, bfloat16 or float16, computed
    in float32 for the 16-bit types. Unlike torch, ``constant`` is not first rounded to
    ``src``'s dtype, so 16-bit results may differ from torch's by one unit in the last
    place (they are closer to the exact sum).

    >>> add_constant_runtime(torch.zeros(2), 0.5)
    tensor([0.5000, 0.5000])
    """
    out = torch.empty_like(src) if out is None else out
    _ADD_CONSTANT_RUNTIME[()].add_constant_runtime(out, src, constant, torch.get_num_threads())
    return out
