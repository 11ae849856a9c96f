"""add_constant: ``src + constant`` element-wise, the constant compile-time or run-time."""

from __future__ import annotations

import torch

from mllm_kernel.cpu.jit.add_constant_contract import ALLOWED_CONSTANTS, checked_constant
from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import refuse_grad, torch_op

_tracing = torch.compiler.is_dynamo_compiling

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


def add_constant(src: torch.Tensor, constant: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Returns ``src + constant`` for ``constant`` in {1, 2, 4, 8, 16}, one compiled kernel
    per value.

    ``src``: any shape and strides; float32, float64, bfloat16, float16, int32 or
    int64. ``out``: written in place if given (``src``'s shape and dtype, any strides
    but zero ones); it may be ``src`` itself, but not overlap ``src`` otherwise. For
    other constants use :func:`add_constant_runtime`. Any DLPack tensor (a numpy
    array) is taken; the result is a torch tensor.

    >>> add_constant(torch.zeros(3), 8)
    tensor([8., 8., 8.])
    """
    if _tracing():
        return ADD_CONSTANT_OP(src, constant, out=out)
    # Hot path: an exact int is looked up as it is (True and 2.0 hash like 1 and 2, so
    # any other type goes through the full check); the module refuses other values.
    if type(constant) is not int:
        constant = checked_constant(constant)
    src = op_inputs.tensor(src, "src")
    refuse_grad("add_constant", src, out)
    try:
        out = torch.empty_like(src) if out is None else op_inputs.output(out, "out")
        _ADD_CONSTANT[constant].add_constant(out, src, torch.get_num_threads())
    except Exception as error:
        op_inputs.explain(error, "cpu", src=src, out=out)
        raise
    return out


def add_constant_runtime(
    src: torch.Tensor, constant: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Returns ``src + constant`` for any float ``constant`` (one kernel for every value).

    ``src``: any shape and strides; float32, float64, bfloat16 or float16, computed
    in float32 for the 16-bit types. Unlike torch, ``constant`` is not first rounded to
    ``src``'s dtype, so 16-bit results may differ from torch's by one unit in the
    last place (they are closer to the exact sum). ``constant``: an int or float (not a
    bool or str). ``out`` as for :func:`add_constant`.

    >>> add_constant_runtime(torch.zeros(2), 0.5)
    tensor([0.5000, 0.5000])
    """
    if _tracing():
        return ADD_CONSTANT_RUNTIME_OP(src, constant, out=out)
    src = op_inputs.tensor(src, "src")
    constant = op_inputs.number(constant, "constant")
    refuse_grad("add_constant_runtime", src, out)
    try:
        out = torch.empty_like(src) if out is None else op_inputs.output(out, "out")
        _ADD_CONSTANT_RUNTIME[()].add_constant_runtime(out, src, constant, torch.get_num_threads())
    except Exception as error:
        op_inputs.explain(error, "cpu", src=src, out=out)
        raise
    return out


ADD_CONSTANT_OP = torch_op(
    "add_constant",
    "(Tensor src, int constant) -> Tensor",
    fake=lambda src, constant: torch.empty_like(src),
    out="out",
).implement("cpu", add_constant)
ADD_CONSTANT_RUNTIME_OP = torch_op(
    "add_constant_runtime",
    "(Tensor src, float constant) -> Tensor",
    fake=lambda src, constant: torch.empty_like(src),
    out="out",
).implement("cpu", add_constant_runtime)
