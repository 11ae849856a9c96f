"""add_constant: ``x + c`` on the GPU, ``c`` compile-time (one module per ``c``) or runtime."""

from __future__ import annotations

import torch

from mllm_kernel.add_constant_contract import ALLOWED_CONSTANTS, checked_constant
from mllm_kernel.cuda.jit.device_module import module_for
from mllm_kernel.jit_utils import (
    cache_once,
    load_cuda_jit,
    make_cpp_args,
    op_inputs,
    register_kernel,
)

_ALLOWED = frozenset(ALLOWED_CONSTANTS)


@register_kernel("add_constant", device="cuda", variants=[(c,) for c in ALLOWED_CONSTANTS])
@cache_once
def _module(c: int):
    args = make_cpp_args(c)
    return load_cuda_jit(
        "add_constant",
        *args,
        cuda_files=["add_constant.cu"],
        cuda_wrappers=[("add_constant", f"mllm_kernel::cuda::add_constant<{args}>")],
    )


@register_kernel("add_constant_runtime", device="cuda", variants=[()])
@cache_once
def _runtime_module():
    return load_cuda_jit(
        "add_constant_runtime",
        cuda_files=["add_constant.cu"],
        cuda_wrappers=[("add_constant_runtime", "mllm_kernel::cuda::add_constant_runtime<>")],
    )


def add_constant(x: torch.Tensor, c: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x + c`` for ``c`` in {1, 2, 4, 8, 16}, a compile-time constant of the kernel.

    int32, float32, float16 or bfloat16; any shape (contiguous). ``out``: ``x``'s
    shape and dtype, contiguous; it may be ``x`` itself, but not overlap it otherwise.
    For other values of ``c`` use :func:`add_constant_runtime`.

    >>> add_constant(torch.zeros(4, dtype=torch.int32, device="cuda"), 8)
    tensor([8, 8, 8, 8], device='cuda:0', dtype=torch.int32)
    """
    # Hot path: exact ints pass one set lookup (True and 2.0 would too, so any other
    # type goes through the full check).
    if type(c) is not int or c not in _ALLOWED:
        c = checked_constant(c)
    x = op_inputs.tensor(x, "x")
    try:
        # x must be contiguous: the kernel says so if not
        out = torch.empty_like(x) if out is None else op_inputs.output(out, "out")
        module_for(_module, x, c).add_constant(out, x)
    except Exception as error:
        op_inputs.explain(error, "cuda", x=x, out=out)
        raise
    return out


def add_constant_runtime(
    x: torch.Tensor, c: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``x + c`` with ``c`` passed at run time (an integer for int32 tensors).

    >>> add_constant_runtime(torch.zeros(2, device="cuda", dtype=torch.float16), 0.5)
    tensor([0.5000, 0.5000], device='cuda:0', dtype=torch.float16)
    """
    x = op_inputs.tensor(x, "x")
    c = op_inputs.number(c, "c")
    try:
        out = torch.empty_like(x) if out is None else op_inputs.output(out, "out")
        module_for(_runtime_module, x).add_constant_runtime(out, x, c)
    except Exception as error:
        op_inputs.explain(error, "cuda", x=x, out=out)
        raise
    return out
