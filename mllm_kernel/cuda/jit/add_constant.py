"""add_constant and add_constant_runtime on the GPU (declared in
:mod:`mllm_kernel.ops.add_constant`): one module per compile-time constant, one for the
run-time one."""

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
    device="cuda",
    sources=["add_constant.cu"],
    exports=["add_constant"],
    variants=[(c,) for c in ALLOWED_CONSTANTS],
    check_variant=checked_constant,
)
_ADD_CONSTANT_RUNTIME = KernelModule(
    "add_constant_runtime",
    device="cuda",
    sources=["add_constant.cu"],
    exports=[("add_constant_runtime", "mllm_kernel::cuda::add_constant_runtime<>")],
)


@ADD_CONSTANT.kernel("cuda")
def add_constant(src, constant, out):
    """int32, float32, float16 or bfloat16, contiguous (``out`` too).

    >>> add_constant(torch.zeros(4, dtype=torch.int32, device="cuda"), 8)
    tensor([8, 8, 8, 8], device='cuda:0', dtype=torch.int32)
    """
    out = torch.empty_like(src) if out is None else out
    _ADD_CONSTANT[src.get_device(), constant].add_constant(out, src)
    return out


@ADD_CONSTANT_RUNTIME.kernel("cuda")
def add_constant_runtime(src, constant, out):
    """as for ``add_constant``; an integer ``constant`` for int32 tensors.

    >>> add_constant_runtime(torch.zeros(2, device="cuda", dtype=torch.float16), 0.5)
    tensor([0.5000, 0.5000], device='cuda:0', dtype=torch.float16)
    """
    out = torch.empty_like(src) if out is None else out
    _ADD_CONSTANT_RUNTIME[src.get_device()].add_constant_runtime(out, src, constant)
    return out
